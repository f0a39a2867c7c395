//! Validation and serialisation of a commit on the submitting thread.
//!
//! Everything that does not depend on the chain head (checking shapes and
//! bounds, writing event bodies, receipts and latch infos as canonical JSON)
//! happens in `submit`, in parallel across callers. The single writer thread
//! is then left with only what must be serial: assigning `seq`, hashing with
//! `prev_hash`, and the SQL.

use crate::chain::{kind_json, MAX_BODY_DEPTH, MAX_ENTRY_BYTES};
use crate::{
    BudgetRow, CanonicalBody, Commit, EventBody, LatchRow, ReceiptRef, RevisionRow, StoreError,
};
use serde_json::Value;
use std::collections::HashSet;
use tether_core::canonical::write_canonical_bounded;

/// Most items of each kind (events, receipts, revisions, latches, budget
/// draws, budget releases) in one commit. Bounds the work one commit adds to a
/// batch; a decision step needs a handful.
pub const MAX_ITEMS_PER_COMMIT: usize = 4096;

/// Room in an entry for everything but the body and kind: members, hashes,
/// numbers.
const ENTRY_OVERHEAD: usize = 256;

pub(crate) struct PreparedEvent {
    pub kind_json: String,
    pub body_json: String,
}

pub(crate) struct PreparedReceipt {
    pub row: ReceiptRef,
}

pub(crate) struct PreparedLatch {
    pub row: LatchRow,
    pub info_json: String,
}

/// A validated commit with its JSON already serialised.
pub(crate) struct Prepared {
    pub events: Vec<PreparedEvent>,
    pub receipts: Vec<PreparedReceipt>,
    pub revisions: Vec<RevisionRow>,
    pub latches: Vec<PreparedLatch>,
    pub budget_draws: Vec<BudgetRow>,
    pub budget_releases: Vec<String>,
    pub open_ops: Vec<(crate::OpenOp, String)>,
    pub closed_ops: Vec<String>,
    pub approvals: Vec<(crate::ApprovalRow, String)>,
    /// `(invocation_id, info_json)`.
    pub invocations: Vec<(String, String)>,
    pub invocation_refs: Vec<crate::InvocationRef>,
    /// Each lease draft with its info as JSON text (empty for a release).
    pub leases: Vec<(crate::LeaseDraft, String)>,
}

impl Prepared {
    /// A commit with nothing in it (filled by the journal's reader).
    pub(crate) fn empty() -> Self {
        Self {
            events: Vec::new(),
            receipts: Vec::new(),
            revisions: Vec::new(),
            latches: Vec::new(),
            budget_draws: Vec::new(),
            budget_releases: Vec::new(),
            open_ops: Vec::new(),
            closed_ops: Vec::new(),
            approvals: Vec::new(),
            invocations: Vec::new(),
            invocation_refs: Vec::new(),
            leases: Vec::new(),
        }
    }
}

fn invalid(msg: impl Into<String>) -> StoreError {
    StoreError::Invalid(msg.into())
}

/// Canonical JSON of `v`, refusing nesting deeper than [`MAX_BODY_DEPTH`] and
/// text longer than [`MAX_ENTRY_BYTES`].
fn bounded_json(v: &Value, what: &str) -> Result<String, StoreError> {
    let mut s = String::with_capacity(128);
    write_canonical_bounded(v, &mut s, MAX_BODY_DEPTH).map_err(|_| {
        invalid(format!(
            "{what} is nested deeper than {MAX_BODY_DEPTH} levels"
        ))
    })?;
    if s.len() > MAX_ENTRY_BYTES {
        return Err(invalid(format!(
            "{what} is larger than {MAX_ENTRY_BYTES} bytes"
        )));
    }
    Ok(s)
}

/// Whether a body (an event's, or an invocation's info) is a JSON object.
fn is_object(body: &EventBody) -> bool {
    match body {
        EventBody::Value(v) => v.is_object(),
        EventBody::Canonical(c) => c.text().starts_with('{'),
    }
}

/// A body's JSON text and its length: a value written canonically (depth-
/// and size-bounded, as `what`), canonical text checked (debug builds) and
/// copied — or, without `copy`, left empty for `prepare_owned` to move in.
fn body_json(body: &EventBody, what: &str, copy: bool) -> Result<(String, usize), StoreError> {
    match body {
        EventBody::Value(v) => {
            let text = bounded_json(v, what)?;
            let len = text.len();
            Ok((text, len))
        }
        EventBody::Canonical(c) => {
            debug_check_canonical(c);
            let text = if copy {
                c.text().to_owned()
            } else {
                String::new()
            };
            Ok((text, c.text().len()))
        }
    }
}

/// A debug build checks what a release build trusts: that a canonical body
/// (an event's, or an invocation's info) is an object, is the canonical text
/// of what it parses to, fits the depth bound, and holds the receipt it names.
fn debug_check_canonical(body: &CanonicalBody) {
    // `debug_assert!` evaluates its condition in debug builds only.
    debug_assert_eq!(canonical_defect(body), None, "{}", body.text());
}

/// What is wrong with a body that claims to be canonical, if anything (see
/// [`debug_check_canonical`]).
fn canonical_defect(body: &CanonicalBody) -> Option<String> {
    let parsed: Value = match serde_json::from_str(body.text()) {
        Ok(v) => v,
        Err(e) => return Some(format!("a canonical event body does not parse: {e}")),
    };
    if !parsed.is_object() {
        return Some("a canonical event body is not an object".into());
    }
    let mut again = String::with_capacity(body.text().len());
    if write_canonical_bounded(&parsed, &mut again, MAX_BODY_DEPTH).is_err() {
        return Some(format!(
            "a canonical event body is nested deeper than {MAX_BODY_DEPTH}"
        ));
    }
    if again != body.text() {
        return Some("an event body claimed canonical is not".into());
    }
    let held = parsed
        .get("receipt")
        .and_then(|r| r.get("command_id"))
        .and_then(Value::as_str);
    match body.receipt_command_id() {
        Some(id) if held != Some(id) => {
            Some("a canonical body does not hold the receipt it names".into())
        }
        _ => None,
    }
}

fn fits_i64(v: u64, what: &str) -> Result<(), StoreError> {
    if v > i64::MAX as u64 {
        return Err(invalid(format!(
            "{what} {v} exceeds the storable range (at most {})",
            i64::MAX
        )));
    }
    Ok(())
}

/// Checks that receipt `r` points at an event of the commit whose body holds
/// it: a `receipt` object whose `command_id` is the row's.
fn check_receipt_ref(r: &ReceiptRef, events: &[crate::EventDraft]) -> Result<(), StoreError> {
    let Some(event) = events.get(r.event) else {
        return Err(invalid(format!(
            "receipt {:?} points at event {} of a commit with {} events",
            r.command_id,
            r.event,
            events.len()
        )));
    };
    let held = match &event.body {
        EventBody::Value(body) => body
            .get("receipt")
            .and_then(|d| d.get("command_id"))
            .and_then(Value::as_str),
        EventBody::Canonical(body) => body.receipt_command_id(),
    };
    if held != Some(r.command_id.as_str()) {
        return Err(invalid(format!(
            "event {} ({:?}) does not hold the receipt of command_id {:?} as its `receipt` member",
            r.event, event.kind, r.command_id
        )));
    }
    Ok(())
}

/// Validates and serialises `c` from a borrow: event bodies become canonical
/// text, rows are copied (they are small). Receipt documents stay in their
/// event bodies, where every backend reads them back.
pub(crate) fn prepare(c: &Commit) -> Result<Prepared, StoreError> {
    prepare_parts(c, true)
}

/// [`prepare`] for a commit the caller gives up: canonical bodies and the
/// rows are moved instead of copied (the kernel's path for a command's
/// receipt, whose body is already canonical text).
pub(crate) fn prepare_owned(c: Commit) -> Result<Prepared, StoreError> {
    let mut p = prepare_parts(&c, false)?;
    debug_assert_eq!(p.events.len(), c.events.len());
    for (prepared, e) in p.events.iter_mut().zip(c.events) {
        if let EventBody::Canonical(body) = e.body {
            prepared.body_json = body.text;
        }
    }
    p.receipts = c
        .receipts
        .into_iter()
        .map(|row| PreparedReceipt { row })
        .collect();
    p.revisions = c.revisions;
    p.budget_draws = c.budget_draws;
    p.budget_releases = c.budget_releases;
    p.closed_ops = c.closed_ops;
    debug_assert_eq!(p.invocations.len(), c.invocations.len());
    for (prepared, row) in p.invocations.iter_mut().zip(c.invocations) {
        if let EventBody::Canonical(info) = row.info {
            prepared.1 = info.text;
        }
    }
    Ok(p)
}

/// Validates `c` and serialises its JSON. With `copy`, canonical bodies and
/// the plain rows (receipts, revisions, budget rows, closed operations) are
/// copied into the result; without, they are left empty for
/// [`prepare_owned`] to move in.
fn prepare_parts(c: &Commit, copy: bool) -> Result<Prepared, StoreError> {
    check_counts(c)?;
    let events = prepare_events(&c.events, copy)?;
    check_receipts(&c.receipts, &c.events)?;
    check_budget_draws(&c.budget_draws)?;
    for r in &c.revisions {
        fits_i64(r.revision, "revision")?;
    }
    let receipts = copied(copy, &c.receipts)
        .into_iter()
        .map(|row| PreparedReceipt { row })
        .collect();
    let latches = c
        .latches
        .iter()
        .map(|row| {
            Ok(PreparedLatch {
                info_json: bounded_json(&row.info, "latch info")?,
                row: row.clone(),
            })
        })
        .collect::<Result<_, StoreError>>()?;
    let open_ops = c
        .open_ops
        .iter()
        .map(|op| Ok((op.clone(), bounded_json(&op.info, "open operation info")?)))
        .collect::<Result<_, StoreError>>()?;
    let approvals = c
        .approvals
        .iter()
        .map(|a| Ok((a.clone(), bounded_json(&a.record, "approval record")?)))
        .collect::<Result<_, StoreError>>()?;
    let invocations = prepare_invocations(&c.invocations, copy)?;
    check_invocation_refs(&c.invocation_refs, c.events.len())?;
    let leases = prepare_leases(&c.leases)?;
    Ok(Prepared {
        leases,
        approvals,
        events,
        receipts,
        revisions: copied(copy, &c.revisions),
        latches,
        budget_draws: copied(copy, &c.budget_draws),
        budget_releases: copied(copy, &c.budget_releases),
        open_ops,
        closed_ops: copied(copy, &c.closed_ops),
        invocations,
        invocation_refs: c.invocation_refs.clone(),
    })
}

/// Each lease draft checked, with its info serialised.
fn prepare_leases(
    drafts: &[crate::LeaseDraft],
) -> Result<Vec<(crate::LeaseDraft, String)>, StoreError> {
    crate::lease::check_drafts(drafts)?;
    drafts
        .iter()
        .map(|d| {
            let info = match &d.op {
                crate::LeaseOp::Hold { info, .. } => bounded_json(info, "lease info")?,
                crate::LeaseOp::Release => String::new(),
            };
            Ok((d.clone(), info))
        })
        .collect()
}

/// `rows` copied with `copy`, else empty (for [`prepare_owned`] to move in).
fn copied<T: Clone>(copy: bool, rows: &[T]) -> Vec<T> {
    if copy {
        rows.to_vec()
    } else {
        Vec::new()
    }
}

/// No kind of item exceeds [`MAX_ITEMS_PER_COMMIT`].
fn check_counts(c: &Commit) -> Result<(), StoreError> {
    let counts = [
        ("events", c.events.len()),
        ("receipts", c.receipts.len()),
        ("revisions", c.revisions.len()),
        ("latches", c.latches.len()),
        ("budget_draws", c.budget_draws.len()),
        ("budget_releases", c.budget_releases.len()),
        ("open_ops", c.open_ops.len()),
        ("closed_ops", c.closed_ops.len()),
        ("approvals", c.approvals.len()),
        ("invocations", c.invocations.len()),
        ("invocation_refs", c.invocation_refs.len()),
        ("leases", c.leases.len()),
    ];
    for (what, n) in counts {
        if n > MAX_ITEMS_PER_COMMIT {
            return Err(invalid(format!(
                "{n} {what} in one commit (at most {MAX_ITEMS_PER_COMMIT})"
            )));
        }
    }
    Ok(())
}

/// Each event checked (a kind, an object body, within the entry size) and
/// serialised.
fn prepare_events(
    events: &[crate::EventDraft],
    copy: bool,
) -> Result<Vec<PreparedEvent>, StoreError> {
    let mut out = Vec::with_capacity(events.len());
    for e in events {
        if e.kind.is_empty() {
            return Err(invalid("event kind is empty"));
        }
        if !is_object(&e.body) {
            return Err(invalid(format!(
                "body of event {:?} is not a JSON object",
                e.kind
            )));
        }
        let (body_json, body_len) = body_json(&e.body, "event body", copy)?;
        let kind_json = kind_json(&e.kind);
        if body_len + kind_json.len() + ENTRY_OVERHEAD > MAX_ENTRY_BYTES {
            return Err(invalid(format!(
                "event {:?} is larger than {MAX_ENTRY_BYTES} bytes",
                e.kind
            )));
        }
        out.push(PreparedEvent {
            kind_json,
            body_json,
        });
    }
    Ok(out)
}

/// Receipts name a command, once per commit, each held by its own event.
fn check_receipts(receipts: &[ReceiptRef], events: &[crate::EventDraft]) -> Result<(), StoreError> {
    let mut seen: HashSet<&str> = HashSet::with_capacity(receipts.len());
    let mut holders: HashSet<usize> = HashSet::with_capacity(receipts.len());
    for r in receipts {
        if r.command_id.is_empty() {
            return Err(invalid("receipt command_id is empty"));
        }
        if !seen.insert(&r.command_id) {
            return Err(StoreError::Conflict(format!(
                "two receipts for command_id {:?} in one commit",
                r.command_id
            )));
        }
        check_receipt_ref(r, events)?;
        if !holders.insert(r.event) {
            return Err(invalid(format!(
                "two receipts point at event {} of one commit",
                r.event
            )));
        }
    }
    Ok(())
}

/// Budget draws name a reservation, once per commit, with a finite amount,
/// a storable time and, when capped, a finite cap.
fn check_budget_draws(draws: &[BudgetRow]) -> Result<(), StoreError> {
    let mut seen: HashSet<&str> = HashSet::with_capacity(draws.len());
    for b in draws {
        if b.reservation_id.is_empty() {
            return Err(invalid("budget reservation_id is empty"));
        }
        if !b.amount.is_finite() {
            return Err(invalid(format!(
                "budget reservation {:?} amount is not finite",
                b.reservation_id
            )));
        }
        fits_i64(b.ts_ms, "budget ts_ms")?;
        if let Some(cap) = &b.cap {
            // A cap the store could not compare against refuses the draw
            // rather than letting it through unchecked.
            if !cap.limit.is_finite() || cap.limit < 0.0 {
                return Err(invalid(format!(
                    "budget reservation {:?} has a cap that is not a finite, non-negative number",
                    b.reservation_id
                )));
            }
        }
        if !seen.insert(&b.reservation_id) {
            return Err(StoreError::Conflict(format!(
                "two budget draws with reservation_id {:?} in one commit",
                b.reservation_id
            )));
        }
    }
    Ok(())
}

/// Each invocation checked (an id, an object info within the entry size)
/// and serialised, as `(invocation_id, info_json)`.
fn prepare_invocations(
    rows: &[crate::InvocationRow],
    copy: bool,
) -> Result<Vec<(String, String)>, StoreError> {
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        if row.invocation_id.is_empty() {
            return Err(invalid("invocation_id is empty"));
        }
        if !is_object(&row.info) {
            return Err(invalid("invocation info is not a JSON object"));
        }
        let (info_json, info_len) = body_json(&row.info, "invocation info", copy)?;
        if info_len > MAX_ENTRY_BYTES {
            return Err(invalid(format!(
                "invocation info is larger than {MAX_ENTRY_BYTES} bytes"
            )));
        }
        out.push((row.invocation_id.clone(), info_json));
    }
    Ok(out)
}

/// Invocation references name an invocation and point at one of the
/// commit's `event_count` events.
fn check_invocation_refs(
    refs: &[crate::InvocationRef],
    event_count: usize,
) -> Result<(), StoreError> {
    for r in refs {
        if r.invocation_id.is_empty() {
            return Err(invalid("invocation_id is empty"));
        }
        if r.event >= event_count {
            return Err(invalid(format!(
                "invocation {:?} points at event {} of a commit with {} events",
                r.invocation_id, r.event, event_count
            )));
        }
    }
    Ok(())
}
