//! A dispatched command's finish: the receipt written once as canonical
//! text, recorded durably with the revision and the open operation closed,
//! then the `command_id` completed in the index.
//!
//! **Fail-closed rule:** a receipt that cannot be made durable is never
//! answered `completed`: it is answered `unknown` (`receipt_not_durable`,
//! `x-tether.evidence: not_durable`), replayed as such, and offered to the
//! store again until it is recorded; for a physical call a smaller crashed
//! finish is recorded instead, or the resource is held
//! (`dispatch/evidence.rs`).

use crate::dispatch::answer::Answer;
use crate::dispatch::receipt::{receipt_event, take_receipt, Admission};
use crate::kernel::Kernel;
use crate::loader::BindingSpec;
use crate::order::Ctx;
use crate::ApiError;
use serde_json::{json, Value};
use tether_core::catalogue::{self};
use tether_core::{Code, Receipt, Refusal, Status};
use tether_store::{Commit, EventDraft, ReceiptRef, RevisionRow, StoreError};

impl Kernel {
    /// Records a dispatched command's receipt and answers it: a call the
    /// device refused before actuating is a rejection like any other; every
    /// other outcome is the id's recorded outcome, durable before it is
    /// answered (or answered as not durable).
    pub(crate) async fn finish(
        &self,
        ctx: Ctx,
        b: &BindingSpec,
        revisions: (u64, u64),
        (status, output, error): (Status, Option<Value>, Option<Refusal>),
        op_id: &str,
        admission: Admission,
    ) -> Result<Answer, ApiError> {
        if status == Status::Rejected {
            // The device refused before actuating: no side effect, like any refusal.
            self.abort_idempotent(&ctx.command_id);
            let refusal =
                error.unwrap_or_else(|| Refusal::bare(Code::DeviceBusy, "the device refused"));
            return Ok(self.reject_binding(&ctx, refusal).await.into());
        }
        let latency_us = u64::try_from(ctx.t0.elapsed().as_micros()).unwrap_or(u64::MAX);
        let receipt = self.dispatched_receipt(&ctx, b, revisions, (status, output, error));
        self.note_finished(op_id, ctx.device, &ctx.principal.id, &receipt);
        // The entry is where the receipt is stored (the receipts table only
        // indexes it). The commit is serialised from a borrow; the answer is
        // the receipt's canonical text, or on the value path the receipt
        // taken back out of the commit, so it is never copied as a tree.
        // An admission recorded before dispatch left an open operation
        // (`durable_start`); the receipt closes it.
        let closes_op = matches!(admission, Admission::Recorded) && !b.is_read();
        let (event, text) = receipt_event(&ctx, receipt, latency_us, op_id, admission);
        let commit = self.receipt_commit(&ctx, b, event, (revisions.1, closes_op));
        let (durable, answer) = match text {
            // The store moves the canonical body in; the answer is the text.
            Some(text) => (self.commit_for(&ctx, commit).await, Answer::Canonical(text)),
            None => {
                let mut commit = commit;
                let durable = self.commit_ref_for(&ctx, &mut commit).await;
                (durable, Answer::Value(take_receipt(commit)))
            }
        };
        match durable {
            Ok(_) => {
                // Stored: a replay reads it back from the store, so the index
                // keeps only the id and digest.
                if let Ok(mut ix) = self.inner.idem.lock() {
                    ix.complete_stored(&ctx.command_id, &ctx.key);
                }
                Ok(answer)
            }
            Err(e) => {
                let unknown = self.not_durable(&ctx, b, op_id, answer, &e).await;
                // Not stored: the index is the only copy a replay can answer,
                // and it answers `unknown`: the id never runs again here.
                if let Ok(mut ix) = self.inner.idem.lock() {
                    ix.complete(&ctx.command_id, &ctx.key, unknown.clone().into_value());
                }
                // A physical call's finish is reconciled by its own crashed
                // finish record (`not_durable`); the rest are offered again.
                let dev = &self.inner.devices[ctx.device];
                if !(dev.spec.manifest.mode.is_physical() && Kernel::is_effectful(b)) {
                    self.owe_record(&ctx.command_id, &ctx.key, unknown.clone().into_value());
                }
                Ok(unknown)
            }
        }
    }

    /// The typed receipt of a dispatched command (a configure command's
    /// output is what it applied and the revision it made).
    fn dispatched_receipt(
        &self,
        ctx: &Ctx,
        b: &BindingSpec,
        (before, after): (u64, u64),
        (status, output, error): (Status, Option<Value>, Option<Refusal>),
    ) -> Receipt {
        let is_configure = b.catalogued && b.capability_id == catalogue::CONFIGURE;
        let output = if is_configure && status == Status::Completed {
            Some(json!({"applied": ctx.input, "revision": after}))
        } else {
            output
        };
        let mut receipt = self.receipt_base(
            ctx,
            &b.capability_id,
            Some(&b.resource),
            status,
            output,
            error,
        );
        receipt.state_revision_before = Some(before);
        receipt.state_revision_after = Some(after);
        receipt.decision = Some("allow");
        receipt
    }

    /// The receipt's commit: its entry indexed under the command id, the
    /// revision it made, and the open operation it closes.
    fn receipt_commit(
        &self,
        ctx: &Ctx,
        b: &BindingSpec,
        event: EventDraft,
        (after, closes_op): (u64, bool),
    ) -> Commit {
        let dev = &self.inner.devices[ctx.device];
        let revisions = if b.is_read() {
            Vec::new()
        } else {
            vec![RevisionRow {
                device_id: dev.id().to_owned(),
                resource: b.resource.clone(),
                revision: after,
            }]
        };
        let closed_ops = if closes_op {
            vec![ctx.command_id.clone()]
        } else {
            Vec::new()
        };
        Commit {
            events: vec![event],
            receipts: vec![ReceiptRef {
                command_id: ctx.command_id.clone(),
                input_digest: ctx.key.clone(),
                event: 0,
            }],
            revisions,
            closed_ops,
            ..Commit::default()
        }
    }

    /// A receipt the store did not take: no client is told `completed` for
    /// it. The answer is `unknown` (`receipt_not_durable`, what the device
    /// reported kept in the details) with `x-tether` saying why; a physical
    /// call records a crashed finish, or holds its resource.
    async fn not_durable(
        &self,
        ctx: &Ctx,
        b: &BindingSpec,
        op_id: &str,
        answer: Answer,
        e: &StoreError,
    ) -> Answer {
        tracing::error!(command_id = %ctx.command_id, error = %e, "receipt could not be made durable");
        let mut w = answer.into_value();
        let reported = json!({"status": w["status"], "output": w["output"], "error": w["error"]});
        w["status"] = json!(Status::Unknown.as_str());
        w["output"] = Value::Null;
        w["error"] = json!({
            "mhs_code": Code::OutcomeUnknown.as_str(),
            "message": "the command ran, but its receipt could not be made durable: its outcome is not on record; read the device before acting again, and do not resend this command_id",
            "details": {"reason": "receipt_not_durable", "store_error": e.to_string(), "device_reported": reported},
            "retryable": false,
        });
        w["x-tether"] = json!({"evidence": "not_durable", "store_error": e.to_string()});
        let dev = &self.inner.devices[ctx.device];
        if dev.spec.manifest.mode.is_physical() && Kernel::is_effectful(b) {
            let held = self
                .record_crashed_finish(
                    ctx.device,
                    &b.resource,
                    &ctx.command_id,
                    op_id,
                    &ctx.key,
                    "receipt_not_durable",
                )
                .await;
            w["x-tether"]["finish"] = json!(if held {
                "held_unreconciled"
            } else {
                "crashed_finish_recorded"
            });
        }
        w.into()
    }
}
