//! `durable_load` with telemetry off and on, in one run (issue 22 §2,
//! docs/PERFORMANCE.md, docs/TELEMETRY.md): the same 64 callers sending
//! setpoint commands through a kernel on SQLite (WAL, the store's journal,
//! group commit), with no tracer (telemetry off, as `tether serve`
//! without `otlp_endpoint`) and with the exporter `tether serve` gives
//! the kernel, sending over OTLP/HTTP through `telemetry::otlp` to a live
//! receiver on loopback (a thread that reads every request and answers
//! 200). Both runs have the log subscriber `tether serve` installs, at its
//! default level.
//!
//! Run: `cargo bench -p tether-server --bench telemetry_load` (optionally
//! `-- CALLERS COMMANDS_PER_CALLER`; `TELEMETRY_SAMPLE_RATIO`,
//! `TELEMETRY_ROUNDS` off/on pairs run alternately, default 3,
//! `TELEMETRY_QUEUE` the export queue, default 8192, and
//! `TELEMETRY_EXPORT=none` for spans made but never sent). Prints `FIGURE`
//! lines, each round's ratio and their median.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

#[path = "../../tether-kernel/benches/common/mod.rs"]
mod common;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tether_kernel::trace::TraceSink;
use tether_kernel::Principal;
use tether_server::metrics::{SPANS_DROPPED, SPANS_EXPORTED};
use tether_store::SqliteStore;

/// Export requests and body bytes the receiver took.
static RECEIVED: AtomicU64 = AtomicU64::new(0);
static RECEIVED_BYTES: AtomicU64 = AtomicU64::new(0);

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let callers = args.first().copied().unwrap_or(64);
    let per_caller = args.get(1).copied().unwrap_or(1500);

    // TELEMETRY_SAMPLE_RATIO: `[telemetry] sample_ratio` (default 1).
    let ratio: f64 = std::env::var("TELEMETRY_SAMPLE_RATIO")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1.0);
    // TELEMETRY_ROUNDS: off/on pairs run alternately (default 3), so that a
    // drift of the machine (disk phase, a neighbour) weighs on both halves.
    let rounds: usize = std::env::var("TELEMETRY_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3)
        .max(1);
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
        .init();
    // TELEMETRY_QUEUE: `[telemetry] export_queue_max` (default 8192, as
    // `tether serve`'s).
    let queue_max: usize = std::env::var("TELEMETRY_QUEUE")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(8192);
    let port = start_receiver();
    let exporter = Arc::new(
        tether_server::telemetry::otlp::Exporter::start(&tether_server::telemetry::otlp::Otlp {
            endpoint: format!("http://127.0.0.1:{port}"),
            protocol: tether_server::telemetry::otlp::Protocol::HttpProtobuf,
            service_name: "tether-bench".into(),
            queue_max,
            timeout: Duration::from_secs(2),
            sample_ratio: ratio,
        })
        .expect("the exporter"),
    );
    // TELEMETRY_EXPORT=none: every span is made and offered to a tracer
    // that drops it, to tell what the callers pay from what the export
    // thread does.
    let sink = if std::env::var("TELEMETRY_EXPORT").is_ok_and(|v| v == "none") {
        println!("FIGURE telemetry_export kind=none");
        TraceSink(Arc::new(Discard(exporter.clone())))
    } else {
        TraceSink(exporter.clone())
    };
    let mut ratios = Vec::with_capacity(rounds);
    for round in 1..=rounds {
        let off = run_load(callers, per_caller, None);
        print(&format!("telemetry_off round={round}"), &off, callers);
        let on = run_load(callers, per_caller, Some(sink.clone()));
        print(&format!("telemetry_on round={round}"), &on, callers);
        let r = on.per_second() / off.per_second().max(f64::MIN_POSITIVE);
        println!(
            "FIGURE telemetry_round round={round} throughput_ratio={r:.2} cpu_ratio={:.2}",
            on.cpu_us() / off.cpu_us()
        );
        ratios.push(r);
    }
    exporter.shutdown(Duration::from_secs(5));
    ratios.sort_by(f64::total_cmp);
    println!("FIGURE telemetry_sample_ratio ratio={ratio}");
    println!(
        "FIGURE telemetry_on_vs_off rounds={rounds} median_throughput_ratio={:.2} min={:.2} max={:.2} spans_exported={} spans_dropped={} export_requests={} export_bytes={}",
        ratios[ratios.len() / 2],
        ratios[0],
        ratios[ratios.len() - 1],
        SPANS_EXPORTED.load(Ordering::Relaxed),
        SPANS_DROPPED.load(Ordering::Relaxed),
        RECEIVED.load(Ordering::Relaxed),
        RECEIVED_BYTES.load(Ordering::Relaxed),
    );
}

/// The exporter's ids and sampler; every span dropped unsent.
struct Discard(Arc<tether_server::telemetry::otlp::Exporter>);

impl tether_kernel::trace::Tracer for Discard {
    fn start_trace(&self) -> Option<tether_kernel::trace::SpanCx> {
        tether_kernel::trace::Tracer::start_trace(self.0.as_ref())
    }
    fn span_id(&self) -> tether_kernel::trace::SpanId {
        tether_kernel::trace::Tracer::span_id(self.0.as_ref())
    }
    fn offer(&self, span: tether_kernel::trace::SpanRecord) {
        drop(span);
    }
}

struct Load {
    completed: u64,
    seconds: f64,
    cpu_seconds: Option<f64>,
}

impl Load {
    fn per_second(&self) -> f64 {
        self.completed as f64 / self.seconds
    }
    fn cpu_us(&self) -> f64 {
        self.cpu_seconds.unwrap_or(f64::NAN) * 1e6 / self.completed.max(1) as f64
    }
}

fn print(name: &str, l: &Load, callers: u64) {
    println!(
        "FIGURE {name} callers={callers} commands={} seconds={:.2} commands_per_s={:.0} cpu_us_per_command={:.1}",
        l.completed,
        l.seconds,
        l.per_second(),
        l.cpu_us()
    );
}

/// The load of `durable_load` on a fresh SQLite store.
fn run_load(callers: u64, per_caller: u64, tracer: Option<TraceSink>) -> Load {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(SqliteStore::open(dir.path()).expect("store"));
    let mut config = tether_kernel::KernelConfig::standard("telemetry");
    config.tracer = tracer;
    let k = common::kernel_with(config, store);
    let rt = common::runtime();
    let p = Principal::local_agent();
    let session = common::open_session(&rt, &k, &p);
    let started = Instant::now();
    let cpu_before = common::cpu::process_cpu_seconds();
    let completed = rt.block_on(async {
        let mut tasks = Vec::new();
        for c in 0..callers {
            let k = k.clone();
            let p = p.clone();
            let session = session.clone();
            tasks.push(tokio::spawn(async move {
                let mut ok = 0u64;
                for i in 0..per_caller {
                    let req = common::setpoint(&session, 20.0 + ((c + i) % 60) as f64);
                    let answer = k
                        .command(&p, req, tether_kernel::CommandOptions::plain())
                        .await;
                    if answer.is_ok_and(|a| a.status() == Some("completed")) {
                        ok += 1;
                    }
                }
                ok
            }));
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap_or(0);
        }
        total
    });
    let seconds = started.elapsed().as_secs_f64();
    let cpu_seconds = common::cpu::process_cpu_seconds()
        .zip(cpu_before)
        .map(|(a, b)| a - b);
    drop(k);
    drop(rt);
    Load {
        completed,
        seconds,
        cpu_seconds,
    }
}

/// A live OTLP/HTTP receiver: reads each request whole and answers 200
/// with an empty body. Answers its port.
fn start_receiver() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut reader = BufReader::new(conn);
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some((k, v)) = line.split_once(':') {
                    if k.eq_ignore_ascii_case("content-length") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                }
            }
            let mut body = vec![0u8; length];
            if reader.read_exact(&mut body).is_ok() {
                RECEIVED.fetch_add(1, Ordering::Relaxed);
                RECEIVED_BYTES.fetch_add(length as u64, Ordering::Relaxed);
            }
            let mut conn = reader.into_inner();
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    port
}
