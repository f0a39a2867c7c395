//! The safety status: `mhs.safety.status`.
//!
//! **Owns:** the per-device view of the latch, arming, the e-stop (budget,
//! engaged, confirmed, terminated), interlocks, the device's link (`null`
//! for a driver that reports none) and running operations.
//! **Never belongs here:** anything that changes what it shows.
//! **Fail-closed rule:** a latch whose details cannot be read still reports
//! `latched` from the flag every check reads; an unreported interlock reads
//! unknown.

use crate::kernel::Kernel;
use crate::ApiError;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;

impl Kernel {
    /// `mhs.safety.status`: per device, the latch, interlocks and running operations.
    pub fn safety_status(&self, device_id: Option<&str>) -> Result<Value, ApiError> {
        let devices: Vec<usize> = match device_id {
            Some(id) => vec![self
                .device_index(id)
                .ok_or_else(|| self.unknown_device(id))?],
            None => (0..self.inner.devices.len()).collect(),
        };
        let list: Vec<Value> = devices
            .into_iter()
            .map(|d| {
                let dev = &self.inner.devices[d];
                let latched = dev.latched.load(Ordering::SeqCst);
                let info = dev.latch.lock().map(|l| l.clone()).unwrap_or_default();
                let interlocks: Vec<Value> = dev
                    .interlock_readings()
                    .into_iter()
                    .map(|(i, s)| {
                        let il = &dev.spec.manifest.interlocks[i];
                        json!({"id": il.id, "state": s.as_str(), "description": il.description, "gating": il.required_for.is_some(), "required_for": il.required_for})
                    })
                    .collect();
                json!({
                    "device_id": dev.id(),
                    "mode": dev.spec.manifest.mode.as_str(),
                    "latched": latched,
                    "armed": dev.armed.load(Ordering::SeqCst),
                    "latch": if latched { json!({"since_ms": info.since_ms, "reason": info.reason, "durable": info.durable}) } else { Value::Null },
                    "estop": {"latency_ms": dev.estop_budget_ms(), "engaged": latched, "confirmed": latched && dev.stop_confirmed.load(Ordering::SeqCst), "terminated": dev.terminated.load(Ordering::SeqCst)},
                    "interlocks": interlocks,
                    "link": crate::safety::link::link_json(dev.driver.link().as_ref()),
                    "running_operations": self.running_on(d).into_iter().map(|(op, cap)| json!({"operation_id": op, "capability_id": cap})).collect::<Vec<_>>(),
                })
            })
            .collect();
        // Why every device is latched, when the store did not open at start.
        // Beside it, the `unknown` outcomes the store did not take yet
        // (`dispatch/owed.rs`).
        let unrecorded = self.owed_outcomes();
        let store = match self.store_closed() {
            Some(why) => json!({"open": false, "error": why, "unrecorded_outcomes": unrecorded}),
            None => json!({"open": true, "error": null, "unrecorded_outcomes": unrecorded}),
        };
        Ok(
            json!({"devices": list, "store": store, "not_certified": true, "statement": tether_core::NOT_CERTIFIED}),
        )
    }
}
