//! The campaign's client side: an HTTP/1.1 client that never panics (a
//! request cut by the kill is an `Err`, which the ledger reads as "not
//! acknowledged"), JSON-RPC and REST calls with a bearer token, and the
//! events the load threads report to the ledger.

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

pub const AGENT: &str = "crash-agent-token-41ad";
pub const ALICE: &str = "crash-alice-token-8c1e";
pub const BOB: &str = "crash-bob-token-2f97";

/// Bound on one request (the longest motion the load asks for is ~3 s).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The prefix of the error of a request that never reached the endpoint.
pub const UNREACHED: &str = "connect";

/// One request on a fresh connection (`Connection: close`): the status and
/// the JSON body, or why there was no complete answer.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
    token: &str,
) -> Result<(u16, Value), String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("{UNREACHED}: {e}"))?;
    stream
        .set_read_timeout(Some(REQUEST_TIMEOUT))
        .map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(Some(REQUEST_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let text = body.map(Value::to_string).unwrap_or_default();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n"
    );
    if body.is_some() {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            text.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(&text);
    stream
        .write_all(req.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .map_err(|e| format!("read: {e}"))?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("no HTTP head in {} bytes", raw.len()))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line: {head}"))?;
    let mut body = raw[split + 4..].to_vec();
    let length = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse::<usize>().ok())
            .flatten()
    });
    if let Some(n) = length {
        if body.len() < n {
            return Err(format!("body cut short: {} of {n} bytes", body.len()));
        }
        body.truncate(n);
    }
    let v = serde_json::from_slice(&body).map_err(|e| format!("body is not JSON: {e}"))?;
    Ok((status, v))
}

/// One JSON-RPC call; the whole answer object.
pub fn rpc(addr: SocketAddr, token: &str, method: &str, params: Value) -> Result<Value, String> {
    let req = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let (status, v) = http(addr, "POST", "/rpc", Some(&req), token)?;
    if status != 200 {
        return Err(format!("HTTP {status} on /rpc: {v}"));
    }
    Ok(v)
}

/// A fresh session for `token`.
pub fn session(addr: SocketAddr, token: &str) -> Result<String, String> {
    let a = rpc(addr, token, "mhs.session.open", json!({}))?;
    a["result"]["session_id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("no session: {a}"))
}

/// How a command was sent, so it can be sent again identically.
#[derive(Clone, Debug)]
pub enum Via {
    /// `mhs.command` params without `session_id`.
    Rpc(Value),
    /// `POST /tools/{tool}:invoke` with this body (input and command id).
    Rest { tool: String, body: Value },
}

impl Via {
    pub fn surface(&self) -> &'static str {
        match self {
            Via::Rpc(_) => "rpc",
            Via::Rest { .. } => "rest",
        }
    }
}

/// What a command's sending answered.
pub enum Sent {
    /// A receipt (from the JSON-RPC result or the invocation's result).
    Receipt(Value),
    /// A refusal answered as an error (REST 4xx, a JSON-RPC error): its code.
    Refused(String),
    /// No complete answer (the kill, most likely).
    Lost(String),
    /// Not sent: no connection (the endpoint is gone), so nothing ran.
    Unreached,
}

/// Sends a command by `via` in session `sid` (JSON-RPC only) and waits for
/// its receipt (REST: polls the invocation's result).
pub fn send(addr: SocketAddr, sid: &str, via: &Via) -> Sent {
    match via {
        Via::Rpc(params) => {
            let mut p = params.clone();
            p["session_id"] = json!(sid);
            match rpc(addr, AGENT, "mhs.command", p) {
                Err(e) => lost(e),
                Ok(a) if a["result"].is_object() => Sent::Receipt(a["result"].clone()),
                Ok(a) => Sent::Refused(code_of(&a["error"]["data"]["mhs_code"])),
            }
        }
        Via::Rest { tool, body } => send_rest(addr, tool, body),
    }
}

/// A request without an answer: never sent when it found no connection.
fn lost(e: String) -> Sent {
    if e.starts_with(UNREACHED) {
        Sent::Unreached
    } else {
        Sent::Lost(e)
    }
}

fn code_of(v: &Value) -> String {
    v.as_str().unwrap_or("no_code").to_owned()
}

fn send_rest(addr: SocketAddr, tool: &str, body: &Value) -> Sent {
    let path = format!("/tools/{tool}:invoke");
    let (status, v) = match http(addr, "POST", &path, Some(body), AGENT) {
        Err(e) => return lost(e),
        Ok(x) => x,
    };
    if status != 202 {
        return Sent::Refused(code_of(&v["error"]["code"]));
    }
    let Some(inv) = v["data"]["invocation_id"].as_str() else {
        return Sent::Refused(format!("202 without invocation_id: {v}"));
    };
    let result = format!("/invocations/{inv}/result");
    // Bounded: 30 s of polling, far above the longest motion.
    for _ in 0..1500 {
        match http(addr, "GET", &result, None, AGENT) {
            Err(e) => return Sent::Lost(e),
            Ok((200, r)) => {
                return if r["data"]["receipt"].is_object() {
                    Sent::Receipt(r["data"]["receipt"].clone())
                } else {
                    Sent::Refused(code_of(&r["data"]["error"]["mhs_code"]))
                }
            }
            Ok((202, _)) => std::thread::sleep(Duration::from_millis(20)),
            Ok((s, r)) => return Sent::Refused(format!("HTTP {s} on result: {r}")),
        }
    }
    Sent::Lost("invocation still pending after 30 s".into())
}

/// What a load thread reports, in the order it happened on that thread.
#[derive(Debug)]
pub enum Event {
    /// About to send `cid` (a motion when `motion`).
    Sending { cid: String, via: Via, motion: bool },
    /// `cid` answered with this receipt; `draw` when it draws the budget.
    Answered {
        cid: String,
        via: Via,
        receipt: Value,
        draw: bool,
    },
    /// `cid` answered without a receipt, or not at all.
    Unanswered { cid: String, refused: bool },
    /// A hold answered with its approval.
    Held { approval_id: String, cid: String },
    /// A vote acknowledged.
    Voted {
        approval_id: String,
        voter: &'static str,
    },
    /// About to latch or reset these devices.
    SafetySending { devices: Vec<&'static str> },
    /// Acknowledged: these devices latched (durably) or reset.
    SafetyAnswered {
        devices: Vec<&'static str>,
        latched: bool,
    },
    /// An answer no client should ever see (an internal error).
    Anomaly(String),
    /// A refusal's code, for the statistics.
    Refusal(String),
}
