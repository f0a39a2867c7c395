//! `modbus.tcp`: a device on Modbus TCP, described entirely by its manifest.
//!
//! **Owns:** the `Driver` implementation over a register map (`map`), the
//! value codec (`codec`), bounded connections (`lane`), the mirror, link and
//! watchdog feed (`shared`), the I/O tasks (`tasks`) and `tether probe`'s
//! reading (`probe`). The driver runs its I/O on a thread of its own (a
//! current-thread runtime): drivers are built before the endpoint's runtime,
//! and a device's I/O must not depend on how busy the endpoint is.
//! **Never here:** decisions, clamping, rounding, retries of a write.
//!
//! The kernel's synchronous reads (`read`, `interlocks`) answer from the
//! mirror: a reading older than `stale_ms` is unknown (and an unknown
//! interlock blocks like an open one). `estop` hands the stop to the safety
//! lane and waits for it within the stop's own deadline.

pub mod codec;
pub mod lane;
pub mod map;
pub mod probe;
pub mod shared;
pub mod tasks;

use crate::mirror::answer;
use map::Map;
use serde_json::Value;
use shared::Shared;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use tasks::Lanes;
use tether_core::manifest::DeviceManifest;
use tether_kernel::{Authorized, BoxFuture, CancelToken, Driver, InterlockState, Link, Signal};

/// The driver kind in manifests.
pub const KIND: &str = "modbus.tcp";

/// A Modbus TCP device.
pub struct ModbusTcp {
    shared: Arc<Shared>,
    lanes: Arc<Lanes>,
    addr: SocketAddr,
    runtime: tokio::runtime::Handle,
    // Dropping it ends the runtime thread, and with it every task.
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl std::fmt::Debug for ModbusTcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModbusTcp")
            .field("addr", &self.addr)
            .finish()
    }
}

/// Mapping defects of a manifest, as `tether check` reports them.
pub fn check(manifest: &DeviceManifest) -> Vec<crate::mapping::MapDefect> {
    Map::of(manifest).err().unwrap_or_default()
}

impl ModbusTcp {
    /// Builds the driver: checks the map and starts polling (the device may
    /// be down: the driver starts anyway and reports the link).
    ///
    /// # Errors
    /// Every mapping defect, one a line.
    pub fn new(manifest: &DeviceManifest) -> Result<Self, String> {
        let (map, addr) = Map::load(manifest)?;
        let (runtime, stop) = crate::driver_runtime("modbus", &manifest.device_id)?;
        let shared = Arc::new(Shared::new(map));
        let lanes = Arc::new(Lanes::new(&shared, addr));
        runtime.spawn(tasks::poll_loop(Arc::downgrade(&shared), addr));
        runtime.spawn(tasks::feed_loop(
            Arc::downgrade(&shared),
            Arc::downgrade(&lanes),
        ));
        Ok(Self {
            shared,
            lanes,
            addr,
            runtime,
            _stop: stop,
        })
    }
}

impl Driver for ModbusTcp {
    fn read(&self, call: &Authorized) -> Result<Value, Signal> {
        let s = &self.shared;
        answer::read(s.map.fields(call.resource()), |p| s.fresh(&shared::key(p)))
    }

    fn call(&self, call: Authorized, cancel: CancelToken) -> BoxFuture<'_, Result<Value, Signal>> {
        let parts = answer::call_parts(&self.shared.map.targets, &call);
        let (s, l) = (self.shared.clone(), self.lanes.clone());
        Box::pin(async move {
            let (writes, input, until) = parts?;
            let running = tasks::run_call(s, l, writes, input, cancel, until);
            answer::on_runtime(&self.runtime, running).await
        })
    }

    fn estop(&self, call: &Authorized) -> Result<(), Signal> {
        let until = call
            .deadline()
            .unwrap_or_else(|| Instant::now() + self.shared.map.request_timeout);
        let stopping = tasks::stop(self.shared.clone(), self.lanes.clone(), self.addr, until);
        answer::stop_within(&self.runtime, stopping, until, &self.addr.to_string())
    }

    fn interlocks(&self) -> Vec<(String, InterlockState)> {
        let s = &self.shared;
        answer::interlocks(&s.map.interlocks, |p| s.fresh(&shared::key(p)))
    }

    fn link(&self) -> Option<Link> {
        Some(self.shared.link())
    }
}
