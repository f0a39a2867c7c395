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
pub(crate) mod mode;
pub(crate) mod permits;
pub mod policy;
pub(crate) mod structure;

use crate::check::interlocks::check_interlocks;
use crate::check::latch::latched_refusal;
use crate::check::mode::{check_armed, check_authority};
use crate::check::policy::PolicyStep;
use crate::check::structure::{check_configure_fields, check_schema};
use crate::kernel::Kernel;
use crate::order::Ctx;
use serde_json::json;
use std::sync::atomic::Ordering;
use tether_core::catalogue::{self};
use tether_core::manifest::{Mode, RiskClass};
use tether_core::{Code, Refusal};
use tether_store::BudgetRow;

/// What admission hands to dispatch.
pub(crate) struct Admitted {
    pub(crate) reservations: Vec<BudgetRow>,
}

impl Kernel {
    /// Steps 5 to 11. Pure checks plus the budget reservation (released by
    /// the caller on any later refusal).
    pub(crate) fn admit(&self, ctx: &Ctx, create: bool) -> Result<Admitted, Refusal> {
        let dev = &self.inner.devices[ctx.device];
        let (b, rt) = dev.binding(ctx.binding);
        // Step 5: latch (an operator's safe-place grant lets its one exact command through).
        if Kernel::is_effectful(b) && dev.latched.load(Ordering::SeqCst) {
            match &ctx.safe_place_grant {
                Some(g) => self.check_grant_for(g, ctx.device, ctx.binding, &ctx.digest, false)?,
                None => return Err(latched_refusal(dev)),
            }
        }
        // Step 6: mode, hybrid authority, arming.
        if dev.spec.manifest.mode == Mode::Replay && !b.is_read() {
            return Err(Refusal::new(
                Code::ModeReadOnly,
                "a replay device accepts no commands",
                json!({"mode": "replay"}),
            ));
        }
        check_authority(dev, b, &ctx.principal)?;
        check_armed(dev, b)?;
        // Step 7: structure (configure field rules first).
        if b.catalogued && b.capability_id == catalogue::CONFIGURE {
            check_configure_fields(dev, &b.resource, &ctx.input)?;
        }
        check_schema(&rt.structure, rt.class_structure.as_ref(), &ctx.input)?;
        // Step 8: limits on every element and leaf, then unset operator bounds.
        if let Err(v) = b.limits.check(&ctx.input) {
            let first = &v.first;
            return Err(Refusal::new(
                Code::SafetyEnvelopeViolation,
                format!(
                    "{} = {} violates {} bound {}{} (source: {})",
                    first.path,
                    first.value,
                    first.kind.as_str(),
                    first.bound,
                    first
                        .unit
                        .as_deref()
                        .map(|u| format!(" {u}"))
                        .unwrap_or_default(),
                    first.source
                ),
                v.to_details(),
            ));
        }
        if !b.is_stop() && !b.is_read() {
            let unset = b.limits.unset_paths(&ctx.input);
            if !unset.is_empty() {
                return Err(Refusal::new(
                    Code::SafetyLimitsUnset,
                    "the input sets a value whose bound is operator_required and no operator overlay filled it",
                    json!({"paths": unset, "reason": "operator_required"}),
                ));
            }
            // CORE-046 (strict): a physical call at R1 or above never sets a
            // number no limit bounds. Tether always runs strict.
            if dev.spec.manifest.mode.is_physical() && b.risk >= RiskClass::R1 {
                let unbounded = b.limits.unlimited_set_paths(&ctx.input);
                if !unbounded.is_empty() {
                    return Err(Refusal::new(
                        Code::SafetyLimitsUnset,
                        "the input sets a number no limit bounds; a hardware call at R1 or above needs a limit on every number it sets",
                        json!({"paths": unbounded, "reason": "no_limit"}),
                    ));
                }
            }
        }
        // Step 9: remaining schema bounds.
        check_schema(&rt.full, rt.class_full.as_ref(), &ctx.input)?;
        // Step 10: policy (allow / hold / deny, with the approval route), then
        // the permit bound to the exact input digest, then budgets.
        match self.policy_step(ctx, b, create) {
            PolicyStep::Go { approval } => {
                if let Some(id) = approval {
                    let _ = ctx.approval.set(id);
                }
            }
            PolicyStep::Refused {
                refusal,
                new_approval,
            } => {
                if let Some(id) = new_approval {
                    let _ = ctx.new_approval.set(id);
                }
                return Err(refusal);
            }
        }
        if let Some(id) = &ctx.permit_id {
            self.check_permit(id, ctx, false)?;
        }
        let reservations = if Kernel::is_effectful(b) {
            self.reserve_budgets(ctx, b)?
        } else {
            Vec::new()
        };
        // Step 11: interlocks.
        if let Err(r) = check_interlocks(dev, b) {
            self.release_budgets(&reservations);
            return Err(r);
        }
        Ok(Admitted { reservations })
    }
}
