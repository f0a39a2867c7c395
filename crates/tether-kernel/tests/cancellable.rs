//! A caller-held cancellation token (`Kernel::command_cancellable`): cancelled
//! before dispatch refuses the command with nothing dispatched; a stop-class
//! command never runs on it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

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
        route: tether_kernel::Route::Command,
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
        .command(
            &p,
            move_to,
            tether_kernel::CommandOptions::cancellable(cancel),
        )
        .await
        .map(tether_kernel::Answer::into_value)
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
        .command(
            &p,
            request(&sid, "cap.motion.stop.v1", json!({})),
            tether_kernel::CommandOptions::cancellable(cancel),
        )
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt");
    assert_eq!(r["status"], "completed", "{r}");
}

/// `command_answer` fires its admission signal for a command that passed steps 2-11
/// (before its outcome is known) and drops it for one they refuse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admission_signal_fires_for_an_admitted_command_only() {
    let k = common::builtin_kernel();
    let p = Principal::local_agent();
    let sid = session(&k, &p).await;

    // Admitted: a real motion (0.4 rad at 1 rad/s), so the signal arrives
    // while the command is still running.
    let (tx, rx) = tokio::sync::oneshot::channel();
    let motion = request(
        &sid,
        "cap.motion.move_to.v1",
        json!({"joints": [0.4, 0, 0, 0, 0, 0], "speed": 1.0}),
    );
    let (k2, p2) = (k.clone(), p.clone());
    let run = tokio::spawn(async move {
        let options = tether_kernel::CommandOptions {
            cancel: CancelToken::new(),
            on_admit: Some(tx),
            rider: None,
        };
        k2.command(&p2, motion, options).await
    });
    rx.await.expect("an admitted command signals");
    assert!(!run.is_finished(), "signalled before the motion ended");
    let r = run.await.expect("joined").expect("receipt").into_value();
    assert_eq!(r["status"], "completed", "{r}");

    // Refused by the limits step: the signal is dropped unfired, and the
    // answer is the rejected receipt.
    let (tx, rx) = tokio::sync::oneshot::channel();
    let too_far = request(
        &sid,
        "cap.motion.move_to.v1",
        json!({"joints": [99.0, 0, 0, 0, 0, 0], "speed": 1.0}),
    );
    let r = k
        .command(
            &p,
            too_far,
            tether_kernel::CommandOptions {
                cancel: CancelToken::new(),
                on_admit: Some(tx),
                rider: None,
            },
        )
        .await
        .expect("receipt")
        .into_value();
    assert!(rx.await.is_err(), "a refused command never signals");
    assert_eq!(r["status"], "rejected", "{r}");
    assert_eq!(
        r["error"]["mhs_code"], "MHS.SAFETY.ENVELOPE_VIOLATION",
        "{r}"
    );
}
