//! Evidence across a restart (latch, receipts, chain) and tamper detection
//! of an exported chain.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

use common::{assert_rejected, tether, Run, Server, Transport};
use serde_json::{json, Value};
use std::path::Path;

const T: &str = "thermostat-1";
const RELAY: &str = "relay-1";

fn relay_switch(sid: &str, command_id: &str) -> Value {
    json!({"session_id": sid, "device_id": RELAY, "capability_id": "cap.io.relay.v1", "command_id": command_id, "input": {"channel": 2, "on": true}})
}

/// `ok: N entries, chain intact` → N.
fn intact_entries(run: &Run) -> u64 {
    let out = run.stdout_text();
    assert_eq!(
        run.code,
        Some(0),
        "verify failed: stdout {out:?} stderr {:?}",
        run.stderr
    );
    assert!(out.starts_with("ok"), "verify output: {out:?}");
    out.split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no entry count in {out:?}"))
}

fn verify_dir(dir: &Path) -> Run {
    tether(&[
        "audit".as_ref(),
        "verify".as_ref(),
        "--state-dir".as_ref(),
        dir.as_os_str(),
    ])
}

fn verify_file(file: &Path) -> Run {
    tether(&[
        "audit".as_ref(),
        "verify".as_ref(),
        "--file".as_ref(),
        file.as_os_str(),
    ])
}

#[test]
fn restart_keeps_the_latch_the_receipts_and_the_chain() {
    let dir = tempfile::tempdir().expect("tempdir");

    let mut first = Server::start(Transport::Http, Some(dir.path()));
    let sid = first.session();
    let stop = first.ok(
        "mhs.safety.estop",
        json!({"device_id": T, "reason": "before restart"}),
    );
    assert_eq!(stop["status"], "completed", "{stop}");
    assert_eq!(stop["latch_durable"], true, "{stop}");
    let done = first.command(relay_switch(&sid, "e2e-restart-1"));
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["state_revision_after"], 1, "{done}");
    first.kill();

    let before = intact_entries(&verify_dir(dir.path()));
    assert!(before > 0);

    let mut second = Server::start(Transport::Http, Some(dir.path()));
    let st = second.status_of(T);
    assert_eq!(st["latched"], true, "the latch survives a restart: {st}");
    assert_eq!(second.status_of(RELAY)["latched"], false);

    // Sessions do not survive; receipts do.
    let sid2 = second.session();
    let replay = second.command(relay_switch(&sid2, "e2e-restart-1"));
    assert_eq!(replay["replayed"], true, "{replay}");
    assert_eq!(replay["receipt_id"], done["receipt_id"], "{replay}");
    assert_eq!(replay["status"], "completed");
    // The persisted revision, not a fresh count.
    assert_eq!(
        second.revision(&sid2, RELAY, "bank"),
        1,
        "the revision survives a restart"
    );

    // The latch still refuses effects after the restart.
    let refused = second.command(json!({"session_id": sid2, "device_id": T, "capability_id": "cap.thermal.setpoint.v1", "input": {"target_temperature": 30}}));
    assert_rejected(&refused, "MHS.SAFETY.ESTOP_ENGAGED");
    second.kill();

    // One chain across both runs: intact and longer than before.
    let after = intact_entries(&verify_dir(dir.path()));
    assert!(
        after > before,
        "the chain continued across the restart ({before} -> {after} entries)"
    );
}

/// A state directory with some evidence, exported to JSON Lines.
fn exported_chain() -> (tempfile::TempDir, Vec<Vec<u8>>) {
    let work = tempfile::tempdir().expect("tempdir");
    let state = work.path().join("state");
    {
        let mut s = Server::start(Transport::Http, Some(&state));
        let sid = s.session();
        for t in [25, 30, 35] {
            let r = s.command(json!({"session_id": sid, "device_id": T, "capability_id": "cap.thermal.setpoint.v1", "input": {"target_temperature": t}}));
            assert_eq!(r["status"], "completed", "{r}");
        }
        assert_rejected(&s.command(json!({"session_id": sid, "device_id": T, "capability_id": "cap.thermal.setpoint.v1", "input": {"target_temperature": 400}})), "MHS.SAFETY.ENVELOPE_VIOLATION");
        s.kill();
    }
    let export = tether(&[
        "audit".as_ref(),
        "export".as_ref(),
        "--state-dir".as_ref(),
        state.as_os_str(),
    ]);
    assert_eq!(export.code, Some(0), "export failed: {}", export.stderr);
    let lines: Vec<Vec<u8>> = export
        .stdout
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    assert!(
        lines.len() >= 6,
        "too few entries to tamper with: {}",
        lines.len()
    );
    for l in &lines {
        let v: Value = serde_json::from_slice(l).expect("each exported line is JSON");
        assert!(
            v["body"].is_object() && v["hash"].is_string() && v["prev_hash"].is_string(),
            "entry: {v}"
        );
    }
    (work, lines)
}

fn write_lines(path: &Path, lines: &[Vec<u8>]) {
    let mut out = Vec::new();
    for l in lines {
        out.extend_from_slice(l);
        out.push(b'\n');
    }
    std::fs::write(path, out).expect("write chain");
}

/// Verify must fail and name `line` as the first broken one.
fn assert_broken_at(run: &Run, line: usize, what: &str) {
    let out = run.stdout_text();
    assert_eq!(
        run.code,
        Some(1),
        "{what}: verify should fail; stdout {out:?} stderr {:?}",
        run.stderr
    );
    assert!(out.contains("broken"), "{what}: {out:?}");
    assert!(
        out.contains(&format!("line {line} ")) || out.contains(&format!("line {line}:")),
        "{what}: verify must name line {line}: {out:?}"
    );
}

/// Changes one character of a string value inside `body`, keeping the line
/// valid canonical JSON so only the hash can tell.
fn flip_a_body_byte(line: &mut [u8]) {
    let body = line
        .windows(8)
        .position(|w| w == b"\"body\":{")
        .expect("a body")
        + 8;
    let mut i = body;
    while i + 3 < line.len() {
        if &line[i..i + 3] == b"\":\"" {
            let c = line[i + 3];
            if c.is_ascii_alphanumeric() {
                line[i + 3] = if c == b'a' { b'b' } else { b'a' };
                return;
            }
        }
        i += 1;
    }
    panic!(
        "no string value in the body of {}",
        String::from_utf8_lossy(line)
    );
}

#[test]
fn tampering_with_an_exported_chain_is_detected_and_located() {
    let (work, lines) = exported_chain();
    let intact = work.path().join("chain.jsonl");
    write_lines(&intact, &lines);
    let n = intact_entries(&verify_file(&intact));
    assert_eq!(
        n,
        lines.len() as u64 - 1,
        "every exported entry verifies; the last line is the export's seal"
    );
    let seal: Value = serde_json::from_slice(&lines[lines.len() - 1]).expect("seal");
    assert_eq!(seal["kind"], "audit.export.seal", "{seal}");
    assert_eq!(seal["body"]["entries"], n, "{seal}");

    let mid = lines.len() / 2; // 0-based index of a middle line; its line number is mid + 1

    // (a) one byte of a body.
    let mut a = lines.clone();
    let original = a[mid].clone();
    flip_a_body_byte(&mut a[mid]);
    assert_eq!(a[mid].len(), original.len());
    assert_eq!(
        a[mid].iter().zip(&original).filter(|(x, y)| x != y).count(),
        1,
        "exactly one byte differs"
    );
    assert!(
        serde_json::from_slice::<Value>(&a[mid]).is_ok(),
        "the tampered line is still JSON"
    );
    let fa = work.path().join("byte.jsonl");
    write_lines(&fa, &a);
    assert_broken_at(&verify_file(&fa), mid + 1, "changed byte");

    // (b) a middle line deleted: the next line no longer follows.
    let mut b = lines.clone();
    b.remove(mid);
    let fb = work.path().join("deleted.jsonl");
    write_lines(&fb, &b);
    assert_broken_at(&verify_file(&fb), mid + 1, "deleted line");

    // (c) two lines swapped.
    let mut c = lines.clone();
    c.swap(mid, mid + 1);
    let fc = work.path().join("swapped.jsonl");
    write_lines(&fc, &c);
    assert_broken_at(&verify_file(&fc), mid + 1, "swapped lines");

    // (d) lines cut from the end: the last entry, or the seal with it.
    let last = lines.len() - 1;
    let mut d = lines.clone();
    d.remove(last - 1);
    let fd = work.path().join("last-entry.jsonl");
    write_lines(&fd, &d);
    assert_broken_at(&verify_file(&fd), last, "last entry removed");
    let fe = work.path().join("truncated.jsonl");
    write_lines(&fe, &lines[..last - 1]);
    assert_broken_at(&verify_file(&fe), last, "cut short");

    // The untouched export still verifies.
    assert_eq!(intact_entries(&verify_file(&intact)), n);
}

#[test]
fn verify_reads_an_export_from_standard_input() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let (work, lines) = exported_chain();
    let mut text = Vec::new();
    for l in &lines {
        text.extend_from_slice(l);
        text.push(b'\n');
    }
    let verify = |input: &[u8]| {
        let mut child = Command::new(common::BIN)
            .args(["audit", "verify", "--file", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input)
            .expect("write");
        child.wait_with_output().expect("wait")
    };
    let ok = verify(&text);
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stdout)
    );
    let cut = &text[..text.len() - lines[lines.len() - 1].len() - 1];
    let broken = verify(cut);
    assert_eq!(
        broken.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&broken.stdout)
    );
    drop(work);
}

/// `audit export --follow` prints the chain so far, then each entry as it
/// commits; every line links to the one before it (`prev_hash`), so a
/// receiver can check continuity; `--after SEQ` resumes after an entry.
#[test]
fn export_follow_tails_the_chain_with_each_link() {
    use std::io::BufRead;
    let s = Server::http();
    let sid = s.session();
    assert_eq!(
        s.command(relay_switch(&sid, "follow-1"))["status"],
        "completed"
    );
    let mut child = std::process::Command::new(common::BIN)
        .args(["audit", "export", "--follow", "--state-dir"])
        .arg(s.state_dir())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("follow");
    let (tx, rx) = std::sync::mpsc::channel::<Value>();
    let out = child.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                break;
            };
            if tx.send(v).is_err() {
                break;
            }
        }
    });
    let next = || {
        rx.recv_timeout(std::time::Duration::from_secs(20))
            .expect("a followed line")
    };
    let mut lines = vec![next()];
    // The chain so far, then the command run after the follower started.
    assert_eq!(
        s.command(relay_switch(&sid, "follow-2"))["status"],
        "completed"
    );
    while !lines
        .iter()
        .any(|e| e["body"]["receipt"]["command_id"] == "follow-2")
    {
        lines.push(next());
    }
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(lines[0]["seq"], 1);
    for pair in lines.windows(2) {
        assert_eq!(
            pair[1]["seq"].as_u64(),
            pair[0]["seq"].as_u64().map(|n| n + 1)
        );
        assert_eq!(pair[1]["prev_hash"], pair[0]["hash"], "{pair:?}");
    }
    assert!(
        lines.iter().all(|e| e["kind"] != "audit.export.seal"),
        "a followed stream has no seal"
    );
}
