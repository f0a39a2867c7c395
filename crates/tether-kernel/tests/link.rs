//! Device links: shown in `mhs.devices.list` and `mhs.safety.status`,
//! weighed by the endpoint's health, and the link-loss latch — a physical
//! device whose link stays down past its watchdog period is latched once per
//! outage (running operation cancelled, stop path attempted, evidence
//! written), and the latch holds after the link returns until an operator
//! resets it (refused while the link is still down).
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
use tether_kernel::{
    Authorized, BoxFuture, CancelToken, CommandOptions, CommandRequest, Driver, Kernel, Link,
    Principal, ResetRequest, Signal,
};
use tether_store::faulty::FaultyStore;
use tether_store::{MemoryStore, Store};

const WATCHDOG_MS: u64 = 200;

fn manifest(mode: &str, watchdog: Option<u64>) -> String {
    let watchdog = watchdog.map_or(String::new(), |w| format!("watchdog_ms = {w}\n"));
    let fidelity = if mode == "simulated" {
        "fidelity = { kind = \"simulated\", notes = \"scripted\" }\n"
    } else {
        ""
    };
    format!(
        r#"
device_id = "pump-1"
mode = "{mode}"
risk_class = "R1"
driver = "test"
{fidelity}
[[resources]]
id = "main"
state_schema = {{ type = "object", properties = {{ running = {{ type = "boolean", readOnly = true }} }} }}

[[bindings]]
capability_id = "x-cap.test.run.v1"
resource = "main"
target = "run"
kind = "time_bounded"
max_duration_ms = 10000
input_schema = {{ type = "object", additionalProperties = false, properties = {{}} }}
output_schema = {{ type = "object" }}

[safety]
{watchdog}estop = {{ latency_ms = 300, native = true }}
"#
    )
}

/// A driver whose link the test toggles; its native stop fails while the
/// link is down (as a real one would), and `run` waits for cancellation.
struct LinkDriver {
    link: Mutex<Link>,
    estops: AtomicUsize,
    running: AtomicBool,
}

impl LinkDriver {
    fn new() -> Self {
        Self {
            link: Mutex::new(Link {
                connected: true,
                since_ms: now(),
                last_error: None,
            }),
            estops: AtomicUsize::new(0),
            running: AtomicBool::new(false),
        }
    }
    fn set(&self, connected: bool, error: Option<&str>) {
        let mut l = self.link.lock().expect("link");
        if l.connected != connected {
            l.since_ms = now();
        }
        l.connected = connected;
        if let Some(e) = error {
            l.last_error = Some(e.to_owned());
        }
    }
    fn up(&self) -> bool {
        self.link.lock().expect("link").connected
    }
}

fn now() -> u64 {
    tether_core::receipt::now_ms()
}

impl Driver for LinkDriver {
    fn read(&self, _call: &Authorized) -> Result<Value, Signal> {
        Ok(json!({"running": self.running.load(Ordering::SeqCst)}))
    }
    fn call(&self, _call: Authorized, cancel: CancelToken) -> BoxFuture<'_, Result<Value, Signal>> {
        Box::pin(async move {
            self.running.store(true, Ordering::SeqCst);
            let r = tokio::time::timeout(Duration::from_secs(5), cancel.cancelled()).await;
            self.running.store(false, Ordering::SeqCst);
            match r {
                Ok(()) => Err(Signal::Cancelled),
                Err(_) => Ok(json!({})),
            }
        })
    }
    fn estop(&self, _call: &Authorized) -> Result<(), Signal> {
        self.estops.fetch_add(1, Ordering::SeqCst);
        if self.up() {
            Ok(())
        } else {
            Err(Signal::OutcomeUnknown {
                message: "no connection to the device".into(),
            })
        }
    }
    fn link(&self) -> Option<Link> {
        Some(self.link.lock().expect("link").clone())
    }
}

fn kernel_on(
    mode: &str,
    watchdog: Option<u64>,
    store: Arc<dyn Store>,
) -> (Kernel, Arc<LinkDriver>) {
    let driver = Arc::new(LinkDriver::new());
    let k =
        common::single_device_kernel("pump-1", &manifest(mode, watchdog), driver.clone(), store);
    (k, driver)
}

fn operator() -> Principal {
    Principal {
        id: "op".into(),
        kind: tether_kernel::PrincipalKind::Human,
        operator: true,
    }
}

fn run(sid: &str) -> CommandRequest {
    CommandRequest {
        route: tether_kernel::Route::Command,
        session_id: Some(sid.to_owned()),
        device_id: "pump-1".into(),
        capability_id: "x-cap.test.run.v1".into(),
        resource: None,
        input: json!({}),
        command_id: None,
        deadline: None,
        expected_revision: None,
        safe_place_grant: None,
        permit_id: None,
    }
}

async fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn status(k: &Kernel) -> Value {
    k.safety_status(Some("pump-1")).expect("status")["devices"][0].clone()
}

/// Entries of `kind` about the link source in the chain.
fn link_trips(store: &dyn Store) -> usize {
    store
        .chain_tail(10_000)
        .expect("tail")
        .iter()
        .filter(|e| e["kind"] == "safety.estop" && e["body"]["source"] == "link")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_down_past_the_watchdog_latches_once_and_holds_until_an_operator_reset() {
    let store = Arc::new(MemoryStore::new());
    let (k, driver) = kernel_on("hardware", Some(WATCHDOG_MS), store.clone());
    let _monitor = k
        .start_link_monitor(&tokio::runtime::Handle::current())
        .expect("a physical device is watched");
    let p = Principal::local_agent();
    let sid = common::open_session(&k, &p).await;

    // Connected: shown, and healthy.
    assert_eq!(status(&k)["link"]["state"], "connected");
    assert_eq!(k.devices_list()["devices"][0]["link"]["state"], "connected");
    let h = k.health().await;
    assert!(h.ok, "{}", h.body);
    assert_eq!(h.body["unreachable"], json!([]));

    // A running operation, then the link drops.
    let k2 = k.clone();
    let sid2 = sid.clone();
    let running = tokio::spawn(async move {
        k2.command(
            &Principal::local_agent(),
            run(&sid2),
            CommandOptions::plain(),
        )
        .await
        .map(tether_kernel::Answer::into_value)
    });
    wait_until("the operation to run", Duration::from_secs(5), || {
        driver.running.load(Ordering::SeqCst)
    })
    .await;
    let dropped = Instant::now();
    driver.set(false, Some("connection refused"));

    // Shown at once (the driver's word), unhealthy, not latched yet.
    let st = status(&k);
    assert_eq!(st["link"]["state"], "reconnecting", "{st}");
    assert_eq!(st["link"]["last_error"], "connection refused", "{st}");
    assert_eq!(st["latched"], false, "{st}");
    let h = k.health().await;
    assert!(!h.ok);
    assert_eq!(h.body["store"]["writable"], true, "{}", h.body);
    assert_eq!(
        h.body["unreachable"][0]["device_id"], "pump-1",
        "{}",
        h.body
    );
    assert_eq!(
        h.body["unreachable"][0]["link"]["last_error"], "connection refused",
        "{}",
        h.body
    );

    // Past the watchdog period: latched, with a reason naming the link.
    wait_until("the link-loss latch", Duration::from_secs(5), || {
        status(&k)["latched"] == true
    })
    .await;
    assert!(
        dropped.elapsed() >= Duration::from_millis(WATCHDOG_MS),
        "latched after {:?}, before the watchdog period",
        dropped.elapsed()
    );
    let st = status(&k);
    let reason = st["latch"]["reason"].as_str().expect("reason");
    assert!(
        reason.contains("link") && reason.contains("connection refused"),
        "{st}"
    );
    // The running operation was cancelled, the stop path attempted.
    let receipt = running.await.expect("task").expect("receipt");
    assert_eq!(receipt["status"], "cancelled", "{receipt}");
    // The stop path runs in its own worker: it may come after the receipt.
    wait_until(
        "the stop path's native stop",
        Duration::from_secs(5),
        || driver.estops.load(Ordering::SeqCst) >= 1,
    )
    .await;
    // A command is refused with the latch code.
    let refused = k
        .command(&p, run(&sid), CommandOptions::plain())
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt");
    assert_eq!(
        refused["error"]["mhs_code"], "MHS.SAFETY.ESTOP_ENGAGED",
        "{refused}"
    );

    // Once per outage: the latch row and its entry, once.
    tokio::time::sleep(Duration::from_millis(WATCHDOG_MS * 2)).await;
    assert_eq!(link_trips(store.as_ref()), 1);
    let rows = store.latches().expect("latches");
    let row = rows.iter().find(|r| r.device_id == "pump-1").expect("row");
    assert_eq!(row.info["source"], "link", "{:?}", row.info);

    // A reset while the link is down is refused.
    let reset = ResetRequest {
        session_id: None,
        device_id: "pump-1".into(),
        reason: "t".into(),
    };
    let r = k.reset(&operator(), reset.clone()).await.expect("reset");
    assert_eq!(r["status"], "rejected", "{r}");
    assert_eq!(r["error"]["details"]["reason"], "link_down", "{r}");

    // The link returns: healthy, still latched; the stop path's retry
    // gets through; an operator's reset releases it.
    driver.set(true, None);
    let h = k.health().await;
    assert!(h.ok, "{}", h.body);
    assert_eq!(status(&k)["link"]["state"], "connected");
    assert_eq!(status(&k)["link"]["last_error"], "connection refused");
    tokio::time::sleep(Duration::from_millis(WATCHDOG_MS * 2)).await;
    assert_eq!(
        status(&k)["latched"],
        true,
        "the latch holds after the link returns"
    );
    wait_until(
        "the stop path to be confirmed",
        Duration::from_secs(5),
        || status(&k)["estop"]["confirmed"] == true,
    )
    .await;
    let r = k.reset(&operator(), reset).await.expect("reset");
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(link_trips(store.as_ref()), 1);

    // The evidence has each change of the link.
    let changes: Vec<Value> = store
        .chain_tail(10_000)
        .expect("tail")
        .into_iter()
        .filter(|e| e["kind"] == "device.link")
        .map(|e| e["body"]["link"]["state"].clone())
        .collect();
    assert_eq!(changes, vec![json!("reconnecting"), json!("connected")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_watchdog_or_on_a_simulated_device_a_lost_link_is_shown_and_never_latches() {
    for (mode, watchdog) in [("hardware", None), ("simulated", Some(WATCHDOG_MS))] {
        let (k, driver) = kernel_on(mode, watchdog, Arc::new(MemoryStore::new()));
        let _monitor = k.start_link_monitor(&tokio::runtime::Handle::current());
        driver.set(false, Some("timed out"));
        tokio::time::sleep(Duration::from_millis(WATCHDOG_MS * 3)).await;
        let st = status(&k);
        assert_eq!(st["link"]["state"], "reconnecting", "{mode}: {st}");
        assert_eq!(st["latched"], false, "{mode}: {st}");
        // Only a physical device's link weighs on health.
        let h = k.health().await;
        assert_eq!(h.ok, mode == "simulated", "{mode}: {}", h.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_not_taking_writes_is_unhealthy_until_it_does_again() {
    let store = Arc::new(FaultyStore::new(Arc::new(MemoryStore::new())));
    let (k, _driver) = kernel_on("hardware", Some(WATCHDOG_MS), store.clone());
    let p = Principal::local_agent();
    let sid = common::open_session(&k, &p).await;
    assert!(k.health().await.ok);
    // A command's commit fails: unhealthy at once, the fresh probe
    // notwithstanding.
    store.fail_writes.store(true, Ordering::SeqCst);
    let refused = k
        .command(&p, run(&sid), CommandOptions::plain())
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt");
    assert_eq!(refused["status"], "rejected", "{refused}");
    let h = k.health().await;
    assert!(!h.ok, "{}", h.body);
    assert_eq!(h.body["store"]["writable"], false, "{}", h.body);
    // Past the probe's freshness, the next probe fails.
    tokio::time::sleep(Duration::from_millis(tether_kernel::HEALTH_PROBE_FRESH_MS)).await;
    let h = k.health().await;
    assert!(!h.ok);
    assert_eq!(h.body["store"]["writable"], false, "{}", h.body);
    assert!(
        h.body["store"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("injected write failure")),
        "{}",
        h.body
    );
    store.fail_writes.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(tether_kernel::HEALTH_PROBE_FRESH_MS)).await;
    let h = k.health().await;
    assert!(h.ok, "{}", h.body);
}
