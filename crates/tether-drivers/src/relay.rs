//! A simulated bank of relays. Its e-stop releases every channel.

use serde_json::{json, Value};
use std::sync::Mutex;
use tether_kernel::{Authorized, BoxFuture, CancelToken, Driver, Signal};

/// Most channels a simulated bank may have.
const CHANNELS_MAX: u64 = 64;

/// The simulated relay bank.
#[derive(Debug)]
pub struct SimRelay {
    channels: Mutex<Vec<bool>>,
}

impl SimRelay {
    /// Builds it from `driver_config.channels` (default 4).
    ///
    /// # Errors
    /// A channel count that is not an integer in 1..=64.
    pub fn new(cfg: &Value) -> Result<Self, String> {
        let n = match cfg.get("channels") {
            None => 4,
            Some(v) => v
                .as_u64()
                .filter(|n| (1..=CHANNELS_MAX).contains(n))
                .ok_or("driver_config.channels must be an integer from 1 to 64")?,
        };
        Ok(Self {
            channels: Mutex::new(vec![false; n as usize]),
        })
    }
}

fn poisoned() -> Signal {
    Signal::Failed {
        reason: "state_poisoned".into(),
        message: "simulator state unavailable".into(),
    }
}

impl Driver for SimRelay {
    fn read(&self, _call: &Authorized) -> Result<Value, Signal> {
        let c = self.channels.lock().map_err(|_| poisoned())?;
        Ok(json!({"channels": *c}))
    }

    fn call(&self, call: Authorized, _cancel: CancelToken) -> BoxFuture<'_, Result<Value, Signal>> {
        Box::pin(async move {
            if call.target() != "switch" {
                return Err(Signal::Failed {
                    reason: "unknown_target".into(),
                    message: format!("unknown target `{}`", call.target()),
                });
            }
            let channel = call.input().get("channel").and_then(Value::as_u64);
            let on = call.input().get("on").and_then(Value::as_bool);
            let (Some(channel), Some(on)) = (channel, on) else {
                return Err(Signal::Failed {
                    reason: "bad_input".into(),
                    message: "channel and on are required".into(),
                });
            };
            let mut c = self.channels.lock().map_err(|_| poisoned())?;
            let slot = c.get_mut(channel as usize).ok_or_else(|| Signal::Failed {
                reason: "no_such_channel".into(),
                message: format!("channel {channel} does not exist"),
            })?;
            *slot = on;
            Ok(json!({"channel": channel, "on": on}))
        })
    }

    /// In process: switching a simulated channel never waits.
    fn polls_promptly(&self) -> bool {
        true
    }

    fn estop(&self, _call: &Authorized) -> Result<(), Signal> {
        let mut c = self.channels.lock().map_err(|_| poisoned())?;
        c.iter_mut().for_each(|x| *x = false);
        Ok(())
    }
}
