//! Telemetry end to end (issue 22 §2, docs/TELEMETRY.md): the real `tether
//! serve` with `[telemetry] otlp_endpoint` sends its spans to a real OTLP
//! receiver this test starts (Python, decoding with the official
//! `opentelemetry-proto` definitions; over gRPC, grpcio serving the package's
//! generated `TraceService`), and its `GET /metrics` is read with the
//! Prometheus reference parser (`prometheus_client`). Both come pinned from
//! `tests/telemetry/requirements.txt`, in the `py-telemetry` venv `.ci/run`
//! fills.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "common/peers.rs"]
mod peers;

use common::mcp_http::{mcp_addr, mcp_post, mcp_session, tool_text};
use common::*;
use serde_json::{json, Value};
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const AGENT: &str = "telemetry-agent-token-1";
const OPERATOR: &str = "telemetry-operator-token-2";

/// The caller's trace the JSON-RPC request continues.
const RPC_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const RPC_PARENT: &str = "00f067aa0ba902b7";
/// The trace the MCP call names in `_meta.traceparent`.
const MCP_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const MCP_PARENT: &str = "b7ad6b7169203331";
/// The trace the REST call names in its header.
const REST_TRACE: &str = "5d0e7c1f2a3b4c5d6e7f8091a2b3c4d5";
const REST_PARENT: &str = "1122334455667788";
/// The trace an e-stop continues.
const ESTOP_TRACE: &str = "77f1e2d3c4b5a6978877665544332211";
const ESTOP_PARENT: &str = "a1b2c3d4e5f60718";
/// A caller's trace that it does not record (sampled flag off).
const UNSAMPLED_TRACE: &str = "0123456789abcdef0123456789abcdef";

fn python() -> PathBuf {
    peers::pinned_venv(
        "TETHER_TELEMETRY_PYTHON",
        &peers::package_dir().join("tests/telemetry/requirements.txt"),
        "py-telemetry",
    )
    .unwrap_or_else(|e| {
        panic!("opentelemetry-proto and prometheus_client could not be set up: {e}")
    })
}

/// The OTLP receiver: a child process and the file it writes spans to.
struct Receiver {
    child: Child,
    port: u16,
    out: PathBuf,
}

impl Receiver {
    fn start(python: &Path, dir: &Path) -> Receiver {
        Self::start_with(python, dir, &[])
    }

    fn start_with(python: &Path, dir: &Path, args: &[&str]) -> Receiver {
        let out = dir.join("spans.jsonl");
        std::fs::write(&out, "").unwrap();
        let mut child = Command::new(python)
            .arg(peers::package_dir().join("tests/telemetry/otlp_receiver.py"))
            .arg(&out)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the OTLP receiver starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("the receiver's port line");
        let port = line
            .trim()
            .strip_prefix("PORT ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port from the receiver: {line:?}"));
        Receiver { child, port, out }
    }

    fn spans(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.kill();
    }
}

fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

fn config(dir: &Path, otlp_port: u16) -> PathBuf {
    config_with(dir, otlp_port, "http/protobuf")
}

fn config_with(dir: &Path, otlp_port: u16, protocol: &str) -> PathBuf {
    let text = format!(
        "builtin_cell = true\n\n[telemetry]\notlp_endpoint = \"http://127.0.0.1:{otlp_port}\"\n\
         otlp_protocol = \"{protocol}\"\nexport_timeout_ms = 500\n\n\
         [[principals]]\nid = \"planner\"\nkind = \"agent\"\ntoken_sha256 = \"{}\"\n\n\
         [[principals]]\nid = \"alice\"\nkind = \"human\"\nroles = [\"operator\"]\ntoken_sha256 = \"{}\"\n",
        sha256_hex(AGENT),
        sha256_hex(OPERATOR)
    );
    let path = dir.join("tether.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn rpc(s: &Server, token: &str, traceparent: Option<&str>, method: &str, params: Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string();
    let mut headers = format!("Authorization: Bearer {token}\r\n");
    if let Some(tp) = traceparent {
        headers.push_str(&format!("traceparent: {tp}\r\n"));
    }
    let r = http_post_with(s.addr(), body.as_bytes(), TIMEOUT, &headers);
    assert_eq!(r.status, 200, "{method}: {}", r.text());
    let v = r.json();
    assert!(v.get("error").is_none(), "{method}: {v}");
    v["result"].clone()
}

fn setpoint(s: &Server, sid: &str, traceparent: Option<&str>, t: f64) -> Value {
    rpc(
        s,
        AGENT,
        traceparent,
        "mhs.command",
        json!({"session_id": sid, "device_id": "thermostat-1",
               "capability_id": "cap.thermal.setpoint.v1", "input": {"target_temperature": t}}),
    )
}

/// `GET /metrics` read by `prometheus_client`'s parser: sample → value.
/// `tether_otlp_spans_exported_total` once it moved (at most 10 s): the
/// receiver has a batch before the export thread, which runs at a lower
/// priority, has read the answer and counted it.
fn exported_eventually(s: &Server, python: &Path) -> f64 {
    let mut exported = 0.0;
    for _ in 0..100 {
        let (_, m) = metrics(s, python, Some(AGENT));
        exported = sample(&m, "tether_otlp_spans_exported_total{}");
        if exported > 0.0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    exported
}

fn metrics(
    s: &Server,
    python: &Path,
    token: Option<&str>,
) -> (u16, serde_json::Map<String, Value>) {
    let headers = token.map_or_else(String::new, |t| format!("Authorization: Bearer {t}\r\n"));
    let r = http_request(s.addr(), "GET", "/metrics", b"", TIMEOUT, &headers);
    if r.status != 200 {
        return (r.status, serde_json::Map::new());
    }
    let mut parser = Command::new(python)
        .arg(peers::package_dir().join("tests/telemetry/parse_metrics.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    parser.stdin.take().unwrap().write_all(&r.body).unwrap();
    let out = parser.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the reference parser refused the page: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        r.text()
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    (200, v.as_object().cloned().unwrap())
}

fn sample(m: &serde_json::Map<String, Value>, key: &str) -> f64 {
    m.get(key).and_then(Value::as_f64).unwrap_or(0.0)
}

/// Spans of `trace` (hex), waiting (bounded) until `want` of them came.
fn trace_spans(rx: &Receiver, trace: &str, want: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let mut spans = Vec::new();
    poll_until(&format!("the spans of trace {trace}"), TIMEOUT, || {
        spans = rx
            .spans()
            .into_iter()
            .filter(|s| s["trace_id"] == trace)
            .collect();
        want(&spans)
    });
    spans
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

fn has(spans: &[Value], name: &str) -> bool {
    !named(spans, name).is_empty()
}

/// The JSON-RPC command's trace: the request span is the caller's child
/// (the `traceparent` header), the kernel's spans its descendants, with the
/// command's attributes; nothing sent holds an input value or a token.
fn assert_rpc_trace(rx: &Receiver) {
    let spans = trace_spans(rx, RPC_TRACE, |s| {
        [
            "POST /rpc",
            "tether.command",
            "policy",
            "driver",
            "tether.commit",
        ]
        .iter()
        .all(|n| has(s, n))
    });
    let request = named(&spans, "POST /rpc")[0];
    assert_eq!(request["parent_span_id"], RPC_PARENT, "{request}");
    assert_eq!(request["service"], "tether");
    assert_eq!(request["attributes"]["surface"], "jsonrpc");
    let command = named(&spans, "tether.command")[0];
    assert_eq!(command["parent_span_id"], request["span_id"], "{command}");
    let attrs = &command["attributes"];
    assert_eq!(attrs["device"], "thermostat-1", "{command}");
    assert_eq!(attrs["capability"], "cap.thermal.setpoint.v1");
    assert_eq!(attrs["decision"], "allow");
    assert_eq!(attrs["outcome"], "completed");
    assert_eq!(attrs["principal_kind"], "agent");
    // Stages are the command's children; the policy decision, the checks'.
    for stage in ["arrive", "resolve", "grant", "claim", "checks", "dispatch"] {
        let st = named(&spans, stage);
        assert_eq!(st.len(), 1, "stage {stage}: {spans:#?}");
        assert_eq!(st[0]["parent_span_id"], command["span_id"], "{stage}");
    }
    let checks = named(&spans, "checks")[0];
    assert_eq!(
        named(&spans, "policy")[0]["parent_span_id"],
        checks["span_id"]
    );
    // No input value and no token anywhere in what was sent.
    let all = serde_json::to_string(&rx.spans()).unwrap();
    for secret in ["31.5", AGENT, OPERATOR, "target_temperature"] {
        assert!(
            !all.contains(secret),
            "`{secret}` leaked into a span: {all}"
        );
    }
}

/// MCP over HTTP with `_meta.traceparent`.
fn assert_mcp_trace(s: &Server, rx: &Receiver) {
    // MCP over HTTP with `_meta.traceparent`.
    let maddr = mcp_addr(s);
    let msid = mcp_session(maddr, AGENT);
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "thermostat-1__setpoint", "arguments": {"target_temperature": 33.0},
        "_meta": {"traceparent": format!("00-{MCP_TRACE}-{MCP_PARENT}-01")}}});
    let (answer, _) = mcp_post(maddr, AGENT, Some(&msid), &call);
    assert!(tool_text(&answer).contains("completed"), "{answer}");
    let spans = trace_spans(rx, MCP_TRACE, |s| {
        has(s, "tether.command") && has(s, "tools/call")
    });
    let request = named(&spans, "tools/call")[0];
    assert_eq!(request["parent_span_id"], MCP_PARENT, "{request}");
    assert_eq!(request["attributes"]["surface"], "mcp");
    let command = named(&spans, "tether.command")[0];
    assert_eq!(command["parent_span_id"], request["span_id"]);
    assert_eq!(command["attributes"]["principal_kind"], "agent");
}

/// REST with a `traceparent` header (the command runs in its own task).
fn assert_rest_trace(s: &Server, rx: &Receiver) {
    // REST with a traceparent header (the command runs in its own task).
    let body = json!({"input": {"target_temperature": 34.0}}).to_string();
    let headers = format!(
        "Authorization: Bearer {AGENT}\r\ntraceparent: 00-{REST_TRACE}-{REST_PARENT}-01\r\n"
    );
    let r = http_request(
        s.addr(),
        "POST",
        "/tools/thermostat-1__setpoint:invoke",
        body.as_bytes(),
        TIMEOUT,
        &headers,
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let spans = trace_spans(rx, REST_TRACE, |s| {
        has(s, "tether.command") && has(s, "driver")
    });
    let request = named(&spans, "POST /tools/{tool}:invoke")[0];
    assert_eq!(request["parent_span_id"], REST_PARENT);
    assert_eq!(
        named(&spans, "tether.command")[0]["parent_span_id"],
        request["span_id"]
    );
}

/// A caller that does not record its trace (flags `00`) gets nothing
/// recorded under it; an e-stop with a `traceparent` is the request's
/// `tether.estop` child. The e-stop's spans are sent after the unsampled
/// command's would have been (one queue, in order), so once they are in,
/// the absence of the other trace is a finding, not a race.
fn assert_unsampled_and_estop_traces(s: &Server, sid: &str, rx: &Receiver) {
    let commands = |rx: &Receiver| named(&rx.spans(), "tether.command").len();
    let commands_before = commands(rx);
    let quiet = format!("00-{UNSAMPLED_TRACE}-{RPC_PARENT}-00");
    let r = setpoint(s, sid, Some(&quiet), 22.5);
    assert_eq!(r["status"], "completed", "{r}");
    let tp = format!("00-{ESTOP_TRACE}-{ESTOP_PARENT}-01");
    let stop = rpc(
        s,
        OPERATOR,
        Some(&tp),
        "mhs.safety.estop",
        json!({"device_id": "relay-1", "reason": "traced stop"}),
    );
    assert!(stop.to_string().contains("relay-1"), "{stop}");
    let spans = trace_spans(rx, ESTOP_TRACE, |s| {
        has(s, "tether.estop") && has(s, "POST /rpc")
    });
    let request = named(&spans, "POST /rpc")[0];
    assert_eq!(request["parent_span_id"], ESTOP_PARENT, "{request}");
    let estop = named(&spans, "tether.estop")[0];
    assert_eq!(estop["parent_span_id"], request["span_id"], "{estop}");
    assert_eq!(estop["kind"], 1, "internal");
    assert_eq!(request["kind"], 2, "server");
    let leaked: Vec<Value> = rx
        .spans()
        .into_iter()
        .filter(|s| s["trace_id"] == UNSAMPLED_TRACE)
        .collect();
    assert!(
        leaked.is_empty(),
        "an unsampled trace was recorded: {leaked:#?}"
    );
    // Nor did its command start a trace of its own.
    assert_eq!(commands(rx), commands_before);
}

/// With the collector gone: `n` setpoints complete, then an e-stop of
/// `relay-1` is served.
fn commands_then_estop(s: &Server, sid: &str, tp: &str, n: u32, reason: &str) {
    for i in 0..n {
        let r = setpoint(s, sid, Some(tp), 20.0 + f64::from(i) / 10.0);
        assert_eq!(r["status"], "completed", "{r}");
    }
    let stop = rpc(
        s,
        OPERATOR,
        None,
        "mhs.safety.estop",
        json!({"device_id": "relay-1", "reason": reason}),
    );
    assert!(stop.to_string().contains("relay-1"), "{stop}");
}

#[test]
fn spans_reach_a_real_otlp_receiver_and_metrics_move_and_a_dead_collector_changes_nothing() {
    let python = python();
    let dir = tempfile::tempdir().unwrap();
    let mut rx = Receiver::start(&python, dir.path());
    let cfg = config(dir.path(), rx.port);
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

    // /metrics needs the token (principals are configured) and parses.
    assert_eq!(metrics(&s, &python, None).0, 401);
    let (_, before) = metrics(&s, &python, Some(AGENT));
    let done = "tether_commands_total{capability=cap.thermal.setpoint.v1,device=thermostat-1,outcome=completed}";
    let denied = "tether_commands_total{capability=cap.thermal.setpoint.v1,device=thermostat-1,outcome=rejected}";
    let envelope = "tether_refusals_total{code=MHS.SAFETY.ENVELOPE_VIOLATION}";
    assert!(before.contains_key(done), "no commands series: {before:?}");

    // JSON-RPC with a traceparent header: the request span is the caller's
    // child, and the kernel's spans are its descendants.
    let sid = rpc(&s, AGENT, None, "mhs.session.open", json!({}))["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let tp = format!("00-{RPC_TRACE}-{RPC_PARENT}-01");
    let receipt = setpoint(&s, &sid, Some(&tp), 31.5);
    assert_eq!(receipt["status"], "completed", "{receipt}");
    let refused = setpoint(&s, &sid, None, 500.0);
    assert_eq!(refused["status"], "rejected", "{refused}");

    assert_rpc_trace(&rx);

    // The refused command's span carries its code (its own trace).
    poll_until("the refused command's span", TIMEOUT, || {
        rx.spans().iter().any(|s| {
            s["name"] == "tether.command"
                && s["attributes"]["refusal_code"] == "MHS.SAFETY.ENVELOPE_VIOLATION"
                && s["attributes"]["outcome"] == "rejected"
        })
    });

    assert_mcp_trace(&s, &rx);
    assert_rest_trace(&s, &rx);
    assert_unsampled_and_estop_traces(&s, &sid, &rx);

    // Counters moved by what ran.
    let (_, after) = metrics(&s, &python, Some(AGENT));
    assert!(
        sample(&after, done) >= sample(&before, done) + 3.0,
        "{after:?}"
    );
    assert_eq!(sample(&after, denied), sample(&before, denied) + 1.0);
    assert_eq!(sample(&after, envelope), sample(&before, envelope) + 1.0);
    assert!(
        sample(&after, "tether_commit_seconds_count{}")
            > sample(&before, "tether_commit_seconds_count{}")
    );
    assert!(sample(&after, "tether_decision_seconds_count{}") >= 4.0);
    assert!(exported_eventually(&s, &python) > 0.0);
    assert_eq!(sample(&after, "tether_latched_devices{}"), 1.0);

    // The collector dies: commands go on, and the e-stop latches as ever.
    rx.kill();
    commands_then_estop(&s, &sid, &tp, 20, "telemetry test");
    let (_, last) = metrics(&s, &python, Some(OPERATOR));
    assert!(
        sample(&last, done) >= sample(&after, done) + 20.0,
        "{last:?}"
    );
    assert_eq!(sample(&last, "tether_latched_devices{}"), 1.0, "{last:?}");
    assert_eq!(sample(&last, "tether_device_latched{device=relay-1}"), 1.0);
    assert!(sample(&last, "tether_estop_seconds_count{}") >= 1.0);
    // The device holds the last value sent after the receiver died.
    let state = rpc(
        &s,
        AGENT,
        None,
        "mhs.resource.read",
        json!({"session_id": sid, "device_id": "thermostat-1", "resource": "main"}),
    );
    assert_eq!(state["state"]["setpoint"], 21.9, "{state}");
}

/// The same spans over gRPC: a JSON-RPC command continuing its caller's
/// trace reaches grpcio's `TraceService` whole (request, command, stages,
/// their parents and attributes), and a receiver killed mid-run changes
/// nothing for commands or the e-stop.
#[test]
fn over_grpc_spans_reach_a_real_receiver_and_its_death_changes_nothing() {
    let python = python();
    let dir = tempfile::tempdir().unwrap();
    let mut rx = Receiver::start_with(&python, dir.path(), &["--grpc"]);
    let cfg = config_with(dir.path(), rx.port, "grpc");
    let s = Server::start_with(
        Transport::Http,
        Some(&dir.path().join("state")),
        &[OsStr::new("--config"), cfg.as_os_str()],
    );
    let sid = rpc(&s, AGENT, None, "mhs.session.open", json!({}))["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let tp = format!("00-{RPC_TRACE}-{RPC_PARENT}-01");
    let receipt = setpoint(&s, &sid, Some(&tp), 31.5);
    assert_eq!(receipt["status"], "completed", "{receipt}");
    assert_rpc_trace(&rx);
    assert!(exported_eventually(&s, &python) > 0.0);

    rx.kill();
    commands_then_estop(&s, &sid, &tp, 10, "grpc telemetry test");
    let (_, last) = metrics(&s, &python, Some(OPERATOR));
    assert_eq!(sample(&last, "tether_device_latched{device=relay-1}"), 1.0);
    let state = rpc(
        &s,
        AGENT,
        None,
        "mhs.resource.read",
        json!({"session_id": sid, "device_id": "thermostat-1", "resource": "main"}),
    );
    assert_eq!(state["state"]["setpoint"], 20.9, "{state}");
}
