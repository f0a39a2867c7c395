//! Steps 5 to 11: the checks between a claimed `command_id` and dispatch.
//!
//! [`Kernel::checks`] runs them in order — latch, mode (replay, hybrid
//! authority, arming), structure, limits, schema bounds, policy (with the
//! approval route), permit, budgets, interlocks — each a function of its own
//! module that answers go-on or a refusal.
//!
//! **Owns:** the checks and the budget reservation they end with.
//! **Never belongs here:** side effects beyond the reservation (which the
//! caller releases on any later refusal) and a new approval (made durable by
//! the order before its hold is answered); the device lock, revisions and
//! the driver (`dispatch/`).
//! **Fail-closed rule:** a check that cannot be evaluated — a poisoned lock,
//! an interlock that reads unknown, a policy evaluation error — refuses.

pub(crate) mod budgets;
pub(crate) mod fields;
pub(crate) mod interlocks;
pub(crate) mod latch;
pub(crate) mod limits;
pub(crate) mod mode;
pub(crate) mod permits;
pub mod policy;
pub(crate) mod structure;

use crate::check::interlocks::check_interlocks;
use crate::check::limits::limits_step;
use crate::check::mode::mode_step;
use crate::check::structure::{check_schema, structure_step};
use crate::dispatch::answer::Answer;
use crate::kernel::Kernel;
use crate::order::Ctx;
use tether_core::Refusal;
use tether_store::BudgetRow;

/// What the checks hand to dispatch.
pub(crate) struct Admitted {
    /// Budget draws reserved in the ledger: drawn durably with the
    /// admission, released on any later refusal.
    pub(crate) reservations: Vec<BudgetRow>,
}

/// Whether the checks may leave what a real command leaves (a new approval
/// for a hold), or must leave nothing at all (a dry run).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Effects {
    /// A command: a hold creates its approval.
    Real,
    /// `Kernel::preflight`: nothing is created; reservations are released
    /// by the caller at once.
    DryRun,
}

impl Kernel {
    /// Steps 5 to 11, in order. Pure checks plus the budget reservation
    /// (released by the caller on any later refusal).
    pub(crate) fn checks(&self, ctx: &Ctx, effects: Effects) -> Result<Admitted, Refusal> {
        let dev = &self.inner.devices[ctx.device];
        let (b, rt) = dev.binding(ctx.binding);
        self.latch_step(ctx, dev, b)?; // 5
        mode_step(dev, b, &ctx.principal)?; // 6: replay, hybrid authority, arming
        structure_step(dev, b, rt, &ctx.input)?; // 7
        limits_step(dev, b, &ctx.input)?; // 8
        check_schema(&rt.full, rt.class_full.as_ref(), &ctx.input)?; // 9: remaining bounds
        crate::stages::step(crate::stages::Stage::Policy, || {
            self.policy_gate(ctx, b, effects)
        })?; // 10: allow / hold / deny, approval route
        if let Some(id) = &ctx.permit_id {
            self.check_permit(id, ctx, false)?; // 10: the permit of this exact input
        }
        let reservations = self.budget_step(ctx, b)?; // 10: budgets
        if let Err(r) = check_interlocks(dev, b) {
            // 11
            self.release_budgets(&reservations);
            return Err(r);
        }
        Ok(Admitted { reservations })
    }

    /// A command the checks refused: a hold answers only once its approval
    /// is durable; the id claim is given back; the rejected receipt is
    /// evidence.
    pub(crate) async fn refuse_checked(&self, ctx: &Ctx, refusal: Refusal) -> Answer {
        let refusal = match ctx.new_approval.get() {
            Some(id) => match self.persist_new_approval(id).await {
                Ok(()) => refusal,
                Err(e) => e,
            },
            None => refusal,
        };
        self.abort_idempotent(&ctx.command_id);
        self.reject_binding(ctx, refusal).await.into()
    }
}
