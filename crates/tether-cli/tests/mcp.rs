//! The MCP surface end to end: the official MCP Python SDK (pinned in
//! `tests/mcp/requirements.txt`) drives the real `tether` binary over stdio
//! (`tether mcp`) and streamable HTTP (`tether serve --mcp-http`), in the
//! SDK's `legacy` (initialize, 2025-11-25) and `auto` (server/discover,
//! 2026-07-28) modes. Raw-protocol checks (bad input, missing token) are
//! made here directly.
//!
//! The SDK lives in a virtualenv under the target directory (`py-mcp`),
//! created on first use with `python3.11 -m venv` (or `python3`) and
//! `pip install -r tests/mcp/requirements.txt`; `TETHER_TEST_PYTHON` points
//! at a ready interpreter instead. A failed setup fails the tests: they are
//! never skipped.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;
#[path = "common/peers.rs"]
mod peers;

use common::{tether, BIN};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const AGENT_TOKEN: &str = "mcp-agent-token-5b1e";
/// Longest a Python scenario may take (it bounds its own waits at 60 s).
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(90);

// ----- the Python SDK ------------------------------------------------------

fn scripts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp")
}

fn drain(
    child: &mut Child,
) -> (
    std::thread::JoinHandle<String>,
    std::thread::JoinHandle<String>,
) {
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let read_all = |r: &mut dyn Read| {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    };
    (
        std::thread::spawn(move || read_all(&mut out)),
        std::thread::spawn(move || read_all(&mut err)),
    )
}

/// A Python with the pinned SDK: `TETHER_TEST_PYTHON`, or the virtualenv
/// `py-mcp` under the target directory (tests/common/peers.rs sets it up).
fn setup_python() -> Result<PathBuf, String> {
    peers::pinned_venv(
        "TETHER_TEST_PYTHON",
        &scripts_dir().join("requirements.txt"),
        "py-mcp",
    )
}

/// The Python every test shares (set up once per test binary).
fn python() -> &'static Path {
    static PYTHON: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match PYTHON.get_or_init(setup_python) {
        Ok(p) => p,
        Err(e) => panic!(
            "the MCP end-to-end tests need the official MCP Python SDK and could not set it up:\n{e}\n\
             (set TETHER_TEST_PYTHON to a Python with `pip install -r crates/tether-cli/tests/mcp/requirements.txt` done)"
        ),
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
    let (out, err) = drain(&mut child);
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
    let (out, err) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    assert!(
        status.success(),
        "client.py {args:?} failed ({status}):\nstdout:\n{out}\nstderr:\n{err}"
    );
    out
}

fn stdio_scenario(name: &str, mode: &str, state_dir: &Path) -> String {
    let dir = state_dir.to_str().expect("utf-8 path");
    scenario(&[
        name,
        "--transport",
        "stdio",
        "--mode",
        mode,
        "--bin",
        BIN,
        "--state-dir",
        dir,
    ])
}

// ----- an MCP HTTP endpoint ------------------------------------------------------

/// `tether serve --mcp-http 127.0.0.1:0` with one agent principal configured.
struct McpHttp {
    child: Child,
    addr: SocketAddr,
    state_dir: PathBuf,
    _tmp: tempfile::TempDir,
}

impl McpHttp {
    fn start() -> McpHttp {
        let tmp = tempfile::tempdir().expect("tempdir");
        let cfg = tmp.path().join("tether.toml");
        let digest = tether_server_digest(AGENT_TOKEN);
        std::fs::write(
            &cfg,
            format!("builtin_cell = true\n\n[[principals]]\nid = \"planner\"\nkind = \"agent\"\ntoken_sha256 = \"{digest}\"\n"),
        )
        .expect("config");
        let state_dir = tmp.path().join("state");
        let mut child = Command::new(BIN)
            .arg("serve")
            .arg("--config")
            .arg(&cfg)
            .arg("--state-dir")
            .arg(&state_dir)
            .args(["--mcp-http", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tether serve --mcp-http");
        let addr = wait_listening(&mut child);
        McpHttp {
            child,
            addr,
            state_dir,
            _tmp: tmp,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    fn scenario(&self, name: &str, mode: &str, token: bool) -> String {
        let url = self.url();
        let mut args = vec![name, "--transport", "http", "--mode", mode, "--url", &url];
        if token {
            args.extend(["--token", AGENT_TOKEN]);
        }
        scenario(&args)
    }
}

impl Drop for McpHttp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The SHA-256 hex of a token, as `[[principals]] token_sha256` wants it.
fn tether_server_digest(token: &str) -> String {
    tether_server::auth::token_digest(token)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Reads stderr until the MCP listening line; keeps draining it afterwards.
fn wait_listening(child: &mut Child) -> SocketAddr {
    let pipe = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        let mut r = BufReader::new(pipe);
        let mut line = String::new();
        while r.read_line(&mut line).is_ok_and(|n| n > 0) {
            let _ = tx.send(std::mem::take(&mut line));
        }
    });
    let deadline = Instant::now() + common::TIMEOUT;
    let mut seen = String::new();
    while Instant::now() < deadline {
        let Ok(line) = rx.recv_timeout(Duration::from_millis(100)) else {
            continue;
        };
        seen.push_str(&line);
        if let Some(rest) = line.split("MCP listening on http://").nth(1) {
            let host = rest.split('/').next().expect("host");
            return host.parse().expect("listening address");
        }
    }
    panic!("tether did not print its MCP address; stderr:\n{seen}");
}

/// One raw HTTP/1.1 POST to `/mcp`; answers the status and body.
fn post_mcp(addr: SocketAddr, body: &[u8], headers: &str) -> (u16, String) {
    let head = format!("Host: {addr}\r\n{headers}Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n");
    let (status, _, body) = raw_mcp(addr, "POST", &head, body);
    (status, body)
}

/// The receipts of `capability_id` in the exported evidence chain.
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
            let body = e.get("body")?.clone();
            let receipt = body.get("receipt").cloned().unwrap_or(body);
            (receipt.get("capability_id")? == capability_id && receipt.get("status").is_some())
                .then_some(receipt)
        })
        .collect()
}

/// How many evidence entries of `kind` the chain holds.
fn count_kind(state_dir: &Path, kind: &str) -> usize {
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
        .filter(|e| e["kind"] == kind)
        .count()
}

/// Every kernel session the MCP connections opened was closed when they ended.
fn wait_sessions_closed(state_dir: &Path) {
    let deadline = Instant::now() + common::TIMEOUT;
    loop {
        let (opened, closed) = (
            count_kind(state_dir, "session.open"),
            count_kind(state_dir, "session.close"),
        );
        if opened > 0 && opened == closed {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "sessions opened {opened}, closed {closed}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn wait_for_cancelled_move(state_dir: &Path) {
    let deadline = Instant::now() + common::TIMEOUT;
    loop {
        let moves = receipts_of(state_dir, "cap.motion.move_to.v1");
        if moves.iter().any(|r| r["status"] == "cancelled") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no cancelled move_to receipt in the evidence: {moves:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

// ----- over stdio ------------------------------------------------------------------

#[test]
fn python_sdk_legacy_mode_drives_the_governed_path_over_stdio() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = stdio_scenario("governed", "legacy", dir.path());
    assert!(
        out.contains("governed ok") && out.contains("protocol 2025-11-25"),
        "{out}"
    );
    wait_sessions_closed(dir.path());
}

#[test]
fn python_sdk_auto_mode_drives_the_governed_path_over_stdio() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = stdio_scenario("governed", "auto", dir.path());
    assert!(
        out.contains("governed ok") && out.contains("protocol 2026-07-28"),
        "{out}"
    );
    wait_sessions_closed(dir.path());
}

#[test]
fn the_estop_tool_is_answered_while_a_motion_runs_and_cancels_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = stdio_scenario("estop_during_motion", "auto", dir.path());
    assert!(out.contains("estop_during_motion ok"), "{out}");
}

#[test]
fn a_cancelled_stdio_call_reports_progress_and_cancels_the_motion() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = stdio_scenario("motion", "legacy", dir.path());
    assert!(out.contains("motion ok"), "{out}");
    wait_for_cancelled_move(dir.path());
}

/// Runs `tether mcp` with raw lines on stdin; answers the output lines.
fn raw_stdio(lines: &[&[u8]]) -> Vec<Value> {
    let dir = tempfile::tempdir().expect("tempdir");
    raw_stdio_in(dir.path(), lines)
}

/// [`raw_stdio`] on the state directory `dir`.
fn raw_stdio_in(dir: &Path, lines: &[&[u8]]) -> Vec<Value> {
    let mut child = Command::new(BIN)
        .arg("mcp")
        .arg("--state-dir")
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn tether mcp");
    let mut stdin = child.stdin.take().expect("stdin");
    for line in lines {
        stdin.write_all(line).expect("write");
        stdin.write_all(b"\n").expect("write");
    }
    drop(stdin);
    let mut out = String::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut out)
        .expect("read");
    let _ = child.wait();
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

#[test]
fn stdio_answers_malformed_duplicate_deep_and_oversized_input_with_json_rpc_errors() {
    let big = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"ping\",\"params\":{{\"pad\":\"{}\"}}}}",
        "x".repeat(1 << 20)
    );
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    let answers = raw_stdio(&[
        b"{not json",
        br#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#,
        deep.as_bytes(),
        big.as_bytes(),
        br#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#,
    ]);
    let codes: Vec<&Value> = answers.iter().map(|a| &a["error"]["code"]).collect();
    assert_eq!(
        codes[..4],
        [
            &json!(-32700),
            &json!(-32700),
            &json!(-32700),
            &json!(-32600)
        ],
        "{answers:?}"
    );
    assert_eq!(
        answers[3]["error"]["data"]["mhs_code"], "MHS.PROTOCOL.TOO_LARGE",
        "{answers:?}"
    );
    // The connection survives bad input: the ping after it is answered.
    assert_eq!(answers[4]["id"], 3, "{answers:?}");
    assert!(answers[4].get("result").is_some(), "{answers:?}");
}

/// The receipt capability of an endpoint e-stop.
const ESTOP_RECEIPT: &str = "cap.internal.safety_estop.v1";

/// The answer with `id` among `answers`.
fn answer_for<'a>(answers: &'a [Value], id: &Value) -> &'a Value {
    answers
        .iter()
        .find(|a| &a["id"] == id)
        .unwrap_or_else(|| panic!("no answer for {id}: {answers:?}"))
}

/// Asserts `answer` is the protocol error `code` saying the e-stop was served.
fn assert_estop_served(answer: &Value, code: i64) {
    assert_eq!(answer["error"]["code"], code, "{answer}");
    let data = &answer["error"]["data"];
    assert!(
        data["mhs_code"]
            .as_str()
            .is_some_and(|c| c.starts_with("MHS.PROTOCOL.")),
        "{answer}"
    );
    assert_eq!(data["details"]["estop_served"], true, "{answer}");
    assert_eq!(
        data["details"]["receipt"]["capability_id"], ESTOP_RECEIPT,
        "{answer}"
    );
}

/// The devices latched by an e-stop whose reason, in the evidence, records
/// a request defect.
fn defect_stopped_devices(state_dir: &Path) -> Vec<String> {
    let run = tether(&[
        "audit".as_ref(),
        "export".as_ref(),
        "--state-dir".as_ref(),
        state_dir.as_os_str(),
    ]);
    assert_eq!(run.code, Some(0), "audit export: {}", run.stderr);
    let mut ids: Vec<String> = run
        .stdout_text()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["kind"] == "safety.estop")
        .filter(|e| {
            e["body"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("request defect"))
        })
        .filter_map(|e| e["body"]["device_id"].as_str().map(str::to_owned))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

const INITIALIZE: &[u8] = br#"{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;

#[test]
fn stdio_latches_a_malformed_or_early_estop_and_says_it_was_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let answers = raw_stdio_in(
        dir.path(),
        &[
            // Before initialize: the SDK would refuse it without a stop.
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"estop","arguments":{}}}"#,
            INITIALIZE,
            br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"estop","arguments":["arm-1"]}}"#,
            br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"estop","arguments":"arm-1"}}"#,
            br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"estop","arguments":{"reason":"a","reason":"b"}}}"#,
            // Malformed params of another tool: invalid params, with a code.
            br#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"arm-1__stop","arguments":[]}}"#,
            br#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":5}}"#,
            br#"{"jsonrpc":"2.0","id":7,"method":"tools/call"}"#,
            br#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"arm-1__stop","arguments":"x"}}"#,
        ],
    );
    assert_estop_served(answer_for(&answers, &json!(1)), -32600);
    assert_estop_served(answer_for(&answers, &json!(2)), -32602);
    assert_estop_served(answer_for(&answers, &json!(3)), -32602);
    // A parse error has no usable id.
    assert_estop_served(answer_for(&answers, &Value::Null), -32700);
    for id in 5..=8 {
        let a = answer_for(&answers, &json!(id));
        assert_eq!(a["error"]["code"], -32602, "{a}");
        assert_eq!(
            a["error"]["data"]["mhs_code"], "MHS.PROTOCOL.INVALID_PARAMS",
            "{a}"
        );
        assert_eq!(a["error"]["data"]["retryable"], false, "{a}");
        assert!(a["error"]["data"]["details"]["reason"].is_string(), "{a}");
    }
    // Every device was latched, and the evidence records the defect.
    assert_eq!(
        defect_stopped_devices(dir.path()),
        ["arm-1", "relay-1", "thermostat-1"]
    );
}

#[test]
fn stdio_estop_tool_summary_names_every_device_and_an_unknown_one() {
    let answers = raw_stdio(&[
        INITIALIZE,
        br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"estop","arguments":{"device_id":"nope"}}}"#,
        br#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    ]);
    let first = answer_for(&answers, &json!(1))["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(first.contains("No device `nope` is served here"), "{first}");
    for d in ["thermostat-1", "arm-1", "relay-1"] {
        assert!(first.contains(d), "{first}");
    }
    let tools = answer_for(&answers, &json!(2))["result"]["tools"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let stop = tools
        .iter()
        .find(|t| t["name"] == "arm-1__stop")
        .and_then(|t| t["description"].as_str())
        .unwrap_or_default();
    assert!(stop.contains("risk class R2"), "{stop}");
    assert!(
        !tools
            .iter()
            .any(|t| t["description"].as_str().is_some_and(|d| d.contains(".."))),
        "{tools:?}"
    );
}

#[test]
fn closing_stdin_mid_motion_cancels_the_call_and_its_receipt_is_recorded_before_exit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(BIN)
        .arg("mcp")
        .arg("--state-dir")
        .arg(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn tether mcp");
    let mut stdin = child.stdin.take().expect("stdin");
    let lines = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        // Six seconds of motion.
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "arm-1__move_to", "arguments": {"joints": [3.0, 0, 0, 0, 0, 0], "speed": 0.5}}}),
    ];
    for line in lines {
        writeln!(stdin, "{line}").expect("write");
    }
    std::thread::sleep(Duration::from_millis(700));
    let closed_at = Instant::now();
    drop(stdin);
    let deadline = closed_at + common::TIMEOUT;
    while child.try_wait().expect("try_wait").is_none() {
        assert!(
            Instant::now() < deadline,
            "tether mcp did not exit after stdin closed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The process has exited: the receipt must already be in the evidence.
    let moves = receipts_of(dir.path(), "cap.motion.move_to.v1");
    assert!(
        moves.iter().any(|r| r["status"] == "cancelled"),
        "no cancelled move_to receipt after stdin closed: {moves:?}"
    );
}

#[test]
fn stdio_refuses_to_start_without_the_configured_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("tether.toml");
    std::fs::write(
        &cfg,
        format!("builtin_cell = true\n\n[[principals]]\nid = \"planner\"\nkind = \"agent\"\ntoken_sha256 = \"{}\"\n", tether_server_digest(AGENT_TOKEN)),
    )
    .expect("config");
    let run = tether(&[
        "mcp".as_ref(),
        "--config".as_ref(),
        cfg.as_os_str(),
        "--state-dir".as_ref(),
        dir.path().join("state").as_os_str(),
        "--token-env".as_ref(),
        "TETHER_MCP_TEST_NO_SUCH_VAR".as_ref(),
    ]);
    assert_eq!(run.code, Some(2), "stderr: {}", run.stderr);
    assert!(
        run.stderr.contains("TETHER_MCP_TEST_NO_SUCH_VAR"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains(AGENT_TOKEN));
}

// ----- over streamable HTTP ------------------------------------------------------

#[test]
fn python_sdk_legacy_mode_drives_the_governed_path_over_http_with_a_token() {
    let s = McpHttp::start();
    let out = s.scenario("governed", "legacy", true);
    assert!(
        out.contains("governed ok") && out.contains("protocol 2025-11-25"),
        "{out}"
    );
    // The client's DELETE ended the MCP session, and with it the kernel session.
    wait_sessions_closed(&s.state_dir);
}

#[test]
fn python_sdk_auto_mode_drives_the_governed_path_over_http_with_a_token() {
    let s = McpHttp::start();
    let out = s.scenario("governed", "auto", true);
    assert!(
        out.contains("governed ok") && out.contains("protocol 2026-07-28"),
        "{out}"
    );
    // Stateless requests each had their own handler; none left a session open.
    wait_sessions_closed(&s.state_dir);
}

#[test]
fn an_http_client_without_a_token_is_refused_in_both_modes() {
    let s = McpHttp::start();
    for mode in ["legacy", "auto"] {
        let out = s.scenario("no_token", mode, false);
        assert!(out.contains("no_token ok"), "{out}");
    }
    let (status, body) = post_mcp(s.addr, br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#, "");
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("MHS.AUTH.UNAUTHENTICATED"), "{body}");
}

#[test]
fn an_abandoned_http_call_reports_progress_and_cancels_the_motion_in_both_modes() {
    let s = McpHttp::start();
    // auto (2026-07-28): the SDK aborts the POST, a disconnect; legacy
    // (2025-11-25): it sends notifications/cancelled on the MCP session.
    for mode in ["auto", "legacy"] {
        let out = s.scenario("motion", mode, true);
        assert!(out.contains("motion ok"), "{out}");
    }
    let deadline = Instant::now() + common::TIMEOUT;
    while receipts_of(&s.state_dir, "cap.motion.move_to.v1")
        .iter()
        .filter(|r| r["status"] == "cancelled")
        .count()
        < 2
    {
        assert!(
            Instant::now() < deadline,
            "fewer than two cancelled move_to receipts"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn http_refuses_malformed_and_oversized_bodies_with_protocol_errors() {
    let s = McpHttp::start();
    let auth = format!("Authorization: Bearer {AGENT_TOKEN}\r\n");
    let (status, body) = post_mcp(
        s.addr,
        br#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#,
        &auth,
    );
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("-32700") && body.contains("MHS.PROTOCOL.PARSE_ERROR"),
        "{body}"
    );
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    let (status, body) = post_mcp(s.addr, deep.as_bytes(), &auth);
    assert_eq!(status, 400, "{body}");
    let big = vec![b' '; (1 << 20) + 16];
    let (status, body) = post_mcp(s.addr, &big, &auth);
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("MHS.PROTOCOL.TOO_LARGE"), "{body}");
}

#[test]
fn http_latches_a_malformed_or_sessionless_estop_and_says_it_was_served() {
    let s = McpHttp::start();
    let auth = format!("Authorization: Bearer {AGENT_TOKEN}\r\n");
    let served = |body: &[u8], code: i64| {
        let (status, text) = post_mcp(s.addr, body, &auth);
        assert!((400..500).contains(&status), "{status} {text}");
        let answer: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_estop_served(&answer, code);
    };
    served(
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"estop","arguments":["arm-1"]}}"#,
        -32602,
    );
    served(
        br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"estop","arguments":{"reason":"a","reason":"b"}}}"#,
        -32700,
    );
    // Well-formed but with no MCP session: the SDK refuses it; the stop runs.
    served(
        br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"estop","arguments":{}}}"#,
        -32600,
    );
    let (status, text) = post_mcp(
        s.addr,
        br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"arm-1__stop","arguments":[]}}"#,
        &auth,
    );
    assert_eq!(status, 400, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(answer["error"]["code"], -32602, "{text}");
    assert_eq!(
        answer["error"]["data"]["mhs_code"], "MHS.PROTOCOL.INVALID_PARAMS",
        "{text}"
    );
    assert_eq!(
        defect_stopped_devices(&s.state_dir),
        ["arm-1", "relay-1", "thermostat-1"]
    );
}

/// One raw request on `/mcp` with exactly the given header lines.
fn raw_mcp(addr: SocketAddr, method: &str, headers: &str, body: &[u8]) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(common::TIMEOUT))
        .expect("timeout");
    let head = format!(
        "{method} /mcp HTTP/1.1\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(body));
    let mut raw = Vec::new();
    let _ = stream.take(1 << 20).read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {text:?}"));
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (status, head.to_ascii_lowercase(), body.to_owned())
}

#[test]
fn http_transport_refusals_are_json_rpc_errors() {
    let s = McpHttp::start();
    let addr = s.addr;
    let auth = format!("Authorization: Bearer {AGENT_TOKEN}\r\n");
    let list = br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#;
    // (method, headers, the code; `None`: the SDK's refusal, with its status).
    let cases: Vec<(String, String, Option<&str>)> = vec![
        // Wrong content type: refused at the edge (415), before the SDK.
        (
            "POST".into(),
            format!("Host: {addr}\r\n{auth}Content-Type: text/plain\r\nAccept: application/json, text/event-stream\r\n"),
            Some("MHS.PROTOCOL.UNSUPPORTED_MEDIA_TYPE"),
        ),
        // No Accept for the event stream.
        (
            "POST".into(),
            format!("Host: {addr}\r\n{auth}Content-Type: application/json\r\n"),
            None,
        ),
        // A GET without a session.
        (
            "GET".into(),
            format!("Host: {addr}\r\n{auth}Accept: text/event-stream\r\n"),
            None,
        ),
    ];
    for (method, headers, code) in cases {
        let body: &[u8] = if method == "GET" { b"" } else { list };
        let (status, head, text) = raw_mcp(addr, &method, &headers, body);
        assert!(
            (400..500).contains(&status),
            "{method} {headers}: {status} {text}"
        );
        assert!(head.contains("content-type: application/json"), "{head}");
        let answer: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(answer["jsonrpc"], "2.0", "{text}");
        let data = &answer["error"]["data"];
        match code {
            Some(code) => {
                assert_eq!(status, 415, "{text}");
                assert_eq!(data["mhs_code"], code, "{text}");
            }
            None => {
                assert_eq!(data["mhs_code"], "MHS.PROTOCOL.INVALID_REQUEST", "{text}");
                assert_eq!(data["details"]["http_status"], status, "{text}");
            }
        }
    }
}

/// A `tools/call` of `estop` too large to read.
fn oversized_estop_call(id: u64) -> Vec<u8> {
    let mut big = format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"estop","arguments":{{"device_id":"relay-1","reason":""#
    )
    .into_bytes();
    big.extend(std::iter::repeat_n(b'a', 2 << 20));
    big.extend_from_slice(br#""}}}"#);
    big
}

/// An e-stop call too large to read still stops, every device (its
/// arguments were never read), and the TOO_LARGE error says so; over stdio
/// and over HTTP (413).
#[test]
fn an_oversized_estop_call_still_stops_every_device() {
    let dir = tempfile::tempdir().expect("tempdir");
    let big = oversized_estop_call(9);
    let answers = raw_stdio_in(
        dir.path(),
        &[
            INITIALIZE,
            br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            &big,
        ],
    );
    // Its id was never read: the answer's id is null.
    let a = answer_for(&answers, &Value::Null);
    assert_estop_served(a, -32600);
    assert_eq!(
        a["error"]["data"]["mhs_code"], "MHS.PROTOCOL.TOO_LARGE",
        "{a}"
    );
    assert_eq!(
        defect_stopped_devices(dir.path()),
        ["arm-1", "relay-1", "thermostat-1"]
    );

    let s = McpHttp::start();
    let auth = format!("Authorization: Bearer {AGENT_TOKEN}\r\n");
    let (status, text) = post_mcp(s.addr, &oversized_estop_call(10), &auth);
    assert_eq!(status, 413, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_estop_served(&answer, -32600);
    assert_eq!(
        defect_stopped_devices(&s.state_dir),
        ["arm-1", "relay-1", "thermostat-1"]
    );
}

/// A held tool call over stdio, against a config with a holding policy and
/// `console_url`: the result names the approval, the policy's reason and
/// the quorum, and the host (which supports URL elicitation) is sent the
/// console's page for that approval.
#[test]
fn a_held_call_sends_the_host_to_the_approval_in_the_console() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("policy.cedar"),
        // The operators example's: setpoints above 60 degC wait for two.
        include_str!("../../../examples/operators/policy.cedar"),
    )
    .expect("policy");
    let cfg = dir.path().join("tether.toml");
    std::fs::write(
        &cfg,
        format!(
            "builtin_cell = true\npolicy = \"policy.cedar\"\nconsole_url = \"http://127.0.0.1:7878/console/\"\n\n[[principals]]\nid = \"planner\"\nkind = \"agent\"\ntoken_sha256 = \"{}\"\n",
            tether_server_digest(AGENT_TOKEN)
        ),
    )
    .expect("config");
    let state = dir.path().join("state");
    let out = scenario(&[
        "held_to_console",
        "--transport",
        "stdio",
        "--mode",
        "legacy",
        "--bin",
        BIN,
        "--state-dir",
        state.to_str().expect("utf-8"),
        "--config",
        cfg.to_str().expect("utf-8"),
        "--token",
        AGENT_TOKEN,
    ]);
    assert!(out.contains("held_to_console ok"), "{out}");
}
