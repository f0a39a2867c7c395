//! What the kernel counts for `GET /metrics` (issue 22 §2): commands by
//! device, capability and outcome, refusals by code, the decision, durable
//! commit and e-stop latencies, driver errors and the store's queue depth.
//!
//! **Owns:** [`Meters`], fixed tables of atomics sized once from the cell
//! and the code registry, and [`MetersView`], the read-only copy a surface
//! renders. The surfaces render it (`tether-server`); this crate knows no
//! exposition format and no telemetry library.
//! **Never belongs here:** a label taken from a request: every label is a
//! device or capability id of the manifest, an outcome of the receipt
//! grammar or a registry code, so the number of series is bounded by the
//! cell; a device or capability no manifest names is counted as unknown.
//! **Fail-closed rule:** counting never refuses, blocks or takes a lock: a
//! command's path only adds to atomics.

use crate::dispatch::answer::Answer;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tether_core::codes::REGISTRY;
use tether_core::Code;

/// The outcomes a command is counted under: the receipt's status, with a
/// hold (a rejected receipt coded `POLICY.HELD`) told apart.
pub const OUTCOMES: [&str; 6] = [
    "completed",
    "rejected",
    "held",
    "failed",
    "cancelled",
    "unknown",
];

/// Upper bounds of the latency histograms' buckets, microseconds (the last,
/// implicit bucket is `+Inf`).
pub const BUCKETS_US: [u64; 15] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000,
];

/// A latency histogram of fixed buckets, atomics only.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS_US.len() + 1],
    sum_us: AtomicU64,
    count: AtomicU64,
}

/// A copy of a [`Histogram`]: per-bucket (not cumulative) counts, the last
/// one `+Inf`, the sum in microseconds and the count.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistogramView {
    /// Counts of each bucket of [`BUCKETS_US`], then the `+Inf` bucket.
    pub buckets: Vec<u64>,
    /// Sum of the observations, microseconds.
    pub sum_us: u64,
    /// Number of observations.
    pub count: u64,
}

impl Histogram {
    /// Adds one observation.
    pub fn observe(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let at = BUCKETS_US
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(BUCKETS_US.len());
        if let Some(b) = self.buckets.get(at) {
            b.fetch_add(1, Ordering::Relaxed);
        }
        self.sum_us.fetch_add(us, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn view(&self) -> HistogramView {
        HistogramView {
            buckets: self
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
            sum_us: self.sum_us.load(Ordering::Relaxed),
            count: self.count.load(Ordering::Relaxed),
        }
    }
}

/// The counters of one served device.
#[derive(Debug)]
struct DeviceMeters {
    id: String,
    /// The distinct capability ids the device binds, sorted (the labels).
    capabilities: Vec<String>,
    /// `(capabilities.len() + 1) × OUTCOMES.len()`: the last row counts
    /// commands naming a capability the device does not bind.
    commands: Box<[AtomicU64]>,
    driver_errors: AtomicU64,
}

/// The kernel's counters, sized once at start.
#[derive(Debug)]
pub(crate) struct Meters {
    devices: Vec<DeviceMeters>,
    /// Refusals by code, in registry order.
    refusals: Box<[AtomicU64]>,
    pub decision: Histogram,
    pub commit: Histogram,
    pub estop: Histogram,
    /// Commits handed to the store and not answered yet.
    pub store_in_flight: Arc<AtomicU64>,
}

impl Meters {
    /// Tables for devices `(id, capability ids)`.
    pub(crate) fn new<'a>(devices: impl Iterator<Item = (&'a str, Vec<String>)>) -> Self {
        let devices = devices
            .map(|(id, mut capabilities)| {
                capabilities.sort();
                capabilities.dedup();
                let cells = (capabilities.len() + 1) * OUTCOMES.len();
                DeviceMeters {
                    id: id.to_owned(),
                    capabilities,
                    commands: (0..cells).map(|_| AtomicU64::new(0)).collect(),
                    driver_errors: AtomicU64::new(0),
                }
            })
            .collect();
        Self {
            devices,
            refusals: (0..REGISTRY.len()).map(|_| AtomicU64::new(0)).collect(),
            decision: Histogram::default(),
            commit: Histogram::default(),
            estop: Histogram::default(),
            store_in_flight: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Counts a command's answer under its device, capability and outcome
    /// (read from the receipt, matched against the manifest), and its
    /// refusal code. Answers the labels it used, for the command's span.
    pub(crate) fn command(&self, device: Option<usize>, answer: &Answer) -> Counted<'_> {
        let status = answer.status().unwrap_or("unknown");
        let code = (status != "completed")
            .then(|| refusal_code(answer))
            .flatten();
        let outcome = match (status, code) {
            (_, Some(Code::PolicyHeld)) => 2,
            _ => OUTCOMES.iter().position(|o| *o == status).unwrap_or(5),
        };
        if let Some(c) = code {
            self.refusal(c);
        }
        let mut capability = None;
        if let Some(dev) = device.and_then(|d| self.devices.get(d)) {
            let cap = answer.string_member("capability_id");
            let row = cap.as_deref().and_then(|c| {
                dev.capabilities
                    .binary_search_by(|x| x.as_str().cmp(c))
                    .ok()
            });
            capability = row
                .and_then(|r| dev.capabilities.get(r))
                .map(String::as_str);
            let row = row.unwrap_or(dev.capabilities.len());
            if let Some(cell) = dev.commands.get(row * OUTCOMES.len() + outcome) {
                cell.fetch_add(1, Ordering::Relaxed);
            }
        }
        Counted {
            outcome: OUTCOMES.get(outcome).copied().unwrap_or("unknown"),
            code,
            capability,
        }
    }

    /// Counts a refusal (a rejected receipt's code, or a protocol error).
    pub(crate) fn refusal(&self, code: Code) {
        if let Some(i) = REGISTRY.iter().position(|r| r.code == code) {
            if let Some(c) = self.refusals.get(i) {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Counts a driver call that ended in an error other than cancellation.
    pub(crate) fn driver_error(&self, device: usize) {
        if let Some(d) = self.devices.get(device) {
            d.driver_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A commit was handed to the store ([`answered`] once it is answered).
    pub(crate) fn submitted(&self) {
        self.store_in_flight.fetch_add(1, Ordering::Relaxed);
    }

    /// The read-only copy `GET /metrics` renders; `latched` are the
    /// devices' latch flags, in load order.
    pub(crate) fn view<'a>(&self, latched: impl Iterator<Item = &'a AtomicBool>) -> MetersView {
        let mut latched = latched;
        let devices = self
            .devices
            .iter()
            .map(|d| DeviceView {
                id: d.id.clone(),
                capabilities: d.capabilities.clone(),
                commands: d
                    .commands
                    .iter()
                    .map(|c| c.load(Ordering::Relaxed))
                    .collect(),
                driver_errors: d.driver_errors.load(Ordering::Relaxed),
                latched: latched.next().is_some_and(|l| l.load(Ordering::Relaxed)),
            })
            .collect();
        MetersView {
            devices,
            refusals: REGISTRY
                .iter()
                .zip(self.refusals.iter())
                .map(|(r, c)| (r.name, c.load(Ordering::Relaxed)))
                .collect(),
            decision: self.decision.view(),
            commit: self.commit.view(),
            estop: self.estop.view(),
            store_in_flight: self.store_in_flight.load(Ordering::Relaxed),
            pending_approvals: 0,
            store: None,
        }
    }
}

impl crate::Kernel {
    /// What `GET /metrics` shows, copied: the counters, the latched devices
    /// and the store writer's counters (atomics), and the pending approvals
    /// (counted under the approvals' lock, held for the count only: a
    /// scrape's cost, never a command's).
    pub fn meters(&self) -> MetersView {
        let inner = &self.inner;
        let mut view = inner.meters.view(inner.devices.iter().map(|d| &d.latched));
        view.pending_approvals = inner
            .approvals
            .lock()
            .map(|a| a.pending_count())
            .unwrap_or(0);
        view.store = inner.store.writer_stats().map(|s| StoreView {
            batches: s.batches,
            commits: s.commits,
            largest_batch: s.largest_batch,
        });
        view
    }
}

/// The store answered a commit counted by [`Meters::submitted`].
pub(crate) fn answered(in_flight: &AtomicU64) {
    // Never below zero, whatever the order the answers come in.
    let _ = in_flight.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
        Some(n.saturating_sub(1))
    });
}

/// What [`Meters::command`] counted a command under.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Counted<'a> {
    pub outcome: &'static str,
    pub code: Option<Code>,
    /// The receipt's capability, when it is one the device binds (the
    /// meters' own copy of its name: never a caller's string).
    pub capability: Option<&'a str>,
}

/// The refusal code of a receipt that is not completed: `error.mhs_code`.
fn refusal_code(answer: &Answer) -> Option<Code> {
    let error = answer.member("error")?;
    Code::from_name(error.get("mhs_code")?.as_str()?)
}

/// The counters of one device, copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceView {
    /// The device id (from the manifest).
    pub id: String,
    /// The capability ids it binds, sorted; a command naming another is
    /// counted in an extra last row.
    pub capabilities: Vec<String>,
    /// Commands, row-major: `(capabilities.len() + 1) × OUTCOMES.len()`.
    pub commands: Vec<u64>,
    /// Driver calls that ended in an error other than cancellation.
    pub driver_errors: u64,
    /// Whether the device is latched now.
    pub latched: bool,
}

impl DeviceView {
    /// The commands counted under capability row `row` (the last row:
    /// capabilities the device does not bind) and outcome `outcome`.
    pub fn commands(&self, row: usize, outcome: usize) -> u64 {
        self.commands
            .get(row * OUTCOMES.len() + outcome)
            .copied()
            .unwrap_or(0)
    }
}

/// The store writer's own counters, when the store keeps them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreView {
    /// Transactions attempted.
    pub batches: u64,
    /// Commits taken from the queue.
    pub commits: u64,
    /// The largest number of commits in one transaction.
    pub largest_batch: u64,
}

/// Everything `GET /metrics` shows, copied from the kernel's atomics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetersView {
    /// One entry per served device, in load order.
    pub devices: Vec<DeviceView>,
    /// Refusals by registry code, in registry order.
    pub refusals: Vec<(&'static str, u64)>,
    /// Steps 5–11 (the checks, the policy decision among them).
    pub decision: HistogramView,
    /// From handing a commit to the store to its durable answer.
    pub commit: HistogramView,
    /// From an e-stop's arrival to its answer.
    pub estop: HistogramView,
    /// Commits handed to the store and not answered yet.
    pub store_in_flight: u64,
    /// Approvals still pending a decision.
    pub pending_approvals: u64,
    /// The store writer's counters (`None` for a store that keeps none).
    pub store: Option<StoreView>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_command_is_counted_under_manifest_labels_only() {
        let m = Meters::new([("relay-1", vec!["switch.set".to_owned()])].into_iter());
        let done = Answer::Value(
            json!({"status": "completed", "device_id": "relay-1", "capability_id": "switch.set"}),
        );
        let odd = Answer::Value(json!({"status": "rejected", "capability_id": "made.up",
            "error": {"mhs_code": Code::CapabilityUnknown.as_str()}}));
        assert_eq!(m.command(Some(0), &done).capability, Some("switch.set"));
        let c = m.command(Some(0), &odd);
        assert_eq!(c.capability, None, "a caller's string is never a label");
        let flags = [AtomicBool::new(true)];
        let v = m.view(flags.iter());
        assert_eq!(v.devices[0].commands(0, 0), 1);
        assert_eq!(
            v.devices[0].commands(1, 1),
            1,
            "an unbound capability has its own row"
        );
        assert!(v.devices[0].latched);
        let unknown = v
            .refusals
            .iter()
            .find(|(n, _)| *n == Code::CapabilityUnknown.as_str());
        assert_eq!(unknown.map(|(_, c)| *c), Some(1));
    }

    #[test]
    fn a_histogram_puts_each_observation_in_one_bucket() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(90));
        h.observe(Duration::from_secs(60));
        let v = h.view();
        assert_eq!(v.buckets[0], 1);
        assert_eq!(v.buckets[BUCKETS_US.len()], 1);
        assert_eq!(v.count, 2);
    }
}
