//! The OPC UA oven of `examples/opcua-oven/`, end to end: a real asyncua
//! server plays the oven (`oven.py`, which logs every write and method call
//! it receives), the real `tether` binary serves the example's config (its
//! endpoint rewritten to a free port), and every assertion about the device
//! is made on the device's side — its log and its variables.
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

const OPERATOR: &str = "operator-token-opcua-test";
const AGENT: &str = "agent-token-opcua-test";
const DEVICE: &str = "oven-1";
const NS: &str = "nsu=urn:tether:example:oven;s=";

/// The oven peer (its log, status and control files in the test's dir).
struct Oven(peers::Peer);

impl std::ops::Deref for Oven {
    type Target = peers::Peer;
    fn deref(&self) -> &peers::Peer {
        &self.0
    }
}

impl Oven {
    fn start(dir: &Path, port: u16, extra: &[&str]) -> Oven {
        let mut args: Vec<String> = ["--host", "127.0.0.1", "--port", &port.to_string()]
            .map(str::to_owned)
            .to_vec();
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        Oven(peers::Peer::start(
            "examples/opcua-oven/oven.py",
            &args,
            dir,
            "oven",
            port,
        ))
    }

    /// Client writes and calls the oven received, watchdog feeds left out.
    fn commands(&self) -> Vec<Value> {
        self.lines()
            .into_iter()
            .filter(|l| {
                (l["kind"] == "write" && l["node"] != "Oven.Watchdog") || l["kind"] == "call"
            })
            .collect()
    }

    fn feeds(&self) -> usize {
        self.lines()
            .iter()
            .filter(|l| l["kind"] == "write" && l["node"] == "Oven.Watchdog")
            .count()
    }

    fn values(&self) -> Value {
        self.status()["values"].clone()
    }
}

/// The example's config and manifest copied into `dir`, the endpoint
/// rewritten to `port`; answers the config's path.
fn example_config(dir: &Path, port: u16) -> PathBuf {
    let src = peers::package_dir().join("../../examples/opcua-oven");
    let cfg = std::fs::read_to_string(src.join("tether.toml")).unwrap();
    let manifest = std::fs::read_to_string(src.join("oven-1.toml"))
        .unwrap()
        .replace("127.0.0.1:4840", &format!("127.0.0.1:{port}"));
    std::fs::write(dir.join("oven-1.toml"), manifest).unwrap();
    let path = dir.join("tether.toml");
    std::fs::write(&path, cfg).unwrap();
    path
}

fn start_tether(dir: &Path, cfg: &Path, mcp: bool, env: &[(&str, &str)]) -> Server {
    let mut extra = vec![OsStr::new("--config"), cfg.as_os_str()];
    if mcp {
        extra.extend([OsStr::new("--mcp-http"), OsStr::new("127.0.0.1:0")]);
    }
    let mut vars = vec![
        ("TETHER_OPERATOR_TOKEN", OPERATOR),
        ("TETHER_AGENT_TOKEN", AGENT),
    ];
    vars.extend_from_slice(env);
    Server::start_with_env(Transport::Http, Some(&dir.join("state")), &extra, &vars)
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

/// Waits until the endpoint reads the oven (its mirror is fresh).
fn wait_readable(s: &Server, sid: &str) {
    poll_until("the oven's state to be readable", TIMEOUT, || {
        read_state(s, sid).get("result").is_some()
    });
}

fn estop(s: &Server, reason: &str) -> Value {
    ok_as(
        s,
        OPERATOR,
        "mhs.safety.estop",
        json!({"device_id": DEVICE, "reason": reason}),
    )
}

/// Wall-clock ms, as the oven's log stamps them.
fn now_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1000.0
}

struct Rig {
    _dir: tempfile::TempDir,
    oven: Oven,
    tether: Server,
    sid: String,
}

fn rig(mcp: bool) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let port = peers::free_port();
    let oven = Oven::start(dir.path(), port, &[]);
    let cfg = example_config(dir.path(), port);
    let tether = start_tether(dir.path(), &cfg, mcp, &[]);
    let sid = session_as(&tether, AGENT);
    wait_readable(&tether, &sid);
    Rig {
        _dir: dir,
        oven,
        tether,
        sid,
    }
}

#[test]
fn an_in_limit_setpoint_reaches_the_oven_once_in_the_declared_order() {
    let r = rig(false);
    let receipt = setpoint(&r.tether, &r.sid, 180.5);
    assert_eq!(receipt["status"], "completed", "{receipt}");
    let cmds = r.oven.commands();
    assert_eq!(cmds.len(), 2, "exactly the target's two writes: {cmds:?}");
    assert_eq!(
        (&cmds[0]["node"], &cmds[0]["value"], &cmds[0]["type"]),
        (&json!("Oven.Setpoint"), &json!(180.5), &json!("Double"))
    );
    assert_eq!(
        (&cmds[1]["node"], &cmds[1]["value"]),
        (&json!("Oven.Enabled"), &json!(true))
    );
    assert!(cmds.iter().all(|c| c["status"] == "Good"), "{cmds:?}");
    poll_until("the oven to hold the setpoint", TIMEOUT, || {
        r.oven.values()["Setpoint"] == 180.5 && r.oven.values()["Enabled"] == true
    });
    poll_until("the read to show the new setpoint", TIMEOUT, || {
        let st = read_state(&r.tether, &r.sid);
        st["result"]["state"]["setpoint"] == 180.5 && st["result"]["state"]["enabled"] == true
    });
    // The watchdog is fed while the oven is enabled: past its period, still on.
    let before = r.oven.feeds();
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        r.oven.feeds() >= before + 2,
        "fed at least twice per period"
    );
    assert!(
        r.oven.events("watchdog_trip").is_empty(),
        "never tripped while fed"
    );
    assert_eq!(r.oven.values()["Enabled"], true);
}

#[test]
fn out_of_limit_interlocked_and_latched_commands_write_nothing() {
    let r = rig(false);
    let too_hot = setpoint(&r.tether, &r.sid, 260.0);
    assert_eq!(too_hot["status"], "rejected", "{too_hot}");
    let too_cold = setpoint(&r.tether, &r.sid, 19.5);
    assert_eq!(too_cold["status"], "rejected", "{too_cold}");
    r.oven.control(json!({"door": "open"}));
    std::thread::sleep(Duration::from_millis(300));
    let door_open = setpoint(&r.tether, &r.sid, 100.0);
    assert_rejected(&door_open, "MHS.SAFETY.INTERLOCK_OPEN");
    assert!(r.oven.commands().is_empty(), "{:?}", r.oven.commands());
    r.oven.control(json!({"door": "closed"}));
    std::thread::sleep(Duration::from_millis(300));
    estop(&r.tether, "test");
    let cmds = r.oven.commands();
    assert_eq!(cmds.len(), 1, "only the native stop: {cmds:?}");
    assert_eq!(
        (&cmds[0]["kind"], &cmds[0]["method"], &cmds[0]["status"]),
        (&json!("call"), &json!("Oven.Stop"), &json!("Good"))
    );
    let latched = setpoint(&r.tether, &r.sid, 100.0);
    assert_eq!(latched["status"], "rejected", "{latched}");
    assert_eq!(r.oven.commands().len(), 1, "nothing after the latch");
    assert_eq!(r.oven.values()["Setpoint"], 20.0);
}

#[test]
fn the_estop_reaches_the_oven_while_a_command_is_in_flight() {
    let r = rig(false);
    // The setpoint write answers 1500 ms late: the command is in flight.
    r.oven
        .control(json!({"write_delay_ms": {"Oven.Setpoint": 1500}}));
    let addr = r.tether.addr();
    let sid = r.sid.clone();
    let cmd = std::thread::spawn(move || {
        let body = json!({"jsonrpc": "2.0", "id": 9, "method": "mhs.command", "params": {
            "session_id": sid, "device_id": DEVICE, "capability_id": "cap.thermal.setpoint.v1",
            "resource": "main", "input": {"target_temperature": 150.0}}});
        http_post_with(
            addr,
            body.to_string().as_bytes(),
            TIMEOUT,
            &format!("Authorization: Bearer {AGENT}\r\n"),
        )
        .json()
    });
    // The oven logs a delayed write when it answers; wait for the feed that
    // goes just before the command instead, then a little more.
    let feeds = r.oven.feeds();
    poll_until("the command to start", TIMEOUT, || r.oven.feeds() > feeds);
    std::thread::sleep(Duration::from_millis(200));
    let asked = now_ms();
    estop(&r.tether, "in flight");
    let answered = cmd.join().unwrap();
    let lines = r.oven.lines();
    let stop = lines
        .iter()
        .find(|l| l["kind"] == "call" && l["method"] == "Oven.Stop")
        .unwrap_or_else(|| panic!("no Stop() call: {lines:?}"));
    let latency = stop["t_ms"].as_f64().unwrap() - asked;
    assert!(
        latency < 500.0,
        "Stop() reached the oven {latency} ms after the e-stop was asked"
    );
    assert!(
        !lines
            .iter()
            .any(|l| l["kind"] == "write" && l["node"] == "Oven.Enabled"),
        "the command never enabled the oven after the stop: {lines:?}"
    );
    assert_ne!(answered["result"]["status"], "completed", "{answered}");
    std::thread::sleep(Duration::from_millis(1800));
    assert_eq!(r.oven.values()["Enabled"], false);
}

#[test]
fn kill_9_of_tether_leaves_the_oven_to_its_own_watchdog() {
    let mut r = rig(false);
    let receipt = setpoint(&r.tether, &r.sid, 90.0);
    assert_eq!(receipt["status"], "completed", "{receipt}");
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(r.oven.values()["Enabled"], true, "fed, the oven stays on");
    let killed = Instant::now();
    let killed_ms = now_ms();
    r.tether.kill();
    poll_until(
        "the oven's watchdog to clear Enabled",
        Duration::from_secs(8),
        || r.oven.values()["Enabled"] == false,
    );
    let trip = r.oven.events("watchdog_trip");
    assert_eq!(trip.len(), 1, "{trip:?}");
    let after = trip[0]["t_ms"].as_f64().unwrap() - killed_ms;
    eprintln!(
        "kill -9 -> oven stopped by its watchdog after {after:.0} ms (observed {:?})",
        killed.elapsed()
    );
    assert!(
        after <= 2000.0 + 1000.0,
        "the period (2000 ms) and a margin: {after}"
    );
}

#[test]
fn a_refusing_slow_or_absent_oven_gets_clear_answers_and_the_estop_still_latches() {
    let mut r = rig(false);
    // A bad status code: failed, with the native code, nothing changed.
    r.oven
        .control(json!({"write_status": {"Oven.Setpoint": "BadDeviceFailure"}}));
    let refused = setpoint(&r.tether, &r.sid, 100.0);
    assert_eq!(refused["status"], "failed", "{refused}");
    let native = &refused["error"]["details"]["native"];
    assert_eq!(native["status"], "BadDeviceFailure", "{refused}");
    assert_eq!(
        r.oven.values()["Setpoint"],
        20.0,
        "the device changed nothing"
    );
    assert!(
        !r.oven
            .commands()
            .iter()
            .any(|c| c["node"] == "Oven.Enabled"),
        "Enabled was never written after the refused setpoint"
    );
    // A silent server: reads go unknown once the mirror is stale, and the
    // gated setpoint is refused (an unknown interlock blocks).
    r.oven.control(json!({"silent": true}));
    std::thread::sleep(Duration::from_millis(1500));
    let unknown = read_state(&r.tether, &r.sid);
    assert!(
        unknown.get("error").is_some() || unknown["result"]["status"] != "completed",
        "{unknown}"
    );
    let blocked = setpoint(&r.tether, &r.sid, 100.0);
    assert_eq!(blocked["status"], "rejected", "{blocked}");
    // Down altogether: the endpoint keeps serving, the e-stop latches.
    r.oven.0.stop();
    estop(&r.tether, "peer down");
    let st = ok_as(
        &r.tether,
        OPERATOR,
        "mhs.safety.status",
        json!({"device_id": DEVICE}),
    );
    let dev = st["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["device_id"] == DEVICE)
        .cloned()
        .unwrap_or_default();
    assert_eq!(dev["latched"], true, "{st}");
    // The server returns: reads reconcile, the latch holds until a reset.
    let (dir, port) = (r.oven.dir.clone(), r.oven.port);
    r.oven.clear_control();
    let back = Oven::start(&dir, port, &[]);
    wait_readable(&r.tether, &r.sid);
    let still = setpoint(&r.tether, &r.sid, 100.0);
    assert_eq!(still["status"], "rejected", "the latch holds: {still}");
    drop(back);
}

#[test]
fn basic256sha256_with_a_user_reaches_the_oven_and_a_wrong_password_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let port = peers::free_port();
    let pki = dir.path().join("server-pki");
    let oven = Oven::start(
        dir.path(),
        port,
        &[
            "--security",
            "basic256sha256",
            "--user",
            "tether",
            "--password",
            "oven-secret",
            "--pki",
            pki.to_str().unwrap(),
        ],
    );
    let cfg = example_config(dir.path(), port);
    let manifest = dir.path().join("oven-1.toml");
    let client_pki = dir.path().join("client-pki");
    let secured = std::fs::read_to_string(&manifest).unwrap().replace(
        "security = \"none\"",
        &format!(
            "security = \"basic256sha256\"\nsecurity_mode = \"sign_and_encrypt\"\nusername = \"tether\"\npassword_env = \"OVEN_PASSWORD\"\npki_dir = \"{}\"\ntrust_server_certs = true",
            client_pki.display()
        ),
    );
    std::fs::write(&manifest, secured).unwrap();
    let tether = start_tether(dir.path(), &cfg, false, &[("OVEN_PASSWORD", "oven-secret")]);
    let sid = session_as(&tether, AGENT);
    wait_readable(&tether, &sid);
    let receipt = setpoint(&tether, &sid, 120.0);
    assert_eq!(receipt["status"], "completed", "{receipt}");
    poll_until("the oven to hold 120", TIMEOUT, || {
        oven.values()["Setpoint"] == 120.0
    });
    drop(tether);
    // A wrong password: no session, so the state is unknown and the link
    // says why; nothing is written.
    let writes = oven.commands().len();
    let wrong = start_tether(dir.path(), &cfg, false, &[("OVEN_PASSWORD", "wrong")]);
    let sid = session_as(&wrong, AGENT);
    std::thread::sleep(Duration::from_millis(1500));
    let st = read_state(&wrong, &sid);
    assert!(
        st.get("error").is_some() || st["result"]["status"] != "completed",
        "{st}"
    );
    let refused = setpoint(&wrong, &sid, 130.0);
    assert_ne!(refused["status"], "completed", "{refused}");
    assert_eq!(oven.commands().len(), writes, "nothing reached the oven");
}

#[test]
fn probe_prints_every_mapped_node_in_declared_units_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let port = peers::free_port();
    let oven = Oven::start(dir.path(), port, &[]);
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
        &format!("{NS}Oven.Setpoint"),
        "main.temperature",
        "degC",
        "interlock door",
        "closed",
        "watchdog",
        &format!("{NS}Oven.Watchdog"),
    ] {
        assert!(out.contains(needle), "`{needle}` in:\n{out}");
    }
    assert!(oven.commands().is_empty(), "probe wrote nothing");
    assert_eq!(oven.feeds(), 0, "probe fed nothing");
}

#[test]
fn check_reports_every_mapping_defect_with_file_device_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = example_config(dir.path(), 4840);
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, &text[..text.find("[[principals]]").unwrap()]).unwrap();
    let path = dir.path().join("oven-1.toml");
    let broken = std::fs::read_to_string(&path)
        .unwrap()
        .replace(
            "s=Oven.Temperature\", type = \"double\"",
            "s=Oven.Temperature\", type = \"quad\"",
        )
        .replace(
            "s=Oven.Setpoint\", type = \"double\", unit = \"degC\"",
            "s=Oven.Setpoint\", type = \"sbyte\", unit = \"degC\"",
        )
        .replace(
            "configure = [{ field = \"setpoint\", input = \"setpoint\" }]",
            "configure = []",
        )
        .replace(
            "s=Oven.DoorClosed\", type = \"boolean\", closed = true",
            "s=Oven.DoorClosed\", type = \"boolean\"",
        )
        .replace(
            "stop = [{ call = \"nsu=urn:tether:example:oven;s=Oven.Stop\" }]",
            "stop = [{ call = \"Oven.Stop\" }]",
        );
    std::fs::write(&path, broken).unwrap();
    check_names_defects(
        &cfg,
        &path,
        DEVICE,
        &[
            ("driver_config.fields.main.temperature.type", "quad"),
            ("driver_config.fields.main.setpoint.type", "maximum 250"),
            ("driver_config.targets.configure", "no writes"),
            ("driver_config.interlocks.door.closed", "closed"),
            ("driver_config.stop[0].call", "Oven.Stop"),
        ],
    );
}

#[test]
fn a_model_over_mcp_moves_the_oven_and_an_out_of_limit_call_writes_nothing() {
    let r = rig(true);
    let addr = mcp_addr(&r.tether);
    let sid = mcp_session(addr, AGENT);
    let call = |id: u64, t: f64| {
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "oven-1__setpoint", "arguments": {"target_temperature": t}}});
        mcp_post(addr, AGENT, Some(&sid), &msg).0
    };
    let refused = call(2, 300.0);
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    assert!(
        r.oven.commands().is_empty(),
        "an out-of-limit call writes nothing"
    );
    let done = call(3, 75.25);
    assert_ne!(done["result"]["isError"], true, "{done}");
    let cmds = r.oven.commands();
    assert_eq!(cmds.len(), 2, "{cmds:?}");
    assert_eq!(cmds[0]["value"], json!(75.25));
    assert_eq!(cmds[1]["value"], json!(true));
}

/// A server that advertises its endpoints under a path of its own (as
/// asyncua's default `/freeopcua/server/` does) is still reached at the
/// example's path-less address: the setpoint lands.
#[test]
fn a_server_that_advertises_a_path_of_its_own_is_still_reached() {
    let dir = tempfile::tempdir().unwrap();
    let port = peers::free_port();
    let oven = Oven::start(dir.path(), port, &["--endpoint-path", "/freeopcua/server/"]);
    let cfg = example_config(dir.path(), port);
    let tether = start_tether(dir.path(), &cfg, false, &[]);
    let sid = session_as(&tether, AGENT);
    wait_readable(&tether, &sid);
    let receipt = setpoint(&tether, &sid, 99.5);
    assert_eq!(receipt["status"], "completed", "{receipt}");
    poll_until("the oven to hold 99.5", TIMEOUT, || {
        oven.values()["Setpoint"] == 99.5
    });
}
