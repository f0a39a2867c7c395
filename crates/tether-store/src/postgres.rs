//! The PostgreSQL store: the state of every endpoint of a fleet in one
//! database, behind the same [`Store`](crate::Store) contract as
//! [`SqliteStore`](crate::SqliteStore).
//!
//! Durability: every session runs with `synchronous_commit=on`, so `COMMIT`
//! returns only once the server flushed its WAL; only then does a `done`
//! callback hear of success. The group-commit writer (`writer.rs`, shared
//! with SQLite) applies everything queued in one transaction.
//!
//! One chain for the whole store, whichever endpoint writes: each batch
//! locks the `chain_head` row first, so the writers of all endpoints take
//! turns, each continuing from the head the last one left (see docs/STORE.md
//! for why one chain rather than one per endpoint).
//!
//! Threads: the writer thread and a reader thread each own one connection
//! and a current-thread runtime; the synchronous `Store` reads (called from
//! tokio worker threads, where blocking on a future would panic) are handed
//! to the reader over a bounded queue and answered over a channel.
//!
//! | module | owns |
//! |---|---|
//! | `conn` | the URL, the password's source, one connection, bounded calls |
//! | `tls` | `sslmode` / `sslrootcert` and the rustls client (ring provider) |
//! | `schema` | the numbered migrations, `schema_version`, `migrate` |
//! | `head` | the chain head and the `chain_head` row |
//! | `apply` | the writer's backend: one transaction per batch |
//! | `read` | the `Store` queries and the chain export |
//! | `listen` | `LISTEN tether_change`: wakes the governed-stop watcher |
//! | `verify` | `audit verify` of a PostgreSQL store |
//! | `copy` | `tether store copy`: a SQLite store's state moved in, verified |
//! | `archive` | the archive anchor and `audit archive`'s transaction |

mod apply;
mod archive;
mod conn;
mod copy;
mod head;
mod listen;
mod read;
mod schema;
mod tls;
mod verify;

pub use conn::is_postgres_url;
pub use copy::{copy_sqlite_to_url, CopyReport};
pub use schema::PG_SCHEMA_VERSION;
pub use verify::{verify_url, verify_url_with};

use crate::writer::{Writer, WriterStats};
use crate::StoreError;
use conn::{PgConn, PgTarget, CONNECT_TIMEOUT, STATEMENT_TIMEOUT};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::time::Duration;

/// Most reads waiting for the reader thread; beyond it a read is refused
/// with [`StoreError::Overloaded`] rather than queued without bound.
const READ_QUEUE: usize = 256;

/// Longest a read waits for its answer: a reconnect and one statement, with
/// room for the reads queued before it.
const READ_WAIT: Duration = Duration::from_secs(30);

const _: () =
    assert!(READ_WAIT.as_secs() > CONNECT_TIMEOUT.as_secs() + STATEMENT_TIMEOUT.as_secs());

type ReadJob = Box<dyn FnOnce(&mut PgConn) + Send + 'static>;

/// PostgreSQL-backed [`Store`](crate::Store).
pub struct PgStore {
    writer: Writer,
    reads: SyncSender<ReadJob>,
    shown: String,
    /// Where to connect for work of its own (`audit archive`'s transaction).
    target: PgTarget,
    changes: std::sync::Arc<listen::Changes>,
}

impl Drop for PgStore {
    fn drop(&mut self) {
        self.changes.close();
    }
}

/// Poll interval of the governed-stop watcher on PostgreSQL, ms: the
/// fallback behind `LISTEN`, which wakes it at once for a trip.
pub const PG_CHANGE_POLL_MS: u64 = 20;

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("url", &self.shown)
            .finish_non_exhaustive()
    }
}

/// Runs `f` on a thread of its own (a connection must never block a
/// runtime's thread, and the caller may be one) and waits for it.
fn on_own_thread<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    let handle = std::thread::Builder::new()
        .name("tether-pg-open".into())
        .spawn(f)
        .map_err(|e| StoreError::Io(format!("cannot start a thread: {e}")))?;
    handle.join().unwrap_or_else(|_| Err(StoreError::Closed))
}

impl PgStore {
    /// Connects to the store at `url`. Refuses with
    /// [`StoreError::Unsupported`] a database whose schema is not this
    /// build's (naming both versions; `tether store migrate` makes it), and
    /// with [`StoreError::Corrupt`] one whose chain head fails its checks.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        let target = PgTarget::parse(url)?;
        let shown = target.shown.clone();
        let listen_target = target.clone();
        let own_target = target.clone();
        let (writer_conn, reader_conn, head) = on_own_thread(move || {
            let mut w = PgConn::connect(target.clone())?;
            schema::check_version(&mut w)?;
            let head = head::load_head(&mut w)?;
            let r = PgConn::connect(target)?;
            Ok((w, r, head))
        })?;
        let (reads, rx) = mpsc::sync_channel::<ReadJob>(READ_QUEUE);
        std::thread::Builder::new()
            .name("tether-pg-reader".into())
            .spawn(move || {
                let mut pg = reader_conn;
                // Ends when the store (the only sender) is dropped.
                while let Ok(job) = rx.recv() {
                    job(&mut pg);
                }
            })
            .map_err(|e| StoreError::Io(format!("cannot start the store reader thread: {e}")))?;
        let writer = Writer::spawn(apply::PgBackend::new(writer_conn, head), "tether-pg-writer")?;
        let changes = std::sync::Arc::new(listen::Changes::default());
        listen::spawn(listen_target, std::sync::Arc::clone(&changes))
            .map_err(|e| StoreError::Io(format!("cannot start the store listener thread: {e}")))?;
        Ok(Self {
            writer,
            reads,
            shown,
            target: own_target,
            changes,
        })
    }

    /// Creates the schema at `url`, or upgrades it to [`PG_SCHEMA_VERSION`];
    /// returns the versions before and after. Refuses a newer schema.
    pub fn migrate(url: &str) -> Result<(i32, i32), StoreError> {
        let target = PgTarget::parse(url)?;
        on_own_thread(move || {
            let mut pg = PgConn::connect(target)?;
            schema::migrate(&mut pg)
        })
    }

    /// The URL it was opened with (it holds no password).
    pub fn url(&self) -> &str {
        &self.shown
    }

    /// Writer counters (batches = transactions).
    pub fn stats(&self) -> WriterStats {
        self.writer.stats()
    }

    /// Runs `f` on the reader thread and waits (bounded) for its answer.
    fn call<T: Send + 'static>(
        &self,
        f: impl Fn(&mut PgConn) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (tx, rx) = mpsc::sync_channel(1);
        let job: ReadJob = Box::new(move |pg| {
            let mut r = pg.ensure().and_then(|()| f(pg));
            if r.is_err() && pg.link_dropped() {
                // A read changes nothing, so it is tried once more on a new
                // link: the first read after a server restart still answers.
                r = pg.ensure().and_then(|()| f(pg));
            }
            // The caller may have given up waiting; then nobody listens.
            let _ = tx.send(r);
        });
        match self.reads.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => return Err(StoreError::Overloaded),
            Err(TrySendError::Disconnected(_)) => return Err(StoreError::Closed),
        }
        match rx.recv_timeout(READ_WAIT) {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Timeout) => Err(StoreError::Postgres(format!(
                "no answer from {} within {READ_WAIT:?}",
                self.shown
            ))),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(StoreError::Closed),
        }
    }
}
