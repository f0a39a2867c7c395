//! Signed checkpoints of the evidence chain, made in the background.
//!
//! **Owns:** [`Kernel::start_checkpointer`] and the [`Checkpointer`] it
//! answers: a task that reads the chain head every [`CHECKPOINT_POLL_MS_MAX`]
//! ms at most, signs it once `every_entries` entries or `every_ms` ms have
//! passed since the last checkpoint, and appends the signed checkpoint as a
//! chain entry of its own (`evidence.checkpoint`, format in
//! `tether_store::checkpoint`); and the last checkpoint at orderly shutdown
//! ([`Checkpointer::final_checkpoint`]).
//! **Never belongs here:** key files and their modes (the CLI), the
//! checkpoint format and its verification (`tether_store::checkpoint`).
//! **Fail-closed rule:** none is needed on the command path, which this never
//! touches: a command never waits for a signature. A checkpoint the store
//! refuses is logged and tried again at the next period; an unsigned stretch
//! of chain is what a verifier then reports ("unsigned tail"), never a
//! checkpoint that claims more than was durable.

use crate::kernel::Kernel;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tether_core::receipt::now_ms;
use tether_store::checkpoint::{CheckpointSigner, SavedCheckpoint, CHECKPOINT_KIND};
use tether_store::{Commit, EventDraft, StoreError};

/// Longest pause between two looks at the chain head (the period is
/// `every_ms` when that is shorter).
pub const CHECKPOINT_POLL_MS_MAX: u64 = 50;

/// Called with each checkpoint once its entry is durable (off the runtime's
/// worker threads: it may write a file).
pub type OnSigned = Arc<dyn Fn(&SavedCheckpoint) + Send + Sync>;

/// What the checkpointer needs.
pub struct CheckpointSettings {
    /// The key.
    pub signer: Arc<CheckpointSigner>,
    /// Sign after this many new entries (≥ 1).
    pub every_entries: u64,
    /// Sign at least this often while entries arrive, in ms (≥ 1).
    pub every_ms: u64,
    /// Told of each durable checkpoint.
    pub on_signed: OnSigned,
}

/// Where the last checkpoint left off.
#[derive(Debug, Clone, Copy)]
struct Mark {
    /// The head the last checkpoint signed.
    signed_seq: u64,
    /// The last checkpoint's own entry (its head needs no checkpoint).
    entry_seq: u64,
    at: Instant,
}

/// The running checkpointer; dropping it stops the task.
pub struct Checkpointer {
    kernel: Kernel,
    settings: Arc<CheckpointSettings>,
    mark: Arc<tokio::sync::Mutex<Mark>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Checkpointer {
    /// Signs the head once more if anything was appended since the last
    /// checkpoint, and stops the periodic task: what an orderly shutdown
    /// calls last, so the chain ends signed. Answers the checkpoint made.
    ///
    /// # Errors
    /// The store could not read the head or make the checkpoint durable.
    pub async fn final_checkpoint(&self) -> Result<Option<SavedCheckpoint>, StoreError> {
        let mut mark = self.mark.lock().await;
        self.task.abort();
        let saved = self
            .kernel
            .checkpoint_once(&self.settings, &mut mark)
            .await?;
        if let Some(s) = &saved {
            let f = self.settings.on_signed.clone();
            let s = s.clone();
            let _ = tokio::task::spawn_blocking(move || f(&s)).await;
        }
        Ok(saved)
    }
}

impl Kernel {
    /// Starts the checkpointer on `runtime` (see the module doc).
    pub fn start_checkpointer(
        &self,
        runtime: &tokio::runtime::Handle,
        settings: CheckpointSettings,
    ) -> Checkpointer {
        let settings = Arc::new(CheckpointSettings {
            every_entries: settings.every_entries.max(1),
            every_ms: settings.every_ms.max(1),
            ..settings
        });
        let mark = Arc::new(tokio::sync::Mutex::new(Mark {
            signed_seq: 0,
            entry_seq: 0,
            at: Instant::now(),
        }));
        let task = runtime.spawn(checkpoint_loop(
            self.clone(),
            settings.clone(),
            mark.clone(),
        ));
        Checkpointer {
            kernel: self.clone(),
            settings,
            mark,
            task,
        }
    }

    /// Signs the head if it moved past the last checkpoint's own entry.
    async fn checkpoint_once(
        &self,
        settings: &CheckpointSettings,
        mark: &mut Mark,
    ) -> Result<Option<SavedCheckpoint>, StoreError> {
        let Some((seq, head_hash)) = self.inner.store.chain_head()? else {
            return Ok(None);
        };
        if seq <= mark.entry_seq {
            return Ok(None);
        }
        let body = settings
            .signer
            .sign(seq, &head_hash, now_ms(), &self.inner.config.endpoint_id);
        let ack = self
            .commit(Commit {
                events: vec![EventDraft {
                    kind: CHECKPOINT_KIND.into(),
                    body: body.clone().into(),
                }],
                ..Commit::default()
            })
            .await?;
        *mark = Mark {
            signed_seq: seq,
            entry_seq: ack.last_seq,
            at: Instant::now(),
        };
        Ok(Some(SavedCheckpoint {
            entry_seq: ack.last_seq,
            entry_hash: ack.head_hash,
            body,
        }))
    }
}

/// The periodic part: runs until the checkpointer is dropped or finished.
async fn checkpoint_loop(
    kernel: Kernel,
    settings: Arc<CheckpointSettings>,
    mark: Arc<tokio::sync::Mutex<Mark>>,
) {
    let poll = Duration::from_millis(settings.every_ms.min(CHECKPOINT_POLL_MS_MAX));
    let period = Duration::from_millis(settings.every_ms);
    let mut tick = tokio::time::interval(poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    // Runs for the life of the endpoint (aborted with it); each round is one
    // head read and at most one signature and commit.
    loop {
        tick.tick().await;
        let mut m = mark.lock().await;
        // After a failure, the next try waits a period, so a failing store
        // is not asked every poll.
        if failing && m.at.elapsed() < period {
            continue;
        }
        let due = match kernel.inner.store.chain_head() {
            Ok(Some((seq, _))) => {
                seq > m.entry_seq
                    && (seq.saturating_sub(m.signed_seq) >= settings.every_entries
                        || m.at.elapsed() >= period)
            }
            Ok(None) => false,
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "the chain head cannot be read for a checkpoint");
                }
                failing = true;
                m.at = Instant::now();
                false
            }
        };
        if !due {
            continue;
        }
        match kernel.checkpoint_once(&settings, &mut m).await {
            Ok(Some(saved)) => {
                failing = false;
                let f = settings.on_signed.clone();
                let _ = tokio::task::spawn_blocking(move || f(&saved)).await;
            }
            Ok(None) => {}
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "a signed checkpoint could not be recorded; trying again");
                }
                failing = true;
                m.at = Instant::now();
            }
        }
    }
}
