//! Invocations of the gateway: what was accepted, by whom, and how it ended.
//!
//! An invocation is one asynchronous command (an action or a write) behind a
//! 202. Its record is made durable before the 202 is answered, so its id
//! answers after a restart: the `invocation.accepted` entry in the evidence
//! chain holds it (the record's row form, status `pending`), and the store's
//! `invocations` table only indexes that entry; how a refused one ended is an
//! `invocation.finished` entry plus a full row. In memory the table is bounded: pending
//! invocations by [`PENDING_MAX`] (new ones are refused beyond it), finished
//! ones by a configured bound ([`FINISHED_MAX_DEFAULT`] unless `[limits]
//! rest_finished_max` says otherwise; older ones are answered from the store).
//!
//! A record is typed ([`Record`]) and written straight to canonical JSON for
//! the store and for answers: its receipt stays the text the kernel wrote, so
//! a finished invocation costs its strings and that text in memory (~1.5 KB),
//! not a JSON tree (~12 KB each when it was one).

use serde_json::{json, Value};
use std::collections::HashMap;
use tether_core::canonical::{object_text, CanonicalText, Member, MembersError, MAX_BODY_DEPTH};
use tether_core::recent::RecentMap;
use tether_core::Code;
use tether_kernel::{Answer, CancelToken};

/// Invocations running at once; a new one beyond this is refused (503).
pub(crate) const PENDING_MAX: usize = 4096;
/// Finished invocations kept in memory by default; older ones are read from
/// the store. About 1.5 KB each: 10,000 hold ~15 MiB (100,000 held ~150 MiB,
/// most of a REST soak's resident memory).
pub const FINISHED_MAX_DEFAULT: usize = 10_000;
/// Largest bound a config may set on finished invocations in memory.
pub const FINISHED_MAX_LIMIT: usize = 1_000_000;

/// Terminal statuses are a receipt's; `pending` is the only other one.
pub(crate) const PENDING: &str = "pending";

/// How deep a free-form member (a receipt, an error) of a record may nest:
/// the record itself is a stored row bounded like an event body, one level
/// above its members (a receipt the kernel recorded always fits: it sat one
/// level inside its own entry).
const MEMBER_DEPTH: usize = MAX_BODY_DEPTH - 1;

/// One invocation's record: what the gateway answers for it and keeps.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub invocation_id: String,
    pub attempt_id: String,
    pub tool_id: String,
    pub device_id: Option<String>,
    pub capability_id: String,
    pub resource: Option<String>,
    pub command_id: Option<String>,
    pub input_digest: String,
    pub principal_id: String,
    pub principal_kind: String,
    pub accepted_at_ms: u64,
    /// `pending`, or the receipt's status (`rejected` for a protocol error,
    /// `unknown` for an outcome never recorded).
    pub status: String,
    pub cancel_requested: bool,
    pub stop_requested: bool,
    pub receipt: Option<Answer>,
    pub error: Option<Value>,
    pub finished_at_ms: Option<u64>,
    /// The operation running the command while it is pending (read live
    /// from the kernel when the record is shown; never stored).
    pub running_operation: Option<String>,
}

/// Which members a record is written with.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    /// The durable form, the principal included: the body of the
    /// `invocation.accepted` entry (pending) and a finished record's row.
    Row,
    /// The caller's view: everything but the principal, plus `terminal`,
    /// `operation_id` and `receipt_id` (and `links` on the 202).
    View { links: bool },
}

fn opt_str(s: Option<&str>) -> Member<'_> {
    s.map_or(Member::Null, Member::Str)
}

impl Record {
    pub fn pending(&self) -> bool {
        self.status == PENDING
    }

    pub fn terminal(&self) -> bool {
        !self.pending()
    }

    /// Records how the command ended (the outcome is moved in).
    pub fn finish(&mut self, outcome: Outcome, finished_at_ms: u64) {
        self.take_outcome(outcome);
        self.finished_at_ms = Some(finished_at_ms);
    }

    fn take_outcome(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Receipt { receipt, status } => {
                self.status = status;
                self.error = receipt.member("error").filter(|e| !e.is_null());
                self.receipt = Some(receipt);
            }
            Outcome::Error(e) => {
                self.status = "rejected".to_owned();
                self.receipt = None;
                self.error = Some(e);
            }
        }
    }

    /// The record as canonical JSON in `form`.
    ///
    /// # Errors
    /// A receipt or error nested deeper than the evidence allows.
    pub fn write(&self, form: Form) -> Result<CanonicalText, MembersError> {
        let view = matches!(form, Form::View { .. });
        let principal = if view {
            None
        } else {
            Some(object_text(
                &mut [
                    ("id", Member::Str(&self.principal_id)),
                    ("kind", Member::Str(&self.principal_kind)),
                ],
                1,
            )?)
        };
        let links = match form {
            Form::View { links: true } => Some(self.links()?),
            _ => None,
        };
        // Only the view shows these (read out of the receipt's text).
        let (receipt_id, operation_id) = if view {
            (
                self.receipt_member("receipt_id"),
                self.receipt_member("operation_id"),
            )
        } else {
            (None, None)
        };
        let mut members: Vec<(&str, Member<'_>)> = vec![
            ("accepted_at_ms", Member::U64(self.accepted_at_ms)),
            ("attempt_id", Member::Str(&self.attempt_id)),
            ("capability_id", Member::Str(&self.capability_id)),
            ("command_id", opt_str(self.command_id.as_deref())),
            ("device_id", opt_str(self.device_id.as_deref())),
            ("input_digest", Member::Str(&self.input_digest)),
            ("invocation_id", Member::Str(&self.invocation_id)),
            ("resource", opt_str(self.resource.as_deref())),
            ("tool_id", Member::Str(&self.tool_id)),
            ("cancel_requested", Member::Bool(self.cancel_requested)),
            ("stop_requested", Member::Bool(self.stop_requested)),
        ];
        if let Some(p) = &principal {
            members.push(("principal", Member::Canonical(p)));
        }
        members.push(("status", Member::Str(&self.status)));
        members.push(("receipt", receipt_member(self.receipt.as_ref())));
        members.push((
            "error",
            self.error.as_ref().map_or(Member::Null, Member::Value),
        ));
        members.push((
            "finished_at_ms",
            self.finished_at_ms.map_or(Member::Null, Member::U64),
        ));
        if view {
            members.push(("terminal", Member::Bool(self.terminal())));
            members.push(("receipt_id", opt_str(receipt_id.as_deref())));
            let running = self.running_operation.as_deref();
            members.push(("operation_id", opt_str(operation_id.as_deref().or(running))));
        }
        if let Some(l) = &links {
            members.push(("links", Member::Canonical(l)));
        }
        object_text(&mut members, MEMBER_DEPTH)
    }

    fn links(&self) -> Result<CanonicalText, MembersError> {
        let own = format!("/invocations/{}", self.invocation_id);
        let result = format!("{own}/result");
        let cancel = format!("{own}/cancel");
        let stop = format!("{own}/stop");
        object_text(
            &mut [
                ("self", Member::Str(&own)),
                ("result", Member::Str(&result)),
                ("cancel", Member::Str(&cancel)),
                ("stop", Member::Str(&stop)),
            ],
            1,
        )
    }

    /// What `GET /invocations/{id}/result` answers for a terminal record.
    ///
    /// # Errors
    /// As [`Record::write`].
    pub fn write_result(&self) -> Result<CanonicalText, MembersError> {
        object_text(
            &mut [
                ("invocation_id", Member::Str(&self.invocation_id)),
                ("attempt_id", Member::Str(&self.attempt_id)),
                ("status", Member::Str(&self.status)),
                ("terminal", Member::Bool(self.terminal())),
                ("receipt", receipt_member(self.receipt.as_ref())),
                (
                    "error",
                    self.error.as_ref().map_or(Member::Null, Member::Value),
                ),
            ],
            MEMBER_DEPTH,
        )
    }

    /// The `invocation.finished` evidence entry: how it ended, pointing at
    /// the receipt (the row holds the rest).
    ///
    /// # Errors
    /// As [`Record::write`] (never, in practice: these members are flat).
    pub fn write_finished(&self) -> Result<CanonicalText, MembersError> {
        let receipt_id = self.receipt_member("receipt_id");
        object_text(
            &mut [
                ("invocation_id", Member::Str(&self.invocation_id)),
                ("command_id", opt_str(self.command_id.as_deref())),
                ("status", Member::Str(&self.status)),
                ("receipt_id", opt_str(receipt_id.as_deref())),
            ],
            1,
        )
    }

    /// A string member of the receipt (its id, its operation's id).
    fn receipt_member(&self, name: &str) -> Option<String> {
        self.receipt
            .as_ref()
            .and_then(|r| r.string_member(name))
            .map(std::borrow::Cow::into_owned)
    }

    /// A record read back from the store (written by [`Record::write`] in
    /// [`Form::Row`]). A pending one is completed from the receipt stored
    /// under its `command_id`, if any; without one it is `unknown`: accepted
    /// durably, outcome never recorded (never reported as a stop).
    ///
    /// # Errors
    /// The name of a member that is missing or of the wrong type.
    pub fn recovered(info: &Value, stored_receipt: Option<Value>) -> Result<Self, String> {
        let text = |name: &str| -> Result<String, String> {
            info.get(name)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| name.to_owned())
        };
        let opt_text = |name: &str| -> Result<Option<String>, String> {
            match info.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(name.to_owned()),
            }
        };
        let ms = |name: &str| -> Result<Option<u64>, String> {
            match info.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v.as_u64().map(Some).ok_or_else(|| name.to_owned()),
            }
        };
        let flag = |name: &str| info.get(name).and_then(Value::as_bool).unwrap_or(false);
        let principal = info.get("principal").unwrap_or(&Value::Null);
        let principal_text = |name: &str| {
            principal
                .get(name)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| format!("principal.{name}"))
        };
        let mut record = Record {
            invocation_id: text("invocation_id")?,
            attempt_id: text("attempt_id")?,
            tool_id: text("tool_id")?,
            device_id: opt_text("device_id")?,
            capability_id: text("capability_id")?,
            resource: opt_text("resource")?,
            command_id: opt_text("command_id")?,
            input_digest: text("input_digest")?,
            principal_id: principal_text("id")?,
            principal_kind: principal_text("kind")?,
            accepted_at_ms: ms("accepted_at_ms")?.ok_or("accepted_at_ms")?,
            status: text("status")?,
            cancel_requested: flag("cancel_requested"),
            stop_requested: flag("stop_requested"),
            receipt: info
                .get("receipt")
                .filter(|r| !r.is_null())
                .map(|r| Answer::Value(r.clone())),
            error: info.get("error").filter(|e| !e.is_null()).cloned(),
            finished_at_ms: ms("finished_at_ms")?,
            running_operation: None,
        };
        if record.pending() {
            match stored_receipt {
                // Finished while the endpoint was down or before the
                // restart: when is not known, so `finished_at_ms` stays null.
                Some(r) => record.take_outcome(Outcome::receipt(Answer::Value(r))),
                None => {
                    record.status = "unknown".to_owned();
                    record.receipt = None;
                    record.error = Some(json!({
                        "mhs_code": Code::OutcomeUnknown.as_str(),
                        "retryable": false,
                        "message": "accepted durably, but no outcome was recorded (the endpoint stopped while it ran); read the device before acting again",
                        "details": {"reason": "no_receipt_recorded", "stopped": false},
                    }));
                }
            }
        }
        Ok(record)
    }
}

fn receipt_member(r: Option<&Answer>) -> Member<'_> {
    match r {
        None => Member::Null,
        Some(Answer::Value(v)) => Member::Value(v),
        Some(Answer::Canonical(t)) => Member::Canonical(t),
    }
}

/// One invocation in memory.
pub(crate) struct Invocation {
    pub record: Record,
    /// Delivers cancellation to the command (before or after dispatch).
    pub cancel: CancelToken,
    /// Whether a cancel may be delivered (stop-class commands: never).
    pub cancellable: bool,
}

impl Invocation {
    pub fn pending(&self) -> bool {
        self.record.pending()
    }
}

/// What the gateway knows about one invocation id in memory.
///
/// Pending invocations sit in a map of their own (bounded by
/// [`PENDING_MAX`]; they come and go, but it is small and sized once);
/// finished ones move into a [`RecentMap`], which forgets the oldest beyond
/// the table's bound without ever rehashing a whole map under this lock
/// (its text says why a map with a FIFO of evictions did).
pub(crate) struct Table {
    /// Boxed, so the maps' slots stay small: each is sized for its bound
    /// once and touches memory only as it fills.
    pending: HashMap<String, Box<Invocation>>,
    finished: RecentMap<String, Box<Invocation>>,
}

impl Default for Table {
    fn default() -> Self {
        Self::new(FINISHED_MAX_DEFAULT)
    }
}

impl Table {
    /// A table keeping at most `finished_max` finished invocations (at
    /// least one).
    pub fn new(finished_max: usize) -> Self {
        let finished_max = finished_max.clamp(1, FINISHED_MAX_LIMIT);
        Self {
            pending: HashMap::with_capacity(PENDING_MAX),
            finished: RecentMap::new(finished_max),
        }
    }

    /// Adds a pending invocation, unless [`PENDING_MAX`] are pending.
    pub fn insert(&mut self, inv: Invocation) -> bool {
        if self.pending.len() >= PENDING_MAX {
            return false;
        }
        self.pending
            .insert(inv.record.invocation_id.clone(), Box::new(inv));
        true
    }

    pub fn get(&self, id: &str) -> Option<&Invocation> {
        self.pending
            .get(id)
            .or_else(|| self.finished.get(id))
            .map(|b| &**b)
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut Invocation> {
        match self.pending.get_mut(id) {
            Some(b) => Some(&mut **b),
            None => self.finished.get_mut(id).map(|b| &mut **b),
        }
    }

    /// Marks an invocation finished with its outcome (moved into the
    /// record); the oldest finished ones beyond the table's bound are
    /// forgotten. Answers the finished record's row form when `copy` asks
    /// for it (the caller must record it), `None` when it was not pending.
    pub fn finish(
        &mut self,
        id: &str,
        outcome: Outcome,
        finished_at_ms: u64,
        copy: bool,
    ) -> Option<Option<Finished>> {
        let (key, mut inv) = self.pending.remove_entry(id)?;
        debug_assert!(inv.pending(), "only pending invocations sit in `pending`");
        inv.record.finish(outcome, finished_at_ms);
        let finished = copy.then(|| Finished {
            event: inv.record.write_finished(),
            row: inv.record.write(Form::Row),
        });
        self.finished.insert(key, inv);
        Some(finished)
    }
}

/// What a finished record that must be recorded gives its recorder: the
/// `invocation.finished` entry and the row.
pub(crate) struct Finished {
    pub event: Result<CanonicalText, MembersError>,
    pub row: Result<CanonicalText, MembersError>,
}

/// How a command ended, as the gateway records it.
pub(crate) enum Outcome {
    /// The kernel answered a receipt (any status, read out of it once).
    Receipt { receipt: Answer, status: String },
    /// The kernel answered a protocol error before the order ran.
    Error(Value),
}

impl Outcome {
    /// A receipt outcome; a receipt without a string status reads `unknown`.
    pub fn receipt(receipt: Answer) -> Self {
        let status = receipt.status().unwrap_or("unknown").to_owned();
        Outcome::Receipt { receipt, status }
    }

    /// Whether the kernel refused the command (nothing was dispatched).
    pub fn rejected(&self) -> bool {
        match self {
            Outcome::Receipt { status, .. } => status == "rejected",
            Outcome::Error(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> Record {
        Record {
            invocation_id: id.to_owned(),
            attempt_id: "att_1".into(),
            tool_id: "thermostat-1__setpoint".into(),
            device_id: Some("thermostat-1".into()),
            capability_id: "cap.thermal.setpoint.v1".into(),
            resource: Some("main".into()),
            command_id: Some("cmd_1".into()),
            input_digest: "sha256:00".into(),
            principal_id: "agent-1".into(),
            principal_kind: "agent".into(),
            accepted_at_ms: 1_700_000_000_000,
            status: PENDING.into(),
            cancel_requested: false,
            stop_requested: false,
            receipt: None,
            error: None,
            finished_at_ms: None,
            running_operation: None,
        }
    }

    fn pending(id: &str) -> Invocation {
        Invocation {
            record: record(id),
            cancel: CancelToken::new(),
            cancellable: true,
        }
    }

    fn parsed(t: Result<CanonicalText, MembersError>) -> Value {
        serde_json::from_str(t.expect("written").as_str()).expect("json")
    }

    #[test]
    fn pending_invocations_are_bounded_and_finishing_frees_a_slot() {
        let mut t = Table::default();
        for i in 0..PENDING_MAX {
            assert!(t.insert(pending(&format!("inv_{i}"))));
        }
        assert!(!t.insert(pending("one_more")));
        let done =
            || Outcome::receipt(Answer::Value(json!({"status": "completed", "error": null})));
        assert!(t
            .finish("inv_0", done(), 1, true)
            .is_some_and(|c| c.is_some()));
        assert!(
            t.finish("inv_0", done(), 2, true).is_none(),
            "finishes once"
        );
        assert!(t.insert(pending("one_more")));
    }

    #[test]
    fn finished_invocations_beyond_the_bound_are_forgotten_oldest_first() {
        let mut t = Table::new(3);
        let done =
            || Outcome::receipt(Answer::Value(json!({"status": "completed", "error": null})));
        for i in 0..10 {
            assert!(t.insert(pending(&format!("inv_{i}"))));
            assert!(t.get(&format!("inv_{i}")).is_some_and(Invocation::pending));
            assert!(t.finish(&format!("inv_{i}"), done(), i, false).is_some());
            assert!(t.finished.len() <= 3, "after inv_{i}");
            // The newest half of the bound (rounded up) is always kept, finished.
            for back in 0..2.min(i + 1) {
                let id = format!("inv_{}", i - back);
                assert!(
                    t.get(&id).is_some_and(|inv| !inv.pending()),
                    "{id} after inv_{i}"
                );
            }
        }
        assert!(t.get("inv_0").is_none());
        assert!(t.pending.is_empty());
        // A finished record is still changed in place (a stop asked of it).
        if let Some(inv) = t.get_mut("inv_9") {
            inv.record.stop_requested = true;
        }
        assert!(t.get("inv_9").is_some_and(|inv| inv.record.stop_requested));
    }

    #[test]
    fn a_pending_record_without_a_receipt_recovers_as_unknown_never_as_stopped() {
        let row = parsed(record("inv_1").write(Form::Row));
        let r = Record::recovered(&row, None).expect("readable");
        assert_eq!(r.status, "unknown");
        assert_eq!(
            r.error.as_ref().map(|e| &e["details"]["stopped"]),
            Some(&json!(false))
        );
        let r = Record::recovered(&row, Some(json!({"status": "completed", "error": null})))
            .expect("readable");
        assert_eq!(r.status, "completed");
        assert!(r.error.is_none());
    }

    #[test]
    fn a_row_reads_back_as_the_record_it_was_written_from() {
        let mut r = record("inv_2");
        r.cancel_requested = true;
        let receipt = CanonicalText::of_value(
            &json!({"status": "failed", "receipt_id": "rcp_1", "operation_id": "op_1",
                    "error": {"mhs_code": "MHS.ADAPTER.DRIVER_FAILED", "details": {"x": 1}}}),
            8,
        )
        .expect("shallow");
        r.finish(
            Outcome::receipt(Answer::Canonical(receipt)),
            1_700_000_000_123,
        );
        assert_eq!(r.status, "failed");
        assert_eq!(
            r.error.as_ref().map(|e| &e["details"]["x"]),
            Some(&json!(1))
        );
        let row = parsed(r.write(Form::Row));
        assert_eq!(row["principal"], json!({"id": "agent-1", "kind": "agent"}));
        let back = Record::recovered(&row, None).expect("readable");
        assert_eq!(parsed(back.write(Form::Row)), row);
        let view = parsed(back.write(Form::View { links: true }));
        assert!(
            view.get("principal").is_none(),
            "the view never shows the principal"
        );
        assert_eq!(view["terminal"], true);
        assert_eq!(view["receipt_id"], "rcp_1");
        assert_eq!(view["operation_id"], "op_1");
        assert_eq!(view["links"]["result"], "/invocations/inv_2/result");
    }

    #[test]
    fn a_receipt_as_deep_as_an_entry_allows_is_written_and_a_deeper_one_refused() {
        let nested = |depth: usize| {
            let mut v = json!(1);
            for _ in 1..depth {
                v = json!([v]);
            }
            json!({"status": "rejected", "output": v})
        };
        let mut r = record("inv_4");
        // A receipt of depth MAX_BODY_DEPTH - 1 sat one level inside its entry.
        r.finish(
            Outcome::receipt(Answer::Value(nested(MAX_BODY_DEPTH - 1))),
            1,
        );
        let row = r.write(Form::Row).expect("fits");
        // The store takes it: it parses back to the same canonical text
        // within the evidence depth bound (what the store re-checks before
        // it writes an entry), and reads as the record.
        let back: Value = serde_json::from_str(row.as_str()).expect("parses");
        let mut again = String::new();
        assert!(
            tether_core::canonical::write_canonical_bounded(&back, &mut again, MAX_BODY_DEPTH)
                .is_ok(),
            "within the store's depth bound"
        );
        assert_eq!(again, row.as_str(), "canonical as stored");
        assert_eq!(back["status"], "rejected");
        let mut deeper = record("inv_5");
        deeper.finish(Outcome::receipt(Answer::Value(nested(MAX_BODY_DEPTH))), 1);
        assert_eq!(deeper.write(Form::Row).err(), Some(MembersError::TooDeep));
    }

    #[test]
    fn a_row_missing_a_member_is_not_read_as_a_record() {
        let mut row = parsed(record("inv_3").write(Form::Row));
        if let Some(o) = row.as_object_mut() {
            o.remove("attempt_id");
        }
        assert_eq!(
            Record::recovered(&row, None).err().as_deref(),
            Some("attempt_id")
        );
    }
}
