//! The SQLite store's journal (see `src/sqlite/journal.rs`): which batches it
//! holds, and that answered commits whose WAL frames a power loss took are
//! applied again when the store opens — and only those, onto the head they
//! name, or the store is refused.
//!
//! A power loss is modelled by files: the database and its WAL copied at a
//! moment SQLite had flushed them (right after a batch committed with the
//! journal off, so with SQLite's own flush, nothing queued), the journal
//! copied after later commits were answered. The copy is what a disk that
//! kept only flushed writes holds.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::json;
use std::path::Path;
use tether_store::verify::verify_store;
use tether_store::{
    Commit, EventDraft, LatchRow, OpenOp, ReceiptRef, RevisionRow, SqliteStore, Store, StoreError,
    DB_FILE_NAME, JOURNAL_FILE_NAME, JOURNAL_SET_ASIDE_FILE_NAME,
};

fn digest(id: &str) -> String {
    tether_store::canonical::digest(&json!({ "id": id }))
}

/// What a setpoint commits: its receipt entry, the receipt's index and the
/// resource's revision.
fn setpoint(id: &str, revision: u64) -> Commit {
    Commit {
        events: vec![EventDraft {
            kind: "receipt".into(),
            body: json!({"command_id": id, "receipt": {"command_id": id, "status": "completed"}})
                .into(),
        }],
        receipts: vec![ReceiptRef {
            command_id: id.into(),
            input_digest: digest(id),
            event: 0,
        }],
        revisions: vec![RevisionRow {
            device_id: "t1".into(),
            resource: "setpoint".into(),
            revision,
        }],
        ..Commit::default()
    }
}

/// What a physical call's durable start commits.
fn start(id: &str) -> Commit {
    Commit {
        events: vec![EventDraft {
            kind: "command.started".into(),
            body: json!({ "command_id": id }).into(),
        }],
        open_ops: vec![OpenOp {
            command_id: id.into(),
            info: json!({"device_id": "arm1"}),
        }],
        ..Commit::default()
    }
}

fn latch() -> Commit {
    Commit {
        latches: vec![LatchRow {
            device_id: "t1".into(),
            latched: true,
            info: json!({"by": "op"}),
        }],
        ..Commit::default()
    }
}

/// A batch committed with SQLite's own flush (the journal off for it), which
/// flushes every WAL frame written before it.
fn flushed_by_sqlite(s: &SqliteStore, c: Commit) {
    s.set_journal(false);
    s.commit_blocking(c).unwrap();
    s.set_journal(true);
}

/// The database as SQLite last flushed it: copied while nothing is queued,
/// right after [`flushed_by_sqlite`].
fn copy_database(from: &Path, to: &Path) {
    for name in [DB_FILE_NAME.to_string(), format!("{DB_FILE_NAME}-wal")] {
        let src = from.join(&name);
        if src.exists() {
            std::fs::copy(&src, to.join(&name)).unwrap();
        }
    }
}

/// The `command_id` of each of the chain's last ten entries, oldest first.
fn command_ids_in_chain(s: &SqliteStore) -> Vec<String> {
    s.chain_tail(10)
        .unwrap()
        .iter()
        .map(|e| e["body"]["command_id"].as_str().unwrap_or("").to_owned())
        .collect()
}

/// The store's chain verifies from its files, with `entries` entries.
fn assert_chain_verifies(dir: &Path, entries: u64) {
    let report = verify_store(dir).unwrap();
    assert!(report.ok, "{:?}", report.first_broken);
    assert_eq!(report.entries, entries);
}

/// `rm tether.db*`: the database and its WAL go, the journal stays.
fn remove_database(dir: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(dir.join(format!("{DB_FILE_NAME}{suffix}")));
    }
}

#[test]
fn every_batch_goes_through_the_journal_the_latch_of_an_estop_too() {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(dir.path()).unwrap();
    let at_open = s.journal_stats();
    assert!(at_open.active, "{:?}", at_open.why_off);
    s.commit_blocking(setpoint("a", 1)).unwrap();
    s.commit_blocking(start("b")).unwrap();
    s.commit_blocking(latch()).unwrap();
    let st = s.journal_stats();
    assert_eq!((st.records, st.flushed_batches), (3, 0));
    assert_eq!(st.restarts, 1, "the first record starts a fresh journal");
    flushed_by_sqlite(&s, setpoint("c", 2));
    s.commit_blocking(setpoint("d", 3)).unwrap();
    let st = s.journal_stats();
    assert_eq!((st.records, st.flushed_batches), (4, 1));
    assert_eq!(
        st.restarts, 2,
        "SQLite's flush covered the records: the next starts again"
    );
    assert_eq!(
        std::fs::metadata(dir.path().join(JOURNAL_FILE_NAME))
            .unwrap()
            .len(),
        4 << 20,
        "written once to its full size"
    );
    // A duplicate command id is still a conflict on the journal's path.
    assert!(matches!(
        s.commit_blocking(setpoint("a", 3)),
        Err(StoreError::Conflict(_))
    ));
}

#[test]
fn answered_commits_whose_wal_a_power_loss_took_are_applied_again_on_open() {
    let live = tempfile::tempdir().unwrap();
    let image = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(live.path()).unwrap();
    s.commit_blocking(setpoint("before", 1)).unwrap();
    flushed_by_sqlite(&s, setpoint("flushed", 2));
    copy_database(live.path(), image.path());
    let mut last = None;
    for i in 0..5 {
        last = Some(
            s.commit_blocking(setpoint(&format!("sp{i}"), 2 + i))
                .unwrap(),
        );
    }
    s.commit_blocking(start("move1")).unwrap();
    s.commit_blocking(latch()).unwrap();
    let last = s.commit_blocking(setpoint("after", 9)).unwrap_or_else(|e| {
        panic!("{e:?} after {last:?}");
    });
    std::fs::copy(
        live.path().join(JOURNAL_FILE_NAME),
        image.path().join(JOURNAL_FILE_NAME),
    )
    .unwrap();
    drop(s);

    let r = SqliteStore::open(image.path()).expect("the image opens");
    assert_eq!(r.journal_stats().replayed, 8);
    assert_eq!(
        r.chain_head().unwrap(),
        Some((last.last_seq, last.head_hash.clone())),
        "the head the live store answered"
    );
    for id in ["before", "flushed", "sp0", "sp4", "after"] {
        assert!(r.receipt(id).unwrap().is_some(), "{id}");
    }
    assert_eq!(r.open_ops().unwrap()[0].command_id, "move1");
    assert_eq!(r.revisions().unwrap()[0].revision, 9);
    assert!(r.latches().unwrap()[0].latched);
    // Applied once: the ids conflict, and a reopen applies nothing again.
    assert!(matches!(
        r.commit_blocking(setpoint("sp2", 20)),
        Err(StoreError::Conflict(_))
    ));
    r.commit_blocking(setpoint("next", 21)).unwrap();
    drop(r);
    let again = SqliteStore::open(image.path()).unwrap();
    assert_eq!(again.journal_stats().replayed, 0);
    assert!(again.receipt("next").unwrap().is_some());
    drop(again);
    assert_chain_verifies(image.path(), last.last_seq + 1);
}

#[test]
fn a_clean_reopen_applies_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(dir.path()).unwrap();
    for i in 0..3 {
        s.commit_blocking(setpoint(&format!("k{i}"), i + 1))
            .unwrap();
    }
    let head = s.chain_head().unwrap();
    drop(s);
    let r = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(r.journal_stats().replayed, 0);
    assert_eq!(r.chain_head().unwrap(), head);
    r.commit_blocking(setpoint("k9", 9)).unwrap();
    assert_eq!(r.journal_stats().records, 1);
}

#[test]
fn a_record_that_would_rebuild_another_head_refuses_the_store() {
    let live = tempfile::tempdir().unwrap();
    let image = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(live.path()).unwrap();
    flushed_by_sqlite(&s, setpoint("w", 1));
    copy_database(live.path(), image.path());
    s.commit_blocking(setpoint("x", 2)).unwrap();
    std::fs::copy(
        live.path().join(JOURNAL_FILE_NAME),
        image.path().join(JOURNAL_FILE_NAME),
    )
    .unwrap();
    drop(s);
    // The image's database already indexes a receipt for "x" (written by
    // hand): the record's commit would now be a conflict and append nothing.
    let db = rusqlite::Connection::open(image.path().join(DB_FILE_NAME)).unwrap();
    db.execute(
        "INSERT INTO receipts(seq, command_id, input_digest) VALUES (99, 'x', 'sha256:00')",
        [],
    )
    .unwrap();
    drop(db);
    match SqliteStore::open(image.path()) {
        Err(StoreError::Corrupt(why)) => assert!(why.contains("journal"), "{why}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn a_second_handle_on_the_store_commits_with_sqlites_flush() {
    let dir = tempfile::tempdir().unwrap();
    let first = SqliteStore::open(dir.path()).unwrap();
    let second = SqliteStore::open(dir.path()).unwrap();
    let st = second.journal_stats();
    assert!(!st.active);
    assert!(st.why_off.unwrap().contains("another process"));
    first.commit_blocking(setpoint("one", 1)).unwrap();
    second.commit_blocking(setpoint("two", 2)).unwrap();
    first.commit_blocking(setpoint("three", 3)).unwrap();
    second.commit_blocking(setpoint("four", 4)).unwrap();
    // The journal stays the live first process's: nothing of it is applied
    // or taken over by the second.
    let st = second.journal_stats();
    assert_eq!((st.records, st.adopted, st.active), (0, 0, false), "{st:?}");
    assert_eq!(first.journal_stats().records, 2);
    drop((first, second));
    assert_chain_verifies(dir.path(), 4);
}

/// Two handles on the store in `dir`: the first writes the journal, commits
/// "one", and is killed right after flushing the record of "two"; the
/// second, opened beside it, is returned.
fn beside_a_killed_writer(dir: &Path) -> SqliteStore {
    let first = SqliteStore::open(dir).unwrap();
    let second = SqliteStore::open(dir).unwrap();
    first.commit_blocking(setpoint("one", 1)).unwrap();
    // A read has the answered "one" committed (it was held in the open
    // transaction).
    assert_eq!(first.chain_head().unwrap().map(|(seq, _)| seq), Some(1));
    first.crash_after_next_record();
    assert!(matches!(
        first.commit_blocking(setpoint("two", 2)),
        Err(StoreError::Closed)
    ));
    second
}

/// A process killed while its open transaction holds answered records (the
/// kill rolls them back with it): the next open applies every one of them
/// from the journal. (A process alone on the store holds; with another
/// handle open, it commits each batch: `a_record_a_killed_process_left_...`.)
#[test]
fn answered_records_a_killed_process_held_uncommitted_are_applied_at_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let first = SqliteStore::open(dir.path()).unwrap();
    for (i, id) in ["one", "two"].into_iter().enumerate() {
        first.commit_blocking(setpoint(id, i as u64 + 1)).unwrap();
    }
    first.crash_after_next_record();
    assert!(matches!(
        first.commit_blocking(setpoint("three", 3)),
        Err(StoreError::Closed)
    ));
    let committed = receipts_in_file(dir.path());
    let second = SqliteStore::open(dir.path()).unwrap();
    // Held (nothing committed by a pause, the usual case here): all three.
    assert_eq!(second.journal_stats().replayed, 3 - committed.len() as u64);
    assert_eq!(command_ids_in_chain(&second), ["one", "two", "three"]);
    second.commit_blocking(setpoint("four", 4)).unwrap();
    drop((first, second));
    assert_chain_verifies(dir.path(), 4);
}

#[test]
fn a_record_a_killed_process_left_is_applied_by_the_other_process_before_its_own_next_commit() {
    let dir = tempfile::tempdir().unwrap();
    let second = beside_a_killed_writer(dir.path());
    // Killed: the record of "two" is in the journal, not in the database.
    assert!(second.receipt("two").unwrap().is_none());

    second.commit_blocking(setpoint("three", 3)).unwrap();
    let st = second.journal_stats();
    assert_eq!(st.adopted, 1, "{st:?}");
    assert!(st.active, "it writes the journal now: {st:?}");
    assert!(second.receipt("two").unwrap().is_some());
    let ids = command_ids_in_chain(&second);
    assert_eq!(ids, ["one", "two", "three"]);
    // And it keeps the journal as its own: its next commit is a record.
    second.commit_blocking(setpoint("four", 4)).unwrap();
    assert_eq!(second.journal_stats().records, 1);
    drop(second);
    assert_chain_verifies(dir.path(), 4);
    // Opened again, nothing is applied twice.
    let again = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(again.journal_stats().replayed, 0);
    assert_eq!(again.chain_head().unwrap().map(|(seq, _)| seq), Some(4));
}

/// A dead process's record that would rebuild another head (here: its
/// receipt indexed already, written by hand) refuses the surviving process's
/// commits as corrupt, each time, and nothing is committed past it: the
/// batch that tried to adopt it keeps nothing, the journal included.
#[test]
fn a_dead_process_s_record_that_would_rebuild_another_head_refuses_the_other_s_commits() {
    let dir = tempfile::tempdir().unwrap();
    let second = beside_a_killed_writer(dir.path());
    let db = rusqlite::Connection::open(dir.path().join(DB_FILE_NAME)).unwrap();
    db.execute(
        "INSERT INTO receipts(seq, command_id, input_digest) VALUES (99, 'two', 'sha256:00')",
        [],
    )
    .unwrap();
    drop(db);
    for id in ["three", "four"] {
        match second.commit_blocking(setpoint(id, 3)) {
            Err(StoreError::Corrupt(why)) => assert!(why.contains("journal"), "{why}"),
            other => panic!("expected Corrupt, got {other:?}"),
        }
        let st = second.journal_stats();
        assert_eq!((st.adopted, st.active), (0, false), "{st:?}");
    }
    assert_eq!(second.chain_head().unwrap().map(|(seq, _)| seq), Some(1));
}

#[test]
fn a_journal_left_beside_a_removed_database_is_not_applied_to_a_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(dir.path()).unwrap();
    s.commit_blocking(setpoint("old", 1)).unwrap();
    s.commit_blocking(latch()).unwrap();
    s.commit_blocking(start("old-move")).unwrap();
    drop(s);
    remove_database(dir.path());
    assert!(dir.path().join(JOURNAL_FILE_NAME).exists());
    let fresh = SqliteStore::open(dir.path()).unwrap();
    let st = fresh.journal_stats();
    assert_eq!((st.replayed, st.discarded), (0, 3));
    assert_eq!(st.set_aside_error, None);
    let aside = std::fs::read(dir.path().join(JOURNAL_SET_ASIDE_FILE_NAME)).unwrap();
    assert_eq!(aside.len(), 4 << 20, "the old journal, copied whole");
    assert_eq!(fresh.chain_head().unwrap(), None, "a new, empty chain");
    assert!(fresh.receipt("old").unwrap().is_none());
    assert!(
        fresh.latches().unwrap().is_empty(),
        "no latch of the old store"
    );
    assert!(fresh.open_ops().unwrap().is_empty());
    // The journal starts again over the old records: after a power loss the
    // new store's records are the ones applied, and only onto it.
    fresh.commit_blocking(setpoint("new", 1)).unwrap();
    let live_head = fresh.chain_head().unwrap();
    drop(fresh);
    let reopened = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(reopened.journal_stats().discarded, 0);
    assert_eq!(reopened.chain_head().unwrap(), live_head);
    assert!(reopened.receipt("old").unwrap().is_none());
    assert!(reopened.latches().unwrap().is_empty());
}

#[test]
fn records_set_aside_stay_unapplied_even_before_the_journal_starts_again() {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(dir.path()).unwrap();
    s.commit_blocking(setpoint("old", 1)).unwrap();
    s.commit_blocking(latch()).unwrap();
    drop(s);
    remove_database(dir.path());
    // Opened and closed with no commit: the journal file still holds the old
    // records (it starts again at its next record only).
    let fresh = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(fresh.journal_stats().discarded, 2);
    drop(fresh);
    let again = SqliteStore::open(dir.path()).unwrap();
    let st = again.journal_stats();
    assert_eq!((st.replayed, st.discarded), (0, 0));
    assert!(again.receipt("old").unwrap().is_none());
    assert!(again.latches().unwrap().is_empty());
    assert_eq!(again.chain_head().unwrap(), None);
}

/// The journal's flush fails (an I/O error of the disk) while the batch's
/// last statements ran beside its record's write: the batch is told it
/// failed and nothing of it is visible or stored (SQLite's `COMMIT` comes
/// only after the flush), its record is voided so that no later open
/// applies it, and the next commit is taken as usual.
#[test]
fn a_batch_whose_record_s_flush_fails_is_rolled_back_and_never_applied() {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(dir.path()).unwrap();
    s.commit_blocking(setpoint("one", 1)).unwrap();
    s.fail_next_journal_flush();
    let failed = s.commit_blocking(setpoint("two", 2));
    assert!(
        matches!(&failed, Err(StoreError::Io(why)) if why.contains("flush")),
        "{failed:?}"
    );
    assert!(s.receipt("two").unwrap().is_none());
    let three = s.commit_blocking(setpoint("three", 3)).unwrap();
    assert_eq!(three.first_seq, 2, "the failed batch took no seq");
    // The last batch fails too, and the process stops: its record, written
    // and then voided, is the journal's last.
    s.fail_next_journal_flush();
    assert!(s.commit_blocking(setpoint("four", 4)).is_err());
    drop(s);

    let s = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(s.journal_stats().replayed, 0);
    for id in ["two", "four"] {
        assert!(s.receipt(id).unwrap().is_none(), "{id}");
    }
    let ids = command_ids_in_chain(&s);
    assert_eq!(ids, ["one", "three"]);
    s.commit_blocking(setpoint("five", 5)).unwrap();
    drop(s);
    assert_chain_verifies(dir.path(), three.last_seq + 1);
}

/// Batches of several commits, some refused as conflicts (an id sent a
/// second time right after the first, so often last in its batch): a batch's
/// record is written once its last commit is checked, and what a power loss
/// makes the open apply again is exactly what was answered.
#[test]
fn batches_of_several_commits_with_conflicts_are_applied_again_as_answered() {
    let live = tempfile::tempdir().unwrap();
    let image = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(live.path()).unwrap();
    // Every commit through the writer thread: a burst queues into batches.
    s.set_inline_commits(false);
    flushed_by_sqlite(&s, setpoint("flushed", 1));
    copy_database(live.path(), image.path());
    let batches_before = s.stats().batches;
    let (tx, rx) = std::sync::mpsc::channel();
    const SENT: u64 = 60;
    for i in 0..SENT {
        // Every third commit repeats the id of the one before it.
        let id = format!("b{}", if i % 3 == 2 { i - 1 } else { i });
        let tx = tx.clone();
        s.submit(
            setpoint(&id, 2 + i),
            Box::new(move |r| {
                let _ = tx.send((i, r));
            }),
        );
    }
    let mut answers: Vec<_> = (0..SENT).map(|_| rx.recv().unwrap()).collect();
    answers.sort_by_key(|(i, _)| *i);
    let batches = s.stats().batches - batches_before;
    assert!(batches < SENT, "no batch held two commits ({batches})");
    let mut last = None;
    for (i, r) in &answers {
        match r {
            Ok(ack) if i % 3 != 2 => {
                if last
                    .as_ref()
                    .is_none_or(|l: &tether_store::CommitAck| ack.last_seq > l.last_seq)
                {
                    last = Some(ack.clone());
                }
            }
            Err(StoreError::Conflict(_)) if i % 3 == 2 => {}
            other => panic!("commit {i} was answered {other:?}"),
        }
    }
    let last = last.unwrap();
    std::fs::copy(
        live.path().join(JOURNAL_FILE_NAME),
        image.path().join(JOURNAL_FILE_NAME),
    )
    .unwrap();
    drop(s);

    let r = SqliteStore::open(image.path()).expect("the image opens");
    assert_eq!(r.journal_stats().replayed, batches);
    assert_eq!(
        r.chain_head().unwrap(),
        Some((last.last_seq, last.head_hash.clone())),
        "the head the live store answered"
    );
    assert_eq!(
        last.last_seq,
        1 + SENT * 2 / 3,
        "one entry per commit answered"
    );
    drop(r);
    let report = verify_store(image.path()).unwrap();
    assert!(report.ok, "{:?}", report.first_broken);
}

/// The receipts a connection of its own finds in the database file (what
/// another process on the store reads), by `command_id`.
fn receipts_in_file(dir: &Path) -> Vec<String> {
    let db = rusqlite::Connection::open(dir.join(DB_FILE_NAME)).unwrap();
    let mut st = db
        .prepare("SELECT command_id FROM receipts ORDER BY seq")
        .unwrap();
    let ids = st.query_map([], |r| r.get::<_, String>(0)).unwrap();
    ids.map(|id| id.unwrap()).collect()
}

/// Commits sent back to back share one transaction: each is answered once
/// its record is flushed, and the transaction stays open for the next. A
/// read right after the answers finds every one of them (it has them
/// committed first), as does another connection to the file after it.
#[test]
fn answered_records_held_in_one_transaction_are_read_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(dir.path()).unwrap();
    let ids: Vec<String> = (0..50).map(|i| format!("held-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        s.commit_blocking(setpoint(id, i as u64 + 1)).unwrap();
    }
    let answered = s.stats();
    // Fifty commits took fewer than fifty transactions: some held several
    // (each commit is ~0.1-0.3 ms here; a transaction is committed after a
    // 0.25 ms pause or 2 ms).
    assert!(answered.settled < 49, "{answered:?}");
    assert!(s.receipt(&ids[49]).unwrap().is_some());
    assert_eq!(receipts_in_file(dir.path()), ids);
    assert_eq!(s.journal_stats().records, 50);
    drop(s);
    let again = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(again.journal_stats().replayed, 0);
}

/// Once the callers pause, what is held is committed without any read
/// through the store asking for it (by the writer thread after its 0.25 ms
/// pause, or at the latest by the next checkpoint pass, every 40 ms):
/// another connection to the file finds every answered commit.
#[test]
fn held_records_are_committed_once_the_callers_pause() {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(dir.path()).unwrap();
    for (i, id) in ["one", "two", "three"].into_iter().enumerate() {
        s.commit_blocking(setpoint(id, i as u64 + 1)).unwrap();
    }
    // The pause is 0.25 ms; a loaded machine may take longer to wake the
    // writer thread, so the file is looked at for up to five seconds.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while receipts_in_file(dir.path()).len() < 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(receipts_in_file(dir.path()), ["one", "two", "three"]);
    assert!(s.stats().settled >= 1, "{:?}", s.stats());
}

/// A store closing commits what it holds: nothing is left for the next
/// open to apply from the journal.
#[test]
fn a_store_closing_commits_the_records_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(dir.path()).unwrap();
    s.commit_blocking(setpoint("one", 1)).unwrap();
    s.commit_blocking(setpoint("two", 2)).unwrap();
    drop(s);
    assert_eq!(receipts_in_file(dir.path()), ["one", "two"]);
    let again = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(again.journal_stats().replayed, 0);
    assert_eq!(again.chain_head().unwrap().map(|(seq, _)| seq), Some(2));
}

/// The `COMMIT` of held, answered records fails (a full disk's WAL): they
/// are only in the journal, and are applied again from it before the read
/// that asked for them, and before any later commit, onto the same head.
#[test]
fn held_records_whose_commit_fails_are_applied_again_before_anything_else() {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(dir.path()).unwrap();
    s.fail_next_commits(1);
    s.commit_blocking(setpoint("one", 1)).unwrap();
    s.commit_blocking(setpoint("two", 2)).unwrap();
    // The read has them committed; that `COMMIT` (or the writer's own, had
    // it paused first) fails, and they are applied again.
    assert!(s.receipt("two").unwrap().is_some());
    assert_eq!(s.journal_stats().recovered, 1);
    assert_eq!(receipts_in_file(dir.path()), ["one", "two"]);
    let three = s.commit_blocking(setpoint("three", 3)).unwrap();
    assert_eq!(three.first_seq, 3);
    assert_eq!(command_ids_in_chain(&s), ["one", "two", "three"]);
    drop(s);
    let again = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(again.journal_stats().replayed, 0);
    drop(again);
    assert_chain_verifies(dir.path(), 3);
}

/// While answered records whose `COMMIT` failed cannot be applied again
/// (the disk still full), a read is refused rather than answered without
/// them, and so is a new commit; once the disk has room, the next read
/// applies them first, and nothing is lost or run twice.
#[test]
fn while_held_records_cannot_be_applied_again_reads_and_commits_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(dir.path()).unwrap();
    s.fail_next_commits(1_000);
    // Answered: its record is flushed; its transaction is held.
    s.commit_blocking(setpoint("one", 1)).unwrap();
    let injected = |r: Option<&StoreError>| matches!(r, Some(StoreError::Sqlite(why)) if why.contains("injected"));
    let read = s.receipt("one");
    assert!(injected(read.as_ref().err()), "{read:?}");
    let refused = s.commit_blocking(setpoint("two", 2));
    assert!(injected(refused.as_ref().err()), "{refused:?}");
    assert!(s.chain_head().is_err());
    // Meanwhile the database lacks it: it is in the journal only.
    assert!(receipts_in_file(dir.path()).is_empty());
    assert_eq!(s.journal_stats().recovered, 0);

    s.fail_next_commits(0);
    assert!(s.receipt("one").unwrap().is_some());
    assert_eq!(s.journal_stats().recovered, 1);
    assert_eq!(receipts_in_file(dir.path()), ["one"]);
    let two = s.commit_blocking(setpoint("two", 2)).unwrap();
    assert_eq!(two.first_seq, 2, "the refused commit took no seq");
    drop(s);
    let again = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(again.journal_stats().replayed, 0);
    assert_eq!(command_ids_in_chain(&again), ["one", "two"]);
    drop(again);
    assert_chain_verifies(dir.path(), 2);
}

/// A batch that fails inside the held transaction (its record's flush
/// failed) undoes only itself: the answered records before it stay, and
/// are committed with the ones after it.
#[test]
fn a_batch_failing_inside_the_held_transaction_undoes_only_itself() {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(dir.path()).unwrap();
    s.commit_blocking(setpoint("one", 1)).unwrap();
    s.fail_next_journal_flush();
    assert!(s.commit_blocking(setpoint("two", 2)).is_err());
    s.commit_blocking(setpoint("three", 3)).unwrap();
    drop(s);
    assert_eq!(receipts_in_file(dir.path()), ["one", "three"]);
    assert_chain_verifies(dir.path(), 2);
}
