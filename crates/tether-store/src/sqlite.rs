//! The SQLite store: one `tether.db` per state directory.
//!
//! Durability: WAL journal. Each batch is written as one record to
//! Tether's own journal file (`tether.journal`) and flushed there, then
//! committed with `synchronous=NORMAL`; a batch too large for the journal
//! commits with `synchronous=FULL`, so its `COMMIT` returns only after the
//! WAL is flushed (`journal` says why and how the two fit together). The
//! writer thread owns the only write connection and the chain head; reads go through a second connection (WAL lets it read
//! the last committed state while the writer works), after the writer has
//! committed the answered records it holds (`apply::hold`).
//!
//! | module | owns |
//! |---|---|
//! | `schema` | the numbered migrations and `schema_version` |
//! | `head` | the chain head: checked at open, recorded in `meta` |
//! | `apply` | the writer's backend: one transaction per batch, or one held open across batches (`apply::rows`: one commit's checks, sealed entries and rows; `apply::replay`: a journal's records applied at open, or adopted from a process that died; `apply::hold`: answered records held in the open transaction, committed when the callers pause, a bound is reached or a read comes) |
//! | `presence` | whether another handle has the store open (the writer holds a transaction only when none has) |
//! | `journal` | the record flushed before a batch's unflushed commit (its bytes: `journal::codec`), and its replay |
//! | `read` | the `Store` queries and the chain export |
//! | `checkpoint` | the thread that checkpoints the WAL |
//! | `archive` | the archive anchor and `audit archive`'s transaction |

mod apply;
mod archive;
mod checkpoint;
mod head;
mod journal;
mod presence;
mod read;
mod schema;

pub(crate) use archive::read_anchor;
pub(crate) use head::recorded_head;
pub use journal::{JOURNAL_FILE_NAME, SET_ASIDE_FILE_NAME as JOURNAL_SET_ASIDE_FILE_NAME};
pub use presence::PRESENCE_FILE_NAME;
pub use schema::SCHEMA_VERSION;

use crate::writer::{Writer, WriterStats};
use crate::StoreError;
use apply::{JournalCounters, SqliteBackend};
use checkpoint::Checkpointer;
use rusqlite::{Connection, OpenFlags};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// The one database file in a state directory.
pub const DB_FILE_NAME: &str = "tether.db";

/// How long a connection waits for another process holding the write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Page cache of the write connection, in KiB.
const WRITER_CACHE_KIB: i64 = 16 * 1024;

/// Rows fetched per page when streaming the chain, so an export or a verify
/// of a long chain holds neither the whole chain in memory nor the read
/// connection for the whole run.
pub(crate) const PAGE_ROWS: i64 = 1024;

/// SQLite-backed [`Store`](crate::Store).
pub struct SqliteStore {
    writer: Writer,
    reader: Mutex<Connection>,
    path: PathBuf,
    journal: Arc<JournalCounters>,
    /// Why this store commits without the journal, if it does.
    journal_off: Option<String>,
    /// What the open set aside of a journal written for another database.
    set_aside: journal::SetAside,
    // Declared last: dropped after the writer has drained.
    _checkpointer: Checkpointer,
}

/// The writer's automatic checkpoint threshold, pages: a backstop only.
const WRITER_AUTOCHECKPOINT_PAGES: i64 = 65_536;

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// What a store's journal did since it opened ([`SqliteStore::journal_stats`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalStats {
    /// Whether this store writes the journal.
    pub active: bool,
    /// Why it does not, when it does not.
    pub why_off: Option<String>,
    /// Records written (batches committed without SQLite's own flush).
    pub records: u64,
    /// Times the journal started again from its beginning.
    pub restarts: u64,
    /// Records applied again when the store opened.
    pub replayed: u64,
    /// Records applied from a journal another process on the store wrote and
    /// left when it died (this one then writes the journal).
    pub adopted: u64,
    /// Batches committed with SQLite's flush while the journal was active.
    pub flushed_batches: u64,
    /// Times answered records whose `COMMIT` failed were applied again
    /// from the journal while the store ran.
    pub recovered: u64,
    /// Records found beside a database this open created, so written for
    /// another (removed) database, and not applied: the file was copied to
    /// [`JOURNAL_SET_ASIDE_FILE_NAME`] first.
    pub discarded: u64,
    /// Why that copy failed, if it did (the records are then gone).
    pub set_aside_error: Option<String>,
}

impl SqliteStore {
    /// Open (creating if needed) the store in `state_dir`: the directory, the
    /// file [`DB_FILE_NAME`] in it, and the schema. Refuses with
    /// [`StoreError::Corrupt`] if the last chain entry fails verification and
    /// with [`StoreError::Unsupported`] if the schema is newer than this build.
    pub fn open(state_dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(state_dir).map_err(|e| {
            StoreError::Io(format!(
                "cannot create state directory {}: {e}",
                state_dir.display()
            ))
        })?;
        let path = state_dir.join(DB_FILE_NAME);
        let mut conn = Connection::open(&path)
            .map_err(|e| StoreError::Sqlite(format!("cannot open {}: {e}", path.display())))?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Unsupported(format!(
                "{} cannot use WAL journaling (got {mode:?})",
                path.display()
            )));
        }
        conn.pragma_update(None, "synchronous", "FULL")?;
        // A larger page cache for the writer (default is 2 MiB): a batch of a
        // few thousand commits touches thousands of pages, and re-reading
        // evicted B-tree pages from disk stalls the only writer.
        conn.pragma_update(None, "cache_size", -WRITER_CACHE_KIB)?;
        // Checkpoints run on their own thread (see `Checkpointer`), never inside
        // the only writer's commit, where a large one stalls every caller and
        // the e-stop's latch write behind it. The writer's own automatic
        // checkpoint stays only as a backstop should that thread be gone.
        conn.pragma_update(None, "wal_autocheckpoint", WRITER_AUTOCHECKPOINT_PAGES)?;
        // A batch inside a held transaction runs in a savepoint, whose undo
        // copies of the pages it touches would spill to a temporary file
        // past 64 KiB: kept in memory instead (bounded by the held
        // transaction's bounds, `apply::hold`).
        conn.pragma_update(None, "temp_store", "MEMORY")?;
        conn.set_prepared_statement_cache_capacity(32);
        // The journal is read first: a database made now records its last
        // record as held, in the transaction that makes it (below).
        let mut opened = journal::Journal::open(state_dir)?;
        let held = opened.last().map(|at| at.to_string());
        let created = schema::migrate(&mut conn, held.as_deref())?;
        // The last entry and the head recorded beside it, read in one
        // snapshot: another process on the store may commit in between.
        conn.execute_batch("BEGIN")?;
        let head = head::load_head(&conn);
        conn.execute_batch("COMMIT")?;
        let head = head?;

        let reader = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        reader.busy_timeout(BUSY_TIMEOUT)?;
        // Readers never write; make that a property of the connection.
        reader.pragma_update(None, "query_only", true)?;
        reader.set_prepared_statement_cache_capacity(32);

        // The journal's records past the position the database recorded are
        // answered commits whose WAL frames the disk lost: applied before
        // anything else is.
        let counters = Arc::new(JournalCounters::default());
        let mut set_aside = journal::SetAside::default();
        if created {
            // A database this open made holds nothing a journal could have
            // answered: records beside it belong to a store whose database
            // was removed (`rm tether.db*` leaves `tether.journal`), and
            // applying them would bring its entries, receipts and latches
            // back into a new store. The database already records them as
            // held, so no later open applies them either.
            set_aside = opened.set_aside(state_dir);
        }
        // While another process writes the journal, this one applies what it
        // leaves should it die, before its own next batch.
        let adopt_from = opened.held_elsewhere.then(|| state_dir.to_path_buf());
        let presence = if opened.journal.is_some() {
            presence::Presence::probe(state_dir)
        } else {
            presence::Presence::announce(state_dir)
        };
        let mut backend = SqliteBackend::new(
            conn,
            head,
            opened.journal,
            counters.clone(),
            adopt_from,
            presence,
        );
        backend.replay(opened.records, opened.generation)?;
        let writer = Writer::spawn_inline(backend, "tether-store-writer")?;
        let checkpointer = Checkpointer::spawn(&path, writer.idle_gate())?;
        Ok(SqliteStore {
            writer,
            reader: Mutex::new(reader),
            path,
            journal: counters,
            journal_off: opened.why_not,
            set_aside,
            _checkpointer: checkpointer,
        })
    }

    /// Path of the database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether a command's waiting commit that finds the writer idle is
    /// applied on the caller's thread (on by default; [`crate::Store::submit_waiting`]).
    /// Off, every commit goes through the writer thread: for benchmarks that
    /// compare the two in one run.
    pub fn set_inline_commits(&self, on: bool) {
        self.writer.set_inline(on);
    }

    /// Writer counters (batches = transactions = fsyncs).
    pub fn stats(&self) -> WriterStats {
        self.writer.stats()
    }

    /// Whether batches go through the journal (on by default). Off, every
    /// batch commits with SQLite's flush: for benchmarks that compare the
    /// two in one run.
    pub fn set_journal(&self, on: bool) {
        self.journal.off.store(!on, Ordering::Relaxed);
    }

    /// Whether a journalled batch's last statements run while its record
    /// goes to the disk (on by default). Off, the record is flushed before
    /// them: for benchmarks that compare the two in one run.
    #[doc(hidden)]
    pub fn set_early_write(&self, on: bool) {
        self.journal.flush_first.store(!on, Ordering::Relaxed);
    }

    /// For tests of a process killed between a record's write and its
    /// commit: the next batch that goes through the journal stops there as
    /// such a process would (its transaction gone, the journal's lock
    /// released with the record in it, its callers answered `Closed`), and
    /// every later commit fails `Closed`.
    #[doc(hidden)]
    pub fn crash_after_next_record(&self) {
        self.journal
            .crash_after_record
            .store(true, Ordering::Relaxed);
    }

    /// Whether a journalled batch's transaction stays open for the next
    /// batches once its record is flushed and its callers answered (on by
    /// default; docs/STORE.md, "Answered records held in one transaction").
    /// Off, each batch commits before its answers: for benchmarks that
    /// compare the two in one run.
    #[doc(hidden)]
    pub fn set_hold(&self, on: bool) {
        self.journal.hold_off.store(!on, Ordering::Relaxed);
    }

    /// For tests of a `COMMIT` that fails after its records were answered
    /// (a full disk): the next `n` commits of held records, and attempts to
    /// apply them again from the journal, fail.
    #[doc(hidden)]
    pub fn fail_next_commits(&self, n: u32) {
        self.journal.fail_commits.store(n, Ordering::Relaxed);
    }

    /// For tests of a disk that fails a flush: the next batch that goes
    /// through the journal finds its record's flush failed, as a disk's I/O
    /// error would.
    #[doc(hidden)]
    pub fn fail_next_journal_flush(&self) {
        self.journal.fail_flush.store(true, Ordering::Relaxed);
    }

    /// What the journal did since the store opened.
    pub fn journal_stats(&self) -> JournalStats {
        let c = &self.journal;
        let active = c.active.load(Ordering::Relaxed);
        JournalStats {
            active,
            why_off: if active {
                None
            } else {
                self.journal_off.clone()
            },
            adopted: c.adopted.load(Ordering::Relaxed),
            records: c.records.load(Ordering::Relaxed),
            restarts: c.restarts.load(Ordering::Relaxed),
            replayed: c.replayed.load(Ordering::Relaxed),
            flushed_batches: c.flushed_batches.load(Ordering::Relaxed),
            recovered: c.recovered.load(Ordering::Relaxed),
            discarded: self.set_aside.records,
            set_aside_error: self.set_aside.copy_error.clone(),
        }
    }

    /// The read connection, once every commit answered so far is in the
    /// database: answered records the writer holds in its open transaction
    /// are committed first. Refused when they cannot be (the read would miss
    /// answered commits).
    fn read(&self) -> Result<MutexGuard<'_, Connection>, StoreError> {
        self.writer.settle(BUSY_TIMEOUT)?;
        Ok(self.read_committed())
    }

    /// The read connection without waiting for the writer: it reads what is
    /// committed, which may lack this process's latest answered commits
    /// (`Store::latches_committed`).
    fn read_committed(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the reader leaves no half-done write behind
        // (it is query-only), so a poisoned lock is still usable.
        self.reader.lock().unwrap_or_else(|p| p.into_inner())
    }
}
