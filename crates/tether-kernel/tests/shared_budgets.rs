//! Budgets shared by every kernel on one store: two kernels on one SQLite
//! state directory (each with its own store handle, writer and connection,
//! as two endpoints are) draw from one ledger. The store checks each draw
//! against its budget's cap in the transaction that stores it, so a draw
//! made by one counts against the other's next command at once, and the two
//! drawing concurrently never exceed the budget together.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tether_kernel::loader::{load, ManifestSource, OverlaySource};
use tether_kernel::{
    Authorized, BoxFuture, CancelToken, CommandRequest, Driver, Kernel, KernelConfig, Principal,
    SessionOpen, Signal,
};
use tether_store::faulty::FaultyStore;
use tether_store::{Commit, SqliteStore, Store};

/// The site's budget: 25 mL of doses per rolling hour (beside the binding's
/// range, which a hardware call needs on every number it sets).
const OVERLAY: &str = r#"{"pump-1": {"x-cap.test.dose.v1": {"amount": {"max": 25, "per": "rolling_1h", "unit": "mL", "source": "operator"}}}}"#;

/// A dosing pump whose every dose draws from a 25 mL hourly budget.
fn manifest(mode: &str) -> String {
    let fidelity = if mode == "simulated" {
        "fidelity = { kind = \"simulated\", notes = \"scripted test driver\" }"
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
state_schema = {{ type = "object", properties = {{ dosed = {{ type = "number", readOnly = true, "x-mhs-unit" = "mL" }} }} }}

[[bindings]]
capability_id = "x-cap.test.dose.v1"
resource = "main"
target = "dose"
kind = "leased"
input_schema = {{ type = "object", required = ["amount"], additionalProperties = false, properties = {{ amount = {{ type = "number", "x-mhs-unit" = "mL" }} }} }}
output_schema = {{ type = "object" }}
limits.amount = {{ min = 0, max = 25, unit = "mL", source = "operator" }}

[safety]
estop = {{ latency_ms = 300, native = true }}
"#
    )
}

#[derive(Default)]
struct Pump {
    calls: AtomicUsize,
    /// A dose never ends (the process is "killed" while it runs).
    hang: std::sync::atomic::AtomicBool,
}

impl Driver for Pump {
    fn read(&self, _call: &Authorized) -> Result<Value, Signal> {
        Ok(json!({"dosed": 0}))
    }
    fn call(&self, call: Authorized, _cancel: CancelToken) -> BoxFuture<'_, Result<Value, Signal>> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.hang.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            Ok(json!({"dosed": call.input()["amount"]}))
        })
    }
    fn estop(&self, _call: &Authorized) -> Result<(), Signal> {
        Ok(())
    }
}

struct Endpoint {
    k: Kernel,
    pump: Arc<Pump>,
    store: Arc<dyn Store>,
    p: Principal,
    sid: String,
}

/// One kernel on its own handle of the store in `dir`.
async fn endpoint(dir: &Path, mode: &str) -> Endpoint {
    endpoint_on(Arc::new(SqliteStore::open(dir).expect("store")), mode).await
}

/// One kernel on `store` (a handle of its own, wrapped or not).
async fn endpoint_on(store: Arc<dyn Store>, mode: &str) -> Endpoint {
    let cell = load(
        &[ManifestSource {
            origin: "pump-1.toml".into(),
            text: manifest(mode),
        }],
        Some(&OverlaySource {
            origin: "site-limits.json".into(),
            text: OVERLAY.into(),
        }),
    )
    .expect("loads");
    let pump = Arc::new(Pump::default());
    let mut drivers: HashMap<String, Arc<dyn Driver>> = HashMap::new();
    drivers.insert("pump-1".into(), pump.clone());
    // Several kernels in one process stand for endpoint processes here;
    // leases (one owner per physical device, the live endpoints' open
    // operations) need a process each: tether-cli/tests/fleet.rs.
    let mut config = KernelConfig::standard("t");
    config.claim_devices = false;
    let k = Kernel::new(config, cell, drivers, store.clone()).expect("kernel");
    let p = Principal::local_agent();
    let sid = k
        .session_open(&p, SessionOpen::default())
        .await
        .expect("session")["session_id"]
        .as_str()
        .expect("sid")
        .to_owned();
    Endpoint {
        k,
        pump,
        store,
        p,
        sid,
    }
}

impl Endpoint {
    async fn dose(&self, amount: f64) -> Value {
        self.dose_as(amount, None).await
    }

    async fn dose_as(&self, amount: f64, command_id: Option<&str>) -> Value {
        let req = CommandRequest {
            route: tether_kernel::Route::Command,
            session_id: Some(self.sid.clone()),
            device_id: "pump-1".into(),
            capability_id: "x-cap.test.dose.v1".into(),
            resource: None,
            input: json!({"amount": amount}),
            command_id: command_id.map(str::to_owned),
            deadline: None,
            expected_revision: None,
            safe_place_grant: None,
            permit_id: None,
        };
        self.k
            .command(&self.p, req, tether_kernel::CommandOptions::plain())
            .await
            .map(tether_kernel::Answer::into_value)
            .expect("receipt")
    }

    /// What the store's journal holds drawn and not given back.
    fn stored_draws(&self) -> f64 {
        self.store
            .budget_rows_since(0)
            .expect("rows")
            .iter()
            .filter(|r| !r.released)
            .map(|r| r.amount)
            .sum()
    }
}

/// Another endpoint arms or disarms the pump, `after_ms` from now.
fn set_arming(other: &SqliteStore, armed: bool, after_ms: u64, reason: &str) {
    other
        .commit_blocking(Commit {
            latches: vec![tether_kernel::governed::arming_row(
                "pump-1",
                armed,
                json!({"at_ms": tether_core::receipt::now_ms() + after_ms, "reason": reason}),
            )],
            ..Commit::default()
        })
        .expect("arming");
}

fn admitted_entries(store: &dyn Store) -> usize {
    store
        .chain_tail(10_000)
        .expect("tail")
        .iter()
        .filter(|e| e["kind"] == "command.admitted")
        .count()
}

#[tokio::test]
async fn a_draw_made_by_one_kernel_counts_against_the_others_next_command_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = endpoint(dir.path(), "simulated").await;
    let b = endpoint(dir.path(), "simulated").await;
    assert_eq!(a.dose(20.0).await["status"], "completed");
    // B's own ledger has never seen A's draw; the store has.
    let before = admitted_entries(b.store.as_ref());
    let r = b.dose(6.0).await;
    assert_eq!(r["status"], "rejected", "{r}");
    assert_eq!(r["error"]["mhs_code"], "MHS.SAFETY.CUMULATIVE_LIMIT", "{r}");
    let d = &r["error"]["details"];
    assert_eq!(d["used"], json!(20.0), "{r}");
    assert_eq!(d["limit"], json!(25.0), "{r}");
    assert_eq!(d["requested"], json!(6.0), "{r}");
    assert_eq!(d["window"], "rolling_1h", "{r}");
    assert_eq!(d["limit_path"], "amount", "{r}");
    assert_eq!(d["unit"], "mL", "{r}");
    // No side effect: the pump was not called, no admission or draw stored.
    assert_eq!(b.pump.calls.load(Ordering::SeqCst), 0);
    assert_eq!(admitted_entries(b.store.as_ref()), before);
    assert_eq!(b.stored_draws(), 20.0);
    // What is left fits, from either side; then neither draws more.
    assert_eq!(b.dose(5.0).await["status"], "completed");
    let r = a.dose(1.0).await;
    assert_eq!(r["error"]["mhs_code"], "MHS.SAFETY.CUMULATIVE_LIMIT", "{r}");
    assert_eq!(r["error"]["details"]["used"], json!(25.0), "{r}");
    assert_eq!(a.stored_draws(), 25.0);
}

#[tokio::test]
async fn two_kernels_drawing_concurrently_never_exceed_the_budget_together() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = Arc::new(endpoint(dir.path(), "simulated").await);
    let b = Arc::new(endpoint(dir.path(), "simulated").await);
    let mut tasks = Vec::new();
    for i in 0..40 {
        let e = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move { e.dose(2.0).await }));
    }
    let (mut completed, mut refused) = (0, 0);
    for t in tasks {
        let r = t.await.expect("task");
        match r["status"].as_str() {
            Some("completed") => completed += 1,
            _ => {
                assert_eq!(r["error"]["mhs_code"], "MHS.SAFETY.CUMULATIVE_LIMIT", "{r}");
                refused += 1;
            }
        }
    }
    // 25 / 2: twelve doses fit, whichever kernel made them.
    assert_eq!(completed, 12, "{completed} completed, {refused} refused");
    assert_eq!(refused, 28);
    let calls = a.pump.calls.load(Ordering::SeqCst) + b.pump.calls.load(Ordering::SeqCst);
    assert_eq!(calls, 12, "only admitted doses reach a pump");
    assert_eq!(a.stored_draws(), 24.0);
}

#[tokio::test]
async fn draws_given_back_elsewhere_make_room_for_a_kernel_that_counted_them_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = endpoint(dir.path(), "simulated").await;
    assert_eq!(a.dose(20.0).await["status"], "completed");
    // B starts while A's draw stands, so its ledger counts it...
    let b = endpoint(dir.path(), "simulated").await;
    // ...and then the draw is given back in the store (as a refusal after a
    // durable admission does on another endpoint).
    let ids: Vec<String> = a
        .store
        .budget_rows_since(0)
        .expect("rows")
        .into_iter()
        .map(|r| r.reservation_id)
        .collect();
    a.store
        .commit_blocking(Commit {
            budget_releases: ids,
            ..Commit::default()
        })
        .expect("release");
    // The store's journal, not B's start-up copy, decides.
    let r = b.dose(20.0).await;
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(b.stored_draws(), 20.0);
}

#[tokio::test]
async fn a_physical_call_refused_by_a_disarm_made_elsewhere_draws_nothing_from_the_shared_budget() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = endpoint(dir.path(), "hardware").await;
    // Another endpoint disarms the pump. This kernel runs no stop watcher,
    // so it learns of it only by re-reading the store before dispatch.
    let other = SqliteStore::open(dir.path()).expect("store");
    set_arming(&other, false, 1, "elsewhere");
    let r = b.dose(10.0).await;
    assert_eq!(r["error"]["mhs_code"], "MHS.AUTH.HARDWARE_DISABLED", "{r}");
    assert_eq!(b.pump.calls.load(Ordering::SeqCst), 0);
    let rows = other.budget_rows_since(0).expect("rows");
    assert!(
        rows.iter().all(|r| r.released),
        "nothing drawn stays: {rows:?}"
    );
    assert!(other.open_ops().expect("open ops").is_empty());
    // So the whole budget is there for the next call, on any endpoint (an
    // operator armed the pump again meanwhile).
    set_arming(&other, true, 2, "shift start");
    let a = endpoint(dir.path(), "hardware").await;
    let r = a.dose(25.0).await;
    assert_eq!(r["status"], "completed", "{r}");
}

/// The stop is read again right before dispatch, once the admission is
/// durable: a disarm another endpoint makes while this one's admission waits
/// for the store refuses the call, although the read before the admission
/// let it through, and what it drew is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disarm_made_elsewhere_while_the_admission_is_written_refuses_the_call() {
    let dir = tempfile::tempdir().expect("tempdir");
    let faulty = Arc::new(FaultyStore::new(Arc::new(
        SqliteStore::open(dir.path()).expect("store"),
    )));
    let b = Arc::new(endpoint_on(faulty.clone(), "hardware").await);
    let r = b.dose(5.0).await;
    assert_eq!(r["status"], "completed", "{r}");

    // The next admission waits, as for a database another process holds.
    faulty.hold_writes.store(true, Ordering::SeqCst);
    let call = {
        let b = Arc::clone(&b);
        tokio::spawn(async move { b.dose(10.0).await })
    };
    for _ in 0..500 {
        if faulty.held_commits.load(Ordering::SeqCst) > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        faulty.held_commits.load(Ordering::SeqCst),
        1,
        "the admission waits"
    );
    let other = SqliteStore::open(dir.path()).expect("store");
    set_arming(&other, false, 1, "elsewhere");
    faulty.hold_writes.store(false, Ordering::SeqCst);
    let r = call.await.expect("call");
    assert_eq!(r["error"]["mhs_code"], "MHS.AUTH.HARDWARE_DISABLED", "{r}");
    assert_eq!(b.pump.calls.load(Ordering::SeqCst), 1, "only the first ran");
    // Refused after its admission was durable: the admission is on record,
    // its open operation closed and its draw given back.
    assert_eq!(admitted_entries(&other), 2);
    assert!(other.open_ops().expect("open ops").is_empty());
    let drawn = b.stored_draws();
    assert!(
        (drawn - 5.0).abs() < 1e-9,
        "only the first dose counts: {drawn}"
    );
}

/// A simulated call that draws a budget has its admission made durable
/// before dispatch; killed before its receipt, the next start must record
/// the id's outcome (`unknown`), so a resend replays it and never runs or
/// draws again (found by the SIGKILL campaign: the admitted id had no
/// outcome, and its resend collided with its own stored draw).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budgeted_call_killed_before_its_receipt_is_unknown_after_a_restart_and_never_runs_again()
{
    let dir = tempfile::tempdir().expect("tempdir");
    const ID: &str = "01BUDGETKILLED000000000001";
    {
        let a = Arc::new(endpoint(dir.path(), "simulated").await);
        // A call that completes leaves no open operation behind.
        assert_eq!(a.dose(2.0).await["status"], "completed");
        assert!(a.store.open_ops().expect("ops").is_empty());
        a.pump.hang.store(true, Ordering::SeqCst);
        let running = {
            let a = a.clone();
            tokio::spawn(async move { a.dose_as(3.0, Some(ID)).await })
        };
        let t0 = std::time::Instant::now();
        while a.pump.calls.load(Ordering::SeqCst) < 2 {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(10),
                "never dispatched"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        // While it runs, its start is on the far side: the open operation.
        let ops = a.store.open_ops().expect("ops");
        assert_eq!(
            ops.iter()
                .map(|o| o.command_id.as_str())
                .collect::<Vec<_>>(),
            [ID]
        );
        // The "kill": the call never finishes and this endpoint is gone.
        running.abort();
    }
    let b = endpoint(dir.path(), "simulated").await;
    let row = b
        .store
        .receipt(ID)
        .expect("read")
        .expect("an outcome for the killed id");
    assert_eq!(row.receipt["status"], "unknown", "{}", row.receipt);
    assert_eq!(
        row.receipt["error"]["details"]["reason"],
        "endpoint_crashed"
    );
    assert!(b.store.open_ops().expect("ops").is_empty());
    let again = b.dose_as(3.0, Some(ID)).await;
    assert_eq!(again["status"], "unknown", "{again}");
    assert_eq!(again["replayed"], true, "{again}");
    assert_eq!(b.pump.calls.load(Ordering::SeqCst), 0, "never run again");
    // Its draw stays counted (it may have dosed), never drawn twice.
    assert_eq!(b.stored_draws(), 5.0);
}
