//! Step 12: from an admitted command to its receipt.
//!
//! [`Kernel::dispatch`] is a sequence: a resource held by unreconciled
//! physical evidence refuses, the device lock, the revision, the deadline,
//! the governed stop read again for physical devices, the operation
//! registered (with a second latch check), the admission made durable when
//! it must be, the [`Authorized`](crate::Authorized) witness minted, the
//! driver called in its own task, the outcome classified, the revision
//! advanced, and the receipt recorded (`finish.rs`).
//!
//! **Owns:** everything that happens to an admitted command.
//! **Never belongs here:** deciding whether it may run (`check/`).
//! **Fail-closed rule:** a physical call never starts unless its start is
//! durable and the governed stop was read; a driver that ignores
//! cancellation past its deadline is reported `unknown`, never `completed`.

pub(crate) mod answer;
pub(crate) mod authorized;
pub(crate) mod evidence;
pub(crate) mod finish;
pub(crate) mod invocations;
pub(crate) mod operations;
pub(crate) mod receipt;
pub(crate) mod registry;
pub(crate) mod rider;
pub(crate) mod run;
pub(crate) mod start;

use crate::admit::replay::replayed;
use crate::check::Admitted;
use crate::dispatch::answer::Answer;
use crate::dispatch::authorized::{Authorized, CallKind};
use crate::dispatch::receipt::Admission;
use crate::dispatch::run::classify;
use crate::driver::CancelToken;
use crate::kernel::Kernel;
use crate::loader::BindingSpec;
use crate::order::Ctx;
use crate::ApiError;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tether_core::catalogue::{self};
use tether_core::ids::{self};
use tether_core::manifest::{Concurrency, Mode};
use tether_core::receipt::now_ms;
use tether_core::{Code, Refusal, Status};
use tether_store::{BudgetRow, Commit, EventDraft, StoreError};

/// CORE-061: a deadline that passed during the checks is
/// `deadline_exceeded_before_dispatch`, wherever it passed (`waiting` says
/// where: the checks, or the wait for the device lock).
pub(crate) fn timeout_refusal(waiting: &str) -> Refusal {
    Refusal::new(
        Code::OutcomeTimeout,
        "the deadline passed before dispatch; nothing was dispatched",
        json!({"reason": "deadline_exceeded_before_dispatch", "while": waiting}),
    )
}

impl Kernel {
    /// Whether a call's start is made durable, as an open operation, before
    /// it is dispatched: every effectful call on a physical device, and on a
    /// simulated one every call that runs for a while (an exclusive or
    /// time-bounded operation, such as a motion). A process that dies while
    /// such a call runs leaves the open operation, and start-up records the
    /// id's outcome as `unknown`, so the same `command_id` is never run a
    /// second time. A simulated instant call (a setpoint) writes its
    /// admission with its receipt: one commit instead of two, and between
    /// dispatch and that commit there is only the driver's own call.
    pub(crate) fn start_is_tracked(mode: Mode, b: &BindingSpec) -> bool {
        if !Kernel::is_effectful(b) {
            return false;
        }
        mode.is_physical() || b.concurrency == Concurrency::Exclusive || b.max_duration_ms.is_some()
    }

    /// Step 12: lock, revision, durable admission evidence, dispatch, output
    /// validation, receipt.
    pub(crate) async fn dispatch(
        &self,
        ctx: Ctx,
        admitted: Admitted,
        caller_cancel: CancelToken,
    ) -> Result<Answer, ApiError> {
        let dev = &self.inner.devices[ctx.device];
        let (b, _) = dev.binding(ctx.binding);
        if Kernel::is_effectful(b) {
            if let Some(open) = self.unreconciled(ctx.device, &b.resource) {
                return Ok(self
                    .refuse_admitted(
                        &ctx,
                        &admitted.reservations,
                        Refusal::new(
                            Code::EvidenceUnavailable,
                            "the resource is held: a physical call's finish could not be recorded yet",
                            json!({"reason": "physical_evidence_unreconciled", "open_receipts": open}),
                        ),
                    )
                    .await);
            }
        }
        let guard = match Kernel::concurrency(b) {
            Concurrency::Shared => None,
            Concurrency::Exclusive => match dev.lock.try_lock() {
                Ok(g) => Some(g),
                Err(_) => {
                    return Ok(self
                        .refuse_admitted(
                            &ctx,
                            &admitted.reservations,
                            Refusal::new(
                                Code::DeviceBusy,
                                format!(
                                    "device `{}` is busy with an exclusive operation",
                                    dev.id()
                                ),
                                json!({"concurrency": "exclusive"}),
                            ),
                        )
                        .await)
                }
            },
            Concurrency::Serialized => {
                let wait = ctx.deadline.saturating_duration_since(Instant::now());
                match tokio::time::timeout(wait, dev.lock.lock()).await {
                    Ok(g) => Some(g),
                    Err(_) => {
                        return Ok(self
                            .refuse_admitted(
                                &ctx,
                                &admitted.reservations,
                                timeout_refusal("waiting_for_device_lock"),
                            )
                            .await)
                    }
                }
            }
        };
        let before = dev.revision(&b.resource);
        if let Some(expected) = ctx.expected_revision {
            if expected != before {
                return Ok(self
                    .refuse_admitted(
                        &ctx,
                        &admitted.reservations,
                        Refusal::new(
                            Code::ConflictRevision,
                            format!("expected revision {expected}, live revision is {before}"),
                            json!({"expected_revision": expected, "revision": before}),
                        ),
                    )
                    .await);
            }
        }
        if Instant::now() >= ctx.deadline {
            return Ok(self
                .refuse_admitted(&ctx, &admitted.reservations, timeout_refusal("checks"))
                .await);
        }
        // Stops and safe-state actions are exempt: they always run.
        if dev.spec.manifest.mode.is_physical() && Kernel::is_effectful(b) {
            if let Err(r) = self.reread_governed_stop(ctx.device) {
                return Ok(self.refuse_admitted(&ctx, &admitted.reservations, r).await);
            }
        }
        let op_id = ids::mint("op_");
        // A stop is never cancelled, so it never runs on the caller's token.
        let cancel = if Kernel::is_effectful(b) {
            caller_cancel
        } else {
            CancelToken::new()
        };
        if let Err(r) = self.register_op(&ctx, b, &op_id, &cancel) {
            return Ok(self.refuse_admitted(&ctx, &admitted.reservations, r).await);
        }
        let mut admission = Admission::Recorded;
        if !b.is_read() {
            // A physical call, or one that draws a budget, waits until its
            // admission is durable before dispatch (fail-closed evidence). A
            // simulated call writes its admission in the same commit as its
            // receipt: nothing physical can happen in between, and one commit
            // instead of two halves the evidence cost of the common case.
            let tracked = Kernel::start_is_tracked(dev.spec.manifest.mode, b);
            let must_be_durable = tracked || !admitted.reservations.is_empty();
            let durable = if must_be_durable {
                // A tracked call's start is also an open operation: if the
                // process dies before its finish is recorded, start-up finds it
                // and records a crashed finish (`unknown`) under its id.
                let open_ops = if tracked {
                    vec![tether_store::OpenOp {
                        command_id: ctx.command_id.clone(),
                        info: json!({"device_id": dev.id(), "resource": b.resource, "capability_id": b.capability_id, "operation_id": op_id, "input_digest": ctx.digest, "key": ctx.key, "started_at_ms": now_ms(), "accepted_at_ms": ctx.accepted_at_ms, "mode": dev.spec.manifest.mode.as_str(), "revision_before": before}),
                    }]
                } else {
                    Vec::new()
                };
                let decision = Commit {
                    events: vec![EventDraft {
                        kind: "command.admitted".into(),
                        body: self.admitted_body(&ctx, b, &op_id).into(),
                    }],
                    budget_draws: admitted.reservations.clone(),
                    open_ops,
                    ..Commit::default()
                };
                self.commit_for(&ctx, decision).await.map(|_| ())
            } else {
                // The receipt repeats the binding, input digest and operation;
                // the admission part keeps only what the receipt lacks.
                admission = Admission::WithReceipt(b.risk.as_str());
                Ok(())
            };
            if let Err(e) = durable {
                self.unregister_op(&op_id);
                if matches!(e, StoreError::Conflict(_)) && tracked {
                    // Another process on this store ran or runs this id.
                    return Ok(self.ran_elsewhere(&ctx, &admitted.reservations).await);
                }
                return Ok(self
                    .refuse_admitted(
                        &ctx,
                        &admitted.reservations,
                        Refusal::new(
                            Code::EvidenceUnavailable,
                            "the admission could not be made durable, so nothing was dispatched",
                            json!({"reason": "started_not_durable", "store_error": e.to_string()}),
                        ),
                    )
                    .await);
            }
            // The stop and the arming are read again once the admission is
            // durable, right before dispatch: a trip or disarm another
            // process made durable while this admission was being written
            // refuses the call (the first read came before that wait).
            if dev.spec.manifest.mode.is_physical() && Kernel::is_effectful(b) {
                if let Err(r) = self.reread_governed_stop(ctx.device) {
                    self.unregister_op(&op_id);
                    let answer = self.refuse_admitted(&ctx, &admitted.reservations, r).await;
                    if tracked {
                        self.close_open_op(&ctx.command_id).await;
                    }
                    return Ok(answer);
                }
            }
        }
        // A time-bounded binding (`max_duration_ms`) runs no longer than that,
        // whatever deadline the caller gave.
        let cap = b.max_duration_ms.map(Duration::from_millis);
        let run_deadline = cap.map_or(ctx.deadline, |d| ctx.deadline.min(Instant::now() + d));
        let capped = run_deadline < ctx.deadline;
        let auth = Authorized::mint(
            dev.id(),
            &b.capability_id,
            &b.resource,
            &b.target,
            ctx.input.clone(),
            &ctx.command_id,
            if b.is_stop() {
                CallKind::Stop
            } else {
                CallKind::Effect
            },
            Some(run_deadline),
        );
        if b.is_stop() {
            // A stop cancels the running operations of its device first.
            self.cancel_device_ops(ctx.device, "stop requested");
        }
        if let Some(id) = ctx.approval.get() {
            // Dispatched: the approval is spent whatever the outcome.
            self.spend_approval(id, &ctx.command_id).await;
        }
        let result = self
            .run_driver(dev, b, auth, cancel, &op_id, run_deadline)
            .await;
        // A configure command's output is built by the kernel ({applied, revision}),
        // so the driver's own answer is not held to the class output schema.
        let is_configure = b.catalogued && b.capability_id == catalogue::CONFIGURE;
        let (_, rt) = dev.binding(ctx.binding);
        let (status, output, mut error) = classify(result, (!is_configure).then_some(&rt.output));
        if let Some(e) = error
            .as_mut()
            .filter(|e| capped && e.code == Code::OutcomeTimeout)
        {
            // The binding's own bound ended it, not the caller's deadline.
            e.message =
                "the operation ran for the binding's max_duration_ms and was cancelled".into();
            e.details["reason"] = json!("max_duration_exceeded");
            e.details["max_duration_ms"] = json!(b.max_duration_ms);
        }
        let after = if status != Status::Rejected && !b.is_read() {
            dev.revisions
                .get(&b.resource)
                .map_or(before, |r| r.fetch_add(1, Ordering::SeqCst) + 1)
        } else {
            before
        };
        // The device lock covers the effect and its revision, not the wait for
        // the receipt to become durable: holding it across the fsync would
        // serialise every command of the device behind the disk.
        drop(guard);
        self.finish(
            ctx,
            b,
            (before, after),
            (status, output, error),
            &op_id,
            admission,
        )
        .await
    }

    pub(crate) async fn refuse_admitted(
        &self,
        ctx: &Ctx,
        reservations: &[BudgetRow],
        refusal: Refusal,
    ) -> Answer {
        self.release_budgets(reservations);
        if let Some(id) = &ctx.permit_id {
            // Refused before dispatch: the permit is given back (a revoked one is gone).
            self.give_back_permit(id);
        }
        if let Some(id) = ctx.approval.get() {
            // Likewise the approval: it was not used.
            self.release_approval(id);
        }
        self.abort_idempotent(&ctx.command_id);
        self.reject_binding(ctx, refusal).await.into()
    }

    /// A command id whose operation another process on this store already
    /// ran (its receipt is the outcome: a replay when this is the same
    /// request) or is running (refused `in_flight`). Nothing is dispatched
    /// here.
    pub(crate) async fn ran_elsewhere(&self, ctx: &Ctx, reservations: &[BudgetRow]) -> Answer {
        if let Ok(Some(row)) = self.inner.store.receipt(&ctx.command_id) {
            if row.input_digest == ctx.key {
                self.release_budgets(reservations);
                self.abort_idempotent(&ctx.command_id);
                return replayed(row.receipt).into();
            }
        }
        let refusal = Refusal::new(
            Code::ConflictCommandIdReuse,
            format!(
                "command_id `{}` already ran or is running on another endpoint of this state directory",
                ctx.command_id
            ),
            json!({"reason": "in_flight", "command_id": ctx.command_id, "where": "another_endpoint"}),
        );
        self.refuse_admitted(ctx, reservations, refusal).await
    }
}
