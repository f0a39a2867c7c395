//! The chain head as PostgreSQL holds it: the `chain_head` row (written in
//! the same transaction as the entries) and the last entry, which must
//! agree. A hash chain cannot show entries cut from its end; the row beside
//! it can.

use super::conn::PgConn;
use crate::chain::{check_entry_text, GENESIS_PREV_HASH};
use crate::StoreError;

/// The chain head a writer extends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Head {
    pub(crate) seq: u64,
    pub(crate) hash: String,
}

pub(super) fn col<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a tokio_postgres::Row,
    i: usize,
) -> Result<T, StoreError> {
    row.try_get(i)
        .map_err(|e| StoreError::Corrupt(format!("unexpected column in the store: {e}")))
}

pub(super) fn seq_from_db(v: i64) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| StoreError::Corrupt(format!("negative seq {v} in the store")))
}

pub(super) fn seq_to_db(v: u64) -> Result<i64, StoreError> {
    i64::try_from(v)
        .map_err(|_| StoreError::Corrupt(format!("seq {v} exceeds PostgreSQL's bigint range")))
}

/// The recorded head `(seq, hash)` from the `chain_head` row.
pub(super) fn recorded_head(pg: &mut PgConn) -> Result<(u64, String), StoreError> {
    let rows = pg.query("SELECT seq, hash FROM chain_head WHERE id = 1", &[])?;
    let row = rows
        .first()
        .ok_or_else(|| StoreError::Corrupt("the chain_head row is missing".into()))?;
    Ok((seq_from_db(col(row, 0)?)?, col(row, 1)?))
}

/// Reads and checks the head: the last entry recomputes its hash and agrees
/// with its columns, and is the entry the `chain_head` row names. Checking
/// only the head keeps opening O(1); `verify` checks the whole chain.
pub(crate) fn load_head(pg: &mut PgConn) -> Result<Head, StoreError> {
    let (recorded, recorded_hash) = recorded_head(pg)?;
    let rows = pg.query(
        "SELECT seq, hash, line FROM events ORDER BY seq DESC LIMIT 1",
        &[],
    )?;
    let Some(row) = rows.first() else {
        if recorded != 0 {
            return Err(cut(recorded, 0));
        }
        return Ok(Head {
            seq: 0,
            hash: GENESIS_PREV_HASH.to_owned(),
        });
    };
    let seq = seq_from_db(col(row, 0)?)?;
    let hash: String = col(row, 1)?;
    let line: String = col(row, 2)?;
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
    if recorded > seq {
        return Err(cut(recorded, seq));
    }
    if recorded < seq || recorded_hash != hash {
        return Err(StoreError::Corrupt(format!(
            "the events table ends at seq {seq}, which is not the head the store recorded (seq {recorded}): something wrote the chain without its lock"
        )));
    }
    Ok(Head { seq, hash })
}

fn cut(recorded: u64, seq: u64) -> StoreError {
    StoreError::Corrupt(format!(
        "entries were removed from the end of the evidence chain: the store recorded its head at seq {recorded}, the events table ends at seq {seq}"
    ))
}
