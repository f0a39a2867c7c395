//! The example device programs check themselves: `heater.py` (pymodbus) and
//! `oven.py` (asyncua) each run their self-check against a real client of
//! their protocol, so a driver test that fails points at Tether, not at the
//! program playing the device.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/peers.rs"]
mod peers;

use std::process::Command;

fn selfcheck(script: &str) {
    let out = Command::new(peers::python())
        .arg(peers::peers_dir().join(script))
        .output()
        .expect("run the self-check");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("selfcheck ok"),
        "{script}: {}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One after the other: both measure their own timing (watchdogs, delays),
/// which two at once on a small machine would blur.
#[test]
fn the_heater_and_oven_programs_pass_their_self_checks() {
    selfcheck("test_heater_selfcheck.py");
    selfcheck("test_oven_selfcheck.py");
}
