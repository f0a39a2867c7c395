//! The ControlPolicy and approvals over HTTP with several principals: holds
//! with a quorum of distinct operators, resume by the same `command_id`,
//! refusals for agents, requesters and second votes, durability across a
//! restart, a policy that now forbids, fingerprints, expiry, denial, the CLI,
//! and invalid policies refusing start-up.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

use common::mcp_http::*;
use common::*;
use serde_json::{json, Value};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

const AGENT: &str = "agent-token-1c2d";
const ALICE: &str = "alice-token-9e8f";
const BOB: &str = "bob-token-7a6b";
const CAROL: &str = "carol-token-5d4c";
const SERVICE: &str = "svc-token-3b2a";

/// Setpoints above 60 degC wait for two operators, for anyone; everything
/// else on the simulated cell is allowed.
const HOLD_POLICY: &str = r#"
@id("reads") permit(principal, action == Tether::Action::"read", resource);
@id("cell") permit(principal, action, resource) when { context.mode == "simulated" };
@id("hot-setpoints")
@hold("setpoints above 60 degC need two operators")
@quorum("2")
permit(principal, action == Tether::Action::"command", resource)
  when { resource.capability == "cap.thermal.setpoint.v1" &&
         context.input has target_temperature &&
         context.input.target_temperature.greaterThan(decimal("60.0")) };
"#;

/// The same, plus a forbid that now refuses hot setpoints outright.
const FORBID_POLICY: &str = r#"
@id("reads") permit(principal, action == Tether::Action::"read", resource);
@id("cell") permit(principal, action, resource) when { context.mode == "simulated" };
@id("no-hot-setpoints") @reason("hot setpoints are forbidden since the incident review")
forbid(principal, action == Tether::Action::"command", resource)
  when { context.input has target_temperature &&
         context.input.target_temperature.greaterThan(decimal("60.0")) };
"#;

fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

fn principal(id: &str, kind: &str, roles: &str, token: &str) -> String {
    format!(
        "[[principals]]\nid = \"{id}\"\nkind = \"{kind}\"\nroles = [{roles}]\ntoken_sha256 = \"{}\"\n\n",
        sha256_hex(token)
    )
}

/// Writes `tether.toml` and `policy.cedar` into `dir`; answers the config path.
fn write_config(dir: &Path, policy: &str, extra: &str) -> PathBuf {
    std::fs::write(dir.join("policy.cedar"), policy).expect("policy");
    let mut text = format!("builtin_cell = true\npolicy = \"policy.cedar\"\n{extra}\n");
    text.push_str(&principal("planner", "agent", "", AGENT));
    text.push_str(&principal("alice", "human", "\"operator\"", ALICE));
    text.push_str(&principal("bob", "human", "\"operator\"", BOB));
    text.push_str(&principal("carol", "human", "", CAROL));
    text.push_str(&principal("ingest", "service", "", SERVICE));
    let path = dir.join("tether.toml");
    std::fs::write(&path, text).expect("config");
    path
}

fn start(dir: &Path, cfg: &Path) -> Server {
    start_with_config(dir, cfg)
}

fn call(s: &Server, token: &str, method: &str, params: Value) -> Value {
    call_with_token(s, token, method, params)
}

fn ok(s: &Server, token: &str, method: &str, params: Value) -> Value {
    let a = call(s, token, method, params.clone());
    assert!(a.get("error").is_none(), "{method} {params}: {a}");
    a["result"].clone()
}

fn err(s: &Server, token: &str, method: &str, params: Value) -> Value {
    let a = call(s, token, method, params.clone());
    assert!(
        a.get("result").is_none(),
        "{method} {params} succeeded: {a}"
    );
    a["error"].clone()
}

fn session(s: &Server, token: &str) -> String {
    ok(s, token, "mhs.session.open", json!({}))["session_id"]
        .as_str()
        .expect("session_id")
        .to_owned()
}

fn setpoint(s: &Server, token: &str, sid: &str, command_id: &str, t: f64) -> Value {
    ok(
        s,
        token,
        "mhs.command",
        json!({"session_id": sid, "device_id": "thermostat-1", "capability_id": "cap.thermal.setpoint.v1", "input": {"target_temperature": t}, "command_id": command_id}),
    )
}

fn decide(s: &Server, token: &str, id: &str, decision: &str) -> Value {
    call(
        s,
        token,
        "mhs.approvals.decide",
        json!({"approval_id": id, "decision": decision, "reason": "test"}),
    )
}

fn held_approval(receipt: &Value) -> String {
    let d = assert_rejected(receipt, "MHS.POLICY.HELD");
    d["approval_id"]
        .as_str()
        .unwrap_or_else(|| panic!("hold without approval_id: {receipt}"))
        .to_owned()
}

fn live_setpoint(s: &Server, token: &str, sid: &str) -> f64 {
    ok(
        s,
        token,
        "mhs.resource.read",
        json!({"session_id": sid, "device_id": "thermostat-1", "resource": "main"}),
    )["state"]["setpoint"]
        .as_f64()
        .expect("setpoint")
}

#[test]
fn quorum_of_two_distinct_operators_then_resume_by_command_id() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), HOLD_POLICY, "");
    let s = start(dir.path(), &cfg);
    let sid = session(&s, AGENT);
    let before = live_setpoint(&s, AGENT, &sid);

    // Below the threshold: allowed, and the receipt says which policy allowed it.
    let cool = setpoint(&s, AGENT, &sid, "cool-1", 40.0);
    assert_eq!(cool["status"], "completed", "{cool}");
    assert_eq!(cool["decision"], "allow");
    assert_eq!(cool["policy"]["policies"], json!(["cell"]), "{cool}");

    // Above it: held, nothing dispatched.
    let held = setpoint(&s, AGENT, &sid, "hot-1", 70.0);
    let id = held_approval(&held);
    assert_eq!(held["error"]["details"]["quorum"], 2, "{held}");
    assert_eq!(held["policy"]["decision"], "hold", "{held}");
    assert_eq!(
        held["policy"]["policies"],
        json!(["hot-setpoints"]),
        "{held}"
    );
    assert_eq!(live_setpoint(&s, AGENT, &sid), 40.0);
    assert_ne!(before, 70.0);

    // Sending it again while pending answers the same approval, not a new one.
    assert_eq!(held_approval(&setpoint(&s, AGENT, &sid, "hot-1", 70.0)), id);

    // Who may not decide.
    let e = err(
        &s,
        AGENT,
        "mhs.approvals.decide",
        json!({"approval_id": id, "decision": "approve", "reason": "me"}),
    );
    assert_eq!(
        assert_rpc_error(&e, "MHS.AUTH.FORBIDDEN")["reason"],
        "operator_required"
    );
    let e = err(
        &s,
        CAROL,
        "mhs.approvals.decide",
        json!({"approval_id": id, "decision": "approve"}),
    );
    assert_eq!(
        assert_rpc_error(&e, "MHS.AUTH.FORBIDDEN")["reason"],
        "operator_required"
    );
    let e = err(
        &s,
        SERVICE,
        "mhs.approvals.decide",
        json!({"approval_id": id, "decision": "approve"}),
    );
    assert_eq!(
        assert_rpc_error(&e, "MHS.AUTH.FORBIDDEN")["reason"],
        "operator_required"
    );

    // The agent sees its own approval; operators see it in the pending list.
    let mine = ok(&s, AGENT, "mhs.approvals.get", json!({"approval_id": id}));
    assert_eq!(mine["status"], "pending");
    let pending = ok(
        &s,
        ALICE,
        "mhs.approvals.list",
        json!({"status": "pending"}),
    );
    assert!(pending["approvals"]
        .as_array()
        .expect("list")
        .iter()
        .any(|a| a["approval_id"] == id.as_str()));

    // One operator is not a quorum, and may not vote twice.
    let first = decide(&s, ALICE, &id, "approve");
    assert_eq!(first["result"]["status"], "pending", "{first}");
    assert_eq!(first["result"]["approvals"], 1);
    let again = decide(&s, ALICE, &id, "approve");
    assert_eq!(
        assert_rpc_error(&again["error"], "MHS.AUTH.FORBIDDEN")["reason"],
        "already_voted"
    );
    assert_eq!(
        held_approval(&setpoint(&s, AGENT, &sid, "hot-1", 70.0)),
        id,
        "still pending after one vote"
    );

    let second = decide(&s, BOB, &id, "approve");
    assert_eq!(second["result"]["status"], "approved", "{second}");

    // The approval is fingerprinted: another input under the same id does not resume.
    let other = setpoint(&s, AGENT, &sid, "hot-1", 75.0);
    let other_id = held_approval(&other);
    assert_ne!(other_id, id);
    assert_eq!(
        live_setpoint(&s, AGENT, &sid),
        40.0,
        "the other input did not run"
    );

    // The same command_id and input resumes and runs the whole order.
    let done = setpoint(&s, AGENT, &sid, "hot-1", 70.0);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["approval_id"], id.as_str());
    assert_eq!(done["decision"], "allow");
    assert_eq!(live_setpoint(&s, AGENT, &sid), 70.0);
    // Sending it once more replays the receipt; the approval is spent.
    let replay = setpoint(&s, AGENT, &sid, "hot-1", 70.0);
    assert_eq!(replay["replayed"], true, "{replay}");
    assert_eq!(
        ok(&s, ALICE, "mhs.approvals.get", json!({"approval_id": id}))["status"],
        "used"
    );
    // A new command id is a new request: held again.
    assert_ne!(held_approval(&setpoint(&s, AGENT, &sid, "hot-2", 70.0)), id);

    // Every request, vote and use is in the evidence chain.
    let export = tether(&[
        OsStr::new("audit"),
        OsStr::new("export"),
        OsStr::new("--state-dir"),
        dir.path().join("state").as_os_str(),
    ]);
    let text = export.stdout_text();
    for kind in ["approval.requested", "approval.vote", "approval.used"] {
        assert!(
            text.contains(&format!("\"kind\":\"{kind}\"")),
            "{kind} missing from the chain"
        );
    }
    assert!(
        !text.contains(ALICE) && !text.contains(AGENT),
        "tokens never reach the evidence"
    );
}

/// Exactly one approval is pending (an operator lists them).
fn assert_one_pending(s: &Server) {
    let pending = ok(s, ALICE, "mhs.approvals.list", json!({"status": "pending"}));
    assert_eq!(
        pending["approvals"].as_array().map(Vec::len),
        Some(1),
        "{pending}"
    );
}

/// A setpoint sent without a command id of its own, as MCP tools send them.
fn setpoint_without_id(s: &Server, token: &str, sid: &str, t: f64) -> Value {
    ok(
        s,
        token,
        "mhs.command",
        json!({"session_id": sid, "device_id": "thermostat-1", "capability_id": "cap.thermal.setpoint.v1", "input": {"target_temperature": t}}),
    )
}

#[test]
fn a_request_without_a_command_id_resumes_the_hold_it_repeats() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), HOLD_POLICY, "");
    let s = start(dir.path(), &cfg);
    let sid = session(&s, AGENT);
    let first = setpoint_without_id(&s, AGENT, &sid, 75.0);
    let approval = held_approval(&first);
    // Repeated while pending: the same hold, not a second approval.
    let again = setpoint_without_id(&s, AGENT, &sid, 75.0);
    assert_eq!(held_approval(&again), approval, "{again}");
    assert_eq!(again["command_id"], first["command_id"], "{again}");
    assert_one_pending(&s);
    // Other input is another request: its own hold.
    let other = setpoint_without_id(&s, AGENT, &sid, 76.0);
    assert_ne!(held_approval(&other), approval, "{other}");
    for op in [ALICE, BOB] {
        let d = decide(&s, op, &approval, "approve");
        assert!(d.get("error").is_none(), "{d}");
    }
    let done = setpoint_without_id(&s, AGENT, &sid, 75.0);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["approval_id"], approval.as_str(), "{done}");
    assert_eq!(done["command_id"], first["command_id"], "{done}");
    assert_eq!(live_setpoint(&s, AGENT, &sid), 75.0);
    // The approval is spent: the same request again is a new hold.
    let later = setpoint_without_id(&s, AGENT, &sid, 75.0);
    assert_ne!(held_approval(&later), approval, "{later}");
}

#[test]
fn an_estop_revokes_the_devices_open_approvals() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), HOLD_POLICY, "");
    let s = start(dir.path(), &cfg);
    let sid = session(&s, AGENT);
    let approved = held_approval(&setpoint(&s, AGENT, &sid, "hot-approved", 75.0));
    let pending = held_approval(&setpoint(&s, AGENT, &sid, "hot-pending", 80.0));
    for op in [ALICE, BOB] {
        let d = decide(&s, op, &approved, "approve");
        assert!(d.get("error").is_none(), "{d}");
    }
    ok(
        &s,
        AGENT,
        "mhs.safety.estop",
        json!({"device_id": "thermostat-1", "reason": "incident"}),
    );
    for id in [&approved, &pending] {
        let a = ok(&s, ALICE, "mhs.approvals.get", json!({"approval_id": id}));
        assert_eq!(a["status"], "revoked", "{a}");
    }
    // A late vote is refused as closed.
    let late = decide(&s, ALICE, &pending, "approve");
    assert_eq!(
        late["error"]["data"]["mhs_code"], "MHS.POLICY.APPROVAL_CLOSED",
        "{late}"
    );
    ok(
        &s,
        ALICE,
        "mhs.safety.reset",
        json!({"device_id": "thermostat-1"}),
    );
    // Consent given before the incident does not move the device after it.
    let resumed = setpoint(&s, AGENT, &sid, "hot-approved", 75.0);
    let d = assert_rejected(&resumed, "MHS.POLICY.APPROVAL_CLOSED");
    assert_eq!(d["status"], "revoked", "{resumed}");
    drop(s);
    // The revocation is durable.
    let s = start(dir.path(), &cfg);
    let a = ok(
        &s,
        ALICE,
        "mhs.approvals.get",
        json!({"approval_id": approved}),
    );
    assert_eq!(a["status"], "revoked", "{a}");
}

#[test]
fn a_second_vote_after_a_denial_is_answered_closed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), HOLD_POLICY, "");
    let s = start(dir.path(), &cfg);
    let sid = session(&s, AGENT);
    let id = held_approval(&setpoint(&s, AGENT, &sid, "deny-twice", 75.0));
    let d = decide(&s, BOB, &id, "deny");
    assert!(d.get("error").is_none(), "{d}");
    let again = decide(&s, BOB, &id, "approve");
    assert_eq!(
        again["error"]["data"]["mhs_code"], "MHS.POLICY.APPROVAL_CLOSED",
        "{again}"
    );
}

const HOLD_READS_AND_STOPS: &str = r#"
@id("hold-read") @hold("reads of the relay are held")
permit(principal, action == Tether::Action::"read", resource) when { resource.device == "relay-1" };
@id("hold-stops") @hold("stops held?")
permit(principal, action, resource) when { resource.stop_class };
@id("all") permit(principal, action, resource);
"#;

#[test]
fn a_hold_on_a_read_command_is_a_deny_and_a_hold_on_a_stop_is_set_aside() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), HOLD_READS_AND_STOPS, "");
    let s = start(dir.path(), &cfg);
    let sid = session(&s, AGENT);
    let read = ok(
        &s,
        AGENT,
        "mhs.command",
        json!({"session_id": sid, "device_id": "relay-1", "capability_id": "cap.state.read.v1", "input": {}}),
    );
    let d = assert_rejected(&read, "MHS.POLICY.DENIED");
    assert!(
        d.get("approval_id").is_none(),
        "no approval for a read: {read}"
    );
    // What is recorded is what was done: a deny, which a hold became.
    assert_eq!(read["decision"], "deny", "{read}");
    assert_eq!(read["policy"]["decision"], "deny", "{read}");
    assert_eq!(read["policy"]["hold_denied"], true, "{read}");
    assert_eq!(d["policy"]["decision"], "deny", "{read}");
    let direct = err(
        &s,
        AGENT,
        "mhs.resource.read",
        json!({"session_id": sid, "device_id": "relay-1", "resource": "bank"}),
    );
    assert_eq!(
        direct["data"]["details"]["policy"]["decision"], "deny",
        "{direct}"
    );
    assert_eq!(
        direct["data"]["details"]["policy"]["hold_denied"], true,
        "{direct}"
    );
    let stop = ok(
        &s,
        AGENT,
        "mhs.command",
        json!({"session_id": sid, "device_id": "arm-1", "capability_id": "cap.motion.stop.v1", "input": {}}),
    );
    assert_eq!(stop["status"], "completed", "{stop}");
    assert_eq!(stop["decision"], "allow", "{stop}");
    assert_eq!(stop["policy"]["decision"], "allow", "{stop}");
    assert_eq!(stop["policy"]["hold_ignored"], true, "{stop}");
}

#[test]
fn the_requester_never_approves_its_own_hold() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), HOLD_POLICY, "");
    let s = start(dir.path(), &cfg);
    let sid = session(&s, ALICE);
    let id = held_approval(&setpoint(&s, ALICE, &sid, "alice-hot", 65.0));
    let e = decide(&s, ALICE, &id, "approve");
    assert_eq!(
        assert_rpc_error(&e["error"], "MHS.AUTH.FORBIDDEN")["reason"],
        "requester_cannot_decide"
    );
    // Others' approvals are invisible to a non-operator.
    let e = err(&s, AGENT, "mhs.approvals.get", json!({"approval_id": id}));
    assert_rpc_error(&e, "MHS.POLICY.APPROVAL_UNKNOWN");
    let e = err(
        &s,
        ALICE,
        "mhs.approvals.get",
        json!({"approval_id": "appr_nope"}),
    );
    assert_rpc_error(&e, "MHS.POLICY.APPROVAL_UNKNOWN");
}

#[test]
fn approvals_survive_a_restart_and_resume_from_a_new_session() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), HOLD_POLICY, "");
    let mut s = start(dir.path(), &cfg);
    let sid = session(&s, AGENT);
    let id = held_approval(&setpoint(&s, AGENT, &sid, "restart-1", 66.0));
    assert_eq!(decide(&s, ALICE, &id, "approve")["result"]["approvals"], 1);
    s.kill();

    let s = start(dir.path(), &cfg);
    let got = ok(&s, BOB, "mhs.approvals.get", json!({"approval_id": id}));
    assert_eq!(got["status"], "pending");
    assert_eq!(got["votes"][0]["by"], "alice", "the vote survived: {got}");
    assert_eq!(
        decide(&s, BOB, &id, "approve")["result"]["status"],
        "approved"
    );
    let sid = session(&s, AGENT);
    let done = setpoint(&s, AGENT, &sid, "restart-1", 66.0);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(live_setpoint(&s, AGENT, &sid), 66.0);
}

#[test]
fn an_approval_never_overrides_a_policy_that_now_forbids() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), HOLD_POLICY, "");
    let mut s = start(dir.path(), &cfg);
    let sid = session(&s, AGENT);
    let id = held_approval(&setpoint(&s, AGENT, &sid, "forbid-1", 68.0));
    decide(&s, ALICE, &id, "approve");
    assert_eq!(
        decide(&s, BOB, &id, "approve")["result"]["status"],
        "approved"
    );
    s.kill();

    let cfg = write_config(dir.path(), FORBID_POLICY, "");
    let s = start(dir.path(), &cfg);
    let sid = session(&s, AGENT);
    let r = setpoint(&s, AGENT, &sid, "forbid-1", 68.0);
    let details = assert_rejected(&r, "MHS.POLICY.DENIED");
    assert_eq!(
        details["policy"]["policies"],
        json!(["no-hot-setpoints"]),
        "{r}"
    );
    assert_eq!(
        details["policy"]["reason"],
        "hot setpoints are forbidden since the incident review"
    );
    assert_ne!(live_setpoint(&s, AGENT, &sid), 68.0);
    // The approval stays unused.
    assert_eq!(
        ok(&s, ALICE, "mhs.approvals.get", json!({"approval_id": id}))["status"],
        "approved"
    );
}

#[test]
fn a_denial_is_durable_and_final() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), HOLD_POLICY, "");
    let mut s = start(dir.path(), &cfg);
    let sid = session(&s, AGENT);
    let id = held_approval(&setpoint(&s, AGENT, &sid, "deny-1", 80.0));
    assert_eq!(decide(&s, ALICE, &id, "deny")["result"]["status"], "denied");
    let late = decide(&s, BOB, &id, "approve");
    assert_eq!(
        assert_rpc_error(&late["error"], "MHS.POLICY.APPROVAL_CLOSED")["status"],
        "denied"
    );
    let r = setpoint(&s, AGENT, &sid, "deny-1", 80.0);
    assert_eq!(
        assert_rejected(&r, "MHS.POLICY.DENIED")["approval_id"],
        id.as_str()
    );
    s.kill();
    let s = start(dir.path(), &cfg);
    let sid = session(&s, AGENT);
    let r = setpoint(&s, AGENT, &sid, "deny-1", 80.0);
    assert_rejected(&r, "MHS.POLICY.DENIED");
}

#[test]
fn an_expired_approval_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), HOLD_POLICY, "approval_ttl_s = 1");
    let s = start(dir.path(), &cfg);
    let sid = session(&s, AGENT);
    let id = held_approval(&setpoint(&s, AGENT, &sid, "ttl-1", 61.0));
    std::thread::sleep(Duration::from_millis(1300));
    let e = decide(&s, ALICE, &id, "approve");
    assert_rpc_error(&e["error"], "MHS.POLICY.APPROVAL_EXPIRED");
    let r = setpoint(&s, AGENT, &sid, "ttl-1", 61.0);
    assert_rejected(&r, "MHS.POLICY.APPROVAL_EXPIRED");
    assert_eq!(
        ok(
            &s,
            ALICE,
            "mhs.approvals.list",
            json!({"status": "expired"})
        )["approvals"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
}

fn tether_with_token(token: &str, args: &[&OsStr]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(BIN)
        .args(args)
        .env("TETHER_TOKEN", token)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run tether");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn operators_decide_from_the_cli() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), HOLD_POLICY, "");
    let s = start(dir.path(), &cfg);
    let sid = session(&s, AGENT);
    let id = held_approval(&setpoint(&s, AGENT, &sid, "cli-1", 62.0));
    let url = format!("http://{}/rpc", s.addr());
    let endpoint = [OsStr::new("--endpoint"), OsStr::new(url.as_str())];

    let (code, out, _) = tether_with_token(
        ALICE,
        &[
            &[OsStr::new("approvals"), OsStr::new("list")][..],
            &endpoint[..],
        ]
        .concat(),
    );
    assert_eq!(code, Some(0));
    assert!(out.contains(&id) && out.contains("pending"), "{out}");

    // An agent's token cannot decide from the CLI either.
    let (code, _, err_text) = tether_with_token(
        AGENT,
        &[
            &[
                OsStr::new("approvals"),
                OsStr::new("approve"),
                OsStr::new(id.as_str()),
            ][..],
            &endpoint[..],
        ]
        .concat(),
    );
    assert_eq!(code, Some(1), "{err_text}");
    assert!(err_text.contains("MHS.AUTH.FORBIDDEN"), "{err_text}");

    for token in [ALICE, BOB] {
        let (code, out, err_text) = tether_with_token(
            token,
            &[
                &[
                    OsStr::new("approvals"),
                    OsStr::new("approve"),
                    OsStr::new(id.as_str()),
                ][..],
                &endpoint[..],
            ]
            .concat(),
        );
        assert_eq!(code, Some(0), "{out}{err_text}");
    }
    assert_eq!(
        setpoint(&s, AGENT, &sid, "cli-1", 62.0)["status"],
        "completed"
    );
}

#[test]
fn invalid_policies_refuse_start_up_naming_the_policy_and_the_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = r#"@id("typo-rule") permit(principal, action, resource) when { resource.capabilty == "x" };"#;
    let cfg = write_config(dir.path(), bad, "");
    let run = tether(&[
        OsStr::new("serve"),
        OsStr::new("--config"),
        cfg.as_os_str(),
        OsStr::new("--state-dir"),
        dir.path().join("state").as_os_str(),
        OsStr::new("--http"),
        OsStr::new("127.0.0.1:0"),
    ]);
    assert_ne!(run.code, Some(0));
    assert!(
        run.stderr.contains("policy.cedar") && run.stderr.contains("typo-rule"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("capabilty"),
        "the error names the attribute: {}",
        run.stderr
    );

    let check = tether(&[OsStr::new("check"), cfg.as_os_str()]);
    assert_eq!(check.code, Some(1), "{}", check.stderr);
    assert!(check.stderr.contains("typo-rule"), "{}", check.stderr);

    let unparsable = write_config(dir.path(), "permit(principal, action", "");
    let run = tether(&[OsStr::new("check"), unparsable.as_os_str()]);
    assert_eq!(run.code, Some(1));
    assert!(run.stderr.contains("does not parse"), "{}", run.stderr);

    let good = write_config(dir.path(), HOLD_POLICY, "");
    let run = tether(&[OsStr::new("check"), good.as_os_str()]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stdout_text().contains("hot-setpoints"),
        "{}",
        run.stdout_text()
    );

    let file = dir.path().join("policy.cedar");
    let run = tether(&[OsStr::new("check"), file.as_os_str()]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
}

/// A REST invocation of `path` (`GET` when `body` is empty) with `token`.
fn rest(s: &Server, token: &str, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let text = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let headers = format!("Authorization: Bearer {token}\r\n");
    let r = http_request(s.addr(), method, path, text.as_bytes(), TIMEOUT, &headers);
    (r.status, r.json())
}

/// Through the REST gateway a hold is an error that names its approval and
/// keeps the invocation (rejected, with the hold's receipt); once approved,
/// the same `command_id` resumes it as a new invocation that completes.
#[test]
fn a_rest_invocation_held_for_approval_then_resumed_by_command_id() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), HOLD_POLICY, "");
    let s = start(dir.path(), &cfg);
    let invoke = "/tools/thermostat-1__setpoint:invoke";
    let hot = json!({"input": {"target_temperature": 70.0}, "command_id": "rest-hot-1"});

    let (status, held) = rest(&s, AGENT, "POST", invoke, &hot);
    assert_eq!(held["ok"], false, "{held}");
    assert_eq!(held["error"]["code"], "MHS.POLICY.HELD", "{held}");
    assert_ne!(status, 202, "{held}");
    let details = &held["error"]["details"];
    let approval = details["receipt"]["error"]["details"]["approval_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no approval id: {held}"))
        .to_owned();
    let inv = details["invocation_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no invocation id: {held}"))
        .to_owned();
    // The invocation is retained, rejected with the hold, and nothing ran.
    let (status, record) = rest(
        &s,
        AGENT,
        "GET",
        &format!("/invocations/{inv}"),
        &Value::Null,
    );
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["data"]["status"], "rejected", "{record}");
    assert_eq!(record["data"]["terminal"], true, "{record}");
    let sid = session(&s, AGENT);
    assert_ne!(live_setpoint(&s, AGENT, &sid), 70.0);

    // Two operators approve; the same command_id and input resume it.
    decide(&s, ALICE, &approval, "approve");
    assert_eq!(
        decide(&s, BOB, &approval, "approve")["result"]["status"],
        "approved"
    );
    let (status, resumed) = rest(&s, AGENT, "POST", invoke, &hot);
    assert_eq!(status, 202, "{resumed}");
    let again = resumed["data"]["invocation_id"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_ne!(again, inv, "a new invocation");
    let mut done = Value::Null;
    for _ in 0..200 {
        let (status, r) = rest(
            &s,
            AGENT,
            "GET",
            &format!("/invocations/{again}/result"),
            &Value::Null,
        );
        if status == 200 {
            done = r;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(done["data"]["status"], "completed", "{done}");
    assert_eq!(live_setpoint(&s, AGENT, &sid), 70.0);
}

/// A REST invocation without a `command_id` that repeats an open hold takes
/// the hold's id: it answers the same hold while pending, and runs once the
/// quorum approved (as a request without its own id does over JSON-RPC).
#[test]
fn a_rest_invocation_without_a_command_id_resumes_the_hold_it_repeats() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), HOLD_POLICY, "");
    let s = start(dir.path(), &cfg);
    let invoke = "/tools/thermostat-1__setpoint:invoke";
    let hot = json!({"input": {"target_temperature": 71.0}});
    let approval_of = |answer: &Value| {
        assert_eq!(answer["error"]["code"], "MHS.POLICY.HELD", "{answer}");
        answer["error"]["details"]["receipt"]["error"]["details"]["approval_id"]
            .as_str()
            .unwrap_or_else(|| panic!("no approval id: {answer}"))
            .to_owned()
    };
    let (_, first) = rest(&s, AGENT, "POST", invoke, &hot);
    let approval = approval_of(&first);
    let (_, again) = rest(&s, AGENT, "POST", invoke, &hot);
    assert_eq!(approval_of(&again), approval, "the same hold: {again}");
    for op in [ALICE, BOB] {
        let d = decide(&s, op, &approval, "approve");
        assert!(d.get("error").is_none(), "{d}");
    }
    let (status, resumed) = rest(&s, AGENT, "POST", invoke, &hot);
    assert_eq!(status, 202, "{resumed}");
    let inv = resumed["data"]["invocation_id"]
        .as_str()
        .expect("id")
        .to_owned();
    let mut done = Value::Null;
    poll_until("the resumed invocation ends", TIMEOUT, || {
        let (status, r) = rest(
            &s,
            AGENT,
            "GET",
            &format!("/invocations/{inv}/result"),
            &Value::Null,
        );
        done = r;
        status == 200
    });
    assert_eq!(done["data"]["status"], "completed", "{done}");
    let status = ok(
        &s,
        ALICE,
        "mhs.approvals.get",
        json!({"approval_id": approval}),
    );
    assert_eq!(status["status"], "used", "{status}");
}

// ----- MCP over HTTP, raw: tests/common/mcp_http.rs ----------------------

/// The approval id a held tool result names (`appr_...`).
fn named_approval(text: &str) -> String {
    let at = text
        .find("appr_")
        .unwrap_or_else(|| panic!("no approval id in: {text}"));
    text[at..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// An MCP tool call that the policy holds can be resumed by repeating it:
/// the repeat names the same approval while it is pending, and once the
/// quorum approved, the same call runs and spends the approval.
#[test]
fn an_mcp_tool_call_repeated_after_approval_resumes_the_hold() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), HOLD_POLICY, "");
    let s = Server::start_with(
        Transport::Http,
        Some(&dir.path().join("state")),
        &[
            OsStr::new("--config"),
            cfg.as_os_str(),
            OsStr::new("--mcp-http"),
            OsStr::new("127.0.0.1:0"),
        ],
    );
    let addr = mcp_addr(&s);
    let sid = mcp_session(addr, AGENT);
    let call = |id: u64| {
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "thermostat-1__setpoint", "arguments": {"target_temperature": 72.0}}});
        mcp_post(addr, AGENT, Some(&sid), &msg).0
    };
    let first = call(2);
    assert_eq!(first["result"]["isError"], true, "{first}");
    let approval = named_approval(&tool_text(&first));
    let again = call(3);
    assert_eq!(
        named_approval(&tool_text(&again)),
        approval,
        "the same hold: {again}"
    );
    assert_one_pending(&s);
    for op in [ALICE, BOB] {
        let d = decide(&s, op, &approval, "approve");
        assert!(d.get("error").is_none(), "{d}");
    }
    let done = call(4);
    assert_ne!(done["result"]["isError"], true, "{done}");
    let rpc_sid = session(&s, AGENT);
    assert_eq!(live_setpoint(&s, AGENT, &rpc_sid), 72.0);
    let used = ok(
        &s,
        ALICE,
        "mhs.approvals.get",
        json!({"approval_id": approval}),
    );
    assert_eq!(used["status"], "used", "{used}");
}

/// Humans act unheld, agents wait for an operator.
const AGENTS_WAIT_POLICY: &str = r#"
@id("reads") permit(principal, action == Tether::Action::"read", resource);
@id("humans") permit(principal is Tether::Human, action, resource);
@id("agents-wait") @hold("agents wait for an operator")
permit(principal is Tether::Agent, action, resource);
"#;

fn start_with_mcp(dir: &Path, cfg: &Path) -> Server {
    Server::start_with(
        Transport::Http,
        Some(&dir.join("state")),
        &[
            OsStr::new("--config"),
            cfg.as_os_str(),
            OsStr::new("--mcp-http"),
            OsStr::new("127.0.0.1:0"),
        ],
    )
}

/// Whoever's token it holds, an MCP caller is a model: the policy sees an
/// agent, so an operator's token through MCP is held where the operator
/// over JSON-RPC is not.
#[test]
fn an_mcp_caller_with_an_operators_token_is_an_agent_to_the_policy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), AGENTS_WAIT_POLICY, "");
    let s = start_with_mcp(dir.path(), &cfg);
    let sid = session(&s, ALICE);
    let direct = setpoint(&s, ALICE, &sid, "alice-direct-1", 40.0);
    assert_eq!(direct["status"], "completed", "{direct}");
    let addr = mcp_addr(&s);
    let mcp_sid = mcp_session(addr, ALICE);
    let msg = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "thermostat-1__setpoint", "arguments": {"target_temperature": 41.0}}});
    let (answer, _) = mcp_post(addr, ALICE, Some(&mcp_sid), &msg);
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    let text = tool_text(&answer);
    assert!(text.contains("MHS.POLICY.HELD"), "{text}");
}

/// An MCP session belongs to the principal that opened it: another
/// principal's request in it reads as an unknown session.
#[test]
fn an_mcp_session_refuses_another_principals_requests() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), HOLD_POLICY, "");
    let s = start_with_mcp(dir.path(), &cfg);
    let addr = mcp_addr(&s);
    let mcp_sid = mcp_session(addr, AGENT);
    let list = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list", "params": {}});
    let headers = format!(
        "Authorization: Bearer {SERVICE}\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-11-25\r\nMcp-Session-Id: {mcp_sid}\r\n"
    );
    let r = http_request(
        addr,
        "POST",
        "/mcp",
        list.to_string().as_bytes(),
        TIMEOUT,
        &headers,
    );
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(
        r.json()["error"]["data"]["details"]["reason"],
        "session_unknown",
        "{}",
        r.text()
    );
    // The owner still uses it.
    let (answer, _) = mcp_post(addr, AGENT, Some(&mcp_sid), &list);
    assert!(answer["result"]["tools"].is_array(), "{answer}");
}

/// A `command_id` belongs to the principal that used it: another principal
/// sending it (same binding, same input) is refused, never handed the
/// first principal's receipt.
#[test]
fn a_command_id_is_bound_to_its_principal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), HOLD_POLICY, "");
    let s = start(dir.path(), &cfg);
    let sid = session(&s, AGENT);
    let first = setpoint(&s, AGENT, &sid, "shared-id-1", 30.0);
    assert_eq!(first["status"], "completed", "{first}");
    let bob_sid = session(&s, BOB);
    let other = setpoint(&s, BOB, &bob_sid, "shared-id-1", 30.0);
    assert_rejected(&other, "MHS.CONFLICT.COMMAND_ID_REUSE");
    assert_ne!(other["receipt_id"], first["receipt_id"], "{other}");
    // The owner still replays it.
    let again = setpoint(&s, AGENT, &sid, "shared-id-1", 30.0);
    assert_eq!(again["replayed"], true, "{again}");
    assert_eq!(again["receipt_id"], first["receipt_id"], "{again}");
}

/// Two `Authorization` headers naming two principals: which one is the
/// caller would be a guess, so the request is refused.
#[test]
fn a_request_with_two_authorization_headers_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), HOLD_POLICY, "");
    let s = start(dir.path(), &cfg);
    let two = format!("Authorization: Bearer {AGENT}\r\nAuthorization: Bearer {ALICE}\r\n");
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "mhs.hello", "params": {}}).to_string();
    let r = http_post_with(s.addr(), body.as_bytes(), TIMEOUT, &two);
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(
        r.json()["error"]["data"]["details"]["reason"],
        "multiple_authorization_headers",
        "{}",
        r.text()
    );
    let r = http_request(s.addr(), "GET", "/tools", b"", TIMEOUT, &two);
    assert_eq!(r.status, 401, "{}", r.text());
}

/// An approval given under a quorum of one does not cover a command the
/// policy now holds for two: the resume is weighed again, the approval
/// reopens for the missing vote, and only then does the command run.
#[test]
fn a_resume_is_held_again_when_the_policy_now_asks_for_a_larger_quorum() {
    let dir = tempfile::tempdir().expect("tempdir");
    let one = HOLD_POLICY.replace("@quorum(\"2\")", "@quorum(\"1\")");
    let cfg = write_config(dir.path(), &one, "");
    let mut s = start(dir.path(), &cfg);
    let sid = session(&s, AGENT);
    let id = held_approval(&setpoint(&s, AGENT, &sid, "quorum-up-1", 67.0));
    assert_eq!(
        decide(&s, ALICE, &id, "approve")["result"]["status"],
        "approved"
    );
    s.kill();

    let cfg = write_config(dir.path(), HOLD_POLICY, "");
    let s = start(dir.path(), &cfg);
    let sid = session(&s, AGENT);
    let again = setpoint(&s, AGENT, &sid, "quorum-up-1", 67.0);
    assert_eq!(
        held_approval(&again),
        id,
        "the same approval, reopened: {again}"
    );
    assert_ne!(live_setpoint(&s, AGENT, &sid), 67.0);
    let got = ok(&s, BOB, "mhs.approvals.get", json!({"approval_id": id}));
    assert_eq!(got["status"], "pending", "{got}");
    assert_eq!(got["quorum"], 2, "{got}");
    assert_eq!(
        decide(&s, BOB, &id, "approve")["result"]["status"],
        "approved"
    );
    let done = setpoint(&s, AGENT, &sid, "quorum-up-1", 67.0);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["policy"]["quorum"], 2, "{done}");
}

/// A relay bank whose switch is a two-person extension.
fn two_person_relay() -> String {
    include_str!("../../tether-drivers/cell/relay-1.toml")
        .replace("device_id = \"relay-1\"", "device_id = \"relay-2p\"")
        .replace(
            "capability_id = \"cap.io.relay.v1\"",
            "capability_id = \"x-cap.acme.switch.v1\"\nflags = { two_person = true }\noutput_schema = { type = \"object\" }",
        )
        .replace(
            "input_schema = { properties = { channel = { maximum = 3 } } }",
            "input_schema = { type = \"object\", additionalProperties = false, required = [\"channel\", \"on\"], properties = { channel = { type = \"integer\" }, on = { type = \"boolean\" } } }",
        )
}

/// A binding flagged `two_person` runs only on the approval of two distinct
/// operators, even where the policy allows it outright (a simulated device),
/// and `mhs.safety.permit` never stands in for them.
#[test]
fn a_two_person_operation_needs_two_operators_whatever_the_policy_says() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("relay-2p.toml"), two_person_relay()).expect("manifest");
    let cfg = write_config(dir.path(), HOLD_POLICY, "devices = [\"relay-2p.toml\"]");
    let s = start(dir.path(), &cfg);
    let sid = session(&s, AGENT);
    let cmd = json!({"session_id": sid, "device_id": "relay-2p", "capability_id": "x-cap.acme.switch.v1", "input": {"channel": 1, "on": true}, "command_id": "two-person-1"});
    let mut ask = cmd.clone();
    ask.as_object_mut().expect("object").remove("command_id");
    let permit = err(&s, AGENT, "mhs.safety.permit", ask);
    assert_eq!(
        permit["data"]["mhs_code"], "MHS.SAFETY.APPROVAL_REQUIRED",
        "{permit}"
    );
    let first = ok(&s, AGENT, "mhs.command", cmd.clone());
    let d = assert_rejected(&first, "MHS.SAFETY.APPROVAL_REQUIRED");
    assert_eq!(d["quorum"], 2, "{first}");
    let approval = d["approval_id"].as_str().expect("approval").to_owned();
    assert_eq!(
        decide(&s, ALICE, &approval, "approve")["result"]["status"],
        "pending"
    );
    let still = ok(&s, AGENT, "mhs.command", cmd.clone());
    assert_rejected(&still, "MHS.SAFETY.APPROVAL_REQUIRED");
    assert_eq!(
        decide(&s, BOB, &approval, "approve")["result"]["status"],
        "approved"
    );
    let done = ok(&s, AGENT, "mhs.command", cmd);
    assert_eq!(done["status"], "completed", "{done}");
}

/// The built-in arm as a hardware device `arm-hw`.
fn hardware_arm() -> String {
    as_hardware(
        &include_str!("../../tether-drivers/cell/arm-1.toml")
            .replace("device_id = \"arm-1\"", "device_id = \"arm-hw\""),
    )
}

/// On a latched hardware arm, the operator's safe-place grant is her
/// decision on that exact park: it runs without a second operator, under
/// the default policy that holds hardware R2 actions.
#[test]
fn a_safe_place_grant_is_the_operators_decision_under_the_default_policy() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("arm-hw.toml"), hardware_arm()).expect("manifest");
    std::fs::write(
        dir.path().join("policy.cedar"),
        include_str!("../../tether-policy/default.cedar"),
    )
    .expect("policy");
    let mut text = String::from("devices = [\"arm-hw.toml\"]\npolicy = \"policy.cedar\"\n");
    text.push_str(&principal("alice", "human", "\"operator\"", ALICE));
    let cfg = dir.path().join("tether.toml");
    std::fs::write(&cfg, text).expect("config");
    let s = start(dir.path(), &cfg);
    let stop = call(
        &s,
        ALICE,
        "mhs.safety.estop",
        json!({"device_id": "arm-hw"}),
    );
    assert_eq!(stop["result"]["output"]["latched"], true, "{stop}");
    let park = json!({"device_id": "arm-hw", "capability_id": "cap.motion.park.v1", "input": {}});
    let grant = ok(&s, ALICE, "mhs.safety.grant_safe_place", park.clone());
    let sid = session(&s, ALICE);
    let mut cmd = park;
    cmd["session_id"] = json!(sid);
    cmd["safe_place_grant"] = grant["grant_id"].clone();
    let done = ok(&s, ALICE, "mhs.command", cmd.clone());
    assert_eq!(done["status"], "completed", "{done}");
    // Single use: the same again is refused by the latch.
    cmd["command_id"] = json!("park-again-1");
    let again = ok(&s, ALICE, "mhs.command", cmd);
    assert_rejected(&again, "MHS.SAFETY.ESTOP_ENGAGED");
}

/// Two endpoints on one state directory: a hold made by one appears in the
/// other within a second, with the input, limits and facts an operator
/// decides on; votes cast in the second (a quorum of two) let the agent's
/// retry in the first run at once, and a third endpoint started later sees
/// the approval used.
#[test]
fn a_hold_made_in_one_process_is_decided_in_another_and_the_retry_runs_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), HOLD_POLICY, "");
    let a = start(dir.path(), &cfg);
    let b = start(dir.path(), &cfg);
    let sid = session(&a, AGENT);
    let id = held_approval(&setpoint(&a, AGENT, &sid, "hot-x", 72.5));

    // Seen by the other endpoint within a second, with what it is about.
    let t0 = std::time::Instant::now();
    let seen = loop {
        let got = call(&b, ALICE, "mhs.approvals.get", json!({"approval_id": id}));
        if let Some(r) = got.get("result") {
            break r.clone();
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "never seen: {got}");
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!("hold seen by the other endpoint after {:?}", t0.elapsed());
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    assert_eq!(seen["input"], json!({"target_temperature": 72.5}), "{seen}");
    assert_eq!(
        seen["limits"]["limits"]["target_temperature"]["max"], 90,
        "{seen}"
    );
    assert_eq!(
        seen["limits"]["limits"]["target_temperature"]["unit"], "degC",
        "{seen}"
    );
    for key in [
        "device_id",
        "capability_id",
        "mode",
        "risk",
        "session_id",
        "reason",
        "policies",
        "quorum",
        "expires_at_ms",
    ] {
        assert!(!seen[key].is_null(), "{key} missing: {seen}");
    }
    assert_eq!(seen["requested_by"]["id"], "planner", "{seen}");
    let listed = ok(&b, BOB, "mhs.approvals.list", json!({"status": "pending"}));
    assert_eq!(
        listed["approvals"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );

    // Two operators approve on the other endpoint.
    for token in [ALICE, BOB] {
        let r = decide(&b, token, &id, "approve");
        assert!(r.get("error").is_none(), "{r}");
    }
    // The retry on the first endpoint runs at once.
    let done = setpoint(&a, AGENT, &sid, "hot-x", 72.5);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(live_setpoint(&a, AGENT, &sid), 72.5);

    // Used: the other endpoint says so, and a vote there is refused.
    let t0 = std::time::Instant::now();
    loop {
        let got = ok(&b, ALICE, "mhs.approvals.get", json!({"approval_id": id}));
        if got["status"] == "used" {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "{got}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The same command sent to the other endpoint never runs twice: its
    // approval is spent there too (or its receipt replays).
    let again = setpoint(&b, AGENT, &session(&b, AGENT), "hot-x", 72.5);
    assert!(
        again["replayed"] == true || again["error"]["mhs_code"] == "MHS.POLICY.APPROVAL_CLOSED",
        "{again}"
    );
    let closed = decide(&b, CAROL, &id, "approve");
    assert!(closed.get("error").is_some(), "{closed}");
}

/// A `tether mcp` on stdio, talked to line by line.
struct McpStdio {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
}

impl McpStdio {
    fn start(dir: &Path, cfg: &Path, token: &str) -> McpStdio {
        let mut child = std::process::Command::new(BIN)
            .args(["mcp", "--config"])
            .arg(cfg)
            .arg("--state-dir")
            .arg(dir.join("state"))
            .env("TETHER_TOKEN", token)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn tether mcp");
        let stdin = child.stdin.take().expect("stdin");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufRead::lines(std::io::BufReader::new(out)).map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut m = McpStdio {
            child,
            stdin,
            lines,
        };
        m.ask(
            1,
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "approvals-test", "version": "1"}}),
        );
        m.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        m
    }

    fn send(&mut self, v: &Value) {
        use std::io::Write;
        writeln!(self.stdin, "{v}").expect("write to tether mcp");
    }

    fn ask(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let deadline = std::time::Instant::now() + TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no answer to {method}"));
            let v: Value = serde_json::from_str(&line).expect("JSON");
            if v["id"] == json!(id) {
                return v;
            }
        }
    }
}

impl Drop for McpStdio {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The issue's own scenario: a hold asked through `tether mcp` (stdio) is
/// listed by `tether approvals list` against a `tether serve` on the same
/// state directory within a second; approved there by two operators, the
/// running `tether mcp`'s repeated call runs at once.
#[test]
fn a_hold_asked_over_stdio_mcp_is_approved_from_the_cli_and_the_repeat_runs_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), HOLD_POLICY, "");
    let serve = start(dir.path(), &cfg);
    let mut mcp = McpStdio::start(dir.path(), &cfg, AGENT);
    let call = json!({"name": "thermostat-1__setpoint", "arguments": {"target_temperature": 71.5}});
    let held = mcp.ask(2, "tools/call", call.clone());
    assert_eq!(held["result"]["isError"], true, "{held}");
    let text = held["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(
        text.contains("a person must approve") && text.contains("It needs 2 operators"),
        "{text}"
    );
    let id = held["result"]["structuredContent"]["error"]["details"]["approval_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no approval id: {held}"))
        .to_owned();
    let endpoint = format!("http://{}/rpc", serve.addr());
    let t0 = std::time::Instant::now();
    loop {
        let (code, out, _) = tether_with_token(
            ALICE,
            &[
                OsStr::new("approvals"),
                OsStr::new("list"),
                OsStr::new("--endpoint"),
                OsStr::new(&endpoint),
            ],
        );
        if code == Some(0) && out.contains(&id) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "never listed: {out}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "listed after {:?}",
        t0.elapsed()
    );
    for token in [ALICE, BOB] {
        let (code, out, err) = tether_with_token(
            token,
            &[
                OsStr::new("approvals"),
                OsStr::new("approve"),
                OsStr::new(&id),
                OsStr::new("--endpoint"),
                OsStr::new(&endpoint),
            ],
        );
        assert_eq!(code, Some(0), "{out}{err}");
    }
    let t1 = std::time::Instant::now();
    let done = mcp.ask(3, "tools/call", call);
    assert_ne!(done["result"]["isError"], true, "{done}");
    assert!(t1.elapsed() < Duration::from_secs(5), "{:?}", t1.elapsed());
    // Each process drives its own simulated thermostat: the receipt says
    // the stdio endpoint's ran.
    assert_eq!(
        done["result"]["structuredContent"]["status"], "completed",
        "{done}"
    );
}
