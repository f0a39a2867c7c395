//! The sealed `Authorized` witness.
//!
//! A driver can only be called with an [`Authorized`] value, and only this
//! crate can make one: its fields are private and its only constructor is
//! `pub(crate)`. It has no `Default`, `Clone`, `Deserialize` or public
//! constructor, so code outside the kernel — a surface, a driver, a test
//! harness — cannot fabricate the proof that the evaluation order ran.
//! `crates/tether-drivers/tests/ui/` holds the compile-fail tests that keep
//! this true.

use serde_json::Value;
use std::time::Instant;

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
}

impl Authorized {
    /// Minted only by the kernel, after the checks of its call kind passed.
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
            input,
            command_id: command_id.to_owned(),
            kind,
            deadline,
        }
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
    /// When the caller stops waiting.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }
}
