//! The database schema: the numbered migrations, the `schema_version` table
//! that records which of them ran, and the check that guards migration 4.
//!
//! Only what runs once, when the store is opened, belongs here; the chain
//! head is `head`, what a batch writes is `apply`, what the reads ask is
//! `read`.

use crate::StoreError;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

/// Schema version this build writes (the highest migration it knows).
pub const SCHEMA_VERSION: i64 = 10;

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
    (
        6,
        // Each approval record carries the chain position of the commit that
        // last wrote it, so an endpoint reads only what changed since it last
        // looked (approvals and votes made by other processes on the store).
        "ALTER TABLE approvals ADD COLUMN updated_seq INTEGER NOT NULL DEFAULT 0;
    UPDATE approvals SET updated_seq = created_seq;
    CREATE INDEX approvals_updated ON approvals(updated_seq);",
    ),
    (
        7,
        // The writer checks every capped draw against its key's draws in
        // the window, inside the transaction that stores it; this keeps
        // that sum one index range, whatever else the journal holds.
        "CREATE INDEX budget_key_ts ON budget(key, ts_ms);",
    ),
    (
        8,
        // Leases: the endpoints alive on the store and the owner of each
        // physical device (crate::lease), on the writer's clock.
        "CREATE TABLE leases(
        key TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        renewed_ms INTEGER NOT NULL,
        until_ms INTEGER NOT NULL,
        info TEXT NOT NULL
    ) WITHOUT ROWID;",
    ),
    (
        9,
        // Retention (`tether audit archive`): a receipt whose chain entry was
        // archived keeps its document here (NULL while the entry is in the
        // chain), so its command_id still replays; `archives` records each
        // archive, the newest naming where the chain now starts.
        "ALTER TABLE receipts ADD COLUMN receipt TEXT;
    CREATE TABLE archives(
        through_seq INTEGER PRIMARY KEY,
        through_hash TEXT NOT NULL,
        checkpoint_seq INTEGER NOT NULL,
        first_seq INTEGER NOT NULL,
        entries INTEGER NOT NULL,
        file_sha256 TEXT NOT NULL,
        file_name TEXT NOT NULL,
        archived_ms INTEGER NOT NULL
    );",
    ),
    (
        10,
        // Answered commits may be in `tether.journal` and not yet in this
        // file (`journal`): a build that does not read the journal must
        // refuse the store rather than miss them. Nothing else changes.
        "INSERT INTO meta(key, value) VALUES ('journal', 'tether.journal')
         ON CONFLICT(key) DO NOTHING;",
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

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Brings the schema up to [`SCHEMA_VERSION`], refusing a newer one.
/// Returns whether the database was made by this call (it had no schema).
/// A database made here records `journal_held` (a journal position, "GEN
/// INDEX") as the last journal record it holds, in the same transaction:
/// the records already in the journal were written for another database,
/// and no open of this one may apply them.
pub(super) fn migrate(
    conn: &mut Connection,
    journal_held: Option<&str>,
) -> Result<bool, StoreError> {
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
        if let Some(at) = journal_held {
            tx.execute(
                "INSERT INTO meta(key, value) VALUES ('journal_at', ?1)",
                params![at],
            )?;
        }
    }
    tx.commit()?;
    Ok(current == 0)
}
