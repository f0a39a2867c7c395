//! The PostgreSQL side of `tether audit archive`: the recorded archives and
//! the one transaction that removes archived entries.
//!
//! The transaction runs on a connection of its own while the fleet's
//! endpoints keep writing: it never takes the `chain_head` row (so no batch
//! waits for it) and touches only entries far behind the head; two archive
//! runs serialise on an advisory lock. Every statement is bounded (pages of
//! [`PAGE`] rows), as every statement on this store is (`statement_timeout`).

use super::conn::{PgConn, PgTarget};
use super::head::{col, seq_from_db, seq_to_db};
use crate::archive::{ArchiveAnchor, ArchiveCommitted};
use crate::checkpoint::CHECKPOINT_KIND;
use crate::StoreError;

/// Rows per statement.
const PAGE: i64 = 5000;

/// Key of the advisory lock two archive runs serialise on.
const ARCHIVE_LOCK: i64 = 0x7465_7468_6172; // "tethar"

/// The newest recorded archive, `None` when nothing was archived.
pub(super) fn read_anchor(pg: &mut PgConn) -> Result<Option<ArchiveAnchor>, StoreError> {
    let rows = pg.query(
        "SELECT through_seq, through_hash, checkpoint_seq, first_seq, entries, file_sha256,
                file_name, archived_ms
         FROM archives ORDER BY through_seq DESC LIMIT 1",
        &[],
    )?;
    let Some(r) = rows.first() else {
        return Ok(None);
    };
    Ok(Some(ArchiveAnchor {
        through_seq: seq_from_db(col(r, 0)?)?,
        through_hash: col(r, 1)?,
        checkpoint_seq: seq_from_db(col(r, 2)?)?,
        first_seq: seq_from_db(col(r, 3)?)?,
        entries: seq_from_db(col(r, 4)?)?,
        file_sha256: col(r, 5)?,
        file_name: col(r, 6)?,
        archived_ms: seq_from_db(col(r, 7)?)?,
    }))
}

/// Removes the entries up to `anchor.through_seq` and records `anchor`, in
/// one transaction (see [`crate::Store::archive_commit`]).
pub(super) fn commit(
    target: PgTarget,
    anchor: &ArchiveAnchor,
) -> Result<ArchiveCommitted, StoreError> {
    let mut pg = PgConn::connect(target)?;
    super::schema::check_version(&mut pg)?;
    pg.batch("BEGIN")?;
    match in_tx(&mut pg, anchor) {
        Ok(done) => {
            pg.commit()?;
            Ok(done)
        }
        Err(e) => {
            let _ = pg.batch("ROLLBACK");
            Err(e)
        }
    }
}

fn in_tx(pg: &mut PgConn, anchor: &ArchiveAnchor) -> Result<ArchiveCommitted, StoreError> {
    pg.execute("SELECT pg_advisory_xact_lock($1)", &[&ARCHIVE_LOCK])?;
    check_start(pg, anchor)?;
    let first = seq_to_db(anchor.first_seq)?;
    let through = seq_to_db(anchor.through_seq)?;
    let mut kept = ArchiveCommitted::default();
    let mut deleted = 0u64;
    let mut from = first - 1;
    // One bounded page of seqs per round; `from` grows by PAGE each time.
    while from < through {
        let to = from.saturating_add(PAGE).min(through);
        keep_page(pg, from, to, &mut kept)?;
        deleted += pg.execute(
            "DELETE FROM events WHERE seq > $1 AND seq <= $2",
            &[&from, &to],
        )?;
        from = to;
    }
    if deleted != anchor.entries {
        return Err(StoreError::Corrupt(format!(
            "archiving seq {} to {} would remove {deleted} entries, the archive file holds {}; nothing was removed",
            anchor.first_seq, anchor.through_seq, anchor.entries
        )));
    }
    pg.execute(
        "INSERT INTO archives(through_seq, through_hash, checkpoint_seq, first_seq, entries,
                              file_sha256, file_name, archived_ms)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        &[
            &through,
            &anchor.through_hash,
            &seq_to_db(anchor.checkpoint_seq)?,
            &first,
            &seq_to_db(anchor.entries)?,
            &anchor.file_sha256,
            &anchor.file_name,
            &seq_to_db(anchor.archived_ms)?,
        ],
    )?;
    Ok(kept)
}

/// Copies the receipt documents and invocation records held by the entries
/// `from < seq <= to` into their index rows, taken out in Rust exactly as
/// the entry spells them (`jsonb` would re-spell numbers and reorder keys).
fn keep_page(
    pg: &mut PgConn,
    from: i64,
    to: i64,
    kept: &mut ArchiveCommitted,
) -> Result<(), StoreError> {
    let rows = pg.query(
        "SELECT r.seq, r.command_id, e.line FROM receipts r JOIN events e ON e.seq = r.seq
         WHERE r.seq > $1 AND r.seq <= $2 AND r.receipt IS NULL",
        &[&from, &to],
    )?;
    for r in &rows {
        let (seq, id, line): (i64, String, String) = (col(r, 0)?, col(r, 1)?, col(r, 2)?);
        let receipt = crate::chain::receipt_from_entry(&id, &line)?;
        let text = tether_core::canonical::to_canonical_string(&receipt);
        pg.execute(
            "UPDATE receipts SET receipt = $1 WHERE seq = $2",
            &[&text, &seq],
        )?;
        kept.receipts_kept += 1;
    }
    let rows = pg.query(
        "SELECT i.invocation_id, e.line FROM invocations i JOIN events e ON e.seq = i.seq
         WHERE i.seq > $1 AND i.seq <= $2",
        &[&from, &to],
    )?;
    for r in &rows {
        let (id, line): (String, String) = (col(r, 0)?, col(r, 1)?);
        let info = crate::chain::invocation_from_entry(&id, &line)?.into_value();
        let text = tether_core::canonical::to_canonical_string(&info);
        pg.execute(
            "UPDATE invocations SET info = $1, seq = NULL WHERE invocation_id = $2",
            &[&text, &id],
        )?;
        kept.invocations_kept += 1;
    }
    Ok(())
}

/// Inside the transaction: the store still starts where the archive file
/// does, holds the entry it ends with, and the checkpoint that signs it.
fn check_start(pg: &mut PgConn, anchor: &ArchiveAnchor) -> Result<(), StoreError> {
    let now = read_anchor(pg)?.map_or(1, |a| a.through_seq + 1);
    let rows = pg.query("SELECT MIN(seq) FROM events", &[])?;
    let first: Option<i64> = rows.first().map(|r| col(r, 0)).transpose()?.flatten();
    if now != anchor.first_seq || first.map(seq_from_db).transpose()? != Some(anchor.first_seq) {
        return Err(StoreError::Conflict(format!(
            "the store no longer starts at seq {} (another archive ran?); nothing was removed",
            anchor.first_seq
        )));
    }
    let rows = pg.query(
        "SELECT hash FROM events WHERE seq = $1",
        &[&seq_to_db(anchor.through_seq)?],
    )?;
    let hash: Option<String> = rows.first().map(|r| col(r, 0)).transpose()?;
    if hash.as_deref() != Some(anchor.through_hash.as_str()) {
        return Err(StoreError::Corrupt(format!(
            "the store's entry at seq {} is not the one archived; nothing was removed",
            anchor.through_seq
        )));
    }
    let rows = pg.query(
        "SELECT line::jsonb ->> 'kind' FROM events WHERE seq = $1",
        &[&seq_to_db(anchor.checkpoint_seq)?],
    )?;
    let kind: Option<String> = rows.first().map(|r| col(r, 0)).transpose()?.flatten();
    if anchor.checkpoint_seq <= anchor.through_seq || kind.as_deref() != Some(CHECKPOINT_KIND) {
        return Err(StoreError::Corrupt(format!(
            "the store holds no checkpoint entry at seq {}; nothing was removed",
            anchor.checkpoint_seq
        )));
    }
    Ok(())
}
