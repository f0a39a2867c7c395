//! Start-up: [`KernelConfig`], [`StartError`] and [`Kernel::new`], which
//! restores what a restart must not lose before the kernel answers anything;
//! [`Compiled`], the read-only part of a kernel (schemas, ControlPolicy)
//! built once and shared by the kernels [`Kernel::from_compiled`] builds.
//!
//! **Owns:** the restore order — orphaned commands reconciled first (their
//! receipts must be in the idempotency index), then each device with its
//! latch, arming and revisions, the idempotency index, the budget ledger,
//! the ControlPolicy and the approvals — and the `endpoint.start` entry,
//! which also withdraws the approvals asked for before a restored latch.
//! **Never belongs here:** loading manifests (`loader/`), serving
//! (`tether-server`), anything a request does.
//! **Fail-closed rule:** a store that cannot be read, a device without a
//! driver, a schema that does not compile or a policy that does not validate
//! stops the start; a restored latch stays latched until a reset; a
//! journalled budget draw is replayed as drawn (a restart never refills a
//! window).

use crate::admit::idempotency::Index;
use crate::admit::session::Sessions;
use crate::approvals::Approvals;
use crate::driver::Driver;
use crate::kernel::{binding_rt, BindingRt, DeviceRt, Inner, Kernel, LatchInfo};
use crate::loader::{Cell, DeviceSpec};
use crate::safety::governed;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tether_core::receipt::now_ms;
use tether_limits::budget::{Ledger, Window, RETENTION_MS};
use tether_policy::ControlPolicy;
use tether_store::{Commit, EventDraft, LatchRow, RevisionRow, Store, StoreError};

/// How far back journalled budget draws are replayed at start, ms.
const BUDGET_REPLAY_MS: u64 = 7 * 24 * 3_600_000;
// Every draw a budget window still counts is replayed after a restart.
const _: () = assert!(BUDGET_REPLAY_MS >= RETENTION_MS);

/// Settings of a kernel, passed explicitly (no hidden defaults at call sites).
#[derive(Clone, Debug)]
pub struct KernelConfig {
    /// Endpoint id shown in hello.
    pub endpoint_id: String,
    /// Default session lifetime without heartbeat, ms.
    pub session_ttl_ms: u64,
    /// Most live sessions at once.
    pub sessions_max: usize,
    /// Completed command ids kept in memory for replay checks (an id
    /// beyond it is looked up in the store: replayed, never run again).
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
    /// Open approvals (pending, or approved and unused) on the endpoint, at
    /// most ([`crate::bounds`]).
    pub approvals_open_max: usize,
    /// Open approvals one principal may hold, at most; at most half of
    /// `approvals_open_max`.
    pub approvals_open_per_principal_max: usize,
    /// Outstanding permits on the endpoint, at most.
    pub permits_max: usize,
    /// Outstanding permits of one principal, at most; at most half of
    /// `permits_max`.
    pub permits_per_principal_max: usize,
    /// Longest free text (reasons) a caller may hand the kernel, characters:
    /// longer is refused, except an e-stop's or a disarm's, which is cut.
    pub text_chars_max: usize,
    /// This host's name, as other endpoints of the fleet are told it.
    pub host: String,
    /// Whether this endpoint takes leases on its store (its own, and one
    /// per `hardware` or `hybrid` device: `kernel/fleet.rs`). Off only for
    /// kernels that share a process and a store in tests.
    pub claim_devices: bool,
    /// How long the leases last without a renewal, ms: an endpoint that
    /// dies leaves its devices to another after at most this.
    pub fleet_lease_ms: u64,
    /// How long a start waits for a device another endpoint owns before
    /// it refuses, ms (0: refuse at once).
    pub wait_for_devices_ms: u64,
    /// The governed stop's guaranteed bound, ms: an endpoint that cannot
    /// read the stop for longer aborts its physical calls and refuses new
    /// ones until it can.
    pub stop_bound_ms: u64,
    /// Where trace spans go (`crate::trace`): the OTLP exporter when
    /// `[telemetry] otlp_endpoint` is set; `None` records no span.
    pub tracer: Option<crate::trace::TraceSink>,
}

impl KernelConfig {
    /// The settings `tether serve` uses, written out so they are visible.
    pub fn standard(endpoint_id: &str) -> Self {
        Self {
            endpoint_id: endpoint_id.to_owned(),
            session_ttl_ms: 600_000,
            sessions_max: 10_000,
            idempotency_cache_max: crate::bounds::IDEMPOTENCY_CACHE_MAX_DEFAULT,
            default_deadline_ms: 300_000,
            approval_ttl_ms: 3_600_000,
            policy: None,
            hardware_armed_at_start: true,
            approvals_open_max: crate::bounds::APPROVALS_OPEN_MAX_DEFAULT,
            approvals_open_per_principal_max:
                crate::bounds::APPROVALS_OPEN_PER_PRINCIPAL_MAX_DEFAULT,
            permits_max: crate::bounds::PERMITS_MAX_DEFAULT,
            permits_per_principal_max: crate::bounds::PERMITS_PER_PRINCIPAL_MAX_DEFAULT,
            text_chars_max: crate::bounds::TEXT_CHARS_MAX_DEFAULT,
            host: crate::kernel::fleet::this_host(),
            claim_devices: true,
            fleet_lease_ms: crate::kernel::fleet::FLEET_LEASE_MS_DEFAULT,
            wait_for_devices_ms: 0,
            stop_bound_ms: crate::safety::governed::STOP_BOUND_MS_DEFAULT,
            tracer: None,
        }
    }
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
    /// A bound per caller is out of range, or lets one principal reach the
    /// endpoint's bound alone (each defect, naming its config key).
    Bounds(Vec<String>),
    /// A `hardware` or `hybrid` device is owned by another live endpoint of
    /// the fleet (its lease on the store holds).
    DeviceOwned {
        /// The device.
        device: String,
        /// The owner, as it described itself.
        owner: String,
    },
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
            StartError::Bounds(d) => write!(f, "bounds: {}", d.join("; ")),
            StartError::DeviceOwned { device, owner } => write!(
                f,
                "device `{device}` is owned by {owner}: one endpoint drives a physical device at a time (stop that endpoint, wait for its lease to lapse, or start with --wait-for-devices)"
            ),
        }
    }
}

impl std::error::Error for StartError {}

/// A cell compiled for a kernel under one configuration (see
/// [`Kernel::compile`]): the configuration, the cell's specs, each device's
/// compiled binding schemas (in cell order) and the loaded ControlPolicy.
/// Nothing in it changes after it is built.
pub struct Compiled {
    config: KernelConfig,
    cell: Cell,
    /// Per device, in the order of `cell.devices`.
    bindings: Vec<Arc<[BindingRt]>>,
    policy: Arc<ControlPolicy>,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled")
            .field("endpoint_id", &self.config.endpoint_id)
            .field("devices", &self.cell.devices.len())
            .finish_non_exhaustive()
    }
}

impl Kernel {
    /// Builds a kernel over a loaded cell, its drivers (by device id) and a
    /// store, restoring latches, arming, revisions, budgets, the idempotency
    /// index and approvals, then records `endpoint.start`.
    ///
    /// # Errors
    /// A device without a driver, a schema that does not compile, a
    /// ControlPolicy that does not load or validate, a store failure.
    pub fn new(
        config: KernelConfig,
        cell: Cell,
        drivers: HashMap<String, Arc<dyn Driver>>,
        store: Arc<dyn Store>,
    ) -> Result<Self, StartError> {
        Self::from_compiled(&Self::compile(config, cell)?, drivers, store)
    }

    /// What [`Kernel::new`] compiles before it builds anything: the bounds
    /// checked, every binding's schemas and the ControlPolicy. Read-only once
    /// built, so one [`Compiled`] serves any number of kernels over the same
    /// cell ([`Kernel::from_compiled`]) — a fuzz target's fresh kernel for
    /// every input pays for a kernel, not for Cedar's parser.
    ///
    /// # Errors
    /// Bounds out of range, a schema that does not compile, a ControlPolicy
    /// that does not load or validate.
    pub fn compile(config: KernelConfig, cell: Cell) -> Result<Compiled, StartError> {
        let defects = crate::bounds::check(&config);
        if !defects.is_empty() {
            return Err(StartError::Bounds(defects));
        }
        let bindings = cell
            .devices
            .iter()
            .map(|spec| {
                let id = spec.manifest.device_id.as_str();
                let compiled = spec.bindings.iter().map(|b| binding_rt(id, b));
                compiled.collect::<Result<Vec<_>, _>>().map(Arc::from)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let policy = crate::check::policy::load(&config, &cell).map_err(StartError::Policy)?;
        Ok(Compiled {
            config,
            cell,
            bindings,
            policy: Arc::new(policy),
        })
    }

    /// A kernel over what `compiled` holds, its drivers and a store,
    /// restored and started as [`Kernel::new`] does; `compiled` stays as it
    /// was (the kernel shares its schemas and policy, and copies its specs).
    ///
    /// # Errors
    /// A device without a driver, a store failure.
    pub fn from_compiled(
        compiled: &Compiled,
        drivers: HashMap<String, Arc<dyn Driver>>,
        store: Arc<dyn Store>,
    ) -> Result<Self, StartError> {
        let kernel = Self::assemble(compiled, drivers, Arc::clone(&store))?;
        kernel
            .restore_from(store.as_ref(), None, &|| {})
            .map_err(crate::kernel::fleet::owned_error)?;
        Ok(kernel)
    }

    /// The kernel over a compiled cell with nothing restored yet: every
    /// device unlatched at revision 0, an empty index that asks the store
    /// about every id, no budget draws, no approvals. [`Kernel::restore_from`]
    /// brings the store's state in before anything may act.
    pub(crate) fn assemble(
        compiled: &Compiled,
        drivers: HashMap<String, Arc<dyn Driver>>,
        store: Arc<dyn Store>,
    ) -> Result<Self, StartError> {
        let config = compiled.config.clone();
        let (devices, index) = build_devices(compiled, drivers)?;
        // Incomplete: until the store's receipts are in, a miss asks the store.
        let idem = Index::new(config.idempotency_cache_max.max(1), false);
        let sessions = Sessions::new(config.sessions_max);
        let meters = crate::meters::Meters::new(devices.iter().map(|d| {
            let caps = d.spec.bindings.iter().map(|b| b.capability_id.clone());
            (d.id(), caps.collect())
        }));
        Ok(Kernel {
            inner: Arc::new(Inner {
                config,
                devices,
                index,
                store,
                sessions: Mutex::new(sessions),
                idem: Mutex::new(idem),
                budgets: Mutex::new(Ledger::new()),
                ops: Mutex::new(HashMap::new()),
                finished_ops: Mutex::new(crate::dispatch::operations::Finished::default()),
                grants: Mutex::new(crate::safety::grants::Grants::default()),
                permits: Mutex::new(crate::check::permits::Permits::default()),
                policy: Arc::clone(&compiled.policy),
                approvals: Mutex::new(Approvals::default()),
                started: Instant::now(),
                started_ms: now_ms(),
                stop_watch: governed::WatchHealth::default(),
                store_health: crate::safety::health::StoreHealth::default(),
                store_open: crate::kernel::deferred::OpenState::default(),
                instance: tether_core::ids::mint("inst_"),
                fleet: crate::kernel::fleet::FleetState::default(),
                meters,
                owed: crate::dispatch::owed::Owed::default(),
            }),
        })
    }

    /// Brings the state `store` holds into the kernel — orphaned commands
    /// reconciled first (their receipts must be in the index), then each
    /// device's latch, arming and revisions, the index, the budget ledger
    /// and the approvals — and records `endpoint.start` there. A latch is
    /// only ever set here, never released: a device latched in memory (the
    /// trip of an endpoint that started without its store, `start_fault`)
    /// stays latched whatever the store says. `first_stage_done` is called
    /// once the restore's writes that wait for the store's lock (leases,
    /// reconciled operations) and the devices' state are done; what
    /// follows reads work linear in the store (the deferred start bounds
    /// the two stages apart).
    pub(crate) fn restore_from(
        &self,
        store: &dyn Store,
        start_fault: Option<&str>,
        first_stage_done: &dyn Fn(),
    ) -> Result<(), StartError> {
        // Leases first: only an owner reconciles, and only the operations
        // of endpoints no longer alive.
        self.claim_fleet(store)?;
        let live = self.live_others(store)?;
        let alone = live.is_empty();
        crate::dispatch::evidence::reconcile_orphans(store, &live).map_err(StartError::Store)?;
        let latches = store.latches().map_err(StartError::Store)?;
        let revisions = store.revisions().map_err(StartError::Store)?;
        for dev in &self.inner.devices {
            restore_device_state(&self.inner.config, dev, &latches, &revisions);
        }
        first_stage_done();
        let warm = restore_index(&self.inner.config, store)?;
        if let Ok(mut idem) = self.inner.idem.lock() {
            match (start_fault, warm) {
                // A fresh kernel: the store's receipts are the whole index.
                (None, warm) if idem.is_empty() => {
                    *idem = warm.into_index(&self.inner.config);
                }
                // Ids this endpoint answered while the store was away (or
                // while its state was still being read) stay as they are;
                // the index stays incomplete (a miss asks).
                (_, warm) => {
                    for (id, digest) in warm.ids {
                        idem.warm_missing(id, digest);
                    }
                }
            }
        }
        if let Ok(mut idem) = self.inner.idem.lock() {
            // With other endpoints on the store, a miss asks it.
            idem.set_alone(alone);
        }
        let ledger = restore_budgets(store, now_ms())?;
        if let Ok(mut b) = self.inner.budgets.lock() {
            *b = ledger;
        }
        // The head first: an approval written after it is merged later
        // (`sync_approvals`), one written before is in what is read now.
        let head = store.chain_head().map_err(StartError::Store)?;
        let rows = store
            .approvals_to_restore(
                crate::approvals::APPROVALS_MAX,
                crate::approvals::APPROVALS_RESTORE_CLOSED_MAX,
            )
            .map_err(StartError::Store)?;
        let mut approvals = Approvals::restore(&rows);
        approvals.seen = head.map_or(0, |(seq, _)| seq);
        if let Ok(mut a) = self.inner.approvals.lock() {
            *a = approvals;
        }
        self.record_start(store, start_fault)
    }

    /// The `endpoint.start` entry, made durable before the kernel serves.
    /// A latch restored from the store may come from a trip no endpoint saw
    /// (`tether estop` while none ran): the approvals asked for before it
    /// are withdrawn now, as a live e-stop withdraws them.
    fn record_start(&self, store: &dyn Store, start_fault: Option<&str>) -> Result<(), StartError> {
        let devices: Vec<Value> = self
            .inner
            .devices
            .iter()
            .map(|d| json!({"device_id": d.id(), "mode": d.spec.manifest.mode.as_str(), "latched": d.latched.load(Ordering::SeqCst), "origin": d.spec.origin}))
            .collect();
        let mut revoked = Vec::new();
        for d in &self.inner.devices {
            if d.latched.load(Ordering::SeqCst) {
                let since = d.latch.lock().map_or(u64::MAX, |l| l.since_ms);
                revoked.extend(self.revoke_approvals_before(d.id(), since));
            }
        }
        let revoked_ids: Vec<&str> = revoked.iter().map(|r| r.approval_id.as_str()).collect();
        let mut body = json!({"endpoint_id": self.inner.config.endpoint_id, "version": env!("CARGO_PKG_VERSION"), "devices": devices, "revoked_approvals": revoked_ids});
        if let Some(fault) = start_fault {
            // Said in the evidence: this endpoint served, tripped, before
            // its store opened.
            body["store_fault_at_start"] = json!(fault);
        }
        store
            .commit_blocking(Commit {
                events: vec![EventDraft {
                    kind: "endpoint.start".into(),
                    body: body.into(),
                }],
                approvals: revoked,
                ..Commit::default()
            })
            .map_err(StartError::Store)?;
        Ok(())
    }
}

/// Every device of the compiled cell with its driver and compiled schemas,
/// nothing restored yet, in load order, and the index of each by id.
fn build_devices(
    compiled: &Compiled,
    mut drivers: HashMap<String, Arc<dyn Driver>>,
) -> Result<(Vec<DeviceRt>, HashMap<String, usize>), StartError> {
    // One entry of compiled schemas per device, by construction (`compile`).
    debug_assert_eq!(compiled.cell.devices.len(), compiled.bindings.len());
    let mut devices = Vec::new();
    let mut index = HashMap::new();
    for (spec, bindings) in compiled.cell.devices.iter().zip(&compiled.bindings) {
        let id = spec.manifest.device_id.clone();
        let driver = drivers
            .remove(&id)
            .ok_or_else(|| StartError::MissingDriver(id.clone()))?;
        index.insert(id, devices.len());
        let bindings = Arc::clone(bindings);
        devices.push(build_device(
            &compiled.config,
            spec.clone(),
            driver,
            bindings,
        ));
    }
    Ok((devices, index))
}

/// One device with its compiled schemas; unlatched, at revision 0, armed as
/// a start with nothing stored has it.
fn build_device(
    config: &KernelConfig,
    spec: DeviceSpec,
    driver: Arc<dyn Driver>,
    bindings: Arc<[BindingRt]>,
) -> DeviceRt {
    let revisions = spec
        .manifest
        .resources
        .iter()
        .map(|r| (r.id.clone(), AtomicU64::new(0)))
        .collect();
    let (armed, arming_ms) = restored_arming(config, &spec, &[]);
    DeviceRt {
        spec,
        driver,
        bindings,
        latched: AtomicBool::new(false),
        latch: Mutex::new(LatchInfo::default()),
        latch_event_ms: AtomicU64::new(0),
        armed: AtomicBool::new(armed),
        arming_ms: AtomicU64::new(arming_ms),
        estop_epoch: AtomicU64::new(0),
        stops_in_flight: AtomicUsize::new(0),
        stop_confirmed: AtomicBool::new(false),
        terminated: AtomicBool::new(false),
        unreconciled: Mutex::new(BTreeMap::new()),
        revisions,
        lock: tokio::sync::Mutex::new(()),
    }
}

/// A device's revisions, latch and arming as the store last recorded them.
/// Revisions only move forward and a latch is only set: what this process
/// holds already (a start-up trip) is never undone by an older store.
fn restore_device_state(
    config: &KernelConfig,
    dev: &DeviceRt,
    latches: &[LatchRow],
    revisions: &[RevisionRow],
) {
    let id = dev.id();
    for (resource, revision) in &dev.revisions {
        if let Some(row) = revisions
            .iter()
            .find(|row| row.device_id == id && &row.resource == resource)
        {
            revision.fetch_max(row.revision, Ordering::SeqCst);
        }
    }
    let (latch, latched, latch_event_ms) = restored_latch(latches, id);
    if latched && !dev.latched.swap(true, Ordering::SeqCst) {
        if let Ok(mut l) = dev.latch.lock() {
            *l = latch;
        }
    }
    dev.latch_event_ms
        .fetch_max(latch_event_ms, Ordering::SeqCst);
    if dev.spec.manifest.mode.is_physical() && config.hardware_armed_at_start {
        let (armed, arming_ms) = restored_arming(config, &dev.spec, latches);
        dev.armed.store(armed, Ordering::SeqCst);
        dev.arming_ms.store(arming_ms, Ordering::SeqCst);
    }
}

/// The latch of a device from the newest stored trip or reset (its own or
/// the governed stop of every device): the latch, whether it is set, and
/// the time of that event (older rows are ignored from then on).
fn restored_latch(latches: &[LatchRow], id: &str) -> (LatchInfo, bool, u64) {
    let newest = governed::newest_event(latches, id);
    match newest {
        Some(ev) if ev.latched => (
            LatchInfo {
                since_ms: ev.at_ms,
                reason: ev.reason,
                durable: true,
            },
            true,
            ev.at_ms,
        ),
        Some(ev) => (LatchInfo::default(), false, ev.at_ms),
        None => (LatchInfo::default(), false, 0),
    }
}

/// Whether a device starts armed, and the time of that arming: a device
/// that moves nothing physical is always armed; hardware keeps its stored
/// arming (armed when none is stored), or starts disarmed at every start
/// when `hardware_armed_at_start` is off.
fn restored_arming(config: &KernelConfig, spec: &DeviceSpec, latches: &[LatchRow]) -> (bool, u64) {
    if !spec.manifest.mode.is_physical() {
        (true, 0)
    } else if config.hardware_armed_at_start {
        governed::arming_of(latches, &spec.manifest.device_id).unwrap_or((true, 0))
    } else {
        // Disarmed at every start: only a later arm counts.
        (false, now_ms())
    }
}

/// The newest receipts' ids and digests, and whether they are all of them.
struct Warm {
    ids: Vec<(String, String)>,
    complete: bool,
}

impl Warm {
    /// The index of a fresh kernel, warmed with them.
    fn into_index(self, config: &KernelConfig) -> Index {
        let mut idem = Index::new(config.idempotency_cache_max.max(1), self.complete);
        for (id, digest) in self.ids {
            idem.warm(id, digest);
        }
        idem
    }
}

/// The idempotency index's warm set: the newest receipts' digests.
fn restore_index(config: &KernelConfig, store: &dyn Store) -> Result<Warm, StartError> {
    let (ids, complete) = store
        .receipt_digests(config.idempotency_cache_max)
        .map_err(StartError::Store)?;
    Ok(Warm { ids, complete })
}

/// The budget ledger: every journalled draw not released is replayed as
/// drawn, so a restart never refills a window.
fn restore_budgets(store: &dyn Store, now: u64) -> Result<Ledger, StartError> {
    let mut ledger = Ledger::new();
    let rows = store
        .budget_rows_since(now.saturating_sub(BUDGET_REPLAY_MS))
        .map_err(StartError::Store)?;
    for row in rows.iter().filter(|row| !row.released) {
        if let Some(window) = window_of_key(&row.key) {
            let _ = ledger.record(&row.key, window, row.amount, row.ts_ms, &row.reservation_id);
        }
    }
    Ok(ledger)
}

/// The window of a budget key `device/capability/path/window[/session]`,
/// read from its end: a device id may hold `/` (a capability id, a window
/// and a session id never do), so counting from the start would miss the
/// draws of such a device and a restart would refill its window.
fn window_of_key(key: &str) -> Option<Window> {
    let mut segments = key.rsplit('/');
    let last = segments.next()?;
    match Window::parse(last) {
        Some(Window::Session) | None => segments
            .next()
            .and_then(Window::parse)
            .filter(|w| *w == Window::Session),
        Some(window) => Some(window),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_key_names_its_window_whatever_the_device_id_holds() {
        let cases = [
            ("oven-1/cap.x.v1/power/rolling_1h", Some(Window::Rolling1h)),
            (
                "lab/oven:2/cap.x.v1/power/rolling_24h",
                Some(Window::Rolling24h),
            ),
            (
                "lab/oven/cap.x.v1/power/session/mhs_s_abc",
                Some(Window::Session),
            ),
            ("oven-1/cap.x.v1/power/session/-", Some(Window::Session)),
            ("oven-1/cap.x.v1/power/weekly", None),
        ];
        for (key, window) in cases {
            assert_eq!(window_of_key(key), window, "{key}");
        }
    }
}
