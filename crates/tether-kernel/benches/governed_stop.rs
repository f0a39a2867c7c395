//! Governed stop across store connections: a trip written through a second
//! `SqliteStore` on the same state directory (what `tether estop` or another
//! endpoint does) aborts a motion running in this kernel. Measures, per trip,
//! the delay from the trip being durable to the motion's cancelled receipt.
//!
//! Run: `cargo bench -p tether-kernel --bench governed_stop [-- TRIPS]`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tether_kernel::{CommandRequest, Kernel, KernelConfig, Principal, ResetRequest, SessionOpen};
use tether_store::SqliteStore;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let trips: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(100);
    let dir = tempfile::tempdir().expect("tempdir");
    let cell = tether_kernel::loader::load(&tether_drivers::builtin_cell(), None).expect("cell");
    let drivers =
        tether_drivers::build_all(cell.devices.iter().map(|d| &d.manifest)).expect("drivers");
    let store = Arc::new(SqliteStore::open(dir.path()).expect("store"));
    let k = Kernel::new(KernelConfig::standard("gs"), cell, drivers, store).expect("kernel");
    let other =
        SqliteStore::open(dir.path()).expect("second connection, as another process would open");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("rt");
    let _watcher = k.start_stop_watcher(rt.handle().clone()).expect("watcher");
    let p = Principal::local_agent();
    let sid = rt
        .block_on(k.session_open(&p, SessionOpen::default()))
        .expect("session")["session_id"]
        .as_str()
        .expect("sid")
        .to_owned();
    let mut abort_ms = Vec::with_capacity(trips);
    for i in 0..trips {
        let target = if i % 2 == 0 { 1.0 } else { -1.0 };
        let req = CommandRequest {
            route: tether_kernel::Route::Command,
            session_id: Some(sid.clone()),
            device_id: "arm-1".into(),
            capability_id: "cap.motion.move_to.v1".into(),
            resource: None,
            input: json!({"joints": [target, 0, 0, 0, 0, 0], "speed": 0.5}),
            command_id: None,
            deadline: None,
            expected_revision: None,
            safe_place_grant: None,
            permit_id: None,
        };
        let k2 = k.clone();
        let p2 = p.clone();
        let motion = rt.spawn(async move {
            k2.command(&p2, req, tether_kernel::CommandOptions::plain())
                .await
                .map(tether_kernel::Answer::into_value)
        });
        std::thread::sleep(Duration::from_millis(30));
        tether_kernel::governed::trip_in_store(&other, Some("arm-1"), "bench", "bench")
            .expect("trip");
        let durable = Instant::now();
        let receipt = rt.block_on(motion).expect("join").expect("receipt");
        abort_ms.push(durable.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(receipt["status"], "cancelled", "{receipt}");
        let reset = rt
            .block_on(k.reset(
                &p,
                ResetRequest {
                    session_id: None,
                    device_id: "arm-1".into(),
                    reason: "bench".into(),
                },
            ))
            .expect("reset");
        assert_eq!(reset["status"], "completed", "{reset}");
    }
    abort_ms.sort_by(f64::total_cmp);
    let at = |q: f64| abort_ms[((abort_ms.len() as f64 - 1.0) * q) as usize];
    println!(
        "FIGURE governed_stop_abort_ms trips={trips} p50={:.2} p99={:.2} max={:.2}",
        at(0.5),
        at(0.99),
        at(1.0)
    );
}
