//! Signed evidence at the endpoint: the `[evidence]` config table, the
//! checkpointer started when the state directory holds a signing key, and
//! the newest checkpoint kept beside the store ([`CHECKPOINT_FILE`]).

use crate::keys;
use anyhow::Context;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tether_kernel::checkpoints::{CheckpointSettings, Checkpointer};
use tether_kernel::Kernel;
use tether_store::checkpoint::SavedCheckpoint;

/// The newest signed checkpoint, beside the store (replaced atomically).
pub const CHECKPOINT_FILE: &str = "evidence-checkpoint.json";

/// Default: sign after this many new entries.
pub const CHECKPOINT_EVERY_ENTRIES_DEFAULT: u64 = 1000;

/// Default: sign at least this often while entries arrive, ms.
pub const CHECKPOINT_EVERY_MS_DEFAULT: u64 = 1000;

/// Largest accepted `checkpoint_every_ms` (one hour).
pub const CHECKPOINT_EVERY_MS_MAX: u64 = 3_600_000;

/// Largest accepted `checkpoint_every_entries`.
pub const CHECKPOINT_EVERY_ENTRIES_MAX: u64 = 1_000_000;

/// The `[evidence]` table. Every key is optional; unknown keys are refused.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvidenceConfig {
    /// Sign a checkpoint after this many new entries (default 1000).
    pub checkpoint_every_entries: Option<u64>,
    /// Sign a checkpoint at least this often while entries arrive, in ms
    /// (default 1000).
    pub checkpoint_every_ms: Option<u64>,
}

impl EvidenceConfig {
    /// Every value out of its range, as `(key, message)`.
    pub fn defects(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if let Some(n) = self.checkpoint_every_entries {
            if !(1..=CHECKPOINT_EVERY_ENTRIES_MAX).contains(&n) {
                out.push((
                    "evidence.checkpoint_every_entries".into(),
                    format!("must be between 1 and {CHECKPOINT_EVERY_ENTRIES_MAX}"),
                ));
            }
        }
        if let Some(ms) = self.checkpoint_every_ms {
            if !(1..=CHECKPOINT_EVERY_MS_MAX).contains(&ms) {
                out.push((
                    "evidence.checkpoint_every_ms".into(),
                    format!("must be between 1 and {CHECKPOINT_EVERY_MS_MAX} (ms)"),
                ));
            }
        }
        out
    }
}

/// Starts the checkpointer when `dir` holds a signing key; without one says
/// once that evidence is unsigned and answers `None`.
///
/// # Errors
/// A key file that is refused (its mode, its content).
pub fn start(
    kernel: &Kernel,
    runtime: &tokio::runtime::Handle,
    dir: &Path,
    cfg: &EvidenceConfig,
) -> anyhow::Result<Option<Checkpointer>> {
    let Some(signer) = keys::load(dir)? else {
        eprintln!(
            "tether: evidence is unsigned: no signing key in {} (`tether keys init` creates one)",
            dir.display()
        );
        return Ok(None);
    };
    let every_entries = cfg
        .checkpoint_every_entries
        .unwrap_or(CHECKPOINT_EVERY_ENTRIES_DEFAULT);
    let every_ms = cfg
        .checkpoint_every_ms
        .unwrap_or(CHECKPOINT_EVERY_MS_DEFAULT);
    eprintln!(
        "tether: evidence is signed: a checkpoint every {every_entries} entries or {every_ms} ms (key id {}), the newest in {}",
        signer.key_id(),
        dir.join(CHECKPOINT_FILE).display()
    );
    let file = dir.join(CHECKPOINT_FILE);
    let on_signed = Arc::new(move |saved: &SavedCheckpoint| {
        let mut text = saved.to_text();
        text.push('\n');
        if let Err(e) = keys::write_atomically(&file, text.as_bytes(), 0o644) {
            tracing::warn!(error = %format!("{e:#}"), "the newest checkpoint could not be written beside the store");
        }
    });
    Ok(Some(kernel.start_checkpointer(
        runtime,
        CheckpointSettings {
            signer: Arc::new(signer),
            every_entries,
            every_ms,
            on_signed,
        },
    )))
}

/// At orderly shutdown: the last checkpoint (bounded wait).
pub async fn finish(checkpointer: Option<&Checkpointer>) {
    let Some(c) = checkpointer else { return };
    match tokio::time::timeout(FINAL_CHECKPOINT_WAIT, c.final_checkpoint()).await {
        Ok(Ok(Some(saved))) => {
            eprintln!(
                "tether: signed the final checkpoint (entry seq {})",
                saved.entry_seq
            );
        }
        // The periodic checkpoint already signed the head: the chain ends
        // signed all the same (said, so the operator need not guess).
        Ok(Ok(None)) => {
            eprintln!(
                "tether: the chain ends signed (nothing was appended since the last checkpoint)"
            );
        }
        Ok(Err(e)) => eprintln!("tether: the final checkpoint could not be recorded: {e}"),
        Err(_) => eprintln!("tether: the final checkpoint timed out"),
    }
}

/// Longest wait for the final checkpoint at shutdown.
const FINAL_CHECKPOINT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Reads a saved checkpoint file.
///
/// # Errors
/// The file cannot be read or is not a saved checkpoint.
pub fn read_saved(path: &Path) -> anyhow::Result<SavedCheckpoint> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    SavedCheckpoint::parse(&text)
        .map_err(|e| anyhow::anyhow!("{} is not a saved checkpoint: {e}", path.display()))
}

/// The checkpoint file of a state directory.
pub fn checkpoint_path(dir: &Path) -> PathBuf {
    dir.join(CHECKPOINT_FILE)
}
