//! MCP over HTTP, raw: the streamable-HTTP transport spoken by hand (a
//! session opened with `initialize`, tool calls in it, answers as a JSON body
//! or an event stream), for tests that check what a model's calls do.

use super::*;
use serde_json::{json, Value};

/// The MCP listening address of a server started with `--mcp-http`.
pub fn mcp_addr(s: &Server) -> std::net::SocketAddr {
    let mut addr = None;
    poll_until("the MCP listening line", TIMEOUT, || {
        addr = s
            .stderr_text()
            .split("MCP listening on http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .and_then(|host| host.parse().ok());
        addr.is_some()
    });
    addr.expect("MCP address")
}

/// The JSON-RPC messages of an MCP answer (a JSON body or an event stream).
pub fn mcp_messages(body: &str) -> Vec<Value> {
    if let Ok(v) = serde_json::from_str::<Value>(body.trim()) {
        return vec![v];
    }
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str(d.trim()).ok())
        .collect()
}

/// One MCP request on `/mcp` (2025-11-25, in the given session); answers
/// the response to `id` and the response's head.
pub fn mcp_post(
    addr: std::net::SocketAddr,
    token: &str,
    session: Option<&str>,
    msg: &Value,
) -> (Value, String) {
    let mut headers = format!(
        "Authorization: Bearer {token}\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-11-25\r\n"
    );
    if let Some(sid) = session {
        headers.push_str(&format!("Mcp-Session-Id: {sid}\r\n"));
    }
    let r = http_request(
        addr,
        "POST",
        "/mcp",
        msg.to_string().as_bytes(),
        TIMEOUT,
        &headers,
    );
    assert!(r.status < 300, "{msg}: {} {}", r.status, r.text());
    let answer = mcp_messages(&r.text())
        .into_iter()
        .find(|m| m.get("id").is_some() && m["id"] == msg["id"])
        .unwrap_or(Value::Null);
    (answer, r.head.to_ascii_lowercase())
}

/// Opens an MCP session with `token`; answers its id.
pub fn mcp_session(addr: std::net::SocketAddr, token: &str) -> String {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "tether-test", "version": "1"}}});
    let (answer, head) = mcp_post(addr, token, None, &init);
    assert!(answer.get("result").is_some(), "{answer}");
    let sid = head
        .lines()
        .find_map(|l| l.strip_prefix("mcp-session-id:"))
        .map(|v| v.trim().to_owned())
        .unwrap_or_else(|| panic!("no session id: {head}"));
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let headers = format!(
        "Authorization: Bearer {token}\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-11-25\r\nMcp-Session-Id: {sid}\r\n"
    );
    let r = http_request(
        addr,
        "POST",
        "/mcp",
        note.to_string().as_bytes(),
        TIMEOUT,
        &headers,
    );
    assert!(r.status < 300, "initialized: {} {}", r.status, r.text());
    sid
}

/// The text of an MCP tool result.
pub fn tool_text(answer: &Value) -> String {
    answer["result"]["content"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter_map(|i| i["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}
