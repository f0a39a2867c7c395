//! The kernel: devices, sessions, latches, revisions and the store, and the
//! constructor that restores them after a restart.

use crate::admit::idempotency::Index;
use crate::admit::session::Sessions;
use crate::driver::{Driver, InterlockState};
use crate::loader::{BindingSpec, Cell, DeviceSpec};
use crate::ApiError;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tether_core::catalogue::Verb;
use tether_core::manifest::Concurrency;
use tether_core::receipt::now_ms;
use tether_core::Code;
use tether_limits::budget::Ledger;
use tether_store::{Commit, CommitAck, EventDraft, Store, StoreError};

/// Settings of a kernel, passed explicitly (no hidden defaults at call sites).
#[derive(Clone, Debug)]
pub struct KernelConfig {
    /// Endpoint id shown in hello.
    pub endpoint_id: String,
    /// Default session lifetime without heartbeat, ms.
    pub session_ttl_ms: u64,
    /// Most live sessions at once.
    pub sessions_max: usize,
    /// Completed command ids kept in memory for replay checks.
    pub idempotency_cache_max: usize,
    /// Deadline of a command that names none, ms.
    pub default_deadline_ms: u64,
    /// How long an approval stays open (pending or approved and unused), ms.
    pub approval_ttl_ms: u64,
    /// The ControlPolicy as (name, Cedar text); `None` serves the built-in default.
    pub policy: Option<(String, String)>,
    /// Whether hardware and hybrid devices start armed. `true` (the
    /// standard): armed unless an operator disarmed them (durably, so a
    /// restart keeps a disarm). `false`: every start begins disarmed and an
    /// operator arms each device (`mhs.safety.arm`).
    pub hardware_armed_at_start: bool,
}

impl KernelConfig {
    /// The settings `tether serve` uses, written out so they are visible.
    pub fn standard(endpoint_id: &str) -> Self {
        Self {
            endpoint_id: endpoint_id.to_owned(),
            session_ttl_ms: 600_000,
            sessions_max: 10_000,
            idempotency_cache_max: 200_000,
            default_deadline_ms: 300_000,
            approval_ttl_ms: 3_600_000,
            policy: None,
            hardware_armed_at_start: true,
        }
    }
}

/// A principal (who is asking). Issue-4 adds tokens; today every caller is
/// the single local agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// Stable id.
    pub id: String,
    /// human, agent or service.
    pub kind: PrincipalKind,
    /// Whether this human holds the operator role.
    pub operator: bool,
}

/// Kinds of principal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrincipalKind {
    /// A person.
    Human,
    /// A model-controlled caller.
    Agent,
    /// Another program.
    Service,
}

impl PrincipalKind {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            PrincipalKind::Human => "human",
            PrincipalKind::Agent => "agent",
            PrincipalKind::Service => "service",
        }
    }
}

impl Principal {
    /// The single local caller when no principals are configured: an agent.
    pub fn local_agent() -> Self {
        Self {
            id: "local".into(),
            kind: PrincipalKind::Agent,
            operator: false,
        }
    }
    /// The same principal as seen through a surface a model drives (MCP):
    /// an agent, never an operator, whatever its token names. A model that
    /// holds a person's token acts as a model (DESIGN §1), for the policy
    /// (`Tether::Agent`), for approvals and for resets alike.
    #[must_use]
    pub fn model_controlled(self) -> Self {
        Self {
            id: self.id,
            kind: PrincipalKind::Agent,
            operator: false,
        }
    }
    /// Evidence form (never carries credentials).
    pub fn to_json(&self) -> Value {
        json!({"id": self.id, "kind": self.kind.as_str()})
    }
}

/// A running effectful operation.
pub(crate) struct RunningOp {
    pub device: usize,
    pub capability_id: String,
    pub cancel: crate::driver::CancelToken,
    pub stop_class: bool,
    pub session_id: Option<String>,
    /// The command this operation runs (lets a surface that only knows the
    /// `command_id` it sent find the operation to cancel).
    pub command_id: String,
}

/// The latch of one device.
#[derive(Debug, Clone, Default)]
pub(crate) struct LatchInfo {
    pub since_ms: u64,
    pub reason: String,
    pub durable: bool,
}

pub(crate) struct BindingRt {
    pub structure: jsonschema::Validator,
    pub full: jsonschema::Validator,
    pub class_structure: Option<jsonschema::Validator>,
    pub class_full: Option<jsonschema::Validator>,
    pub output: jsonschema::Validator,
}

/// Time kept back from a stop's budget or a caller's deadline to build and
/// send the answer: a twentieth of it, at most 5 ms.
pub(crate) fn answer_margin(budget: std::time::Duration) -> std::time::Duration {
    (budget / 20).min(std::time::Duration::from_millis(5))
}

pub(crate) struct DeviceRt {
    pub spec: DeviceSpec,
    pub driver: Arc<dyn Driver>,
    pub bindings: Vec<BindingRt>,
    pub latched: AtomicBool,
    pub latch: Mutex<LatchInfo>,
    /// Time of the newest latch or reset this process has applied (its own or
    /// one observed in the shared store); older store rows are ignored.
    pub latch_event_ms: AtomicU64,
    /// Whether hardware actuation is armed (step 6; always true for a
    /// simulated or replay device, whose calls move nothing physical).
    pub armed: AtomicBool,
    /// Time of the newest arming change this process applied; older rows
    /// in the store are ignored (a start that begins disarmed counts as one).
    pub arming_ms: AtomicU64,
    /// Counts every e-stop engaged on this device here (a trip while already
    /// latched included): a reset that sees it move keeps the latch.
    pub estop_epoch: AtomicU64,
    /// Native stops still running (a hung one keeps this above zero and
    /// blocks reset: `stop_path_pending`).
    pub stops_in_flight: std::sync::atomic::AtomicUsize,
    /// Whether the current latch's stop path has succeeded.
    pub stop_confirmed: AtomicBool,
    /// A stop path ran on this endpoint for a device that declares a terminal
    /// stop: its resets are refused for the rest of this endpoint's life.
    pub terminated: AtomicBool,
    /// Resources held because a physical call's finish could not be recorded:
    /// resource -> command ids awaiting reconciliation.
    pub unreconciled: Mutex<std::collections::BTreeMap<String, std::collections::BTreeSet<String>>>,
    pub revisions: HashMap<String, AtomicU64>,
    pub lock: tokio::sync::Mutex<()>,
}

impl DeviceRt {
    pub fn id(&self) -> &str {
        &self.spec.manifest.device_id
    }
    pub fn binding(&self, i: usize) -> (&BindingSpec, &BindingRt) {
        (&self.spec.bindings[i], &self.bindings[i])
    }
    pub fn revision(&self, resource: &str) -> u64 {
        self.revisions
            .get(resource)
            .map_or(0, |r| r.load(Ordering::SeqCst))
    }
    pub fn estop_budget_ms(&self) -> u64 {
        self.spec.manifest.safety.estop.latency_ms.unwrap_or(1000)
    }
    /// The part of the e-stop budget the stop path may use before the answer
    /// is made: the rest ([`answer_margin`]) writes the receipt, so the
    /// answer comes within the budget, not just after it.
    pub fn stop_path_budget(&self) -> std::time::Duration {
        let budget = std::time::Duration::from_millis(self.estop_budget_ms());
        budget.saturating_sub(answer_margin(budget))
    }
    /// Interlock readings for every declared interlock; unreported is unknown.
    pub fn interlock_readings(&self) -> Vec<(usize, InterlockState)> {
        let reported = self.driver.interlocks();
        self.spec
            .manifest
            .interlocks
            .iter()
            .enumerate()
            .map(|(i, il)| {
                let state = reported
                    .iter()
                    .find(|(id, _)| id == &il.id)
                    .map_or(InterlockState::Unknown, |(_, s)| *s);
                (i, state)
            })
            .collect()
    }
}

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
    pub policy: tether_policy::ControlPolicy,
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
}

/// The kernel. Cheap to clone (an `Arc`).
#[derive(Clone)]
pub struct Kernel {
    pub(crate) inner: Arc<Inner>,
}

/// Why a kernel could not start.
#[derive(Debug)]
pub enum StartError {
    /// A device has no driver.
    MissingDriver(String),
    /// A served schema does not compile.
    Schema {
        /// Device.
        device: String,
        /// Binding.
        capability_id: String,
        /// Message.
        message: String,
    },
    /// The store failed.
    Store(StoreError),
    /// The ControlPolicy does not load or validate.
    Policy(tether_policy::PolicyError),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::MissingDriver(d) => write!(f, "device `{d}`: no driver"),
            StartError::Schema {
                device,
                capability_id,
                message,
            } => {
                write!(f, "device `{device}`: binding `{capability_id}`: schema does not compile: {message}")
            }
            StartError::Store(e) => write!(f, "evidence store: {e}"),
            StartError::Policy(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for StartError {}

pub(crate) fn compile(schema: &Value) -> Result<jsonschema::Validator, String> {
    jsonschema::options()
        .should_validate_formats(false)
        .build(schema)
        .map_err(|e| e.to_string())
}

pub(crate) fn binding_rt(device: &str, b: &BindingSpec) -> Result<BindingRt, StartError> {
    let err = |message: String| StartError::Schema {
        device: device.to_owned(),
        capability_id: b.capability_id.clone(),
        message,
    };
    let stripped = tether_limits::strip_limited_bounds(&b.served_schema, &b.limits);
    let class_pair = match &b.class_schema {
        Some(c) => {
            let cs = tether_limits::strip_limited_bounds(c, &b.limits);
            Some((compile(&cs).map_err(err)?, compile(c).map_err(err)?))
        }
        None => None,
    };
    let (class_structure, class_full) = match class_pair {
        Some((s, f)) => (Some(s), Some(f)),
        None => (None, None),
    };
    Ok(BindingRt {
        structure: compile(&stripped).map_err(err)?,
        full: compile(&b.served_schema).map_err(err)?,
        class_structure,
        class_full,
        output: compile(&b.output_schema).map_err(err)?,
    })
}

impl Kernel {
    /// Builds a kernel over a loaded cell, its drivers (by device id) and a
    /// store, restoring latches, revisions, budgets and the idempotency index.
    ///
    /// # Errors
    /// A device without a driver, a schema that does not compile, a store failure.
    pub fn new(
        config: KernelConfig,
        cell: Cell,
        mut drivers: HashMap<String, Arc<dyn Driver>>,
        store: Arc<dyn Store>,
    ) -> Result<Self, StartError> {
        // Orphans first: their receipts must be in the idempotency index.
        crate::dispatch::evidence::reconcile_orphans(store.as_ref()).map_err(StartError::Store)?;
        let latches = store.latches().map_err(StartError::Store)?;
        let revisions = store.revisions().map_err(StartError::Store)?;
        let mut devices = Vec::new();
        let mut index = HashMap::new();
        for spec in cell.devices {
            let id = spec.manifest.device_id.clone();
            let driver = drivers
                .remove(&id)
                .ok_or_else(|| StartError::MissingDriver(id.clone()))?;
            let bindings = spec
                .bindings
                .iter()
                .map(|b| binding_rt(&id, b))
                .collect::<Result<Vec<_>, _>>()?;
            let mut revs = HashMap::new();
            for r in &spec.manifest.resources {
                let stored = revisions
                    .iter()
                    .find(|row| row.device_id == id && row.resource == r.id)
                    .map_or(0, |row| row.revision);
                revs.insert(r.id.clone(), AtomicU64::new(stored));
            }
            let newest = crate::safety::governed::newest_event(&latches, &id);
            let latch = match &newest {
                Some(ev) if ev.latched => LatchInfo {
                    since_ms: ev.at_ms,
                    reason: ev.reason.clone(),
                    durable: true,
                },
                _ => LatchInfo::default(),
            };
            let latched_at_start = newest.as_ref().is_some_and(|ev| ev.latched);
            let stored_arming = crate::safety::governed::arming_of(&latches, &id);
            let (armed_at_start, arming_ms) = if !spec.manifest.mode.is_physical() {
                (true, 0)
            } else if config.hardware_armed_at_start {
                stored_arming.unwrap_or((true, 0))
            } else {
                // Disarmed at every start: only a later arm counts.
                (false, now_ms())
            };
            let event_ms = newest.as_ref().map_or(0, |ev| ev.at_ms);
            index.insert(id.clone(), devices.len());
            devices.push(DeviceRt {
                spec,
                driver,
                bindings,
                latched: AtomicBool::new(latched_at_start),
                latch: Mutex::new(latch),
                latch_event_ms: AtomicU64::new(event_ms),
                armed: AtomicBool::new(armed_at_start),
                arming_ms: AtomicU64::new(arming_ms),
                estop_epoch: AtomicU64::new(0),
                stops_in_flight: std::sync::atomic::AtomicUsize::new(0),
                stop_confirmed: AtomicBool::new(false),
                terminated: AtomicBool::new(false),
                unreconciled: Mutex::new(std::collections::BTreeMap::new()),
                revisions: revs,
                lock: tokio::sync::Mutex::new(()),
            });
        }
        let (warm, complete) = store
            .receipt_digests(config.idempotency_cache_max)
            .map_err(StartError::Store)?;
        let mut idem = Index::new(config.idempotency_cache_max.max(1), complete);
        for (id, digest) in warm {
            idem.warm(id, digest);
        }
        let now = now_ms();
        let mut ledger = Ledger::new();
        let week_ms = 7 * 24 * 3_600_000;
        for row in store
            .budget_rows_since(now.saturating_sub(week_ms))
            .map_err(StartError::Store)?
        {
            if !row.released {
                // A journalled draw is replayed as drawn; a restart never refills a window.
                let window = row
                    .key
                    .split('/')
                    .nth(3)
                    .and_then(tether_limits::budget::Window::parse);
                if let Some(window) = window {
                    let _ =
                        ledger.record(&row.key, window, row.amount, row.ts_ms, &row.reservation_id);
                }
            }
        }
        let sessions = Sessions::new(config.sessions_max);
        let policy = crate::check::policy::load(&config, &devices).map_err(StartError::Policy)?;
        let approvals =
            crate::approvals::Approvals::restore(&store.approvals().map_err(StartError::Store)?);
        let kernel = Kernel {
            inner: Arc::new(Inner {
                config,
                devices,
                index,
                store,
                sessions: Mutex::new(sessions),
                idem: Mutex::new(idem),
                budgets: Mutex::new(ledger),
                ops: Mutex::new(HashMap::new()),
                finished_ops: Mutex::new(crate::dispatch::operations::Finished::default()),
                grants: Mutex::new(crate::safety::grants::Grants::default()),
                permits: Mutex::new(crate::check::permits::Permits::default()),
                policy,
                approvals: Mutex::new(approvals),
                started: Instant::now(),
                started_ms: now,
                stop_watch: crate::safety::governed::WatchHealth::default(),
            }),
        };
        let devices: Vec<Value> = kernel
            .inner
            .devices
            .iter()
            .map(|d| json!({"device_id": d.id(), "mode": d.spec.manifest.mode.as_str(), "latched": d.latched.load(Ordering::SeqCst), "origin": d.spec.origin}))
            .collect();
        // A latch restored from the store may come from a trip no endpoint
        // saw (`tether estop` while none ran): the approvals asked for before
        // it are withdrawn now, as a live e-stop withdraws them.
        let mut revoked = Vec::new();
        for d in &kernel.inner.devices {
            if d.latched.load(Ordering::SeqCst) {
                let since = d.latch.lock().map_or(u64::MAX, |l| l.since_ms);
                revoked.extend(kernel.revoke_approvals_before(d.id(), since));
            }
        }
        let revoked_ids: Vec<&str> = revoked.iter().map(|r| r.approval_id.as_str()).collect();
        kernel
            .inner
            .store
            .commit_blocking(Commit {
                events: vec![EventDraft {
                    kind: "endpoint.start".into(),
                    body: json!({"endpoint_id": kernel.inner.config.endpoint_id, "version": env!("CARGO_PKG_VERSION"), "devices": devices, "revoked_approvals": revoked_ids}).into(),
                }],
                approvals: revoked,
                ..Commit::default()
            })
            .map_err(StartError::Store)?;
        Ok(kernel)
    }

    pub(crate) fn device(&self, device_id: &str) -> Result<&DeviceRt, ApiError> {
        self.inner
            .index
            .get(device_id)
            .map(|&i| &self.inner.devices[i])
            .ok_or_else(|| {
                ApiError::new(
                    Code::DeviceUnknown,
                    format!("no device `{device_id}` is served here"),
                    json!({"device_id": device_id, "devices": self.device_ids()}),
                )
            })
    }

    pub(crate) fn unknown_device(&self, id: &str) -> ApiError {
        self.device(id)
            .err()
            .unwrap_or_else(|| ApiError::new(Code::DeviceUnknown, "unknown device", json!({})))
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
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.inner.store.submit(
            commit,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        rx.await.unwrap_or(Err(StoreError::Closed))
    }

    /// [`Kernel::commit`] for a commit the caller still needs afterwards (it
    /// takes a document back out of it): serialised from the borrow.
    pub(crate) async fn commit_ref(&self, commit: &Commit) -> Result<CommitAck, StoreError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.inner.store.submit_ref(
            commit,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        rx.await.unwrap_or(Err(StoreError::Closed))
    }

    /// Queues a commit without waiting (reads and other no-effect records).
    pub(crate) fn record(&self, commit: Commit) {
        self.inner.store.submit(
            commit,
            Box::new(|r| {
                if let Err(e) = r {
                    tracing::warn!(error = %e, "evidence record failed");
                }
            }),
        );
    }

    /// Effectful operations running on a device, as `(operation_id, capability_id)`.
    /// Shutdown: asks every running operation (stops excepted) to give up, so
    /// each ends with a recorded `cancelled` receipt instead of being cut off
    /// by the process's end. Answers how many were asked.
    pub fn cancel_all_operations(&self, why: &str) -> usize {
        (0..self.inner.devices.len())
            .map(|d| self.cancel_device_ops(d, why).len())
            .sum()
    }

    /// Operations still running (stops included).
    pub fn running_operations(&self) -> usize {
        self.inner.ops.lock().map(|ops| ops.len()).unwrap_or(0)
    }

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
