//! Approvals across processes: every endpoint on a store sees every
//! approval and vote made by any of them.
//!
//! **Owns:** [`Kernel::sync_approvals`], which reads the approval records
//! written since the table's position (`Store::approvals_since`, indexed by
//! the chain position of the write) and merges them. It runs from the
//! governed-stop watcher when the store's change token moves (at most every
//! [`APPROVAL_SYNC_MS`]), and before every approval verb and every approval
//! gate, so a retry after another process's quorum runs at once.
//! **Never belongs here:** the merge rule itself (`Approvals::merge`), votes,
//! the gate.
//! **Fail-closed rule:** a store that cannot be read leaves the table as it
//! is: an approval this process has not seen approved does not cover
//! anything; nothing is approved by a failed read.

use crate::kernel::Kernel;
use tether_core::receipt::now_ms;
use tether_store::APPROVALS_SINCE_MAX;

/// How often, at most, the watcher merges approval writes while the store
/// changes (well inside the one second an operator may wait).
pub const APPROVAL_SYNC_MS: u64 = 100;

/// Reads per sync at most ([`APPROVALS_SINCE_MAX`] records each); a reader
/// further behind catches up on the next.
const SYNC_ROUNDS_MAX: usize = 8;

impl Kernel {
    /// Merges the approval records other processes (and this one) wrote
    /// since the last merge. Bounded: at most [`SYNC_ROUNDS_MAX`] reads.
    pub(crate) fn sync_approvals(&self) {
        let Ok(mut after) = self.inner.approvals.lock().map(|t| t.seen) else {
            return;
        };
        for _ in 0..SYNC_ROUNDS_MAX {
            let (rows, newest) = match self.inner.store.approvals_since(after) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "approvals written elsewhere cannot be read now");
                    return;
                }
            };
            let Ok(mut t) = self.inner.approvals.lock() else {
                return;
            };
            t.merge(&rows, now_ms());
            t.seen = t.seen.max(newest);
            after = t.seen;
            if rows.len() < APPROVALS_SINCE_MAX {
                return;
            }
        }
    }
}
