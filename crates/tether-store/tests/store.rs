//! Behaviour of every store through the `Store` trait — a conformance suite
//! run against the memory store, SQLite and a real PostgreSQL (a throwaway
//! cluster, see `common/pg.rs`; every run of it a database of its own) with
//! the same assertions — plus SQLite-only durability and integrity checks
//! (PostgreSQL's own are in `postgres.rs`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

#[path = "common/pg.rs"]
mod pg;

use serde_json::json;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;
use tether_store::verify::{verify_jsonl, verify_store};
use tether_store::{
    BudgetRow, Commit, CommitAck, EventDraft, LatchRow, MemoryStore, ReceiptRef, ReceiptRow,
    RevisionRow, SqliteStore, Store, StoreError, GENESIS_PREV_HASH, QUEUE_CAPACITY,
};

fn event(kind: &str, body: serde_json::Value) -> EventDraft {
    EventDraft {
        kind: kind.into(),
        body: body.into(),
    }
}

fn receipt(id: &str) -> ReceiptRow {
    ReceiptRow {
        command_id: id.into(),
        input_digest: tether_store::canonical::digest(&json!({"id": id})),
        receipt: json!({"command_id": id, "status": "completed"}),
    }
}

/// The commit's side of `receipt(id)`: the row pointing at event `event`.
fn receipt_ref(id: &str, event: usize) -> ReceiptRef {
    ReceiptRef {
        command_id: id.into(),
        input_digest: receipt(id).input_digest,
        event,
    }
}

/// An entry recording `receipt(id)`, where the store keeps it.
fn receipt_event(id: &str) -> EventDraft {
    event(
        "receipt",
        json!({"command_id": id, "receipt": receipt(id).receipt}),
    )
}

fn budget(id: &str, ts_ms: u64) -> BudgetRow {
    BudgetRow {
        key: "dev1/energy".into(),
        reservation_id: id.into(),
        amount: 2.5,
        ts_ms,
        released: false,
        cap: None,
    }
}

fn full_commit(id: &str) -> Commit {
    Commit {
        events: vec![
            event("command.started", json!({"command_id": id})),
            receipt_event(id),
        ],
        receipts: vec![receipt_ref(id, 1)],
        revisions: vec![RevisionRow {
            device_id: "dev1".into(),
            resource: "state".into(),
            revision: 7,
        }],
        latches: vec![LatchRow {
            device_id: "dev1".into(),
            latched: true,
            info: json!({"by": "op"}),
        }],
        budget_draws: vec![budget(&format!("r-{id}"), 1_000)],
        budget_releases: vec![],
        leases: vec![],
        open_ops: vec![tether_store::OpenOp {
            command_id: format!("{id}-open"),
            info: json!({"device_id": "dev1"}),
        }],
        closed_ops: vec![],
        approvals: vec![tether_store::ApprovalRow {
            approval_id: format!("appr-{id}"),
            record: json!({"status": "pending", "votes": []}),
        }],
        invocations: vec![],
        invocation_refs: vec![],
    }
}

/// Run `f` against every implementation: memory, SQLite, PostgreSQL.
fn both(f: impl Fn(&dyn Store)) {
    f(&MemoryStore::new());
    let dir = tempfile::tempdir().expect("tempdir");
    f(&SqliteStore::open(dir.path()).expect("open"));
    let url = pg::migrated_database("conformance");
    f(&tether_store::PgStore::open(&url).expect("open PostgreSQL"));
}

#[test]
fn commit_and_read_back() {
    both(|s| {
        assert_eq!(s.chain_head().expect("head"), None);
        let ack = s.commit_blocking(full_commit("c1")).expect("commit");
        assert_eq!((ack.first_seq, ack.last_seq), (1, 2));
        assert_eq!(
            s.chain_head().expect("head"),
            Some((2, ack.head_hash.clone()))
        );

        let r = s.receipt("c1").expect("read").expect("present");
        assert_eq!(r, receipt("c1"));
        assert_eq!(s.receipt("nope").expect("read"), None);
        assert_eq!(s.revisions().expect("revs")[0].revision, 7);
        assert!(s.latches().expect("latches")[0].latched);
        let open = s.open_ops().expect("open ops");
        assert_eq!(open.len(), 1);
        assert_eq!(open[0].command_id, "c1-open");
        // Closing an open operation removes it; closing an unknown one is a no-op.
        s.commit_blocking(Commit {
            closed_ops: vec!["c1-open".into(), "never-opened".into()],
            ..Commit::default()
        })
        .expect("close");
        assert!(s.open_ops().expect("open ops").is_empty());
        assert_eq!(
            s.budget_rows_since(0).expect("budget"),
            vec![budget("r-c1", 1_000)]
        );
        assert!(s.budget_rows_since(1_001).expect("budget").is_empty());

        let tail = s.chain_tail(5).expect("tail");
        assert_eq!(tail.len(), 2);
        assert_eq!(tail[0]["seq"], 1);
        assert_eq!(tail[0]["prev_hash"], GENESIS_PREV_HASH);
        assert_eq!(tail[1]["prev_hash"], tail[0]["hash"]);
        assert_eq!(tail[1]["hash"], ack.head_hash.as_str());
        assert_eq!(s.chain_tail(1).expect("tail")[0]["seq"], 2);

        // A commit without events: an empty seq range at the head.
        let ack2 = s
            .commit_blocking(Commit {
                budget_releases: vec!["r-c1".into(), "unknown".into()],
                ..Commit::default()
            })
            .expect("release");
        assert_eq!((ack2.first_seq, ack2.last_seq), (3, 2));
        assert_eq!(ack2.head_hash, ack.head_hash);
        assert!(s.budget_rows_since(0).expect("budget")[0].released);

        let mut out = Vec::new();
        assert_eq!(s.export_chain(&mut out).expect("export"), 2);
        assert!(verify_jsonl(&out[..]).ok);
    });
}

#[test]
fn approvals_upsert_keep_creation_order_and_survive_reopen() {
    both(|s| {
        s.commit_blocking(full_commit("a")).expect("a");
        s.commit_blocking(full_commit("b")).expect("b");
        // A later vote overwrites the record in place; the order stays by creation.
        s.commit_blocking(Commit {
            approvals: vec![tether_store::ApprovalRow {
                approval_id: "appr-a".into(),
                record: json!({"status": "approved", "votes": [{"by": "op"}]}),
            }],
            ..Commit::default()
        })
        .expect("vote");
        let rows = s.approvals().expect("approvals");
        let ids: Vec<&str> = rows.iter().map(|r| r.approval_id.as_str()).collect();
        assert_eq!(ids, ["appr-a", "appr-b"]);
        assert_eq!(rows[0].record["status"], "approved");
        assert_eq!(rows[1].record["status"], "pending");
    });
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let s = SqliteStore::open(dir.path()).expect("open");
        s.commit_blocking(full_commit("x")).expect("x");
    }
    let s = SqliteStore::open(dir.path()).expect("reopen");
    assert_eq!(s.approvals().expect("approvals")[0].approval_id, "appr-x");
}

#[test]
fn a_restart_reads_back_the_open_approvals_and_only_the_newest_closed_ones() {
    both(|s| {
        // Created in this order; the status is the stored one.
        let statuses = [
            ("appr-1", "used"),
            ("appr-2", "pending"),
            ("appr-3", "revoked"),
            ("appr-4", "denied"),
            ("appr-5", "expired"),
            ("appr-6", "approved"),
            ("appr-7", "used"),
            ("appr-8", "pending"),
        ];
        for (id, status) in statuses {
            s.commit_blocking(Commit {
                events: vec![event("approval.created", json!({"id": id}))],
                approvals: vec![tether_store::ApprovalRow {
                    approval_id: id.into(),
                    record: json!({"approval_id": id, "status": status}),
                }],
                ..Commit::default()
            })
            .expect("commit");
        }
        let ids = |open: usize, closed: usize| -> Vec<String> {
            s.approvals_to_restore(open, closed)
                .expect("restore")
                .into_iter()
                .map(|r| r.approval_id)
                .collect()
        };
        // Every open one (denied counts: a denial is final), the two newest
        // closed ones, in creation order.
        assert_eq!(
            ids(10, 2),
            ["appr-2", "appr-4", "appr-5", "appr-6", "appr-7", "appr-8"]
        );
        assert_eq!(ids(2, 0), ["appr-6", "appr-8"]);
        assert_eq!(ids(0, 10), ["appr-1", "appr-3", "appr-5", "appr-7"]);
        assert_eq!(ids(10, 10).len(), statuses.len());
        // The store still keeps every record, each found by its id.
        assert_eq!(s.approvals().expect("approvals").len(), statuses.len());
        let old = s.approval("appr-1").expect("read").expect("kept");
        assert_eq!(old.record["status"], "used");
        assert_eq!(old.approval_id, "appr-1");
        assert!(s.approval("appr-9").expect("read").is_none());
    });
}

#[test]
fn approvals_since_answers_what_was_written_after_a_position() {
    both(|s| {
        s.commit_blocking(full_commit("a")).expect("a");
        let (all, pos_a) = s.approvals_since(0).expect("since 0");
        assert_eq!(all.len(), 1);
        assert!(pos_a > 0);
        let (none, same) = s.approvals_since(pos_a).expect("nothing newer");
        assert!(none.is_empty());
        assert_eq!(same, pos_a);
        s.commit_blocking(full_commit("b")).expect("b");
        // A vote on `a` after `b` was created: both are newer than pos_a,
        // oldest write first.
        s.commit_blocking(Commit {
            events: vec![event("approval.vote", json!({"approval_id": "appr-a"}))],
            approvals: vec![tether_store::ApprovalRow {
                approval_id: "appr-a".into(),
                record: json!({"status": "approved"}),
            }],
            ..Commit::default()
        })
        .expect("vote");
        let (rows, pos) = s.approvals_since(pos_a).expect("since a");
        let ids: Vec<&str> = rows.iter().map(|r| r.approval_id.as_str()).collect();
        assert_eq!(ids, ["appr-b", "appr-a"]);
        assert_eq!(rows[1].record["status"], "approved");
        assert!(pos > pos_a);
        assert!(s.approvals_since(pos).expect("caught up").0.is_empty());
    });
}

#[test]
fn durability_flags() {
    assert!(!MemoryStore::new().durable());
    let dir = tempfile::tempdir().expect("tempdir");
    assert!(SqliteStore::open(dir.path()).expect("open").durable());
    let url = pg::migrated_database("durable");
    assert!(tether_store::PgStore::open(&url).expect("open").durable());
}

#[test]
fn the_change_token_moves_with_every_commit_even_without_events() {
    both(|s| {
        let t0 = s.change_token().expect("token");
        assert_eq!(s.change_token().expect("token"), t0, "nothing committed");
        s.commit_blocking(full_commit("a")).expect("a");
        let t1 = s.change_token().expect("token");
        assert_ne!(t1, t0);
        s.commit_blocking(Commit {
            latches: vec![LatchRow {
                device_id: "dev2".into(),
                latched: true,
                info: json!({"by": "stop"}),
            }],
            ..Commit::default()
        })
        .expect("latch only");
        assert_ne!(s.change_token().expect("token"), t1);
    });
}

#[test]
fn duplicate_receipt_is_a_conflict_and_stores_nothing() {
    both(|s| {
        let first = s.commit_blocking(full_commit("dup")).expect("first");
        let err = s.commit_blocking(full_commit("dup")).expect_err("second");
        assert!(matches!(err, StoreError::Conflict(_)), "{err}");
        assert!(!err.is_retryable());
        assert!(err.to_string().contains("dup"), "{err}");
        // Nothing of the failed commit: no events, same head.
        assert_eq!(
            s.chain_head().expect("head"),
            Some((first.last_seq, first.head_hash))
        );

        // Duplicates inside one commit, and duplicate budget reservations.
        let mut c = full_commit("twice");
        c.receipts.push(receipt_ref("twice", 1));
        assert!(matches!(s.commit_blocking(c), Err(StoreError::Conflict(_))));
        let mut c = full_commit("other");
        c.budget_draws = vec![budget("r-dup", 5)];
        assert!(matches!(s.commit_blocking(c), Err(StoreError::Conflict(_))));
        assert!(s.receipt("other").expect("read").is_none());
    });
}

#[test]
fn conflict_fails_only_its_commit_within_a_batch() {
    both(|s| {
        s.commit_blocking(full_commit("taken")).expect("seed");
        // Submit without waiting so the commits share batches.
        let (tx, rx) = mpsc::channel();
        for i in 0..200 {
            let id = if i % 10 == 5 {
                "taken".to_string()
            } else {
                format!("b{i}")
            };
            let tx = tx.clone();
            s.submit(
                full_commit(&id),
                Box::new(move |r| tx.send((i, r)).expect("send")),
            );
        }
        drop(tx);
        let mut results: Vec<(i32, Result<CommitAck, StoreError>)> = rx.iter().collect();
        assert_eq!(results.len(), 200);
        results.sort_by_key(|(i, _)| *i);
        let mut next = 3;
        for (i, r) in results {
            if i % 10 == 5 {
                assert!(matches!(r, Err(StoreError::Conflict(_))), "{i}: {r:?}");
            } else {
                let ack = r.expect("ok");
                assert_eq!(
                    (ack.first_seq, ack.last_seq),
                    (next, next + 1),
                    "commit {i}"
                );
                next += 2;
            }
        }
        let mut out = Vec::new();
        s.export_chain(&mut out).expect("export");
        let v = verify_jsonl(&out[..]);
        assert!(v.ok && v.entries == next - 1, "{v:?}");
    });
}

#[test]
fn invalid_commits_are_refused_up_front() {
    both(|s| {
        let bad = [
            Commit {
                events: vec![event("k", json!([1]))],
                ..Commit::default()
            },
            Commit {
                events: vec![event("", json!({}))],
                ..Commit::default()
            },
            Commit {
                budget_draws: vec![BudgetRow {
                    amount: f64::NAN,
                    ..budget("r", 1)
                }],
                ..Commit::default()
            },
            Commit {
                revisions: vec![RevisionRow {
                    device_id: "d".into(),
                    resource: "r".into(),
                    revision: u64::MAX,
                }],
                ..Commit::default()
            },
        ];
        for c in bad {
            let err = s.commit_blocking(c).expect_err("invalid");
            assert!(matches!(err, StoreError::Invalid(_)), "{err}");
        }
        let mut deep = json!({});
        for _ in 0..100 {
            deep = json!({ "d": deep });
        }
        let err = s.commit_blocking(Commit {
            events: vec![event("k", deep)],
            ..Commit::default()
        });
        assert!(matches!(err, Err(StoreError::Invalid(_))), "{err:?}");
        assert_eq!(s.chain_head().expect("head"), None);
    });
}

#[test]
fn receipt_digests_are_the_most_recent() {
    both(|s| {
        for i in 0..5 {
            s.commit_blocking(Commit {
                events: vec![receipt_event(&format!("r{i}"))],
                receipts: vec![receipt_ref(&format!("r{i}"), 0)],
                ..Commit::default()
            })
            .expect("commit");
        }
        let (d, complete) = s.receipt_digests(3).expect("digests");
        let ids: Vec<&str> = d.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["r2", "r3", "r4"]);
        assert!(!complete);
        assert_eq!(d[2].1, receipt("r4").input_digest);
        let (d, complete) = s.receipt_digests(5).expect("digests");
        assert_eq!(d.len(), 5);
        assert!(complete);
        let (d, complete) = s.receipt_digests(0).expect("digests");
        assert!(d.is_empty() && !complete);
    });
}

#[test]
fn upserts_and_ordering() {
    both(|s| {
        let c = Commit {
            revisions: vec![
                RevisionRow {
                    device_id: "b".into(),
                    resource: "x".into(),
                    revision: 1,
                },
                RevisionRow {
                    device_id: "a".into(),
                    resource: "y".into(),
                    revision: 1,
                },
                RevisionRow {
                    device_id: "a".into(),
                    resource: "x".into(),
                    revision: 1,
                },
            ],
            latches: vec![
                LatchRow {
                    device_id: "z".into(),
                    latched: true,
                    info: json!({}),
                },
                LatchRow {
                    device_id: "a".into(),
                    latched: true,
                    info: json!({"n": 1}),
                },
            ],
            budget_draws: vec![budget("late", 20), budget("early", 10), budget("mid", 15)],
            ..Commit::default()
        };
        s.commit_blocking(c).expect("commit");
        let c = Commit {
            revisions: vec![RevisionRow {
                device_id: "a".into(),
                resource: "x".into(),
                revision: 2,
            }],
            latches: vec![LatchRow {
                device_id: "a".into(),
                latched: false,
                info: json!({"n": 2}),
            }],
            ..Commit::default()
        };
        s.commit_blocking(c).expect("commit");
        let revs: Vec<(String, String, u64)> = s
            .revisions()
            .expect("revs")
            .into_iter()
            .map(|r| (r.device_id, r.resource, r.revision))
            .collect();
        assert_eq!(
            revs,
            [
                ("a".into(), "x".into(), 2),
                ("a".into(), "y".into(), 1),
                ("b".into(), "x".into(), 1)
            ]
        );
        let latches = s.latches().expect("latches");
        assert_eq!(
            latches[0],
            LatchRow {
                device_id: "a".into(),
                latched: false,
                info: json!({"n": 2})
            }
        );
        assert_eq!(latches[1].device_id, "z");
        let ids: Vec<String> = s
            .budget_rows_since(11)
            .expect("budget")
            .into_iter()
            .map(|b| b.reservation_id)
            .collect();
        assert_eq!(ids, ["mid", "late"]);
    });
}

/// `threads` × `per_thread` commits, each thread its own, made by
/// `commit(thread, i)`; every answer.
fn from_threads(
    threads: usize,
    per_thread: usize,
    commit: impl Fn(usize, usize) -> CommitAck + Sync,
) -> Vec<CommitAck> {
    std::thread::scope(|scope| {
        let commit = &commit;
        let handles: Vec<_> = (0..threads)
            .map(|t| scope.spawn(move || (0..per_thread).map(|i| commit(t, i)).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("thread"))
            .collect()
    })
}

#[test]
fn concurrent_submitters_get_contiguous_seqs() {
    both(|s| {
        const THREADS: usize = 16;
        const PER_THREAD: usize = 100;
        let acks = from_threads(THREADS, PER_THREAD, |t, i| {
            s.commit_blocking(full_commit(&format!("t{t}-{i}")))
                .expect("commit")
        });
        let mut ranges: Vec<(u64, u64)> = acks.iter().map(|a| (a.first_seq, a.last_seq)).collect();
        ranges.sort();
        let mut next = 1;
        for (first, last) in ranges {
            assert_eq!((first, last), (next, next + 1));
            next += 2;
        }
        let total = (THREADS * PER_THREAD * 2) as u64;
        assert_eq!(next - 1, total);
        let mut out = Vec::new();
        assert_eq!(s.export_chain(&mut out).expect("export"), total);
        let v = verify_jsonl(&out[..]);
        assert!(v.ok, "{:?}", v.first_broken);
        assert_eq!(
            s.receipt_digests(usize::MAX).expect("digests").0.len(),
            THREADS * PER_THREAD
        );
    });
}

#[test]
fn reopen_keeps_everything_and_continues_the_chain() {
    let dir = tempfile::tempdir().expect("tempdir");
    let head = {
        let s = SqliteStore::open(dir.path()).expect("open");
        s.commit_blocking(full_commit("a")).expect("a");
        let ack = s.commit_blocking(full_commit("b")).expect("b");
        s.commit_blocking(Commit {
            budget_releases: vec!["r-a".into()],
            ..Commit::default()
        })
        .expect("release");
        ack
    };
    assert!(dir.path().join("tether.db").is_file());

    let s = SqliteStore::open(dir.path()).expect("reopen");
    assert_eq!(
        s.chain_head().expect("head"),
        Some((4, head.head_hash.clone()))
    );
    assert_eq!(s.receipt("a").expect("read"), Some(receipt("a")));
    assert_eq!(s.receipt("b").expect("read"), Some(receipt("b")));
    assert_eq!(s.revisions().expect("revs").len(), 1);
    assert_eq!(s.latches().expect("latches")[0].info, json!({"by": "op"}));
    let budget_rows = s.budget_rows_since(0).expect("budget");
    assert_eq!(budget_rows.len(), 2);
    assert!(budget_rows
        .iter()
        .any(|b| b.reservation_id == "r-a" && b.released));
    assert!(budget_rows
        .iter()
        .any(|b| b.reservation_id == "r-b" && !b.released));

    // Idempotency survives the restart.
    assert!(matches!(
        s.commit_blocking(full_commit("a")),
        Err(StoreError::Conflict(_))
    ));

    let ack = s.commit_blocking(full_commit("c")).expect("c");
    assert_eq!((ack.first_seq, ack.last_seq), (5, 6));
    let tail = s.chain_tail(3).expect("tail");
    assert_eq!(tail[0]["hash"], head.head_hash.as_str());
    assert_eq!(tail[1]["prev_hash"], head.head_hash.as_str());
    drop(s);

    let report = verify_store(dir.path()).expect("verify");
    assert!(report.ok, "{:?}", report.first_broken);
    assert_eq!(report.entries, 6);
}

#[test]
fn tampered_head_refuses_to_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let s = SqliteStore::open(dir.path()).expect("open");
        s.commit_blocking(full_commit("a")).expect("a");
    }
    let db = rusqlite::Connection::open(dir.path().join("tether.db")).expect("db");
    db.execute(
        "UPDATE events SET line = replace(line, '\"a\"', '\"x\"') WHERE seq = 2",
        [],
    )
    .expect("tamper");
    drop(db);
    let err = SqliteStore::open(dir.path()).expect_err("corrupt");
    assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
    assert!(err.to_string().contains("hash mismatch"), "{err}");
}

#[test]
fn newer_schema_is_unsupported() {
    let dir = tempfile::tempdir().expect("tempdir");
    drop(SqliteStore::open(dir.path()).expect("open"));
    let db = rusqlite::Connection::open(dir.path().join("tether.db")).expect("db");
    db.execute(
        "INSERT INTO schema_version(version, applied_ms) VALUES (99, 0)",
        [],
    )
    .expect("bump");
    drop(db);
    let err = SqliteStore::open(dir.path()).expect_err("newer");
    assert!(matches!(err, StoreError::Unsupported(_)), "{err}");
}

#[test]
fn two_writers_on_one_file_keep_one_chain() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = SqliteStore::open(dir.path()).expect("a");
    let b = SqliteStore::open(dir.path()).expect("b");
    for i in 0..20 {
        let s: &dyn Store = if i % 2 == 0 { &a } else { &b };
        s.commit_blocking(full_commit(&format!("x{i}")))
            .expect("commit");
    }
    drop((a, b));
    let report = verify_store(dir.path()).expect("verify");
    assert!(report.ok, "{:?}", report.first_broken);
    assert_eq!(report.entries, 40);
}

#[test]
fn full_queue_is_overloaded_and_nothing_is_lost() {
    // The group-commit writer's queue (the default memory store applies
    // commits on the caller's thread and has none).
    let s = MemoryStore::with_writer();
    // Park the writer inside a callback so the queue can only fill.
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let (parked_tx, parked_rx) = mpsc::channel::<()>();
    s.submit(
        Commit::default(),
        Box::new(move |_| {
            parked_tx.send(()).expect("parked");
            let _ = release_rx.recv_timeout(Duration::from_secs(30));
        }),
    );
    parked_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("writer parked");
    let (tx, rx) = mpsc::channel();
    for _ in 0..QUEUE_CAPACITY {
        let tx = tx.clone();
        s.submit(
            Commit::default(),
            Box::new(move |r| tx.send(r.is_ok()).expect("send")),
        );
    }
    let err = s
        .commit_blocking(Commit::default())
        .expect_err("overloaded");
    assert_eq!(err, StoreError::Overloaded);
    assert!(err.is_retryable());
    release_tx.send(()).expect("release");
    drop(tx);
    let oks = rx.iter().filter(|ok| *ok).count();
    assert_eq!(oks, QUEUE_CAPACITY);
}

#[test]
fn a_panicking_callback_does_not_stop_the_writer() {
    both(|s| {
        s.submit(Commit::default(), Box::new(|_| panic!("callback bug")));
        s.commit_blocking(full_commit("after"))
            .expect("writer still running");
    });
}

#[test]
fn dropping_the_last_handle_from_a_callback_does_not_deadlock() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Arc::new(SqliteStore::open(dir.path()).expect("open"));
    let (tx, rx) = mpsc::channel();
    let held = Arc::clone(&s);
    s.submit(
        full_commit("last"),
        Box::new(move |r| {
            drop(held);
            tx.send(r.is_ok()).expect("send");
        }),
    );
    drop(s);
    assert!(rx
        .recv_timeout(Duration::from_secs(10))
        .expect("callback ran"));
    let s = SqliteStore::open(dir.path()).expect("reopen");
    assert!(s.receipt("last").expect("read").is_some());
}

#[test]
fn drop_drains_the_queue() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (tx, rx) = mpsc::channel();
    {
        let s = SqliteStore::open(dir.path()).expect("open");
        for i in 0..500 {
            let tx = tx.clone();
            s.submit(
                full_commit(&format!("d{i}")),
                Box::new(move |r| tx.send(r.is_ok()).expect("send")),
            );
        }
    }
    drop(tx);
    assert_eq!(rx.iter().filter(|ok| *ok).count(), 500);
    let s = SqliteStore::open(dir.path()).expect("reopen");
    assert_eq!(s.chain_head().expect("head").map(|h| h.0), Some(1000));
}

#[test]
fn invocations_are_upserted_and_survive_a_reopen() {
    let row = |status: &str| tether_store::InvocationRow {
        invocation_id: "inv_1".into(),
        info: json!({"command_id": "c1", "status": status}).into(),
    };
    both(|s| {
        assert_eq!(s.invocation("inv_1").expect("read"), None);
        s.commit_blocking(Commit {
            invocations: vec![row("pending")],
            ..Commit::default()
        })
        .expect("insert");
        s.commit_blocking(Commit {
            invocations: vec![row("completed")],
            ..Commit::default()
        })
        .expect("overwrite");
        assert_eq!(s.invocation("inv_1").expect("read"), Some(row("completed")));
    });
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let s = SqliteStore::open(dir.path()).expect("open");
        s.commit_blocking(Commit {
            invocations: vec![row("pending")],
            ..Commit::default()
        })
        .expect("insert");
    }
    let s = SqliteStore::open(dir.path()).expect("reopen");
    assert_eq!(s.invocation("inv_1").expect("read"), Some(row("pending")));
}

fn invocation_ref(id: &str, event: usize) -> tether_store::InvocationRef {
    tether_store::InvocationRef {
        invocation_id: id.into(),
        event,
    }
}

#[test]
fn an_invocation_indexed_at_its_entry_reads_back_as_that_entrys_body() {
    let record = json!({"invocation_id": "inv_7", "status": "pending", "command_id": "c7"});
    both(|s| {
        s.commit_blocking(Commit {
            events: vec![
                event("other", json!({"n": 1})),
                event("invocation.accepted", record.clone()),
            ],
            invocation_refs: vec![invocation_ref("inv_7", 1)],
            ..Commit::default()
        })
        .expect("indexed");
        let row = s.invocation("inv_7").expect("read").expect("stored");
        assert_eq!(row.info.into_value(), record);
        // A full row later (how it ended) replaces the index, and an index
        // later replaces a full row.
        let finished = json!({"invocation_id": "inv_7", "status": "rejected"});
        s.commit_blocking(Commit {
            invocations: vec![tether_store::InvocationRow {
                invocation_id: "inv_7".into(),
                info: finished.clone().into(),
            }],
            ..Commit::default()
        })
        .expect("row");
        let row = s.invocation("inv_7").expect("read").expect("stored");
        assert_eq!(row.info.into_value(), finished);
    });
}

#[test]
fn an_invocation_index_must_point_into_its_commit_at_an_entry_naming_it() {
    both(|s| {
        // Out of range: refused whole, nothing stored.
        let out_of_range = Commit {
            events: vec![event(
                "invocation.accepted",
                json!({"invocation_id": "inv_8"}),
            )],
            invocation_refs: vec![invocation_ref("inv_8", 1)],
            ..Commit::default()
        };
        assert!(matches!(
            s.commit_blocking(out_of_range),
            Err(StoreError::Invalid(_))
        ));
        assert_eq!(s.chain_head().expect("head"), None);
        assert_eq!(s.invocation("inv_8").expect("read"), None);
        // An entry that does not hold the record is never read as it.
        s.commit_blocking(Commit {
            events: vec![event("other", json!({"invocation_id": "inv_other"}))],
            invocation_refs: vec![invocation_ref("inv_9", 0)],
            ..Commit::default()
        })
        .expect("stored");
        assert!(matches!(s.invocation("inv_9"), Err(StoreError::Corrupt(_))));
    });
}

#[test]
fn version_4_invocation_rows_survive_the_move_to_indexed_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let row = tether_store::InvocationRow {
        invocation_id: "inv_old".into(),
        info: json!({"invocation_id": "inv_old", "status": "completed"}).into(),
    };
    {
        let s = SqliteStore::open(dir.path()).expect("open");
        s.commit_blocking(Commit {
            invocations: vec![row.clone()],
            ..Commit::default()
        })
        .expect("row");
    }
    let db = rusqlite::Connection::open(dir.path().join("tether.db")).expect("db");
    downgrade_invocations_to_v4(&db);
    drop(db);
    let s = SqliteStore::open(dir.path()).expect("migrated");
    assert_eq!(s.invocation("inv_old").expect("read"), Some(row));
    // The migrated table takes indexed records.
    s.commit_blocking(Commit {
        events: vec![event(
            "invocation.accepted",
            json!({"invocation_id": "inv_new"}),
        )],
        invocation_refs: vec![invocation_ref("inv_new", 0)],
        ..Commit::default()
    })
    .expect("indexed");
    assert!(s.invocation("inv_new").expect("read").is_some());
}

#[test]
fn version_5_approvals_are_found_by_position_after_the_migration() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let s = SqliteStore::open(dir.path()).expect("open");
        s.commit_blocking(full_commit("old")).expect("old");
    }
    let db = rusqlite::Connection::open(dir.path().join("tether.db")).expect("db");
    downgrade_approvals_to_v5(&db);
    drop(db);
    let s = SqliteStore::open(dir.path()).expect("migrated");
    let (rows, pos) = s.approvals_since(0).expect("since 0");
    assert_eq!(
        rows.len(),
        1,
        "the old approval is at its creation position"
    );
    assert_eq!(rows[0].approval_id, "appr-old");
    assert!(pos > 0);
}

/// The version 9 layout: no journal beside the database.
fn downgrade_to_v9(db: &rusqlite::Connection) {
    db.execute_batch(
        "DELETE FROM meta WHERE key = 'journal';
         DELETE FROM schema_version WHERE version = 10;",
    )
    .expect("v9 layout");
}

/// The version 8 layout: no `archives` table, no kept receipt documents.
fn downgrade_to_v8(db: &rusqlite::Connection) {
    downgrade_to_v9(db);
    db.execute_batch(
        "DROP TABLE archives;
         ALTER TABLE receipts DROP COLUMN receipt;
         DELETE FROM schema_version WHERE version = 9;",
    )
    .expect("v8 layout");
}

/// The version 7 layout: no `leases` table.
fn downgrade_to_v7(db: &rusqlite::Connection) {
    downgrade_to_v8(db);
    db.execute_batch(
        "DROP TABLE leases;
         DELETE FROM schema_version WHERE version = 8;",
    )
    .expect("v7 layout");
}

/// The version 6 layout: no `(key, ts_ms)` index on the budget journal.
fn downgrade_to_v6(db: &rusqlite::Connection) {
    downgrade_to_v7(db);
    db.execute_batch(
        "DROP INDEX budget_key_ts;
         DELETE FROM schema_version WHERE version = 7;",
    )
    .expect("v6 layout");
}

/// The version 5 `approvals` table (no `updated_seq`), rows kept.
fn downgrade_approvals_to_v5(db: &rusqlite::Connection) {
    downgrade_to_v6(db);
    db.execute_batch(
        "DROP INDEX approvals_updated;
         ALTER TABLE approvals DROP COLUMN updated_seq;
         DELETE FROM schema_version WHERE version = 6;",
    )
    .expect("v5 layout");
}

/// The version 4 `invocations` table (a full row per invocation), rows kept.
fn downgrade_invocations_to_v4(db: &rusqlite::Connection) {
    downgrade_approvals_to_v5(db);
    db.execute_batch(
        "CREATE TABLE invocations_v4(invocation_id TEXT PRIMARY KEY, info TEXT NOT NULL) WITHOUT ROWID;
         INSERT INTO invocations_v4 SELECT invocation_id, info FROM invocations WHERE info IS NOT NULL;
         DROP TABLE invocations;
         ALTER TABLE invocations_v4 RENAME TO invocations;
         DELETE FROM schema_version WHERE version = 5;",
    )
    .expect("v4 layout");
}

#[test]
fn a_receipt_must_point_at_an_event_that_holds_it() {
    both(|s| {
        // Out of range, an event without a `receipt`, and another command's receipt.
        let mut c = full_commit("r1");
        c.receipts = vec![receipt_ref("r1", 2)];
        let err = s.commit_blocking(c).expect_err("out of range");
        assert!(matches!(err, StoreError::Invalid(_)), "{err}");
        let mut c = full_commit("r1");
        c.receipts = vec![receipt_ref("r1", 0)];
        let err = s.commit_blocking(c).expect_err("no receipt member");
        assert!(err.to_string().contains("does not hold"), "{err}");
        let mut c = full_commit("r1");
        c.receipts = vec![receipt_ref("someone-else", 1)];
        assert!(matches!(s.commit_blocking(c), Err(StoreError::Invalid(_))));
        // Two receipts in one event.
        let mut c = full_commit("r1");
        c.events.push(receipt_event("r2"));
        c.receipts = vec![receipt_ref("r1", 1), receipt_ref("r2", 1)];
        assert!(matches!(s.commit_blocking(c), Err(StoreError::Invalid(_))));
        // Nothing of any of them was stored.
        assert_eq!(s.chain_head().expect("head"), None);
        assert_eq!(s.receipt("r1").expect("read"), None);
    });
}

/// Turns a current database back into the version 3 layout, where every
/// receipt row also carried its own copy of the receipt.
fn downgrade_to_v3(path: &std::path::Path, receipt_text: impl Fn(&str) -> String) {
    let db = rusqlite::Connection::open(path.join("tether.db")).expect("db");
    downgrade_invocations_to_v4(&db);
    let rows: Vec<(i64, String, String)> = {
        let mut st = db
            .prepare("SELECT seq, command_id, input_digest FROM receipts")
            .expect("select");
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .expect("rows")
            .collect::<Result<_, _>>()
            .expect("rows")
    };
    db.execute_batch(
        "DROP TABLE receipts;
         CREATE TABLE receipts(command_id TEXT PRIMARY KEY, input_digest TEXT NOT NULL,
                               receipt TEXT NOT NULL, seq INTEGER NOT NULL);
         DELETE FROM schema_version WHERE version = 4;",
    )
    .expect("v3 layout");
    for (seq, id, digest) in rows {
        db.execute(
            "INSERT INTO receipts(command_id, input_digest, receipt, seq) VALUES (?1, ?2, ?3, ?4)",
            rusqlite::params![id, digest, receipt_text(&id), seq],
        )
        .expect("v3 row");
    }
}

fn canonical_receipt(id: &str) -> String {
    tether_store::canonical::to_canonical_string(&receipt(id).receipt)
}

#[test]
fn version_3_receipts_migrate_to_their_chain_entries() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let s = SqliteStore::open(dir.path()).expect("open");
        s.commit_blocking(full_commit("a")).expect("a");
        s.commit_blocking(full_commit("b")).expect("b");
    }
    downgrade_to_v3(dir.path(), canonical_receipt);
    let s = SqliteStore::open(dir.path()).expect("migrated");
    assert_eq!(s.receipt("a").expect("read"), Some(receipt("a")));
    assert_eq!(s.receipt("b").expect("read"), Some(receipt("b")));
    let (ids, complete) = s.receipt_digests(10).expect("digests");
    assert!(complete);
    assert_eq!(ids.len(), 2);
    assert_eq!(ids[1].0, "b", "newest last");
    // The migrated store takes new receipts and still refuses a reused id.
    s.commit_blocking(full_commit("c")).expect("c");
    assert!(matches!(
        s.commit_blocking(full_commit("a")),
        Err(StoreError::Conflict(_))
    ));
}

#[test]
fn a_version_3_receipt_unlike_its_entry_refuses_the_migration() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let s = SqliteStore::open(dir.path()).expect("open");
        s.commit_blocking(full_commit("a")).expect("a");
    }
    downgrade_to_v3(dir.path(), |_| {
        r#"{"command_id":"a","status":"failed"}"#.into()
    });
    let err = SqliteStore::open(dir.path()).expect_err("refused");
    assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
    assert!(err.to_string().contains("schema 4"), "{err}");
    // Nothing changed: the version 3 table and its copy are still there.
    let db = rusqlite::Connection::open(dir.path().join("tether.db")).expect("db");
    let kept: String = db
        .query_row(
            "SELECT receipt FROM receipts WHERE command_id = 'a'",
            [],
            |r| r.get(0),
        )
        .expect("v3 row kept");
    assert!(kept.contains("failed"));
}

#[test]
fn a_version_6_store_gains_the_budget_key_index_and_keeps_its_draws() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let s = SqliteStore::open(dir.path()).expect("open");
        s.commit_blocking(Commit {
            budget_draws: vec![budget("r-old", 5)],
            ..Commit::default()
        })
        .expect("draw");
    }
    let db = rusqlite::Connection::open(dir.path().join("tether.db")).expect("db");
    downgrade_to_v6(&db);
    drop(db);
    let s = SqliteStore::open(dir.path()).expect("migrated");
    assert_eq!(
        s.budget_rows_since(0).expect("rows"),
        vec![budget("r-old", 5)]
    );
    assert_eq!(s.budget_used("dev1/energy", None).expect("used"), 2.5);
    drop(s);
    let db = rusqlite::Connection::open(dir.path().join("tether.db")).expect("db");
    let index: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = 'budget_key_ts'",
            [],
            |r| r.get(0),
        )
        .expect("index");
    assert_eq!(index, 1);
}

/// [`Store::submit_waiting`] and wait for its answer.
fn commit_waiting(s: &dyn Store, c: Commit) -> Result<CommitAck, StoreError> {
    let (tx, rx) = mpsc::sync_channel(1);
    s.submit_waiting(c, Box::new(move |r| tx.send(r).expect("answer")));
    rx.recv_timeout(Duration::from_secs(30)).expect("answered")
}

#[test]
fn waiting_commits_on_callers_threads_and_queued_ones_keep_one_contiguous_chain() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = SqliteStore::open(dir.path()).expect("open");
    const THREADS: usize = 12;
    const PER_THREAD: usize = 60;
    let acks = from_threads(THREADS, PER_THREAD, |t, i| {
        let c = full_commit(&format!("w{t}-{i}"));
        // Half the threads wait on their own thread when they can, half
        // always go through the queue.
        if t % 2 == 0 {
            commit_waiting(&s, c).expect("commit")
        } else {
            s.commit_blocking(c).expect("commit")
        }
    });
    let mut ranges: Vec<(u64, u64)> = acks.iter().map(|a| (a.first_seq, a.last_seq)).collect();
    // Under a stampede the writer may never be idle when a waiting caller
    // arrives (a busy two-core machine gave 720 queued, none inline). A lone
    // caller that pauses between its commits finds it idle: the first of
    // these that was applied on its own thread ends the loop, which is
    // bounded.
    let mut lone = 0;
    while s.stats().inline_batches == 0 {
        assert!(
            lone < 200,
            "no lone waiting commit was applied inline: {:?}",
            s.stats()
        );
        std::thread::sleep(Duration::from_millis(5));
        let ack = commit_waiting(&s, full_commit(&format!("lone-{lone}"))).expect("commit");
        ranges.push((ack.first_seq, ack.last_seq));
        lone += 1;
    }
    ranges.sort_unstable();
    for (n, (first, last)) in ranges.into_iter().enumerate() {
        let first_expected = 2 * n as u64 + 1;
        assert_eq!((first, last), (first_expected, first_expected + 1));
    }
    let stats = s.stats();
    assert!(stats.inline_batches > 0, "{stats:?}");
    assert!(stats.inline_batches < stats.batches, "{stats:?}");
    assert_eq!(
        s.receipt_digests(usize::MAX).expect("digests").0.len(),
        THREADS * PER_THREAD + lone
    );
    // A duplicate on the caller's thread is refused like a queued one.
    let again = commit_waiting(&s, full_commit("w0-0"));
    assert!(matches!(again, Err(StoreError::Conflict(_))), "{again:?}");
    drop(s);
    let report = verify_store(dir.path()).expect("verify");
    assert!(report.ok, "{:?}", report.first_broken);
    assert_eq!(report.entries, ((THREADS * PER_THREAD + lone) * 2) as u64);
    let reopened = SqliteStore::open(dir.path()).expect("reopen");
    assert!(reopened.receipt("w4-59").expect("read").is_some());
}

/// A lone caller leaves the writer idle between its commits; the
/// checkpointer's passes then copy the whole WAL back, and the WAL starts
/// again from its beginning instead of growing with every commit (whose
/// flush would then carry the file's size too).
#[test]
fn a_lone_caller_s_wal_starts_again_instead_of_growing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = SqliteStore::open(dir.path()).expect("open");
    let wal = s.path().with_extension("db-wal");
    let mut largest = 0;
    for i in 0..400 {
        commit_waiting(&s, full_commit(&format!("lone-{i}"))).expect("commit");
        std::thread::sleep(Duration::from_millis(1));
        largest = largest.max(std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0));
    }
    // Each commit appends about seven 4 KiB frames: 400 commits that never
    // restart the WAL leave it over 10 MB. Restarted every checkpoint pass
    // (40 ms, a few dozen commits here) it stays near one pass's frames.
    assert!(
        largest < 4 * 1024 * 1024,
        "the WAL grew to {largest} bytes over 400 commits"
    );
    drop(s);
    let report = verify_store(dir.path()).expect("verify");
    assert!(report.ok, "{:?}", report.first_broken);
    assert_eq!(report.entries, 800);
}
