//! The governed Modbus path against the example heater (a real pymodbus
//! server, `examples/modbus-heater/heater.py`) and the real `tether` binary:
//!
//! 1. bare tokio-modbus: one register write, and the sequence a configure
//!    command sends (watchdog feed, holding register 0), on one connection;
//! 2. governed: `mhs.command` configure (command in → register written →
//!    receipt durable) over one keep-alive HTTP connection;
//! 3. e-stop → stop coil written (the heater's log stamps each write's
//!    arrival), after a setpoint enabled the heater;
//! 4. `kill -9` of tether → the heater's own watchdog clears the coil.
//!
//! `cargo bench -p tether-cli --bench modbus_roundtrip [-- ROUNDS]` (default
//! 300; e-stops and kills are fewer). Needs the peers venv (`.ci/run` makes
//! `target/py-peers`; or `TETHER_PEERS_PYTHON`). Prints `FIGURE` lines with
//! the disk's flush time beside the durable numbers.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio_modbus::client::Writer;

const BIN: &str = env!("CARGO_BIN_EXE_tether");
const OPERATOR: &str = "operator-token-bench";
const AGENT: &str = "agent-token-bench";
/// Bound on any single wait of the bench.
const WAIT: Duration = Duration::from_secs(20);
/// Most rounds a run may ask for (the run stays bounded).
const ROUNDS_MAX: usize = 5000;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn python() -> PathBuf {
    std::env::var_os("TETHER_PEERS_PYTHON").map_or_else(
        || {
            let t = std::env::var_os("CARGO_TARGET_DIR")
                .map_or_else(|| root().join("target"), PathBuf::from);
            t.join("py-peers/bin/python")
        },
        PathBuf::from,
    )
}

fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1000.0
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn heater(dir: &Path, port: u16) -> Kill {
    let mut c = Command::new(python())
        .arg(root().join("examples/modbus-heater/heater.py"))
        .args(["--port", &port.to_string(), "--log"])
        .arg(dir.join("heater.log"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("heater.py (is the peers venv there?)");
    let mut line = String::new();
    BufReader::new(c.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("ready"), "{line}");
    Kill(c)
}

fn writes(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("heater.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect()
}

fn tether(dir: &Path, port: u16) -> (Kill, SocketAddr) {
    let src = root().join("examples/modbus-heater");
    let m = std::fs::read_to_string(src.join("heater-1.toml"))
        .unwrap()
        .replace("127.0.0.1:5020", &format!("127.0.0.1:{port}"));
    std::fs::write(dir.join("heater-1.toml"), m).unwrap();
    std::fs::copy(src.join("tether.toml"), dir.join("tether.toml")).unwrap();
    let mut c = Command::new(BIN)
        .args(["serve", "--http", "127.0.0.1:0", "--config"])
        .arg(dir.join("tether.toml"))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .envs([
            ("TETHER_OPERATOR_TOKEN", OPERATOR),
            ("TETHER_AGENT_TOKEN", AGENT),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut r = BufReader::new(c.stderr.take().unwrap());
    let deadline = Instant::now() + WAIT;
    let mut line = String::new();
    let addr = loop {
        assert!(Instant::now() < deadline, "tether did not listen");
        line.clear();
        r.read_line(&mut line).unwrap();
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split('/').next().unwrap().parse().unwrap();
        }
    };
    std::thread::spawn(move || std::io::copy(&mut r, &mut std::io::sink()));
    (Kill(c), addr)
}

/// One keep-alive HTTP/1.1 connection speaking JSON-RPC.
struct Rpc {
    s: BufReader<TcpStream>,
    addr: SocketAddr,
}

impl Rpc {
    fn new(addr: SocketAddr) -> Self {
        let s = TcpStream::connect(addr).unwrap();
        s.set_nodelay(true).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        Self {
            s: BufReader::new(s),
            addr,
        }
    }
    fn call(&mut self, token: &str, method: &str, params: Value) -> Value {
        let body =
            json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string();
        let req = format!(
            "POST /rpc HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        self.s.get_mut().write_all(req.as_bytes()).unwrap();
        let mut len = 0usize;
        let mut line = String::new();
        loop {
            line.clear();
            self.s.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
        }
        let mut buf = vec![0; len];
        self.s.read_exact(&mut buf).unwrap();
        let v: Value = serde_json::from_slice(&buf).unwrap();
        assert!(v.get("error").is_none(), "{method}: {v}");
        v["result"].clone()
    }
}

fn pct(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

fn figure(what: &str, us: Vec<f64>) {
    println!(
        "FIGURE {what}: p50 {:.0} us, p99 {:.0} us, max {:.0} us (n={})",
        pct(us.clone(), 0.5),
        pct(us.clone(), 0.99),
        pct(us.clone(), 1.0),
        us.len()
    );
}

fn flush_us(dir: &Path) -> f64 {
    let path = dir.join("flush.probe");
    let mut f = std::fs::File::create(&path).unwrap();
    let block = [7u8; 4096];
    let mut t = Vec::new();
    for _ in 0..100 {
        let t0 = Instant::now();
        f.write_all(&block).unwrap();
        f.sync_data().unwrap();
        t.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    pct(t, 0.5)
}

fn bare(port: u16, rounds: usize) -> (Vec<f64>, Vec<f64>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut ctx = tokio_modbus::client::tcp::connect_slave(addr, tokio_modbus::Slave(1))
            .await
            .unwrap();
        let (mut one, mut seq) = (Vec::new(), Vec::new());
        for i in 0..rounds {
            let t0 = Instant::now();
            ctx.write_single_register(0, 200 + (i % 100) as u16)
                .await
                .unwrap()
                .unwrap();
            one.push(t0.elapsed().as_secs_f64() * 1e6);
            let t0 = Instant::now();
            ctx.write_single_register(10, i as u16)
                .await
                .unwrap()
                .unwrap();
            ctx.write_single_register(0, 200 + (i % 100) as u16)
                .await
                .unwrap()
                .unwrap();
            seq.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        (one, seq)
    })
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find(|a| a.parse::<usize>().is_ok())
        .map_or(300, |a| a.parse().unwrap())
        .min(ROUNDS_MAX);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _h = heater(dir.path(), port);
    let (one, seq) = bare(port, rounds);
    figure("bare tokio-modbus write (holding 0)", one.clone());
    figure(
        "bare tokio-modbus feed + write (what a configure sends)",
        seq.clone(),
    );

    let (tk, addr) = tether(dir.path(), port);
    let mut rpc = Rpc::new(addr);
    let sid = rpc.call(AGENT, "mhs.session.open", json!({}))["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // The mirror fills within a poll period or two.
    std::thread::sleep(Duration::from_millis(500));
    let mut governed = Vec::new();
    for i in 0..rounds {
        let sp = 20.0 + f64::from((i % 100) as u32) / 10.0;
        let t0 = Instant::now();
        let r = rpc.call(AGENT, "mhs.command", json!({"session_id": sid, "device_id": "heater-1",
            "capability_id": "cap.device.configure.v1", "resource": "main", "input": {"setpoint": sp}}));
        governed.push(t0.elapsed().as_secs_f64() * 1e6);
        assert_eq!(r["status"], "completed", "{r}");
    }
    figure(
        "governed configure (command in -> register written -> receipt durable)",
        governed.clone(),
    );
    let over50 = pct(governed.clone(), 0.5) - pct(seq.clone(), 0.5);
    let over99 = pct(governed, 0.99) - pct(seq, 0.99);
    println!("FIGURE overhead over the bare sequence: p50 {over50:.0} us, p99 {over99:.0} us");

    let mut stops = Vec::new();
    let mut answers = Vec::new();
    for _ in 0..(rounds / 10).clamp(5, 100) {
        let r = rpc.call(AGENT, "mhs.command", json!({"session_id": sid, "device_id": "heater-1",
            "capability_id": "cap.thermal.setpoint.v1", "resource": "main", "input": {"target_temperature": 30.0}}));
        assert_eq!(r["status"], "completed", "{r}");
        let before = writes(dir.path()).len();
        let asked = now_ms();
        let t0 = Instant::now();
        rpc.call(
            OPERATOR,
            "mhs.safety.estop",
            json!({"device_id": "heater-1", "reason": "bench"}),
        );
        answers.push(t0.elapsed().as_secs_f64() * 1e6);
        let log = writes(dir.path());
        let stop = log[before..]
            .iter()
            .find(|w| w["kind"] == "write" && w["fc"] == 5 && w["values"] == json!([false]))
            .expect("stop write");
        stops.push((stop["t_ms"].as_f64().unwrap() - asked) * 1000.0);
        rpc.call(
            OPERATOR,
            "mhs.safety.reset",
            json!({"device_id": "heater-1", "reason": "bench"}),
        );
    }
    figure("e-stop asked -> stop coil written at the heater", stops);
    figure("e-stop answered (latch durable)", answers);
    drop(tk);

    let mut kills = Vec::new();
    for _ in 0..3 {
        let d = tempfile::tempdir().unwrap();
        let p = free_port();
        let _h = heater(d.path(), p);
        let (mut tk, addr) = tether(d.path(), p);
        let mut rpc = Rpc::new(addr);
        let sid = rpc.call(AGENT, "mhs.session.open", json!({}))["session_id"]
            .as_str()
            .unwrap()
            .to_owned();
        std::thread::sleep(Duration::from_millis(300));
        let r = rpc.call(AGENT, "mhs.command", json!({"session_id": sid, "device_id": "heater-1",
            "capability_id": "cap.thermal.setpoint.v1", "resource": "main", "input": {"target_temperature": 30.0}}));
        assert_eq!(r["status"], "completed", "{r}");
        std::thread::sleep(Duration::from_millis(1500));
        let killed = now_ms();
        let _ = tk.0.kill();
        let deadline = Instant::now() + WAIT;
        let trip = loop {
            assert!(Instant::now() < deadline, "no watchdog trip");
            if let Some(t) = writes(d.path())
                .iter()
                .find(|l| l["event"] == "watchdog_trip")
            {
                break t["t_ms"].as_f64().unwrap();
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        kills.push((trip - killed) * 1000.0);
    }
    figure(
        "kill -9 -> heater stopped by its watchdog (period 1000 ms)",
        kills,
    );
    println!(
        "FIGURE disk flush (4 KiB write + fdatasync) p50: {:.0} us",
        flush_us(dir.path())
    );
}
