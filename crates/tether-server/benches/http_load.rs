//! JSON-RPC over HTTP under load, on loopback, in one process: 64 keep-alive
//! clients send governed setpoint commands (durable evidence: SQLite WAL,
//! the store's journal, group commit) while e-stops are timed — request to answer
//! (the latch is durable when the answer is sent) and request to the abort of
//! an in-flight arm motion.
//!
//! Run: `cargo bench -p tether-server --bench http_load [-- CLIENTS SECONDS]`.
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

fn pct(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * q) as usize]
}

fn main() {
    let (clients, seconds) = support::args();
    let (_dir, store, kernel) = support::durable_kernel("http-load");
    support::runtime().block_on(async move {
        let addr = support::serve(kernel).await;
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
                    let id = c.next_id();
                    let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"mhs.command","params":{{"session_id":"{sid}","device_id":"thermostat-1","capability_id":"cap.thermal.setpoint.v1","input":{{"target_temperature":{t}}}}}}}"#);
                    let (status, r) = c.request_bytes("POST", "/rpc", &body).await;
                    let completed = if n.is_multiple_of(support::FULL_CHECK_EVERY) {
                        let v: serde_json::Value = serde_json::from_slice(&r).expect("json");
                        assert_eq!(v["id"], id, "{v}");
                        v["result"]["status"] == "completed"
                    } else {
                        support::contains(&r, br#""status":"completed""#)
                    };
                    if status == 200 && completed {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let start_count = done.load(Ordering::Relaxed);
        let t0 = Instant::now();
        let cpu0 = support::process_cpu_seconds();
        let stats0 = store.stats();
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
        let cpu1 = support::process_cpu_seconds();
        let stats1 = store.stats();
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            let _ = t.await;
        }
        println!("FIGURE http_jsonrpc_load clients={clients} seconds={elapsed:.1} commands={total} commands_per_s={:.0}", total as f64 / elapsed);
        support::print_cpu("http_jsonrpc_load_cpu", (cpu0, cpu1), total, elapsed);
        let (batches, commits) = (stats1.batches - stats0.batches, stats1.commits - stats0.commits);
        println!("FIGURE http_jsonrpc_load_batches batches={batches} commits={commits} commits_per_batch={:.1} batch_cycle_ms={:.2} writer_idle_waits={}", commits as f64 / batches.max(1) as f64, elapsed * 1000.0 / batches.max(1) as f64, stats1.idle_waits - stats0.idle_waits);
        println!("FIGURE http_estop_answer_ms_under_load n={} p50={:.2} p99={:.2}", answer_ms.len(), pct(&mut answer_ms, 0.5), pct(&mut answer_ms, 0.99));
        println!("FIGURE http_estop_abort_ms_under_load n={} p50={:.2} p99={:.2}", abort_ms.len(), pct(&mut abort_ms, 0.5), pct(&mut abort_ms, 0.99));
    });
}
