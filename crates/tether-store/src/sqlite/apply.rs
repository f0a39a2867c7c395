//! The writer's side of the SQLite store: the backend the group-commit
//! writer drives. One batch is one `BEGIN IMMEDIATE` … `COMMIT`; each of its
//! commits is checked for conflicts with what is stored, then its entries
//! are sealed onto the chain and its rows written. A batch's record is
//! written to the journal once the last commit's checks are done, and
//! flushed after the last statements, which run while the device takes it;
//! then `COMMIT`, which does not flush, and only then are its callers
//! answered (`journal`). With holding on (the default), that `COMMIT` waits:
//! the transaction stays open for the next batches, each in a savepoint,
//! and is committed when the callers pause or a bound is reached (`hold`).
//!
//! Never here: validation or serialisation of a commit (done on the caller's
//! thread, in `prepare`), one commit's checks and rows (`rows`), or reads
//! answered to callers (`read`).

mod hold;
mod replay;
mod rows;

use super::head::{load_head, seq_from_db, seq_to_db, Head};
use super::journal::{self, Journal};
use super::presence::Presence;
use crate::chain::Sealed;
use crate::writer::{Backend, Job};
use crate::{CommitAck, StoreError};
use rows::{apply_one, check_and_seal, write_one};
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// One commit's outcome in its batch: stored, or refused alone.
type Outcome = Result<CommitAck, StoreError>;

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
    /// Off, a journalled batch's record is flushed before its last
    /// statements instead of while they run (a benchmark's switch:
    /// [`super::SqliteStore::set_early_write`]).
    pub flush_first: AtomicBool,
    /// Tests only ([`super::SqliteStore::fail_next_journal_flush`]): the
    /// next journalled batch's flush fails.
    pub fail_flush: AtomicBool,
    /// Tests only ([`super::SqliteStore::crash_after_next_record`]): the next
    /// journalled batch stops as a killed process would, after its record.
    pub crash_after_record: AtomicBool,
    /// Off, every journalled batch commits before its answers instead of
    /// holding its transaction open for the next (a benchmark's switch:
    /// [`super::SqliteStore::set_hold`]).
    pub hold_off: AtomicBool,
    /// Tests only ([`super::SqliteStore::fail_next_commits`]): how many of
    /// the next `COMMIT`s of held records, and of the attempts to apply them
    /// again, fail, as on a full disk.
    pub fail_commits: AtomicU32,
    /// Times answered records a failed `COMMIT` left only in the journal
    /// were applied again (`hold::recover`).
    pub recovered: AtomicU64,
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
    /// Answered records in the open transaction (`hold`).
    held: Option<hold::Held>,
    /// Answered records a failed `COMMIT` left only in the journal.
    recovery: Option<hold::Recovery>,
    /// Whether other handles have the store open.
    presence: Presence,
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
    /// The entries of the commit being applied, sealed and not yet written,
    /// with their seqs (reused).
    sealed: Vec<(u64, Sealed)>,
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
        let journalled = self.encode_record(batch);
        // Held only for a few callers' batches (a group of many already
        // shares one `COMMIT`, and one held open makes the next groups
        // smaller: measured, PERFORMANCE.md), and only while no other handle
        // on the store could wait for the write lock or read the file
        // meanwhile (`presence`).
        let hold = journalled
            && batch.len() <= hold::HOLD_MAX_BATCH
            && !self.counters.hold_off.load(Ordering::Relaxed)
            && (self.held.is_some() || self.presence.alone());
        // A batch that does not hold its transaction starts a new one, and
        // answered records the database lacks come before anything else.
        let ready = if hold {
            self.recover()
        } else {
            self.settle_held()
        };
        ready?;
        let saved = self.chain.head.clone();
        let nested = self.held.is_some();
        let outcome = self
            .set_full_sync(!journalled)
            .and_then(|()| self.try_batch(batch, ts_ms, results, journalled, (nested, hold)));
        if outcome.is_err() {
            // Nothing of the batch may survive: undo its statements (the
            // whole transaction when it began it; harmless if BEGIN itself
            // failed) and the head advanced by it.
            if nested {
                self.undo_nested(saved.clone());
            } else {
                let _ = self.conn.execute_batch("ROLLBACK");
            }
            self.chain.head = saved;
            results.clear();
        }
        outcome
    }

    fn held(&self) -> Option<std::time::Duration> {
        self.hold_pause()
    }

    fn settle_due(&self) -> bool {
        self.hold_due()
    }

    fn settle(&mut self) -> Result<(), StoreError> {
        self.settle_held()
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
        presence: Presence,
    ) -> Self {
        counters.active.store(journal.is_some(), Ordering::Relaxed);
        Self {
            conn,
            chain: ChainState {
                head,
                scratch: String::with_capacity(256),
                batch_revisions: HashMap::new(),
                sealed: Vec::new(),
            },
            journal,
            // `SqliteStore::open` sets FULL on the connection.
            full_sync: true,
            record_meta: Vec::with_capacity(256),
            record_body: Vec::with_capacity(4096),
            counters,
            adopt_from,
            crashed: false,
            held: None,
            recovery: None,
            presence,
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
        (nested, hold): (bool, bool),
    ) -> Result<(), StoreError> {
        if self.crashed {
            return Err(StoreError::Closed);
        }
        if nested {
            // The held transaction has the write lock since its first batch:
            // nobody else appended, and nothing is left to adopt.
            self.conn.prepare_cached("SAVEPOINT batch")?.execute([])?;
            let start = self.chain.head.clone();
            return self.journalled_batch(batch, ts_ms, results, &start, (nested, hold));
        }
        // IMMEDIATE takes the write lock now, so the head check below cannot
        // race with another process appending.
        self.conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        self.reconcile_head()?;
        // Only a store without the journal adopts one: its batch commits
        // with SQLite's flush, below.
        let adopted = self.adopt_journal()?;
        let start = self.chain.head.clone();
        if journalled && self.journal.is_some() {
            // A process that writes the journal has none to adopt.
            debug_assert!(adopted.is_none());
            return self.journalled_batch(batch, ts_ms, results, &start, (nested, hold));
        }
        self.apply_jobs(batch, ts_ms, results)?;
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
        Ok(())
    }

    /// A batch committed through the journal. Its commits are applied but
    /// the last one's writes, whose checks and entries are all the record
    /// needs; the record is written and sent on its way to the disk, and
    /// the last writes run while the device takes it; then its flush, and
    /// only then SQLite's unflushed `COMMIT` and the answers
    /// (docs/PERFORMANCE.md, "The record's write started early").
    fn journalled_batch(
        &mut self,
        batch: &[Job],
        ts_ms: u64,
        results: &mut Vec<Result<CommitAck, StoreError>>,
        start: &Head,
        (nested, hold): (bool, bool),
    ) -> Result<(), StoreError> {
        let last = self.apply_all_but_last_writes(batch, ts_ms, results)?;
        let Some(j) = self.journal.as_mut() else {
            return Err(StoreError::Closed);
        };
        let at_position = j.position();
        let (meta, head) = (&mut self.record_meta, &self.chain.head);
        journal::encode_meta(meta, at_position.index, ts_ms, start, head);
        let at = j.write(&self.record_meta, &self.record_body)?;
        if self.counters.crash_after_record.load(Ordering::Relaxed) {
            return Err(self.crash());
        }
        let flushed = self.counters.flush_first.load(Ordering::Relaxed);
        if flushed {
            if let Err(e) = j.flush() {
                j.void(at);
                return Err(e);
            }
        }
        let written = match &last {
            Some((job, Ok(ack))) => HotStatements::prepare(&self.conn).and_then(|mut hot| {
                write_one(&self.conn, &mut hot, &self.chain.sealed, job, ts_ms, ack)
            }),
            _ => Ok(()),
        };
        let written = written
            .and_then(|()| self.write_batch_revisions())
            .and_then(|()| self.record_head())
            .and_then(|()| record_journal_at(&self.conn, at_position));
        let Some(j) = self.journal.as_mut() else {
            return Err(StoreError::Closed);
        };
        // The flush before `COMMIT`: nothing of the batch is visible to a
        // reader or another process until its record is on the disk.
        let durable = written.and_then(|()| {
            if flushed {
                Ok(())
            } else if self.counters.fail_flush.load(Ordering::Relaxed)
                && self.counters.fail_flush.swap(false, Ordering::Relaxed)
            {
                Err(StoreError::Io("an injected journal flush failure".into()))
            } else {
                j.flush()
            }
        });
        let ended = durable.and_then(|()| {
            if hold {
                self.hold_record(nested)
            } else {
                commit(&self.conn)
            }
        });
        if let Err(e) = ended {
            // Its callers are told it failed: the record must not stand.
            if let Some(j) = self.journal.as_mut() {
                j.void(at);
            }
            return Err(e);
        }
        let Some(j) = self.journal.as_mut() else {
            return Err(StoreError::Closed);
        };
        results.extend(last.map(|(_, r)| r));
        self.counters
            .records
            .store(j.records_written, Ordering::Relaxed);
        self.counters.restarts.store(j.restarts, Ordering::Relaxed);
        Ok(())
    }

    /// A journalled batch's commits applied, but for the last one only its
    /// checks and its sealed entries (in `chain.sealed`): all its record
    /// needs. Returns the last commit and its outcome.
    fn apply_all_but_last_writes<'b>(
        &mut self,
        batch: &'b [Job],
        ts_ms: u64,
        results: &mut Vec<Result<CommitAck, StoreError>>,
    ) -> Result<Option<(&'b Job, Outcome)>, StoreError> {
        self.chain.batch_revisions.clear();
        let Some((last, rest)) = batch.split_last() else {
            return Ok(None);
        };
        let mut hot = HotStatements::prepare(&self.conn)?;
        for job in rest {
            let r = apply_one(&self.conn, &mut self.chain, &mut hot, job, ts_ms)?;
            results.push(r);
        }
        let r = check_and_seal(&self.conn, &mut self.chain, &mut hot, last, ts_ms)?;
        Ok(Some((last, r)))
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

impl SqliteBackend {
    /// `COMMIT` of held records, failing when a test asked for it.
    fn commit_held(&self) -> Result<(), StoreError> {
        self.injected_failure("COMMIT")?;
        commit(&self.conn)
    }

    /// A failure a test asked for ([`super::SqliteStore::fail_next_commits`]),
    /// counted down; `Ok` when none is left (a plain load then).
    fn injected_failure(&self, what: &str) -> Result<(), StoreError> {
        let c = &self.counters.fail_commits;
        if c.load(Ordering::Relaxed) == 0 {
            return Ok(());
        }
        match c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)) {
            Ok(_) => Err(StoreError::Sqlite(format!(
                "an injected {what} failure (a full disk)"
            ))),
            Err(_) => Ok(()),
        }
    }
}
