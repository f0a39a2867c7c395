//! Step 6: mode — a replay device, hybrid authority and arming.
//!
//! **Owns:** whether a model may command a resource the hardware side of a
//! hybrid device drives, and whether a hardware device is armed.
//! **Never belongs here:** who may arm (`safety/arming.rs`).
//! **Fail-closed rule:** an unarmed physical device refuses effectful
//! calls; stops are never refused for it.

use crate::kernel::{DeviceRt, Kernel, Principal};
use crate::loader::BindingSpec;
use serde_json::json;
use std::sync::atomic::Ordering;
use tether_core::manifest::Mode;
use tether_core::{Code, Refusal};

/// Step 6, hybrid authority: a model-controlled principal (an agent) never
/// commands a resource the physical side of a hybrid device drives.
/// Step 6: a replay device accepts no commands; then hybrid authority and
/// arming.
pub(crate) fn mode_step(dev: &DeviceRt, b: &BindingSpec, p: &Principal) -> Result<(), Refusal> {
    if dev.spec.manifest.mode == Mode::Replay && !b.is_read() {
        return Err(Refusal::new(
            Code::ModeReadOnly,
            "a replay device accepts no commands",
            json!({"mode": "replay"}),
        ));
    }
    check_authority(dev, b, p)?;
    check_armed(dev, b)
}

pub(crate) fn check_authority(
    dev: &DeviceRt,
    b: &BindingSpec,
    p: &Principal,
) -> Result<(), Refusal> {
    if dev.spec.manifest.mode != Mode::Hybrid || !Kernel::is_effectful(b) || b.is_stop() {
        return Ok(());
    }
    let authority = dev
        .spec
        .manifest
        .resources
        .iter()
        .find(|r| r.id == b.resource)
        .and_then(|r| r.authority)
        .unwrap_or(tether_core::manifest::Authority::Hardware);
    if authority == tether_core::manifest::Authority::Hardware
        && p.kind == crate::PrincipalKind::Agent
    {
        return Err(Refusal::new(
            Code::SafetyEnvelopeViolation,
            format!(
                "resource `{}` of hybrid device `{}` is driven by its hardware side; a model may read it but not command it",
                b.resource,
                dev.id()
            ),
            json!({"authority": authority.as_str(), "resource": b.resource, "reason": "hardware_authority"}),
        ));
    }
    Ok(())
}

/// Step 6, arming: hardware actuation needs an armed device. Stops are
/// never refused for it (a stop makes things safer).
pub(crate) fn check_armed(dev: &DeviceRt, b: &BindingSpec) -> Result<(), Refusal> {
    if !dev.spec.manifest.mode.is_physical() || !Kernel::is_effectful(b) || b.is_stop() {
        return Ok(());
    }
    if dev.armed.load(Ordering::SeqCst) {
        return Ok(());
    }
    Err(Refusal::new(
        Code::AuthHardwareDisabled,
        format!(
            "device `{}` is not armed; an operator arms it (mhs.safety.arm, tether arm)",
            dev.id()
        ),
        json!({"reason": "not_armed", "device_id": dev.id()}),
    ))
}
