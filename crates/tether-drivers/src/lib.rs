//! # tether-drivers — built-in drivers
//!
//! Owns the simulated cell that `tether serve` runs when no config is given:
//! `thermostat-1` ([`thermostat`]), `arm-1` ([`arm`]) and `relay-1`
//! ([`relay`]), their manifests (`cell/*.toml`, shipped as data), and the
//! factory that builds a driver from a manifest's `driver` kind.
//!
//! **Never belongs here:** decisions (limits, latches, grants — the kernel
//! owns them), wire framing, storage. A driver translates and reports signals;
//! it never refuses on its own authority except `Busy`.
//!
//! **Depends on:** tether-core, tether-kernel (for the `Driver` trait and the
//! `Authorized` witness it cannot mint). **Depended on by:** tether-cli.
#![deny(missing_docs)]

pub mod arm;
pub mod relay;
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
pub const KINDS: &[&str] = &["sim.thermostat", "sim.arm", "sim.relay"];

/// Builds the driver a manifest names.
///
/// # Errors
/// An unknown driver kind or a bad `driver_config`.
pub fn build(manifest: &DeviceManifest) -> Result<Arc<dyn Driver>, String> {
    let cfg = manifest
        .driver_config
        .clone()
        .unwrap_or(serde_json::Value::Null);
    match manifest.driver.as_str() {
        "sim.thermostat" => Ok(Arc::new(thermostat::SimThermostat::new(&cfg)?)),
        "sim.arm" => Ok(Arc::new(arm::SimArm::new(&cfg)?)),
        "sim.relay" => Ok(Arc::new(relay::SimRelay::new(&cfg)?)),
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
    let mut out = HashMap::new();
    for m in manifests {
        let d = build(m).map_err(|e| format!("device `{}`: {e}", m.device_id))?;
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
