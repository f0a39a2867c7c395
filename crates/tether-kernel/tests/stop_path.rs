//! The e-stop's stop path: native stop, safe-state actions, failures that keep
//! the latch and are retried in the background, and resets refused while a
//! stop attempt still runs.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tether_kernel::{
    Authorized, BoxFuture, CancelToken, CommandRequest, Driver, EstopRequest, Kernel, Principal,
    ResetRequest, SessionOpen, Signal,
};
use tether_store::MemoryStore;

fn manifest(mode: &str, native: bool, achieved_by: &str) -> String {
    format!(
        r#"
device_id = "press-1"
mode = "{mode}"
risk_class = "R2"
driver = "test"
fidelity = {{ kind = "simulated", notes = "scripted" }}

[[resources]]
id = "main"
state_schema = {{ type = "object", properties = {{ pos = {{ type = "number", readOnly = true, "x-mhs-unit" = "mm" }} }} }}

[[bindings]]
capability_id = "x-cap.test.hold.v1"
resource = "main"
target = "hold"
kind = "leased"
input_schema = {{ type = "object", additionalProperties = false, properties = {{}} }}
output_schema = {{ type = "object" }}

[[bindings]]
capability_id = "x-cap.test.press.v1"
resource = "main"
target = "press"
kind = "leased"
input_schema = {{ type = "object", additionalProperties = false, properties = {{}} }}
output_schema = {{ type = "object" }}

[safety]
estop = {{ latency_ms = 300, native = {native} }}
safe_state = {{ description = "held", achieved_by = [{achieved_by}] }}
"#
    )
}

#[derive(Default)]
struct PressDriver {
    guard_open: std::sync::atomic::AtomicBool,
    estop_failures_left: AtomicUsize,
    estop_sleep_ms: AtomicUsize,
    estops: AtomicUsize,
    calls: Mutex<Vec<String>>,
}

impl Driver for PressDriver {
    fn read(&self, _call: &Authorized) -> Result<Value, Signal> {
        Ok(json!({"pos": 0}))
    }
    fn call(&self, call: Authorized, _cancel: CancelToken) -> BoxFuture<'_, Result<Value, Signal>> {
        Box::pin(async move {
            if let Ok(mut c) = self.calls.lock() {
                c.push(call.target().to_owned());
            }
            Ok(json!({}))
        })
    }
    fn interlocks(&self) -> Vec<(String, tether_kernel::InterlockState)> {
        let open = self.guard_open.load(Ordering::SeqCst);
        vec![(
            "guard".into(),
            if open {
                tether_kernel::InterlockState::Open
            } else {
                tether_kernel::InterlockState::Closed
            },
        )]
    }
    fn estop(&self, _call: &Authorized) -> Result<(), Signal> {
        self.estops.fetch_add(1, Ordering::SeqCst);
        let sleep = self.estop_sleep_ms.load(Ordering::SeqCst) as u64;
        if sleep > 0 {
            std::thread::sleep(Duration::from_millis(sleep));
        }
        let left = self.estop_failures_left.load(Ordering::SeqCst);
        if left > 0 {
            self.estop_failures_left.store(left - 1, Ordering::SeqCst);
            return Err(Signal::Failed {
                reason: "jammed".into(),
                message: "brake did not engage".into(),
            });
        }
        Ok(())
    }
}

fn kernel(text: &str) -> (Kernel, Arc<PressDriver>) {
    let driver = Arc::new(PressDriver::default());
    let k = common::single_device_kernel(
        "press-1",
        text,
        driver.clone(),
        Arc::new(MemoryStore::new()),
    );
    (k, driver)
}

fn estop() -> EstopRequest {
    EstopRequest {
        device_ids: vec!["press-1".into()],
        reason: "test".into(),
        ..EstopRequest::default()
    }
}

fn operator() -> Principal {
    Principal {
        id: "op".into(),
        kind: tether_kernel::PrincipalKind::Human,
        operator: true,
    }
}

fn reset() -> ResetRequest {
    ResetRequest {
        session_id: None,
        device_id: "press-1".into(),
        reason: "t".into(),
    }
}

#[tokio::test]
async fn safe_state_actions_run_after_the_native_stop_and_stay_callable_while_latched() {
    let (k, driver) = kernel(&manifest("simulated", true, "\"x-cap.test.hold.v1\""));
    let r = k.estop(estop()).await;
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["safe_state_achieved"], true);
    assert_eq!(
        r["output"]["safe_state_actions"],
        json!(["x-cap.test.hold.v1"])
    );
    assert_eq!(driver.estops.load(Ordering::SeqCst), 1);
    assert_eq!(
        driver.calls.lock().expect("calls").clone(),
        vec!["hold".to_owned()]
    );
    // An achieved_by action is exempt from the latch; another action is not.
    let p = Principal::local_agent();
    let sid = k
        .session_open(&p, SessionOpen::default())
        .await
        .expect("session")["session_id"]
        .as_str()
        .expect("sid")
        .to_owned();
    let cmd = |cap: &str| CommandRequest {
        route: tether_kernel::Route::Command,
        session_id: Some(sid.clone()),
        device_id: "press-1".into(),
        capability_id: cap.into(),
        resource: None,
        input: json!({}),
        command_id: None,
        deadline: None,
        expected_revision: None,
        safe_place_grant: None,
        permit_id: None,
    };
    assert_eq!(
        k.command(
            &p,
            cmd("x-cap.test.hold.v1"),
            tether_kernel::CommandOptions::plain()
        )
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt")["status"],
        "completed"
    );
    assert_eq!(
        k.command(
            &p,
            cmd("x-cap.test.press.v1"),
            tether_kernel::CommandOptions::plain()
        )
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt")["error"]["mhs_code"],
        "MHS.SAFETY.ESTOP_ENGAGED"
    );
}

#[tokio::test]
async fn a_failed_native_stop_keeps_the_latch_and_is_retried_until_confirmed() {
    let (k, driver) = kernel(&manifest("hardware", true, ""));
    driver.estop_failures_left.store(2, Ordering::SeqCst);
    let r = k.estop(estop()).await;
    assert_eq!(r["status"], "failed", "{r}");
    assert_eq!(r["error"]["mhs_code"], "MHS.SAFETY.SAFE_STATE_UNREACHED");
    assert_eq!(r["error"]["details"]["reason"], "native_failed");
    assert_eq!(r["safe_state_achieved"], false);
    let st = k.safety_status(Some("press-1")).expect("status");
    assert_eq!(st["devices"][0]["latched"], true);
    assert_eq!(st["devices"][0]["estop"]["confirmed"], false);
    // Retries after 0.25 s and 0.5 s: the second succeeds.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(3) {
        if k.safety_status(Some("press-1")).expect("status")["devices"][0]["estop"]["confirmed"]
            == true
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        k.safety_status(Some("press-1")).expect("status")["devices"][0]["estop"]["confirmed"],
        true
    );
    assert_eq!(driver.estops.load(Ordering::SeqCst), 3);
    assert_eq!(
        k.safety_status(Some("press-1")).expect("status")["devices"][0]["latched"],
        true,
        "a confirmation never releases the latch"
    );
}

#[tokio::test]
async fn a_hanging_native_stop_answers_within_the_budget_and_blocks_reset_while_it_runs() {
    let (k, driver) = kernel(&manifest("hardware", true, ""));
    driver.estop_sleep_ms.store(800, Ordering::SeqCst);
    let t0 = Instant::now();
    let r = k.estop(estop()).await;
    let took = t0.elapsed();
    assert!(
        took < Duration::from_millis(700),
        "answered after {took:?}, budget is 300 ms"
    );
    assert_eq!(r["error"]["details"]["reason"], "timeout", "{r}");
    let refused = k.reset(&operator(), reset()).await.expect("reset");
    assert_eq!(
        refused["error"]["details"]["reason"], "stop_path_pending",
        "{refused}"
    );
    // Once the hung stop returns (and a retry confirms), an operator may reset.
    tokio::time::sleep(Duration::from_millis(900)).await;
    driver.estop_sleep_ms.store(0, Ordering::SeqCst);
    let t1 = Instant::now();
    loop {
        let r = k.reset(&operator(), reset()).await.expect("reset");
        if r["status"] == "completed" || t1.elapsed() > Duration::from_secs(3) {
            assert_eq!(r["status"], "completed", "{r}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_hardware_latch_is_released_only_by_an_operator() {
    let (k, _driver) = kernel(&manifest("hardware", true, ""));
    k.estop(estop()).await;
    let agent = k
        .reset(&Principal::local_agent(), reset())
        .await
        .expect("reset");
    assert_eq!(agent["error"]["mhs_code"], "MHS.AUTH.FORBIDDEN", "{agent}");
    assert_eq!(agent["error"]["details"]["reason"], "operator_required");
    assert_eq!(
        k.reset(&operator(), reset()).await.expect("reset")["status"],
        "completed"
    );
}

#[tokio::test]
async fn a_hardware_device_without_any_stop_path_never_reports_a_safe_state() {
    let (k, _driver) = kernel(&manifest("hardware", false, ""));
    let r = k.estop(estop()).await;
    assert_eq!(r["status"], "failed");
    assert_eq!(r["error"]["details"]["reason"], "no_stop_path");
    assert_eq!(
        k.safety_status(Some("press-1")).expect("status")["devices"][0]["latched"],
        true
    );
}

#[tokio::test]
async fn the_estop_answer_never_comes_after_the_callers_deadline() {
    let (k, driver) = kernel(&manifest("hardware", true, ""));
    driver.estop_sleep_ms.store(250, Ordering::SeqCst);
    let t0 = Instant::now();
    let r = k
        .estop(EstopRequest {
            deadline: Some(Duration::from_millis(40)),
            ..estop()
        })
        .await;
    let took = t0.elapsed();
    assert!(took < Duration::from_millis(200), "answered after {took:?}");
    assert_eq!(
        r["error"]["mhs_code"], "MHS.SAFETY.SAFE_STATE_UNREACHED",
        "{r}"
    );
    assert_eq!(r["error"]["details"]["stop_path"], "running");
    assert_eq!(
        k.safety_status(Some("press-1")).expect("status")["devices"][0]["latched"],
        true,
        "latched before answering"
    );
}

#[tokio::test]
async fn a_terminal_stop_refuses_every_later_reset_on_this_endpoint() {
    let text = manifest("hardware", true, "").replace("estop = { latency_ms = 300, native = true }", "estop = { latency_ms = 300, native = true, terminal = \"the drive needs a power cycle after a stop\" }");
    let (k, _driver) = kernel(&text);
    k.estop(estop()).await;
    let r = k.reset(&operator(), reset()).await.expect("reset");
    assert_eq!(r["error"]["details"]["reason"], "terminal_estop", "{r}");
    assert_eq!(
        r["error"]["details"]["terminal"],
        "the drive needs a power cycle after a stop"
    );
    assert_eq!(
        k.safety_status(Some("press-1")).expect("status")["devices"][0]["estop"]["terminated"],
        true
    );
}

#[tokio::test]
async fn a_safe_state_action_gated_by_an_open_interlock_is_not_run_and_the_stop_is_retried() {
    let text = manifest("simulated", false, "\"x-cap.test.hold.v1\"")
        + "\n[[interlocks]]\nid = \"guard\"\ndescription = \"guard closed\"\nsource = \"simulated\"\nrequired_for = [\"x-cap.test.hold.v1\"]\n";
    let (k, driver) = kernel(&text);
    driver.guard_open.store(true, Ordering::SeqCst);
    let r = k.estop(estop()).await;
    assert_eq!(r["status"], "failed", "{r}");
    assert_eq!(r["error"]["details"]["reason"], "action_failed");
    assert!(
        driver.calls.lock().expect("calls").is_empty(),
        "the gated action never ran"
    );
    driver.guard_open.store(false, Ordering::SeqCst);
    let t0 = Instant::now();
    while k.safety_status(Some("press-1")).expect("status")["devices"][0]["estop"]["confirmed"]
        != true
    {
        assert!(t0.elapsed() < Duration::from_secs(3), "never retried");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        driver.calls.lock().expect("calls").clone(),
        vec!["hold".to_owned()]
    );
}

#[tokio::test]
async fn a_completed_reset_names_the_reenable_and_never_runs_it() {
    let text = manifest("simulated", true, "").replace(
        "estop = { latency_ms = 300, native = true }",
        "estop = { latency_ms = 300, native = true, reenable = \"x-cap.test.press.v1\" }",
    );
    assert!(text.contains("reenable"), "{text}");
    let (k, driver) = kernel(&text);
    k.estop(estop()).await;
    let r = k.reset(&operator(), reset()).await.expect("reset");
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["output"]["reenable"], "x-cap.test.press.v1", "{r}");
    assert_eq!(r["output"]["resumed"], false, "{r}");
    assert!(
        !driver
            .calls
            .lock()
            .expect("calls")
            .iter()
            .any(|c| c == "press"),
        "the reset ran the re-enable"
    );
}
