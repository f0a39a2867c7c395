//! The evaluation order, in process, against a scripted test driver.
//!
//! Every refusal is checked for "no side effect": the driver was not called,
//! the revision did not move, no budget was drawn, and the `command_id` stays
//! free.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tether_kernel::loader::{load, ManifestSource, OverlaySource};
use tether_kernel::{
    Authorized, BoxFuture, CancelToken, CommandRequest, Driver, EstopRequest, InterlockState,
    Kernel, KernelConfig, Principal, ReadRequest, ResetRequest, SessionOpen, Signal,
};
use tether_store::{MemoryStore, SqliteStore, Store};

const MANIFEST: &str = r#"
device_id = "rig-1"
mode = "simulated"
risk_class = "R2"
driver = "test"
fidelity = { kind = "simulated", notes = "scripted test driver" }

[[resources]]
id = "main"
[resources.state_schema]
type = "object"
properties.level = { type = "number", minimum = 0, maximum = 100, "x-mhs-unit" = "%" }
properties.temp = { type = "number", readOnly = true, "x-mhs-unit" = "degC" }
properties.tuning = { type = "object", properties = { gain = { type = "number", "x-mhs-unit" = "1" } } }

[[bindings]]
capability_id = "cap.device.configure.v1"
resource = "main"
limits.level = { min = 0, max = 80, unit = "%", source = "operator", reason = "tank rating" }
limits."tuning.gain" = { max = 4, source = "operator" }

[[bindings]]
capability_id = "x-cap.test.dose.v1"
resource = "main"
target = "dose"
input_schema = { type = "object", required = ["amount"], additionalProperties = false, properties = { amount = { type = "number", "x-mhs-unit" = "mL" } } }
output_schema = { type = "object", required = ["dosed"], properties = { dosed = { type = "number" } } }
limits.amount = { min = -10, max = 10, unit = "mL", source = "operator" }

[[bindings]]
capability_id = "x-cap.test.budget.v1"
resource = "main"
target = "dose"
input_schema = { type = "object", required = ["amount"], additionalProperties = false, properties = { amount = { type = "number", "x-mhs-unit" = "mL" } } }
output_schema = { type = "object" }
limits.amount = { max = 25, unit = "mL", source = "operator", per = "rolling_1h" }

[[bindings]]
capability_id = "x-cap.test.heat.v1"
resource = "main"
target = "heat"
input_schema = { type = "object", required = ["power"], additionalProperties = false, properties = { power = { type = "number", "x-mhs-unit" = "W" } } }
output_schema = { type = "object" }
limits.power = "operator_required"

[[bindings]]
capability_id = "cap.io.relay.v1"
resource = "main"
target = "relay"
concurrency = "serialized"

[[bindings]]
capability_id = "cap.state.read.v1"
resource = "main"

[[bindings]]
capability_id = "x-cap.test.tally.v1"
resource = "main"
target = "dose"
input_schema = { type = "object", additionalProperties = false, properties = { count = { "x-mhs-unit" = "mL" } } }
output_schema = { type = "object" }
limits.count = { max = 5, unit = "mL", per = "session" }

[[interlocks]]
id = "guard"
description = "Guard door closed"
source = "simulated"
required_for = ["cap.io.*"]

[safety]
estop = { latency_ms = 200 }
"#;

#[derive(Default)]
struct TestDriver {
    calls: AtomicUsize,
    guard: Mutex<Option<InterlockState>>,
    bad_output: AtomicBool,
    slow_ms: AtomicUsize,
    /// Panic inside the call: after the slow wait, if any (so either in the
    /// call's first poll or in a later one).
    panics: AtomicBool,
    /// Say the calls poll promptly, so the kernel polls each once inline.
    prompt: AtomicBool,
    /// Wait this long ignoring cancellation (a call that cannot be stopped).
    stubborn_ms: AtomicUsize,
}

impl Driver for TestDriver {
    fn read(&self, _call: &Authorized) -> Result<Value, Signal> {
        Ok(json!({"level": 10, "temp": 21.5, "tuning": {"gain": 1}}))
    }
    fn call(&self, call: Authorized, cancel: CancelToken) -> BoxFuture<'_, Result<Value, Signal>> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let stubborn = self.stubborn_ms.load(Ordering::SeqCst) as u64;
            if stubborn > 0 {
                tokio::time::sleep(Duration::from_millis(stubborn)).await;
            }
            let slow = self.slow_ms.load(Ordering::SeqCst) as u64;
            if slow > 0 {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(slow)) => {}
                    () = cancel.cancelled() => return Err(Signal::Cancelled),
                }
            }
            if self.panics.load(Ordering::SeqCst) {
                panic!("test driver panics on purpose");
            }
            if self.bad_output.load(Ordering::SeqCst) {
                return Ok(json!({"unexpected": true}));
            }
            match call.target() {
                "dose" => Ok(json!({"dosed": call.input()["amount"]})),
                "relay" => Ok(call.input().clone()),
                _ => Ok(json!({})),
            }
        })
    }
    fn estop(&self, _call: &Authorized) -> Result<(), Signal> {
        Ok(())
    }
    fn polls_promptly(&self) -> bool {
        self.prompt.load(Ordering::SeqCst)
    }
    fn interlocks(&self) -> Vec<(String, InterlockState)> {
        self.guard
            .lock()
            .ok()
            .and_then(|g| *g)
            .map(|s| vec![("guard".to_owned(), s)])
            .unwrap_or_default()
    }
}

struct Rig {
    kernel: Kernel,
    driver: Arc<TestDriver>,
    session: String,
    p: Principal,
}

fn manifest() -> Vec<ManifestSource> {
    vec![ManifestSource {
        origin: "rig-1.toml".into(),
        text: MANIFEST.into(),
    }]
}

async fn rig_with(overlay: Option<&str>, store: Arc<dyn Store>) -> Rig {
    rig_configured(overlay, store, KernelConfig::standard("test")).await
}

async fn rig_configured(overlay: Option<&str>, store: Arc<dyn Store>, config: KernelConfig) -> Rig {
    let ov = overlay.map(|t| OverlaySource {
        origin: "site-limits.json".into(),
        text: t.into(),
    });
    let cell = load(&manifest(), ov.as_ref()).expect("rig loads");
    let driver = Arc::new(TestDriver::default());
    *driver.guard.lock().expect("guard") = Some(InterlockState::Closed);
    let mut drivers: HashMap<String, Arc<dyn Driver>> = HashMap::new();
    drivers.insert("rig-1".into(), driver.clone());
    let kernel = Kernel::new(config, cell, drivers, store).expect("kernel");
    let p = Principal::local_agent();
    let session = kernel
        .session_open(&p, SessionOpen::default())
        .await
        .expect("session")["session_id"]
        .as_str()
        .expect("sid")
        .to_owned();
    Rig {
        kernel,
        driver,
        session,
        p,
    }
}

async fn rig() -> Rig {
    rig_with(None, Arc::new(MemoryStore::new())).await
}

impl Rig {
    fn req(&self, cap: &str, input: Value) -> CommandRequest {
        CommandRequest {
            route: tether_kernel::Route::Command,
            session_id: Some(self.session.clone()),
            device_id: "rig-1".into(),
            capability_id: cap.into(),
            resource: None,
            input,
            command_id: None,
            deadline: None,
            expected_revision: None,
            safe_place_grant: None,
            permit_id: None,
        }
    }
    async fn run(&self, req: CommandRequest) -> Value {
        self.kernel
            .command(&self.p, req, tether_kernel::CommandOptions::plain())
            .await
            .map(tether_kernel::Answer::into_value)
            .expect("receipt")
    }
    async fn revision(&self) -> u64 {
        let r = self
            .kernel
            .read(
                &self.p,
                ReadRequest {
                    session_id: Some(self.session.clone()),
                    device_id: "rig-1".into(),
                    resource: "main".into(),
                },
            )
            .await
            .expect("read");
        r["revision"].as_u64().expect("revision")
    }
    fn calls(&self) -> usize {
        self.driver.calls.load(Ordering::SeqCst)
    }
    /// Runs a command expected to be refused and checks it left no trace.
    async fn refused(&self, mut req: CommandRequest, code: &str) -> Value {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let id = format!("01REFUSED{:017}", NEXT.fetch_add(1, Ordering::SeqCst));
        let (rev, calls) = (self.revision().await, self.calls());
        req.command_id = Some(id.clone());
        let r = self.run(req).await;
        assert_eq!(r["status"], "rejected", "{r}");
        assert_eq!(r["error"]["mhs_code"], code, "{r}");
        assert_eq!(
            self.revision().await,
            rev,
            "a refusal must not advance the revision"
        );
        assert_eq!(self.calls(), calls, "a refusal must not reach the driver");
        // The id was not recorded as an outcome: a different, valid input may use it
        // (unless the device is latched, where nothing effectful runs).
        let mut ok = self.req("cap.state.read.v1", json!({}));
        ok.command_id = Some(id);
        let again = self.run(ok).await;
        assert_ne!(
            again["error"]["mhs_code"], "MHS.CONFLICT.COMMAND_ID_REUSE",
            "{again}"
        );
        r
    }
}

#[tokio::test]
async fn a_valid_action_completes_and_advances_the_revision_once() {
    let rig = rig().await;
    let r = rig
        .run(rig.req("x-cap.test.dose.v1", json!({"amount": 5})))
        .await;
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["output"], json!({"dosed": 5}));
    assert_eq!(r["state_revision_before"], 0);
    assert_eq!(r["state_revision_after"], 1);
    assert_eq!(rig.revision().await, 1);
}

#[tokio::test]
async fn limits_refuse_before_dispatch_with_path_bound_value_unit_and_source() {
    let rig = rig().await;
    let r = rig
        .refused(
            rig.req("x-cap.test.dose.v1", json!({"amount": 12})),
            "MHS.SAFETY.ENVELOPE_VIOLATION",
        )
        .await;
    let d = &r["error"]["details"];
    assert_eq!(d["path"], "amount");
    assert_eq!(d["kind"], "max");
    assert_eq!(d["bound"], json!(10.0));
    assert_eq!(d["value"], json!(12));
    assert_eq!(d["unit"], "mL");
    assert_eq!(d["source"], "binding");
}

#[tokio::test]
async fn wrong_types_and_unknown_fields_are_refused() {
    let rig = rig().await;
    rig.refused(
        rig.req("x-cap.test.dose.v1", json!({"amount": "5"})),
        "MHS.CAPABILITY.INPUT_INVALID",
    )
    .await;
    rig.refused(
        rig.req("x-cap.test.dose.v1", json!({"amount": true})),
        "MHS.CAPABILITY.INPUT_INVALID",
    )
    .await;
    rig.refused(
        rig.req("x-cap.test.dose.v1", json!({"amount": 1, "extra": 1})),
        "MHS.CAPABILITY.INPUT_INVALID",
    )
    .await;
    rig.refused(
        rig.req("x-cap.test.dose.v1", json!({})),
        "MHS.CAPABILITY.INPUT_INVALID",
    )
    .await;
}

#[tokio::test]
async fn configure_refuses_unknown_and_read_only_fields_at_any_depth() {
    let rig = rig().await;
    let mut w = rig.req("cap.device.configure.v1", json!({"nope": 1}));
    w.resource = Some("main".into());
    let r = rig.refused(w.clone(), "MHS.RESOURCE.FIELD_UNKNOWN").await;
    assert_eq!(r["error"]["details"]["fields"], json!(["nope"]));
    w.input = json!({"tuning": {"nope": 1}});
    let r = rig.refused(w.clone(), "MHS.RESOURCE.FIELD_UNKNOWN").await;
    assert_eq!(r["error"]["details"]["fields"], json!(["tuning.nope"]));
    w.input = json!({"temp": 30});
    rig.refused(w.clone(), "MHS.RESOURCE.NOT_WRITABLE").await;
    // A nested leaf is limited too: tuning.gain max 4.
    w.input = json!({"tuning": {"gain": 5}});
    let r = rig
        .refused(w.clone(), "MHS.SAFETY.ENVELOPE_VIOLATION")
        .await;
    assert_eq!(r["error"]["details"]["path"], "tuning.gain");
    // A limited field's schema bound is a safety refusal, not INPUT_INVALID (limit 80 is tighter than schema 100).
    w.input = json!({"level": 90});
    rig.refused(w.clone(), "MHS.SAFETY.ENVELOPE_VIOLATION")
        .await;
    w.input = json!({"level": 50});
    let ok = rig.run(w).await;
    assert_eq!(ok["status"], "completed", "{ok}");
    assert_eq!(ok["output"]["applied"], json!({"level": 50}));
}

#[tokio::test]
async fn operator_required_bound_is_unset_until_an_overlay_fills_it() {
    let rig = rig().await;
    let r = rig
        .refused(
            rig.req("x-cap.test.heat.v1", json!({"power": 100})),
            "MHS.SAFETY.LIMITS_UNSET",
        )
        .await;
    assert_eq!(r["error"]["details"]["paths"], json!(["power"]));
    let filled = rig_with(Some(r#"{"rig-1": {"x-cap.test.heat.v1": {"power": {"max": 500, "unit": "W", "source": "operator"}}}}"#), Arc::new(MemoryStore::new())).await;
    assert_eq!(
        filled
            .run(filled.req("x-cap.test.heat.v1", json!({"power": 100})))
            .await["status"],
        "completed"
    );
    let over = filled
        .refused(
            filled.req("x-cap.test.heat.v1", json!({"power": 600})),
            "MHS.SAFETY.ENVELOPE_VIOLATION",
        )
        .await;
    assert_eq!(over["error"]["details"]["source"], "overlay");
}

#[tokio::test]
async fn cumulative_budget_is_drawn_by_magnitude_and_refuses_when_exceeded() {
    let rig = rig().await;
    assert_eq!(
        rig.run(rig.req("x-cap.test.budget.v1", json!({"amount": 10})))
            .await["status"],
        "completed"
    );
    // A negative value draws its magnitude: it never refunds.
    assert_eq!(
        rig.run(rig.req("x-cap.test.budget.v1", json!({"amount": -10})))
            .await["status"],
        "completed"
    );
    let r = rig
        .refused(
            rig.req("x-cap.test.budget.v1", json!({"amount": 6})),
            "MHS.SAFETY.CUMULATIVE_LIMIT",
        )
        .await;
    let d = &r["error"]["details"];
    assert_eq!(d["used"], json!(20.0));
    assert_eq!(d["limit"], json!(25.0));
    assert_eq!(d["window"], "rolling_1h");
    assert_eq!(
        rig.run(rig.req("x-cap.test.budget.v1", json!({"amount": 5})))
            .await["status"],
        "completed"
    );
}

#[tokio::test]
async fn a_restart_never_refills_a_budget_window() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let rig = rig_with(
            None,
            Arc::new(SqliteStore::open(dir.path()).expect("store")),
        )
        .await;
        assert_eq!(
            rig.run(rig.req("x-cap.test.budget.v1", json!({"amount": 20})))
                .await["status"],
            "completed"
        );
    }
    let rig = rig_with(
        None,
        Arc::new(SqliteStore::open(dir.path()).expect("store")),
    )
    .await;
    rig.refused(
        rig.req("x-cap.test.budget.v1", json!({"amount": 6})),
        "MHS.SAFETY.CUMULATIVE_LIMIT",
    )
    .await;
}

#[tokio::test]
async fn an_open_or_unknown_interlock_refuses_the_gated_capability_only() {
    let rig = rig().await;
    let relay = json!({"channel": 1, "on": true});
    assert_eq!(
        rig.run(rig.req("cap.io.relay.v1", relay.clone())).await["status"],
        "completed"
    );
    *rig.driver.guard.lock().expect("guard") = Some(InterlockState::Open);
    let r = rig
        .refused(
            rig.req("cap.io.relay.v1", relay.clone()),
            "MHS.SAFETY.INTERLOCK_OPEN",
        )
        .await;
    assert_eq!(r["error"]["details"]["interlocks"][0]["id"], "guard");
    *rig.driver.guard.lock().expect("guard") = None; // not reported = unknown = open
    let r = rig
        .refused(
            rig.req("cap.io.relay.v1", relay),
            "MHS.SAFETY.INTERLOCK_OPEN",
        )
        .await;
    assert_eq!(r["error"]["details"]["interlocks"][0]["state"], "unknown");
    // Ungated capabilities still run.
    assert_eq!(
        rig.run(rig.req("x-cap.test.dose.v1", json!({"amount": 1})))
            .await["status"],
        "completed"
    );
}

#[tokio::test]
async fn a_stale_expected_revision_is_a_conflict() {
    let rig = rig().await;
    let mut r = rig.req("x-cap.test.dose.v1", json!({"amount": 1}));
    r.expected_revision = Some(7);
    let out = rig.refused(r, "MHS.CONFLICT.REVISION").await;
    assert_eq!(out["error"]["details"]["revision"], 0);
}

#[tokio::test]
async fn output_that_breaks_the_output_schema_fails_the_receipt() {
    let rig = rig().await;
    rig.driver.bad_output.store(true, Ordering::SeqCst);
    let r = rig
        .run(rig.req("x-cap.test.dose.v1", json!({"amount": 1})))
        .await;
    assert_eq!(r["status"], "failed");
    assert_eq!(r["error"]["mhs_code"], "MHS.ADAPTER.OUTPUT_INVALID");
}

#[tokio::test]
async fn a_driver_that_panics_fails_its_receipt_and_the_kernel_goes_on() {
    let rig = rig().await;
    rig.driver.panics.store(true, Ordering::SeqCst);
    // At its first poll (an instant call), then at a later poll (a call that
    // waited first), in a task of its own or polled first on the caller's
    // task (a driver that polls promptly): each ends as a failed receipt
    // naming the panic.
    for prompt in [false, true] {
        rig.driver.prompt.store(prompt, Ordering::SeqCst);
        for slow in [0, 30] {
            rig.driver.slow_ms.store(slow, Ordering::SeqCst);
            let r = rig
                .run(rig.req("x-cap.test.dose.v1", json!({"amount": 1})))
                .await;
            assert_eq!(r["status"], "failed", "prompt {prompt} slow {slow}: {r}");
            assert_eq!(r["error"]["mhs_code"], "MHS.ADAPTER.DRIVER_FAILED", "{r}");
            assert_eq!(r["error"]["details"]["reason"], "driver_panicked", "{r}");
        }
    }
    rig.driver.panics.store(false, Ordering::SeqCst);
    rig.driver.slow_ms.store(0, Ordering::SeqCst);
    let r = rig
        .run(rig.req("x-cap.test.dose.v1", json!({"amount": 1})))
        .await;
    assert_eq!(r["status"], "completed", "{r}");
}

#[tokio::test]
async fn a_call_that_ignores_cancellation_is_left_behind_unknown_at_its_deadline() {
    let rig = rig().await;
    rig.driver.stubborn_ms.store(60_000, Ordering::SeqCst);
    // Polled inline first or not, a call that waits and never heeds its
    // cancellation is left behind: the caller is answered `unknown` after
    // the deadline and the cancel grace, not when the call ends.
    for prompt in [false, true] {
        rig.driver.prompt.store(prompt, Ordering::SeqCst);
        let mut r = rig.req("x-cap.test.dose.v1", json!({"amount": 1}));
        r.deadline = Some(Duration::from_millis(100));
        let began = std::time::Instant::now();
        let out = rig.run(r).await;
        let took = began.elapsed();
        assert_eq!(out["status"], "unknown", "prompt {prompt}: {out}");
        assert_eq!(
            out["error"]["details"]["reason"], "deadline_exceeded_cancel_unconfirmed",
            "{out}"
        );
        assert!(took < Duration::from_secs(20), "held {took:?}");
    }
}

#[tokio::test]
async fn latch_refuses_effects_but_not_reads_and_reset_resumes_nothing() {
    let rig = rig().await;
    let stop = rig
        .kernel
        .estop(EstopRequest {
            device_ids: vec!["rig-1".into()],
            reason: "test".into(),
            ..EstopRequest::default()
        })
        .await;
    assert_eq!(stop["status"], "completed", "{stop}");
    assert!(stop["latch_latency_ms"].as_f64().is_some());
    rig.refused(
        rig.req("x-cap.test.dose.v1", json!({"amount": 1})),
        "MHS.SAFETY.ESTOP_ENGAGED",
    )
    .await;
    let read = rig.run(rig.req("cap.state.read.v1", json!({}))).await;
    assert_eq!(
        read["status"], "completed",
        "a catalogued read is exempt from the latch: {read}"
    );
    let reset = rig
        .kernel
        .reset(
            &rig.p,
            ResetRequest {
                session_id: None,
                device_id: "rig-1".into(),
                reason: "done".into(),
            },
        )
        .await
        .expect("reset");
    assert_eq!(reset["status"], "completed");
    assert_eq!(reset["output"]["resumed"], false);
    let again = rig
        .kernel
        .reset(
            &rig.p,
            ResetRequest {
                session_id: None,
                device_id: "rig-1".into(),
                reason: "again".into(),
            },
        )
        .await
        .expect("reset");
    assert_eq!(again["error"]["details"]["reason"], "not_latched");
}

#[tokio::test]
async fn a_deadline_that_passes_while_waiting_for_the_device_is_a_timeout_before_dispatch() {
    let rig = Arc::new(rig().await);
    rig.driver.slow_ms.store(400, Ordering::SeqCst);
    let first = {
        let rig = rig.clone();
        tokio::spawn(async move {
            rig.run(rig.req("cap.io.relay.v1", json!({"channel": 0, "on": true})))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut second = rig.req("cap.io.relay.v1", json!({"channel": 1, "on": true}));
    second.deadline = Some(Duration::from_millis(50));
    let calls = rig.calls();
    let r = rig.run(second).await;
    assert_eq!(r["error"]["mhs_code"], "MHS.OUTCOME.TIMEOUT", "{r}");
    assert_eq!(
        r["error"]["details"]["reason"],
        "deadline_exceeded_before_dispatch"
    );
    assert_eq!(r["error"]["details"]["while"], "waiting_for_device_lock");
    assert_eq!(rig.calls(), calls);
    assert_eq!(first.await.expect("join")["status"], "completed");
}

#[tokio::test]
async fn an_estop_cancels_a_running_operation() {
    let rig = Arc::new(rig().await);
    rig.driver.slow_ms.store(5_000, Ordering::SeqCst);
    let running = {
        let rig = rig.clone();
        tokio::spawn(async move {
            rig.run(rig.req("x-cap.test.dose.v1", json!({"amount": 1})))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let stop = rig.kernel.estop(EstopRequest::default()).await;
    assert_eq!(
        stop["cancelled_operations"].as_array().map(Vec::len),
        Some(1),
        "{stop}"
    );
    let r = tokio::time::timeout(Duration::from_secs(2), running)
        .await
        .expect("cancelled promptly")
        .expect("join");
    assert_eq!(r["status"], "cancelled");
}

#[tokio::test]
async fn replay_returns_the_retained_receipt_and_reuse_is_refused() {
    let rig = rig().await;
    let mut a = rig.req("x-cap.test.dose.v1", json!({"amount": 2}));
    a.command_id = Some("01AAAAAAAAAAAAAAAAAAAAAAAA".into());
    let first = rig.run(a.clone()).await;
    let again = rig.run(a.clone()).await;
    assert_eq!(again["replayed"], true);
    assert_eq!(again["receipt_id"], first["receipt_id"]);
    assert_eq!(rig.calls(), 1, "a replay never reaches the driver");
    a.input = json!({"amount": 3});
    let reuse = rig.run(a).await;
    assert_eq!(reuse["error"]["mhs_code"], "MHS.CONFLICT.COMMAND_ID_REUSE");
    assert_eq!(reuse["error"]["details"]["reason"], "input_differs");
}

fn defects(text: &str, overlay: Option<&str>) -> String {
    let src = vec![ManifestSource {
        origin: "bad.toml".into(),
        text: text.into(),
    }];
    let ov = overlay.map(|t| OverlaySource {
        origin: "site-limits.json".into(),
        text: t.into(),
    });
    match load(&src, ov.as_ref()) {
        Ok(_) => String::new(),
        Err(d) => d
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

#[test]
fn a_duplicate_device_id_does_not_hide_that_manifests_other_defects() {
    let low = MANIFEST.replace("risk_class = \"R2\"", "risk_class = \"R0\"");
    let src = vec![
        ManifestSource {
            origin: "first.toml".into(),
            text: MANIFEST.into(),
        },
        ManifestSource {
            origin: "second.toml".into(),
            text: low,
        },
    ];
    let msg = match load(&src, None) {
        Ok(_) => panic!("a duplicate device id must refuse the cell"),
        Err(d) => d
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n"),
    };
    assert!(
        msg.contains("second.toml") && msg.contains("already declared in first.toml"),
        "{msg}"
    );
    assert!(
        msg.contains("risk_class") && msg.contains("below the floor"),
        "the second manifest's own defects are reported too: {msg}"
    );
}

#[test]
fn manifest_defects_name_the_file_the_device_and_the_field() {
    let twice = MANIFEST.replace("[[bindings]]\ncapability_id = \"cap.state.read.v1\"\nresource = \"main\"", "[[bindings]]\ncapability_id = \"cap.state.read.v1\"\nresource = \"main\"\n[[bindings]]\ncapability_id = \"cap.state.read.v1\"\nresource = \"main\"");
    let msg = defects(&twice, None);
    assert!(
        msg.contains("bad.toml")
            && msg.contains("rig-1")
            && msg.contains("bindings[6]")
            && msg.contains("already bound"),
        "{msg}"
    );

    let unknown = MANIFEST.replace(
        "capability_id = \"cap.io.relay.v1\"",
        "capability_id = \"cap.foo.bar.v1\"",
    );
    let msg = defects(&unknown, None);
    assert!(
        msg.contains("bindings[4].input_schema") && msg.contains("cap.foo.bar.v1"),
        "{msg}"
    );

    let low = MANIFEST.replace("risk_class = \"R2\"", "risk_class = \"R0\"");
    let msg = defects(&low, None);
    assert!(
        msg.contains("risk_class") && msg.contains("below the floor"),
        "{msg}"
    );

    let typo = MANIFEST.replace(
        "limits.amount = { min = -10, max = 10",
        "limits.amount = { min = -10, maxx = 10",
    );
    let msg = defects(&typo, None);
    assert!(
        msg.contains("bindings[1].limits.amount") && msg.contains("maxx"),
        "{msg}"
    );

    let unit = MANIFEST.replace("max = 10, unit = \"mL\"", "max = 10, unit = \"L\"");
    assert!(
        defects(&unit, None).contains("unit"),
        "unit mismatch must be a load error"
    );

    let unknown_unit = MANIFEST.replace("\"x-mhs-unit\" = \"%\"", "\"x-mhs-unit\" = \"furlong\"");
    let msg = defects(&unknown_unit, None);
    assert!(
        msg.contains("resources[0].state_schema.properties.level.x-mhs-unit")
            && msg.contains("furlong"),
        "{msg}"
    );

    let env_bad = format!("{MANIFEST}envelope = {{ \"motion\" = {{ amount = {{ max = 1 }} }} }}\n");
    assert!(defects(&env_bad, None).contains("envelope-key-invalid"));
    let env_unbound =
        format!("{MANIFEST}envelope = {{ \"cap.motion.*\" = {{ speed = {{ max = 1 }} }} }}\n");
    assert!(defects(&env_unbound, None).contains("envelope-unbound"));
}

#[test]
fn overlay_defects_are_load_errors() {
    let widening = defects(
        MANIFEST,
        Some(
            r#"{"rig-1": {"x-cap.test.dose.v1": {"amount": {"max": 50, "unit": "mL", "source": "operator"}}}}"#,
        ),
    );
    assert!(widening.contains("widening"), "{widening}");
    assert!(
        widening.contains("site-limits.json -> x-cap.test.dose.v1 -> amount"),
        "an overlay rule's defect names the overlay file: {widening}"
    );
    let unbound = defects(
        MANIFEST,
        Some(r#"{"rig-1": {"cap.motion.move_to.v1": {"speed": {"max": 1}}}}"#),
    );
    assert!(unbound.contains("does not bind"), "{unbound}");
    let device = defects(MANIFEST, Some(r#"{"nobody": {}}"#));
    assert!(
        device.contains("nobody") && device.contains("does not serve"),
        "{device}"
    );
    let readonly = defects(MANIFEST, Some(r#"{"rig-1": {"temp": {"max": 1}}}"#));
    assert!(readonly.contains("not a writable field"), "{readonly}");
    assert_eq!(
        defects(
            MANIFEST,
            Some(r#"{"rig-1": {"level": {"max": 60, "unit": "%", "source": "operator"}}}"#)
        ),
        ""
    );
}

#[test]
fn the_builtin_cell_loads_cleanly() {
    let cell = load(
        &[ManifestSource {
            origin: "rig-1.toml".into(),
            text: MANIFEST.into(),
        }],
        None,
    )
    .expect("loads");
    assert_eq!(cell.devices.len(), 1);
}

#[test]
fn json_manifests_load_like_toml_and_refuse_duplicate_keys() {
    let value: toml::Value = toml::from_str(MANIFEST).expect("toml");
    let json_text = serde_json::to_string(&value).expect("json");
    let src = vec![ManifestSource {
        origin: "rig-1.json".into(),
        text: json_text.clone(),
    }];
    let cell = load(&src, None).expect("the JSON form loads");
    assert_eq!(cell.devices[0].bindings.len(), 7);
    let dup = json_text.replacen(
        "\"device_id\":\"rig-1\"",
        "\"device_id\":\"rig-1\",\"device_id\":\"rig-2\"",
        1,
    );
    let err = load(
        &[ManifestSource {
            origin: "rig-1.json".into(),
            text: dup,
        }],
        None,
    )
    .expect_err("duplicate key");
    assert!(err[0].to_string().contains("duplicate key"), "{}", err[0]);
}

/// The dose command of the replay test, always under the same id.
fn replayable_dose(rig: &Rig) -> CommandRequest {
    let mut req = rig.req("x-cap.test.dose.v1", json!({"amount": 3.0}));
    req.command_id = Some("01REPLAYSAMEDOCUMENT000000".into());
    req
}

/// A replay's answer with its `replayed` flag put back to the first answer's.
fn as_first_answer(replay: &Value) -> Value {
    let mut same = replay.clone();
    same["replayed"] = json!(false);
    same
}

#[tokio::test]
async fn a_replay_answers_the_same_document_before_and_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sqlite = || Arc::new(SqliteStore::open(dir.path()).expect("store"));
    let first = {
        let rig = rig_with(None, sqlite()).await;
        // A whole float in the output: recorded, and read back, as 3.
        let first = rig.run(replayable_dose(&rig)).await;
        assert_eq!(first["status"], "completed", "{first}");
        assert_eq!(first["replayed"], false);
        let again = rig.run(replayable_dose(&rig)).await;
        assert_eq!(again["replayed"], true, "{again}");
        assert_eq!(
            as_first_answer(&again),
            first,
            "a replay in the same process"
        );
        first
    };
    let rig = rig_with(None, sqlite()).await;
    let after = rig.run(replayable_dose(&rig)).await;
    assert_eq!(after["replayed"], true, "{after}");
    assert_eq!(as_first_answer(&after), first, "a replay after a restart");
    assert_eq!(rig.calls(), 0, "a replay never reaches the driver");
}

#[tokio::test]
async fn a_minted_command_id_needs_no_store_lookup_even_past_the_index_capacity() {
    let store = Arc::new(tether_store::faulty::FaultyStore::new(Arc::new(
        MemoryStore::new(),
    )));
    let mut config = KernelConfig::standard("test");
    // One entry: the index is incomplete from the second command on.
    config.idempotency_cache_max = 1;
    let rig = rig_configured(None, store.clone(), config).await;
    for amount in [1, 2, 3] {
        let r = rig
            .run(rig.req("x-cap.test.dose.v1", json!({"amount": amount})))
            .await;
        assert_eq!(r["status"], "completed", "{r}");
    }
    assert_eq!(
        store.receipt_reads.load(Ordering::SeqCst),
        0,
        "ids the endpoint minted are new: no look-up"
    );
    // A caller's id on an incomplete index is looked up, and replays.
    let mut req = rig.req("x-cap.test.dose.v1", json!({"amount": 4}));
    req.command_id = Some("01CALLERSUPPLIEDID00000000".into());
    let first = rig.run(req.clone()).await;
    assert_eq!(first["status"], "completed", "{first}");
    assert!(store.receipt_reads.load(Ordering::SeqCst) >= 1);
    rig.run(rig.req("x-cap.test.dose.v1", json!({"amount": 5})))
        .await;
    let again = rig.run(req).await;
    assert_eq!(again["replayed"], true, "{again}");
    assert_eq!(again["receipt_id"], first["receipt_id"]);
}

#[tokio::test]
async fn a_value_a_budget_cannot_draw_from_is_refused_with_full_violation_details() {
    let rig = rig().await;
    for bad in [json!("abc"), json!(true), json!([1]), json!({"a": 1})] {
        let r = rig
            .refused(
                rig.req("x-cap.test.tally.v1", json!({ "count": bad })),
                "MHS.SAFETY.ENVELOPE_VIOLATION",
            )
            .await;
        let d = &r["error"]["details"];
        assert_eq!(d["kind"], "type", "{r}");
        assert_eq!(d["path"], "count", "{r}");
        assert_eq!(d["value"], bad, "{r}");
        assert_eq!(d["bound"], json!(5.0), "{r}");
        assert!(d["source"].is_string(), "{r}");
        assert_eq!(d["violations"][0]["path"], "count", "{r}");
    }
    assert_eq!(
        rig.run(rig.req("x-cap.test.tally.v1", json!({"count": 5})))
            .await["status"],
        "completed"
    );
}

#[test]
fn the_reference_shows_limits_on_what_an_adjustable_field_holds() {
    let src = vec![ManifestSource {
        origin: "rig-1.toml".into(),
        text: MANIFEST.into(),
    }];
    let cell = load(&src, None).expect("rig loads");
    let reference = tether_kernel::reference::reference_json(&cell.devices[0]);
    let tuning = reference["adjusts"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["field"] == "tuning"))
        .cloned()
        .expect("tuning is adjustable");
    assert_eq!(
        tuning["limits_within"]["tuning.gain"]["max"],
        json!(4.0),
        "{tuning}"
    );
    let text = tether_kernel::reference::reference_markdown(&cell.devices[0]);
    assert!(text.contains("`main.tuning.gain` max 4"), "{text}");
    assert!(!text.contains("`main.tuning` no limit"), "{text}");
}

#[test]
fn a_defective_envelope_rule_is_reported_once_at_its_binding() {
    let text =
        format!("{MANIFEST}\n[safety.envelope.\"x-cap.test.dose.v1\"]\namount = {{ maxx = 5 }}\n");
    let msg = defects(&text, None);
    assert!(msg.contains("maxx"), "{msg}");
    assert!(
        !msg.contains("matches no bound capability"),
        "the key does match a bound capability: {msg}"
    );
}

#[test]
fn a_manifest_the_strict_reading_refuses_still_names_its_device() {
    let text = format!("colour = \"blue\"\n{MANIFEST}");
    let msg = defects(&text, None);
    assert!(msg.contains("bad.toml") && msg.contains("rig-1"), "{msg}");
    assert!(msg.contains("colour"), "{msg}");
}

/// A command that ran but whose receipt the store would not take is never
/// answered `completed`: it is `unknown` (`receipt_not_durable`), a resend
/// of its id replays that without reaching the driver, and once the store
/// takes writes again the `unknown` receipt is recorded, so a restart would
/// replay it too (issue 21 §3).
#[tokio::test]
async fn a_receipt_that_cannot_be_made_durable_is_unknown_replayed_and_recorded_later() {
    let store = Arc::new(tether_store::faulty::FaultyStore::new(Arc::new(
        MemoryStore::new(),
    )));
    let rig = rig_configured(None, store.clone(), KernelConfig::standard("test")).await;
    let mut req = rig.req("x-cap.test.dose.v1", json!({"amount": 1}));
    req.command_id = Some("01NOTDURABLERECEIPT0000001".into());
    store.fail_writes.store(true, Ordering::SeqCst);
    let first = rig.run(req.clone()).await;
    assert_eq!(first["status"], "unknown", "{first}");
    assert_eq!(
        first["error"]["details"]["reason"], "receipt_not_durable",
        "{first}"
    );
    assert_eq!(first["x-tether"]["evidence"], "not_durable", "{first}");
    let calls = rig.calls();
    let again = rig.run(req.clone()).await;
    assert_eq!(again["status"], "unknown", "{again}");
    assert_eq!(rig.calls(), calls, "the id never runs again");
    store.fail_writes.store(false, Ordering::SeqCst);
    let t0 = std::time::Instant::now();
    let stored = loop {
        if let Ok(Some(r)) = store.receipt("01NOTDURABLERECEIPT0000001") {
            break r;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "never recorded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(stored.receipt["status"], "unknown", "{:?}", stored.receipt);
    let replay = rig.run(req).await;
    assert_eq!(replay["status"], "unknown", "{replay}");
    assert_eq!(rig.calls(), calls, "still never run again");
}

/// The unknown outcomes the store did not take are counted (`store.
/// unrecorded_outcomes` in the safety status) and an orderly shutdown's
/// last offer records them at once, without waiting for the background
/// recorder's next round, so a restart replays their ids.
#[tokio::test]
async fn the_last_offer_at_shutdown_records_every_owed_unknown_outcome() {
    let store = Arc::new(tether_store::faulty::FaultyStore::new(Arc::new(
        MemoryStore::new(),
    )));
    let rig = rig_configured(None, store.clone(), KernelConfig::standard("test")).await;
    store.fail_writes.store(true, Ordering::SeqCst);
    let ids = ["01OWEDOUTCOME0000000000001", "01OWEDOUTCOME0000000000002"];
    for id in ids {
        let mut req = rig.req("x-cap.test.dose.v1", json!({"amount": 1}));
        req.command_id = Some(id.into());
        assert_eq!(rig.run(req).await["status"], "unknown");
    }
    assert_eq!(rig.kernel.owed_outcomes(), 2);
    let status = rig.kernel.safety_status(None).expect("status");
    assert_eq!(status["store"]["unrecorded_outcomes"], 2, "{status}");
    // Still failing: the last offer gives up within its bound and says so.
    let left = rig
        .kernel
        .record_owed_outcomes(Duration::from_millis(500))
        .await;
    assert_eq!(left, 2);
    store.fail_writes.store(false, Ordering::SeqCst);
    let left = rig
        .kernel
        .record_owed_outcomes(Duration::from_secs(5))
        .await;
    assert_eq!(left, 0);
    for id in ids {
        let row = store.receipt(id).expect("read").expect("recorded");
        assert_eq!(row.receipt["status"], "unknown", "{:?}", row.receipt);
    }
    assert_eq!(rig.kernel.owed_outcomes(), 0);
}
