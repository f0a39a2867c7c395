//! The operator's path from a shell (issue 19 §1): tokens made without hand
//! work, a process that needs only the token it is given, and CLI errors
//! that name the real cause — against the real binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::json;
use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Stdio};

/// Runs `tether ARGS` with exactly the `TETHER_*` variables given.
fn run(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args).stdin(Stdio::null());
    for var in [
        "TETHER_TOKEN",
        "TETHER_ENDPOINT",
        "TETHER_OPERATOR_TOKEN",
        "TETHER_AGENT_TOKEN",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run tether");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

/// A config whose two principals take their tokens from the environment.
fn env_config(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("tether.toml");
    std::fs::write(
        &path,
        "builtin_cell = true\n\n[[principals]]\nid = \"operator\"\nkind = \"human\"\nroles = [\"operator\"]\ntoken_env = \"TETHER_OPERATOR_TOKEN\"\n\n[[principals]]\nid = \"agent\"\nkind = \"agent\"\ntoken_env = \"TETHER_AGENT_TOKEN\"\n",
    )
    .unwrap();
    path
}

#[test]
fn token_new_prints_a_fresh_token_and_its_config_line() {
    let (code, out, _) = run(&["token", "new"], &[]);
    assert_eq!(code, Some(0));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    let token = lines[0];
    assert!(token.starts_with("tt_") && token.len() == 67, "{token}");
    assert_eq!(
        lines[1],
        format!("token_sha256 = \"{}\"", sha256_hex(token))
    );
    let (_, again, _) = run(&["token", "new"], &[]);
    assert_ne!(
        again.lines().next(),
        Some(token),
        "a fresh token every time"
    );
}

#[test]
fn a_process_needs_only_the_token_it_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = env_config(dir.path());
    // The agent's endpoint: no operator token in its environment.
    let s = Server::start_with_env(
        Transport::Http,
        Some(&dir.path().join("state")),
        &[OsStr::new("--config"), cfg.as_os_str()],
        &[("TETHER_AGENT_TOKEN", "agent-secret-1")],
    );
    let opened = call_with_token(&s, "agent-secret-1", "mhs.session.open", json!({}));
    assert!(opened.get("result").is_some(), "{opened}");
    // Nothing authenticates as the operator here, whatever it sends.
    for guess in ["agent-secret-1x", "operator", "TETHER_OPERATOR_TOKEN"] {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "mhs.safety.status", "params": {}});
        let r = http_post_with(
            s.addr(),
            body.to_string().as_bytes(),
            TIMEOUT,
            &format!("Authorization: Bearer {guess}\r\n"),
        );
        assert_eq!(r.status, 401, "{}", r.text());
    }
    let said = s.stderr_text();
    assert_eq!(
        said.matches("TETHER_OPERATOR_TOKEN").count(),
        1,
        "said once: {said}"
    );
    // `check` accepts the config as it is.
    let (code, _, err) = run(&["check", cfg.to_str().unwrap()], &[]);
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn operator_commands_name_the_real_cause_and_take_the_endpoint_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = env_config(dir.path());
    let s = Server::start_with_env(
        Transport::Http,
        Some(&dir.path().join("state")),
        &[OsStr::new("--config"), cfg.as_os_str()],
        &[
            ("TETHER_AGENT_TOKEN", "agent-secret-2"),
            ("TETHER_OPERATOR_TOKEN", "operator-secret-2"),
        ],
    );
    let url = format!("http://{}/rpc", s.addr());
    // No token: the refusal says to set it (not something about terminals).
    let (code, _, err) = run(
        &["reset", "--device", "arm-1"],
        &[("TETHER_ENDPOINT", &url)],
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("TETHER_TOKEN") && err.contains("MHS.AUTH"),
        "{err}"
    );
    // An unknown device is named as such.
    let (code, _, err) = run(
        &["reset", "--device", "no-such-device"],
        &[
            ("TETHER_ENDPOINT", &url),
            ("TETHER_TOKEN", "operator-secret-2"),
        ],
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("no-such-device") && err.contains("MHS."),
        "{err}"
    );
    // The endpoint comes from TETHER_ENDPOINT.
    let (code, out, err) = run(
        &["approvals", "list"],
        &[
            ("TETHER_ENDPOINT", &url),
            ("TETHER_TOKEN", "operator-secret-2"),
        ],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    // Nothing listening there, or no JSON-RPC at that path: said plainly.
    let nothing = format!("http://127.0.0.1:{}/rpc", free_port());
    let (code, _, err) = run(&["approvals", "list", "--endpoint", &nothing], &[]);
    assert_ne!(code, Some(0));
    assert!(
        err.contains("cannot reach") && err.contains("--http"),
        "{err}"
    );
    let wrong_path = format!("http://{}/nope", s.addr());
    let (code, _, err) = run(&["approvals", "list", "--endpoint", &wrong_path], &[]);
    assert_ne!(code, Some(0));
    assert!(
        err.contains("serves no JSON-RPC") && err.contains("--http"),
        "{err}"
    );
    // Every status filter is offered.
    let (_, help, _) = run(&["approvals", "list", "--help"], &[]);
    for status in [
        "pending", "approved", "denied", "used", "expired", "revoked",
    ] {
        assert!(help.contains(status), "{status} in {help}");
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

/// `examples/operators/` works as shipped: `check` accepts it, a hot
/// setpoint is held, both operators approve from the CLI (the endpoint from
/// `TETHER_ENDPOINT`), and the agent's retry runs.
#[test]
fn the_operators_example_runs_as_shipped() {
    let example = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/operators/tether.toml");
    let tokens = [
        ("ALICE_TOKEN", "alice-example-token"),
        ("BOB_TOKEN", "bob-example-token"),
        ("PLANNER_TOKEN", "planner-example-token"),
    ];
    let (code, _, err) = run(&["check", example.to_str().unwrap()], &tokens);
    assert_eq!(code, Some(0), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with_env(
        Transport::Http,
        Some(&dir.path().join("state")),
        &[OsStr::new("--config"), example.as_os_str()],
        &tokens,
    );
    let agent = "planner-example-token";
    let sid = call_with_token(&s, agent, "mhs.session.open", json!({}))["result"]["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let hot = json!({"session_id": sid, "device_id": "thermostat-1", "capability_id": "cap.thermal.setpoint.v1",
                     "input": {"target_temperature": 70}, "command_id": "hot-1"});
    let held = call_with_token(&s, agent, "mhs.command", hot.clone());
    let id = assert_rejected(&held["result"], "MHS.POLICY.HELD")["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let url = format!("http://{}/rpc", s.addr());
    for token in ["alice-example-token", "bob-example-token"] {
        let (code, out, err) = run(
            &["approvals", "approve", &id, "--reason", "checked"],
            &[("TETHER_ENDPOINT", &url), ("TETHER_TOKEN", token)],
        );
        assert_eq!(code, Some(0), "{out}{err}");
    }
    let done = call_with_token(&s, agent, "mhs.command", hot);
    assert_eq!(done["result"]["status"], "completed", "{done}");
}

/// Principals configured but none of their tokens given to this process:
/// nobody is served (never everybody as the local caller).
#[test]
fn principals_without_any_usable_token_serve_nobody() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = env_config(dir.path());
    let s = Server::start_with_env(
        Transport::Http,
        Some(&dir.path().join("state")),
        &[OsStr::new("--config"), cfg.as_os_str()],
        &[],
    );
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "mhs.session.open", "params": {}});
    for auth in ["", "Authorization: Bearer anything\r\n"] {
        let r = http_post_with(s.addr(), body.to_string().as_bytes(), TIMEOUT, auth);
        assert_eq!(r.status, 401, "{}", r.text());
    }
}
