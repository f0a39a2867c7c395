//! A simulated six-joint arm that moves in real time.
//!
//! A move interpolates every joint linearly so that the joint with the
//! largest travel moves at the requested speed; it takes max|Δjoint| / speed
//! seconds. The motion advances in ticks and checks cancellation and the
//! halt flag (set by a stop or an e-stop) at every tick, so it stops within
//! one tick of being told to.

use crate::cfg_f64;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tether_kernel::{Authorized, BoxFuture, CancelToken, Driver, InterlockState, Signal};

/// Joints of the simulated arm.
pub const JOINTS: usize = 6;
/// Longest motion the simulator runs, s (bounds the tick loop).
const MOTION_S_MAX: f64 = 600.0;
/// Fastest simulated clock, simulated seconds a wall-clock second.
const TIME_SCALE_MAX: f64 = 10_000.0;

#[derive(Debug, Clone)]
struct State {
    positions: [f64; JOINTS],
    target: Option<[f64; JOINTS]>,
}

/// The simulated arm.
#[derive(Debug)]
pub struct SimArm {
    home: [f64; JOINTS],
    park_speed: f64,
    tick: Duration,
    /// Simulated seconds a wall-clock second (1: real time).
    time_scale: f64,
    state: Mutex<State>,
    /// Incremented by every stop and e-stop; a motion that sees it change halts.
    halt_epoch: AtomicU64,
    /// Simulator control file (the door contact), if any.
    control: Option<std::path::PathBuf>,
}

impl SimArm {
    /// Builds it from `driver_config` (`home`, `park_speed_rad_s`, `tick_ms`,
    /// `time_scale`: simulated seconds a wall-clock second, 1 to 10,000,
    /// default 1; the fuzz targets run the arm fast this way, and the
    /// output's `duration_s` stays the simulated duration).
    ///
    /// # Errors
    /// Malformed settings.
    pub fn new(cfg: &Value) -> Result<Self, String> {
        let home = match cfg.get("home") {
            None => [0.0; JOINTS],
            Some(v) => joints_of(v).ok_or("driver_config.home must hold 6 finite numbers")?,
        };
        let park_speed = cfg_f64(cfg, "park_speed_rad_s", 1.0)?;
        let tick_ms = cfg_f64(cfg, "tick_ms", 10.0)?;
        let time_scale = cfg_f64(cfg, "time_scale", 1.0)?;
        if park_speed <= 0.0 || !(1.0..=100.0).contains(&tick_ms) {
            return Err("park_speed_rad_s must be positive and tick_ms within 1..=100".into());
        }
        if !(1.0..=TIME_SCALE_MAX).contains(&time_scale) {
            return Err(format!("time_scale must be within 1..={TIME_SCALE_MAX}"));
        }
        Ok(Self {
            home,
            park_speed,
            tick: Duration::from_millis(tick_ms as u64),
            time_scale,
            state: Mutex::new(State {
                positions: home,
                target: None,
            }),
            halt_epoch: AtomicU64::new(0),
            control: None,
        })
    }

    /// Reads the door contact from this control file.
    pub fn with_control(mut self, control: Option<std::path::PathBuf>) -> Self {
        self.control = control;
        self
    }

    /// The door as the simulated contact reports it: closed unless the control
    /// file says otherwise; an unreadable or malformed file reads unknown.
    fn door(&self) -> InterlockState {
        let Some(path) = &self.control else {
            return InterlockState::Closed;
        };
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return InterlockState::Closed,
            Err(_) => return InterlockState::Unknown,
        };
        match serde_json::from_str::<Value>(&text)
            .ok()
            .as_ref()
            .and_then(|v| v.get("door"))
            .and_then(Value::as_str)
        {
            Some("closed") => InterlockState::Closed,
            Some("open") => InterlockState::Open,
            None if serde_json::from_str::<Value>(&text).is_ok() => InterlockState::Closed,
            _ => InterlockState::Unknown,
        }
    }

    fn snapshot(&self) -> Result<State, Signal> {
        self.state.lock().map(|s| s.clone()).map_err(|_| poisoned())
    }

    fn set(&self, positions: [f64; JOINTS], target: Option<[f64; JOINTS]>) -> Result<(), Signal> {
        let mut s = self.state.lock().map_err(|_| poisoned())?;
        s.positions = positions;
        s.target = target;
        Ok(())
    }

    async fn move_to(
        &self,
        target: [f64; JOINTS],
        speed: f64,
        cancel: &CancelToken,
    ) -> Result<Value, Signal> {
        if !(speed.is_finite() && speed > 0.0) {
            return Err(Signal::Failed {
                reason: "bad_speed".into(),
                message: "speed must be positive".into(),
            });
        }
        let start = self.snapshot()?.positions;
        let travel = start
            .iter()
            .zip(&target)
            .map(|(a, b)| (b - a).abs())
            .fold(0.0, f64::max);
        let duration_s = (travel / speed).min(MOTION_S_MAX);
        let epoch = self.halt_epoch.load(Ordering::SeqCst);
        self.set(start, Some(target))?;
        let began = Instant::now();
        // The wall-clock time the motion takes on the simulated clock.
        let wall_s = duration_s / self.time_scale;
        let ticks_max = (wall_s / self.tick.as_secs_f64()).ceil() as u64 + 2;
        for _ in 0..ticks_max {
            let elapsed = began.elapsed().as_secs_f64();
            let frac = if wall_s > 0.0 {
                (elapsed / wall_s).min(1.0)
            } else {
                1.0
            };
            let now: [f64; JOINTS] =
                std::array::from_fn(|i| start[i] + (target[i] - start[i]) * frac);
            if cancel.is_cancelled() || self.halt_epoch.load(Ordering::SeqCst) != epoch {
                self.set(now, None)?;
                return Err(Signal::Cancelled);
            }
            if frac >= 1.0 {
                self.set(target, None)?;
                return Ok(json!({"joints": target, "duration_s": duration_s}));
            }
            self.set(now, Some(target))?;
            tokio::select! {
                () = tokio::time::sleep(self.tick) => {}
                () = cancel.cancelled() => {}
            }
        }
        self.set(target, None)?;
        Ok(json!({"joints": target, "duration_s": duration_s}))
    }
}

/// Six finite numbers, or `None` (shared with the remote arm driver).
pub fn joints_of_pub(v: &Value) -> Option<[f64; JOINTS]> {
    joints_of(v)
}

fn joints_of(v: &Value) -> Option<[f64; JOINTS]> {
    let a = v.as_array().filter(|a| a.len() == JOINTS)?;
    let mut out = [0.0; JOINTS];
    for (slot, x) in out.iter_mut().zip(a) {
        *slot = x.as_f64().filter(|f| f.is_finite())?;
    }
    Some(out)
}

fn poisoned() -> Signal {
    Signal::Failed {
        reason: "state_poisoned".into(),
        message: "simulator state unavailable".into(),
    }
}

impl Driver for SimArm {
    fn read(&self, _call: &Authorized) -> Result<Value, Signal> {
        let s = self.snapshot()?;
        Ok(json!({"positions": s.positions, "moving": s.target.is_some(), "target": s.target}))
    }

    fn call(&self, call: Authorized, cancel: CancelToken) -> BoxFuture<'_, Result<Value, Signal>> {
        Box::pin(async move {
            match call.target() {
                "move_to" => {
                    let target =
                        call.input()
                            .get("joints")
                            .and_then(joints_of)
                            .ok_or_else(|| Signal::Failed {
                                reason: "bad_input".into(),
                                message: "joints must hold 6 numbers".into(),
                            })?;
                    let speed = call
                        .input()
                        .get("speed")
                        .and_then(Value::as_f64)
                        .unwrap_or(0.25);
                    self.move_to(target, speed, &cancel).await
                }
                "park" => self.move_to(self.home, self.park_speed, &cancel).await,
                "stop" | "estop" => {
                    self.halt_epoch.fetch_add(1, Ordering::SeqCst);
                    Ok(json!({"stopped": true}))
                }
                other => Err(Signal::Failed {
                    reason: "unknown_target".into(),
                    message: format!("unknown target `{other}`"),
                }),
            }
        })
    }

    /// In process: a motion waits on timers, never on the thread.
    fn polls_promptly(&self) -> bool {
        true
    }

    fn estop(&self, _call: &Authorized) -> Result<(), Signal> {
        self.halt_epoch.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn interlocks(&self) -> Vec<(String, InterlockState)> {
        vec![("door".to_owned(), self.door())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_simulated_clock_is_bounded_and_real_time_by_default() {
        let arm = SimArm::new(&json!({})).map_err(|e| e.to_string());
        assert_eq!(arm.map(|a| a.time_scale), Ok(1.0));
        let fast = SimArm::new(&json!({"time_scale": 1000, "tick_ms": 1}));
        assert!(fast.is_ok_and(|a| a.time_scale == 1000.0));
        for bad in [json!(0.5), json!(20_000), json!("fast")] {
            assert!(
                SimArm::new(&json!({ "time_scale": bad })).is_err(),
                "time_scale {bad} was taken"
            );
        }
    }
}
