//! Two `tether serve` processes on one state directory share what the store
//! holds: one ledger per budget (drawn from both at once, never exceeded
//! together) and the arming of a hardware device (a disarm made on one
//! owner binds the next).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

use common::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const AGENT: &str = "shared-agent-token";
const ALICE: &str = "shared-alice-token";
/// The budget the overlay gives the thermostat's setpoints: the sum of the
/// target temperatures asked per rolling hour.
const CAP: f64 = 200.0;
/// Each setpoint draws its target temperature.
const DRAW: f64 = 10.0;

fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

/// A config serving `manifest` (written as `device.toml`) with an agent and
/// an operator, plus `extra` lines.
fn write_config(dir: &Path, manifest: &str, extra: &str) -> PathBuf {
    std::fs::write(dir.join("device.toml"), manifest).expect("manifest");
    let text = format!(
        "devices = [\"device.toml\"]\n{extra}\n[[principals]]\nid = \"planner\"\nkind = \"agent\"\ntoken_sha256 = \"{}\"\n\n[[principals]]\nid = \"alice\"\nkind = \"human\"\nroles = [\"operator\"]\ntoken_sha256 = \"{}\"\n",
        sha256_hex(AGENT),
        sha256_hex(ALICE)
    );
    let path = dir.join("tether.toml");
    std::fs::write(&path, text).expect("config");
    path
}

fn session(s: &Server, token: &str) -> String {
    call_with_token(s, token, "mhs.session.open", json!({}))["result"]["session_id"]
        .as_str()
        .expect("session")
        .to_owned()
}

fn setpoint(s: &Server, sid: &str, degc: f64) -> Value {
    let r = call_with_token(
        s,
        AGENT,
        "mhs.command",
        json!({"session_id": sid, "device_id": "thermostat-1", "capability_id": "cap.thermal.setpoint.v1", "input": {"target_temperature": degc}}),
    );
    r["result"].clone()
}

/// Many setpoints from both endpoints at once, on one budget: exactly as
/// many complete as the budget holds, every other one is refused with
/// `CUMULATIVE_LIMIT`, and the store's journal holds no more than the cap.
#[test]
fn two_endpoints_drawing_from_one_budget_at_once_never_exceed_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let overlay = json!({"thermostat-1": {"cap.thermal.setpoint.v1": {"target_temperature": {"max": CAP, "per": "rolling_1h", "unit": "degC", "source": "operator", "reason": "site heating budget"}}}});
    std::fs::write(dir.path().join("site-limits.json"), overlay.to_string()).expect("overlay");
    let cfg = write_config(
        dir.path(),
        include_str!("../../tether-drivers/cell/thermostat-1.toml"),
        "overlay = \"site-limits.json\"",
    );
    let a = Arc::new(start_with_config(dir.path(), &cfg));
    let b = Arc::new(start_with_config(dir.path(), &cfg));

    // Three callers per endpoint, ten setpoints each: 60 asks, 20 fit.
    let callers: Vec<_> = (0..6)
        .map(|i| {
            let s = if i % 2 == 0 { a.clone() } else { b.clone() };
            std::thread::spawn(move || {
                let sid = session(&s, AGENT);
                (0..10)
                    .map(|_| setpoint(&s, &sid, DRAW))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let receipts: Vec<Value> = callers
        .into_iter()
        .flat_map(|h| h.join().expect("caller"))
        .collect();
    let completed = receipts
        .iter()
        .filter(|r| r["status"] == "completed")
        .count();
    for r in receipts.iter().filter(|r| r["status"] != "completed") {
        let d = assert_rejected(r, "MHS.SAFETY.CUMULATIVE_LIMIT");
        assert_eq!(d["limit"], json!(CAP), "{r}");
        assert_eq!(d["requested"], json!(DRAW), "{r}");
        assert_eq!(d["window"], "rolling_1h", "{r}");
        assert_eq!(d["limit_path"], "target_temperature", "{r}");
        let used = d["used"].as_f64().expect("used");
        assert!(used + DRAW > CAP, "refused although it fit: {r}");
    }
    assert_eq!(
        completed, 20,
        "one ledger for both endpoints: {CAP} / {DRAW} setpoints fit"
    );

    // The store's journal, read while both endpoints run.
    let db = rusqlite::Connection::open_with_flags(
        dir.path().join("state").join("tether.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .expect("open the store read-only");
    let (count, sum): (i64, f64) = db
        .query_row(
            "SELECT COUNT(*), COALESCE(SUM(amount), 0.0) FROM budget WHERE released = 0",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("budget rows");
    assert_eq!(count, 20);
    assert!(sum <= CAP, "the journal holds {sum}, over the cap {CAP}");

    // Either endpoint refuses the next draw, even the smallest.
    for s in [&a, &b] {
        let sid = session(s, AGENT);
        assert_rejected(&setpoint(s, &sid, 5.0), "MHS.SAFETY.CUMULATIVE_LIMIT");
    }
}

/// The built-in relay bank as a hardware device.
fn relay_hw() -> String {
    let text = include_str!("../../tether-drivers/cell/relay-1.toml")
        .replace("device_id = \"relay-1\"", "device_id = \"relay-hw\"")
        .replace(
            "kind = \"time_bounded\"\n",
            "kind = \"time_bounded\"\nmax_duration_ms = 2000\n",
        );
    as_hardware(&text)
}

fn switch(s: &Server, channel: u64) -> Value {
    let sid = session(s, AGENT);
    call_with_token(
        s,
        AGENT,
        "mhs.command",
        json!({"session_id": sid, "device_id": "relay-hw", "capability_id": "cap.io.relay.v1", "input": {"channel": channel, "on": true}}),
    )["result"]
        .clone()
}

fn armed(s: &Server) -> bool {
    call_with_token(
        s,
        ALICE,
        "mhs.safety.status",
        json!({"device_id": "relay-hw"}),
    )["result"]["devices"][0]["armed"]
        .as_bool()
        .expect("armed")
}

/// Arming is kept in the store: a disarm made on the device's owner binds
/// the next owner (a physical device has one owner at a time, `fleet.rs`),
/// and an operator's arm there lets its calls run again.
#[test]
fn a_disarm_made_on_one_owner_binds_the_next_and_an_arm_there_releases_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), &relay_hw(), "");
    let mut a = start_with_config(dir.path(), &cfg);
    assert!(armed(&a));
    let off = call_with_token(
        &a,
        AGENT,
        "mhs.safety.disarm",
        json!({"device_id": "relay-hw"}),
    );
    assert_eq!(off["result"]["durable"], true, "{off}");
    let d = assert_rejected(&switch(&a, 2), "MHS.AUTH.HARDWARE_DISABLED");
    assert_eq!(d["reason"], "not_armed");
    let status = a.terminate().expect("exit");
    assert!(status.success(), "{status:?}");

    let b = start_with_config(dir.path(), &cfg);
    assert!(!armed(&b), "the disarm is kept in the store");
    assert_rejected(&switch(&b, 1), "MHS.AUTH.HARDWARE_DISABLED");
    let yes = call_with_token(
        &b,
        ALICE,
        "mhs.safety.arm",
        json!({"device_id": "relay-hw", "reason": "shift start"}),
    );
    assert_eq!(yes["result"]["durable"], true, "{yes}");
    let r = switch(&b, 1);
    assert_eq!(r["status"], "completed", "{r}");
}
