//! A power loss after answered commands, against the real binary: the SQLite
//! store answers a command once its record is flushed in `tether.journal`,
//! before SQLite's WAL frames reach the disk (docs/STORE.md, "The journal").
//! A machine that loses power then holds the database as it was last
//! flushed and the journal; the next open must apply the answered commands
//! again, identically, and run none of them twice.
//!
//! The image of such a disk is made from files: the database as a clean stop
//! left it (flushed and closed), the journal as a later run that was killed
//! after its answers left it. The live directory (killed, nothing lost) is
//! the reference: the image's chain must be the same entries, byte for
//! byte, and each command resent with its `command_id` must replay the
//! receipt the client was given. A third directory with the same database and
//! no journal shows what the journal keeps: there the commands are missing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{tether, Server, Transport};
use serde_json::{json, Value};
use std::path::Path;

const THERMOSTAT: &str = "thermostat-1";
const RELAY: &str = "relay-1";

fn setpoint(sid: &str, id: &str, t: f64) -> Value {
    json!({"session_id": sid, "device_id": THERMOSTAT, "capability_id": "cap.thermal.setpoint.v1",
           "command_id": id, "input": {"target_temperature": t}})
}

fn relay(sid: &str, id: &str, on: bool) -> Value {
    json!({"session_id": sid, "device_id": RELAY, "capability_id": "cap.io.relay.v1",
           "command_id": id, "input": {"channel": 2, "on": on}})
}

/// The entries `tether audit export` writes for a state directory (which
/// opens the store, and so applies the journal's records it lacks), without
/// the seal that closes the export (it carries the export's own time).
fn export(dir: &Path) -> Vec<String> {
    let run = tether(&[
        "audit".as_ref(),
        "export".as_ref(),
        "--state-dir".as_ref(),
        dir.as_os_str(),
    ]);
    assert_eq!(
        run.code,
        Some(0),
        "export of {}: {}",
        dir.display(),
        run.stderr
    );
    String::from_utf8(run.stdout)
        .expect("utf-8 export")
        .lines()
        .filter(|l| !l.contains("\"kind\":\"audit.export.seal\""))
        .map(str::to_owned)
        .collect()
}

fn verify(dir: &Path) {
    let run = tether(&[
        "audit".as_ref(),
        "verify".as_ref(),
        "--state-dir".as_ref(),
        dir.as_os_str(),
    ]);
    assert_eq!(
        run.code,
        Some(0),
        "verify {}: {} {}",
        dir.display(),
        run.stdout_text(),
        run.stderr
    );
}

/// A receipt without its `replayed` flag.
fn bare(r: &Value) -> Value {
    let mut r = r.clone();
    if let Value::Object(m) = &mut r {
        m.remove("replayed");
    }
    r
}

fn copy(from: &Path, to: &Path, name: &str) {
    let src = from.join(name);
    if src.exists() {
        std::fs::copy(&src, to.join(name)).unwrap_or_else(|e| panic!("copy {name}: {e}"));
    }
}

#[test]
fn answered_commands_survive_a_power_loss_that_took_sqlites_unflushed_wal() {
    let live = tempfile::tempdir().unwrap();
    let image = tempfile::tempdir().unwrap();
    let without_journal = tempfile::tempdir().unwrap();

    // A first run, stopped cleanly: its database is flushed and closed.
    let mut first = Server::start(Transport::Http, Some(live.path()));
    let sid = first.session();
    let r = first.command(setpoint(&sid, "before-1", 21.0));
    assert_eq!(r["status"], "completed", "{r}");
    assert!(first.terminate().is_some(), "a clean stop");
    for dir in [image.path(), without_journal.path()] {
        for name in ["tether.db", "tether.db-wal"] {
            copy(live.path(), dir, name);
        }
    }

    // A second run: commands answered, then a kill (nothing lost here).
    let mut second = Server::start(Transport::Http, Some(live.path()));
    let sid = second.session();
    let mut sent = Vec::new();
    for i in 0..12 {
        let id = format!("after-{i}");
        let req = if i % 3 == 2 {
            relay(&sid, &id, i % 2 == 0)
        } else {
            setpoint(&sid, &id, 20.0 + f64::from(i))
        };
        let r = second.command(req.clone());
        assert_eq!(r["status"], "completed", "{r}");
        sent.push((req, r));
    }
    second.kill();
    copy(live.path(), image.path(), "tether.journal");

    // The image applies the journal: the same chain as the live directory.
    let reference = export(live.path());
    let rebuilt = export(image.path());
    assert_eq!(
        rebuilt.len(),
        reference.len(),
        "entries after the power loss"
    );
    if let Some((a, b)) = rebuilt.iter().zip(&reference).find(|(a, b)| a != b) {
        panic!("the rebuilt chain differs from the live one:\n{a}\n{b}");
    }
    let lost = export(without_journal.path());
    assert!(
        lost.len() < reference.len() && !lost.iter().any(|l| l.contains("after-0")),
        "without the journal the answered commands are gone ({} of {} entries)",
        lost.len(),
        reference.len()
    );
    verify(image.path());

    // Each command resent with its id replays the receipt its client got.
    let s = Server::start(Transport::Http, Some(image.path()));
    let sid = s.session();
    for (mut req, answered) in sent {
        req["session_id"] = json!(sid);
        let again = s.command(req);
        assert_eq!(again["replayed"], true, "{again}");
        assert_eq!(bare(&again), bare(&answered), "replayed receipt");
    }
    drop(s);
    verify(image.path());
}

/// `rm tether.db*` to start afresh leaves `tether.journal`: its records
/// belong to the removed database and must not come back into the new one
/// (the old store's latch would trip the new endpoint, its receipts would
/// replay for ids the new store never ran).
#[test]
fn a_journal_left_behind_by_a_removed_database_is_not_applied_to_a_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut old = Server::start(Transport::Http, Some(dir.path()));
    let sid = old.session();
    let r = old.command(setpoint(&sid, "old-1", 21.0));
    assert_eq!(r["status"], "completed", "{r}");
    let stop = old.ok(
        "mhs.safety.estop",
        json!({"device_id": THERMOSTAT, "reason": "before the reset"}),
    );
    assert_eq!(stop["status"], "completed", "{stop}");
    assert!(old.terminate().is_some(), "a clean stop");
    assert!(
        export(dir.path())
            .iter()
            .any(|l| l.contains("before the reset")),
        "the old chain records the e-stop"
    );
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(dir.path().join(format!("tether.db{suffix}")));
    }
    assert!(dir.path().join("tether.journal").exists());

    let s = Server::start(Transport::Http, Some(dir.path()));
    let sid = s.session();
    // Not latched by the old store's e-stop, and "old-1" is a new command.
    let r = s.command(setpoint(&sid, "old-1", 22.0));
    assert_eq!(r["status"], "completed", "{r}");
    assert_ne!(r["replayed"], true, "{r}");
    assert!(
        s.stderr_text()
            .contains("not applied, copied to tether.journal.set-aside"),
        "start-up says the journal's records were set aside: {}",
        s.stderr_text()
    );
    drop(s);
    let entries = export(dir.path());
    assert!(
        !entries.iter().any(|l| l.contains("before the reset")),
        "the old store's e-stop is not in the new chain"
    );
    verify(dir.path());
}
