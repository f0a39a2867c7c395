//! One leased command over MQTT, run by the kernel's leased-command runner:
//! publish the command once (QoS 1), wait (bounded) for the device's
//! acknowledgement, renew the lease on its own topic at half the lease, and
//! report `done`, `stopped` or `rejected` from the acknowledgements.
//!
//! A command whose acknowledgement never comes is `unknown`; nothing is ever
//! published twice. Every wait is bounded by the smaller of its own timeout
//! and what is left of the call's deadline.
//!
//! **Owns:** the command's life on the wire. **Never belongs here:** deciding
//! whether the command may run (the kernel did), retries.

use super::config::Config;
use super::mirror::{filtered, Running, Shared};
use super::session::{PublishError, Request};
use super::template::{self, Fill};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tether_kernel::lease::{LeasedController, Progress};
use tether_kernel::{BoxFuture, Signal};
use tokio::sync::mpsc;

/// Acknowledgements read per wait at most (others are ignored).
const ACKS_READ_MAX: usize = 16;

/// What an acknowledgement says.
#[derive(Debug, PartialEq)]
pub enum Ack {
    /// The device took the command.
    Accepted,
    /// Finished.
    Done,
    /// Refused, with the device's reason.
    Rejected(String),
    /// Ended early, with the device's reason.
    Stopped(String),
    /// A status the mapping does not name.
    Other,
}

/// Reads an acknowledgement.
pub fn classify(cfg: &Config, v: &Value) -> Ack {
    let reason = || {
        v.get(&cfg.ack.reason_field)
            .and_then(Value::as_str)
            .map(filtered)
            .unwrap_or_default()
    };
    match v.get(&cfg.ack.status_field).and_then(Value::as_str) {
        Some(s) if s == cfg.ack.accepted => Ack::Accepted,
        Some(s) if s == cfg.ack.done => Ack::Done,
        Some(s) if s == cfg.ack.rejected => Ack::Rejected(reason()),
        Some(s) if s == cfg.ack.stopped => Ack::Stopped(reason()),
        _ => Ack::Other,
    }
}

/// The smaller of `bound` and what is left before `deadline`.
pub fn bounded(bound: Duration, deadline: Option<Instant>) -> Duration {
    deadline.map_or(bound, |d| {
        bound.min(d.saturating_duration_since(Instant::now()))
    })
}

/// Publishes once and waits (bounded) for the broker's PUBACK.
///
/// # Errors
/// [`PublishError::NotSent`] when nothing left; `Unknown` when it may have.
pub async fn publish(
    tx: &mpsc::Sender<Request>,
    topic: &str,
    payload: Value,
    bound: Duration,
) -> Result<(), PublishError> {
    let (otx, orx) = tokio::sync::oneshot::channel();
    let done = Box::new(move |r| {
        let _ = otx.send(r);
    });
    tx.try_send(Request::Publish {
        topic: topic.to_owned(),
        payload,
        done,
    })
    .map_err(|_| {
        PublishError::NotSent("the MQTT session is busy or stopped; nothing was published".into())
    })?;
    match tokio::time::timeout(bound, orx).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err(PublishError::Unknown(
            "the MQTT session ended during the publish".into(),
        )),
        Err(_) => Err(PublishError::Unknown(format!(
            "the broker did not acknowledge the publish within {} ms",
            bound.as_millis()
        ))),
    }
}

/// The native stop's payload naming `command_id`.
///
/// # Errors
/// A template that cannot be rendered (checked at build, so not expected).
pub fn stop_payload(cfg: &Config, command_id: &str) -> Result<Value, Signal> {
    let fill = Fill {
        command_id,
        lease_ms: u64::try_from(cfg.lease.as_millis()).unwrap_or(u64::MAX),
        input: &Value::Null,
        input_units: &BTreeMap::new(),
    };
    template::render(&cfg.stop_payload, &fill).map_err(|m| Signal::Failed {
        reason: "bad_template".into(),
        message: m,
    })
}

/// One leased command.
pub struct Dose {
    /// The mapping.
    pub cfg: Arc<Config>,
    /// The mirror (acknowledgement route, running dose).
    pub shared: Arc<Shared>,
    /// The session.
    pub tx: mpsc::Sender<Request>,
    /// Correlation value.
    pub command_id: String,
    /// Payload template and input units.
    pub template: Value,
    /// Input field → (declared, native) unit.
    pub input_units: BTreeMap<String, (String, String)>,
    /// The call's input.
    pub input: Value,
    /// The call's deadline.
    pub deadline: Option<Instant>,
    /// Acknowledgements of this command.
    pub acks: mpsc::Receiver<Value>,
    /// Set when `done` came before a renewal.
    pub finished: bool,
}

impl Dose {
    fn render(&self, t: &Value, lease: Duration) -> Result<Value, Signal> {
        let fill = Fill {
            command_id: &self.command_id,
            lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
            input: &self.input,
            input_units: &self.input_units,
        };
        template::render(t, &fill).map_err(|m| Signal::Failed {
            reason: "bad_template".into(),
            message: m,
        })
    }

    /// What an acknowledgement other than `accepted` ends the call with.
    fn ending(&self, ack: Ack) -> Option<Result<Value, Signal>> {
        match ack {
            Ack::Accepted | Ack::Other => None,
            Ack::Done => Some(Ok(self.input.clone())),
            Ack::Rejected(r) => Some(Err(Signal::Failed {
                reason: "device_rejected".into(),
                message: format!(
                    "the device rejected the command (device reason: {})",
                    or_none(&r)
                ),
            })),
            Ack::Stopped(_) if self.shared.stop_sent(&self.command_id) => {
                Some(Err(Signal::Cancelled))
            }
            Ack::Stopped(r) => Some(Err(Signal::Failed {
                reason: "stopped_by_device".into(),
                message: format!(
                    "the device stopped the command before it finished (device reason: {})",
                    or_none(&r)
                ),
            })),
        }
    }
}

fn or_none(r: &str) -> &str {
    if r.is_empty() {
        "none given"
    } else {
        r
    }
}

fn unknown(m: String) -> Signal {
    Signal::OutcomeUnknown { message: m }
}

impl LeasedController for Dose {
    fn send(&mut self, lease: Duration) -> BoxFuture<'_, Result<(), Signal>> {
        Box::pin(async move {
            let payload = self.render(&self.template.clone(), lease)?;
            self.shared.set_running(Some(Running {
                command_id: self.command_id.clone(),
                stop_sent: false,
            }));
            let bound = bounded(self.cfg.publish_timeout, self.deadline);
            match publish(&self.tx, &self.cfg.topics.cmd, payload, bound).await {
                Ok(()) => {}
                Err(PublishError::NotSent(m)) => {
                    return Err(Signal::Failed {
                        reason: "broker_unreachable".into(),
                        message: m,
                    })
                }
                Err(PublishError::Unknown(m)) => {
                    return Err(unknown(format!(
                        "{m}; the command was published at most once and is not re-sent"
                    )))
                }
            }
            let wait = bounded(self.cfg.ack_timeout, self.deadline);
            let until = tokio::time::Instant::now() + wait;
            for _ in 0..ACKS_READ_MAX {
                match tokio::time::timeout_at(until, self.acks.recv()).await {
                    Ok(Some(v)) => match classify(&self.cfg, &v) {
                        Ack::Accepted => return Ok(()),
                        Ack::Done => {
                            self.finished = true;
                            return Ok(());
                        }
                        other => match self.ending(other) {
                            Some(Err(s)) => return Err(s),
                            _ => continue,
                        },
                    },
                    Ok(None) | Err(_) => break,
                }
            }
            Err(unknown(format!(
                "the device did not acknowledge command {} within {} ms; it was published once and is not re-sent (the device stops it by itself when the lease lapses)",
                self.command_id,
                wait.as_millis()
            )))
        })
    }

    fn renew(&mut self, lease: Duration) -> BoxFuture<'_, Result<Progress, Signal>> {
        Box::pin(async move {
            if self.finished {
                return Ok(Progress::Done(self.input.clone()));
            }
            for _ in 0..ACKS_READ_MAX {
                let Ok(v) = self.acks.try_recv() else { break };
                match self.ending(classify(&self.cfg, &v)) {
                    Some(Ok(out)) => return Ok(Progress::Done(out)),
                    Some(Err(s)) => return Err(s),
                    None => {}
                }
            }
            let payload = self.render(&self.cfg.lease_payload.clone(), lease)?;
            let bound = bounded(self.cfg.publish_timeout.min(lease / 2), self.deadline);
            match publish(&self.tx, &self.cfg.topics.lease, payload, bound).await {
                Ok(()) => Ok(Progress::Running),
                Err(PublishError::NotSent(m) | PublishError::Unknown(m)) => {
                    Err(unknown(format!("the lease could not be renewed: {m}")))
                }
            }
        })
    }

    fn stop(&mut self) -> BoxFuture<'_, Result<(), Signal>> {
        Box::pin(async move {
            if self.shared.stop_sent(&self.command_id) {
                return Ok(());
            }
            let id = self.shared.take_stop(&self.command_id);
            let payload = stop_payload(&self.cfg, &id)?;
            publish(
                &self.tx,
                &self.cfg.topics.cmd,
                payload,
                self.cfg.publish_timeout,
            )
            .await
            .map_err(|e| match e {
                PublishError::NotSent(m) | PublishError::Unknown(m) => {
                    unknown(format!("the native stop: {m}"))
                }
            })
        })
    }
}
