//! Session expiry and close end the session's running operations.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

use serde_json::json;
use std::time::{Duration, Instant};
use tether_kernel::{CommandRequest, Kernel, Principal, SessionOpen};

fn kernel() -> Kernel {
    common::builtin_kernel()
}

fn long_move(sid: &str) -> CommandRequest {
    CommandRequest {
        route: tether_kernel::Route::Command,
        session_id: Some(sid.into()),
        device_id: "arm-1".into(),
        capability_id: "cap.motion.move_to.v1".into(),
        resource: None,
        input: json!({"joints": [1.0, 0, 0, 0, 0, 0], "speed": 0.5}),
        command_id: None,
        deadline: None,
        expected_revision: None,
        safe_place_grant: None,
        permit_id: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_session_cancels_its_running_motion_and_later_use_is_expired() {
    let k = kernel();
    let _reaper = k.start_session_reaper(&tokio::runtime::Handle::current());
    let p = Principal::local_agent();
    let sid = k
        .session_open(
            &p,
            SessionOpen {
                ttl_ms: Some(300),
                ..SessionOpen::default()
            },
        )
        .await
        .expect("session")["session_id"]
        .as_str()
        .expect("sid")
        .to_owned();
    let t0 = Instant::now();
    let r = k
        .command(&p, long_move(&sid), tether_kernel::CommandOptions::plain())
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt");
    assert_eq!(r["status"], "cancelled", "{r}");
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "cancelled at expiry, not at the end of the 2 s motion: {:?}",
        t0.elapsed()
    );
    let later = k.session_heartbeat(&p, &sid).expect_err("expired");
    assert_eq!(later.code.as_str(), "MHS.SESSION.EXPIRED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_session_cancels_its_running_motion() {
    let k = kernel();
    let p = Principal::local_agent();
    let sid = k
        .session_open(&p, SessionOpen::default())
        .await
        .expect("session")["session_id"]
        .as_str()
        .expect("sid")
        .to_owned();
    let k2 = k.clone();
    let (p2, sid2) = (p.clone(), sid.clone());
    let motion = tokio::spawn(async move {
        k2.command(
            &p2,
            long_move(&sid2),
            tether_kernel::CommandOptions::plain(),
        )
        .await
        .map(tether_kernel::Answer::into_value)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let closed = k.session_close(&p, &sid).await.expect("close");
    assert_eq!(
        closed["cancelled_operations"].as_array().map(Vec::len),
        Some(1),
        "{closed}"
    );
    let r = motion.await.expect("join").expect("receipt");
    assert_eq!(r["status"], "cancelled", "{r}");
    let again = k
        .command(&p, long_move(&sid), tether_kernel::CommandOptions::plain())
        .await
        .map(tether_kernel::Answer::into_value)
        .expect_err("closed session");
    assert_eq!(again.code.as_str(), "MHS.SESSION.EXPIRED");
}

#[tokio::test]
async fn one_principal_never_takes_every_session() {
    use std::sync::Arc;
    use tether_kernel::{KernelConfig, PrincipalKind};
    let cell = tether_kernel::loader::load(&tether_drivers::builtin_cell(), None).expect("cell");
    let drivers =
        tether_drivers::build_all(cell.devices.iter().map(|d| &d.manifest)).expect("drivers");
    let config = KernelConfig {
        sessions_max: 30,
        ..KernelConfig::standard("t")
    };
    let k = Kernel::new(
        config,
        cell,
        drivers,
        Arc::new(tether_store::MemoryStore::new()),
    )
    .expect("kernel");
    let agent = Principal::local_agent();
    // A tenth of the table each: 3 of 30.
    for _ in 0..3 {
        k.session_open(&agent, SessionOpen::default())
            .await
            .expect("within the share");
    }
    let refused = k
        .session_open(&agent, SessionOpen::default())
        .await
        .expect_err("over the share");
    assert_eq!(refused.code.as_str(), "MHS.SESSION.LIMIT");
    assert_eq!(refused.details["reason"], "principal_sessions_full");
    let operator = Principal {
        id: "alice".into(),
        kind: PrincipalKind::Human,
        operator: true,
    };
    k.session_open(&operator, SessionOpen::default())
        .await
        .expect("another principal still opens one");
}
