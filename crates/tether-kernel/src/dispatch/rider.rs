//! Evidence a surface hands the kernel to record in the same durable commit
//! as a command's first one.
//!
//! The REST gateway must make an invocation durable before it answers 202.
//! Writing that record as its own commit costs a second trip through the
//! store for every invocation; instead the record *rides* in the command's
//! first commit — the admission commit of a physical or budgeted call (so it
//! is durable before dispatch), otherwise the commit that records the
//! receipt or the refusal. A command that does not reach a commit soon (a
//! long simulated motion commits only when it ends) would hold the 202 back,
//! so the surface may instead [`Rider::submit_alone`]: whichever side takes
//! the rider first writes it, exactly once. Only the kernel makes a rider
//! (`Kernel::invocation_rider`), so a surface never composes chain entries.
//!
//! Ordering: the rider's events go before the command's own in the commit,
//! and a rider submitted alone is queued while its lock is held, so the
//! kernel's later commit (which finds the slot empty) is queued after it.
//! Either way the chain records the invocation before what the command did.

use crate::EvidenceFault;
use std::sync::{Arc, Mutex, MutexGuard};
use tether_store::{Commit, CommitAck, Store, StoreError};
use tokio::sync::{oneshot, Notify};

/// The outcome the surface waits for: the rider's commit became durable
/// (`Ok`) or failed (`Err`, the store's reason).
pub type RiderOutcome = Result<(), EvidenceFault>;

/// A record waiting to ride in a command's first commit. Cheap to clone (one
/// shared slot).
#[derive(Clone)]
pub struct Rider {
    inner: Arc<Inner>,
}

struct Inner {
    /// Where a rider submitted alone goes.
    store: Arc<dyn Store>,
    /// The parts and who to tell, until someone takes them.
    slot: Mutex<Option<(Commit, oneshot::Sender<RiderOutcome>)>>,
    /// Signalled when the kernel takes the rider into a commit of its own.
    boarded: Notify,
}

impl std::fmt::Debug for Rider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rider")
            .field("waiting", &self.lock().is_some())
            .finish()
    }
}

/// A rider taken into a kernel commit: reports that commit's outcome.
pub(crate) struct Boarded(oneshot::Sender<RiderOutcome>);

impl Boarded {
    /// Tells the surface how the commit the rider was in ended.
    pub(crate) fn land(self, outcome: &Result<CommitAck, StoreError>) {
        // The surface may have stopped waiting (its client went away).
        let _ = self.0.send(
            outcome
                .as_ref()
                .map(|_| ())
                .map_err(|e| EvidenceFault(e.to_string())),
        );
    }

    /// [`Boarded::land`] for a commit that may not have carried a rider.
    pub(crate) fn land_opt(boarded: Option<Self>, outcome: &Result<CommitAck, StoreError>) {
        if let Some(b) = boarded {
            b.land(outcome);
        }
    }
}

impl Rider {
    /// A rider carrying `parts` (events and rows of the surface's own) to
    /// `store`, and the receiver that learns when they are durable.
    pub(crate) fn new(
        store: Arc<dyn Store>,
        parts: Commit,
    ) -> (Self, oneshot::Receiver<RiderOutcome>) {
        let (tx, rx) = oneshot::channel();
        let rider = Self {
            inner: Arc::new(Inner {
                store,
                slot: Mutex::new(Some((parts, tx))),
                boarded: Notify::new(),
            }),
        };
        (rider, rx)
    }

    fn lock(&self) -> MutexGuard<'_, Option<(Commit, oneshot::Sender<RiderOutcome>)>> {
        // Take-or-leave of one Option: no invariant a panicking holder could
        // break half-way, so a poisoned lock is still usable.
        self.inner.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Completes once the kernel has taken the rider into one of its
    /// commits (immediately if it already has).
    pub async fn boarded(&self) {
        self.inner.boarded.notified().await;
    }

    /// If nobody has taken the rider yet, queues it as a commit of its own
    /// and answers `true`; its receiver then learns the outcome. `false`: it
    /// is (or was) in a kernel commit already.
    pub fn submit_alone(&self) -> bool {
        let mut slot = self.lock();
        let Some((parts, tx)) = slot.take() else {
            return false;
        };
        // Queued under the lock: a kernel commit built after this finds the
        // slot empty and is queued behind the rider.
        self.inner.store.submit(
            parts,
            Box::new(move |r| {
                let _ = tx.send(r.map(|_| ()).map_err(|e| EvidenceFault(e.to_string())));
            }),
        );
        true
    }

    /// Takes the rider into `commit`, in front of the commit's own events,
    /// if it is still waiting.
    pub(crate) fn board(&self, commit: &mut Commit) -> Option<Boarded> {
        let (parts, tx) = self.lock().take()?;
        prepend(commit, parts);
        self.inner.boarded.notify_one();
        Some(Boarded(tx))
    }

    /// [`Rider::board`] keeping a copy of the rider's parts, for a commit
    /// the store may refuse for a reason of its own (a budget draw over its
    /// cap): the rider can then be put back to ride the next commit.
    pub(crate) fn board_keeping(&self, commit: &mut Commit) -> Option<Kept> {
        let (parts, tx) = self.lock().take()?;
        let copy = parts.clone();
        prepend(commit, parts);
        self.inner.boarded.notify_one();
        Some(Kept {
            rider: self.clone(),
            parts: copy,
            boarded: Boarded(tx),
        })
    }
}

/// A rider boarded with [`Rider::board_keeping`].
pub(crate) struct Kept {
    rider: Rider,
    parts: Commit,
    boarded: Boarded,
}

impl Kept {
    /// Tells the surface how the commit ended, as [`Boarded::land`].
    pub(crate) fn land(self, outcome: &Result<CommitAck, StoreError>) {
        self.boarded.land(outcome);
    }

    /// The commit stored nothing: the rider waits again for the next
    /// commit of its command (or to be submitted alone).
    pub(crate) fn put_back(self) {
        let mut slot = self.rider.lock();
        if slot.is_none() {
            *slot = Some((self.parts, self.boarded.0));
        }
    }
}

/// `parts` in front of `commit`: events first (the commit's references to
/// its events shift by as many), rows added.
fn prepend(commit: &mut Commit, parts: Commit) {
    let Commit {
        events,
        receipts,
        revisions,
        latches,
        budget_draws,
        budget_releases,
        open_ops,
        closed_ops,
        approvals,
        invocations,
        invocation_refs,
        leases,
    } = parts;
    let shift = events.len();
    for r in &mut commit.receipts {
        r.event += shift;
    }
    for r in &mut commit.invocation_refs {
        r.event += shift;
    }
    let own = std::mem::replace(&mut commit.events, events);
    commit.events.extend(own);
    // The rider's own references index its own events, which now come
    // first: unchanged.
    commit.receipts.extend(receipts);
    commit.invocation_refs.extend(invocation_refs);
    commit.revisions.extend(revisions);
    commit.latches.extend(latches);
    commit.budget_draws.extend(budget_draws);
    commit.budget_releases.extend(budget_releases);
    commit.open_ops.extend(open_ops);
    commit.closed_ops.extend(closed_ops);
    commit.approvals.extend(approvals);
    commit.invocations.extend(invocations);
    commit.leases.extend(leases);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tether_store::{EventDraft, InvocationRow, ReceiptRef};

    fn event(kind: &str) -> EventDraft {
        EventDraft {
            kind: kind.into(),
            body: json!({"k": kind}).into(),
        }
    }

    fn rider_parts() -> Commit {
        Commit {
            events: vec![event("invocation.accepted")],
            invocations: vec![InvocationRow {
                invocation_id: "inv_1".into(),
                info: json!({"status": "pending"}).into(),
            }],
            ..Commit::default()
        }
    }

    #[test]
    fn a_boarded_rider_goes_first_and_the_receipt_reference_follows_its_entry() {
        let store = Arc::new(tether_store::MemoryStore::new());
        let (rider, _rx) = Rider::new(store, rider_parts());
        let mut commit = Commit {
            events: vec![event("command.receipt")],
            receipts: vec![ReceiptRef {
                command_id: "c1".into(),
                input_digest: "d".into(),
                event: 0,
            }],
            ..Commit::default()
        };
        assert!(rider.board(&mut commit).is_some());
        let kinds: Vec<_> = commit.events.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, ["invocation.accepted", "command.receipt"]);
        assert_eq!(commit.receipts[0].event, 1, "still the receipt's entry");
        assert_eq!(commit.invocations.len(), 1);
        // Taken once: a second commit of the same command carries nothing.
        let mut later = Commit::default();
        assert!(rider.board(&mut later).is_none());
        assert!(later.events.is_empty());
    }

    #[test]
    fn a_rider_is_written_once_whoever_takes_it() {
        let store = Arc::new(tether_store::MemoryStore::new());
        let (rider, rx) = Rider::new(store.clone(), rider_parts());
        assert!(rider.submit_alone());
        assert!(!rider.submit_alone(), "never twice");
        let mut commit = Commit::default();
        assert!(
            rider.board(&mut commit).is_none(),
            "nor also in a kernel commit"
        );
        assert_eq!(rx.blocking_recv().map_err(|_| "no outcome"), Ok(Ok(())));
        let head = store.chain_head().ok().flatten().map(|(seq, _)| seq);
        assert_eq!(head, Some(1), "one entry: the rider's");
    }
}
