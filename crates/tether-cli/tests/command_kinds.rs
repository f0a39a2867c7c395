//! Command kinds at start-up, against the real binary: on a hardware device
//! an effectful binding that declares no `kind` (or is `time_bounded`
//! without `max_duration_ms`) is a defect `tether check` names with the
//! file, the device and the field, and `tether serve` refuses to start.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

use common::{as_hardware, tether};
use std::path::{Path, PathBuf};

const RELAY_TOML: &str = include_str!("../../tether-drivers/cell/relay-1.toml");
const ARM_TOML: &str = include_str!("../../tether-drivers/cell/arm-1.toml");

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p
}

/// The built-in relay bank as a hardware device, its switch binding's kind
/// line replaced by `kind_lines` (empty: no kind at all).
fn hardware_relay(kind_lines: &str) -> String {
    let text = as_hardware(RELAY_TOML);
    assert!(
        text.contains("kind = \"time_bounded\"\n"),
        "relay-1.toml changed; update the test"
    );
    text.replacen("kind = \"time_bounded\"\n", kind_lines, 1)
}

fn check(file: &Path) -> common::Run {
    tether(&["check".as_ref(), file.as_os_str()])
}

#[test]
fn check_names_a_hardware_binding_without_a_kind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = write(dir.path(), "relay-hw.toml", &hardware_relay(""));
    let run = check(&f);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    let err = &run.stderr;
    assert!(
        err.contains("relay-hw.toml")
            && err.contains("relay-1")
            && err.contains("bindings[0].kind")
            && err.contains("cap.io.relay.v1")
            && err.contains("leased")
            && err.contains("time_bounded"),
        "file, device, field and remedy: {err}"
    );
    assert!(
        !run.stdout_text().contains("ok: device"),
        "{}",
        run.stdout_text()
    );
}

#[test]
fn check_names_a_time_bounded_hardware_binding_without_its_duration() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = write(
        dir.path(),
        "relay-hw.toml",
        &hardware_relay("kind = \"time_bounded\"\n"),
    );
    let run = check(&f);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains("relay-1") && run.stderr.contains("bindings[0].max_duration_ms"),
        "{}",
        run.stderr
    );
    // Declared in full, it loads; so does the built-in arm made hardware
    // (its motion is time-bounded, its park and stops risk-reducing).
    let ok = write(
        dir.path(),
        "relay-ok.toml",
        &hardware_relay("kind = \"time_bounded\"\nmax_duration_ms = 2000\n"),
    );
    let run = check(&ok);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let arm = write(dir.path(), "arm-hw.toml", &as_hardware(ARM_TOML));
    let run = check(&arm);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
}

#[test]
fn serve_refuses_to_start_with_a_hardware_binding_without_a_kind() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "relay-hw.toml", &hardware_relay(""));
    let config = write(dir.path(), "tether.toml", "devices = [\"relay-hw.toml\"]\n");
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
        run.stderr.contains("relay-hw.toml")
            && run.stderr.contains("relay-1")
            && run.stderr.contains("bindings[0].kind"),
        "{}",
        run.stderr
    );
    assert!(
        run.stdout.is_empty(),
        "nothing was served: {:?}",
        run.stdout_text()
    );
}
