//! The writer's side of the SQLite store: the backend the group-commit
//! writer drives. One batch is one `BEGIN IMMEDIATE` … `COMMIT`; each of its
//! commits is checked for conflicts with what is stored, then its entries
//! are sealed onto the chain and its rows written. A batch's record is
//! flushed in the journal before `COMMIT`, which then does not flush
//! (`journal`).
//!
//! Never here: validation or serialisation of a commit (done on the caller's
//! thread, in `prepare`), or reads answered to callers (`read`).

mod replay;

use super::head::{load_head, seq_from_db, seq_to_db, Head};
use super::journal::{self, Journal};
use crate::chain::seal;
use crate::prepare::{PreparedEvent, PreparedLatch, PreparedReceipt};
use crate::writer::{Backend, Job};
use crate::{ApprovalRow, BudgetRow, CommitAck, InvocationRef, OpenOp, RevisionRow, StoreError};
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// The journal's counters, read by [`super::SqliteStore::journal_stats`].
#[derive(Debug, Default)]
pub(super) struct JournalCounters {
    pub records: AtomicU64,
    pub restarts: AtomicU64,
    pub replayed: AtomicU64,
    pub flushed_batches: AtomicU64,
    /// Records applied from a journal a dead process left (`adopt_journal`).
    pub adopted: AtomicU64,
    /// Whether this process writes the journal now.
    pub active: AtomicBool,
    /// Off, every batch commits with SQLite's flush (a benchmark's switch:
    /// [`super::SqliteStore::set_journal`]).
    pub off: AtomicBool,
    /// Tests only ([`super::SqliteStore::crash_after_next_record`]): the next
    /// journalled batch stops as a killed process would, after its record.
    pub crash_after_record: AtomicBool,
}

/// The writer's backend: the only write connection and the chain it extends.
pub(super) struct SqliteBackend {
    conn: Connection,
    chain: ChainState,
    journal: Option<Journal>,
    /// The connection's `synchronous` setting: `FULL` (SQLite flushes its
    /// WAL at `COMMIT`) when true, `NORMAL` (the journal flushed) when false.
    full_sync: bool,
    /// A journalled batch's record: its index, time and heads, then its
    /// commits.
    record_meta: Vec<u8>,
    record_body: Vec<u8>,
    counters: Arc<JournalCounters>,
    /// The state directory, while another process writes its journal: that
    /// process may die between a record's flush and its commit, and this
    /// one must then apply the record before anything of its own
    /// (`adopt_journal`).
    adopt_from: Option<PathBuf>,
    /// Stopped as a killed process would (tests only): every batch fails.
    crashed: bool,
}

/// The writer's state beside its connection (kept apart so a batch can hold
/// statements prepared on the connection while it advances the chain).
struct ChainState {
    head: Head,
    /// Reused buffer for sealing entries.
    scratch: String,
    /// Highest revision per `(device_id, resource)` among the batch's
    /// commits so far (only those that succeeded alone).
    batch_revisions: HashMap<(String, String), u64>,
}

/// The statements every command's commit runs, prepared once per batch
/// instead of looked up in the statement cache once per commit.
struct HotStatements<'c> {
    receipt_exists: rusqlite::CachedStatement<'c>,
    insert_event: rusqlite::CachedStatement<'c>,
    insert_receipt: rusqlite::CachedStatement<'c>,
}

impl<'c> HotStatements<'c> {
    fn prepare(conn: &'c Connection) -> Result<Self, StoreError> {
        Ok(Self {
            receipt_exists: conn.prepare_cached("SELECT 1 FROM receipts WHERE command_id = ?1")?,
            insert_event: conn
                .prepare_cached("INSERT INTO events(seq, hash, line) VALUES (?1, ?2, ?3)")?,
            insert_receipt: conn.prepare_cached(
                "INSERT INTO receipts(seq, command_id, input_digest) VALUES (?1, ?2, ?3)",
            )?,
        })
    }
}

impl Backend for SqliteBackend {
    fn apply_batch(
        &mut self,
        batch: &[Job],
        ts_ms: u64,
        results: &mut Vec<Result<CommitAck, StoreError>>,
    ) -> Result<(), StoreError> {
        let saved = self.chain.head.clone();
        let journalled = self.encode_record(batch);
        let outcome = self
            .set_full_sync(!journalled)
            .and_then(|()| self.try_batch(batch, ts_ms, results, journalled));
        if outcome.is_err() {
            // Nothing of the batch may survive: undo the transaction (harmless
            // if BEGIN itself failed) and the head advanced by it.
            let _ = self.conn.execute_batch("ROLLBACK");
            self.chain.head = saved;
            results.clear();
        }
        outcome
    }
}

impl SqliteBackend {
    /// The backend of a freshly opened store whose chain ends at `head`,
    /// writing `journal` when this process may.
    pub(super) fn new(
        conn: Connection,
        head: Head,
        journal: Option<Journal>,
        counters: Arc<JournalCounters>,
        adopt_from: Option<PathBuf>,
    ) -> Self {
        counters.active.store(journal.is_some(), Ordering::Relaxed);
        Self {
            conn,
            chain: ChainState {
                head,
                scratch: String::with_capacity(256),
                batch_revisions: HashMap::new(),
            },
            journal,
            // `SqliteStore::open` sets FULL on the connection.
            full_sync: true,
            record_meta: Vec::with_capacity(256),
            record_body: Vec::with_capacity(4096),
            counters,
            adopt_from,
            crashed: false,
        }
    }

    /// Whether the batch goes through the journal: there is one, it is on,
    /// and the record fits. If so, its commits are in `record_body`.
    fn encode_record(&mut self, batch: &[Job]) -> bool {
        // The index, time and heads take at most this much beside the commits
        // (a head is a seq and a 64-digit hash).
        const META_MAX: usize = 8 * 4 + 4 * 2 + 2 * 128;
        let Some(j) = &self.journal else { return false };
        if self.counters.off.load(Ordering::Relaxed) {
            return false;
        }
        journal::encode_commits(&mut self.record_body, batch.iter().map(|job| &job.commit));
        j.fits(self.record_body.len() + META_MAX)
    }

    fn set_full_sync(&mut self, full: bool) -> Result<(), StoreError> {
        if self.full_sync != full {
            let value = if full { "FULL" } else { "NORMAL" };
            self.conn.pragma_update(None, "synchronous", value)?;
            self.full_sync = full;
        }
        Ok(())
    }

    fn try_batch(
        &mut self,
        batch: &[Job],
        ts_ms: u64,
        results: &mut Vec<Result<CommitAck, StoreError>>,
        journalled: bool,
    ) -> Result<(), StoreError> {
        if self.crashed {
            return Err(StoreError::Closed);
        }
        // IMMEDIATE takes the write lock now, so the head check below cannot
        // race with another process appending.
        self.conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        self.reconcile_head()?;
        // Only a store without the journal adopts one: its batch commits
        // with SQLite's flush, below.
        let adopted = self.adopt_journal()?;
        let start = self.chain.head.clone();
        self.apply_jobs(batch, ts_ms, results)?;
        let Some(j) = self.journal.as_mut().filter(|_| journalled) else {
            // SQLite's flush of its WAL covers every earlier record too.
            commit(&self.conn)?;
            if let Some(adopted) = adopted {
                self.take_over(adopted);
            }
            if let Some(j) = self.journal.as_mut() {
                j.covered();
                self.counters
                    .flushed_batches
                    .fetch_add(1, Ordering::Relaxed);
            }
            return Ok(());
        };
        let at_position = j.position();
        record_journal_at(&self.conn, at_position)?;
        let (meta, head) = (&mut self.record_meta, &self.chain.head);
        journal::encode_meta(meta, at_position.index, ts_ms, &start, head);
        let at = j.append(&self.record_meta, &self.record_body)?;
        if self.counters.crash_after_record.load(Ordering::Relaxed) {
            return Err(self.crash());
        }
        if let Err(e) = commit(&self.conn) {
            // Its callers are told it failed: the record must not stand.
            j.void(at);
            return Err(e);
        }
        self.counters
            .records
            .store(j.records_written, Ordering::Relaxed);
        self.counters.restarts.store(j.restarts, Ordering::Relaxed);
        Ok(())
    }

    /// The batch's statements inside the open transaction: each commit, then
    /// the revisions gathered and the head recorded.
    fn apply_jobs(
        &mut self,
        batch: &[Job],
        ts_ms: u64,
        results: &mut Vec<Result<CommitAck, StoreError>>,
    ) -> Result<(), StoreError> {
        self.chain.batch_revisions.clear();
        {
            let mut hot = HotStatements::prepare(&self.conn)?;
            for job in batch {
                let r = apply_one(&self.conn, &mut self.chain, &mut hot, job, ts_ms)?;
                results.push(r);
            }
        }
        self.write_batch_revisions()?;
        self.record_head()
    }

    /// Keeps the chain's head (seq and hash) in `meta`, in the same
    /// transaction as the entries: a hash chain cannot show that entries were
    /// cut from its end, so the head recorded beside it is what lets start-up
    /// and `audit verify` notice a shortened chain.
    fn record_head(&mut self) -> Result<(), StoreError> {
        let head = &self.chain.head;
        if head.seq == 0 {
            return Ok(());
        }
        self.conn
            .prepare_cached(
                "INSERT INTO meta(key, value) VALUES ('chain_head', ?1)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            )?
            .execute([format!("{} {}", head.seq, head.hash)])?;
        Ok(())
    }

    /// The batch's revisions, one upsert per resource.
    fn write_batch_revisions(&mut self) -> Result<(), StoreError> {
        if self.chain.batch_revisions.is_empty() {
            return Ok(());
        }
        let mut upsert = self.conn.prepare_cached(
            // Another process may have written a higher one: keep the highest.
            "INSERT INTO revisions(device_id, resource, revision) VALUES (?1, ?2, ?3)
             ON CONFLICT(device_id, resource) DO UPDATE SET revision = MAX(revision, excluded.revision)",
        )?;
        for ((device_id, resource), revision) in self.chain.batch_revisions.drain() {
            // prepare() checked the range, so the conversion cannot fail.
            upsert.execute(params![device_id, resource, seq_to_db(revision)?])?;
        }
        Ok(())
    }

    /// Another process may share the file (the design allows several on one
    /// store). If it appended entries since our last batch, continue from the
    /// database's head instead of forking the chain.
    fn reconcile_head(&mut self) -> Result<(), StoreError> {
        let db: Option<(i64, String)> = self
            .conn
            .prepare_cached("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1")?
            .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        let db_seq = match &db {
            Some((s, _)) => seq_from_db(*s)?,
            None => 0,
        };
        let same = match &db {
            Some((_, h)) => db_seq == self.chain.head.seq && *h == self.chain.head.hash,
            None => self.chain.head.seq == 0,
        };
        if same {
            return Ok(());
        }
        if db_seq > self.chain.head.seq {
            self.chain.head = load_head(&self.conn)?;
            return Ok(());
        }
        Err(StoreError::Corrupt(format!(
            "the database chain head (seq {db_seq}) disagrees with the writer's (seq {})",
            self.chain.head.seq
        )))
    }
}
/// Records, in the batch's transaction, the journal position of its record.
fn record_journal_at(conn: &Connection, at: journal::Position) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO meta(key, value) VALUES ('journal_at', ?1)
         ON CONFLICT(key) DO UPDATE SET value = excluded.value",
    )?
    .execute([at.to_string()])?;
    Ok(())
}

/// The journal position of the last record the database committed.
fn read_journal_at(conn: &Connection) -> Result<Option<journal::Position>, StoreError> {
    let value: Option<String> = conn
        .query_row("SELECT value FROM meta WHERE key = 'journal_at'", [], |r| {
            r.get(0)
        })
        .optional()?;
    value
        .map(|v| {
            v.parse().map_err(|()| {
                StoreError::Corrupt(format!(
                    "the recorded journal position {v:?} is not `GEN INDEX`"
                ))
            })
        })
        .transpose()
}

fn commit(conn: &Connection) -> Result<(), StoreError> {
    conn.prepare_cached("COMMIT")?.execute([])?;
    Ok(())
}

/// Apply one commit inside the open transaction. The outer error aborts
/// the batch; the inner one fails only this commit and is returned before
/// anything of it is written.
fn apply_one(
    conn: &Connection,
    chain: &mut ChainState,
    hot: &mut HotStatements<'_>,
    job: &Job,
    ts_ms: u64,
) -> Result<Result<CommitAck, StoreError>, StoreError> {
    let c = &job.commit;
    if let Some(conflict) = receipt_conflict(hot, &c.receipts)? {
        return Ok(Err(conflict));
    }
    // An operation opens under its command_id once: another process on
    // this store that already ran the id (a receipt) or is running it
    // (an open operation) makes the start a conflict, so a command id is
    // dispatched once per state directory, not once per process.
    if !c.open_ops.is_empty() {
        if let Some(conflict) = open_op_conflict(conn, hot, &c.open_ops)? {
            return Ok(Err(conflict));
        }
    }
    if !c.budget_draws.is_empty() {
        if let Some(conflict) = budget_conflict(conn, &c.budget_draws)? {
            return Ok(Err(conflict));
        }
        // The check and the draw in one transaction that holds the write
        // lock: every process on the file draws from one ledger.
        if let Some(exceeded) = budget_over_cap(conn, &c.budget_draws)? {
            return Ok(Err(exceeded));
        }
    }

    if !c.leases.is_empty() {
        if let Err(held) = decide_leases(conn, &c.leases, ts_ms)? {
            return Ok(Err(held));
        }
        write_leases(conn, &c.leases, ts_ms)?;
    }

    let first_seq = chain.head.seq + 1;
    append_events(chain, &mut hot.insert_event, &c.events, ts_ms)?;
    index_receipts(
        &mut hot.insert_receipt,
        &c.receipts,
        first_seq,
        chain.head.seq,
    )?;
    // Revisions only ever rise (the highest wins), so a batch's are
    // gathered and written once per resource before COMMIT.
    gather_revisions(&mut chain.batch_revisions, &c.revisions);
    if !c.latches.is_empty() {
        upsert_latches(conn, &c.latches)?;
    }
    if !c.budget_draws.is_empty() {
        insert_budget_draws(conn, &c.budget_draws)?;
    }
    if !c.budget_releases.is_empty() {
        release_budget(conn, &c.budget_releases)?;
    }
    if !c.open_ops.is_empty() {
        upsert_open_ops(conn, &c.open_ops)?;
    }
    if !c.closed_ops.is_empty() {
        delete_open_ops(conn, &c.closed_ops)?;
    }
    if !c.approvals.is_empty() {
        upsert_approvals(conn, &c.approvals, chain.head.seq)?;
    }
    if !c.invocations.is_empty() {
        upsert_invocations(conn, &c.invocations)?;
    }
    if !c.invocation_refs.is_empty() {
        index_invocations(conn, &c.invocation_refs, first_seq, chain.head.seq)?;
    }
    Ok(Ok(CommitAck {
        first_seq,
        last_seq: chain.head.seq,
        head_hash: chain.head.hash.clone(),
    }))
}

/// The conflict of a receipt whose `command_id` is already stored.
fn receipt_conflict(
    hot: &mut HotStatements<'_>,
    receipts: &[PreparedReceipt],
) -> Result<Option<StoreError>, StoreError> {
    for r in receipts {
        if hot.receipt_exists.exists([&r.row.command_id])? {
            return Ok(Some(StoreError::Conflict(format!(
                "a receipt for command_id {:?} is already stored",
                r.row.command_id
            ))));
        }
    }
    Ok(None)
}

/// The conflict of an operation whose `command_id` already ran (a receipt)
/// or is running (an open operation) on this store.
fn open_op_conflict(
    conn: &Connection,
    hot: &mut HotStatements<'_>,
    open_ops: &[(OpenOp, String)],
) -> Result<Option<StoreError>, StoreError> {
    let mut open = conn.prepare_cached("SELECT 1 FROM open_ops WHERE command_id = ?1")?;
    for (op, _) in open_ops {
        let id = &op.command_id;
        if hot.receipt_exists.exists([id])? || open.exists([id])? {
            return Ok(Some(StoreError::Conflict(format!(
                "command_id {id:?} already ran or is running on this store"
            ))));
        }
    }
    Ok(None)
}

/// The conflict of a budget draw whose `reservation_id` is already stored.
fn budget_conflict(
    conn: &Connection,
    draws: &[BudgetRow],
) -> Result<Option<StoreError>, StoreError> {
    let mut exists = conn.prepare_cached("SELECT 1 FROM budget WHERE reservation_id = ?1")?;
    for b in draws {
        if exists.exists([&b.reservation_id])? {
            return Ok(Some(StoreError::Conflict(format!(
                "budget reservation {:?} is already stored",
                b.reservation_id
            ))));
        }
    }
    Ok(None)
}

/// The refusal of the first capped draw that does not fit: the key's
/// stored, unreleased draws the window counts (earlier commits of this
/// batch included, since they are in the open transaction) plus this
/// commit's earlier draws of the same key (see [`crate::BudgetCap`]).
fn budget_over_cap(
    conn: &Connection,
    draws: &[BudgetRow],
) -> Result<Option<StoreError>, StoreError> {
    let mut sum = conn.prepare_cached(
        "SELECT COALESCE(SUM(amount), 0.0) FROM budget
         WHERE key = ?1 AND ts_ms >= ?2 AND released = 0",
    )?;
    for (i, d) in draws.iter().enumerate() {
        let Some(cap) = &d.cap else { continue };
        let from_ms = cap.counts_from_ms(d.ts_ms).unwrap_or(0);
        // Stored ts_ms never exceeds i64::MAX, so a larger bound counts nothing.
        let from_db = i64::try_from(from_ms).unwrap_or(i64::MAX);
        let stored: f64 = sum.query_row(params![&d.key, from_db], |r| r.get(0))?;
        let earlier: f64 = draws[..i]
            .iter()
            .filter(|e| e.key == d.key && e.ts_ms >= from_ms && !e.released)
            .map(|e| e.amount)
            .sum();
        if let Err(e) = cap.check(d, stored + earlier) {
            return Ok(Some(e));
        }
    }
    Ok(None)
}

/// Each lease draft decided against its stored row, under the write lock
/// (see [`crate::lease`]): the inner error refuses this commit alone.
fn decide_leases(
    conn: &Connection,
    drafts: &[(crate::LeaseDraft, String)],
    now_ms: u64,
) -> Result<Result<(), StoreError>, StoreError> {
    let mut get = conn
        .prepare_cached("SELECT holder, renewed_ms, until_ms, info FROM leases WHERE key = ?1")?;
    for (d, _) in drafts {
        let stored = get
            .query_row([&d.key], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, String>(3)?,
                ))
            })
            .optional()?
            .map(|(holder, renewed, until, info)| crate::LeaseRow {
                key: d.key.clone(),
                holder,
                renewed_ms: u64::try_from(renewed).unwrap_or(0),
                until_ms: u64::try_from(until).unwrap_or(0),
                info: serde_json::from_str(&info).unwrap_or(serde_json::Value::Null),
            });
        if let Err(e) = crate::lease::decide_hold(d, stored.as_ref(), now_ms) {
            return Ok(Err(e));
        }
    }
    Ok(Ok(()))
}

/// Writes lease drafts already decided.
fn write_leases(
    conn: &Connection,
    drafts: &[(crate::LeaseDraft, String)],
    now_ms: u64,
) -> Result<(), StoreError> {
    let mut upsert = conn.prepare_cached(
        "INSERT INTO leases(key, holder, renewed_ms, until_ms, info) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT(key) DO UPDATE SET holder = excluded.holder, renewed_ms = excluded.renewed_ms,
             until_ms = excluded.until_ms, info = excluded.info",
    )?;
    let mut delete = conn.prepare_cached("DELETE FROM leases WHERE key = ?1 AND holder = ?2")?;
    for (d, info) in drafts {
        match &d.op {
            crate::LeaseOp::Hold { lease_ms, .. } => {
                let until = now_ms.saturating_add(*lease_ms);
                upsert.execute(params![
                    &d.key,
                    &d.holder,
                    seq_to_db(now_ms)?,
                    seq_to_db(until)?,
                    info
                ])?;
            }
            crate::LeaseOp::Release => {
                delete.execute(params![&d.key, &d.holder])?;
            }
        }
    }
    Ok(())
}

/// Seals each event onto the chain, in order, and inserts its entry.
fn append_events(
    chain: &mut ChainState,
    insert_event: &mut rusqlite::CachedStatement<'_>,
    events: &[PreparedEvent],
    ts_ms: u64,
) -> Result<(), StoreError> {
    for e in events {
        let seq = chain.head.seq + 1;
        let sealed = seal(
            seq,
            ts_ms,
            &e.kind_json,
            &e.body_json,
            &chain.head.hash,
            &mut chain.scratch,
        );
        insert_event.execute(params![seq_to_db(seq)?, &sealed.hash, &sealed.line])?;
        chain.head = Head {
            seq,
            hash: sealed.hash,
        };
    }
    Ok(())
}

/// Indexes each receipt by the entry that holds it (`first_seq` is the
/// commit's first entry, `last_seq` its last).
fn index_receipts(
    insert_receipt: &mut rusqlite::CachedStatement<'_>,
    receipts: &[PreparedReceipt],
    first_seq: u64,
    last_seq: u64,
) -> Result<(), StoreError> {
    for r in receipts {
        // prepare() checked that `event` indexes this commit's events.
        let seq = first_seq + r.row.event as u64;
        debug_assert!(seq <= last_seq);
        insert_receipt.execute(params![
            seq_to_db(seq)?,
            &r.row.command_id,
            &r.row.input_digest
        ])?;
    }
    Ok(())
}

/// Keeps the highest revision of each resource among the batch's commits.
fn gather_revisions(batch: &mut HashMap<(String, String), u64>, revisions: &[RevisionRow]) {
    for r in revisions {
        let slot = batch
            .entry((r.device_id.clone(), r.resource.clone()))
            .or_insert(0);
        *slot = (*slot).max(r.revision);
    }
}

fn upsert_latches(conn: &Connection, latches: &[PreparedLatch]) -> Result<(), StoreError> {
    let mut upsert = conn.prepare_cached(
        "INSERT INTO latches(device_id, latched, info) VALUES (?1, ?2, ?3)
         ON CONFLICT(device_id) DO UPDATE SET latched = excluded.latched, info = excluded.info",
    )?;
    for l in latches {
        upsert.execute(params![&l.row.device_id, l.row.latched, &l.info_json])?;
    }
    Ok(())
}

fn insert_budget_draws(conn: &Connection, draws: &[BudgetRow]) -> Result<(), StoreError> {
    let mut insert = conn.prepare_cached(
        "INSERT INTO budget(reservation_id, key, amount, ts_ms, released) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    for b in draws {
        insert.execute(params![
            &b.reservation_id,
            &b.key,
            b.amount,
            seq_to_db(b.ts_ms)?,
            b.released
        ])?;
    }
    Ok(())
}

fn release_budget(conn: &Connection, reservation_ids: &[String]) -> Result<(), StoreError> {
    let mut release =
        conn.prepare_cached("UPDATE budget SET released = 1 WHERE reservation_id = ?1")?;
    for id in reservation_ids {
        release.execute([id])?;
    }
    Ok(())
}

fn upsert_open_ops(conn: &Connection, open_ops: &[(OpenOp, String)]) -> Result<(), StoreError> {
    let mut upsert = conn.prepare_cached(
        "INSERT INTO open_ops(command_id, info) VALUES (?1, ?2)
         ON CONFLICT(command_id) DO UPDATE SET info = excluded.info",
    )?;
    for (op, info) in open_ops {
        upsert.execute(params![&op.command_id, info])?;
    }
    Ok(())
}

fn delete_open_ops(conn: &Connection, command_ids: &[String]) -> Result<(), StoreError> {
    let mut delete = conn.prepare_cached("DELETE FROM open_ops WHERE command_id = ?1")?;
    for id in command_ids {
        delete.execute([id])?;
    }
    Ok(())
}

/// Upserts approval records; a new one is created at `head_seq`, the
/// commit's last entry (which orders [`crate::Store::approvals`]), and every
/// write marks the record updated there ([`crate::Store::approvals_since`]).
fn upsert_approvals(
    conn: &Connection,
    approvals: &[(ApprovalRow, String)],
    head_seq: u64,
) -> Result<(), StoreError> {
    let mut upsert = conn.prepare_cached(
        "INSERT INTO approvals(approval_id, record, created_seq, updated_seq) VALUES (?1, ?2, ?3, ?3)
         ON CONFLICT(approval_id) DO UPDATE SET record = excluded.record, updated_seq = excluded.updated_seq",
    )?;
    for (a, record_json) in approvals {
        upsert.execute(params![&a.approval_id, record_json, seq_to_db(head_seq)?])?;
    }
    Ok(())
}

/// Upserts invocations recorded by value, `(invocation_id, info_json)`.
fn upsert_invocations(
    conn: &Connection,
    invocations: &[(String, String)],
) -> Result<(), StoreError> {
    let mut upsert = conn.prepare_cached(
        "INSERT INTO invocations(invocation_id, info, seq) VALUES (?1, ?2, NULL)
         ON CONFLICT(invocation_id) DO UPDATE SET info = excluded.info, seq = NULL",
    )?;
    for (invocation_id, info) in invocations {
        upsert.execute(params![invocation_id, info])?;
    }
    Ok(())
}

/// Indexes invocations whose record is an entry of this commit (`first_seq`
/// is the commit's first entry, `last_seq` its last).
fn index_invocations(
    conn: &Connection,
    refs: &[InvocationRef],
    first_seq: u64,
    last_seq: u64,
) -> Result<(), StoreError> {
    let mut upsert = conn.prepare_cached(
        "INSERT INTO invocations(invocation_id, info, seq) VALUES (?1, NULL, ?2)
         ON CONFLICT(invocation_id) DO UPDATE SET info = NULL, seq = excluded.seq",
    )?;
    for r in refs {
        // prepare() checked that `event` indexes this commit's events.
        let seq = first_seq + r.event as u64;
        debug_assert!(seq <= last_seq);
        upsert.execute(params![&r.invocation_id, seq_to_db(seq)?])?;
    }
    Ok(())
}
