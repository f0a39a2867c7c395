//! `tether check` refuses manifest defects naming the file, the device and
//! the field; `tether describe` prints limits with units and the
//! not-certified statement.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

use common::tether;
use std::path::{Path, PathBuf};

const ARM_TOML: &str = include_str!("../../tether-drivers/cell/arm-1.toml");
const ARM_PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tether-drivers/cell/arm-1.toml"
);

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write manifest");
    p
}

fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert!(
        text.contains(from),
        "arm-1.toml no longer contains {from:?}; update the test"
    );
    text.replacen(from, to, 1)
}

/// `check FILE` must exit 1 and name the file, `arm-1` and every `fields` fragment on stderr.
fn assert_defect(file: &Path, fields: &[&str]) {
    let run = tether(&["check".as_ref(), file.as_os_str()]);
    assert_eq!(
        run.code,
        Some(1),
        "check {} should fail; stdout {:?} stderr {:?}",
        file.display(),
        run.stdout_text(),
        run.stderr
    );
    let err = &run.stderr;
    let name = file.display().to_string();
    assert!(err.contains(&name), "stderr names the file {name}: {err}");
    assert!(err.contains("arm-1"), "stderr names the device: {err}");
    for f in fields {
        assert!(err.contains(f), "stderr names the field {f:?}: {err}");
    }
    assert!(
        !run.stdout_text().contains("ok: device"),
        "a defective manifest is not reported ok: {}",
        run.stdout_text()
    );
}

#[test]
fn check_accepts_the_builtin_arm_manifest() {
    let run = tether(&["check", ARM_PATH]);
    assert_eq!(
        run.code,
        Some(0),
        "stdout {:?} stderr {:?}",
        run.stdout_text(),
        run.stderr
    );
    assert!(
        run.stdout_text().contains("ok: device `arm-1`"),
        "{}",
        run.stdout_text()
    );
}

#[test]
fn check_refuses_a_binding_pair_declared_twice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = format!("{ARM_TOML}\n[[bindings]]\ncapability_id = \"cap.motion.park.v1\"\nresource = \"joints\"\ntarget = \"park\"\nkind = \"risk_reducing\"\n");
    let f = write(dir.path(), "arm-dup-binding.toml", &text);
    assert_defect(&f, &["bindings[5]", "cap.motion.park.v1"]);
}

#[test]
fn check_refuses_an_uncatalogued_binding_without_input_schema() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = format!("{ARM_TOML}\n[[bindings]]\ncapability_id = \"cap.foo.bar.v1\"\nresource = \"joints\"\ntarget = \"foo\"\n");
    let f = write(dir.path(), "arm-uncatalogued.toml", &text);
    assert_defect(&f, &["bindings[5]", "input_schema", "cap.foo.bar.v1"]);
}

#[test]
fn check_refuses_a_risk_class_below_the_class_floor() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = replace_once(ARM_TOML, "risk_class = \"R2\"", "risk_class = \"R1\"");
    let f = write(dir.path(), "arm-risk-r1.toml", &text);
    assert_defect(&f, &["risk_class", "R2", "cap.motion.move_to.v1"]);
}

#[test]
fn check_refuses_a_limits_typo() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = replace_once(
        ARM_TOML,
        "speed = { min = 0.05, max = 1.5",
        "speed = { min = 0.05, maxx = 1.5",
    );
    let f = write(dir.path(), "arm-limits-typo.toml", &text);
    assert_defect(&f, &["bindings[0].limits.speed", "maxx"]);
}

#[test]
fn describe_prints_limits_with_units_and_the_not_certified_statement() {
    let run = tether(&["describe", "arm-1"]);
    assert_eq!(run.code, Some(0), "stderr {:?}", run.stderr);
    let out = run.stdout_text();
    assert!(out.contains("arm-1"), "{out}");
    assert!(out.contains("cap.motion.move_to.v1"), "{out}");
    assert!(out.contains("rad/s"), "speed limit with its unit: {out}");
    assert!(out.contains("1.5"), "speed bound: {out}");
    assert!(
        out.contains("joints[*]") && out.contains(" rad"),
        "joint limits in rad: {out}"
    );
    assert!(
        out.to_lowercase().contains("not certified"),
        "not-certified statement: {out}"
    );
}

#[test]
fn serve_refuses_to_start_with_a_defective_manifest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = replace_once(ARM_TOML, "risk_class = \"R2\"", "risk_class = \"R1\"");
    write(dir.path(), "arm-risk-r1.toml", &text);
    let config = write(
        dir.path(),
        "tether.toml",
        "devices = [\"arm-risk-r1.toml\"]\n",
    );
    let state = dir.path().join("state");
    // With stdin closed, a server that did start would end at once with 0.
    let run = tether(&[
        "serve".as_ref(),
        "--config".as_ref(),
        config.as_os_str(),
        "--state-dir".as_ref(),
        state.as_os_str(),
        "--stdio".as_ref(),
    ]);
    assert_eq!(run.code, Some(2), "stderr {:?}", run.stderr);
    assert!(
        run.stderr.contains("arm-risk-r1.toml")
            && run.stderr.contains("arm-1")
            && run.stderr.contains("risk_class"),
        "{}",
        run.stderr
    );
    assert!(
        run.stdout.is_empty(),
        "nothing was served: {:?}",
        run.stdout_text()
    );
}

#[test]
fn a_report_cut_short_by_its_reader_ends_quietly() {
    use serde_json::json;
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    // A chain larger than a pipe's buffer, so the export is still writing
    // when its reader goes away (`tether audit export | head -1`).
    let state = tempfile::tempdir().expect("tempdir");
    {
        let s = common::Server::start(common::Transport::Http, Some(state.path()));
        let sid = s.session();
        for i in 0..200 {
            let r = s.command(json!({"session_id": sid, "device_id": "thermostat-1", "capability_id": "cap.thermal.setpoint.v1", "input": {"target_temperature": 20 + i % 50}}));
            assert_eq!(r["status"], "completed", "{r}");
        }
    }
    let mut child = Command::new(common::BIN)
        .args(["audit", "export", "--state-dir"])
        .arg(state.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut first = String::new();
    {
        let out = child.stdout.take().expect("stdout");
        BufReader::new(out).read_line(&mut first).expect("line");
    }
    let done = child.wait_with_output().expect("wait");
    assert!(first.starts_with('{'), "{first}");
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(
        !stderr.contains("panicked") && !stderr.to_lowercase().contains("broken pipe"),
        "{stderr}"
    );
}

#[test]
fn check_refuses_a_schema_that_serve_could_not_compile() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, schema) in [
        (
            "bad-type",
            r#"{ type = "object", properties = { x = { type = "foo" } } }"#,
        ),
        (
            "bad-ref",
            r##"{ type = "object", properties = { x = { "$ref" = "#/$defs/nope" } } }"##,
        ),
        (
            "bad-pattern",
            r#"{ type = "object", properties = { x = { type = "string", pattern = "([" } } }"#,
        ),
    ] {
        let text = format!("{ARM_TOML}\n[[bindings]]\ncapability_id = \"x-cap.test.{}.v1\"\nresource = \"joints\"\ntarget = \"park\"\ninput_schema = {schema}\n", name.replace('-', "_"));
        let f = write(dir.path(), &format!("arm-{name}.toml"), &text);
        assert_defect(&f, &["bindings[5]", "schema does not compile"]);
    }
}

#[test]
fn a_draft_07_tuple_is_served_as_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = format!("{ARM_TOML}\n[[bindings]]\ncapability_id = \"x-cap.test.pair.v1\"\nresource = \"joints\"\ntarget = \"park\"\ninput_schema = {{ type = \"object\", properties = {{ pair = {{ type = \"array\", items = [ {{ type = \"number\", \"x-mhs-unit\" = \"rad\" }}, {{ type = \"number\", \"x-mhs-unit\" = \"rad\" }} ], additionalItems = false }} }} }}\nlimits.\"pair[1]\" = {{ max = 1, unit = \"rad\" }}\n");
    let f = write(dir.path(), "arm-tuple.toml", &text);
    let run = tether(&["check".as_ref(), f.as_os_str()]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let cfg = write(
        dir.path(),
        "tether.toml",
        "builtin_cell = false\ndevices = [\"arm-tuple.toml\"]\n",
    );
    let s = common::Server::start_with(
        common::Transport::Http,
        None,
        &[std::ffi::OsStr::new("--config"), cfg.as_os_str()],
    );
    let sid = s.session();
    let over = s.command(serde_json::json!({"session_id": sid, "device_id": "arm-1", "capability_id": "x-cap.test.pair.v1", "input": {"pair": [0.5, 1.5]}}));
    assert_eq!(
        over["error"]["mhs_code"], "MHS.SAFETY.ENVELOPE_VIOLATION",
        "{over}"
    );
    assert_eq!(over["error"]["details"]["path"], "pair[1]", "{over}");
    let extra = s.command(serde_json::json!({"session_id": sid, "device_id": "arm-1", "capability_id": "x-cap.test.pair.v1", "input": {"pair": [0.5, 0.5, 0.5]}}));
    assert_eq!(
        extra["error"]["mhs_code"], "MHS.CAPABILITY.INPUT_INVALID",
        "{extra}"
    );
}

#[test]
fn check_refuses_facts_without_a_source_or_a_cited_ref() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = format!(
        "{ARM_TOML}\n[[facts]]\ntext = \"payload 5 kg\"\nsource = \"model\"\n\n[[facts]]\ntext = \"reach 850 mm\"\nsource = \"vendor_doc\"\nref = \"see the manual\"\n\n[[facts]]\ntext = \"rated for 24/7\"\nsource = \"upstream_code\"\n\n[[facts]]\ntext = \"door switch checked weekly\"\nsource = \"operator\"\n"
    );
    let f = write(dir.path(), "arm-facts.toml", &text);
    assert_defect(&f, &["facts[0].source", "facts[1].ref", "facts[2].ref"]);
    let run = tether(&["check".as_ref(), f.as_os_str()]);
    assert!(
        !run.stderr.contains("facts[3]"),
        "an operator fact needs no ref: {}",
        run.stderr
    );
}

#[test]
fn check_refuses_a_reenable_that_cannot_take_an_empty_input() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = replace_once(
        ARM_TOML,
        "estop = { latency_ms = 250, native = true }",
        "estop = { latency_ms = 250, native = true, reenable = \"cap.motion.move_to.v1\" }",
    );
    let f = write(dir.path(), "arm-reenable.toml", &text);
    assert_defect(&f, &["safety.estop.reenable"]);
}

#[test]
fn check_refuses_an_approval_ttl_that_serve_would_refuse() {
    let dir = tempfile::tempdir().expect("tempdir");
    for ttl in ["0", "99999999999"] {
        let cfg = write(
            dir.path(),
            "tether.toml",
            &format!("builtin_cell = true\napproval_ttl_s = {ttl}\n"),
        );
        let run = tether(&["check".as_ref(), cfg.as_os_str()]);
        assert_eq!(run.code, Some(1), "{ttl}: {}", run.stderr);
        assert!(run.stderr.contains("approval_ttl_s"), "{}", run.stderr);
    }
}

#[test]
fn check_refuses_a_binding_schema_that_admits_what_its_class_refuses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let thermo = include_str!("../../tether-drivers/cell/thermostat-1.toml");
    let text = replace_once(
        thermo,
        "input_schema = { properties = { target_temperature = { minimum = 5, maximum = 90 } } }",
        "input_schema = { additionalProperties = true, properties = { boost = { type = \"boolean\" }, target_temperature = { minimum = 5, maximum = 90 } } }",
    );
    let f = write(dir.path(), "thermo-loose.toml", &text);
    let run = tether(&["check".as_ref(), f.as_os_str()]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("thermostat-1"), "{}", run.stderr);
    assert!(run.stderr.contains("boost"), "{}", run.stderr);
    assert!(
        run.stderr.contains("additionalProperties"),
        "{}",
        run.stderr
    );
}
