//! Cumulative budgets: windows, the amount a call draws, and a pure ledger.
//!
//! The ledger holds draws in memory only and never reads a clock: the caller
//! passes `now_ms` and persists draws and releases itself (the store journals
//! them so a restart never refills a window). Keys are opaque strings built by
//! the caller, e.g. `device/cap/path/window[/session]`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::ops::ControlFlow;

use serde_json::Value;

use crate::path::LimitPath;
use crate::walk::{walk, Event};

/// How long a budget remembers a draw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Window {
    /// Every draw under the key counts, for as long as the key lives.
    Session,
    /// Draws of the last hour.
    Rolling1h,
    /// Draws of the last 24 hours.
    Rolling24h,
    /// Draws of the last 7 days.
    Rolling7d,
}

const HOUR_MS: u64 = 3_600_000;

/// Draws older than this are never counted by any window and may be pruned.
pub const RETENTION_MS: u64 = 7 * 24 * HOUR_MS;

/// Most old draws removed per ledger call, so one call never does unbounded work.
pub const PRUNE_PER_CALL_MAX: usize = 64;

/// Most draws kept under one key; beyond it reservations are refused.
pub const DRAWS_PER_KEY_MAX: usize = 100_000;

impl Window {
    /// Parse the wire spelling (`session`, `rolling_1h`, `rolling_24h`, `rolling_7d`).
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "session" => Some(Window::Session),
            "rolling_1h" => Some(Window::Rolling1h),
            "rolling_24h" => Some(Window::Rolling24h),
            "rolling_7d" => Some(Window::Rolling7d),
            _ => None,
        }
    }

    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Window::Session => "session",
            Window::Rolling1h => "rolling_1h",
            Window::Rolling24h => "rolling_24h",
            Window::Rolling7d => "rolling_7d",
        }
    }

    /// The window's length; `None` for [`Window::Session`], which never forgets.
    pub fn duration_ms(self) -> Option<u64> {
        match self {
            Window::Session => None,
            Window::Rolling1h => Some(HOUR_MS),
            Window::Rolling24h => Some(24 * HOUR_MS),
            Window::Rolling7d => Some(RETENTION_MS),
        }
    }
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A rule with `per`: the sum drawn at `path` within `window` may not exceed `limit`.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetRule {
    /// The addressed values.
    pub path: LimitPath,
    /// The budget, in the field's unit.
    pub limit: f64,
    /// How long draws count.
    pub window: Window,
    /// The field's unit.
    pub unit: Option<String>,
    /// The source that declared it (`class`, `binding`, ...).
    pub source: String,
    /// Why the budget exists.
    pub reason: Option<String>,
}

impl BudgetRule {
    /// The rule as JSON for the reference file.
    pub fn to_json(&self) -> Value {
        let mut out = serde_json::json!({
            "path": self.path.to_string(),
            "max": self.limit,
            "per": self.window.as_str(),
            "source": self.source,
        });
        if let Some(unit) = &self.unit {
            out["unit"] = Value::from(unit.as_str());
        }
        if let Some(reason) = &self.reason {
            out["reason"] = Value::from(reason.as_str());
        }
        out
    }
}

/// Why an amount could not be drawn from an input.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DrawError {
    /// An addressed value is not a number (a type violation).
    #[error("{path}: {value} is not a number")]
    NotANumber {
        /// Concrete location.
        path: String,
        /// The value found.
        value: Value,
    },
    /// The sum is not finite.
    #[error("the amount drawn is not finite")]
    NotFinite,
    /// The input addresses too many values to evaluate.
    #[error("the input addresses too many values")]
    TooLarge,
}

/// The amount a call draws: the sum of the magnitudes of every value `path`
/// addresses in `input` (absent values draw nothing). Magnitudes, so a
/// negative value never refunds a budget.
///
/// # Errors
/// [`DrawError::NotANumber`] when an addressed value (or a value on the way)
/// is not what the path needs; [`DrawError::NotFinite`] on overflow.
pub fn draw_amount(input: &Value, path: &LimitPath) -> Result<f64, DrawError> {
    draw_with(input, path, None)
}

pub(crate) fn draw_with<'a>(
    input: &'a Value,
    path: &LimitPath,
    schema: Option<&crate::schema::Resolver<'a>>,
) -> Result<f64, DrawError> {
    let mut sum = 0.0_f64;
    let mut failure = None;
    let mut visit = |event: Event<'a>| -> ControlFlow<()> {
        let (concrete, value) = match event {
            Event::LeafArray { .. } => return ControlFlow::Continue(()),
            Event::Leaf {
                concrete, value, ..
            } => (concrete, value),
            Event::Mismatch {
                concrete, value, ..
            } => (concrete, value),
        };
        match value
            .as_f64()
            .filter(|v| value.is_number() && v.is_finite())
        {
            Some(v) => {
                sum += v.abs();
                ControlFlow::Continue(())
            }
            None => {
                failure = Some(DrawError::NotANumber {
                    path: concrete,
                    value: value.clone(),
                });
                ControlFlow::Break(())
            }
        }
    };
    walk(input, schema, path, &mut visit).map_err(|_| DrawError::TooLarge)?;
    if let Some(err) = failure {
        return Err(err);
    }
    if sum.is_finite() {
        Ok(sum)
    } else {
        Err(DrawError::NotFinite)
    }
}

/// Why a reservation or record was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BudgetError {
    /// The draw would take the window over its limit.
    #[error("budget {key} exceeded: used {used} + {amount} > {limit} ({window})")]
    Exceeded {
        /// The ledger key.
        key: String,
        /// Already drawn within the window.
        used: f64,
        /// The budget.
        limit: f64,
        /// The requested draw.
        amount: f64,
        /// The window.
        window: Window,
    },
    /// The amount is negative or not finite (impossible for amounts made by
    /// [`draw_amount`]; refused rather than trusted).
    #[error("invalid draw amount {0}")]
    InvalidAmount(f64),
    /// The reservation id is already recorded.
    #[error("reservation {0} already recorded")]
    DuplicateReservation(String),
    /// The key was first used with another window.
    #[error("key {key} belongs to window {existing}")]
    WindowMismatch {
        /// The ledger key.
        key: String,
        /// The window the key was created with.
        existing: Window,
    },
    /// The key holds [`DRAWS_PER_KEY_MAX`] draws.
    #[error("key {0} holds too many draws")]
    Full(String),
}

#[derive(Debug, Clone, PartialEq)]
struct Draw {
    amount: f64,
    ts_ms: u64,
    reservation_id: String,
}

#[derive(Debug, Clone, PartialEq)]
struct Account {
    window: Window,
    draws: Vec<Draw>,
    /// No draw is older than this (it may be older than the oldest left
    /// after a release): `prune` passes an account it cannot shorten
    /// without touching its draws.
    oldest_ms: u64,
}

/// One budget a call must fit in, for [`Ledger::try_reserve_all`].
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The ledger key.
    pub key: String,
    /// The key's window.
    pub window: Window,
    /// The budget.
    pub limit: f64,
    /// The amount to draw.
    pub amount: f64,
}

/// Draws per key. Pure: no clock, no I/O.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ledger {
    accounts: BTreeMap<String, Account>,
    /// Every recorded reservation id and how many draws carry it (one per
    /// budget of a call), so a duplicate is found without a scan of every
    /// draw: replaying a window's journal at start-up stays linear in it.
    reservations: HashMap<String, usize>,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Self {
        Ledger::default()
    }

    /// Record a draw unconditionally (replaying a journal on start-up).
    ///
    /// # Errors
    /// [`BudgetError::InvalidAmount`], [`BudgetError::DuplicateReservation`],
    /// [`BudgetError::WindowMismatch`] or [`BudgetError::Full`].
    pub fn record(
        &mut self,
        key: &str,
        window: Window,
        amount: f64,
        ts_ms: u64,
        reservation_id: &str,
    ) -> Result<(), BudgetError> {
        self.admit(key, window, amount, reservation_id)?;
        self.prune(ts_ms);
        let request = Request {
            key: key.to_string(),
            window,
            limit: f64::INFINITY,
            amount,
        };
        self.push_unchecked(&request, ts_ms, reservation_id);
        Ok(())
    }

    /// Checks shared by every write: a valid amount, a fresh id, the key's window.
    fn admit(
        &self,
        key: &str,
        window: Window,
        amount: f64,
        reservation_id: &str,
    ) -> Result<(), BudgetError> {
        if !amount.is_finite() || amount < 0.0 {
            return Err(BudgetError::InvalidAmount(amount));
        }
        if self.has_reservation(reservation_id) {
            return Err(BudgetError::DuplicateReservation(
                reservation_id.to_string(),
            ));
        }
        if let Some(account) = self.accounts.get(key) {
            if account.window != window {
                return Err(BudgetError::WindowMismatch {
                    key: key.to_string(),
                    existing: account.window,
                });
            }
            if account.draws.len() >= DRAWS_PER_KEY_MAX {
                return Err(BudgetError::Full(key.to_string()));
            }
        }
        Ok(())
    }

    fn has_reservation(&self, reservation_id: &str) -> bool {
        self.reservations.contains_key(reservation_id)
    }

    /// One draw carrying `reservation_id` is gone.
    fn forget_draw(&mut self, reservation_id: &str) {
        if let Some(n) = self.reservations.get_mut(reservation_id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.reservations.remove(reservation_id);
            }
        }
    }

    /// Remove every draw of a reservation (a refused command gives its draw
    /// back). Returns how many draws were removed.
    pub fn release(&mut self, reservation_id: &str) -> usize {
        if self.reservations.remove(reservation_id).is_none() {
            return 0;
        }
        let mut removed = 0;
        for account in self.accounts.values_mut() {
            let before = account.draws.len();
            account.draws.retain(|d| d.reservation_id != reservation_id);
            removed += before - account.draws.len();
        }
        self.accounts.retain(|_, a| !a.draws.is_empty());
        removed
    }

    /// The amount drawn under `key` that `window` still counts at `now_ms`.
    /// A rolling window counts draws with `ts_ms > now_ms - duration`.
    pub fn used(&self, key: &str, window: Window, now_ms: u64) -> f64 {
        let Some(account) = self.accounts.get(key) else {
            return 0.0;
        };
        // Before the first full window has elapsed every draw still counts.
        let cutoff = window.duration_ms().and_then(|d| now_ms.checked_sub(d));
        account
            .draws
            .iter()
            .filter(|d| cutoff.is_none_or(|c| d.ts_ms > c))
            .map(|d| d.amount)
            .sum()
    }

    /// Check that `amount` fits and record it, as one step.
    ///
    /// # Errors
    /// [`BudgetError::Exceeded`] when `used + amount > limit`, or any error of
    /// [`Ledger::record`]. Nothing is recorded on error.
    pub fn try_reserve(
        &mut self,
        key: &str,
        window: Window,
        limit: f64,
        amount: f64,
        now_ms: u64,
        reservation_id: &str,
    ) -> Result<(), BudgetError> {
        let request = Request {
            key: key.to_string(),
            window,
            limit,
            amount,
        };
        self.try_reserve_all(std::slice::from_ref(&request), now_ms, reservation_id)
    }

    /// Reserve several budgets at once: either every draw is recorded or
    /// none. When several are exceeded, the one with the least headroom is
    /// reported (the smallest budget wins).
    ///
    /// # Errors
    /// As [`Ledger::try_reserve`].
    pub fn try_reserve_all(
        &mut self,
        requests: &[Request],
        now_ms: u64,
        reservation_id: &str,
    ) -> Result<(), BudgetError> {
        let mut worst: Option<(f64, BudgetError)> = None;
        for req in requests {
            self.admit(&req.key, req.window, req.amount, reservation_id)?;
            let used = self.used(&req.key, req.window, now_ms);
            let headroom = req.limit - used - req.amount;
            if headroom < 0.0 && worst.as_ref().is_none_or(|(h, _)| headroom < *h) {
                let err = BudgetError::Exceeded {
                    key: req.key.clone(),
                    used,
                    limit: req.limit,
                    amount: req.amount,
                    window: req.window,
                };
                worst = Some((headroom, err));
            }
        }
        if let Some((_, err)) = worst {
            return Err(err);
        }
        self.prune(now_ms);
        for req in requests {
            self.push_unchecked(req, now_ms, reservation_id);
        }
        Ok(())
    }

    fn push_unchecked(&mut self, req: &Request, now_ms: u64, reservation_id: &str) {
        let account = self
            .accounts
            .entry(req.key.clone())
            .or_insert_with(|| Account {
                window: req.window,
                draws: Vec::new(),
                oldest_ms: now_ms,
            });
        account.oldest_ms = account.oldest_ms.min(now_ms);
        *self
            .reservations
            .entry(reservation_id.to_string())
            .or_default() += 1;
        account.draws.push(Draw {
            amount: req.amount,
            ts_ms: now_ms,
            reservation_id: reservation_id.to_string(),
        });
    }

    /// Forget up to [`PRUNE_PER_CALL_MAX`] rolling-window draws that no
    /// window counts any more. Session draws are never pruned: a session
    /// window never refills. Returns how many draws were removed.
    pub fn prune(&mut self, now_ms: u64) -> usize {
        let mut budget = PRUNE_PER_CALL_MAX;
        let mut gone = Vec::new();
        for account in self.accounts.values_mut() {
            let Some(len) = account.window.duration_ms() else {
                continue;
            };
            let Some(cutoff) = now_ms.checked_sub(len) else {
                continue;
            };
            // Nothing this old: the account is left untouched (without this,
            // every draw moved on every call, quadratic over a journal).
            if account.oldest_ms > cutoff {
                continue;
            }
            let mut kept = Vec::with_capacity(account.draws.len());
            for draw in account.draws.drain(..) {
                if budget > 0 && draw.ts_ms <= cutoff {
                    budget -= 1;
                    gone.push(draw.reservation_id);
                } else {
                    kept.push(draw);
                }
            }
            account.oldest_ms = kept.iter().map(|d| d.ts_ms).min().unwrap_or(u64::MAX);
            account.draws = kept;
            if budget == 0 {
                break;
            }
        }
        for id in &gone {
            self.forget_draw(id);
        }
        self.accounts.retain(|_, a| !a.draws.is_empty());
        gone.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_parse_and_print() {
        for w in [
            Window::Session,
            Window::Rolling1h,
            Window::Rolling24h,
            Window::Rolling7d,
        ] {
            assert_eq!(Window::parse(w.as_str()), Some(w));
        }
        assert_eq!(Window::parse("daily"), None);
    }

    #[test]
    fn exceeded_budget_records_nothing() {
        let mut ledger = Ledger::new();
        assert!(ledger
            .try_reserve("k", Window::Session, 10.0, 6.0, 0, "r1")
            .is_ok());
        let err = ledger.try_reserve("k", Window::Session, 10.0, 6.0, 1, "r2");
        assert!(matches!(err, Err(BudgetError::Exceeded { used, .. }) if used == 6.0));
        assert_eq!(ledger.used("k", Window::Session, 2), 6.0);
        assert_eq!(ledger.release("r1"), 1);
        assert_eq!(ledger.used("k", Window::Session, 2), 0.0);
    }

    #[test]
    fn a_reservation_id_is_known_until_its_last_draw_is_pruned_or_released() {
        let hour = 3_600_000;
        let mut ledger = Ledger::new();
        let two = [
            Request {
                key: "a".into(),
                window: Window::Rolling1h,
                limit: 100.0,
                amount: 1.0,
            },
            Request {
                key: "b".into(),
                window: Window::Rolling24h,
                limit: 100.0,
                amount: 1.0,
            },
        ];
        assert!(ledger.try_reserve_all(&two, 1_000, "r1").is_ok());
        assert!(matches!(
            ledger.record("c", Window::Session, 1.0, 1_000, "r1"),
            Err(BudgetError::DuplicateReservation(_))
        ));
        // An hour later `a` forgets its draw, `b` still holds one: known.
        assert_eq!(ledger.prune(1_000 + hour), 1);
        assert_eq!(ledger.used("a", Window::Rolling1h, 1_000 + hour), 0.0);
        assert!(ledger
            .record("c", Window::Session, 1.0, 2_000, "r1")
            .is_err());
        // Released everywhere: the id may be drawn again.
        assert_eq!(ledger.release("r1"), 1);
        assert_eq!(ledger.release("r1"), 0);
        assert!(ledger
            .record("c", Window::Session, 1.0, 2_000, "r1")
            .is_ok());
        // Pruned everywhere: likewise.
        assert!(ledger
            .try_reserve("a", Window::Rolling1h, 100.0, 1.0, 5_000, "r2")
            .is_ok());
        assert_eq!(ledger.prune(5_000 + hour), 1);
        assert!(ledger
            .try_reserve("a", Window::Rolling1h, 100.0, 1.0, 6_000 + hour, "r2")
            .is_ok());
    }

    /// A full key's journal replays (as start-up does) draw by draw; each
    /// record once scanned every draw before it and moved them all.
    #[test]
    fn a_full_keys_journal_replays_and_the_next_draw_is_refused() {
        let mut ledger = Ledger::new();
        for i in 0..DRAWS_PER_KEY_MAX {
            let ts = 1_000 + i as u64 / 100;
            let id = format!("cmd-{i}#0");
            assert!(ledger.record("k", Window::Rolling1h, 1.0, ts, &id).is_ok());
        }
        assert!(matches!(
            ledger.record("k", Window::Rolling1h, 1.0, 3_000, "one-more#0"),
            Err(BudgetError::Full(_))
        ));
        let all = DRAWS_PER_KEY_MAX as f64;
        assert_eq!(ledger.used("k", Window::Rolling1h, 3_000), all);
        assert!(ledger
            .record("k", Window::Rolling1h, 1.0, 3_000, "cmd-7#0")
            .is_err());
    }

    #[test]
    fn negative_or_non_finite_amounts_are_refused() {
        let mut ledger = Ledger::new();
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                ledger.try_reserve("k", Window::Session, 10.0, bad, 0, "r"),
                Err(BudgetError::InvalidAmount(_))
            ));
        }
    }

    #[test]
    fn smallest_budget_wins_and_nothing_is_recorded() {
        let mut ledger = Ledger::new();
        let reqs = [
            Request {
                key: "a".into(),
                window: Window::Session,
                limit: 100.0,
                amount: 5.0,
            },
            Request {
                key: "b".into(),
                window: Window::Rolling1h,
                limit: 4.0,
                amount: 5.0,
            },
        ];
        let err = ledger.try_reserve_all(&reqs, 0, "r");
        assert!(matches!(err, Err(BudgetError::Exceeded { ref key, .. }) if key == "b"));
        assert_eq!(ledger.used("a", Window::Session, 0), 0.0);
    }
}
