//! The driver's I/O, on its own runtime thread, one session per lane.
//!
//! **Owns:** the lanes (poll: keeps the mirror and the link fresh; command:
//! a call's ordered steps; safety: the native stop and the watchdog feed),
//! so a stop never waits behind a command or a poll (a server may serve one
//! session's requests in order); a busy safety lane makes the stop open a
//! session of its own.
//! **Never here:** decisions (the kernel's), retries of an actuation: a step
//! is sent once and a target's steps that fail part-way end `unknown`,
//! listing the steps made. Re-sending a *stop* is not an actuation.

use super::config::{arg_point, Call, Map, Step};
use super::node::{Node, NodeRef, UaValue, VarType};
use super::session::{reading, Conn, IoError};
use super::Shared;
use crate::mapping::{Point as _, Source};
use crate::mirror::lanes::{may_continue, CallGuard, InFlight};
use crate::mirror::Sample;
use serde_json::{json, Value};
use std::sync::{Arc, Weak};
use std::time::Instant;
use tether_kernel::{CancelToken, Signal};
use tokio::sync::Mutex;

/// A session opened on first use and dropped when it times out or breaks
/// (the next use opens a new one; nothing is re-sent).
pub struct Lane {
    client: opcua::client::Client,
    conn: Option<Conn>,
    map: Arc<Map>,
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane").field("conn", &self.conn).finish()
    }
}

impl Lane {
    /// A lane to the map's endpoint (nothing is opened until used).
    ///
    /// # Errors
    /// A client configuration the library refuses.
    pub fn new(map: Arc<Map>, device_id: &str) -> Result<Lane, String> {
        Ok(Lane {
            client: super::session::client(&map, device_id)?,
            conn: None,
            map,
        })
    }

    async fn conn(&mut self, until: Instant) -> Result<&mut Conn, IoError> {
        if !self.conn.as_ref().is_some_and(Conn::alive) {
            self.conn = None;
            let c = Conn::open(&mut self.client, &self.map, until).await?;
            self.conn = Some(c);
        }
        self.conn
            .as_mut()
            .ok_or_else(|| IoError::Unreachable("no session".into()))
    }

    fn settle<T>(&mut self, r: Result<T, IoError>) -> Result<T, IoError> {
        if matches!(r, Err(IoError::Timeout(_) | IoError::Transport(_))) {
            // An answer may still come on this session; a new one is clean.
            self.conn = None;
        }
        r
    }

    /// Reads every node in one request.
    ///
    /// # Errors
    /// See [`Conn::read`].
    pub async fn read(
        &mut self,
        nodes: &[Node],
        until: Instant,
    ) -> Result<Vec<Result<UaValue, String>>, IoError> {
        let c = self.conn(until).await?;
        let ids = nodes
            .iter()
            .map(|n| c.node(&n.node))
            .collect::<Result<Vec<_>, _>>()?;
        let r = c.read(&ids, until).await;
        self.settle(r)
            .map(|values| values.iter().map(reading).collect())
    }

    /// Writes one value, once.
    ///
    /// # Errors
    /// See [`Conn::write`].
    pub async fn write(
        &mut self,
        node: &NodeRef,
        v: UaValue,
        until: Instant,
    ) -> Result<(), IoError> {
        let c = self.conn(until).await?;
        let id = c.node(node)?;
        let r = c.write(id, v, until).await;
        self.settle(r)
    }

    /// Calls a method once, with its encoded arguments.
    ///
    /// # Errors
    /// See [`Conn::call`].
    pub async fn call(
        &mut self,
        call: &Call,
        args: &[UaValue],
        until: Instant,
    ) -> Result<(), IoError> {
        let c = self.conn(until).await?;
        let object = c.object_of(&call.method, call.object.as_ref(), until).await;
        let object = self.settle(object)?;
        let c = self.conn(until).await?;
        let method = c.node(&call.method)?;
        let variants = args.iter().map(|a| a.to_variant()).collect();
        let r = c.call(object, method, variants, until).await;
        self.settle(r)
    }
}

/// The lanes a driver owns.
#[derive(Debug)]
pub struct Lanes {
    /// Command steps, one call at a time.
    pub command: Mutex<Lane>,
    /// The native stop and the watchdog feed.
    pub safety: Mutex<Lane>,
}

/// Keeps the mirror fresh: every `poll` period, every polled node in one
/// read, until the driver is dropped (the loop ends with the weak reference).
pub async fn poll_loop(shared: Weak<Shared>, mut lane: Lane) {
    let Some(first) = shared.upgrade() else {
        return;
    };
    let nodes = first.map.polled();
    let period = first.map.poll;
    drop(first);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(s) = shared.upgrade() else {
            return;
        };
        let at = Instant::now();
        match lane.read(&nodes, at + s.map.request_timeout).await {
            Ok(values) => {
                s.link_up();
                for (n, value) in nodes.iter().zip(values) {
                    s.record(n.node.clone(), Sample { at, value });
                }
            }
            Err(e) => s.link_down(e.to_string()),
        }
        s.disarm_if_disabled();
    }
}

/// Feeds the watchdog while armed (`crate::mirror::lanes::feed_loop`),
/// until the driver is dropped.
pub async fn feed_loop(shared: Weak<Shared>, lanes: Weak<Lanes>) {
    let Some(period) = shared
        .upgrade()
        .and_then(|s| s.map.watchdog.as_ref().map(|w| w.period))
    else {
        return;
    };
    crate::mirror::lanes::feed_loop(shared, lanes, period, |s, l, v, until| async move {
        feed(&s, &l, v, until).await;
    })
    .await;
}

/// The counter as a value of the watchdog's type: it wraps within the
/// type's range, so consecutive values always differ.
fn feed_value(t: VarType, counter: u32) -> UaValue {
    let modulus: u32 = match t {
        VarType::SByte => 0x80,
        VarType::Byte => 0x100,
        VarType::Int16 => 0x8000,
        VarType::UInt16 => 0x1_0000,
        VarType::Int32 | VarType::Float => 0x0100_0000,
        _ => 0,
    };
    let v = if modulus == 0 {
        counter
    } else {
        counter % modulus
    };
    UaValue::Number(t, f64::from(v))
}

/// One watchdog write on the safety lane (a heartbeat, not a command write).
pub async fn feed(s: &Shared, lanes: &Lanes, counter: u32, until: Instant) {
    let Some(wd) = s.map.watchdog.as_ref() else {
        return;
    };
    let Ok(mut lane) = tokio::time::timeout_at(until.into(), lanes.safety.lock()).await else {
        return;
    };
    let v = feed_value(wd.point.data_type, counter);
    if let Err(e) = lane.write(&wd.point.node, v, until).await {
        s.note_error(format!("watchdog {}: {e}", wd.point.label()));
    }
}

/// The native stop: its steps on the safety lane, or on a session of its
/// own when a feed holds it; re-asserted after an in-flight command step
/// (`crate::mirror::lanes::stop_and_reassert`).
///
/// # Errors
/// The first step that failed, or the bound passing.
pub async fn stop(s: Arc<Shared>, lanes: Arc<Lanes>, until: Instant) -> Result<(), Signal> {
    let timeout = s.map.request_timeout;
    let shared = s.clone();
    crate::mirror::lanes::stop_and_reassert(s, timeout, until, move |until| {
        let (s, lanes) = (shared.clone(), lanes.clone());
        async move { stop_on_a_free_lane(&s, &lanes, until).await }
    })
    .await
}

async fn stop_on_a_free_lane(s: &Shared, lanes: &Lanes, until: Instant) -> Result<(), Signal> {
    if let Ok(mut lane) = lanes.safety.try_lock() {
        return stop_steps(s, &mut lane, until).await;
    }
    let mut own = Lane::new(s.map.clone(), &s.device_id).map_err(|e| Signal::Failed {
        reason: "client".into(),
        message: e,
    })?;
    stop_steps(s, &mut own, until).await
}

async fn stop_steps(s: &Shared, lane: &mut Lane, until: Instant) -> Result<(), Signal> {
    let planned = plan(&s.map.stop, &Value::Null).map_err(|e| match e {
        Signal::Failed { message, .. } => Signal::Failed {
            reason: "not_representable".into(),
            message,
        },
        other => other,
    })?;
    for p in &planned {
        if let Err(e) = send(lane, p, until).await {
            s.note_error(format!("stop {}: {e}", p.label));
            return Err(Signal::NativeFailed {
                reason: e.reason().into(),
                message: format!("the native stop's step {} failed: {e}", p.label),
                native: native_details(&e, &[]),
            });
        }
    }
    Ok(())
}

/// A step ready to send: its values encoded.
struct Planned<'a> {
    step: &'a Step,
    label: String,
    /// The field value (a write) or the argument values (a call).
    value: Value,
    native: Vec<UaValue>,
}

fn source_value(source: &Source, input: &Value) -> Option<Value> {
    match source {
        Source::Input(name) => input.get(name).cloned(),
        Source::Constant(v) => Some(v.clone()),
    }
}

fn not_representable(e: &str) -> Signal {
    Signal::Failed {
        reason: "not_representable".into(),
        message: format!("nothing was written: {e}"),
    }
}

/// Every step of a target, encoded before anything is sent: a value the
/// node's type cannot hold exactly refuses the whole call, nothing written.
/// A write whose input is absent is skipped; a call needs all its inputs.
fn plan<'a>(steps: &'a [Step], input: &Value) -> Result<Vec<Planned<'a>>, Signal> {
    let mut out = Vec::with_capacity(steps.len());
    for step in steps {
        match step {
            Step::Write(w) => {
                let Some(value) = source_value(&w.source, input) else {
                    continue;
                };
                let native = w.point.encode(&value).map_err(|e| not_representable(&e))?;
                out.push(Planned {
                    step,
                    label: step.label(),
                    value,
                    native: vec![native],
                });
            }
            Step::Call(c) => {
                let mut values = Vec::with_capacity(c.args.len());
                let mut native = Vec::with_capacity(c.args.len());
                for (k, a) in c.args.iter().enumerate() {
                    let label = format!("argument {k} of {}", c.method.text);
                    let v = source_value(&a.source, input).ok_or_else(|| {
                        not_representable(&format!("the input has no value for {label}"))
                    })?;
                    let n = arg_point(a.data_type, &label)
                        .encode(&v)
                        .map_err(|e| not_representable(&e))?;
                    values.push(v);
                    native.push(n);
                }
                out.push(Planned {
                    step,
                    label: step.label(),
                    value: Value::from(values),
                    native,
                });
            }
        }
    }
    if out.is_empty() {
        return Err(Signal::Failed {
            reason: "nothing_to_write".into(),
            message: "the input names none of the fields this target writes".into(),
        });
    }
    Ok(out)
}

async fn send(lane: &mut Lane, p: &Planned<'_>, until: Instant) -> Result<(), IoError> {
    match p.step {
        Step::Write(w) => {
            let v = p
                .native
                .first()
                .copied()
                .ok_or_else(|| IoError::Transport("nothing encoded".into()))?;
            lane.write(&w.point.node, v, until).await
        }
        Step::Call(c) => lane.call(c, &p.native, until).await,
    }
}

fn native_details(e: &IoError, made: &[Value]) -> Value {
    let mut d = json!({"writes_made": made});
    if let IoError::Status { code, name } = e {
        d["status_code"] = json!(code);
        d["status"] = json!(name);
    }
    d
}

/// A call's steps, in order, on the command lane; see the module charter.
///
/// # Errors
/// A signal the kernel classifies.
pub async fn run_call(
    s: Arc<Shared>,
    lanes: Arc<Lanes>,
    steps: Vec<Step>,
    (capability_id, input): (String, Value),
    cancel: CancelToken,
    until: Instant,
) -> Result<Value, Signal> {
    let planned = plan(&steps, &input)?;
    let Ok(mut lane) = tokio::time::timeout_at(until.into(), lanes.command.lock()).await else {
        return Err(Signal::Busy);
    };
    let (_call, epoch, feed_first) = CallGuard::begin(&s, &cancel)?;
    if let Some(v) = feed_first {
        feed(&s, &lanes, v, until).await;
    }
    send_all(&s, &mut lane, &planned, &cancel, epoch, until)
        .await
        .map(|writes| crate::mapping::call_output(&capability_id, &input, writes))
}

async fn send_all(
    s: &Shared,
    lane: &mut Lane,
    planned: &[Planned<'_>],
    cancel: &CancelToken,
    epoch: u64,
    until: Instant,
) -> Result<Value, Signal> {
    let mut made: Vec<Value> = Vec::new();
    for p in planned {
        may_continue(s, cancel, epoch, &made, planned.len())?;
        let r = {
            let _in_flight = InFlight::new(s);
            send(lane, p, until).await
        };
        match r {
            Ok(()) => {
                let raw: Vec<Value> = p.native.iter().map(|n| n.to_json()).collect();
                let raw = if matches!(p.step, Step::Write(_)) {
                    raw.into_iter().next().unwrap_or(Value::Null)
                } else {
                    Value::from(raw)
                };
                made.push(json!({"point": p.label, "value": p.value, "raw": raw}));
            }
            Err(e) => return Err(step_failed(s, &e, &made, &p.label)),
        }
    }
    Ok(json!(made))
}

fn step_failed(s: &Shared, e: &IoError, made: &[Value], label: &str) -> Signal {
    if matches!(
        e,
        IoError::Timeout(_) | IoError::Transport(_) | IoError::Unreachable(_)
    ) {
        s.link_down(e.to_string());
    } else {
        s.note_error(format!("{label}: {e}"));
    }
    let mut native = native_details(e, made);
    native["failed_at"] = json!(label);
    if made.is_empty() && e.had_no_effect() {
        return Signal::NativeFailed {
            reason: e.reason().into(),
            message: format!("{label} was not applied: {e}"),
            native,
        };
    }
    Signal::NativeUnknown {
        message: format!(
            "{label} ended uncertain or a later step failed ({e}) after {} step(s); read the device before acting again",
            made.len()
        ),
        native,
    }
}
