//! The kernel object: [`Kernel`], the state it shares ([`Inner`]), the door
//! to the store and the device look-up every stage uses.
//!
//! **Owns:** [`Kernel`] and [`Inner`]; committing to the store (waiting,
//! or only recording); device look-up by id; the running-operations view.
//! The rest of the object lives beside it: `principal.rs` (who asks),
//! `device.rs` (a device at run time, its compiled schemas and latch),
//! `start.rs` (settings, start errors, `Kernel::new` and the restore),
//! `deferred.rs` (a start on a store that cannot be opened yet), `fleet.rs`
//! (the leases: this endpoint among the others on one store).
//! **Never belongs here:** any step of the evaluation order (`order.rs` and
//! the stage folders), SQL (`tether-store`).
//! **Fail-closed rule:** a commit the store drops without answering is a
//! store failure ([`StoreError::Closed`]), never a success; an unknown device
//! id is `DEVICE.UNKNOWN`, never a default device.

pub(crate) mod deferred;
mod device;
pub(crate) mod fleet;
mod principal;
mod start;

pub use deferred::{
    DeferredStart, OpenStore, StoreOpener, START_RESTORE_READ_MS, START_RESTORE_WAIT_MS,
};
pub(crate) use device::{
    answer_margin, binding_rt, compile, BindingRt, DeviceRt, LatchInfo, RunningOp,
    ANSWER_MARGIN_MS_MAX, ESTOP_BUDGET_MS_DEFAULT,
};
pub use fleet::{holder_gone, this_host, FleetLease, FLEET_LEASE_MS_DEFAULT};
pub use principal::{Principal, PrincipalKind};
pub use start::{Compiled, KernelConfig, StartError};

use crate::admit::idempotency::Index;
use crate::admit::session::Sessions;
use crate::loader::BindingSpec;
use crate::ApiError;
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tether_core::catalogue::Verb;
use tether_core::manifest::Concurrency;
use tether_core::Code;
use tether_limits::budget::Ledger;
use tether_store::{Commit, CommitAck, Store, StoreError};

/// What every clone of a [`Kernel`] shares.
pub(crate) struct Inner {
    pub config: KernelConfig,
    pub devices: Vec<DeviceRt>,
    pub index: HashMap<String, usize>,
    pub store: Arc<dyn Store>,
    pub sessions: Mutex<Sessions>,
    pub idem: Mutex<Index>,
    pub budgets: Mutex<Ledger>,
    pub ops: Mutex<HashMap<String, RunningOp>>,
    /// Outstanding permits.
    pub permits: Mutex<crate::check::permits::Permits>,
    /// The ControlPolicy (Cedar), validated for this cell.
    /// Loaded once per [`Compiled`] cell, shared by the kernels built from it.
    pub policy: Arc<tether_policy::ControlPolicy>,
    /// Approvals (restored from the store at start).
    pub approvals: Mutex<crate::approvals::Approvals>,
    /// Outstanding single-use safe-place grants.
    pub grants: Mutex<crate::safety::grants::Grants>,
    /// Recently finished operations (bounded), for `mhs.operations.get`.
    pub finished_ops: Mutex<crate::dispatch::operations::Finished>,
    pub started: Instant,
    pub started_ms: u64,
    /// Governed-stop watcher health.
    pub stop_watch: crate::safety::governed::WatchHealth,
    /// What the awaited commits and the health probe say of the store's writes.
    pub store_health: crate::safety::health::StoreHealth,
    /// Whether the store is open (an endpoint started without it serves
    /// tripped until it opens: `deferred.rs`).
    pub store_open: deferred::OpenState,
    /// This process's id on the store (the holder of its leases, written
    /// into its open operations).
    pub instance: String,
    /// What this endpoint knows of the fleet.
    pub fleet: fleet::FleetState,
    /// What `GET /metrics` shows (`crate::meters`): atomics only.
    pub meters: crate::meters::Meters,
    /// `unknown` receipts the store did not take yet (`dispatch/owed.rs`).
    pub owed: crate::dispatch::owed::Owed,
}

/// The kernel. Cheap to clone (an `Arc`).
#[derive(Clone)]
pub struct Kernel {
    pub(crate) inner: Arc<Inner>,
}

impl Kernel {
    pub(crate) fn device(&self, device_id: &str) -> Result<&DeviceRt, ApiError> {
        self.inner
            .index
            .get(device_id)
            .map(|&i| &self.inner.devices[i])
            .ok_or_else(|| {
                ApiError::new(
                    Code::DeviceUnknown,
                    format!(
                        "no device `{}` is served here",
                        tether_core::echo::id(device_id)
                    ),
                    json!({"device_id": tether_core::echo::id(device_id), "devices": self.device_ids()}),
                )
            })
    }

    pub(crate) fn unknown_device(&self, id: &str) -> ApiError {
        self.device(id)
            .err()
            .unwrap_or_else(|| ApiError::new(Code::DeviceUnknown, "unknown device", json!({})))
    }

    /// The installed trace exporter, if any (`KernelConfig::tracer`): the
    /// surfaces record their request spans through it.
    #[must_use]
    pub fn tracer(&self) -> Option<&crate::trace::TraceSink> {
        self.inner.config.tracer.as_ref()
    }

    pub(crate) fn device_index(&self, device_id: &str) -> Option<usize> {
        self.inner.index.get(device_id).copied()
    }

    /// Ids of the served devices, in load order.
    pub fn device_ids(&self) -> Vec<String> {
        self.inner
            .devices
            .iter()
            .map(|d| d.id().to_owned())
            .collect()
    }

    /// Commits and waits (asynchronously) until durable.
    pub(crate) async fn commit(&self, commit: Commit) -> Result<CommitAck, StoreError> {
        // Given up to the store, which moves what it can instead of copying.
        self.await_commit(|done| self.inner.store.submit(commit, done))
            .await
    }

    /// [`Kernel::commit`] for a wait with no bound of its own (a command's
    /// admission and receipt): an idle store may apply it on this thread
    /// ([`Store::submit_waiting`]), sparing two thread wake-ups. Never for
    /// a commit awaited under a deadline.
    pub(crate) async fn commit_waiting(&self, commit: Commit) -> Result<CommitAck, StoreError> {
        self.await_commit(|done| self.inner.store.submit_waiting(commit, done))
            .await
    }

    /// [`Kernel::commit_waiting`] for a commit the caller still needs
    /// afterwards (it takes a document back out of it): serialised from the
    /// borrow.
    pub(crate) async fn commit_ref_waiting(
        &self,
        commit: &Commit,
    ) -> Result<CommitAck, StoreError> {
        self.await_commit(|done| self.inner.store.submit_ref_waiting(commit, done))
            .await
    }

    /// Hands a commit to the store with `submit` and waits for its answer,
    /// timed as the command's `tether.commit` stage (the submit included: an
    /// idle store may apply it right there) and kept in the door's books.
    async fn await_commit(
        &self,
        submit: impl FnOnce(tether_store::Done),
    ) -> Result<CommitAck, StoreError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let t0 = self.submitting();
        let stage = crate::stages::enter(crate::stages::Stage::Commit);
        submit(Box::new(move |r| {
            let _ = tx.send(r);
        }));
        let r = rx.await.unwrap_or(Err(StoreError::Closed));
        drop(stage);
        self.committed(t0, &r);
        r
    }

    /// The door's bookkeeping before a commit is handed over: the queue
    /// depth `GET /metrics` shows, and the start of its latency.
    fn submitting(&self) -> Instant {
        self.inner.meters.submitted();
        Instant::now()
    }

    /// The door's bookkeeping once the store answered an awaited commit:
    /// the store's health, the queue depth, the commit's latency (a durable
    /// one only: a failure is not a commit latency).
    fn committed(&self, t0: Instant, r: &Result<CommitAck, StoreError>) {
        let meters = &self.inner.meters;
        crate::meters::answered(&meters.store_in_flight);
        if r.is_ok() {
            meters.commit.observe(t0.elapsed());
        }
        self.inner.store_health.observe(r);
    }

    /// Queues a commit without waiting (reads and other no-effect records).
    pub(crate) fn record(&self, commit: Commit) {
        // The queue depth's own counter, not the kernel: the last handle to
        // the kernel is never dropped on the store's writer thread.
        self.inner.meters.submitted();
        let in_flight = Arc::clone(&self.inner.meters.store_in_flight);
        self.inner.store.submit(
            commit,
            Box::new(move |r| {
                crate::meters::answered(&in_flight);
                if let Err(e) = r {
                    tracing::warn!(error = %e, "evidence record failed");
                }
            }),
        );
    }

    /// Shutdown: asks every running operation (stops and non-abortable ones
    /// excepted: those end within their bound) to give up, so each ends with
    /// a recorded `cancelled` receipt instead of being cut off by the
    /// process's end. Answers how many were asked.
    pub fn cancel_all_operations(&self, why: &str) -> usize {
        (0..self.inner.devices.len())
            .map(|d| self.cancel_device_ops(d, why).len())
            .sum()
    }

    /// Operations still running (stops included).
    pub fn running_operations(&self) -> usize {
        self.inner.ops.lock().map(|ops| ops.len()).unwrap_or(0)
    }

    /// Effectful operations running on a device, as `(operation_id, capability_id)`.
    pub(crate) fn running_on(&self, device: usize) -> Vec<(String, String)> {
        self.inner
            .ops
            .lock()
            .map(|ops| {
                ops.iter()
                    .filter(|(_, op)| op.device == device && !op.stop_class)
                    .map(|(id, op)| (id.clone(), op.capability_id.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether a verb is effectful for the latch.
    pub(crate) fn is_effectful(b: &BindingSpec) -> bool {
        !(b.is_read() || b.is_stop() || b.achieves_safe_state)
    }

    /// Seconds since start (for status).
    pub fn uptime_s(&self) -> u64 {
        self.inner.started.elapsed().as_secs()
    }

    pub(crate) fn concurrency(b: &BindingSpec) -> Concurrency {
        if b.verb == Verb::Read || b.is_stop() {
            Concurrency::Shared
        } else {
            b.concurrency
        }
    }
}
