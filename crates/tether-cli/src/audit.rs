//! `tether audit export|verify`: the evidence chain read straight from a
//! state directory's store (no endpoint needed), or verified from an exported
//! JSON Lines file. Exit 1 names the first broken entry.

use crate::cli::AuditAction;
use crate::config;
use crate::store::StoreChoice;
use anyhow::Context;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Runs one `tether audit` action.
pub fn audit(action: AuditAction) -> anyhow::Result<ExitCode> {
    match action {
        AuditAction::Export { state_dir, store } => export(&StoreChoice { state_dir, store }),
        AuditAction::Verify {
            state_dir,
            store,
            file,
        } => verify(StoreChoice { state_dir, store }, file),
    }
}

/// Writes the chain as JSON Lines to standard output.
fn export(choice: &StoreChoice) -> anyhow::Result<ExitCode> {
    let opened = crate::store::open_for_shell(choice)?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let n = opened.store.export_chain(&mut out)?;
    out.flush()?;
    eprintln!("tether: exported {n} entries from the {}", opened.shown);
    Ok(ExitCode::SUCCESS)
}

/// Verifies an exported file (`-` is standard input), a PostgreSQL store or
/// a state directory.
fn verify(choice: StoreChoice, file: Option<PathBuf>) -> anyhow::Result<ExitCode> {
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
        None if choice.url(None).is_some() => {
            let url = choice.url(None).unwrap_or_default();
            tether_store::postgres::verify_url(&url)
                .with_context(|| format!("reading the PostgreSQL store {url}"))?
        }
        None => {
            let dir = config::state_dir(choice.state_dir.as_deref(), None);
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
