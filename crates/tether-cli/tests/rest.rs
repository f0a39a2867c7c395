//! The REST tool gateway end to end: the real binary over HTTP.
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
use std::path::Path;
use std::time::{Duration, Instant};

const TOKEN: &str = "rest-agent-token-5d2e";
const OTHER_TOKEN: &str = "rest-other-token-9b41";

fn request(s: &Server, method: &str, path: &str, body: &[u8], token: Option<&str>) -> (u16, Value) {
    let headers = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let r = http_request(s.addr(), method, path, body, TIMEOUT, &headers);
    let v = r.json();
    assert!(
        r.head
            .to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{}",
        r.head
    );
    (r.status, v)
}

fn get(s: &Server, path: &str) -> (u16, Value) {
    request(s, "GET", path, b"", None)
}

fn post(s: &Server, path: &str, body: Value) -> (u16, Value) {
    request(s, "POST", path, body.to_string().as_bytes(), None)
}

/// `data` of a success with the expected status.
fn ok(answer: (u16, Value), status: u16) -> Value {
    assert_eq!(answer.0, status, "{}", answer.1);
    assert_eq!(answer.1["ok"], true, "{}", answer.1);
    assert!(answer.1["data"].is_object(), "{}", answer.1);
    answer.1["data"].clone()
}

/// `error` of a refusal with the expected status and code.
fn err(answer: (u16, Value), status: u16, code: &str) -> Value {
    assert_eq!(answer.0, status, "{}", answer.1);
    assert_eq!(answer.1["ok"], false, "{}", answer.1);
    let e = answer.1["error"].clone();
    assert_eq!(e["code"], code, "{e}");
    assert!(
        e["message"].is_string() && e["retryable"].is_boolean() && e["details"].is_object(),
        "{e}"
    );
    e
}

fn invoke(s: &Server, tool: &str, body: Value) -> (u16, Value) {
    post(s, &format!("/tools/{tool}:invoke"), body)
}

/// Polls `/invocations/{id}/result` until it answers 200; every answer before
/// must be 202 and pending.
fn wait_result(s: &Server, inv: &str, timeout: Duration) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let (status, v) = get(s, &format!("/invocations/{inv}/result"));
        if status == 200 {
            assert_eq!(v["data"]["terminal"], true, "{v}");
            return v["data"].clone();
        }
        assert_eq!(status, 202, "{v}");
        assert_eq!(v["data"]["status"], "pending", "{v}");
        assert!(
            Instant::now() < deadline,
            "{inv} still pending after {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn start_motion(s: &Server, joint0: f64, speed: f64) -> String {
    let accepted = ok(
        invoke(
            s,
            "arm-1__move_to",
            json!({"input": {"joints": [joint0, 0, 0, 0, 0, 0], "speed": speed}}),
        ),
        202,
    );
    assert!(
        accepted["attempt_id"]
            .as_str()
            .is_some_and(|a| a.starts_with("att_")),
        "{accepted}"
    );
    accepted["invocation_id"]
        .as_str()
        .expect("invocation_id")
        .to_owned()
}

fn wait_running(s: &Server) {
    poll_until("the motion to run", Duration::from_secs(5), || {
        s.status_of("arm-1")["running_operations"]
            .as_array()
            .is_some_and(|o| !o.is_empty())
    });
}

#[test]
fn every_route_answers_the_envelope() {
    let s = Server::http();
    let tools = ok(get(&s, "/tools"), 200);
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["tool_id"].as_str())
        .collect();
    assert_eq!(names[0], "estop", "{names:?}");
    assert!(names.contains(&"thermostat-1__setpoint") && names.contains(&"arm-1__move_to"));
    assert!(
        !names
            .iter()
            .any(|n| n.contains("reset") || n.contains("permit")),
        "{names:?}"
    );

    let tool = ok(get(&s, "/tools/thermostat-1__setpoint"), 200);
    assert_eq!(tool["kind"], "action");
    let ctx = ok(get(&s, "/tools/thermostat-1__setpoint/context"), 200)["context"].clone();
    assert_eq!(ctx["latched"], false, "{ctx}");
    assert_eq!(ctx["mode"], "simulated");
    assert!(
        ctx["effective_limits"]["limits"]["target_temperature"]["max"].is_number(),
        "{ctx}"
    );
    assert!(
        ctx["state"]["revision"].is_u64() && ctx["state"]["state"].is_object(),
        "{ctx}"
    );
    assert!(ctx["interlocks"].is_array());
    let arm = ok(get(&s, "/tools/arm-1__move_to/context"), 200)["context"].clone();
    assert_eq!(arm["interlocks"][0]["id"], "door", "{arm}");

    let read = ok(invoke(&s, "thermostat-1__read", json!({})), 200);
    assert!(read["result"]["state"].is_object(), "{read}");

    let accepted = ok(
        invoke(
            &s,
            "thermostat-1__setpoint",
            json!({"input": {"target_temperature": 30}, "command_id": "rest-every-route-1"}),
        ),
        202,
    );
    assert_eq!(accepted["status"], "pending");
    assert_eq!(accepted["command_id"], "rest-every-route-1");
    let inv = accepted["invocation_id"].as_str().expect("id").to_owned();
    let result = wait_result(&s, &inv, TIMEOUT);
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(result["receipt"]["command_id"], "rest-every-route-1");
    let record = ok(get(&s, &format!("/invocations/{inv}")), 200);
    assert_eq!(record["status"], "completed");
    assert_eq!(record["attempt_id"], accepted["attempt_id"]);
    assert!(
        record["operation_id"]
            .as_str()
            .is_some_and(|o| o.starts_with("op_")),
        "{record}"
    );

    let late = ok(
        post(&s, &format!("/invocations/{inv}/cancel"), json!({})),
        200,
    );
    assert_eq!(late["cancel_delivered"], false);
    assert_eq!(late["reason"], "already_finished");
    let late = ok(
        post(&s, &format!("/invocations/{inv}/stop"), json!({})),
        200,
    );
    assert_eq!(late["stop_delivered"], false);

    err(
        get(&s, "/tools/no-such-tool"),
        404,
        "MHS.CAPABILITY.UNKNOWN",
    );
    err(
        invoke(&s, "no-such-tool", json!({})),
        404,
        "MHS.CAPABILITY.UNKNOWN",
    );
    err(
        get(&s, "/invocations/inv_nope"),
        404,
        "MHS.OPERATION.UNKNOWN",
    );
    err(
        get(&s, "/invocations/inv_nope/result"),
        404,
        "MHS.OPERATION.UNKNOWN",
    );
    err(
        post(&s, "/invocations/inv_nope/cancel", json!({})),
        404,
        "MHS.OPERATION.UNKNOWN",
    );
    err(get(&s, "/nowhere"), 404, "MHS.PROTOCOL.METHOD_NOT_FOUND");
    // `/tools/{id}` is GET only and `/tools/{id}:invoke` POST only: 405 with `Allow`.
    let e = err(
        post(&s, "/tools/thermostat-1__setpoint:run", json!({})),
        405,
        "MHS.PROTOCOL.METHOD_NOT_FOUND",
    );
    assert_eq!(e["details"]["allow"], "GET,HEAD");
    let r = http_request(
        s.addr(),
        "GET",
        "/tools/thermostat-1__setpoint:invoke",
        b"",
        TIMEOUT,
        "",
    );
    assert_eq!(r.status, 405);
    assert!(
        r.head.to_ascii_lowercase().contains("allow: post"),
        "{}",
        r.head
    );
    err(
        request(&s, "DELETE", "/tools", b"", None),
        405,
        "MHS.PROTOCOL.METHOD_NOT_FOUND",
    );
    let doc = http_request(s.addr(), "GET", "/openapi.json", b"", TIMEOUT, "").json();
    assert!(
        doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")),
        "{doc}"
    );
}

#[test]
fn the_same_command_id_replays_its_receipt_and_other_input_is_a_conflict() {
    let s = Server::http();
    let body = |t: f64| json!({"input": {"target_temperature": t}, "command_id": "rest-replay-1"});
    let first = ok(invoke(&s, "thermostat-1__setpoint", body(30.0)), 202);
    let first = wait_result(&s, first["invocation_id"].as_str().expect("id"), TIMEOUT);
    assert_eq!(first["status"], "completed", "{first}");
    let revision = ok(get(&s, "/tools/thermostat-1__setpoint/context"), 200)["context"]["state"]
        ["revision"]
        .clone();

    // Same command_id, same input: a new invocation whose result is the
    // original receipt; nothing runs again.
    let again = ok(invoke(&s, "thermostat-1__setpoint", body(30.0)), 202);
    assert_ne!(again["invocation_id"], first["invocation_id"]);
    let again = wait_result(&s, again["invocation_id"].as_str().expect("id"), TIMEOUT);
    assert_eq!(again["status"], "completed", "{again}");
    assert_eq!(
        again["receipt"]["receipt_id"], first["receipt"]["receipt_id"],
        "{again}"
    );

    // Same command_id, other input: refused, nothing dispatched. The refusal
    // comes from the real command before dispatch, so it is the answer (an
    // error with the rejected receipt), not a 202.
    let (status, other) = invoke(&s, "thermostat-1__setpoint", body(31.0));
    assert_ne!(status, 202, "{other}");
    assert_eq!(other["ok"], false, "{other}");
    assert_eq!(
        other["error"]["code"], "MHS.CONFLICT.COMMAND_ID_REUSE",
        "{other}"
    );
    assert!(
        other["error"]["details"]["invocation_id"].is_string(),
        "{other}"
    );
    let receipt = other["error"]["details"]["receipt"].clone();
    assert_eq!(receipt["status"], "rejected", "{receipt}");
    assert_eq!(
        receipt["error"]["mhs_code"], "MHS.CONFLICT.COMMAND_ID_REUSE",
        "{receipt}"
    );
    assert_eq!(
        receipt["error"]["details"]["reason"], "input_differs",
        "{receipt}"
    );
    let after = ok(get(&s, "/tools/thermostat-1__setpoint/context"), 200)["context"]["state"]
        ["revision"]
        .clone();
    assert_eq!(after, revision, "a refused reuse changes nothing");
}

#[test]
fn a_long_motion_is_polled_to_completion() {
    let s = Server::http();
    let t0 = Instant::now();
    // 0.6 rad at 1 rad/s: 0.6 s of real motion.
    let inv = start_motion(&s, 0.6, 1.0);
    let (status, first) = get(&s, &format!("/invocations/{inv}/result"));
    assert_eq!(status, 202, "answered before the motion ended: {first}");
    // While it runs, the record names the operation that runs it.
    wait_running(&s);
    let running = ok(get(&s, &format!("/invocations/{inv}")), 200);
    let op = s.status_of("arm-1")["running_operations"][0]["operation_id"].clone();
    assert!(op.is_string(), "{op}");
    assert_eq!(running["operation_id"], op, "{running}");
    let result = wait_result(&s, &inv, TIMEOUT);
    assert_eq!(result["status"], "completed", "{result}");
    assert!(
        t0.elapsed() >= Duration::from_millis(500),
        "the motion took real time"
    );
    assert_eq!(result["receipt"]["capability_id"], "cap.motion.move_to.v1");
}

#[test]
fn cancel_is_delivered_and_the_motion_ends_cancelled() {
    let s = Server::http();
    let inv = start_motion(&s, 2.0, 0.5);
    wait_running(&s);
    let cancel = ok(
        post(&s, &format!("/invocations/{inv}/cancel"), json!({})),
        202,
    );
    assert_eq!(cancel["cancel_delivered"], true, "{cancel}");
    assert_eq!(
        cancel["status"], "pending",
        "delivered is not stopped: {cancel}"
    );
    let result = wait_result(&s, &inv, TIMEOUT);
    assert_eq!(result["status"], "cancelled", "{result}");
    let record = ok(get(&s, &format!("/invocations/{inv}")), 200);
    assert_eq!(record["cancel_requested"], true);
    assert_eq!(record["stop_requested"], false);
}

#[test]
fn stop_runs_the_device_stop_and_the_motion_ends_cancelled() {
    let s = Server::http();
    let inv = start_motion(&s, 2.0, 0.5);
    wait_running(&s);
    let stop = ok(
        post(&s, &format!("/invocations/{inv}/stop"), json!({})),
        200,
    );
    assert_eq!(stop["stop_delivered"], true, "{stop}");
    assert_eq!(stop["stop_tool"], "arm-1__stop");
    assert_eq!(stop["stop_receipt"]["status"], "completed", "{stop}");
    let result = wait_result(&s, &inv, TIMEOUT);
    assert_eq!(result["status"], "cancelled", "{result}");
    // A stop is not an e-stop: nothing is latched.
    assert_eq!(s.status_of("arm-1")["latched"], false);
}

#[test]
fn a_refused_invocation_is_an_error_with_its_rejected_receipt_and_nothing_dispatched() {
    let s = Server::http();
    let before = ok(get(&s, "/tools/thermostat-1__setpoint/context"), 200)["context"]["state"]
        ["revision"]
        .clone();
    let e = err(
        invoke(
            &s,
            "thermostat-1__setpoint",
            json!({"input": {"target_temperature": 400}}),
        ),
        422,
        "MHS.SAFETY.ENVELOPE_VIOLATION",
    );
    let d = &e["details"];
    assert_eq!(d["path"], "target_temperature", "{e}");
    assert_eq!(d["bound"], 90.0, "{e}");
    assert_eq!(d["value"], 400, "{e}");
    assert_eq!(d["receipt"]["status"], "rejected", "{e}");
    assert!(
        d["receipt"]["operation_id"].is_null(),
        "nothing dispatched: {e}"
    );
    let inv = d["invocation_id"].as_str().expect("invocation_id");
    let record = ok(get(&s, &format!("/invocations/{inv}")), 200);
    assert_eq!(record["status"], "rejected");
    let after = ok(get(&s, "/tools/thermostat-1__setpoint/context"), 200)["context"]["state"]
        ["revision"]
        .clone();
    assert_eq!(before, after, "no revision moved");
    // Schema refusals map to 422 too; an input that is not an object is a 400.
    err(
        invoke(
            &s,
            "thermostat-1__setpoint",
            json!({"input": {"target_temperature": "hot"}}),
        ),
        422,
        "MHS.CAPABILITY.INPUT_INVALID",
    );
    err(
        invoke(&s, "thermostat-1__setpoint", json!({"input": [1]})),
        400,
        "MHS.PROTOCOL.INVALID_PARAMS",
    );
}

#[test]
fn the_estop_tool_latches_and_later_actions_are_locked() {
    let s = Server::http();
    let stop = ok(
        invoke(
            &s,
            "estop",
            json!({"input": {"device_id": "thermostat-1", "reason": "rest test"}}),
        ),
        200,
    );
    assert_eq!(stop["receipt"]["status"], "completed", "{stop}");
    assert_eq!(stop["receipt"]["not_certified"], true);
    let ctx = ok(get(&s, "/tools/thermostat-1__setpoint/context"), 200)["context"].clone();
    assert_eq!(ctx["latched"], true, "{ctx}");
    err(
        invoke(
            &s,
            "thermostat-1__setpoint",
            json!({"input": {"target_temperature": 30}}),
        ),
        423,
        "MHS.SAFETY.ESTOP_ENGAGED",
    );
    // A defective e-stop request still stops (every device) and says so.
    let e = err(
        request(
            &s,
            "POST",
            "/tools/estop:invoke",
            b"{\"input\":{}, \"bogus\":1}",
            None,
        ),
        400,
        "MHS.PROTOCOL.INVALID_PARAMS",
    );
    assert_eq!(e["details"]["estop_served"], true, "{e}");
    assert_eq!(s.status_of("arm-1")["latched"], true);
}

#[test]
fn an_estop_with_unusable_input_stops_every_device_and_answers_the_defect() {
    for input in [
        json!({"bogus": 1}),
        json!({"device_id": 5}),
        json!({"device_id": "relay-1", "reason": ["x"]}),
        json!(["relay-1"]),
    ] {
        let s = Server::http();
        let e = err(
            invoke(&s, "estop", json!({ "input": input })),
            422,
            "MHS.CAPABILITY.INPUT_INVALID",
        );
        assert_eq!(e["details"]["estop_served"], true, "{input}: {e}");
        assert!(e["details"]["receipt"].is_object(), "{input}: {e}");
        for device in ["thermostat-1", "arm-1", "relay-1"] {
            assert_eq!(s.status_of(device)["latched"], true, "{input}: {device}");
        }
    }
}

#[test]
fn malformed_oversized_and_unknown_bodies_are_refused_with_the_envelope() {
    let s = Server::http();
    let path = "/tools/thermostat-1__setpoint:invoke";
    let dup = br#"{"input": {"target_temperature": 30}, "input": {"target_temperature": 80}}"#;
    err(
        request(&s, "POST", path, dup, None),
        400,
        "MHS.PROTOCOL.PARSE_ERROR",
    );
    let deep = format!("{{\"input\": {}{}}}", "[".repeat(70), "]".repeat(70));
    err(
        request(&s, "POST", path, deep.as_bytes(), None),
        400,
        "MHS.PROTOCOL.PARSE_ERROR",
    );
    err(
        request(
            &s,
            "POST",
            path,
            b"{\"input\": {\"target_temperature\": 1e999}}",
            None,
        ),
        400,
        "MHS.PROTOCOL.PARSE_ERROR",
    );
    err(
        request(&s, "POST", path, b"{\"input\": ", None),
        400,
        "MHS.PROTOCOL.PARSE_ERROR",
    );
    err(
        invoke(
            &s,
            "thermostat-1__setpoint",
            json!({"input": {}, "verbose": true}),
        ),
        400,
        "MHS.PROTOCOL.INVALID_PARAMS",
    );
    err(
        invoke(
            &s,
            "thermostat-1__setpoint",
            json!({"input": {}, "deadline_ms": 0}),
        ),
        400,
        "MHS.PROTOCOL.INVALID_PARAMS",
    );
    err(
        invoke(
            &s,
            "thermostat-1__setpoint",
            json!({"input": {}, "command_id": "bad id!"}),
        ),
        400,
        "MHS.PROTOCOL.INVALID_PARAMS",
    );
    err(
        request(&s, "POST", path, b"[1,2]", None),
        400,
        "MHS.PROTOCOL.INVALID_PARAMS",
    );
    let big = vec![b' '; (1 << 20) + 10];
    err(
        request(&s, "POST", path, &big, None),
        413,
        "MHS.PROTOCOL.TOO_LARGE",
    );
    err(
        request(&s, "GET", "/tools", &big, None),
        413,
        "MHS.PROTOCOL.TOO_LARGE",
    );
    err(
        request(&s, "GET", "/tools", b"{}", None),
        400,
        "MHS.PROTOCOL.INVALID_PARAMS",
    );
    err(
        request(
            &s,
            "POST",
            "/invocations/inv_x/cancel",
            b"{\"why\":1}",
            None,
        ),
        400,
        "MHS.PROTOCOL.INVALID_PARAMS",
    );
    assert_eq!(
        s.status_of("thermostat-1")["latched"],
        false,
        "nothing stopped"
    );
}

fn sha256_hex(s: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("sha256sum");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(s.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("digest")
        .to_owned()
}

/// A config with two agents; answers its path.
fn principals_config(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("tether.toml");
    let text = format!(
        "builtin_cell = true\n\n[[principals]]\nid = \"planner\"\nkind = \"agent\"\ntoken_sha256 = \"{}\"\n\n[[principals]]\nid = \"other\"\nkind = \"agent\"\ntoken_sha256 = \"{}\"\n",
        sha256_hex(TOKEN),
        sha256_hex(OTHER_TOKEN)
    );
    std::fs::write(&path, text).expect("config");
    path
}

fn start_with_principals(dir: &Path) -> Server {
    let cfg = principals_config(dir);
    Server::start_with(
        Transport::Http,
        Some(&dir.join("state")),
        &[OsStr::new("--config"), cfg.as_os_str()],
    )
}

#[test]
fn with_principals_every_route_needs_a_token_and_invocations_belong_to_their_principal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = start_with_principals(dir.path());
    let e = err(
        request(&s, "GET", "/tools", b"", None),
        401,
        "MHS.AUTH.UNAUTHENTICATED",
    );
    assert_eq!(e["details"]["reason"], "missing_token");
    let raw = http_request(s.addr(), "GET", "/tools", b"", TIMEOUT, "");
    assert!(
        raw.head
            .to_ascii_lowercase()
            .contains("www-authenticate: bearer"),
        "a 401 names its scheme: {}",
        raw.head
    );
    err(
        request(&s, "GET", "/tools", b"", Some("guess")),
        401,
        "MHS.AUTH.UNAUTHENTICATED",
    );
    // Refused before the body is read: even an oversized one is a 401.
    let big = vec![b' '; (1 << 20) + 10];
    err(
        request(&s, "POST", "/tools/estop:invoke", &big, None),
        401,
        "MHS.AUTH.UNAUTHENTICATED",
    );
    let ctx = ok(
        request(&s, "GET", "/tools/arm-1__move_to/context", b"", Some(TOKEN)),
        200,
    );
    assert_eq!(
        ctx["context"]["latched"], false,
        "no e-stop without a token"
    );
    ok(request(&s, "GET", "/tools", b"", Some(TOKEN)), 200);
    let body = json!({"input": {"target_temperature": 31}}).to_string();
    let accepted = ok(
        request(
            &s,
            "POST",
            "/tools/thermostat-1__setpoint:invoke",
            body.as_bytes(),
            Some(TOKEN),
        ),
        202,
    );
    let inv = accepted["invocation_id"].as_str().expect("id");
    ok(
        request(&s, "GET", &format!("/invocations/{inv}"), b"", Some(TOKEN)),
        200,
    );
    err(
        request(
            &s,
            "GET",
            &format!("/invocations/{inv}"),
            b"",
            Some(OTHER_TOKEN),
        ),
        404,
        "MHS.OPERATION.UNKNOWN",
    );
    assert!(
        !s.stderr_text().contains(TOKEN),
        "the token is never logged"
    );
}

#[test]
fn an_invocation_is_retained_across_a_restart_and_a_lost_one_reads_unknown() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let (done, lost, refused) = {
        let mut s = Server::start(Transport::Http, Some(&state));
        let accepted = ok(
            invoke(
                &s,
                "thermostat-1__setpoint",
                json!({"input": {"target_temperature": 33}}),
            ),
            202,
        );
        let done = accepted["invocation_id"].as_str().expect("id").to_owned();
        assert_eq!(wait_result(&s, &done, TIMEOUT)["status"], "completed");
        let e = err(
            invoke(
                &s,
                "thermostat-1__setpoint",
                json!({"input": {"target_temperature": 400}}),
            ),
            422,
            "MHS.SAFETY.ENVELOPE_VIOLATION",
        );
        let refused = e["details"]["invocation_id"]
            .as_str()
            .expect("id")
            .to_owned();
        // A long motion, then the process dies (SIGKILL) before its receipt.
        let lost = start_motion(&s, 2.0, 0.5);
        wait_running(&s);
        // Dispatched (the arm moves) only once its start is durable.
        let sid = s.session();
        poll_until("the arm to move", Duration::from_secs(5), || {
            s.read(&sid, "arm-1", "joints")["state"]["positions"][0]
                .as_f64()
                .is_some_and(|x| x > 0.0)
        });
        s.kill();
        (done, lost, refused)
    };
    let s = Server::start(Transport::Http, Some(&state));
    let record = ok(get(&s, &format!("/invocations/{done}")), 200);
    assert_eq!(record["status"], "completed", "{record}");
    assert_eq!(record["receipt"]["status"], "completed", "{record}");
    let record = ok(get(&s, &format!("/invocations/{refused}")), 200);
    assert_eq!(record["status"], "rejected", "{record}");
    assert_eq!(
        record["error"]["mhs_code"], "MHS.SAFETY.ENVELOPE_VIOLATION",
        "{record}"
    );
    let result = ok(get(&s, &format!("/invocations/{lost}/result")), 200);
    assert_eq!(result["status"], "unknown", "{result}");
    // Start-up recorded the crashed motion's outcome under its command id.
    assert_eq!(result["receipt"]["status"], "unknown", "{result}");
    assert_eq!(
        result["error"]["details"]["reason"], "endpoint_crashed",
        "{result}"
    );
    assert_ne!(
        result["error"]["details"]["stopped"], true,
        "unknown is never a stop: {result}"
    );
    let cancel = ok(
        post(&s, &format!("/invocations/{lost}/cancel"), json!({})),
        200,
    );
    assert_eq!(cancel["cancel_delivered"], false);
    // Its end proves nothing about the arm, so a stop asked for it still
    // runs the device's stop; one asked for a completed invocation declines.
    let stop = ok(
        post(&s, &format!("/invocations/{lost}/stop"), json!({})),
        200,
    );
    assert_eq!(stop["stop_delivered"], true, "{stop}");
    assert_eq!(stop["stop_receipt"]["status"], "completed", "{stop}");
    let late = ok(
        post(&s, &format!("/invocations/{done}/stop"), json!({})),
        200,
    );
    assert_eq!(late["stop_delivered"], false, "{late}");
    assert_eq!(late["reason"], "already_finished", "{late}");
    // Its command id is never run a second time: the same invocation again
    // is answered with the recorded `unknown`, and the lost one stays so.
    let record = ok(get(&s, &format!("/invocations/{lost}")), 200);
    let command_id = record["command_id"]
        .as_str()
        .expect("command_id")
        .to_owned();
    let again = invoke(
        &s,
        "arm-1__move_to",
        json!({"input": {"joints": [2.0, 0, 0, 0, 0, 0], "speed": 0.5}, "command_id": command_id}),
    );
    let text = again.1.to_string();
    assert!(
        !text.contains("\"completed\""),
        "a crashed command must not run again: {text}"
    );
    std::thread::sleep(Duration::from_millis(300));
    let result = ok(get(&s, &format!("/invocations/{lost}/result")), 200);
    assert_eq!(result["status"], "unknown", "{result}");
    let ctx = ok(get(&s, "/tools/arm-1__move_to/context"), 200);
    assert!(
        ctx["context"]["running_operations"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "nothing runs: {ctx}"
    );
}

/// Property-based API test: schemathesis (pinned in tests/rest/requirements.txt,
/// installed into a venv under the target dir when missing) runs against the
/// real binary and must find no violation of `/openapi.json`.
#[test]
fn the_api_conforms_to_its_openapi_document_under_schemathesis() {
    let st = schemathesis();
    let dir = tempfile::tempdir().expect("tempdir");
    let s = start_with_principals(dir.path());
    let url = format!("http://{}/openapi.json", s.addr());
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/rest/schemathesis.toml");
    let out = std::process::Command::new(&st)
        .arg("--config-file")
        .arg(&config)
        .args([
            "run",
            &url,
            "--max-examples",
            "25",
            "--seed",
            "1",
            "--workers",
            "1",
            "--request-timeout",
            "20",
        ])
        .args(["-H", &format!("Authorization: Bearer {TOKEN}")])
        .env("NO_COLOR", "1")
        // Its example database and reports stay in the temporary directory.
        .current_dir(dir.path())
        .output()
        .expect("run schemathesis");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(
        out.status.success(),
        "schemathesis found violations of the OpenAPI document:\n{text}"
    );
}

/// The schemathesis executable, installing the pinned requirements into
/// `$CARGO_TARGET_DIR/schemathesis-venv` (or `target/`) when missing. Fails
/// with a clear message when Python or pip cannot provide it: never skipped.
fn schemathesis() -> std::path::PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let venv = target.join("schemathesis-venv");
    let st = venv.join("bin").join("st");
    let reqs = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/rest/requirements.txt");
    let marker = venv.join("requirements.installed");
    let wanted = std::fs::read_to_string(&reqs).expect("tests/rest/requirements.txt");
    if st.is_file() && std::fs::read_to_string(&marker).ok().as_deref() == Some(wanted.as_str()) {
        return st;
    }
    let run = |cmd: &mut std::process::Command, what: &str| {
        let out = cmd.output().unwrap_or_else(|e| panic!("{what}: cannot run: {e} (python3 with venv and pip is required for the schemathesis test)"));
        assert!(
            out.status.success(),
            "{what} failed (python3 with venv and pip, and access to PyPI, are required for the schemathesis test):\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    if !venv.join("bin").join("pip").is_file() {
        run(
            std::process::Command::new("python3")
                .arg("-m")
                .arg("venv")
                .arg(&venv),
            "python3 -m venv",
        );
    }
    run(
        std::process::Command::new(venv.join("bin").join("pip"))
            .args(["install", "--quiet", "-r"])
            .arg(&reqs),
        "pip install -r tests/rest/requirements.txt",
    );
    assert!(
        st.is_file(),
        "pip installed schemathesis but {} is missing",
        st.display()
    );
    std::fs::write(&marker, wanted).expect("marker");
    st
}
