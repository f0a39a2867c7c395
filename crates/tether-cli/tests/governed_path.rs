//! The governed path end to end, over HTTP and over stdio: the thermostat
//! sequence, `command_id` replay and reuse, write refusals, binding and
//! session refusals. Every refusal leaves the revision where it was.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

use common::{assert_rejected, assert_rpc_error, Server, Transport};
use serde_json::{json, Value};

const T: &str = "thermostat-1";
const SETPOINT: &str = "cap.thermal.setpoint.v1";

fn setpoint(sid: &str, target: Value, command_id: Option<&str>) -> Value {
    let mut p = json!({"session_id": sid, "device_id": T, "capability_id": SETPOINT, "input": {"target_temperature": target}});
    if let Some(id) = command_id {
        p["command_id"] = json!(id);
    }
    p
}

/// A receipt without its `replayed` flag, for comparing a replay with the original.
fn without_replayed(r: &Value) -> Value {
    let mut r = r.clone();
    if let Some(m) = r.as_object_mut() {
        m.remove("replayed");
    }
    r
}

// ----- 1. the thermostat sequence ----------------------------------------

fn thermostat_sequence(s: &Server) {
    let hello = s.ok("mhs.hello", json!({}));
    let features = hello["features"].as_array().expect("features");
    assert!(
        features.iter().any(|f| f == "MHS.SAFETY.NOT_CERTIFIED"),
        "hello features: {hello}"
    );

    let sid = s.session();
    assert!(sid.starts_with("mhs_s_"), "session id {sid}");

    // A fresh state directory: revision 0, the declared state.
    let r0 = s.read(&sid, T, "main");
    assert_eq!(r0["revision"], 0, "first read: {r0}");
    assert_eq!(r0["device_id"], T);
    assert_eq!(r0["mode"], "simulated");
    assert!(r0["state"]["temperature"].is_number(), "state: {r0}");
    assert_eq!(
        r0["state"]["setpoint"].as_f64(),
        Some(20.0),
        "initial setpoint: {r0}"
    );

    // A configure write.
    let w = s.ok(
        "mhs.resource.write",
        json!({"session_id": sid, "device_id": T, "resource": "main", "patch": {"setpoint": 40}}),
    );
    assert_eq!(w["status"], "completed", "write receipt: {w}");
    assert_eq!(w["capability_id"], "cap.device.configure.v1");
    assert_eq!(
        w["output"]["applied"],
        json!({"setpoint": 40}),
        "write receipt: {w}"
    );
    assert_eq!(w["state_revision_before"], 0);
    assert_eq!(w["state_revision_after"], 1);
    assert_eq!(w["output"]["revision"], 1);
    assert_eq!(w["replayed"], false);
    let r1 = s.read(&sid, T, "main");
    assert_eq!(r1["revision"], 1);
    assert_eq!(
        r1["state"]["setpoint"].as_f64(),
        Some(40.0),
        "after the write: {r1}"
    );

    // The setpoint action.
    let a = s.command(setpoint(&sid, json!(30), None));
    assert_eq!(a["status"], "completed", "action receipt: {a}");
    assert_eq!(a["capability_id"], SETPOINT);
    assert_eq!(a["state_revision_before"], w["state_revision_after"]);
    assert_eq!(
        a["state_revision_after"].as_u64(),
        w["state_revision_after"].as_u64().map(|r| r + 1),
        "action receipt: {a}"
    );
    assert_eq!(
        a["output"]["target_temperature"].as_f64(),
        Some(30.0),
        "action receipt: {a}"
    );
    let r2 = s.read(&sid, T, "main");
    assert_eq!(r2["revision"], 2);
    assert_eq!(r2["state"]["setpoint"].as_f64(), Some(30.0));

    // Out of limit: refused with the violation's details.
    let bad = s.command(setpoint(&sid, json!(400), None));
    let d = assert_rejected(&bad, "MHS.SAFETY.ENVELOPE_VIOLATION");
    assert_eq!(d["path"], "target_temperature", "details: {d}");
    assert_eq!(d["kind"], "max", "details: {d}");
    assert_eq!(d["bound"].as_f64(), Some(90.0), "details: {d}");
    assert_eq!(d["value"].as_f64(), Some(400.0), "details: {d}");
    assert_eq!(d["unit"], "degC", "details: {d}");
    assert_eq!(d["source"], "binding", "details: {d}");
    assert_eq!(bad["state_revision_before"], 2);
    assert_eq!(bad["state_revision_after"], 2);
    assert!(bad["output"].is_null(), "a refusal has no output: {bad}");

    // Nothing moved.
    let r3 = s.read(&sid, T, "main");
    assert_eq!(r3["revision"], 2, "revision after the refusal: {r3}");
    assert_eq!(
        r3["state"]["setpoint"].as_f64(),
        Some(30.0),
        "setpoint after the refusal: {r3}"
    );
}

#[test]
fn thermostat_read_write_action_and_out_of_limit_refusal_over_http() {
    thermostat_sequence(&Server::http());
}

#[test]
fn thermostat_read_write_action_and_out_of_limit_refusal_over_stdio() {
    thermostat_sequence(&Server::stdio());
}

// ----- 2. command_id replay and reuse ------------------------------------

fn command_id_replay(s: &Server) {
    let sid = s.session();
    let first = s.command(setpoint(&sid, json!(30), Some("e2e-replay-a")));
    assert_eq!(first["status"], "completed", "{first}");
    assert_eq!(first["replayed"], false);
    assert_eq!(first["command_id"], "e2e-replay-a");
    assert_eq!(s.revision(&sid, T, "main"), 1);

    // Same id, same input: the same receipt, flagged as a replay, no new effect.
    let again = s.command(setpoint(&sid, json!(30), Some("e2e-replay-a")));
    assert_eq!(again["replayed"], true, "{again}");
    assert_eq!(again["receipt_id"], first["receipt_id"]);
    assert_eq!(
        without_replayed(&again),
        without_replayed(&first),
        "a replay answers the recorded receipt"
    );
    assert_eq!(
        s.revision(&sid, T, "main"),
        1,
        "a replay does not actuate again"
    );

    // Same id, other input: refused, nothing moves.
    let reuse = s.command(setpoint(&sid, json!(31), Some("e2e-replay-a")));
    let d = assert_rejected(&reuse, "MHS.CONFLICT.COMMAND_ID_REUSE");
    assert_eq!(d["command_id"], "e2e-replay-a", "details: {d}");
    assert_ne!(reuse["receipt_id"], first["receipt_id"]);
    assert_eq!(s.revision(&sid, T, "main"), 1);
    assert_eq!(
        s.read(&sid, T, "main")["state"]["setpoint"].as_f64(),
        Some(30.0)
    );

    // A refused command's id is not recorded: the same id with a valid input runs.
    let refused = s.command(setpoint(&sid, json!(400), Some("e2e-replay-b")));
    assert_rejected(&refused, "MHS.SAFETY.ENVELOPE_VIOLATION");
    assert_eq!(s.revision(&sid, T, "main"), 1);
    let valid = s.command(setpoint(&sid, json!(33), Some("e2e-replay-b")));
    assert_eq!(valid["status"], "completed", "{valid}");
    assert_eq!(valid["replayed"], false, "{valid}");
    assert_ne!(valid["receipt_id"], refused["receipt_id"]);
    assert_eq!(valid["state_revision_after"], 2);
    assert_eq!(s.revision(&sid, T, "main"), 2);

    // Its recorded outcome is now the completed one.
    let replay_b = s.command(setpoint(&sid, json!(33), Some("e2e-replay-b")));
    assert_eq!(replay_b["replayed"], true, "{replay_b}");
    assert_eq!(replay_b["receipt_id"], valid["receipt_id"]);
    let reuse_b = s.command(setpoint(&sid, json!(400), Some("e2e-replay-b")));
    assert_rejected(&reuse_b, "MHS.CONFLICT.COMMAND_ID_REUSE");
    assert_eq!(s.revision(&sid, T, "main"), 2);
}

#[test]
fn command_id_replay_and_reuse_over_http() {
    command_id_replay(&Server::http());
}

#[test]
fn command_id_replay_and_reuse_over_stdio() {
    command_id_replay(&Server::stdio());
}

// ----- 3. write refusals -------------------------------------------------

fn write_refusals(s: &Server) {
    let sid = s.session();
    let write = |device: &str, resource: &str, patch: Value| json!({"session_id": sid, "device_id": device, "resource": resource, "patch": patch});

    // One accepted write so that "unchanged" means something other than 0.
    let w = s.ok(
        "mhs.resource.write",
        write(T, "main", json!({"setpoint": 25})),
    );
    assert_eq!(w["status"], "completed", "{w}");
    assert_eq!(s.revision(&sid, T, "main"), 1);

    let unknown = s.ok("mhs.resource.write", write(T, "main", json!({"foo": 1})));
    let d = assert_rejected(&unknown, "MHS.RESOURCE.FIELD_UNKNOWN");
    assert!(
        d["fields"]
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x == "foo")),
        "details: {d}"
    );
    assert_eq!(unknown["state_revision_after"], 1);
    assert_eq!(s.revision(&sid, T, "main"), 1);

    let read_only = s.ok(
        "mhs.resource.write",
        write(T, "main", json!({"temperature": 20})),
    );
    let d = assert_rejected(&read_only, "MHS.RESOURCE.NOT_WRITABLE");
    assert!(
        d["fields"]
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x == "temperature")),
        "details: {d}"
    );
    assert_eq!(s.revision(&sid, T, "main"), 1);
    let state = s.read(&sid, T, "main")["state"].clone();
    assert_eq!(state["setpoint"].as_f64(), Some(25.0), "state: {state}");

    // A resource without a configure binding cannot be written at all.
    let relay_before = s.revision(&sid, "relay-1", "bank");
    let e = s.err(
        "mhs.resource.write",
        write(
            "relay-1",
            "bank",
            json!({"channels": [true, true, true, true]}),
        ),
    );
    let d = assert_rpc_error(&e, "MHS.RESOURCE.NOT_WRITABLE");
    assert_eq!(d["reason"], "configure_unbound", "details: {d}");
    assert_eq!(s.revision(&sid, "relay-1", "bank"), relay_before);
    assert_eq!(
        s.read(&sid, "relay-1", "bank")["state"]["channels"],
        json!([false, false, false, false])
    );
    assert_eq!(s.revision(&sid, T, "main"), 1);
}

#[test]
fn write_refusals_unknown_field_read_only_field_unbound_resource_over_http() {
    write_refusals(&Server::http());
}

#[test]
fn write_refusals_unknown_field_read_only_field_unbound_resource_over_stdio() {
    write_refusals(&Server::stdio());
}

// ----- 4. binding, device and session refusals ---------------------------

fn binding_and_session_refusals(s: &Server) {
    let sid = s.session();

    let unknown = s.command(
        json!({"session_id": sid, "device_id": T, "capability_id": "cap.foo.bar.v1", "input": {}}),
    );
    let d = assert_rejected(&unknown, "MHS.CAPABILITY.UNKNOWN");
    assert_eq!(d["capability_id"], "cap.foo.bar.v1", "details: {d}");

    let not_bound = s.command(json!({"session_id": sid, "device_id": T, "capability_id": SETPOINT, "resource": "nope", "input": {"target_temperature": 30}}));
    let d = assert_rejected(&not_bound, "MHS.CAPABILITY.NOT_BOUND");
    assert_eq!(d["bound_resources"], json!(["main"]), "details: {d}");

    let e = s.err("mhs.command", json!({"session_id": sid, "device_id": "no-such-device", "capability_id": SETPOINT, "input": {"target_temperature": 30}}));
    let d = assert_rpc_error(&e, "MHS.DEVICE.UNKNOWN");
    assert_eq!(d["device_id"], "no-such-device", "details: {d}");

    let e = s.err(
        "mhs.command",
        json!({"device_id": T, "capability_id": SETPOINT, "input": {"target_temperature": 30}}),
    );
    assert_rpc_error(&e, "MHS.SESSION.UNKNOWN");
    let e = s.err("mhs.command", json!({"session_id": "mhs_s_not_a_session", "device_id": T, "capability_id": SETPOINT, "input": {"target_temperature": 30}}));
    assert_rpc_error(&e, "MHS.SESSION.UNKNOWN");

    // None of the above moved anything.
    assert_eq!(s.revision(&sid, T, "main"), 0);

    let closed = s.ok("mhs.session.close", json!({"session_id": sid}));
    assert_eq!(closed["closed"], true, "{closed}");
    let e = s.err("mhs.command", setpoint(&sid, json!(30), None));
    let d = assert_rpc_error(&e, "MHS.SESSION.EXPIRED");
    assert_eq!(d["session_id"], sid.as_str(), "details: {d}");
    let e = s.err(
        "mhs.resource.read",
        json!({"session_id": sid, "device_id": T, "resource": "main"}),
    );
    assert_rpc_error(&e, "MHS.SESSION.EXPIRED");

    let sid2 = s.session();
    assert_eq!(
        s.revision(&sid2, T, "main"),
        0,
        "no refused command advanced the revision"
    );
}

#[test]
fn unknown_capability_unbound_resource_unknown_device_and_session_refusals_over_http() {
    binding_and_session_refusals(&Server::http());
}

#[test]
fn unknown_capability_unbound_resource_unknown_device_and_session_refusals_over_stdio() {
    binding_and_session_refusals(&Server::stdio());
}

// ----- CORE-022 through schema combinators --------------------------------

/// A device whose state schema declares fields through `allOf`, `anyOf`,
/// `oneOf`, `then`, `patternProperties`, the draft-07 tuple form of `items`
/// and a local `$ref`, plus a resource whose whole schema is read-only.
const COMBINATOR_DEVICE: &str = r##"{"device_id":"w-1","mode":"simulated","risk_class":"R1","driver":"sim.thermostat",
 "fidelity":{"kind":"simulated","notes":"schema combinators"},
 "resources":[{"id":"main","state_schema":{"type":"object","properties":{
   "setpoint":{"type":"number","x-mhs-unit":"degC"},
   "cfg":{"allOf":[{"type":"object","properties":{"a":{"type":"number"}}},{"properties":{"b":{"type":"number","readOnly":true}}}]},
   "alt":{"anyOf":[{"type":"object","properties":{"p":{"type":"number"}}},{"type":"object","properties":{"q":{"type":"number","readOnly":true}}}]},
   "one":{"oneOf":[{"type":"object","properties":{"s":{"type":"number","readOnly":true}}}]},
   "cond":{"type":"object","properties":{"k":{"type":"number"}},"if":{"properties":{"k":{"const":1}}},"then":{"properties":{"t":{"type":"number","readOnly":true}}}},
   "pp":{"type":"object","patternProperties":{"^ch[0-9]$":{"type":"number","readOnly":true}}},
   "tup":{"type":"array","items":[{"type":"number"},{"type":"object","properties":{"z":{"type":"number","readOnly":true}}}]},
   "ref":{"$ref":"#/$defs/gain"}},
   "$defs":{"gain":{"type":"object","properties":{"g":{"type":"number"},"h":{"type":"number","readOnly":true}}}}}},
  {"id":"locked","state_schema":{"type":"object","readOnly":true,"properties":{"setpoint":{"type":"number"}}}}],
 "bindings":[{"capability_id":"cap.device.configure.v1","resource":"main","target":"configure"},
             {"capability_id":"cap.device.configure.v1","resource":"locked","target":"configure"}]}"##;

#[test]
fn unknown_and_read_only_fields_are_refused_through_every_schema_combinator() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("w.json"), COMBINATOR_DEVICE).expect("manifest");
    let cfg = dir.path().join("tether.toml");
    std::fs::write(&cfg, "devices = [\"w.json\"]\n").expect("config");
    let s = Server::start_with(
        Transport::Http,
        Some(&dir.path().join("state")),
        &[std::ffi::OsStr::new("--config"), cfg.as_os_str()],
    );
    let sid = s.session();
    let write = |resource: &str, patch: Value| {
        s.ok(
            "mhs.resource.write",
            json!({"session_id": sid, "device_id": "w-1", "resource": resource, "patch": patch}),
        )
    };
    for (patch, field) in [
        (json!({"cfg": {"b": 1}}), "cfg.b"),
        (json!({"alt": {"q": 1}}), "alt.q"),
        (json!({"one": {"s": 1}}), "one.s"),
        (json!({"cond": {"k": 1, "t": 1}}), "cond.t"),
        (json!({"pp": {"ch1": 1}}), "pp.ch1"),
        (json!({"tup": [1, {"z": 1}]}), "tup[1].z"),
        (json!({"ref": {"h": 1}}), "ref.h"),
    ] {
        let r = write("main", patch.clone());
        let d = assert_rejected(&r, "MHS.RESOURCE.NOT_WRITABLE");
        assert_eq!(d["fields"], json!([field]), "{patch}: {r}");
    }
    for (patch, field) in [
        (json!({"cfg": {"nosuch": 1}}), "cfg.nosuch"),
        (json!({"pp": {"nosuch": 1}}), "pp.nosuch"),
        (json!({"tup": [1, {"nosuch": 1}]}), "tup[1].nosuch"),
    ] {
        let r = write("main", patch.clone());
        let d = assert_rejected(&r, "MHS.RESOURCE.FIELD_UNKNOWN");
        assert_eq!(d["fields"], json!([field]), "{patch}: {r}");
    }
    let r = write("locked", json!({"setpoint": 1}));
    let d = assert_rejected(&r, "MHS.RESOURCE.NOT_WRITABLE");
    assert_eq!(d["reason"], "read_only", "{r}");
    // Nothing above changed anything; a declared writable field still writes.
    assert_eq!(s.revision(&sid, "w-1", "main"), 0);
    let ok = write(
        "main",
        json!({"cfg": {"a": 2}, "ref": {"g": 1}, "setpoint": 30}),
    );
    assert_eq!(ok["status"], "completed", "{ok}");
    assert_eq!(s.revision(&sid, "w-1", "main"), 1);
    // The published configure schema shows no read-only field at any depth.
    let dev = s.ok("mhs.devices.get", json!({"device_id": "w-1"}));
    let mut schemas = Vec::new();
    input_schemas(&dev, &mut schemas);
    assert!(!schemas.is_empty(), "{dev}");
    for schema in schemas {
        let text = schema.to_string();
        for hidden in ["\"b\":", "\"q\":", "\"^ch[0-9]$\"", "\"h\":", "\"t\":"] {
            assert!(!text.contains(hidden), "{hidden} in {text}");
        }
    }
}

/// Every `input_schema` member anywhere in `v`.
fn input_schemas<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                if k == "input_schema" {
                    out.push(x);
                } else {
                    input_schemas(x, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| input_schemas(x, out)),
        _ => {}
    }
}
