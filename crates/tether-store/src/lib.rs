//! # tether-store — Tether's durable state behind one trait
//!
//! **Owns:** the hash-chained evidence log (RFC 8785 canonical JSON + SHA-256,
//! see [`canonical`] and [`verify`]), receipts by `command_id` (stored once,
//! inside the chain entry that records them, see [`ReceiptRef`]), e-stop latches,
//! resource revisions and the budget journal — and the group-commit writer that
//! makes each [`Commit`] durable (fsynced) before its caller is answered. An
//! event body arrives as a JSON value, which the store serialises, or as
//! canonical text the kernel already wrote ([`EventBody::Canonical`]).
//!
//! **Never belongs here:** decisions, policy, limits evaluation, device I/O, or
//! any interpretation of what an event body means. The store records what the
//! kernel tells it to, in order, atomically per commit.
//!
//! **Depends on:** `tether-core` (canonical JSON; [`canonical`] is a
//! transitional re-export of it). **Depended on by:** `tether-kernel` (all
//! durable writes go through [`Store::submit`]) and the CLI's audit commands
//! ([`verify::verify_store`], [`Store::export_chain`]).
//!
//! ## Implementations
//!
//! * [`SqliteStore`] — one SQLite file `tether.db` per state directory, WAL,
//!   and a journal file `tether.journal` beside it. A single writer thread
//!   owns the write connection and the chain head; everything queued is
//!   applied in one transaction and made durable by one fsync (group commit:
//!   of the batch's record in the journal, or of SQLite's WAL for a batch too
//!   large for it), then every caller's `done` runs.
//! * [`PgStore`] — one PostgreSQL database shared by the endpoints of a
//!   fleet, `synchronous_commit=on`; the same writer thread and batching,
//!   one transaction per batch, one evidence chain for the whole store
//!   (each batch locks its head row). See [`postgres`] and docs/STORE.md.
//! * [`MemoryStore`] — the same behaviour (same writer thread and batching)
//!   without durability, for tests and in-process benchmarks.
//!
//! ## Commit semantics
//!
//! A [`Commit`] is atomic: its events, receipts, revisions, latches and budget
//! rows are all stored or none are. Commits are applied in submission order.
//! Events are appended to the chain with contiguous `seq` numbers in the order
//! given. A commit whose receipt `command_id` (or budget `reservation_id`) is
//! already stored fails alone with [`StoreError::Conflict`], and one whose
//! budget draw does not fit in the cap it carries fails alone with
//! [`StoreError::BudgetExceeded`] (the check and the draw are one step of the
//! writer's transaction, see [`BudgetCap`]); the rest of its batch is
//! unaffected. If the batch's transaction fails, every commit in it
//! fails and nothing of the batch is stored.
#![deny(missing_docs)]

pub use tether_core::canonical;
pub mod archive;
pub mod archive_check;
pub mod chain;
pub mod checkpoint;
pub mod deferred;
pub mod faulty;
pub mod lease;
mod memory;
pub mod postgres;
mod prepare;
mod signed;
pub mod slice;
mod sqlite;
pub mod verify;
mod writer;

pub use chain::{GENESIS_PREV_HASH, MAX_BODY_DEPTH, MAX_ENTRY_BYTES};
pub use lease::{LeaseDraft, LeaseHeld, LeaseOp, LeaseRow, Leases};
pub use memory::MemoryStore;
pub use postgres::{PgStore, PG_SCHEMA_VERSION};
pub use prepare::MAX_ITEMS_PER_COMMIT;
pub use sqlite::{
    JournalStats, SqliteStore, DB_FILE_NAME, JOURNAL_FILE_NAME, JOURNAL_SET_ASIDE_FILE_NAME,
    PRESENCE_FILE_NAME, SCHEMA_VERSION,
};
pub use writer::{WriterStats, MAX_BATCH_COMMITS, QUEUE_CAPACITY};

use serde_json::Value;

/// One evidence event to append to the chain. The store assigns `seq`,
/// `ts_ms`, `prev_hash` and `hash`.
#[derive(Debug, Clone, PartialEq)]
pub struct EventDraft {
    /// Event kind, e.g. `command.started`. Must be non-empty.
    pub kind: String,
    /// Event body; must be a JSON object.
    pub body: EventBody,
}

/// The body of an event: a JSON value the store serialises, or an object the
/// kernel already wrote in canonical form (the hot path of a command's
/// receipt, which then never exists as a `Value`).
#[derive(Debug, Clone, PartialEq)]
pub enum EventBody {
    /// A value; must be an object.
    Value(Value),
    /// Canonical text of an object.
    Canonical(CanonicalBody),
}

impl From<Value> for EventBody {
    fn from(v: Value) -> Self {
        EventBody::Value(v)
    }
}

/// An event body already in RFC 8785 canonical form: a
/// [`canonical::CanonicalText`], which only the canonical writer makes, so
/// the store need not parse it again. It still bounds its size and refuses a
/// text that is not an object, and a debug build parses it back and checks
/// it is the canonical object it claims to be and holds the receipt it names
/// (every test run exercises that check).
#[derive(Debug, Clone, PartialEq)]
pub struct CanonicalBody {
    text: String,
    receipt_command_id: Option<String>,
}

impl CanonicalBody {
    /// A body of canonical text `text` (an object, or the commit is refused).
    /// `receipt_command_id` names the `command_id` of the receipt held as
    /// its `receipt` member, when it holds one (what a [`ReceiptRef`] is
    /// checked against).
    pub fn new(text: canonical::CanonicalText, receipt_command_id: Option<String>) -> Self {
        Self {
            text: text.into_string(),
            receipt_command_id,
        }
    }

    /// The canonical text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The `command_id` of the receipt this body holds, if any.
    pub fn receipt_command_id(&self) -> Option<&str> {
        self.receipt_command_id.as_deref()
    }
}

impl EventBody {
    /// The body as a value (parsing canonical text; `Null` if it does not
    /// parse, which canonical text always does).
    pub fn to_value(&self) -> Value {
        match self {
            EventBody::Value(v) => v.clone(),
            EventBody::Canonical(c) => serde_json::from_str(&c.text).unwrap_or(Value::Null),
        }
    }

    /// [`EventBody::to_value`], without copying a value.
    pub fn into_value(self) -> Value {
        match self {
            EventBody::Value(v) => v,
            EventBody::Canonical(c) => serde_json::from_str(&c.text).unwrap_or(Value::Null),
        }
    }
}

/// The stored outcome of one command, keyed by its `command_id`.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceiptRow {
    /// The command's idempotency key.
    pub command_id: String,
    /// `sha256:…` digest of the command's canonical input.
    pub input_digest: String,
    /// The receipt document.
    pub receipt: Value,
}

/// A receipt to retain under its `command_id`, as a commit asks for it.
///
/// The receipt document is stored once: it is the `receipt` member of the
/// body of event number `event` (0-based) of the same commit, i.e. the chain
/// entry that records it. The store indexes that entry by `command_id` and
/// answers [`Store::receipt`] from it; nothing is written twice.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceiptRef {
    /// The command's idempotency key; must equal the receipt's `command_id`.
    pub command_id: String,
    /// `sha256:…` digest of the command's canonical input.
    pub input_digest: String,
    /// Index into the commit's `events` of the entry holding the receipt.
    pub event: usize,
}

/// The current revision of one resource of one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevisionRow {
    /// Device id.
    pub device_id: String,
    /// Resource name on that device.
    pub resource: String,
    /// Revision counter (at most `i64::MAX`, SQLite's integer range).
    pub revision: u64,
}

/// A device's e-stop latch state.
#[derive(Debug, Clone, PartialEq)]
pub struct LatchRow {
    /// Device id (the governed stop may use a reserved id chosen by the kernel).
    pub device_id: String,
    /// Whether the latch is set.
    pub latched: bool,
    /// Who/why/when, as the kernel records it.
    pub info: Value,
}

/// One budget draw (reservation) in the budget journal.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetRow {
    /// Budget key (which budget this draws from).
    pub key: String,
    /// Unique id of this reservation.
    pub reservation_id: String,
    /// Amount drawn; must be finite.
    pub amount: f64,
    /// When the draw was made (milliseconds since the Unix epoch).
    pub ts_ms: u64,
    /// Whether the reservation was released (given back).
    pub released: bool,
    /// The budget this draw must fit in, checked by the store in the
    /// transaction that stores it (see [`BudgetCap`]); `None` records the
    /// draw unconditionally (a copy of a journal). Not stored: rows read
    /// back carry `None`.
    pub cap: Option<BudgetCap>,
}

/// The cap of a budget, carried by each draw so the store itself makes the
/// check and the draw one step: every process on a store draws from one
/// ledger, and two processes drawing at once can never exceed it together.
///
/// **Contract of every backend.** Inside the writer transaction that would
/// store a draw `d` with `cap: Some(c)`, before anything of its commit is
/// written, the backend sums the amounts of the stored draws with the same
/// `key` that are not released and that the window still counts
/// (`ts_ms >= c.counts_from_ms(d.ts_ms)`, every draw when that is `None`) —
/// including draws of earlier commits of the same batch and earlier draws of
/// the same commit — and hands that sum to [`BudgetCap::check`]. A refusal
/// fails that commit alone with [`StoreError::BudgetExceeded`]: nothing of it
/// is stored, the rest of the batch is unaffected. The transaction must hold
/// the store's write lock across the sum and the insert (SQLite's
/// `BEGIN IMMEDIATE`; on a database with concurrent writers, a lock on the
/// key such as `pg_advisory_xact_lock(hashtext(key))`), so no other
/// writer's draw lands in between.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetCap {
    /// Most the key's counted draws may sum to, this draw included; finite
    /// and not negative.
    pub limit: f64,
    /// How long a draw counts, ms; `None`: for as long as the key lives (a
    /// `session` window).
    pub window_ms: Option<u64>,
}

impl BudgetCap {
    /// The earliest `ts_ms` a draw made at `ts_ms` still counts beside it
    /// (inclusive); `None`: every draw of the key counts. A rolling window
    /// counts draws newer than `ts_ms - window_ms`, and every draw before the
    /// first window has elapsed.
    pub fn counts_from_ms(&self, ts_ms: u64) -> Option<u64> {
        self.window_ms
            .and_then(|w| ts_ms.checked_sub(w))
            .map(|cutoff| cutoff.saturating_add(1))
    }

    /// Whether `draw` fits beside `used` (the counted sum of the other
    /// draws): `Err(StoreError::BudgetExceeded)` when it does not. The same
    /// arithmetic as the kernel's own ledger (`limit - used - amount < 0`
    /// refuses), so both sides agree on the edge.
    ///
    /// # Errors
    /// [`StoreError::BudgetExceeded`].
    pub fn check(&self, draw: &BudgetRow, used: f64) -> Result<(), StoreError> {
        if self.limit - used - draw.amount < 0.0 {
            return Err(StoreError::BudgetExceeded(BudgetExceeded {
                key: draw.key.clone(),
                reservation_id: draw.reservation_id.clone(),
                used,
                limit: self.limit,
                amount: draw.amount,
            }));
        }
        Ok(())
    }
}

/// A draw the store refused: its budget's counted draws plus its amount
/// exceed the cap.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetExceeded {
    /// The budget key.
    pub key: String,
    /// The refused reservation.
    pub reservation_id: String,
    /// What the key's counted draws already sum to, in the store.
    pub used: f64,
    /// The cap.
    pub limit: f64,
    /// The refused amount.
    pub amount: f64,
}

// Amounts and caps are finite (`prepare` refuses others) and sums of
// non-negative finite numbers are never NaN, so equality is reflexive.
impl Eq for BudgetExceeded {}

impl std::fmt::Display for BudgetExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "budget {} exceeded: {} drawn + {} requested > {} (reservation {})",
            self.key, self.used, self.amount, self.limit, self.reservation_id
        )
    }
}

/// Everything one decision step wants stored atomically.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Commit {
    /// Events appended to the chain, in this order.
    pub events: Vec<EventDraft>,
    /// Receipts to retain (each inside one of this commit's events); a
    /// `command_id` already stored is a [`StoreError::Conflict`].
    pub receipts: Vec<ReceiptRef>,
    /// Revisions to set (insert or overwrite).
    pub revisions: Vec<RevisionRow>,
    /// Latches to set (insert or overwrite).
    pub latches: Vec<LatchRow>,
    /// Budget draws to insert; a `reservation_id` already stored is a [`StoreError::Conflict`].
    pub budget_draws: Vec<BudgetRow>,
    /// Reservation ids to mark released (applied after `budget_draws`, so a
    /// commit may draw and release the same reservation). Releasing an unknown
    /// or already-released reservation is a no-op, so a release can be retried.
    pub budget_releases: Vec<String>,
    /// Physical operations started (their "started" record); insert or overwrite.
    pub open_ops: Vec<OpenOp>,
    /// Command ids whose open operation finished (deleted; unknown ids are a no-op).
    pub closed_ops: Vec<String>,
    /// Approval records to insert or overwrite (the kernel owns their meaning).
    pub approvals: Vec<ApprovalRow>,
    /// Gateway invocations to record (insert or overwrite by `invocation_id`).
    pub invocations: Vec<InvocationRow>,
    /// Gateway invocations whose record is the body of one of this commit's
    /// events (insert or overwrite by `invocation_id`): stored once, in the
    /// chain, and only indexed here. Applied after `invocations`.
    pub invocation_refs: Vec<InvocationRef>,
    /// Leases to take, renew or give up (see [`lease`]): decided before
    /// anything of the commit is written; one held by another live holder
    /// fails the commit with [`StoreError::LeaseHeld`].
    pub leases: Vec<LeaseDraft>,
}

/// One approval record, stored whole: the kernel's state machine writes the
/// latest version; the chain holds every request, vote and outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalRow {
    /// The approval's id.
    pub approval_id: String,
    /// The record (binding, input digest, principal, votes, status, ...).
    pub record: Value,
}

/// Most entries one [`Store::entries_after`] answers.
pub const ENTRIES_PAGE_MAX: usize = 10_000;

/// Whether an approval record's stored status is closed: used, expired or
/// revoked (a record without a status counts as open, so it is kept and its
/// reader decides).
pub fn approval_is_closed(record: &Value) -> bool {
    matches!(
        record.get("status").and_then(Value::as_str),
        Some("used" | "expired" | "revoked")
    )
}

/// [`Store::approvals_to_restore`] over every record, oldest created first.
pub fn select_to_restore(
    rows: Vec<ApprovalRow>,
    open_max: usize,
    closed_max: usize,
) -> Vec<ApprovalRow> {
    let (mut open_left, mut closed_left) = (open_max, closed_max);
    let mut kept: Vec<ApprovalRow> = rows
        .into_iter()
        .rev()
        .filter(|row| {
            let left = if approval_is_closed(&row.record) {
                &mut closed_left
            } else {
                &mut open_left
            };
            let keep = *left > 0;
            *left = left.saturating_sub(1);
            keep
        })
        .collect();
    kept.reverse();
    kept
}

/// Most approval records one [`Store::approvals_since`] answers; a reader
/// behind by more asks again from the position it was given.
pub const APPROVALS_SINCE_MAX: usize = 4096;

/// One invocation of the REST tool gateway, retained so that its id answers
/// after a restart. The store keeps `info` as given (the gateway decides what
/// it holds: tool, attempt, command id, status, receipt). Written as a value
/// or as canonical text (an object either way, bounded like an event body);
/// always read back as a value.
#[derive(Debug, Clone, PartialEq)]
pub struct InvocationRow {
    /// `inv_<ULID>`, minted by the gateway.
    pub invocation_id: String,
    /// What the gateway needs to answer for it later.
    pub info: EventBody,
}

/// An invocation whose record is the body of one of its commit's events
/// (which must hold `invocation_id`, checked when it is read back). Read
/// back like an [`InvocationRow`], its `info` being that body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvocationRef {
    /// `inv_<ULID>`, minted by the gateway.
    pub invocation_id: String,
    /// Index into the commit's `events` of the entry holding the record.
    pub event: usize,
}

/// A physical operation whose start is durable and whose finish is not yet:
/// after a crash, start-up finds these and records crashed finishes.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenOp {
    /// The command's id.
    pub command_id: String,
    /// What the kernel needs to reconcile it (device, resource, capability, ...).
    pub info: Value,
}

/// Acknowledgement of a durable commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitAck {
    /// `seq` of the commit's first event. For a commit without events this is
    /// `last_seq + 1` (an empty range).
    pub first_seq: u64,
    /// `seq` of the commit's last event (for a commit without events, the
    /// chain head's `seq` at the time, 0 for an empty chain).
    pub last_seq: u64,
    /// Hash of the chain head after this commit.
    pub head_hash: String,
}

/// Callback run once a submitted commit is durable or has failed.
pub type Done = Box<dyn FnOnce(Result<CommitAck, StoreError>) + Send + 'static>;

/// Errors of the store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// A file-system error (creating the state directory, writing an export).
    #[error("store I/O error: {0}")]
    Io(String),
    /// An error reported by SQLite (busy, disk full, I/O, constraint...).
    #[error("store database error: {0}")]
    Sqlite(String),
    /// The commit queue is full; nothing was stored. Retry later.
    #[error("store overloaded: the commit queue is full, nothing was stored; retry later")]
    Overloaded,
    /// The store is shutting down or its writer has stopped; nothing was stored.
    #[error("store is closed; nothing was stored")]
    Closed,
    /// Stored data fails its integrity checks; the store refuses to continue.
    #[error("store is corrupt: {0}")]
    Corrupt(String),
    /// The commit collides with something already stored (e.g. a receipt for
    /// the same `command_id`); nothing of the commit was stored.
    #[error("store conflict: {0}")]
    Conflict(String),
    /// The commit is malformed (e.g. an event body that is not an object);
    /// nothing of it was stored.
    #[error("invalid commit: {0}")]
    Invalid(String),
    /// The database was written by a newer, incompatible version of Tether
    /// (or, for PostgreSQL, holds no schema or an older one: run `tether
    /// store migrate`).
    #[error("unsupported store: {0}")]
    Unsupported(String),
    /// An error reported by PostgreSQL or its connection (refused, lost,
    /// timed out, a constraint); the batch's transaction was rolled back,
    /// so nothing of it was stored.
    #[error("store database error: {0}")]
    Postgres(String),
    /// The link to the database was lost while a `COMMIT` was in flight:
    /// the commit may or may not be stored. Not retryable — a retry could
    /// store it twice; the caller reads the store again (e.g. the receipt
    /// of its `command_id`) to learn what happened.
    #[error("store commit outcome unknown: {0}")]
    Indeterminate(String),
    /// A budget draw of the commit does not fit in its cap (see
    /// [`BudgetCap`]); nothing of the commit was stored.
    #[error("store refused a budget draw: {0}")]
    BudgetExceeded(BudgetExceeded),
    /// A lease of the commit is held by another live holder (see
    /// [`lease`]); nothing of the commit was stored.
    #[error("store refused a lease: {0}")]
    LeaseHeld(LeaseHeld),
}

impl StoreError {
    /// Whether submitting the same commit again may succeed. True for
    /// transient conditions after which nothing was stored: a full queue, or a
    /// database/I/O error that rolled the whole batch back.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            StoreError::Overloaded
                | StoreError::Io(_)
                | StoreError::Sqlite(_)
                | StoreError::Postgres(_)
        )
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Sqlite(e.to_string())
    }
}

impl From<std::io::Error> for StoreError {
    fn from(e: std::io::Error) -> Self {
        StoreError::Io(e.to_string())
    }
}

/// Durable state of one endpoint.
pub trait Store: Send + Sync + 'static {
    /// Queue a commit. `done` is called (from the writer thread) once the
    /// commit is durable or has failed. Never blocks for I/O: a full queue, a
    /// closed store or a malformed commit calls `done(Err(..))` immediately on
    /// the caller's thread. `done` must not block on the store itself (e.g.
    /// call [`Store::commit_blocking`]): it runs on the writer thread.
    fn submit(&self, commit: Commit, done: Done) {
        self.submit_ref(&commit, done);
    }

    /// [`Store::submit`] for a caller that keeps its commit (e.g. to answer
    /// with a document it also records): everything is serialised from the
    /// borrow before this returns, so nothing big is copied.
    fn submit_ref(&self, commit: &Commit, done: Done);

    /// [`Store::submit`] from a caller that waits for the answer with no
    /// bound of its own (a command's admission and receipt). A store whose
    /// writer is idle may apply the commit on the caller's thread before
    /// this returns, sparing the two thread wake-ups of a hand-off (the
    /// SQLite store does; docs/PERFORMANCE.md). Never for a wait with a
    /// deadline, such as an e-stop's latch: a slow disk would hold it.
    fn submit_waiting(&self, commit: Commit, done: Done) {
        self.submit(commit, done);
    }

    /// [`Store::submit_ref`] for a waiting caller ([`Store::submit_waiting`]).
    fn submit_ref_waiting(&self, commit: &Commit, done: Done) {
        self.submit_ref(commit, done);
    }

    /// The writer's counters (batches, commits, the largest batch), for
    /// `GET /metrics`; `None` for a store that keeps none. Atomics only.
    fn writer_stats(&self) -> Option<WriterStats> {
        None
    }

    /// Submit and wait until the commit is durable or failed. Must not be
    /// called from a `done` callback.
    fn commit_blocking(&self, commit: Commit) -> Result<CommitAck, StoreError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.submit(
            commit,
            Box::new(move |r| {
                // The receiver only goes away if the waiting thread did.
                let _ = tx.send(r);
            }),
        );
        // A dropped sender without a result means the writer vanished.
        rx.recv().unwrap_or(Err(StoreError::Closed))
    }

    /// The stored receipt for `command_id`, if any.
    fn receipt(&self, command_id: &str) -> Result<Option<ReceiptRow>, StoreError>;

    /// The most recently stored `limit` receipts as `(command_id,
    /// input_digest)`, oldest first (so inserting them in order into an LRU
    /// leaves the newest hottest), and whether that is all of them.
    fn receipt_digests(&self, limit: usize) -> Result<(Vec<(String, String)>, bool), StoreError>;

    /// All revisions, ordered by `(device_id, resource)`.
    fn revisions(&self) -> Result<Vec<RevisionRow>, StoreError>;

    /// All latches, ordered by `device_id`.
    fn latches(&self) -> Result<Vec<LatchRow>, StoreError>;

    /// The latches as committed, for a check of what *other* processes on
    /// the store wrote (this process's own are in its memory): it does not
    /// wait for commits this process has answered and not yet committed
    /// (the SQLite store's held transaction, during which no other process
    /// can commit). Otherwise as [`Store::latches`].
    fn latches_committed(&self) -> Result<Vec<LatchRow>, StoreError> {
        self.latches()
    }

    /// Operations started and not finished (see [`OpenOp`]).
    fn open_ops(&self) -> Result<Vec<OpenOp>, StoreError>;

    /// Every approval record, oldest first.
    fn approvals(&self) -> Result<Vec<ApprovalRow>, StoreError>;

    /// What a restart keeps of the approvals, oldest created first: the
    /// `open_max` newest records whose stored status is not closed (see
    /// [`approval_is_closed`]: pending, approved and denied ones, a denial
    /// being final for its request) and the `closed_max` newest closed ones
    /// (used, expired, revoked). The store keeps every record; memory keeps
    /// what can still matter, so a restart on a store of many decided
    /// approvals holds a bounded table.
    fn approvals_to_restore(
        &self,
        open_max: usize,
        closed_max: usize,
    ) -> Result<Vec<ApprovalRow>, StoreError> {
        Ok(select_to_restore(self.approvals()?, open_max, closed_max))
    }

    /// Approval records written (created, voted on, used, revoked) by any
    /// process after chain position `after`, oldest write first, at most
    /// [`APPROVALS_SINCE_MAX`]; with the newest position among them (`after`
    /// when none). An endpoint keeps the position and asks again with it.
    fn approvals_since(&self, after: u64) -> Result<(Vec<ApprovalRow>, u64), StoreError>;

    /// The stored record of approval `approval_id`, if any: for an approval
    /// a restart did not read back into memory (an old closed one). The
    /// provided version scans [`Store::approvals`]; the SQL stores look the
    /// key up.
    fn approval(&self, approval_id: &str) -> Result<Option<ApprovalRow>, StoreError> {
        Ok(self
            .approvals()?
            .into_iter()
            .find(|r| r.approval_id == approval_id))
    }

    /// The recorded invocation `invocation_id`, if any.
    fn invocation(&self, invocation_id: &str) -> Result<Option<InvocationRow>, StoreError>;

    /// Budget rows with `ts_ms >= ts_ms`, oldest first.
    fn budget_rows_since(&self, ts_ms: u64) -> Result<Vec<BudgetRow>, StoreError>;

    /// What the stored draws of budget `key` that are not released and have
    /// `ts_ms >= from_ms` (every one when `None`) sum to: the amount a
    /// [`BudgetCap`] counts, as every process on the store has drawn it.
    /// Outside a write transaction, so only an estimate for a pre-check; the
    /// check that binds is the writer's (see [`BudgetCap`]). The provided
    /// version scans [`Store::budget_rows_since`]; a backend with an index on
    /// `(key, ts_ms)` answers it with one query.
    fn budget_used(&self, key: &str, from_ms: Option<u64>) -> Result<f64, StoreError> {
        Ok(self
            .budget_rows_since(from_ms.unwrap_or(0))?
            .iter()
            .filter(|r| r.key == key && !r.released)
            .map(|r| r.amount)
            .sum())
    }

    /// `(seq, hash)` of the last chain entry, `None` for an empty chain.
    fn chain_head(&self) -> Result<Option<(u64, String)>, StoreError>;

    /// The last `n` entries (with `hash`), oldest first.
    fn chain_tail(&self, n: usize) -> Result<Vec<Value>, StoreError>;

    /// Write the chain as JSON Lines (one canonical entry per line, in `seq`
    /// order) up to the head at the time of the call, closed by the export's
    /// seal line ([`verify::EXPORT_SEAL_KIND`]); returns the count of entries
    /// (the seal not included).
    fn export_chain(&self, out: &mut dyn std::io::Write) -> Result<u64, StoreError>;

    /// At most `limit` (≤ [`ENTRIES_PAGE_MAX`]) chain entries with `seq >
    /// after`, in `seq` order, as stored (one canonical line each, with its
    /// `hash` and `prev_hash`): `tether audit export --follow` tails the
    /// chain with it.
    fn entries_after(&self, after: u64, limit: usize) -> Result<Vec<(u64, String)>, StoreError> {
        let _ = (after, limit);
        Err(StoreError::Unsupported(
            "this store cannot page its entries".into(),
        ))
    }

    /// True when an acknowledged commit survives a crash (SQLite), false for memory.
    fn durable(&self) -> bool;

    /// A cheap value that changes whenever a commit landed (from this
    /// process or another one on the same store) since it was last read. The
    /// governed-stop watcher polls it and re-reads the latches only on change.
    fn change_token(&self) -> Result<u64, StoreError>;

    /// Every lease the store holds, with the store's clock (see [`lease`]).
    /// A backend that keeps none says so: nothing may be judged free on it.
    fn leases(&self) -> Result<Leases, StoreError> {
        Err(StoreError::Unsupported(
            "this store keeps no leases (device ownership)".into(),
        ))
    }

    /// Waits until a commit may have landed (from any process) or `timeout`
    /// has passed, whichever is first; the governed-stop watcher calls it
    /// between reads of [`Store::change_token`]. The provided version
    /// sleeps `timeout`; a backend that can be told of commits (PostgreSQL's
    /// `LISTEN`) returns as soon as one is announced.
    fn wait_change(&self, timeout: std::time::Duration) {
        std::thread::sleep(timeout);
    }

    /// The newest archive the store records ([`archive::ArchiveAnchor`]):
    /// its chain starts one past `through_seq`. `None` when nothing was
    /// archived (the chain starts at seq 1).
    fn archive_anchor(&self) -> Result<Option<archive::ArchiveAnchor>, StoreError> {
        Ok(None)
    }

    /// The transaction of [`archive::archive`], once the archive file is
    /// written and verified: in one transaction, checks that the store still
    /// starts at `anchor.first_seq` (no other archive ran meanwhile) and that
    /// its entry at `anchor.through_seq` has `anchor.through_hash`, copies the
    /// receipt documents and invocation records held by the entries up to
    /// `anchor.through_seq` into their index rows, deletes those entries and
    /// records `anchor`. A backend that cannot archive says so.
    fn archive_commit(
        &self,
        anchor: &archive::ArchiveAnchor,
    ) -> Result<archive::ArchiveCommitted, StoreError> {
        let _ = anchor;
        Err(StoreError::Unsupported(
            "this store cannot archive its entries".into(),
        ))
    }

    /// How long [`Store::wait_change`] may wait between reads: the poll
    /// interval of the governed-stop watcher on this backend, ms.
    fn change_poll_ms(&self) -> u64 {
        2
    }
}
