//! The load soak (issue 21 §4), against the real binary: `tether serve
//! --http` on the built-in cell and its durable SQLite store, driven at a
//! fixed rate over keep-alive HTTP with mixed load — JSON-RPC setpoints to
//! the simulated thermostat, replays of earlier command ids (many beyond the
//! in-memory idempotency bound, so answered from the store), reads, REST
//! tool invocations polled to their result, and an e-stop + reset pair on
//! `relay-1` every two seconds. The endpoint's resident memory (`VmRSS`) is
//! sampled every second.
//!
//! Asserted: every request got an answer, none was an internal error (HTTP
//! 5xx or `MHS.PROTOCOL.INTERNAL`), every replay answered the receipt of
//! its first run (never a second run), every e-stop latched, and resident
//! memory grew by at most [`GROWTH_MAX_MIB`] between the end of warm-up and
//! the end (a leak detector, not a timing assertion: what the endpoint keeps
//! per command is bounded, so after warm-up memory stays flat); then `tether
//! audit verify` passes. Latency (p50/p99/max), the e-stop answer's p99 and
//! the rate achieved are printed as figures, never asserted.
//!
//! The endpoint runs with small memory bounds (`[limits]
//! idempotency_cache_max`, `rest_finished_max`) so they fill during warm-up
//! and the run past them is what is measured; `TETHER_SOAK_DEFAULT_BOUNDS=1`
//! runs with the defaults instead. `TETHER_SOAK_SECS` (default 60),
//! `TETHER_SOAK_RATE` (requests/s, default 400), `TETHER_SOAK_CLIENTS`
//! (default 8), `TETHER_SOAK_WARMUP_SECS` (default half the run, at most
//! 300); `TETHER_SOAK_WRAPPER` names a program that runs the endpoint
//! (handed the binary's path first), to measure another build. The long run (30 minutes) and its figures: docs/RELIABILITY.md,
//! "Load soak".
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

#[path = "soak/client.rs"]
mod client;
mod common;

use client::{rss_kib, Conn};
use common::{Server, Transport, BIN};
use serde_json::{json, Value};
use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Resident memory may grow at most this much between the end of warm-up
/// and the end of the run. Measured growth after warm-up: 0.7 MiB in the
/// 60 s CI run and in a 600 s run (docs/RELIABILITY.md); a structure kept
/// per command at ~170 bytes (the old idempotency index's cost) adds ~14 MiB
/// in five minutes at the default rate, a REST record kept whole ~35 MiB.
const GROWTH_MAX_MIB: u64 = 16;

/// An e-stop + reset pair on `relay-1` this often.
const ESTOP_EVERY: Duration = Duration::from_secs(2);

/// Each load thread renews its session this often.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(60);

/// Command ids each load thread remembers for replays (bounded; the oldest
/// are kept, so many replays are of ids long evicted from memory).
const REMEMBER_MAX: usize = 50_000;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn write_config(dir: &Path) -> std::path::PathBuf {
    let mut text = String::from("builtin_cell = true\n");
    if env_u64("TETHER_SOAK_DEFAULT_BOUNDS") != Some(1) {
        text.push_str("\n[limits]\nidempotency_cache_max = 2000\nrest_finished_max = 1000\n");
    }
    let path = dir.join("tether.toml");
    std::fs::write(&path, text).expect("config");
    path
}

/// What one load thread saw.
#[derive(Default)]
struct Tally {
    requests: u64,
    commands: u64,
    replays: u64,
    reads: u64,
    rest: u64,
    /// Answers that were not what the operation must answer.
    anomalies: Vec<String>,
    /// Latency of each request, µs.
    lat_us: Vec<u64>,
    /// How far behind its schedule a request was sent, at most, µs.
    lag_max_us: u64,
    /// The slowest requests (latency µs, sent at ms since the start, what),
    /// at most `SLOWEST_KEPT`: where the tail comes from, printed.
    slowest: Vec<(u64, u64, String)>,
    /// Requests slower than 10 ms (the bound on the maximum).
    over_10ms: u64,
    /// How many of those were sent in each second of the run (seconds since
    /// the start): whether they came in one moment or were spread out.
    over_10ms_by_second: std::collections::BTreeMap<u64, u64>,
    connects: u64,
}

/// How many of the slowest requests each load thread keeps.
const SLOWEST_KEPT: usize = 12;

impl Tally {
    fn note_latency(&mut self, lat_us: u64, at_ms: u64, what: impl FnOnce() -> String) {
        self.lat_us.push(lat_us);
        if lat_us > 10_000 {
            self.over_10ms += 1;
            // One key per second of the run at most: bounded by its length.
            *self.over_10ms_by_second.entry(at_ms / 1000).or_insert(0) += 1;
        }
        let floor = self.slowest.iter().map(|s| s.0).min().unwrap_or(0);
        if self.slowest.len() < SLOWEST_KEPT || lat_us > floor {
            if self.slowest.len() >= SLOWEST_KEPT {
                if let Some(i) = self.slowest.iter().position(|s| s.0 == floor) {
                    self.slowest.swap_remove(i);
                }
            }
            self.slowest.push((lat_us, at_ms, what()));
        }
    }

    fn anomaly(&mut self, what: String) {
        if self.anomalies.len() < 50 {
            self.anomalies.push(what);
        }
    }
}

struct Load {
    conn: Conn,
    /// When the schedule started.
    t0: Instant,
    sid: String,
    worker: u64,
    /// (command id, temperature, receipt id) of commands that completed.
    done: Vec<(String, f64, String)>,
    tally: Tally,
}

impl Load {
    fn timed(&mut self, method: &str, path: &str, body: Option<&str>) -> Option<(u16, Value)> {
        let t = Instant::now();
        let r = self.conn.request(method, path, body);
        self.tally.requests += 1;
        let at_ms = t.saturating_duration_since(self.t0).as_millis() as u64;
        self.tally
            .note_latency(t.elapsed().as_micros() as u64, at_ms, || {
                let rpc = body
                    .and_then(|b| b.split("\"method\":\"").nth(1))
                    .and_then(|m| m.split('"').next())
                    .unwrap_or("");
                format!("{method} {path} {rpc}")
            });
        match r {
            Ok((status, v)) if status >= 500 => {
                self.tally
                    .anomaly(format!("{method} {path}: HTTP {status}: {v}"));
                None
            }
            Ok(x) => Some(x),
            Err(e) => {
                self.tally
                    .anomaly(format!("{method} {path}: no answer: {e}"));
                None
            }
        }
    }

    fn rpc(&mut self, method: &str, params: Value) -> Option<Value> {
        let body =
            json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string();
        let (status, v) = self.timed("POST", "/rpc", Some(&body))?;
        if status != 200 {
            self.tally.anomaly(format!("{method}: HTTP {status}: {v}"));
            return None;
        }
        if v["error"]["data"]["mhs_code"] == "MHS.PROTOCOL.INTERNAL" {
            self.tally.anomaly(format!("{method}: internal error: {v}"));
            return None;
        }
        Some(v)
    }

    fn setpoint(&mut self, n: u64) {
        let cid = format!("soak-{}-{n}", self.worker);
        let t = 20.0 + (n % 40) as f64;
        let params = json!({"session_id": self.sid, "device_id": "thermostat-1", "capability_id": "cap.thermal.setpoint.v1", "input": {"target_temperature": t}, "command_id": cid});
        self.tally.commands += 1;
        let Some(a) = self.rpc("mhs.command", params) else {
            return;
        };
        let r = &a["result"];
        match r["status"].as_str() {
            Some("completed") => {
                if self.done.len() < REMEMBER_MAX {
                    let rid = r["receipt_id"].as_str().unwrap_or_default().to_owned();
                    self.done.push((cid, t, rid));
                }
            }
            Some(_) => {}
            None => self
                .tally
                .anomaly(format!("setpoint {cid}: no receipt: {a}")),
        }
    }

    /// The same command id and input again: the first run's receipt.
    fn replay(&mut self, n: u64) {
        if self.done.is_empty() {
            return self.setpoint(n);
        }
        // Spread over everything remembered: old ids are beyond the index.
        let pick = (n.wrapping_mul(2_654_435_761) % self.done.len() as u64) as usize;
        let (cid, t, rid) = self.done[pick].clone();
        let params = json!({"session_id": self.sid, "device_id": "thermostat-1", "capability_id": "cap.thermal.setpoint.v1", "input": {"target_temperature": t}, "command_id": cid});
        self.tally.replays += 1;
        let Some(a) = self.rpc("mhs.command", params) else {
            return;
        };
        if a["result"]["receipt_id"].as_str() != Some(rid.as_str()) {
            self.tally
                .anomaly(format!("replay of {cid} did not answer receipt {rid}: {a}"));
        }
    }

    fn read(&mut self) {
        self.tally.reads += 1;
        let params =
            json!({"session_id": self.sid, "device_id": "thermostat-1", "resource": "main"});
        if let Some(a) = self.rpc("mhs.resource.read", params) {
            if !a["result"]["state"].is_object() {
                self.tally.anomaly(format!("read: {a}"));
            }
        }
    }

    /// A REST invocation, polled on the same connection to its result.
    fn rest(&mut self, n: u64) {
        self.tally.rest += 1;
        let body = json!({"input": {"target_temperature": 20.0 + (n % 40) as f64}, "command_id": format!("soak-rest-{}-{n}", self.worker)}).to_string();
        let Some((status, v)) =
            self.timed("POST", "/tools/thermostat-1__setpoint:invoke", Some(&body))
        else {
            return;
        };
        let Some(inv) = v["data"]["invocation_id"]
            .as_str()
            .filter(|_| status == 202)
        else {
            // A refusal is an answer (e.g. the device busy); not an anomaly.
            if v["ok"] != false {
                self.tally
                    .anomaly(format!("REST invoke: HTTP {status}: {v}"));
            }
            return;
        };
        let path = format!("/invocations/{inv}/result");
        for _ in 0..1000 {
            match self.timed("GET", &path, None) {
                None => return,
                Some((200, _)) => return,
                Some((202, _)) => std::thread::sleep(Duration::from_millis(2)),
                Some((s, r)) => {
                    self.tally.anomaly(format!("{path}: HTTP {s}: {r}"));
                    return;
                }
            }
        }
        self.tally
            .anomaly(format!("{path}: still pending after 1000 polls"));
    }
}

/// One load thread: operation `i` (every `clients`-th from `worker`) is due
/// at `t0 + i / rate`; a thread behind its schedule sends at once.
fn load_thread(
    addr: std::net::SocketAddr,
    worker: u64,
    clients: u64,
    rate: u64,
    t0: Instant,
    end: Instant,
) -> (Tally, Vec<(String, f64, String)>) {
    let mut conn = Conn::new(addr);
    let sid = match conn.request(
        "POST",
        "/rpc",
        Some(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "mhs.session.open", "params": {}})
                .to_string(),
        ),
    ) {
        Ok((200, v)) => v["result"]["session_id"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        other => panic!("session: {other:?}"),
    };
    let mut l = Load {
        conn,
        t0,
        sid,
        worker,
        done: Vec::new(),
        tally: Tally {
            // Sized once for the whole run: a doubling copy of a large
            // vector mid-run takes CPU the endpoint's answers then wait for.
            lat_us: Vec::with_capacity(expected_requests(rate, clients, t0, end)),
            ..Tally::default()
        },
    };
    let mut i = worker;
    let mut last_beat = Instant::now();
    loop {
        let due = t0 + Duration::from_micros(i * 1_000_000 / rate);
        if due >= end {
            break;
        }
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        } else {
            l.tally.lag_max_us = l.tally.lag_max_us.max((now - due).as_micros() as u64);
        }
        let n = i / clients;
        // A session lives 600 s without a heartbeat (commands do not renew it).
        if last_beat.elapsed() >= HEARTBEAT_EVERY {
            last_beat = Instant::now();
            let params = json!({"session_id": l.sid});
            if l.rpc("mhs.session.heartbeat", params)
                .is_some_and(|a| a.get("error").is_some())
            {
                l.tally.anomaly("heartbeat refused".into());
            }
        }
        match i % 10 {
            0..=4 => l.setpoint(n),
            5 | 6 => l.rest(n),
            7 => l.replay(n),
            _ => l.read(),
        }
        i += clients;
    }
    l.tally.connects = l.conn.connects;
    // The remembered commands go back to the caller, to be dropped once
    // every load thread has ended: freed here, some 100,000 strings a thread
    // would take CPU from the endpoint in the run's last second, while the
    // other threads' last requests are still being timed.
    (l.tally, l.done)
}

/// How many requests one of `clients` load threads sends between `t0` and
/// `end` at `rate` requests/s in all (a little over, for the rounding).
fn expected_requests(rate: u64, clients: u64, t0: Instant, end: Instant) -> usize {
    let secs = end.saturating_duration_since(t0).as_secs() + 1;
    usize::try_from(rate.saturating_mul(secs) / clients.max(1) + 16).unwrap_or(0)
}

/// E-stop + reset pairs on `relay-1`: (answer latencies µs, anomalies).
fn estop_thread(addr: std::net::SocketAddr, stop: &AtomicBool) -> (Vec<u64>, Vec<String>) {
    let mut conn = Conn::new(addr);
    let mut lat = Vec::new();
    let mut bad = Vec::new();
    let call = |conn: &mut Conn, method: &str, params: Value| {
        let body =
            json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string();
        conn.request("POST", "/rpc", Some(&body))
    };
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(ESTOP_EVERY);
        let t = Instant::now();
        let r = call(
            &mut conn,
            "mhs.safety.estop",
            json!({"device_id": "relay-1", "reason": "soak"}),
        );
        lat.push(t.elapsed().as_micros() as u64);
        match r {
            Ok((200, v)) if v["result"]["status"] == "completed" => {}
            other => bad.push(format!("e-stop: {other:?}")),
        }
        match call(
            &mut conn,
            "mhs.safety.reset",
            json!({"device_id": "relay-1", "reason": "soak"}),
        ) {
            Ok((200, v)) if v["result"]["status"] == "completed" => {}
            other => bad.push(format!("reset: {other:?}")),
        }
    }
    (lat, bad)
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Writes back what earlier writers left dirty (the build that made the
/// binary: hundreds of MB) before the run. The kernel writes dirty pages
/// back ~30 s after they were dirtied, in bursts that queue ahead of the
/// store's small synced writes on the same disk, and a disk without FUA
/// flushes everyone's writes with each commit's: a build's writeback
/// landing inside the run showed as 20-130 ms stalls of every request that
/// were the build's, not the endpoint's (docs/PERFORMANCE.md, "What the
/// remaining stalls were").
fn settle_the_disk() {
    let dirty = || dirty_kib().map_or_else(|| "?".to_owned(), |k| k.to_string());
    let before = dirty();
    let synced = Command::new("sync").status().is_ok_and(|s| s.success());
    eprintln!(
        "soak: dirty page cache before the run {before} KiB; `sync` {}; now {} KiB",
        if synced { "done" } else { "unavailable" },
        dirty()
    );
}

/// The kernel's dirty page cache, KiB (`/proc/meminfo`, Linux).
fn dirty_kib() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("Dirty:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn soak_keeps_memory_flat_and_answers_everything() {
    let secs = env_u64("TETHER_SOAK_SECS").unwrap_or(60).max(10);
    let rate = env_u64("TETHER_SOAK_RATE").unwrap_or(400).max(1);
    let clients = env_u64("TETHER_SOAK_CLIENTS").unwrap_or(8).max(1);
    // Warm-up covers the bounds filling and SQLite's page caches (16 MiB
    // for the writer) filling as the database grows.
    let warmup = env_u64("TETHER_SOAK_WARMUP_SECS")
        .unwrap_or((secs / 2).min(300))
        .min(secs - 5);
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path());
    let state = dir.path().join("state");
    settle_the_disk();
    // A program that execs the binary it is handed (first argument) or
    // another one: to measure a build from before a change.
    let wrapper = std::env::var_os("TETHER_SOAK_WRAPPER");
    let wrapper: Vec<&OsStr> = wrapper.iter().map(|w| w.as_os_str()).collect();
    let mut s = Server::start_wrapped(
        &wrapper,
        Transport::Http,
        Some(&state),
        &[OsStr::new("--config"), cfg.as_os_str()],
        &[],
    );
    let (addr, pid) = (s.addr(), s.pid());
    let idle = rss_kib(pid).expect("VmRSS");
    eprintln!("soak: {secs} s at {rate} requests/s, {clients} clients, warm-up {warmup} s; idle RSS {:.1} MiB", mib(idle));

    let t0 = Instant::now() + Duration::from_millis(200);
    // To line the run up with a system sampler (scripts/pressure).
    let t0_unix_ms = (std::time::SystemTime::now() + Duration::from_millis(200))
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    eprintln!("soak: the schedule starts at unix ms {t0_unix_ms}");
    let end = t0 + Duration::from_secs(secs);
    let stop = Arc::new(AtomicBool::new(false));
    let samples = Arc::new(Mutex::new(Vec::<(u64, u64)>::new()));
    let sampler = {
        let (stop, samples) = (Arc::clone(&stop), Arc::clone(&samples));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some(k) = rss_kib(pid) {
                    let at = Instant::now().saturating_duration_since(t0).as_secs();
                    samples.lock().unwrap().push((at, k));
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    let estops = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || estop_thread(addr, &stop))
    };
    let loads: Vec<_> = (0..clients)
        .map(|w| std::thread::spawn(move || load_thread(addr, w, clients, rate, t0, end)))
        .collect();
    let (tallies, remembered): (Vec<Tally>, Vec<_>) = loads
        .into_iter()
        .map(|h| h.join().expect("load thread"))
        .unzip();
    let elapsed = t0.elapsed();
    drop(remembered);
    stop.store(true, Ordering::Relaxed);
    let (mut estop_lat, estop_bad) = estops.join().expect("e-stop thread");
    sampler.join().expect("sampler");
    let last = rss_kib(pid).expect("VmRSS at the end");

    let mut lat: Vec<u64> = tallies
        .iter()
        .flat_map(|t| t.lat_us.iter().copied())
        .collect();
    lat.sort_unstable();
    estop_lat.sort_unstable();
    let sum = |f: fn(&Tally) -> u64| tallies.iter().map(f).sum::<u64>();
    let anomalies: Vec<&String> = tallies
        .iter()
        .flat_map(|t| t.anomalies.iter())
        .chain(estop_bad.iter())
        .collect();
    let samples = samples.lock().unwrap().clone();
    let at = |sec: u64| {
        samples
            .iter()
            .find(|(t, _)| *t >= sec)
            .map_or(last, |(_, k)| *k)
    };
    let after_warmup = at(warmup);
    let peak = samples.iter().map(|(_, k)| *k).max().unwrap_or(last);
    let requests = sum(|t| t.requests);
    eprintln!(
        "soak figures: {requests} requests in {:.1} s ({:.0}/s): {} setpoints, {} replays, {} reads, {} REST invocations; {} e-stop+reset pairs; connections {}",
        elapsed.as_secs_f64(),
        requests as f64 / elapsed.as_secs_f64(),
        sum(|t| t.commands), sum(|t| t.replays), sum(|t| t.reads), sum(|t| t.rest), estop_lat.len(), sum(|t| t.connects),
    );
    eprintln!(
        "soak figures: latency p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; most behind schedule {:.1} ms; e-stop answer p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        pct(&lat, 0.5) as f64 / 1e3, pct(&lat, 0.99) as f64 / 1e3, pct(&lat, 1.0) as f64 / 1e3,
        tallies.iter().map(|t| t.lag_max_us).max().unwrap_or(0) as f64 / 1e3,
        pct(&estop_lat, 0.5) as f64 / 1e3, pct(&estop_lat, 0.99) as f64 / 1e3, pct(&estop_lat, 1.0) as f64 / 1e3,
    );
    let mut slowest: Vec<&(u64, u64, String)> =
        tallies.iter().flat_map(|t| t.slowest.iter()).collect();
    slowest.sort_unstable_by_key(|s| std::cmp::Reverse(s.0));
    eprintln!(
        "soak figures: {} requests over 10 ms; the slowest (latency ms @ s since the start, request): {}",
        sum(|t| t.over_10ms),
        slowest
            .iter()
            .take(SLOWEST_KEPT)
            .map(|(lat, at, what)| format!("{:.1} @ {:.1} {what}", *lat as f64 / 1e3, *at as f64 / 1e3))
            .collect::<Vec<_>>()
            .join("; ")
    );
    let mut by_second = std::collections::BTreeMap::<u64, u64>::new();
    for t in &tallies {
        for (sec, n) in &t.over_10ms_by_second {
            *by_second.entry(*sec).or_insert(0) += n;
        }
    }
    eprintln!(
        "soak figures: requests over 10 ms by the second they were sent in (s: count): {}",
        by_second
            .iter()
            .map(|(sec, n)| format!("{sec}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let every = (secs / 20).max(5);
    let mut trace: Vec<String> = Vec::new();
    for (t, k) in &samples {
        if *t >= trace.len() as u64 * every {
            trace.push(format!("{t}s {:.1}", mib(*k)));
        }
    }
    eprintln!(
        "soak figures: RSS idle {:.1} MiB, after warm-up ({warmup} s) {:.1} MiB, end {:.1} MiB, peak {:.1} MiB; every {every} s: {}",
        mib(idle), mib(after_warmup), mib(last), mib(peak), trace.join(", ")
    );

    assert!(
        anomalies.is_empty(),
        "{} anomalies, first: {:#?}",
        anomalies.len(),
        &anomalies[..anomalies.len().min(10)]
    );
    assert!(
        sum(|t| t.replays) > 0 && !estop_lat.is_empty(),
        "the load did too little"
    );
    let growth = last.saturating_sub(after_warmup);
    assert!(
        growth <= GROWTH_MAX_MIB * 1024,
        "resident memory grew {:.1} MiB after warm-up (bound {GROWTH_MAX_MIB} MiB): {:.1} -> {:.1} MiB",
        mib(growth), mib(after_warmup), mib(last)
    );
    assert!(
        s.terminate().is_some(),
        "the endpoint did not stop on SIGTERM"
    );
    let out = Command::new(BIN)
        .args(["audit", "verify", "--state-dir"])
        .arg(&state)
        .output()
        .expect("tether audit verify");
    assert!(
        out.status.success(),
        "audit verify: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "soak: chain verifies: {}",
        String::from_utf8_lossy(&out.stdout).trim()
    );
}
