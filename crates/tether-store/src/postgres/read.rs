//! The reads of the PostgreSQL store: the [`Store`] queries, each run on the
//! reader thread, and the chain export, paged so that neither the whole
//! chain nor the reader is held for long.
//!
//! Never here: writes (all of them go through the writer, see `apply`).

use super::head::{col, seq_from_db};
use super::PgStore;
use crate::chain::GENESIS_PREV_HASH;
use crate::{
    ApprovalRow, BudgetRow, Commit, Done, InvocationRow, LatchRow, OpenOp, ReceiptRow, RevisionRow,
    Store, StoreError,
};
use serde_json::Value;

/// Rows fetched per page of an export.
const PAGE_ROWS: i64 = 1024;

fn corrupt_json(what: &str, key: &str, e: serde_json::Error) -> StoreError {
    StoreError::Corrupt(format!("stored {what} for {key:?} is not valid JSON: {e}"))
}

fn json(text: &str, what: &str, key: &str) -> Result<Value, StoreError> {
    serde_json::from_str(text).map_err(|e| corrupt_json(what, key, e))
}

fn to_db(v: u64) -> i64 {
    // Stored values never exceed i64::MAX, so a larger bound matches nothing
    // beyond what i64::MAX matches.
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// `(id, text)` rows of a two-column query.
fn pairs(rows: &[tokio_postgres::Row]) -> Result<Vec<(String, String)>, StoreError> {
    rows.iter().map(|r| Ok((col(r, 0)?, col(r, 1)?))).collect()
}

impl Store for PgStore {
    fn writer_stats(&self) -> Option<crate::WriterStats> {
        Some(self.stats())
    }
    fn submit(&self, commit: Commit, done: Done) {
        self.writer.submit_owned(commit, done);
    }

    fn submit_ref(&self, commit: &Commit, done: Done) {
        self.writer.submit(commit, done);
    }

    fn receipt(&self, command_id: &str) -> Result<Option<ReceiptRow>, StoreError> {
        let id = command_id.to_owned();
        let row = self.call(move |pg| {
            // LEFT JOIN: a receipt whose entry was archived keeps its
            // document in its own row; one with neither is corrupt.
            let rows = pg.query(
                "SELECT r.input_digest, e.line, r.receipt, r.seq FROM receipts r
                 LEFT JOIN events e ON e.seq = r.seq WHERE r.command_id = $1",
                &[&id],
            )?;
            rows.first()
                .map(|r| {
                    Ok::<_, StoreError>((
                        col::<String>(r, 0)?,
                        col::<Option<String>>(r, 1)?,
                        col::<Option<String>>(r, 2)?,
                        col::<i64>(r, 3)?,
                    ))
                })
                .transpose()
        })?;
        match row {
            None => Ok(None),
            Some((input_digest, line, kept, seq)) => Ok(Some(ReceiptRow {
                command_id: command_id.to_owned(),
                input_digest,
                receipt: crate::chain::receipt_from_row(command_id, line, kept, seq)?,
            })),
        }
    }

    fn receipt_digests(&self, limit: usize) -> Result<(Vec<(String, String)>, bool), StoreError> {
        // One row more than asked tells whether everything fitted.
        let n = i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX);
        let mut out = self.call(move |pg| {
            let rows = pg.query(
                "SELECT command_id, input_digest FROM receipts ORDER BY seq DESC LIMIT $1",
                &[&n],
            )?;
            pairs(&rows)
        })?;
        let complete = out.len() <= limit;
        out.truncate(limit);
        out.reverse();
        Ok((out, complete))
    }

    fn revisions(&self) -> Result<Vec<RevisionRow>, StoreError> {
        self.call(|pg| {
            let rows = pg.query(
                "SELECT device_id, resource, revision FROM revisions ORDER BY device_id, resource",
                &[],
            )?;
            rows.iter()
                .map(|r| {
                    Ok(RevisionRow {
                        device_id: col(r, 0)?,
                        resource: col(r, 1)?,
                        revision: seq_from_db(col(r, 2)?)?,
                    })
                })
                .collect()
        })
    }

    fn latches(&self) -> Result<Vec<LatchRow>, StoreError> {
        self.call(|pg| {
            let rows = pg.query(
                "SELECT device_id, latched, info FROM latches ORDER BY device_id",
                &[],
            )?;
            rows.iter()
                .map(|r| {
                    let device_id: String = col(r, 0)?;
                    let info: String = col(r, 2)?;
                    Ok(LatchRow {
                        info: json(&info, "latch info", &device_id)?,
                        latched: col(r, 1)?,
                        device_id,
                    })
                })
                .collect()
        })
    }

    fn open_ops(&self) -> Result<Vec<OpenOp>, StoreError> {
        let rows = self.call(|pg| {
            let rows = pg.query(
                "SELECT command_id, info FROM open_ops ORDER BY command_id",
                &[],
            )?;
            pairs(&rows)
        })?;
        rows.into_iter()
            .map(|(command_id, info)| {
                Ok(OpenOp {
                    info: json(&info, "open operation", &command_id)?,
                    command_id,
                })
            })
            .collect()
    }

    fn approvals(&self) -> Result<Vec<ApprovalRow>, StoreError> {
        let rows = self.call(|pg| {
            let rows = pg.query(
                "SELECT approval_id, record FROM approvals ORDER BY created_seq, approval_id",
                &[],
            )?;
            pairs(&rows)
        })?;
        rows.into_iter()
            .map(|(approval_id, record)| {
                Ok(ApprovalRow {
                    record: json(&record, "approval", &approval_id)?,
                    approval_id,
                })
            })
            .collect()
    }

    fn approval(&self, approval_id: &str) -> Result<Option<ApprovalRow>, StoreError> {
        let id = approval_id.to_owned();
        let rows = self.call(move |pg| {
            let rows = pg.query(
                "SELECT approval_id, record FROM approvals WHERE approval_id = $1",
                &[&id],
            )?;
            pairs(&rows)
        })?;
        rows.into_iter()
            .next()
            .map(|(approval_id, record)| {
                Ok(ApprovalRow {
                    record: json(&record, "approval", &approval_id)?,
                    approval_id,
                })
            })
            .transpose()
    }

    fn approvals_to_restore(
        &self,
        open_max: usize,
        closed_max: usize,
    ) -> Result<Vec<ApprovalRow>, StoreError> {
        let open = i64::try_from(open_max).unwrap_or(i64::MAX);
        let closed = i64::try_from(closed_max).unwrap_or(i64::MAX);
        let rows = self.call(move |pg| {
            // The closed statuses are those of `crate::approval_is_closed`.
            let rows = pg.query(
                "SELECT approval_id, record FROM (
                    (SELECT approval_id, record, created_seq FROM approvals
                        WHERE COALESCE(record::json->>'status', '')
                            NOT IN ('used', 'expired', 'revoked')
                        ORDER BY created_seq DESC, approval_id DESC LIMIT $1)
                    UNION ALL
                    (SELECT approval_id, record, created_seq FROM approvals
                        WHERE record::json->>'status' IN ('used', 'expired', 'revoked')
                        ORDER BY created_seq DESC, approval_id DESC LIMIT $2)
                 ) AS kept ORDER BY created_seq, approval_id",
                &[&open, &closed],
            )?;
            pairs(&rows)
        })?;
        rows.into_iter()
            .map(|(approval_id, record)| {
                Ok(ApprovalRow {
                    record: json(&record, "approval", &approval_id)?,
                    approval_id,
                })
            })
            .collect()
    }

    fn approvals_since(&self, after: u64) -> Result<(Vec<ApprovalRow>, u64), StoreError> {
        let from = to_db(after);
        let limit = i64::try_from(crate::APPROVALS_SINCE_MAX).unwrap_or(i64::MAX);
        let rows = self.call(move |pg| {
            let rows = pg.query(
                "SELECT approval_id, record, updated_seq FROM approvals WHERE updated_seq > $1
                 ORDER BY updated_seq, approval_id LIMIT $2",
                &[&from, &limit],
            )?;
            rows.iter()
                .map(|r| {
                    Ok((
                        col::<String>(r, 0)?,
                        col::<String>(r, 1)?,
                        col::<i64>(r, 2)?,
                    ))
                })
                .collect::<Result<Vec<_>, StoreError>>()
        })?;
        let (mut out, mut newest) = (Vec::with_capacity(rows.len()), after);
        for (approval_id, record, seq) in rows {
            newest = newest.max(u64::try_from(seq).unwrap_or(0));
            out.push(ApprovalRow {
                record: json(&record, "approval", &approval_id)?,
                approval_id,
            });
        }
        Ok((out, newest))
    }

    fn invocation(&self, invocation_id: &str) -> Result<Option<InvocationRow>, StoreError> {
        let id = invocation_id.to_owned();
        type Found = (Option<String>, Option<i64>, Option<String>);
        let row: Option<Found> = self.call(move |pg| {
            let rows = pg.query(
                "SELECT i.info, i.seq, e.line FROM invocations i LEFT JOIN events e ON e.seq = i.seq
                 WHERE i.invocation_id = $1",
                &[&id],
            )?;
            rows.first()
                .map(|r| Ok((col(r, 0)?, col(r, 1)?, col(r, 2)?)))
                .transpose()
        })?;
        let info = match row {
            None => return Ok(None),
            Some((Some(info), _, _)) => json(&info, "invocation", invocation_id)?.into(),
            Some((None, _, Some(line))) => {
                crate::chain::invocation_from_entry(invocation_id, &line)?
            }
            Some((None, seq, None)) => {
                return Err(StoreError::Corrupt(format!(
                    "invocation {invocation_id:?} is indexed at entry {seq:?}, which is missing"
                )))
            }
        };
        Ok(Some(InvocationRow {
            invocation_id: invocation_id.to_owned(),
            info,
        }))
    }

    fn budget_rows_since(&self, ts_ms: u64) -> Result<Vec<BudgetRow>, StoreError> {
        let from = to_db(ts_ms);
        self.call(move |pg| {
            let rows = pg.query(
                "SELECT key, reservation_id, amount, ts_ms, released FROM budget
                 WHERE ts_ms >= $1 ORDER BY ts_ms, ord",
                &[&from],
            )?;
            rows.iter()
                .map(|r| {
                    Ok(BudgetRow {
                        key: col(r, 0)?,
                        reservation_id: col(r, 1)?,
                        amount: col(r, 2)?,
                        ts_ms: seq_from_db(col(r, 3)?)?,
                        released: col(r, 4)?,
                        cap: None,
                    })
                })
                .collect()
        })
    }

    fn chain_head(&self) -> Result<Option<(u64, String)>, StoreError> {
        self.call(|pg| {
            let rows = pg.query(
                "SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1",
                &[],
            )?;
            rows.first()
                .map(|r| Ok((seq_from_db(col(r, 0)?)?, col(r, 1)?)))
                .transpose()
        })
    }

    fn chain_tail(&self, n: usize) -> Result<Vec<Value>, StoreError> {
        let limit = i64::try_from(n).unwrap_or(i64::MAX);
        let rows = self.call(move |pg| {
            let rows = pg.query(
                "SELECT seq, line FROM events ORDER BY seq DESC LIMIT $1",
                &[&limit],
            )?;
            rows.iter()
                .map(|r| Ok((col::<i64>(r, 0)?, col::<String>(r, 1)?)))
                .collect::<Result<Vec<_>, StoreError>>()
        })?;
        let mut out = rows
            .into_iter()
            .map(|(seq, line)| json(&line, "entry", &seq.to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        out.reverse();
        Ok(out)
    }

    fn export_chain(&self, out: &mut dyn std::io::Write) -> Result<u64, StoreError> {
        // Export up to the head as of now; entries appended meanwhile are
        // left for the next export, which also bounds the loop.
        let Some((head, head_hash)) = self.chain_head()? else {
            crate::verify::write_export_seal(out, 0, GENESIS_PREV_HASH)?;
            out.flush()?;
            return Ok(0);
        };
        let head = to_db(head);
        let (mut after, mut count) = (0i64, 0u64);
        while after < head {
            // The reader is held only while fetching, never while writing
            // to `out` (which may be slow).
            let page = self.call(move |pg| {
                let rows = pg.query(
                    "SELECT seq, line FROM events WHERE seq > $1 AND seq <= $2 ORDER BY seq LIMIT $3",
                    &[&after, &head, &PAGE_ROWS],
                )?;
                rows.iter()
                    .map(|r| Ok((col::<i64>(r, 0)?, col::<String>(r, 1)?)))
                    .collect::<Result<Vec<_>, StoreError>>()
            })?;
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
        self.call(super::archive::read_anchor)
    }

    fn archive_commit(
        &self,
        anchor: &crate::archive::ArchiveAnchor,
    ) -> Result<crate::archive::ArchiveCommitted, StoreError> {
        let target = self.target.clone();
        let anchor = anchor.clone();
        super::on_own_thread(move || super::archive::commit(target, &anchor))
    }

    fn durable(&self) -> bool {
        true
    }

    fn entries_after(&self, after: u64, limit: usize) -> Result<Vec<(u64, String)>, StoreError> {
        let after = to_db(after);
        let limit = i64::try_from(limit.min(crate::ENTRIES_PAGE_MAX)).unwrap_or(0);
        self.call(move |pg| {
            let rows = pg.query(
                "SELECT seq, line FROM events WHERE seq > $1 ORDER BY seq LIMIT $2",
                &[&after, &limit],
            )?;
            rows.iter()
                .map(|r| {
                    let seq = u64::try_from(col::<i64>(r, 0)?)
                        .map_err(|_| StoreError::Corrupt("a negative seq".into()))?;
                    Ok((seq, col::<String>(r, 1)?))
                })
                .collect()
        })
    }

    fn leases(&self) -> Result<crate::Leases, StoreError> {
        self.call(|pg| {
            let now = pg.query(
                "SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint",
                &[],
            )?;
            let now_ms = match now.first() {
                Some(r) => u64::try_from(col::<i64>(r, 0)?).unwrap_or(0),
                None => 0,
            };
            let rows = pg.query(
                "SELECT key, holder, renewed_ms, until_ms, info FROM leases ORDER BY key",
                &[],
            )?;
            let rows = rows
                .iter()
                .map(|r| {
                    let key: String = col(r, 0)?;
                    let info: String = col(r, 4)?;
                    Ok(crate::LeaseRow {
                        info: json(&info, "lease info", &key)?,
                        holder: col(r, 1)?,
                        renewed_ms: u64::try_from(col::<i64>(r, 2)?).unwrap_or(0),
                        until_ms: u64::try_from(col::<i64>(r, 3)?).unwrap_or(0),
                        key,
                    })
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
            Ok(crate::Leases { rows, now_ms })
        })
    }

    fn wait_change(&self, timeout: std::time::Duration) {
        self.changes.wait(timeout);
    }

    fn change_poll_ms(&self) -> u64 {
        super::PG_CHANGE_POLL_MS
    }

    fn change_token(&self) -> Result<u64, StoreError> {
        // Every batch of every endpoint bumps the counter in the head row.
        self.call(|pg| {
            let rows = pg.query("SELECT batches FROM chain_head WHERE id = 1", &[])?;
            let row = rows
                .first()
                .ok_or_else(|| StoreError::Corrupt("the chain_head row is missing".into()))?;
            Ok(col::<i64>(row, 0)? as u64)
        })
    }
}
