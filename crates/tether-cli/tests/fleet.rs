//! Endpoints of one fleet on one store (the SQLite store of one state
//! directory here; `postgres_fleet.rs` does it on PostgreSQL): a physical
//! device has one owner at a time, a second endpoint configured with it is
//! refused naming the owner (or waits with `--wait-for-devices`), a dead
//! owner's device passes to the next endpoint, which reconciles the motion
//! the dead one left; an endpoint starting beside a running one leaves its
//! operations alone; `tether fleet status` shows it all; an e-stop naming a
//! device another endpoint serves latches it there.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

use common::*;
use serde_json::{json, Value};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

const ARM: &str = "arm-1";

/// A config serving the built-in arm as a `hardware` device, with a
/// policy that lets its motions run without an approval (the default holds
/// a hardware motion for an operator).
fn hardware_arm_config(dir: &Path) -> PathBuf {
    let manifest = as_hardware(include_str!("../../tether-drivers/cell/arm-1.toml"));
    std::fs::write(dir.join("arm-hw.toml"), manifest).expect("manifest");
    std::fs::write(
        dir.join("allow.cedar"),
        "permit(principal, action, resource);\n",
    )
    .expect("policy");
    let cfg = dir.join("tether.toml");
    std::fs::write(
        &cfg,
        "devices = [\"arm-hw.toml\"]\npolicy = \"allow.cedar\"\n",
    )
    .expect("config");
    cfg
}

const AGENT: &str = "fleet-agent-token";
const OPERATOR: &str = "fleet-operator-token";

fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

/// [`hardware_arm_config`] with an agent and an operator, so a hardware
/// motion (R2: it needs an operator's approval) can run.
fn hardware_arm_config_with_operator(dir: &Path) -> PathBuf {
    let cfg = hardware_arm_config(dir);
    let mut text = std::fs::read_to_string(&cfg).expect("config");
    text.push_str(&format!(
        "\n[[principals]]\nid = \"planner\"\nkind = \"agent\"\ntoken_sha256 = \"{}\"\n\n[[principals]]\nid = \"olga\"\nkind = \"human\"\nroles = [\"operator\"]\ntoken_sha256 = \"{}\"\n",
        sha256_hex(AGENT),
        sha256_hex(OPERATOR)
    ));
    std::fs::write(&cfg, text).expect("config");
    cfg
}

fn result(s: &Server, token: &str, method: &str, params: Value) -> Value {
    let r = call_with_token(s, token, method, params);
    assert!(r.get("error").is_none(), "{method}: {r}");
    r["result"].clone()
}

/// A session of the agent, and its long motion `id` approved by the
/// operator (the agent's first try is held; the retry runs).
fn approved_move(s: &Server, id: &str) -> (String, Value) {
    let sid = result(s, AGENT, "mhs.session.open", json!({}))["session_id"]
        .as_str()
        .expect("session")
        .to_owned();
    let cmd = long_move(&sid, id);
    let first = result(s, AGENT, "mhs.command", cmd.clone());
    let d = assert_rejected(&first, "MHS.SAFETY.APPROVAL_REQUIRED");
    let approval = d["approval_id"].as_str().expect("approval").to_owned();
    let decided = result(
        s,
        OPERATOR,
        "mhs.approvals.decide",
        json!({"approval_id": approval, "decision": "approve", "reason": "fleet test"}),
    );
    assert_eq!(decided["status"], "approved", "{decided}");
    (sid, cmd)
}

fn fleet_status(state: &Path) -> Value {
    let run = tether(&[
        OsStr::new("fleet"),
        OsStr::new("status"),
        OsStr::new("--json"),
        OsStr::new("--state-dir"),
        state.as_os_str(),
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    serde_json::from_str(&run.stdout_text()).expect("status JSON")
}

fn live_endpoints(status: &Value) -> Vec<Value> {
    status["endpoints"]
        .as_array()
        .expect("endpoints")
        .iter()
        .filter(|e| e["live"] == true)
        .cloned()
        .collect()
}

fn long_move(sid: &str, id: &str) -> Value {
    json!({"session_id": sid, "device_id": ARM, "capability_id": "cap.motion.move_to.v1", "input": {"joints": [1.0, 0, 0, 0, 0, 0], "speed": 0.5}, "command_id": id})
}

fn send_in_background(
    s: &Server,
    cmd: &Value,
    timeout: Duration,
) -> std::thread::JoinHandle<HttpResponse> {
    let body =
        json!({"jsonrpc": "2.0", "id": 1, "method": "mhs.command", "params": cmd}).to_string();
    let addr = s.addr();
    std::thread::spawn(move || http_post(addr, body.as_bytes(), timeout))
}

fn wait_moving(s: &Server, sid: &str) {
    poll_until("the arm to move", Duration::from_secs(10), || {
        s.read(sid, ARM, "joints")["state"]["positions"][0]
            .as_f64()
            .is_some_and(|x| x > 0.0)
    });
}

/// One owner per physical device: a second endpoint with the same hardware
/// device is refused, naming the owner; when the owner dies (SIGKILL,
/// mid-motion) the next endpoint takes the device at once (a dead process
/// of this host), reconciles the motion as `unknown` before it serves, and
/// never runs it again.
#[test]
fn a_second_owner_is_refused_and_the_next_owner_reconciles_a_dead_owners_motion() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let cfg = hardware_arm_config_with_operator(dir.path());
    let mut owner = start_with_config(dir.path(), &cfg);

    // The fleet as the store holds it: one live endpoint, owning the arm.
    let status = fleet_status(&state);
    let live = live_endpoints(&status);
    assert_eq!(live.len(), 1, "{status}");
    assert_eq!(live[0]["pid"], owner.pid(), "{status}");
    let owners = status["device_owners"].as_array().expect("owners");
    assert_eq!(owners.len(), 1, "{status}");
    assert_eq!(owners[0]["device_id"], ARM);
    assert_eq!(owners[0]["live"], true);

    // A second endpoint with the same hardware arm: refused at start-up.
    let second = tether(&[
        OsStr::new("serve"),
        OsStr::new("--config"),
        cfg.as_os_str(),
        OsStr::new("--state-dir"),
        state.as_os_str(),
        OsStr::new("--http"),
        OsStr::new("127.0.0.1:0"),
    ]);
    assert_eq!(second.code, Some(2), "{}", second.stderr);
    assert!(
        second.stderr.contains("`arm-1` is owned by"),
        "{}",
        second.stderr
    );
    assert!(
        second.stderr.contains(&format!("pid {}", owner.pid())),
        "{}",
        second.stderr
    );

    // The owner dies mid-motion.
    let (sid, cmd) = approved_move(&owner, "fleet-move-1");
    let body =
        json!({"jsonrpc": "2.0", "id": 1, "method": "mhs.command", "params": cmd}).to_string();
    let addr = owner.addr();
    let sender = std::thread::spawn(move || {
        let auth = format!("Authorization: Bearer {AGENT}\r\n");
        http_post_with(addr, body.as_bytes(), Duration::from_secs(5), &auth)
    });
    poll_until("the arm to move", Duration::from_secs(10), || {
        result(
            &owner,
            AGENT,
            "mhs.resource.read",
            json!({"session_id": sid, "device_id": ARM, "resource": "joints"}),
        )["state"]["positions"][0]
            .as_f64()
            .is_some_and(|x| x > 0.0)
    });
    let before = fleet_status(&state);
    let ops = before["open_operations"].as_array().expect("ops");
    assert_eq!(ops.len(), 1, "{before}");
    assert_eq!(ops[0]["command_id"], "fleet-move-1");
    owner.kill();
    let _ = sender.join();

    // The next endpoint takes the arm at once and reconciles the motion.
    let next = start_with_config(dir.path(), &cfg);
    let after = fleet_status(&state);
    assert!(
        after["open_operations"]
            .as_array()
            .is_some_and(Vec::is_empty),
        "{after}"
    );
    let live = live_endpoints(&after);
    assert_eq!(live.len(), 1, "{after}");
    assert_eq!(live[0]["pid"], next.pid(), "{after}");
    let sid = result(&next, AGENT, "mhs.session.open", json!({}))["session_id"]
        .as_str()
        .expect("session")
        .to_owned();
    let again = result(&next, AGENT, "mhs.command", long_move(&sid, "fleet-move-1"));
    assert_eq!(again["replayed"], true, "{again}");
    assert_eq!(again["status"], "unknown", "{again}");
}

/// `--wait-for-devices`: a second endpoint waits for the owner instead of
/// refusing, and starts once the owner stops in order (it gives its
/// leases up).
#[test]
fn a_start_told_to_wait_for_its_devices_starts_when_the_owner_stops() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let cfg = hardware_arm_config(dir.path());
    let mut owner = start_with_config(dir.path(), &cfg);
    let waiter = {
        let (cfg, state) = (cfg.clone(), state.clone());
        std::thread::spawn(move || {
            Server::start_with(
                Transport::Http,
                Some(&state),
                &[
                    OsStr::new("--config"),
                    cfg.as_os_str(),
                    OsStr::new("--wait-for-devices=60"),
                ],
            )
        })
    };
    // Long enough for the waiter to have found the arm owned.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!waiter.is_finished(), "the second endpoint must wait");
    let status = owner.terminate().expect("the owner exits");
    assert!(status.success(), "{status:?}");
    let next = waiter.join().expect("the waiting endpoint starts");
    assert_eq!(next.status_of(ARM)["mode"], "hardware");
    let live = live_endpoints(&fleet_status(&state));
    assert_eq!(live.len(), 1);
    assert_eq!(live[0]["pid"], next.pid());
}

/// Two endpoints on one state directory, both serving the simulated cell:
/// the second one's start leaves the first one's running motion alone (it
/// is alive: its lease holds), so the motion completes, and its id replays
/// `completed` on either.
#[test]
fn an_endpoint_starting_beside_a_running_motion_leaves_it_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let a = Server::start(Transport::Http, Some(&state));
    let sid = a.session();
    let cmd = long_move(&sid, "beside-move-1");
    let sender = send_in_background(&a, &cmd, Duration::from_secs(60));
    wait_moving(&a, &sid);
    let b = Server::start(Transport::Http, Some(&state));
    let answer = sender.join().expect("sender").json();
    assert_eq!(answer["result"]["status"], "completed", "{answer}");
    let sid_b = b.session();
    let again = b.command(long_move(&sid_b, "beside-move-1"));
    assert_eq!(again["replayed"], true, "{again}");
    assert_eq!(again["status"], "completed", "{again}");
    assert_eq!(live_endpoints(&fleet_status(&state)).len(), 2);
}

/// An e-stop naming a device only another endpoint serves latches it
/// there: the trip goes through the store and the owner obeys it.
#[test]
fn an_estop_naming_a_device_another_endpoint_serves_latches_it_there() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let cfg = hardware_arm_config(dir.path());
    let owner = start_with_config(dir.path(), &cfg);
    // An endpoint serving only the thermostat.
    let thermo = dir.path().join("thermo.toml");
    std::fs::write(
        dir.path().join("thermo-dev.toml"),
        include_str!("../../tether-drivers/cell/thermostat-1.toml"),
    )
    .expect("manifest");
    std::fs::write(&thermo, "devices = [\"thermo-dev.toml\"]\n").expect("config");
    let other = Server::start_with(
        Transport::Http,
        Some(&state),
        &[OsStr::new("--config"), thermo.as_os_str()],
    );
    // It learned the fleet's devices from the leases at its start.
    let stop = other.call(
        "mhs.safety.estop",
        json!({"device_id": ARM, "reason": "fleet stop test"}),
    );
    let result = &stop["result"];
    assert_eq!(result["output"]["scope"], "fleet", "{stop}");
    assert_eq!(result["output"]["latch_durable"], true, "{stop}");
    assert_eq!(
        result["output"]["served_by"][0]["served_by"], "tether-local",
        "{stop}"
    );
    poll_until("the owner to latch the arm", Duration::from_secs(5), || {
        owner.status_of(ARM)["latched"] == true
    });
    // The thermostat here was not stopped.
    assert_eq!(other.status_of("thermostat-1")["latched"], false);
}

/// `TETHER_LOG_FORMAT=json`: every log line on stderr is one JSON object
/// (here the warning of a start waiting for a device another endpoint owns,
/// then its refusal when the wait runs out).
#[test]
fn json_logs_are_one_object_a_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let cfg = hardware_arm_config(dir.path());
    let _owner = start_with_config(dir.path(), &cfg);
    let out = std::process::Command::new(BIN)
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--wait-for-devices=1",
            "--config",
        ])
        .arg(&cfg)
        .arg("--state-dir")
        .arg(&state)
        .env("TETHER_LOG_FORMAT", "json")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("serve");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let logs: Vec<Value> = stderr
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let waiting = logs
        .iter()
        .find(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("waiting for a device"))
        })
        .unwrap_or_else(|| panic!("no JSON warning in {stderr}"));
    assert_eq!(waiting["level"], "WARN", "{waiting}");
    assert!(
        waiting["fields"]["owner"]
            .as_str()
            .is_some_and(|o| o.contains("tether-local")),
        "{waiting}"
    );
}
