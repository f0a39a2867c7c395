//! Step 10's budgets: cumulative limits reserved before dispatch and
//! drawn durably with the admission.
//!
//! Two ledgers, one truth. The store's journal is the ledger every process
//! on the store draws from: each draw carries its budget's cap
//! ([`tether_store::BudgetCap`]) and the store's writer refuses it, inside
//! the transaction that would store it, when the key's counted draws plus
//! this one exceed the cap — so two endpoints drawing at once never exceed a
//! budget together. This process's in-memory ledger is a fast pre-check at
//! step 10 (it holds this process's reservations before they are durable);
//! when it refuses, the store's sum is asked before the refusal stands,
//! since the in-memory ledger may still count draws another process has
//! given back since this one started.
//!
//! **Owns:** the reservation of every budget a command draws from, the
//! refusal of a draw the store would not take, and the release of both on a
//! later refusal.
//! **Never belongs here:** the budget arithmetic (`tether_limits::budget`).
//! **Fail-closed rule:** a ledger that cannot be locked, a store that cannot
//! be asked, or a value a budget cannot draw from, refuses; a reservation
//! is never proceed-and-true-up.

use crate::kernel::Kernel;
use crate::loader::BindingSpec;
use crate::order::Ctx;
use serde_json::{json, Value};
use tether_core::receipt::now_ms;
use tether_core::{Code, Refusal};
use tether_store::{BudgetCap, BudgetExceeded, BudgetRow};

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

/// The refusal of a draw that does not fit: `used` is what the budget's
/// counted draws already sum to (in the ledger that refused it).
fn cumulative_refusal(rule: &tether_limits::BudgetRule, used: f64, amount: f64) -> Refusal {
    let used = if used.is_finite() {
        json!(used)
    } else {
        Value::Null
    };
    Refusal::new(
        Code::SafetyCumulativeLimit,
        format!(
            "cumulative budget of {} over {} would be exceeded",
            rule.path,
            rule.window.as_str()
        ),
        json!({"used": used, "limit": rule.limit, "requested": amount, "window": rule.window.as_str(), "limit_path": rule.path.to_string(), "unit": rule.unit}),
    )
}

/// The ledger key of a budget: `device/capability/path/window`, and the
/// session id for a `session` window (read back by `kernel/start.rs`).
fn budget_key(
    device_id: &str,
    b: &BindingSpec,
    rule: &tether_limits::BudgetRule,
    session_id: Option<&str>,
) -> String {
    let mut key = format!(
        "{}/{}/{}/{}",
        device_id,
        b.capability_id,
        rule.path,
        rule.window.as_str()
    );
    if rule.window == tether_limits::budget::Window::Session {
        key.push('/');
        key.push_str(session_id.unwrap_or("-"));
    }
    key
}

/// The reservation id of a command's draw from its binding's budget `i`.
fn reservation_id(command_id: &str, i: usize) -> String {
    format!("{command_id}#{i}")
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
        let mut rows: Vec<BudgetRow> = Vec::new();
        for (i, rule) in rules.iter().enumerate() {
            let amount = b
                .limits
                .draw_amount(&ctx.input, rule)
                .map_err(|e| budget_draw_refusal(rule, &e))?;
            if amount == 0.0 {
                continue;
            }
            let row = BudgetRow {
                key: budget_key(dev.id(), b, rule, ctx.session_id.as_deref()),
                reservation_id: reservation_id(&ctx.command_id, i),
                amount,
                ts_ms: now,
                released: false,
                cap: Some(BudgetCap {
                    limit: rule.limit,
                    window_ms: rule.window.duration_ms(),
                }),
            };
            let reserved = ledger.try_reserve(
                &row.key,
                rule.window,
                rule.limit,
                amount,
                now,
                &row.reservation_id,
            );
            if let Err(ex) = reserved {
                let refused = match ex {
                    tether_limits::budget::BudgetError::Exceeded { used, .. } => {
                        self.store_admits(&row, used)
                    }
                    _ => Err(f64::NAN),
                };
                match refused {
                    // The store's journal has room: the draw goes on to the
                    // store's own check, and this ledger counts it from now.
                    Ok(()) => {
                        // A ledger that cannot hold it (a full key) only
                        // loses the pre-check; the store still checks.
                        let _ =
                            ledger.record(&row.key, rule.window, amount, now, &row.reservation_id);
                    }
                    Err(used) => {
                        for r in &rows {
                            ledger.release(&r.reservation_id);
                        }
                        return Err(cumulative_refusal(rule, used, amount));
                    }
                }
            }
            rows.push(row);
        }
        Ok(rows)
    }

    /// Whether the store's journal, which every process on the store draws
    /// from, has room for `row` where this process's ledger found `used`
    /// (`Err`: what the refusal reports as used, the store's sum when it
    /// could be read, else the ledger's).
    fn store_admits(&self, row: &BudgetRow, ledger_used: f64) -> Result<(), f64> {
        let Some(cap) = &row.cap else {
            return Err(ledger_used);
        };
        match self
            .inner
            .store
            .budget_used(&row.key, cap.counts_from_ms(row.ts_ms))
        {
            Ok(used) if cap.check(row, used).is_ok() => Ok(()),
            Ok(used) => Err(used),
            Err(e) => {
                tracing::warn!(key = %row.key, error = %e, "the budget journal could not be read; the draw is refused");
                Err(ledger_used)
            }
        }
    }

    /// The refusal of a command whose draw the store refused (another
    /// process drew first): the same `CUMULATIVE_LIMIT` and details as the
    /// in-memory ledger's, `used` as the store counted it.
    pub(crate) fn store_budget_refusal(
        &self,
        ctx: &Ctx,
        b: &BindingSpec,
        exceeded: &BudgetExceeded,
    ) -> Refusal {
        let rules = b.limits.budgets();
        match (0..rules.len())
            .find(|i| reservation_id(&ctx.command_id, *i) == exceeded.reservation_id)
        {
            Some(i) => cumulative_refusal(&rules[i], exceeded.used, exceeded.amount),
            None => Refusal::new(
                Code::SafetyCumulativeLimit,
                "a cumulative budget would be exceeded",
                json!({"used": exceeded.used, "limit": exceeded.limit, "requested": exceeded.amount}),
            ),
        }
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
