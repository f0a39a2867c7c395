//! Verification of exported chains: intact chains pass; any single changed
//! byte, a removed entry or two swapped entries are found at the right line.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

use proptest::prelude::*;
use serde_json::json;
use std::sync::OnceLock;
use tether_store::verify::{verify_jsonl, verify_store};
use tether_store::{Commit, EventDraft, MemoryStore, SqliteStore, Store};

fn event(kind: &str, body: serde_json::Value) -> EventDraft {
    EventDraft {
        kind: kind.into(),
        body: body.into(),
    }
}

/// A real chain of 24 entries with awkward content: escapes, non-ASCII,
/// non-BMP keys, floats, big integers, nesting.
fn exported_chain() -> &'static [String] {
    static CHAIN: OnceLock<Vec<String>> = OnceLock::new();
    CHAIN.get_or_init(|| {
        let store = MemoryStore::new();
        for i in 0..12u64 {
            let commit = Commit {
                events: vec![
                    event(
                        "command.started",
                        json!({"command_id": format!("c{i}"), "input": {"x": i as f64 / 3.0, "big": u64::MAX - i}}),
                    ),
                    event(
                        "receipt",
                        json!({"status": "completed", "note": "tab\tquote\"back\\slash\u{1}é", "\u{E000}": 1, "\u{1F600}": [null, true, 1e21, -0.0]}),
                    ),
                ],
                ..Commit::default()
            };
            store.commit_blocking(commit).expect("commit");
        }
        let mut out = Vec::new();
        let n = store.export_chain(&mut out).expect("export");
        assert_eq!(n, 24);
        String::from_utf8(out).expect("utf8").lines().map(str::to_string).collect()
    })
}

fn join(lines: &[String]) -> Vec<u8> {
    let mut s = lines.join("\n");
    s.push('\n');
    s.into_bytes()
}

#[test]
fn intact_chain_verifies() {
    let lines = exported_chain();
    let r = verify_jsonl(&join(lines)[..]);
    assert!(r.ok, "{:?}", r.first_broken);
    assert_eq!(r.entries, 24);
    // Without the final newline, and with CRLF endings, too.
    let mut no_nl = join(lines);
    no_nl.pop();
    assert!(verify_jsonl(&no_nl[..]).ok);
    let crlf = lines.join("\r\n");
    assert!(verify_jsonl(crlf.as_bytes()).ok);
}

#[test]
fn an_empty_file_or_one_cut_short_is_broken() {
    let r = verify_jsonl(&b""[..]);
    assert!(!r.ok, "an empty file is not an export");
    let lines = exported_chain();
    assert_eq!(lines.len(), 25, "24 entries and the export's seal");
    assert!(lines[24].contains("\"kind\":\"audit.export.seal\""));
    // Cut 1, 2 or 24 lines from the end: the seal is gone, or no longer last.
    for cut in [1, 2, 24] {
        let r = verify_jsonl(&join(&lines[..25 - cut])[..]);
        assert!(!r.ok, "cut {cut}");
        let b = r.first_broken.expect("broken");
        assert!(
            b.reason.contains("seal is missing"),
            "cut {cut}: {}",
            b.reason
        );
        assert_eq!(r.entries, (25 - cut) as u64);
    }
    // The last entry removed with the seal kept: the seal no longer links.
    let mut kept = lines[..23].to_vec();
    kept.push(lines[24].clone());
    let r = verify_jsonl(&join(&kept)[..]);
    assert!(!r.ok);
    // A line after the seal.
    let mut after = lines.to_vec();
    after.push(lines[0].clone());
    let b = verify_jsonl(&join(&after)[..])
        .first_broken
        .expect("broken");
    assert!(
        b.reason.contains("follows the export's closing seal"),
        "{}",
        b.reason
    );
}

#[test]
fn a_store_cut_at_its_end_is_refused_by_verify_and_at_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let store = SqliteStore::open(dir.path()).expect("open");
        for i in 0..20u64 {
            let c = Commit {
                events: vec![event("tick", json!({"i": i}))],
                ..Commit::default()
            };
            store.commit_blocking(c).expect("commit");
        }
    }
    assert!(verify_store(dir.path()).expect("verify").ok);
    let db = rusqlite::Connection::open(dir.path().join("tether.db")).expect("db");
    db.execute("DELETE FROM events WHERE seq >= 18", [])
        .expect("cut the tail");
    drop(db);
    let r = verify_store(dir.path()).expect("verify");
    assert!(!r.ok);
    assert_eq!(r.entries, 17);
    let b = r.first_broken.expect("broken");
    assert!(b.reason.contains("removed from the end"), "{}", b.reason);
    let Err(err) = SqliteStore::open(dir.path()) else {
        panic!("a store cut at its end must be refused at open");
    };
    assert!(err.to_string().contains("removed from the end"), "{err}");
}

#[test]
fn removed_entry_is_a_seq_gap() {
    let mut lines = exported_chain().to_vec();
    lines.remove(4);
    let r = verify_jsonl(&join(&lines)[..]);
    assert!(!r.ok);
    assert_eq!(r.entries, 4);
    let b = r.first_broken.expect("broken");
    assert_eq!((b.line, b.seq), (5, Some(6)));
    assert_eq!(b.reason, "seq gap: expected 5, found 6");
}

#[test]
fn removed_first_entry_is_detected() {
    let lines = &exported_chain()[1..];
    let b = verify_jsonl(&join(lines)[..]).first_broken.expect("broken");
    assert_eq!((b.line, b.seq), (1, Some(2)));
    assert_eq!(b.reason, "seq gap: expected 1, found 2");
}

#[test]
fn renumbered_entry_breaks_prev_hash_or_hash() {
    // Re-sealing is impossible without the hash, so a forged entry with the
    // right seq but another prev_hash is caught by the link check.
    let lines = exported_chain();
    let mut forged = lines.to_vec();
    let other: serde_json::Value = serde_json::from_str(&lines[0]).expect("json");
    // Entry 1 re-used as entry 3's place: seq 1 != 3.
    forged[2] = lines[0].clone();
    let b = verify_jsonl(&join(&forged)[..])
        .first_broken
        .expect("broken");
    assert_eq!(b.line, 3);
    assert_eq!(b.seq, other["seq"].as_u64());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn any_changed_byte_is_detected(line_idx in 0usize..24, pos in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let mut lines: Vec<Vec<u8>> = exported_chain().iter().map(|l| l.clone().into_bytes()).collect();
        let line = &mut lines[line_idx];
        let at = pos.index(line.len());
        prop_assume!(line[at] != byte);
        line[at] = byte;
        let mut file = lines.join(&b'\n');
        file.push(b'\n');
        let r = verify_jsonl(&file[..]);
        prop_assert!(!r.ok);
        let b = r.first_broken.expect("a broken entry");
        prop_assert_eq!(b.line, line_idx as u64 + 1, "reason: {}", b.reason);
        prop_assert_eq!(r.entries, line_idx as u64);
    }

    #[test]
    fn swapped_entries_are_detected(i in 0usize..24, j in 0usize..24) {
        prop_assume!(i != j);
        let mut lines = exported_chain().to_vec();
        lines.swap(i, j);
        let r = verify_jsonl(&join(&lines)[..]);
        prop_assert!(!r.ok);
        let b = r.first_broken.expect("a broken entry");
        prop_assert_eq!(b.line, i.min(j) as u64 + 1);
        prop_assert!(b.reason.starts_with("seq gap"), "{}", b.reason);
    }
}

#[test]
fn store_and_export_verify_alike() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(dir.path()).expect("open");
    for i in 0..3000u64 {
        let c = Commit {
            events: vec![event("tick", json!({"i": i}))],
            ..Commit::default()
        };
        store.commit_blocking(c).expect("commit");
    }
    let mut out = Vec::new();
    assert_eq!(store.export_chain(&mut out).expect("export"), 3000);
    let from_file = verify_jsonl(&out[..]);
    assert!(from_file.ok);
    assert_eq!(from_file.entries, 3000);
    let from_db = verify_store(dir.path()).expect("verify store");
    assert_eq!(from_db, from_file);
    drop(store);

    // Tamper with entry 2000's text in place (multi-page read).
    let db = rusqlite::Connection::open(dir.path().join("tether.db")).expect("db");
    db.execute(
        "UPDATE events SET line = replace(line, '\"i\":1999', '\"i\":7') WHERE seq = 2000",
        [],
    )
    .expect("tamper");
    let r = verify_store(dir.path()).expect("verify");
    assert!(!r.ok);
    assert_eq!(r.entries, 1999);
    let b = r.first_broken.expect("broken");
    assert_eq!(
        (b.line, b.seq, b.reason.as_str()),
        (2000, Some(2000), "hash mismatch")
    );

    // A deleted row in the middle is a gap.
    db.execute(
        "UPDATE events SET line = (SELECT line FROM events WHERE seq = 1) WHERE seq = 1",
        [],
    )
    .expect("noop");
    db.execute("DELETE FROM events WHERE seq = 10", [])
        .expect("delete");
    let b = verify_store(dir.path())
        .expect("verify")
        .first_broken
        .expect("broken");
    assert_eq!((b.line, b.seq), (10, Some(11)));
    assert_eq!(b.reason, "seq gap: expected 10, found 11");
}

#[test]
fn verify_store_needs_a_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = verify_store(&dir.path().join("nope")).expect_err("no store");
    assert!(err.to_string().contains("no Tether store"), "{err}");
    assert!(
        !dir.path().join("nope").exists(),
        "verify must not create anything"
    );
}
