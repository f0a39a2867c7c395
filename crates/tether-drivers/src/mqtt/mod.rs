//! `mqtt`: a device behind an MQTT broker, described by its manifest's
//! `[driver_config]` mapping (docs/DRIVERS.md, "MQTT").
//!
//! The driver owns one OS thread with a current-thread tokio runtime that
//! keeps the broker connection ([`session`]); the trait's sync methods never
//! touch the network: `read` and `interlocks` answer from the state mirror
//! ([`mirror`]), `estop` hands the native stop to the session and waits at
//! most the witness's deadline, `call` runs a leased command ([`dose`])
//! through the kernel's runner. Plain TCP only: TLS to a broker is not
//! offered yet.
//!
//! **Owns:** the `mqtt` driver kind, `check` (mapping defects for `tether
//! check`) and `probe` (live reading, writing nothing). **Never belongs
//! here:** refusals other than the device's own, retries, clamping.

pub mod config;
pub mod dose;
pub mod mirror;
pub mod proto;
pub mod session;
pub mod template;

use config::Config;
use mirror::Shared;
use serde_json::Value;
use session::{PublishError, Request};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tether_core::manifest::DeviceManifest;
use tether_kernel::lease::run_leased;
use tether_kernel::{Authorized, BoxFuture, CancelToken, Driver, InterlockState, Link, Signal};
use tokio::sync::mpsc;

/// The e-stop's wait when the witness carries no deadline.
const ESTOP_WAIT_MAX: Duration = Duration::from_millis(1000);
/// How often `probe` looks at the mirror while it waits.
const PROBE_POLL: Duration = Duration::from_millis(20);

/// The MQTT driver.
pub struct MqttDriver {
    cfg: Arc<Config>,
    shared: Arc<Shared>,
    tx: mpsc::Sender<Request>,
}

impl std::fmt::Debug for MqttDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MqttDriver")
            .field("broker", &format!("{}:{}", self.cfg.host, self.cfg.port))
            .finish()
    }
}

/// Mapping defects of a manifest served by the `mqtt` driver: (field path
/// under the manifest, message). Empty when the mapping is sound.
pub fn check(manifest: &DeviceManifest) -> Vec<(String, String)> {
    config::parse(manifest).err().unwrap_or_default()
}

impl MqttDriver {
    /// Checks the mapping and starts the session (it connects in the
    /// background; a broker that is down does not stop the endpoint).
    ///
    /// # Errors
    /// Every mapping defect, or the session thread could not start.
    pub fn new(manifest: &DeviceManifest) -> Result<Self, String> {
        let cfg = Arc::new(config::parse(manifest).map_err(|d| {
            d.iter()
                .map(|(p, m)| format!("{p}: {m}"))
                .collect::<Vec<_>>()
                .join("; ")
        })?);
        let shared = Arc::new(Shared::default());
        shared.set_link(false, None);
        let tx = session::start(Arc::clone(&cfg), Arc::clone(&shared))?;
        Ok(Self { cfg, shared, tx })
    }

    fn fresh_document(&self) -> Result<(Value, u64), Signal> {
        let s = self.shared.fresh(self.cfg.stale_after)?;
        Ok((mirror::document(&self.cfg, &s.raw)?, s.wall_ms))
    }

    /// The receive time (wall ms) of the state message a read would use.
    pub fn sampled_at(&self) -> Option<u64> {
        self.shared
            .fresh(self.cfg.stale_after)
            .ok()
            .map(|s| s.wall_ms)
    }

    async fn native_stop(
        &self,
        command_id: &str,
        deadline: Option<Instant>,
    ) -> Result<Value, Signal> {
        let id = self.shared.take_stop(command_id);
        let payload = dose::stop_payload(&self.cfg, &id)?;
        let bound = dose::bounded(self.cfg.publish_timeout, deadline);
        dose::publish(&self.tx, &self.cfg.topics.cmd, payload, bound)
            .await
            .map(|()| serde_json::json!({"stopped": true}))
            .map_err(publish_signal)
    }
}

fn publish_signal(e: PublishError) -> Signal {
    match e {
        PublishError::NotSent(m) => Signal::Failed {
            reason: "broker_unreachable".into(),
            message: m,
        },
        PublishError::Unknown(m) => Signal::OutcomeUnknown { message: m },
    }
}

impl Driver for MqttDriver {
    fn read(&self, call: &Authorized) -> Result<Value, Signal> {
        if call.resource() != self.cfg.resource {
            return Err(Signal::Failed {
                reason: "unknown_resource".into(),
                message: format!(
                    "the mqtt mapping reads resource `{}` only",
                    self.cfg.resource
                ),
            });
        }
        self.fresh_document().map(|(doc, _)| doc)
    }

    fn call(&self, call: Authorized, cancel: CancelToken) -> BoxFuture<'_, Result<Value, Signal>> {
        Box::pin(async move {
            let target = call.target().to_owned();
            if matches!(target.as_str(), "stop" | "estop")
                && !self.cfg.targets.contains_key(&target)
            {
                return self.native_stop(call.command_id(), call.deadline()).await;
            }
            let Some(t) = self.cfg.targets.get(&target) else {
                return Err(Signal::Failed {
                    reason: "unknown_target".into(),
                    message: format!("the mqtt mapping has no target `{target}`"),
                });
            };
            let acks = self.shared.open_route(call.command_id())?;
            let mut d = dose::Dose {
                cfg: Arc::clone(&self.cfg),
                shared: Arc::clone(&self.shared),
                tx: self.tx.clone(),
                command_id: call.command_id().to_owned(),
                template: t.payload.clone(),
                input_units: t.input_units.clone(),
                input: call.input().clone(),
                deadline: call.deadline(),
                acks,
                finished: false,
            };
            let out = run_leased(&mut d, self.cfg.lease, t.run_max, &cancel).await;
            self.shared.close_route(call.command_id());
            self.shared.set_running(None);
            out
        })
    }

    fn estop(&self, call: &Authorized) -> Result<(), Signal> {
        let id = self.shared.take_stop(call.command_id());
        let payload = dose::stop_payload(&self.cfg, &id)?;
        let wait = dose::bounded(ESTOP_WAIT_MAX, call.deadline());
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let done = Box::new(move |r| {
            let _ = tx.try_send(r);
        });
        let req = Request::Publish {
            topic: self.cfg.topics.cmd.clone(),
            payload,
            done,
        };
        let out = if self.tx.try_send(req).is_err() {
            Signal::Failed {
                reason: "broker_unreachable".into(),
                message: "the MQTT session is busy or stopped; the native stop was not published"
                    .into(),
            }
        } else {
            match rx.recv_timeout(wait) {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => publish_signal(e),
                Err(_) => Signal::OutcomeUnknown {
                    message: format!(
                        "the broker did not acknowledge the native stop within {} ms",
                        wait.as_millis()
                    ),
                },
            }
        };
        // The running command's own stop (on cancellation) tries again.
        self.shared.stop_failed(&id);
        Err(out)
    }

    fn interlocks(&self) -> Vec<(String, InterlockState)> {
        let sample = self.shared.fresh(self.cfg.stale_after).ok();
        mirror::interlocks(&self.cfg, sample.as_ref())
    }

    fn link(&self) -> Option<Link> {
        Some(self.shared.link())
    }

    fn sampled_at_ms(&self, resource: &str) -> Option<u64> {
        (resource == self.cfg.resource)
            .then(|| self.sampled_at())
            .flatten()
    }
}

/// One row of `tether probe`: a mapped field or interlock read live.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeRow {
    /// The resource field, or `interlock:<id>`.
    pub name: String,
    /// The value in the declared unit (`"closed"`/`"open"` for an interlock).
    pub declared: Value,
    /// The declared unit, if any.
    pub unit: Option<String>,
    /// The native value as the device published it.
    pub raw: Value,
}

/// Reads every mapped field and interlock from the live device (its
/// retained state message), publishing nothing; waits at most `timeout`.
///
/// # Errors
/// A mapping defect, no connection, or no state message within `timeout`.
pub fn probe(manifest: &DeviceManifest, timeout: Duration) -> Result<Vec<ProbeRow>, String> {
    let mut cfg = config::parse(manifest).map_err(|d| {
        d.iter()
            .map(|(p, m)| format!("{p}: {m}"))
            .collect::<Vec<_>>()
            .join("; ")
    })?;
    cfg.client_id = format!("{}-probe-{}", cfg.client_id, std::process::id());
    let cfg = Arc::new(cfg);
    let shared = Arc::new(Shared::default());
    let tx = session::start(Arc::clone(&cfg), Arc::clone(&shared))?;
    let until = Instant::now() + timeout;
    let sample = loop {
        if let Ok(s) = shared.fresh(cfg.stale_after) {
            break s;
        }
        if Instant::now() >= until {
            let link = shared.link();
            let why = link
                .last_error
                .unwrap_or_else(|| "no retained state message".into());
            return Err(format!(
                "no state message on `{}` from broker {}:{} within {} ms ({why})",
                cfg.topics.state,
                cfg.host,
                cfg.port,
                timeout.as_millis()
            ));
        }
        std::thread::sleep(PROBE_POLL);
    };
    drop(tx);
    Ok(probe_rows(&cfg, &sample.raw))
}

fn probe_rows(cfg: &Config, raw: &Value) -> Vec<ProbeRow> {
    let mut rows = Vec::new();
    for f in &cfg.fields {
        let native = mirror::at_path(raw, &f.path)
            .cloned()
            .unwrap_or(Value::Null);
        let declared =
            mirror::declared(f.native_unit.as_deref(), f.schema_unit.as_deref(), &native)
                .unwrap_or(Value::Null);
        rows.push(ProbeRow {
            name: f.name.clone(),
            declared,
            unit: f.schema_unit.clone(),
            raw: native,
        });
    }
    let sample = mirror::Sample::now(raw.clone());
    for (m, (_, state)) in cfg
        .interlocks
        .iter()
        .zip(mirror::interlocks(cfg, Some(&sample)))
    {
        rows.push(ProbeRow {
            name: format!("interlock:{}", m.id),
            declared: Value::from(state.as_str()),
            unit: None,
            raw: mirror::at_path(raw, &m.path)
                .cloned()
                .unwrap_or(Value::Null),
        });
    }
    rows
}
