//! The Modbus heater of `examples/modbus-heater/`, end to end: a real
//! pymodbus server plays the heater (`heater.py`, which logs every write it
//! receives), the real `tether` binary serves the example's config (its
//! address rewritten to a free port), and every assertion about the device is
//! made on the device's side — its write log and its registers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "common/peers.rs"]
mod peers;

use common::mcp_http::*;
use common::*;
use serde_json::{json, Value};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const OPERATOR: &str = "operator-token-modbus-test";
const AGENT: &str = "agent-token-modbus-test";
const DEVICE: &str = "heater-1";

/// The heater peer (its log, status and control files in the test's dir).
struct Heater(peers::Peer);

impl std::ops::Deref for Heater {
    type Target = peers::Peer;
    fn deref(&self) -> &peers::Peer {
        &self.0
    }
}

impl Heater {
    fn start(dir: &Path, port: u16) -> Heater {
        let args = [
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--unit",
            "1",
        ]
        .map(str::to_owned);
        Heater(peers::Peer::start(
            "examples/modbus-heater/heater.py",
            &args,
            dir,
            "heater",
            port,
        ))
    }

    /// Writes the device received, watchdog feeds (holding 10) left out.
    fn command_writes(&self) -> Vec<Value> {
        self.lines()
            .into_iter()
            .filter(|l| l["kind"] == "write" && !(l["table"] == "holding" && l["address"] == 10))
            .collect()
    }

    fn feeds(&self) -> usize {
        self.lines()
            .iter()
            .filter(|l| l["kind"] == "write" && l["table"] == "holding" && l["address"] == 10)
            .count()
    }

    fn registers(&self) -> Value {
        self.status()["registers"].clone()
    }

    fn stop(&mut self) {
        self.0.stop();
    }
}

/// The example's config and manifest copied into `dir`, the heater's
/// address rewritten to `port`; answers the config's path.
fn example_config(dir: &Path, port: u16) -> PathBuf {
    let src = peers::package_dir().join("../../examples/modbus-heater");
    let cfg = std::fs::read_to_string(src.join("tether.toml")).unwrap();
    let manifest = std::fs::read_to_string(src.join("heater-1.toml"))
        .unwrap()
        .replace("127.0.0.1:5020", &format!("127.0.0.1:{port}"));
    std::fs::write(dir.join("heater-1.toml"), manifest).unwrap();
    let path = dir.join("tether.toml");
    std::fs::write(&path, cfg).unwrap();
    path
}

fn start_tether(dir: &Path, cfg: &Path, mcp: bool) -> Server {
    let mut extra = vec![OsStr::new("--config"), cfg.as_os_str()];
    if mcp {
        extra.extend([OsStr::new("--mcp-http"), OsStr::new("127.0.0.1:0")]);
    }
    Server::start_with_env(
        Transport::Http,
        Some(&dir.join("state")),
        &extra,
        &[
            ("TETHER_OPERATOR_TOKEN", OPERATOR),
            ("TETHER_AGENT_TOKEN", AGENT),
        ],
    )
}

fn ok_as(s: &Server, token: &str, method: &str, params: Value) -> Value {
    let a = call_with_token(s, token, method, params.clone());
    assert!(a.get("error").is_none(), "{method} {params}: {a}");
    a["result"].clone()
}

fn session_as(s: &Server, token: &str) -> String {
    ok_as(s, token, "mhs.session.open", json!({}))["session_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn setpoint(s: &Server, sid: &str, t: f64) -> Value {
    ok_as(
        s,
        AGENT,
        "mhs.command",
        json!({"session_id": sid, "device_id": DEVICE, "capability_id": "cap.thermal.setpoint.v1",
               "resource": "main", "input": {"target_temperature": t}}),
    )
}

fn read_state(s: &Server, sid: &str) -> Value {
    call_with_token(
        s,
        AGENT,
        "mhs.resource.read",
        json!({"session_id": sid, "device_id": DEVICE, "resource": "main"}),
    )
}

/// Waits until the endpoint reads the heater (its mirror is fresh).
fn wait_readable(s: &Server, sid: &str) {
    poll_until("the heater's state to be readable", TIMEOUT, || {
        read_state(s, sid).get("result").is_some()
    });
}

struct Rig {
    _dir: tempfile::TempDir,
    heater: Heater,
    tether: Server,
    sid: String,
}

fn rig(mcp: bool) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let port = peers::free_port();
    let heater = Heater::start(dir.path(), port);
    let cfg = example_config(dir.path(), port);
    let tether = start_tether(dir.path(), &cfg, mcp);
    let sid = session_as(&tether, AGENT);
    wait_readable(&tether, &sid);
    Rig {
        _dir: dir,
        heater,
        tether,
        sid,
    }
}

#[test]
fn an_in_limit_setpoint_reaches_the_heater_once_in_the_declared_order() {
    let r = rig(false);
    let receipt = setpoint(&r.tether, &r.sid, 42.5);
    assert_eq!(receipt["status"], "completed", "{receipt}");
    let writes = r.heater.command_writes();
    assert_eq!(
        writes.len(),
        2,
        "exactly the target's two writes: {writes:?}"
    );
    assert_eq!(
        (writes[0]["fc"].as_u64(), writes[0]["address"].as_u64()),
        (Some(6), Some(0))
    );
    assert_eq!(
        writes[0]["values"],
        json!([425]),
        "42.5 degC at 0.1 degC per count"
    );
    assert_eq!(
        (writes[1]["fc"].as_u64(), writes[1]["values"].clone()),
        (Some(5), json!([true]))
    );
    poll_until("the heater to show the setpoint", TIMEOUT, || {
        r.heater.registers()["holding0"] == 425 && r.heater.registers()["coil0"] == true
    });
    // The endpoint reads it back in declared units.
    poll_until("the read to show the new setpoint", TIMEOUT, || {
        let st = read_state(&r.tether, &r.sid);
        st["result"]["state"]["setpoint"] == 42.5 && st["result"]["state"]["enabled"] == true
    });
    // The watchdog is fed while the heater is enabled.
    let before = r.heater.feeds();
    std::thread::sleep(Duration::from_millis(1200));
    assert!(
        r.heater.feeds() >= before + 2,
        "fed at least twice per period"
    );
    assert!(
        r.heater.events("watchdog_trip").is_empty(),
        "the heater's watchdog never tripped while fed"
    );
    assert_eq!(r.heater.registers()["coil0"], true);
}

#[test]
fn out_of_limit_off_grid_interlocked_and_latched_commands_write_nothing() {
    let r = rig(false);
    let too_hot = setpoint(&r.tether, &r.sid, 95.0);
    assert_eq!(too_hot["status"], "rejected", "{too_hot}");
    let off_grid = call_with_token(
        &r.tether,
        AGENT,
        "mhs.command",
        json!({"session_id": r.sid, "device_id": DEVICE, "capability_id": "cap.thermal.setpoint.v1",
               "resource": "main", "input": {"target_temperature": 21.55}}),
    );
    assert!(
        off_grid.get("error").is_some() || off_grid["result"]["status"] == "rejected",
        "21.55 is not on the 0.1 degC grid: {off_grid}"
    );
    r.heater.control(json!({"lid": "open"}));
    std::thread::sleep(Duration::from_millis(300));
    let lid_open = setpoint(&r.tether, &r.sid, 30.0);
    assert_rejected(&lid_open, "MHS.SAFETY.INTERLOCK_OPEN");
    r.heater.control(json!({"lid": "closed"}));
    std::thread::sleep(Duration::from_millis(300));
    ok_as(
        &r.tether,
        OPERATOR,
        "mhs.safety.estop",
        json!({"device_id": DEVICE, "reason": "test"}),
    );
    let stop_writes = r.heater.command_writes();
    assert_eq!(
        stop_writes.len(),
        1,
        "only the native stop wrote: {stop_writes:?}"
    );
    assert_eq!(stop_writes[0]["values"], json!([false]));
    let latched = setpoint(&r.tether, &r.sid, 30.0);
    assert_eq!(latched["status"], "rejected", "{latched}");
    assert_eq!(
        r.heater.command_writes().len(),
        1,
        "nothing written after the latch"
    );
    assert_eq!(r.heater.registers()["holding0"], 0);
}

#[test]
fn the_estop_reaches_the_heater_while_a_command_is_in_flight() {
    let r = rig(false);
    // The setpoint register answers 800 ms late: the command is in flight.
    r.heater
        .control(json!({"write_delay_ms": {"holding:0": 800}}));
    let addr = r.tether.addr();
    let sid = r.sid.clone();
    let cmd = std::thread::spawn(move || {
        let body = json!({"jsonrpc": "2.0", "id": 9, "method": "mhs.command", "params": {
            "session_id": sid, "device_id": DEVICE, "capability_id": "cap.thermal.setpoint.v1",
            "resource": "main", "input": {"target_temperature": 60.0}}});
        http_post_with(
            addr,
            body.to_string().as_bytes(),
            TIMEOUT,
            &format!("Authorization: Bearer {AGENT}\r\n"),
        )
        .json()
    });
    poll_until("the setpoint write to arrive", TIMEOUT, || {
        !r.heater.command_writes().is_empty()
    });
    let asked = SystemClock::now_ms();
    ok_as(
        &r.tether,
        OPERATOR,
        "mhs.safety.estop",
        json!({"device_id": DEVICE, "reason": "in flight"}),
    );
    let answered = cmd.join().unwrap();
    let writes = r.heater.command_writes();
    let stop = writes
        .iter()
        .find(|w| w["fc"] == 5 && w["values"] == json!([false]))
        .unwrap_or_else(|| panic!("no stop write: {writes:?}"));
    let latency = stop["t_ms"].as_f64().unwrap() - asked;
    assert!(
        latency < 500.0,
        "the stop reached the heater {latency} ms after the e-stop was asked"
    );
    assert!(
        !writes
            .iter()
            .any(|w| w["fc"] == 5 && w["values"] == json!([true])),
        "the command never enabled the heater after the stop: {writes:?}"
    );
    assert_ne!(answered["result"]["status"], "completed", "{answered}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(r.heater.registers()["coil0"], false);
}

/// Wall-clock ms, as the heater's log stamps them.
struct SystemClock;
impl SystemClock {
    fn now_ms() -> f64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
            * 1000.0
    }
}

#[test]
fn kill_9_of_tether_leaves_the_heater_to_its_own_watchdog() {
    let mut r = rig(false);
    let receipt = setpoint(&r.tether, &r.sid, 35.0);
    assert_eq!(receipt["status"], "completed", "{receipt}");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        r.heater.registers()["coil0"],
        true,
        "fed, the heater stays enabled"
    );
    let killed = Instant::now();
    let killed_ms = SystemClock::now_ms();
    r.tether.kill();
    poll_until(
        "the heater's watchdog to clear coil 0",
        Duration::from_secs(5),
        || r.heater.registers()["coil0"] == false,
    );
    let trip = r.heater.events("watchdog_trip");
    assert_eq!(trip.len(), 1, "{trip:?}");
    let after = trip[0]["t_ms"].as_f64().unwrap() - killed_ms;
    eprintln!(
        "kill -9 -> heater stopped by its watchdog after {after:.0} ms (observed {:?})",
        killed.elapsed()
    );
    assert!(
        after <= 1000.0 + 1000.0,
        "the watchdog period (1000 ms) and a margin: {after} ms"
    );
}

#[test]
fn a_refusing_slow_or_absent_heater_gets_clear_answers_and_the_estop_still_latches() {
    let mut r = rig(false);
    // A Modbus exception: failed, with the native code, nothing written.
    r.heater.control(json!({"exception": {"holding:0": 4}}));
    let refused = setpoint(&r.tether, &r.sid, 30.0);
    assert_eq!(refused["status"], "failed", "{refused}");
    assert_eq!(
        refused["error"]["details"]["native"]["exception_code"], 4,
        "{refused}"
    );
    assert_eq!(
        r.heater.registers()["holding0"],
        0,
        "the device changed nothing"
    );
    assert!(
        !r.heater.command_writes().iter().any(|w| w["fc"] == 5),
        "the enable coil was never written after the refused setpoint"
    );
    // A silent device: reads go unknown once the mirror is stale, and the
    // gated setpoint is refused (an unknown interlock blocks).
    r.heater.control(json!({"silent": true}));
    std::thread::sleep(Duration::from_millis(1300));
    let unknown = read_state(&r.tether, &r.sid);
    assert!(
        unknown.get("error").is_some() || unknown["result"]["status"] != "completed",
        "{unknown}"
    );
    let blocked = setpoint(&r.tether, &r.sid, 30.0);
    assert_eq!(blocked["status"], "rejected", "{blocked}");
    // Down altogether: the endpoint keeps serving, the e-stop latches.
    r.heater.stop();
    let status = ok_as(
        &r.tether,
        OPERATOR,
        "mhs.safety.estop",
        json!({"device_id": DEVICE, "reason": "peer down"}),
    );
    assert!(status.to_string().contains(DEVICE), "{status}");
    let st = ok_as(
        &r.tether,
        OPERATOR,
        "mhs.safety.status",
        json!({"device_id": DEVICE}),
    );
    assert!(
        st["devices"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["device_id"] == DEVICE && d["latched"] == true),
        "{st}"
    );
    // The peer returns: reads reconcile, the latch holds until a reset.
    let dir = r.heater.dir.clone();
    let port = r.heater.port;
    r.heater.clear_control();
    let back = Heater::start(&dir, port);
    wait_readable(&r.tether, &r.sid);
    let still = setpoint(&r.tether, &r.sid, 30.0);
    assert_eq!(still["status"], "rejected", "the latch holds: {still}");
    drop(back);
}

#[test]
fn probe_prints_every_mapped_point_in_declared_units_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let port = peers::free_port();
    let heater = Heater::start(dir.path(), port);
    let cfg = example_config(dir.path(), port);
    let run = tether(&[
        OsStr::new("probe"),
        OsStr::new(DEVICE),
        OsStr::new("--config"),
        cfg.as_os_str(),
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let out = run.stdout_text();
    for needle in [
        "main.setpoint",
        "holding:0",
        "main.temperature",
        "input:0",
        "20",
        "degC",
        "interlock lid",
        "closed",
        "watchdog",
    ] {
        assert!(out.contains(needle), "`{needle}` in:\n{out}");
    }
    assert!(
        heater.lines().iter().all(|l| l["kind"] != "write"),
        "probe wrote nothing"
    );
}

#[test]
fn check_reports_every_mapping_defect_with_file_device_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = example_config(dir.path(), 5020);
    // `tether check` reads token variables; this config names none.
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, &text[..text.find("[[principals]]").unwrap()]).unwrap();
    let path = dir.path().join("heater-1.toml");
    let broken = std::fs::read_to_string(&path)
        .unwrap()
        .replace(
            "table = \"input\", address = 0",
            "table = \"inputs\", address = 0",
        )
        .replace(
            "type = \"i16\", scale = 0.1, unit = \"degC\" }\ntemperature",
            "type = \"u16\", scale = 0.001, unit = \"mL\" }\ntemperature",
        )
        .replace(
            "configure = [{ field = \"setpoint\", input = \"setpoint\" }]",
            "configure = []",
        )
        .replace(
            "lid = { table = \"discrete\", address = 0, closed = true }",
            "lid = { table = \"discrete\", address = 0 }",
        );
    std::fs::write(&path, broken).unwrap();
    check_names_defects(
        &cfg,
        &path,
        DEVICE,
        &[
            ("driver_config.fields.main.temperature.table", "inputs"),
            ("driver_config.fields.main.setpoint.unit", "mL"),
            ("driver_config.targets.configure", "no writes"),
            ("driver_config.interlocks.lid.closed", "closed"),
        ],
    );
}

#[test]
fn a_model_over_mcp_moves_the_heater_and_an_out_of_limit_call_writes_nothing() {
    let r = rig(true);
    let addr = mcp_addr(&r.tether);
    let sid = mcp_session(addr, AGENT);
    let call = |id: u64, t: f64| {
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "heater-1__setpoint", "arguments": {"target_temperature": t}}});
        mcp_post(addr, AGENT, Some(&sid), &msg).0
    };
    let refused = call(2, 120.0);
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    assert!(
        r.heater.command_writes().is_empty(),
        "an out-of-limit call writes nothing"
    );
    let done = call(3, 55.5);
    assert_ne!(done["result"]["isError"], true, "{done}");
    let writes = r.heater.command_writes();
    assert_eq!(writes.len(), 2, "{writes:?}");
    assert_eq!(writes[0]["values"], json!([555]));
    assert_eq!(writes[1]["values"], json!([true]));
}
