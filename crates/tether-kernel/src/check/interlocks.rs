//! Step 11: the interlocks that gate a binding.
//!
//! **Owns:** which interlocks gate a binding and whether they read closed.
//! **Never belongs here:** watching them while an operation runs
//! (`dispatch/run.rs` uses these helpers).
//! **Fail-closed rule:** an interlock that reads unknown counts as open.

use crate::driver::InterlockState;
use crate::kernel::DeviceRt;
use crate::loader::BindingSpec;
use serde_json::{json, Value};
use tether_core::catalogue::{self};
use tether_core::{Code, Refusal};

/// Indexes of the interlocks that gate this binding.
pub(crate) fn gating_interlocks(dev: &DeviceRt, b: &BindingSpec) -> Vec<usize> {
    dev.spec
        .manifest
        .interlocks
        .iter()
        .enumerate()
        .filter(|(_, il)| {
            il.required_for.as_ref().is_some_and(|keys| {
                keys.iter()
                    .any(|k| catalogue::key_matches(k, &b.capability_id))
            })
        })
        .map(|(i, _)| i)
        .collect()
}

/// The gating interlocks that do not read closed (unknown counts as open).
pub(crate) fn open_interlocks(dev: &DeviceRt, gating: &[usize]) -> Vec<Value> {
    dev.interlock_readings()
        .iter()
        .filter(|(i, s)| gating.contains(i) && *s != InterlockState::Closed)
        .map(|(i, s)| {
            let il = &dev.spec.manifest.interlocks[*i];
            json!({"id": il.id, "state": s.as_str(), "description": il.description})
        })
        .collect()
}

pub(crate) fn check_interlocks(dev: &DeviceRt, b: &BindingSpec) -> Result<(), Refusal> {
    let gating = gating_interlocks(dev, b);
    if gating.is_empty() {
        return Ok(());
    }
    let open = open_interlocks(dev, &gating);
    if open.is_empty() {
        return Ok(());
    }
    Err(Refusal::new(
        Code::SafetyInterlockOpen,
        "a gating interlock is open or unknown",
        json!({"interlocks": open}),
    ))
}
