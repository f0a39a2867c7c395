//! The memory bounds of `[limits]` (issue 21 §4) against the real binary:
//! with `idempotency_cache_max = 1` and `rest_finished_max = 1`, a command
//! id evicted from memory is still replayed from the store — the same
//! receipt, nothing run again (the device's revision does not move) — and
//! another input under it is still refused, before and after a restart; a
//! REST invocation evicted from memory still answers its result. A bound of
//! 0 is a config defect naming its key.
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
use std::path::Path;
use std::time::{Duration, Instant};

fn config(dir: &Path, limits: &str) -> std::path::PathBuf {
    let path = dir.join("tether.toml");
    std::fs::write(&path, format!("builtin_cell = true\n\n[limits]\n{limits}")).expect("config");
    path
}

fn setpoint(sid: &str, cid: &str, t: f64) -> Value {
    json!({"session_id": sid, "device_id": "thermostat-1", "capability_id": "cap.thermal.setpoint.v1", "input": {"target_temperature": t}, "command_id": cid})
}

fn rest(s: &Server, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let b = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let r = http_request(s.addr(), method, path, b.as_bytes(), TIMEOUT, "");
    (r.status, r.json())
}

/// Invokes the thermostat's setpoint tool and polls it to its result.
fn invoke(s: &Server, cid: &str, t: f64) -> (String, Value) {
    let body = json!({"input": {"target_temperature": t}, "command_id": cid});
    let (status, v) = rest(s, "POST", "/tools/thermostat-1__setpoint:invoke", &body);
    assert_eq!(status, 202, "{v}");
    let inv = v["data"]["invocation_id"]
        .as_str()
        .expect("invocation_id")
        .to_owned();
    (inv.clone(), result(s, &inv))
}

fn result(s: &Server, inv: &str) -> Value {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let (status, v) = rest(
            s,
            "GET",
            &format!("/invocations/{inv}/result"),
            &Value::Null,
        );
        if status == 200 {
            return v["data"].clone();
        }
        assert_eq!(status, 202, "{v}");
        assert!(Instant::now() < deadline, "{inv} still pending");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Replays `cid` (evicted from memory) and checks it answers `receipt_id`
/// without running again, and that another input under it is refused.
fn replay_from_store(s: &Server, cid: &str, t: f64, receipt_id: &Value) {
    let sid = s.session();
    let before = s.revision(&sid, "thermostat-1", "main");
    let again = s.command(setpoint(&sid, cid, t));
    assert_eq!(again["receipt_id"], *receipt_id, "{again}");
    assert_eq!(again["status"], "completed", "{again}");
    assert_eq!(
        s.revision(&sid, "thermostat-1", "main"),
        before,
        "the replay ran the command again"
    );
    let other = s.command(setpoint(&sid, cid, t + 1.0));
    assert_rejected(&other, "MHS.CONFLICT.COMMAND_ID_REUSE");
    assert_eq!(s.revision(&sid, "thermostat-1", "main"), before);
}

#[test]
fn an_id_beyond_the_memory_bound_is_replayed_from_the_store_never_run_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(
        dir.path(),
        "idempotency_cache_max = 1\nrest_finished_max = 1\n",
    );
    let s = start_with_config(dir.path(), &cfg);
    let sid = s.session();
    let first = s.command(setpoint(&sid, "bound-a", 30.0));
    assert_eq!(first["status"], "completed", "{first}");
    // Two more ids: `bound-a` is no longer in memory.
    for (i, cid) in ["bound-b", "bound-c"].iter().enumerate() {
        let r = s.command(setpoint(&sid, cid, 31.0 + i as f64));
        assert_eq!(r["status"], "completed", "{r}");
    }
    replay_from_store(&s, "bound-a", 30.0, &first["receipt_id"]);

    // REST: the first invocation, evicted from the table, still answers.
    let (inv1, r1) = invoke(&s, "bound-rest-1", 40.0);
    assert_eq!(r1["status"], "completed", "{r1}");
    let (_, r2) = invoke(&s, "bound-rest-2", 41.0);
    assert_eq!(r2["status"], "completed", "{r2}");
    let (_, r3) = invoke(&s, "bound-rest-3", 42.0);
    assert_eq!(r3["status"], "completed", "{r3}");
    let old = result(&s, &inv1);
    assert_eq!(
        old["receipt"]["receipt_id"], r1["receipt"]["receipt_id"],
        "{old}"
    );
    let (_, replayed) = invoke(&s, "bound-rest-1", 40.0);
    assert_eq!(
        replayed["receipt"]["receipt_id"], r1["receipt"]["receipt_id"],
        "{replayed}"
    );

    // After a restart (the index warmed with one id only) the same holds.
    let mut s = s;
    assert!(s.terminate().is_some());
    drop(s);
    let s = start_with_config(dir.path(), &cfg);
    replay_from_store(&s, "bound-a", 30.0, &first["receipt_id"]);
    let old = result(&s, &inv1);
    assert_eq!(
        old["receipt"]["receipt_id"], r1["receipt"]["receipt_id"],
        "{old}"
    );
}

#[test]
fn a_memory_bound_of_zero_is_a_config_defect_naming_its_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    for key in ["idempotency_cache_max", "rest_finished_max"] {
        let cfg = config(dir.path(), &format!("{key} = 0\n"));
        let run = tether(&[OsStr::new("check"), cfg.as_os_str()]);
        assert_ne!(run.code, Some(0), "{}", run.stderr);
        assert!(
            run.stderr.contains(&format!("limits.{key}")),
            "{}",
            run.stderr
        );
    }
}
