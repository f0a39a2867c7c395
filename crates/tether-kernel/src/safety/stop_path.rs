//! The stop path of one device: the native stop, then every
//! `safe_state.achieved_by` action, each in a bounded worker, and the
//! background retry of a stop path that failed.
//!
//! The latch is already set and persisted when this runs; nothing here can
//! release it. A failed stop path keeps the latch and is retried every
//! 0.25 s doubling to 5 s, until it succeeds or the device is reset.

use crate::dispatch::authorized::{Authorized, CallKind};
use crate::driver::CancelToken;
use crate::kernel::Kernel;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tether_core::catalogue;
use tether_core::ids;
use tether_core::manifest::Mode;
use tether_core::receipt::now_ms;
use tether_store::{Commit, EventDraft};

/// How often expired sessions are looked for, ms.
pub const SESSION_REAP_MS: u64 = 250;
/// First retry delay of a failed stop path.
const RETRY_DELAY_FIRST: Duration = Duration::from_millis(250);
/// Longest retry delay.
const RETRY_DELAY_MAX: Duration = Duration::from_secs(5);
/// Retries before giving up on one latch (about 14 hours at the longest delay);
/// the latch itself stays engaged regardless.
const RETRY_COUNT_MAX: u32 = 10_000;

/// What a successful stop path did.
#[derive(Debug)]
pub(crate) struct StopDone {
    native: bool,
    actions: Vec<String>,
    software_only: bool,
}

impl StopDone {
    /// Receipt output.
    pub(crate) fn output(&self) -> Value {
        let estop = if self.software_only {
            "software_only"
        } else if self.native {
            "native"
        } else {
            "safe_state_actions"
        };
        json!({"latched": true, "estop": estop, "safe_state_actions": self.actions})
    }
}

/// Why a stop path failed.
#[derive(Debug)]
pub(crate) struct StopFailure {
    /// `timeout`, `native_failed`, `action_failed`, `safe_state_unbound`, `no_stop_path`.
    pub reason: &'static str,
    /// For people.
    pub message: String,
}

impl Kernel {
    /// Runs the device's stop path within its budget (measured from `t0`).
    pub(crate) async fn run_stop_path(
        &self,
        d: usize,
        t0: Instant,
        reason: &str,
        command_id: Option<&str>,
    ) -> Result<StopDone, StopFailure> {
        let dev = &self.inner.devices[d];
        let m = &dev.spec.manifest;
        let budget = dev.stop_path_budget();
        if m.safety.estop.terminal.is_some() {
            // From the first stop path on, this endpoint never resets the device.
            dev.terminated.store(true, Ordering::SeqCst);
        }
        let native = m.safety.estop.native.unwrap_or(true);
        // Without a driver stop, a bound e-stop class is the native stop
        // (CORE-074: the bridge's estop, else a bound cap.motion.estop.v1).
        let bound_estop = !native
            && dev
                .spec
                .bindings
                .iter()
                .any(|b| b.catalogued && b.capability_id == catalogue::ESTOP);
        let actions: Vec<String> = m
            .safety
            .safe_state
            .as_ref()
            .map(|s| s.achieved_by.clone())
            .unwrap_or_default();
        if !native && !bound_estop && actions.is_empty() {
            if m.mode.is_physical() {
                return Err(StopFailure {
                    reason: "no_stop_path",
                    message: "the device declares no native stop and no safe-state action".into(),
                });
            }
            return Ok(StopDone {
                native: false,
                actions,
                software_only: true,
            });
        }
        if native || bound_estop {
            // With actions to follow, the native stop gets half the budget so
            // the actions start no later than that even if it hangs.
            let share = if actions.is_empty() {
                budget
            } else {
                budget / 2
            };
            let limit = share.saturating_sub(t0.elapsed());
            let stopped = if native {
                self.run_native_stop(d, limit, reason, command_id).await
            } else {
                self.run_safe_state_actions(
                    d,
                    crate::clock::after(Instant::now(), limit),
                    &[catalogue::ESTOP.to_owned()],
                )
                .await
                .map_err(|e| StopFailure {
                    reason: if e.reason == "timeout" {
                        "timeout"
                    } else {
                        "native_failed"
                    },
                    message: format!("the bound e-stop: {}", e.message),
                })
            };
            if let Err(e) = stopped {
                if actions.is_empty() {
                    return Err(e);
                }
                // Run the actions anyway, then report the native failure.
                self.run_safe_state_actions(d, crate::clock::after(t0, budget), &actions)
                    .await?;
                return Err(e);
            }
        }
        self.run_safe_state_actions(d, crate::clock::after(t0, budget), &actions)
            .await?;
        let software_only =
            matches!(m.mode, Mode::Simulated | Mode::Replay) && !native && !bound_estop;
        Ok(StopDone {
            native: native || bound_estop,
            actions,
            software_only,
        })
    }

    /// The native stop in a blocking worker bounded by `limit`. A worker that
    /// never returns is counted in `stops_in_flight`, which blocks a reset.
    pub(crate) async fn run_native_stop(
        &self,
        d: usize,
        limit: Duration,
        reason: &str,
        command_id: Option<&str>,
    ) -> Result<(), StopFailure> {
        let dev = &self.inner.devices[d];
        let auth = Authorized::mint(
            dev.id(),
            catalogue::ESTOP,
            "",
            "estop",
            json!({"reason": reason}),
            command_id.unwrap_or(""),
            CallKind::Stop,
            Some(crate::clock::after(Instant::now(), limit)),
        );
        let driver = dev.driver.clone();
        dev.stops_in_flight.fetch_add(1, Ordering::SeqCst);
        let kernel = self.clone();
        let worker = tokio::task::spawn_blocking(move || {
            let r = driver.estop(&auth);
            kernel.inner.devices[d]
                .stops_in_flight
                .fetch_sub(1, Ordering::SeqCst);
            r
        });
        match tokio::time::timeout(limit, worker).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(s))) => Err(StopFailure {
                reason: "native_failed",
                message: format!("native stop failed: {s:?}"),
            }),
            Ok(Err(_)) => Err(StopFailure {
                reason: "native_failed",
                message: "native stop worker ended abnormally".into(),
            }),
            Err(_) => Err(StopFailure {
                reason: "timeout",
                message: format!("native stop did not answer within {} ms", limit.as_millis()),
            }),
        }
    }

    /// Every achieved_by action, each on every resource it is bound to, with
    /// an empty input; stop-path calls are never cancelled.
    pub(crate) async fn run_safe_state_actions(
        &self,
        d: usize,
        deadline: Instant,
        actions: &[String],
    ) -> Result<(), StopFailure> {
        let dev = &self.inner.devices[d];
        for cap in actions {
            let bindings: Vec<_> = dev
                .spec
                .bindings
                .iter()
                .filter(|b| &b.capability_id == cap)
                .collect();
            if bindings.is_empty() {
                return Err(StopFailure {
                    reason: "safe_state_unbound",
                    message: format!("safe-state action `{cap}` has no binding left"),
                });
            }
            for b in bindings {
                // A safe-state action is exempt from the latch, never from its
                // own limits and interlocks: a park gated by an open door does
                // not move (the stop path fails, keeps the latch, and retries).
                let input = json!({});
                if let Err(v) = b.limits.check(&input) {
                    return Err(StopFailure {
                        reason: "action_failed",
                        message: format!(
                            "safe-state action `{cap}` refused by its limits at {}",
                            v.first.path
                        ),
                    });
                }
                if let Err(r) = crate::check::interlocks::check_interlocks(dev, b) {
                    return Err(StopFailure {
                        reason: "action_failed",
                        message: format!(
                            "safe-state action `{cap}` not run: {} ({})",
                            r.message, r.details["interlocks"]
                        ),
                    });
                }
                let auth = Authorized::mint(
                    dev.id(),
                    &b.capability_id,
                    &b.resource,
                    &b.target,
                    json!({}),
                    &ids::mint("stop_"),
                    CallKind::Stop,
                    Some(deadline),
                )
                .of_binding(b);
                let limit = deadline.saturating_duration_since(Instant::now());
                let driver = dev.driver.clone();
                let call = async move { driver.call(auth, CancelToken::new()).await };
                match tokio::time::timeout(limit, tokio::spawn(call)).await {
                    Ok(Ok(Ok(_))) => {}
                    Ok(Ok(Err(s))) => {
                        return Err(StopFailure {
                            reason: "action_failed",
                            message: format!("safe-state action `{cap}` failed: {s:?}"),
                        })
                    }
                    Ok(Err(_)) => {
                        return Err(StopFailure {
                            reason: "action_failed",
                            message: format!("safe-state action `{cap}` ended abnormally"),
                        })
                    }
                    Err(_) => {
                        return Err(StopFailure {
                            reason: "timeout",
                            message: format!(
                                "safe-state action `{cap}` did not finish within the stop budget"
                            ),
                        })
                    }
                }
            }
        }
        Ok(())
    }

    /// Starts the session reaper: every [`SESSION_REAP_MS`] ms, sessions that
    /// expired get their operations cancelled and safe-state actions run.
    pub fn start_session_reaper(
        &self,
        runtime: &tokio::runtime::Handle,
    ) -> tokio::task::JoinHandle<()> {
        let kernel = self.clone();
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(SESSION_REAP_MS));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // Runs for the life of the endpoint (aborted with the runtime).
            loop {
                tick.tick().await;
                let ended = match kernel.inner.sessions.lock() {
                    Ok(mut s) => s.take_ended(now_ms()),
                    Err(_) => continue,
                };
                for sid in ended {
                    kernel.end_session(&sid, "expired").await;
                }
            }
        })
    }

    /// Retries a failed stop path in the background until it succeeds or the
    /// device's latch is released (or replaced by a newer one).
    pub(crate) fn spawn_stop_retry(&self, d: usize, failed_receipt_id: String) {
        let kernel = self.clone();
        let generation = self.inner.devices[d].latch_event_ms.load(Ordering::SeqCst);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let mut delay = RETRY_DELAY_FIRST;
            for attempt in 1..=RETRY_COUNT_MAX {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(RETRY_DELAY_MAX);
                let dev = &kernel.inner.devices[d];
                if !dev.latched.load(Ordering::SeqCst) || dev.latch_event_ms.load(Ordering::SeqCst) != generation {
                    return;
                }
                let t0 = Instant::now();
                if kernel.run_stop_path(d, t0, "background retry of a failed stop", None).await.is_ok() {
                    dev.stop_confirmed.store(true, Ordering::SeqCst);
                    let receipt = json!({
                        "receipt_id": ids::mint("rcpt_"),
                        "capability_id": crate::safety::estop::INTERNAL_ESTOP,
                        "device_id": dev.id(),
                        "status": "completed",
                        "output": {"latched": true, "confirms": failed_receipt_id, "attempt": attempt},
                        "completed_at_ms": now_ms(),
                        "safe_state_achieved": true,
                    });
                    kernel.record(Commit {
                        events: vec![EventDraft { kind: "safety.estop.confirmed".into(), body: json!({"receipt": receipt}).into() }],
                        ..Commit::default()
                    });
                    return;
                }
            }
        });
    }
}
