//! A record's bytes: how a batch is written into the journal and read back.
//! Counts and lengths are little-endian `u32`, numbers `u64`, floats their
//! bits; a reader never trusts a count beyond the bytes left.
//!
//! Never here: the file, its frames and checksums (`journal`).

use super::super::head::Head;
use super::Record;
use crate::prepare::{Prepared, PreparedEvent, PreparedLatch, PreparedReceipt};
use crate::{
    ApprovalRow, BudgetCap, BudgetRow, InvocationRef, LatchRow, LeaseDraft, LeaseOp, OpenOp,
    ReceiptRef, RevisionRow,
};

/// The record's first part: its index, time, and the heads it starts from
/// and ends at.
pub(in crate::sqlite) fn encode_meta(
    out: &mut Vec<u8>,
    index: u64,
    ts_ms: u64,
    start: &Head,
    end: &Head,
) {
    out.clear();
    put_u64(out, index);
    put_u64(out, ts_ms);
    put_u64(out, start.seq);
    put_str(out, &start.hash);
    put_u64(out, end.seq);
    put_str(out, &end.hash);
}

/// The record's commits.
pub(in crate::sqlite) fn encode_commits<'a>(
    out: &mut Vec<u8>,
    commits: impl ExactSizeIterator<Item = &'a Prepared>,
) {
    out.clear();
    put_len(out, commits.len());
    for c in commits {
        put_len(out, c.events.len());
        for e in &c.events {
            put_str(out, &e.kind_json);
            put_str(out, &e.body_json);
        }
        put_len(out, c.receipts.len());
        for r in &c.receipts {
            put_str(out, &r.row.command_id);
            put_str(out, &r.row.input_digest);
            put_len(out, r.row.event);
        }
        put_len(out, c.revisions.len());
        for r in &c.revisions {
            put_str(out, &r.device_id);
            put_str(out, &r.resource);
            put_u64(out, r.revision);
        }
        put_len(out, c.open_ops.len());
        for (op, info) in &c.open_ops {
            put_str(out, &op.command_id);
            put_str(out, info);
        }
        put_len(out, c.closed_ops.len());
        for id in &c.closed_ops {
            put_str(out, id);
        }
        put_len(out, c.invocation_refs.len());
        for r in &c.invocation_refs {
            put_str(out, &r.invocation_id);
            put_len(out, r.event);
        }
        encode_state(out, c);
    }
}

/// The rest of a commit: latches, budgets, approvals, invocations by value
/// and leases.
fn encode_state(out: &mut Vec<u8>, c: &Prepared) {
    put_len(out, c.latches.len());
    for l in &c.latches {
        put_str(out, &l.row.device_id);
        put_bool(out, l.row.latched);
        put_str(out, &l.info_json);
    }
    put_len(out, c.budget_draws.len());
    for b in &c.budget_draws {
        put_str(out, &b.key);
        put_str(out, &b.reservation_id);
        put_u64(out, b.amount.to_bits());
        put_u64(out, b.ts_ms);
        put_bool(out, b.released);
        put_bool(out, b.cap.is_some());
        if let Some(cap) = &b.cap {
            put_u64(out, cap.limit.to_bits());
            put_bool(out, cap.window_ms.is_some());
            put_u64(out, cap.window_ms.unwrap_or(0));
        }
    }
    put_len(out, c.budget_releases.len());
    for id in &c.budget_releases {
        put_str(out, id);
    }
    put_len(out, c.approvals.len());
    for (a, record_json) in &c.approvals {
        put_str(out, &a.approval_id);
        put_str(out, record_json);
    }
    put_len(out, c.invocations.len());
    for (id, info_json) in &c.invocations {
        put_str(out, id);
        put_str(out, info_json);
    }
    put_len(out, c.leases.len());
    for (d, info_json) in &c.leases {
        put_str(out, &d.key);
        put_str(out, &d.holder);
        match &d.op {
            LeaseOp::Release => put_bool(out, false),
            LeaseOp::Hold {
                lease_ms, replaces, ..
            } => {
                put_bool(out, true);
                put_u64(out, *lease_ms);
                put_str(out, info_json);
                put_bool(out, replaces.is_some());
                put_str(out, replaces.as_deref().unwrap_or(""));
            }
        }
    }
}

fn put_bool(out: &mut Vec<u8>, b: bool) {
    out.push(u8::from(b));
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_len(out: &mut Vec<u8>, n: usize) {
    // Every count and text is bounded far below u32 (MAX_ITEMS_PER_COMMIT,
    // MAX_ENTRY_BYTES, MAX_RECORD_BYTES).
    out.extend_from_slice(&(n as u32).to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_len(out, s.len());
    out.extend_from_slice(s.as_bytes());
}

/// Reads a record back; `None` for a body this build did not write (the
/// checksum matched, so that is a defect, and the journal ends there).
pub(super) fn decode(body: &[u8]) -> Option<Record> {
    let mut r = Reader { bytes: body, at: 0 };
    let index = r.u64()?;
    let ts_ms = r.u64()?;
    let start = Head {
        seq: r.u64()?,
        hash: r.string()?,
    };
    let end = Head {
        seq: r.u64()?,
        hash: r.string()?,
    };
    let n = r.count()?;
    let mut commits = Vec::with_capacity(n);
    for _ in 0..n {
        commits.push(decode_commit(&mut r)?);
    }
    (r.at == body.len()).then_some(Record {
        index,
        ts_ms,
        start,
        end,
        commits,
    })
}

fn decode_commit(r: &mut Reader<'_>) -> Option<Prepared> {
    let mut c = Prepared::empty();
    for _ in 0..r.count()? {
        c.events.push(PreparedEvent {
            kind_json: r.string()?,
            body_json: r.string()?,
        });
    }
    for _ in 0..r.count()? {
        let row = ReceiptRef {
            command_id: r.string()?,
            input_digest: r.string()?,
            event: r.count()?,
        };
        c.receipts.push(PreparedReceipt { row });
    }
    for _ in 0..r.count()? {
        c.revisions.push(RevisionRow {
            device_id: r.string()?,
            resource: r.string()?,
            revision: r.u64()?,
        });
    }
    for _ in 0..r.count()? {
        let command_id = r.string()?;
        let info_json = r.string()?;
        let info = serde_json::from_str(&info_json).ok()?;
        c.open_ops.push((OpenOp { command_id, info }, info_json));
    }
    for _ in 0..r.count()? {
        c.closed_ops.push(r.string()?);
    }
    for _ in 0..r.count()? {
        c.invocation_refs.push(InvocationRef {
            invocation_id: r.string()?,
            event: r.count()?,
        });
    }
    decode_state(r, &mut c)?;
    Some(c)
}

fn decode_state(r: &mut Reader<'_>, c: &mut Prepared) -> Option<()> {
    for _ in 0..r.count()? {
        let device_id = r.string()?;
        let latched = r.bool()?;
        let info_json = r.string()?;
        let info = serde_json::from_str(&info_json).ok()?;
        c.latches.push(PreparedLatch {
            row: LatchRow {
                device_id,
                latched,
                info,
            },
            info_json,
        });
    }
    for _ in 0..r.count()? {
        c.budget_draws.push(decode_draw(r)?);
    }
    for _ in 0..r.count()? {
        c.budget_releases.push(r.string()?);
    }
    for _ in 0..r.count()? {
        let approval_id = r.string()?;
        let record_json = r.string()?;
        let record = serde_json::from_str(&record_json).ok()?;
        c.approvals.push((
            ApprovalRow {
                approval_id,
                record,
            },
            record_json,
        ));
    }
    for _ in 0..r.count()? {
        c.invocations.push((r.string()?, r.string()?));
    }
    for _ in 0..r.count()? {
        c.leases.push(decode_lease(r)?);
    }
    Some(())
}

fn decode_draw(r: &mut Reader<'_>) -> Option<BudgetRow> {
    let key = r.string()?;
    let reservation_id = r.string()?;
    let amount = f64::from_bits(r.u64()?);
    let ts_ms = r.u64()?;
    let released = r.bool()?;
    let cap = if r.bool()? {
        let limit = f64::from_bits(r.u64()?);
        let windowed = r.bool()?;
        let window = r.u64()?;
        Some(BudgetCap {
            limit,
            window_ms: windowed.then_some(window),
        })
    } else {
        None
    };
    Some(BudgetRow {
        key,
        reservation_id,
        amount,
        ts_ms,
        released,
        cap,
    })
}

fn decode_lease(r: &mut Reader<'_>) -> Option<(LeaseDraft, String)> {
    let key = r.string()?;
    let holder = r.string()?;
    if !r.bool()? {
        let release = LeaseDraft {
            key,
            holder,
            op: LeaseOp::Release,
        };
        return Some((release, String::new()));
    }
    let lease_ms = r.u64()?;
    let info_json = r.string()?;
    let info = serde_json::from_str(&info_json).ok()?;
    let replaced = r.bool()?;
    let replaces = r.string()?;
    let op = LeaseOp::Hold {
        lease_ms,
        info,
        replaces: replaced.then_some(replaces),
    };
    Some((LeaseDraft { key, holder, op }, info_json))
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let s = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }

    fn bool(&mut self) -> Option<bool> {
        match self.take(1)? {
            [0] => Some(false),
            [1] => Some(true),
            _ => None,
        }
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    /// A count or length: never more than the bytes left, so a count read
    /// from a defective body cannot make a huge allocation or a long loop.
    fn count(&mut self) -> Option<usize> {
        let n = u32::from_le_bytes(self.take(4)?.try_into().ok()?) as usize;
        (n <= self.bytes.len() - self.at).then_some(n)
    }

    fn string(&mut self) -> Option<String> {
        let n = self.count()?;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
}
