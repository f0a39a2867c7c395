//! Evaluation step 6 on physical devices: hardware actuation needs an armed
//! device (only an operator arms, anyone disarms, a disarm survives a
//! restart), and a model never commands a resource the hardware side of a
//! hybrid device drives.
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
use std::path::{Path, PathBuf};

const AGENT: &str = "arming-agent-token";
const ALICE: &str = "arming-alice-token";
const RELAY: &str = "relay-hw";

fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

/// The built-in relay bank as a `mode` device (no fidelity: not simulated),
/// with `extra` added to its resource table.
fn relay_manifest(mode: &str, resource_extra: &str) -> String {
    let text = include_str!("../../tether-drivers/cell/relay-1.toml")
        .replace("device_id = \"relay-1\"", &format!("device_id = \"{RELAY}\""))
        .replace("mode = \"simulated\"", &format!("mode = \"{mode}\""))
        .replace(
            "[fidelity]\nkind = \"simulated\"\nnotes = \"Ideal relays: switch instantly, never weld or bounce.\"\n",
            "",
        )
        // On hardware a time_bounded binding declares its bound.
        .replace(
            "kind = \"time_bounded\"\n",
            "kind = \"time_bounded\"\nmax_duration_ms = 2000\n",
        )
        .replace(
            "description = \"Relay channel states.\"",
            &format!("description = \"Relay channel states.\"\n{resource_extra}"),
        );
    assert!(
        !text.contains("[fidelity]") && text.contains("max_duration_ms"),
        "relay-1.toml changed; update the test"
    );
    text
}

fn write_config(dir: &Path, manifest: &str, extra: &str) -> PathBuf {
    std::fs::write(dir.join("relay.toml"), manifest).expect("manifest");
    let text = format!(
        "devices = [\"relay.toml\"]\n{extra}\n[[principals]]\nid = \"planner\"\nkind = \"agent\"\ntoken_sha256 = \"{}\"\n\n[[principals]]\nid = \"alice\"\nkind = \"human\"\nroles = [\"operator\"]\ntoken_sha256 = \"{}\"\n",
        sha256_hex(AGENT),
        sha256_hex(ALICE)
    );
    let path = dir.join("tether.toml");
    std::fs::write(&path, text).expect("config");
    path
}

fn switch(s: &Server, token: &str, channel: u64) -> Value {
    let sid = call_with_token(s, token, "mhs.session.open", json!({}))["result"]["session_id"]
        .as_str()
        .expect("session")
        .to_owned();
    call_with_token(s,
        token,
        "mhs.command",
        json!({"session_id": sid, "device_id": RELAY, "capability_id": "cap.io.relay.v1", "input": {"channel": channel, "on": true}}),
    )["result"]
        .clone()
}

fn armed(s: &Server) -> Value {
    call_with_token(s, ALICE, "mhs.safety.status", json!({"device_id": RELAY}))["result"]["devices"]
        [0]["armed"]
        .clone()
}

#[test]
fn hardware_actuation_needs_an_armed_device_and_only_an_operator_arms() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(
        dir.path(),
        &relay_manifest("hardware", ""),
        "hardware_armed_at_start = false",
    );
    let mut s = start_with_config(dir.path(), &cfg);
    assert_eq!(armed(&s), false);
    let refused = switch(&s, AGENT, 1);
    let d = assert_rejected(&refused, "MHS.AUTH.HARDWARE_DISABLED");
    assert_eq!(d["reason"], "not_armed", "{refused}");
    // An e-stop is never refused for it.
    let stop = call_with_token(&s, AGENT, "mhs.safety.estop", json!({"device_id": RELAY}));
    assert_eq!(stop["result"]["output"]["latched"], true, "{stop}");
    let reset = call_with_token(&s, ALICE, "mhs.safety.reset", json!({"device_id": RELAY}));
    assert_eq!(reset["result"]["status"], "completed", "{reset}");

    // A model may not arm; an operator may.
    let no = call_with_token(&s, AGENT, "mhs.safety.arm", json!({"device_id": RELAY}));
    assert_rpc_error(&no["error"], "MHS.AUTH.FORBIDDEN");
    let yes = call_with_token(
        &s,
        ALICE,
        "mhs.safety.arm",
        json!({"device_id": RELAY, "reason": "shift start"}),
    );
    assert_eq!(yes["result"]["armed"], true, "{yes}");
    assert_eq!(armed(&s), true);
    assert_eq!(switch(&s, AGENT, 1)["status"], "completed");

    // Anyone may disarm; the disarm is durable across a restart that would
    // otherwise arm the device.
    let off = call_with_token(&s, AGENT, "mhs.safety.disarm", json!({"device_id": RELAY}));
    assert_eq!(off["result"]["armed"], false, "{off}");
    assert_rejected(&switch(&s, AGENT, 2), "MHS.AUTH.HARDWARE_DISABLED");
    s.kill();
    let cfg = write_config(dir.path(), &relay_manifest("hardware", ""), "");
    let s = start_with_config(dir.path(), &cfg);
    assert_eq!(armed(&s), false, "a disarm survives a restart");
    let yes = call_with_token(&s, ALICE, "mhs.safety.arm", json!({"device_id": RELAY}));
    assert_eq!(yes["result"]["armed"], true, "{yes}");
    assert_eq!(switch(&s, AGENT, 2)["status"], "completed");

    // Every change is evidence.
    let export = tether(&[
        OsStr::new("audit"),
        OsStr::new("export"),
        OsStr::new("--state-dir"),
        dir.path().join("state").as_os_str(),
    ]);
    let arming = export
        .stdout_text()
        .lines()
        .filter(|l| l.contains("\"safety.arming\""))
        .count();
    assert_eq!(arming, 3, "arm, disarm, arm");
}

#[test]
fn a_simulated_device_is_always_armed() {
    let s = Server::http();
    let r = s.call("mhs.safety.disarm", json!({"device_id": "relay-1"}));
    let d = assert_rpc_error(&r["error"], "MHS.PROTOCOL.INVALID_PARAMS");
    assert_eq!(d["reason"], "not_physical", "{r}");
    assert_eq!(s.status_of("relay-1")["armed"], true);
}

#[test]
fn a_model_never_commands_a_hardware_authority_resource_of_a_hybrid_device() {
    let dir = tempfile::tempdir().expect("tempdir");
    // No authority declared: on a hybrid device the hardware side drives it.
    let cfg = write_config(dir.path(), &relay_manifest("hybrid", ""), "");
    let mut s = start_with_config(dir.path(), &cfg);
    let refused = switch(&s, AGENT, 1);
    let d = assert_rejected(&refused, "MHS.SAFETY.ENVELOPE_VIOLATION");
    assert_eq!(d["authority"], "hardware", "{refused}");
    assert_eq!(switch(&s, ALICE, 1)["status"], "completed", "a person may");
    s.kill();
    let cfg = write_config(
        dir.path(),
        &relay_manifest("hybrid", "authority = \"model\""),
        "",
    );
    let s = start_with_config(dir.path(), &cfg);
    assert_eq!(switch(&s, AGENT, 3)["status"], "completed");
}

#[test]
fn authority_is_declared_only_on_a_hybrid_device() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(
        dir.path(),
        &relay_manifest("hardware", "authority = \"model\""),
        "",
    );
    let run = tether(&[OsStr::new("check"), cfg.as_os_str()]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains("resources[0].authority"),
        "{}",
        run.stderr
    );
}

/// Two endpoints on one state directory: a command id runs once there (the
/// second endpoint, serving the relay simulated — a physical device has one
/// owner, `fleet.rs` — answers the first one's receipt), and a disarm
/// answered by the owner binds the next owner of the device.
#[test]
fn endpoints_sharing_a_state_directory_run_an_id_once_and_keep_one_disarm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), &relay_manifest("hardware", ""), "");
    let sim_dir = dir.path().join("sim");
    std::fs::create_dir_all(&sim_dir).expect("dir");
    let simulated = include_str!("../../tether-drivers/cell/relay-1.toml").replace(
        "device_id = \"relay-1\"",
        &format!("device_id = \"{RELAY}\""),
    );
    let sim_cfg = write_config(&sim_dir, &simulated, "");
    let mut a = start_with_config(dir.path(), &cfg);
    let b = Server::start_with(
        Transport::Http,
        Some(&dir.path().join("state")),
        &[std::ffi::OsStr::new("--config"), sim_cfg.as_os_str()],
    );
    let run = |s: &Server, id: &str| {
        let sid = call_with_token(s, AGENT, "mhs.session.open", json!({}))["result"]["session_id"]
            .as_str()
            .expect("session")
            .to_owned();
        call_with_token(
            s,
            AGENT,
            "mhs.command",
            json!({"session_id": sid, "device_id": RELAY, "capability_id": "cap.io.relay.v1", "input": {"channel": 0, "on": true}, "command_id": id}),
        )["result"]
            .clone()
    };
    let first = run(&a, "shared-once-1");
    assert_eq!(first["status"], "completed", "{first}");
    let second = run(&b, "shared-once-1");
    assert_eq!(second["replayed"], true, "{second}");
    assert_eq!(second["receipt_id"], first["receipt_id"], "{second}");

    let off = call_with_token(&a, AGENT, "mhs.safety.disarm", json!({"device_id": RELAY}));
    assert_eq!(off["result"]["durable"], true, "{off}");
    assert_rejected(&run(&a, "after-disarm-1"), "MHS.AUTH.HARDWARE_DISABLED");
    // The owner stops in order; the next owner finds the relay disarmed.
    let status = a.terminate().expect("exit");
    assert!(status.success(), "{status:?}");
    let next = start_with_config(dir.path(), &cfg);
    assert_rejected(&run(&next, "after-disarm-2"), "MHS.AUTH.HARDWARE_DISABLED");
}
