//! `tether audit export|verify`: the evidence chain read straight from a
//! state directory's store (no endpoint needed), or verified from an exported
//! JSON Lines file. Exit 1 names the first broken entry.

use crate::cli::AuditAction;
use crate::config;
use anyhow::Context;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use tether_store::SqliteStore;

/// Runs one `tether audit` action.
pub fn audit(action: AuditAction) -> anyhow::Result<ExitCode> {
    match action {
        AuditAction::Export { state_dir } => export(state_dir),
        AuditAction::Verify { state_dir, file } => verify(state_dir, file),
    }
}

/// Writes the chain as JSON Lines to standard output.
fn export(state_dir: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let dir = config::state_dir(state_dir.as_deref(), None);
    let store = SqliteStore::open(&dir)
        .with_context(|| format!("opening the store in {}", dir.display()))?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let n = tether_store::Store::export_chain(&store, &mut out)?;
    out.flush()?;
    eprintln!("tether: exported {n} entries from {}", dir.display());
    Ok(ExitCode::SUCCESS)
}

/// Verifies an exported file (`-` is standard input) or a state directory.
fn verify(state_dir: Option<PathBuf>, file: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let report = match file {
        // `-` is standard input, as for other Unix tools:
        // `tether audit export | tether audit verify --file -`.
        Some(f) if f.as_os_str() == "-" => {
            tether_store::verify::verify_jsonl(std::io::BufReader::new(std::io::stdin()))
        }
        Some(f) => {
            let fh = std::fs::File::open(&f).with_context(|| format!("opening {}", f.display()))?;
            tether_store::verify::verify_jsonl(std::io::BufReader::new(fh))
        }
        None => {
            let dir = config::state_dir(state_dir.as_deref(), None);
            tether_store::verify::verify_store(&dir)
                .with_context(|| format!("reading the store in {}", dir.display()))?
        }
    };
    match (&report.ok, &report.first_broken) {
        (true, _) => {
            println!("ok: {} entries, chain intact", report.entries);
            Ok(ExitCode::SUCCESS)
        }
        (false, Some(b)) => {
            println!(
                "broken: first broken entry at {b} ({} intact entries before it)",
                report.entries
            );
            Ok(ExitCode::from(1))
        }
        (false, None) => {
            println!("broken: chain did not verify");
            Ok(ExitCode::from(1))
        }
    }
}
