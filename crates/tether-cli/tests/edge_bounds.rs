//! The edge, bounds per caller (issue 17, part C), against the real binary
//! with the bounds set low in the config: no one caller starves the others.
//! MCP HTTP sessions, open approvals and permits are bounded per principal
//! and in all (the excess refused `MHS.PROTOCOL.LIMIT`, retryable, 429 with
//! `Retry-After` on HTTP, never INTERNAL, never evicting another's);
//! `mhs.approvals.list` is paged; operations belong to their principal; free
//! text is bounded (refused, an e-stop's reason cut); errors never echo a
//! long id.
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
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};

const AGENT: &str = "agent-token-e1";
const AGENT_B: &str = "agent-b-token-e2";
const ALICE: &str = "alice-token-e3";
const CAROL: &str = "carol-token-e4";
const SERVICE: &str = "svc-token-e5";

/// Setpoints above 60 degC are held for one operator, for anyone; everything
/// else on the simulated cell is allowed.
const HOLD_POLICY: &str = r#"
@id("reads") permit(principal, action == Tether::Action::"read", resource);
@id("cell") permit(principal, action, resource) when { context.mode == "simulated" };
@id("hot-setpoints")
@hold("setpoints above 60 degC need an operator")
permit(principal, action == Tether::Action::"command", resource)
  when { resource.capability == "cap.thermal.setpoint.v1" &&
         context.input has target_temperature &&
         context.input.target_temperature.greaterThan(decimal("60.0")) };
"#;

fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

fn principal(id: &str, kind: &str, roles: &str, token: &str) -> String {
    format!(
        "[[principals]]\nid = \"{id}\"\nkind = \"{kind}\"\nroles = [{roles}]\ntoken_sha256 = \"{}\"\n\n",
        sha256_hex(token)
    )
}

/// `tether.toml` and `policy.cedar` in `dir`, with `tables` (`[limits]`,
/// `[http]`) before the principals; answers the config's path.
fn write_config(dir: &Path, tables: &str) -> PathBuf {
    std::fs::write(dir.join("policy.cedar"), HOLD_POLICY).expect("policy");
    let mut text = "builtin_cell = true\npolicy = \"policy.cedar\"\n\n".to_owned();
    text.push_str(tables);
    text.push('\n');
    text.push_str(&principal("planner", "agent", "", AGENT));
    text.push_str(&principal("helper", "agent", "", AGENT_B));
    text.push_str(&principal("alice", "human", "\"operator\"", ALICE));
    text.push_str(&principal("carol", "human", "", CAROL));
    text.push_str(&principal("ingest", "service", "", SERVICE));
    let path = dir.join("tether.toml");
    std::fs::write(&path, text).expect("config");
    path
}

fn ok(s: &Server, token: &str, method: &str, params: Value) -> Value {
    let a = call_with_token(s, token, method, params.clone());
    assert!(a.get("error").is_none(), "{method} {params}: {a}");
    a["result"].clone()
}

fn err(s: &Server, token: &str, method: &str, params: Value) -> Value {
    let a = call_with_token(s, token, method, params.clone());
    assert!(a.get("result").is_none(), "{method} succeeded: {a}");
    a["error"].clone()
}

fn session(s: &Server, token: &str) -> String {
    ok(s, token, "mhs.session.open", json!({}))["session_id"]
        .as_str()
        .expect("session_id")
        .to_owned()
}

fn hot_setpoint(s: &Server, token: &str, sid: &str, command_id: &str) -> Value {
    ok(
        s,
        token,
        "mhs.command",
        json!({"session_id": sid, "device_id": "thermostat-1", "capability_id": "cap.thermal.setpoint.v1", "input": {"target_temperature": 70.0}, "command_id": command_id}),
    )
}

fn held(receipt: &Value) -> String {
    assert_rejected(receipt, "MHS.POLICY.HELD")["approval_id"]
        .as_str()
        .unwrap_or_else(|| panic!("a hold without approval_id: {receipt}"))
        .to_owned()
}

/// Asserts a rejected receipt refused for a bound: `MHS.PROTOCOL.LIMIT`,
/// retryable, naming `reason` and `limit`.
fn assert_limit(receipt: &Value, reason: &str, limit: u64) {
    let d = assert_rejected(receipt, "MHS.PROTOCOL.LIMIT");
    assert_eq!(receipt["error"]["retryable"], true, "{receipt}");
    assert_eq!(d["reason"], reason, "{receipt}");
    assert_eq!(d["limit"], limit, "{receipt}");
}

// ----- MCP sessions ----------------------------------------------------------

/// Waits for the MCP listening line in the server's stderr.
fn mcp_addr(s: &Server) -> SocketAddr {
    let mut found = None;
    poll_until("the MCP listening line", TIMEOUT, || {
        found = s
            .stderr_text()
            .split("MCP listening on http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .and_then(|host| host.parse().ok());
        found.is_some()
    });
    found.expect("MCP address")
}

/// One request on `/mcp` (`Connection: close`): status, lower-cased head, body.
fn mcp(
    addr: SocketAddr,
    method: &str,
    token: &str,
    extra: &str,
    body: &[u8],
) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    let head = format!(
        "{method} /mcp HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n{extra}Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).expect("head");
    stream.write_all(body).expect("body");
    let mut raw = Vec::new();
    let _ = stream.take(4 << 20).read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {text:?}"));
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (status, head.to_ascii_lowercase(), body.to_owned())
}

const INITIALIZE: &[u8] = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"edge-bounds","version":"1"}}}"#;

/// `initialize`: the session id on success, else the status and body.
fn initialize(addr: SocketAddr, token: &str) -> Result<String, (u16, String, String)> {
    let (status, head, body) = mcp(addr, "POST", token, "", INITIALIZE);
    let sid = head
        .lines()
        .find_map(|l| l.strip_prefix("mcp-session-id:"))
        .map(|v| v.trim().to_owned());
    match sid {
        Some(sid) if status == 200 => {
            let note = br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
            let (s, _, b) = mcp(addr, "POST", token, &session_header(&sid), note);
            assert!((200..300).contains(&s), "initialized: {s} {b}");
            Ok(sid)
        }
        _ => Err((status, head, body)),
    }
}

fn session_header(sid: &str) -> String {
    format!("Mcp-Session-Id: {sid}\r\nMCP-Protocol-Version: 2025-06-18\r\n")
}

/// `tools/list` in session `sid`: the status and body.
fn tools_list(addr: SocketAddr, token: &str, sid: &str) -> (u16, String) {
    let (status, _, body) = mcp(
        addr,
        "POST",
        token,
        &session_header(sid),
        br#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}"#,
    );
    (status, body)
}

#[test]
fn a_flood_of_mcp_sessions_stops_at_the_principals_bound_and_never_costs_another_its_session() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(
        dir.path(),
        "[http]\nmcp_sessions_max = 8\nmcp_sessions_per_principal_max = 3\n",
    );
    let s = Server::start_with(
        Transport::Http,
        Some(&dir.path().join("state")),
        &[
            OsStr::new("--config"),
            cfg.as_os_str(),
            OsStr::new("--mcp-http"),
            OsStr::new("127.0.0.1:0"),
        ],
    );
    let addr = mcp_addr(&s);
    // Another principal's session, opened before the flood.
    let theirs = initialize(addr, AGENT_B).expect("helper's session");

    // One agent floods initialize: three sessions, then refusals.
    let mut mine = Vec::new();
    let mut refused = Vec::new();
    for _ in 0..12 {
        match initialize(addr, AGENT) {
            Ok(sid) => mine.push(sid),
            Err(r) => refused.push(r),
        }
    }
    assert_eq!(mine.len(), 3, "the agent's sessions: {mine:?}");
    assert_eq!(refused.len(), 9);
    for (status, head, body) in &refused {
        assert_eq!(*status, 429, "{head}\n{body}");
        assert!(head.contains("retry-after:"), "{head}");
        assert!(head.contains("content-type: application/json"), "{head}");
        let answer: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
        assert_eq!(answer["jsonrpc"], "2.0", "{body}");
        let data = &answer["error"]["data"];
        assert_eq!(data["mhs_code"], "MHS.PROTOCOL.LIMIT", "{body}");
        assert_eq!(data["retryable"], true, "{body}");
        assert_eq!(data["details"]["reason"], "mcp_sessions_per_principal_full");
        assert_eq!(data["details"]["limit"], 3);
    }

    // The other principal's session still works, and it can open another.
    let (status, body) = tools_list(addr, AGENT_B, &theirs);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"estop\""), "{body}");
    initialize(addr, AGENT_B).expect("helper opens a new session during the flood");

    // A session the agent closes frees its slot.
    let (status, _, body) = mcp(addr, "DELETE", AGENT, &session_header(&mine[0]), b"");
    assert!((200..300).contains(&status), "{status} {body}");
    initialize(addr, AGENT).expect("a freed slot is the agent's again");
    assert!(initialize(addr, AGENT).is_err(), "and the bound holds");
}

// ----- approvals ------------------------------------------------------------

#[test]
fn one_agents_holds_stop_at_its_bound_while_an_operator_and_other_callers_still_get_approvals() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(
        dir.path(),
        "[limits]\napprovals_open_max = 8\napprovals_open_per_principal_max = 3\n",
    );
    let s = start_with_config(dir.path(), &cfg);
    let sid = session(&s, AGENT);
    for i in 0..3 {
        held(&hot_setpoint(&s, AGENT, &sid, &format!("flood-{i}")));
    }
    // The fourth, and every one after, is refused for the bound: a rejected
    // receipt, retryable, never INTERNAL.
    for i in 3..6 {
        let r = hot_setpoint(&s, AGENT, &sid, &format!("flood-{i}"));
        assert_limit(&r, "approvals_open_per_principal_full", 3);
    }

    // Through the REST gateway the same refusal is HTTP 429 with Retry-After.
    let r = http_request(
        s.addr(),
        "POST",
        "/tools/thermostat-1__setpoint:invoke",
        json!({"input": {"target_temperature": 70.0}, "command_id": "flood-rest"})
            .to_string()
            .as_bytes(),
        TIMEOUT,
        &format!("Authorization: Bearer {AGENT}\r\n"),
    );
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(
        r.head.to_ascii_lowercase().contains("retry-after:"),
        "{}",
        r.head
    );
    let body = r.json();
    assert_eq!(body["error"]["code"], "MHS.PROTOCOL.LIMIT", "{body}");
    assert_eq!(body["error"]["retryable"], true, "{body}");

    // An operator's hold still gets its approval, and so does another agent's.
    let alice_sid = session(&s, ALICE);
    let alice_approval = held(&hot_setpoint(&s, ALICE, &alice_sid, "operator-move"));
    let helper_sid = session(&s, AGENT_B);
    for i in 0..3 {
        held(&hot_setpoint(
            &s,
            AGENT_B,
            &helper_sid,
            &format!("helper-{i}"),
        ));
    }
    let carol_sid = session(&s, CAROL);
    held(&hot_setpoint(&s, CAROL, &carol_sid, "carol-1"));
    // Eight open now: the endpoint's bound, reached by four principals.
    let svc_sid = session(&s, SERVICE);
    let r = hot_setpoint(&s, SERVICE, &svc_sid, "svc-1");
    assert_limit(&r, "approvals_open_full", 8);

    // Deciding one frees room; the approved one is used by its command.
    let vote = ok(
        &s,
        ALICE,
        "mhs.approvals.decide",
        json!({"approval_id": held(&hot_setpoint(&s, AGENT, &sid, "flood-0")), "decision": "deny", "reason": "flood"}),
    );
    assert_eq!(vote["status"], "denied", "{vote}");
    held(&hot_setpoint(&s, SERVICE, &svc_sid, "svc-2"));
    assert!(!alice_approval.is_empty());
}

#[test]
fn approvals_list_answers_bounded_pages_and_the_cli_follows_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(
        dir.path(),
        "[limits]\napprovals_open_max = 400\napprovals_open_per_principal_max = 200\n",
    );
    let s = start_with_config(dir.path(), &cfg);
    let sid = session(&s, AGENT);
    let mut ids = std::collections::BTreeSet::new();
    for i in 0..150 {
        ids.insert(held(&hot_setpoint(&s, AGENT, &sid, &format!("page-{i}"))));
    }
    // With no limit, a page holds the default (100) and says where to go on.
    let first = ok(&s, ALICE, "mhs.approvals.list", json!({}));
    assert_eq!(first["approvals"].as_array().map(Vec::len), Some(100));
    let cursor = first["next_cursor"]
        .as_str()
        .expect("a next_cursor")
        .to_owned();
    let rest = ok(
        &s,
        ALICE,
        "mhs.approvals.list",
        json!({"cursor": cursor, "limit": 500}),
    );
    assert_eq!(rest["approvals"].as_array().map(Vec::len), Some(50));
    assert_eq!(rest["next_cursor"], Value::Null);
    // Small pages, followed to the end, list each approval exactly once.
    let mut seen = Vec::new();
    let mut cursor = Value::Null;
    for _ in 0..100 {
        let mut params = json!({"limit": 7, "status": "pending"});
        if !cursor.is_null() {
            params["cursor"] = cursor.clone();
        }
        let page = ok(&s, AGENT, "mhs.approvals.list", params);
        let list = page["approvals"].as_array().expect("approvals");
        assert!(list.len() <= 7);
        seen.extend(
            list.iter()
                .map(|a| a["approval_id"].as_str().expect("id").to_owned()),
        );
        cursor = page["next_cursor"].clone();
        if cursor.is_null() {
            break;
        }
    }
    assert_eq!(seen.len(), 150);
    assert_eq!(
        seen.iter()
            .cloned()
            .collect::<std::collections::BTreeSet<_>>(),
        ids
    );
    // A page over the maximum, or a cursor this method never gave, is refused.
    let e = err(&s, ALICE, "mhs.approvals.list", json!({"limit": 501}));
    assert_eq!(
        assert_rpc_error(&e, "MHS.PROTOCOL.INVALID_PARAMS")["reason"],
        "limit_invalid"
    );
    let e = err(
        &s,
        ALICE,
        "mhs.approvals.list",
        json!({"cursor": "x".repeat(5000)}),
    );
    assert_eq!(
        assert_rpc_error(&e, "MHS.PROTOCOL.INVALID_PARAMS")["reason"],
        "cursor_invalid"
    );
    assert!(e.to_string().len() < 2048, "{e}");

    // `tether approvals list` follows the pages: every approval, once.
    let endpoint = format!("http://{}/rpc", s.addr());
    let out = std::process::Command::new(BIN)
        .args(["approvals", "list", "--endpoint", &endpoint])
        .env("TETHER_TOKEN", ALICE)
        .output()
        .expect("tether approvals list");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.lines().filter(|l| l.starts_with("appr_")).count(),
        150,
        "{text}"
    );
    for id in &ids {
        assert!(text.contains(id.as_str()), "{id} missing");
    }
}

// ----- permits --------------------------------------------------------------

fn permit(s: &Server, token: &str, sid: &str) -> Value {
    call_with_token(
        s,
        token,
        "mhs.safety.permit",
        json!({"session_id": sid, "device_id": "thermostat-1", "capability_id": "cap.thermal.setpoint.v1", "input": {"target_temperature": 30}, "ttl_ms": 600000}),
    )
}

#[test]
fn one_agents_permits_stop_at_its_bound_while_an_operator_and_another_agent_still_get_theirs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(
        dir.path(),
        "[limits]\npermits_max = 8\npermits_per_principal_max = 3\n",
    );
    let s = start_with_config(dir.path(), &cfg);
    let sid = session(&s, AGENT);
    for _ in 0..3 {
        let a = permit(&s, AGENT, &sid);
        assert!(a["result"]["permit_id"].is_string(), "{a}");
    }
    for _ in 0..3 {
        let a = permit(&s, AGENT, &sid);
        let d = assert_rpc_error(&a["error"], "MHS.PROTOCOL.LIMIT");
        assert_eq!(a["error"]["data"]["retryable"], true, "{a}");
        assert_eq!(d["reason"], "permits_per_principal_full", "{a}");
        assert_eq!(d["limit"], 3, "{a}");
    }
    let alice_sid = session(&s, ALICE);
    let a = permit(&s, ALICE, &alice_sid);
    assert!(
        a["result"]["permit_id"].is_string(),
        "an operator's permit: {a}"
    );
    let helper_sid = session(&s, AGENT_B);
    for _ in 0..3 {
        let a = permit(&s, AGENT_B, &helper_sid);
        assert!(a["result"]["permit_id"].is_string(), "{a}");
    }
    let carol_sid = session(&s, CAROL);
    let a = permit(&s, CAROL, &carol_sid);
    assert!(a["result"]["permit_id"].is_string(), "{a}");
    // Eight outstanding: the endpoint's bound, reached by four principals;
    // a fifth is refused for the endpoint's bound, not its own.
    let svc_sid = session(&s, SERVICE);
    let a = permit(&s, SERVICE, &svc_sid);
    let d = assert_rpc_error(&a["error"], "MHS.PROTOCOL.LIMIT");
    assert_eq!(d["reason"], "permits_full", "{a}");
    assert_eq!(d["limit"], 8, "{a}");
    // A session's end releases its permits, and the room is there again.
    ok(&s, AGENT, "mhs.session.close", json!({"session_id": sid}));
    let a = permit(&s, SERVICE, &svc_sid);
    assert!(a["result"]["permit_id"].is_string(), "{a}");
}

// ----- operations -----------------------------------------------------------

/// Sends a slow arm motion on its own thread (4 s); answers its receipt
/// when it ends.
fn slow_move(
    s: &Server,
    token: &'static str,
    sid: &str,
    to: f64,
) -> std::thread::JoinHandle<Value> {
    let addr = s.addr();
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "mhs.command", "params": {"session_id": sid, "device_id": "arm-1", "capability_id": "cap.motion.move_to.v1", "input": {"joints": [to, 0, 0, 0, 0, 0], "speed": 0.25}}}).to_string();
    std::thread::spawn(move || {
        let r = http_post_with(
            addr,
            body.as_bytes(),
            TIMEOUT,
            &format!("Authorization: Bearer {token}\r\n"),
        );
        r.json()["result"].clone()
    })
}

/// The id of the arm's running motion, once it shows.
fn running_op(s: &Server) -> String {
    let mut op = None;
    poll_until("the motion to run", TIMEOUT, || {
        let st = ok(s, ALICE, "mhs.safety.status", json!({"device_id": "arm-1"}));
        op = st["devices"][0]["running_operations"][0]["operation_id"]
            .as_str()
            .map(str::to_owned);
        op.is_some()
    });
    op.expect("operation id")
}

fn evidence_kinds(state_dir: &Path, kind: &str) -> Vec<Value> {
    let run = tether(&[
        OsStr::new("audit"),
        OsStr::new("export"),
        OsStr::new("--state-dir"),
        state_dir.as_os_str(),
    ]);
    run.stdout_text()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["kind"] == kind)
        .collect()
}

#[test]
fn a_service_cannot_read_or_cancel_an_agents_operation_and_an_operator_can_on_the_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), "");
    let s = start_with_config(dir.path(), &cfg);
    let sid = session(&s, AGENT);
    let motion = slow_move(&s, AGENT, &sid, 1.0);
    let op = running_op(&s);
    // The owner sees it.
    let own = ok(&s, AGENT, "mhs.operations.get", json!({"operation_id": op}));
    assert_eq!(own["state"], "running", "{own}");
    // A service reads it as an id that does not exist, and cannot cancel it.
    let unknown_get = err(
        &s,
        SERVICE,
        "mhs.operations.get",
        json!({"operation_id": op}),
    );
    let nowhere = err(
        &s,
        SERVICE,
        "mhs.operations.get",
        json!({"operation_id": "op_01JNOSUCHOPERATION000000000"}),
    );
    assert_rpc_error(&unknown_get, "MHS.OPERATION.UNKNOWN");
    assert_rpc_error(&nowhere, "MHS.OPERATION.UNKNOWN");
    assert_eq!(
        unknown_get["message"]
            .as_str()
            .map(|m| m.replace(op.as_str(), "ID")),
        nowhere["message"]
            .as_str()
            .map(|m| m.replace("op_01JNOSUCHOPERATION000000000", "ID")),
        "another's operation reads exactly as one that does not exist"
    );
    let e = err(
        &s,
        SERVICE,
        "mhs.operations.cancel",
        json!({"operation_id": op}),
    );
    assert_rpc_error(&e, "MHS.OPERATION.UNKNOWN");
    let e = err(
        &s,
        AGENT_B,
        "mhs.operations.cancel",
        json!({"operation_id": op}),
    );
    assert_rpc_error(&e, "MHS.OPERATION.UNKNOWN");
    // ... and the motion runs to completion.
    let receipt = motion.join().expect("motion");
    assert_eq!(receipt["status"], "completed", "{receipt}");
    let e = err(
        &s,
        SERVICE,
        "mhs.operations.get",
        json!({"operation_id": op}),
    );
    assert_rpc_error(&e, "MHS.OPERATION.UNKNOWN");

    // An operator may read and cancel it, and that is recorded.
    let motion = slow_move(&s, AGENT, &sid, 0.0);
    let op2 = running_op(&s);
    let seen = ok(
        &s,
        ALICE,
        "mhs.operations.get",
        json!({"operation_id": op2}),
    );
    assert_eq!(seen["state"], "running", "{seen}");
    let c = ok(
        &s,
        ALICE,
        "mhs.operations.cancel",
        json!({"operation_id": op2}),
    );
    assert_eq!(c["cancel_delivered"], true, "{c}");
    let receipt = motion.join().expect("motion");
    assert_eq!(receipt["status"], "cancelled", "{receipt}");
    let mut recorded = Vec::new();
    poll_until("the operator's access in the evidence", TIMEOUT, || {
        recorded = evidence_kinds(s.state_dir(), "operation.operator_access");
        recorded.len() >= 2
    });
    let actions: Vec<&str> = recorded
        .iter()
        .map(|e| e["body"]["action"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(actions, ["get", "cancel"], "{recorded:?}");
    for e in &recorded {
        assert_eq!(e["body"]["operation_id"], op2.as_str());
        assert_eq!(e["body"]["operator"]["id"], "alice");
        assert_eq!(e["body"]["owner"]["id"], "planner");
    }
}

// ----- text -----------------------------------------------------------------

#[test]
fn a_huge_reset_reason_is_refused_naming_the_bound_and_a_long_estop_reason_latches_cut() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), "[limits]\ntext_chars_max = 512\n");
    let s = start_with_config(dir.path(), &cfg);
    let reason = "r".repeat(600);
    let receipt = ok(
        &s,
        AGENT,
        "mhs.safety.estop",
        json!({"device_id": "thermostat-1", "reason": reason}),
    );
    assert_eq!(receipt["status"], "completed", "{receipt}");
    let status = ok(
        &s,
        AGENT,
        "mhs.safety.status",
        json!({"device_id": "thermostat-1"}),
    );
    let latch = &status["devices"][0]["latch"];
    assert_eq!(status["devices"][0]["latched"], true, "{status}");
    assert_eq!(
        latch["reason"],
        "r".repeat(512),
        "cut to the bound: {latch}"
    );

    let huge = "x".repeat(900_000);
    let e = err(
        &s,
        AGENT,
        "mhs.safety.reset",
        json!({"device_id": "thermostat-1", "reason": huge}),
    );
    let d = assert_rpc_error(&e, "MHS.PROTOCOL.INVALID_PARAMS");
    assert_eq!(d["reason"], "text_too_long", "{e}");
    assert_eq!(d["limit"], 512, "{e}");
    assert_eq!(d["field"], "reason", "{e}");
    assert!(
        e.to_string().len() < 2048,
        "the refusal does not echo the text"
    );
    let status = ok(
        &s,
        AGENT,
        "mhs.safety.status",
        json!({"device_id": "thermostat-1"}),
    );
    assert_eq!(status["devices"][0]["latched"], true, "nothing was reset");
    // Within the bound, the reset goes through; nothing long reached the evidence.
    let r = ok(
        &s,
        AGENT,
        "mhs.safety.reset",
        json!({"device_id": "thermostat-1", "reason": "r".repeat(512)}),
    );
    assert_eq!(r["status"], "completed", "{r}");
    let resets = evidence_kinds(s.state_dir(), "safety.reset");
    assert_eq!(resets.len(), 1);
    assert!(resets[0].to_string().len() < 4096);
    // A vote's reason has the same bound.
    let sid = session(&s, AGENT);
    let id = held(&hot_setpoint(&s, AGENT, &sid, "vote-1"));
    let e = err(
        &s,
        ALICE,
        "mhs.approvals.decide",
        json!({"approval_id": id, "decision": "approve", "reason": "v".repeat(513)}),
    );
    assert_eq!(
        assert_rpc_error(&e, "MHS.PROTOCOL.INVALID_PARAMS")["reason"],
        "text_too_long"
    );
}

// ----- echoed ids -----------------------------------------------------------

#[test]
fn errors_never_echo_a_long_id_on_any_method() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), "");
    let s = start_with_config(dir.path(), &cfg);
    let long = "s".repeat(500_000);
    let sid = session(&s, AGENT);
    let cases = [
        ("mhs.session.heartbeat", json!({"session_id": long})),
        ("mhs.session.close", json!({"session_id": long})),
        (
            "mhs.command",
            json!({"session_id": long, "device_id": "thermostat-1", "capability_id": "cap.thermal.setpoint.v1", "input": {"target_temperature": 30}}),
        ),
        (
            "mhs.command",
            json!({"session_id": sid, "device_id": long, "capability_id": "cap.thermal.setpoint.v1"}),
        ),
        (
            "mhs.command",
            json!({"session_id": sid, "device_id": "thermostat-1", "capability_id": long}),
        ),
        (
            "mhs.resource.read",
            json!({"session_id": sid, "device_id": "thermostat-1", "resource": long}),
        ),
        (
            "mhs.resource.write",
            json!({"session_id": sid, "device_id": "thermostat-1", "resource": long, "patch": {}}),
        ),
        ("mhs.devices.get", json!({"device_id": long})),
        ("mhs.approvals.get", json!({"approval_id": long})),
        ("mhs.operations.get", json!({"operation_id": long})),
        ("mhs.operations.cancel", json!({"operation_id": long})),
        ("mhs.safety.estop", json!({"device_id": long})),
        ("mhs.session.open", json!({"device_ids": [long]})),
        ("mhs.session.open", {
            let mut unknown_member = serde_json::Map::new();
            unknown_member.insert(long.clone(), json!(1));
            Value::Object(unknown_member)
        }),
        (long.as_str(), json!({})),
    ];
    for (method, params) in cases {
        let body =
            json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string();
        let r = http_post_with(
            s.addr(),
            body.as_bytes(),
            TIMEOUT,
            &format!("Authorization: Bearer {AGENT}\r\n"),
        );
        let text = r.text();
        let shown = &text[..text.len().min(300)];
        assert!(
            text.len() < 8192,
            "{} bytes answered {}: {shown}",
            text.len(),
            &method[..method.len().min(40)]
        );
        assert!(text.contains("chars]"), "the echo says it was cut: {shown}");
    }
    // A JSON-RPC id is repeated by every answer: a long one is refused, and
    // not repeated.
    let body = json!({"jsonrpc": "2.0", "id": long, "method": "mhs.hello"}).to_string();
    let r = http_post_with(
        s.addr(),
        body.as_bytes(),
        TIMEOUT,
        &format!("Authorization: Bearer {AGENT}\r\n"),
    );
    assert!(r.body.len() < 2048, "{} bytes", r.body.len());
    let answer = r.json();
    assert_eq!(answer["id"], Value::Null);
    assert_eq!(
        assert_rpc_error(&answer["error"], "MHS.PROTOCOL.INVALID_REQUEST")["reason"],
        "id_invalid"
    );
}

// ----- config ---------------------------------------------------------------

#[test]
fn a_per_principal_bound_one_principal_could_fill_the_endpoint_with_is_refused_at_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(
        dir.path(),
        "[limits]\napprovals_open_max = 10\napprovals_open_per_principal_max = 10\n\n[http]\nmcp_sessions_max = 4\nmcp_sessions_per_principal_max = 3\n",
    );
    let run = tether(&[OsStr::new("check"), cfg.as_os_str()]);
    assert_ne!(run.code, Some(0), "{}", run.stdout_text());
    let all = format!("{}{}", run.stdout_text(), run.stderr);
    assert!(
        all.contains("limits.approvals_open_per_principal_max"),
        "{all}"
    );
    assert!(all.contains("http.mcp_sessions_per_principal_max"), "{all}");
}
