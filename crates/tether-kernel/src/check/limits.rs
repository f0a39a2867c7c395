//! Step 8: limits with units on every element and leaf, then the bounds an
//! operator must fill, then CORE-046's strict rule for physical calls.
//!
//! **Owns:** turning the limits engine's verdict into a refusal with the
//! path, kind, bound, value, unit and source of the first violation (all of
//! them in the details).
//! **Never belongs here:** the limits grammar and engine (`tether_limits`).
//! **Fail-closed rule:** a value whose bound is `operator_required` and
//! unfilled is refused; a physical call at R1 or above never sets a number
//! no limit bounds.

use crate::kernel::DeviceRt;
use crate::loader::BindingSpec;
use serde_json::{json, Value};
use tether_core::manifest::RiskClass;
use tether_core::{Code, Refusal};

/// Step 8.
pub(crate) fn limits_step(dev: &DeviceRt, b: &BindingSpec, input: &Value) -> Result<(), Refusal> {
    if let Err(v) = b.limits.check(input) {
        let first = &v.first;
        return Err(Refusal::new(
            Code::SafetyEnvelopeViolation,
            format!(
                "{} = {} violates {} bound {}{} (source: {})",
                tether_core::echo::text(&first.path),
                tether_core::echo::text(&first.value.to_string()),
                first.kind.as_str(),
                first.bound,
                first
                    .unit
                    .as_deref()
                    .map(|u| format!(" {u}"))
                    .unwrap_or_default(),
                first.source
            ),
            v.to_details(),
        ));
    }
    if b.is_stop() || b.is_read() {
        return Ok(());
    }
    let unset = b.limits.unset_paths(input);
    if !unset.is_empty() {
        return Err(Refusal::new(
            Code::SafetyLimitsUnset,
            "the input sets a value whose bound is operator_required and no operator overlay filled it",
            json!({"paths": unset, "reason": "operator_required"}),
        ));
    }
    // CORE-046 (strict): a physical call at R1 or above never sets a number
    // no limit bounds. Tether always runs strict.
    if dev.spec.manifest.mode.is_physical() && b.risk >= RiskClass::R1 {
        let unbounded = b.limits.unlimited_set_paths(input);
        if !unbounded.is_empty() {
            return Err(Refusal::new(
                Code::SafetyLimitsUnset,
                "the input sets a number no limit bounds; a hardware call at R1 or above needs a limit on every number it sets",
                json!({"paths": unbounded, "reason": "no_limit"}),
            ));
        }
    }
    Ok(())
}
