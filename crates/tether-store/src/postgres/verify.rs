//! `tether audit verify --store URL`: the whole chain of a PostgreSQL store
//! checked entry by entry with the checker the SQLite store and exported
//! files use, plus the checks that see a cut tail (the recorded head, the
//! entries the indexes name). Read in one snapshot, a page at a time, so a
//! live fleet appending meanwhile neither disturbs nor prolongs it.

use super::conn::{PgConn, PgTarget};
use super::head::{col, seq_from_db};
use crate::verify::{
    check_nothing_cut_from_the_end, ChainVerifier, SigningReport, VerifyOptions, VerifyReport,
};
use crate::StoreError;

const PAGE_ROWS: i64 = 1024;

/// Verifies the chain of the store at `url` (read-only; it needs only the
/// `SELECT` right).
pub fn verify_url(url: &str) -> Result<VerifyReport, StoreError> {
    Ok(verify_url_with(url, &VerifyOptions::default())?.0)
}

/// [`verify_url`] with public keys, a saved checkpoint or the demand of a
/// signed tail, as [`crate::verify::verify_store_with`]; a store that
/// archived its oldest entries verifies from its archive point on, which a
/// signed checkpoint in it must prove (so it needs the keys).
///
/// # Errors
/// The store cannot be read, or the options are unusable
/// ([`StoreError::Invalid`]).
pub fn verify_url_with(
    url: &str,
    opts: &VerifyOptions,
) -> Result<(VerifyReport, SigningReport), StoreError> {
    let target = PgTarget::parse(url)?;
    let opts = opts.clone();
    super::on_own_thread(move || {
        let mut pg = PgConn::connect(target)?;
        super::schema::check_version(&mut pg)?;
        pg.batch("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")?;
        let r = verify_in_snapshot(&mut pg, &opts);
        let _ = pg.batch("ROLLBACK");
        r
    })
}

pub(super) fn verify_in_snapshot(
    pg: &mut PgConn,
    opts: &VerifyOptions,
) -> Result<(VerifyReport, SigningReport), StoreError> {
    let recorded = super::head::recorded_head(pg)?;
    let indexed = highest_indexed_seq(pg)?;
    let anchor = super::archive::read_anchor(pg)?;
    let head_rows = pg.query("SELECT COALESCE(MAX(seq), 0) FROM events", &[])?;
    let head: i64 = head_rows
        .first()
        .map(|r| col(r, 0))
        .transpose()?
        .unwrap_or(0);
    let mut v = ChainVerifier::for_store(opts, anchor.as_ref()).map_err(StoreError::Invalid)?;
    let mut after: i64 = i64::MIN;
    'pages: loop {
        let rows = pg.query(
            "SELECT seq, hash, line FROM events WHERE seq > $1 AND seq <= $2 ORDER BY seq LIMIT $3",
            &[&after, &head, &PAGE_ROWS],
        )?;
        let Some(last) = rows.last() else { break };
        let last: i64 = col(last, 0)?;
        for row in &rows {
            let seq: i64 = col(row, 0)?;
            let hash: String = col(row, 1)?;
            let line: String = col(row, 2)?;
            if !v.push_stored(line.as_bytes(), seq, &hash) {
                break 'pages;
            }
        }
        after = last;
    }
    if v.report().ok {
        // The head row is written with every batch, so it always names the head.
        let recorded = (recorded.0 > 0).then_some(recorded);
        check_nothing_cut_from_the_end(&mut v, recorded, indexed);
    }
    Ok(v.finish_store(anchor))
}

/// The highest entry seq any index names, with the index's name.
fn highest_indexed_seq(pg: &mut PgConn) -> Result<Option<(u64, &'static str)>, StoreError> {
    let rows = pg.query(
        "SELECT (SELECT MAX(seq) FROM receipts), (SELECT MAX(seq) FROM invocations),
                (SELECT MAX(created_seq) FROM approvals)",
        &[],
    )?;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let mut best: Option<(u64, &'static str)> = None;
    for (i, table) in ["receipts", "invocations", "approvals"]
        .into_iter()
        .enumerate()
    {
        if let Some(seq) = col::<Option<i64>>(row, i)? {
            let seq = seq_from_db(seq)?;
            if best.is_none_or(|(b, _)| seq > b) {
                best = Some((seq, table));
            }
        }
    }
    Ok(best)
}
