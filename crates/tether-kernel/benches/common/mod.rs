//! What the kernel's load benches share: a kernel on the built-in cell over a
//! given store, its runtime and session, and the setpoint command they send.

// Each bench uses part of this module.
#![allow(dead_code)]

pub mod cpu;

use serde_json::json;
use std::sync::Arc;
use tether_kernel::{CommandRequest, Kernel, KernelConfig, Principal, SessionOpen};
use tether_store::Store;

/// A kernel on the built-in simulated cell, its evidence in `store`.
pub fn kernel_on(name: &str, store: Arc<dyn Store>) -> Kernel {
    kernel_with(KernelConfig::standard(name), store)
}

/// The built-in cell on `store` with `config`.
#[allow(dead_code)] // not every bench sets its own settings
pub fn kernel_with(config: KernelConfig, store: Arc<dyn Store>) -> Kernel {
    let cell = tether_kernel::loader::load(&tether_drivers::builtin_cell(), None).expect("cell");
    let drivers =
        tether_drivers::build_all(cell.devices.iter().map(|d| &d.manifest)).expect("drivers");
    Kernel::new(config, cell, drivers, store).expect("kernel")
}

/// Two runtime workers, as on the project's 2-core machine.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("rt")
}

/// A session for the local agent, opened on `rt`.
pub fn open_session(rt: &tokio::runtime::Runtime, k: &Kernel, p: &Principal) -> String {
    rt.block_on(k.session_open(p, SessionOpen::default()))
        .expect("session")["session_id"]
        .as_str()
        .expect("sid")
        .to_owned()
}

/// `cap.thermal.setpoint.v1` on `thermostat-1` to `target` degC.
pub fn setpoint(session: &str, target: f64) -> CommandRequest {
    CommandRequest {
        route: tether_kernel::Route::Command,
        session_id: Some(session.to_owned()),
        device_id: "thermostat-1".into(),
        capability_id: "cap.thermal.setpoint.v1".into(),
        resource: None,
        input: json!({"target_temperature": target}),
        command_id: None,
        deadline: None,
        expected_revision: None,
        safe_place_grant: None,
        permit_id: None,
    }
}
