//! The client-side ledger: every outcome the endpoint acknowledged (a
//! receipt with its body, a durable latch or a reset, a hold and its votes,
//! a completed budget draw) and every command in flight when the kill came.

use super::client::{Event, Via};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// An acknowledged receipt and how its command was sent.
pub struct Acked {
    pub via: Via,
    pub receipt: Value,
}

/// An acknowledged hold and the votes acknowledged on it.
pub struct Hold {
    pub cid: String,
    pub voters: Vec<&'static str>,
}

#[derive(Default)]
pub struct Stats {
    pub sent: u64,
    pub acked: u64,
    pub replays: u64,
    pub interrupted: u64,
    pub interrupted_motions_unknown: u64,
    pub interrupted_resent: u64,
    pub holds: u64,
    pub votes: u64,
    pub draws: u64,
    pub latches: u64,
    pub resets: u64,
    pub refusals: BTreeMap<String, u64>,
    pub anomalies: Vec<String>,
}

#[derive(Default)]
pub struct Ledger {
    pub receipts: BTreeMap<String, Acked>,
    /// Command ids of `receipts` in acknowledgement order (for sampling).
    pub order: Vec<String>,
    /// Acknowledged since the last restart's checks.
    pub fresh_receipts: Vec<String>,
    pub draws: Vec<String>,
    pub fresh_draws: Vec<String>,
    pub holds: BTreeMap<String, Hold>,
    pub fresh_holds: Vec<String>,
    /// Sent and not answered: (how, whether a motion).
    pub inflight: BTreeMap<String, (Via, bool)>,
    /// Expected latch per device; `None` when the kill left it ambiguous.
    pub latch: BTreeMap<&'static str, Option<bool>>,
    pending_latch: BTreeSet<&'static str>,
    pub stats: Stats,
}

/// Statuses that are a command's stored outcome (a rejection never is).
pub fn is_outcome(receipt: &Value) -> bool {
    matches!(
        receipt["status"].as_str(),
        Some("completed" | "failed" | "cancelled" | "unknown")
    )
}

impl Ledger {
    pub fn new(devices: &[&'static str]) -> Ledger {
        let mut l = Ledger::default();
        for d in devices {
            l.latch.insert(d, Some(false));
        }
        l
    }

    pub fn apply(&mut self, e: Event) {
        match e {
            Event::Sending { cid, via, motion } => {
                self.stats.sent += 1;
                self.inflight.insert(cid, (via, motion));
            }
            Event::Answered {
                cid,
                via,
                receipt,
                draw,
            } => {
                self.inflight.remove(&cid);
                if is_outcome(&receipt) {
                    if draw && receipt["status"] == "completed" {
                        self.stats.draws += 1;
                        self.draws.push(cid.clone());
                        self.fresh_draws.push(cid.clone());
                    }
                    self.acknowledge(cid, via, receipt);
                }
            }
            Event::Unanswered { cid, refused } => {
                // A refusal answered as an error dispatched nothing; a lost
                // answer leaves the command in flight.
                if refused {
                    self.inflight.remove(&cid);
                }
            }
            Event::Held { approval_id, cid } => {
                self.stats.holds += 1;
                self.fresh_holds.push(approval_id.clone());
                self.holds.insert(
                    approval_id,
                    Hold {
                        cid,
                        voters: Vec::new(),
                    },
                );
            }
            Event::Voted { approval_id, voter } => {
                self.stats.votes += 1;
                if let Some(h) = self.holds.get_mut(&approval_id) {
                    h.voters.push(voter);
                }
            }
            Event::SafetySending { devices } => self.pending_latch.extend(devices),
            Event::SafetyAnswered { devices, latched } => {
                if latched {
                    self.stats.latches += 1;
                } else {
                    self.stats.resets += 1;
                }
                for d in devices {
                    self.pending_latch.remove(d);
                    self.latch.insert(d, Some(latched));
                }
            }
            Event::Anomaly(a) => self.stats.anomalies.push(a),
            Event::Refusal(code) => *self.stats.refusals.entry(code).or_default() += 1,
        }
    }

    /// Records an acknowledged outcome (also a replay found after a kill).
    pub fn acknowledge(&mut self, cid: String, via: Via, receipt: Value) {
        self.stats.acked += 1;
        if !self.receipts.contains_key(&cid) {
            self.order.push(cid.clone());
        }
        self.fresh_receipts.push(cid.clone());
        self.receipts.insert(cid, Acked { via, receipt });
    }

    /// At the kill: a latch or reset not answered leaves its devices
    /// ambiguous until the next restart shows what the store kept.
    pub fn killed(&mut self) {
        for d in std::mem::take(&mut self.pending_latch) {
            self.latch.insert(d, None);
        }
        self.stats.interrupted += self.inflight.len() as u64;
    }
}
