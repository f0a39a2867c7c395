//! Invocations of the gateway: what was accepted, by whom, and how it ended.
//!
//! An invocation is one asynchronous command (an action or a write) behind a
//! 202. Its record is made durable (an `invocation.accepted` entry in the
//! evidence chain plus an `invocations` row) before the 202 is answered, so its
//! id answers after a restart. In memory the table is bounded: pending
//! invocations by [`PENDING_MAX`] (new ones are refused beyond it), finished
//! ones by [`FINISHED_MAX`] (older ones are answered from the store).

use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use tether_kernel::CancelToken;

/// Invocations running at once; a new one beyond this is refused (503).
pub(crate) const PENDING_MAX: usize = 4096;
/// Finished invocations kept in memory; older ones are read from the store.
pub(crate) const FINISHED_MAX: usize = 100_000;

/// Terminal statuses are a receipt's; `pending` is the only other one.
pub(crate) const PENDING: &str = "pending";

/// One invocation.
pub(crate) struct Invocation {
    /// The durable record (see [`Invocation::record`]).
    pub info: Value,
    /// Delivers cancellation to the command (before or after dispatch).
    pub cancel: CancelToken,
    /// Whether a cancel may be delivered (stop-class commands: never).
    pub cancellable: bool,
}

impl Invocation {
    pub fn status(&self) -> &str {
        self.info["status"].as_str().unwrap_or(PENDING)
    }

    pub fn pending(&self) -> bool {
        self.status() == PENDING
    }
}

/// What the gateway knows about one invocation id in memory.
#[derive(Default)]
pub(crate) struct Table {
    by_id: HashMap<String, Invocation>,
    pending: usize,
    finished_order: VecDeque<String>,
}

impl Table {
    /// Adds a pending invocation, unless [`PENDING_MAX`] are pending.
    pub fn insert(&mut self, id: String, inv: Invocation) -> bool {
        if self.pending >= PENDING_MAX {
            return false;
        }
        self.pending += 1;
        self.by_id.insert(id, inv);
        true
    }

    pub fn get(&self, id: &str) -> Option<&Invocation> {
        self.by_id.get(id)
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut Invocation> {
        self.by_id.get_mut(id)
    }

    /// Marks an invocation finished with its outcome (moved into the
    /// record); evicts the oldest finished ones beyond [`FINISHED_MAX`].
    /// Answers a copy of the finished record when `copy` asks for one (the
    /// caller must record it), `None` when it was not pending.
    pub fn finish(
        &mut self,
        id: &str,
        outcome: Outcome,
        finished_at_ms: u64,
        copy: bool,
    ) -> Option<Option<Value>> {
        let inv = self.by_id.get_mut(id)?;
        if !inv.pending() {
            return None;
        }
        outcome.apply(&mut inv.info, finished_at_ms);
        let info = copy.then(|| inv.info.clone());
        self.pending = self.pending.saturating_sub(1);
        self.finished_order.push_back(id.to_owned());
        while self.finished_order.len() > FINISHED_MAX {
            if let Some(old) = self.finished_order.pop_front() {
                self.by_id.remove(&old);
            }
        }
        Some(info)
    }
}

/// How a command ended, as the gateway records it.
pub(crate) enum Outcome {
    /// The kernel answered a receipt (any status).
    Receipt(Value),
    /// The kernel answered a protocol error before the order ran.
    Error(Value),
}

impl Outcome {
    fn apply(self, info: &mut Value, finished_at_ms: u64) {
        match self {
            Outcome::Receipt(r) => {
                info["status"] = r["status"].clone();
                info["error"] = r["error"].clone();
                info["receipt"] = r;
            }
            Outcome::Error(e) => {
                info["status"] = json!("rejected");
                info["receipt"] = Value::Null;
                info["error"] = e;
            }
        }
        info["finished_at_ms"] = json!(finished_at_ms);
    }
}

/// The public view of an invocation record: the record plus derived fields.
/// `unknown` with no receipt is terminal for accounting but never a stop.
pub(crate) fn view(info: Value) -> Value {
    let mut v = info;
    let terminal = v["status"].as_str().unwrap_or(PENDING) != PENDING;
    v["terminal"] = json!(terminal);
    v["operation_id"] = v["receipt"]["operation_id"].clone();
    v["receipt_id"] = v["receipt"]["receipt_id"].clone();
    if let Some(obj) = v.as_object_mut() {
        obj.remove("principal");
    }
    v
}

/// A record read back from the store after a restart. A pending one without
/// a stored receipt is `unknown`: accepted durably, outcome never recorded.
pub(crate) fn recovered(mut info: Value, receipt: Option<Value>) -> Value {
    if info["status"].as_str().unwrap_or(PENDING) != PENDING {
        return info;
    }
    match receipt {
        Some(r) => {
            info["status"] = r["status"].clone();
            info["error"] = r["error"].clone();
            info["receipt"] = r;
        }
        None => {
            info["status"] = json!("unknown");
            info["receipt"] = Value::Null;
            info["error"] = json!({
                "mhs_code": "MHS.OUTCOME.UNKNOWN",
                "retryable": false,
                "message": "accepted durably, but no outcome was recorded (the endpoint stopped while it ran); read the device before acting again",
                "details": {"reason": "no_receipt_recorded", "stopped": false},
            });
        }
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(id: &str) -> Invocation {
        Invocation {
            info: json!({"invocation_id": id, "status": PENDING}),
            cancel: CancelToken::new(),
            cancellable: true,
        }
    }

    #[test]
    fn pending_invocations_are_bounded_and_finishing_frees_a_slot() {
        let mut t = Table::default();
        for i in 0..PENDING_MAX {
            assert!(t.insert(format!("inv_{i}"), pending("x")));
        }
        assert!(!t.insert("one_more".into(), pending("x")));
        let done = || Outcome::Receipt(json!({"status": "completed", "error": null}));
        assert!(t
            .finish("inv_0", done(), 1, true)
            .is_some_and(|c| c.is_some()));
        assert!(
            t.finish("inv_0", done(), 2, true).is_none(),
            "finishes once"
        );
        assert!(t.insert("one_more".into(), pending("x")));
    }

    #[test]
    fn a_pending_record_without_a_receipt_recovers_as_unknown_never_as_stopped() {
        let info = recovered(json!({"status": PENDING}), None);
        assert_eq!(info["status"], "unknown");
        assert_eq!(info["error"]["details"]["stopped"], false);
        let info = recovered(
            json!({"status": PENDING}),
            Some(json!({"status": "completed", "error": null})),
        );
        assert_eq!(info["status"], "completed");
    }
}
