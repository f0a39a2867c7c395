//! `tether mcp --endpoint URL`: MCP on standard input/output as a client of a
//! running endpoint's streamable HTTP MCP (`tether serve --mcp-http ADDR`,
//! path `/mcp`), with the caller's own token. A desktop MCP client and an
//! operator console then share one endpoint — one kernel, one owner of each
//! device — instead of each starting its own.
//!
//! The bridge decides nothing: every message read on stdin is posted as it
//! is to the endpoint, and every message the endpoint answers (a JSON body or
//! the events of an SSE stream: results, progress, elicitations) is written
//! to stdout, one per line. Tool calls, refusals and the e-stop are the
//! endpoint kernel's. What the bridge adds is transport only: the
//! `Mcp-Session-Id` and `MCP-Protocol-Version` headers, the method and name
//! headers of protocol 2026-07-28, a new MCP session when the endpoint lost
//! its own (a restart: the request was not served, so it is sent once
//! more), and a clear answer, within bounded times, when the endpoint cannot
//! be reached: never a hang, and an e-stop that could not be delivered says
//! so.

use anyhow::Context;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{json, Value};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, Semaphore};

/// Longest wait for a TCP connection to the endpoint.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for the endpoint's response head after a request was sent.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest silence within a response body (an SSE stream of a long call
/// carries progress; a call sent without a progress token may be silent
/// until its result, bounded by the kernel's deadline).
const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Largest line read from stdin (the endpoint reads 1 MiB of a request and
/// still serves an e-stop named in it; a longer line is cut here).
const MAX_LINE: usize = 4 << 20;
/// Largest body or SSE event accepted from the endpoint.
const MAX_ANSWER: usize = 16 << 20;
/// Requests in flight to the endpoint at once (an e-stop never waits for a place).
const MAX_IN_FLIGHT: usize = 64;
/// Messages waiting to be written to stdout.
const OUT_QUEUE: usize = 1024;
/// At stdin's end: longest wait for calls still in flight.
const DRAIN_WAIT: Duration = Duration::from_secs(30);

/// The protocol generation from which requests carry `Mcp-Method` / `Mcp-Name`.
const STANDARD_HEADERS_VERSION: &str = "2026-07-28";
const META_VERSION_KEY: &str = "io.modelcontextprotocol/protocolVersion";

/// Where the endpoint is.
#[derive(Debug, Clone)]
struct Target {
    /// `host:port`, as connected to and sent as `Host`.
    authority: String,
    path: String,
    url: String,
    token: Option<String>,
}

impl Target {
    fn parse(url: &str, token: Option<String>) -> anyhow::Result<Self> {
        if url.starts_with("https://") {
            anyhow::bail!(
                "{url}: `tether mcp --endpoint` speaks plain http:// only (an endpoint on this host, or behind a TLS tunnel)"
            );
        }
        let rest = url.strip_prefix("http://").with_context(|| {
            format!("{url} is not an http:// URL of an MCP endpoint (http://HOST:PORT/mcp)")
        })?;
        let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
        if authority.is_empty() || !authority.contains(':') {
            anyhow::bail!("{url}: name the endpoint's host and port (http://HOST:PORT/mcp)");
        }
        let path = match path.trim_end_matches('/') {
            "" => "/mcp".to_owned(),
            "rpc" => anyhow::bail!(
                "{url} is the JSON-RPC path; the MCP listener of `tether serve --mcp-http ADDR` serves /mcp"
            ),
            p => format!("/{p}"),
        };
        Ok(Self {
            authority: authority.to_owned(),
            url: format!("http://{authority}{path}"),
            path,
            token,
        })
    }
}

/// What the bridge keeps of the MCP session it speaks in.
#[derive(Debug, Default)]
struct Session {
    id: Option<String>,
    /// The negotiated protocol version (from the initialize result).
    version: Option<String>,
    /// The client's initialize request, to make a new session with when the
    /// endpoint lost this one.
    init: Option<Value>,
}

struct Bridge {
    target: Target,
    session: Mutex<Session>,
    out: mpsc::Sender<String>,
    places: Arc<Semaphore>,
    /// The task reading the endpoint's own stream of the session (GET).
    listener: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// Runs the bridge until stdin ends.
pub fn run(endpoint: &str, token_env: &str) -> anyhow::Result<ExitCode> {
    let token = std::env::var(token_env).ok().filter(|t| !t.is_empty());
    let target = Target::parse(endpoint, token)?;
    eprintln!(
        "tether: MCP on stdio, bridged to the endpoint {} (every call is decided there{})",
        target.url,
        if target.token.is_some() {
            format!("; the caller's token from {token_env}")
        } else {
            format!("; no token in {token_env}")
        }
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(serve_stdio(target))?;
    Ok(ExitCode::SUCCESS)
}

async fn serve_stdio(target: Target) -> anyhow::Result<()> {
    let (out, mut rx) = mpsc::channel::<String>(OUT_QUEUE);
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(line) = rx.recv().await {
            if stdout.write_all(line.as_bytes()).await.is_err()
                || stdout.write_all(b"\n").await.is_err()
                || stdout.flush().await.is_err()
            {
                break;
            }
        }
    });
    let bridge = Arc::new(Bridge {
        target,
        session: Mutex::new(Session::default()),
        out,
        places: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
        listener: Mutex::new(None),
    });
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let mut line = Vec::new();
        let n = (&mut stdin)
            .take(MAX_LINE as u64)
            .read_until(b'\n', &mut line)
            .await?;
        if n == 0 {
            break;
        }
        if line.last() != Some(&b'\n') && n == MAX_LINE {
            // Cut: skip the rest of the line, forward its start (the
            // endpoint answers it as too large, and stops if it names estop).
            let mut rest = Vec::new();
            while (&mut stdin)
                .take(MAX_LINE as u64)
                .read_until(b'\n', &mut rest)
                .await?
                > 0
            {
                if rest.last() == Some(&b'\n') {
                    break;
                }
                rest.clear();
            }
        }
        let text = String::from_utf8_lossy(&line).trim().to_owned();
        if text.is_empty() {
            continue;
        }
        let bridge = Arc::clone(&bridge);
        // An e-stop is never queued behind other calls.
        let permit = if names_estop(&text) {
            None
        } else {
            Some(Arc::clone(&bridge.places).acquire_owned().await?)
        };
        tasks.spawn(async move {
            bridge.forward(text).await;
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
    }
    let _ = tokio::time::timeout(DRAIN_WAIT, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    // What is still running after the wait is abandoned (the endpoint's
    // kernel finishes it and records its receipt all the same).
    drop(tasks);
    bridge.close_session().await;
    drop(bridge);
    let _ = tokio::time::timeout(CONNECT_TIMEOUT, writer).await;
    Ok(())
}

/// Whether a message (perhaps not even JSON) asks for the e-stop tool.
fn names_estop(text: &str) -> bool {
    text.contains("tools/call") && text.contains("estop")
}

/// One HTTP answer of the endpoint.
struct Answer {
    status: u16,
    session: Option<String>,
    /// Whether it carried a JSON-RPC response (not only notifications).
    answered: bool,
    /// Whether it carried any JSON-RPC message.
    any: bool,
    /// The protocol version an initialize result named.
    version: Option<String>,
    /// Messages not written as they came: those of a 404, which is
    /// answered by a new session when the bridge had one.
    held: Vec<Value>,
    /// The body, when it was not JSON-RPC (for messages).
    raw: String,
}

/// Why a request got no answer.
#[derive(Debug)]
struct Unreachable(String);

impl Bridge {
    /// Posts one message and writes what comes back; a failure is answered
    /// to the client (for a request) or logged (for anything else).
    async fn forward(self: Arc<Self>, text: String) {
        let parsed: Option<Value> = serde_json::from_str(&text).ok();
        let id = parsed
            .as_ref()
            .filter(|v| v.get("method").is_some())
            .and_then(|v| v.get("id"))
            .cloned();
        let method = parsed
            .as_ref()
            .and_then(|v| v.get("method"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        if method.as_deref() == Some("initialize") {
            if let Ok(mut s) = self.session.lock() {
                s.init = parsed.clone();
            }
        }
        let answer = match self.post(&text, parsed.as_ref(), true).await {
            Ok(a) if a.status == 404 && self.has_session() => {
                self.renew_and_retry(&text, parsed.as_ref()).await
            }
            other => other,
        };
        if method.as_deref() == Some("notifications/initialized") {
            self.start_listening();
        }
        match answer {
            Ok(a) => {
                self.deliver(a, id, method.as_deref(), parsed.as_ref())
                    .await
            }
            Err(Unreachable(why)) => match id {
                Some(id) => {
                    self.answer_unreachable(id, method.as_deref(), parsed.as_ref(), &why)
                        .await
                }
                None => eprintln!(
                    "tether: {} cannot be reached ({why}); a message was not delivered",
                    self.target.url
                ),
            },
        }
    }

    fn has_session(&self) -> bool {
        self.session.lock().map(|s| s.id.is_some()).unwrap_or(false)
    }

    /// The endpoint no longer knows the session (it restarted): make a new
    /// one with the client's own initialize request and send the message
    /// once more (a 404 served nothing of it).
    async fn renew_and_retry(
        self: &Arc<Self>,
        text: &str,
        parsed: Option<&Value>,
    ) -> Result<Answer, Unreachable> {
        let init = self.session.lock().ok().and_then(|mut s| {
            s.id = None;
            s.init.clone()
        });
        let Some(init) = init else {
            return Err(Unreachable(
                "the endpoint ended this MCP session; restart the MCP client".into(),
            ));
        };
        eprintln!(
            "tether: the endpoint {} lost this MCP session (a restart?); making a new one",
            self.target.url
        );
        // Neither answer is the client's: it asked for neither.
        let renewed = self.post(&init.to_string(), Some(&init), false).await?;
        if renewed.session.is_none() {
            return Err(Unreachable(format!(
                "the endpoint refused a new MCP session (HTTP {})",
                renewed.status
            )));
        }
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        self.learn_session(&renewed);
        self.post(&initialized.to_string(), Some(&initialized), false)
            .await?;
        self.start_listening();
        self.post(text, parsed, true).await
    }

    /// After the endpoint's messages were written as they came: when an
    /// HTTP error carried no answer to a request, an error naming the status.
    async fn deliver(
        &self,
        a: Answer,
        id: Option<Value>,
        method: Option<&str>,
        parsed: Option<&Value>,
    ) {
        if method == Some("initialize") {
            self.learn_session(&a);
        }
        for m in &a.held {
            let _ = self.out.send(m.to_string()).await;
        }
        if let (Some(id), false) = (id, a.answered) {
            if a.status >= 300 || !a.any {
                let why = format!(
                    "the endpoint answered HTTP {}: {}",
                    a.status,
                    a.raw.chars().take(300).collect::<String>()
                );
                self.answer_unreachable(id, method, parsed, &why).await;
            }
        }
    }

    /// The session id of an initialize's answer, from its headers.
    fn learn_session_header(&self, resp: &hyper::Response<hyper::body::Incoming>) {
        let sid = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok());
        if let (Some(sid), true) = (sid, resp.status().is_success()) {
            if let Ok(mut s) = self.session.lock() {
                s.id = Some(sid.to_owned());
            }
        }
    }

    /// Remembers the session id and the negotiated version of an initialize.
    fn learn_session(&self, a: &Answer) {
        let version = a.version.clone();
        if let Ok(mut s) = self.session.lock() {
            if a.session.is_some() {
                s.id.clone_from(&a.session);
            }
            if version.is_some() {
                s.version = version;
            }
        }
    }

    /// The answer to a request the endpoint did not answer: for a tool call a
    /// tool error the model reads (an e-stop says it was not delivered),
    /// for anything else a JSON-RPC error.
    async fn answer_unreachable(
        &self,
        id: Value,
        method: Option<&str>,
        parsed: Option<&Value>,
        why: &str,
    ) {
        let url = &self.target.url;
        let msg = if method == Some("tools/call") {
            let tool = parsed
                .and_then(|v| v.pointer("/params/name"))
                .and_then(Value::as_str)
                .unwrap_or("?");
            let text = if tool == "estop" {
                format!("E-STOP NOT DELIVERED: the Tether endpoint {url} did not answer ({why}). Tether stopped nothing; use the hardware e-stop, and tell the user at once.")
            } else {
                format!("The Tether endpoint {url} did not answer ({why}); the call `{tool}` may not have run. Nothing is known of its outcome: read the device before trying again.")
            };
            json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": text}], "isError": true}})
        } else {
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": format!("the Tether endpoint {url} did not answer: {why}")}})
        };
        let _ = self.out.send(msg.to_string()).await;
    }

    /// The headers a message needs besides the fixed ones.
    fn headers_for(&self, parsed: Option<&Value>) -> Vec<(&'static str, String)> {
        let mut h = Vec::new();
        let (sid, negotiated) = self
            .session
            .lock()
            .map(|s| (s.id.clone(), s.version.clone()))
            .unwrap_or_default();
        if let Some(sid) = sid {
            h.push(("Mcp-Session-Id", sid));
        }
        let method = parsed.and_then(|v| v.get("method")).and_then(Value::as_str);
        let from_meta = parsed
            .and_then(|v| v.pointer("/params/_meta"))
            .and_then(|m| m.get(META_VERSION_KEY))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let version = if method == Some("initialize") {
            None
        } else {
            from_meta.or(negotiated)
        };
        if let Some(m) = method {
            if version
                .as_deref()
                .is_some_and(|v| v >= STANDARD_HEADERS_VERSION)
            {
                h.push(("Mcp-Method", m.to_owned()));
                if let Some(name) = name_of(m, parsed) {
                    h.push(("Mcp-Name", header_value(&name)));
                }
            }
        }
        if let Some(v) = version {
            h.push(("MCP-Protocol-Version", v));
        }
        h
    }

    /// One POST of `text`; the messages the endpoint sends back are written
    /// to the client as they arrive when `to_client` (progress while a call
    /// runs), else dropped.
    async fn post(
        &self,
        text: &str,
        parsed: Option<&Value>,
        to_client: bool,
    ) -> Result<Answer, Unreachable> {
        let extra = self.headers_for(parsed);
        let mut req = hyper::Request::builder()
            .method("POST")
            .uri(&self.target.path)
            .header("Host", &self.target.authority)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream");
        if let Some(t) = &self.target.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        for (k, v) in extra {
            req = req.header(k, v);
        }
        let req = req
            .body(Full::new(Bytes::from(text.to_owned())))
            .map_err(|e| Unreachable(format!("cannot build the request: {e}")))?;
        let resp = self.send(req).await?;
        if parsed.and_then(|v| v.get("method")).and_then(Value::as_str) == Some("initialize") {
            // Learnt before the answer reaches the client: its next requests
            // (sent as soon as it reads the answer) carry the session id.
            self.learn_session_header(&resp);
        }
        let request = parsed
            .filter(|v| v.get("method").is_some())
            .and_then(|v| v.get("id"))
            .cloned();
        read_answer(resp, to_client.then_some(&self.out), request).await
    }

    async fn send(
        &self,
        req: hyper::Request<Full<Bytes>>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, Unreachable> {
        let stream = match tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio::net::TcpStream::connect(&self.target.authority),
        )
        .await
        {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(Unreachable(format!("cannot connect: {e}"))),
            Err(_) => {
                return Err(Unreachable(format!(
                    "no connection within {CONNECT_TIMEOUT:?}"
                )))
            }
        };
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| Unreachable(format!("HTTP handshake: {e}")))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        match tokio::time::timeout(HEAD_TIMEOUT, sender.send_request(req)).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(Unreachable(format!("the request failed: {e}"))),
            Err(_) => Err(Unreachable(format!("no answer within {HEAD_TIMEOUT:?}"))),
        }
    }

    /// Reads the endpoint's own stream of the session (a GET on the MCP
    /// path): what it sends outside any request's answer, e.g. an
    /// elicitation sent in the background, is written to the client. Made
    /// again a second after it ends, while the session lasts; not at all
    /// when the endpoint offers none (405) or the session has none.
    fn start_listening(self: &Arc<Self>) {
        let sid = self.session.lock().ok().and_then(|s| s.id.clone());
        let Some(sid) = sid else { return };
        let me = Arc::clone(self);
        let task = tokio::spawn(async move {
            loop {
                let still = me.session.lock().ok().and_then(|s| s.id.clone());
                if still.as_deref() != Some(sid.as_str()) {
                    return;
                }
                match me.listen_once(&sid).await {
                    Ok(status) if status >= 400 => return,
                    _ => tokio::time::sleep(Duration::from_secs(1)).await,
                }
            }
        });
        if let Ok(mut slot) = self.listener.lock() {
            if let Some(old) = slot.replace(task) {
                old.abort();
            }
        }
    }

    async fn listen_once(&self, sid: &str) -> Result<u16, Unreachable> {
        let version = self.session.lock().ok().and_then(|s| s.version.clone());
        let mut req = hyper::Request::builder()
            .method("GET")
            .uri(&self.target.path)
            .header("Host", &self.target.authority)
            .header("Accept", "text/event-stream")
            .header("Mcp-Session-Id", sid);
        if let Some(v) = version {
            req = req.header("MCP-Protocol-Version", v);
        }
        if let Some(t) = &self.target.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let req = req
            .body(Full::new(Bytes::new()))
            .map_err(|e| Unreachable(format!("cannot build the request: {e}")))?;
        let resp = self.send(req).await?;
        read_answer(resp, Some(&self.out), None)
            .await
            .map(|a| a.status)
    }

    /// At the end: the MCP session is ended on the endpoint (bounded).
    async fn close_session(&self) {
        if let Some(task) = self.listener.lock().ok().and_then(|mut l| l.take()) {
            task.abort();
        }
        let sid = self.session.lock().ok().and_then(|s| s.id.clone());
        let Some(sid) = sid else { return };
        let mut req = hyper::Request::builder()
            .method("DELETE")
            .uri(&self.target.path)
            .header("Host", &self.target.authority)
            .header("Mcp-Session-Id", sid);
        if let Some(t) = &self.target.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        if let Ok(req) = req.body(Full::new(Bytes::new())) {
            let _ = tokio::time::timeout(CONNECT_TIMEOUT, self.send(req)).await;
        }
    }
}

/// The `Mcp-Name` of a request: the tool or prompt name, or the resource URI.
fn name_of(method: &str, parsed: Option<&Value>) -> Option<String> {
    let key = match method {
        "tools/call" | "prompts/get" => "name",
        "resources/read" | "resources/subscribe" | "resources/unsubscribe" => "uri",
        "tasks/get" | "tasks/update" | "tasks/cancel" => "taskId",
        _ => return None,
    };
    parsed?
        .pointer(&format!("/params/{key}"))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// A header value as MCP's header rules spell it: as is when it is plain
/// printable ASCII, else wrapped as `=?base64?…?=`.
fn header_value(v: &str) -> String {
    let padded = v.starts_with([' ', '\t']) || v.ends_with([' ', '\t']);
    let printable = v.chars().all(|c| (' '..='~').contains(&c));
    let looks_wrapped = v.starts_with("=?base64?") && v.ends_with("?=");
    let plain = !padded && printable && !looks_wrapped;
    if plain {
        return v.to_owned();
    }
    format!("=?base64?{}?=", base64(v.as_bytes()))
}

fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ABC[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Reads a response: a JSON body, or an SSE stream whose events are
/// JSON-RPC messages, each written to `sink` as soon as it is whole; every
/// read bounded in size and time.
async fn read_answer(
    resp: hyper::Response<hyper::body::Incoming>,
    sink: Option<&mpsc::Sender<String>>,
    request: Option<Value>,
) -> Result<Answer, Unreachable> {
    let status = resp.status().as_u16();
    let session = resp
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let sse = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/event-stream"));
    // A 404 may be a lost session the caller answers with a new one: its
    // messages wait for that decision.
    let sink = if status == 404 { None } else { sink };
    let mut body = resp.into_body();
    let mut buf: Vec<u8> = Vec::new();
    let mut messages = Vec::new();
    let mut seen = Seen {
        request,
        ..Seen::default()
    };
    loop {
        let frame = match tokio::time::timeout(IDLE_TIMEOUT, body.frame()).await {
            Ok(Some(Ok(f))) => f,
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(Unreachable(format!("the answer broke off: {e}"))),
            Err(_) => {
                return Err(Unreachable(format!(
                    "the answer went silent for {IDLE_TIMEOUT:?}"
                )))
            }
        };
        if let Some(data) = frame.data_ref() {
            buf.extend_from_slice(data);
        }
        if sse {
            take_events(&mut buf, &mut messages);
            seen.pass(&mut messages, sink).await;
        }
        if buf.len() > MAX_ANSWER {
            return Err(Unreachable(format!("an answer over {MAX_ANSWER} bytes")));
        }
    }
    let raw = String::from_utf8_lossy(&buf).into_owned();
    if !sse {
        if let Ok(v) = serde_json::from_str::<Value>(&raw) {
            match v {
                Value::Array(items) => messages.extend(items),
                v if v.get("jsonrpc").is_some() => messages.push(v),
                _ => {}
            }
        }
        seen.pass(&mut messages, sink).await;
    }
    Ok(Answer {
        status,
        session,
        answered: seen.answered,
        any: seen.any,
        version: seen.version,
        held: seen.held,
        raw,
    })
}

/// What the messages of an answer showed, as they were passed on.
#[derive(Default)]
struct Seen {
    /// The id of the request this answers, if it was one.
    request: Option<Value>,
    answered: bool,
    any: bool,
    version: Option<String>,
    held: Vec<Value>,
}

impl Seen {
    async fn pass(&mut self, messages: &mut Vec<Value>, sink: Option<&mpsc::Sender<String>>) {
        for mut m in messages.drain(..) {
            self.any = true;
            let response = m.get("method").is_none()
                && (m.get("result").is_some() || m.get("error").is_some());
            if let (true, Some(id)) = (response, &self.request) {
                // A refusal made before the body was read (401, 413, ...)
                // cannot name the request; it is this request's answer, and
                // a client waits for an answer under its own id.
                if m.get("id").is_none_or(Value::is_null) {
                    m["id"] = id.clone();
                }
                if m.get("id") == Some(id) {
                    self.answered = true;
                }
            }
            if let Some(v) = m.pointer("/result/protocolVersion").and_then(Value::as_str) {
                self.version = Some(v.to_owned());
            }
            match sink {
                Some(out) => {
                    let _ = out.send(m.to_string()).await;
                }
                None => self.held.push(m),
            }
        }
    }
}

/// Takes the complete SSE events off the front of `buf` (an event ends at a
/// blank line); each event's `data:` lines, joined, is one JSON-RPC message.
/// Events with no data (the endpoint's priming events) are skipped.
fn take_events(buf: &mut Vec<u8>, messages: &mut Vec<Value>) {
    // Split on bytes: a frame may end inside a multi-byte character, which
    // is whole again once the next frame is appended.
    let find = |buf: &[u8], pat: &[u8]| buf.windows(pat.len()).position(|w| w == pat);
    loop {
        let ends = [(find(buf, b"\n\n"), 2), (find(buf, b"\r\n\r\n"), 4)];
        let Some((end, sep)) = ends
            .iter()
            .filter_map(|(at, sep)| at.map(|a| (a, *sep)))
            .min_by_key(|(at, _)| *at)
        else {
            return;
        };
        let event = String::from_utf8_lossy(&buf[..end]).into_owned();
        let data: Vec<&str> = event
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if !data.is_empty() {
            if let Ok(v) = serde_json::from_str::<Value>(&data.join("\n")) {
                messages.push(v);
            }
        }
        buf.drain(..end + sep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_are_split_at_blank_lines_and_priming_events_skipped() {
        let mut buf = b"id: 0\nretry: 3000\ndata:\n\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\r\n\r\ndata: {\"partial".to_vec();
        let mut out = Vec::new();
        take_events(&mut buf, &mut out);
        assert_eq!(out, vec![json!({"jsonrpc": "2.0", "id": 1, "result": {}})]);
        assert_eq!(buf, b"data: {\"partial");
    }

    #[test]
    fn an_event_cut_inside_a_character_is_whole_once_the_rest_arrives() {
        let whole = "data: {\"text\":\"é\"}\n\n".as_bytes().to_vec();
        let cut = whole.iter().position(|b| *b == 0xc3).unwrap() + 1;
        let mut buf = whole[..cut].to_vec();
        let mut out = Vec::new();
        take_events(&mut buf, &mut out);
        assert!(out.is_empty());
        buf.extend_from_slice(&whole[cut..]);
        take_events(&mut buf, &mut out);
        assert_eq!(out, vec![json!({"text": "é"})]);
        assert!(buf.is_empty());
    }

    #[test]
    fn urls_name_the_mcp_path_and_header_values_are_wrapped_when_not_plain() {
        let t = Target::parse("http://127.0.0.1:7880", None).unwrap();
        assert_eq!(
            (t.authority.as_str(), t.path.as_str()),
            ("127.0.0.1:7880", "/mcp")
        );
        assert!(Target::parse("http://127.0.0.1:7878/rpc", None).is_err());
        assert!(Target::parse("https://db:1/mcp", None).is_err());
        assert_eq!(
            header_value("thermostat-1__setpoint"),
            "thermostat-1__setpoint"
        );
        assert_eq!(header_value("é"), "=?base64?w6k=?=");
        assert_eq!(base64(b"abcd"), "YWJjZA==");
    }
}
