//! Device health against a real network peer: `remote.arm` in mode hardware
//! with `safety.watchdog_ms`, its controller a `tether sim serve` process.
//! Killing the controller shows the link reconnecting with its last error in
//! `mhs.safety.status` and `mhs.devices.list`, turns `GET /healthz` to 503
//! naming the device, and past the watchdog period latches the device (a
//! command is refused with the latch code, the evidence has the trip).
//! Restarting it brings the link and `/healthz` back; the latch holds until
//! an operator resets it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

use common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const AGENT: &str = "link-agent-token";
const OPERATOR: &str = "link-operator-token";
const ARM: &str = "arm-remote";
const WATCHDOG_MS: u64 = 1000;

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

/// `tether sim serve` on `listen`; its address from the banner.
fn start_sim(listen: &str) -> Sim {
    let mut child = Command::new(BIN)
        .args(["sim", "serve", "--listen", listen])
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
        .unwrap_or_else(|| panic!("no address in the sim's banner: {line}"))
        .to_owned();
    Sim { child, addr }
}

fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

/// The built-in arm as `remote.arm` at `addr`, mode hardware, with a
/// watchdog period; an agent and an operator.
fn write_config(dir: &Path, addr: &str) -> PathBuf {
    let manifest = as_hardware(include_str!("../../tether-drivers/cell/arm-1.toml"))
        .replace("driver = \"sim.arm\"", "driver = \"remote.arm\"")
        .replace("device_id = \"arm-1\"", &format!("device_id = \"{ARM}\""))
        .replace(
            "home = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]",
            &format!("address = \"{addr}\""),
        )
        .replace("tick_ms = 10\n", "")
        .replace(
            "[safety]\n",
            &format!("[safety]\nwatchdog_ms = {WATCHDOG_MS}\n"),
        );
    assert!(
        manifest.contains("watchdog_ms"),
        "arm-1.toml changed; update the test"
    );
    std::fs::write(dir.join("arm-remote.toml"), manifest).expect("manifest");
    let config = dir.join("tether.toml");
    let text = format!(
        "devices = [\"arm-remote.toml\"]\n\n[[principals]]\nid = \"planner\"\nkind = \"agent\"\ntoken_sha256 = \"{}\"\n\n[[principals]]\nid = \"olga\"\nkind = \"human\"\nroles = [\"operator\"]\ntoken_sha256 = \"{}\"\n",
        sha256_hex(AGENT),
        sha256_hex(OPERATOR)
    );
    std::fs::write(&config, text).expect("config");
    config
}

fn result(s: &Server, token: &str, method: &str, params: Value) -> Value {
    let r = call_with_token(s, token, method, params);
    assert!(r.get("error").is_none(), "{method}: {r}");
    r["result"].clone()
}

fn status(s: &Server) -> Value {
    result(s, OPERATOR, "mhs.safety.status", json!({"device_id": ARM}))["devices"][0].clone()
}

fn listed(s: &Server) -> Value {
    let list = result(s, AGENT, "mhs.devices.list", json!({}));
    list["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .find(|d| d["device_id"] == ARM)
        .cloned()
        .expect("the arm is listed")
}

fn healthz(s: &Server) -> (u16, Value) {
    let r = http_request(s.addr(), "GET", "/healthz", b"", TIMEOUT, "");
    (r.status, r.json())
}

#[test]
fn a_lost_controller_shows_reconnecting_fails_healthz_and_latches_past_its_watchdog() {
    let mut sim = start_sim("127.0.0.1:0");
    let addr = sim.addr.clone();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &addr);
    let mut s = start_with_config(dir.path(), &config);

    // Connected: shown in both views; healthy.
    poll_until("the link to come up", TIMEOUT, || {
        status(&s)["link"]["state"] == "connected"
    });
    assert_eq!(listed(&s)["link"]["state"], "connected");
    let (code, body) = healthz(&s);
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["ok"], true, "{body}");
    let sid = result(&s, AGENT, "mhs.session.open", json!({}))["session_id"]
        .as_str()
        .expect("session")
        .to_owned();

    // The controller dies.
    let _ = sim.child.kill();
    let _ = sim.child.wait();
    let killed = Instant::now();
    // (The watch's request in flight at the kill may fail otherwise first.)
    poll_until("the link to show reconnecting, refused", TIMEOUT, || {
        let link = &status(&s)["link"];
        link["state"] == "reconnecting" && link["last_error"] == "connection refused"
    });
    let st = status(&s);
    let down_since = st["link"]["since_ms"].as_u64().expect("since_ms");
    let l = listed(&s);
    assert_eq!(l["link"]["state"], "reconnecting", "{l}");
    assert_eq!(l["link"]["since_ms"].as_u64(), Some(down_since), "{l}");
    let (code, body) = healthz(&s);
    assert_eq!(code, 503, "{body}");
    assert_eq!(body["ok"], false, "{body}");
    assert_eq!(body["store"]["writable"], true, "{body}");
    assert_eq!(body["unreachable"][0]["device_id"], ARM, "{body}");
    assert_eq!(
        body["unreachable"][0]["link"]["last_error"], "connection refused",
        "{body}"
    );

    // Past the watchdog period the device is latched, naming the link.
    poll_until("the link-loss latch", TIMEOUT, || {
        status(&s)["latched"] == true
    });
    assert!(
        killed.elapsed() >= Duration::from_millis(WATCHDOG_MS),
        "latched {:?} after the kill, before the watchdog period",
        killed.elapsed()
    );
    let st = status(&s);
    let reason = st["latch"]["reason"].as_str().expect("reason");
    assert!(
        reason.contains("link") && reason.contains("connection refused"),
        "{st}"
    );
    let refused = result(
        &s,
        AGENT,
        "mhs.command",
        json!({"session_id": sid, "device_id": ARM, "capability_id": "cap.motion.move_to.v1", "input": {"joints": [0.1, 0, 0, 0, 0, 0], "speed": 0.5}}),
    );
    assert_eq!(refused["status"], "rejected", "{refused}");
    assert_eq!(
        refused["error"]["mhs_code"], "MHS.SAFETY.ESTOP_ENGAGED",
        "{refused}"
    );
    // A reset while the controller is away is refused.
    let early = result(
        &s,
        OPERATOR,
        "mhs.safety.reset",
        json!({"device_id": ARM, "reason": "too soon"}),
    );
    assert_eq!(early["status"], "rejected", "{early}");
    assert_eq!(early["error"]["details"]["reason"], "link_down", "{early}");

    // The controller returns at the same address: link and health back,
    // the latch holds.
    let _sim = start_sim(&addr);
    poll_until("the link to come back", TIMEOUT, || {
        status(&s)["link"]["state"] == "connected"
    });
    poll_until("/healthz to answer 200 again", TIMEOUT, || {
        healthz(&s).0 == 200
    });
    let st = status(&s);
    assert_eq!(
        st["latched"], true,
        "the latch holds after the link returns: {st}"
    );
    assert_eq!(st["link"]["last_error"], "connection refused", "{st}");

    // Only an operator releases it (once the stop path got through).
    let by_agent = call_with_token(
        &s,
        AGENT,
        "mhs.safety.reset",
        json!({"device_id": ARM, "reason": "agent"}),
    );
    assert_eq!(
        by_agent["result"]["error"]["mhs_code"], "MHS.AUTH.FORBIDDEN",
        "{by_agent}"
    );
    let mut last = Value::Null;
    poll_until("an operator's reset to release the latch", TIMEOUT, || {
        last = result(
            &s,
            OPERATOR,
            "mhs.safety.reset",
            json!({"device_id": ARM, "reason": "controller back"}),
        );
        last["status"] == "completed"
    });
    assert_eq!(status(&s)["latched"], false);

    // The evidence has the trip (source `link`) and the link's changes (a
    // change is recorded within one poll of the link monitor, at most 250 ms).
    std::thread::sleep(Duration::from_millis(tether_kernel::LINK_POLL_MS_MAX + 100));
    s.terminate();
    let export = tether(&[
        "audit".as_ref(),
        "export".as_ref(),
        "--state-dir".as_ref(),
        dir.path().join("state").as_os_str(),
    ]);
    assert_eq!(export.code, Some(0), "export failed: {}", export.stderr);
    let entries: Vec<Value> = export
        .stdout_text()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let trips: Vec<&Value> = entries
        .iter()
        .filter(|e| e["kind"] == "safety.estop" && e["body"]["source"] == "link")
        .collect();
    assert_eq!(trips.len(), 1, "one trip for one outage");
    assert_eq!(trips[0]["body"]["device_id"], ARM);
    let changes: Vec<&Value> = entries
        .iter()
        .filter(|e| e["kind"] == "device.link")
        .map(|e| &e["body"]["link"]["state"])
        .collect();
    assert!(
        changes
            .windows(2)
            .any(|w| w[0] == "reconnecting" && w[1] == "connected"),
        "{changes:?}"
    );
}
