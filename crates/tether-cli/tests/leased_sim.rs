//! Leased commands with a controller outside the process: `kill -9` of the
//! endpoint mid-motion leaves the external simulated arm stopped within one
//! lease, visibly in `tether sim status`.
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
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LEASE_MS: u64 = 300;

struct Sim {
    child: Child,
    addr: String,
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_sim() -> Sim {
    let mut child = Command::new(BIN)
        .args(["sim", "serve", "--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sim");
    let stderr = child.stderr.take().expect("stderr");
    let mut line = String::new();
    BufReader::new(stderr)
        .read_line(&mut line)
        .expect("sim banner");
    let addr = line
        .split("listening on ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .expect("address in banner")
        .to_owned();
    Sim { child, addr }
}

fn sim_status(sim: &Sim) -> Value {
    let run = tether(&["sim", "status", "--connect", sim.addr.as_str()]);
    serde_json::from_str(&run.stdout_text()).expect("status JSON")
}

fn write_config(dir: &std::path::Path, addr: &str) -> std::path::PathBuf {
    let manifest = include_str!("../../tether-drivers/cell/arm-1.toml")
        .replace("driver = \"sim.arm\"", "driver = \"remote.arm\"")
        .replace("device_id = \"arm-1\"", "device_id = \"arm-remote\"")
        .replace(
            "home = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]",
            &format!("address = \"{addr}\""),
        )
        .replace("park_speed_rad_s = 1.0", &format!("lease_ms = {LEASE_MS}"))
        .replace("tick_ms = 10\n", "")
        // The remote controller runs motions under a lease.
        .replace("kind = \"time_bounded\"", "kind = \"leased\"");
    std::fs::write(dir.join("arm-remote.toml"), manifest).expect("manifest");
    let config = dir.join("tether.toml");
    std::fs::write(&config, "devices = [\"arm-remote.toml\"]\n").expect("config");
    config
}

fn move_to(sid: &str, x: f64) -> Value {
    json!({"session_id": sid, "device_id": "arm-remote", "capability_id": "cap.motion.move_to.v1", "input": {"joints": [x, 0, 0, 0, 0, 0], "speed": 0.5}})
}

#[test]
fn kill_9_of_the_endpoint_mid_motion_leaves_the_external_arm_stopped_within_one_lease() {
    let sim = start_sim();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &sim.addr);
    let mut s = Server::start_with(
        Transport::Http,
        Some(&dir.path().join("state")),
        &[OsStr::new("--config"), config.as_os_str()],
    );
    let sid = s.session();
    // A short leased motion completes through renewals.
    let done = s.command(move_to(&sid, 0.1));
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(sim_status(&sim)["last_stop"]["reason"], "completed");
    // A long one: kill the endpoint while it runs.
    let addr = s.addr();
    let request =
        json!({"jsonrpc": "2.0", "id": 99, "method": "mhs.command", "params": move_to(&sid, 2.0)})
            .to_string();
    // The endpoint dies mid-request, so this request never gets an answer.
    let long = std::thread::spawn(move || {
        use std::io::{Read, Write};
        if let Ok(mut c) = std::net::TcpStream::connect(addr) {
            let _ = write!(c, "POST /rpc HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{request}", request.len());
            let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = c.read_to_end(&mut Vec::new());
        }
    });
    poll_until("the remote arm to move", Duration::from_secs(5), || {
        sim_status(&sim)["moving"] == true
    });
    s.kill();
    let killed = Instant::now();
    let _ = long.join();
    poll_until(
        "the controller to stop the arm by itself",
        Duration::from_millis(LEASE_MS * 4),
        || sim_status(&sim)["moving"] == false,
    );
    let stopped_after = killed.elapsed();
    let st = sim_status(&sim);
    assert_eq!(st["last_stop"]["reason"], "lease_expired", "{st}");
    let x = st["positions"][0].as_f64().expect("position");
    assert!(x > 0.1 && x < 2.0, "stopped part-way, at {x}");
    println!("external arm stopped {stopped_after:?} after kill -9 (lease {LEASE_MS} ms)");
}

#[test]
fn an_estop_reaches_the_external_controller() {
    let sim = start_sim();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &sim.addr);
    let s = Server::start_with(
        Transport::Http,
        Some(&dir.path().join("state")),
        &[OsStr::new("--config"), config.as_os_str()],
    );
    let sid = s.session();
    let motion = std::thread::scope(|scope| {
        let m = scope.spawn(|| s.command(move_to(&sid, 2.0)));
        poll_until("the remote arm to move", Duration::from_secs(5), || {
            sim_status(&sim)["moving"] == true
        });
        let stop = s.ok("mhs.safety.estop", json!({"device_id": "arm-remote"}));
        assert_eq!(stop["status"], "completed", "{stop}");
        m.join().expect("motion")
    });
    assert_eq!(motion["status"], "cancelled", "{motion}");
    let st = sim_status(&sim);
    assert_eq!(st["moving"], false, "{st}");
}

/// `tether sim door --connect` sets the external simulator's door, which the
/// endpoint reads as the arm's `door` interlock.
#[test]
fn the_door_of_an_external_simulator_is_set_through_its_address() {
    let sim = start_sim();
    let run = tether(&["sim", "door", "open", "--connect", sim.addr.as_str()]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(sim_status(&sim)["door"], "open");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &sim.addr);
    let s = Server::start_with(
        Transport::Http,
        Some(&dir.path().join("state")),
        &[std::ffi::OsStr::new("--config"), config.as_os_str()],
    );
    let door = || s.status_of("arm-remote")["interlocks"][0]["state"].clone();
    poll_until("the endpoint reads the door open", TIMEOUT, || {
        door() == "open"
    });
    let run = tether(&["sim", "door", "close", "--connect", sim.addr.as_str()]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    poll_until("the endpoint reads the door closed", TIMEOUT, || {
        door() == "closed"
    });
}
