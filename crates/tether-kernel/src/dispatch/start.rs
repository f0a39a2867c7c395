//! A dispatched command's start: the admission evidence, made durable before
//! dispatch when the call is physical, long-running or budgeted, and the
//! governed stop read again right before the driver is called.
//!
//! **Fail-closed rule:** a start that cannot be made durable is a refusal
//! (`started_not_durable`); a stop that cannot be read refuses a physical call.

use crate::check::Admitted;
use crate::dispatch::answer::Answer;
use crate::dispatch::receipt::Admission;
use crate::kernel::Kernel;
use crate::loader::BindingSpec;
use crate::order::Ctx;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use tether_core::receipt::now_ms;
use tether_core::{Code, Refusal};
use tether_store::{BudgetRow, Commit, EventDraft, OpenOp, StoreError};

impl Kernel {
    /// Makes the start durable when it must be, and answers where the
    /// admission is recorded. A physical call, or one that draws a budget,
    /// waits until its admission is durable before dispatch; a simulated
    /// call writes its admission in the same commit as its receipt (nothing
    /// physical can happen in between, and one commit instead of two halves
    /// the evidence cost of the common case). `Err` is the answer instead of
    /// dispatching: the registration is undone and what the checks took is
    /// given back.
    pub(crate) async fn durable_start(
        &self,
        ctx: &Ctx,
        b: &BindingSpec,
        admitted: &Admitted,
        op_id: &str,
        before: u64,
    ) -> Result<Admission, Answer> {
        if b.is_read() {
            return Ok(Admission::Recorded);
        }
        let dev = &self.inner.devices[ctx.device];
        // A call whose admission is durable before dispatch (it draws a
        // budget) also leaves its open operation: killed before its receipt,
        // start-up records the id's outcome (`unknown`) instead of leaving
        // an admitted id without one, whose resend would draw again.
        let tracked = Kernel::start_is_tracked(dev.spec.manifest.mode, b)
            || !admitted.reservations.is_empty();
        if !tracked {
            // The receipt repeats the binding, input digest and operation;
            // the admission part keeps only what the receipt lacks.
            return Ok(Admission::WithReceipt(b.risk.as_str()));
        }
        let commit = self.admission_commit(ctx, b, admitted, op_id, (tracked, before));
        if let Err(e) = self.commit_admission(ctx, commit).await {
            self.unregister_op(op_id);
            if matches!(e, StoreError::Conflict(_)) && tracked {
                // Another process on this store ran or runs this id.
                return Err(self.ran_elsewhere(ctx, &admitted.reservations).await);
            }
            if let StoreError::BudgetExceeded(exceeded) = &e {
                // Another process on this store drew first: the store's
                // ledger is the truth, and nothing of the admission is stored.
                let refusal = self.store_budget_refusal(ctx, b, exceeded);
                return Err(self
                    .refuse_admitted(ctx, &admitted.reservations, refusal)
                    .await);
            }
            let refusal = Refusal::new(
                Code::EvidenceUnavailable,
                "the admission could not be made durable, so nothing was dispatched",
                json!({"reason": "started_not_durable", "store_error": e.to_string()}),
            );
            return Err(self
                .refuse_admitted(ctx, &admitted.reservations, refusal)
                .await);
        }
        // The stop and the arming are read again once the admission is
        // durable, right before dispatch: a trip or disarm another process
        // made durable while this admission was being written refuses the
        // call (the first read came before that wait).
        if dev.spec.manifest.mode.is_physical() && Kernel::is_effectful(b) {
            if let Err(r) = self.reread_governed_stop(ctx.device) {
                self.unregister_op(op_id);
                let answer = self.refuse_admitted(ctx, &admitted.reservations, r).await;
                let op = tracked.then_some(ctx.command_id.as_str());
                self.undo_admission(op, &admitted.reservations).await;
                return Err(answer);
            }
        }
        Ok(Admission::Recorded)
    }

    /// The admission commit: the `command.admitted` entry, the budget draws
    /// and, for a tracked call, its open operation — if the process dies
    /// before the finish is recorded, start-up finds it and records a
    /// crashed finish (`unknown`) under its id.
    fn admission_commit(
        &self,
        ctx: &Ctx,
        b: &BindingSpec,
        admitted: &Admitted,
        op_id: &str,
        (tracked, before): (bool, u64),
    ) -> Commit {
        let dev = &self.inner.devices[ctx.device];
        let open_ops = if tracked {
            vec![OpenOp {
                command_id: ctx.command_id.clone(),
                info: json!({"device_id": dev.id(), "resource": b.resource, "capability_id": b.capability_id, "operation_id": op_id, "input_digest": ctx.digest, "key": ctx.key, "started_at_ms": now_ms(), "accepted_at_ms": ctx.accepted_at_ms, "mode": dev.spec.manifest.mode.as_str(), "revision_before": before, "instance": self.inner.instance}),
            }]
        } else {
            Vec::new()
        };
        Commit {
            events: vec![EventDraft {
                kind: "command.admitted".into(),
                body: self.admitted_body(ctx, b, op_id).into(),
            }],
            budget_draws: admitted.reservations.clone(),
            open_ops,
            ..Commit::default()
        }
    }

    /// Before a physical call: the watcher is healthy and the store's latch
    /// rows hold no trip this process has not applied. A stop that cannot be
    /// read refuses the call.
    pub(crate) fn reread_governed_stop(&self, d: usize) -> Result<(), Refusal> {
        let dev = &self.inner.devices[d];
        let unreadable = |why: String| {
            Refusal::new(
                Code::SafetyEstopEngaged,
                "the governed stop cannot be read, so no physical call may start",
                json!({"reason": "stop_unreadable", "detail": why}),
            )
        };
        if !self.inner.stop_watch.readable() {
            return Err(unreadable(
                "the stop watcher has not read the store recently".into(),
            ));
        }
        // Other processes' rows: this process's own latches are in memory.
        let rows = self
            .inner
            .store
            .latches_committed()
            .map_err(|e| unreadable(e.to_string()))?;
        if let Some(ev) = crate::safety::governed::newest_event(&rows, dev.id()) {
            // A trip this process has not applied: newer than what it knows,
            // or known (the watcher records the time first) but not latched
            // here yet (the watcher latches on its own task, a moment later).
            let unapplied = ev.at_ms > dev.latch_event_ms.load(Ordering::SeqCst)
                || !dev.latched.load(Ordering::SeqCst);
            if ev.latched && unapplied {
                return Err(Refusal::new(
                    Code::SafetyEstopEngaged,
                    format!(
                        "a governed stop of `{}` was tripped by another process",
                        dev.id()
                    ),
                    json!({"reason": "governed_stop", "device_id": dev.id(), "tripped_at_ms": ev.at_ms, "latch_reason": ev.reason}),
                ));
            }
        }
        // Arming made by another process (or here since step 6) binds this
        // call too: a disarm this process has not applied yet refuses it.
        if let Some((armed, at_ms)) = crate::safety::governed::arming_of(&rows, dev.id()) {
            if at_ms > dev.arming_ms.load(Ordering::SeqCst) {
                dev.arming_ms.fetch_max(at_ms, Ordering::SeqCst);
                dev.armed.store(armed, Ordering::SeqCst);
            }
        }
        if !dev.armed.load(Ordering::SeqCst) {
            return Err(Refusal::new(
                Code::AuthHardwareDisabled,
                format!("device `{}` was disarmed", dev.id()),
                json!({"reason": "not_armed", "device_id": dev.id()}),
            ));
        }
        Ok(())
    }

    /// The admission commit, carrying the surface's rider. A commit with
    /// budget draws may be refused by the store for them (another process
    /// drew first); the rider then goes back to wait for the rejection's
    /// commit instead of failing with it, since nothing was wrong with it.
    async fn commit_admission(&self, ctx: &Ctx, mut commit: Commit) -> Result<(), StoreError> {
        if commit.budget_draws.is_empty() {
            return self.commit_for(ctx, commit).await.map(|_| ());
        }
        let kept = ctx
            .rider
            .as_ref()
            .and_then(|r| r.board_keeping(&mut commit));
        let durable = self.commit_waiting(commit).await;
        if let Some(kept) = kept {
            if matches!(durable, Err(StoreError::BudgetExceeded(_))) {
                kept.put_back();
            } else {
                kept.land(&durable);
            }
        }
        durable.map(|_| ())
    }

    /// Undoes what a durable admission stored, for a call refused after it
    /// (nothing was dispatched; its rejected receipt is the outcome): the open
    /// operation `command_id` closed, and the budget draws given back in the
    /// store, so every process on it counts them no more.
    pub(crate) async fn undo_admission(&self, command_id: Option<&str>, draws: &[BudgetRow]) {
        if command_id.is_none() && draws.is_empty() {
            return;
        }
        let undo = Commit {
            closed_ops: command_id.map(str::to_owned).into_iter().collect(),
            budget_releases: draws.iter().map(|d| d.reservation_id.clone()).collect(),
            ..Commit::default()
        };
        if let Err(e) = self.commit(undo).await {
            // Start-up closes the operation then (the receipt exists, so
            // nothing is counted twice); a draw not given back keeps counting,
            // which errs on the safe side.
            tracing::warn!(command_id, error = %e, "a refused admission could not be undone in the store");
        }
    }

    pub(crate) fn admitted_body(&self, ctx: &Ctx, b: &BindingSpec, op_id: &str) -> Value {
        let dev = &self.inner.devices[ctx.device];
        json!({
            "command_id": ctx.command_id,
            "operation_id": op_id,
            "device_id": dev.id(),
            "capability_id": b.capability_id,
            "resource": b.resource,
            "input_digest": ctx.digest,
            "principal": ctx.principal.to_json(),
            "session_id": ctx.session_id,
            "decision": "allow",
            "risk": b.risk.as_str(),
            "mode": dev.spec.manifest.mode.as_str(),
        })
    }
}
