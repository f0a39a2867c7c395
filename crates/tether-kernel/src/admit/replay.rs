//! Step 4: the `command_id` claim — fresh, a replay of its recorded
//! outcome, or a reuse that is refused.
//!
//! **Owns:** claiming an id in the in-memory index (`idempotency.rs`), the
//! fall-back to the store once the index has evicted, and giving the claim
//! back when the command is refused before dispatch.
//! **Never belongs here:** what a receipt says (`dispatch/receipt.rs`).
//! **Fail-closed rule:** an index or store that cannot be read refuses the
//! id (`index_unavailable`, `store_unavailable`); it is never run on a guess.

use crate::admit::idempotency::Begin;
use crate::dispatch::answer::Answer;
use crate::kernel::Kernel;
use crate::order::Ctx;
use serde_json::{json, Value};
use tether_core::{Code, Refusal};

/// A retained receipt answered again: marked `"replayed": true`.
pub(crate) fn replayed(mut r: Value) -> Value {
    r["replayed"] = json!(true);
    r
}

impl Kernel {
    /// Step 4: claims the command's id. `Err` is the answer instead of
    /// running: the retained receipt of an id already run (a replay), or a
    /// rejected receipt when the id is bound to something else or cannot be
    /// checked.
    pub(crate) async fn claim_step(&self, ctx: &Ctx) -> Result<(), Answer> {
        let begin = if ctx.id_minted {
            self.claim_minted(&ctx.command_id, &ctx.key)
        } else {
            self.begin_idempotent(&ctx.command_id, &ctx.key)
        };
        match begin {
            Ok(None) => Ok(()),
            Ok(Some(replay)) => Err(replay.into()),
            Err(reason) => {
                let refusal = Refusal::new(
                    Code::ConflictCommandIdReuse,
                    format!(
                        "command_id `{}` was already used ({reason})",
                        ctx.command_id
                    ),
                    json!({"reason": reason, "command_id": ctx.command_id}),
                );
                Err(self.reject_binding(ctx, refusal).await.into())
            }
        }
    }

    pub(crate) fn begin_idempotent(
        &self,
        command_id: &str,
        digest: &str,
    ) -> Result<Option<Value>, &'static str> {
        let begin = match self.inner.idem.lock() {
            Ok(mut ix) => ix.begin(command_id, digest),
            Err(_) => return Err("index_unavailable"),
        };
        match begin {
            Begin::Fresh => Ok(None),
            Begin::Replay(r) => Ok(Some(replayed(r))),
            Begin::Reuse(reason) => Err(reason),
            Begin::Unknown => match self.inner.store.receipt(command_id) {
                Ok(Some(row)) if row.input_digest == digest => Ok(Some(replayed(row.receipt))),
                Ok(Some(_)) => Err("input_differs"),
                Ok(None) => match self.inner.idem.lock() {
                    Ok(mut ix) => {
                        if ix.claim(command_id, digest) {
                            Ok(None)
                        } else {
                            Err("in_flight")
                        }
                    }
                    Err(_) => Err("index_unavailable"),
                },
                // A check that cannot be evaluated refuses.
                Err(_) => Err("store_unavailable"),
            },
        }
    }

    /// Step 4 for an id this endpoint just minted: nothing can hold it yet,
    /// so it is claimed without asking the store (which an index that has
    /// evicted entries would otherwise do for every command).
    pub(crate) fn claim_minted(
        &self,
        command_id: &str,
        digest: &str,
    ) -> Result<Option<Value>, &'static str> {
        let Ok(mut ix) = self.inner.idem.lock() else {
            return Err("index_unavailable");
        };
        if ix.claim(command_id, digest) {
            Ok(None)
        } else {
            Err("in_flight")
        }
    }

    pub(crate) fn abort_idempotent(&self, command_id: &str) {
        if let Ok(mut ix) = self.inner.idem.lock() {
            ix.abort(command_id);
        }
    }
}
