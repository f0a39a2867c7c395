//! What the driver knows of the device, shared between the session thread
//! and the trait methods: the last state message with its receive time, the
//! link, the acknowledgement routes of running commands, the running dose.
//!
//! Every lock here is held for a copy or an insert, never across I/O or an
//! await, so `read`, `interlocks`, `link` and `estop` answer at once.
//!
//! **Owns:** the mirror and its freshness rule, mapping the state message to
//! the resource document (native units converted to the schema's) and to
//! interlock readings. **Never belongs here:** I/O, payload templates.

use super::config::Config;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tether_kernel::{InterlockState, Link, Signal};
use tether_limits::units;
use tokio::sync::mpsc;

/// Commands whose acknowledgements are awaited at once.
pub const ROUTES_MAX: usize = 64;
/// Acknowledgements buffered for one command.
pub const ACKS_PER_COMMAND: usize = 16;
/// Longest error text kept for people.
const ERROR_CHARS_MAX: usize = 200;

/// One state message.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When it arrived (monotonic).
    pub at: Instant,
    /// When it arrived (wall clock, ms).
    pub wall_ms: u64,
    /// The message.
    pub raw: Value,
}

impl Sample {
    /// A message received now.
    pub fn now(raw: Value) -> Self {
        Self {
            at: Instant::now(),
            wall_ms: now_ms(),
            raw,
        }
    }
}

/// Wall-clock milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The running dose, for the native stop.
#[derive(Debug, Clone, Default)]
pub struct Running {
    /// Its correlation value.
    pub command_id: String,
    /// Whether the native stop for it was published already.
    pub stop_sent: bool,
}

#[derive(Default)]
struct Inner {
    link: Option<Link>,
    sample: Option<Sample>,
    routes: HashMap<String, mpsc::Sender<Value>>,
    running: Option<Running>,
}

/// The shared mirror.
#[derive(Default)]
pub struct Shared {
    inner: Mutex<Inner>,
}

/// Keeps what a device says for people: printable characters, bounded.
pub fn filtered(text: &str) -> String {
    text.chars()
        .filter(|c| c.is_ascii_alphanumeric() || " _-.:,/()=".contains(*c))
        .take(ERROR_CHARS_MAX)
        .collect()
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Plain data: a panic elsewhere leaves it usable.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The link now.
    pub fn link(&self) -> Link {
        self.lock().link.clone().unwrap_or(Link {
            connected: false,
            since_ms: now_ms(),
            last_error: None,
        })
    }

    /// Records a link change (and an error, kept across reconnects).
    pub fn set_link(&self, connected: bool, error: Option<String>) {
        let mut g = self.lock();
        let prev = g.link.take();
        let since_ms = match &prev {
            Some(l) if l.connected == connected => l.since_ms,
            _ => now_ms(),
        };
        let last_error = error
            .map(|e| filtered(&e))
            .or(prev.and_then(|l| l.last_error));
        g.link = Some(Link {
            connected,
            since_ms,
            last_error,
        });
    }

    /// Records a native problem without changing the connection state.
    pub fn note_error(&self, error: &str) {
        let connected = self.lock().link.as_ref().is_some_and(|l| l.connected);
        self.set_link(connected, Some(error.to_owned()));
    }

    /// Stores a state message.
    pub fn set_sample(&self, s: Sample) {
        self.lock().sample = Some(s);
    }

    /// The last state message if younger than `stale_after`.
    pub fn fresh(&self, stale_after: Duration) -> Result<Sample, Signal> {
        match self.lock().sample.clone() {
            Some(s) if s.at.elapsed() <= stale_after => Ok(s),
            Some(s) => Err(Signal::OutcomeUnknown {
                message: format!(
                    "the device's last state message is {} ms old (staleness bound {} ms): its state is unknown",
                    s.at.elapsed().as_millis(),
                    stale_after.as_millis()
                ),
            }),
            None => Err(Signal::OutcomeUnknown {
                message: "no state message from the device yet: its state is unknown".into(),
            }),
        }
    }

    /// Opens the acknowledgement route of a command.
    pub fn open_route(&self, command_id: &str) -> Result<mpsc::Receiver<Value>, Signal> {
        let mut g = self.lock();
        if g.routes.len() >= ROUTES_MAX {
            return Err(Signal::Busy);
        }
        let (tx, rx) = mpsc::channel(ACKS_PER_COMMAND);
        g.routes.insert(command_id.to_owned(), tx);
        Ok(rx)
    }

    /// Closes it.
    pub fn close_route(&self, command_id: &str) {
        self.lock().routes.remove(command_id);
    }

    /// Hands an acknowledgement to its command (dropped when none waits).
    pub fn route_ack(&self, command_id: &str, ack: Value) {
        if let Some(tx) = self.lock().routes.get(command_id) {
            let _ = tx.try_send(ack);
        }
    }

    /// Sets or clears the running dose.
    pub fn set_running(&self, r: Option<Running>) {
        self.lock().running = r;
    }

    /// The correlation value the native stop names, marking its stop sent:
    /// the running dose's, else `fallback`.
    pub fn take_stop(&self, fallback: &str) -> String {
        let mut g = self.lock();
        match g.running.as_mut() {
            Some(r) => {
                r.stop_sent = true;
                r.command_id.clone()
            }
            None => fallback.to_owned(),
        }
    }

    /// Forgets that the native stop of `command_id` was sent (its publish
    /// failed), so the command's own stop tries again.
    pub fn stop_failed(&self, command_id: &str) {
        if let Some(r) = self
            .lock()
            .running
            .as_mut()
            .filter(|r| r.command_id == command_id)
        {
            r.stop_sent = false;
        }
    }

    /// Whether the native stop of `command_id` was published already.
    pub fn stop_sent(&self, command_id: &str) -> bool {
        self.lock()
            .running
            .as_ref()
            .is_some_and(|r| r.command_id == command_id && r.stop_sent)
    }
}

/// A dotted path in a message.
pub fn at_path<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

/// The resource document of a state message, in declared units.
///
/// # Errors
/// A mapped member missing or not convertible: the state is unknown.
pub fn document(cfg: &Config, raw: &Value) -> Result<Value, Signal> {
    let unknown = |m: String| Signal::OutcomeUnknown { message: m };
    let mut doc = Map::new();
    for f in &cfg.fields {
        let v = at_path(raw, &f.path).ok_or_else(|| {
            unknown(format!(
                "the state message has no `{}`: `{}` is unknown",
                f.path, f.name
            ))
        })?;
        doc.insert(
            f.name.clone(),
            declared(f.native_unit.as_deref(), f.schema_unit.as_deref(), v).map_err(unknown)?,
        );
    }
    Ok(Value::Object(doc))
}

/// A native value in the declared unit.
pub fn declared(native: Option<&str>, schema: Option<&str>, v: &Value) -> Result<Value, String> {
    let (Some(n), Some(s)) = (native, schema) else {
        return Ok(v.clone());
    };
    let x = v
        .as_f64()
        .ok_or_else(|| format!("`{v}` is not a number in {n}"))?;
    let y = units::convert(x, n, s).map_err(|e| e.to_string())?;
    serde_json::Number::from_f64(y)
        .map(Value::Number)
        .ok_or_else(|| "not finite".into())
}

/// Interlock readings of a state message (`None`: stale or absent).
pub fn interlocks(cfg: &Config, sample: Option<&Sample>) -> Vec<(String, InterlockState)> {
    cfg.interlocks
        .iter()
        .map(|m| {
            let state = match sample.and_then(|s| at_path(&s.raw, &m.path)) {
                None => InterlockState::Unknown,
                Some(v) if *v == m.closed => InterlockState::Closed,
                Some(_) => InterlockState::Open,
            };
            (m.id.clone(), state)
        })
        .collect()
}
