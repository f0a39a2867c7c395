//! The journal's records applied to the database: at open, those a power
//! loss or a kill left past the position the database recorded (`replay`);
//! inside a batch, those a process that died left in a journal this one did
//! not write (`adopt_journal`), so that no later commit starts from a head
//! without them.
//!
//! Never here: writing records (`crate::sqlite::journal`), or a batch's own
//! commits (`super`).

use super::{commit, read_journal_at, record_journal_at, SqliteBackend};
use crate::sqlite::journal::{self, Journal, Record};
use crate::writer::Job;
use crate::{CommitAck, StoreError};
use std::sync::atomic::Ordering;

/// A dead process's journal, adopted by a batch not yet committed.
pub(super) struct Adopted {
    /// The journal, locked, when it could be sized.
    journal: Option<Journal>,
    /// Its records the batch applied.
    records: u64,
    /// The position the database records once the batch commits.
    at: Option<journal::Position>,
}

impl SqliteBackend {
    /// Applies the journal's records after the position the database
    /// committed last, in order, each with SQLite's flush; returns how many.
    /// A record rebuilds exactly the head it recorded, or the store is
    /// refused as corrupt.
    pub(in crate::sqlite) fn replay(
        &mut self,
        records: Vec<Record>,
        generation: u64,
    ) -> Result<usize, StoreError> {
        // The usual open, after a clean stop or a kill that lost no flushed
        // write: every record is already in the database. Taking the write
        // lock only when one is not also lets a store on a read-only disk open.
        let committed = read_journal_at(&self.conn)?;
        if let Some(j) = self.journal.as_mut() {
            j.follow(committed);
        }
        let newer = |r: &Record| {
            let at = journal::Position {
                generation,
                index: r.index,
            };
            at.after(committed)
        };
        if !records.iter().any(newer) {
            return Ok(0);
        }
        self.set_full_sync(true)?;
        let mut results = Vec::new();
        let mut applied = 0;
        // Each step applies one record or stops: bounded by their number.
        for record in records.into_iter().filter(|r| newer(r)) {
            let saved = self.chain.head.clone();
            let at = journal::Position {
                generation,
                index: record.index,
            };
            match self.replay_one(record, at, &mut results) {
                Ok(true) => applied += 1,
                Ok(false) => break,
                Err(e) => {
                    let _ = self.conn.execute_batch("ROLLBACK");
                    self.chain.head = saved;
                    return Err(e);
                }
            }
        }
        if applied > 0 {
            if let Some(j) = self.journal.as_mut() {
                j.covered();
            }
        }
        self.counters
            .replayed
            .store(applied as u64, Ordering::Relaxed);
        Ok(applied)
    }

    /// One record the database lacks, applied if it starts at the database's
    /// head. One that does not is a batch a killed process flushed and never
    /// committed (nor answered), after which another process committed: it
    /// is left, and so is every record after it.
    fn replay_one(
        &mut self,
        record: Record,
        at: journal::Position,
        results: &mut Vec<Result<CommitAck, StoreError>>,
    ) -> Result<bool, StoreError> {
        self.conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        self.reconcile_head()?;
        if !self.apply_record(record, at, results)? {
            self.conn.execute_batch("ROLLBACK")?;
            return Ok(false);
        }
        commit(&self.conn)?;
        Ok(true)
    }

    /// One record, inside the open transaction, if it starts at the chain's
    /// head (`false`, nothing written, when it does not); it must rebuild
    /// the head it recorded, or the store is corrupt.
    fn apply_record(
        &mut self,
        record: Record,
        at: journal::Position,
        results: &mut Vec<Result<CommitAck, StoreError>>,
    ) -> Result<bool, StoreError> {
        if record.start != self.chain.head {
            return Ok(false);
        }
        let jobs: Vec<Job> = record.commits.into_iter().map(Job::replayed).collect();
        results.clear();
        self.apply_jobs(&jobs, record.ts_ms, results)?;
        if self.chain.head != record.end {
            return Err(StoreError::Corrupt(format!(
                "the journal's record from seq {} rebuilds seq {} {}, not the recorded seq {} {}",
                record.start.seq,
                self.chain.head.seq,
                self.chain.head.hash,
                record.end.seq,
                record.end.hash
            )));
        }
        record_journal_at(&self.conn, at)?;
        Ok(true)
    }

    /// Inside the batch's transaction, which holds the write lock: while
    /// another process wrote the journal when this store opened, a journal
    /// now unlocked was left by a process that died, maybe between a
    /// record's flush and its commit, a record its callers may have been
    /// answered for. Its records past the position the database recorded
    /// are applied here, before this batch, as the process's own next open
    /// would have (this batch would otherwise start from a head without
    /// them, and they could never be applied); and this process writes the
    /// journal from now on.
    ///
    /// What it took (the journal, and its lock) is kept only once the batch
    /// commits ([`SqliteBackend::take_over`]): a batch that fails rolls the
    /// records back with it, drops the journal and its lock, and the next
    /// batch tries again.
    pub(super) fn adopt_journal(&mut self) -> Result<Option<Adopted>, StoreError> {
        let Some(dir) = self.adopt_from.as_deref() else {
            return Ok(None);
        };
        let opened = Journal::open(dir)?;
        if !opened.locked {
            // Alive (it holds the lock), or unreadable as at open.
            return Ok(None);
        }
        let committed = read_journal_at(&self.conn)?;
        let mut results = Vec::new();
        let mut records = 0u64;
        // Each step applies one record or stops: bounded by their number.
        for record in opened.records {
            let at = journal::Position {
                generation: opened.generation,
                index: record.index,
            };
            if !at.after(committed) {
                continue;
            }
            results.clear();
            if !self.apply_record(record, at, &mut results)? {
                break;
            }
            records += 1;
        }
        Ok(Some(Adopted {
            journal: opened.journal,
            records,
            at: read_journal_at(&self.conn)?,
        }))
    }

    /// After the batch that adopted a dead process's journal committed:
    /// this process writes it from now on (unless it could not be sized, a
    /// full disk: then the next batch looks again).
    /// Cannot fail: the batch is committed, and its callers are told so.
    pub(super) fn take_over(&mut self, adopted: Adopted) {
        self.counters
            .adopted
            .fetch_add(adopted.records, Ordering::Relaxed);
        if adopted.records > 0 {
            tracing::warn!(
                records = adopted.records,
                "another process on this evidence store died between flushing its journal and committing; its records were applied before this process's next commit"
            );
        }
        let Some(mut j) = adopted.journal else {
            return;
        };
        tracing::info!("this process now writes the evidence store's journal (the process that wrote it is gone)");
        j.follow(adopted.at);
        self.journal = Some(j);
        if let Some(dir) = self.adopt_from.take() {
            // It writes the journal now: it asks who else is there instead
            // of showing itself (which would hide it from its own probe).
            self.presence = crate::sqlite::presence::Presence::probe(&dir);
        }
        self.counters.active.store(true, Ordering::Relaxed);
    }

    /// Stops as a process killed right after its record's flush (tests
    /// only): the transaction is gone, the journal released with the record
    /// in it, the callers never told; every later batch fails.
    pub(super) fn crash(&mut self) -> StoreError {
        let _ = self.conn.execute_batch("ROLLBACK");
        // Held records stay in the journal, for the next open.
        self.held = None;
        self.journal = None;
        self.crashed = true;
        self.counters.active.store(false, Ordering::Relaxed);
        StoreError::Closed
    }
}
