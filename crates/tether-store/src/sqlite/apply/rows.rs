//! One commit inside a batch's open transaction: its checks against what
//! is stored (a conflict refuses that commit alone), its entries sealed
//! onto the chain, and its rows written. The batch around it (the
//! transaction, the journal's record, `COMMIT`) is `super`'s.
//!
//! Never here: anything that spans the batch (revisions gathered are
//! written once per batch by `super`), or the journal.

use super::{ChainState, HotStatements};
use crate::chain::{seal, Sealed};
use crate::prepare::{PreparedLatch, PreparedReceipt};
use crate::sqlite::head::{seq_to_db, Head};
use crate::writer::Job;
use crate::{ApprovalRow, BudgetRow, CommitAck, InvocationRef, OpenOp, RevisionRow, StoreError};
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::HashMap;

/// Apply one commit inside the open transaction. The outer error aborts
/// the batch; the inner one fails only this commit and is returned before
/// anything of it is written.
pub(super) fn apply_one(
    conn: &Connection,
    chain: &mut ChainState,
    hot: &mut HotStatements<'_>,
    job: &Job,
    ts_ms: u64,
) -> Result<Result<CommitAck, StoreError>, StoreError> {
    let ack = match check_and_seal(conn, chain, hot, job, ts_ms)? {
        Ok(ack) => ack,
        Err(conflict) => return Ok(Err(conflict)),
    };
    write_one(conn, hot, &chain.sealed, job, ts_ms, &ack)?;
    Ok(Ok(ack))
}

/// A commit's checks against what is stored, then, if it passes, its
/// entries sealed onto the chain (in `chain.sealed`, written by
/// [`write_one`]). Reads only: nothing of it is written yet.
pub(super) fn check_and_seal(
    conn: &Connection,
    chain: &mut ChainState,
    hot: &mut HotStatements<'_>,
    job: &Job,
    ts_ms: u64,
) -> Result<Result<CommitAck, StoreError>, StoreError> {
    if let Some(conflict) = check_one(conn, hot, job, ts_ms)? {
        return Ok(Err(conflict));
    }
    let first_seq = chain.head.seq + 1;
    chain.sealed.clear();
    for e in &job.commit.events {
        let seq = chain.head.seq + 1;
        let sealed = seal(
            seq,
            ts_ms,
            &e.kind_json,
            &e.body_json,
            &chain.head.hash,
            &mut chain.scratch,
        );
        chain.head = Head {
            seq,
            hash: sealed.hash.clone(),
        };
        chain.sealed.push((seq, sealed));
    }
    // Revisions only ever rise (the highest wins), so a batch's are
    // gathered and written once per resource before COMMIT.
    gather_revisions(&mut chain.batch_revisions, &job.commit.revisions);
    Ok(Ok(CommitAck {
        first_seq,
        last_seq: chain.head.seq,
        head_hash: chain.head.hash.clone(),
    }))
}

/// The conflict that refuses this commit alone, if any.
fn check_one(
    conn: &Connection,
    hot: &mut HotStatements<'_>,
    job: &Job,
    ts_ms: u64,
) -> Result<Option<StoreError>, StoreError> {
    let c = &job.commit;
    if let Some(conflict) = receipt_conflict(hot, &c.receipts)? {
        return Ok(Some(conflict));
    }
    // An operation opens under its command_id once: another process on
    // this store that already ran the id (a receipt) or is running it
    // (an open operation) makes the start a conflict, so a command id is
    // dispatched once per state directory, not once per process.
    if !c.open_ops.is_empty() {
        if let Some(conflict) = open_op_conflict(conn, hot, &c.open_ops)? {
            return Ok(Some(conflict));
        }
    }
    if !c.budget_draws.is_empty() {
        if let Some(conflict) = budget_conflict(conn, &c.budget_draws)? {
            return Ok(Some(conflict));
        }
        // The check and the draw in one transaction that holds the write
        // lock: every process on the file draws from one ledger.
        if let Some(exceeded) = budget_over_cap(conn, &c.budget_draws)? {
            return Ok(Some(exceeded));
        }
    }
    if !c.leases.is_empty() {
        if let Err(held) = decide_leases(conn, &c.leases, ts_ms)? {
            return Ok(Some(held));
        }
    }
    Ok(None)
}

/// The writes of a commit that passed [`check_and_seal`]: its sealed
/// entries and every row it carries.
pub(super) fn write_one(
    conn: &Connection,
    hot: &mut HotStatements<'_>,
    sealed: &[(u64, Sealed)],
    job: &Job,
    ts_ms: u64,
    ack: &CommitAck,
) -> Result<(), StoreError> {
    let c = &job.commit;
    if !c.leases.is_empty() {
        write_leases(conn, &c.leases, ts_ms)?;
    }
    for (seq, e) in sealed {
        hot.insert_event
            .execute(params![seq_to_db(*seq)?, &e.hash, &e.line])?;
    }
    index_receipts(
        &mut hot.insert_receipt,
        &c.receipts,
        ack.first_seq,
        ack.last_seq,
    )?;
    if !c.latches.is_empty() {
        upsert_latches(conn, &c.latches)?;
    }
    if !c.budget_draws.is_empty() {
        insert_budget_draws(conn, &c.budget_draws)?;
    }
    if !c.budget_releases.is_empty() {
        release_budget(conn, &c.budget_releases)?;
    }
    if !c.open_ops.is_empty() {
        upsert_open_ops(conn, &c.open_ops)?;
    }
    if !c.closed_ops.is_empty() {
        delete_open_ops(conn, &c.closed_ops)?;
    }
    if !c.approvals.is_empty() {
        upsert_approvals(conn, &c.approvals, ack.last_seq)?;
    }
    if !c.invocations.is_empty() {
        upsert_invocations(conn, &c.invocations)?;
    }
    if !c.invocation_refs.is_empty() {
        index_invocations(conn, &c.invocation_refs, ack.first_seq, ack.last_seq)?;
    }
    Ok(())
}

/// The conflict of a receipt whose `command_id` is already stored.
fn receipt_conflict(
    hot: &mut HotStatements<'_>,
    receipts: &[PreparedReceipt],
) -> Result<Option<StoreError>, StoreError> {
    for r in receipts {
        if hot.receipt_exists.exists([&r.row.command_id])? {
            return Ok(Some(StoreError::Conflict(format!(
                "a receipt for command_id {:?} is already stored",
                r.row.command_id
            ))));
        }
    }
    Ok(None)
}

/// The conflict of an operation whose `command_id` already ran (a receipt)
/// or is running (an open operation) on this store.
fn open_op_conflict(
    conn: &Connection,
    hot: &mut HotStatements<'_>,
    open_ops: &[(OpenOp, String)],
) -> Result<Option<StoreError>, StoreError> {
    let mut open = conn.prepare_cached("SELECT 1 FROM open_ops WHERE command_id = ?1")?;
    for (op, _) in open_ops {
        let id = &op.command_id;
        if hot.receipt_exists.exists([id])? || open.exists([id])? {
            return Ok(Some(StoreError::Conflict(format!(
                "command_id {id:?} already ran or is running on this store"
            ))));
        }
    }
    Ok(None)
}

/// The conflict of a budget draw whose `reservation_id` is already stored.
fn budget_conflict(
    conn: &Connection,
    draws: &[BudgetRow],
) -> Result<Option<StoreError>, StoreError> {
    let mut exists = conn.prepare_cached("SELECT 1 FROM budget WHERE reservation_id = ?1")?;
    for b in draws {
        if exists.exists([&b.reservation_id])? {
            return Ok(Some(StoreError::Conflict(format!(
                "budget reservation {:?} is already stored",
                b.reservation_id
            ))));
        }
    }
    Ok(None)
}

/// The refusal of the first capped draw that does not fit: the key's
/// stored, unreleased draws the window counts (earlier commits of this
/// batch included, since they are in the open transaction) plus this
/// commit's earlier draws of the same key (see [`crate::BudgetCap`]).
fn budget_over_cap(
    conn: &Connection,
    draws: &[BudgetRow],
) -> Result<Option<StoreError>, StoreError> {
    let mut sum = conn.prepare_cached(
        "SELECT COALESCE(SUM(amount), 0.0) FROM budget
         WHERE key = ?1 AND ts_ms >= ?2 AND released = 0",
    )?;
    for (i, d) in draws.iter().enumerate() {
        let Some(cap) = &d.cap else { continue };
        let from_ms = cap.counts_from_ms(d.ts_ms).unwrap_or(0);
        // Stored ts_ms never exceeds i64::MAX, so a larger bound counts nothing.
        let from_db = i64::try_from(from_ms).unwrap_or(i64::MAX);
        let stored: f64 = sum.query_row(params![&d.key, from_db], |r| r.get(0))?;
        let earlier: f64 = draws[..i]
            .iter()
            .filter(|e| e.key == d.key && e.ts_ms >= from_ms && !e.released)
            .map(|e| e.amount)
            .sum();
        if let Err(e) = cap.check(d, stored + earlier) {
            return Ok(Some(e));
        }
    }
    Ok(None)
}

/// Each lease draft decided against its stored row, under the write lock
/// (see [`crate::lease`]): the inner error refuses this commit alone.
fn decide_leases(
    conn: &Connection,
    drafts: &[(crate::LeaseDraft, String)],
    now_ms: u64,
) -> Result<Result<(), StoreError>, StoreError> {
    let mut get = conn
        .prepare_cached("SELECT holder, renewed_ms, until_ms, info FROM leases WHERE key = ?1")?;
    for (d, _) in drafts {
        let stored = get
            .query_row([&d.key], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, String>(3)?,
                ))
            })
            .optional()?
            .map(|(holder, renewed, until, info)| crate::LeaseRow {
                key: d.key.clone(),
                holder,
                renewed_ms: u64::try_from(renewed).unwrap_or(0),
                until_ms: u64::try_from(until).unwrap_or(0),
                info: serde_json::from_str(&info).unwrap_or(serde_json::Value::Null),
            });
        if let Err(e) = crate::lease::decide_hold(d, stored.as_ref(), now_ms) {
            return Ok(Err(e));
        }
    }
    Ok(Ok(()))
}

/// Writes lease drafts already decided.
fn write_leases(
    conn: &Connection,
    drafts: &[(crate::LeaseDraft, String)],
    now_ms: u64,
) -> Result<(), StoreError> {
    let mut upsert = conn.prepare_cached(
        "INSERT INTO leases(key, holder, renewed_ms, until_ms, info) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT(key) DO UPDATE SET holder = excluded.holder, renewed_ms = excluded.renewed_ms,
             until_ms = excluded.until_ms, info = excluded.info",
    )?;
    let mut delete = conn.prepare_cached("DELETE FROM leases WHERE key = ?1 AND holder = ?2")?;
    for (d, info) in drafts {
        match &d.op {
            crate::LeaseOp::Hold { lease_ms, .. } => {
                let until = now_ms.saturating_add(*lease_ms);
                upsert.execute(params![
                    &d.key,
                    &d.holder,
                    seq_to_db(now_ms)?,
                    seq_to_db(until)?,
                    info
                ])?;
            }
            crate::LeaseOp::Release => {
                delete.execute(params![&d.key, &d.holder])?;
            }
        }
    }
    Ok(())
}

/// Indexes each receipt by the entry that holds it (`first_seq` is the
/// commit's first entry, `last_seq` its last).
fn index_receipts(
    insert_receipt: &mut rusqlite::CachedStatement<'_>,
    receipts: &[PreparedReceipt],
    first_seq: u64,
    last_seq: u64,
) -> Result<(), StoreError> {
    for r in receipts {
        // prepare() checked that `event` indexes this commit's events.
        let seq = first_seq + r.row.event as u64;
        debug_assert!(seq <= last_seq);
        insert_receipt.execute(params![
            seq_to_db(seq)?,
            &r.row.command_id,
            &r.row.input_digest
        ])?;
    }
    Ok(())
}

/// Keeps the highest revision of each resource among the batch's commits.
fn gather_revisions(batch: &mut HashMap<(String, String), u64>, revisions: &[RevisionRow]) {
    for r in revisions {
        let slot = batch
            .entry((r.device_id.clone(), r.resource.clone()))
            .or_insert(0);
        *slot = (*slot).max(r.revision);
    }
}

fn upsert_latches(conn: &Connection, latches: &[PreparedLatch]) -> Result<(), StoreError> {
    let mut upsert = conn.prepare_cached(
        "INSERT INTO latches(device_id, latched, info) VALUES (?1, ?2, ?3)
         ON CONFLICT(device_id) DO UPDATE SET latched = excluded.latched, info = excluded.info",
    )?;
    for l in latches {
        upsert.execute(params![&l.row.device_id, l.row.latched, &l.info_json])?;
    }
    Ok(())
}

fn insert_budget_draws(conn: &Connection, draws: &[BudgetRow]) -> Result<(), StoreError> {
    let mut insert = conn.prepare_cached(
        "INSERT INTO budget(reservation_id, key, amount, ts_ms, released) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    for b in draws {
        insert.execute(params![
            &b.reservation_id,
            &b.key,
            b.amount,
            seq_to_db(b.ts_ms)?,
            b.released
        ])?;
    }
    Ok(())
}

fn release_budget(conn: &Connection, reservation_ids: &[String]) -> Result<(), StoreError> {
    let mut release =
        conn.prepare_cached("UPDATE budget SET released = 1 WHERE reservation_id = ?1")?;
    for id in reservation_ids {
        release.execute([id])?;
    }
    Ok(())
}

fn upsert_open_ops(conn: &Connection, open_ops: &[(OpenOp, String)]) -> Result<(), StoreError> {
    let mut upsert = conn.prepare_cached(
        "INSERT INTO open_ops(command_id, info) VALUES (?1, ?2)
         ON CONFLICT(command_id) DO UPDATE SET info = excluded.info",
    )?;
    for (op, info) in open_ops {
        upsert.execute(params![&op.command_id, info])?;
    }
    Ok(())
}

fn delete_open_ops(conn: &Connection, command_ids: &[String]) -> Result<(), StoreError> {
    let mut delete = conn.prepare_cached("DELETE FROM open_ops WHERE command_id = ?1")?;
    for id in command_ids {
        delete.execute([id])?;
    }
    Ok(())
}

/// Upserts approval records; a new one is created at `head_seq`, the
/// commit's last entry (which orders [`crate::Store::approvals`]), and every
/// write marks the record updated there ([`crate::Store::approvals_since`]).
fn upsert_approvals(
    conn: &Connection,
    approvals: &[(ApprovalRow, String)],
    head_seq: u64,
) -> Result<(), StoreError> {
    let mut upsert = conn.prepare_cached(
        "INSERT INTO approvals(approval_id, record, created_seq, updated_seq) VALUES (?1, ?2, ?3, ?3)
         ON CONFLICT(approval_id) DO UPDATE SET record = excluded.record, updated_seq = excluded.updated_seq",
    )?;
    for (a, record_json) in approvals {
        upsert.execute(params![&a.approval_id, record_json, seq_to_db(head_seq)?])?;
    }
    Ok(())
}

/// Upserts invocations recorded by value, `(invocation_id, info_json)`.
fn upsert_invocations(
    conn: &Connection,
    invocations: &[(String, String)],
) -> Result<(), StoreError> {
    let mut upsert = conn.prepare_cached(
        "INSERT INTO invocations(invocation_id, info, seq) VALUES (?1, ?2, NULL)
         ON CONFLICT(invocation_id) DO UPDATE SET info = excluded.info, seq = NULL",
    )?;
    for (invocation_id, info) in invocations {
        upsert.execute(params![invocation_id, info])?;
    }
    Ok(())
}

/// Indexes invocations whose record is an entry of this commit (`first_seq`
/// is the commit's first entry, `last_seq` its last).
fn index_invocations(
    conn: &Connection,
    refs: &[InvocationRef],
    first_seq: u64,
    last_seq: u64,
) -> Result<(), StoreError> {
    let mut upsert = conn.prepare_cached(
        "INSERT INTO invocations(invocation_id, info, seq) VALUES (?1, NULL, ?2)
         ON CONFLICT(invocation_id) DO UPDATE SET info = NULL, seq = excluded.seq",
    )?;
    for r in refs {
        // prepare() checked that `event` indexes this commit's events.
        let seq = first_seq + r.event as u64;
        debug_assert!(seq <= last_seq);
        upsert.execute(params![&r.invocation_id, seq_to_db(seq)?])?;
    }
    Ok(())
}
