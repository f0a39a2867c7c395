//! The e-stop's answer while one caller floods the endpoint up to (and past)
//! its bounds per caller: MCP sessions, open approvals, permits. Starts the
//! real binary (`tether serve --http --mcp-http`, the default bounds, the
//! durable store), measures e-stops from another principal on fresh
//! connections, first with no flood, then during each flood.
//!
//! `cargo bench -p tether-cli --bench flood_bounds [-- SECONDS_PER_PHASE FLOODERS]`
//! (defaults 3 and 4; the run is bounded by 4 phases of that length).
//! Prints `FIGURE` lines: e-stop answer p50 / p99 / max per phase, the
//! flood's requests per second, how many were refused for a bound, and the
//! endpoint's resident memory after the phase.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_tether");
const FLOODER: &str = "flooder-token-b1";
const OPERATOR: &str = "operator-token-b2";
/// Longest a phase may be asked to last, seconds (the run stays bounded).
const PHASE_S_MAX: u64 = 60;
/// Pause between two e-stops, ms.
const ESTOP_EVERY_MS: u64 = 20;

const HOLD_POLICY: &str = r#"
@id("reads") permit(principal, action == Tether::Action::"read", resource);
@id("cell") permit(principal, action, resource) when { context.mode == "simulated" };
@id("hot-setpoints") @hold("setpoints above 60 degC need an operator")
permit(principal, action == Tether::Action::"command", resource)
  when { resource.capability == "cap.thermal.setpoint.v1" &&
         context.input has target_temperature &&
         context.input.target_temperature.greaterThan(decimal("60.0")) };
"#;

fn digest(token: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

struct Endpoint {
    child: Child,
    rpc: SocketAddr,
    mcp: SocketAddr,
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
    std::fs::write(dir.path().join("policy.cedar"), HOLD_POLICY).expect("policy");
    let cfg = dir.path().join("tether.toml");
    std::fs::write(
        &cfg,
        format!(
            "builtin_cell = true\npolicy = \"policy.cedar\"\n\n[[principals]]\nid = \"flooder\"\nkind = \"agent\"\ntoken_sha256 = \"{}\"\n\n[[principals]]\nid = \"alice\"\nkind = \"human\"\nroles = [\"operator\"]\ntoken_sha256 = \"{}\"\n",
            digest(FLOODER),
            digest(OPERATOR)
        ),
    )
    .expect("config");
    let mut child = Command::new(BIN)
        .arg("serve")
        .arg("--config")
        .arg(&cfg)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .args(["--http", "127.0.0.1:0", "--mcp-http", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tether serve");
    let (tx, rx) = mpsc::channel::<String>();
    let pipe = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        let mut r = BufReader::new(pipe);
        let mut line = String::new();
        while r.read_line(&mut line).is_ok_and(|n| n > 0) {
            let _ = tx.send(std::mem::take(&mut line));
        }
    });
    let (mut rpc, mut mcp) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(30);
    while (rpc.is_none() || mcp.is_none()) && Instant::now() < deadline {
        let Ok(line) = rx.recv_timeout(Duration::from_millis(100)) else {
            continue;
        };
        let addr = |marker: &str| {
            line.split(marker)
                .nth(1)
                .and_then(|r| r.split('/').next())
                .and_then(|h| h.parse::<SocketAddr>().ok())
        };
        if let Some(a) = addr("MCP listening on http://") {
            mcp = Some(a);
        } else if let Some(a) = addr("listening on http://") {
            rpc = Some(a);
        }
    }
    Endpoint {
        child,
        rpc: rpc.expect("the /rpc address"),
        mcp: mcp.expect("the /mcp address"),
        _dir: dir,
    }
}

/// One request on a fresh connection; the status and body.
fn request(addr: SocketAddr, path: &str, token: &str, extra: &str, body: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("head");
    s.write_all(body).expect("body");
    let mut raw = Vec::new();
    let _ = s.take(8 << 20).read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

fn rpc(addr: SocketAddr, token: &str, method: &str, params: Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string();
    let (_, text) = request(addr, "/rpc", token, "", body.as_bytes());
    serde_json::from_str(&text).unwrap_or(Value::Null)
}

/// What one flood sends, once; `true` when it was refused for a bound.
type Flood = Arc<dyn Fn(u64) -> bool + Send + Sync>;

fn session_flood(e: &Endpoint) -> Flood {
    let addr = e.mcp;
    Arc::new(move |_| {
        let init = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"flood","version":"1"}}}"#;
        let (status, _) = request(
            addr,
            "/mcp",
            FLOODER,
            "Accept: application/json, text/event-stream\r\n",
            init,
        );
        status == 429
    })
}

fn approvals_flood(e: &Endpoint) -> Flood {
    let addr = e.rpc;
    let sid = rpc(addr, FLOODER, "mhs.session.open", json!({}))["result"]["session_id"]
        .as_str()
        .expect("session")
        .to_owned();
    Arc::new(move |i| {
        let r = rpc(
            addr,
            FLOODER,
            "mhs.command",
            json!({"session_id": sid, "device_id": "thermostat-1", "capability_id": "cap.thermal.setpoint.v1", "input": {"target_temperature": 70}, "command_id": format!("flood-{i}")}),
        );
        r["result"]["error"]["mhs_code"] == "MHS.PROTOCOL.LIMIT"
    })
}

fn permits_flood(e: &Endpoint) -> Flood {
    let addr = e.rpc;
    let sid = rpc(addr, FLOODER, "mhs.session.open", json!({}))["result"]["session_id"]
        .as_str()
        .expect("session")
        .to_owned();
    Arc::new(move |_| {
        let r = rpc(
            addr,
            FLOODER,
            "mhs.safety.permit",
            json!({"session_id": sid, "device_id": "thermostat-1", "capability_id": "cap.thermal.setpoint.v1", "input": {"target_temperature": 30}, "ttl_ms": 600000}),
        );
        r["error"]["data"]["mhs_code"] == "MHS.PROTOCOL.LIMIT"
    })
}

/// E-stops of `relay-1` by the operator, one every [`ESTOP_EVERY_MS`], for
/// `phase`, while `flooders` threads send `flood` as fast as answered.
/// Answers (e-stop latencies in ms, flood requests, refused for a bound).
fn phase(
    e: &Endpoint,
    flood: Option<Flood>,
    flooders: usize,
    phase: Duration,
) -> (Vec<f64>, u64, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut threads = Vec::new();
    if let Some(flood) = flood {
        for t in 0..flooders {
            let (stop, sent, refused, flood) =
                (stop.clone(), sent.clone(), refused.clone(), flood.clone());
            threads.push(std::thread::spawn(move || {
                let mut i = (t as u64) << 32;
                while !stop.load(Ordering::Relaxed) {
                    if flood(i) {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                    sent.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            }));
        }
        // Let the flood reach its bound before measuring.
        std::thread::sleep(Duration::from_millis(500));
    }
    let sent_before = sent.load(Ordering::Relaxed);
    let refused_before = refused.load(Ordering::Relaxed);
    let until = Instant::now() + phase;
    let mut latencies = Vec::new();
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "mhs.safety.estop", "params": {"device_id": "relay-1", "reason": "flood bench"}}).to_string();
    while Instant::now() < until {
        let t0 = Instant::now();
        let (status, text) = request(e.rpc, "/rpc", OPERATOR, "", body.as_bytes());
        let ms = t0.elapsed().as_secs_f64() * 1000.0;
        assert!(
            status == 200 && text.contains("\"latched\":true"),
            "{status} {text}"
        );
        latencies.push(ms);
        std::thread::sleep(Duration::from_millis(ESTOP_EVERY_MS));
    }
    let flood_sent = sent.load(Ordering::Relaxed) - sent_before;
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let refused_during = refused.load(Ordering::Relaxed) - refused_before;
    (latencies, flood_sent, refused_during.min(flood_sent))
}

/// The endpoint's resident memory, MiB (Linux; NaN elsewhere).
fn rss_mib(e: &Endpoint) -> f64 {
    std::fs::read_to_string(format!("/proc/{}/status", e.child.id()))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or(f64::NAN)
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let seconds = args.first().copied().unwrap_or(3).clamp(1, PHASE_S_MAX);
    let flooders = usize::try_from(args.get(1).copied().unwrap_or(4).clamp(1, 64)).unwrap_or(4);
    let e = start();
    let d = Duration::from_secs(seconds);
    let phases: Vec<(&str, Option<Flood>)> = vec![
        ("none", None),
        ("mcp_sessions", Some(session_flood(&e))),
        ("approvals", Some(approvals_flood(&e))),
        ("permits", Some(permits_flood(&e))),
    ];
    println!("flood_bounds: {seconds} s per phase, {flooders} flooding threads, e-stop every {ESTOP_EVERY_MS} ms on a fresh connection");
    for (name, flood) in phases {
        let (mut l, sent, refused) = phase(&e, flood, flooders, d);
        l.sort_by(f64::total_cmp);
        println!(
            "FIGURE flood_bounds flood={name} estops={} estop_p50_ms={:.2} estop_p99_ms={:.2} estop_max_ms={:.2} flood_per_s={:.0} flood_refused_for_bound={refused} rss_mib={:.0}",
            l.len(),
            pct(&l, 0.5),
            pct(&l, 0.99),
            l.last().copied().unwrap_or(f64::NAN),
            sent as f64 / seconds as f64,
            rss_mib(&e),
        );
    }
}
