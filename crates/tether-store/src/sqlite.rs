//! The SQLite store: one `tether.db` per state directory.
//!
//! Durability: WAL journal with `synchronous=FULL`, so a `COMMIT` returns only
//! after the WAL is fsynced. The writer thread owns the only write connection
//! and the chain head; reads go through a second connection (WAL lets it read
//! the last committed state while the writer works).

use crate::chain::{check_entry_text, seal, GENESIS_PREV_HASH};
use crate::writer::{Backend, Job, Writer, WriterStats};
use crate::{
    BudgetRow, Commit, CommitAck, Done, LatchRow, ReceiptRow, RevisionRow, Store, StoreError,
};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, TransactionBehavior};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// The one database file in a state directory.
pub const DB_FILE_NAME: &str = "tether.db";

/// Schema version this build writes (the highest migration it knows).
pub const SCHEMA_VERSION: i64 = 5;

/// How long a connection waits for another process holding the write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Page cache of the write connection, in KiB.
const WRITER_CACHE_KIB: i64 = 16 * 1024;

/// Rows fetched per page when streaming the chain, so an export or a verify
/// of a long chain holds neither the whole chain in memory nor the read
/// connection for the whole run.
pub(crate) const PAGE_ROWS: i64 = 1024;

/// Migrations by number; each runs once, in order, in one transaction with
/// the version bump. Never edit a released migration: add a new one.
const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        "CREATE TABLE events(
        seq INTEGER PRIMARY KEY,
        hash TEXT NOT NULL,
        line TEXT NOT NULL
    );
    CREATE TABLE receipts(
        command_id TEXT PRIMARY KEY,
        input_digest TEXT NOT NULL,
        receipt TEXT NOT NULL,
        seq INTEGER NOT NULL
    );
    CREATE TABLE revisions(
        device_id TEXT NOT NULL,
        resource TEXT NOT NULL,
        revision INTEGER NOT NULL,
        PRIMARY KEY(device_id, resource)
    ) WITHOUT ROWID;
    CREATE TABLE latches(
        device_id TEXT PRIMARY KEY,
        latched INTEGER NOT NULL,
        info TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE budget(
        reservation_id TEXT PRIMARY KEY,
        key TEXT NOT NULL,
        amount REAL NOT NULL,
        ts_ms INTEGER NOT NULL,
        released INTEGER NOT NULL
    );
    CREATE INDEX budget_ts ON budget(ts_ms);
    CREATE TABLE open_ops(
        command_id TEXT PRIMARY KEY,
        info TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE meta(
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    ) WITHOUT ROWID;",
    ),
    (
        2,
        "CREATE TABLE approvals(
        approval_id TEXT PRIMARY KEY,
        record TEXT NOT NULL,
        created_seq INTEGER NOT NULL
    );",
    ),
    (
        3,
        // Invocations of the REST tool gateway, retained across restarts.
        "CREATE TABLE invocations(
        invocation_id TEXT PRIMARY KEY,
        info TEXT NOT NULL
    ) WITHOUT ROWID;",
    ),
    (
        4,
        // Each receipt is stored once, inside the chain entry that records it
        // (its `receipt` member); this table only indexes that entry. Up to
        // version 3 every receipt row pointed at exactly that entry (one
        // receipt per commit, one event per receipt commit), which
        // `check_receipts_movable` confirms before this runs.
        "ALTER TABLE receipts RENAME TO receipts_v3;
    CREATE TABLE receipts(
        seq INTEGER PRIMARY KEY,
        command_id TEXT NOT NULL UNIQUE,
        input_digest TEXT NOT NULL
    );
    INSERT INTO receipts(seq, command_id, input_digest)
        SELECT seq, command_id, input_digest FROM receipts_v3;
    DROP TABLE receipts_v3;",
    ),
    (
        5,
        // An invocation's record may be the body of a chain entry (the
        // gateway's `invocation.accepted`), indexed by `seq` instead of
        // copied: exactly one of `info` and `seq` is set.
        "ALTER TABLE invocations RENAME TO invocations_v4;
    CREATE TABLE invocations(
        invocation_id TEXT PRIMARY KEY,
        info TEXT,
        seq INTEGER,
        CHECK ((info IS NULL) <> (seq IS NULL))
    ) WITHOUT ROWID;
    INSERT INTO invocations(invocation_id, info) SELECT invocation_id, info FROM invocations_v4;
    DROP TABLE invocations_v4;",
    ),
];

/// Before migration 4 drops the receipt copies: every receipt row must point
/// at an entry whose body holds that same receipt. Otherwise the migration is
/// refused and nothing changes.
fn check_receipts_movable(tx: &rusqlite::Transaction<'_>) -> Result<(), StoreError> {
    let stray: Option<String> = tx
        .query_row(
            "SELECT r.command_id FROM receipts r LEFT JOIN events e ON e.seq = r.seq
             WHERE e.seq IS NULL
                OR json_extract(e.line, '$.body.receipt.command_id') IS NOT r.command_id
                OR json(json_extract(e.line, '$.body.receipt')) IS NOT json(r.receipt)
             LIMIT 1",
            [],
            |r| r.get(0),
        )
        .optional()?;
    match stray {
        None => Ok(()),
        Some(id) => Err(StoreError::Corrupt(format!(
            "cannot migrate to schema 4: the receipt of command_id {id:?} is not the one in its chain entry; nothing was changed"
        ))),
    }
}

/// SQLite-backed [`Store`].
pub struct SqliteStore {
    writer: Writer,
    reader: Mutex<Connection>,
    path: PathBuf,
    // Declared last: dropped after the writer has drained.
    _checkpointer: Checkpointer,
}

/// The writer's automatic checkpoint threshold, pages: a backstop only.
const WRITER_AUTOCHECKPOINT_PAGES: i64 = 65_536;
/// How often the checkpointer copies the WAL back into the database. Short,
/// so each pass (and its database sync) is small and the writer's backstop
/// checkpoint, when the WAL reaches its size, finds little left to copy: at
/// 250 ms the e-stop's latch commit under REST load waited ~100 ms behind
/// that backstop, at 40 ms 16-75 ms (docs/PERFORMANCE.md, sixth pass).
const CHECKPOINT_INTERVAL: std::time::Duration = std::time::Duration::from_millis(40);

/// A thread with its own connection that runs passive checkpoints, which
/// never block the writer.
struct Checkpointer {
    stop: std::sync::Arc<(Mutex<bool>, std::sync::Condvar)>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Checkpointer {
    fn spawn(path: &Path) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        let stop = std::sync::Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("tether-store-ckpt".into())
            .spawn(move || checkpoint_loop(&conn, &flag))
            .map_err(|e| StoreError::Io(format!("cannot start the checkpoint thread: {e}")))?;
        Ok(Self {
            stop,
            handle: Some(handle),
        })
    }
}

fn checkpoint_loop(conn: &Connection, stop: &(Mutex<bool>, std::sync::Condvar)) {
    let (lock, cv) = stop;
    let mut stopped = lock.lock().unwrap_or_else(|p| p.into_inner());
    // Runs until the store is dropped; each round waits at most one interval.
    while !*stopped {
        let (guard, _) = cv
            .wait_timeout(stopped, CHECKPOINT_INTERVAL)
            .unwrap_or_else(|p| p.into_inner());
        stopped = guard;
        if *stopped {
            break;
        }
        drop(stopped);
        // A failed passive checkpoint is retried next round; the WAL keeps
        // every committed frame meanwhile, so nothing is lost.
        let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
        stopped = lock.lock().unwrap_or_else(|p| p.into_inner());
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        let (lock, cv) = &*self.stop;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cv.notify_all();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
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
        conn.set_prepared_statement_cache_capacity(32);
        migrate(&mut conn)?;
        let head = load_head(&conn)?;

        let reader = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        reader.busy_timeout(BUSY_TIMEOUT)?;
        // Readers never write; make that a property of the connection.
        reader.pragma_update(None, "query_only", true)?;
        reader.set_prepared_statement_cache_capacity(32);

        let backend = SqliteBackend {
            conn,
            chain: ChainState {
                head,
                scratch: String::with_capacity(256),
                batch_revisions: std::collections::HashMap::new(),
            },
        };
        let writer = Writer::spawn(backend, "tether-store-writer")?;
        let checkpointer = Checkpointer::spawn(&path)?;
        Ok(SqliteStore {
            writer,
            reader: Mutex::new(reader),
            path,
            _checkpointer: checkpointer,
        })
    }

    /// Path of the database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writer counters (batches = transactions = fsyncs).
    pub fn stats(&self) -> WriterStats {
        self.writer.stats()
    }

    fn read(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the reader leaves no half-done write behind
        // (it is query-only), so a poisoned lock is still usable.
        self.reader.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_version(
            version INTEGER PRIMARY KEY,
            applied_ms INTEGER NOT NULL
        )",
    )?;
    let current: i64 = tx.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_version",
        [],
        |r| r.get(0),
    )?;
    if current > SCHEMA_VERSION {
        return Err(StoreError::Unsupported(format!(
            "schema version {current} is newer than this build supports ({SCHEMA_VERSION})"
        )));
    }
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current) {
        if *version == 4 {
            check_receipts_movable(&tx)?;
        }
        tx.execute_batch(sql)?;
        tx.execute(
            "INSERT INTO schema_version(version, applied_ms) VALUES (?1, ?2)",
            params![version, now_ms()],
        )?;
    }
    if current == 0 {
        tx.execute(
            "INSERT OR IGNORE INTO meta(key, value) VALUES ('created_ms', ?1)",
            params![now_ms().to_string()],
        )?;
    }
    tx.commit()?;
    Ok(())
}

/// The in-memory chain head the writer extends.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Head {
    seq: u64,
    hash: String,
}

fn seq_from_db(v: i64) -> Result<u64, StoreError> {
    u64::try_from(v)
        .map_err(|_| StoreError::Corrupt(format!("negative seq {v} in the events table")))
}

fn seq_to_db(v: u64) -> Result<i64, StoreError> {
    i64::try_from(v)
        .map_err(|_| StoreError::Corrupt(format!("seq {v} exceeds SQLite's integer range")))
}

/// Read and verify the last entry: it must recompute its own hash and agree
/// with its `seq` and `hash` columns. Verifying only the head keeps open O(1);
/// `verify_store` checks the whole chain.
fn load_head(conn: &Connection) -> Result<Head, StoreError> {
    let row: Option<(i64, String, String)> = conn
        .query_row(
            "SELECT seq, hash, line FROM events ORDER BY seq DESC LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()?;
    let Some((seq, hash, line)) = row else {
        check_recorded_head(conn, 0, GENESIS_PREV_HASH)?;
        return Ok(Head {
            seq: 0,
            hash: GENESIS_PREV_HASH.to_string(),
        });
    };
    let seq = seq_from_db(seq)?;
    let link = check_entry_text(line.as_bytes()).map_err(|e| {
        StoreError::Corrupt(format!(
            "chain head (seq {seq}) fails verification: {}",
            e.reason
        ))
    })?;
    if link.seq != seq || link.hash != hash {
        return Err(StoreError::Corrupt(format!(
            "chain head row seq {seq} does not match its entry (seq {}, hash {})",
            link.seq, link.hash
        )));
    }
    check_recorded_head(conn, seq, &hash)?;
    Ok(Head { seq, hash })
}

/// The head recorded in `meta` (`None` for a store written before it was kept).
pub(crate) fn recorded_head(conn: &Connection) -> Result<Option<(u64, String)>, StoreError> {
    let value: Option<String> = conn
        .query_row("SELECT value FROM meta WHERE key = 'chain_head'", [], |r| {
            r.get(0)
        })
        .optional()?;
    let Some(value) = value else {
        return Ok(None);
    };
    let parsed = value
        .split_once(' ')
        .and_then(|(seq, hash)| Some((seq.parse::<u64>().ok()?, hash.to_owned())));
    match parsed {
        Some(head) => Ok(Some(head)),
        None => Err(StoreError::Corrupt(format!(
            "the recorded chain head {value:?} is not `SEQ HASH`"
        ))),
    }
}

/// The events table must reach the head recorded with its last batch: an
/// events table that ends earlier lost entries from its end. (It may end
/// later: a process of an older version appended without recording.)
pub(crate) fn check_recorded_head(
    conn: &Connection,
    seq: u64,
    hash: &str,
) -> Result<(), StoreError> {
    match recorded_head(conn)? {
        Some((recorded, _)) if recorded > seq => Err(StoreError::Corrupt(format!(
            "entries were removed from the end of the evidence chain: the store recorded its head at seq {recorded}, the events table ends at seq {seq}"
        ))),
        Some((recorded, recorded_hash)) if recorded == seq && recorded_hash != hash => {
            Err(StoreError::Corrupt(format!(
                "the chain head (seq {seq}) is not the entry the store recorded there"
            )))
        }
        _ => Ok(()),
    }
}

struct SqliteBackend {
    conn: Connection,
    chain: ChainState,
}

/// The writer's state beside its connection (kept apart so a batch can hold
/// statements prepared on the connection while it advances the chain).
struct ChainState {
    head: Head,
    /// Reused buffer for sealing entries.
    scratch: String,
    /// Highest revision per `(device_id, resource)` among the batch's
    /// commits so far (only those that succeeded alone).
    batch_revisions: std::collections::HashMap<(String, String), u64>,
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
        let outcome = self.try_batch(batch, ts_ms, results);
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
    fn try_batch(
        &mut self,
        batch: &[Job],
        ts_ms: u64,
        results: &mut Vec<Result<CommitAck, StoreError>>,
    ) -> Result<(), StoreError> {
        // IMMEDIATE takes the write lock now, so the head check below cannot
        // race with another process appending.
        self.conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        self.reconcile_head()?;
        self.chain.batch_revisions.clear();
        {
            let mut hot = HotStatements::prepare(&self.conn)?;
            for job in batch {
                let r = apply_one(&self.conn, &mut self.chain, &mut hot, job, ts_ms)?;
                results.push(r);
            }
        }
        self.write_batch_revisions()?;
        self.record_head()?;
        self.conn.prepare_cached("COMMIT")?.execute([])?;
        Ok(())
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
    {
        for r in &c.receipts {
            if hot.receipt_exists.exists([&r.row.command_id])? {
                return Ok(Err(StoreError::Conflict(format!(
                    "a receipt for command_id {:?} is already stored",
                    r.row.command_id
                ))));
            }
        }
        // An operation opens under its command_id once: another process on
        // this store that already ran the id (a receipt) or is running it
        // (an open operation) makes the start a conflict, so a command id is
        // dispatched once per state directory, not once per process.
        if !c.open_ops.is_empty() {
            let mut open = conn.prepare_cached("SELECT 1 FROM open_ops WHERE command_id = ?1")?;
            for (op, _) in &c.open_ops {
                let id = &op.command_id;
                if hot.receipt_exists.exists([id])? || open.exists([id])? {
                    return Ok(Err(StoreError::Conflict(format!(
                        "command_id {id:?} already ran or is running on this store"
                    ))));
                }
            }
        }
        if !c.budget_draws.is_empty() {
            let mut exists =
                conn.prepare_cached("SELECT 1 FROM budget WHERE reservation_id = ?1")?;
            for b in &c.budget_draws {
                if exists.exists([&b.reservation_id])? {
                    return Ok(Err(StoreError::Conflict(format!(
                        "budget reservation {:?} is already stored",
                        b.reservation_id
                    ))));
                }
            }
        }
    }

    let first_seq = chain.head.seq + 1;
    if !c.events.is_empty() {
        for e in &c.events {
            let seq = chain.head.seq + 1;
            let sealed = seal(
                seq,
                ts_ms,
                &e.kind_json,
                &e.body_json,
                &chain.head.hash,
                &mut chain.scratch,
            );
            hot.insert_event
                .execute(params![seq_to_db(seq)?, &sealed.hash, &sealed.line])?;
            chain.head = Head {
                seq,
                hash: sealed.hash,
            };
        }
    }
    if !c.receipts.is_empty() {
        for r in &c.receipts {
            // prepare() checked that `event` indexes this commit's events.
            let seq = first_seq + r.row.event as u64;
            debug_assert!(seq <= chain.head.seq);
            hot.insert_receipt.execute(params![
                seq_to_db(seq)?,
                &r.row.command_id,
                &r.row.input_digest
            ])?;
        }
    }
    // Revisions only ever rise (the highest wins), so a batch's are
    // gathered and written once per resource before COMMIT.
    for r in &c.revisions {
        let slot = chain
            .batch_revisions
            .entry((r.device_id.clone(), r.resource.clone()))
            .or_insert(0);
        *slot = (*slot).max(r.revision);
    }
    if !c.latches.is_empty() {
        let mut upsert = conn.prepare_cached(
            "INSERT INTO latches(device_id, latched, info) VALUES (?1, ?2, ?3)
             ON CONFLICT(device_id) DO UPDATE SET latched = excluded.latched, info = excluded.info",
        )?;
        for l in &c.latches {
            upsert.execute(params![&l.row.device_id, l.row.latched, &l.info_json])?;
        }
    }
    if !c.budget_draws.is_empty() {
        let mut insert = conn.prepare_cached(
            "INSERT INTO budget(reservation_id, key, amount, ts_ms, released) VALUES (?1, ?2, ?3, ?4, ?5)",
        )?;
        for b in &c.budget_draws {
            insert.execute(params![
                &b.reservation_id,
                &b.key,
                b.amount,
                seq_to_db(b.ts_ms)?,
                b.released
            ])?;
        }
    }
    if !c.budget_releases.is_empty() {
        let mut release =
            conn.prepare_cached("UPDATE budget SET released = 1 WHERE reservation_id = ?1")?;
        for id in &c.budget_releases {
            release.execute([id])?;
        }
    }
    if !c.open_ops.is_empty() {
        let mut upsert = conn.prepare_cached(
            "INSERT INTO open_ops(command_id, info) VALUES (?1, ?2)
             ON CONFLICT(command_id) DO UPDATE SET info = excluded.info",
        )?;
        for (op, info) in &c.open_ops {
            upsert.execute(params![&op.command_id, info])?;
        }
    }
    if !c.closed_ops.is_empty() {
        let mut delete = conn.prepare_cached("DELETE FROM open_ops WHERE command_id = ?1")?;
        for id in &c.closed_ops {
            delete.execute([id])?;
        }
    }
    if !c.approvals.is_empty() {
        let mut upsert = conn.prepare_cached(
            "INSERT INTO approvals(approval_id, record, created_seq) VALUES (?1, ?2, ?3)
             ON CONFLICT(approval_id) DO UPDATE SET record = excluded.record",
        )?;
        for (a, record_json) in &c.approvals {
            upsert.execute(params![
                &a.approval_id,
                record_json,
                seq_to_db(chain.head.seq)?
            ])?;
        }
    }
    if !c.invocations.is_empty() {
        let mut upsert = conn.prepare_cached(
            "INSERT INTO invocations(invocation_id, info, seq) VALUES (?1, ?2, NULL)
             ON CONFLICT(invocation_id) DO UPDATE SET info = excluded.info, seq = NULL",
        )?;
        for (invocation_id, info) in &c.invocations {
            upsert.execute(params![invocation_id, info])?;
        }
    }
    if !c.invocation_refs.is_empty() {
        let mut upsert = conn.prepare_cached(
            "INSERT INTO invocations(invocation_id, info, seq) VALUES (?1, NULL, ?2)
             ON CONFLICT(invocation_id) DO UPDATE SET info = NULL, seq = excluded.seq",
        )?;
        for r in &c.invocation_refs {
            // prepare() checked that `event` indexes this commit's events.
            let seq = first_seq + r.event as u64;
            debug_assert!(seq <= chain.head.seq);
            upsert.execute(params![&r.invocation_id, seq_to_db(seq)?])?;
        }
    }
    Ok(Ok(CommitAck {
        first_seq,
        last_seq: chain.head.seq,
        head_hash: chain.head.hash.clone(),
    }))
}

fn corrupt_json(what: &str, key: &str, e: serde_json::Error) -> StoreError {
    StoreError::Corrupt(format!("stored {what} for {key:?} is not valid JSON: {e}"))
}

fn u64_col(v: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(v)
        .map_err(|_| StoreError::Corrupt(format!("negative {what} {v} in the database")))
}

fn limit_param(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Store for SqliteStore {
    fn submit(&self, commit: Commit, done: Done) {
        self.writer.submit_owned(commit, done);
    }

    fn submit_ref(&self, commit: &Commit, done: Done) {
        self.writer.submit(commit, done);
    }

    fn receipt(&self, command_id: &str) -> Result<Option<ReceiptRow>, StoreError> {
        let conn = self.read();
        let row: Option<(String, String)> = conn
            .prepare_cached(
                "SELECT r.input_digest, e.line FROM receipts r JOIN events e ON e.seq = r.seq
                 WHERE r.command_id = ?1",
            )?
            .query_row([command_id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        drop(conn);
        match row {
            None => Ok(None),
            Some((input_digest, line)) => Ok(Some(ReceiptRow {
                command_id: command_id.to_string(),
                input_digest,
                receipt: crate::chain::receipt_from_entry(command_id, &line)?,
            })),
        }
    }

    fn receipt_digests(&self, limit: usize) -> Result<(Vec<(String, String)>, bool), StoreError> {
        let conn = self.read();
        let mut st = conn.prepare_cached(
            "SELECT command_id, input_digest FROM receipts ORDER BY seq DESC LIMIT ?1",
        )?;
        // One row more than asked tells whether everything fitted.
        let rows = st.query_map([limit_param(limit.saturating_add(1))], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
        let mut out: Vec<(String, String)> = Vec::new();
        for row in rows {
            out.push(row?);
        }
        let complete = out.len() <= limit;
        out.truncate(limit);
        out.reverse();
        Ok((out, complete))
    }

    fn revisions(&self) -> Result<Vec<RevisionRow>, StoreError> {
        let conn = self.read();
        let mut st = conn.prepare_cached(
            "SELECT device_id, resource, revision FROM revisions ORDER BY device_id, resource",
        )?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)?)))?;
        let mut out = Vec::new();
        for row in rows {
            let (device_id, resource, revision) = row?;
            out.push(RevisionRow {
                device_id,
                resource,
                revision: u64_col(revision, "revision")?,
            });
        }
        Ok(out)
    }

    fn open_ops(&self) -> Result<Vec<crate::OpenOp>, StoreError> {
        let conn = self.read();
        let mut st =
            conn.prepare_cached("SELECT command_id, info FROM open_ops ORDER BY command_id")?;
        let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
        let mut out = Vec::new();
        for row in rows {
            let (command_id, info) = row?;
            let info: Value = serde_json::from_str(&info)
                .map_err(|e| corrupt_json("open operation", &command_id, e))?;
            out.push(crate::OpenOp { command_id, info });
        }
        Ok(out)
    }

    fn approvals(&self) -> Result<Vec<crate::ApprovalRow>, StoreError> {
        let conn = self.read();
        let mut st = conn.prepare_cached(
            "SELECT approval_id, record FROM approvals ORDER BY created_seq, approval_id",
        )?;
        let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
        let mut out = Vec::new();
        for row in rows {
            let (approval_id, record) = row?;
            let record: Value = serde_json::from_str(&record)
                .map_err(|e| corrupt_json("approval", &approval_id, e))?;
            out.push(crate::ApprovalRow {
                approval_id,
                record,
            });
        }
        Ok(out)
    }

    fn invocation(&self, invocation_id: &str) -> Result<Option<crate::InvocationRow>, StoreError> {
        let conn = self.read();
        let row: Option<(Option<String>, Option<i64>, Option<String>)> = conn
            .prepare_cached(
                "SELECT i.info, i.seq, e.line FROM invocations i LEFT JOIN events e ON e.seq = i.seq
                 WHERE i.invocation_id = ?1",
            )?
            .query_row([invocation_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .optional()?;
        drop(conn);
        let info = match row {
            None => return Ok(None),
            Some((Some(info), _, _)) => serde_json::from_str::<Value>(&info)
                .map_err(|e| corrupt_json("invocation", invocation_id, e))?
                .into(),
            Some((None, _, Some(line))) => {
                crate::chain::invocation_from_entry(invocation_id, &line)?
            }
            Some((None, seq, None)) => {
                return Err(StoreError::Corrupt(format!(
                    "invocation {invocation_id:?} is indexed at entry {seq:?}, which is missing"
                )))
            }
        };
        Ok(Some(crate::InvocationRow {
            invocation_id: invocation_id.to_owned(),
            info,
        }))
    }

    fn latches(&self) -> Result<Vec<LatchRow>, StoreError> {
        let conn = self.read();
        let mut st =
            conn.prepare_cached("SELECT device_id, latched, info FROM latches ORDER BY device_id")?;
        let rows = st.query_map([], |r| {
            Ok((r.get::<_, String>(0)?, r.get(1)?, r.get::<_, String>(2)?))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (device_id, latched, info) = row?;
            let info: Value = serde_json::from_str(&info)
                .map_err(|e| corrupt_json("latch info", &device_id, e))?;
            out.push(LatchRow {
                device_id,
                latched,
                info,
            });
        }
        Ok(out)
    }

    fn budget_rows_since(&self, ts_ms: u64) -> Result<Vec<BudgetRow>, StoreError> {
        let conn = self.read();
        let mut st = conn.prepare_cached(
            "SELECT key, reservation_id, amount, ts_ms, released FROM budget
             WHERE ts_ms >= ?1 ORDER BY ts_ms, rowid",
        )?;
        // Stored ts_ms never exceeds i64::MAX, so a larger bound matches nothing.
        let from = i64::try_from(ts_ms).unwrap_or(i64::MAX);
        let rows = st.query_map([from], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get::<_, i64>(3)?,
                r.get(4)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (key, reservation_id, amount, ts, released) = row?;
            out.push(BudgetRow {
                key,
                reservation_id,
                amount,
                ts_ms: u64_col(ts, "budget ts_ms")?,
                released,
            });
        }
        Ok(out)
    }

    fn chain_head(&self) -> Result<Option<(u64, String)>, StoreError> {
        let conn = self.read();
        let row: Option<(i64, String)> = conn
            .prepare_cached("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1")?
            .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        row.map(|(s, h)| Ok((seq_from_db(s)?, h))).transpose()
    }

    fn chain_tail(&self, n: usize) -> Result<Vec<Value>, StoreError> {
        let conn = self.read();
        let mut st =
            conn.prepare_cached("SELECT seq, line FROM events ORDER BY seq DESC LIMIT ?1")?;
        let rows = st.query_map([limit_param(n)], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (seq, line) = row?;
            let v = serde_json::from_str(&line)
                .map_err(|e| corrupt_json("entry", &seq.to_string(), e))?;
            out.push(v);
        }
        out.reverse();
        Ok(out)
    }

    fn export_chain(&self, out: &mut dyn std::io::Write) -> Result<u64, StoreError> {
        // Export up to the head as of now; entries appended meanwhile are left
        // for the next export, which also bounds the loop.
        let Some((head, head_hash)) = self.chain_head()? else {
            crate::verify::write_export_seal(out, 0, GENESIS_PREV_HASH)?;
            out.flush()?;
            return Ok(0);
        };
        let head = seq_to_db(head)?;
        let mut after: i64 = 0;
        let mut count: u64 = 0;
        let mut page: Vec<(i64, String)> = Vec::with_capacity(PAGE_ROWS as usize);
        while after < head {
            page.clear();
            {
                // Hold the reader only while fetching, never while writing to
                // `out` (which may be slow).
                let conn = self.read();
                let mut st = conn.prepare_cached(
                    "SELECT seq, line FROM events WHERE seq > ?1 AND seq <= ?2 ORDER BY seq LIMIT ?3",
                )?;
                let rows = st.query_map(params![after, head, PAGE_ROWS], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })?;
                for row in rows {
                    page.push(row?);
                }
            }
            let Some(&(last, _)) = page.last() else { break };
            for (_, line) in &page {
                out.write_all(line.as_bytes())?;
                out.write_all(b"\n")?;
                count += 1;
            }
            after = last;
        }
        crate::verify::write_export_seal(out, count, &head_hash)?;
        out.flush()?;
        Ok(count)
    }

    fn durable(&self) -> bool {
        true
    }

    fn change_token(&self) -> Result<u64, StoreError> {
        // data_version moves whenever another connection — this process's
        // writer or another process — committed since the last call.
        let conn = self.read();
        let v: i64 = conn.query_row("PRAGMA data_version", [], |r| r.get(0))?;
        Ok(v as u64)
    }
}
