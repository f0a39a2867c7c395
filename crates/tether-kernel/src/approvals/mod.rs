//! Approvals: durable, fingerprinted, single-use consent from people.
//!
//! A hold (or a hardware command at R2 and above that needs a permit) creates
//! one approval bound to the requester, the `command_id`, the binding and the
//! exact input digest. Operators vote through `mhs.approvals.decide`; the
//! requester never votes on its own request and agents never vote at all.
//! Quorum approvals need that many distinct operators; one denial is final.
//! An approval is used once: the same principal re-submits the same
//! `command_id` with the same input, the whole evaluation order runs again
//! (so a policy or limit that now refuses still refuses), and on dispatch the
//! approval is spent. Every request, vote and outcome is an evidence entry;
//! the latest record of each approval lives in the store, so approvals survive
//! a restart (sessions need not).
//!
//! **Owns:** the approval table ([`Approval`], [`Approvals`]: by id, by
//! fingerprint, by request) and its restore from the store (here); step 10's
//! gate and an approval's life from request to use or revocation
//! (`gate.rs`); the verbs `mhs.approvals.list|get|decide` and who may vote
//! (`verbs.rs`); what other processes on the store decided (`sync.rs`).
//! **Never belongs here:** whether a command needs an approval (the policy
//! and permit rules, `check/policy.rs`, `check/permits.rs`); when an e-stop
//! revokes (`safety/estop.rs` calls in).
//! **Fail-closed rule:** an approval table that cannot be locked refuses; a
//! stored record that cannot be read is skipped and never authorises; a new
//! approval or a vote that cannot be made durable did not happen (a hold is
//! answered only once its approval is durable); a revocation applies in
//! memory at once, whether or not its record lands.

mod gate;
mod sync;
mod verbs;

pub(crate) use gate::{Gate, Need};
pub(crate) use sync::APPROVAL_SYNC_MS;

use serde_json::{json, Value};
use std::collections::HashMap;
use tether_store::ApprovalRow;

/// Most approvals kept in memory (open, and denials, which are final); beyond
/// it new holds are refused. The open ones are bounded by the config
/// (`limits.approvals_open_max`, at most [`crate::bounds::APPROVALS_OPEN_LIMIT`]).
pub(crate) const APPROVALS_MAX: usize = 20_000;
// Denials always find room beside the most open approvals a config allows.
const _: () = assert!(crate::bounds::APPROVALS_OPEN_LIMIT * 2 <= APPROVALS_MAX);

/// Most closed approvals (used, expired, revoked) a restart reads back, the
/// newest: what `approvals.get` and `approvals.list` still show of them. The
/// store keeps every one.
pub(crate) const APPROVALS_RESTORE_CLOSED_MAX: usize = APPROVALS_MAX / 4;
const _: () = assert!(APPROVALS_RESTORE_CLOSED_MAX < APPROVALS_MAX);

/// Where an approval stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Pending,
    Approved,
    Denied,
    Used,
    Expired,
    /// An e-stop of its device withdrew it before it was used: consent given
    /// before an incident never moves the machine after the reset.
    Revoked,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Denied => "denied",
            Self::Used => "used",
            Self::Expired => "expired",
            Self::Revoked => "revoked",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => Self::Pending,
            "approved" => Self::Approved,
            "denied" => Self::Denied,
            "used" => Self::Used,
            "expired" => Self::Expired,
            "revoked" => Self::Revoked,
            _ => return None,
        })
    }
}

/// One vote.
#[derive(Clone, Debug)]
struct Vote {
    by: String,
    decision: String,
    reason: String,
    at_ms: u64,
}

/// One approval. `record` is its stored form; the fields mirror it.
#[derive(Clone, Debug)]
pub(crate) struct Approval {
    pub id: String,
    key: String,
    requester_id: String,
    status: Status,
    quorum: u32,
    expires_at_ms: u64,
    votes: Vec<Vote>,
    /// The fixed part of the record (binding, digest, requester, reason...).
    base: Value,
    /// A command currently holds it between admission and dispatch.
    reserved_by: Option<String>,
    /// The creating request persists it; others only read it.
    durable: bool,
}

impl Approval {
    fn status_at(&self, now: u64) -> Status {
        match self.status {
            Status::Pending | Status::Approved if now >= self.expires_at_ms => Status::Expired,
            s => s,
        }
    }

    fn approvals(&self) -> usize {
        self.votes
            .iter()
            .filter(|v| v.decision == "approve")
            .count()
    }

    /// The stored and wire form.
    pub(crate) fn to_json(&self, now: u64) -> Value {
        let mut v = self.base.clone();
        v["approval_id"] = json!(self.id);
        v["status"] = json!(self.status_at(now).as_str());
        v["quorum"] = json!(self.quorum);
        v["approvals"] = json!(self.approvals());
        v["expires_at_ms"] = json!(self.expires_at_ms);
        v["votes"] = json!(self
            .votes
            .iter()
            .map(|x| json!({"by": x.by, "decision": x.decision, "reason": x.reason, "at_ms": x.at_ms}))
            .collect::<Vec<_>>());
        v
    }

    fn stored(&self) -> Value {
        // The stored status never says "expired": expiry is a function of time.
        let mut v = self.to_json(0);
        v["status"] = json!(self.status.as_str());
        v
    }

    pub(crate) fn from_stored(row: &ApprovalRow) -> Option<Self> {
        let r = &row.record;
        let votes = r["votes"]
            .as_array()?
            .iter()
            .map(|x| {
                Some(Vote {
                    by: x["by"].as_str()?.to_owned(),
                    decision: x["decision"].as_str()?.to_owned(),
                    reason: x["reason"].as_str().unwrap_or_default().to_owned(),
                    at_ms: x["at_ms"].as_u64().unwrap_or(0),
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Self {
            id: row.approval_id.clone(),
            key: r["key"].as_str()?.to_owned(),
            requester_id: r["requested_by"]["id"].as_str()?.to_owned(),
            status: Status::parse(r["status"].as_str()?)?,
            quorum: u32::try_from(r["quorum"].as_u64()?).ok()?,
            expires_at_ms: r["expires_at_ms"].as_u64()?,
            votes,
            base: r.clone(),
            reserved_by: None,
            durable: true,
        })
    }
}

/// Approvals by id, by fingerprint key, and by request (the fingerprint
/// without its command id: who asked for which binding and input).
#[derive(Debug, Default)]
pub(crate) struct Approvals {
    by_id: HashMap<String, Approval>,
    by_key: HashMap<String, String>,
    by_request: HashMap<String, String>,
    /// The chain position up to which the store's approval writes are merged
    /// here (`Store::approvals_since`): other processes' holds and votes.
    pub(crate) seen: u64,
}

/// Splits a fingerprint `requester|command_id|binding/digest` into its command
/// id and binding key (a command id never holds `|`).
fn split_key<'k>(requester: &str, key: &'k str) -> Option<(&'k str, &'k str)> {
    key.strip_prefix(requester)?
        .strip_prefix('|')?
        .split_once('|')
}

fn request_key(requester: &str, binding_key: &str) -> String {
    format!("{requester}|{binding_key}")
}

impl Approvals {
    /// Approvals still waiting for a decision (`GET /metrics`).
    pub(crate) fn pending_count(&self) -> u64 {
        let n = self.by_id.values().filter(|a| a.status == Status::Pending);
        u64::try_from(n.count()).unwrap_or(u64::MAX)
    }

    fn insert(&mut self, a: Approval) {
        if let Some((_, binding_key)) = split_key(&a.requester_id, &a.key) {
            self.by_request
                .insert(request_key(&a.requester_id, binding_key), a.id.clone());
        }
        self.by_key.insert(a.key.clone(), a.id.clone());
        self.by_id.insert(a.id.clone(), a);
    }

    fn remove(&mut self, id: &str) -> Option<Approval> {
        let a = self.by_id.remove(id)?;
        self.by_key.remove(&a.key);
        if let Some((_, binding_key)) = split_key(&a.requester_id, &a.key) {
            let rk = request_key(&a.requester_id, binding_key);
            if self.by_request.get(&rk).is_some_and(|x| x == id) {
                self.by_request.remove(&rk);
            }
        }
        Some(a)
    }

    /// Rebuilds the table from stored records (what
    /// `Store::approvals_to_restore` answers): the open ones first, then
    /// closed ones while the table has room, so it never holds more than
    /// [`APPROVALS_MAX`]. A record that cannot be read is skipped with a
    /// warning: it can then never authorise anything.
    pub(crate) fn restore(rows: &[ApprovalRow]) -> Self {
        let mut t = Self::default();
        for closed in [false, true] {
            let rows = rows
                .iter()
                .filter(|r| tether_store::approval_is_closed(&r.record) == closed);
            for row in rows {
                if t.by_id.len() >= APPROVALS_MAX {
                    break;
                }
                match Approval::from_stored(row) {
                    Some(a) => t.insert(a),
                    None => {
                        tracing::warn!(approval_id = %row.approval_id, "unreadable approval record ignored")
                    }
                }
            }
        }
        t
    }
}

impl Approvals {
    /// Merges stored records: approvals other processes on the store made,
    /// and votes, uses and revocations they wrote. The stored record is the
    /// truth for an approval this process holds durably and is not using; an
    /// approval it is still making durable, or one a command of its own has
    /// reserved, keeps its local state. A closed approval not in memory stays
    /// out (the store keeps every one; memory keeps what can still matter),
    /// and a full table takes no more.
    pub(crate) fn merge(&mut self, rows: &[ApprovalRow], now: u64) {
        for row in rows {
            let Some(a) = Approval::from_stored(row) else {
                tracing::warn!(approval_id = %row.approval_id, "unreadable approval record ignored");
                continue;
            };
            match self.by_id.get(&a.id) {
                Some(local) if !local.durable || local.reserved_by.is_some() => {}
                Some(local) => {
                    let a = merged(local, a);
                    self.remove(&row.approval_id);
                    self.insert(a);
                }
                None => {
                    let open = matches!(
                        a.status_at(now),
                        Status::Pending | Status::Approved | Status::Denied
                    );
                    if open && self.by_id.len() >= APPROVALS_MAX {
                        prune_closed(self, now);
                    }
                    if open && self.by_id.len() < APPROVALS_MAX {
                        self.insert(a);
                    }
                }
            }
        }
    }
}

/// How far a status has moved on: votes only add, and an approval goes from
/// pending to approved, and to denied, used or revoked, never back.
fn progress(s: Status) -> u8 {
    match s {
        Status::Pending => 0,
        Status::Approved | Status::Expired => 1,
        Status::Denied | Status::Used | Status::Revoked => 2,
    }
}

/// A stored record `a` of an approval this process holds too (`local`),
/// merged with what this process knows: every vote of either, the status
/// that has moved on further. A stored record older than one of this
/// process's own writes still in flight (a vote already pushed here, whose
/// commit has not landed) must not take that write back: replacing the
/// record lost the vote, and the next write of the record (a revocation, a
/// use) stored the loss (found by the SIGKILL campaign: an acknowledged vote
/// missing from its revoked approval after a restart).
fn merged(local: &Approval, mut a: Approval) -> Approval {
    for v in &local.votes {
        if !a.votes.iter().any(|x| x.by == v.by) {
            a.votes.push(v.clone());
        }
    }
    if progress(local.status) > progress(a.status) {
        a.status = local.status;
        a.base = local.base.clone();
    }
    if matches!(a.status, Status::Pending | Status::Approved) {
        if a.votes.iter().any(|v| v.decision == "deny") {
            a.status = Status::Denied;
        } else if a.approvals() >= a.quorum as usize {
            a.status = Status::Approved;
        }
    }
    a
}

/// Drops used and expired approvals from memory (they stay in the store).
/// Denials stay: a denial is final, so its fingerprint must keep refusing.
fn prune_closed(t: &mut Approvals, now: u64) {
    let closed: Vec<String> = t
        .by_id
        .values()
        .filter(|a| {
            matches!(
                a.status_at(now),
                Status::Used | Status::Expired | Status::Revoked
            )
        })
        .map(|a| a.id.clone())
        .collect();
    for id in closed {
        t.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(status: &str, votes: Value) -> ApprovalRow {
        ApprovalRow {
            approval_id: "appr_1".into(),
            record: json!({"approval_id": "appr_1", "key": "planner|c1|t/cap/main/sha256:x@planner", "requested_by": {"id": "planner", "kind": "agent"}, "status": status, "quorum": 2, "expires_at_ms": u64::MAX, "votes": votes}),
        }
    }

    fn vote(by: &str) -> Value {
        json!({"by": by, "decision": "approve", "reason": "", "at_ms": 1})
    }

    /// A vote pushed here whose commit has not landed survives a merge of
    /// the older stored record, and a revocation stored later keeps it.
    #[test]
    fn a_merge_of_an_older_stored_record_keeps_a_vote_in_flight() {
        let mut t = Approvals::restore(&[row("pending", json!([]))]);
        let a = t.by_id.get_mut("appr_1").expect("restored");
        a.votes.push(Vote {
            by: "alice".into(),
            decision: "approve".into(),
            reason: String::new(),
            at_ms: 2,
        });
        t.merge(&[row("pending", json!([]))], 3);
        let a = &t.by_id["appr_1"];
        assert_eq!(a.approvals(), 1, "{:?}", a.votes);
        assert_eq!(a.status, Status::Pending);
        // Another process's vote and revocation arrive: both are kept, and
        // the status moves on to the revocation, never back.
        t.merge(&[row("revoked", json!([vote("bob")]))], 4);
        let a = &t.by_id["appr_1"];
        assert_eq!(a.status, Status::Revoked);
        let voters: Vec<&str> = a.votes.iter().map(|v| v.by.as_str()).collect();
        assert_eq!(voters, ["bob", "alice"]);
        assert_eq!(a.stored()["votes"].as_array().map(Vec::len), Some(2));
        t.merge(&[row("pending", json!([]))], 5);
        assert_eq!(t.by_id["appr_1"].status, Status::Revoked);
    }

    fn numbered(n: usize, status: &str) -> ApprovalRow {
        let id = format!("appr_{n}");
        ApprovalRow {
            approval_id: id.clone(),
            record: json!({"approval_id": id, "key": format!("planner|c{n}|t/cap/main/sha256:x@planner"), "requested_by": {"id": "planner", "kind": "agent"}, "status": status, "quorum": 1, "expires_at_ms": u64::MAX, "votes": []}),
        }
    }

    /// A restart never holds more than the table's bound, and the open
    /// approvals take the room before closed ones.
    #[test]
    fn a_restore_keeps_the_open_approvals_first_and_stays_within_the_bound() {
        let mut rows: Vec<ApprovalRow> = (0..10).map(|n| numbered(n, "used")).collect();
        rows.extend((10..APPROVALS_MAX + 15).map(|n| numbered(n, "pending")));
        let t = Approvals::restore(&rows);
        assert_eq!(t.by_id.len(), APPROVALS_MAX);
        assert!(t.by_id.values().all(|a| a.status == Status::Pending));
        let rows = [
            numbered(1, "denied"),
            numbered(2, "used"),
            numbered(3, "pending"),
        ];
        let t = Approvals::restore(&rows);
        assert_eq!(t.by_id.len(), 3, "closed ones fill the room that is left");
        assert_eq!(t.by_id["appr_1"].status, Status::Denied);
    }

    /// Votes of two processes reaching the quorum together approve.
    #[test]
    fn votes_merged_from_two_processes_reach_the_quorum() {
        let mut t = Approvals::restore(&[row("pending", json!([vote("alice")]))]);
        t.merge(&[row("pending", json!([vote("bob")]))], 3);
        let a = &t.by_id["appr_1"];
        assert_eq!(a.approvals(), 2);
        assert_eq!(a.status, Status::Approved);
    }
}
