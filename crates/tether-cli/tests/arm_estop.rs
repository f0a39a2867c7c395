//! The arm: per-joint envelope, type refusals, and an e-stop that cancels a
//! running motion, latches, blocks effects but not reads, and is released
//! by a reset that resumes nothing.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

use common::{assert_rejected, poll_until, Received, Server, TIMEOUT};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const ARM: &str = "arm-1";
const MOVE: &str = "cap.motion.move_to.v1";
/// Sanity ceiling for an e-stop answer (not a performance assertion).
const ESTOP_CEILING: Duration = Duration::from_secs(2);

fn move_to(sid: &str, joints: Value, speed: Value) -> Value {
    json!({"session_id": sid, "device_id": ARM, "capability_id": MOVE, "input": {"joints": joints, "speed": speed}})
}

/// A motion of 1 rad at 0.5 rad/s: about 2 s of real time.
fn long_move(sid: &str) -> Value {
    move_to(sid, json!([1.0, 0, 0, 0, 0, 0]), json!(0.5))
}

fn positions(s: &Server, sid: &str) -> Vec<f64> {
    let r = s.read(sid, ARM, "joints");
    r["state"]["positions"]
        .as_array()
        .expect("positions")
        .iter()
        .map(|v| v.as_f64().expect("number"))
        .collect()
}

#[test]
fn arm_joint_out_of_bounds_names_the_element_and_wrong_types_are_refused() {
    let s = Server::http();
    let sid = s.session();

    let r = s.command(move_to(&sid, json!([0, 0, 0, 0, 0, 9]), json!(1.0)));
    let d = assert_rejected(&r, "MHS.SAFETY.ENVELOPE_VIOLATION");
    assert_eq!(d["path"], "joints[5]", "details: {d}");
    assert_eq!(d["element_name"], "wrist_3", "details: {d}");
    assert_eq!(d["kind"], "max", "details: {d}");
    assert_eq!(d["bound"].as_f64(), Some(3.1), "details: {d}");
    assert_eq!(d["value"].as_f64(), Some(9.0), "details: {d}");
    assert_eq!(d["unit"], "rad", "details: {d}");
    assert_eq!(d["source"], "binding", "details: {d}");

    // Every element is checked, not only the first offender.
    let r = s.command(move_to(&sid, json!([0, -2.5, 0, 0, 0, 9]), json!(1.0)));
    let d = assert_rejected(&r, "MHS.SAFETY.ENVELOPE_VIOLATION");
    let paths: Vec<&str> = d["violations"]
        .as_array()
        .expect("violations")
        .iter()
        .filter_map(|v| v["path"].as_str())
        .collect();
    assert!(
        paths.contains(&"joints[1]") && paths.contains(&"joints[5]"),
        "violations: {d}"
    );

    // A string never passes a numeric bound (refused at the structure step).
    let r = s.command(move_to(&sid, json!([0, 0, "0.1", 0, 0, 0]), json!(1.0)));
    let d = assert_rejected(&r, "MHS.CAPABILITY.INPUT_INVALID");
    assert_eq!(d["errors"][0]["path"], "/joints/2", "details: {d}");

    // Nor does a boolean.
    let r = s.command(move_to(&sid, json!([0, 0, 0, 0, 0, 0]), json!(true)));
    let d = assert_rejected(&r, "MHS.CAPABILITY.INPUT_INVALID");
    assert_eq!(d["errors"][0]["path"], "/speed", "details: {d}");

    // Speed over its limit, in rad/s.
    let r = s.command(move_to(&sid, json!([0, 0, 0, 0, 0, 0.1]), json!(2.0)));
    let d = assert_rejected(&r, "MHS.SAFETY.ENVELOPE_VIOLATION");
    assert_eq!(d["path"], "speed", "details: {d}");
    assert_eq!(d["unit"], "rad/s", "details: {d}");

    assert_eq!(
        s.revision(&sid, ARM, "joints"),
        0,
        "no refusal moved the arm"
    );
    assert_eq!(positions(&s, &sid), vec![0.0; 6]);
}

/// After the e-stop: effects refused, reads served, status latched, reset
/// releases once and refuses a second time, and motion works again.
fn after_estop(s: &Server, sid: &str) {
    let rev = s.revision(sid, ARM, "joints");
    let r = s.command(move_to(sid, json!([0, 0, 0, 0, 0, 0.1]), json!(1.0)));
    let d = assert_rejected(&r, "MHS.SAFETY.ESTOP_ENGAGED");
    assert_eq!(d["device_id"], ARM, "details: {d}");
    let r = s.command(json!({"session_id": sid, "device_id": ARM, "capability_id": "cap.motion.park.v1", "input": {}}));
    assert_rejected(&r, "MHS.SAFETY.ESTOP_ENGAGED");

    // Reads still work, and the refusals moved nothing.
    let read = s.read(sid, ARM, "joints");
    assert_eq!(read["revision"].as_u64(), Some(rev), "{read}");
    assert_eq!(read["state"]["moving"], false, "{read}");

    let st = s.status_of(ARM);
    assert_eq!(st["latched"], true, "status: {st}");
    // Other devices are not latched by an e-stop of arm-1.
    assert_eq!(s.status_of("thermostat-1")["latched"], false);

    let reset = s.ok(
        "mhs.safety.reset",
        json!({"device_id": ARM, "reason": "e2e"}),
    );
    assert_eq!(reset["status"], "completed", "reset: {reset}");
    assert_eq!(reset["output"]["resumed"], false, "reset: {reset}");
    assert_eq!(reset["output"]["latched"], false, "reset: {reset}");
    assert_eq!(s.status_of(ARM)["latched"], false);

    let again = s.ok("mhs.safety.reset", json!({"device_id": ARM}));
    let d = assert_rejected(&again, "MHS.SAFETY.RESET_REFUSED");
    assert_eq!(d["reason"], "not_latched", "details: {d}");

    // A reset resumes nothing, but new commands are admitted again.
    let before = positions(s, sid);
    let mut target = before.clone();
    target[5] += 0.05;
    let ok = s.command(move_to(sid, json!(target), json!(1.0)));
    assert_eq!(ok["status"], "completed", "{ok}");
    assert_eq!(ok["state_revision_after"].as_u64(), Some(rev + 1), "{ok}");
}

#[test]
fn estop_during_motion_cancels_it_latches_and_reset_releases_over_http() {
    let s = Server::http();
    let sid = s.session();

    let (motion, estop, estop_elapsed) = std::thread::scope(|scope| {
        let motion = scope.spawn(|| s.command(long_move(&sid)));
        // Wait (bounded) until the motion is running.
        poll_until("the motion to be running", TIMEOUT, || {
            s.status_of(ARM)["running_operations"]
                .as_array()
                .is_some_and(|ops| !ops.is_empty())
                || motion.is_finished()
        });
        assert!(
            !motion.is_finished(),
            "the motion ended before the e-stop could be sent"
        );
        let t0 = Instant::now();
        let estop = s.ok(
            "mhs.safety.estop",
            json!({"device_id": ARM, "reason": "e2e stop"}),
        );
        let elapsed = t0.elapsed();
        (motion.join().expect("motion thread"), estop, elapsed)
    });

    assert_estop_cut_the_motion_short(&s, &sid, &estop, &motion, estop_elapsed);
}

/// Starts the long motion over stdio, waits until it runs, sends the e-stop;
/// answers (e-stop answer, motion answer, time from sending the e-stop to its answer).
fn stdio_estop_during_motion(s: &Server, sid: &str) -> (Received, Received, Duration) {
    let c = s.stdio_client();
    let motion_id = json!(format!("motion-{}", s.fresh_id()));
    c.send(&motion_id, "mhs.command", long_move(sid));
    poll_until("the motion to be running", TIMEOUT, || {
        s.status_of(ARM)["running_operations"]
            .as_array()
            .is_some_and(|ops| !ops.is_empty())
    });
    let estop_id = json!(format!("estop-{}", s.fresh_id()));
    let t0 = Instant::now();
    c.send(
        &estop_id,
        "mhs.safety.estop",
        json!({"device_id": ARM, "reason": "e2e stop"}),
    );
    let estop = c.wait_id(&estop_id, TIMEOUT);
    let elapsed = t0.elapsed();
    let motion = c.wait_id(&motion_id, TIMEOUT);
    (estop, motion, elapsed)
}

#[test]
fn estop_during_motion_cancels_it_latches_and_reset_releases_over_stdio() {
    let s = Server::stdio();
    let sid = s.session();
    let (estop, motion, estop_elapsed) = stdio_estop_during_motion(&s, &sid);

    // Served while the motion was in flight, not queued behind it: the
    // motion alone would have run about 2 s.
    assert_estop_cut_the_motion_short(
        &s,
        &sid,
        &estop.value["result"],
        &motion.value["result"],
        estop_elapsed,
    );
}

/// The e-stop answered in time, latched, named the motion's operation as
/// cancelled; the motion ended cancelled, cut short, with the arm part-way;
/// afterwards effects are refused and reads still work.
fn assert_estop_cut_the_motion_short(
    s: &Server,
    sid: &str,
    estop: &Value,
    motion: &Value,
    estop_elapsed: Duration,
) {
    assert!(
        estop_elapsed < ESTOP_CEILING,
        "e-stop took {estop_elapsed:?}"
    );
    assert_eq!(estop["status"], "completed", "e-stop: {estop}");
    assert_eq!(estop["output"]["latched"], true, "e-stop: {estop}");
    let cancelled = estop["cancelled_operations"]
        .as_array()
        .expect("cancelled_operations");
    assert!(!cancelled.is_empty(), "e-stop: {estop}");
    assert_eq!(motion["status"], "cancelled", "motion: {motion}");
    assert_eq!(
        motion["error"]["mhs_code"], "MHS.OUTCOME.CANCELLED",
        "motion: {motion}"
    );
    assert!(
        cancelled.contains(&motion["operation_id"]),
        "the e-stop names the motion's operation: {estop} / {motion}"
    );
    let ran_ms = motion["completed_at_ms"]
        .as_u64()
        .unwrap_or(u64::MAX)
        .saturating_sub(motion["accepted_at_ms"].as_u64().unwrap_or(0));
    assert!(
        ran_ms < 1900,
        "the motion ran {ran_ms} ms: it was not cut short"
    );
    // The arm stopped partway.
    let p = positions(s, sid);
    assert!(
        p[0] < 1.0 - 1e-6,
        "the arm reached the target despite the e-stop: {p:?}"
    );
    after_estop(s, sid);
}

/// An endpoint serving the built-in arm with `from` replaced by `to` in its
/// manifest (the state directory lives as long as the returned `TempDir`).
fn serve_arm_with(from: &str, to: &str) -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = include_str!("../../tether-drivers/cell/arm-1.toml");
    assert!(
        manifest.contains(from),
        "arm-1.toml changed; update the test"
    );
    std::fs::write(dir.path().join("arm.toml"), manifest.replace(from, to)).expect("manifest");
    let cfg = dir.path().join("tether.toml");
    std::fs::write(&cfg, "devices = [\"arm.toml\"]\n").expect("config");
    let s = Server::start_with(
        common::Transport::Http,
        Some(&dir.path().join("state")),
        &[std::ffi::OsStr::new("--config"), cfg.as_os_str()],
    );
    (dir, s)
}

/// Without a native stop, a bound `cap.motion.estop.v1` is the stop path
/// (OpenMHS CORE-074): the e-stop dispatches it, and a motion in flight halts.
#[test]
fn a_bound_estop_class_is_the_stop_path_of_a_device_without_a_native_stop() {
    let (_dir, s) = serve_arm_with("native = true", "native = false");
    let r = s.ok(
        "mhs.safety.estop",
        json!({"device_id": ARM, "reason": "bound stop"}),
    );
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["output"]["estop"], "native", "{r}");
    assert_eq!(r["safe_state_achieved"], true, "{r}");
}

/// A time-bounded binding runs no longer than its `max_duration_ms`,
/// whatever deadline the caller gave: the motion is cancelled and says why.
#[test]
fn a_motion_runs_no_longer_than_its_bindings_max_duration() {
    let (_dir, s) = serve_arm_with("max_duration_ms = 120000", "max_duration_ms = 300");
    let sid = s.session();
    let t0 = Instant::now();
    // 1 rad at 0.1 rad/s would take 10 s.
    let r = s.command(move_to(&sid, json!([1.0, 0, 0, 0, 0, 0]), json!(0.1)));
    let took = t0.elapsed();
    assert_eq!(r["status"], "failed", "{r}");
    assert_eq!(r["error"]["mhs_code"], "MHS.OUTCOME.TIMEOUT", "{r}");
    assert_eq!(
        r["error"]["details"]["reason"], "max_duration_exceeded",
        "{r}"
    );
    assert!(took < Duration::from_secs(3), "took {took:?}");
}
