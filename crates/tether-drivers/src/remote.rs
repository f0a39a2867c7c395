//! `remote.arm`: an arm in a controller outside this process (`tether sim
//! serve`), driven with leased commands through the kernel's runner.
//!
//! `driver_config`: `address` (host:port of the controller, required),
//! `lease_ms` (default 300), `park_speed_rad_s` (default 1.0).
//!
//! Its link ([`Driver::link`]) is the background status watch's: connected
//! while the watch's last request was answered, since the watch last saw it
//! change (down from the driver's start until the first answer), with the
//! last failure as a fixed phrase (`connection refused`, `timed out`, …),
//! never the operating system's or the controller's own text.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader as StdBufReader, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tether_core::receipt::now_ms;
use tether_kernel::lease::{run_leased, LeasedController, Progress};
use tether_kernel::{Authorized, BoxFuture, CancelToken, Driver, InterlockState, Link, Signal};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// How long one request to the controller may take.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(1000);
/// Longest motion the runner lets run (a binding's `max_duration_ms`
/// shortens it).
const MOTION_MAX: Duration = Duration::from_secs(600);

/// How long a synchronous status request may take while the controller
/// answers promptly (a read, an interlock reading).
const STATUS_TIMEOUT: Duration = Duration::from_millis(150);
/// How often the background watch asks the controller for its status.
const WATCH_EVERY: Duration = Duration::from_millis(20);
/// A watch request outstanding longer than this marks the controller slow:
/// reads and interlock readings then answer at once from what is known
/// instead of waiting on it (a hung controller must never hold the
/// endpoint's threads; the driver contract asks for prompt answers).
const SLOW_AFTER: Duration = Duration::from_millis(50);
/// A status older than this is not used: the reading is unknown.
const STATUS_FRESH_FOR: Duration = Duration::from_millis(250);

/// The remote arm driver.
#[derive(Debug)]
pub struct RemoteArm {
    address: String,
    lease: Duration,
    park_speed: f64,
    watch: Arc<Watch>,
}

/// What the background watch knows of the controller.
#[derive(Debug)]
struct Watch {
    state: Mutex<WatchState>,
}

#[derive(Debug)]
struct WatchState {
    /// The last status the controller answered, and when.
    last: Option<(Instant, Value)>,
    /// Since when the watch's current request is outstanding.
    asking_since: Option<Instant>,
    /// Whether the watch's last request failed.
    failed: bool,
    /// The link as the watch sees it: up while its last request was
    /// answered; wall-clock ms of its last change; the last failure.
    link_up: bool,
    link_since_ms: u64,
    last_error: Option<&'static str>,
}

impl Default for Watch {
    fn default() -> Self {
        Self {
            state: Mutex::new(WatchState {
                last: None,
                asking_since: None,
                failed: false,
                // Down until the controller first answers.
                link_up: false,
                link_since_ms: now_ms(),
                last_error: None,
            }),
        }
    }
}

impl WatchState {
    /// Notes one watch request's outcome on the link.
    fn link_outcome(&mut self, outcome: Result<(), &'static str>) {
        if outcome.is_ok() != self.link_up {
            self.link_up = outcome.is_ok();
            self.link_since_ms = now_ms();
        }
        if let Err(e) = outcome {
            self.last_error = Some(e);
        }
    }
}

impl Watch {
    fn lock(&self) -> std::sync::MutexGuard<'_, WatchState> {
        // A poisoned lock only means a panic elsewhere; the state is plain data.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the controller answers promptly right now.
    fn responsive(&self) -> bool {
        let s = self.lock();
        !s.failed && s.asking_since.is_none_or(|t| t.elapsed() < SLOW_AFTER)
    }

    fn record(&self, status: Value) {
        self.lock().last = Some((Instant::now(), status));
    }

    /// The last status if it is fresh.
    fn fresh(&self) -> Option<Value> {
        let s = self.lock();
        s.last
            .as_ref()
            .filter(|(at, _)| at.elapsed() < STATUS_FRESH_FOR)
            .map(|(_, v)| v.clone())
    }
}

/// Asks the controller for its status every [`WATCH_EVERY`] until the
/// driver is dropped.
fn spawn_watch(address: String, watch: &Arc<Watch>) {
    let weak = Arc::downgrade(watch);
    let spawned = std::thread::Builder::new()
        .name("remote-arm-watch".into())
        .spawn(move || loop {
            let Some(watch) = weak.upgrade() else {
                return;
            };
            watch.lock().asking_since = Some(Instant::now());
            let answer = try_request(&address, &status_request(), REQUEST_TIMEOUT);
            {
                let mut s = watch.lock();
                s.asking_since = None;
                s.failed = answer.is_err();
                s.link_outcome(answer.as_ref().map(|_| ()).map_err(|f| f.text()));
                if let Ok(status) = answer {
                    s.last = Some((Instant::now(), status));
                }
            }
            drop(watch);
            std::thread::sleep(WATCH_EVERY);
        });
    if let Err(e) = spawned {
        // Without the watch every reading asks the controller itself.
        tracing::warn!(error = %e, "remote.arm: the status watch could not start");
    }
}

fn status_request() -> Value {
    json!({"op": "status", "device": "arm-1"})
}

impl RemoteArm {
    /// Builds it from `driver_config`.
    ///
    /// # Errors
    /// A missing address or a lease outside 20..=60000 ms.
    pub fn new(cfg: &Value) -> Result<Self, String> {
        let address = cfg
            .get("address")
            .and_then(Value::as_str)
            .ok_or("driver_config.address (host:port of `tether sim serve`) is required")?
            .to_owned();
        let lease_ms = cfg
            .get("lease_ms")
            .map_or(Some(300), Value::as_u64)
            .filter(|ms| (20..=60_000).contains(ms))
            .ok_or("driver_config.lease_ms must be an integer from 20 to 60000")?;
        let park_speed = crate::cfg_f64(cfg, "park_speed_rad_s", 1.0)?;
        let watch = Arc::new(Watch::default());
        spawn_watch(address.clone(), &watch);
        Ok(Self {
            address,
            lease: Duration::from_millis(lease_ms),
            park_speed,
            watch,
        })
    }

    /// One blocking request on a fresh connection (the native stop).
    fn request_blocking(&self, req: &Value) -> Result<Value, Signal> {
        request_blocking(&self.address, req, REQUEST_TIMEOUT)
    }

    /// The controller's status, promptly: asked for while the controller
    /// answers quickly, else the watch's last status if fresh, else unknown.
    fn status(&self) -> Result<Value, Signal> {
        if self.watch.responsive() {
            if let Ok(status) = request_blocking(&self.address, &status_request(), STATUS_TIMEOUT) {
                self.watch.record(status.clone());
                return Ok(status);
            }
        }
        self.watch.fresh().ok_or_else(|| Signal::OutcomeUnknown {
            message: format!(
                "controller {} is not answering promptly; its status is unknown",
                self.address
            ),
        })
    }
}

/// Why a request to the controller failed.
#[derive(Debug)]
enum Fault {
    /// The address does not parse.
    BadAddress(String),
    /// The exchange failed (connect, write, read).
    Io(std::io::Error),
    /// The connection closed before an answer.
    Closed,
    /// The answer is not JSON.
    NotJson,
}

impl Fault {
    /// A fixed phrase for people (the link's last error): never the operating
    /// system's or the controller's text.
    fn text(&self) -> &'static str {
        use std::io::ErrorKind as K;
        match self {
            Fault::BadAddress(_) => "bad address",
            Fault::Closed => "connection closed",
            Fault::NotJson => "answer is not JSON",
            Fault::Io(e) => match e.kind() {
                K::ConnectionRefused => "connection refused",
                K::TimedOut | K::WouldBlock => "timed out",
                K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe => "connection reset",
                K::UnexpectedEof => "connection closed",
                K::AddrNotAvailable | K::NetworkUnreachable | K::HostUnreachable => "unreachable",
                _ => "I/O error",
            },
        }
    }

    fn into_signal(self, address: &str) -> Signal {
        match self {
            Fault::BadAddress(e) => Signal::Failed {
                reason: "bad_address".into(),
                message: e,
            },
            Fault::NotJson => Signal::OutcomeUnknown {
                message: "the controller's answer is not JSON".into(),
            },
            Fault::Closed => Signal::OutcomeUnknown {
                message: format!("controller {address}: connection closed before an answer"),
            },
            Fault::Io(e) => Signal::OutcomeUnknown {
                message: format!("controller {address} unreachable: {e}"),
            },
        }
    }
}

/// One blocking request on a fresh connection, each step bounded by `timeout`.
fn request_blocking(address: &str, req: &Value, timeout: Duration) -> Result<Value, Signal> {
    try_request(address, req, timeout).map_err(|f| f.into_signal(address))
}

/// [`request_blocking`], failing with what went wrong.
fn try_request(address: &str, req: &Value, timeout: Duration) -> Result<Value, Fault> {
    let addr = address
        .parse::<std::net::SocketAddr>()
        .map_err(|e| Fault::BadAddress(e.to_string()))?;
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout).map_err(Fault::Io)?;
    stream.set_read_timeout(Some(timeout)).map_err(Fault::Io)?;
    stream.set_write_timeout(Some(timeout)).map_err(Fault::Io)?;
    let mut line = req.to_string();
    line.push('\n');
    stream.write_all(line.as_bytes()).map_err(Fault::Io)?;
    let mut answer = String::new();
    let limited = std::io::Read::take(stream, crate::simproc::LINE_BYTES_MAX as u64);
    let read = StdBufReader::new(limited)
        .read_line(&mut answer)
        .map_err(Fault::Io)?;
    if read == 0 {
        return Err(Fault::Closed);
    }
    serde_json::from_str(&answer).map_err(|_| Fault::NotJson)
}

/// One leased motion over a persistent connection.
struct Motion {
    address: String,
    joints: [f64; 6],
    speed: f64,
    conn: Option<BufReader<TcpStream>>,
    motion_id: u64,
}

impl Motion {
    async fn request(&mut self, req: Value) -> Result<Value, Signal> {
        let address = self.address.clone();
        let unknown = move |m: String| Signal::OutcomeUnknown {
            message: format!("controller {address}: {m}"),
        };
        if self.conn.is_none() {
            let s = tokio::time::timeout(REQUEST_TIMEOUT, TcpStream::connect(&self.address))
                .await
                .map_err(|_| unknown("connect timed out".into()))?
                .map_err(|e| unknown(e.to_string()))?;
            self.conn = Some(BufReader::new(s));
        }
        let Some(conn) = self.conn.as_mut() else {
            return Err(unknown("no connection".into()));
        };
        let mut line = req.to_string();
        line.push('\n');
        let exchange = async {
            conn.get_mut().write_all(line.as_bytes()).await?;
            let mut answer = String::new();
            conn.read_line(&mut answer).await?;
            Ok::<String, std::io::Error>(answer)
        };
        let answer = match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
            Ok(Ok(a)) if !a.is_empty() => a,
            Ok(Ok(_)) => {
                self.conn = None;
                return Err(unknown("connection closed".into()));
            }
            Ok(Err(e)) => {
                self.conn = None;
                return Err(unknown(e.to_string()));
            }
            Err(_) => {
                self.conn = None;
                return Err(unknown("request timed out".into()));
            }
        };
        serde_json::from_str(&answer).map_err(|_| unknown("answer is not JSON".into()))
    }
}

impl LeasedController for Motion {
    fn send(&mut self, lease: Duration) -> BoxFuture<'_, Result<(), Signal>> {
        Box::pin(async move {
            let r = self.request(json!({"op": "move", "device": "arm-1", "joints": self.joints, "speed": self.speed, "lease_ms": lease.as_millis() as u64})).await?;
            if r["ok"] != true {
                return Err(if r["error"] == "busy" {
                    Signal::Busy
                } else {
                    Signal::Failed {
                        reason: "controller_refused".into(),
                        message: r["error"].as_str().unwrap_or("refused").to_owned(),
                    }
                });
            }
            self.motion_id = r["motion_id"].as_u64().unwrap_or(0);
            Ok(())
        })
    }

    fn renew(&mut self, lease: Duration) -> BoxFuture<'_, Result<Progress, Signal>> {
        Box::pin(async move {
            let r = self.request(json!({"op": "renew", "motion_id": self.motion_id, "lease_ms": lease.as_millis() as u64})).await?;
            match r["state"].as_str() {
                Some("running") => Ok(Progress::Running),
                Some("done") => Ok(Progress::Done(r["output"].clone())),
                Some("stopped") => Err(Signal::Failed {
                    reason: "stopped_by_controller".into(),
                    message: format!(
                        "the controller stopped the motion ({})",
                        r["reason"].as_str().unwrap_or("?")
                    ),
                }),
                _ => Err(Signal::OutcomeUnknown {
                    message: format!("unexpected controller answer: {r}"),
                }),
            }
        })
    }

    fn stop(&mut self) -> BoxFuture<'_, Result<(), Signal>> {
        Box::pin(async move {
            // A fresh connection: the motion's own may be the broken part.
            self.conn = None;
            self.request(json!({"op": "stop", "device": "arm-1"}))
                .await
                .map(|_| ())
        })
    }
}

impl Driver for RemoteArm {
    fn read(&self, _call: &Authorized) -> Result<Value, Signal> {
        let s = self.status()?;
        Ok(json!({"positions": s["positions"], "moving": s["moving"], "target": s["target"]}))
    }

    fn call(&self, call: Authorized, cancel: CancelToken) -> BoxFuture<'_, Result<Value, Signal>> {
        Box::pin(async move {
            let (joints, speed) = match call.target() {
                "move_to" => {
                    let joints = call
                        .input()
                        .get("joints")
                        .and_then(crate::arm::joints_of_pub)
                        .ok_or_else(|| Signal::Failed {
                            reason: "bad_input".into(),
                            message: "joints must hold 6 numbers".into(),
                        })?;
                    (
                        joints,
                        call.input()
                            .get("speed")
                            .and_then(Value::as_f64)
                            .unwrap_or(0.25),
                    )
                }
                "park" => ([0.0; 6], self.park_speed),
                "stop" | "estop" => {
                    let mut m = Motion {
                        address: self.address.clone(),
                        joints: [0.0; 6],
                        speed: 1.0,
                        conn: None,
                        motion_id: 0,
                    };
                    m.stop().await?;
                    return Ok(json!({"stopped": true}));
                }
                other => {
                    return Err(Signal::Failed {
                        reason: "unknown_target".into(),
                        message: format!("unknown target `{other}`"),
                    })
                }
            };
            let mut motion = Motion {
                address: self.address.clone(),
                joints,
                speed,
                conn: None,
                motion_id: 0,
            };
            // The binding's declared duration bounds the lease runner too,
            // never beyond the driver's own longest motion.
            let longest = call
                .max_duration()
                .map_or(MOTION_MAX, |d| d.min(MOTION_MAX));
            run_leased(&mut motion, self.lease, longest, &cancel).await
        })
    }

    fn estop(&self, _call: &Authorized) -> Result<(), Signal> {
        let r = self.request_blocking(&json!({"op": "stop", "device": "arm-1"}))?;
        if r["ok"] == true {
            Ok(())
        } else {
            Err(Signal::Failed {
                reason: "controller_refused".into(),
                message: r.to_string(),
            })
        }
    }

    fn link(&self) -> Option<Link> {
        let s = self.watch.lock();
        Some(Link {
            connected: s.link_up,
            since_ms: s.link_since_ms,
            last_error: s.last_error.map(str::to_owned),
        })
    }

    fn interlocks(&self) -> Vec<(String, InterlockState)> {
        let state = match self.status() {
            Ok(s) => match s["door"].as_str() {
                Some("closed") => InterlockState::Closed,
                Some("open") => InterlockState::Open,
                _ => InterlockState::Unknown,
            },
            Err(_) => InterlockState::Unknown,
        };
        vec![("door".to_owned(), state)]
    }
}
