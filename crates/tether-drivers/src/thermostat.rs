//! A simulated thermostat: first-order lag of the temperature toward the
//! setpoint while the heater is enabled, toward ambient when it is not.
//!
//! The temperature is computed from elapsed time on each read, so sensor
//! dynamics never need a background task and never advance a revision.

use crate::cfg_f64;
use serde_json::{json, Value};
use std::sync::Mutex;
use std::time::Instant;
use tether_kernel::{Authorized, BoxFuture, CancelToken, Driver, Signal};

#[derive(Debug)]
struct State {
    setpoint: f64,
    heating: bool,
    /// Temperature at `since`.
    temp_at_since: f64,
    since: Instant,
}

/// The simulated thermostat.
#[derive(Debug)]
pub struct SimThermostat {
    tau_s: f64,
    ambient: f64,
    state: Mutex<State>,
}

impl SimThermostat {
    /// Builds it from `driver_config` (`time_constant_s`, `ambient_degc`, `initial_setpoint_degc`).
    ///
    /// # Errors
    /// Non-numeric or non-positive settings.
    pub fn new(cfg: &Value) -> Result<Self, String> {
        let tau_s = cfg_f64(cfg, "time_constant_s", 30.0)?;
        if tau_s <= 0.0 {
            return Err("driver_config.time_constant_s must be positive".into());
        }
        let ambient = cfg_f64(cfg, "ambient_degc", 20.0)?;
        let setpoint = cfg_f64(cfg, "initial_setpoint_degc", ambient)?;
        Ok(Self {
            tau_s,
            ambient,
            state: Mutex::new(State {
                setpoint,
                heating: true,
                temp_at_since: ambient,
                since: Instant::now(),
            }),
        })
    }

    fn temperature(&self, s: &State, now: Instant) -> f64 {
        let target = if s.heating { s.setpoint } else { self.ambient };
        let dt = now.saturating_duration_since(s.since).as_secs_f64();
        target + (s.temp_at_since - target) * (-dt / self.tau_s).exp()
    }

    /// Re-anchors the model at `now` before a parameter changes.
    fn anchor(&self, s: &mut State) {
        let now = Instant::now();
        s.temp_at_since = self.temperature(s, now);
        s.since = now;
    }

    fn set(&self, setpoint: f64) -> Result<(), Signal> {
        if !setpoint.is_finite() {
            return Err(Signal::Failed {
                reason: "non_finite".into(),
                message: "setpoint is not finite".into(),
            });
        }
        let mut s = self.state.lock().map_err(|_| poisoned())?;
        self.anchor(&mut s);
        s.setpoint = setpoint;
        s.heating = true;
        Ok(())
    }
}

fn poisoned() -> Signal {
    Signal::Failed {
        reason: "state_poisoned".into(),
        message: "simulator state unavailable".into(),
    }
}

impl Driver for SimThermostat {
    fn read(&self, _call: &Authorized) -> Result<Value, Signal> {
        let s = self.state.lock().map_err(|_| poisoned())?;
        let t = self.temperature(&s, Instant::now());
        Ok(
            json!({"temperature": (t * 1000.0).round() / 1000.0, "setpoint": s.setpoint, "heating": s.heating}),
        )
    }

    fn call(&self, call: Authorized, _cancel: CancelToken) -> BoxFuture<'_, Result<Value, Signal>> {
        Box::pin(async move {
            match call.target() {
                "configure" => {
                    if let Some(sp) = call.input().get("setpoint") {
                        let sp = sp.as_f64().ok_or_else(|| Signal::Failed {
                            reason: "bad_input".into(),
                            message: "setpoint is not a number".into(),
                        })?;
                        self.set(sp)?;
                    }
                    Ok(json!({"applied": call.input(), "revision": 0}))
                }
                "setpoint" => {
                    let t = call
                        .input()
                        .get("target_temperature")
                        .and_then(Value::as_f64)
                        .ok_or_else(|| Signal::Failed {
                            reason: "bad_input".into(),
                            message: "target_temperature missing".into(),
                        })?;
                    self.set(t)?;
                    Ok(json!({"target_temperature": t}))
                }
                other => Err(Signal::Failed {
                    reason: "unknown_target".into(),
                    message: format!("unknown target `{other}`"),
                }),
            }
        })
    }

    /// In process: the simulation answers a setpoint at once.
    fn polls_promptly(&self) -> bool {
        true
    }

    fn estop(&self, _call: &Authorized) -> Result<(), Signal> {
        let mut s = self.state.lock().map_err(|_| poisoned())?;
        self.anchor(&mut s);
        s.heating = false;
        Ok(())
    }
}
