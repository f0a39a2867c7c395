//! A fleet on PostgreSQL, as separate processes (the same store from hosts
//! in network namespaces is `netns_fleet.rs`): a second owner of a
//! hardware device is refused naming the owner and `tether fleet status
//! --store` shows who owns what; a hold asked on one endpoint is approved
//! by operators on another and the retry runs once; a `command_id` run on
//! one endpoint is replayed on another. The approval visibility lag over
//! `TETHER_FLEET_HOLDS` holds (CI: 10) is printed for docs/PERFORMANCE.md.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;
#[path = "../../tether-store/tests/common/pg.rs"]
mod pg;

use common::{assert_rejected, call_with_token, tether, Server, Transport};
use serde_json::{json, Value};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const AGENT: &str = "pgfleet-agent-token";
const ALICE: &str = "pgfleet-alice-token";
const BOB: &str = "pgfleet-bob-token";

/// Setpoints above 60 degC wait for two operators; the rest of the
/// simulated cell is allowed.
const HOLD_POLICY: &str = r#"
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

fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

fn principal(id: &str, kind: &str, roles: &str, token: &str) -> String {
    format!(
        "[[principals]]\nid = \"{id}\"\nkind = \"{kind}\"\nroles = [{roles}]\ntoken_sha256 = \"{}\"\n\n",
        sha256_hex(token)
    )
}

/// `tether.toml` serving `devices` (the built-in cell when empty) under the
/// hold policy, on the store `url`.
fn write_config(dir: &Path, url: &str, devices: &str) -> PathBuf {
    std::fs::create_dir_all(dir).expect("dir");
    std::fs::write(dir.join("policy.cedar"), HOLD_POLICY).expect("policy");
    let cell = if devices.is_empty() {
        "builtin_cell = true\n".to_owned()
    } else {
        format!("devices = [{devices}]\n")
    };
    let mut text = format!("{cell}policy = \"policy.cedar\"\nstore = \"{url}\"\n");
    text.push_str(&principal("planner", "agent", "", AGENT));
    text.push_str(&principal("alice", "human", "\"operator\"", ALICE));
    text.push_str(&principal("bob", "human", "\"operator\"", BOB));
    let path = dir.join("tether.toml");
    std::fs::write(&path, text).expect("config");
    path
}

fn serve(dir: &Path, cfg: &Path) -> Server {
    Server::start_with(
        Transport::Http,
        Some(&dir.join("state")),
        &[OsStr::new("--config"), cfg.as_os_str()],
    )
}

fn ok(s: &Server, token: &str, method: &str, params: Value) -> Value {
    let a = call_with_token(s, token, method, params.clone());
    assert!(a.get("error").is_none(), "{method} {params}: {a}");
    a["result"].clone()
}

fn session(s: &Server) -> String {
    ok(s, AGENT, "mhs.session.open", json!({}))["session_id"]
        .as_str()
        .expect("session")
        .to_owned()
}

fn setpoint(s: &Server, sid: &str, id: &str, t: f64) -> Value {
    ok(
        s,
        AGENT,
        "mhs.command",
        json!({"session_id": sid, "device_id": "thermostat-1", "capability_id": "cap.thermal.setpoint.v1", "input": {"target_temperature": t}, "command_id": id}),
    )
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[test]
fn on_postgres_one_owner_per_device_and_ids_and_approvals_are_the_fleets() {
    let url = pg::migrated_database("pg_fleet");
    let dir = tempfile::tempdir().expect("tempdir");

    // Host A: the simulated cell and a hardware relay it owns.
    let relay = common::as_hardware(include_str!("../../tether-drivers/cell/relay-1.toml"))
        .replace("device_id = \"relay-1\"", "device_id = \"relay-hw\"")
        .replace(
            "kind = \"time_bounded\"\n",
            "kind = \"time_bounded\"\nmax_duration_ms = 2000\n",
        );
    let a_dir = dir.path().join("a");
    std::fs::create_dir_all(&a_dir).expect("dir");
    std::fs::write(a_dir.join("relay-hw.toml"), &relay).expect("relay");
    let a_cfg = write_config(&a_dir, &url, "");
    let mut text = std::fs::read_to_string(&a_cfg).expect("cfg");
    text = text.replace(
        "builtin_cell = true\n",
        "builtin_cell = true\ndevices = [\"relay-hw.toml\"]\n",
    );
    std::fs::write(&a_cfg, text).expect("cfg");
    let a = serve(&a_dir, &a_cfg);

    // Host B: the simulated cell only; a third with the relay is refused.
    let b_dir = dir.path().join("b");
    let b_cfg = write_config(&b_dir, &url, "");
    let b = serve(&b_dir, &b_cfg);
    let refused = tether(&[
        OsStr::new("serve"),
        OsStr::new("--config"),
        a_cfg.as_os_str(),
        OsStr::new("--state-dir"),
        dir.path().join("c").as_os_str(),
        OsStr::new("--http"),
        OsStr::new("127.0.0.1:0"),
    ]);
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("`relay-hw` is owned by"),
        "{}",
        refused.stderr
    );
    assert!(
        refused.stderr.contains(&format!("pid {}", a.pid())),
        "{}",
        refused.stderr
    );

    // The fleet as the database holds it.
    let status = tether(&["fleet", "status", "--json", "--store", &url]);
    assert_eq!(status.code, Some(0), "{}", status.stderr);
    let doc: Value = serde_json::from_str(&status.stdout_text()).expect("json");
    let live: Vec<&Value> = doc["endpoints"]
        .as_array()
        .expect("endpoints")
        .iter()
        .filter(|e| e["live"] == true)
        .collect();
    assert_eq!(live.len(), 2, "{doc}");
    assert_eq!(doc["device_owners"][0]["device_id"], "relay-hw", "{doc}");

    // A command id run on A is replayed on B, never run again.
    let (sa, sb) = (session(&a), session(&b));
    let first = setpoint(&a, &sa, "pgfleet-once-1", 30.0);
    assert_eq!(first["status"], "completed", "{first}");
    let again = setpoint(&b, &sb, "pgfleet-once-1", 30.0);
    assert_eq!(again["replayed"], true, "{again}");
    assert_eq!(again["receipt_id"], first["receipt_id"], "{again}");

    // Holds asked on A, decided by two operators on B; the retry runs once.
    let holds: usize = std::env::var("TETHER_FLEET_HOLDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let mut lags = Vec::new();
    for n in 0..holds {
        let id = format!("pgfleet-hot-{n}");
        let held = setpoint(&a, &sa, &id, 70.0);
        let d = assert_rejected(&held, "MHS.POLICY.HELD");
        let approval = d["approval_id"].as_str().expect("approval").to_owned();
        let t0 = Instant::now();
        loop {
            let got = call_with_token(
                &b,
                ALICE,
                "mhs.approvals.get",
                json!({"approval_id": approval}),
            );
            if got.get("result").is_some() {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "never seen on B: {got}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        lags.push(t0.elapsed());
        for token in [ALICE, BOB] {
            ok(
                &b,
                token,
                "mhs.approvals.decide",
                json!({"approval_id": approval, "decision": "approve", "reason": "fleet test"}),
            );
        }
        let mut done = Value::Null;
        let t1 = Instant::now();
        while t1.elapsed() < Duration::from_secs(10) {
            done = setpoint(&a, &sa, &id, 70.0);
            if done["status"] == "completed" {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(done["status"], "completed", "{done}");
        // Once: the same id again is its replay.
        let replay = setpoint(&b, &sb, &id, 70.0);
        assert_eq!(replay["replayed"], true, "{replay}");
        assert_eq!(replay["receipt_id"], done["receipt_id"], "{replay}");
    }
    lags.sort_unstable();
    eprintln!(
        "approval visibility lag on PostgreSQL over {} holds: p50 {:?}, p99 {:?}, max {:?}",
        lags.len(),
        percentile(&lags, 0.5),
        percentile(&lags, 0.99),
        lags[lags.len() - 1]
    );
    let verify = tether(&["audit", "verify", "--store", &url]);
    assert_eq!(verify.code, Some(0), "{}", verify.stderr);
}
