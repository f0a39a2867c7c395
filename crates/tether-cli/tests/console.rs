//! The operator console end to end in a real browser: Debian's chromium
//! (`/usr/bin/chromium`, installed by `.ci/run`) driven by Playwright for
//! Python (`tests/console/requirements.txt`, in the `py-console` venv under
//! the target directory; never `playwright install`). The real `tether
//! serve` runs two operators, an agent and a holding policy; the script
//! (`tests/console/console_e2e.py`) signs in, watches the devices update
//! live, has a hold approved in two browser contexts, presses the e-stop
//! while the arm moves, is refused a reset while the door is open and then
//! resets, and checks that forged and cookie-less posts change nothing.
//!
//! `TETHER_CONSOLE_SHOTS=DIR` makes it write a screenshot of each page there
//! (docs/console/ holds the ones docs/CONSOLE.md shows).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "common/peers.rs"]
mod peers;

use common::*;
use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

const ALICE: &str = "alice-console-token";
const BOB: &str = "bob-console-token";
const PLANNER: &str = "planner-console-token";

/// The operators example's policy: setpoints above 60 degC wait for two
/// operators.
const POLICY: &str = include_str!("../../../examples/operators/policy.cedar");

fn config(dir: &Path) -> std::path::PathBuf {
    std::fs::write(dir.join("policy.cedar"), POLICY).unwrap();
    let mut text = String::from("builtin_cell = true\npolicy = \"policy.cedar\"\n");
    for (id, kind, roles, var) in [
        ("alice", "human", "[\"operator\"]", "ALICE_TOKEN"),
        ("bob", "human", "[\"operator\"]", "BOB_TOKEN"),
        ("planner", "agent", "[]", "PLANNER_TOKEN"),
    ] {
        text.push_str(&format!(
            "\n[[principals]]\nid = \"{id}\"\nkind = \"{kind}\"\nroles = {roles}\ntoken_env = \"{var}\"\n"
        ));
    }
    let path = dir.join("tether.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn the_console_in_a_real_browser() {
    assert!(
        Path::new("/usr/bin/chromium").exists(),
        "the console test drives Debian's chromium: apt-get install chromium (.ci/run does)"
    );
    let python = peers::pinned_venv(
        "TETHER_CONSOLE_PYTHON",
        &peers::package_dir().join("tests/console/requirements.txt"),
        "py-console",
    )
    .unwrap_or_else(|e| panic!("Playwright for Python could not be set up: {e}"));
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let state = dir.path().join("state");
    let tokens = [
        ("ALICE_TOKEN", ALICE),
        ("BOB_TOKEN", BOB),
        ("PLANNER_TOKEN", PLANNER),
    ];
    let server = Server::start_with_env(
        Transport::Http,
        Some(&state),
        &[OsStr::new("--config"), cfg.as_os_str()],
        &tokens,
    );
    poll_until("the start-up lines to name the console", TIMEOUT, || {
        server
            .stderr_text()
            .contains(&format!("console at http://{}/console/", server.addr()))
    });
    let mut cmd = Command::new(python);
    cmd.arg(peers::package_dir().join("tests/console/console_e2e.py"))
        .env("TETHER_URL", format!("http://{}", server.addr()))
        .env("TETHER_BIN", BIN)
        .env("STATE_DIR", &state)
        .env("TETHER_PID", server.pid().to_string())
        .envs(tokens);
    if let Some(shots) = std::env::var_os("TETHER_CONSOLE_SHOTS") {
        cmd.env("SHOTS", shots);
    }
    let out = cmd.output().expect("run the console script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success() && stdout.contains("console e2e ok"),
        "{}\n{stdout}\n{}\n--- tether ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        server.stderr_text()
    );
}
