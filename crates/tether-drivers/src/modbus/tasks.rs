//! The driver's I/O, on its own runtime thread, one connection per lane.
//!
//! **Owns:** the poll lane (keeps the mirror and the link fresh), the command
//! lane (a call's ordered writes), and the safety lane (the native stop and
//! the watchdog feed), so a stop never waits behind a command or a poll; a
//! busy safety lane makes the stop open a connection of its own.
//! **Never here:** decisions (the kernel's), retries of an actuation: a write
//! is sent once and a target's writes that fail part-way end `unknown`,
//! listing the writes made. Re-sending a *stop* is not an actuation.

use super::codec::{Native, Point};
use super::lane::{IoError, Lane};
use super::map::{Source, Write};
use super::shared::{key, Sample, Shared};
use crate::mirror::lanes::{may_continue, CallGuard, InFlight};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Instant;
use tether_kernel::{CancelToken, Signal};
use tokio::sync::Mutex;

/// The lanes a driver owns.
#[derive(Debug)]
pub struct Lanes {
    /// Command writes, one call at a time.
    pub command: Mutex<Lane>,
    /// The native stop and the watchdog feed.
    pub safety: Mutex<Lane>,
}

impl Lanes {
    /// Lanes to `addr` (nothing is opened until used).
    pub fn new(shared: &Shared, addr: SocketAddr) -> Self {
        let m = &shared.map;
        let lane = || Lane::new(addr, m.unit_id, m.connect_timeout, m.request_timeout);
        Self {
            command: Mutex::new(lane()),
            safety: Mutex::new(lane()),
        }
    }
}

/// Keeps the mirror fresh: every `poll` period, every polled point, until
/// the driver is dropped (the loop ends when the weak reference does).
pub async fn poll_loop(shared: Weak<Shared>, addr: SocketAddr) {
    let Some(first) = shared.upgrade() else {
        return;
    };
    let m = &first.map;
    let mut lane = Lane::new(addr, m.unit_id, m.connect_timeout, m.request_timeout);
    let points = m.polled();
    let period = m.poll;
    drop(first);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(s) = shared.upgrade() else {
            return;
        };
        poll_round(&s, &mut lane, &points).await;
        s.disarm_if_disabled();
    }
}

async fn poll_round(s: &Shared, lane: &mut Lane, points: &[Point]) {
    for p in points {
        let at = Instant::now();
        let until = at + s.map.request_timeout;
        match lane.read(p, until).await {
            Ok(v) => {
                s.link_up();
                s.record(key(p), Sample { at, value: Ok(v) });
            }
            Err(e @ IoError::Exception { .. }) => {
                s.link_up();
                s.note_error(format!("{}: {e}", p.label()));
                let value = Err(format!("the device refused the read: {e}"));
                s.record(key(p), Sample { at, value });
            }
            Err(e) => {
                // The link is down: the rest of the round would only wait
                // out the same timeout; their readings age instead.
                s.link_down(e.to_string());
                return;
            }
        }
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

/// One watchdog write on the safety lane (a heartbeat, not a command write).
pub async fn feed(s: &Shared, lanes: &Lanes, value: u32, until: Instant) {
    let Some(wd) = s.map.watchdog.as_ref() else {
        return;
    };
    let Ok(mut lane) = tokio::time::timeout_at(until.into(), lanes.safety.lock()).await else {
        return;
    };
    if let Err(e) = lane
        // The counter's low word: consecutive values still differ.
        .write(
            &wd.point,
            &Native::Words(vec![(value & 0xFFFF) as u16]),
            until,
        )
        .await
    {
        s.note_error(format!("watchdog {}: {e}", wd.point.label()));
    }
}

/// The native stop: its writes on the safety lane, or on a fresh
/// connection when a feed holds it; re-asserted after an in-flight command
/// write (`crate::mirror::lanes::stop_and_reassert`).
///
/// # Errors
/// The first write that failed, or the bound passing.
pub async fn stop(
    s: Arc<Shared>,
    lanes: Arc<Lanes>,
    addr: SocketAddr,
    until: Instant,
) -> Result<(), Signal> {
    let timeout = s.map.request_timeout;
    let shared = s.clone();
    crate::mirror::lanes::stop_and_reassert(s, timeout, until, move |until| {
        let (s, lanes) = (shared.clone(), lanes.clone());
        async move { stop_on_a_free_lane(&s, &lanes, addr, until).await }
    })
    .await
}

async fn stop_on_a_free_lane(
    s: &Shared,
    lanes: &Lanes,
    addr: SocketAddr,
    until: Instant,
) -> Result<(), Signal> {
    let m = &s.map;
    if let Ok(mut lane) = lanes.safety.try_lock() {
        return stop_writes(s, &mut lane, until).await;
    }
    let mut own = Lane::new(addr, m.unit_id, m.connect_timeout, m.request_timeout);
    stop_writes(s, &mut own, until).await
}

async fn stop_writes(s: &Shared, lane: &mut Lane, until: Instant) -> Result<(), Signal> {
    for w in &s.map.stop {
        let Source::Constant(v) = &w.source else {
            continue;
        };
        let native = w.point.encode(v).map_err(|e| Signal::Failed {
            reason: "not_representable".into(),
            message: e,
        })?;
        if let Err(e) = lane.write(&w.point, &native, until).await {
            s.note_error(format!("stop {}: {e}", w.label));
            return Err(Signal::NativeFailed {
                reason: e.reason().into(),
                message: format!("the native stop's write to {} failed: {e}", w.label),
                native: native_details(&e, &[]),
            });
        }
    }
    Ok(())
}

/// A write ready to send.
struct Planned<'a> {
    write: &'a Write,
    value: Value,
    native: Native,
}

/// Every write of a target, encoded before anything is sent: a value the
/// native type cannot hold exactly refuses the whole call, nothing written.
fn plan<'a>(writes: &'a [Write], input: &Value) -> Result<Vec<Planned<'a>>, Signal> {
    let mut out = Vec::with_capacity(writes.len());
    for w in writes {
        let value = match &w.source {
            Source::Input(name) => match input.get(name) {
                Some(v) => v.clone(),
                None => continue,
            },
            Source::Constant(v) => v.clone(),
        };
        let native = w.point.encode(&value).map_err(|e| Signal::Failed {
            reason: "not_representable".into(),
            message: format!("nothing was written: {e}"),
        })?;
        out.push(Planned {
            write: w,
            value,
            native,
        });
    }
    if out.is_empty() {
        return Err(Signal::Failed {
            reason: "nothing_to_write".into(),
            message: "the input names none of the fields this target writes".into(),
        });
    }
    Ok(out)
}

fn native_details(e: &IoError, made: &[Value]) -> Value {
    let mut d = json!({"writes_made": made});
    if let IoError::Exception { code, name } = e {
        d["exception_code"] = json!(code);
        d["exception"] = json!(name);
    }
    d
}

/// A call's writes, in order, on the command lane; see the module charter.
///
/// # Errors
/// A signal the kernel classifies.
pub async fn run_call(
    s: Arc<Shared>,
    lanes: Arc<Lanes>,
    writes: Vec<Write>,
    (capability_id, input): (String, Value),
    cancel: CancelToken,
    until: Instant,
) -> Result<Value, Signal> {
    let planned = plan(&writes, &input)?;
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
            lane.write(&p.write.point, &p.native, until).await
        };
        match r {
            Ok(()) => made
                .push(json!({"point": p.write.label, "value": p.value, "raw": p.native.to_json()})),
            Err(e) => return Err(write_failed(s, &e, &made, &p.write.label)),
        }
    }
    Ok(json!(made))
}

fn write_failed(s: &Shared, e: &IoError, made: &[Value], label: &str) -> Signal {
    if matches!(e, IoError::Timeout(_) | IoError::Transport(_)) {
        s.link_down(e.to_string());
    } else {
        s.note_error(format!("{label}: {e}"));
    }
    let mut native = native_details(e, made);
    native["failed_at"] = json!(label);
    if made.is_empty() && e.had_no_effect() {
        return Signal::NativeFailed {
            reason: e.reason().into(),
            message: format!("the write to {label} was not applied: {e}"),
            native,
        };
    }
    Signal::NativeUnknown {
        message: format!(
            "the write to {label} ended uncertain or a later write failed ({e}) after {} write(s); read the device before acting again",
            made.len()
        ),
        native,
    }
}
