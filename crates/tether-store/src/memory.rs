//! The in-memory store: same trait, nothing durable. For tests and
//! in-process benchmarks. A commit is applied on the caller's thread at
//! once (nothing is gained by batching what is never flushed, and a thread
//! hand-off each way is most of an in-memory command's time);
//! [`MemoryStore::with_writer`] keeps SQLite's writer thread and batching
//! instead, for what measures the writer itself.
//!
//! Everything is kept for the life of the store (the chain grows without
//! bound, as a durable one would on disk); do not use it for long-running
//! endpoints.

use crate::chain::{seal, GENESIS_PREV_HASH};
use crate::prepare::{Prepared, PreparedEvent, PreparedReceipt};
use crate::writer::{Backend, Job, Writer, WriterStats};
use crate::{BudgetRow, Commit, CommitAck, Done, LatchRow, ReceiptRow, Store, StoreError};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

/// A receipt's index row: its id, digest and the entry that holds it.
struct StoredReceipt {
    command_id: String,
    input_digest: String,
    seq: u64,
}

#[derive(Default)]
struct State {
    /// `(hash, line)`; the entry at index i has seq i + 1.
    events: Vec<(String, String)>,
    /// Receipts in insertion order (the document is read back from its
    /// entry, as SQLite does), and their index by command_id.
    receipts: Vec<StoredReceipt>,
    receipt_index: HashMap<String, usize>,
    revisions: BTreeMap<(String, String), u64>,
    latches: BTreeMap<String, LatchRow>,
    budget: Vec<BudgetRow>,
    budget_index: HashMap<String, usize>,
    /// Bumped by every applied commit (the change token).
    version: u64,
    open_ops: BTreeMap<String, crate::OpenOp>,
    approvals: Vec<crate::ApprovalRow>,
    /// The chain position (head after the commit) that last wrote each
    /// approval, as SQLite's `updated_seq`.
    approval_versions: HashMap<String, u64>,
    /// Invocation records by id, as SQLite stores them.
    invocations: HashMap<String, StoredInvocation>,
    /// Leases by key (see [`crate::lease`]).
    leases: BTreeMap<String, crate::LeaseRow>,
    /// Reused buffer for sealing entries (commits applied inline).
    scratch: String,
    /// Counters of commits applied inline (one "batch" each).
    inline_stats: WriterStats,
}

/// An invocation's record: its canonical text, or the `seq` of the entry
/// whose body it is.
enum StoredInvocation {
    Info(String),
    Entry(u64),
}

impl State {
    /// The stored text of entry `seq` (1-based), if the chain has it.
    fn line(&self, seq: u64) -> Option<&str> {
        let i = usize::try_from(seq.checked_sub(1)?).ok()?;
        self.events.get(i).map(|(_, line)| line.as_str())
    }

    fn head(&self) -> (u64, &str) {
        match self.events.last() {
            Some((hash, _)) => (self.events.len() as u64, hash.as_str()),
            None => (0, GENESIS_PREV_HASH),
        }
    }
}

type Shared = Arc<Mutex<State>>;

fn lock(state: &Shared) -> MutexGuard<'_, State> {
    // Each commit is applied by a sequence of infallible pushes after all of
    // its checks, so a panic cannot leave a commit half-applied in a way that
    // matters more than losing the process; keep serving.
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// In-memory [`Store`]; `durable()` is false.
pub struct MemoryStore {
    /// `None`: commits are applied on the caller's thread.
    writer: Option<Writer>,
    state: Shared,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore").finish_non_exhaustive()
    }
}

impl MemoryStore {
    /// A new, empty store. If its writer thread cannot be started, the store
    /// answers every commit with [`StoreError::Closed`].
    pub fn new() -> Self {
        MemoryStore {
            writer: None,
            state: Arc::default(),
        }
    }

    /// A store whose commits go through the group-commit writer thread, as
    /// SQLite's do. If the thread cannot be started, every commit is
    /// answered [`StoreError::Closed`].
    pub fn with_writer() -> Self {
        let state: Shared = Arc::default();
        let backend = MemoryBackend {
            state: Arc::clone(&state),
            scratch: String::new(),
        };
        let writer = Writer::spawn(backend, "tether-store-memory-writer")
            .unwrap_or_else(|_| Writer::stopped());
        MemoryStore {
            writer: Some(writer),
            state,
        }
    }

    /// Writer counters (for inline commits, one batch per commit).
    pub fn stats(&self) -> WriterStats {
        match &self.writer {
            Some(w) => w.stats(),
            None => lock(&self.state).inline_stats,
        }
    }

    /// Applies a prepared commit now, on this thread, and answers it.
    fn apply_now(&self, prepared: Result<Prepared, StoreError>, done: Done) {
        let r = prepared.and_then(|c| {
            let mut st = lock(&self.state);
            let mut scratch = std::mem::take(&mut st.scratch);
            let r = st.apply_job(&c, tether_core::receipt::now_ms(), &mut scratch);
            st.scratch = scratch;
            st.inline_stats.batches += 1;
            st.inline_stats.commits += 1;
            st.inline_stats.largest_batch = 1;
            r
        });
        // The lock is released: `done` may read the store.
        crate::writer::call_done(done, r);
    }
}

struct MemoryBackend {
    state: Shared,
    scratch: String,
}

impl Backend for MemoryBackend {
    fn apply_batch(
        &mut self,
        batch: &[Job],
        ts_ms: u64,
        results: &mut Vec<Result<CommitAck, StoreError>>,
    ) -> Result<(), StoreError> {
        // One lock for the whole batch, so readers see a batch all at once,
        // like a SQLite transaction.
        let mut st = lock(&self.state);
        for job in batch {
            results.push(st.apply_job(&job.commit, ts_ms, &mut self.scratch));
        }
        Ok(())
    }
}

impl State {
    /// One commit: checked, then applied whole, or refused with nothing of
    /// it applied.
    fn apply_job(
        &mut self,
        c: &Prepared,
        ts_ms: u64,
        scratch: &mut String,
    ) -> Result<CommitAck, StoreError> {
        if let Some(conflict) = self.conflict(c) {
            return Err(conflict);
        }
        crate::lease::decide_all(&self.leases, &c.leases, ts_ms)?;
        crate::lease::apply_all(&mut self.leases, &c.leases, ts_ms);
        Ok(self.apply(c, ts_ms, scratch))
    }

    /// Why `c` collides with what is stored (checked before anything of it
    /// is applied, in the order SQLite checks): a receipt already stored, an
    /// operation that already ran or is running, a budget reservation
    /// already stored, a capped draw that does not fit.
    fn conflict(&self, c: &Prepared) -> Option<StoreError> {
        if let Some(r) = c
            .receipts
            .iter()
            .find(|r| self.receipt_index.contains_key(&r.row.command_id))
        {
            return Some(StoreError::Conflict(format!(
                "a receipt for command_id {:?} is already stored",
                r.row.command_id
            )));
        }
        if let Some((op, _)) = c.open_ops.iter().find(|(op, _)| {
            self.receipt_index.contains_key(&op.command_id)
                || self.open_ops.contains_key(&op.command_id)
        }) {
            return Some(StoreError::Conflict(format!(
                "command_id {:?} already ran or is running on this store",
                op.command_id
            )));
        }
        if let Some(b) = c
            .budget_draws
            .iter()
            .find(|b| self.budget_index.contains_key(&b.reservation_id))
        {
            return Some(StoreError::Conflict(format!(
                "budget reservation {:?} is already stored",
                b.reservation_id
            )));
        }
        self.over_cap(&c.budget_draws)
    }

    /// The refusal of the first capped draw that does not fit, counted as
    /// SQLite counts it (see [`crate::BudgetCap`]): the key's unreleased
    /// draws the window counts, stored or earlier in this commit.
    fn over_cap(&self, draws: &[BudgetRow]) -> Option<StoreError> {
        for (i, d) in draws.iter().enumerate() {
            let Some(cap) = &d.cap else { continue };
            let from_ms = cap.counts_from_ms(d.ts_ms).unwrap_or(0);
            let used: f64 = self
                .budget
                .iter()
                .chain(&draws[..i])
                .filter(|e| e.key == d.key && e.ts_ms >= from_ms && !e.released)
                .map(|e| e.amount)
                .sum();
            if let Err(e) = cap.check(d, used) {
                return Some(e);
            }
        }
        None
    }

    /// Applies a commit that has no conflict; infallible, so a commit is
    /// applied whole.
    fn apply(&mut self, c: &Prepared, ts_ms: u64, scratch: &mut String) -> CommitAck {
        let first_seq = self.head().0 + 1;
        self.append_events(&c.events, ts_ms, scratch);
        self.index_receipts(&c.receipts, first_seq);
        self.raise_revisions(&c.revisions);
        self.version = self.version.wrapping_add(1);
        for l in &c.latches {
            self.latches.insert(l.row.device_id.clone(), l.row.clone());
        }
        self.insert_budget_draws(&c.budget_draws);
        for (op, _) in &c.open_ops {
            self.open_ops.insert(op.command_id.clone(), op.clone());
        }
        for id in &c.closed_ops {
            self.open_ops.remove(id);
        }
        self.upsert_approvals(&c.approvals);
        for (id, info) in &c.invocations {
            self.invocations
                .insert(id.clone(), StoredInvocation::Info(info.clone()));
        }
        for r in &c.invocation_refs {
            // prepare() checked that `event` indexes this commit's events.
            let seq = first_seq + r.event as u64;
            self.invocations
                .insert(r.invocation_id.clone(), StoredInvocation::Entry(seq));
        }
        self.release_budget(&c.budget_releases);
        let (last_seq, hash) = self.head();
        CommitAck {
            first_seq,
            last_seq,
            head_hash: hash.to_string(),
        }
    }

    fn append_events(&mut self, events: &[PreparedEvent], ts_ms: u64, scratch: &mut String) {
        for e in events {
            let (seq, prev) = self.head();
            let sealed = seal(seq + 1, ts_ms, &e.kind_json, &e.body_json, prev, scratch);
            self.events.push((sealed.hash, sealed.line));
        }
    }

    /// Indexes each receipt by the entry that holds it (`first_seq` is the
    /// commit's first entry).
    fn index_receipts(&mut self, receipts: &[PreparedReceipt], first_seq: u64) {
        for r in receipts {
            let at = self.receipts.len();
            self.receipt_index.insert(r.row.command_id.clone(), at);
            self.receipts.push(StoredReceipt {
                command_id: r.row.command_id.clone(),
                input_digest: r.row.input_digest.clone(),
                // prepare() checked that `event` indexes this commit's events.
                seq: first_seq + r.row.event as u64,
            });
        }
    }

    fn raise_revisions(&mut self, revisions: &[crate::RevisionRow]) {
        for r in revisions {
            // Revisions are minted by an atomic increment and concurrent
            // commits may land out of order: keep the highest.
            let slot = self
                .revisions
                .entry((r.device_id.clone(), r.resource.clone()))
                .or_insert(0);
            *slot = (*slot).max(r.revision);
        }
    }

    fn insert_budget_draws(&mut self, draws: &[BudgetRow]) {
        for b in draws {
            let at = self.budget.len();
            self.budget_index.insert(b.reservation_id.clone(), at);
            // The cap is checked, not stored, as SQLite does.
            self.budget.push(BudgetRow {
                cap: None,
                ..b.clone()
            });
        }
    }

    fn upsert_approvals(&mut self, approvals: &[(crate::ApprovalRow, String)]) {
        for (a, _) in approvals {
            let at = self.events.len() as u64;
            self.approval_versions.insert(a.approval_id.clone(), at);
            match self
                .approvals
                .iter_mut()
                .find(|x| x.approval_id == a.approval_id)
            {
                Some(x) => x.record = a.record.clone(),
                None => self.approvals.push(a.clone()),
            }
        }
    }

    /// Marks reservations released; an unknown id is a no-op.
    fn release_budget(&mut self, reservation_ids: &[String]) {
        for id in reservation_ids {
            if let Some(&at) = self.budget_index.get(id) {
                if let Some(row) = self.budget.get_mut(at) {
                    row.released = true;
                }
            }
        }
    }
}

fn parse_line(line: &str) -> Result<Value, StoreError> {
    serde_json::from_str(line)
        .map_err(|e| StoreError::Corrupt(format!("entry is not valid JSON: {e}")))
}

impl Store for MemoryStore {
    fn writer_stats(&self) -> Option<crate::WriterStats> {
        Some(self.stats())
    }
    fn submit(&self, commit: Commit, done: Done) {
        match &self.writer {
            Some(w) => w.submit_owned(commit, done),
            None => self.apply_now(crate::prepare::prepare_owned(commit), done),
        }
    }

    fn submit_ref(&self, commit: &Commit, done: Done) {
        match &self.writer {
            Some(w) => w.submit(commit, done),
            None => self.apply_now(crate::prepare::prepare(commit), done),
        }
    }

    fn receipt(&self, command_id: &str) -> Result<Option<ReceiptRow>, StoreError> {
        let st = lock(&self.state);
        let Some(r) = st
            .receipt_index
            .get(command_id)
            .and_then(|&i| st.receipts.get(i))
        else {
            return Ok(None);
        };
        let line = st.line(r.seq).ok_or_else(|| {
            StoreError::Corrupt(format!("no entry {} for command_id {command_id:?}", r.seq))
        })?;
        Ok(Some(ReceiptRow {
            command_id: r.command_id.clone(),
            input_digest: r.input_digest.clone(),
            receipt: crate::chain::receipt_from_entry(command_id, line)?,
        }))
    }

    fn receipt_digests(&self, limit: usize) -> Result<(Vec<(String, String)>, bool), StoreError> {
        let st = lock(&self.state);
        let from = st.receipts.len().saturating_sub(limit);
        let out = st.receipts[from..]
            .iter()
            .map(|r| (r.command_id.clone(), r.input_digest.clone()))
            .collect();
        Ok((out, from == 0))
    }

    fn revisions(&self) -> Result<Vec<crate::RevisionRow>, StoreError> {
        let st = lock(&self.state);
        Ok(st
            .revisions
            .iter()
            .map(|((device_id, resource), &revision)| crate::RevisionRow {
                device_id: device_id.clone(),
                resource: resource.clone(),
                revision,
            })
            .collect())
    }

    fn approvals(&self) -> Result<Vec<crate::ApprovalRow>, StoreError> {
        Ok(lock(&self.state).approvals.clone())
    }

    fn open_ops(&self) -> Result<Vec<crate::OpenOp>, StoreError> {
        Ok(lock(&self.state).open_ops.values().cloned().collect())
    }

    fn invocation(&self, invocation_id: &str) -> Result<Option<crate::InvocationRow>, StoreError> {
        let st = lock(&self.state);
        let info = match st.invocations.get(invocation_id) {
            None => return Ok(None),
            Some(StoredInvocation::Info(text)) => {
                let info: Value = serde_json::from_str(text).map_err(|e| {
                    StoreError::Corrupt(format!(
                        "invocation {invocation_id:?} is not valid JSON: {e}"
                    ))
                })?;
                info.into()
            }
            Some(StoredInvocation::Entry(seq)) => {
                let line = st.line(*seq).ok_or_else(|| {
                    StoreError::Corrupt(format!("no entry {seq} for invocation {invocation_id:?}"))
                })?;
                crate::chain::invocation_from_entry(invocation_id, line)?
            }
        };
        Ok(Some(crate::InvocationRow {
            invocation_id: invocation_id.to_owned(),
            info,
        }))
    }

    fn latches(&self) -> Result<Vec<LatchRow>, StoreError> {
        Ok(lock(&self.state).latches.values().cloned().collect())
    }

    fn budget_rows_since(&self, ts_ms: u64) -> Result<Vec<BudgetRow>, StoreError> {
        let st = lock(&self.state);
        let mut rows: Vec<BudgetRow> = st
            .budget
            .iter()
            .filter(|b| b.ts_ms >= ts_ms)
            .cloned()
            .collect();
        // Same order as SQLite: by time, then insertion (the sort is stable).
        rows.sort_by_key(|b| b.ts_ms);
        Ok(rows)
    }

    fn chain_head(&self) -> Result<Option<(u64, String)>, StoreError> {
        let st = lock(&self.state);
        Ok(st
            .events
            .last()
            .map(|(hash, _)| (st.events.len() as u64, hash.clone())))
    }

    fn chain_tail(&self, n: usize) -> Result<Vec<Value>, StoreError> {
        let st = lock(&self.state);
        let from = st.events.len().saturating_sub(n);
        st.events[from..]
            .iter()
            .map(|(_, line)| parse_line(line))
            .collect()
    }

    fn export_chain(&self, out: &mut dyn std::io::Write) -> Result<u64, StoreError> {
        // Copy the lines out first so a slow writer never holds the lock the
        // writer thread needs.
        let lines: Vec<(String, String)> = lock(&self.state).events.clone();
        for (_, line) in &lines {
            out.write_all(line.as_bytes())?;
            out.write_all(b"\n")?;
        }
        let head_hash = lines
            .last()
            .map_or(crate::chain::GENESIS_PREV_HASH, |(hash, _)| hash.as_str());
        crate::verify::write_export_seal(out, lines.len() as u64, head_hash)?;
        out.flush()?;
        Ok(lines.len() as u64)
    }

    fn durable(&self) -> bool {
        false
    }

    fn change_token(&self) -> Result<u64, StoreError> {
        Ok(lock(&self.state).version)
    }

    fn entries_after(&self, after: u64, limit: usize) -> Result<Vec<(u64, String)>, StoreError> {
        let st = lock(&self.state);
        let start = usize::try_from(after).unwrap_or(usize::MAX);
        Ok(st
            .events
            .iter()
            .enumerate()
            .skip(start)
            .take(limit.min(crate::ENTRIES_PAGE_MAX))
            .map(|(i, (_, line))| (i as u64 + 1, line.clone()))
            .collect())
    }

    fn leases(&self) -> Result<crate::Leases, StoreError> {
        let st = lock(&self.state);
        Ok(crate::Leases {
            rows: st.leases.values().cloned().collect(),
            now_ms: tether_core::receipt::now_ms(),
        })
    }

    fn approvals_since(&self, after: u64) -> Result<(Vec<crate::ApprovalRow>, u64), StoreError> {
        let st = lock(&self.state);
        let mut rows: Vec<(u64, &crate::ApprovalRow)> = st
            .approvals
            .iter()
            .filter_map(|a| {
                let v = st
                    .approval_versions
                    .get(&a.approval_id)
                    .copied()
                    .unwrap_or(0);
                (v > after).then_some((v, a))
            })
            .collect();
        rows.sort_by_key(|(v, _)| *v);
        rows.truncate(crate::APPROVALS_SINCE_MAX);
        let newest = rows.last().map_or(after, |(v, _)| *v);
        Ok((rows.into_iter().map(|(_, a)| a.clone()).collect(), newest))
    }
}
