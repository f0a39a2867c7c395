//! `mhs.operations.get` and `mhs.operations.cancel` on a running motion.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

use common::*;
use serde_json::json;
use std::time::Duration;

#[test]
fn cancel_is_delivered_to_a_running_motion_and_get_reports_how_it_ended() {
    let s = Server::http();
    let sid = s.session();
    let (motion, op_id, cancel) = std::thread::scope(|scope| {
        let motion = scope.spawn(|| {
            s.command(json!({"session_id": sid, "device_id": "arm-1", "capability_id": "cap.motion.move_to.v1", "input": {"joints": [1.0, 0, 0, 0, 0, 0], "speed": 0.5}}))
        });
        let mut op_id = String::new();
        poll_until("the motion to be running", Duration::from_secs(5), || {
            if let Some(op) = s.status_of("arm-1")["running_operations"]
                .as_array()
                .and_then(|o| o.first())
            {
                op_id = op["operation_id"].as_str().unwrap_or_default().to_owned();
            }
            !op_id.is_empty() || motion.is_finished()
        });
        let running = s.ok("mhs.operations.get", json!({"operation_id": op_id}));
        assert_eq!(running["state"], "running", "{running}");
        let cancel = s.ok("mhs.operations.cancel", json!({"operation_id": op_id}));
        (motion.join().expect("motion"), op_id, cancel)
    });
    assert_eq!(cancel["cancel_delivered"], true, "{cancel}");
    assert_eq!(motion["status"], "cancelled", "{motion}");
    assert_eq!(motion["operation_id"], op_id.as_str());
    let after = s.ok("mhs.operations.get", json!({"operation_id": op_id}));
    assert_eq!(after["state"], "finished");
    assert_eq!(after["status"], "cancelled");
    let again = s.ok("mhs.operations.cancel", json!({"operation_id": op_id}));
    assert_eq!(again["cancel_delivered"], false);
    let unknown = s.err("mhs.operations.get", json!({"operation_id": "op_nope"}));
    assert_rpc_error(&unknown, "MHS.OPERATION.UNKNOWN");
    // Cancelling is not a latch: the arm still takes commands.
    assert_eq!(s.status_of("arm-1")["latched"], false);
}
