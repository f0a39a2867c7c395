//! Command kinds and non-abortable calls.
//!
//! Load: on a hardware or hybrid device every effectful binding declares
//! `kind = "leased"` or `"time_bounded"` (no default), a time-bounded one its
//! `max_duration_ms`, and a binding's claim of `risk_reducing` needs a class
//! that is; simulated devices keep the default.
//! Run: the witness carries the kind and the duration to the driver, and the
//! driver's deadline is never later than the duration; a call declared
//! `abortable = false` is not cancelled by an e-stop, a session's end or a
//! cancel — the native stop still runs, the latch holds, the call ends with
//! its own result and the next call is refused.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tether_kernel::loader::{load, Defect, ManifestSource};
use tether_kernel::{
    Authorized, BoxFuture, CancelToken, CommandKind, CommandRequest, Driver, EstopRequest, Kernel,
    Principal, Signal,
};
use tether_store::MemoryStore;

/// A one-binding device: `mode`, the binding's extra lines `binding`, and
/// a catalogued read, stop and park that never need a kind.
fn manifest(mode: &str, binding: &str) -> String {
    format!(
        r#"
device_id = "doser-1"
mode = "{mode}"
risk_class = "R1"
driver = "test"

[[resources]]
id = "main"
state_schema = {{ type = "object", properties = {{ ml = {{ type = "number", readOnly = true, "x-mhs-unit" = "mm" }} }} }}

[[bindings]]
capability_id = "x-cap.test.dose.v1"
resource = "main"
target = "dose"
input_schema = {{ type = "object", additionalProperties = false, properties = {{}} }}
output_schema = {{ type = "object" }}
{binding}

[[bindings]]
capability_id = "cap.state.read.v1"
resource = "main"

[[bindings]]
capability_id = "cap.motion.stop.v1"
resource = "main"

[[bindings]]
capability_id = "cap.motion.park.v1"
resource = "main"

[safety]
estop = {{ latency_ms = 300, native = true }}
"#
    )
}

fn load_one(text: &str) -> Result<tether_kernel::loader::Cell, Vec<Defect>> {
    load(
        &[ManifestSource {
            origin: "doser-1.toml".into(),
            text: text.into(),
        }],
        None,
    )
}

fn defects(text: &str) -> Vec<Defect> {
    match load_one(text) {
        Ok(_) => Vec::new(),
        Err(d) => d,
    }
}

#[test]
fn a_physical_effectful_binding_without_a_kind_is_a_load_defect_naming_it() {
    for mode in ["hardware", "hybrid"] {
        let d = defects(&manifest(mode, ""));
        assert_eq!(d.len(), 1, "{mode}: only the dose binding: {d:?}");
        assert_eq!(d[0].file, "doser-1.toml");
        assert_eq!(d[0].device, "doser-1");
        assert_eq!(d[0].field, "bindings[0].kind");
        assert!(
            d[0].message.contains("x-cap.test.dose.v1")
                && d[0].message.contains("leased")
                && d[0].message.contains("time_bounded")
                && d[0].message.contains(mode),
            "{}",
            d[0].message
        );
    }
}

#[test]
fn simulated_and_replay_devices_keep_the_default_kind() {
    for mode in ["simulated", "replay"] {
        let text = manifest(mode, "").replace(
            "driver = \"test\"",
            "driver = \"test\"\nfidelity = { kind = \"simulated\", notes = \"scripted\" }",
        );
        let cell = load_one(&text).unwrap_or_else(|d| panic!("{mode}: {d:?}"));
        let b = &cell.devices[0].bindings;
        assert_eq!(b[0].kind, CommandKind::TimeBounded, "{mode}");
        assert!(b[0].abortable, "abortable unless declared otherwise");
        assert_eq!(b[2].kind, CommandKind::RiskReducing, "a stop class");
    }
}

#[test]
fn a_time_bounded_physical_binding_needs_its_duration() {
    let d = defects(&manifest("hardware", "kind = \"time_bounded\""));
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].field, "bindings[0].max_duration_ms");
    assert!(d[0].message.contains("max_duration_ms"), "{}", d[0].message);
    assert!(defects(&manifest(
        "hardware",
        "kind = \"time_bounded\"\nmax_duration_ms = 5000"
    ))
    .is_empty());
    // A leased binding is bounded by its lease.
    let cell = load_one(&manifest("hardware", "kind = \"leased\"")).expect("loads");
    assert_eq!(cell.devices[0].bindings[0].kind, CommandKind::Leased);
}

#[test]
fn a_claim_of_risk_reducing_is_not_trusted_on_a_physical_device() {
    let d = defects(&manifest("hardware", "kind = \"risk_reducing\""));
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].field, "bindings[0].kind");
    assert!(d[0].message.contains("not trusted"), "{}", d[0].message);
    // A duration of zero could never run, on any device.
    let d = defects(&manifest(
        "hardware",
        "kind = \"time_bounded\"\nmax_duration_ms = 0",
    ));
    assert!(
        d.iter().any(|d| d.field == "bindings[0].max_duration_ms"),
        "{d:?}"
    );
}

/// What the witness said: kind, duration, abortable, and how long the
/// driver's deadline left it at the start.
type Witness = (Option<CommandKind>, Option<Duration>, bool, Duration);

/// A doser whose dose runs until the test releases it, recording what its
/// witness and its cancel token said.
#[derive(Default)]
struct Doser {
    release: AtomicBool,
    running: AtomicBool,
    estops: AtomicUsize,
    saw_cancel: AtomicBool,
    witness: Mutex<Option<Witness>>,
}

impl Driver for Doser {
    fn read(&self, _call: &Authorized) -> Result<Value, Signal> {
        Ok(json!({"ml": 0}))
    }
    fn call(&self, call: Authorized, cancel: CancelToken) -> BoxFuture<'_, Result<Value, Signal>> {
        Box::pin(async move {
            if call.target() != "dose" {
                return Ok(json!({"stopped": true, "joints": []}));
            }
            let left = call.deadline().map_or(Duration::MAX, |d| {
                d.saturating_duration_since(Instant::now())
            });
            if let Ok(mut w) = self.witness.lock() {
                *w = Some((
                    call.command_kind(),
                    call.max_duration(),
                    call.abortable(),
                    left,
                ));
            }
            self.running.store(true, Ordering::SeqCst);
            // A non-abortable device finishes what it started: it does not
            // watch the token, it only reports whether it was ever cancelled.
            while !self.release.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            self.saw_cancel
                .store(cancel.is_cancelled(), Ordering::SeqCst);
            Ok(json!({"dosed_ml": 12.5}))
        })
    }
    fn estop(&self, _call: &Authorized) -> Result<(), Signal> {
        self.estops.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

fn dose(sid: &str) -> CommandRequest {
    CommandRequest {
        command_id: Some(tether_core::ids::CommandId::mint().as_str().to_owned()),
        route: tether_kernel::Route::Command,
        session_id: Some(sid.into()),
        device_id: "doser-1".into(),
        capability_id: "x-cap.test.dose.v1".into(),
        resource: None,
        input: json!({}),
        deadline: None,
        expected_revision: None,
        safe_place_grant: None,
        permit_id: None,
    }
}

const NOT_ABORTABLE: &str = "kind = \"time_bounded\"\nmax_duration_ms = 5000\nabortable = false";

fn rig(binding: &str) -> (Kernel, Arc<Doser>) {
    let driver = Arc::new(Doser::default());
    let k = common::single_device_kernel(
        "doser-1",
        &manifest("hardware", binding),
        driver.clone(),
        Arc::new(MemoryStore::new()),
    );
    (k, driver)
}

/// Starts a dose in its own task and waits until the driver runs it.
async fn start_dose(
    k: &Kernel,
    p: &Principal,
    sid: &str,
    driver: &Doser,
) -> tokio::task::JoinHandle<Value> {
    start(k, p, dose(sid), driver).await
}

/// Starts `req` in its own task and waits until the driver runs it.
async fn start(
    k: &Kernel,
    p: &Principal,
    req: CommandRequest,
    driver: &Doser,
) -> tokio::task::JoinHandle<Value> {
    let (k2, p2) = (k.clone(), p.clone());
    let task = tokio::spawn(async move {
        k2.command(&p2, req, tether_kernel::CommandOptions::plain())
            .await
            .map(tether_kernel::Answer::into_value)
            .expect("receipt")
    });
    let t0 = Instant::now();
    while !driver.running.load(Ordering::SeqCst) {
        assert!(t0.elapsed() < Duration::from_secs(5), "the dose never ran");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    task
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_estop_does_not_cancel_a_non_abortable_call_but_latches_and_refuses_the_next() {
    let (k, driver) = rig(NOT_ABORTABLE);
    // The reference shows what the binding declares (surfaces read it).
    let got = k.device_get("doser-1").expect("device");
    let b = &got["device"]["bindings"][0];
    assert_eq!(
        (&b["kind"], &b["max_duration_ms"], &b["abortable"]),
        (&json!("time_bounded"), &json!(5000), &json!(false)),
        "{b}"
    );
    let p = Principal::local_agent();
    let sid = common::open_session(&k, &p).await;
    let req = dose(&sid);
    let command_id = req.command_id.clone().expect("id");
    let task = start(&k, &p, req, &driver).await;
    let op = k.operation_of_command(&command_id).expect("op");
    // The caller's own cancel is answered, never delivered.
    let c = k.operation_cancel(&p, &op).expect("cancel answer");
    assert_eq!(c["cancel_delivered"], false, "{c}");
    assert_eq!(c["reason"], "not_abortable", "{c}");

    let stop = k
        .estop(EstopRequest {
            device_ids: vec!["doser-1".into()],
            reason: "test".into(),
            ..EstopRequest::default()
        })
        .await;
    assert_eq!(stop["status"], "completed", "{stop}");
    assert_eq!(
        driver.estops.load(Ordering::SeqCst),
        1,
        "the native stop ran"
    );
    assert_eq!(
        stop["cancelled_operations"],
        json!([]),
        "not cancelled: {stop}"
    );
    assert!(!task.is_finished(), "the call runs on after the e-stop");
    // The latch holds while it runs: a reset is refused.
    let reset = k
        .reset(
            &Principal {
                id: "op".into(),
                kind: tether_kernel::PrincipalKind::Human,
                operator: true,
            },
            tether_kernel::ResetRequest {
                session_id: None,
                device_id: "doser-1".into(),
                reason: "t".into(),
            },
        )
        .await;
    let reset = format!("{reset:?}");
    assert!(
        reset.contains("operation_running"),
        "reset refused while it runs: {reset}"
    );

    driver.release.store(true, Ordering::SeqCst);
    let r = task.await.expect("joined");
    assert_eq!(r["status"], "completed", "its own result: {r}");
    assert_eq!(r["output"], json!({"dosed_ml": 12.5}));
    assert!(
        !driver.saw_cancel.load(Ordering::SeqCst),
        "the token was never cancelled"
    );
    let (kind, max, abortable, left) = driver.witness.lock().expect("w").take().expect("witness");
    assert_eq!(kind, Some(CommandKind::TimeBounded));
    assert_eq!(max, Some(Duration::from_millis(5000)));
    assert!(!abortable);
    assert!(
        left <= Duration::from_millis(5000),
        "the driver's deadline is within the duration: {left:?}"
    );

    driver.running.store(false, Ordering::SeqCst);
    let next = k
        .command(&p, dose(&sid), tether_kernel::CommandOptions::plain())
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt");
    assert_eq!(next["status"], "rejected", "{next}");
    assert_eq!(
        next["error"]["mhs_code"], "MHS.SAFETY.ESTOP_ENGAGED",
        "{next}"
    );
    assert!(!driver.running.load(Ordering::SeqCst), "nothing dispatched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_end_and_a_stop_class_leave_a_non_abortable_call_running() {
    let (k, driver) = rig(NOT_ABORTABLE);
    let p = Principal::local_agent();
    let sid = common::open_session(&k, &p).await;
    let task = start_dose(&k, &p, &sid, &driver).await;
    // A stop class from another session cancels the device's operations:
    // not this one.
    let other = common::open_session(&k, &p).await;
    let mut stop = dose(&other);
    stop.capability_id = "cap.motion.stop.v1".into();
    let s = k
        .command(&p, stop, tether_kernel::CommandOptions::plain())
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt");
    assert_eq!(s["status"], "completed", "{s}");
    let closed = k.session_close(&p, &sid).await.expect("closed");
    assert_eq!(closed["cancelled_operations"], json!([]), "{closed}");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!task.is_finished(), "still running");
    driver.release.store(true, Ordering::SeqCst);
    let r = task.await.expect("joined");
    assert_eq!(r["status"], "completed", "{r}");
    assert!(!driver.saw_cancel.load(Ordering::SeqCst));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abortable_call_is_cancelled_by_the_estop_as_before() {
    let (k, driver) = rig("kind = \"leased\"");
    let p = Principal::local_agent();
    let sid = common::open_session(&k, &p).await;
    let task = start_dose(&k, &p, &sid, &driver).await;
    let stop = k
        .estop(EstopRequest {
            device_ids: vec!["doser-1".into()],
            reason: "test".into(),
            ..EstopRequest::default()
        })
        .await;
    assert_eq!(
        stop["cancelled_operations"].as_array().map(Vec::len),
        Some(1),
        "{stop}"
    );
    driver.release.store(true, Ordering::SeqCst);
    let _ = task.await.expect("joined");
    assert!(driver.saw_cancel.load(Ordering::SeqCst), "cancelled");
    let (kind, max, abortable, _) = driver.witness.lock().expect("w").take().expect("witness");
    assert_eq!(kind, Some(CommandKind::Leased));
    assert_eq!(max, None);
    assert!(abortable);
}
