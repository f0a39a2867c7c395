//! `tether sim serve`: the simulated arm as a separate process, driven over a
//! small line protocol with leases (documented in docs/SIM_PROTOCOL.md).
//!
//! The controller here enforces the lease by itself: a motion whose lease is
//! not renewed in time stops where it is (`last_stop.reason = lease_expired`).
//! That is what makes a `kill -9` of the endpoint safe for this device: nothing
//! renews, so the arm stops within one lease.

use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// Protocol name and version, answered by `hello`.
pub const PROTOCOL: &str = "tether-sim/1";
/// Longest request line, bytes.
pub const LINE_BYTES_MAX: usize = 64 * 1024;
/// Watchdog tick of the controller, ms.
const TICK_MS: u64 = 5;
/// Shortest and longest lease accepted, ms.
const LEASE_MS_MIN: u64 = 20;
const LEASE_MS_MAX: u64 = 60_000;
/// Joints of the simulated arm.
const JOINTS: usize = 6;

#[derive(Debug, Clone)]
struct Motion {
    id: u64,
    start: [f64; JOINTS],
    target: [f64; JOINTS],
    began: Instant,
    duration_s: f64,
    lease_until: Instant,
}

impl Motion {
    fn at(&self, now: Instant) -> [f64; JOINTS] {
        let frac = if self.duration_s > 0.0 {
            (now.saturating_duration_since(self.began).as_secs_f64() / self.duration_s).min(1.0)
        } else {
            1.0
        };
        std::array::from_fn(|i| self.start[i] + (self.target[i] - self.start[i]) * frac)
    }
    fn finished(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.began).as_secs_f64() >= self.duration_s
    }
}

#[derive(Debug)]
struct Arm {
    positions: [f64; JOINTS],
    motion: Option<Motion>,
    next_id: u64,
    /// (motion id, reason, at ms since epoch, output when completed)
    last_end: Option<(u64, String, u64, Value)>,
    door: String,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Arm {
    fn end_motion(&mut self, now: Instant, reason: &str) {
        if let Some(m) = self.motion.take() {
            let done = reason == "completed";
            self.positions = if done { m.target } else { m.at(now) };
            let out = if done {
                json!({"joints": m.target, "duration_s": m.duration_s})
            } else {
                Value::Null
            };
            self.last_end = Some((m.id, reason.to_owned(), now_ms(), out));
        }
    }

    /// The watchdog: completes finished motions and stops unrenewed ones.
    fn tick(&mut self, now: Instant) {
        let Some(m) = &self.motion else { return };
        if m.finished(now) {
            self.end_motion(now, "completed");
        } else if now > m.lease_until {
            self.end_motion(now, "lease_expired");
        }
    }

    fn status(&self, now: Instant) -> Value {
        let positions = self.motion.as_ref().map_or(self.positions, |m| m.at(now));
        json!({
            "ok": true,
            "device": "arm-1",
            "positions": positions,
            "moving": self.motion.is_some(),
            "target": self.motion.as_ref().map(|m| m.target),
            "motion_id": self.motion.as_ref().map(|m| m.id),
            "last_stop": self.last_end.as_ref().map(|(id, reason, at, _)| json!({"motion_id": id, "reason": reason, "at_ms": at})),
            "door": self.door,
        })
    }
}

fn joints_of(v: &Value) -> Option<[f64; JOINTS]> {
    let a = v.as_array().filter(|a| a.len() == JOINTS)?;
    let mut out = [0.0; JOINTS];
    for (slot, x) in out.iter_mut().zip(a) {
        *slot = x.as_f64().filter(|f| f.is_finite())?;
    }
    Some(out)
}

fn lease_of(req: &Value) -> Result<Duration, Value> {
    match req.get("lease_ms").and_then(Value::as_u64) {
        Some(ms) if (LEASE_MS_MIN..=LEASE_MS_MAX).contains(&ms) => Ok(Duration::from_millis(ms)),
        _ => Err(json!({"ok": false, "error": "lease_ms must be an integer from 20 to 60000"})),
    }
}

fn handle(arm: &Mutex<Arm>, req: &Value) -> Value {
    let Ok(mut a) = arm.lock() else {
        return json!({"ok": false, "error": "simulator state unavailable"});
    };
    let now = Instant::now();
    a.tick(now);
    match req.get("op").and_then(Value::as_str) {
        Some("hello") => json!({"ok": true, "protocol": PROTOCOL, "devices": ["arm-1"]}),
        Some("status") => a.status(now),
        Some("move") => {
            let lease = match lease_of(req) {
                Ok(l) => l,
                Err(e) => return e,
            };
            let (Some(target), Some(speed)) = (
                req.get("joints").and_then(joints_of),
                req.get("speed")
                    .and_then(Value::as_f64)
                    .filter(|s| s.is_finite() && *s > 0.0),
            ) else {
                return json!({"ok": false, "error": "joints (6 numbers) and a positive speed are required"});
            };
            if a.motion.is_some() {
                return json!({"ok": false, "error": "busy"});
            }
            let start = a.positions;
            let travel = start
                .iter()
                .zip(&target)
                .map(|(x, y)| (y - x).abs())
                .fold(0.0, f64::max);
            a.next_id += 1;
            let id = a.next_id;
            a.motion = Some(Motion {
                id,
                start,
                target,
                began: now,
                duration_s: (travel / speed).min(600.0),
                lease_until: now + lease,
            });
            json!({"ok": true, "motion_id": id})
        }
        Some("renew") => {
            let lease = match lease_of(req) {
                Ok(l) => l,
                Err(e) => return e,
            };
            let id = req.get("motion_id").and_then(Value::as_u64).unwrap_or(0);
            if let Some(m) = a.motion.as_mut().filter(|m| m.id == id) {
                m.lease_until = now + lease;
                return json!({"ok": true, "state": "running"});
            }
            match &a.last_end {
                Some((end_id, reason, _, out)) if *end_id == id && reason == "completed" => {
                    json!({"ok": true, "state": "done", "output": out})
                }
                Some((end_id, reason, _, _)) if *end_id == id => {
                    json!({"ok": true, "state": "stopped", "reason": reason})
                }
                _ => json!({"ok": false, "error": "unknown motion"}),
            }
        }
        Some("stop") => {
            a.end_motion(now, "stop");
            json!({"ok": true})
        }
        Some("door") => match req.get("state").and_then(Value::as_str) {
            Some(s @ ("open" | "closed")) => {
                a.door = s.to_owned();
                json!({"ok": true, "door": s})
            }
            _ => json!({"ok": false, "error": "state must be open or closed"}),
        },
        _ => json!({"ok": false, "error": "unknown op"}),
    }
}

/// Serves the simulator until the listener fails.
///
/// # Errors
/// The listener's I/O error.
pub async fn serve(listener: TcpListener) -> std::io::Result<()> {
    let arm = Arc::new(Mutex::new(Arm {
        positions: [0.0; JOINTS],
        motion: None,
        next_id: 0,
        last_end: None,
        door: "closed".into(),
    }));
    let watchdog = arm.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(TICK_MS));
        // Runs for the life of the simulator process.
        loop {
            tick.tick().await;
            if let Ok(mut a) = watchdog.lock() {
                a.tick(Instant::now());
            }
        }
    });
    loop {
        let (stream, _) = listener.accept().await?;
        let arm = arm.clone();
        tokio::spawn(async move {
            let _ = connection(stream, &arm).await;
        });
    }
}

async fn connection(stream: TcpStream, arm: &Mutex<Arm>) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut buf = String::new();
    // One request per line until the peer closes.
    loop {
        buf.clear();
        let n = (&mut reader)
            .take(LINE_BYTES_MAX as u64)
            .read_line(&mut buf)
            .await?;
        if n == 0 {
            return Ok(());
        }
        let mut answer = match serde_json::from_str::<Value>(&buf) {
            Ok(req) => {
                let mut a = handle(arm, &req);
                a["id"] = req.get("id").cloned().unwrap_or(Value::Null);
                a
            }
            Err(_) => json!({"ok": false, "error": "not JSON", "id": null}),
        };
        let mut line = std::mem::take(&mut answer).to_string();
        line.push('\n');
        write.write_all(line.as_bytes()).await?;
    }
}
