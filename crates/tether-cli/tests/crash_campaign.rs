//! The SIGKILL campaign (issue 21 §2), against the real binary: `tether
//! serve` on the built-in cell, with a hold policy (setpoints above 60 degC
//! wait for two operators) and a budget on the thermostat's setpoints, runs
//! under mixed JSON-RPC and REST load (setpoints, relay switches, arm
//! motions, holds and votes, budget draws, e-stops and resets) and is killed
//! with SIGKILL at a seeded random moment — while the load runs (so inside
//! group commits and motions) and now and then during start-up. After every
//! kill, once restarted (the open applies what the journal holds beyond the
//! database): `tether audit verify` passes, and in the chain no
//! command id has two executions and every admission without an outcome is
//! a command that was in flight at that kill. After every restart, against
//! the endpoint and the store: every acknowledged receipt is stored and
//! replays identically, every interrupted command that left a record replays
//! it without running again (an interrupted motion is `unknown` and the arm
//! does not move), every acknowledged latch, reset, hold, vote and budget
//! draw is there; the start-up time is recorded.
//!
//! `TETHER_CRASH_KILLS` (default 50) sets the number of kills and
//! `TETHER_CRASH_SEED` replays a run (the seed fixes the operations and the
//! kill moments, not the threads' interleaving). The long run and its result:
//! docs/RELIABILITY.md, "SIGKILL campaign".
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

#[path = "crash/client.rs"]
mod client;
mod common;
#[path = "crash/ledger.rs"]
mod ledger;
#[path = "crash/load.rs"]
mod load;

use client::*;
use common::{Server, Transport, BIN};
use ledger::Ledger;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

/// Setpoints above 60 degC wait for two operators; the rest of the cell is
/// allowed.
const POLICY: &str = r#"
@id("reads") permit(principal, action == Tether::Action::"read", resource);
@id("cell") permit(principal, action, resource) when { context.mode == "simulated" };
@id("hot-setpoints")
@hold("setpoints above 60 degC need two operators")
@quorum("2")
permit(principal, action == Tether::Action::"command", resource)
  when { resource.capability == "cap.thermal.setpoint.v1" &&
         context.input has target_temperature &&
         context.input.target_temperature.greaterThan(decimal("60.0")) };
"#;

/// Each setpoint draws its target temperature from a budget far above what
/// a run asks, so every draw is a durable admission before dispatch.
const OVERLAY: &str = r#"{"thermostat-1": {"cap.thermal.setpoint.v1": {"target_temperature": {"max": 1000000000, "per": "rolling_1h", "unit": "degC", "source": "operator", "reason": "crash campaign budget"}}}}"#;

/// Older acknowledged receipts and holds checked again after each restart,
/// beside every one acknowledged since the last.
const SAMPLE: usize = 8;

fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

fn write_config(dir: &Path) -> PathBuf {
    std::fs::write(dir.join("policy.cedar"), POLICY).expect("policy");
    std::fs::write(dir.join("site-limits.json"), OVERLAY).expect("overlay");
    let mut text = String::from(
        "builtin_cell = true\npolicy = \"policy.cedar\"\noverlay = \"site-limits.json\"\n\n",
    );
    for (id, kind, roles, token) in [
        ("planner", "agent", "", AGENT),
        ("alice", "human", "\"operator\"", ALICE),
        ("bob", "human", "\"operator\"", BOB),
    ] {
        text.push_str(&format!(
            "[[principals]]\nid = \"{id}\"\nkind = \"{kind}\"\nroles = [{roles}]\ntoken_sha256 = \"{}\"\n\n",
            sha256_hex(token)
        ));
    }
    let path = dir.join("tether.toml");
    std::fs::write(&path, text).expect("config");
    path
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

struct Campaign {
    state: PathBuf,
    cfg: PathBuf,
    seed: u64,
    rng: StdRng,
    ledger: Ledger,
    startups: Vec<Duration>,
    startup_kills: u64,
    chain: Chain,
    verify_every: u64,
    verifies: u64,
    verify_max: Duration,
    /// Whether the last start-up served LATCHED (its restore outlasted
    /// its bound), and how long each such start-up took.
    latched_start: bool,
    latched_starts: Vec<Duration>,
    /// How long each start-up took that served while its store's state
    /// was still being read (past the restore's first stage and its 2 s).
    late_starts: Vec<Duration>,
    /// Start-ups that applied records of the SQLite store's journal.
    journal_replays: u64,
}

impl Campaign {
    fn fail(&self, cycle: u64, what: String) -> ! {
        panic!(
            "SIGKILL campaign, seed {} (replay with TETHER_CRASH_SEED={}), after kill {cycle}: {what}",
            self.seed, self.seed
        )
    }

    fn start(&mut self) -> Server {
        let t0 = Instant::now();
        let s = Server::start_with(
            Transport::Http,
            Some(&self.state),
            &[OsStr::new("--config"), self.cfg.as_os_str()],
        );
        self.startups.push(t0.elapsed());
        // A start-up whose restore outlasts its bound (2 s) serves with
        // every device latched until an operator resets it, and seats the
        // store when the restore ends (kernel/deferred.rs): fail-closed, so
        // counted and reported, not a failure. The checks wait for the store.
        let stderr = s.stderr_text();
        self.latched_start = stderr.contains("serving LATCHED");
        // A restore past its first stage (the writes that wait for the
        // lock) serves untripped and seats its store when it is done: the
        // checks wait for the store as well.
        let late = stderr.contains("still being restored");
        if late {
            self.late_starts.push(t0.elapsed());
        }
        if self.latched_start {
            self.latched_starts.push(t0.elapsed());
        }
        if self.latched_start || late {
            let n = self.startups.len() as u64;
            let deadline = Instant::now() + Duration::from_secs(90);
            loop {
                let a = rpc(s.addr(), ALICE, "mhs.safety.status", json!({}));
                if a.as_ref()
                    .is_ok_and(|a| a["result"]["store"]["open"] == true)
                {
                    break;
                }
                if Instant::now() > deadline {
                    self.fail(n, format!("start-up {n} served without its store (LATCHED: {}) and the store did not open within 90 s: {a:?}", self.latched_start));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        s
    }

    /// Kills a `tether serve` during its start-up (before or while it
    /// opens the store and reconciles what the last kill left).
    fn kill_during_startup(&mut self) {
        let mut child = Command::new(BIN)
            .arg("serve")
            .arg("--state-dir")
            .arg(&self.state)
            .arg("--config")
            .arg(&self.cfg)
            .args(["--http", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn tether serve");
        std::thread::sleep(Duration::from_millis(self.rng.gen_range(0..400)));
        let _ = child.kill();
        let _ = child.wait();
        self.startup_kills += 1;
    }

    /// One cycle: load until a random moment, then SIGKILL.
    fn load_and_kill(&mut self, s: &mut Server, cycle: u64) {
        let stop = AtomicBool::new(false);
        let (tx, rx) = std::sync::mpsc::channel();
        let delay = Duration::from_millis(self.rng.gen_range(50..1500));
        let ctx = load::Ctx {
            addr: s.addr(),
            stop: &stop,
            tx,
            cycle,
            seed: self.seed,
        };
        std::thread::scope(|scope| {
            scope.spawn(|| load::run(&ctx));
            std::thread::sleep(delay);
            s.kill();
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        drop(ctx);
        // Its start-up applied the journal's records the database lacked
        // (the last kill fell between a record's flush and SQLite's commit).
        if s.stderr_text().contains("journal held") {
            self.journal_replays += 1;
        }
        for e in rx.try_iter() {
            self.ledger.apply(e);
        }
        self.ledger.killed();
    }

    /// Offline, after a kill: the chain verifies (every `verify_every`
    /// kills, and at the end), it never lost entries it had, no command id
    /// has two executions, every acknowledged receipt is in it, and every
    /// admission without an outcome was in flight at this kill. The entries
    /// are read from the store incrementally, as they were appended.
    fn check_chain(&mut self, cycle: u64, verify: bool) {
        if verify {
            let t0 = Instant::now();
            let (code, out) = audit_verify(&self.state);
            if code != Some(0) || !out.starts_with("ok") {
                self.fail(cycle, format!("audit verify: {code:?} {out}"));
            }
            self.verify_max = self.verify_max.max(t0.elapsed());
            self.verifies += 1;
        }
        let db = Db::open(&self.state);
        let last: i64 =
            db.0.query_row("SELECT COALESCE(MAX(seq), 0) FROM events", [], |r| r.get(0))
                .expect("chain head");
        if last < self.chain.seq {
            self.fail(
                cycle,
                format!("the chain went back from seq {} to {last}", self.chain.seq),
            );
        }
        let mut q =
            db.0.prepare("SELECT seq, line FROM events WHERE seq > ?1 ORDER BY seq")
                .expect("events");
        let rows = q
            .query_map([self.chain.seq], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
            })
            .expect("events")
            .collect::<Result<Vec<_>, _>>()
            .expect("events");
        for (seq, line) in rows {
            let e: Value = serde_json::from_str(&line)
                .unwrap_or_else(|err| self.fail(cycle, format!("entry {seq}: {err}")));
            self.chain.seq = seq;
            self.chain.take(&e);
        }
        let chain = &self.chain;
        if let Some((cid, k)) = chain.outcomes.iter().find(|(_, k)| **k > 1) {
            self.fail(cycle, format!("{cid} has {k} outcome entries (ran twice?)"));
        }
        if let Some((cid, k)) = chain.admitted.iter().find(|(_, k)| **k > 1) {
            self.fail(cycle, format!("{cid} was admitted {k} times (ran twice?)"));
        }
        for cid in chain.admitted.keys() {
            if !chain.outcomes.contains_key(cid) && !self.ledger.inflight.contains_key(cid) {
                self.fail(
                    cycle,
                    format!(
                        "{cid} was admitted, has no outcome and was not in flight at this kill"
                    ),
                );
            }
        }
        for cid in &self.ledger.fresh_receipts {
            let id = self.ledger.receipts[cid].receipt["receipt_id"]
                .as_str()
                .unwrap_or_default();
            if !chain.receipt_ids.contains(id) {
                self.fail(
                    cycle,
                    format!("acknowledged receipt {id} of {cid} is not in the chain"),
                );
            }
        }
    }
}

/// Bound on one `tether audit verify` (a long run's chain grows to hundreds
/// of thousands of entries; the debug binary checks ~20,000 a second).
const VERIFY_TIMEOUT: Duration = Duration::from_secs(600);

/// `tether audit verify --state-dir STATE`, bounded by `VERIFY_TIMEOUT`:
/// its exit code and everything it wrote.
fn audit_verify(state: &Path) -> (Option<i32>, String) {
    let out = tempfile::NamedTempFile::new().expect("verify output file");
    let mut child = Command::new(BIN)
        .args(["audit", "verify", "--state-dir"])
        .arg(state)
        .stdin(Stdio::null())
        .stdout(out.reopen().expect("reopen"))
        .stderr(out.reopen().expect("reopen"))
        .spawn()
        .expect("spawn tether audit verify");
    let deadline = Instant::now() + VERIFY_TIMEOUT;
    let code = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break st.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        code,
        std::fs::read_to_string(out.path()).unwrap_or_default(),
    )
}

/// What the chain holds so far, read entry by entry.
#[derive(Default)]
struct Chain {
    seq: i64,
    /// Outcome entries (`command.receipt`, `command.finish_crashed`) per id.
    outcomes: BTreeMap<String, u64>,
    /// `command.admitted` entries per id.
    admitted: BTreeMap<String, u64>,
    receipt_ids: HashSet<String>,
}

impl Chain {
    fn take(&mut self, e: &Value) {
        let body = &e["body"];
        for r in [&body["receipt_id"], &body["receipt"]["receipt_id"]] {
            if let Some(r) = r.as_str() {
                self.receipt_ids.insert(r.to_owned());
            }
        }
        let cid = body["command_id"]
            .as_str()
            .or_else(|| body["receipt"]["command_id"].as_str());
        let (Some(cid), Some(kind)) = (cid, e["kind"].as_str()) else {
            return;
        };
        match kind {
            "command.receipt" | "command.finish_crashed" => {
                *self.outcomes.entry(cid.to_owned()).or_default() += 1;
            }
            "command.admitted" => *self.admitted.entry(cid.to_owned()).or_default() += 1,
            _ => {}
        }
    }
}

/// A read-only view of the store beside the running endpoint.
struct Db(rusqlite::Connection);

impl Db {
    fn open(state: &Path) -> Db {
        let c = rusqlite::Connection::open_with_flags(
            state.join("tether.db"),
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .expect("open the store read-only");
        c.busy_timeout(Duration::from_secs(10))
            .expect("busy timeout");
        Db(c)
    }

    /// The stored receipt of `cid`, if any: the `receipt` member of the
    /// chain entry its row indexes.
    fn receipt(&self, cid: &str) -> Option<Value> {
        let line = self
            .0
            .query_row(
                "SELECT e.line FROM receipts r JOIN events e ON e.seq = r.seq WHERE r.command_id = ?1",
                [cid],
                |r| r.get::<_, String>(0),
            )
            .ok()?;
        let entry: Value = serde_json::from_str(&line).ok()?;
        let body = if entry["body"].is_object() {
            &entry["body"]
        } else {
            &entry
        };
        Some(body.get("receipt").unwrap_or(body).clone())
    }

    /// Whether `cid`'s budget draw is stored and counted.
    fn draw_counted(&self, cid: &str) -> bool {
        self.0
            .query_row(
                "SELECT released FROM budget WHERE reservation_id = ?1",
                [format!("{cid}#0")],
                |r| r.get::<_, i64>(0),
            )
            .is_ok_and(|released| released == 0)
    }
}

/// A receipt without its `replayed` flag.
fn bare(r: &Value) -> Value {
    let mut r = r.clone();
    if let Value::Object(m) = &mut r {
        m.remove("replayed");
    }
    r
}

/// The checks after a restart, on the running endpoint `s`.
struct After<'a> {
    c: &'a mut Campaign,
    addr: std::net::SocketAddr,
    db: Db,
    sid: String,
    cycle: u64,
}

impl After<'_> {
    fn arm_positions(&self) -> Value {
        let r = rpc(
            self.addr,
            AGENT,
            "mhs.resource.read",
            json!({"session_id": self.sid, "device_id": "arm-1", "resource": "joints"}),
        )
        .unwrap_or_else(|e| self.c.fail(self.cycle, format!("read the arm: {e}")));
        r["result"]["state"]["positions"].clone()
    }

    fn resend(&self, cid: &str, via: &Via) -> Value {
        match send(self.addr, &self.sid, via) {
            Sent::Receipt(r) => r,
            Sent::Refused(code) => self
                .c
                .fail(self.cycle, format!("resending {cid} was refused: {code}")),
            Sent::Lost(e) => self.c.fail(self.cycle, format!("resending {cid}: {e}")),
            Sent::Unreached => self
                .c
                .fail(self.cycle, format!("resending {cid}: no connection")),
        }
    }

    /// Every command in flight at the kill that left a stored outcome
    /// replays it and does not run again; an interrupted motion is
    /// `unknown` and the arm stays where it is.
    fn interrupted(&mut self) {
        let inflight = std::mem::take(&mut self.c.ledger.inflight);
        for (cid, (via, motion)) in inflight {
            let Some(stored) = self.db.receipt(&cid) else {
                continue;
            };
            // A motion the kill cut short ends `unknown` (start-up's crashed
            // finish); one that ended before the kill keeps its own outcome.
            let crashed = stored["error"]["details"]["reason"] == "endpoint_crashed";
            if stored["status"] == "unknown" && !crashed
                || crashed && stored["status"] != "unknown"
                || !ledger::is_outcome(&stored)
            {
                self.c.fail(
                    self.cycle,
                    format!("interrupted {cid} is stored as {stored}"),
                );
            }
            if motion && crashed {
                self.c.ledger.stats.interrupted_motions_unknown += 1;
            }
            let before = motion.then(|| self.arm_positions());
            let r = self.resend(&cid, &via);
            if r["replayed"] != true || bare(&r)["receipt_id"] != stored["receipt_id"] {
                self.c.fail(
                    self.cycle,
                    format!("interrupted {cid} did not replay its stored outcome {stored}: {r}"),
                );
            }
            if let Some(before) = before {
                std::thread::sleep(Duration::from_millis(50));
                let after = self.arm_positions();
                if after != before {
                    self.c.fail(
                        self.cycle,
                        format!(
                            "resending interrupted motion {cid} moved the arm: {before} -> {after}"
                        ),
                    );
                }
            }
            self.c.ledger.stats.interrupted_resent += 1;
            self.c.ledger.acknowledge(cid, via, r);
        }
    }

    /// Acknowledged receipts (the fresh ones and a sample of older ones) are
    /// stored and replay identically.
    fn receipts(&mut self) {
        let mut ids = std::mem::take(&mut self.c.ledger.fresh_receipts);
        for _ in 0..SAMPLE.min(self.c.ledger.order.len()) {
            let i = self.c.rng.gen_range(0..self.c.ledger.order.len());
            ids.push(self.c.ledger.order[i].clone());
        }
        ids.sort();
        ids.dedup();
        for cid in ids {
            let (via, want) = {
                let a = &self.c.ledger.receipts[&cid];
                (a.via.clone(), bare(&a.receipt))
            };
            let stored = self.db.receipt(&cid);
            if stored.as_ref().map(|s| &s["receipt_id"]) != Some(&want["receipt_id"]) {
                self.c.fail(
                    self.cycle,
                    format!("acknowledged {cid} ({want}) is stored as {stored:?}"),
                );
            }
            let got = self.resend(&cid, &via);
            if got["replayed"] != true || bare(&got) != want {
                self.c.fail(
                    self.cycle,
                    format!(
                        "{} replay of {cid} differs:\nacknowledged {want}\nreplayed     {got}",
                        via.surface()
                    ),
                );
            }
            self.c.ledger.stats.replays += 1;
        }
    }

    fn draws(&mut self) {
        for cid in std::mem::take(&mut self.c.ledger.fresh_draws) {
            if !self.db.draw_counted(&cid) {
                self.c.fail(
                    self.cycle,
                    format!("the acknowledged draw of {cid} is not counted"),
                );
            }
        }
    }

    /// Acknowledged holds are there with every acknowledged vote; those
    /// left pending are denied so open approvals stay bounded.
    fn holds(&mut self) {
        let mut ids = std::mem::take(&mut self.c.ledger.fresh_holds);
        let keys: Vec<String> = self.c.ledger.holds.keys().cloned().collect();
        for _ in 0..SAMPLE.min(keys.len()) {
            ids.push(keys[self.c.rng.gen_range(0..keys.len())].clone());
        }
        ids.sort();
        ids.dedup();
        for id in ids {
            let a = rpc(
                self.addr,
                ALICE,
                "mhs.approvals.get",
                json!({"approval_id": id}),
            )
            .unwrap_or_else(|e| self.c.fail(self.cycle, format!("approvals.get: {e}")));
            let got = &a["result"];
            let h = &self.c.ledger.holds[&id];
            if !got.is_object() {
                self.c.fail(
                    self.cycle,
                    format!("acknowledged hold {id} of {} is gone: {a}", h.cid),
                );
            }
            let votes = got["votes"].to_string();
            for v in &h.voters {
                if !votes.contains(&format!("\"{v}\"")) {
                    self.c.fail(
                        self.cycle,
                        format!("{v}'s acknowledged vote on {id} is missing: {got}"),
                    );
                }
            }
            if got["status"] == "pending" {
                for token in [ALICE, BOB] {
                    let _ = rpc(
                        self.addr,
                        token,
                        "mhs.approvals.decide",
                        json!({"approval_id": id, "decision": "deny", "reason": "crash campaign: left pending by a kill"}),
                    );
                }
            }
        }
    }

    fn latches(&mut self) {
        let a = rpc(self.addr, ALICE, "mhs.safety.status", json!({}))
            .unwrap_or_else(|e| self.c.fail(self.cycle, format!("safety.status: {e}")));
        for d in load::DEVICES {
            let st = a["result"]["devices"]
                .as_array()
                .and_then(|l| l.iter().find(|x| x["device_id"] == d))
                .cloned()
                .unwrap_or_else(|| self.c.fail(self.cycle, format!("no {d} in {a}")));
            let latched = st["latched"] == true;
            // A LATCHED start-up trips every device whatever was reset:
            // more latched than acknowledged, never less.
            let tripped_at_start = self.c.latched_start
                && latched
                && st["latch"]["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("start-up"));
            if let Some(Some(want)) = self.c.ledger.latch.get(d) {
                if *want != latched && !tripped_at_start {
                    self.c.fail(
                        self.cycle,
                        format!("{d} latched = {latched}, acknowledged {want}: {st}"),
                    );
                }
            }
            self.c.ledger.latch.insert(d, Some(latched));
        }
    }
}

impl Campaign {
    fn check_restart(&mut self, s: &Server, cycle: u64) {
        let addr = s.addr();
        let sid =
            session(addr, AGENT).unwrap_or_else(|e| self.fail(cycle, format!("session: {e}")));
        let mut a = After {
            db: Db::open(&self.state),
            c: self,
            addr,
            sid,
            cycle,
        };
        a.latches();
        a.interrupted();
        a.receipts();
        a.draws();
        a.holds();
        // Every admission the chain held at the kill has its outcome now.
        let missing: Vec<String> =
            a.c.chain
                .admitted
                .keys()
                .filter(|cid| !a.c.chain.outcomes.contains_key(*cid) && a.db.receipt(cid).is_none())
                .cloned()
                .collect();
        if !missing.is_empty() {
            a.c.fail(
                cycle,
                format!("admitted without a stored outcome after the restart: {missing:?}"),
            );
        }
    }

    fn report(&self, kills: u64, elapsed: Duration) -> String {
        let mut ms: Vec<u128> = self.startups.iter().map(Duration::as_millis).collect();
        ms.sort_unstable();
        let p50 = ms.get(ms.len() / 2).copied().unwrap_or(0);
        let max = ms.last().copied().unwrap_or(0);
        let s = &self.ledger.stats;
        let mut top: Vec<(&String, &u64)> = s.refusals.iter().collect();
        top.sort_by(|a, b| b.1.cmp(a.1));
        top.truncate(6);
        format!(
            "SIGKILL campaign: seed {}, {kills} kills ({} during start-up) in {:.0} s; start-up p50 {p50} ms, max {max} ms ({} starts); \
             commands sent {}, outcomes acknowledged {}, replays checked {}, in flight at a kill {} (resent and replayed {}, interrupted motions unknown {}); \
             holds {}, votes {}, budget draws {}, latches {}, resets {}; chain entries {} ({} verifies, slowest {} ms); start-ups served LATCHED {:?}; start-ups served while still restoring {:?}; start-ups that applied journal records {}; refusals {top:?}; anomalies {}",
            self.seed,
            self.startup_kills,
            elapsed.as_secs_f64(),
            ms.len(),
            s.sent,
            s.acked,
            s.replays,
            s.interrupted,
            s.interrupted_resent,
            s.interrupted_motions_unknown,
            s.holds,
            s.votes,
            s.draws,
            s.latches,
            s.resets,
            self.chain.seq,
            self.verifies,
            self.verify_max.as_millis(),
            self.latched_starts,
            self.late_starts,
            self.journal_replays,
            s.anomalies.len(),
        )
    }
}

#[test]
fn sigkill_campaign_keeps_every_acknowledged_outcome_and_runs_nothing_twice() {
    let kills = env_u64("TETHER_CRASH_KILLS").unwrap_or(50);
    let seed = env_u64("TETHER_CRASH_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(21)
    });
    eprintln!(
        "SIGKILL campaign: seed {seed} (TETHER_CRASH_SEED), {kills} kills (TETHER_CRASH_KILLS)"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = Campaign {
        state: dir.path().join("state"),
        cfg: write_config(dir.path()),
        seed,
        rng: StdRng::seed_from_u64(seed),
        ledger: Ledger::new(&load::DEVICES),
        startups: Vec::new(),
        startup_kills: 0,
        chain: Chain::default(),
        verify_every: env_u64("TETHER_CRASH_VERIFY_EVERY").unwrap_or(1).max(1),
        verifies: 0,
        verify_max: Duration::ZERO,
        latched_start: false,
        latched_starts: Vec::new(),
        late_starts: Vec::new(),
        journal_replays: 0,
    };
    let t0 = Instant::now();
    let mut s = c.start();
    for cycle in 1..=kills {
        if cycle > 1 && c.rng.gen_bool(0.1) {
            drop(s);
            c.kill_during_startup();
            s = c.start();
            c.check_chain(cycle, cycle % c.verify_every == 0);
            c.check_restart(&s, cycle);
            continue;
        }
        c.load_and_kill(&mut s, cycle);
        // Checked once restarted: an answered commit may be only in the
        // store's journal at the kill (its open transaction held it), and
        // the open applies it before serving (docs/STORE.md).
        s = c.start();
        c.check_chain(cycle, cycle % c.verify_every == 0);
        c.check_restart(&s, cycle);
        if cycle % 10 == 0 {
            eprintln!("{}", c.report(cycle, t0.elapsed()));
        }
    }
    let stopped = s.terminate();
    assert!(stopped.is_some(), "the endpoint did not stop on SIGTERM");
    c.check_chain(kills, true);
    let report = c.report(kills, t0.elapsed());
    eprintln!("{report}");
    assert!(
        c.ledger.stats.anomalies.is_empty(),
        "{report}\nanomalies: {:?}",
        c.ledger.stats.anomalies
    );
    assert!(
        c.ledger.stats.acked > 0 && c.ledger.stats.replays > 0,
        "the load acknowledged nothing: {report}"
    );
}
