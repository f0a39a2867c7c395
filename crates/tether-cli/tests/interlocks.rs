//! The simulated door interlock of arm-1, set through the simulator control
//! (`tether sim door`), never through a model-reachable method.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

use common::*;
use serde_json::{json, Value};
use std::time::Duration;

const ARM: &str = "arm-1";

fn door(s: &Server, state: &str) {
    let run = tether(&[
        "sim".as_ref(),
        "door".as_ref(),
        state.as_ref(),
        "--state-dir".as_ref(),
        s.state_dir().as_os_str(),
    ]);
    assert_eq!(run.code, Some(0), "tether sim door {state}: {}", run.stderr);
}

fn move_to(sid: &str, x: f64) -> Value {
    json!({"session_id": sid, "device_id": ARM, "capability_id": "cap.motion.move_to.v1", "input": {"joints": [x, 0, 0, 0, 0, 0], "speed": 0.5}})
}

fn door_state(s: &Server) -> Value {
    let st = s.status_of(ARM);
    st["interlocks"]
        .as_array()
        .and_then(|a| a.iter().find(|i| i["id"] == "door").cloned())
        .unwrap_or(Value::Null)
}

#[test]
fn an_open_door_refuses_motion_and_is_reported_by_status() {
    let s = Server::http();
    let sid = s.session();
    assert_eq!(door_state(&s)["state"], "closed");
    door(&s, "open");
    assert_eq!(door_state(&s)["state"], "open");
    assert_eq!(door_state(&s)["gating"], true);
    let rev = s.revision(&sid, ARM, "joints");
    let r = s.command(move_to(&sid, 0.1));
    let details = assert_rejected(&r, "MHS.SAFETY.INTERLOCK_OPEN");
    assert_eq!(details["interlocks"][0]["id"], "door", "{r}");
    assert_eq!(
        s.revision(&sid, ARM, "joints"),
        rev,
        "a refusal moves no revision"
    );
    // Stop classes are never gated by the door.
    let stop = s.command(json!({"session_id": sid, "device_id": ARM, "capability_id": "cap.motion.stop.v1", "input": {}}));
    assert_eq!(stop["status"], "completed", "{stop}");
    door(&s, "close");
    assert_eq!(s.command(move_to(&sid, 0.05))["status"], "completed");
}

#[test]
fn a_door_opened_during_a_motion_stops_it() {
    let s = Server::http();
    let sid = s.session();
    let motion = std::thread::scope(|scope| {
        let motion = scope.spawn(|| s.command(move_to(&sid, 1.0)));
        poll_until("the motion to be running", Duration::from_secs(5), || {
            s.status_of(ARM)["running_operations"]
                .as_array()
                .is_some_and(|o| !o.is_empty())
                || motion.is_finished()
        });
        door(&s, "open");
        motion.join().expect("motion thread")
    });
    assert_eq!(motion["status"], "cancelled", "{motion}");
    assert_eq!(
        motion["error"]["mhs_code"], "MHS.SAFETY.INTERLOCK_OPEN",
        "{motion}"
    );
    assert_eq!(
        motion["error"]["details"]["reason"],
        "opened_during_operation"
    );
    let pos = s.read(&sid, ARM, "joints")["state"]["positions"][0]
        .as_f64()
        .expect("position");
    assert!(pos > 0.0 && pos < 1.0, "the arm stopped part-way, at {pos}");
}

#[test]
fn reset_is_refused_while_the_door_is_open_and_accepted_once_closed() {
    let s = Server::http();
    s.ok(
        "mhs.safety.estop",
        json!({"device_id": ARM, "reason": "door test"}),
    );
    door(&s, "open");
    let refused = s.ok("mhs.safety.reset", json!({"device_id": ARM}));
    let details = assert_rejected(&refused, "MHS.SAFETY.RESET_REFUSED");
    assert_eq!(details["reason"], "interlock_open", "{refused}");
    assert_eq!(s.status_of(ARM)["latched"], true);
    door(&s, "close");
    let reset = s.ok("mhs.safety.reset", json!({"device_id": ARM}));
    assert_eq!(reset["status"], "completed", "{reset}");
    assert_eq!(reset["output"]["resumed"], false);
}
