//! `tether describe`: a device's generated reference file (limits with units
//! and sources, safety declarations), as Markdown or JSON; and `tether
//! probe`: a network device's mapped points read live, writing nothing.

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

/// Reads every mapped point of `device` once and prints a table: name,
/// native point, value in the declared unit, raw native value. Exit 1 when
/// any point could not be read.
pub fn probe(device: &str, config: &std::path::Path, timeout_ms: u64) -> anyhow::Result<ExitCode> {
    let loaded = config::read(Some(config)).map_err(|d| defects_error(&d))?;
    let cell = config::load_cell(&loaded).map_err(|d| defects_error(&d))?;
    let Some(spec) = cell.devices.iter().find(|d| d.manifest.device_id == device) else {
        bail!("no device `{device}` in {}", config.display());
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let timeout = std::time::Duration::from_millis(timeout_ms);
    let rows = runtime
        .block_on(tether_drivers::probe(&spec.manifest, timeout))
        .map_err(anyhow::Error::msg)?;
    println!(
        "{:<24} {:<14} {:>14} {:<8} {:>14} {:<8}",
        "point", "native", "declared", "unit", "raw", "native unit"
    );
    let mut unreadable = 0;
    for r in &rows {
        let unit = r.unit.as_deref().unwrap_or("-");
        let native_unit = r.native_unit.as_deref().unwrap_or("-");
        match &r.error {
            None => println!(
                "{:<24} {:<14} {:>14} {:<8} {:>14} {:<8}",
                r.name,
                r.point,
                r.declared.to_string(),
                unit,
                r.raw.to_string(),
                native_unit
            ),
            Some(e) => {
                unreadable += 1;
                println!("{:<24} {:<14} unreadable: {e}", r.name, r.point);
            }
        }
    }
    println!(
        "{} point(s) read from {device}; nothing was written",
        rows.len() - unreadable
    );
    Ok(if unreadable == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
