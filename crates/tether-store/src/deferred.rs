//! A store that is not open yet: the seat an endpoint serves from while its
//! evidence store cannot be opened or written at start-up.
//!
//! Until [`DeferredStore::open_with`] seats the real store, every commit
//! fails with [`StoreError::Io`] naming why the store is not open (nothing is
//! written, and the error is retryable) and every read fails the same way;
//! from then on every call goes to the seated store. A store is seated once
//! and never unseated: a fault of the real store after that is its own to
//! report, as on any endpoint.

use crate::{
    ApprovalRow, BudgetRow, Commit, Done, InvocationRow, LatchRow, OpenOp, ReceiptRow, RevisionRow,
    Store, StoreError,
};
use serde_json::Value;
use std::sync::{Arc, Mutex, OnceLock};

/// A store seat that fails every call until a real store is seated.
pub struct DeferredStore {
    seated: OnceLock<Arc<dyn Store>>,
    /// Why the real store is not open (the last attempt's error).
    why: Mutex<String>,
    durable: bool,
}

impl std::fmt::Debug for DeferredStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeferredStore")
            .field("open", &self.is_open())
            .field("why", &self.why())
            .finish_non_exhaustive()
    }
}

impl DeferredStore {
    /// An empty seat; `durable` is what [`Store::durable`] answers for the
    /// store that will be seated (it is asked before that store exists).
    pub fn new(why: impl Into<String>, durable: bool) -> Self {
        Self {
            seated: OnceLock::new(),
            why: Mutex::new(why.into()),
            durable,
        }
    }

    /// Seats the real store; `false` if one was seated already (the first
    /// stays: a seated store is never replaced).
    pub fn open_with(&self, store: Arc<dyn Store>) -> bool {
        self.seated.set(store).is_ok()
    }

    /// Whether a real store is seated.
    pub fn is_open(&self) -> bool {
        self.seated.get().is_some()
    }

    /// Notes why the last attempt to open the real store failed.
    pub fn note_failure(&self, why: impl Into<String>) {
        if let Ok(mut w) = self.why.lock() {
            *w = why.into();
        }
    }

    /// Why the real store is not open (the last attempt's error).
    pub fn why(&self) -> String {
        self.why
            .lock()
            .map(|w| w.clone())
            .unwrap_or_else(|_| "the evidence store is not open".into())
    }

    /// Hands a commit to the seated store, or answers `done` with why
    /// there is none yet.
    fn seated_or_refuse(&self, done: Done, submit: impl FnOnce(&dyn Store, Done)) {
        match self.store() {
            Ok(s) => submit(s.as_ref(), done),
            Err(e) => done(Err(e)),
        }
    }

    fn store(&self) -> Result<&Arc<dyn Store>, StoreError> {
        self.seated.get().ok_or_else(|| {
            StoreError::Io(format!("the evidence store is not open: {}", self.why()))
        })
    }
}

impl Store for DeferredStore {
    fn submit(&self, commit: Commit, done: Done) {
        self.seated_or_refuse(done, |s, done| s.submit(commit, done));
    }
    fn submit_ref(&self, commit: &Commit, done: Done) {
        self.seated_or_refuse(done, |s, done| s.submit_ref(commit, done));
    }
    fn submit_waiting(&self, commit: Commit, done: Done) {
        self.seated_or_refuse(done, |s, done| s.submit_waiting(commit, done));
    }
    fn submit_ref_waiting(&self, commit: &Commit, done: Done) {
        self.seated_or_refuse(done, |s, done| s.submit_ref_waiting(commit, done));
    }
    fn writer_stats(&self) -> Option<crate::WriterStats> {
        self.seated.get().and_then(|s| s.writer_stats())
    }
    fn receipt(&self, command_id: &str) -> Result<Option<ReceiptRow>, StoreError> {
        self.store()?.receipt(command_id)
    }
    fn receipt_digests(&self, limit: usize) -> Result<(Vec<(String, String)>, bool), StoreError> {
        self.store()?.receipt_digests(limit)
    }
    fn revisions(&self) -> Result<Vec<RevisionRow>, StoreError> {
        self.store()?.revisions()
    }
    fn latches(&self) -> Result<Vec<LatchRow>, StoreError> {
        self.store()?.latches()
    }
    fn latches_committed(&self) -> Result<Vec<LatchRow>, StoreError> {
        self.store()?.latches_committed()
    }
    fn open_ops(&self) -> Result<Vec<OpenOp>, StoreError> {
        self.store()?.open_ops()
    }
    fn approvals(&self) -> Result<Vec<ApprovalRow>, StoreError> {
        self.store()?.approvals()
    }
    fn approvals_to_restore(
        &self,
        open_max: usize,
        closed_max: usize,
    ) -> Result<Vec<ApprovalRow>, StoreError> {
        self.store()?.approvals_to_restore(open_max, closed_max)
    }
    fn approvals_since(&self, after: u64) -> Result<(Vec<ApprovalRow>, u64), StoreError> {
        self.store()?.approvals_since(after)
    }
    fn approval(&self, approval_id: &str) -> Result<Option<ApprovalRow>, StoreError> {
        self.store()?.approval(approval_id)
    }
    fn invocation(&self, invocation_id: &str) -> Result<Option<InvocationRow>, StoreError> {
        self.store()?.invocation(invocation_id)
    }
    fn budget_rows_since(&self, ts_ms: u64) -> Result<Vec<BudgetRow>, StoreError> {
        self.store()?.budget_rows_since(ts_ms)
    }
    fn chain_head(&self) -> Result<Option<(u64, String)>, StoreError> {
        self.store()?.chain_head()
    }
    fn chain_tail(&self, n: usize) -> Result<Vec<Value>, StoreError> {
        self.store()?.chain_tail(n)
    }
    fn export_chain(&self, out: &mut dyn std::io::Write) -> Result<u64, StoreError> {
        self.store()?.export_chain(out)
    }
    fn durable(&self) -> bool {
        self.seated.get().map_or(self.durable, |s| s.durable())
    }
    fn change_token(&self) -> Result<u64, StoreError> {
        self.store()?.change_token()
    }
    fn entries_after(&self, after: u64, limit: usize) -> Result<Vec<(u64, String)>, StoreError> {
        self.store()?.entries_after(after, limit)
    }
    fn leases(&self) -> Result<crate::Leases, StoreError> {
        self.store()?.leases()
    }
    fn wait_change(&self, timeout: std::time::Duration) {
        match self.seated.get() {
            Some(s) => s.wait_change(timeout),
            None => std::thread::sleep(timeout),
        }
    }
    fn change_poll_ms(&self) -> u64 {
        self.seated.get().map_or(2, |s| s.change_poll_ms())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EventDraft, MemoryStore};
    use serde_json::json;

    fn one_event() -> Commit {
        Commit {
            events: vec![EventDraft {
                kind: "test.event".into(),
                body: json!({"n": 1}).into(),
            }],
            ..Commit::default()
        }
    }

    #[test]
    fn an_empty_seat_refuses_every_call_naming_why_and_a_seated_store_answers() {
        let seat = DeferredStore::new("disk full", true);
        let err = seat.commit_blocking(one_event()).unwrap_err();
        assert!(err.is_retryable(), "{err}");
        assert!(err.to_string().contains("disk full"), "{err}");
        assert!(seat.latches().is_err());
        assert!(seat.change_token().is_err());
        seat.note_failure("read-only file system");
        assert!(seat
            .chain_head()
            .unwrap_err()
            .to_string()
            .contains("read-only"));
        let memory: Arc<dyn Store> = Arc::new(MemoryStore::new());
        assert!(seat.open_with(memory.clone()));
        assert!(!seat.open_with(Arc::new(MemoryStore::new())), "seated once");
        let ack = seat.commit_blocking(one_event()).unwrap();
        assert_eq!(ack.last_seq, 1);
        assert_eq!(memory.chain_head().unwrap().map(|h| h.0), Some(1));
        assert!(!seat.durable(), "the seated store answers");
    }
}
