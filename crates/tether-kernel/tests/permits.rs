//! Permits: single-use, bound to the exact input, binding, session and
//! principal; given back when the command is refused before dispatch;
//! revoked by an e-stop; required (and only from an approval route) for
//! hardware commands at R2 and above.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

use serde_json::{json, Value};
use std::sync::Arc;
use tether_core::Code;
use tether_kernel::{
    Authorized, BoxFuture, CancelToken, CommandRequest, Driver, EstopRequest, Kernel, Principal,
    ResetRequest, SessionOpen, Signal,
};
use tether_store::{ApprovalRow, Commit, MemoryStore, Store};

fn manifest(mode: &str) -> String {
    format!(
        r#"
device_id = "mixer-1"
mode = "{mode}"
risk_class = "R2"
driver = "test"
fidelity = {{ kind = "simulated", notes = "scripted" }}

[[resources]]
id = "main"
state_schema = {{ type = "object", properties = {{ rpm = {{ type = "number", readOnly = true, "x-mhs-unit" = "rpm" }} }} }}

[[bindings]]
capability_id = "x-cap.test.mix.v1"
resource = "main"
target = "mix"
kind = "leased"
risk = "R2"
input_schema = {{ type = "object", additionalProperties = false, required = ["rpm"], properties = {{ rpm = {{ type = "number", "x-mhs-unit" = "rpm" }} }} }}
output_schema = {{ type = "object" }}
limits.rpm = {{ min = 0, max = 500, unit = "rpm", source = "operator" }}
"#
    )
}

struct Mixer;

impl Driver for Mixer {
    fn read(&self, _call: &Authorized) -> Result<Value, Signal> {
        Ok(json!({"rpm": 0}))
    }
    fn call(
        &self,
        _call: Authorized,
        _cancel: CancelToken,
    ) -> BoxFuture<'_, Result<Value, Signal>> {
        Box::pin(async { Ok(json!({})) })
    }
    fn estop(&self, _call: &Authorized) -> Result<(), Signal> {
        Ok(())
    }
}

async fn rig(mode: &str) -> (Kernel, Principal, String) {
    let k = common::single_device_kernel(
        "mixer-1",
        &manifest(mode),
        Arc::new(Mixer),
        Arc::new(MemoryStore::new()),
    );
    let p = Principal::local_agent();
    let sid = common::open_session(&k, &p).await;
    (k, p, sid)
}

fn mix(sid: &str, rpm: f64, permit: Option<&str>) -> CommandRequest {
    CommandRequest {
        route: tether_kernel::Route::Command,
        session_id: Some(sid.into()),
        device_id: "mixer-1".into(),
        capability_id: "x-cap.test.mix.v1".into(),
        resource: None,
        input: json!({"rpm": rpm}),
        command_id: None,
        deadline: None,
        expected_revision: None,
        safe_place_grant: None,
        permit_id: permit.map(str::to_owned),
    }
}

#[tokio::test]
async fn a_permit_is_single_use_and_bound_to_the_exact_input_session_and_binding() {
    let (k, p, sid) = rig("simulated").await;
    let permit = k
        .permit(&p, &mix(&sid, 100.0, None), None)
        .await
        .expect("permit");
    let id = permit["permit_id"].as_str().expect("id").to_owned();
    let other = k
        .command(
            &p,
            mix(&sid, 101.0, Some(&id)),
            tether_kernel::CommandOptions::plain(),
        )
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt");
    assert_eq!(other["error"]["mhs_code"], "MHS.SAFETY.PERMIT_INVALID");
    assert_eq!(other["error"]["details"]["reason"], "other_input");
    let sid2 = k
        .session_open(&p, SessionOpen::default())
        .await
        .expect("session")["session_id"]
        .as_str()
        .expect("sid")
        .to_owned();
    let wrong_session = k
        .command(
            &p,
            mix(&sid2, 100.0, Some(&id)),
            tether_kernel::CommandOptions::plain(),
        )
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt");
    assert_eq!(
        wrong_session["error"]["details"]["reason"],
        "other_session_or_principal"
    );
    assert_eq!(
        k.command(
            &p,
            mix(&sid, 100.0, Some(&id)),
            tether_kernel::CommandOptions::plain()
        )
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt")["status"],
        "completed"
    );
    let reused = k
        .command(
            &p,
            mix(&sid, 100.0, Some(&id)),
            tether_kernel::CommandOptions::plain(),
        )
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt");
    assert_eq!(reused["error"]["details"]["reason"], "used");
}

#[tokio::test]
async fn a_permit_consumed_by_a_command_refused_before_dispatch_is_given_back() {
    let (k, p, sid) = rig("simulated").await;
    let id = k
        .permit(&p, &mix(&sid, 100.0, None), None)
        .await
        .expect("permit")["permit_id"]
        .as_str()
        .expect("id")
        .to_owned();
    let mut stale = mix(&sid, 100.0, Some(&id));
    stale.expected_revision = Some(42);
    let refused = k
        .command(&p, stale, tether_kernel::CommandOptions::plain())
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt");
    assert_eq!(refused["error"]["mhs_code"], "MHS.CONFLICT.REVISION");
    assert_eq!(
        k.command(
            &p,
            mix(&sid, 100.0, Some(&id)),
            tether_kernel::CommandOptions::plain()
        )
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt")["status"],
        "completed",
        "the permit was given back"
    );
}

#[tokio::test]
async fn an_estop_revokes_the_devices_permits() {
    let (k, p, sid) = rig("simulated").await;
    let id = k
        .permit(&p, &mix(&sid, 100.0, None), None)
        .await
        .expect("permit")["permit_id"]
        .as_str()
        .expect("id")
        .to_owned();
    k.estop(EstopRequest {
        device_ids: vec!["mixer-1".into()],
        reason: "t".into(),
        ..EstopRequest::default()
    })
    .await;
    k.reset(
        &p,
        ResetRequest {
            session_id: None,
            device_id: "mixer-1".into(),
            reason: "t".into(),
        },
    )
    .await
    .expect("reset");
    let r = k
        .command(
            &p,
            mix(&sid, 100.0, Some(&id)),
            tether_kernel::CommandOptions::plain(),
        )
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt");
    assert_eq!(r["error"]["details"]["reason"], "unknown", "{r}");
}

#[tokio::test]
async fn hardware_at_r2_needs_a_permit_that_the_requester_cannot_grant_itself() {
    // The default policy holds hardware R2 actions: the hold is the approval route.
    let (k, p, sid) = rig("hardware").await;
    let r = k
        .command(
            &p,
            mix(&sid, 100.0, None),
            tether_kernel::CommandOptions::plain(),
        )
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt");
    assert_eq!(r["error"]["mhs_code"], "MHS.POLICY.HELD", "{r}");
    assert_eq!(
        r["error"]["details"]["policies"],
        json!(["hardware-r2-up-held"]),
        "{r}"
    );
    assert!(r["error"]["details"]["approval_id"].is_string(), "{r}");
    let e = k
        .permit(&p, &mix(&sid, 100.0, None), None)
        .await
        .expect_err("no self-granted permit");
    assert_eq!(e.code.as_str(), "MHS.SAFETY.APPROVAL_REQUIRED");
    assert_eq!(e.details["reason"], "approval_route_required");
}

fn human(id: &str, operator: bool) -> Principal {
    Principal {
        id: id.into(),
        kind: tether_kernel::PrincipalKind::Human,
        operator,
    }
}

/// A policy that allows everything: the permit rule alone asks for approval.
async fn permissive_rig() -> (Kernel, Principal, String) {
    permissive_rig_on("mixer-1", Arc::new(MemoryStore::new())).await
}

/// [`permissive_rig`] for hardware mixer `device` on `store`.
async fn permissive_rig_on(device: &str, store: Arc<MemoryStore>) -> (Kernel, Principal, String) {
    let mut config = tether_kernel::KernelConfig::standard("t");
    config.policy = Some((
        "allow-all.cedar".into(),
        "@id(\"all\") permit(principal, action, resource);".into(),
    ));
    let k = common::single_device_kernel_with(
        device,
        &manifest("hardware").replace("mixer-1", device),
        Arc::new(Mixer),
        store,
        config,
    );
    let p = Principal::local_agent();
    let sid = common::open_session(&k, &p).await;
    (k, p, sid)
}

/// Sends `req` (held: the permit rule asks for approval) and has operator
/// "op" approve it; answers the approval's id.
async fn held_then_approved(k: &Kernel, p: &Principal, req: &CommandRequest) -> String {
    let r = k
        .command(p, req.clone(), tether_kernel::CommandOptions::plain())
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt");
    let id = r["error"]["details"]["approval_id"]
        .as_str()
        .expect("approval id")
        .to_owned();
    k.approvals_decide(&human("op", true), &id, "approve", "ok")
        .await
        .expect("vote");
    id
}

#[tokio::test]
async fn without_a_permit_the_command_takes_the_approval_route_and_resumes_once() {
    let (k, p, sid) = permissive_rig().await;
    let mut req = mix(&sid, 120.0, None);
    req.command_id = Some("mix-approved-1".into());
    let r = k
        .command(&p, req.clone(), tether_kernel::CommandOptions::plain())
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt");
    assert_eq!(
        r["error"]["mhs_code"], "MHS.SAFETY.APPROVAL_REQUIRED",
        "{r}"
    );
    assert_eq!(
        r["policy"]["decision"], "allow",
        "the policy allowed; the permit rule asks: {r}"
    );
    let id = r["error"]["details"]["approval_id"]
        .as_str()
        .expect("approval id")
        .to_owned();
    assert_eq!(
        k.approvals_get(&human("op", true), &id).expect("get")["kind"],
        "permit"
    );

    // The model can never approve its own permit, nor can a non-operator.
    let e = k
        .approvals_decide(&p, &id, "approve", "mine")
        .await
        .expect_err("agent");
    assert_eq!(e.details["reason"], "operator_required");
    let e = k
        .approvals_decide(&human("visitor", false), &id, "approve", "")
        .await
        .expect_err("no role");
    assert_eq!(e.details["reason"], "operator_required");

    let v = k
        .approvals_decide(&human("op", true), &id, "approve", "ok")
        .await
        .expect("vote");
    assert_eq!(v["status"], "approved");

    // Another input under the same command id is not covered.
    let mut other = mix(&sid, 130.0, None);
    other.command_id = Some("mix-approved-1".into());
    let r = k
        .command(&p, other, tether_kernel::CommandOptions::plain())
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt");
    assert_eq!(
        r["error"]["mhs_code"], "MHS.SAFETY.APPROVAL_REQUIRED",
        "{r}"
    );
    assert_ne!(r["error"]["details"]["approval_id"], json!(id));

    let done = k
        .command(&p, req.clone(), tether_kernel::CommandOptions::plain())
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt");
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["approval_id"], json!(id));
    assert_eq!(
        k.approvals_get(&human("op", true), &id).expect("get")["status"],
        "used"
    );
    let replay = k
        .command(&p, req, tether_kernel::CommandOptions::plain())
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt");
    assert_eq!(replay["replayed"], true, "{replay}");
}

#[tokio::test]
async fn an_approved_command_refused_later_keeps_its_approval() {
    let (k, p, sid) = permissive_rig().await;
    let mut req = mix(&sid, 50.0, None);
    req.command_id = Some("mix-latched".into());
    let id = held_then_approved(&k, &p, &req).await;
    // A revision conflict: the whole order runs again and refuses after the
    // policy step; the approval is given back, not spent.
    let mut stale = req.clone();
    stale.expected_revision = Some(12_345);
    let r = k
        .command(&p, stale, tether_kernel::CommandOptions::plain())
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt");
    assert_eq!(r["error"]["mhs_code"], "MHS.CONFLICT.REVISION", "{r}");
    assert_eq!(
        k.approvals_get(&human("op", true), &id).expect("get")["status"],
        "approved"
    );
    // An e-stop revokes it: consent given before an incident never moves the
    // device after the reset.
    k.estop(EstopRequest {
        device_ids: vec!["mixer-1".into()],
        reason: "drill".into(),
        envelope_defect: None,
        requested_by: None,
        session_id: None,
        deadline: None,
    })
    .await;
    let r = k
        .command(&p, req, tether_kernel::CommandOptions::plain())
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt");
    assert_eq!(r["error"]["mhs_code"], "MHS.SAFETY.ESTOP_ENGAGED", "{r}");
    assert_eq!(
        k.approvals_get(&human("op", true), &id).expect("get")["status"],
        "revoked"
    );
}

/// A restart reads back only the newest closed approvals (5,000: memory stays
/// bounded); an older one is still answered by `approvals.get`, from the
/// store, which keeps every one. Found by the SIGKILL campaign's long run: a
/// hold acknowledged at its second kill answered "no approval" at the 463rd.
#[tokio::test]
async fn an_old_closed_approval_a_restart_did_not_read_back_is_answered_from_the_store() {
    let store = Arc::new(MemoryStore::new());
    let (k, p, sid) = permissive_rig_on("mixer-1", store.clone()).await;
    let mut req = mix(&sid, 120.0, None);
    req.command_id = Some("mix-old-1".into());
    let id = held_then_approved(&k, &p, &req).await;
    let done = k
        .command(&p, req, tether_kernel::CommandOptions::plain())
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("receipt");
    assert_eq!(done["status"], "completed", "{done}");
    drop(k);

    // 5,000 closed approvals newer than it (its record under other ids).
    let row = store.approval(&id).expect("read").expect("stored");
    assert_eq!(row.record["status"], "used");
    let newer: Vec<ApprovalRow> = (0..5_000)
        .map(|i| {
            let mut record = row.record.clone();
            let other = format!("appr_newer_{i:05}");
            record["approval_id"] = json!(other);
            ApprovalRow {
                approval_id: other,
                record,
            }
        })
        .collect();
    for part in newer.chunks(1_000) {
        store
            .commit_blocking(Commit {
                approvals: part.to_vec(),
                ..Commit::default()
            })
            .expect("commit");
    }

    // Another endpoint on the store (the first one's lease on mixer-1 is
    // still live in this process): it restores the approvals all the same.
    let (k, _, _) = permissive_rig_on("mixer-2", store.clone()).await;
    let listed = k
        .approvals_list(&human("op", true), Some("used"), Some(500), None)
        .expect("list");
    assert!(
        !listed.to_string().contains(&id),
        "not read back into memory"
    );
    let got = k
        .approvals_get(&human("op", true), &id)
        .expect("answered from the store");
    assert_eq!(got["status"], "used", "{got}");
    assert_eq!(got["approval_id"], json!(id));
    assert_eq!(got["votes"][0]["by"], "op", "{got}");
    // The store's answer keeps the visibility rule: the requester sees its
    // own, another non-operator does not; an unknown id stays unknown.
    k.approvals_get(&p, &id).expect("the requester's own");
    let e = k
        .approvals_get(&human("visitor", false), &id)
        .expect_err("not the visitor's");
    assert_eq!(e.code, Code::PolicyApprovalUnknown);
    let e = k
        .approvals_get(&human("op", true), "appr_never_made")
        .expect_err("unknown");
    assert_eq!(e.code, Code::PolicyApprovalUnknown);
    // A vote on it says it is closed, as it would in memory.
    let e = k
        .approvals_decide(&human("op2", true), &id, "approve", "late")
        .await
        .expect_err("closed");
    assert_eq!(e.code, Code::PolicyApprovalClosed, "{e:?}");
    let e = k
        .approvals_decide(&human("op2", true), "appr_never_made", "deny", "")
        .await
        .expect_err("unknown");
    assert_eq!(e.code, Code::PolicyApprovalUnknown);
}
