//! The REST tool gateway under load, on loopback, in one process: keep-alive
//! clients invoke `thermostat-1__setpoint` (a governed action: the whole
//! evaluation order, durable evidence in SQLite WAL with the store's journal and
//! group commit). Each invoke is answered 202 once its invocation record is
//! durable; each client then polls nothing, it just invokes again. The figure
//! counts invocations accepted per second, and separately invocations whose
//! receipt was recorded (the gateway's `/result` turning terminal), measured
//! by draining at the end. Meanwhile e-stops go through the REST `estop` tool
//! on their own connection and their answer latency is timed.
//!
//! Run: `cargo bench -p tether-server --bench rest_load [-- CLIENTS SECONDS]`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod support;

use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::Client;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let (clients, seconds) = support::args();
    let (_dir, store, kernel) = support::durable_kernel("rest-load");
    support::runtime().block_on(async move {
        let addr = support::serve(kernel).await;
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicU64::new(0));
        let last_ids = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..clients {
            let (stop, accepted, last_ids) = (stop.clone(), accepted.clone(), last_ids.clone());
            tasks.push(tokio::spawn(async move {
                let mut c = Client::connect(addr).await;
                let mut n = 0u64;
                let mut last = String::new();
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let t = 20.0 + ((i + n) % 60) as f64;
                    let body = format!(r#"{{"input":{{"target_temperature":{t}}}}}"#);
                    let (status, r) = c.request_bytes("POST", "/tools/thermostat-1__setpoint:invoke", &body).await;
                    assert_eq!(status, 202, "{}", String::from_utf8_lossy(&r));
                    if n.is_multiple_of(support::FULL_CHECK_EVERY) {
                        let v: serde_json::Value = serde_json::from_slice(&r).expect("json");
                        assert_eq!(v["ok"], true, "{v}");
                        last = v["data"]["invocation_id"].as_str().unwrap_or_default().to_owned();
                    } else {
                        last = support::string_after(&r, br#""invocation_id":""#).unwrap_or_default().to_owned();
                    }
                    assert!(!last.is_empty(), "{}", String::from_utf8_lossy(&r));
                    accepted.fetch_add(1, Ordering::Relaxed);
                }
                if let Ok(mut l) = last_ids.lock() {
                    l.push(last);
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let start_count = accepted.load(Ordering::Relaxed);
        let stats0 = store.stats();
        let t0 = Instant::now();
        let cpu0 = support::process_cpu_seconds();
        // E-stops under that load, through the REST `estop` tool on its own
        // connection: the answer comes once the latch is durable and the stop
        // path ran. Each is reset over JSON-RPC (reset is an operator route,
        // never a tool) before the next.
        let mut estop_ms = Vec::new();
        let mut sc = Client::connect(addr).await;
        let rounds = (seconds * 4).max(8);
        for _ in 0..rounds {
            tokio::time::sleep(Duration::from_millis(seconds * 1000 / rounds)).await;
            let body = json!({"input": {"device_id": "relay-1", "reason": "bench"}}).to_string();
            let t = Instant::now();
            let (status, r) = sc.request("POST", "/tools/estop:invoke", &body).await;
            estop_ms.push(t.elapsed().as_secs_f64() * 1000.0);
            assert_eq!(status, 200, "{r}");
            let r = sc.call("mhs.safety.reset", json!({"device_id": "relay-1"})).await;
            assert!(r.get("error").is_none(), "{r}");
        }
        let total = accepted.load(Ordering::Relaxed) - start_count;
        let elapsed = t0.elapsed().as_secs_f64();
        let cpu1 = support::process_cpu_seconds();
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            let _ = t.await;
        }
        // Drain: every client's last invocation reaches its receipt.
        let mut c = Client::connect(addr).await;
        let ids = last_ids.lock().map(|l| l.clone()).unwrap_or_default();
        let drain = Instant::now();
        for id in ids {
            for _ in 0..1000 {
                let (status, r) = c.request("GET", &format!("/invocations/{id}/result"), "").await;
                if status == 200 {
                    assert_eq!(r["data"]["status"], "completed", "{r}");
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        let stats1 = store.stats();
        println!("FIGURE rest_invoke_load clients={clients} seconds={elapsed:.1} invocations={total} invocations_per_s={:.0}", total as f64 / elapsed);
        support::print_cpu("rest_invoke_load_cpu", (cpu0, cpu1), total, elapsed);
        println!("FIGURE rest_drain_ms {:.1}", drain.elapsed().as_secs_f64() * 1000.0);
        estop_ms.sort_by(f64::total_cmp);
        let q = |x: f64| estop_ms[((estop_ms.len() - 1) as f64 * x).round() as usize];
        println!("FIGURE rest_estop_answer_ms_under_load n={} p50={:.2} p99={:.2} max={:.2}", estop_ms.len(), q(0.5), q(0.99), q(1.0));
        println!("FIGURE rest_store stats_before={stats0:?} stats_after={stats1:?}");
    });
}
