//! The edge (issue 17, part A): no web page drives the endpoint. Bodies that
//! are not `application/json` are 415 on `/rpc`, REST and `/mcp`; a `Host`
//! the endpoint does not serve and an `Origin` it does not allow are 403 on
//! every route; an e-stop among them still latches (the answer is the
//! refusal with `estop_served` and the receipt); with principals the token
//! comes first (401). Every check runs against the real binary.
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
use std::time::{Duration, Instant};

const TOKEN: &str = "edge-agent-token-4c7d";
const JSON: &str = "Content-Type: application/json\r\n";
const PLAIN: &str = "Content-Type: text/plain\r\n";
const EVIL_ORIGIN: &str = "Origin: http://evil.example\r\n";
const MCP_ACCEPT: &str = "Accept: application/json, text/event-stream\r\n";
const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"edge","version":"1"}}}"#;
const SESSION_OPEN: &str = r#"{"jsonrpc":"2.0","id":11,"method":"mhs.session.open","params":{}}"#;
const SETPOINT: &str = "/tools/thermostat-1__setpoint:invoke";
const SETPOINT_BODY: &str = r#"{"input":{"target_temperature":31}}"#;

// ----- a raw HTTP exchange ---------------------------------------------------

/// One request with exactly the given header lines (the caller writes `Host`,
/// `Content-Type`, `Origin`...); `Content-Length` and `Connection: close`
/// are added. Reads the whole answer.
fn exchange(addr: SocketAddr, method: &str, path: &str, headers: &str, body: &str) -> HttpResponse {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    stream.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    let head = format!(
        "{method} {path} HTTP/1.1\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(body.as_bytes()));
    let mut raw = Vec::new();
    let _ = stream.take(4 << 20).read_to_end(&mut raw);
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head in {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head}"));
    HttpResponse {
        status,
        head,
        body: raw[split + 4..].to_vec(),
    }
}

fn host(addr: SocketAddr) -> String {
    format!("Host: {addr}\r\n")
}

/// A header's value in an answer's head (lower-cased name), if present.
fn header(r: &HttpResponse, name: &str) -> Option<String> {
    r.head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_owned())
    })
}

/// The JSON of an answer whose body is JSON or one server-sent event.
fn json_of(r: &HttpResponse) -> Value {
    let text = r.text();
    if let Ok(v) = serde_json::from_str(&text) {
        return v;
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .find_map(|d| serde_json::from_str(d.trim()).ok())
        .unwrap_or_else(|| {
            panic!(
                "HTTP {} answer is neither JSON nor an event: {text}",
                r.status
            )
        })
}

/// A JSON-RPC error answer with this status, code and reason; answers `details`.
fn rpc_refusal(r: &HttpResponse, status: u16, code: &str, reason: Option<&str>) -> Value {
    assert_eq!(r.status, status, "{}\n{}", r.head, r.text());
    let v = json_of(r);
    assert_eq!(v["jsonrpc"], "2.0", "{v}");
    assert_eq!(v["error"]["data"]["mhs_code"], code, "{v}");
    let details = v["error"]["data"]["details"].clone();
    if let Some(reason) = reason {
        assert_eq!(details["reason"], reason, "{v}");
    }
    details
}

/// A REST envelope refusal with this status, code and reason; answers `details`.
fn rest_refusal(r: &HttpResponse, status: u16, code: &str, reason: Option<&str>) -> Value {
    assert_eq!(r.status, status, "{}\n{}", r.head, r.text());
    let v = r.json();
    assert_eq!(v["ok"], false, "{v}");
    assert_eq!(v["error"]["code"], code, "{v}");
    let details = v["error"]["details"].clone();
    if let Some(reason) = reason {
        assert_eq!(details["reason"], reason, "{v}");
    }
    details
}

fn assert_no_cors(r: &HttpResponse) {
    assert!(
        !r.head.to_ascii_lowercase().contains("access-control-allow"),
        "{}",
        r.head
    );
}

/// `details` of an answer that says the e-stop was served, with its receipt.
fn assert_estop_served(details: &Value) {
    assert_eq!(details["estop_served"], true, "{details}");
    assert_eq!(
        details["receipt"]["capability_id"], "cap.internal.safety_estop.v1",
        "{details}"
    );
}

// ----- endpoints -------------------------------------------------------------

const ORIGIN: &str = "https://console.lab.example";
const PUBLIC_NAME: &str = "tether.lab.example";

/// A config serving the built-in cell with `[http]` and, with `principals`,
/// one agent principal holding `TOKEN`.
fn config(dir: &Path, http: &str, principals: bool) -> PathBuf {
    let mut text = "builtin_cell = true\n".to_owned();
    if !http.is_empty() {
        text.push_str(&format!("\n[http]\n{http}\n"));
    }
    if principals {
        let digest: String = tether_server::auth::token_digest(TOKEN)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        text.push_str(&format!(
            "\n[[principals]]\nid = \"planner\"\nkind = \"agent\"\ntoken_sha256 = \"{digest}\"\n"
        ));
    }
    let path = dir.join("tether.toml");
    std::fs::write(&path, text).expect("config");
    path
}

/// `tether serve --http 127.0.0.1:0 --mcp-http 127.0.0.1:0 [--config CFG]`;
/// answers the server and its MCP address.
fn with_mcp(dir: Option<&Path>, cfg: Option<&Path>) -> (Server, SocketAddr) {
    let mut extra: Vec<&OsStr> = vec![OsStr::new("--mcp-http"), OsStr::new("127.0.0.1:0")];
    if let Some(cfg) = cfg {
        extra.extend([OsStr::new("--config"), cfg.as_os_str()]);
    }
    let state = dir.map(|d| d.join("state"));
    let s = Server::start_with(Transport::Http, state.as_deref(), &extra);
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let text = s.stderr_text();
        if let Some(rest) = text.split("MCP listening on http://").nth(1) {
            let addr = rest.split('/').next().expect("address");
            return (s, addr.parse().expect("MCP address"));
        }
        assert!(
            Instant::now() < deadline,
            "no MCP listening line; stderr:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn thermostat_revision(s: &Server) -> u64 {
    let sid = s.session();
    s.revision(&sid, "thermostat-1", "main")
}

/// Kernel sessions opened so far (from the evidence).
fn sessions_opened(s: &Server) -> usize {
    let run = tether(&[
        OsStr::new("audit"),
        OsStr::new("export"),
        OsStr::new("--state-dir"),
        s.state_dir().as_os_str(),
    ]);
    assert_eq!(run.code, Some(0), "audit export: {}", run.stderr);
    run.stdout_text()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["kind"] == "session.open")
        .count()
}

fn latched(s: &Server) -> Vec<String> {
    let r = s.ok("mhs.safety.status", json!({}));
    let mut ids: Vec<String> = r["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .filter(|d| d["latched"] == true)
        .filter_map(|d| d["device_id"].as_str().map(str::to_owned))
        .collect();
    ids.sort_unstable();
    ids
}

// ----- content type ------------------------------------------------------------

#[test]
fn a_text_plain_post_to_rpc_is_415_and_opens_no_session() {
    let s = Server::http();
    let addr = s.addr();
    let before = sessions_opened(&s);
    for content_type in [
        PLAIN,
        "",
        "Content-Type: application/x-www-form-urlencoded\r\n",
        "Content-Type: multipart/form-data; boundary=x\r\n",
        "Content-Type: application/json; charset=latin1\r\n",
        "Content-Type: application/json-patch+json\r\n",
    ] {
        let r = exchange(
            addr,
            "POST",
            "/rpc",
            &format!("{}{content_type}", host(addr)),
            SESSION_OPEN,
        );
        let details = rpc_refusal(&r, 415, "MHS.PROTOCOL.UNSUPPORTED_MEDIA_TYPE", None);
        assert!(details["reason"].is_string(), "{details}");
        assert!(details.get("estop_served").is_none(), "{details}");
        assert_no_cors(&r);
    }
    assert_eq!(sessions_opened(&s), before, "no session was opened");
    // JSON, with or without a UTF-8 charset, in any case, is served.
    for content_type in [
        JSON,
        "Content-Type: application/json; charset=utf-8\r\n",
        "Content-Type: Application/JSON; Charset=\"UTF-8\"\r\n",
    ] {
        let r = exchange(
            addr,
            "POST",
            "/rpc",
            &format!("{}{content_type}", host(addr)),
            SESSION_OPEN,
        );
        assert_eq!(r.status, 200, "{content_type}: {}", r.text());
        assert!(r.json()["result"]["session_id"].is_string(), "{}", r.text());
    }
}

#[test]
fn a_text_plain_rest_invoke_is_415_and_the_revision_does_not_move() {
    let s = Server::http();
    let addr = s.addr();
    let before = thermostat_revision(&s);
    for content_type in [PLAIN, ""] {
        let r = exchange(
            addr,
            "POST",
            SETPOINT,
            &format!("{}{content_type}", host(addr)),
            SETPOINT_BODY,
        );
        rest_refusal(&r, 415, "MHS.PROTOCOL.UNSUPPORTED_MEDIA_TYPE", None);
        assert_no_cors(&r);
    }
    // Nothing ran: the revision is where it was.
    assert_eq!(thermostat_revision(&s), before);
    // A body-less POST needs no content type: this cancel reaches the route.
    let r = exchange(
        addr,
        "POST",
        "/invocations/inv_unknown/cancel",
        &host(addr),
        "",
    );
    rest_refusal(&r, 404, "MHS.OPERATION.UNKNOWN", None);
    // The same invoke as JSON is served, and moves the revision.
    let r = exchange(
        addr,
        "POST",
        SETPOINT,
        &format!("{}{JSON}", host(addr)),
        SETPOINT_BODY,
    );
    assert_eq!(r.status, 202, "{}", r.text());
    poll_until("the setpoint to run", Duration::from_secs(10), || {
        thermostat_revision(&s) > before
    });
}

// ----- Host ------------------------------------------------------------------------

#[test]
fn a_foreign_host_is_403_on_rpc_rest_and_healthz() {
    let s = Server::http();
    let addr = s.addr();
    let before = sessions_opened(&s);
    let other_port = format!("127.0.0.1:{}", addr.port().wrapping_add(1).max(1));
    for name in [
        "evil.example",
        &format!("evil.example:{}", addr.port()),
        &other_port,
    ] {
        let headers = format!("Host: {name}\r\n{JSON}");
        let r = exchange(addr, "POST", "/rpc", &headers, SESSION_OPEN);
        rpc_refusal(&r, 403, "MHS.AUTH.ORIGIN_REFUSED", Some("host_not_served"));
        for path in [
            "/tools",
            "/healthz",
            "/openapi.json",
            "/tools/estop",
            "/nowhere",
        ] {
            let r = exchange(addr, "GET", path, &headers, "");
            rest_refusal(&r, 403, "MHS.AUTH.ORIGIN_REFUSED", Some("host_not_served"));
            assert_no_cors(&r);
        }
        let r = exchange(addr, "POST", SETPOINT, &headers, SETPOINT_BODY);
        rest_refusal(&r, 403, "MHS.AUTH.ORIGIN_REFUSED", Some("host_not_served"));
    }
    assert_eq!(sessions_opened(&s), before, "no session was opened");
    assert_eq!(
        thermostat_revision(&s),
        0,
        "no setpoint ran on a fresh endpoint"
    );
}

#[test]
fn localhost_and_the_literal_loopback_address_are_both_served() {
    let s = Server::http();
    let addr = s.addr();
    let port = addr.port();
    for name in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("LocalHost:{port}"),
    ] {
        // With no Origin, and with the endpoint's own origin.
        for origin in [String::new(), format!("Origin: http://{name}\r\n")] {
            let headers = format!("Host: {name}\r\n{origin}{JSON}");
            let r = exchange(
                addr,
                "POST",
                "/rpc",
                &headers,
                r#"{"jsonrpc":"2.0","id":1,"method":"mhs.hello","params":{}}"#,
            );
            assert_eq!(r.status, 200, "{headers}: {}", r.text());
            assert!(r.json()["result"].is_object(), "{}", r.text());
            for path in ["/tools", "/healthz", "/openapi.json"] {
                let r = exchange(addr, "GET", path, &headers, "");
                assert_eq!(r.status, 200, "{path} {headers}: {}", r.text());
                assert_no_cors(&r);
            }
        }
    }
}

// ----- Origin ----------------------------------------------------------------------

#[test]
fn a_foreign_origin_is_403_on_rpc_and_rest_and_nothing_happens() {
    let s = Server::http();
    let addr = s.addr();
    let before = sessions_opened(&s);
    let port = addr.port();
    let other = format!(
        "Origin: http://localhost:{}\r\n",
        port.wrapping_add(1).max(1)
    );
    let evil_same_port = format!("Origin: https://evil.example:{port}\r\n");
    for origin in [
        EVIL_ORIGIN,
        "Origin: null\r\n",
        &other,
        &evil_same_port,
        "Origin: not an origin\r\n",
    ] {
        let headers = format!("{}{origin}{JSON}", host(addr));
        let r = exchange(addr, "POST", "/rpc", &headers, SESSION_OPEN);
        rpc_refusal(
            &r,
            403,
            "MHS.AUTH.ORIGIN_REFUSED",
            Some("origin_not_allowed"),
        );
        assert_no_cors(&r);
        let r = exchange(addr, "POST", SETPOINT, &headers, SETPOINT_BODY);
        rest_refusal(
            &r,
            403,
            "MHS.AUTH.ORIGIN_REFUSED",
            Some("origin_not_allowed"),
        );
        let r = exchange(addr, "GET", "/tools", &headers, "");
        rest_refusal(
            &r,
            403,
            "MHS.AUTH.ORIGIN_REFUSED",
            Some("origin_not_allowed"),
        );
        // A preflight is refused too, and allows nothing.
        let preflight = format!(
            "{}{origin}Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: content-type\r\n",
            host(addr)
        );
        let r = exchange(addr, "OPTIONS", "/rpc", &preflight, "");
        assert!((400..500).contains(&r.status), "{}", r.head);
        assert_no_cors(&r);
    }
    assert_eq!(sessions_opened(&s), before, "no session was opened");
    assert_eq!(thermostat_revision(&s), 0, "no setpoint ran");
}

#[test]
fn mcp_refuses_a_foreign_origin_host_and_content_type_and_opens_no_session() {
    let (s, mcp) = with_mcp(None, None);
    let cases = [
        (
            format!("{}{EVIL_ORIGIN}{JSON}", host(mcp)),
            403,
            "MHS.AUTH.ORIGIN_REFUSED",
            "origin_not_allowed",
        ),
        (
            format!("Host: evil.example:{}\r\n{JSON}", mcp.port()),
            403,
            "MHS.AUTH.ORIGIN_REFUSED",
            "host_not_served",
        ),
        (
            format!("{}{PLAIN}", host(mcp)),
            415,
            "MHS.PROTOCOL.UNSUPPORTED_MEDIA_TYPE",
            "content_type_not_json",
        ),
    ];
    for (headers, status, code, reason) in cases {
        let r = exchange(
            mcp,
            "POST",
            "/mcp",
            &format!("{headers}{MCP_ACCEPT}"),
            INITIALIZE,
        );
        rpc_refusal(&r, status, code, Some(reason));
        assert!(header(&r, "mcp-session-id").is_none(), "{}", r.head);
        assert_no_cors(&r);
    }
    // The listener's own names are served: both loopback spellings, and the
    // endpoint's own origin.
    let port = mcp.port();
    for name in [format!("localhost:{port}"), format!("127.0.0.1:{port}")] {
        let headers = format!("Host: {name}\r\nOrigin: http://{name}\r\n{JSON}{MCP_ACCEPT}");
        let r = exchange(mcp, "POST", "/mcp", &headers, INITIALIZE);
        assert_eq!(r.status, 200, "{headers}: {}", r.text());
        assert!(header(&r, "mcp-session-id").is_some(), "{}", r.head);
        assert!(
            json_of(&r)["result"]["serverInfo"].is_object(),
            "{}",
            r.text()
        );
    }
    // The MCP port is not the HTTP port: a Host naming the other listener is refused.
    let r = exchange(
        mcp,
        "POST",
        "/mcp",
        &format!("{}{JSON}{MCP_ACCEPT}", host(s.addr())),
        INITIALIZE,
    );
    rpc_refusal(&r, 403, "MHS.AUTH.ORIGIN_REFUSED", Some("host_not_served"));
}

// ----- configured names and origins ----------------------------------------------------

#[test]
fn a_configured_public_name_and_allowed_origin_are_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(
        dir.path(),
        &format!("public_names = [\"{PUBLIC_NAME}\"]\nallowed_origins = [\"{ORIGIN}\"]"),
        false,
    );
    let (s, mcp) = with_mcp(Some(dir.path()), Some(&cfg));
    let addr = s.addr();
    let port = addr.port();
    let hello = r#"{"jsonrpc":"2.0","id":1,"method":"mhs.hello","params":{}}"#;
    let served = [
        format!("Host: {PUBLIC_NAME}:{port}\r\n"),
        // Reached through a proxy on the scheme's default port.
        format!("Host: {PUBLIC_NAME}\r\n"),
        format!("Host: {PUBLIC_NAME}:{port}\r\nOrigin: {ORIGIN}\r\n"),
        format!("Host: {PUBLIC_NAME}:{port}\r\nOrigin: http://{PUBLIC_NAME}:{port}\r\n"),
        format!("{}Origin: {ORIGIN}\r\n", host(addr)),
        format!("{}Origin: {ORIGIN}:443\r\n", host(addr)),
    ];
    for headers in &served {
        let r = exchange(addr, "POST", "/rpc", &format!("{headers}{JSON}"), hello);
        assert_eq!(r.status, 200, "{headers}: {}", r.text());
        let r = exchange(addr, "GET", "/tools", headers, "");
        assert_eq!(r.status, 200, "{headers}: {}", r.text());
    }
    let refused = [
        (
            format!("Host: other.lab.example:{port}\r\n"),
            "host_not_served",
        ),
        (
            format!("{}Origin: {ORIGIN}:8443\r\n", host(addr)),
            "origin_not_allowed",
        ),
        (
            format!("{}Origin: http://console.lab.example\r\n", host(addr)),
            "origin_not_allowed",
        ),
        (
            format!("{}Origin: https://evil.console.lab.example\r\n", host(addr)),
            "origin_not_allowed",
        ),
    ];
    for (headers, reason) in &refused {
        let r = exchange(addr, "POST", "/rpc", &format!("{headers}{JSON}"), hello);
        rpc_refusal(&r, 403, "MHS.AUTH.ORIGIN_REFUSED", Some(reason));
        let r = exchange(addr, "GET", "/tools", headers, "");
        rest_refusal(&r, 403, "MHS.AUTH.ORIGIN_REFUSED", Some(reason));
    }
    // MCP: the same names and origins, on its own port.
    let served_mcp = format!(
        "Host: {PUBLIC_NAME}:{}\r\nOrigin: {ORIGIN}\r\n{JSON}{MCP_ACCEPT}",
        mcp.port()
    );
    let r = exchange(mcp, "POST", "/mcp", &served_mcp, INITIALIZE);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(header(&r, "mcp-session-id").is_some(), "{}", r.head);
    let refused_mcp = format!(
        "Host: other.lab.example:{}\r\nOrigin: {ORIGIN}\r\n{JSON}{MCP_ACCEPT}",
        mcp.port()
    );
    let r = exchange(mcp, "POST", "/mcp", &refused_mcp, INITIALIZE);
    rpc_refusal(&r, 403, "MHS.AUTH.ORIGIN_REFUSED", Some("host_not_served"));
}

#[test]
fn malformed_http_keys_refuse_start_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (http, needle) in [
        ("allowed_origins = [\"*\"]", "allowed_origins[0]"),
        ("allowed_origins = [\"null\"]", "allowed_origins[0]"),
        (
            "allowed_origins = [\"console.lab.example\"]",
            "allowed_origins[0]",
        ),
        (
            "allowed_origins = [\"https://console.lab.example/app\"]",
            "allowed_origins[0]",
        ),
        (
            "public_names = [\"http://tether.lab.example\"]",
            "public_names[0]",
        ),
        ("public_names = [\"\"]", "public_names[0]"),
        ("public_hosts = [\"x\"]", "public_hosts"),
    ] {
        let cfg = config(dir.path(), http, false);
        let run = tether(&[
            OsStr::new("serve"),
            OsStr::new("--config"),
            cfg.as_os_str(),
            OsStr::new("--state-dir"),
            dir.path().join("state").as_os_str(),
            OsStr::new("--http"),
            OsStr::new("127.0.0.1:0"),
        ]);
        assert_eq!(run.code, Some(2), "{http}: {}", run.stderr);
        assert!(run.stderr.contains(needle), "{http}: {}", run.stderr);
    }
}

// ----- the e-stop is never refused -------------------------------------------------------

fn rpc_estop(devices: &[&str]) -> String {
    json!({"jsonrpc": "2.0", "id": 77, "method": "mhs.safety.estop", "params": {"device_ids": devices, "reason": "edge test"}})
        .to_string()
}

#[test]
fn an_estop_posted_as_text_plain_latches_what_it_names_and_answers_415() {
    let s = Server::http();
    let addr = s.addr();
    // JSON-RPC: the devices it names, and only those.
    let r = exchange(
        addr,
        "POST",
        "/rpc",
        &format!("{}{PLAIN}", host(addr)),
        &rpc_estop(&["arm-1", "relay-1"]),
    );
    let details = rpc_refusal(&r, 415, "MHS.PROTOCOL.UNSUPPORTED_MEDIA_TYPE", None);
    assert_estop_served(&details);
    assert_eq!(json_of(&r)["id"], 77, "{}", r.text());
    assert_eq!(latched(&s), ["arm-1", "relay-1"]);
    // REST's estop tool, with no content type at all.
    let r = exchange(
        addr,
        "POST",
        "/tools/estop:invoke",
        &host(addr),
        r#"{"input":{"device_id":"thermostat-1","reason":"edge test"}}"#,
    );
    assert_estop_served(&rest_refusal(
        &r,
        415,
        "MHS.PROTOCOL.UNSUPPORTED_MEDIA_TYPE",
        None,
    ));
    assert_eq!(latched(&s), ["arm-1", "relay-1", "thermostat-1"]);
}

#[test]
fn an_mcp_estop_posted_as_text_plain_latches_and_answers_415() {
    let (s, mcp) = with_mcp(None, None);
    let call = r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"estop","arguments":{"device_id":"relay-1","reason":"edge test"}}}"#;
    let r = exchange(
        mcp,
        "POST",
        "/mcp",
        &format!("{}{PLAIN}{MCP_ACCEPT}", host(mcp)),
        call,
    );
    let details = rpc_refusal(&r, 415, "MHS.PROTOCOL.UNSUPPORTED_MEDIA_TYPE", None);
    assert_estop_served(&details);
    assert_eq!(json_of(&r)["id"], 5, "{}", r.text());
    assert_eq!(latched(&s), ["relay-1"]);
}

#[test]
fn an_estop_with_a_foreign_origin_or_host_latches_and_answers_403() {
    let (s, mcp) = with_mcp(None, None);
    let addr = s.addr();
    let foreign = format!("{}{EVIL_ORIGIN}{JSON}", host(addr));
    let r = exchange(addr, "POST", "/rpc", &foreign, &rpc_estop(&["relay-1"]));
    assert_estop_served(&rpc_refusal(
        &r,
        403,
        "MHS.AUTH.ORIGIN_REFUSED",
        Some("origin_not_allowed"),
    ));
    assert_eq!(latched(&s), ["relay-1"]);
    // REST, named by a foreign Host.
    let evil_host = format!("Host: evil.example\r\n{JSON}");
    let r = exchange(
        addr,
        "POST",
        "/tools/estop:invoke",
        &evil_host,
        r#"{"input":{"device_id":"thermostat-1"}}"#,
    );
    assert_estop_served(&rest_refusal(
        &r,
        403,
        "MHS.AUTH.ORIGIN_REFUSED",
        Some("host_not_served"),
    ));
    assert_eq!(latched(&s), ["relay-1", "thermostat-1"]);
    // MCP, with a foreign Origin and no session.
    let call = r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"estop","arguments":{"device_id":"arm-1"}}}"#;
    let r = exchange(
        mcp,
        "POST",
        "/mcp",
        &format!("{}{EVIL_ORIGIN}{JSON}{MCP_ACCEPT}", host(mcp)),
        call,
    );
    assert_estop_served(&rpc_refusal(
        &r,
        403,
        "MHS.AUTH.ORIGIN_REFUSED",
        Some("origin_not_allowed"),
    ));
    assert_eq!(latched(&s), ["arm-1", "relay-1", "thermostat-1"]);
}

#[test]
fn an_unparsable_estop_with_a_foreign_origin_stops_every_device() {
    let s = Server::http();
    let addr = s.addr();
    // A duplicate key: which device it meant cannot be trusted.
    let text = r#"{"jsonrpc":"2.0","id":8,"method":"mhs.safety.estop","params":{"device_id":"arm-1","device_id":"relay-1"}}"#;
    let headers = format!("{}{EVIL_ORIGIN}{PLAIN}", host(addr));
    let r = exchange(addr, "POST", "/rpc", &headers, text);
    assert_estop_served(&rpc_refusal(
        &r,
        403,
        "MHS.AUTH.ORIGIN_REFUSED",
        Some("origin_not_allowed"),
    ));
    assert_eq!(latched(&s), ["arm-1", "relay-1", "thermostat-1"]);
}

#[test]
fn with_principals_a_foreign_origin_estop_without_a_token_is_401_and_latches_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path(), "", true);
    let (s, mcp) = with_mcp(Some(dir.path()), Some(&cfg));
    let addr = s.addr();
    let latched_with_token = || -> Vec<String> {
        let v = call_with_token(&s, TOKEN, "mhs.safety.status", json!({}));
        let mut ids: Vec<String> = v["result"]["devices"]
            .as_array()
            .expect("devices")
            .iter()
            .filter(|d| d["latched"] == true)
            .filter_map(|d| d["device_id"].as_str().map(str::to_owned))
            .collect();
        ids.sort_unstable();
        ids
    };
    let foreign = format!("{}{EVIL_ORIGIN}{PLAIN}", host(addr));
    let r = exchange(addr, "POST", "/rpc", &foreign, &rpc_estop(&["relay-1"]));
    rpc_refusal(&r, 401, "MHS.AUTH.UNAUTHENTICATED", Some("missing_token"));
    let r = exchange(
        addr,
        "POST",
        "/tools/estop:invoke",
        &format!("Host: evil.example\r\n{PLAIN}"),
        "{}",
    );
    rest_refusal(&r, 401, "MHS.AUTH.UNAUTHENTICATED", Some("missing_token"));
    let call = r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"estop","arguments":{}}}"#;
    let r = exchange(
        mcp,
        "POST",
        "/mcp",
        &format!("{}{EVIL_ORIGIN}{PLAIN}{MCP_ACCEPT}", host(mcp)),
        call,
    );
    rpc_refusal(&r, 401, "MHS.AUTH.UNAUTHENTICATED", Some("missing_token"));
    assert!(latched_with_token().is_empty(), "nothing latched");
    // A foreign-Origin request with the token is refused 403, and nothing
    // but an e-stop runs.
    let auth = format!("Authorization: Bearer {TOKEN}\r\n");
    let r = exchange(
        addr,
        "POST",
        "/rpc",
        &format!("{foreign}{auth}"),
        SESSION_OPEN,
    );
    rpc_refusal(
        &r,
        403,
        "MHS.AUTH.ORIGIN_REFUSED",
        Some("origin_not_allowed"),
    );
    // With the token, the foreign-Origin e-stop latches and answers 403.
    let r = exchange(
        addr,
        "POST",
        "/rpc",
        &format!("{foreign}{auth}"),
        &rpc_estop(&["relay-1"]),
    );
    assert_estop_served(&rpc_refusal(
        &r,
        403,
        "MHS.AUTH.ORIGIN_REFUSED",
        Some("origin_not_allowed"),
    ));
    assert_eq!(latched_with_token(), ["relay-1"]);
}
