//! Outcomes owed to the store: the `unknown` receipts of commands whose
//! receipt the store did not take (`finish.rs`), offered to it again until
//! they are on record, so that a restart replays their id instead of
//! running it.
//!
//! **Owns:** the bounded set of owed receipts, the one background recorder
//! that offers them every [`RECORD_RETRY_EVERY`] while any is owed, and the
//! last offer an orderly shutdown makes ([`Kernel::record_owed_outcomes`]).
//! **Never belongs here:** deciding the answer (it is `unknown` before it
//! is owed) or a physical call's finish (its crashed finish record closes
//! it, `dispatch/evidence.rs`).
//! **Fail-closed rule:** an owed id is answered `unknown` from the index in
//! memory whatever happens here; a receipt another writer stored meanwhile
//! (a conflict) is on record, never written twice.

use crate::kernel::Kernel;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tether_store::{Commit, EventDraft, ReceiptRef, StoreError};

/// How often the owed receipts are offered to the store again.
const RECORD_RETRY_EVERY: Duration = Duration::from_millis(250);
/// How long one receipt stays owed before the endpoint gives up on it (it
/// is still answered `unknown` from memory until the process ends).
const RECORD_OWED_FOR: Duration = Duration::from_secs(600);
/// Owed receipts kept at most: a fault under load must not grow memory
/// without bound (the index in memory still answers the rest `unknown`).
const RECORD_OWED_MAX: usize = 10_000;
/// Receipts offered at once: the store's writer takes them as one batch.
const RECORD_CHUNK: usize = 256;

const _: () = assert!(RECORD_CHUNK <= RECORD_OWED_MAX);

/// One receipt owed to the store.
struct OwedRecord {
    /// The command's input digest (the idempotency key).
    key: String,
    receipt: Value,
    since: Instant,
}

#[derive(Default)]
struct State {
    records: HashMap<String, OwedRecord>,
    /// Whether the background recorder runs (at most one does).
    recorder: bool,
}

/// The owed receipts (`Kernel::inner.owed`).
#[derive(Default)]
pub(crate) struct Owed {
    state: Mutex<State>,
}

/// What one offer of an owed receipt came to.
enum Offered {
    /// On record now (stored by this offer, or by another writer).
    Recorded,
    /// The store did not take it; it stays owed.
    Refused,
}

impl Kernel {
    /// Owes `receipt` (an `unknown` answer) to the store under `command_id`
    /// and makes sure the background recorder runs.
    pub(crate) fn owe_record(&self, command_id: &str, key: &str, receipt: Value) {
        let Ok(mut st) = self.inner.owed.state.lock() else {
            tracing::error!(
                command_id,
                "the owed receipts are unusable; this outcome stays answered from memory"
            );
            return;
        };
        if st.records.len() >= RECORD_OWED_MAX && !st.records.contains_key(command_id) {
            tracing::error!(
                command_id,
                max = RECORD_OWED_MAX,
                "too many unrecorded outcomes; this one stays answered from memory"
            );
            return;
        }
        let record = OwedRecord {
            key: key.to_owned(),
            receipt,
            since: Instant::now(),
        };
        st.records.insert(command_id.to_owned(), record);
        if !st.recorder {
            st.recorder = true;
            let kernel = self.clone();
            tokio::spawn(async move { kernel.recorder().await });
        }
    }

    /// How many `unknown` outcomes are not on record yet.
    pub fn owed_outcomes(&self) -> usize {
        self.inner
            .owed
            .state
            .lock()
            .map(|st| st.records.len())
            .unwrap_or(0)
    }

    /// The last offer, at an orderly shutdown: every owed receipt offered
    /// once more, the whole bounded by `wait`. Answers how many are still
    /// not on record (a restart will not know their ids).
    pub async fn record_owed_outcomes(&self, wait: Duration) -> usize {
        let _ = tokio::time::timeout(wait, self.offer_all()).await;
        self.owed_outcomes()
    }

    /// The background recorder: runs while anything is owed. Each round
    /// offers every owed receipt and then drops those owed too long, so it
    /// ends once the store took them all or the last one expired.
    async fn recorder(self) {
        loop {
            tokio::time::sleep(RECORD_RETRY_EVERY).await;
            self.offer_all().await;
            let Ok(mut st) = self.inner.owed.state.lock() else {
                return;
            };
            st.records.retain(|id, r| {
                let keep = r.since.elapsed() < RECORD_OWED_FOR;
                if !keep {
                    tracing::error!(command_id = %id, "an unknown outcome could not be recorded; it stays answered from memory");
                }
                keep
            });
            if st.records.is_empty() {
                st.recorder = false;
                return;
            }
        }
    }

    /// Offers every receipt owed now, [`RECORD_CHUNK`] at a time.
    async fn offer_all(&self) {
        let ids: Vec<String> = self
            .inner
            .owed
            .state
            .lock()
            .map(|st| st.records.keys().cloned().collect())
            .unwrap_or_default();
        for chunk in ids.chunks(RECORD_CHUNK) {
            self.offer(chunk).await;
        }
    }

    /// Offers the owed receipts of `ids` at once (the writer batches them;
    /// a conflict fails alone) and forgets each that is on record.
    async fn offer(&self, ids: &[String]) {
        let mut tasks = tokio::task::JoinSet::new();
        for id in ids {
            let Some(commit) = self.owed_commit(id) else {
                continue;
            };
            let (kernel, id) = (self.clone(), id.clone());
            tasks.spawn(async move {
                let offered = match kernel.commit(commit).await {
                    // A conflict: someone recorded it meanwhile (a crashed
                    // finish, or the shutdown's offer racing this one).
                    Ok(_) | Err(StoreError::Conflict(_)) => Offered::Recorded,
                    Err(_) => Offered::Refused,
                };
                (id, offered)
            });
        }
        while let Some(done) = tasks.join_next().await {
            if let Ok((id, Offered::Recorded)) = done {
                self.forget_owed(&id);
            }
        }
    }

    /// The late record of an owed receipt (`None` once it is not owed).
    fn owed_commit(&self, command_id: &str) -> Option<Commit> {
        let st = self.inner.owed.state.lock().ok()?;
        let r = st.records.get(command_id)?;
        Some(Commit {
            events: vec![EventDraft {
                kind: "receipt".into(),
                body:
                    json!({"command_id": command_id, "receipt": r.receipt, "recorded_late": true})
                        .into(),
            }],
            receipts: vec![ReceiptRef {
                command_id: command_id.to_owned(),
                input_digest: r.key.clone(),
                event: 0,
            }],
            ..Commit::default()
        })
    }

    /// On record: a replay reads it from the store from now on.
    fn forget_owed(&self, command_id: &str) {
        let key = match self.inner.owed.state.lock() {
            Ok(mut st) => st.records.remove(command_id).map(|r| r.key),
            Err(_) => None,
        };
        if let (Some(key), Ok(mut ix)) = (key, self.inner.idem.lock()) {
            ix.complete_stored(command_id, &key);
        }
    }
}
