//! The chain head as the database holds it: the last entry, checked when the
//! store opens, and the head recorded in `meta` beside it, which lets a
//! shortened chain be noticed. Also the conversions of `seq` to and from
//! SQLite's integers.
//!
//! Never here: extending the chain (that is the writer's, in `apply`).

use crate::chain::{check_entry_text, GENESIS_PREV_HASH};
use crate::StoreError;
use rusqlite::{Connection, OptionalExtension};

/// The in-memory chain head the writer extends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Head {
    pub(super) seq: u64,
    pub(super) hash: String,
}

pub(super) fn seq_from_db(v: i64) -> Result<u64, StoreError> {
    u64::try_from(v)
        .map_err(|_| StoreError::Corrupt(format!("negative seq {v} in the events table")))
}

pub(super) fn seq_to_db(v: u64) -> Result<i64, StoreError> {
    i64::try_from(v)
        .map_err(|_| StoreError::Corrupt(format!("seq {v} exceeds SQLite's integer range")))
}

/// Read and verify the last entry: it must recompute its own hash and agree
/// with its `seq` and `hash` columns. Verifying only the head keeps open O(1);
/// `verify_store` checks the whole chain.
pub(super) fn load_head(conn: &Connection) -> Result<Head, StoreError> {
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
fn check_recorded_head(conn: &Connection, seq: u64, hash: &str) -> Result<(), StoreError> {
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
