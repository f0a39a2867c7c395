//! Retention with the real binary: `tether audit archive --before SEQ` on a
//! served endpoint's store (SQLite here, PostgreSQL in `postgres_archive`
//! below) moves the entries before a signed checkpoint into a sealed file
//! that verifies on its own, and the store then verifies from that
//! checkpoint on, saying what was archived. A command_id whose receipt was
//! archived still replays after a restart. Refusals leave the store as it
//! was; a tampered file, a deleted or moved archive record and a cut head
//! each fail `verify`, naming the position.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;
#[path = "../../tether-store/tests/common/pg.rs"]
mod pg;

use common::{tether, Run, Server, Transport};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn run(args: &[&str]) -> Run {
    tether(args)
}

fn p(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// `tether keys init`; the public key.
fn init_key(state: &Path) -> String {
    let r = run(&["keys", "init", "--state-dir", p(state)]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    r.stdout_text()
        .lines()
        .find_map(|l| l.strip_prefix("public key:"))
        .expect("public key line")
        .trim()
        .to_owned()
}

fn signing_config(dir: &Path) -> PathBuf {
    let cfg = dir.join("tether.toml");
    std::fs::write(
        &cfg,
        "builtin_cell = true\n[evidence]\ncheckpoint_every_entries = 10\ncheckpoint_every_ms = 100\n",
    )
    .expect("config");
    cfg
}

fn relay(sid: &str, id: &str) -> Value {
    json!({"session_id": sid, "device_id": "relay-1", "capability_id": "cap.io.relay.v1",
        "command_id": id, "input": {"channel": 1, "on": true}})
}

/// The saved checkpoint beside the store, once its entry is at or past `seq`.
fn checkpoint_at_least(state: &Path, seq: u64) -> Value {
    let file = state.join("evidence-checkpoint.json");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let got = std::fs::read_to_string(&file)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .unwrap_or(Value::Null);
        if got["entry_seq"].as_u64().is_some_and(|s| s >= seq) {
            return got;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint at or past seq {seq} within 30 s; the newest: {got}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn lines_of(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("read")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

fn exported(args: &[&str]) -> Vec<Value> {
    let mut all = vec!["audit", "export"];
    all.extend_from_slice(args);
    let r = run(&all);
    assert_eq!(r.code, Some(0), "export: {}", r.stderr);
    r.stdout_text()
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

fn verify(args: &[&str]) -> Run {
    let mut all = vec!["audit", "verify"];
    all.extend_from_slice(args);
    run(&all)
}

fn assert_ok(r: &Run, what: &str) -> String {
    let out = r.stdout_text();
    assert_eq!(r.code, Some(0), "{what}: {out} {}", r.stderr);
    assert!(out.starts_with("ok"), "{what}: {out}");
    out
}

fn assert_broken(r: &Run, what: &str, needle: &str) -> String {
    let out = r.stdout_text();
    assert_eq!(r.code, Some(1), "{what}: {out} {}", r.stderr);
    assert!(out.contains(needle), "{what}: {out}");
    out
}

fn assert_refused(r: &Run, what: &str, needle: &str) {
    assert_eq!(r.code, Some(2), "{what}: {} {}", r.stdout_text(), r.stderr);
    assert!(r.stderr.contains(needle), "{what}: {}", r.stderr);
}

fn sha256_of(path: &Path) -> String {
    format!("{:x}", Sha256::digest(std::fs::read(path).expect("read")))
}

/// A copy of a stopped store's directory, to tamper with.
fn copy_state(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        if e.file_type().expect("type").is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
        }
    }
}

fn sql(state: &Path, statement: &str) {
    let conn = rusqlite::Connection::open(state.join("tether.db")).expect("open");
    conn.execute_batch(statement).expect("sql");
}

/// `archive` refused three ways while the endpoint serves; nothing changes.
fn refusals_change_nothing(state: &Path, work: &Path, before: u64) {
    let before_first = exported(&["--state-dir", p(state)])[0]["seq"].clone();
    let out = work.join("refused.jsonl");
    let r = run(&[
        "audit",
        "archive",
        "--before",
        "1",
        "--out",
        p(&out),
        "--state-dir",
        p(state),
    ]);
    assert_refused(
        &r,
        "no checkpoint",
        "no signed checkpoint at or before seq 1",
    );
    let r = run(&[
        "audit",
        "archive",
        "--before",
        "100000000",
        "--out",
        p(&out),
        "--state-dir",
        p(state),
    ]);
    assert_refused(&r, "beyond the head", "beyond the chain's head");
    let unwritable = work.join("no-such-dir").join("a.jsonl");
    let r = run(&[
        "audit",
        "archive",
        "--before",
        &before.to_string(),
        "--out",
        p(&unwritable),
        "--state-dir",
        p(state),
    ]);
    assert_refused(&r, "unwritable", "cannot create the archive file");
    assert!(!out.exists() && !unwritable.exists());
    assert_eq!(
        exported(&["--state-dir", p(state)])[0]["seq"],
        before_first,
        "nothing removed"
    );
}

#[test]
fn archive_on_a_served_store_keeps_receipts_and_the_store_verifies_from_the_checkpoint() {
    let work = tempfile::tempdir().expect("dir");
    let state = work.path().join("state");
    let public = init_key(&state);
    let cfg = signing_config(work.path());
    let mut s = Server::start_with(
        Transport::Http,
        Some(&state),
        &[os("--config"), cfg.as_os_str()],
    );
    let sid = s.session();
    let first = s.command(relay(&sid, "arch-0"));
    assert_eq!(first["status"], "completed", "{first}");
    for i in 1..30 {
        let r = s.command(relay(&sid, &format!("arch-{i}")));
        assert!(r["status"].is_string(), "{r}");
    }
    let saved = checkpoint_at_least(&state, 25);
    let before = saved["entry_seq"].as_u64().expect("seq");
    refusals_change_nothing(&state, work.path(), before);

    // Archive while the endpoint serves.
    let through = saved["body"]["signed"]["seq"].as_u64().expect("signed seq");
    let file1 = work.path().join("archive-1.jsonl");
    let r = run(&[
        "audit",
        "archive",
        "--before",
        &before.to_string(),
        "--out",
        p(&file1),
        "--state-dir",
        p(&state),
    ]);
    assert_eq!(r.code, Some(0), "{} {}", r.stdout_text(), r.stderr);
    let said = r.stdout_text();
    assert!(said.contains(&format!("(seq 1 to {through})")), "{said}");
    assert!(said.contains(&sha256_of(&file1)), "{said}");
    // The endpoint keeps working on the archived store, and replays.
    let more = s.command(relay(&sid, "after-archive-1"));
    assert_eq!(more["status"], "completed", "{more}");
    let again = s.command(relay(&sid, "arch-0"));
    assert_eq!(again["replayed"], true, "{again}");
    let status = s.terminate().expect("exits");
    assert!(status.success(), "{}", s.stderr_text());

    // A restarted endpoint (nothing in memory) replays the archived
    // receipt instead of running the command again.
    let mut s = Server::start_with(
        Transport::Http,
        Some(&state),
        &[os("--config"), cfg.as_os_str()],
    );
    let sid = s.session();
    let replay = s.command(relay(&sid, "arch-0"));
    assert_eq!(replay["replayed"], true, "{replay}");
    assert_eq!(replay["receipt_id"], first["receipt_id"], "{replay}");
    for i in 0..15 {
        s.command(relay(&sid, &format!("later-{i}")));
    }
    let later = checkpoint_at_least(&state, before + 10);
    let status = s.terminate().expect("exits");
    assert!(status.success(), "{}", s.stderr_text());

    // The store: verified from the checkpoint on, the archive named.
    let out = assert_ok(&verify(&["--state-dir", p(&state)]), "store");
    assert!(
        out.contains(&format!("entries before seq {} are archived", through + 1))
            && out.contains(&sha256_of(&file1)),
        "{out}"
    );
    // The file alone, with the key only; and continuity with the store.
    let f_out = assert_ok(
        &verify(&["--file", p(&file1), "--pubkey", &public]),
        "archive file",
    );
    assert!(f_out.contains(&format!("ok: {through} entries")), "{f_out}");
    let archived = lines_of(&file1);
    let last_archived = &archived[archived.len() - 2];
    assert_eq!(last_archived["seq"], through);
    let chain = exported(&["--state-dir", p(&state)]);
    assert_eq!(chain[0]["seq"], through + 1);
    assert_eq!(chain[0]["prev_hash"], last_archived["hash"], "continuity");
    let store_export = work.path().join("store.jsonl");
    std::fs::write(
        &store_export,
        chain.iter().map(|v| format!("{v}\n")).collect::<String>(),
    )
    .expect("write");

    // `store copy` copies whole chains only: an archived store is refused by
    // name, before any target is reached (this URL has no server).
    let r = run(&[
        "store",
        "copy",
        "--from",
        p(&state),
        "--to",
        "postgres://tether@127.0.0.1:9/none",
    ]);
    assert_refused(
        &r,
        "copy of an archived store",
        "has archived its entries up to seq",
    );

    // The tampering below works on the store as the first archive left it
    // (the second may leave only a checkpoint or two to tamper with).
    let after_first = work.path().join("after-first");
    copy_state(&state, &after_first);

    // A second archive starts where the first ended; its file is a slice
    // proven by the checkpoint that proved the store's start.
    let file2 = work.path().join("archive-2.jsonl");
    let r = run(&[
        "audit",
        "archive",
        "--before",
        &later["entry_seq"].to_string(),
        "--out",
        p(&file2),
        "--state-dir",
        p(&state),
    ]);
    assert_eq!(r.code, Some(0), "{} {}", r.stdout_text(), r.stderr);
    assert!(
        r.stdout_text()
            .contains(&format!("(seq {} to", through + 1)),
        "{}",
        r.stdout_text()
    );
    let f2 = assert_ok(
        &verify(&["--file", p(&file2), "--pubkey", &public]),
        "second archive",
    );
    assert!(f2.contains(&format!("slice: seq {}", through + 1)), "{f2}");
    assert_ok(&verify(&["--state-dir", p(&state)]), "store after two");
    // The first archive cannot be taken again (nothing before its end).
    let r = run(&[
        "audit",
        "archive",
        "--before",
        &before.to_string(),
        "--out",
        p(&work.path().join("again.jsonl")),
        "--state-dir",
        p(&state),
    ]);
    assert_refused(&r, "archived already", "nothing to archive");

    history_checks(&state, (&file1, &file2), work.path(), through);
    tampering_fails(&after_first, &file1, work.path(), &public);
}

/// `verify --archive`: the archive files and the store as one history from
/// seq 1, and each way it can be incomplete or wrong named.
fn history_checks(state: &Path, (file1, file2): (&Path, &Path), work: &Path, through: u64) {
    let dir = p(state);
    let with = |files: &[&Path]| {
        let mut args = vec!["--state-dir", dir];
        for f in files {
            args.extend(["--archive", p(f)]);
        }
        verify(&args)
    };
    let out = assert_ok(&with(&[file2, file1]), "whole history");
    assert!(out.contains("history: 2 archive file(s)"), "{out}");
    assert_broken(
        &with(&[file2]),
        "the oldest archive left out",
        "an older archive file is missing",
    );
    assert_broken(
        &with(&[file1]),
        "the newest archive left out",
        &format!("the store's newest archive holds seq {}", through + 1),
    );
    assert_broken(&with(&[file1, file1]), "one archive twice", "they overlap");
    // One byte changed in the newest archive: it no longer verifies on its
    // own, and the history says which file and where.
    let text = std::fs::read_to_string(file2).expect("read");
    let changed = work.join("archive-2-changed.jsonl");
    std::fs::write(&changed, text.replacen("\"kind\":\"", "\"kind\":\"x", 1)).expect("write");
    assert_broken(
        &with(&[file1, &changed]),
        "a changed newest archive",
        "archive-2-changed.jsonl: broken at line 1",
    );
}

/// A changed archive file, a deleted or moved archive record and a cut head.
fn tampering_fails(state: &Path, file1: &Path, work: &Path, public: &str) {
    // One byte of an entry's body in the file: the position is named.
    let text = std::fs::read_to_string(file1).expect("read");
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    lines[4] = lines[4].replacen("\"kind\":\"", "\"kind\":\"x", 1);
    let bad = work.join("tampered.jsonl");
    std::fs::write(&bad, lines.join("\n") + "\n").expect("write");
    assert_broken(
        &verify(&["--file", p(&bad), "--pubkey", public]),
        "tampered file",
        "line 5 (seq 5)",
    );
    assert_ne!(sha256_of(&bad), sha256_of(file1));

    // The archive record deleted: the chain's start is unexplained.
    let no_anchor = work.join("no-anchor");
    copy_state(state, &no_anchor);
    sql(&no_anchor, "DELETE FROM archives");
    assert_broken(
        &verify(&["--state-dir", p(&no_anchor)]),
        "no anchor",
        "the store records no archive",
    );

    // Entries removed and the record moved with them, so seq and link
    // agree. The store alone catches it unless a checkpoint happens to sign
    // the new point (then it is indistinguishable from an archive there):
    // the first remaining checkpoint signs a head before the store's start,
    // or none signs the new point. With the archive file it always fails:
    // the file ends where the store's start no longer is.
    for (name, drop) in [("moved-1", 1), ("moved-3", 3)] {
        let moved = work.join(name);
        copy_state(state, &moved);
        for _ in 0..drop {
            sql(
                &moved,
                "UPDATE archives SET through_seq = through_seq + 1,
                     through_hash = (SELECT hash FROM events WHERE seq = (SELECT MIN(seq) FROM events))
                 WHERE through_seq = (SELECT MAX(through_seq) FROM archives);
                 DELETE FROM events WHERE seq = (SELECT MIN(seq) FROM events);",
            );
        }
        let alone = verify(&["--state-dir", p(&moved)]);
        if alone.code != Some(0) {
            let out = assert_broken(&alone, name, "broken");
            assert!(
                out.contains("the archive point is not proven")
                    || out.contains("before the first entry this verifier holds"),
                "{name}: {out}"
            );
        }
        assert_broken(
            &verify(&["--state-dir", p(&moved), "--archive", p(file1)]),
            name,
            "broken",
        );
    }
    assert_broken(
        &verify(&["--state-dir", p(&work.join("moved-1"))]),
        "moved-1",
        "broken",
    );

    // The head cut: still caught.
    let cut = work.join("cut-head");
    copy_state(state, &cut);
    sql(
        &cut,
        "DELETE FROM events WHERE seq = (SELECT MAX(seq) FROM events)",
    );
    assert_broken(
        &verify(&["--state-dir", p(&cut)]),
        "cut head",
        "entries removed from the end",
    );
}

#[test]
fn archive_without_a_key_is_refused_and_nothing_changes() {
    let work = tempfile::tempdir().expect("dir");
    let state = work.path().join("state");
    let mut s = Server::start(Transport::Http, Some(&state));
    let sid = s.session();
    let r = s.command(relay(&sid, "unsigned-1"));
    assert_eq!(r["status"], "completed", "{r}");
    assert!(s.terminate().expect("exits").success());
    let out = work.path().join("a.jsonl");
    let r = run(&[
        "audit",
        "archive",
        "--before",
        "3",
        "--out",
        p(&out),
        "--state-dir",
        p(&state),
    ]);
    assert_refused(&r, "no key", "no public key");
    assert!(!out.exists());
    assert_ok(&verify(&["--state-dir", p(&state)]), "unchanged");
    assert_eq!(exported(&["--state-dir", p(&state)])[0]["seq"], 1);
}

#[test]
fn postgres_archive_keeps_receipts_and_verifies_from_the_checkpoint() {
    let url = pg::migrated_database("archive");
    let work = tempfile::tempdir().expect("dir");
    let state = work.path().join("state");
    let public = init_key(&state);
    let cfg = signing_config(work.path());
    let start = || {
        Server::start_with(
            Transport::Http,
            Some(&state),
            &[os("--config"), cfg.as_os_str(), os("--store"), os(&url)],
        )
    };
    let mut s = start();
    let sid = s.session();
    let first = s.command(relay(&sid, "pg-arch-0"));
    assert_eq!(first["status"], "completed", "{first}");
    for i in 1..20 {
        s.command(relay(&sid, &format!("pg-arch-{i}")));
    }
    let saved = checkpoint_at_least(&state, 15);
    let before = saved["entry_seq"].as_u64().expect("seq");
    let through = saved["body"]["signed"]["seq"].as_u64().expect("signed seq");
    let file = work.path().join("pg-archive.jsonl");
    let r = run(&[
        "audit",
        "archive",
        "--before",
        &before.to_string(),
        "--out",
        p(&file),
        "--store",
        &url,
        "--state-dir",
        p(&state),
    ]);
    assert_eq!(r.code, Some(0), "{} {}", r.stdout_text(), r.stderr);
    let more = s.command(relay(&sid, "pg-after"));
    assert_eq!(more["status"], "completed", "{more}");
    assert!(s.terminate().expect("exits").success());

    // The rows as PostgreSQL holds them: entries gone, the receipt kept.
    let min = pg::psql_on(&url, "SELECT MIN(seq) FROM events");
    assert_eq!(min, (through + 1).to_string());
    let kept = pg::psql_on(
        &url,
        "SELECT receipt IS NOT NULL FROM receipts WHERE command_id = 'pg-arch-0'",
    );
    assert_eq!(kept, "t");

    let mut s = start();
    let sid = s.session();
    let replay = s.command(relay(&sid, "pg-arch-0"));
    assert_eq!(replay["replayed"], true, "{replay}");
    assert_eq!(replay["receipt_id"], first["receipt_id"], "{replay}");
    assert!(s.terminate().expect("exits").success());

    let out = assert_ok(&verify(&["--store", &url, "--pubkey", &public]), "pg store");
    assert!(
        out.contains(&format!("entries before seq {} are archived", through + 1)),
        "{out}"
    );
    let unkeyed = verify(&["--store", &url]);
    assert_refused(&unkeyed, "pg without keys", "give the public keys");
    assert_ok(
        &verify(&["--file", p(&file), "--pubkey", &public]),
        "pg archive file",
    );
    let chain = exported(&["--store", &url]);
    let archived = lines_of(&file);
    assert_eq!(chain[0]["prev_hash"], archived[archived.len() - 2]["hash"]);

    // The record deleted: caught.
    pg::psql_on(&url, "DELETE FROM archives");
    assert_broken(
        &verify(&["--store", &url, "--pubkey", &public]),
        "pg no anchor",
        "the store records no archive",
    );
}
