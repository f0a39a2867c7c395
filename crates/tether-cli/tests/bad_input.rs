//! Untrusted input never kills the process: each malformed request gets a
//! JSON-RPC error with the right code, and the endpoint keeps answering. A
//! malformed envelope that asks for an e-stop still latches.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

use common::{assert_rpc_error, Server, Transport};
use serde_json::{json, Value};

const PARSE: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;

struct Case {
    name: &'static str,
    bytes: Vec<u8>,
    /// The id the answer must carry (null when the request has none usable).
    id: Value,
    code: i64,
    mhs_code: &'static str,
}

fn case(
    name: &'static str,
    bytes: impl Into<Vec<u8>>,
    id: Value,
    code: i64,
    mhs_code: &'static str,
) -> Case {
    Case {
        name,
        bytes: bytes.into(),
        id,
        code,
        mhs_code,
    }
}

fn cases() -> Vec<Case> {
    let deep = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":11,\"method\":\"mhs.hello\",\"params\":{{\"client\":{}{}}}}}",
        "[".repeat(100),
        "]".repeat(100)
    );
    let mut not_utf8 =
        br#"{"jsonrpc":"2.0","id":12,"method":"mhs.hello","params":{"client":""#.to_vec();
    not_utf8.extend_from_slice(&[0xff, 0xfe, 0xc3]);
    not_utf8.extend_from_slice(br#""}}"#);
    vec![
        case(
            "not JSON",
            "this is not json",
            Value::Null,
            PARSE,
            "MHS.PROTOCOL.PARSE_ERROR",
        ),
        case(
            "truncated JSON",
            r#"{"jsonrpc":"2.0","id":1,"#,
            Value::Null,
            PARSE,
            "MHS.PROTOCOL.PARSE_ERROR",
        ),
        case(
            "empty array",
            "[]",
            Value::Null,
            INVALID_REQUEST,
            "MHS.PROTOCOL.INVALID_REQUEST",
        ),
        case(
            "batch",
            r#"[{"jsonrpc":"2.0","id":2,"method":"mhs.hello"},{"jsonrpc":"2.0","id":3,"method":"mhs.hello"}]"#,
            Value::Null,
            INVALID_REQUEST,
            "MHS.PROTOCOL.INVALID_REQUEST",
        ),
        case(
            "a bare number",
            "42",
            Value::Null,
            INVALID_REQUEST,
            "MHS.PROTOCOL.INVALID_REQUEST",
        ),
        case(
            "notification",
            r#"{"jsonrpc":"2.0","method":"mhs.hello"}"#,
            Value::Null,
            INVALID_REQUEST,
            "MHS.PROTOCOL.INVALID_REQUEST",
        ),
        case(
            "wrong jsonrpc version",
            r#"{"jsonrpc":"1.0","id":4,"method":"mhs.hello"}"#,
            json!(4),
            INVALID_REQUEST,
            "MHS.PROTOCOL.INVALID_REQUEST",
        ),
        case(
            "method is a number",
            r#"{"jsonrpc":"2.0","id":1,"method":5}"#,
            json!(1),
            INVALID_REQUEST,
            "MHS.PROTOCOL.INVALID_REQUEST",
        ),
        case(
            "unknown envelope member",
            r#"{"jsonrpc":"2.0","id":5,"method":"mhs.hello","extra":true}"#,
            json!(5),
            INVALID_REQUEST,
            "MHS.PROTOCOL.INVALID_REQUEST",
        ),
        case(
            "params as an array",
            r#"{"jsonrpc":"2.0","id":6,"method":"mhs.hello","params":[1,2]}"#,
            json!(6),
            INVALID_PARAMS,
            "MHS.PROTOCOL.INVALID_PARAMS",
        ),
        case(
            "unknown params member",
            r#"{"jsonrpc":"2.0","id":7,"method":"mhs.hello","params":{"bogus":1}}"#,
            json!(7),
            INVALID_PARAMS,
            "MHS.PROTOCOL.INVALID_PARAMS",
        ),
        case(
            "wrong param type",
            r#"{"jsonrpc":"2.0","id":"s8","method":"mhs.devices.get","params":{"device_id":5}}"#,
            json!("s8"),
            INVALID_PARAMS,
            "MHS.PROTOCOL.INVALID_PARAMS",
        ),
        case(
            "unknown method",
            r#"{"jsonrpc":"2.0","id":8,"method":"mhs.no.such.method"}"#,
            json!(8),
            METHOD_NOT_FOUND,
            "MHS.PROTOCOL.METHOD_NOT_FOUND",
        ),
        case(
            "duplicate keys",
            r#"{"jsonrpc":"2.0","id":9,"id":10,"method":"mhs.hello"}"#,
            Value::Null,
            PARSE,
            "MHS.PROTOCOL.PARSE_ERROR",
        ),
        case(
            "1e400",
            r#"{"jsonrpc":"2.0","id":10,"method":"mhs.hello","params":{"client":1e400}}"#,
            Value::Null,
            PARSE,
            "MHS.PROTOCOL.PARSE_ERROR",
        ),
        case(
            "nesting depth 100",
            deep,
            Value::Null,
            PARSE,
            "MHS.PROTOCOL.PARSE_ERROR",
        ),
        case(
            "invalid UTF-8",
            not_utf8,
            Value::Null,
            PARSE,
            "MHS.PROTOCOL.PARSE_ERROR",
        ),
    ]
}

fn two_mib_request() -> Vec<u8> {
    let mut v = br#"{"jsonrpc":"2.0","id":99,"method":"mhs.hello","params":{"client":""#.to_vec();
    v.extend(std::iter::repeat_n(b'a', 2 << 20));
    v.extend_from_slice(br#""}}"#);
    v
}

fn check_error(name: &str, answer: &Value, id: &Value, code: i64, mhs_code: &str) {
    assert_eq!(answer["jsonrpc"], "2.0", "{name}: {answer}");
    assert!(
        answer.get("result").is_none(),
        "{name}: unexpected result {answer}"
    );
    assert_eq!(&answer["id"], id, "{name}: {answer}");
    assert_eq!(
        answer["error"]["code"].as_i64(),
        Some(code),
        "{name}: {answer}"
    );
    assert_eq!(
        answer["error"]["data"]["mhs_code"], mhs_code,
        "{name}: {answer}"
    );
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{name}: {answer}"
    );
}

fn bad_input_survives(mut s: Server) {
    for c in cases() {
        let (status, answer) = s.raw(&c.bytes, &c.id);
        assert_eq!(status, 200, "{}: HTTP status", c.name);
        check_error(c.name, &answer, &c.id, c.code, c.mhs_code);
        assert!(
            s.is_alive(),
            "tether exited after {}; stderr:\n{}",
            c.name,
            s.stderr_text()
        );
    }

    // Oversized: refused without being buffered whole; over HTTP with 413.
    let (status, answer) = s.raw(&two_mib_request(), &Value::Null);
    let expected_status = if s.transport() == Transport::Http {
        413
    } else {
        200
    };
    assert_eq!(
        status, expected_status,
        "2 MiB request: HTTP status; answer {answer}"
    );
    check_error(
        "2 MiB request",
        &answer,
        &Value::Null,
        INVALID_REQUEST,
        "MHS.PROTOCOL.TOO_LARGE",
    );
    assert_eq!(
        answer["error"]["data"]["details"]["limit_bytes"],
        1 << 20,
        "{answer}"
    );
    assert!(
        s.is_alive(),
        "tether exited after the 2 MiB request; stderr:\n{}",
        s.stderr_text()
    );

    // Still serving, and no e-stop was triggered by any of it.
    let hello = s.ok("mhs.hello", json!({}));
    assert!(
        hello["features"]
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x == "MHS.SAFETY.NOT_CERTIFIED")),
        "{hello}"
    );
    for d in ["thermostat-1", "arm-1", "relay-1"] {
        assert_eq!(s.status_of(d)["latched"], false, "{d} latched by bad input");
    }
    let stderr = s.stderr_text();
    assert!(!stderr.contains("panicked"), "tether panicked:\n{stderr}");
}

#[test]
fn bad_input_gets_jsonrpc_errors_and_never_kills_the_process_over_http() {
    bad_input_survives(Server::http());
}

#[test]
fn bad_input_gets_jsonrpc_errors_and_never_kills_the_process_over_stdio() {
    bad_input_survives(Server::stdio());
}

fn malformed_estop_still_latches(s: Server) {
    assert_eq!(s.status_of("relay-1")["latched"], false);
    let bytes = br#"{"jsonrpc":"1.0","id":"stop-1","method":"mhs.safety.estop","params":{"device_id":"relay-1","reason":"malformed"}}"#;
    let (status, answer) = s.raw(bytes, &json!("stop-1"));
    assert_eq!(status, 200);
    check_error(
        "malformed e-stop",
        &answer,
        &json!("stop-1"),
        INVALID_REQUEST,
        "MHS.PROTOCOL.INVALID_REQUEST",
    );
    let details = assert_rpc_error(&answer["error"], "MHS.PROTOCOL.INVALID_REQUEST");
    assert_eq!(details["estop_served"], true, "details: {details}");
    assert_eq!(
        details["receipt"]["output"]["latched"], true,
        "details: {details}"
    );

    let st = s.status_of("relay-1");
    assert_eq!(st["latched"], true, "status: {st}");
    // The stop named one device it can use, so only that device latched.
    assert_eq!(s.status_of("thermostat-1")["latched"], false);

    let sid = s.session();
    let refused = s.command(json!({"session_id": sid, "device_id": "relay-1", "capability_id": "cap.io.relay.v1", "input": {"channel": 0, "on": true}}));
    common::assert_rejected(&refused, "MHS.SAFETY.ESTOP_ENGAGED");
}

#[test]
fn malformed_envelope_asking_for_estop_still_latches_over_http() {
    malformed_estop_still_latches(Server::http());
}

#[test]
fn malformed_envelope_asking_for_estop_still_latches_over_stdio() {
    malformed_estop_still_latches(Server::stdio());
}

#[test]
fn estop_sent_as_a_notification_latches_without_an_answer_over_http() {
    let s = Server::http();
    let body = br#"{"jsonrpc":"2.0","method":"mhs.safety.estop","params":{"device_id":"arm-1"}}"#;
    let resp = common::http_post(s.addr(), body, common::TIMEOUT);
    assert_eq!(
        resp.status,
        204,
        "an e-stop notification has no answer: {}",
        resp.text()
    );
    assert!(resp.body.is_empty(), "{}", resp.text());
    assert_eq!(s.status_of("arm-1")["latched"], true);
    assert_eq!(s.status_of("relay-1")["latched"], false);
}

#[test]
fn estop_notification_with_a_defective_envelope_latches_without_an_answer() {
    let s = Server::http();
    let body = br#"{"jsonrpc":"1.0","method":"mhs.safety.estop","params":{"device_id":"arm-1"}}"#;
    let resp = common::http_post(s.addr(), body, common::TIMEOUT);
    assert_eq!(resp.status, 204, "{}", resp.text());
    assert!(resp.body.is_empty(), "{}", resp.text());
    assert_eq!(s.status_of("arm-1")["latched"], true);
}

#[test]
fn estop_with_a_device_id_of_the_wrong_type_stops_every_device_and_answers_the_defect() {
    let s = Server::http();
    let answer = s.call(
        "mhs.safety.estop",
        json!({"device_id": 5, "reason": "typed wrong"}),
    );
    let details = assert_rpc_error(&answer["error"], "MHS.PROTOCOL.INVALID_PARAMS");
    assert_eq!(details["estop_served"], true, "{answer}");
    for device in ["thermostat-1", "arm-1", "relay-1"] {
        let st = s.status_of(device);
        assert_eq!(st["latched"], true, "{device}: {st}");
    }
    let reason = s.status_of("relay-1")["latch"]["reason"].to_string();
    assert!(
        reason.contains("typed wrong") && reason.contains("device_id"),
        "the defect is recorded in the latch's reason: {reason}"
    );
}

#[test]
fn an_integral_number_written_as_a_float_reaches_the_driver_as_an_integer() {
    let s = Server::http();
    let sid = s.session();
    // JSON Schema's `integer` admits 2.0; the driver must never fail what
    // the kernel admitted.
    let r = s.command(json!({"session_id": sid, "device_id": "relay-1", "capability_id": "cap.io.relay.v1", "input": {"channel": 2.0, "on": true}, "command_id": "relay-float-1"}));
    assert_eq!(r["status"], "completed", "{r}");
    let state = s.call(
        "mhs.resource.read",
        json!({"session_id": sid, "device_id": "relay-1", "resource": "bank"}),
    );
    let channels = &state["result"]["state"]["channels"];
    assert_eq!(channels[2], true, "{state}");
    // The same id with `2` is the same input (RFC 8785): a replay.
    let again = s.command(json!({"session_id": sid, "device_id": "relay-1", "capability_id": "cap.io.relay.v1", "input": {"channel": 2, "on": true}, "command_id": "relay-float-1"}));
    assert_eq!(again["replayed"], true, "{again}");
}

#[test]
fn an_estop_with_a_duplicate_key_still_latches_and_the_parse_error_says_so() {
    let s = Server::http();
    let body = br#"{"jsonrpc":"2.0","id":7,"method":"mhs.safety.estop","params":{"device_id":"relay-1","reason":"a","reason":"b"}}"#;
    let resp = common::http_post(s.addr(), body, common::TIMEOUT);
    let answer = resp.json();
    let details = assert_rpc_error(&answer["error"], "MHS.PROTOCOL.PARSE_ERROR");
    assert_eq!(details["estop_served"], true, "{answer}");
    assert_eq!(s.status_of("relay-1")["latched"], true);
}

#[test]
fn nan_and_infinities_in_an_estop_read_as_null_and_the_stop_is_served() {
    let s = Server::http();
    // CORE-076: the named device is stopped; the values that are not numbers
    // are read as null (a null deadline is the device's budget).
    let body = br#"{"jsonrpc":"2.0","id":8,"method":"mhs.safety.estop","params":{"device_id":"relay-1","reason":"nan","deadline_ms":NaN}}"#;
    let answer = common::http_post(s.addr(), body, common::TIMEOUT).json();
    assert_eq!(answer["id"], 8, "{answer}");
    assert_eq!(answer["result"]["output"]["latched"], true, "{answer}");
    assert_eq!(s.status_of("relay-1")["latched"], true);
    assert_eq!(
        s.status_of("arm-1")["latched"],
        false,
        "only the named device"
    );
    // A numeral beyond f64, through a command on the stop class.
    let body = br#"{"jsonrpc":"2.0","id":9,"method":"mhs.safety.estop","params":{"device_id":"arm-1","deadline_ms":1e999}}"#;
    let answer = common::http_post(s.addr(), body, common::TIMEOUT).json();
    assert_eq!(answer["result"]["output"]["latched"], true, "{answer}");
    assert_eq!(s.status_of("arm-1")["latched"], true);
    // Outside an e-stop the same text is a parse error, and nothing moves.
    let body =
        br#"{"jsonrpc":"2.0","id":10,"method":"mhs.safety.status","params":{"x":-Infinity}}"#;
    let answer = common::http_post(s.addr(), body, common::TIMEOUT).json();
    assert_rpc_error(&answer["error"], "MHS.PROTOCOL.PARSE_ERROR");
    assert_eq!(s.status_of("thermostat-1")["latched"], false);
}

#[test]
fn an_estop_only_a_parser_can_name_beside_a_duplicate_key_and_a_nan_still_stops() {
    let s = Server::http();
    // Neither strict (a duplicate `id`) nor JSON (`NaN`), and its method
    // written with an escape no textual look sees: read with `NaN` as null,
    // it asks for an e-stop, and the stop covers every device (which one it
    // meant cannot be trusted).
    let body = br#"{"jsonrpc":"2.0","id":3,"id":4,"method":"mhs.safety.\u0065stop","params":{"device_id":"relay-1","deadline_ms":NaN}}"#;
    let answer = common::http_post(s.addr(), body, common::TIMEOUT).json();
    let details = assert_rpc_error(&answer["error"], "MHS.PROTOCOL.PARSE_ERROR");
    assert_eq!(details["estop_served"], true, "{answer}");
    for d in ["relay-1", "arm-1", "thermostat-1"] {
        assert_eq!(s.status_of(d)["latched"], true, "{d}: {answer}");
    }
}

#[test]
fn a_duplicate_key_can_neither_narrow_nor_cancel_an_estop() {
    for body in [
        &br#"{"jsonrpc":"2.0","id":11,"method":"mhs.safety.estop","params":{"device_id":"arm-1","device_id":"relay-1"}}"#[..],
        &br#"{"jsonrpc":"2.0","id":12,"method":"mhs.safety.estop","params":{"device_id":"arm-1"},"params":{"device_id":"relay-1"}}"#[..],
        &br#"{"jsonrpc":"2.0","id":13,"method":"mhs.safety.estop","method":"mhs.hello","params":{}}"#[..],
    ] {
        let s = Server::http();
        let answer = common::http_post(s.addr(), body, common::TIMEOUT).json();
        let details = assert_rpc_error(&answer["error"], "MHS.PROTOCOL.PARSE_ERROR");
        assert_eq!(details["estop_served"], true, "{answer}");
        for device in ["thermostat-1", "arm-1", "relay-1"] {
            assert_eq!(
                s.status_of(device)["latched"],
                true,
                "{device} after {}",
                String::from_utf8_lossy(body)
            );
        }
    }
}

/// A request too large to read that names the e-stop method is still an
/// e-stop: every device is stopped (its params were never read) and the
/// TOO_LARGE error says the stop was served.
fn an_oversized_estop_still_latches(s: Server) {
    let mut big = br#"{"jsonrpc":"2.0","id":98,"method":"mhs.safety.estop","params":{"device_id":"relay-1","reason":""#.to_vec();
    big.extend(std::iter::repeat_n(b'a', 2 << 20));
    big.extend_from_slice(br#""}}"#);
    let (status, answer) = s.raw(&big, &Value::Null);
    if s.transport() == Transport::Http {
        assert_eq!(status, 413, "{answer}");
    }
    let details = assert_rpc_error(&answer["error"], "MHS.PROTOCOL.TOO_LARGE");
    assert_eq!(details["estop_served"], true, "{answer}");
    for d in ["thermostat-1", "arm-1", "relay-1"] {
        assert_eq!(s.status_of(d)["latched"], true, "{d}");
    }
}

#[test]
fn an_oversized_estop_still_latches_over_http() {
    an_oversized_estop_still_latches(Server::http());
}

#[test]
fn an_oversized_estop_still_latches_over_stdio() {
    an_oversized_estop_still_latches(Server::stdio());
}
