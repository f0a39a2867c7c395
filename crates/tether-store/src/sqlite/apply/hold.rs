//! Answered records held in one SQLite transaction: a journalled batch is
//! answered once its record is flushed, and its transaction may stay open
//! for the next batches instead of paying `BEGIN IMMEDIATE` and `COMMIT`
//! each. Each later batch runs inside a savepoint, so one that fails undoes
//! only itself. What is held is committed when the writer's callers pause
//! ([`HOLD_PAUSE`]), when a bound is reached, before a read, a checkpoint,
//! a batch too large for the journal, and when the store closes.
//!
//! The held records are durable in the journal, and the transaction holds
//! SQLite's write lock throughout, so no other process decides against a
//! state without them. A `COMMIT` that fails leaves them only in the
//! journal: they are applied again from the frames kept here, as an open
//! would, before any later batch or read is served.
//!
//! Never here: one batch's statements (`super`), the journal's file
//! (`crate::sqlite::journal`), or when the writer calls what is here
//! (`crate::writer`).

use super::SqliteBackend;
use crate::sqlite::head::{load_head, Head};
use crate::sqlite::journal;
use crate::StoreError;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long held records wait while no batch comes before the writer thread
/// commits them: a caller that paused this long is not sending back to back
/// (a lone caller's next command comes some 30 µs after its answer in
/// process, 100-300 µs over HTTP). Short, so that the database file another
/// process reads lags an answer by well under a millisecond once the callers
/// stop.
pub(super) const HOLD_PAUSE: Duration = Duration::from_micros(250);

/// The oldest held record's age at which the batch that ends commits them:
/// bounds how long another process waits for SQLite's write lock, and how
/// stale another process's reads of the file may be.
pub(super) const HOLD_MAX_AGE: Duration = Duration::from_millis(2);

/// Most commits in a batch that holds its transaction open: a larger group
/// commits before its answers, as it shares one `COMMIT` already.
pub(super) const HOLD_MAX_BATCH: usize = 4;

/// Most records held in one transaction.
pub(super) const HOLD_MAX_RECORDS: u32 = 64;

/// Most bytes of frames kept for held records (large batches' records).
pub(super) const HOLD_MAX_BYTES: usize = 1 << 20;

/// How often a failed `COMMIT`'s records are tried again while nothing else
/// asks for them (a full disk: each try costs a transaction).
pub(super) const RECOVERY_RETRY: Duration = Duration::from_millis(100);

/// Records answered inside the open transaction.
pub(super) struct Held {
    records: u32,
    since: Instant,
    /// Their frames as written to the journal, in order.
    frames: Vec<u8>,
}

/// Answered records a failed `COMMIT` (or a lost savepoint) took out of the
/// database: applied again before anything else.
pub(super) struct Recovery {
    frames: Vec<u8>,
    /// The head they end at, which the callers were answered.
    head: Head,
}

impl SqliteBackend {
    /// After a journalled batch's flush, with holding on: the batch stays in
    /// the open transaction (its savepoint released when it had one), and
    /// its record's frame is kept.
    pub(super) fn hold_record(&mut self, nested: bool) -> Result<(), StoreError> {
        if nested {
            self.conn.prepare_cached("RELEASE batch")?.execute([])?;
        }
        let frame = self.journal.as_ref().map_or(&[][..], |j| j.last_frame());
        let held = self.held.get_or_insert_with(|| Held {
            records: 0,
            since: Instant::now(),
            frames: Vec::with_capacity(4096),
        });
        held.records += 1;
        held.frames.extend_from_slice(frame);
        Ok(())
    }

    /// A batch inside the held transaction failed: only its own statements
    /// are undone. If even that fails, the whole transaction goes, and the
    /// held records (ending at `answered`) are applied again.
    pub(super) fn undo_nested(&mut self, answered: Head) {
        if self
            .conn
            .execute_batch("ROLLBACK TO batch; RELEASE batch")
            .is_err()
        {
            self.lose_transaction(answered);
        }
    }

    /// The open transaction is gone (rolled back): what it held must be
    /// applied again from the frames.
    fn lose_transaction(&mut self, answered: Head) {
        let _ = self.conn.execute_batch("ROLLBACK");
        if let Some(held) = self.held.take() {
            tracing::error!(
                records = held.records,
                "the evidence store could not commit answered records; they are in its journal and are applied again before anything else"
            );
            self.recovery = Some(Recovery {
                frames: held.frames,
                head: answered,
            });
        }
    }

    /// Commits the held records, then applies again whatever a failed commit
    /// left. An error means answered records are not in the database yet.
    pub(super) fn settle_held(&mut self) -> Result<(), StoreError> {
        if self.held.is_some() {
            match self.commit_held() {
                Ok(()) => self.held = None,
                Err(_) => self.lose_transaction(self.chain.head.clone()),
            }
        }
        self.recover()
    }

    /// Applies again the records a failed `COMMIT` left only in the journal,
    /// each with SQLite's flush; they must rebuild the head their callers
    /// were answered, or the store is refused as corrupt.
    pub(super) fn recover(&mut self) -> Result<(), StoreError> {
        let Some(r) = self.recovery.as_ref() else {
            return Ok(());
        };
        let (generation, records) = journal::records_of(&r.frames);
        let answered = r.head.clone();
        self.injected_failure("re-application")?;
        self.chain.head = load_head(&self.conn)?;
        let opened_with = self.counters.replayed.load(Ordering::Relaxed);
        let applied = self.replay(records, generation);
        // `replayed` counts what the open applied.
        self.counters.replayed.store(opened_with, Ordering::Relaxed);
        applied?;
        if self.chain.head != answered {
            return Err(StoreError::Corrupt(format!(
                "answered records applied again end at seq {}, not at the answered seq {}",
                self.chain.head.seq, answered.seq
            )));
        }
        self.recovery = None;
        self.counters.recovered.fetch_add(1, Ordering::Relaxed);
        tracing::info!("the evidence store's answered records are in its database again");
        Ok(())
    }

    /// How long the writer lets held records wait while nothing comes.
    pub(super) fn hold_pause(&self) -> Option<Duration> {
        if self.recovery.is_some() {
            Some(RECOVERY_RETRY)
        } else {
            self.held.as_ref().map(|_| HOLD_PAUSE)
        }
    }

    /// Whether the held records reached a bound and are committed now.
    pub(super) fn hold_due(&self) -> bool {
        self.held.as_ref().is_some_and(|h| {
            h.records >= HOLD_MAX_RECORDS
                || h.frames.len() >= HOLD_MAX_BYTES
                || h.since.elapsed() >= HOLD_MAX_AGE
        })
    }
}

impl Drop for SqliteBackend {
    fn drop(&mut self) {
        // A store closing commits what it answered; if it cannot, the
        // records are in the journal and the next open applies them.
        if self.held.is_some() {
            let _ = self.settle_held();
        }
    }
}
