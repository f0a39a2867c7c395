//! The MQTT driver against real peers: Debian's mosquitto broker, the
//! example pump (`examples/mqtt-pump/pump.py`, paho-mqtt) and a spy client
//! logging what the broker carried; the real `tether` binary serves a copy
//! of `examples/mqtt-pump` whose broker address is rewritten. Every check is
//! made on the device side (the pump's log of received messages, the spy's).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;
#[path = "common/peers.rs"]
mod peers;

use common::{call_with_token, poll_until, receipt_code, start_with_config, tether, Server};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

const OP: &str = "mqtt-operator-token-71d2";
const AGENT: &str = "mqtt-agent-token-4b9e";
const DISPENSE: &str = "cap.fluid.dispense.v1";
const CMD: &str = "lab/pump-1/cmd";
const LEASE_MS: u64 = 1000;
/// The example's e-stop budget (`safety.estop.latency_ms`).
const ESTOP_BUDGET: Duration = Duration::from_millis(1000);

fn tokens() {
    static ONCE: Once = Once::new();
    // The served config names these variables (`token_env`); the child
    // inherits them. Set once, before any server starts.
    ONCE.call_once(|| {
        std::env::set_var("TETHER_OPERATOR_TOKEN", OP);
        std::env::set_var("TETHER_AGENT_TOKEN", AGENT);
    });
}

fn example_dir() -> PathBuf {
    peers::package_dir().join("../../examples/mqtt-pump")
}

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.0.id().to_string()])
            .status();
        assert!(ok.is_ok_and(|s| s.success()), "kill {sig}");
    }
}

struct Rig {
    dir: tempfile::TempDir,
    port: u16,
    broker: Option<Proc>,
    pump: Option<Proc>,
    _spy: Option<Proc>,
}

fn wait_port(port: u16, up: bool) {
    poll_until("the broker port", Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() == up
    });
}

fn start_broker(dir: &Path, port: u16) -> Proc {
    let conf = dir.join("mosquitto.conf");
    std::fs::write(
        &conf,
        format!("listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"),
    )
    .unwrap();
    let child = Command::new(peers::mosquitto())
        .arg("-c")
        .arg(&conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn mosquitto");
    wait_port(port, true);
    Proc(child)
}

fn start_spy(dir: &Path, port: u16) -> Proc {
    let mut child = Command::new(peers::python())
        .arg(peers::peers_dir().join("mqtt_spy.py"))
        .args(["127.0.0.1", &port.to_string(), "lab/pump-1/#"])
        .arg(dir.join("spy.jsonl"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn spy");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("spy ready");
    assert_eq!(line.trim(), "ready", "spy: {line}");
    Proc(child)
}

fn start_pump(dir: &Path, port: u16, extra: &[&str]) -> Proc {
    let child = Command::new(peers::python())
        .arg(example_dir().join("pump.py"))
        .args(["--port", &port.to_string(), "--time-scale", "20", "--log"])
        .arg(dir.join("pump.jsonl"))
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn pump");
    Proc(child)
}

impl Rig {
    fn new(pump_args: &[&str]) -> Rig {
        Self::with(pump_args, "3.1.1")
    }

    fn with(pump_args: &[&str], protocol: &str) -> Rig {
        tokens();
        let dir = tempfile::tempdir().unwrap();
        let port = peers::free_port();
        let broker = start_broker(dir.path(), port);
        let spy = start_spy(dir.path(), port);
        let pump = start_pump(dir.path(), port, pump_args);
        for f in ["tether.toml", "pump-1.toml"] {
            let text = std::fs::read_to_string(example_dir().join(f)).unwrap();
            let text = text
                .replace("127.0.0.1:1883", &format!("127.0.0.1:{port}"))
                .replace(
                    "protocol = \"3.1.1\"",
                    &format!("protocol = \"{protocol}\""),
                );
            std::fs::write(dir.path().join(f), text).unwrap();
        }
        Rig {
            dir,
            port,
            broker: Some(broker),
            pump: Some(pump),
            _spy: Some(spy),
        }
    }

    fn serve(&self) -> Server {
        start_with_config(self.dir.path(), &self.dir.path().join("tether.toml"))
    }

    fn lines(&self, file: &str) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join(file))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Messages the pump received on `cmd`.
    fn pump_cmds(&self) -> Vec<Value> {
        self.lines("pump.jsonl")
            .into_iter()
            .filter(|m| m["topic"] == CMD)
            .map(|m| m["payload"].clone())
            .collect()
    }

    /// Messages the broker carried on `topic`.
    fn carried(&self, topic: &str) -> Vec<Value> {
        self.lines("spy.jsonl")
            .into_iter()
            .filter(|m| m["topic"] == topic)
            .collect()
    }

    fn pump(&self) -> &Proc {
        self.pump.as_ref().unwrap()
    }

    /// The pump's last retained state as the broker carried it.
    fn last_state(&self) -> Value {
        self.carried("lab/pump-1/state")
            .last()
            .map(|m| m["payload"].clone())
            .unwrap_or(Value::Null)
    }
}

fn rpc(s: &Server, token: &str, method: &str, params: Value) -> Value {
    call_with_token(s, token, method, params)
}

fn ok(s: &Server, token: &str, method: &str, params: Value) -> Value {
    let a = rpc(s, token, method, params);
    assert!(a.get("error").is_none(), "{method}: {a}");
    a["result"].clone()
}

fn session(s: &Server, token: &str) -> String {
    ok(s, token, "mhs.session.open", json!({}))["session_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn dose(s: &Server, sid: &str, volume: f64, rate: f64) -> Value {
    ok(
        s,
        AGENT,
        "mhs.command",
        json!({"session_id": sid, "device_id": "pump-1", "capability_id": DISPENSE, "input": {"volume_ml": volume, "rate_ml_min": rate}}),
    )
}

fn read(s: &Server, sid: &str) -> Value {
    rpc(
        s,
        AGENT,
        "mhs.resource.read",
        json!({"session_id": sid, "device_id": "pump-1", "resource": "main"}),
    )
}

/// Waits until Tether reads the pump's state (the broker and the pump are up).
fn wait_fresh(s: &Server, sid: &str) {
    poll_until("a fresh pump state", Duration::from_secs(15), || {
        read(s, sid).get("result").is_some()
    });
}

fn doses_of(cmds: &[Value], id: &str) -> usize {
    cmds.iter()
        .filter(|c| c["command_id"] == id && c["op"] == "dose")
        .count()
}

#[test]
fn an_in_limit_dose_reaches_the_pump_once_and_refused_doses_publish_nothing() {
    let rig = Rig::new(&[]);
    let s = rig.serve();
    let sid = session(&s, AGENT);
    wait_fresh(&s, &sid);
    let r = read(&s, &sid)["result"].clone();
    assert_eq!(r["state"]["door"], "closed", "{r}");
    assert_eq!(r["state"]["running"], false, "{r}");
    let age = common_now_ms().saturating_sub(r["sampled_at"].as_u64().unwrap());
    assert!(
        age <= 1000,
        "sampled_at is the state message's receive time: {r}"
    );

    // In limits: completed, and the pump got exactly one dose command.
    let done = dose(&s, &sid, 2.0, 60.0);
    assert_eq!(done["status"], "completed", "{done}");
    let id = done["command_id"].as_str().unwrap();
    let cmds = rig.pump_cmds();
    assert_eq!(doses_of(&cmds, id), 1, "{cmds:?}");
    let c = cmds.iter().find(|c| c["command_id"] == id).unwrap();
    assert_eq!(
        c,
        &json!({"command_id": id, "op": "dose", "volume_ml": 2, "rate_ml_min": 60, "lease_ms": LEASE_MS})
    );
    assert_eq!(rig.carried(CMD).len(), 1, "the broker carried one command");

    // Out of limits: refused, nothing published.
    let r = dose(&s, &sid, 25.0, 60.0);
    assert_eq!(receipt_code(&r), "MHS.SAFETY.ENVELOPE_VIOLATION", "{r}");
    let r = dose(&s, &sid, 1.0, 61.0);
    assert_eq!(receipt_code(&r), "MHS.SAFETY.ENVELOPE_VIOLATION", "{r}");

    // Door open: the interlock refuses, nothing published.
    rig.pump().signal("-USR1");
    poll_until("the door to read open", Duration::from_secs(5), || {
        read(&s, &sid)["result"]["state"]["door"] == "open"
    });
    let r = dose(&s, &sid, 1.0, 60.0);
    assert_eq!(receipt_code(&r), "MHS.SAFETY.INTERLOCK_OPEN", "{r}");
    rig.pump().signal("-USR2");
    poll_until("the door to read closed", Duration::from_secs(5), || {
        read(&s, &sid)["result"]["state"]["door"] == "closed"
    });

    // The budget: 2 + 20 + 20 = 42 mL; 20 more would pass 50 mL per hour.
    for _ in 0..2 {
        let r = dose(&s, &sid, 20.0, 60.0);
        assert_eq!(r["status"], "completed", "{r}");
    }
    let r = dose(&s, &sid, 20.0, 60.0);
    assert_eq!(receipt_code(&r), "MHS.SAFETY.CUMULATIVE_LIMIT", "{r}");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        rig.pump_cmds().len(),
        3,
        "only the three admitted doses: {:?}",
        rig.pump_cmds()
    );
    assert_eq!(rig.carried(CMD).len(), 3);
}

#[test]
fn probe_reads_every_mapped_field_and_interlock_and_publishes_nothing() {
    let rig = Rig::new(&[]);
    let text = std::fs::read_to_string(rig.dir.path().join("pump-1.toml")).unwrap();
    let manifest: tether_core::manifest::DeviceManifest = toml::from_str(&text).unwrap();
    let rows = tether_drivers::mqtt::probe(&manifest, Duration::from_secs(10)).unwrap();
    let row = |n: &str| {
        rows.iter()
            .find(|r| r.name == n)
            .unwrap_or_else(|| panic!("{n}: {rows:?}"))
    };
    assert_eq!(row("door").raw, "closed");
    assert_eq!(row("running").declared, false);
    assert_eq!(row("dispensed_ml").unit.as_deref(), Some("mL"));
    assert_eq!(row("interlock:door").declared, "closed");
    std::thread::sleep(Duration::from_millis(200));
    let published: Vec<Value> = rig
        .lines("spy.jsonl")
        .into_iter()
        .filter(|m| m["topic"] != "lab/pump-1/state" && m["topic"] != "lab/pump-1/ack")
        .collect();
    assert!(published.is_empty(), "{published:?}");
    // A broker that is not there: a clear error within the bound.
    let down = text.replace(&format!("127.0.0.1:{}", rig.port), "127.0.0.1:9");
    let manifest: tether_core::manifest::DeviceManifest = toml::from_str(&down).unwrap();
    let err = tether_drivers::mqtt::probe(&manifest, Duration::from_millis(500)).unwrap_err();
    assert!(err.contains("127.0.0.1:9"), "{err}");
}

#[test]
fn mqtt_5_serves_the_same_pump() {
    let rig = Rig::with(&[], "5");
    let s = rig.serve();
    let sid = session(&s, AGENT);
    wait_fresh(&s, &sid);
    let done = dose(&s, &sid, 1.0, 60.0);
    assert_eq!(done["status"], "completed", "{done}");
    let id = done["command_id"].as_str().unwrap();
    assert_eq!(doses_of(&rig.pump_cmds(), id), 1, "{:?}", rig.pump_cmds());
}

fn common_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Starts a long dose (10 mL at 1 mL/min, scaled: 30 s) on its own thread.
fn long_dose(s: &Server, sid: &str) -> std::thread::JoinHandle<Value> {
    let addr = s.addr();
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "mhs.command", "params": {"session_id": sid, "device_id": "pump-1", "capability_id": DISPENSE, "input": {"volume_ml": 10, "rate_ml_min": 1}}}).to_string();
    std::thread::spawn(move || {
        let r = common::http_post_with(
            addr,
            body.as_bytes(),
            Duration::from_secs(60),
            &format!("Authorization: Bearer {AGENT}\r\n"),
        );
        r.json()
    })
}

#[test]
fn an_estop_while_a_dose_runs_publishes_the_stop_within_budget_and_the_dose_ends_cancelled() {
    let rig = Rig::new(&[]);
    let s = rig.serve();
    let sid = session(&s, AGENT);
    wait_fresh(&s, &sid);
    let running = long_dose(&s, &sid);
    poll_until("the pump to run", Duration::from_secs(5), || {
        rig.last_state()["running"] == true
    });
    let dose_id = rig.pump_cmds()[0]["command_id"]
        .as_str()
        .unwrap()
        .to_owned();

    let t0 = Instant::now();
    let e = ok(
        &s,
        OP,
        "mhs.safety.estop",
        json!({"device_id": "pump-1", "reason": "test"}),
    );
    assert!(e.is_object(), "{e}");
    poll_until("the stop on cmd", ESTOP_BUDGET, || {
        rig.pump_cmds()
            .iter()
            .any(|c| c["op"] == "stop" && c["command_id"] == dose_id.as_str())
    });
    assert!(
        t0.elapsed() <= ESTOP_BUDGET,
        "stop published after {:?}",
        t0.elapsed()
    );
    let receipt = running.join().unwrap()["result"].clone();
    assert_eq!(receipt["status"], "cancelled", "{receipt}");
    poll_until("the pump to stop", Duration::from_secs(2), || {
        rig.last_state()["running"] == false
    });

    // Latched: a dose is refused and nothing more is published.
    let before = rig.carried(CMD).len();
    let r = dose(&s, &sid, 1.0, 60.0);
    assert_eq!(receipt_code(&r), "MHS.SAFETY.ESTOP_ENGAGED", "{r}");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(rig.carried(CMD).len(), before);
    assert!(rig.pump_cmds().iter().filter(|c| c["op"] == "dose").count() == 1);
}

#[test]
fn kill_9_of_tether_mid_dose_stops_the_pump_by_lease_loss() {
    let rig = Rig::new(&[]);
    let mut s = rig.serve();
    let sid = session(&s, AGENT);
    wait_fresh(&s, &sid);
    let _running = long_dose(&s, &sid);
    poll_until("the pump to run", Duration::from_secs(5), || {
        rig.last_state()["running"] == true
    });
    // Renewals arrive while Tether lives.
    poll_until("a lease renewal", Duration::from_secs(3), || {
        !rig.carried("lab/pump-1/lease").is_empty()
    });
    s.kill();
    let killed = Instant::now();
    poll_until(
        "the pump to stop by itself",
        Duration::from_millis(LEASE_MS + 1500),
        || rig.last_state()["running"] == false,
    );
    let took = killed.elapsed();
    assert!(
        took <= Duration::from_millis(LEASE_MS + 1000),
        "stopped after {took:?}"
    );
    let acks = rig.carried("lab/pump-1/ack");
    assert!(
        acks.iter()
            .any(|a| a["payload"]["status"] == "stopped"
                && a["payload"]["reason"] == "lease_expired"),
        "{acks:?}"
    );
}

#[test]
fn an_acknowledgement_that_never_comes_is_unknown_and_the_command_is_published_once() {
    let rig = Rig::new(&["--ignore-commands"]);
    let s = rig.serve();
    let sid = session(&s, AGENT);
    wait_fresh(&s, &sid);
    let r = dose(&s, &sid, 1.0, 60.0);
    assert_eq!(r["status"], "unknown", "{r}");
    assert_eq!(receipt_code(&r), "MHS.OUTCOME.UNKNOWN", "{r}");
    std::thread::sleep(Duration::from_millis(LEASE_MS));
    let id = r["command_id"].as_str().unwrap();
    assert_eq!(doses_of(&rig.pump_cmds(), id), 1, "{:?}", rig.pump_cmds());
    let carried: Vec<Value> = rig
        .carried(CMD)
        .into_iter()
        .map(|m| m["payload"].clone())
        .collect();
    assert_eq!(doses_of(&carried, id), 1, "{carried:?}");
    assert!(
        rig.carried("lab/pump-1/lease").is_empty(),
        "no renewal of an unacknowledged command"
    );
}

#[test]
fn a_broker_that_is_down_fails_the_dose_clearly_the_endpoint_serves_and_the_estop_latches() {
    let mut rig = Rig::new(&[]);
    let s = rig.serve();
    let sid = session(&s, AGENT);
    wait_fresh(&s, &sid);
    rig.pump = None;
    rig._spy = None;
    rig.broker = None;
    wait_port(rig.port, false);
    poll_until("the state to go stale", Duration::from_secs(5), || {
        read(&s, &sid).get("error").is_some()
    });
    let t0 = Instant::now();
    let r = dose(&s, &sid, 1.0, 60.0);
    // The state is stale by now, so the door interlock blocks first; either
    // way nothing is published and the answer is prompt and clear.
    assert_eq!(r["status"], "rejected", "{r}");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    let e = read(&s, &sid);
    assert!(e.get("error").is_some(), "a stale read is unknown: {e}");
    // The endpoint keeps serving, and the e-stop latches.
    let hello = ok(&s, AGENT, "mhs.hello", json!({}));
    assert!(hello.is_object());
    let t0 = Instant::now();
    let _ = rpc(
        &s,
        OP,
        "mhs.safety.estop",
        json!({"device_id": "pump-1", "reason": "broker down"}),
    );
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    let st = ok(&s, OP, "mhs.safety.status", json!({"device_id": "pump-1"}));
    assert!(st.to_string().contains("\"latched\":true"), "{st}");
}

#[test]
fn a_dose_while_the_broker_is_down_but_the_door_reads_closed_fails_as_broker_unreachable() {
    // The broker dies: the driver sees its connection close at once, while
    // the mirrored state (door closed) stays fresh for up to a second.
    let mut rig = Rig::new(&[]);
    let s = rig.serve();
    let sid = session(&s, AGENT);
    wait_fresh(&s, &sid);
    rig.broker = None;
    let t0 = Instant::now();
    let mut failed = None;
    while t0.elapsed() < Duration::from_millis(900) {
        let r = dose(&s, &sid, 1.0, 60.0);
        if r["status"] == "failed" {
            failed = Some(r);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = failed.expect("a dose failed as broker_unreachable while the state was still fresh");
    assert_eq!(r["error"]["details"]["reason"], "broker_unreachable", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nothing was published"),
        "{r}"
    );
}

#[test]
fn state_older_than_the_staleness_bound_reads_unknown_and_blocks_the_door_interlock() {
    let rig = Rig::new(&[]);
    let s = rig.serve();
    let sid = session(&s, AGENT);
    wait_fresh(&s, &sid);
    rig.pump().signal("-STOP");
    poll_until("the read to turn unknown", Duration::from_secs(3), || {
        read(&s, &sid).get("error").is_some()
    });
    let e = read(&s, &sid);
    assert!(e.to_string().contains("unknown"), "{e}");
    let st = ok(&s, OP, "mhs.safety.status", json!({"device_id": "pump-1"}));
    assert!(
        st.to_string().contains("\"unknown\""),
        "the door reads unknown: {st}"
    );
    let r = dose(&s, &sid, 1.0, 60.0);
    assert_eq!(receipt_code(&r), "MHS.SAFETY.INTERLOCK_OPEN", "{r}");
    rig.pump().signal("-CONT");
    wait_fresh(&s, &sid);
    assert!(rig.pump_cmds().is_empty(), "{:?}", rig.pump_cmds());
}

#[test]
fn tether_check_reports_mqtt_mapping_defects_with_file_device_and_field() {
    tokens();
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        example_dir().join("tether.toml"),
        dir.path().join("tether.toml"),
    )
    .unwrap();
    let text = std::fs::read_to_string(example_dir().join("pump-1.toml"))
        .unwrap()
        .replace(
            "lease = \"lab/pump-1/lease\"",
            "lease = \"lab/pump-1/lease\"\nspare = \"x\"",
        )
        .replace(
            "fields.door = { path = \"door\" }",
            "fields.door = { path = \"door\" }\nfields.flow = { path = \"flow\" }",
        )
        .replace(
            "fields.dispensed_ml = { path = \"dispensed_ml\", unit = \"mL\" }",
            "fields.dispensed_ml = { path = \"dispensed_ml\", unit = \"degC\" }",
        )
        .replace("closed = \"closed\"", "")
        .replace(
            "[driver_config.targets.dose]",
            "[driver_config.targets.other]",
        );
    std::fs::write(dir.path().join("pump-1.toml"), text).unwrap();
    let cfg = dir.path().join("tether.toml");
    let run = tether(&[std::ffi::OsStr::new("check"), cfg.as_os_str()]);
    let err = run.stderr.clone() + &run.stdout_text();
    for needle in [
        "driver_config.topics.spare",
        "driver_config.state.fields.flow",
        "driver_config.state.fields.dispensed_ml.unit",
        "driver_config.interlocks.door.closed",
        "bindings[0].target",
    ] {
        assert!(err.contains(needle), "missing {needle}:\n{err}");
    }
    assert!(
        err.contains("pump-1.toml") && err.contains("pump-1"),
        "{err}"
    );
}
