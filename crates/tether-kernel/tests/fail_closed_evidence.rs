//! Fail-closed evidence for physical calls, with a store that fails on demand.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tether_kernel::loader::{load, ManifestSource};
use tether_kernel::{
    Authorized, BoxFuture, CancelToken, CommandRequest, Driver, EstopRequest, Kernel, KernelConfig,
    Principal, SessionOpen, Signal,
};
use tether_store::faulty::FaultyStore;
use tether_store::{Commit, EventDraft, MemoryStore, OpenOp, SqliteStore, Store};

const MANIFEST: &str = r#"
device_id = "cnc-1"
mode = "hardware"
risk_class = "R1"
driver = "test"

[[resources]]
id = "spindle"
state_schema = { type = "object", properties = { rpm = { type = "number", readOnly = true, "x-mhs-unit" = "rpm" } } }

[[bindings]]
capability_id = "x-cap.test.spin.v1"
resource = "spindle"
target = "spin"
kind = "leased"
input_schema = { type = "object", additionalProperties = false, required = ["rpm"], properties = { rpm = { type = "number", "x-mhs-unit" = "rpm" } } }
output_schema = { type = "object" }
limits.rpm = { min = 0, max = 3000, unit = "rpm", source = "operator" }

[safety]
estop = { latency_ms = 300, native = true }
"#;

/// A driver that can break the store from inside a call (between the durable
/// start and the finish).
struct Cnc {
    /// When set, a call runs until cancelled.
    slow: AtomicBool,
    calls: AtomicUsize,
    estops: AtomicUsize,
    break_store_during_call: AtomicBool,
    store: Arc<FaultyStore>,
    /// Kinds of the last chain entries when the latest call began.
    chain_at_call: std::sync::Mutex<Vec<String>>,
}

impl Driver for Cnc {
    fn read(&self, _call: &Authorized) -> Result<Value, Signal> {
        Ok(json!({"rpm": 0}))
    }
    fn call(&self, call: Authorized, cancel: CancelToken) -> BoxFuture<'_, Result<Value, Signal>> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let kinds = self
                .store
                .chain_tail(2)
                .unwrap_or_default()
                .iter()
                .map(|e| e["kind"].as_str().unwrap_or_default().to_owned())
                .collect();
            if let Ok(mut c) = self.chain_at_call.lock() {
                *c = kinds;
            }
            if self.slow.load(Ordering::SeqCst) {
                tokio::select! {
                    () = cancel.cancelled() => return Err(Signal::Cancelled),
                    () = tokio::time::sleep(Duration::from_secs(10)) => {}
                }
            }
            if self.break_store_during_call.load(Ordering::SeqCst) {
                self.store.fail_writes.store(true, Ordering::SeqCst);
            }
            Ok(json!({"rpm": call.input()["rpm"]}))
        })
    }
    fn estop(&self, _call: &Authorized) -> Result<(), Signal> {
        self.estops.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

struct Rig {
    k: Kernel,
    cnc: Arc<Cnc>,
    store: Arc<FaultyStore>,
    p: Principal,
    sid: String,
}

async fn rig_on(inner: Arc<dyn Store>) -> Rig {
    let cell = load(
        &[ManifestSource {
            origin: "cnc-1.toml".into(),
            text: MANIFEST.into(),
        }],
        None,
    )
    .expect("loads");
    let store = Arc::new(FaultyStore::new(inner));
    let cnc = Arc::new(Cnc {
        slow: AtomicBool::new(false),
        calls: AtomicUsize::new(0),
        estops: AtomicUsize::new(0),
        break_store_during_call: AtomicBool::new(false),
        store: store.clone(),
        chain_at_call: std::sync::Mutex::new(Vec::new()),
    });
    let mut drivers: HashMap<String, Arc<dyn Driver>> = HashMap::new();
    drivers.insert("cnc-1".into(), cnc.clone());
    let k = Kernel::new(KernelConfig::standard("t"), cell, drivers, store.clone()).expect("kernel");
    let p = Principal::local_agent();
    let sid = k
        .session_open(&p, SessionOpen::default())
        .await
        .expect("session")["session_id"]
        .as_str()
        .expect("sid")
        .to_owned();
    Rig {
        k,
        cnc,
        store,
        p,
        sid,
    }
}

impl Rig {
    fn spin(&self, rpm: f64, id: Option<&str>) -> CommandRequest {
        CommandRequest {
            route: tether_kernel::Route::Command,
            session_id: Some(self.sid.clone()),
            device_id: "cnc-1".into(),
            capability_id: "x-cap.test.spin.v1".into(),
            resource: None,
            input: json!({"rpm": rpm}),
            command_id: id.map(str::to_owned),
            deadline: None,
            expected_revision: None,
            safe_place_grant: None,
            permit_id: None,
        }
    }
    async fn run(&self, r: CommandRequest) -> Value {
        self.k
            .command(&self.p, r, tether_kernel::CommandOptions::plain())
            .await
            .map(tether_kernel::Answer::into_value)
            .expect("receipt")
    }
}

#[tokio::test]
async fn a_physical_call_whose_start_cannot_be_made_durable_is_refused_before_dispatch() {
    let rig = rig_on(Arc::new(MemoryStore::new())).await;
    rig.store.fail_writes.store(true, Ordering::SeqCst);
    let r = rig.run(rig.spin(100.0, None)).await;
    assert_eq!(r["status"], "rejected", "{r}");
    assert_eq!(r["error"]["mhs_code"], "MHS.EVIDENCE.UNAVAILABLE");
    assert_eq!(r["error"]["details"]["reason"], "started_not_durable");
    assert_eq!(
        rig.cnc.calls.load(Ordering::SeqCst),
        0,
        "nothing was dispatched"
    );
}

/// Spins at 100 rpm with an `invocation.accepted` record riding along;
/// answers the receipt and the rider's outcome receiver.
async fn spin_with_rider(
    rig: &Rig,
    id: &str,
) -> (
    Value,
    tokio::sync::oneshot::Receiver<tether_kernel::RiderOutcome>,
) {
    let record = tether_core::canonical::CanonicalText::of_value(&json!({"invocation_id": id}), 4)
        .expect("record");
    let (rider, outcome) = rig.k.invocation_rider(id, record);
    let options = tether_kernel::CommandOptions {
        cancel: CancelToken::new(),
        on_admit: None,
        rider: Some(rider),
    };
    let answer = rig
        .k
        .command(&rig.p, rig.spin(100.0, None), options)
        .await
        .expect("answer")
        .into_value();
    (answer, outcome)
}

/// A surface's record (the REST gateway's invocation) rides in a physical
/// call's admission commit: durable before the driver is called, and in the
/// chain before the admission.
#[tokio::test]
async fn a_rider_is_durable_before_a_physical_call_is_dispatched() {
    let rig = rig_on(Arc::new(MemoryStore::new())).await;
    let (answer, outcome) = spin_with_rider(&rig, "inv_1").await;
    assert_eq!(answer["status"], "completed", "{answer}");
    assert_eq!(outcome.await.expect("told"), Ok(()));
    let at_call = rig.cnc.chain_at_call.lock().expect("lock").clone();
    assert_eq!(
        at_call,
        ["invocation.accepted", "command.admitted"],
        "the record and the admission were durable, in that order, when the call began"
    );
}

/// The admission commit fails: the rider's outcome says so and nothing is
/// dispatched, so a surface never answers for a record it does not have.
#[tokio::test]
async fn a_rider_that_cannot_be_made_durable_dispatches_nothing() {
    let rig = rig_on(Arc::new(MemoryStore::new())).await;
    rig.store.fail_writes.store(true, Ordering::SeqCst);
    let (answer, outcome) = spin_with_rider(&rig, "inv_2").await;
    assert_eq!(
        answer["error"]["details"]["reason"], "started_not_durable",
        "{answer}"
    );
    assert!(outcome.await.expect("told").is_err());
    assert_eq!(
        rig.cnc.calls.load(Ordering::SeqCst),
        0,
        "nothing was dispatched"
    );
}

#[tokio::test]
async fn an_estop_always_runs_even_when_nothing_can_be_recorded() {
    let rig = rig_on(Arc::new(MemoryStore::new())).await;
    rig.store.fail_writes.store(true, Ordering::SeqCst);
    let r = rig
        .k
        .estop(EstopRequest {
            device_ids: vec!["cnc-1".into()],
            reason: "t".into(),
            ..EstopRequest::default()
        })
        .await;
    assert_eq!(
        rig.cnc.estops.load(Ordering::SeqCst),
        1,
        "the native stop ran"
    );
    assert_eq!(r["latch_durable"], false, "{r}");
    assert_eq!(
        r["error"]["details"]["reason"], "latch_not_durable",
        "the answer says the latch is held in memory only: {r}"
    );
    assert_eq!(
        rig.k.safety_status(Some("cnc-1")).expect("status")["devices"][0]["latched"],
        true
    );
    assert_eq!(
        rig.k.safety_status(Some("cnc-1")).expect("status")["devices"][0]["latch"]["durable"],
        false
    );
    // The process keeps trying; once the store recovers, the latch becomes durable.
    rig.store.fail_writes.store(false, Ordering::SeqCst);
    let t0 = Instant::now();
    while rig.k.safety_status(Some("cnc-1")).expect("status")["devices"][0]["latch"]["durable"]
        != true
    {
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "the latch was never persisted"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test]
async fn a_finish_that_cannot_be_recorded_holds_the_resource_until_reconciled() {
    let rig = rig_on(Arc::new(MemoryStore::new())).await;
    rig.cnc
        .break_store_during_call
        .store(true, Ordering::SeqCst);
    let r = rig
        .run(rig.spin(100.0, Some("01CRASHFINISH0000000000001")))
        .await;
    assert_eq!(r["x-tether"]["finish"], "held_unreconciled", "{r}");
    rig.cnc
        .break_store_during_call
        .store(false, Ordering::SeqCst);
    rig.store.fail_writes.store(false, Ordering::SeqCst);
    let held = rig.run(rig.spin(200.0, None)).await;
    // Either still held, or the reconciler already recorded the crashed finish.
    if held["status"] == "rejected" {
        assert_eq!(
            held["error"]["details"]["reason"], "physical_evidence_unreconciled",
            "{held}"
        );
        assert_eq!(
            held["error"]["details"]["open_receipts"],
            json!(["01CRASHFINISH0000000000001"])
        );
    }
    let t0 = Instant::now();
    loop {
        let r = rig.run(rig.spin(300.0, None)).await;
        if r["status"] == "completed" {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "never reconciled: {r}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn start_up_records_crashed_finishes_for_orphaned_physical_calls() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        // A previous run started a physical call and died before its finish.
        let store = SqliteStore::open(dir.path()).expect("store");
        store
            .commit_blocking(Commit {
                events: vec![EventDraft { kind: "command.admitted".into(), body: json!({"command_id": "01ORPHAN000000000000000001"}).into() }],
                open_ops: vec![OpenOp { command_id: "01ORPHAN000000000000000001".into(), info: json!({"device_id": "cnc-1", "resource": "spindle", "key": "cnc-1/x-cap.test.spin.v1/spindle/sha256:x"}) }],
                ..Commit::default()
            })
            .expect("commit");
    }
    let inner: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.path()).expect("store"));
    let rig = rig_on(inner.clone()).await;
    assert!(
        inner.open_ops().expect("open ops").is_empty(),
        "the orphan was reconciled"
    );
    let row = inner
        .receipt("01ORPHAN000000000000000001")
        .expect("read")
        .expect("a receipt for the orphan");
    assert_eq!(row.receipt["status"], "unknown");
    assert_eq!(
        row.receipt["error"]["details"]["reason"],
        "endpoint_crashed"
    );
    let tail = inner.chain_tail(5).expect("tail");
    assert!(
        tail.iter().any(|e| e["kind"] == "command.finish_crashed"),
        "{tail:?}"
    );
    // The id can never run again.
    let again = rig
        .run(rig.spin(100.0, Some("01ORPHAN000000000000000001")))
        .await;
    assert_ne!(again["status"], "completed", "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_stop_aborts_in_flight_physical_calls_and_refuses_new_ones() {
    let rig = Arc::new(rig_on(Arc::new(MemoryStore::new())).await);
    let _watcher = rig
        .k
        .start_stop_watcher(tokio::runtime::Handle::current())
        .expect("watcher");
    rig.cnc.slow.store(true, Ordering::SeqCst);
    let running = {
        let rig = rig.clone();
        tokio::spawn(async move { rig.run(rig.spin(100.0, None)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    rig.store.fail_reads.store(true, Ordering::SeqCst);
    let r = tokio::time::timeout(Duration::from_secs(2), running)
        .await
        .expect("aborted promptly")
        .expect("join");
    assert_eq!(r["status"], "cancelled", "{r}");
    let refused = rig.run(rig.spin(50.0, None)).await;
    assert_eq!(
        refused["error"]["mhs_code"], "MHS.SAFETY.ESTOP_ENGAGED",
        "{refused}"
    );
    assert_eq!(refused["error"]["details"]["reason"], "stop_unreadable");
    // Readable again: physical calls may start.
    rig.store.fail_reads.store(false, Ordering::SeqCst);
    rig.cnc.slow.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(rig.run(rig.spin(50.0, None)).await["status"], "completed");
}
