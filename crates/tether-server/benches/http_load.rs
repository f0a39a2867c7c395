//! JSON-RPC over HTTP under load, on loopback, in one process: 64 keep-alive
//! clients send governed setpoint commands (durable evidence: SQLite WAL,
//! synchronous=FULL, group commit) while e-stops are timed — request to answer
//! (the latch is durable when the answer is sent) and request to the abort of
//! an in-flight arm motion.
//!
//! Run: `cargo bench -p tether-server --bench http_load [-- CLIENTS SECONDS]`.

use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tether_kernel::{Kernel, KernelConfig};
use tether_store::SqliteStore;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A keep-alive HTTP/1.1 JSON-RPC client.
struct Client {
    conn: BufReader<TcpStream>,
    next_id: u64,
}

impl Client {
    async fn connect(addr: std::net::SocketAddr) -> Client {
        let s = TcpStream::connect(addr).await.expect("connect");
        s.set_nodelay(true).expect("nodelay");
        Client {
            conn: BufReader::new(s),
            next_id: 0,
        }
    }

    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let body =
            json!({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
                .to_string();
        let head = format!("POST /rpc HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", body.len());
        let w = self.conn.get_mut();
        w.write_all(head.as_bytes()).await.expect("write");
        w.write_all(body.as_bytes()).await.expect("write");
        let mut len = 0usize;
        let mut line = String::new();
        // Headers: bounded by the server's few lines.
        for _ in 0..64 {
            line.clear();
            self.conn.read_line(&mut line).await.expect("read");
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some(v) = l.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().expect("length");
            }
        }
        let mut buf = vec![0u8; len];
        self.conn.read_exact(&mut buf).await.expect("body");
        serde_json::from_slice(&buf).expect("json")
    }
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * q) as usize]
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let clients = args.first().copied().unwrap_or(64);
    let seconds = args.get(1).copied().unwrap_or(8);
    let dir = tempfile::tempdir().expect("tempdir");
    let cell = tether_kernel::loader::load(&tether_drivers::builtin_cell(), None).expect("cell");
    let drivers =
        tether_drivers::build_all(cell.devices.iter().map(|d| &d.manifest)).expect("drivers");
    let store = Arc::new(SqliteStore::open(dir.path()).expect("store"));
    let kernel =
        Kernel::new(KernelConfig::standard("http-load"), cell, drivers, store).expect("kernel");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("rt");
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(tether_server::http::serve(kernel, tether_server::auth::Authenticator::open(), listener, std::future::pending()));
        let mut c = Client::connect(addr).await;
        let sid = c.call("mhs.session.open", json!({})).await["result"]["session_id"].as_str().expect("sid").to_owned();
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for i in 0..clients {
            let (stop, done, sid) = (stop.clone(), done.clone(), sid.clone());
            tasks.push(tokio::spawn(async move {
                let mut c = Client::connect(addr).await;
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let t = 20.0 + ((i + n) % 60) as f64;
                    let r = c.call("mhs.command", json!({"session_id": sid, "device_id": "thermostat-1", "capability_id": "cap.thermal.setpoint.v1", "input": {"target_temperature": t}})).await;
                    if r["result"]["status"] == "completed" {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let start_count = done.load(Ordering::Relaxed);
        let t0 = Instant::now();
        // E-stops under load: answer latency (latch durable) on relay-1, and
        // request-to-abort of an in-flight arm motion.
        let mut answer_ms = Vec::new();
        let mut abort_ms = Vec::new();
        let mut sc = Client::connect(addr).await;
        let mut mc = Client::connect(addr).await;
        let rounds = (seconds * 2).max(4);
        for k in 0..rounds {
            let t = Instant::now();
            let r = sc.call("mhs.safety.estop", json!({"device_id": "relay-1", "reason": "bench"})).await;
            answer_ms.push(t.elapsed().as_secs_f64() * 1000.0);
            assert_eq!(r["result"]["status"], "completed", "{r}");
            sc.call("mhs.safety.reset", json!({"device_id": "relay-1"})).await;
            // In-flight abort: start a motion, e-stop it, time until its receipt.
            let target = if k % 2 == 0 { 1.0 } else { -1.0 };
            let sid2 = sid.clone();
            let motion = tokio::spawn(async move {
                let r = mc.call("mhs.command", json!({"session_id": sid2, "device_id": "arm-1", "capability_id": "cap.motion.move_to.v1", "input": {"joints": [target, 0, 0, 0, 0, 0], "speed": 1.0}})).await;
                (mc, Instant::now(), r)
            });
            tokio::time::sleep(Duration::from_millis(100)).await;
            let t = Instant::now();
            sc.call("mhs.safety.estop", json!({"device_id": "arm-1", "reason": "bench"})).await;
            let (back, ended, r) = motion.await.expect("motion");
            mc = back;
            abort_ms.push(ended.saturating_duration_since(t).as_secs_f64() * 1000.0);
            assert_eq!(r["result"]["status"], "cancelled", "{r}");
            sc.call("mhs.safety.reset", json!({"device_id": "arm-1"})).await;
            tokio::time::sleep(Duration::from_millis(seconds * 1000 / rounds)).await;
        }
        let elapsed = t0.elapsed().as_secs_f64();
        let total = done.load(Ordering::Relaxed) - start_count;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            let _ = t.await;
        }
        println!("FIGURE http_jsonrpc_load clients={clients} seconds={elapsed:.1} commands={total} commands_per_s={:.0}", total as f64 / elapsed);
        println!("FIGURE http_estop_answer_ms_under_load n={} p50={:.2} p99={:.2}", answer_ms.len(), pct(&mut answer_ms, 0.5), pct(&mut answer_ms, 0.99));
        println!("FIGURE http_estop_abort_ms_under_load n={} p50={:.2} p99={:.2}", abort_ms.len(), pct(&mut abort_ms, 0.5), pct(&mut abort_ms, 0.99));
    });
}
