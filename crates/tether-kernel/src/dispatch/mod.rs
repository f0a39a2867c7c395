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
pub(crate) mod owed;
pub(crate) mod receipt;
pub(crate) mod registry;
pub(crate) mod rider;
pub(crate) mod run;
pub(crate) mod start;

use crate::admit::replay::replayed;
use crate::check::Admitted;
use crate::dispatch::answer::Answer;
use crate::dispatch::authorized::{Authorized, CallKind};
use crate::dispatch::run::{classify, DriverOutcome};
use crate::driver::CancelToken;
use crate::kernel::{DeviceRt, Kernel};
use crate::loader::BindingSpec;
use crate::order::Ctx;
use crate::ApiError;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tether_core::catalogue::{self};
use tether_core::ids::{self};
use tether_core::manifest::{Concurrency, Mode};
use tether_core::{Code, Refusal, Status};
use tether_store::BudgetRow;
use tokio::sync::MutexGuard;

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

    /// Step 12, in order: everything between an admitted command and its
    /// receipt. A refusal up to the durable start gives back what the
    /// checks took (budget reservations, the permit, the approval, the id
    /// claim) and answers a rejected receipt.
    pub(crate) async fn dispatch(
        &self,
        ctx: Ctx,
        admitted: Admitted,
        caller_cancel: CancelToken,
    ) -> Result<Answer, ApiError> {
        let dev = &self.inner.devices[ctx.device];
        let (b, _) = dev.binding(ctx.binding);
        // A held resource, the device lock, the revision, the deadline, the
        // governed stop read again.
        let (guard, before) = match self.ready_step(&ctx, b).await {
            Ok(ready) => ready,
            Err(r) => return Ok(self.refuse_admitted(&ctx, &admitted.reservations, r).await),
        };
        // The operation registered: the latch checked again, atomically.
        let (op_id, cancel) = match self.register_step(&ctx, b, caller_cancel) {
            Ok(op) => op,
            Err(r) => return Ok(self.refuse_admitted(&ctx, &admitted.reservations, r).await),
        };
        // The start made durable where it must be (fail-closed evidence).
        let admission = match self.durable_start(&ctx, b, &admitted, &op_id, before).await {
            Ok(admission) => admission,
            Err(answer) => return Ok(answer),
        };
        let call = self.mint_call(&ctx, b); // the witness, under the run's deadline
        self.on_dispatch(&ctx, b).await; // a stop cancels the device's operations; the approval is spent
        let returned = self
            .run_driver(dev, b, call.auth, cancel, &op_id, call.deadline)
            .await;
        let outcome = self.outcome(&ctx, b, returned, call.capped); // output validated
        let after = advance_revision(dev, b, outcome.0, before);
        // The device lock covers the effect and its revision, not the wait for
        // the receipt to become durable: holding it across the fsync would
        // serialise every command of the device behind the disk.
        drop(guard);
        self.finish(ctx, b, (before, after), outcome, &op_id, admission)
            .await
    }

    /// The steps before registration that may still refuse: a resource
    /// held by unreconciled physical evidence, the device lock (as the
    /// binding's concurrency asks), the expected revision, the deadline and,
    /// for a physical call, the governed stop. Answers the lock's guard and
    /// the revision before the call.
    async fn ready_step<'k>(
        &'k self,
        ctx: &Ctx,
        b: &BindingSpec,
    ) -> Result<(Option<MutexGuard<'k, ()>>, u64), Refusal> {
        let dev = &self.inner.devices[ctx.device];
        if Kernel::is_effectful(b) {
            if let Some(open) = self.unreconciled(ctx.device, &b.resource) {
                return Err(Refusal::new(
                    Code::EvidenceUnavailable,
                    "the resource is held: a physical call's finish could not be recorded yet",
                    json!({"reason": "physical_evidence_unreconciled", "open_receipts": open}),
                ));
            }
        }
        let guard = self.lock_step(ctx, b).await?;
        let before = dev.revision(&b.resource);
        if let Some(expected) = ctx.expected_revision.filter(|e| *e != before) {
            return Err(Refusal::new(
                Code::ConflictRevision,
                format!("expected revision {expected}, live revision is {before}"),
                json!({"expected_revision": expected, "revision": before}),
            ));
        }
        if Instant::now() >= ctx.deadline {
            return Err(timeout_refusal("checks"));
        }
        // Stops and safe-state actions are exempt: they always run.
        if dev.spec.manifest.mode.is_physical() && Kernel::is_effectful(b) {
            self.reread_governed_stop(ctx.device)?;
        }
        Ok((guard, before))
    }

    /// The device lock as the binding's concurrency asks: none (shared), at
    /// once or refused (exclusive), or waited for until the deadline
    /// (serialized).
    async fn lock_step<'k>(
        &'k self,
        ctx: &Ctx,
        b: &BindingSpec,
    ) -> Result<Option<MutexGuard<'k, ()>>, Refusal> {
        let dev = &self.inner.devices[ctx.device];
        match Kernel::concurrency(b) {
            Concurrency::Shared => Ok(None),
            Concurrency::Exclusive => dev.lock.try_lock().map(Some).map_err(|_| {
                Refusal::new(
                    Code::DeviceBusy,
                    format!("device `{}` is busy with an exclusive operation", dev.id()),
                    json!({"concurrency": "exclusive"}),
                )
            }),
            Concurrency::Serialized => {
                let wait = ctx.deadline.saturating_duration_since(Instant::now());
                tokio::time::timeout(wait, dev.lock.lock())
                    .await
                    .map(Some)
                    .map_err(|_| timeout_refusal("waiting_for_device_lock"))
            }
        }
    }

    /// Registers the operation under a fresh id. A stop is never
    /// cancelled, so it never runs on the caller's token; nor does a
    /// non-abortable call once dispatched (a caller that gave up before
    /// still refuses it: nothing ran yet).
    fn register_step(
        &self,
        ctx: &Ctx,
        b: &BindingSpec,
        caller_cancel: CancelToken,
    ) -> Result<(String, CancelToken), Refusal> {
        let op_id = ids::mint("op_");
        let cancel = match (Kernel::is_effectful(b), b.abortable) {
            (true, true) => caller_cancel,
            // Given up already: registration sees it and refuses.
            (true, false) if caller_cancel.is_cancelled() => caller_cancel,
            _ => CancelToken::new(),
        };
        self.register_op(ctx, b, &op_id, &cancel)?;
        Ok((op_id, cancel))
    }

    /// The witness for this call, and how long it may run: a time-bounded
    /// binding (`max_duration_ms`) runs no longer than that, whatever
    /// deadline the caller gave (`capped` then says the binding's bound
    /// ends it first).
    fn mint_call(&self, ctx: &Ctx, b: &BindingSpec) -> Call {
        let dev = &self.inner.devices[ctx.device];
        let cap = b
            .max_duration_ms
            .and_then(|ms| Instant::now().checked_add(Duration::from_millis(ms)));
        let deadline = cap.map_or(ctx.deadline, |c| ctx.deadline.min(c));
        let kind = if b.is_stop() {
            CallKind::Stop
        } else {
            CallKind::Effect
        };
        let auth = Authorized::mint(
            dev.id(),
            &b.capability_id,
            &b.resource,
            &b.target,
            ctx.input.clone(),
            &ctx.command_id,
            kind,
            Some(deadline),
        )
        .of_binding(b);
        Call {
            auth,
            deadline,
            capped: deadline < ctx.deadline,
        }
    }

    /// What happens at the moment of dispatch: a stop cancels the running
    /// operations of its device first; a covering approval is spent,
    /// whatever the outcome.
    async fn on_dispatch(&self, ctx: &Ctx, b: &BindingSpec) {
        if b.is_stop() {
            self.cancel_device_ops(ctx.device, "stop requested");
        }
        if let Some(id) = ctx.approval.get() {
            self.spend_approval(id, &ctx.command_id).await;
        }
    }

    /// The driver's outcome as a receipt's status, output and error. A
    /// configure command's output is built by the kernel ({applied,
    /// revision}), so the driver's own answer is not held to the class
    /// output schema.
    fn outcome(
        &self,
        ctx: &Ctx,
        b: &BindingSpec,
        returned: DriverOutcome,
        capped: bool,
    ) -> (Status, Option<Value>, Option<Refusal>) {
        let (_, rt) = self.inner.devices[ctx.device].binding(ctx.binding);
        let is_configure = b.catalogued && b.capability_id == catalogue::CONFIGURE;
        let (status, output, mut error) = classify(returned, (!is_configure).then_some(&rt.output));
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
        (status, output, error)
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

/// The witness of one driver call and how long it may run.
struct Call {
    auth: Authorized,
    deadline: Instant,
    /// The binding's `max_duration_ms` ends the call before the caller's
    /// deadline would.
    capped: bool,
}

/// The revision after the call: a dispatched write or action advances it
/// (whatever its outcome: the device may have changed), a read or a call
/// the device refused does not.
fn advance_revision(dev: &DeviceRt, b: &BindingSpec, status: Status, before: u64) -> u64 {
    if status == Status::Rejected || b.is_read() {
        return before;
    }
    dev.revisions
        .get(&b.resource)
        .map_or(before, |r| r.fetch_add(1, Ordering::SeqCst) + 1)
}
