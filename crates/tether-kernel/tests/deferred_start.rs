//! A kernel started on a store that cannot be opened yet
//! (`Kernel::start_deferred`): it serves tripped, says why, and once the
//! store opens restores its state and makes the start-up trip durable; the
//! trip stays until a reset (issue 21 §3; the real binary on real faults is
//! `tether-cli/tests/store_faults.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tether_kernel::loader::load;
use tether_kernel::{EstopRequest, Kernel, KernelConfig, OpenStore, Principal, ResetRequest};
use tether_store::{MemoryStore, Store, StoreError};

const DEVICES: [&str; 3] = ["thermostat-1", "arm-1", "relay-1"];

/// An opener that fails with `error` while `failing` is set, then hands out
/// `store`; counts its attempts.
fn opener(
    store: Arc<dyn Store>,
    failing: Arc<AtomicBool>,
    error: StoreError,
    attempts: Arc<AtomicUsize>,
) -> OpenStore {
    Box::new(move || {
        attempts.fetch_add(1, Ordering::SeqCst);
        if failing.load(Ordering::SeqCst) {
            Err(error.clone())
        } else {
            Ok(store.clone())
        }
    })
}

fn start(open: OpenStore) -> Result<tether_kernel::DeferredStart, tether_kernel::StartError> {
    let cell = load(&tether_drivers::builtin_cell(), None).expect("cell");
    let drivers =
        tether_drivers::build_all(cell.devices.iter().map(|d| &d.manifest)).expect("drivers");
    Kernel::start_deferred(KernelConfig::standard("t"), cell, drivers, open)
}

fn device<'a>(status: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    status["devices"]
        .as_array()
        .and_then(|l| l.iter().find(|d| d["device_id"] == id))
        .expect("device in status")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_cannot_be_opened_starts_tripped_then_restores_and_keeps_the_trip_until_a_reset(
) {
    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let failing = Arc::new(AtomicBool::new(true));
    let attempts = Arc::new(AtomicUsize::new(0));
    let error = StoreError::Sqlite("database or disk is full".into());
    let started = start(opener(
        memory.clone(),
        failing.clone(),
        error,
        attempts.clone(),
    ))
    .expect("the endpoint starts");
    let kernel = started.kernel.clone();
    let why = started.tripped.clone().expect("tripped");
    assert!(why.contains("disk is full"), "{why}");
    let status = kernel.safety_status(None).expect("status");
    assert_eq!(status["store"]["open"], false, "{status}");
    for id in DEVICES {
        let d = device(&status, id);
        assert_eq!(d["latched"], true, "{d}");
        assert_eq!(d["latch"]["durable"], false, "{d}");
        let reason = d["latch"]["reason"].as_str().expect("reason");
        assert!(
            reason.contains("evidence store") && reason.contains("disk is full"),
            "{reason}"
        );
    }
    assert!(!kernel.health().await.ok, "not healthy without a store");
    let e = kernel
        .estop(EstopRequest {
            device_ids: vec!["relay-1".into()],
            reason: "drill".into(),
            ..EstopRequest::default()
        })
        .await;
    assert_eq!(e["latch_durable"], false, "{e}");
    let operator = Principal::local_agent();
    let reset = ResetRequest {
        session_id: None,
        device_id: "relay-1".into(),
        reason: "too early".into(),
    };
    let refused = kernel.reset(&operator, reset.clone()).await.expect("reset");
    assert_eq!(refused["status"], "rejected", "{refused}");
    assert!(
        memory.chain_head().unwrap().is_none(),
        "nothing reached the store"
    );

    failing.store(false, Ordering::SeqCst);
    let t0 = Instant::now();
    while kernel.store_closed().is_some() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the store never opened"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(attempts.load(Ordering::SeqCst) >= 2, "tried again");
    let status = kernel.safety_status(None).expect("status");
    assert_eq!(status["store"]["open"], true, "{status}");
    let latches = memory.latches().expect("latches");
    for id in DEVICES {
        let d = device(&status, id);
        assert_eq!(d["latched"], true, "the trip stays until a reset: {d}");
        assert_eq!(d["latch"]["durable"], true, "{d}");
        let row = latches.iter().find(|r| r.device_id == id).expect("row");
        assert!(row.latched, "{row:?}");
        assert_eq!(row.info["source"], "store_unavailable_at_start", "{row:?}");
    }
    let tail = memory.chain_tail(10).expect("tail");
    let kinds: Vec<&str> = tail.iter().filter_map(|e| e["kind"].as_str()).collect();
    assert!(kinds.contains(&"endpoint.start"), "{kinds:?}");
    assert!(kinds.contains(&"endpoint.store_opened"), "{kinds:?}");
    for id in DEVICES {
        let r = kernel
            .reset(
                &operator,
                ResetRequest {
                    device_id: id.into(),
                    ..reset.clone()
                },
            )
            .await
            .expect("reset");
        assert_eq!(r["status"], "completed", "{r}");
    }
    assert!(kernel.health().await.ok, "healthy once open and reset");
    drop(started);
}

#[test]
fn a_store_that_opens_at_once_starts_untripped() {
    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let started = start(opener(
        memory.clone(),
        Arc::new(AtomicBool::new(false)),
        StoreError::Closed,
        Arc::new(AtomicUsize::new(0)),
    ))
    .expect("start");
    assert!(started.tripped.is_none());
    assert!(started.kernel.store_closed().is_none());
    let status = started.kernel.safety_status(None).expect("status");
    for id in DEVICES {
        assert_eq!(device(&status, id)["latched"], false);
    }
    let head = memory.chain_tail(1).expect("tail");
    assert_eq!(head[0]["kind"], "endpoint.start", "{head:?}");
    assert!(head[0]["body"].get("store_fault_at_start").is_none());
}

#[test]
fn an_integrity_defect_refuses_the_start() {
    let err = start(opener(
        Arc::new(MemoryStore::new()),
        Arc::new(AtomicBool::new(true)),
        StoreError::Corrupt("entry 7 does not hash to the recorded head".into()),
        Arc::new(AtomicUsize::new(0)),
    ))
    .err()
    .expect("refused");
    assert!(err.to_string().contains("corrupt"), "{err}");
}
