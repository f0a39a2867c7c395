//! `tether store copy --from DIR --to URL`: an embedded (SQLite) store's
//! whole state moved into a PostgreSQL store, in one transaction, verified
//! before it commits and again after.
//!
//! What moves, row for row and byte for byte: the chain (`events`: each
//! entry's text and hash as stored, so every hash, signed checkpoint and
//! saved export still holds), the receipt index, revisions, latches, the
//! budget journal (in its order), open operations, approvals (with their
//! chain positions) and invocations. The SQLite file's `meta` is not state
//! of the chain beyond its recorded head, which becomes the `chain_head`
//! row.
//!
//! Refused, changing nothing: a target that holds any state already (a copy
//! never merges two chains), a target without this build's schema, a source
//! whose chain does not verify, and a source written while the copy ran.
//! Whether an endpoint holds the source open is checked by the caller
//! (`tether-cli`), which can see other processes' locks.

use super::conn::{PgConn, PgTarget};
use super::head::col;
use crate::StoreError;
use rusqlite::{Connection, OpenFlags, OptionalExtension};
use std::path::Path;

/// Rows read from SQLite and written to PostgreSQL per statement.
const PAGE: i64 = 1024;

/// What a copy moved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyReport {
    /// Chain entries (all of them verified on the target).
    pub entries: u64,
    /// The head both stores now name: its `seq`.
    pub head_seq: u64,
    /// The head's hash.
    pub head_hash: String,
    /// Rows of the receipt index.
    pub receipts: u64,
    /// Resource revisions.
    pub revisions: u64,
    /// E-stop latch rows (latched or reset).
    pub latches: u64,
    /// Rows of the budget journal (draws, released or not).
    pub budget_rows: u64,
    /// Operations open when the source stopped.
    pub open_ops: u64,
    /// Approval records.
    pub approvals: u64,
    /// Gateway invocation rows.
    pub invocations: u64,
}

/// The tables of the state, in the order they are copied and counted.
const TABLES: [&str; 8] = [
    "events",
    "receipts",
    "revisions",
    "latches",
    "budget",
    "open_ops",
    "approvals",
    "invocations",
];

impl CopyReport {
    fn counts(&self) -> [u64; 8] {
        [
            self.entries,
            self.receipts,
            self.revisions,
            self.latches,
            self.budget_rows,
            self.open_ops,
            self.approvals,
            self.invocations,
        ]
    }
}

fn n(rows: usize) -> u64 {
    u64::try_from(rows).unwrap_or(u64::MAX)
}

/// Copies the SQLite store of `dir` into the PostgreSQL store at `url`
/// (whose schema `tether store migrate` made, and which holds nothing yet).
///
/// # Errors
/// [`StoreError::Conflict`] when the target holds state already;
/// [`StoreError::Corrupt`] when the source chain does not verify or the copy
/// does not verify on the target; [`StoreError::Unsupported`] for a target
/// without this build's schema; [`StoreError::Invalid`] when `dir` holds no
/// store or it changed during the copy. Nothing is stored on the target
/// unless the copy verified.
pub fn copy_sqlite_to_url(dir: &Path, url: &str) -> Result<CopyReport, StoreError> {
    let db = dir.join(crate::DB_FILE_NAME);
    if !db.is_file() {
        return Err(StoreError::Invalid(format!(
            "{} holds no Tether store ({} is missing)",
            dir.display(),
            crate::DB_FILE_NAME
        )));
    }
    // Opening it brings an older file to this build's schema and checks its
    // head; then the whole chain must verify before anything is copied.
    let opened = crate::SqliteStore::open(dir)?;
    // An archived store's chain starts past seq 1, proven by a signature:
    // refused by name rather than as a chain that "does not verify".
    if let Some(a) = crate::Store::archive_anchor(&opened)? {
        return Err(StoreError::Unsupported(format!(
            "the store in {} has archived its entries up to seq {} (into {}): `store copy` copies a whole chain from seq 1 only, and the archived entries are no longer in it; nothing was copied (copy the store before archiving, or keep it on SQLite with its archive files)",
            dir.display(),
            a.through_seq,
            a.file_name
        )));
    }
    drop(opened);
    let source = crate::verify::verify_store(dir)?;
    if !source.ok {
        let why = source
            .first_broken
            .map(|b| format!("entry {}: {}", b.line, b.reason))
            .unwrap_or_default();
        return Err(StoreError::Corrupt(format!(
            "the chain in {} does not verify ({why}); nothing was copied",
            dir.display()
        )));
    }
    let target = PgTarget::parse(url)?;
    let db_path = db.clone();
    super::on_own_thread(move || {
        let src = Connection::open_with_flags(&db_path, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        let mut pg = PgConn::connect(target)?;
        super::schema::check_version(&mut pg)?;
        pg.batch("BEGIN")?;
        let r = copy_in_tx(&src, &db_path, &mut pg);
        match r {
            Ok(report) => {
                pg.commit()?;
                Ok(report)
            }
            Err(e) => {
                let _ = pg.batch("ROLLBACK");
                Err(e)
            }
        }
    })
    .and_then(|report| {
        // Once more, as `tether audit verify --store URL` reads it: committed.
        let after = super::verify_url(url)?;
        if !after.ok || after.entries != report.entries {
            return Err(StoreError::Corrupt(format!(
                "the copy committed but does not verify on {url} ({} of {} entries intact)",
                after.entries, report.entries
            )));
        }
        Ok(report)
    })
}

/// The copy inside the target's transaction: refuse a target with state,
/// copy every table from one read snapshot of the source, record the head,
/// verify, and check the source did not move meanwhile.
fn copy_in_tx(src: &Connection, db: &Path, pg: &mut PgConn) -> Result<CopyReport, StoreError> {
    // Taking the head row's lock first: an endpoint starting on the target
    // meanwhile waits, and two copies into one database take turns (the
    // second then finds the first's chain and is refused).
    pg.query("SELECT seq FROM chain_head WHERE id = 1 FOR UPDATE", &[])?;
    refuse_target_with_state(pg)?;
    // One read transaction: every table is read from the same snapshot.
    src.execute_batch("BEGIN")?;
    let mut report = CopyReport::default();
    let (seq, hash) = copy_events(src, pg, &mut report)?;
    report.head_seq = seq;
    report.head_hash = hash.clone();
    report.receipts = copy_receipts(src, pg)?;
    report.revisions = copy_revisions(src, pg)?;
    report.latches = copy_latches(src, pg)?;
    report.budget_rows = copy_budget(src, pg)?;
    report.open_ops = copy_open_ops(src, pg)?;
    report.approvals = copy_approvals(src, pg)?;
    report.invocations = copy_invocations(src, pg)?;
    src.execute_batch("COMMIT")?;
    let seq_db = super::head::seq_to_db(seq)?;
    pg.execute(
        "UPDATE chain_head SET seq = $1, hash = $2, batches = batches + 1 WHERE id = 1",
        &[&seq_db, &hash],
    )?;
    check_target(pg, &report)?;
    check_source_unchanged(db, &report)?;
    Ok(report)
}

fn refuse_target_with_state(pg: &mut PgConn) -> Result<(), StoreError> {
    let rows = pg.query(
        "SELECT (SELECT seq FROM chain_head WHERE id = 1),
                (SELECT count(*) FROM events), (SELECT count(*) FROM receipts),
                (SELECT count(*) FROM revisions), (SELECT count(*) FROM latches),
                (SELECT count(*) FROM budget), (SELECT count(*) FROM open_ops),
                (SELECT count(*) FROM approvals), (SELECT count(*) FROM invocations)",
        &[],
    )?;
    let row = rows
        .first()
        .ok_or_else(|| StoreError::Corrupt("the chain_head row is missing".into()))?;
    let head: i64 = col(row, 0)?;
    let mut held = Vec::new();
    for (i, table) in TABLES.iter().enumerate() {
        let count: i64 = col(row, i + 1)?;
        if count > 0 {
            held.push(format!("{count} rows in {table}"));
        }
    }
    if head > 0 || !held.is_empty() {
        return Err(StoreError::Conflict(format!(
            "{} already holds state (chain head at seq {head}; {}): a copy never merges two chains; copy into a database that `tether store migrate` has just made",
            pg.target().shown,
            if held.is_empty() { "no rows".to_owned() } else { held.join(", ") }
        )));
    }
    Ok(())
}

/// Copies the chain a page at a time, each entry's text and hash exactly
/// as stored; answers the head `(seq, hash)`.
fn copy_events(
    src: &Connection,
    pg: &mut PgConn,
    report: &mut CopyReport,
) -> Result<(u64, String), StoreError> {
    let mut stmt =
        src.prepare("SELECT seq, hash, line FROM events WHERE seq > ?1 ORDER BY seq LIMIT ?2")?;
    let mut head = (0u64, crate::GENESIS_PREV_HASH.to_owned());
    let mut after = i64::MIN;
    loop {
        let mut seqs: Vec<i64> = Vec::new();
        let mut hashes: Vec<String> = Vec::new();
        let mut lines: Vec<String> = Vec::new();
        let mut rows = stmt.query(rusqlite::params![after, PAGE])?;
        while let Some(r) = rows.next()? {
            seqs.push(r.get(0)?);
            hashes.push(r.get(1)?);
            lines.push(r.get(2)?);
        }
        let (Some(&last), Some(last_hash)) = (seqs.last(), hashes.last()) else {
            break;
        };
        head = (super::head::seq_from_db(last)?, last_hash.clone());
        pg.execute(
            "INSERT INTO events(seq, hash, line)
             SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::text[])",
            &[&seqs, &hashes, &lines],
        )?;
        report.entries += n(seqs.len());
        after = last;
    }
    Ok(head)
}

fn copy_receipts(src: &Connection, pg: &mut PgConn) -> Result<u64, StoreError> {
    let mut stmt = src.prepare(
        "SELECT seq, command_id, input_digest FROM receipts WHERE seq > ?1 ORDER BY seq LIMIT ?2",
    )?;
    let mut total = 0;
    let mut after = i64::MIN;
    loop {
        let (mut seqs, mut ids, mut digests) = (Vec::<i64>::new(), Vec::new(), Vec::new());
        let mut rows = stmt.query(rusqlite::params![after, PAGE])?;
        while let Some(r) = rows.next()? {
            seqs.push(r.get(0)?);
            ids.push(r.get::<_, String>(1)?);
            digests.push(r.get::<_, String>(2)?);
        }
        let Some(&last) = seqs.last() else { break };
        pg.execute(
            "INSERT INTO receipts(seq, command_id, input_digest)
             SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::text[])",
            &[&seqs, &ids, &digests],
        )?;
        total += n(seqs.len());
        after = last;
    }
    Ok(total)
}

fn copy_revisions(src: &Connection, pg: &mut PgConn) -> Result<u64, StoreError> {
    // One row per (device, resource): few, read at once.
    let mut stmt = src.prepare("SELECT device_id, resource, revision FROM revisions")?;
    let (mut devices, mut resources, mut revisions) = (Vec::new(), Vec::new(), Vec::new());
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        devices.push(r.get::<_, String>(0)?);
        resources.push(r.get::<_, String>(1)?);
        revisions.push(r.get::<_, i64>(2)?);
    }
    if !devices.is_empty() {
        pg.execute(
            "INSERT INTO revisions(device_id, resource, revision)
             SELECT * FROM UNNEST($1::text[], $2::text[], $3::bigint[])",
            &[&devices, &resources, &revisions],
        )?;
    }
    Ok(n(devices.len()))
}

fn copy_latches(src: &Connection, pg: &mut PgConn) -> Result<u64, StoreError> {
    // One row per device: few, read at once.
    let mut stmt = src.prepare("SELECT device_id, latched, info FROM latches")?;
    let (mut devices, mut latched, mut infos) = (Vec::new(), Vec::new(), Vec::new());
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        devices.push(r.get::<_, String>(0)?);
        latched.push(r.get::<_, i64>(1)? != 0);
        infos.push(r.get::<_, String>(2)?);
    }
    if !devices.is_empty() {
        pg.execute(
            "INSERT INTO latches(device_id, latched, info)
             SELECT * FROM UNNEST($1::text[], $2::boolean[], $3::text[])",
            &[&devices, &latched, &infos],
        )?;
    }
    Ok(n(devices.len()))
}

fn copy_budget(src: &Connection, pg: &mut PgConn) -> Result<u64, StoreError> {
    // In the journal's order (SQLite's rowid), which `ord` then keeps.
    let mut stmt = src.prepare(
        "SELECT rowid, reservation_id, key, amount, ts_ms, released FROM budget
         WHERE rowid > ?1 ORDER BY rowid LIMIT ?2",
    )?;
    let mut total = 0;
    let mut after = i64::MIN;
    loop {
        let mut last = None;
        let (mut ids, mut keys, mut amounts) = (Vec::new(), Vec::new(), Vec::new());
        let (mut ts, mut released) = (Vec::new(), Vec::new());
        let mut rows = stmt.query(rusqlite::params![after, PAGE])?;
        while let Some(r) = rows.next()? {
            last = Some(r.get::<_, i64>(0)?);
            ids.push(r.get::<_, String>(1)?);
            keys.push(r.get::<_, String>(2)?);
            amounts.push(r.get::<_, f64>(3)?);
            ts.push(r.get::<_, i64>(4)?);
            released.push(r.get::<_, i64>(5)? != 0);
        }
        let Some(last) = last else { break };
        pg.execute(
            "INSERT INTO budget(reservation_id, key, amount, ts_ms, released)
             SELECT r, k, a, t, d FROM UNNEST($1::text[], $2::text[], $3::float8[], $4::bigint[], $5::boolean[])
                 WITH ORDINALITY AS u(r, k, a, t, d, n) ORDER BY n",
            &[&ids, &keys, &amounts, &ts, &released],
        )?;
        total += n(ids.len());
        after = last;
    }
    Ok(total)
}

fn copy_open_ops(src: &Connection, pg: &mut PgConn) -> Result<u64, StoreError> {
    let mut stmt = src.prepare(
        "SELECT command_id, info FROM open_ops WHERE command_id > ?1 ORDER BY command_id LIMIT ?2",
    )?;
    let mut total = 0;
    let mut after = String::new();
    loop {
        let (mut ids, mut infos) = (Vec::<String>::new(), Vec::<String>::new());
        let mut rows = stmt.query(rusqlite::params![after, PAGE])?;
        while let Some(r) = rows.next()? {
            ids.push(r.get(0)?);
            infos.push(r.get(1)?);
        }
        let Some(last) = ids.last().cloned() else {
            break;
        };
        pg.execute(
            "INSERT INTO open_ops(command_id, info) SELECT * FROM UNNEST($1::text[], $2::text[])",
            &[&ids, &infos],
        )?;
        total += n(ids.len());
        after = last;
    }
    Ok(total)
}

fn copy_approvals(src: &Connection, pg: &mut PgConn) -> Result<u64, StoreError> {
    let mut stmt = src.prepare(
        "SELECT approval_id, record, created_seq, updated_seq FROM approvals
         WHERE approval_id > ?1 ORDER BY approval_id LIMIT ?2",
    )?;
    let mut total = 0;
    let mut after = String::new();
    loop {
        let (mut ids, mut records) = (Vec::<String>::new(), Vec::<String>::new());
        let (mut created, mut updated) = (Vec::<i64>::new(), Vec::<i64>::new());
        let mut rows = stmt.query(rusqlite::params![after, PAGE])?;
        while let Some(r) = rows.next()? {
            ids.push(r.get(0)?);
            records.push(r.get(1)?);
            created.push(r.get(2)?);
            updated.push(r.get(3)?);
        }
        let Some(last) = ids.last().cloned() else {
            break;
        };
        pg.execute(
            "INSERT INTO approvals(approval_id, record, created_seq, updated_seq)
             SELECT * FROM UNNEST($1::text[], $2::text[], $3::bigint[], $4::bigint[])",
            &[&ids, &records, &created, &updated],
        )?;
        total += n(ids.len());
        after = last;
    }
    Ok(total)
}

fn copy_invocations(src: &Connection, pg: &mut PgConn) -> Result<u64, StoreError> {
    let mut stmt = src.prepare(
        "SELECT invocation_id, info, seq FROM invocations
         WHERE invocation_id > ?1 ORDER BY invocation_id LIMIT ?2",
    )?;
    let mut total = 0;
    let mut after = String::new();
    loop {
        let mut ids = Vec::<String>::new();
        let mut infos = Vec::<Option<String>>::new();
        let mut seqs = Vec::<Option<i64>>::new();
        let mut rows = stmt.query(rusqlite::params![after, PAGE])?;
        while let Some(r) = rows.next()? {
            ids.push(r.get(0)?);
            infos.push(r.get(1)?);
            seqs.push(r.get(2)?);
        }
        let Some(last) = ids.last().cloned() else {
            break;
        };
        pg.execute(
            "INSERT INTO invocations(invocation_id, info, seq)
             SELECT * FROM UNNEST($1::text[], $2::text[], $3::bigint[])",
            &[&ids, &infos, &seqs],
        )?;
        total += n(ids.len());
        after = last;
    }
    Ok(total)
}

/// Inside the transaction, before it commits: the target's chain verifies
/// whole, ends at the copied head, and every table holds as many rows as
/// were copied.
fn check_target(pg: &mut PgConn, report: &CopyReport) -> Result<(), StoreError> {
    let verified =
        super::verify::verify_in_snapshot(pg, &crate::verify::VerifyOptions::default())?.0;
    if !verified.ok || verified.entries != report.entries {
        let why = verified
            .first_broken
            .map(|b| format!("entry {}: {}", b.line, b.reason))
            .unwrap_or_else(|| format!("{} of {} entries", verified.entries, report.entries));
        return Err(StoreError::Corrupt(format!(
            "the copied chain does not verify on the target ({why}); nothing was stored"
        )));
    }
    let head = super::head::load_head(pg)?;
    if head.seq != report.head_seq || head.hash != report.head_hash {
        return Err(StoreError::Corrupt(format!(
            "the target's head (seq {}) is not the copied head (seq {}); nothing was stored",
            head.seq, report.head_seq
        )));
    }
    let rows = pg.query(
        "SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM receipts),
                (SELECT count(*) FROM revisions), (SELECT count(*) FROM latches),
                (SELECT count(*) FROM budget), (SELECT count(*) FROM open_ops),
                (SELECT count(*) FROM approvals), (SELECT count(*) FROM invocations)",
        &[],
    )?;
    let row = rows
        .first()
        .ok_or_else(|| StoreError::Corrupt("no row counts from the target".into()))?;
    for (i, (table, want)) in TABLES.iter().zip(report.counts()).enumerate() {
        let have: i64 = col(row, i)?;
        if u64::try_from(have).ok() != Some(want) {
            return Err(StoreError::Corrupt(format!(
                "the target holds {have} rows in {table}, {want} were copied; nothing was stored"
            )));
        }
    }
    Ok(())
}

/// The source must still end where the copy read it: a process that wrote
/// it meanwhile (an endpoint the caller could not see) would leave entries
/// behind.
fn check_source_unchanged(db: &Path, report: &CopyReport) -> Result<(), StoreError> {
    let now = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let head: Option<(i64, String)> = now
        .query_row(
            "SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let counts: (i64, i64, i64) = now.query_row(
        "SELECT (SELECT count(*) FROM budget), (SELECT count(*) FROM open_ops),
                (SELECT count(*) FROM invocations)",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    let head_now = head.map(|(s, h)| (u64::try_from(s).unwrap_or(0), h));
    let head_copied = (report.head_seq > 0).then(|| (report.head_seq, report.head_hash.clone()));
    let counts_copied = (report.budget_rows, report.open_ops, report.invocations);
    let counts_now = (
        u64::try_from(counts.0).unwrap_or(0),
        u64::try_from(counts.1).unwrap_or(0),
        u64::try_from(counts.2).unwrap_or(0),
    );
    if head_now != head_copied || counts_now != counts_copied {
        return Err(StoreError::Invalid(format!(
            "{} was written while it was being copied (is an endpoint running on it?); nothing was stored: stop every endpoint on it and copy again",
            db.display()
        )));
    }
    Ok(())
}
