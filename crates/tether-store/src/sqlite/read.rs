//! The reads of the SQLite store: the [`Store`] queries, answered from the
//! read-only connection, and the chain export, paged so that neither the
//! whole chain nor the reader is held for long.
//!
//! Never here: writes (all of them go through the writer, see `apply`).

use super::head::{seq_from_db, seq_to_db};
use super::{SqliteStore, PAGE_ROWS};
use crate::chain::GENESIS_PREV_HASH;
use crate::{BudgetRow, Commit, Done, LatchRow, ReceiptRow, RevisionRow, Store, StoreError};
use rusqlite::{params, OptionalExtension};
use serde_json::Value;

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
    fn writer_stats(&self) -> Option<crate::WriterStats> {
        Some(self.stats())
    }
    fn submit(&self, commit: Commit, done: Done) {
        self.writer.submit_owned(commit, done);
    }

    fn submit_ref(&self, commit: &Commit, done: Done) {
        self.writer.submit(commit, done);
    }

    fn submit_waiting(&self, commit: Commit, done: Done) {
        self.writer.submit_waiting(commit, done);
    }

    fn submit_ref_waiting(&self, commit: &Commit, done: Done) {
        self.writer.submit_ref_waiting(commit, done);
    }

    fn receipt(&self, command_id: &str) -> Result<Option<ReceiptRow>, StoreError> {
        let conn = self.read()?;
        // LEFT JOIN: a receipt whose entry was archived keeps its document
        // in its own row; one with neither is corrupt, never "not run".
        let row: Option<(String, Option<String>, Option<String>, i64)> = conn
            .prepare_cached(
                "SELECT r.input_digest, e.line, r.receipt, r.seq FROM receipts r
                 LEFT JOIN events e ON e.seq = r.seq WHERE r.command_id = ?1",
            )?
            .query_row([command_id], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })
            .optional()?;
        drop(conn);
        match row {
            None => Ok(None),
            Some((input_digest, line, kept, seq)) => Ok(Some(ReceiptRow {
                command_id: command_id.to_string(),
                input_digest,
                receipt: crate::chain::receipt_from_row(command_id, line, kept, seq)?,
            })),
        }
    }

    fn receipt_digests(&self, limit: usize) -> Result<(Vec<(String, String)>, bool), StoreError> {
        let conn = self.read()?;
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
        let conn = self.read()?;
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
        let conn = self.read()?;
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
        let conn = self.read()?;
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

    fn approval(&self, approval_id: &str) -> Result<Option<crate::ApprovalRow>, StoreError> {
        let conn = self.read()?;
        let record: Option<String> = conn
            .prepare_cached("SELECT record FROM approvals WHERE approval_id = ?1")?
            .query_row([approval_id], |r| r.get(0))
            .optional()?;
        record
            .map(|text| {
                let record: Value = serde_json::from_str(&text)
                    .map_err(|e| corrupt_json("approval", approval_id, e))?;
                Ok(crate::ApprovalRow {
                    approval_id: approval_id.to_owned(),
                    record,
                })
            })
            .transpose()
    }

    fn approvals_to_restore(
        &self,
        open_max: usize,
        closed_max: usize,
    ) -> Result<Vec<crate::ApprovalRow>, StoreError> {
        let conn = self.read()?;
        // The closed statuses are those of `crate::approval_is_closed`.
        let mut st = conn.prepare_cached(
            "SELECT approval_id, record FROM (
                SELECT * FROM (SELECT approval_id, record, created_seq FROM approvals
                    WHERE COALESCE(json_extract(record, '$.status'), '')
                        NOT IN ('used', 'expired', 'revoked')
                    ORDER BY created_seq DESC, approval_id DESC LIMIT ?1)
                UNION ALL
                SELECT * FROM (SELECT approval_id, record, created_seq FROM approvals
                    WHERE json_extract(record, '$.status') IN ('used', 'expired', 'revoked')
                    ORDER BY created_seq DESC, approval_id DESC LIMIT ?2)
             ) ORDER BY created_seq, approval_id",
        )?;
        let open = i64::try_from(open_max).unwrap_or(i64::MAX);
        let closed = i64::try_from(closed_max).unwrap_or(i64::MAX);
        let rows = st.query_map(params![open, closed], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
        })?;
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

    fn approvals_since(&self, after: u64) -> Result<(Vec<crate::ApprovalRow>, u64), StoreError> {
        let conn = self.read()?;
        let mut st = conn.prepare_cached(
            "SELECT approval_id, record, updated_seq FROM approvals WHERE updated_seq > ?1
             ORDER BY updated_seq, approval_id LIMIT ?2",
        )?;
        let limit = i64::try_from(crate::APPROVALS_SINCE_MAX).unwrap_or(i64::MAX);
        let rows = st.query_map(params![seq_to_db(after)?, limit], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?;
        let (mut out, mut newest) = (Vec::new(), after);
        for row in rows {
            let (approval_id, record, seq) = row?;
            newest = newest.max(u64::try_from(seq).unwrap_or(0));
            let record: Value = serde_json::from_str(&record)
                .map_err(|e| corrupt_json("approval", &approval_id, e))?;
            out.push(crate::ApprovalRow {
                approval_id,
                record,
            });
        }
        Ok((out, newest))
    }

    fn invocation(&self, invocation_id: &str) -> Result<Option<crate::InvocationRow>, StoreError> {
        let conn = self.read()?;
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
        self.writer.settle(super::BUSY_TIMEOUT)?;
        self.latches_committed()
    }

    fn latches_committed(&self) -> Result<Vec<LatchRow>, StoreError> {
        // While the writer holds answered records, no other process can
        // commit (the held transaction has the write lock, and is held only
        // while no other handle is open): the committed rows are everything
        // others wrote.
        let conn = self.read_committed();
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
        let conn = self.read()?;
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
                cap: None,
            });
        }
        Ok(out)
    }

    fn budget_used(&self, key: &str, from_ms: Option<u64>) -> Result<f64, StoreError> {
        let conn = self.read()?;
        // Stored ts_ms never exceeds i64::MAX, so a larger bound counts nothing.
        let from = i64::try_from(from_ms.unwrap_or(0)).unwrap_or(i64::MAX);
        let used: f64 = conn
            .prepare_cached(
                "SELECT COALESCE(SUM(amount), 0.0) FROM budget
                 WHERE key = ?1 AND ts_ms >= ?2 AND released = 0",
            )?
            .query_row(params![key, from], |r| r.get(0))?;
        Ok(used)
    }

    fn chain_head(&self) -> Result<Option<(u64, String)>, StoreError> {
        let conn = self.read()?;
        let row: Option<(i64, String)> = conn
            .prepare_cached("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1")?
            .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        row.map(|(s, h)| Ok((seq_from_db(s)?, h))).transpose()
    }

    fn chain_tail(&self, n: usize) -> Result<Vec<Value>, StoreError> {
        let conn = self.read()?;
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
                let conn = self.read()?;
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
            let Some(last) = crate::verify::write_export_page(out, &page, &mut count)? else {
                break;
            };
            after = last;
        }
        // After an archive the chain starts past seq 1: the seal follows the head.
        crate::verify::write_export_seal_at(out, seq_from_db(head)? + 1, count, &head_hash)?;
        out.flush()?;
        Ok(count)
    }

    fn archive_anchor(&self) -> Result<Option<crate::archive::ArchiveAnchor>, StoreError> {
        super::archive::read_anchor(&*self.read()?)
    }

    fn archive_commit(
        &self,
        anchor: &crate::archive::ArchiveAnchor,
    ) -> Result<crate::archive::ArchiveCommitted, StoreError> {
        // Its own connection's transaction would wait for the held ones.
        self.writer.settle(super::BUSY_TIMEOUT)?;
        super::archive::commit(&self.path, anchor)
    }

    fn durable(&self) -> bool {
        true
    }

    fn entries_after(&self, after: u64, limit: usize) -> Result<Vec<(u64, String)>, StoreError> {
        let limit = limit_param(limit.min(crate::ENTRIES_PAGE_MAX));
        let conn = self.read()?;
        let mut st = conn
            .prepare_cached("SELECT seq, line FROM events WHERE seq > ?1 ORDER BY seq LIMIT ?2")?;
        let rows = st.query_map(params![seq_to_db(after)?, limit], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (seq, line) = row?;
            out.push((u64_col(seq, "seq")?, line));
        }
        Ok(out)
    }

    fn leases(&self) -> Result<crate::Leases, StoreError> {
        let conn = self.read()?;
        let mut st = conn.prepare_cached(
            "SELECT key, holder, renewed_ms, until_ms, info FROM leases ORDER BY key",
        )?;
        let rows = st.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, String>(4)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (key, holder, renewed, until, info) = row?;
            let info: Value =
                serde_json::from_str(&info).map_err(|e| corrupt_json("lease info", &key, e))?;
            out.push(crate::LeaseRow {
                renewed_ms: u64_col(renewed, "lease time")?,
                until_ms: u64_col(until, "lease expiry")?,
                key,
                holder,
                info,
            });
        }
        // The writer's clock is this host's: leases are judged against it.
        Ok(crate::Leases {
            rows: out,
            now_ms: tether_core::receipt::now_ms(),
        })
    }

    fn change_token(&self) -> Result<u64, StoreError> {
        // data_version moves whenever another connection — this process's
        // writer or another process — committed since the last call (the
        // writer's held records are committed first, as for every read).
        let conn = self.read()?;
        let v: i64 = conn.query_row("PRAGMA data_version", [], |r| r.get(0))?;
        Ok(v as u64)
    }
}
