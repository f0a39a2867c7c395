//! The sealed `Authorized` witness.
//!
//! A driver can only be called with an [`Authorized`] value, and only this
//! crate can make one: its fields are private and its only constructor is
//! `pub(crate)`. It has no `Default`, `Clone`, `Deserialize` or public
//! constructor, so code outside the kernel — a surface, a driver, a test
//! harness — cannot fabricate the proof that the evaluation order ran.
//! `crates/tether-drivers/tests/ui/` holds the compile-fail tests that keep
//! this true.

use crate::loader::BindingSpec;
use serde_json::{Number, Value};
use std::time::{Duration, Instant};
use tether_core::manifest::CommandKind;

/// Deepest nesting [`integral_numbers_as_integers`] walks; the surfaces refuse
/// inputs nested deeper than 64 long before they reach the kernel.
const NORMALISE_DEPTH_MAX: usize = 128;

// Every level of an input the strict parser accepts is normalised.
const _: () = assert!(NORMALISE_DEPTH_MAX >= tether_core::json::DEPTH_MAX);

/// What kind of driver call the witness allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallKind {
    /// Read a resource's state; no effect.
    Read,
    /// An effectful command that passed the whole evaluation order.
    Effect,
    /// A stop-path call (native stop, stop class, safe-state action); these
    /// skip the latch by design.
    Stop,
}

/// Proof that the kernel admitted exactly this call.
#[derive(Debug)]
pub struct Authorized {
    device_id: String,
    capability_id: String,
    resource: String,
    target: String,
    input: Value,
    command_id: String,
    kind: CallKind,
    deadline: Option<Instant>,
    /// The binding's declared (or, off hardware, default) command kind;
    /// `None` for a read and the native stop, which belong to no binding's
    /// command.
    command_kind: Option<CommandKind>,
    /// The binding's `max_duration_ms`.
    max_duration: Option<Duration>,
    /// Whether the kernel may cancel the call (`abortable = false` says it
    /// never does on a trip, an e-stop or a cancel).
    abortable: bool,
}

impl Authorized {
    /// Minted only by the kernel, after the checks of its call kind passed.
    // One argument per field the witness carries: a parameter struct would
    // be one more type, nameable in the crate, from which a witness could be
    // built; the compile-fail fixture `tether-drivers/tests/ui/mint_is_private.rs`
    // calls exactly this signature.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn mint(
        device_id: &str,
        capability_id: &str,
        resource: &str,
        target: &str,
        input: Value,
        command_id: &str,
        kind: CallKind,
        deadline: Option<Instant>,
    ) -> Self {
        Self {
            device_id: device_id.to_owned(),
            capability_id: capability_id.to_owned(),
            resource: resource.to_owned(),
            target: target.to_owned(),
            input: {
                let mut input = input;
                integral_numbers_as_integers(&mut input, 0);
                input
            },
            command_id: command_id.to_owned(),
            kind,
            deadline,
            command_kind: None,
            max_duration: None,
            abortable: true,
        }
    }

    /// The witness of a call of binding `b`: it carries how the binding is
    /// bounded in time, so a driver can run a `leased` binding through
    /// [`crate::lease::run_leased`] within `max_duration`.
    pub(crate) fn of_binding(mut self, b: &BindingSpec) -> Self {
        self.command_kind = Some(b.kind);
        self.max_duration = b.max_duration_ms.map(Duration::from_millis);
        self.abortable = b.abortable;
        self
    }

    /// The device.
    pub fn device_id(&self) -> &str {
        &self.device_id
    }
    /// The capability class id of the binding.
    pub fn capability_id(&self) -> &str {
        &self.capability_id
    }
    /// The resource of the binding.
    pub fn resource(&self) -> &str {
        &self.resource
    }
    /// The driver target declared by the binding.
    pub fn target(&self) -> &str {
        &self.target
    }
    /// The validated input (in the declared units).
    pub fn input(&self) -> &Value {
        &self.input
    }
    /// The idempotency key, to pass to downstream services.
    pub fn command_id(&self) -> &str {
        &self.command_id
    }
    /// Read, effect or stop.
    pub fn kind(&self) -> CallKind {
        self.kind
    }
    /// When the call must have ended: the caller's deadline, or sooner the
    /// binding's `max_duration_ms` counted from dispatch.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }
    /// How the binding's command is bounded in time (`leased`: run it
    /// through [`crate::lease::run_leased`]); `None` for a read and the
    /// native stop.
    pub fn command_kind(&self) -> Option<CommandKind> {
        self.command_kind
    }
    /// The binding's `max_duration_ms`: the longest the call may run, for a
    /// leased runner's `duration_max`.
    pub fn max_duration(&self) -> Option<Duration> {
        self.max_duration
    }
    /// Whether the kernel may cancel this call. `false`: no trip, e-stop
    /// or cancel reaches it (only its deadline does); the driver lets the
    /// device finish and reports what it did.
    pub fn abortable(&self) -> bool {
        self.abortable
    }
}

/// JSON has one kind of number: `2.0` and `2` are the same value, JSON Schema's
/// `integer` accepts both, and RFC 8785 writes both as `2` (so they share an
/// input digest). Drivers read integers with `as_u64` / `as_i64`, which refuse
/// `2.0`; so the kernel hands a driver every integral number in integer form,
/// and a driver never fails an input the kernel's checks admitted.
fn integral_numbers_as_integers(v: &mut Value, depth: usize) {
    match v {
        Value::Number(n) if n.is_f64() => {
            if let Some(i) = n.as_f64().and_then(exact_integer) {
                *n = i;
            }
        }
        Value::Array(items) if depth < NORMALISE_DEPTH_MAX => {
            for item in items {
                integral_numbers_as_integers(item, depth + 1);
            }
        }
        Value::Object(members) if depth < NORMALISE_DEPTH_MAX => {
            for item in members.values_mut() {
                integral_numbers_as_integers(item, depth + 1);
            }
        }
        _ => {}
    }
}

/// `f` as an integer number when it is one exactly (|f| ≤ 2^53, so every such
/// integer is represented without rounding).
fn exact_integer(f: f64) -> Option<Number> {
    const EXACT_MAX: f64 = 9_007_199_254_740_992.0; // 2^53
    if !f.is_finite() || f.fract() != 0.0 || f.abs() > EXACT_MAX {
        return None;
    }
    // Both casts are exact: `f` is integral and within ±2^53.
    if f >= 0.0 {
        Some(Number::from(f as u64))
    } else {
        Some(Number::from(f as i64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn integral_numbers_reach_drivers_as_integers() {
        let mut v = json!({"channel": 2.0, "on": true, "a": [1e0, -3.0, 0.5, -0.0], "n": {"x": 1e300, "y": 7}});
        integral_numbers_as_integers(&mut v, 0);
        assert_eq!(v["channel"].as_u64(), Some(2));
        assert_eq!(v["a"][0].as_u64(), Some(1));
        assert_eq!(v["a"][1].as_i64(), Some(-3));
        assert_eq!(v["a"][2].as_f64(), Some(0.5));
        assert_eq!(v["a"][3].as_u64(), Some(0));
        assert!(v["n"]["x"].is_f64(), "beyond 2^53 stays as it was");
        assert_eq!(v["n"]["y"].as_u64(), Some(7));
        assert_eq!(v["on"], json!(true));
    }
}
