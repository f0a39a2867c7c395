//! `tether describe`: a device's generated reference file (limits with units
//! and sources, safety declarations), as Markdown or JSON.

use crate::config;
use anyhow::bail;
use std::path::PathBuf;
use std::process::ExitCode;

/// Every defect as one error, one defect a line.
fn defects_error(defects: &[tether_kernel::loader::Defect]) -> anyhow::Error {
    anyhow::anyhow!(defects
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n"))
}

/// Prints the reference of `device` in the cell `config` serves (the
/// built-in cell when absent).
pub fn describe(device: &str, config: Option<PathBuf>, json: bool) -> anyhow::Result<ExitCode> {
    let loaded = config::read(config.as_deref()).map_err(|d| defects_error(&d))?;
    let cell = config::load_cell(&loaded).map_err(|d| defects_error(&d))?;
    let Some(spec) = cell.devices.iter().find(|d| d.manifest.device_id == device) else {
        bail!(
            "no device `{device}` (devices: {})",
            cell.devices
                .iter()
                .map(|d| d.manifest.device_id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&tether_kernel::reference::reference_json(spec))?
        );
    } else {
        print!("{}", tether_kernel::reference::reference_markdown(spec));
    }
    Ok(ExitCode::SUCCESS)
}
