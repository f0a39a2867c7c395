//! A served device at run time: its spec, driver, compiled schemas, latch,
//! arming, revisions and lock, and the operations running on it.
//!
//! **Owns:** [`DeviceRt`] and [`BindingRt`] (the schemas compiled once at
//! start), [`LatchInfo`], [`RunningOp`], the e-stop budget and the margin
//! kept back from it to answer.
//! **Never belongs here:** what changes the latch or arming (`safety/`),
//! restoring them at start (`start.rs`), the checks that read them
//! (`check/`).
//! **Fail-closed rule:** a served schema that does not compile stops the
//! start ([`StartError::Schema`]); an interlock the driver does not report
//! reads unknown.

use crate::driver::{Driver, InterlockState};
use crate::kernel::StartError;
use crate::loader::{BindingSpec, DeviceSpec};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// E-stop budget of a device whose manifest names none, ms.
pub(crate) const ESTOP_BUDGET_MS_DEFAULT: u64 = 1000;
/// Most time kept back from a stop's budget or a caller's deadline to build
/// and send the answer, ms.
pub(crate) const ANSWER_MARGIN_MS_MAX: u64 = 5;

/// A running effectful operation.
pub(crate) struct RunningOp {
    pub device: usize,
    pub capability_id: String,
    pub cancel: crate::driver::CancelToken,
    pub stop_class: bool,
    /// `false` for a binding declared `abortable = false`: no trip, e-stop
    /// or cancel reaches it; it ends within its lease or duration.
    pub abortable: bool,
    pub session_id: Option<String>,
    /// The principal whose command it is: only it (and operators) may read
    /// or cancel it.
    pub principal_id: String,
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

/// The schemas of one binding, compiled once at start.
pub(crate) struct BindingRt {
    pub structure: jsonschema::Validator,
    pub full: jsonschema::Validator,
    pub class_structure: Option<jsonschema::Validator>,
    pub class_full: Option<jsonschema::Validator>,
    pub output: jsonschema::Validator,
}

/// Time kept back from a stop's budget or a caller's deadline to build and
/// send the answer: a twentieth of it, at most [`ANSWER_MARGIN_MS_MAX`].
pub(crate) fn answer_margin(budget: Duration) -> Duration {
    (budget / 20).min(Duration::from_millis(ANSWER_MARGIN_MS_MAX))
}

/// One served device.
pub(crate) struct DeviceRt {
    pub spec: DeviceSpec,
    pub driver: Arc<dyn Driver>,
    /// Compiled once per cell, shared by kernels built from one [`Compiled`](crate::kernel::Compiled).
    pub bindings: Arc<[BindingRt]>,
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
    pub stops_in_flight: AtomicUsize,
    /// Whether the current latch's stop path has succeeded.
    pub stop_confirmed: AtomicBool,
    /// A stop path ran on this endpoint for a device that declares a terminal
    /// stop: its resets are refused for the rest of this endpoint's life.
    pub terminated: AtomicBool,
    /// Resources held because a physical call's finish could not be recorded:
    /// resource -> command ids awaiting reconciliation.
    pub unreconciled: Mutex<BTreeMap<String, BTreeSet<String>>>,
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
        self.spec
            .manifest
            .safety
            .estop
            .latency_ms
            .unwrap_or(ESTOP_BUDGET_MS_DEFAULT)
    }
    /// The part of the e-stop budget the stop path may use before the answer
    /// is made: the rest ([`answer_margin`]) writes the receipt, so the
    /// answer comes within the budget, not just after it.
    pub fn stop_path_budget(&self) -> Duration {
        let budget = Duration::from_millis(self.estop_budget_ms());
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

/// Compiles a served schema (formats are not validated).
pub(crate) fn compile(schema: &Value) -> Result<jsonschema::Validator, String> {
    jsonschema::options()
        .should_validate_formats(false)
        .build(schema)
        .map_err(|e| e.to_string())
}

/// Compiles the schemas of one binding of `device`.
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
