//! The PostgreSQL schema: numbered migrations, the `schema_version` table
//! that records which ran, the check an opening store makes, and
//! `tether store migrate`.
//!
//! An endpoint never changes the schema itself: its role needs no DDL right
//! (see docs/STORE.md), and a fleet must not have whichever endpoint starts
//! first upgrade the database under the others. `migrate` does it, once.

use super::conn::PgConn;
use crate::chain::GENESIS_PREV_HASH;
use crate::StoreError;

/// Schema version this build reads and writes (the highest migration it knows).
pub const PG_SCHEMA_VERSION: i32 = 3;

/// Key of the advisory lock two concurrent `migrate` runs serialise on.
const MIGRATE_LOCK: i64 = 0x7465_7468_6572; // "tether"

/// Migrations by number. Never edit a released one: add a new one.
///
/// Ids are `COLLATE "C"`: ordered by bytes, as SQLite orders them, whatever
/// the database's locale. JSON is kept as `text`, not `jsonb`: a chain entry's bytes are what its
/// hash covers, and `jsonb` would re-spell them. `chain_head` is the one row
/// every batch locks: it serialises the writers of all endpoints on the
/// store into one chain, records the head beside the entries (a cut tail is
/// noticed) and counts commits (the change token).
const MIGRATIONS: &[(i32, &str)] = &[
    (
        1,
        r#"CREATE TABLE chain_head(
        id integer PRIMARY KEY CHECK (id = 1),
        seq bigint NOT NULL,
        hash text NOT NULL,
        batches bigint NOT NULL
    );
    CREATE TABLE events(
        seq bigint PRIMARY KEY,
        hash text NOT NULL,
        line text NOT NULL
    );
    CREATE TABLE receipts(
        seq bigint PRIMARY KEY,
        command_id text COLLATE "C" NOT NULL UNIQUE,
        input_digest text NOT NULL
    );
    CREATE TABLE revisions(
        device_id text COLLATE "C" NOT NULL,
        resource text COLLATE "C" NOT NULL,
        revision bigint NOT NULL,
        PRIMARY KEY (device_id, resource)
    );
    CREATE TABLE latches(
        device_id text COLLATE "C" PRIMARY KEY,
        latched boolean NOT NULL,
        info text NOT NULL
    );
    CREATE TABLE budget(
        reservation_id text COLLATE "C" PRIMARY KEY,
        ord bigserial NOT NULL,
        key text NOT NULL,
        amount double precision NOT NULL,
        ts_ms bigint NOT NULL,
        released boolean NOT NULL
    );
    CREATE INDEX budget_ts ON budget(ts_ms, ord);
    CREATE TABLE open_ops(
        command_id text COLLATE "C" PRIMARY KEY,
        info text NOT NULL
    );
    CREATE TABLE approvals(
        approval_id text COLLATE "C" PRIMARY KEY,
        record text NOT NULL,
        created_seq bigint NOT NULL,
        updated_seq bigint NOT NULL
    );
    CREATE INDEX approvals_updated ON approvals(updated_seq);
    CREATE TABLE invocations(
        invocation_id text COLLATE "C" PRIMARY KEY,
        info text,
        seq bigint,
        CHECK ((info IS NULL) <> (seq IS NULL))
    );"#,
    ),
    (
        2,
        // Leases (crate::lease): the endpoints alive on the store and the
        // owner of each physical device, on the database server's clock.
        r#"CREATE TABLE leases(
        key text COLLATE "C" PRIMARY KEY,
        holder text NOT NULL,
        renewed_ms bigint NOT NULL,
        until_ms bigint NOT NULL,
        info text NOT NULL
    );"#,
    ),
    (
        3,
        // Retention (`tether audit archive`): a receipt whose chain entry
        // was archived keeps its document here (NULL while the entry is in
        // the chain); `archives` records each archive, the newest naming
        // where the chain now starts.
        r#"ALTER TABLE receipts ADD COLUMN receipt text;
    CREATE TABLE archives(
        through_seq bigint PRIMARY KEY,
        through_hash text NOT NULL,
        checkpoint_seq bigint NOT NULL,
        first_seq bigint NOT NULL,
        entries bigint NOT NULL,
        file_sha256 text NOT NULL,
        file_name text NOT NULL,
        archived_ms bigint NOT NULL
    );"#,
    ),
];

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The schema version the database records; 0 when it has no Tether schema.
pub(super) fn stored_version(pg: &mut PgConn) -> Result<i32, StoreError> {
    let exists = pg.query("SELECT to_regclass('schema_version') IS NOT NULL", &[])?;
    let exists: bool = exists
        .first()
        .map(|r| r.try_get(0))
        .transpose()
        .map_err(|e| StoreError::Postgres(e.to_string()))?
        .unwrap_or(false);
    if !exists {
        return Ok(0);
    }
    let rows = pg.query("SELECT COALESCE(MAX(version), 0) FROM schema_version", &[])?;
    rows.first()
        .map(|r| r.try_get::<_, i32>(0))
        .transpose()
        .map_err(|e| StoreError::Corrupt(format!("schema_version: {e}")))
        .map(|v| v.unwrap_or(0))
}

/// Refuses a database whose schema is not exactly this build's, naming both
/// versions and what to do.
pub(super) fn check_version(pg: &mut PgConn) -> Result<(), StoreError> {
    let found = stored_version(pg)?;
    let url = &pg.target().shown;
    match found {
        v if v == PG_SCHEMA_VERSION => Ok(()),
        0 => Err(StoreError::Unsupported(format!(
            "{url} holds no Tether schema (this build uses schema version {PG_SCHEMA_VERSION}); create it with `tether store migrate --store {url}`"
        ))),
        v if v < PG_SCHEMA_VERSION => Err(StoreError::Unsupported(format!(
            "{url} has schema version {v}, this build uses version {PG_SCHEMA_VERSION}; upgrade it with `tether store migrate --store {url}`"
        ))),
        v => Err(StoreError::Unsupported(format!(
            "{url} has schema version {v}, newer than this build knows (version {PG_SCHEMA_VERSION}); run a Tether that knows version {v}"
        ))),
    }
}

/// Creates the schema or brings it up to [`PG_SCHEMA_VERSION`], in one
/// transaction; refuses a newer one. Returns `(before, after)`.
pub(super) fn migrate(pg: &mut PgConn) -> Result<(i32, i32), StoreError> {
    pg.batch("BEGIN")?;
    let r = migrate_in_tx(pg);
    match r {
        Ok(v) => {
            pg.commit()?;
            Ok(v)
        }
        Err(e) => {
            let _ = pg.batch("ROLLBACK");
            Err(e)
        }
    }
}

fn migrate_in_tx(pg: &mut PgConn) -> Result<(i32, i32), StoreError> {
    pg.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATE_LOCK])?;
    pg.batch(
        "CREATE TABLE IF NOT EXISTS schema_version(
            version integer PRIMARY KEY,
            applied_ms bigint NOT NULL
        )",
    )?;
    let before = stored_version(pg)?;
    if before > PG_SCHEMA_VERSION {
        return Err(StoreError::Unsupported(format!(
            "{} has schema version {before}, newer than this build knows (version {PG_SCHEMA_VERSION}); nothing was changed",
            pg.target().shown
        )));
    }
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > before) {
        pg.batch(sql)?;
        if *version == 1 {
            pg.execute(
                "INSERT INTO chain_head(id, seq, hash, batches) VALUES (1, 0, $1, 0)",
                &[&GENESIS_PREV_HASH],
            )?;
        }
        pg.execute(
            "INSERT INTO schema_version(version, applied_ms) VALUES ($1, $2)",
            &[version, &now_ms()],
        )?;
    }
    Ok((before, PG_SCHEMA_VERSION))
}
