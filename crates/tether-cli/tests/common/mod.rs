//! Shared helpers of the end-to-end tests: spawn the real `tether` binary
//! with a fresh state directory, and speak JSON-RPC to it over HTTP (a tiny
//! HTTP/1.1 client on `std::net::TcpStream`) or over stdio (one JSON value
//! per line). Every wait is bounded; a server is killed when dropped.

#![allow(dead_code)]

pub mod mcp_http;

use serde_json::{json, Value};
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_tether");

/// Default bound on any single wait (an answer, a start-up, a CLI run).
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// Which surface a server speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Http,
    Stdio,
}

/// A running `tether serve` process with its own state directory.
pub struct Server {
    child: Child,
    state_dir: PathBuf,
    transport: Transport,
    addr: Option<SocketAddr>,
    stdio: Option<StdioClient>,
    stderr: Arc<Mutex<String>>,
    next_id: AtomicU64,
    // Dropped after `Drop::drop` has killed the process.
    _tmp: Option<tempfile::TempDir>,
}

impl Server {
    /// HTTP server on a fresh state directory.
    pub fn http() -> Server {
        Server::start(Transport::Http, None)
    }

    /// Stdio server on a fresh state directory.
    pub fn stdio() -> Server {
        Server::start(Transport::Stdio, None)
    }

    /// A server of `transport` on `dir` (a fresh tempdir when `None`).
    pub fn start(transport: Transport, dir: Option<&Path>) -> Server {
        Self::start_with(transport, dir, &[])
    }

    /// Starts the binary with extra `serve` arguments (e.g. `--config FILE`).
    pub fn start_with(transport: Transport, dir: Option<&Path>, extra: &[&OsStr]) -> Server {
        Self::start_with_env(transport, dir, extra, &[])
    }

    /// `start_with`, with extra environment variables (e.g. token variables
    /// a config names).
    pub fn start_with_env(
        transport: Transport,
        dir: Option<&Path>,
        extra: &[&OsStr],
        env: &[(&str, &str)],
    ) -> Server {
        Self::start_wrapped(&[], transport, dir, extra, env)
    }

    /// `start_with_env`, the binary started through `wrapper` (a program
    /// and its arguments that exec the binary, e.g. `nsenter` into a mount
    /// namespace; empty: the binary itself).
    pub fn start_wrapped(
        wrapper: &[&OsStr],
        transport: Transport,
        dir: Option<&Path>,
        extra: &[&OsStr],
        env: &[(&str, &str)],
    ) -> Server {
        let (tmp, state_dir) = match dir {
            Some(d) => (None, d.to_path_buf()),
            None => {
                let t = tempfile::tempdir().expect("tempdir");
                let p = t.path().to_path_buf();
                (Some(t), p)
            }
        };
        let mut cmd = serve_command(wrapper, &state_dir, transport, extra, env);
        let mut child = cmd.spawn().expect("spawn tether serve");

        // Drain stderr forever (so the pipe never fills), reporting the
        // listening address when it appears.
        let stderr = Arc::new(Mutex::new(String::new()));
        let (addr_tx, addr_rx) = mpsc::channel::<SocketAddr>();
        {
            let pipe = child.stderr.take().expect("stderr");
            let sink = Arc::clone(&stderr);
            std::thread::spawn(move || {
                let mut r = BufReader::new(pipe);
                let mut line = String::new();
                loop {
                    line.clear();
                    match r.read_line(&mut line) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                    if let Some(addr) = parse_listening(&line) {
                        let _ = addr_tx.send(addr);
                    }
                    if let Ok(mut s) = sink.lock() {
                        s.push_str(&line);
                    }
                }
            });
        }

        let mut server = Server {
            child,
            state_dir,
            transport,
            addr: None,
            stdio: None,
            stderr,
            next_id: AtomicU64::new(1),
            _tmp: tmp,
        };
        match transport {
            Transport::Http => {
                let deadline = Instant::now() + TIMEOUT;
                loop {
                    match addr_rx.recv_timeout(Duration::from_millis(50)) {
                        Ok(a) => {
                            server.addr = Some(a);
                            break;
                        }
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => {
                            panic!(
                                "tether exited before listening; stderr:\n{}",
                                server.stderr_text()
                            )
                        }
                    }
                    if let Ok(Some(status)) = server.child.try_wait() {
                        panic!(
                            "tether exited before listening ({status}); stderr:\n{}",
                            server.stderr_text()
                        );
                    }
                    assert!(Instant::now() < deadline, "tether did not print its listening address within {TIMEOUT:?}; stderr:\n{}", server.stderr_text());
                }
            }
            Transport::Stdio => {
                let stdin = server.child.stdin.take().expect("stdin");
                let stdout = server.child.stdout.take().expect("stdout");
                server.stdio = Some(StdioClient::new(stdin, stdout));
            }
        }
        server
    }

    pub fn transport(&self) -> Transport {
        self.transport
    }

    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// The HTTP address (HTTP servers only).
    pub fn addr(&self) -> SocketAddr {
        self.addr.expect("not an HTTP server")
    }

    /// The stdio client (stdio servers only).
    pub fn stdio_client(&self) -> &StdioClient {
        self.stdio.as_ref().expect("not a stdio server")
    }

    /// Everything the server wrote on stderr so far.
    pub fn stderr_text(&self) -> String {
        self.stderr.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The endpoint's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running.
    pub fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// A fresh request id.
    pub fn fresh_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::SeqCst)
    }

    /// One JSON-RPC call; answers the whole response object. Over HTTP the
    /// status must be 200 and the answer's id must be the request's.
    pub fn call(&self, method: &str, params: Value) -> Value {
        let id = self.fresh_id();
        let req = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let answer = match self.transport {
            Transport::Http => {
                let resp = http_post(self.addr(), req.to_string().as_bytes(), TIMEOUT);
                assert_eq!(resp.status, 200, "HTTP status of {method}: {}", resp.text());
                resp.json()
            }
            Transport::Stdio => {
                let c = self.stdio_client();
                c.send_json(&req);
                c.wait_id(&json!(id), TIMEOUT).value
            }
        };
        assert_eq!(answer["jsonrpc"], "2.0", "answer: {answer}");
        assert_eq!(answer["id"], json!(id), "answer: {answer}");
        answer
    }

    /// A call that must succeed; answers `result`.
    pub fn ok(&self, method: &str, params: Value) -> Value {
        let a = self.call(method, params.clone());
        assert!(a.get("error").is_none(), "{method} {params} failed: {a}");
        a["result"].clone()
    }

    /// A call that must fail with a JSON-RPC error; answers `error`.
    pub fn err(&self, method: &str, params: Value) -> Value {
        let a = self.call(method, params.clone());
        assert!(
            a.get("result").is_none(),
            "{method} {params} unexpectedly succeeded: {a}"
        );
        let e = a["error"].clone();
        assert!(e["code"].is_i64(), "error without an integer code: {a}");
        e
    }

    /// Sends one raw request (a stdio line, or an HTTP body) and answers the
    /// HTTP status (200 for stdio) and the parsed answer. Over stdio the
    /// answer is the next one whose id equals `expect_id`.
    pub fn raw(&self, bytes: &[u8], expect_id: &Value) -> (u16, Value) {
        match self.transport {
            Transport::Http => {
                let resp = http_post(self.addr(), bytes, TIMEOUT);
                (resp.status, resp.json())
            }
            Transport::Stdio => {
                let c = self.stdio_client();
                c.send_line(bytes);
                (200, c.wait_id(expect_id, TIMEOUT).value)
            }
        }
    }

    /// Opens a session granting everything; answers its id.
    pub fn session(&self) -> String {
        let r = self.ok("mhs.session.open", json!({}));
        r["session_id"].as_str().expect("session_id").to_owned()
    }

    /// `mhs.resource.read`; answers the result.
    pub fn read(&self, sid: &str, device: &str, resource: &str) -> Value {
        self.ok(
            "mhs.resource.read",
            json!({"session_id": sid, "device_id": device, "resource": resource}),
        )
    }

    /// The revision `mhs.resource.read` reports.
    pub fn revision(&self, sid: &str, device: &str, resource: &str) -> u64 {
        self.read(sid, device, resource)["revision"]
            .as_u64()
            .expect("revision")
    }

    /// `mhs.command`; answers the receipt.
    pub fn command(&self, params: Value) -> Value {
        self.ok("mhs.command", params)
    }

    /// `mhs.safety.status` of one device.
    pub fn status_of(&self, device: &str) -> Value {
        let r = self.ok("mhs.safety.status", json!({"device_id": device}));
        let list = r["devices"].as_array().expect("devices");
        list.iter()
            .find(|d| d["device_id"] == device)
            .cloned()
            .unwrap_or_else(|| panic!("no {device} in status {r}"))
    }

    /// Sends SIGTERM (what a service manager sends) and waits, bounded, for
    /// the process to exit; answers its exit status.
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status();
        assert!(sent.is_ok_and(|s| s.success()), "kill -TERM {pid}");
        let deadline = Instant::now() + TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Kills the process and waits for it (idempotent).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The `tether serve` command line of a test server (through `wrapper`
/// when it names a program).
fn serve_command(
    wrapper: &[&OsStr],
    state_dir: &Path,
    transport: Transport,
    extra: &[&OsStr],
    env: &[(&str, &str)],
) -> Command {
    let mut cmd = match wrapper.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(BIN);
            c
        }
        None => Command::new(BIN),
    };
    cmd.arg("serve")
        .arg("--state-dir")
        .arg(state_dir)
        .args(extra)
        .envs(env.iter().copied());
    match transport {
        Transport::Http => {
            // A test may name its own listen address (another namespace's).
            if !extra.iter().any(|a| *a == OsStr::new("--http")) {
                cmd.args(["--http", "127.0.0.1:0"]);
            }
            cmd.stdin(Stdio::null()).stdout(Stdio::null());
        }
        Transport::Stdio => {
            cmd.arg("--stdio")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped());
        }
    }
    cmd.stderr(Stdio::piped());
    cmd
}

fn parse_listening(line: &str) -> Option<SocketAddr> {
    let rest = line.split("listening on http://").nth(1)?;
    let host = rest.split('/').next()?;
    host.to_socket_addrs().ok()?.next()
}

// ----- HTTP -------------------------------------------------------------

/// An HTTP answer.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON (panics with the body when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "HTTP {} body is not JSON ({e}): {:?}\nhead: {}",
                self.status,
                self.text(),
                self.head
            )
        })
    }
}

/// `POST /rpc` with `body`, `Connection: close`; reads to the end. The body
/// is written on its own thread while the answer is read, so a server that
/// answers early (413) and closes is still heard.
pub fn http_post(addr: SocketAddr, body: &[u8], timeout: Duration) -> HttpResponse {
    http_post_with(addr, body, timeout, "")
}

/// A simulated device's TOML manifest served as a `hardware` device: the
/// mode changed and its `[fidelity]` table (header and lines up to the
/// next blank one) dropped, since only a simulated device declares one.
pub fn as_hardware(manifest: &str) -> String {
    let mut in_fidelity = false;
    let text: String = manifest
        .replace("mode = \"simulated\"", "mode = \"hardware\"")
        .lines()
        .filter(|l| {
            if l.trim() == "[fidelity]" {
                in_fidelity = true;
            } else if l.trim().is_empty() {
                in_fidelity = false;
            }
            !in_fidelity
        })
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(text.contains("mode = \"hardware\""), "{text}");
    text
}

/// `tether serve --config CFG --http` on the state directory `DIR/state`.
pub fn start_with_config(dir: &Path, cfg: &Path) -> Server {
    Server::start_with(
        Transport::Http,
        Some(&dir.join("state")),
        &[OsStr::new("--config"), cfg.as_os_str()],
    )
}

/// One JSON-RPC call on `/rpc` with a bearer token; the whole answer (the
/// HTTP status must be 200).
pub fn call_with_token(s: &Server, token: &str, method: &str, params: Value) -> Value {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        .to_string();
    let headers = format!("Authorization: Bearer {token}\r\n");
    let r = http_post_with(s.addr(), body.as_bytes(), TIMEOUT, &headers);
    assert_eq!(r.status, 200, "{method}: {}", r.text());
    r.json()
}

/// `http_post` with extra header lines (each ending in `\r\n`).
pub fn http_post_with(
    addr: SocketAddr,
    body: &[u8],
    timeout: Duration,
    headers: &str,
) -> HttpResponse {
    http_request(addr, "POST", "/rpc", body, timeout, headers)
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`); a body
/// is sent with its length whatever the method.
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
    timeout: Duration,
    headers: &str,
) -> HttpResponse {
    let deadline = Instant::now() + timeout;
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("read timeout");
    stream
        .set_write_timeout(Some(timeout))
        .expect("write timeout");
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len()).into_bytes();
    request.extend_from_slice(body);
    let mut w = stream.try_clone().expect("clone stream");
    let writer = std::thread::spawn(move || {
        // An early answer may close the connection mid-body: not an error here.
        let _ = w.write_all(&request);
        let _ = w.flush();
    });
    let mut r = stream;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        match r.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                assert!(
                    Instant::now() < deadline,
                    "no complete HTTP answer within {timeout:?} (got {} bytes)",
                    buf.len()
                );
            }
            // A reset after the answer arrived still leaves the answer.
            Err(e) if !buf.is_empty() => {
                let _ = e;
                break;
            }
            Err(e) => panic!("reading the HTTP answer: {e}"),
        }
    }
    let _ = writer.join();
    parse_http(&buf)
}

fn parse_http(raw: &[u8]) -> HttpResponse {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut body = raw[split + 4..].to_vec();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line: {head}"));
    let length = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse::<usize>().ok())
            .flatten()
    });
    if let Some(n) = length {
        assert!(
            body.len() >= n,
            "HTTP body shorter ({}) than Content-Length {n}",
            body.len()
        );
        body.truncate(n);
    }
    HttpResponse { status, head, body }
}

// ----- stdio ------------------------------------------------------------

/// One answer read from the server's stdout, with its arrival order.
#[derive(Clone, Debug)]
pub struct Received {
    pub seq: u64,
    pub value: Value,
}

struct Inbox {
    rx: Receiver<Value>,
    pending: Vec<Received>,
    seq: u64,
}

/// Writes lines to the server's stdin; a background thread reads its stdout
/// lines into a channel; answers are matched by id.
pub struct StdioClient {
    stdin: Mutex<ChildStdin>,
    inbox: Mutex<Inbox>,
}

impl StdioClient {
    fn new(stdin: ChildStdin, stdout: std::process::ChildStdout) -> StdioClient {
        let (tx, rx) = mpsc::channel::<Value>();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut line = Vec::new();
            loop {
                line.clear();
                match r.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                let v = serde_json::from_slice::<Value>(&line).unwrap_or_else(|e| json!({"__unparseable": String::from_utf8_lossy(&line), "__error": e.to_string()}));
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        StdioClient {
            stdin: Mutex::new(stdin),
            inbox: Mutex::new(Inbox {
                rx,
                pending: Vec::new(),
                seq: 0,
            }),
        }
    }

    /// Writes `bytes` and a newline.
    pub fn send_line(&self, bytes: &[u8]) {
        let mut w = self.stdin.lock().expect("stdin lock");
        w.write_all(bytes).expect("write to tether stdin");
        w.write_all(b"\n").expect("write to tether stdin");
        w.flush().expect("flush tether stdin");
    }

    pub fn send_json(&self, v: &Value) {
        self.send_line(v.to_string().as_bytes());
    }

    /// Sends a request with `id` without waiting.
    pub fn send(&self, id: &Value, method: &str, params: Value) {
        self.send_json(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
    }

    /// The first answer (in arrival order) for which `pred` holds.
    pub fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Received {
        let deadline = Instant::now() + timeout;
        let mut inbox = self.inbox.lock().expect("inbox lock");
        if let Some(i) = inbox.pending.iter().position(|r| pred(&r.value)) {
            return inbox.pending.remove(i);
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match inbox.rx.recv_timeout(left) {
                Ok(v) => {
                    assert!(
                        v.get("__unparseable").is_none(),
                        "tether wrote a line that is not JSON: {v}"
                    );
                    inbox.seq += 1;
                    let got = Received {
                        seq: inbox.seq,
                        value: v,
                    };
                    if pred(&got.value) {
                        return got;
                    }
                    inbox.pending.push(got);
                }
                Err(RecvTimeoutError::Timeout) => panic!(
                    "no answer {what} within {timeout:?}; unclaimed: {:?}",
                    inbox.pending
                ),
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "tether closed stdout while waiting for {what}; unclaimed: {:?}",
                    inbox.pending
                ),
            }
        }
    }

    /// The answer whose id equals `id`.
    pub fn wait_id(&self, id: &Value, timeout: Duration) -> Received {
        self.wait_for(&format!("with id {id}"), timeout, |v| {
            v.get("id") == Some(id)
        })
    }
}

// ----- the CLI ----------------------------------------------------------

/// Result of one CLI run.
#[derive(Debug)]
pub struct Run {
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

impl Run {
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

/// Runs `tether ARGS` to completion (bounded), capturing both outputs.
pub fn tether<S: AsRef<OsStr>>(args: &[S]) -> Run {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tether");
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "tether {:?} did not finish within {TIMEOUT:?}",
                args.iter()
                    .map(|a| a.as_ref().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let stdout = t_out.join().unwrap_or_default();
    let stderr = String::from_utf8_lossy(&t_err.join().unwrap_or_default()).into_owned();
    Run {
        code: status.code(),
        stdout,
        stderr,
    }
}

// ----- small assertions ---------------------------------------------------

/// The `mhs_code` of a receipt's error.
pub fn receipt_code(receipt: &Value) -> &str {
    receipt["error"]["mhs_code"]
        .as_str()
        .unwrap_or_else(|| panic!("receipt without error code: {receipt}"))
}

/// Asserts a receipt is `rejected` with `code`; answers `error.details`.
pub fn assert_rejected(receipt: &Value, code: &str) -> Value {
    assert_eq!(receipt["status"], "rejected", "receipt: {receipt}");
    assert_eq!(receipt_code(receipt), code, "receipt: {receipt}");
    assert!(
        receipt["receipt_id"]
            .as_str()
            .is_some_and(|s| !s.is_empty()),
        "receipt without id: {receipt}"
    );
    receipt["error"]["details"].clone()
}

/// Asserts a JSON-RPC error object carries `mhs_code`; answers `data.details`.
pub fn assert_rpc_error(error: &Value, mhs_code: &str) -> Value {
    assert_eq!(error["data"]["mhs_code"], mhs_code, "error: {error}");
    error["data"]["details"].clone()
}

/// Polls `cond` every 10 ms until it holds or `timeout` passes.
pub fn poll_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `tether check CONFIG` and asserts it fails naming, for each
/// `(field, what)`, a line with the manifest's file, the device and `what`.
pub fn check_names_defects(
    config: &Path,
    manifest: &Path,
    device: &str,
    expected: &[(&str, &str)],
) {
    let run = tether(&[OsStr::new("check"), config.as_os_str()]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    let file = manifest.display().to_string();
    for (field, what) in expected {
        let line = run
            .stderr
            .lines()
            .find(|l| l.contains(field))
            .unwrap_or_else(|| panic!("no defect at {field}:\n{}", run.stderr));
        assert!(
            line.contains(&file) && line.contains(device) && line.contains(what),
            "{line}"
        );
    }
}
