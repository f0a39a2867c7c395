//! Store faults against the real binary (issue 21 §3, docs/RELIABILITY.md
//! "Store faults"): the state directory on a small `tmpfs` that is filled
//! up, remounted read-only, or whose database another process holds
//! locked (`BEGIN EXCLUSIVE`), each at start-up and mid-load, with
//! JSON-RPC commands to every built-in device, REST gateway invocations,
//! e-stops, reads and resets. The far side is checked once the fault
//! clears: the receipts the store holds by `command_id`, the latches,
//! `tether audit verify`, and a resent `command_id` answered `unknown`
//! never running again (live, and after a restart).
//!
//! Mounting needs privileges. Every test runs its endpoint inside a user
//! and mount namespace of its own (`unshare --user --map-root-user
//! --mount`), which works as root (CI) and for an ordinary user where the
//! kernel allows unprivileged user namespaces; the tmpfs exists only in
//! that namespace and vanishes with it. Where neither works the tests fail
//! saying so: they never pass without having run.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used)]

mod common;

use common::{http_post, http_request, Server, Transport, BIN, TIMEOUT};
use serde_json::{json, Value};
use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};
use tether_store::Store;

/// Size of each test's tmpfs: room for the store of a short run, small
/// enough to fill at once.
const TMPFS_SIZE: &str = "16m";
/// Longest wait for a store fault to clear in the endpoint's eyes (the
/// opener's and the latch retries' delays reach 5 s; a locked batch waits
/// out a 5 s busy timeout).
const RECOVER: Duration = Duration::from_secs(45);

const THERMOSTAT: &str = "thermostat-1";
const RELAY: &str = "relay-1";
const ARM: &str = "arm-1";
const DEVICES: [&str; 3] = [THERMOSTAT, RELAY, ARM];

// ----- the namespace ------------------------------------------------------

/// A user and mount namespace holding a tmpfs on `state`; the holder
/// process keeps it alive until dropped.
struct Sandbox {
    holder: Child,
    _holder_stdin: ChildStdin,
    pid: String,
    root: tempfile::TempDir,
    state: PathBuf,
}

const NO_NAMESPACE: &str = "store_faults needs a mount namespace to put the state directory on a tmpfs it can fill and remount: run the tests as root (CI does), or as a user where `unshare --user --map-root-user --mount` works (kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0, and no AppArmor restriction on unprivileged user namespaces). It could not be created here";

impl Sandbox {
    fn new() -> Sandbox {
        let root = tempfile::tempdir().expect("tempdir");
        let state = root.path().join("state");
        std::fs::create_dir(&state).expect("state dir");
        let script = format!(
            "mount -t tmpfs -o size={TMPFS_SIZE},mode=0700 tmpfs \"$1\" && echo mounted && exec cat >/dev/null"
        );
        let spawned = Command::new("unshare")
            .args([
                "--user",
                "--map-root-user",
                "--mount",
                "sh",
                "-c",
                &script,
                "sh",
            ])
            .arg(&state)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut holder = spawned.unwrap_or_else(|e| panic!("{NO_NAMESPACE}: {e}"));
        let mut line = String::new();
        let out = holder.stdout.take().expect("holder stdout");
        let _ = BufReader::new(out).read_line(&mut line);
        if line.trim() != "mounted" {
            let _ = holder.kill();
            let output = holder.wait_with_output().expect("holder output");
            panic!(
                "{NO_NAMESPACE}: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        let stdin = holder.stdin.take().expect("holder stdin");
        let pid = holder.id().to_string();
        Sandbox {
            holder,
            _holder_stdin: stdin,
            pid,
            root,
            state,
        }
    }

    /// `nsenter` into the namespace, then the program that follows.
    fn enter(&self) -> Vec<OsString> {
        ["nsenter", "-t", &self.pid, "-U", "-m"]
            .iter()
            .map(OsString::from)
            .collect()
    }

    /// Runs a shell script in the namespace (`$1` is the state directory);
    /// answers its stdout, asserting it succeeded.
    fn sh(&self, script: &str) -> String {
        let out = Command::new("nsenter")
            .args(["-t", &self.pid, "-U", "-m", "sh", "-c", script, "sh"])
            .arg(&self.state)
            .output()
            .expect("nsenter");
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Fills the tmpfs: the last write fails with no space left.
    fn fill(&self) {
        self.sh("dd if=/dev/zero of=\"$1/filler\" bs=64k 2>/dev/null; sync; test \"$(df -k \"$1\" | awk 'NR==2 {print $4}')\" -eq 0");
    }

    fn free(&self) {
        self.sh("rm -f \"$1/filler\"");
    }

    fn read_only(&self) {
        self.sh("mount -o remount,ro \"$1\"");
    }

    fn read_write(&self) {
        self.sh("mount -o remount,rw \"$1\"");
    }

    /// `tether serve --http` on the tmpfs, in the namespace.
    fn serve(&self) -> Server {
        let enter = self.enter();
        let wrapper: Vec<&OsStr> = enter.iter().map(OsString::as_os_str).collect();
        Server::start_wrapped(&wrapper, Transport::Http, Some(&self.state), &[], &[])
    }

    /// `tether ARGS` in the namespace; answers its exit code and output.
    fn tether(&self, args: &[&str]) -> (Option<i32>, String) {
        let out = Command::new("nsenter")
            .args(["-t", &self.pid, "-U", "-m"])
            .arg(BIN)
            .args(args)
            .output()
            .expect("nsenter tether");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    }

    /// A copy of the state directory outside the namespace (the endpoint
    /// stopped), opened as a store.
    fn snapshot(&self, name: &str) -> tether_store::SqliteStore {
        let dir = self.root.path().join(name);
        std::fs::create_dir(&dir).expect("snapshot dir");
        self.sh(&format!("cp -a \"$1\"/tether.db* {}/", dir.display()));
        tether_store::SqliteStore::open(&dir).expect("open the snapshot")
    }

    fn state_str(&self) -> String {
        self.state.display().to_string()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// Another process holding `tether.db` locked (`BEGIN EXCLUSIVE`, Python's
/// `sqlite3`) until dropped.
struct Locker {
    child: Child,
}

impl Locker {
    fn hold(sandbox: &Sandbox) -> Locker {
        let script = "import sqlite3, sys\nc = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)\nc.execute('BEGIN EXCLUSIVE')\nprint('locked', flush=True)\nsys.stdin.read()\nc.execute('ROLLBACK')\n";
        let db = sandbox.state.join("tether.db");
        let mut child = Command::new("nsenter")
            .args(["-t", &sandbox.pid, "-U", "-m", "python3", "-c", script])
            .arg(&db)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 holding the lock");
        let mut line = String::new();
        let out = child.stdout.take().expect("locker stdout");
        let _ = BufReader::new(out).read_line(&mut line);
        assert_eq!(
            line.trim(),
            "locked",
            "python3 could not lock {}",
            db.display()
        );
        Locker { child }
    }
}

impl Drop for Locker {
    fn drop(&mut self) {
        // Its end releases the lock (the process's locks go with it).
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ----- the load -------------------------------------------------------------

/// One command sent and what it was answered.
#[derive(Debug, Clone)]
struct Sent {
    command_id: String,
    /// The whole request, to send again.
    method: &'static str,
    params: Value,
    /// Over REST (`/tools/...:invoke`), not JSON-RPC.
    rest: Option<(String, Value)>,
    receipt: Value,
}

/// A command's answer waits at most this long: on a locked database each
/// batch waits out SQLite's busy timeout (5 s), and on a loaded 2-core
/// machine a command queued behind several such batches took over 20 s.
const COMMAND_WAIT: std::time::Duration = std::time::Duration::from_secs(90);

fn rpc(addr: SocketAddr, method: &str, params: &Value) -> Value {
    let req = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let resp = http_post(addr, req.to_string().as_bytes(), COMMAND_WAIT);
    assert_eq!(resp.status, 200, "{method}: {}", resp.text());
    let v = resp.json();
    assert!(v.get("error").is_none(), "{method} {params}: {v}");
    v["result"].clone()
}

fn healthz(addr: SocketAddr) -> (u16, Value) {
    let r = http_request(addr, "GET", "/healthz", b"", TIMEOUT, "");
    (r.status, r.json())
}

/// A command to send: its id, method, params, and a REST tool and body
/// (sent to the gateway instead of JSON-RPC).
type Planned = (String, &'static str, Value, Option<(String, Value)>);

/// The commands of one round: one to each built-in device over JSON-RPC
/// and a thermostat setpoint through the REST gateway.
fn round(sid: &str, tag: &str, i: usize) -> Vec<Planned> {
    let id = |d: &str| format!("{tag}-{d}-{i}");
    let t = 20 + (i % 40);
    let arm_joint = 0.01 * ((i % 7) as f64 + 1.0);
    vec![
        (
            id("t"),
            "mhs.command",
            json!({"session_id": sid, "device_id": THERMOSTAT, "capability_id": "cap.thermal.setpoint.v1", "input": {"target_temperature": t}, "command_id": id("t")}),
            None,
        ),
        (
            id("r"),
            "mhs.command",
            json!({"session_id": sid, "device_id": RELAY, "capability_id": "cap.io.relay.v1", "input": {"channel": i % 4, "on": i.is_multiple_of(2)}, "command_id": id("r")}),
            None,
        ),
        (
            id("a"),
            "mhs.command",
            json!({"session_id": sid, "device_id": ARM, "capability_id": "cap.motion.move_to.v1", "input": {"joints": [arm_joint, 0, 0, 0, 0, 0], "speed": 1.5}, "command_id": id("a")}),
            None,
        ),
        (
            id("g"),
            "rest",
            Value::Null,
            Some((
                "thermostat-1__setpoint".to_owned(),
                json!({"input": {"target_temperature": t}, "command_id": id("g")}),
            )),
        ),
    ]
}

/// A REST invocation to its end: the receipt of its terminal result.
fn invoke(addr: SocketAddr, tool: &str, body: &Value) -> Value {
    let path = format!("/tools/{tool}:invoke");
    let r = http_request(
        addr,
        "POST",
        &path,
        body.to_string().as_bytes(),
        COMMAND_WAIT,
        "",
    );
    let v = r.json();
    if r.status != 202 {
        // Refused before it was accepted: the refusal is the answer.
        return json!({"status": "rejected", "rest": v, "http_status": r.status});
    }
    let inv = v["data"]["invocation_id"]
        .as_str()
        .expect("invocation_id")
        .to_owned();
    let deadline = Instant::now() + COMMAND_WAIT;
    loop {
        let r = http_request(
            addr,
            "GET",
            &format!("/invocations/{inv}/result"),
            b"",
            COMMAND_WAIT,
            "",
        );
        let v = r.json();
        if r.status == 200 {
            let mut receipt = v["data"]["receipt"].clone();
            if receipt.is_null() {
                receipt = json!({"status": v["data"]["status"], "rest": v});
            }
            return receipt;
        }
        assert!(Instant::now() < deadline, "{inv} never finished: {v}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends one round, its commands concurrently (a locked store keeps each
/// batch waiting for its busy timeout; they share it).
fn send_round(addr: SocketAddr, sid: &str, tag: &str, i: usize) -> Vec<Sent> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = round(sid, tag, i)
            .into_iter()
            .map(|(command_id, method, params, rest)| {
                scope.spawn(move || {
                    let receipt = match &rest {
                        Some((tool, body)) => invoke(addr, tool, body),
                        None => rpc(addr, method, &params),
                    };
                    Sent {
                        command_id,
                        method,
                        params,
                        rest,
                        receipt,
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a command thread"))
            .collect()
    })
}

/// Sends the command again, in session `sid` (a session lives in one
/// endpoint's memory); answers the receipt.
fn resend(addr: SocketAddr, sid: &str, sent: &Sent) -> Value {
    match &sent.rest {
        Some((tool, body)) => invoke(addr, tool, body),
        None => {
            let mut params = sent.params.clone();
            params["session_id"] = json!(sid);
            rpc(addr, sent.method, &params)
        }
    }
}

/// No answer says `completed` unless its receipt is durable: a receipt
/// whose evidence is not durable is `unknown` (`receipt_not_durable`).
fn assert_truthful(sent: &[Sent]) {
    for s in sent {
        let r = &s.receipt;
        if r["status"] == "completed" {
            assert_ne!(
                r["x-tether"]["evidence"], "not_durable",
                "{}: {r}",
                s.command_id
            );
        }
        if r["x-tether"]["evidence"] == "not_durable" {
            assert_eq!(r["status"], "unknown", "{}: {r}", s.command_id);
        }
        if r["status"] == "unknown" && r["error"]["details"]["reason"] == "receipt_not_durable" {
            assert_eq!(r["error"]["mhs_code"], "MHS.OUTCOME.UNKNOWN", "{r}");
        }
    }
}

fn is_unknown(s: &Sent) -> bool {
    s.receipt["status"] == "unknown"
}

/// Every device's status.
fn status(addr: SocketAddr) -> Value {
    rpc(addr, "mhs.safety.status", &json!({}))
}

fn device_status(addr: SocketAddr, device: &str) -> Value {
    let all = status(addr);
    all["devices"]
        .as_array()
        .and_then(|l| l.iter().find(|d| d["device_id"] == device).cloned())
        .unwrap_or_else(|| panic!("no {device} in {all}"))
}

fn estop(addr: SocketAddr, device: &str) -> Value {
    rpc(
        addr,
        "mhs.safety.estop",
        &json!({"device_ids": [device], "reason": "store fault drill"}),
    )
}

fn reset(addr: SocketAddr, device: &str) -> Value {
    rpc(
        addr,
        "mhs.safety.reset",
        &json!({"device_id": device, "reason": "store fault drill over"}),
    )
}

fn poll(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until the endpoint is healthy again and every latch is durable.
fn wait_recovered(addr: SocketAddr) {
    poll("/healthz 200 once the fault cleared", RECOVER, || {
        healthz(addr).0 == 200
    });
    poll(
        "every latch durable once the fault cleared",
        RECOVER,
        || {
            status(addr)["devices"].as_array().is_some_and(|l| {
                l.iter()
                    .all(|d| d["latched"] == false || d["latch"]["durable"] == true)
            })
        },
    );
}

/// Resets every device (each answer `completed`, the latch released).
fn reset_all(addr: SocketAddr) {
    for d in DEVICES {
        if device_status(addr, d)["latched"] == false {
            // Released during an intermittent fault by a reset that landed.
            continue;
        }
        let r = reset(addr, d);
        assert_eq!(r["status"], "completed", "reset {d}: {r}");
        assert_eq!(device_status(addr, d)["latched"], false, "{d}");
    }
}

/// A fresh session (served whatever the store: opening one only records).
fn session(addr: SocketAddr) -> String {
    rpc(addr, "mhs.session.open", &json!({}))["session_id"]
        .as_str()
        .expect("session_id")
        .to_owned()
}

/// The checks once the fault cleared, on the store the endpoint left: every
/// `completed` answer's receipt stored under its id with the same receipt
/// id; every `unknown` one stored as `unknown`; the chain verifies.
fn assert_store_holds(store: &tether_store::SqliteStore, sent: &[Sent]) {
    for s in sent {
        let status = &s.receipt["status"];
        if status != "completed" && status != "unknown" {
            continue;
        }
        let row = store
            .receipt(&s.command_id)
            .expect("read a receipt")
            .unwrap_or_else(|| {
                panic!(
                    "{} was answered {status} but has no stored receipt",
                    s.command_id
                )
            });
        assert_eq!(
            row.receipt["status"], *status,
            "{}: {}",
            s.command_id, row.receipt
        );
        if !s.receipt["receipt_id"].is_null() {
            assert_eq!(
                row.receipt["receipt_id"], s.receipt["receipt_id"],
                "{}",
                s.command_id
            );
        }
    }
}

fn assert_audit_verifies(sandbox: &Sandbox) {
    let (code, text) = sandbox.tether(&["audit", "verify", "--state-dir", &sandbox.state_str()]);
    assert_eq!(code, Some(0), "tether audit verify: {text}");
}

/// Every id answered `unknown` is answered the same receipt again and
/// never runs: its device's revision does not move.
fn assert_unknown_never_runs_again(addr: SocketAddr, sid: &str, sent: &[Sent]) {
    for s in sent.iter().filter(|s| is_unknown(s)) {
        let device = s.params["device_id"].as_str().unwrap_or(THERMOSTAT);
        let resource = match device {
            RELAY => "bank",
            ARM => "joints",
            _ => "main",
        };
        let read = json!({"session_id": sid, "device_id": device, "resource": resource});
        let before = rpc(addr, "mhs.resource.read", &read)["revision"].clone();
        let again = resend(addr, sid, s);
        assert_eq!(
            again["status"], "unknown",
            "{} ran again: {again}",
            s.command_id
        );
        assert_eq!(
            again["receipt_id"], s.receipt["receipt_id"],
            "{}: {again}",
            s.command_id
        );
        let after = rpc(addr, "mhs.resource.read", &read)["revision"].clone();
        assert_eq!(
            before, after,
            "{} moved its device's revision",
            s.command_id
        );
    }
}

// ----- scenarios --------------------------------------------------------------

/// How a fault is put on and taken off.
#[derive(Clone, Copy, Debug)]
enum Fault {
    DiskFull,
    ReadOnly,
    Locked,
}

/// What holds a fault while it lasts.
enum Held {
    Mount,
    Lock(Locker),
}

fn inject(sandbox: &Sandbox, fault: Fault) -> Held {
    match fault {
        Fault::DiskFull => {
            sandbox.fill();
            Held::Mount
        }
        Fault::ReadOnly => {
            sandbox.read_only();
            Held::Mount
        }
        Fault::Locked => Held::Lock(Locker::hold(sandbox)),
    }
}

fn clear(sandbox: &Sandbox, fault: Fault, held: Held) {
    match (fault, held) {
        (Fault::DiskFull, _) => sandbox.free(),
        (Fault::ReadOnly, _) => sandbox.read_write(),
        (Fault::Locked, Held::Lock(locker)) => drop(locker),
        (Fault::Locked, Held::Mount) => {}
    }
}

/// A healthy run first: a round of commands, all completed and stored.
fn seed(addr: SocketAddr) -> Vec<Sent> {
    let sid = session(addr);
    let sent = send_round(addr, &sid, "seed", 0);
    for s in &sent {
        assert_eq!(
            s.receipt["status"], "completed",
            "{}: {}",
            s.command_id, s.receipt
        );
    }
    sent
}

/// Mid-load: the fault hits a serving endpoint; commands, e-stops, reads
/// and a refused reset while it lasts; recovery without a restart.
fn mid_load(fault: Fault) {
    let sandbox = Sandbox::new();
    let server = sandbox.serve();
    let addr = server.addr();
    let mut sent = seed(addr);
    let sid = session(addr);
    let held = inject(&sandbox, fault);
    // Rounds until one is answered other than `completed` (a full disk
    // may take a few: the store's log has room left when it fills).
    let mut during = Vec::new();
    for i in 0..40 {
        let answers = send_round(addr, &sid, &format!("{fault:?}"), i);
        let failed = answers.iter().any(|s| s.receipt["status"] != "completed");
        during.extend(answers);
        if failed {
            break;
        }
    }
    assert_truthful(&during);
    assert!(
        during.iter().any(|s| s.receipt["status"] != "completed"),
        "the {fault:?} fault never reached a command: {during:?}"
    );
    while_faulted(addr, &sid, matches!(fault, Fault::DiskFull));
    clear(&sandbox, fault, held);
    wait_recovered(addr);
    reset_all(addr);
    assert_unknown_never_runs_again(addr, &sid, &during);
    let after = send_round(addr, &sid, &format!("{fault:?}-after"), 0);
    for s in &after {
        assert_eq!(
            s.receipt["status"], "completed",
            "recovered without a restart: {}",
            s.receipt
        );
    }
    sent.extend(during);
    sent.extend(after);
    finish(sandbox, server, &sent);
}

/// While the store fails: every e-stop is served and latched in memory
/// (`latch_durable: false`), reads and status are served, /healthz says
/// 503, a reset is refused (it cannot be made durable).
fn while_faulted(addr: SocketAddr, sid: &str, intermittent: bool) {
    for d in DEVICES {
        let e = estop(addr, d);
        assert!(e["output"]["latched"].as_bool().unwrap_or(true), "{e}");
        let st = device_status(addr, d);
        assert_eq!(st["latched"], true, "{st}");
        // A full disk may still take a small write now and then (the log
        // reuses its pages once checkpointed): the answer must then be true
        // about it. A store that takes nothing is strict.
        if !intermittent || e["latch_durable"] == false {
            assert_eq!(e["latch_durable"], false, "e-stop of {d}: {e}");
            assert_eq!(st["latch"]["durable"], false, "{st}");
        }
    }
    let read = rpc(
        addr,
        "mhs.resource.read",
        &json!({"session_id": sid, "device_id": THERMOSTAT, "resource": "main"}),
    );
    assert!(read["state"].is_object(), "a read is served: {read}");
    if intermittent {
        return;
    }
    let (code, body) = healthz(addr);
    assert_eq!(code, 503, "{body}");
    let r = reset(addr, THERMOSTAT);
    assert_eq!(
        r["status"], "rejected",
        "a reset that cannot be durable is refused: {r}"
    );
    assert_eq!(device_status(addr, THERMOSTAT)["latched"], true);
}

/// After the run: the endpoint stopped, the store's rows and the chain,
/// then a restart on the same store replays every `unknown` id unchanged.
fn finish(sandbox: Sandbox, mut server: Server, sent: &[Sent]) {
    server.terminate().expect("the endpoint exits on SIGTERM");
    drop(server);
    assert_audit_verifies(&sandbox);
    let store = sandbox.snapshot("after");
    assert_store_holds(&store, sent);
    let latches = store.latches().expect("latches");
    for d in DEVICES {
        let row = latches.iter().find(|l| l.device_id == d);
        assert!(
            row.is_some_and(|r| !r.latched),
            "{d} is stored reset: {row:?}"
        );
    }
    drop(store);
    let server = sandbox.serve();
    let addr = server.addr();
    let sid = session(addr);
    for d in DEVICES {
        assert_eq!(
            device_status(addr, d)["latched"],
            false,
            "{d} after the restart"
        );
    }
    assert_unknown_never_runs_again(addr, &sid, sent);
    for s in sent.iter().filter(|s| s.receipt["status"] == "completed") {
        let again = resend(addr, &sid, s);
        assert_eq!(
            again["receipt_id"], s.receipt["receipt_id"],
            "{} replayed: {again}",
            s.command_id
        );
    }
}

/// At start-up: the store cannot be opened or written when the endpoint
/// starts. It serves anyway, latched, says why, and takes its store back
/// once the fault clears; the start-up trip stays until a reset.
fn at_start(fault: Fault) {
    let sandbox = Sandbox::new();
    let mut server = sandbox.serve();
    let seeded = seed(server.addr());
    server.terminate().expect("the seed run exits");
    drop(server);
    let held = inject(&sandbox, fault);
    let server = sandbox.serve();
    let addr = server.addr();
    assert!(
        server.stderr_text().contains("serving LATCHED"),
        "stderr says why: {}",
        server.stderr_text()
    );
    let st = status(addr);
    assert_eq!(st["store"]["open"], false, "{st}");
    for d in st["devices"].as_array().expect("devices") {
        assert_eq!(d["latched"], true, "{d}");
        let reason = d["latch"]["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("evidence store"), "{reason}");
    }
    let sid = session(addr);
    let refused = send_round(addr, &sid, &format!("start-{fault:?}"), 0);
    for s in &refused {
        assert_eq!(
            s.receipt["status"], "rejected",
            "a latched device acts on nothing: {}",
            s.receipt
        );
        if s.rest.is_none() {
            // Latched, or its id cannot be checked against the store: both
            // refuse before anything runs.
            let code = &s.receipt["error"]["mhs_code"];
            let store_unavailable = code == "MHS.CONFLICT.COMMAND_ID_REUSE"
                && s.receipt["error"]["details"]["reason"] == "store_unavailable";
            assert!(
                code == "MHS.SAFETY.ESTOP_ENGAGED" || store_unavailable,
                "{}",
                s.receipt
            );
        }
    }
    while_faulted(addr, &sid, false);
    clear(&sandbox, fault, held);
    wait_recovered(addr);
    assert_eq!(status(addr)["store"]["open"], true);
    for d in DEVICES {
        assert_eq!(
            device_status(addr, d)["latched"],
            true,
            "the start-up trip stays until a reset: {d}"
        );
    }
    reset_all(addr);
    for s in &seeded {
        let again = resend(addr, &sid, s);
        assert_eq!(
            again["receipt_id"], s.receipt["receipt_id"],
            "{} recorded before the fault: {again}",
            s.command_id
        );
    }
    let after = send_round(addr, &sid, &format!("start-{fault:?}-after"), 0);
    for s in &after {
        assert_eq!(s.receipt["status"], "completed", "{}", s.receipt);
    }
    let mut sent = seeded;
    sent.extend(after);
    finish(sandbox, server, &sent);
}

#[test]
fn a_full_disk_mid_load_answers_no_completed_without_a_durable_receipt_and_recovers() {
    mid_load(Fault::DiskFull);
}

/// Linux refuses to remount a filesystem read-only while a process holds a
/// file on it open for writing (`EBUSY`), and the endpoint holds
/// `tether.db` open from start to end: a read-only remount mid-load cannot
/// happen short of the kernel's own `errors=remount-ro`, whose failed
/// writes reach the store as I/O errors — the path the full disk and the
/// lock exercise above. This test pins that: the remount is refused, the
/// endpoint goes on serving, and what it recorded is there and verifies.
#[test]
fn a_read_only_remount_mid_load_is_refused_by_linux_and_the_endpoint_goes_on() {
    let sandbox = Sandbox::new();
    let server = sandbox.serve();
    let addr = server.addr();
    let mut sent = seed(addr);
    let out = Command::new("nsenter")
        .args(["-t", &sandbox.pid, "-U", "-m", "mount", "-o", "remount,ro"])
        .arg(&sandbox.state)
        .output()
        .expect("nsenter mount");
    assert!(
        !out.status.success(),
        "a remount under an open writer succeeded"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("busy"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sid = session(addr);
    let after = send_round(addr, &sid, "ro-refused", 0);
    for s in &after {
        assert_eq!(s.receipt["status"], "completed", "{}", s.receipt);
    }
    assert_eq!(healthz(addr).0, 200);
    for d in DEVICES {
        let e = estop(addr, d);
        assert_eq!(e["latch_durable"], true, "{e}");
    }
    reset_all(addr);
    sent.extend(after);
    finish(sandbox, server, &sent);
}

#[test]
fn a_database_locked_mid_load_answers_no_completed_without_a_durable_receipt_and_recovers() {
    mid_load(Fault::Locked);
}

#[test]
fn an_endpoint_starting_on_a_full_disk_serves_latched_and_takes_its_store_back() {
    at_start(Fault::DiskFull);
}

#[test]
fn an_endpoint_starting_on_a_read_only_disk_serves_latched_and_takes_its_store_back() {
    at_start(Fault::ReadOnly);
}

#[test]
fn an_endpoint_starting_on_a_locked_database_serves_latched_and_takes_its_store_back() {
    at_start(Fault::Locked);
}

/// An integrity defect is no fault to wait out: a store whose last entry
/// no longer hashes to its recorded head still refuses the start (exit 2),
/// as before. Needs no namespace.
#[test]
fn an_endpoint_on_a_corrupt_store_still_refuses_to_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = Server::start(Transport::Http, Some(dir.path()));
    seed(server.addr());
    server.terminate().expect("the seed run exits");
    drop(server);
    let db = dir.path().join("tether.db");
    let cut = Command::new("python3")
        .args(["-c", "import sqlite3, sys\nc = sqlite3.connect(sys.argv[1])\nc.execute(\"UPDATE events SET hash = '00' WHERE seq = (SELECT MAX(seq) FROM events)\")\nc.commit()\n"])
        .arg(&db)
        .status()
        .expect("python3");
    assert!(cut.success(), "cutting the chain's tail");
    let run = common::tether(&[
        OsStr::new("serve"),
        OsStr::new("--http"),
        OsStr::new("127.0.0.1:0"),
        OsStr::new("--state-dir"),
        dir.path().as_os_str(),
    ]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("corrupt"), "{}", run.stderr);
}
