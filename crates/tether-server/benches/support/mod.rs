//! What the HTTP load benches share: arguments, a kernel on the built-in cell
//! with a durable SQLite store, the real server on loopback, and a minimal
//! keep-alive HTTP/1.1 client (no client library, so the client's own cost
//! stays small and visible).

// Each bench uses part of this module.
#![allow(dead_code)]

use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::Arc;
use tether_kernel::{Kernel, KernelConfig};
use tether_store::SqliteStore;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// `[CLIENTS [SECONDS]]` from the command line; 64 clients, 8 s by default.
pub fn args() -> (u64, u64) {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    (
        args.first().copied().unwrap_or(64),
        args.get(1).copied().unwrap_or(8),
    )
}

/// A kernel on the built-in simulated cell whose evidence is durable in a
/// fresh state dir (kept alive by the returned `TempDir`).
pub fn durable_kernel(name: &str) -> (tempfile::TempDir, Arc<SqliteStore>, Kernel) {
    let dir = tempfile::tempdir().expect("tempdir");
    let cell = tether_kernel::loader::load(&tether_drivers::builtin_cell(), None).expect("cell");
    let drivers =
        tether_drivers::build_all(cell.devices.iter().map(|d| &d.manifest)).expect("drivers");
    let store = Arc::new(SqliteStore::open(dir.path()).expect("store"));
    let kernel =
        Kernel::new(KernelConfig::standard(name), cell, drivers, store.clone()).expect("kernel");
    (dir, store, kernel)
}

/// Two runtime workers, shared by the server and the clients.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("rt")
}

/// Serves `kernel` over HTTP (no principals) on a loopback port.
pub async fn serve(kernel: Kernel) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(tether_server::http::serve(
        kernel,
        tether_server::auth::Authenticator::open(),
        tether_server::edge::EdgeConfig::default(),
        listener,
        std::future::pending(),
    ));
    addr
}

/// A keep-alive HTTP/1.1 client.
pub struct Client {
    conn: BufReader<TcpStream>,
    next_id: u64,
    /// The `Host` sent: the server's own address (the edge refuses others).
    host: String,
}

impl Client {
    pub async fn connect(addr: SocketAddr) -> Client {
        let s = TcpStream::connect(addr).await.expect("connect");
        s.set_nodelay(true).expect("nodelay");
        Client {
            conn: BufReader::new(s),
            next_id: 0,
            host: addr.to_string(),
        }
    }

    /// One request; the answer's status and JSON body.
    pub async fn request(&mut self, method: &str, path: &str, body: &str) -> (u16, Value) {
        let (status, buf) = self.request_bytes(method, path, body).await;
        (status, serde_json::from_slice(&buf).expect("json"))
    }

    /// One request; the answer's status and raw body. Load loops use it to
    /// check answers without building a JSON tree for each (as a load tool
    /// such as wrk does), and parse a sample of them fully.
    pub async fn request_bytes(&mut self, method: &str, path: &str, body: &str) -> (u16, Vec<u8>) {
        // Head and body in one write, as real clients send a small request:
        // two writes on a no-delay socket make two segments and wake the
        // server twice for one request.
        let mut wire = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", self.host, body.len());
        wire.push_str(body);
        let w = self.conn.get_mut();
        w.write_all(wire.as_bytes()).await.expect("write");
        let mut len = 0usize;
        let mut status = 0u16;
        let mut line = String::new();
        // Headers: bounded by the server's few lines.
        for i in 0..64 {
            line.clear();
            self.conn.read_line(&mut line).await.expect("read");
            let l = line.trim_end();
            if i == 0 {
                status = l
                    .split(' ')
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .expect("status");
            }
            if l.is_empty() {
                break;
            }
            if let Some(v) = l.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().expect("length");
            }
        }
        let mut buf = vec![0u8; len];
        self.conn.read_exact(&mut buf).await.expect("body");
        (status, buf)
    }

    /// One JSON-RPC call on `/rpc`; the whole answer object.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let body =
            json!({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
                .to_string();
        self.request("POST", "/rpc", &body).await.1
    }

    /// The next JSON-RPC request id.
    pub fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }
}

/// Whether `hay` contains `needle` (answers are a few hundred bytes).
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The string value after `needle` (such as `"invocation_id":"`) in a
/// compact JSON text, up to the next quote.
pub fn string_after<'a>(text: &'a [u8], needle: &[u8]) -> Option<&'a str> {
    let start = text.windows(needle.len()).position(|w| w == needle)? + needle.len();
    let len = text[start..].iter().position(|&b| b == b'"')?;
    std::str::from_utf8(&text[start..start + len]).ok()
}

/// One answer in this many is parsed in full and checked field by field.
pub const FULL_CHECK_EVERY: u64 = 64;

/// Process CPU time: the kernel benches' helper, one copy for both crates.
#[path = "../../../tether-kernel/benches/common/cpu.rs"]
mod cpu;
pub use cpu::process_cpu_seconds;

/// Peak resident memory of this process so far, MiB (Linux: `VmHWM` of
/// /proc/self/status; `None` elsewhere).
pub fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Prints the CPU figure for `commands` done in `elapsed` seconds, the
/// process's CPU time going from `cpu0` to `cpu1`, and the peak memory.
pub fn print_cpu(
    name: &str,
    (cpu0, cpu1): (Option<f64>, Option<f64>),
    commands: u64,
    elapsed: f64,
) {
    if let (Some(a), Some(b)) = (cpu0, cpu1) {
        let cpu = b - a;
        println!(
            "FIGURE {name} cpu_seconds={cpu:.2} cpu_us_per_command={:.1} cores_busy={:.2} (clients and server together)",
            cpu * 1e6 / commands.max(1) as f64,
            cpu / elapsed
        );
    }
    if let Some(mib) = peak_rss_mib() {
        let load = name.trim_end_matches("_cpu");
        println!("FIGURE {load}_memory peak_rss_mib={mib:.0} after {commands} commands (clients and server together)");
    }
}
