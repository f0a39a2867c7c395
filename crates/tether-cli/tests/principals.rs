//! Principals and bearer tokens over HTTP and stdio.
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
use std::time::Duration;

const OP_TOKEN: &str = "operator-token-3f9a";
const BOT_TOKEN: &str = "agent-token-77c1";

fn sha256_hex(s: &str) -> String {
    // Computed with the binary's own notion of the digest, via a tiny helper:
    // `echo -n TOKEN | sha256sum` gives the same.
    use std::process::Command;
    let out = Command::new("sha256sum")
        .arg("-")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().expect("stdin").write_all(s.as_bytes())?;
            c.wait_with_output()
        });
    String::from_utf8_lossy(&out.expect("sha256sum").stdout)
        .split_whitespace()
        .next()
        .expect("digest")
        .to_owned()
}

fn config(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("tether.toml");
    let text = format!(
        "builtin_cell = true\n\n[[principals]]\nid = \"alice\"\nkind = \"human\"\nroles = [\"operator\"]\ntoken_sha256 = \"{}\"\n\n[[principals]]\nid = \"planner\"\nkind = \"agent\"\ntoken_sha256 = \"{}\"\n",
        sha256_hex(OP_TOKEN),
        sha256_hex(BOT_TOKEN)
    );
    std::fs::write(&path, text).expect("config");
    path
}

fn call(s: &Server, token: Option<&str>, method: &str, params: Value) -> (u16, Value) {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string();
    let headers = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let r = http_post_with(s.addr(), body.as_bytes(), Duration::from_secs(10), &headers);
    (r.status, r.json())
}

#[test]
fn with_principals_configured_every_request_needs_a_valid_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path());
    let s = Server::start_with(
        Transport::Http,
        Some(&dir.path().join("state")),
        &[OsStr::new("--config"), cfg.as_os_str()],
    );
    let (status, body) = call(&s, None, "mhs.hello", json!({}));
    assert_eq!(status, 401);
    assert_eq!(
        body["error"]["data"]["mhs_code"],
        "MHS.AUTH.UNAUTHENTICATED"
    );
    assert_eq!(body["error"]["data"]["details"]["reason"], "missing_token");
    let (status, body) = call(&s, Some("wrong"), "mhs.hello", json!({}));
    assert_eq!(status, 401);
    assert_eq!(body["error"]["data"]["details"]["reason"], "invalid_token");
    // Even the e-stop needs the token when principals are configured; nothing latched.
    let (status, _) = call(&s, None, "mhs.safety.estop", json!({}));
    assert_eq!(status, 401);
    let (_, hello) = call(&s, Some(BOT_TOKEN), "mhs.hello", json!({}));
    assert_eq!(
        hello["result"]["principal"],
        json!({"id": "planner", "kind": "agent"})
    );
    let (_, st) = call(&s, Some(BOT_TOKEN), "mhs.safety.status", json!({}));
    assert!(st["result"]["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .all(|d| d["latched"] == false));
}

#[test]
fn sessions_belong_to_their_principal_and_tokens_never_reach_the_evidence() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path());
    let state = dir.path().join("state");
    let s = Server::start_with(
        Transport::Http,
        Some(&state),
        &[OsStr::new("--config"), cfg.as_os_str()],
    );
    let (_, open) = call(&s, Some(BOT_TOKEN), "mhs.session.open", json!({}));
    let sid = open["result"]["session_id"]
        .as_str()
        .expect("sid")
        .to_owned();
    let (_, other) = call(
        &s,
        Some(OP_TOKEN),
        "mhs.resource.read",
        json!({"session_id": sid, "device_id": "thermostat-1", "resource": "main"}),
    );
    assert_eq!(
        other["error"]["data"]["mhs_code"], "MHS.SESSION.UNKNOWN",
        "{other}"
    );
    let (_, own) = call(
        &s,
        Some(BOT_TOKEN),
        "mhs.resource.read",
        json!({"session_id": sid, "device_id": "thermostat-1", "resource": "main"}),
    );
    assert_eq!(own["result"]["revision"], 0, "{own}");
    let export = tether(&[
        "audit".as_ref(),
        "export".as_ref(),
        "--state-dir".as_ref(),
        state.as_os_str(),
    ]);
    let chain = export.stdout_text();
    assert!(chain.contains("planner"), "the principal is recorded");
    assert!(
        !chain.contains(BOT_TOKEN) && !chain.contains(OP_TOKEN),
        "no token in the evidence"
    );
    assert!(!s.stderr_text().contains(BOT_TOKEN), "no token in the logs");
}

#[test]
fn only_an_operator_may_reset_a_hardware_latch_but_anyone_authenticated_may_stop() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path());
    let s = Server::start_with(
        Transport::Http,
        Some(&dir.path().join("state")),
        &[OsStr::new("--config"), cfg.as_os_str()],
    );
    let (_, stop) = call(
        &s,
        Some(BOT_TOKEN),
        "mhs.safety.estop",
        json!({"device_id": "relay-1"}),
    );
    assert_eq!(stop["result"]["status"], "completed", "{stop}");
    // relay-1 is simulated: an agent may reset it.
    let (_, reset) = call(
        &s,
        Some(BOT_TOKEN),
        "mhs.safety.reset",
        json!({"device_id": "relay-1"}),
    );
    assert_eq!(reset["result"]["status"], "completed", "{reset}");
}

#[test]
fn an_agent_can_never_hold_the_operator_role() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tether.toml");
    std::fs::write(&path, format!("builtin_cell = true\n[[principals]]\nid = \"m\"\nkind = \"agent\"\nroles = [\"operator\"]\ntoken_sha256 = \"{}\"\n", sha256_hex("x"))).expect("write");
    let run = tether(&["check".as_ref(), path.as_os_str()]);
    assert_eq!(run.code, Some(1));
    assert!(
        run.stderr.contains("principals[0]")
            && run.stderr.contains("operator role is for humans only"),
        "{}",
        run.stderr
    );
}

#[test]
fn two_principals_may_not_share_a_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tether.toml");
    let same = sha256_hex("same");
    std::fs::write(&path, format!("builtin_cell = true\n[[principals]]\nid = \"bot\"\nkind = \"agent\"\ntoken_sha256 = \"{same}\"\n[[principals]]\nid = \"op\"\nkind = \"human\"\nroles = [\"operator\"]\ntoken_sha256 = \"{same}\"\n")).expect("write");
    let run = tether(&["check".as_ref(), path.as_os_str()]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains("principals[1]") && run.stderr.contains("same token as `bot`"),
        "{}",
        run.stderr
    );
}

#[test]
fn stdio_refuses_to_start_without_a_valid_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path());
    let out = std::process::Command::new(BIN)
        .args([
            OsStr::new("serve"),
            OsStr::new("--stdio"),
            OsStr::new("--config"),
            cfg.as_os_str(),
            OsStr::new("--state-dir"),
            dir.path().join("state").as_os_str(),
        ])
        .env("TETHER_TOKEN", "nope")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("MHS.AUTH.UNAUTHENTICATED"));
}
