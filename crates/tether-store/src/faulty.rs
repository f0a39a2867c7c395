//! A store that fails on demand, for testing fail-closed behaviour.
//!
//! Wraps any [`Store`]; while `fail_writes` is set every commit fails with
//! [`StoreError::Io`] (nothing is written), while `fail_reads` is set every
//! read fails; while `hold_writes` is set every commit waits, as on a
//! database another process holds locked, and fails after a busy timeout;
//! while `hold_index` is set the read of the receipt digests waits (a large
//! store's index warm-up on a loaded machine). Used by the kernel's tests of fail-closed evidence; it is part
//! of the public surface so end users can run the same drills.

use crate::{
    BudgetRow, Commit, Done, LatchRow, OpenOp, ReceiptRow, RevisionRow, Store, StoreError,
};
use serde_json::Value;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// A store wrapper that fails on demand.
pub struct FaultyStore {
    inner: Arc<dyn Store>,
    /// While set, commits fail.
    pub fail_writes: AtomicBool,
    /// While set, reads fail.
    pub fail_reads: AtomicBool,
    /// Commits refused so far.
    pub refused_commits: AtomicU64,
    /// Receipt look-ups by `command_id` so far (failed ones included).
    pub receipt_reads: AtomicU64,
    /// While set, a commit waits (up to [`HOLD_WRITES_BUSY_TIMEOUT`], then
    /// fails as SQLite's busy timeout does); cleared, it goes through.
    pub hold_writes: AtomicBool,
    /// While set, a read of the receipt digests waits (up to
    /// [`HOLD_WRITES_BUSY_TIMEOUT`]), then reads.
    pub hold_index: AtomicBool,
    /// Commits waiting now because `hold_writes` is set.
    pub held_commits: AtomicU64,
}

/// How long a commit held by `hold_writes` (or a read held by
/// `hold_index`) waits before it fails (or reads).
pub const HOLD_WRITES_BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

impl FaultyStore {
    /// Wraps a store; nothing fails until told to.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            fail_writes: AtomicBool::new(false),
            fail_reads: AtomicBool::new(false),
            refused_commits: AtomicU64::new(0),
            receipt_reads: AtomicU64::new(0),
            hold_writes: AtomicBool::new(false),
            hold_index: AtomicBool::new(false),
            held_commits: AtomicU64::new(0),
        }
    }

    /// Waits while writes are held; `false` once the busy timeout passed.
    fn wait_for_writes(&self) -> bool {
        self.held_commits.fetch_add(1, Ordering::SeqCst);
        let through = wait_while(&self.hold_writes);
        self.held_commits.fetch_sub(1, Ordering::SeqCst);
        through
    }

    fn read_check(&self) -> Result<(), StoreError> {
        if self.fail_reads.load(Ordering::SeqCst) {
            return Err(StoreError::Io("injected read failure".into()));
        }
        Ok(())
    }
}

/// Waits while `flag` is set; `false` once [`HOLD_WRITES_BUSY_TIMEOUT`] passed.
fn wait_while(flag: &AtomicBool) -> bool {
    let t0 = std::time::Instant::now();
    while flag.load(Ordering::SeqCst) {
        if t0.elapsed() >= HOLD_WRITES_BUSY_TIMEOUT {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    true
}

impl Store for FaultyStore {
    fn submit_ref(&self, commit: &Commit, done: Done) {
        if self.fail_writes.load(Ordering::SeqCst) {
            self.refused_commits.fetch_add(1, Ordering::SeqCst);
            done(Err(StoreError::Io("injected write failure".into())));
            return;
        }
        if !self.wait_for_writes() {
            self.refused_commits.fetch_add(1, Ordering::SeqCst);
            done(Err(StoreError::Sqlite("database is locked".into())));
            return;
        }
        self.inner.submit_ref(commit, done);
    }
    fn receipt(&self, command_id: &str) -> Result<Option<ReceiptRow>, StoreError> {
        self.receipt_reads.fetch_add(1, Ordering::SeqCst);
        self.read_check()?;
        self.inner.receipt(command_id)
    }
    fn receipt_digests(&self, limit: usize) -> Result<(Vec<(String, String)>, bool), StoreError> {
        // Held first, checked after: a test may fail the read it released.
        wait_while(&self.hold_index);
        self.read_check()?;
        self.inner.receipt_digests(limit)
    }
    fn revisions(&self) -> Result<Vec<RevisionRow>, StoreError> {
        self.read_check()?;
        self.inner.revisions()
    }
    fn latches(&self) -> Result<Vec<LatchRow>, StoreError> {
        self.read_check()?;
        self.inner.latches()
    }
    fn latches_committed(&self) -> Result<Vec<LatchRow>, StoreError> {
        self.read_check()?;
        self.inner.latches_committed()
    }
    fn approvals(&self) -> Result<Vec<crate::ApprovalRow>, StoreError> {
        self.read_check()?;
        self.inner.approvals()
    }

    fn approvals_to_restore(
        &self,
        open_max: usize,
        closed_max: usize,
    ) -> Result<Vec<crate::ApprovalRow>, StoreError> {
        self.read_check()?;
        self.inner.approvals_to_restore(open_max, closed_max)
    }

    fn approvals_since(&self, after: u64) -> Result<(Vec<crate::ApprovalRow>, u64), StoreError> {
        self.read_check()?;
        self.inner.approvals_since(after)
    }

    fn approval(&self, approval_id: &str) -> Result<Option<crate::ApprovalRow>, StoreError> {
        self.read_check()?;
        self.inner.approval(approval_id)
    }

    fn open_ops(&self) -> Result<Vec<OpenOp>, StoreError> {
        self.read_check()?;
        self.inner.open_ops()
    }
    fn invocation(&self, invocation_id: &str) -> Result<Option<crate::InvocationRow>, StoreError> {
        self.read_check()?;
        self.inner.invocation(invocation_id)
    }
    fn budget_rows_since(&self, ts_ms: u64) -> Result<Vec<BudgetRow>, StoreError> {
        self.read_check()?;
        self.inner.budget_rows_since(ts_ms)
    }
    fn budget_used(&self, key: &str, from_ms: Option<u64>) -> Result<f64, StoreError> {
        self.read_check()?;
        self.inner.budget_used(key, from_ms)
    }
    fn chain_head(&self) -> Result<Option<(u64, String)>, StoreError> {
        self.read_check()?;
        self.inner.chain_head()
    }
    fn chain_tail(&self, n: usize) -> Result<Vec<Value>, StoreError> {
        self.read_check()?;
        self.inner.chain_tail(n)
    }
    fn export_chain(&self, out: &mut dyn std::io::Write) -> Result<u64, StoreError> {
        self.read_check()?;
        self.inner.export_chain(out)
    }
    fn durable(&self) -> bool {
        self.inner.durable()
    }
    fn change_token(&self) -> Result<u64, StoreError> {
        self.read_check()?;
        self.inner.change_token()
    }
    fn entries_after(&self, after: u64, limit: usize) -> Result<Vec<(u64, String)>, StoreError> {
        self.read_check()?;
        self.inner.entries_after(after, limit)
    }
    fn leases(&self) -> Result<crate::Leases, StoreError> {
        self.read_check()?;
        self.inner.leases()
    }
    fn wait_change(&self, timeout: std::time::Duration) {
        self.inner.wait_change(timeout);
    }
    fn change_poll_ms(&self) -> u64 {
        self.inner.change_poll_ms()
    }
}
