//! `tether mcp --endpoint URL` end to end: the official MCP Python SDK
//! (pinned in `tests/mcp/requirements.txt`, as `mcp.rs` uses it) launches
//! the bridge on stdio, and every call is decided by a real `tether serve
//! --mcp-http` the bridge is a client of: the commands and the e-stop show
//! up in that endpoint's evidence and latch there, in both protocol
//! generations; a lost endpoint answers tool calls with an error at once;
//! an unreachable one answers `initialize` with an error, never a hang.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;
#[path = "common/peers.rs"]
mod peers;

use common::mcp_http::mcp_addr;
use common::{call_with_token, tether, Server, Transport, BIN};
use serde_json::{json, Value};
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const AGENT_TOKEN: &str = "bridge-agent-token-77c2";
const THERMO: &str = "thermostat-1";
/// Longest a Python scenario may take (it bounds its own waits at 60 s).
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(90);

fn scripts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp")
}

fn python() -> &'static Path {
    static PYTHON: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let made = PYTHON.get_or_init(|| {
        peers::pinned_venv(
            "TETHER_TEST_PYTHON",
            &scripts_dir().join("requirements.txt"),
            "py-mcp",
        )
    });
    match made {
        Ok(p) => p,
        Err(e) => panic!("the MCP bridge tests need the official MCP Python SDK:\n{e}"),
    }
}

/// Runs `client.py ARGS`; panics with both outputs unless it exits 0.
fn scenario(args: &[&str]) -> String {
    let mut child = Command::new(python())
        .arg(scripts_dir().join("client.py"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the Python client");
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + SCENARIO_TIMEOUT;
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("client.py {args:?} did not finish within {SCENARIO_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (out, err) = (t_out.join().unwrap(), t_err.join().unwrap());
    assert!(
        status.success(),
        "client.py {args:?} failed ({status}):\nstdout:\n{out}\nstderr:\n{err}"
    );
    out
}

/// A running endpoint on the built-in cell with one agent principal,
/// serving JSON-RPC (`/rpc`, for the test's own checks) and MCP (`/mcp`).
fn endpoint(dir: &Path) -> (Server, String) {
    endpoint_with(dir, "")
}

/// [`endpoint`] with `extra` top-level config lines.
fn endpoint_with(dir: &Path, extra: &str) -> (Server, String) {
    let cfg = dir.join("tether.toml");
    let digest = hex::encode(tether_server::auth::token_digest(AGENT_TOKEN));
    std::fs::write(
        &cfg,
        format!("builtin_cell = true\n{extra}\n[[principals]]\nid = \"planner\"\nkind = \"agent\"\ntoken_sha256 = \"{digest}\"\n"),
    )
    .expect("config");
    let server = Server::start_with(
        Transport::Http,
        Some(&dir.join("state")),
        &[
            OsStr::new("--config"),
            cfg.as_os_str(),
            OsStr::new("--mcp-http"),
            OsStr::new("127.0.0.1:0"),
        ],
    );
    let url = format!("http://{}/mcp", mcp_addr(&server));
    (server, url)
}

fn bridge_scenario(name: &str, mode: &str, url: &str, extra: &[&str]) -> String {
    let mut args = vec![
        name,
        "--transport",
        "bridge",
        "--mode",
        mode,
        "--bin",
        BIN,
        "--url",
        url,
        "--token",
        AGENT_TOKEN,
    ];
    args.extend_from_slice(extra);
    scenario(&args)
}

/// The receipts of `capability_id` in the endpoint's exported chain.
fn receipts_of(state_dir: &Path, capability_id: &str) -> Vec<Value> {
    let run = tether(&[
        "audit".as_ref(),
        "export".as_ref(),
        "--state-dir".as_ref(),
        state_dir.as_os_str(),
    ]);
    assert_eq!(run.code, Some(0), "audit export: {}", run.stderr);
    run.stdout_text()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|e| {
            let receipt = e.get("body")?.get("receipt")?.clone();
            (receipt.get("capability_id")? == capability_id).then_some(receipt)
        })
        .collect()
}

fn governed_through_the_bridge(mode: &str, protocol: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, url) = endpoint(dir.path());
    let out = bridge_scenario("governed", mode, &url, &[]);
    assert!(
        out.contains("governed ok (bridge") && out.contains(protocol),
        "{out}"
    );
    // The calls were the endpoint's: its chain holds the setpoint the model
    // made (30 °C, completed) and the one refused (400 °C), and its
    // thermostat is latched by the e-stop sent through the bridge.
    let setpoints = receipts_of(&dir.path().join("state"), "cap.thermal.setpoint.v1");
    assert!(
        setpoints.iter().any(|r| r["status"] == "completed"),
        "{setpoints:?}"
    );
    assert!(
        setpoints.iter().any(|r| r["status"] == "rejected"),
        "{setpoints:?}"
    );
    let status = call_with_token(
        &server,
        AGENT_TOKEN,
        "mhs.safety.status",
        json!({"device_id": THERMO}),
    );
    let devices = status["result"]["devices"].as_array().expect("devices");
    let thermo = devices
        .iter()
        .find(|d| d["device_id"] == THERMO)
        .expect("thermostat");
    assert_eq!(thermo["latched"], true, "{status}");
    let verify = tether(&[
        "audit".as_ref(),
        "verify".as_ref(),
        "--state-dir".as_ref(),
        dir.path().join("state").as_os_str(),
    ]);
    assert_eq!(verify.code, Some(0), "{}", verify.stdout_text());
}

#[test]
fn the_python_sdk_in_legacy_mode_drives_a_running_endpoint_through_the_bridge() {
    governed_through_the_bridge("legacy", "protocol 2025-11-25");
}

#[test]
fn the_python_sdk_in_auto_mode_drives_a_running_endpoint_through_the_bridge() {
    governed_through_the_bridge("auto", "protocol 2026-07-28");
}

#[test]
fn an_estop_through_the_bridge_is_answered_while_a_motion_runs_there() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_server, url) = endpoint(dir.path());
    let out = bridge_scenario("estop_during_motion", "legacy", &url, &[]);
    assert!(out.contains("estop_during_motion ok"), "{out}");
    let moves = receipts_of(&dir.path().join("state"), "cap.motion.move_to.v1");
    assert!(
        moves.iter().any(|r| r["status"] == "cancelled"),
        "{moves:?}"
    );
}

/// A held call through the bridge: the endpoint's policy holds it, and its
/// URL elicitation (the console's page for the approval) reaches the host.
#[test]
fn a_held_call_through_the_bridge_sends_the_host_to_the_approval() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("policy.cedar"),
        include_str!("../../../examples/operators/policy.cedar"),
    )
    .expect("policy");
    let (_server, url) = endpoint_with(
        dir.path(),
        "policy = \"policy.cedar\"\nconsole_url = \"http://127.0.0.1:7878/console/\"\n",
    );
    let out = bridge_scenario("held_to_console", "legacy", &url, &[]);
    assert!(out.contains("held_to_console ok"), "{out}");
}

#[test]
fn a_lost_endpoint_answers_tool_calls_and_the_estop_with_an_error_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, url) = endpoint(dir.path());
    let pid = server.pid().to_string();
    let out = bridge_scenario("endpoint_lost", "legacy", &url, &["--kill-pid", &pid]);
    assert!(out.contains("endpoint_lost ok"), "{out}");
}

/// The endpoint restarts (killed, then started again on the same address and
/// state directory) while the host's MCP session is open: the bridge makes a
/// new session with the host's own `initialize`, and the next call runs.
#[test]
fn a_restarted_endpoint_gets_a_new_session_and_the_next_call_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = peers::free_port();
    let addr = format!("127.0.0.1:{port}");
    let start = |dir: &Path| {
        let cfg = dir.join("tether.toml");
        let digest = hex::encode(tether_server::auth::token_digest(AGENT_TOKEN));
        std::fs::write(
            &cfg,
            format!("builtin_cell = true\n\n[[principals]]\nid = \"planner\"\nkind = \"agent\"\ntoken_sha256 = \"{digest}\"\n"),
        )
        .expect("config");
        Server::start_with(
            Transport::Http,
            Some(&dir.join("state")),
            &[
                OsStr::new("--config"),
                cfg.as_os_str(),
                OsStr::new("--mcp-http"),
                OsStr::new(&addr),
            ],
        )
    };
    let mut first = start(dir.path());
    let url = format!("http://{addr}/mcp");
    let signal = dir.path().join("signal").display().to_string();
    let (url2, signal2) = (url.clone(), signal.clone());
    let client = std::thread::spawn(move || {
        bridge_scenario(
            "endpoint_restarted",
            "legacy",
            &url2,
            &["--signal", &signal2],
        )
    });
    let ready = PathBuf::from(format!("{signal}.ready"));
    let deadline = Instant::now() + common::TIMEOUT;
    while !ready.exists() {
        assert!(Instant::now() < deadline, "the scenario never got ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    first.kill();
    let second = start(dir.path());
    std::fs::write(format!("{signal}.restarted"), b"").expect("signal");
    let out = client.join().expect("scenario");
    assert!(out.contains("endpoint_restarted ok"), "{out}");
    // The second endpoint ran the call: its chain holds the setpoint.
    let setpoints = receipts_of(&dir.path().join("state"), "cap.thermal.setpoint.v1");
    assert!(
        setpoints.iter().any(|r| r["status"] == "completed"),
        "{setpoints:?}"
    );
    drop(second);
}

/// Without the caller's token the endpoint refuses (401, before it reads the
/// body); the bridge answers that refusal under the request's own id, so the
/// client fails at once instead of waiting for an answer.
#[test]
fn a_caller_without_a_token_is_refused_through_the_bridge() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_server, url) = endpoint(dir.path());
    let out = scenario(&[
        "no_token",
        "--transport",
        "bridge",
        "--mode",
        "legacy",
        "--bin",
        BIN,
        "--url",
        &url,
    ]);
    assert!(out.contains("no_token ok"), "{out}");
}

#[test]
fn an_unreachable_endpoint_answers_initialize_with_an_error() {
    // A port nothing listens on.
    let port = peers::free_port();
    let url = format!("http://127.0.0.1:{port}/mcp");
    let mut child = Command::new(BIN)
        .args(["mcp", "--endpoint", &url])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn tether mcp --endpoint");
    let mut stdin = child.stdin.take().expect("stdin");
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}});
    writeln!(stdin, "{init}").expect("write");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(common::TIMEOUT)
        .expect("an answer, not a hang");
    let answer: Value = serde_json::from_str(&line).expect("JSON-RPC");
    assert_eq!(answer["id"], 1, "{answer}");
    let message = answer["error"]["message"].as_str().expect("an error");
    assert!(
        message.contains(&url) && message.contains("did not answer"),
        "{message}"
    );
    drop(stdin);
    let _ = child.wait();
}
