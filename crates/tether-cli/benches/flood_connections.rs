//! The e-stop's answer while the HTTP listener is flooded, against the real
//! binary (`tether serve --http`, default `[http]` bounds: 1,024
//! connections, 256 per peer, 10 s header-read timeout).
//!
//! KIND is one of:
//! - `none`: no flood (the reference figure);
//! - `stalled`: 3,000 connections that send half a request header and
//!   stall, kept topped up while the e-stops are measured (every one the
//!   endpoint sheds is replaced);
//! - `idle`: 1,500 keep-alive connections that made one request each and
//!   then idle, kept topped up the same way.
//!
//! Each e-stop (`mhs.safety.estop` of `thermostat-1`) goes on a new
//! connection, and is timed from `connect` to the last byte of its answer.
//! Run: `cargo bench -p tether-cli --bench flood_connections -- KIND [ESTOPS]`
//! (default 200 e-stops, at most 60 s of measuring); it prints a `FIGURE`
//! line. The flood sends traffic only to 127.0.0.1. The e-stop is a
//! software stop; it never replaces a hardware e-stop.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_tether");
/// Longest the measuring may take, whatever ESTOPS says.
const MEASURE_MAX: Duration = Duration::from_secs(60);
/// Longest any one wait (start-up, an answer) may take.
const WAIT_MAX: Duration = Duration::from_secs(20);
const STALLED: usize = 3000;
const IDLE: usize = 1500;
/// Pause between two e-stops, so the flood keeps pace.
const BETWEEN: Duration = Duration::from_millis(20);

struct Endpoint {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start() -> Endpoint {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(BIN)
        .args(["serve", "--http", "127.0.0.1:0", "--state-dir"])
        .arg(dir.path().join("state"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tether serve");
    let mut r = BufReader::new(child.stderr.take().expect("stderr"));
    let deadline = Instant::now() + WAIT_MAX;
    let addr = loop {
        let mut line = String::new();
        assert!(Instant::now() < deadline, "tether did not start");
        if r.read_line(&mut line).expect("stderr line") == 0 {
            panic!("tether exited before listening");
        }
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest
                .split('/')
                .next()
                .expect("address")
                .parse()
                .expect("socket address");
        }
    };
    // Keep draining stderr so the pipe never fills.
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = r.read_to_end(&mut sink);
    });
    Endpoint {
        child,
        addr,
        _dir: dir,
    }
}

fn request(body: &str, close: bool) -> Vec<u8> {
    format!(
        "POST /rpc HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{}\r\n{body}",
        body.len(),
        if close { "Connection: close\r\n" } else { "" }
    )
    .into_bytes()
}

/// One flood connection of `kind`, or `None` when it could not be made.
fn flood_one(addr: SocketAddr, kind: &str) -> Option<TcpStream> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    if kind == "stalled" {
        s.write_all(b"POST /rpc HTTP/1.1\r\nHost: flood\r\nContent-Ty")
            .ok()?;
        return Some(s);
    }
    // Idle: one request answered, then nothing.
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(&request(
        r#"{"jsonrpc":"2.0","id":1,"method":"mhs.safety.status","params":{}}"#,
        false,
    ))
    .ok()?;
    let mut r = BufReader::new(s.try_clone().ok()?);
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.trim().eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0u8; length];
    r.read_exact(&mut body).ok()?;
    Some(s)
}

/// Opens `target` connections of `kind`, then keeps replacing the oldest
/// (the ones the endpoint sheds first) until `stop`; counts those made.
fn flood(
    addr: SocketAddr,
    kind: &'static str,
    target: usize,
    stop: Arc<AtomicBool>,
    made: Arc<AtomicU64>,
    ready: std::sync::mpsc::Sender<()>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut open: VecDeque<TcpStream> = VecDeque::with_capacity(target + 1);
        let mut signalled = false;
        let deadline = Instant::now() + MEASURE_MAX + WAIT_MAX * 2;
        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            if let Some(s) = flood_one(addr, kind) {
                made.fetch_add(1, Ordering::Relaxed);
                open.push_back(s);
            }
            if open.len() > target {
                open.pop_front();
            }
            if !signalled && open.len() >= target {
                signalled = true;
                let _ = ready.send(());
            }
        }
        if !signalled {
            let _ = ready.send(());
        }
    })
}

/// One e-stop on a new connection: the time to its whole answer, and
/// whether its latch was durable within the stop path's bounded wait.
fn estop(addr: SocketAddr) -> (Duration, bool) {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"mhs.safety.estop","params":{"device_id":"thermostat-1","reason":"flood bench"}}"#;
    let t0 = Instant::now();
    let mut s = TcpStream::connect_timeout(&addr, WAIT_MAX).expect("connect");
    s.set_nodelay(true).expect("nodelay");
    s.set_read_timeout(Some(WAIT_MAX)).expect("timeout");
    s.write_all(&request(body, true)).expect("write");
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).expect("no answer to the e-stop");
    let took = t0.elapsed();
    let text = String::from_utf8_lossy(&answer);
    assert!(
        text.starts_with("HTTP/1.1 200") && text.contains("\"latched\":true"),
        "the e-stop was not served: {text}"
    );
    (took, text.contains("\"latch_durable\":true"))
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)].as_secs_f64() * 1e3
}

/// Raises this process's soft open-files limit to its hard limit: the
/// flood holds thousands of sockets.
fn raise_open_files_limit() {
    // SAFETY: getrlimit/setrlimit on a local struct; no memory is shared.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

fn main() {
    raise_open_files_limit();
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let kind: &'static str = match args.next().as_deref() {
        Some("stalled") => "stalled",
        Some("idle") => "idle",
        Some("none") | None => "none",
        Some(other) => panic!("KIND is none, stalled or idle, not {other}"),
    };
    let estops: usize = args.next().map_or(200, |n| n.parse().expect("ESTOPS"));
    let endpoint = start();
    let addr = endpoint.addr;
    let stop = Arc::new(AtomicBool::new(false));
    let made = Arc::new(AtomicU64::new(0));
    let flooder = match kind {
        "none" => None,
        kind => {
            let (tx, rx) = std::sync::mpsc::channel();
            let target = if kind == "stalled" { STALLED } else { IDLE };
            let h = flood(addr, kind, target, Arc::clone(&stop), Arc::clone(&made), tx);
            let _ = rx.recv_timeout(WAIT_MAX * 2);
            Some(h)
        }
    };
    let flood_before = made.load(Ordering::Relaxed);
    let t0 = Instant::now();
    let mut times = Vec::with_capacity(estops);
    let mut not_durable = 0usize;
    while times.len() < estops && t0.elapsed() < MEASURE_MAX {
        let (took, durable) = estop(addr);
        times.push(took);
        not_durable += usize::from(!durable);
        std::thread::sleep(BETWEEN);
    }
    let flood_during = made.load(Ordering::Relaxed) - flood_before;
    stop.store(true, Ordering::Relaxed);
    if let Some(h) = flooder {
        let _ = h.join();
    }
    times.sort();
    println!(
        "FIGURE flood_connections kind={kind} estops={} p50_ms={:.2} p99_ms={:.2} max_ms={:.2} flood_connections_opened_while_measuring={flood_during} latch_not_durable_in_time={not_durable} seconds={:.1}",
        times.len(),
        percentile(&times, 0.50),
        percentile(&times, 0.99),
        times.last().map_or(0.0, |d| d.as_secs_f64() * 1e3),
        t0.elapsed().as_secs_f64()
    );
    drop(endpoint);
}
