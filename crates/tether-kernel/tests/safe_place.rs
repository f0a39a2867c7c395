//! Single-use safe-place grants: an operator lets one exact park run while
//! the arm is latched.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

use serde_json::json;
use tether_kernel::{CommandRequest, EstopRequest, Kernel, Principal, PrincipalKind, SessionOpen};

fn kernel() -> Kernel {
    common::builtin_kernel()
}

fn operator() -> Principal {
    Principal {
        id: "alice".into(),
        kind: PrincipalKind::Human,
        operator: true,
    }
}

fn park(sid: &str, grant: Option<&str>) -> CommandRequest {
    CommandRequest {
        route: tether_kernel::Route::Command,
        session_id: Some(sid.into()),
        device_id: "arm-1".into(),
        capability_id: "cap.motion.park.v1".into(),
        resource: None,
        input: json!({}),
        command_id: None,
        deadline: None,
        expected_revision: None,
        safe_place_grant: grant.map(str::to_owned),
        permit_id: None,
    }
}

#[tokio::test]
async fn an_operator_grant_lets_exactly_one_park_run_while_latched() {
    let k = kernel();
    let agent = Principal::local_agent();
    let sid = k
        .session_open(&agent, SessionOpen::default())
        .await
        .expect("session")["session_id"]
        .as_str()
        .expect("sid")
        .to_owned();
    k.estop(EstopRequest {
        device_ids: vec!["arm-1".into()],
        reason: "t".into(),
        ..EstopRequest::default()
    })
    .await;
    let refused = k
        .command(
            &agent,
            park(&sid, None),
            tether_kernel::CommandOptions::plain(),
        )
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt");
    assert_eq!(refused["error"]["mhs_code"], "MHS.SAFETY.ESTOP_ENGAGED");
    // A model can never grant.
    let denied = k
        .grant_safe_place(&agent, "arm-1", "cap.motion.park.v1", None, &json!({}))
        .expect_err("agent");
    assert_eq!(denied.code.as_str(), "MHS.AUTH.FORBIDDEN");
    // Only safe-place classes can be granted.
    let not_safe = k
        .grant_safe_place(
            &operator(),
            "arm-1",
            "cap.motion.move_to.v1",
            None,
            &json!({"joints": [0, 0, 0, 0, 0, 0]}),
        )
        .expect_err("move_to");
    assert_eq!(not_safe.details["reason"], "not_safe_place");
    let g = k
        .grant_safe_place(&operator(), "arm-1", "cap.motion.park.v1", None, &json!({}))
        .expect("grant");
    let gid = g["grant_id"].as_str().expect("id").to_owned();
    assert_eq!(g["single_use"], true);
    let ok = k
        .command(
            &agent,
            park(&sid, Some(&gid)),
            tether_kernel::CommandOptions::plain(),
        )
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt");
    assert_eq!(ok["status"], "completed", "{ok}");
    let again = k
        .command(
            &agent,
            park(&sid, Some(&gid)),
            tether_kernel::CommandOptions::plain(),
        )
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt");
    assert_eq!(
        again["error"]["details"]["reason"], "safe_place_grant_invalid",
        "{again}"
    );
    // Still latched: the grant released nothing.
    assert_eq!(
        k.safety_status(Some("arm-1")).expect("status")["devices"][0]["latched"],
        true
    );
    // A grant never covers another binding.
    let g2 = k
        .grant_safe_place(&operator(), "arm-1", "cap.motion.park.v1", None, &json!({}))
        .expect("grant");
    let mut mv = park(&sid, g2["grant_id"].as_str());
    mv.capability_id = "cap.motion.move_to.v1".into();
    mv.input = json!({"joints": [0.1, 0, 0, 0, 0, 0]});
    let r = k
        .command(&agent, mv, tether_kernel::CommandOptions::plain())
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt");
    assert_eq!(
        r["error"]["details"]["detail"], "granted for another binding",
        "{r}"
    );
}
