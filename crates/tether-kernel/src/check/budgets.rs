//! Step 10's budgets: cumulative limits reserved before dispatch and
//! drawn durably with the admission.
//!
//! **Owns:** the reservation of every budget a command draws from, and its
//! release on a later refusal.
//! **Never belongs here:** the budget arithmetic (`tether_limits::budget`).
//! **Fail-closed rule:** a ledger that cannot be locked, or a value a budget
//! cannot draw from, refuses; a reservation is never proceed-and-true-up.

use crate::kernel::Kernel;
use crate::loader::BindingSpec;
use crate::order::Ctx;
use serde_json::{json, Value};
use tether_core::receipt::now_ms;
use tether_core::{Code, Refusal};
use tether_store::BudgetRow;

/// A value a budget cannot draw from (not a number, a sum that is not
/// finite, too many values): refused with the same violation details as a
/// bound's, so a caller can correct it the same way.
pub(crate) fn budget_draw_refusal(
    rule: &tether_limits::BudgetRule,
    e: &tether_limits::budget::DrawError,
) -> Refusal {
    let (path, value) = match e {
        tether_limits::budget::DrawError::NotANumber { path, value } => {
            (path.clone(), value.clone())
        }
        _ => (rule.path.to_string(), Value::Null),
    };
    let violation = json!({"path": path, "kind": "type", "bound": rule.limit, "value": value, "unit": rule.unit, "source": rule.source, "limit_path": rule.path.to_string()});
    let mut details = violation.clone();
    details["violations"] = json!([violation]);
    details["truncated"] = json!(false);
    details["window"] = json!(rule.window.as_str());
    Refusal::new(
        Code::SafetyEnvelopeViolation,
        format!("budget path: {e}"),
        details,
    )
}

impl Kernel {
    pub(crate) fn reserve_budgets(
        &self,
        ctx: &Ctx,
        b: &BindingSpec,
    ) -> Result<Vec<BudgetRow>, Refusal> {
        let rules = b.limits.budgets();
        if rules.is_empty() {
            return Ok(Vec::new());
        }
        let dev = &self.inner.devices[ctx.device];
        let now = now_ms();
        let mut ledger =
            self.inner.budgets.lock().map_err(|_| {
                Refusal::bare(Code::SafetyCumulativeLimit, "budget ledger unavailable")
            })?;
        let mut rows = Vec::new();
        for (i, rule) in rules.iter().enumerate() {
            let amount = b
                .limits
                .draw_amount(&ctx.input, rule)
                .map_err(|e| budget_draw_refusal(rule, &e))?;
            if amount == 0.0 {
                continue;
            }
            let mut key = format!(
                "{}/{}/{}/{}",
                dev.id(),
                b.capability_id,
                rule.path,
                rule.window.as_str()
            );
            if rule.window == tether_limits::budget::Window::Session {
                key.push('/');
                key.push_str(ctx.session_id.as_deref().unwrap_or("-"));
            }
            let reservation_id = format!("{}#{i}", ctx.command_id);
            if let Err(ex) =
                ledger.try_reserve(&key, rule.window, rule.limit, amount, now, &reservation_id)
            {
                for r in &rows {
                    let r: &BudgetRow = r;
                    ledger.release(&r.reservation_id);
                }
                let (used, limit) = match &ex {
                    tether_limits::budget::BudgetError::Exceeded { used, limit, .. } => {
                        (*used, *limit)
                    }
                    _ => (f64::NAN, rule.limit),
                };
                let used = if used.is_finite() {
                    json!(used)
                } else {
                    Value::Null
                };
                return Err(Refusal::new(
                    Code::SafetyCumulativeLimit,
                    format!(
                        "cumulative budget of {} over {} would be exceeded",
                        rule.path,
                        rule.window.as_str()
                    ),
                    json!({"used": used, "limit": limit, "requested": amount, "window": rule.window.as_str(), "limit_path": rule.path.to_string(), "unit": rule.unit}),
                ));
            }
            rows.push(BudgetRow {
                key,
                reservation_id,
                amount,
                ts_ms: now,
                released: false,
            });
        }
        Ok(rows)
    }

    pub(crate) fn release_budgets(&self, rows: &[BudgetRow]) {
        if rows.is_empty() {
            return;
        }
        if let Ok(mut ledger) = self.inner.budgets.lock() {
            for r in rows {
                ledger.release(&r.reservation_id);
            }
        }
    }

    /// Step 10's budgets: an effectful command reserves every draw it makes.
    pub(crate) fn budget_step(
        &self,
        ctx: &Ctx,
        b: &BindingSpec,
    ) -> Result<Vec<BudgetRow>, Refusal> {
        if Kernel::is_effectful(b) {
            self.reserve_budgets(ctx, b)
        } else {
            Ok(Vec::new())
        }
    }
}
