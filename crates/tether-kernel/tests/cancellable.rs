//! A caller-held cancellation token (`Kernel::command_cancellable`): cancelled
//! before dispatch refuses the command with nothing dispatched; a stop-class
//! command never runs on it.

mod common;

use serde_json::{json, Value};
use tether_kernel::{CancelToken, CommandRequest, Kernel, Principal, SessionOpen};

async fn session(k: &Kernel, p: &Principal) -> String {
    k.session_open(p, SessionOpen::default())
        .await
        .expect("open")["session_id"]
        .as_str()
        .expect("sid")
        .to_owned()
}

fn request(sid: &str, capability_id: &str, input: Value) -> CommandRequest {
    CommandRequest {
        session_id: Some(sid.into()),
        device_id: "arm-1".into(),
        capability_id: capability_id.into(),
        resource: None,
        input,
        command_id: None,
        deadline: None,
        expected_revision: None,
        safe_place_grant: None,
        permit_id: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_cancelled_before_dispatch_is_refused_and_moves_nothing() {
    let k = common::builtin_kernel();
    let p = Principal::local_agent();
    let sid = session(&k, &p).await;
    let cancel = CancelToken::new();
    cancel.cancel();
    let move_to = request(
        &sid,
        "cap.motion.move_to.v1",
        json!({"joints": [1.0, 0, 0, 0, 0, 0], "speed": 0.5}),
    );
    let r = k
        .command_cancellable(&p, move_to, cancel)
        .await
        .expect("receipt");
    assert_eq!(r["status"], "rejected", "{r}");
    assert_eq!(r["error"]["mhs_code"], "MHS.OUTCOME.CANCELLED", "{r}");
    assert_eq!(r["error"]["details"]["reason"], "cancelled_before_dispatch");
    assert!(r["operation_id"].is_null(), "nothing dispatched: {r}");
    assert_eq!(r["state_revision_before"], r["state_revision_after"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_class_command_ignores_a_cancelled_token() {
    let k = common::builtin_kernel();
    let p = Principal::local_agent();
    let sid = session(&k, &p).await;
    let cancel = CancelToken::new();
    cancel.cancel();
    let r = k
        .command_cancellable(&p, request(&sid, "cap.motion.stop.v1", json!({})), cancel)
        .await
        .expect("receipt");
    assert_eq!(r["status"], "completed", "{r}");
}
