//! # tether-drivers — built-in drivers
//!
//! Owns the simulated cell that `tether serve` runs when no config is given:
//! `thermostat-1` ([`thermostat`]), `arm-1` ([`arm`]) and `relay-1`
//! ([`relay`]), their manifests (`cell/*.toml`, shipped as data); the
//! protocol drivers a manifest describes a real device with ([`modbus`],
//! [`mqtt`], [`opcua`], sharing [`mapping`], [`mirror`] and [`scaling`]);
//! and the factory that builds a driver from a manifest's `driver` kind.
//!
//! **Never belongs here:** decisions (limits, latches, grants — the kernel
//! owns them), wire framing, storage. A driver translates and reports signals;
//! it never refuses on its own authority except `Busy`.
//!
//! **Depends on:** tether-core, tether-kernel (for the `Driver` trait and the
//! `Authorized` witness it cannot mint). **Depended on by:** tether-cli.
#![deny(missing_docs)]

pub mod arm;
pub mod mapping;
pub mod mirror;
pub mod modbus;
pub mod mqtt;
pub mod opcua;
pub mod relay;
pub mod remote;
pub mod scaling;
pub mod simproc;
pub mod thermostat;

use std::collections::HashMap;
use std::sync::Arc;
use tether_core::manifest::DeviceManifest;
use tether_kernel::loader::ManifestSource;
use tether_kernel::Driver;

/// The built-in cell's manifests.
pub fn builtin_cell() -> Vec<ManifestSource> {
    [
        (
            "builtin:thermostat-1.toml",
            include_str!("../cell/thermostat-1.toml"),
        ),
        ("builtin:arm-1.toml", include_str!("../cell/arm-1.toml")),
        ("builtin:relay-1.toml", include_str!("../cell/relay-1.toml")),
    ]
    .into_iter()
    .map(|(origin, text)| ManifestSource {
        origin: origin.to_owned(),
        text: text.to_owned(),
    })
    .collect()
}

/// Driver kinds this crate can build.
pub const KINDS: &[&str] = &[
    "sim.thermostat",
    "sim.arm",
    "sim.relay",
    "remote.arm",
    modbus::KIND,
    "mqtt",
    opcua::KIND,
];

/// Wall-clock milliseconds since the epoch (0 before 1970).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// How long starting a driver's runtime thread may take.
const START_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// Starts a current-thread runtime on a thread of its own, named
/// `{protocol}-{device}`: a network driver's I/O must not depend on how
/// busy the endpoint's runtime is. Dropping the sender ends the thread.
pub(crate) fn driver_runtime(
    protocol: &str,
    device: &str,
) -> Result<(tokio::runtime::Handle, tokio::sync::oneshot::Sender<()>), String> {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name(format!("{protocol}-{device}"))
        .spawn(move || {
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => {
                    let _ = tx.send(Ok(rt.handle().clone()));
                    rt.block_on(async {
                        let _ = stop_rx.await;
                    });
                }
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                }
            }
        })
        .map_err(|e| format!("cannot start the driver thread: {e}"))?;
    rx.recv_timeout(START_MAX)
        .map_err(|_| "the driver thread did not start".to_owned())?
        .map(|handle| (handle, stop_tx))
}

/// One reading of `tether probe`: a mapped field, interlock or watchdog
/// point read from the live device.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeRow {
    /// What it is (`main.setpoint`, `interlock lid`, `watchdog`).
    pub name: String,
    /// The native point (`holding:0`, a topic, a node id).
    pub point: String,
    /// The declared unit of `declared`.
    pub unit: Option<String>,
    /// The device's own unit of `raw`.
    pub native_unit: Option<String>,
    /// The value in the declared unit (`closed`/`open` for an interlock).
    pub declared: serde_json::Value,
    /// The raw native value.
    pub raw: serde_json::Value,
    /// Why it could not be read.
    pub error: Option<String>,
}

/// Mapping defects of a manifest's `[driver_config]`, for `tether check`:
/// (path under the manifest, message). Simulated kinds check their config
/// when built; network kinds report every defect here.
pub fn check_map(manifest: &DeviceManifest) -> Vec<(String, String)> {
    match manifest.driver.as_str() {
        modbus::KIND => modbus::check(manifest),
        "mqtt" => mqtt::check(manifest),
        opcua::KIND => opcua::check(manifest),
        _ => Vec::new(),
    }
}

/// Reads every mapped point of a network device once, writing nothing.
///
/// # Errors
/// A driver kind with nothing to probe, a bad map, or an unreachable device.
pub async fn probe(
    manifest: &DeviceManifest,
    timeout: std::time::Duration,
) -> Result<Vec<ProbeRow>, String> {
    match manifest.driver.as_str() {
        modbus::KIND => modbus::probe::probe(manifest, timeout).await,
        opcua::KIND => opcua::probe::probe(manifest, timeout).await,
        "mqtt" => {
            // The MQTT probe runs its own client to the end: off this runtime.
            let m = manifest.clone();
            let rows = tokio::task::spawn_blocking(move || mqtt::probe(&m, timeout))
                .await
                .map_err(|e| format!("the probe ended abnormally: {e}"))??;
            Ok(rows
                .into_iter()
                .map(|r| ProbeRow {
                    point: "retained state".into(),
                    native_unit: None,
                    error: None,
                    name: r.name,
                    unit: r.unit,
                    declared: r.declared,
                    raw: r.raw,
                })
                .collect())
        }
        other => Err(format!(
            "driver kind `{other}` has no device to probe (simulated or not a network driver)"
        )),
    }
}

/// Where simulator controls live: `<state_dir>/sim-control/<device_id>.json`,
/// written by `tether sim` and read by the simulated drivers. A file, not a
/// method: nothing a model can reach over JSON-RPC can set an interlock.
#[derive(Clone, Debug, Default)]
pub struct SimEnv {
    /// The control directory; `None` means every simulated contact is closed.
    pub control_dir: Option<std::path::PathBuf>,
}

impl SimEnv {
    /// The simulator controls of a state directory.
    pub fn in_state_dir(state_dir: &std::path::Path) -> Self {
        Self {
            control_dir: Some(state_dir.join("sim-control")),
        }
    }

    /// The control file of a device.
    pub fn control_file(&self, device_id: &str) -> Option<std::path::PathBuf> {
        self.control_dir
            .as_ref()
            .map(|d| d.join(format!("{device_id}.json")))
    }
}

/// Builds the driver a manifest names (no simulator controls).
///
/// # Errors
/// An unknown driver kind or a bad `driver_config`.
pub fn build(manifest: &DeviceManifest) -> Result<Arc<dyn Driver>, String> {
    build_with(manifest, &SimEnv::default())
}

/// Builds the driver a manifest names, with simulator controls.
///
/// # Errors
/// An unknown driver kind or a bad `driver_config`.
pub fn build_with(manifest: &DeviceManifest, env: &SimEnv) -> Result<Arc<dyn Driver>, String> {
    let cfg = manifest
        .driver_config
        .clone()
        .unwrap_or(serde_json::Value::Null);
    match manifest.driver.as_str() {
        "sim.thermostat" => Ok(Arc::new(thermostat::SimThermostat::new(&cfg)?)),
        "sim.arm" => Ok(Arc::new(
            arm::SimArm::new(&cfg)?.with_control(env.control_file(&manifest.device_id)),
        )),
        "sim.relay" => Ok(Arc::new(relay::SimRelay::new(&cfg)?)),
        "remote.arm" => Ok(Arc::new(remote::RemoteArm::new(&cfg)?)),
        modbus::KIND => Ok(Arc::new(modbus::ModbusTcp::new(manifest)?)),
        "mqtt" => Ok(Arc::new(mqtt::MqttDriver::new(manifest)?)),
        opcua::KIND => Ok(Arc::new(opcua::OpcUa::new(manifest)?)),
        other => Err(format!(
            "unknown driver kind `{other}` (known: {})",
            KINDS.join(", ")
        )),
    }
}

/// Builds every driver of a set of manifests, keyed by device id.
///
/// # Errors
/// The first device whose driver cannot be built, with its id.
pub fn build_all<'a>(
    manifests: impl IntoIterator<Item = &'a DeviceManifest>,
) -> Result<HashMap<String, Arc<dyn Driver>>, String> {
    build_all_with(manifests, &SimEnv::default())
}

/// Builds every driver, with simulator controls.
///
/// # Errors
/// The first device whose driver cannot be built, with its id.
pub fn build_all_with<'a>(
    manifests: impl IntoIterator<Item = &'a DeviceManifest>,
    env: &SimEnv,
) -> Result<HashMap<String, Arc<dyn Driver>>, String> {
    let mut out = HashMap::new();
    for m in manifests {
        let d = build_with(m, env).map_err(|e| format!("device `{}`: {e}", m.device_id))?;
        out.insert(m.device_id.clone(), d);
    }
    Ok(out)
}

fn cfg_f64(cfg: &serde_json::Value, key: &str, default: f64) -> Result<f64, String> {
    match cfg.get(key) {
        None => Ok(default),
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite())
            .ok_or_else(|| format!("driver_config.{key} must be a finite number")),
    }
}

/// Sets a simulated contact (`tether sim door`): writes the device's control
/// file atomically (write then rename).
///
/// # Errors
/// I/O errors.
pub fn set_sim_contact(
    env: &SimEnv,
    device_id: &str,
    contact: &str,
    closed: bool,
) -> std::io::Result<()> {
    let Some(path) = env.control_file(device_id) else {
        return Err(std::io::Error::other("no simulator control directory"));
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut doc: serde_json::Map<String, serde_json::Value> = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    doc.insert(
        contact.to_owned(),
        serde_json::json!(if closed { "closed" } else { "open" }),
    );
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::Value::Object(doc).to_string())?;
    std::fs::rename(tmp, path)
}
