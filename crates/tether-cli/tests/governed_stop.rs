//! The governed stop across processes: `tether estop` from a shell stops a
//! motion running in a separate endpoint process on the same state directory.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const ARM: &str = "arm-1";

fn long_move(sid: &str) -> Value {
    json!({"session_id": sid, "device_id": ARM, "capability_id": "cap.motion.move_to.v1", "input": {"joints": [1.0, 0, 0, 0, 0, 0], "speed": 0.5}})
}

/// Waits until the arm has a running operation.
fn wait_running(s: &Server) {
    poll_until("the motion to be running", Duration::from_secs(5), || {
        s.status_of(ARM)["running_operations"]
            .as_array()
            .is_some_and(|o| !o.is_empty())
    });
}

/// Waits until the arm has moved: the motion was dispatched, which happens
/// only once its start is durable (an operation is listed as running from
/// its registration, a moment before that).
fn wait_moving(s: &Server, sid: &str) {
    poll_until("the arm to move", Duration::from_secs(5), || {
        s.read(sid, ARM, "joints")["state"]["positions"][0]
            .as_f64()
            .is_some_and(|x| x > 0.0)
    });
}

/// Sends `cmd` (a `mhs.command`'s params) on its own thread; its answer, if
/// any comes within `timeout`, is the thread's result.
fn send_in_background(
    s: &Server,
    cmd: &Value,
    timeout: Duration,
) -> std::thread::JoinHandle<common::HttpResponse> {
    let body =
        json!({"jsonrpc": "2.0", "id": 1, "method": "mhs.command", "params": cmd}).to_string();
    let addr = s.addr();
    std::thread::spawn(move || common::http_post(addr, body.as_bytes(), timeout))
}

fn observed_delays(state_dir: &std::path::Path) -> Vec<u64> {
    let export = tether(&[
        "audit".as_ref(),
        "export".as_ref(),
        "--state-dir".as_ref(),
        state_dir.as_os_str(),
    ]);
    export
        .stdout_text()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["kind"] == "safety.estop.observed")
        .filter_map(|e| e["body"]["observed_delay_ms"].as_u64())
        .collect()
}

#[test]
fn a_stop_from_another_process_aborts_a_running_motion_and_latches_every_device() {
    let s = Server::http();
    let sid = s.session();
    let dir = s.state_dir().to_path_buf();
    let (motion, elapsed) = std::thread::scope(|scope| {
        let motion = scope.spawn(|| s.command(long_move(&sid)));
        poll_until("the motion to be running", Duration::from_secs(5), || {
            s.status_of(ARM)["running_operations"]
                .as_array()
                .is_some_and(|o| !o.is_empty())
                || motion.is_finished()
        });
        assert!(!motion.is_finished(), "the motion ended before the stop");
        let t0 = Instant::now();
        let run = tether(&[
            "estop".as_ref(),
            "--state-dir".as_ref(),
            dir.as_os_str(),
            "--reason".as_ref(),
            "e2e governed stop".as_ref(),
        ]);
        assert!(
            run.stdout_text().contains("durable"),
            "estop output: {}",
            run.stdout_text()
        );
        let motion = motion.join().expect("motion thread");
        (motion, t0.elapsed())
    });
    assert_eq!(motion["status"], "cancelled", "motion: {motion}");
    // A sanity ceiling only (the motion alone runs ~2 s); figures are in docs/PERFORMANCE.md.
    assert!(
        elapsed < Duration::from_millis(1500),
        "stop took {elapsed:?}"
    );
    for device in ["arm-1", "thermostat-1", "relay-1"] {
        assert_eq!(
            s.status_of(device)["latched"],
            true,
            "{device} must be latched"
        );
    }
    let refused = s.command(long_move(&sid));
    assert_eq!(
        refused["error"]["mhs_code"], "MHS.SAFETY.ESTOP_ENGAGED",
        "{refused}"
    );
    let delays = observed_delays(&dir);
    assert!(
        !delays.is_empty(),
        "the observing endpoint records the delay"
    );
    println!("governed stop: `tether estop` to motion answer {elapsed:?}; trip-to-observed delays (ms) {delays:?}");
}

#[test]
fn a_stop_of_one_device_leaves_the_others_running_and_a_reset_releases_it() {
    let s = Server::http();
    let dir = s.state_dir().to_path_buf();
    let run = tether(&[
        "estop".as_ref(),
        "--device".as_ref(),
        "relay-1".as_ref(),
        "--state-dir".as_ref(),
        dir.as_os_str(),
    ]);
    assert!(
        run.stdout_text().contains("relay-1"),
        "{}",
        run.stdout_text()
    );
    poll_until("relay-1 to latch", Duration::from_secs(2), || {
        s.status_of("relay-1")["latched"] == true
    });
    assert_eq!(s.status_of("arm-1")["latched"], false);
    let url = format!("http://{}/rpc", s.addr());
    let reset = tether(&["reset", "--device", "relay-1", "--endpoint", url.as_str()]);
    assert!(
        reset.stdout_text().contains("\"completed\""),
        "{}",
        reset.stdout_text()
    );
    assert_eq!(s.status_of("relay-1")["latched"], false);
}

#[test]
fn a_stop_tripped_while_no_endpoint_runs_is_obeyed_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = tether(&[
        "estop".as_ref(),
        "--device".as_ref(),
        "arm-1".as_ref(),
        "--state-dir".as_ref(),
        dir.path().as_os_str(),
    ]);
    assert!(
        run.stdout_text().contains("durable"),
        "{}",
        run.stdout_text()
    );
    let s = Server::start(Transport::Http, Some(dir.path()));
    assert_eq!(s.status_of("arm-1")["latched"], true);
    assert_eq!(s.status_of("relay-1")["latched"], false);
}

/// Two endpoints on one state directory whose configs disagree: here `arm-1`
/// is simulated (an agent may reset it), there it is hardware. The reset row
/// the first writes must not release the second's hardware latch.
#[test]
fn a_non_operator_reset_elsewhere_never_releases_a_hardware_latch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let manifest = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tether-drivers/cell/arm-1.toml"),
    )
    .expect("arm manifest");
    let hardware = as_hardware(&manifest);
    std::fs::write(dir.path().join("arm-hw.toml"), hardware).expect("write");
    let cfg = dir.path().join("tether.toml");
    std::fs::write(&cfg, "builtin_cell = false\ndevices = [\"arm-hw.toml\"]\n").expect("cfg");
    let simulated = Server::start_with(Transport::Http, Some(&state), &[]);
    let physical = Server::start_with(
        Transport::Http,
        Some(&state),
        &[std::ffi::OsStr::new("--config"), cfg.as_os_str()],
    );
    assert_eq!(physical.status_of(ARM)["mode"], "hardware");
    let run = tether(&[
        "estop".as_ref(),
        "--device".as_ref(),
        ARM.as_ref(),
        "--state-dir".as_ref(),
        state.as_os_str(),
    ]);
    assert!(run.stdout_text().contains(ARM), "{}", run.stdout_text());
    for s in [&simulated, &physical] {
        poll_until("arm-1 to latch", Duration::from_secs(2), || {
            s.status_of(ARM)["latched"] == true
        });
    }
    let reset = simulated.call("mhs.safety.reset", json!({"device_id": ARM}));
    assert_eq!(reset["result"]["status"], "completed", "{reset}");
    // Long enough for the watcher to have seen the reset row several times.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        physical.status_of(ARM)["latched"],
        true,
        "an agent's reset must not release a hardware latch"
    );
}

/// A terminal stop keeps its latch for the life of the endpoint that ran it
/// (OpenMHS CORE-087): a reset made by another endpoint on the same state
/// directory releases that endpoint's latch, never this one's.
#[test]
fn a_terminal_latch_outlives_a_reset_made_by_another_endpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let manifest = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tether-drivers/cell/arm-1.toml"),
    )
    .expect("arm manifest")
    .replace(
        "estop = { latency_ms = 250, native = true }",
        "estop = { latency_ms = 250, native = true, terminal = \"the servo drive needs a power cycle after a stop\" }",
    );
    assert!(
        manifest.contains("terminal"),
        "arm-1.toml changed; update the test"
    );
    std::fs::write(dir.path().join("arm-t.toml"), manifest).expect("write");
    let cfg = dir.path().join("tether.toml");
    std::fs::write(&cfg, "devices = [\"arm-t.toml\"]\n").expect("cfg");
    let args = [std::ffi::OsStr::new("--config"), cfg.as_os_str()];
    let first = Server::start_with(Transport::Http, Some(&state), &args);
    let stop = first.call("mhs.safety.estop", json!({"device_id": ARM}));
    assert_eq!(stop["result"]["output"]["latched"], true, "{stop}");
    assert_eq!(first.status_of(ARM)["estop"]["terminated"], true);
    // A second endpoint restores the latch and (no stop path ran there yet)
    // may reset it.
    let second = Server::start_with(Transport::Http, Some(&state), &args);
    assert_eq!(second.status_of(ARM)["latched"], true);
    let reset = second.call("mhs.safety.reset", json!({"device_id": ARM}));
    assert_eq!(reset["result"]["status"], "completed", "{reset}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        first.status_of(ARM)["latched"],
        true,
        "the endpoint that ran the terminal stop keeps its latch"
    );
}

/// A motion cut short by the process dying (SIGKILL) is never run a second
/// time under its command id: start-up records its outcome as `unknown`.
#[test]
fn a_motion_interrupted_by_a_crash_is_unknown_and_never_runs_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let mut cmd = long_move("-");
    cmd["command_id"] = json!("crash-move-1");
    {
        let mut s = Server::start(Transport::Http, Some(&state));
        let sid = s.session();
        cmd["session_id"] = json!(sid);
        // The answer never comes: the process dies first, mid-motion.
        let sender = send_in_background(&s, &cmd, Duration::from_secs(5));
        wait_running(&s);
        wait_moving(&s, &sid);
        s.kill();
        let _ = sender.join();
    }
    let s = Server::start(Transport::Http, Some(&state));
    let sid = s.session();
    cmd["session_id"] = json!(sid);
    let again = s.command(cmd);
    assert_eq!(again["replayed"], true, "{again}");
    assert_eq!(again["status"], "unknown", "{again}");
    // The receipt says what was dispatched, and the revision moved: the
    // motion may have acted before the process died.
    assert_eq!(again["capability_id"], "cap.motion.move_to.v1", "{again}");
    assert!(again["operation_id"].is_string(), "{again}");
    assert_eq!(again["decision"], "allow", "{again}");
    assert_eq!(again["mode"], "simulated", "{again}");
    assert_eq!(again["state_revision_before"], 0, "{again}");
    assert_eq!(again["state_revision_after"], 1, "{again}");
    assert_eq!(s.revision(&sid, ARM, "joints"), 1);
    assert!(
        s.status_of(ARM)["running_operations"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "nothing was dispatched"
    );
}

/// SIGTERM (a service stop) ends the endpoint in order: a running motion is
/// cancelled and its receipt recorded, so its id replays `cancelled`.
#[test]
fn sigterm_cancels_a_running_motion_and_records_its_receipt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let mut cmd = long_move("-");
    cmd["command_id"] = json!("term-move-1");
    {
        let mut s = Server::start(Transport::Http, Some(&state));
        let sid = s.session();
        cmd["session_id"] = json!(sid);
        let sender = send_in_background(&s, &cmd, Duration::from_secs(10));
        wait_running(&s);
        wait_moving(&s, &sid);
        let status = s.terminate().expect("the endpoint exits after SIGTERM");
        assert!(status.success(), "{status:?}");
        let answer = sender.join().expect("sender").json();
        assert_eq!(answer["result"]["status"], "cancelled", "{answer}");
    }
    let s = Server::start(Transport::Http, Some(&state));
    let sid = s.session();
    cmd["session_id"] = json!(sid);
    let again = s.command(cmd);
    assert_eq!(again["replayed"], true, "{again}");
    assert_eq!(again["status"], "cancelled", "{again}");
}
