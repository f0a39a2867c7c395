//! `mhs.hello`, `mhs.devices.list` and `mhs.devices.get`.

use crate::kernel::{DeviceRt, Kernel, Principal};
use crate::reference;
use crate::ApiError;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use tether_core::Code;

/// Methods the JSON-RPC surface serves (listed in hello).
pub const METHODS: &[&str] = &[
    "mhs.hello",
    "mhs.devices.list",
    "mhs.devices.get",
    "mhs.session.open",
    "mhs.session.heartbeat",
    "mhs.session.close",
    "mhs.resource.read",
    "mhs.resource.write",
    "mhs.command",
    "mhs.operations.get",
    "mhs.operations.cancel",
    "mhs.safety.estop",
    "mhs.safety.reset",
    "mhs.safety.arm",
    "mhs.safety.disarm",
    "mhs.safety.grant_safe_place",
    "mhs.safety.permit",
    "mhs.safety.status",
    "mhs.approvals.list",
    "mhs.approvals.get",
    "mhs.approvals.decide",
];

impl Kernel {
    fn summary(&self, dev: &DeviceRt) -> Value {
        let m = &dev.spec.manifest;
        json!({
            "device_id": m.device_id,
            "mode": m.mode.as_str(),
            "risk_class": m.risk_class.as_str(),
            "description": m.description,
            "fidelity": m.fidelity.as_ref().map(|f| json!({"kind": f.kind, "notes": f.notes})),
            "latched": dev.latched.load(Ordering::SeqCst),
            "link": crate::safety::link::link_json(dev.driver.link().as_ref()),
            "resources": m.resources.iter().map(|r| json!({"resource": r.id, "revision": dev.revision(&r.id)})).collect::<Vec<_>>(),
            "capabilities": dev.spec.bindings.iter().map(|b| json!({"capability_id": b.capability_id, "resource": b.resource, "verb": b.verb.as_str(), "risk": b.risk.as_str(), "concurrency": Kernel::concurrency(b).as_str(), "stop_class": b.is_stop()})).collect::<Vec<_>>(),
        })
    }

    /// `mhs.hello`.
    pub fn hello(&self, p: &Principal) -> Value {
        json!({
            "mhs_version": "1.0",
            "spec_version": "0.9",
            "server": {"name": "tether", "version": env!("CARGO_PKG_VERSION")},
            "endpoint_id": self.inner.config.endpoint_id,
            "started_at_ms": self.inner.started_ms,
            "principal": p.to_json(),
            "features": [Code::SafetyNotCertified.as_str(), "sessions", "receipts", "idempotency", "evidence.hash_chain", "limits.units", "budgets"],
            "not_certified": tether_core::NOT_CERTIFIED,
            "methods": METHODS,
            "devices": self.inner.devices.iter().map(|d| self.summary(d)).collect::<Vec<_>>(),
        })
    }

    /// `mhs.devices.list`.
    pub fn devices_list(&self) -> Value {
        json!({"devices": self.inner.devices.iter().map(|d| self.summary(d)).collect::<Vec<_>>()})
    }

    /// What a tool catalogue reads of a device: its `mode`, `risk_class`
    /// and generated `reference` (bindings with their effective limits),
    /// without the live summary and the markdown `mhs.devices.get` adds
    /// (the catalogue is built once per router, for every device).
    ///
    /// # Errors
    /// Unknown device.
    pub fn device_reference(&self, device_id: &str) -> Result<Value, ApiError> {
        let dev = self.device(device_id)?;
        let m = &dev.spec.manifest;
        Ok(json!({
            "device_id": m.device_id,
            "mode": m.mode.as_str(),
            "risk_class": m.risk_class.as_str(),
            "reference": reference::reference_json(&dev.spec),
        }))
    }

    /// `mhs.devices.get`: the summary, the full manifest view with each
    /// binding's effective limits, and the generated reference file.
    ///
    /// # Errors
    /// Unknown device.
    pub fn device_get(&self, device_id: &str) -> Result<Value, ApiError> {
        let dev = self.device(device_id)?;
        let mut summary = self.summary(dev);
        let r = reference::reference_json(&dev.spec);
        summary["bindings"] = r["bindings"].clone();
        summary["state_schemas"] = json!(dev
            .spec
            .manifest
            .resources
            .iter()
            .map(|r| (r.id.clone(), r.state_schema.clone()))
            .collect::<serde_json::Map<_, _>>());
        summary["interlocks"] = r["safety"]["interlocks"].clone();
        summary["safety"] = r["safety"].clone();
        Ok(json!({
            "device": summary,
            "reference": r,
            "reference_md": reference::reference_markdown(&dev.spec),
        }))
    }
}
