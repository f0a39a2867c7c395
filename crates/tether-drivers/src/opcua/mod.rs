//! `opcua`: a device on OPC UA, described entirely by its manifest.
//!
//! **Owns:** the `Driver` implementation over a node map (`config`), node ids
//! and values (`node`), bounded sessions (`session`), the I/O tasks
//! (`tasks`) and `tether probe`'s reading (`probe`). The driver runs its I/O
//! on a thread of its own (a current-thread runtime), as `modbus.tcp` does:
//! drivers are built before the endpoint's runtime, and a device's I/O must
//! not depend on how busy the endpoint is. Client: async-opcua (`opcua`).
//! **Never here:** decisions, clamping, rounding, retries of a write or call.
//!
//! The kernel's synchronous reads (`read`, `interlocks`) answer from the
//! mirror (`crate::mirror`): a reading older than `stale_ms` is unknown (and
//! an unknown interlock blocks like an open one). `estop` hands the stop to
//! the safety lane and waits for it within the stop's own deadline.

pub mod config;
pub mod node;
pub mod probe;
pub mod session;
pub mod tasks;

use crate::mapping::MapDefect;
use crate::mirror::answer;
use crate::mirror::{Enabled, Mirror};
use config::Map;
use node::{NodeRef, UaValue};
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;
use tasks::{Lane, Lanes};
use tether_core::manifest::DeviceManifest;
use tether_kernel::{Authorized, BoxFuture, CancelToken, Driver, InterlockState, Link, Signal};

/// The driver kind in manifests.
pub const KIND: &str = "opcua";

/// What the driver and its tasks share: the map and the device's mirror,
/// keyed by node.
#[derive(Debug)]
pub struct Shared {
    /// The checked map.
    pub map: Arc<Map>,
    /// The device (names the driver's clients).
    pub device_id: String,
    mirror: Mirror<NodeRef, UaValue>,
}

impl std::ops::Deref for Shared {
    type Target = Mirror<NodeRef, UaValue>;
    fn deref(&self) -> &Self::Target {
        &self.mirror
    }
}

impl Shared {
    fn new(map: Map, device_id: &str) -> Self {
        let enabled = map.watchdog.as_ref().and_then(|wd| {
            let f = map
                .resources
                .values()
                .flatten()
                .find(|f| f.name == wd.enabled_field)?;
            Some(Enabled {
                key: f.point.node.clone(),
                disabled: UaValue::Bool(false),
            })
        });
        Self {
            mirror: Mirror::new(map.stale, enabled),
            map: Arc::new(map),
            device_id: device_id.to_owned(),
        }
    }
}

/// An OPC UA device.
pub struct OpcUa {
    shared: Arc<Shared>,
    lanes: Arc<Lanes>,
    runtime: tokio::runtime::Handle,
    // Dropping it ends the runtime thread, and with it every task.
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl std::fmt::Debug for OpcUa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpcUa")
            .field("endpoint", &self.shared.map.endpoint)
            .finish()
    }
}

/// Mapping defects of a manifest, as `tether check` reports them.
pub fn check(manifest: &DeviceManifest) -> Vec<MapDefect> {
    Map::of(manifest).err().unwrap_or_default()
}

impl OpcUa {
    /// Builds the driver: checks the map and starts polling (the device may
    /// be down: the driver starts anyway and reports the link).
    ///
    /// # Errors
    /// Every mapping defect, or a password variable that is not set.
    pub fn new(manifest: &DeviceManifest) -> Result<Self, String> {
        let map = Map::load(manifest)?;
        if let Some((_, env)) = &map.user {
            if std::env::var_os(env).is_none() {
                return Err(format!(
                    "driver_config.password_env: the variable `{env}` is not set"
                ));
            }
        }
        let id = &manifest.device_id;
        let (runtime, stop) = crate::driver_runtime("opcua", id)?;
        let shared = Arc::new(Shared::new(map, id));
        let lane = || Lane::new(shared.map.clone(), id);
        let lanes = Arc::new(Lanes {
            command: tokio::sync::Mutex::new(lane()?),
            safety: tokio::sync::Mutex::new(lane()?),
        });
        runtime.spawn(tasks::poll_loop(Arc::downgrade(&shared), lane()?));
        runtime.spawn(tasks::feed_loop(
            Arc::downgrade(&shared),
            Arc::downgrade(&lanes),
        ));
        Ok(Self {
            shared,
            lanes,
            runtime,
            _stop: stop,
        })
    }
}

impl Driver for OpcUa {
    fn read(&self, call: &Authorized) -> Result<Value, Signal> {
        let s = &self.shared;
        answer::read(s.map.fields(call.resource()), |p| s.fresh(&p.node))
    }

    fn call(&self, call: Authorized, cancel: CancelToken) -> BoxFuture<'_, Result<Value, Signal>> {
        let parts = answer::call_parts(&self.shared.map.targets, &call);
        let (s, l) = (self.shared.clone(), self.lanes.clone());
        Box::pin(async move {
            let (steps, input, until) = parts?;
            let running = tasks::run_call(s, l, steps, input, cancel, until);
            answer::on_runtime(&self.runtime, running).await
        })
    }

    fn estop(&self, call: &Authorized) -> Result<(), Signal> {
        let until = call
            .deadline()
            .unwrap_or_else(|| Instant::now() + self.shared.map.request_timeout);
        let stopping = tasks::stop(self.shared.clone(), self.lanes.clone(), until);
        answer::stop_within(&self.runtime, stopping, until, &self.shared.map.endpoint)
    }

    fn interlocks(&self) -> Vec<(String, InterlockState)> {
        let s = &self.shared;
        answer::interlocks(&s.map.interlocks, |p| s.fresh(&p.node))
    }

    fn link(&self) -> Option<Link> {
        Some(self.shared.link())
    }
}
