//! What the policy layer needs to know about the cell: devices, their
//! bindings and each binding's served input schema. The kernel fills it in
//! from its loaded manifests; this crate never reads manifests itself.

use serde_json::Value;

/// The served cell, as the policy layer sees it.
#[derive(Debug, Clone, Default)]
pub struct CellShape {
    /// Devices in the kernel's order (indices are used by `decide`).
    pub devices: Vec<DeviceShape>,
}

/// One device.
#[derive(Debug, Clone)]
pub struct DeviceShape {
    /// Device id.
    pub device_id: String,
    /// `simulated`, `hardware`, `hybrid` or `replay`.
    pub mode: String,
    /// The device's risk class (`R0`..`R3`).
    pub risk_class: String,
    /// Bindings in the kernel's order.
    pub bindings: Vec<BindingShape>,
}

/// One binding.
#[derive(Debug, Clone)]
pub struct BindingShape {
    /// Capability class id.
    pub capability: String,
    /// `read`, `write` or `command`.
    pub verb: String,
    /// The binding's effective risk class (`R0`..`R3`).
    pub risk: String,
    /// Resource id.
    pub resource: String,
    /// The binding's flags.
    pub flags: Flags,
    /// The input schema the binding serves (JSON Schema).
    pub input_schema: Value,
}

/// Binding flags exposed to policies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flags {
    /// A stop class (stop, e-stop).
    pub stop_class: bool,
    /// Lowers risk when run.
    pub risk_reducing: bool,
    /// Moves to the safe place.
    pub safe_place: bool,
    /// Needs two people.
    pub two_person: bool,
}
