//! The SQLite side of `tether audit archive`: the recorded archives (the
//! newest names where the chain starts) and the one transaction that removes
//! archived entries.
//!
//! The transaction runs on a connection of its own, not the writer's: it is
//! `BEGIN IMMEDIATE`, so it takes the store's write lock like any batch and
//! an endpoint serving the same file (this process or another) simply waits
//! for it (its busy timeout is 5 s); it deletes only entries far behind the
//! head, which no batch touches.

use super::head::{seq_from_db, seq_to_db};
use super::BUSY_TIMEOUT;
use crate::archive::{ArchiveAnchor, ArchiveCommitted};
use crate::checkpoint::CHECKPOINT_KIND;
use crate::StoreError;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use std::path::Path;

/// Rows moved per statement round, so no step holds a whole index in memory.
const PAGE: i64 = 1024;

/// The newest recorded archive (`None` for a store of an older schema or
/// one never archived).
pub(crate) fn read_anchor(conn: &Connection) -> Result<Option<ArchiveAnchor>, StoreError> {
    let exists: bool = conn.query_row(
        "SELECT EXISTS(SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'archives')",
        [],
        |r| r.get(0),
    )?;
    if !exists {
        return Ok(None);
    }
    let row = conn
        .query_row(
            "SELECT through_seq, through_hash, checkpoint_seq, first_seq, entries, file_sha256,
                    file_name, archived_ms
             FROM archives ORDER BY through_seq DESC LIMIT 1",
            [],
            |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, i64>(4)?,
                    r.get::<_, String>(5)?,
                    r.get::<_, String>(6)?,
                    r.get::<_, i64>(7)?,
                ))
            },
        )
        .optional()?;
    let Some((through, hash, cp, first, entries, sha, name, ms)) = row else {
        return Ok(None);
    };
    Ok(Some(ArchiveAnchor {
        through_seq: seq_from_db(through)?,
        through_hash: hash,
        checkpoint_seq: seq_from_db(cp)?,
        first_seq: seq_from_db(first)?,
        entries: seq_from_db(entries)?,
        file_sha256: sha,
        file_name: name,
        archived_ms: seq_from_db(ms)?,
    }))
}

/// Removes the entries up to `anchor.through_seq` and records `anchor`,
/// in one transaction (see [`crate::Store::archive_commit`]).
pub(super) fn commit(path: &Path, anchor: &ArchiveAnchor) -> Result<ArchiveCommitted, StoreError> {
    let mut conn = Connection::open(path)
        .map_err(|e| StoreError::Sqlite(format!("cannot open {}: {e}", path.display())))?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    check_start(&tx, anchor)?;
    let through = seq_to_db(anchor.through_seq)?;
    let receipts_kept = keep_receipts(&tx, through)?;
    let invocations_kept = keep_invocations(&tx, through)?;
    let deleted = tx.execute("DELETE FROM events WHERE seq <= ?1", [through])?;
    if u64::try_from(deleted).ok() != Some(anchor.entries) {
        return Err(StoreError::Corrupt(format!(
            "archiving seq {} to {} would remove {deleted} entries, the archive file holds {}; nothing was removed",
            anchor.first_seq, anchor.through_seq, anchor.entries
        )));
    }
    tx.execute(
        "INSERT INTO archives(through_seq, through_hash, checkpoint_seq, first_seq, entries,
                              file_sha256, file_name, archived_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            through,
            anchor.through_hash,
            seq_to_db(anchor.checkpoint_seq)?,
            seq_to_db(anchor.first_seq)?,
            seq_to_db(anchor.entries)?,
            anchor.file_sha256,
            anchor.file_name,
            seq_to_db(anchor.archived_ms)?,
        ],
    )?;
    tx.commit()?;
    Ok(ArchiveCommitted {
        receipts_kept,
        invocations_kept,
    })
}

/// Inside the transaction: the store still starts where the archive file
/// does, holds the entry it ends with, and the checkpoint that signs it.
fn check_start(tx: &rusqlite::Transaction<'_>, anchor: &ArchiveAnchor) -> Result<(), StoreError> {
    let now = read_anchor(tx)?.map_or(1, |a| a.through_seq + 1);
    let first: Option<i64> = tx.query_row("SELECT MIN(seq) FROM events", [], |r| r.get(0))?;
    if now != anchor.first_seq || first.map(seq_from_db).transpose()? != Some(anchor.first_seq) {
        return Err(StoreError::Conflict(format!(
            "the store no longer starts at seq {} (another archive ran?); nothing was removed",
            anchor.first_seq
        )));
    }
    let hash: Option<String> = tx
        .query_row(
            "SELECT hash FROM events WHERE seq = ?1",
            [seq_to_db(anchor.through_seq)?],
            |r| r.get(0),
        )
        .optional()?;
    if hash.as_deref() != Some(anchor.through_hash.as_str()) {
        return Err(StoreError::Corrupt(format!(
            "the store's entry at seq {} is not the one archived; nothing was removed",
            anchor.through_seq
        )));
    }
    let kind: Option<String> = tx
        .query_row(
            "SELECT json_extract(line, '$.kind') FROM events WHERE seq = ?1",
            [seq_to_db(anchor.checkpoint_seq)?],
            |r| r.get(0),
        )
        .optional()?
        .flatten();
    if anchor.checkpoint_seq <= anchor.through_seq || kind.as_deref() != Some(CHECKPOINT_KIND) {
        return Err(StoreError::Corrupt(format!(
            "the store holds no checkpoint entry at seq {}; nothing was removed",
            anchor.checkpoint_seq
        )));
    }
    Ok(())
}

/// Copies the receipt document out of each archived entry that holds one
/// into its receipts row; answers how many.
fn keep_receipts(tx: &rusqlite::Transaction<'_>, through: i64) -> Result<u64, StoreError> {
    let mut kept = 0u64;
    let mut after = i64::MIN;
    let mut select = tx.prepare(
        "SELECT r.seq, r.command_id, e.line FROM receipts r JOIN events e ON e.seq = r.seq
         WHERE r.seq > ?1 AND r.seq <= ?2 AND r.receipt IS NULL ORDER BY r.seq LIMIT ?3",
    )?;
    let mut update = tx.prepare("UPDATE receipts SET receipt = ?1 WHERE seq = ?2")?;
    // Each round moves at least one row past `after`, or ends.
    loop {
        let rows = select
            .query_map(params![after, through, PAGE], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                ))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        let Some(last) = rows.last().map(|r| r.0) else {
            return Ok(kept);
        };
        for (seq, command_id, line) in &rows {
            let receipt = crate::chain::receipt_from_entry(command_id, line)?;
            update.execute(params![
                tether_core::canonical::to_canonical_string(&receipt),
                seq
            ])?;
            kept += 1;
        }
        after = last;
    }
}

/// Copies the record out of each archived entry an invocation is indexed
/// at into its row (which then names no entry); answers how many.
fn keep_invocations(tx: &rusqlite::Transaction<'_>, through: i64) -> Result<u64, StoreError> {
    let mut kept = 0u64;
    let mut select = tx.prepare(
        "SELECT i.invocation_id, e.line FROM invocations i JOIN events e ON e.seq = i.seq
         WHERE i.seq <= ?1 LIMIT ?2",
    )?;
    let mut update =
        tx.prepare("UPDATE invocations SET info = ?1, seq = NULL WHERE invocation_id = ?2")?;
    // Each round clears the seq of every row it read, so the next reads others.
    loop {
        let rows = select
            .query_map(params![through, PAGE], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        if rows.is_empty() {
            return Ok(kept);
        }
        for (id, line) in &rows {
            let info = crate::chain::invocation_from_entry(id, line)?.into_value();
            update.execute(params![
                tether_core::canonical::to_canonical_string(&info),
                id
            ])?;
            kept += 1;
        }
    }
}
