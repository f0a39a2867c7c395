//! The PostgreSQL store against a real server (a throwaway cluster the test
//! starts, see `common/pg.rs`): what the shared conformance suite in
//! `store.rs` cannot say through one handle — several endpoints on one
//! database keeping one chain, the schema version, integrity refusals,
//! password handling, and the rows as PostgreSQL holds them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/pg.rs"]
mod pg;

use serde_json::json;
use std::sync::Arc;
use tether_store::postgres::verify_url;
use tether_store::verify::verify_jsonl;
use tether_store::{
    Commit, EventDraft, LatchRow, PgStore, ReceiptRef, Store, StoreError, PG_SCHEMA_VERSION,
};

fn command(id: &str) -> Commit {
    let receipt = json!({"command_id": id, "status": "completed"});
    Commit {
        events: vec![
            EventDraft {
                kind: "command.started".into(),
                body: json!({"command_id": id}).into(),
            },
            EventDraft {
                kind: "command.finished".into(),
                body: json!({"command_id": id, "receipt": receipt}).into(),
            },
        ],
        receipts: vec![ReceiptRef {
            command_id: id.into(),
            input_digest: tether_store::canonical::digest(&json!({"id": id})),
            event: 1,
        }],
        ..Commit::default()
    }
}

#[test]
fn two_endpoints_committing_at_once_keep_one_verifiable_chain() {
    let url = pg::migrated_database("two_endpoints");
    // Two stores on one database, as two endpoint processes would open it.
    let a = Arc::new(PgStore::open(&url).expect("a"));
    let b = Arc::new(PgStore::open(&url).expect("b"));
    const PER_THREAD: usize = 150;
    std::thread::scope(|scope| {
        for (name, s) in [("a", &a), ("b", &b), ("a2", &a), ("b2", &b)] {
            scope.spawn(move || {
                for i in 0..PER_THREAD {
                    s.commit_blocking(command(&format!("{name}-{i}")))
                        .expect("commit");
                }
            });
        }
    });
    let total = (4 * PER_THREAD * 2) as u64;
    // Each sees the other's commits: one chain, one head.
    assert_eq!(a.chain_head().expect("head"), b.chain_head().expect("head"));
    assert_eq!(a.chain_head().expect("head").expect("some").0, total);
    // A command id run through one endpoint is a conflict through the other.
    let err = b.commit_blocking(command("a-7")).expect_err("already run");
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    assert_eq!(
        b.receipt("a-7").expect("read").expect("there").command_id,
        "a-7"
    );
    let mut out = Vec::new();
    assert_eq!(a.export_chain(&mut out).expect("export"), total);
    let v = verify_jsonl(&out[..]);
    assert!(v.ok, "{:?}", v.first_broken);
    let v = verify_url(&url).expect("verify");
    assert!(v.ok && v.entries == total, "{v:?}");
    // The rows, as PostgreSQL holds them.
    let n = pg::psql_on(&url, "SELECT count(*) FROM receipts");
    assert_eq!(n, (4 * PER_THREAD).to_string());
    let head = pg::psql_on(&url, "SELECT seq FROM chain_head");
    assert_eq!(head, total.to_string());
}

#[test]
fn a_commit_on_one_endpoint_moves_the_others_change_token_and_latches() {
    let url = pg::migrated_database("change_token");
    let a = PgStore::open(&url).expect("a");
    let b = PgStore::open(&url).expect("b");
    let before = b.change_token().expect("token");
    a.commit_blocking(Commit {
        latches: vec![LatchRow {
            device_id: "arm".into(),
            latched: true,
            info: json!({"by": "operator"}),
        }],
        ..Commit::default()
    })
    .expect("latch");
    assert_ne!(b.change_token().expect("token"), before);
    assert!(b.latches().expect("latches")[0].latched);
}

#[test]
fn reopening_continues_the_chain_and_keeps_idempotency() {
    let url = pg::migrated_database("reopen");
    let head = {
        let s = PgStore::open(&url).expect("open");
        s.commit_blocking(command("x")).expect("x")
    };
    let s = PgStore::open(&url).expect("reopen");
    assert_eq!(
        s.chain_head().expect("head"),
        Some((2, head.head_hash.clone()))
    );
    assert!(matches!(
        s.commit_blocking(command("x")),
        Err(StoreError::Conflict(_))
    ));
    let ack = s.commit_blocking(command("y")).expect("y");
    assert_eq!((ack.first_seq, ack.last_seq), (3, 4));
    let v = verify_url(&url).expect("verify");
    assert!(v.ok && v.entries == 4, "{v:?}");
}

#[test]
fn migrate_creates_then_is_a_no_op_and_an_unknown_version_refuses_naming_both() {
    let url = pg::fresh_database("versions");
    let err = PgStore::open(&url).expect_err("no schema yet");
    assert!(matches!(err, StoreError::Unsupported(_)), "{err}");
    assert!(err.to_string().contains("tether store migrate"), "{err}");
    assert_eq!(
        PgStore::migrate(&url).expect("create"),
        (0, PG_SCHEMA_VERSION)
    );
    assert_eq!(
        PgStore::migrate(&url).expect("again"),
        (PG_SCHEMA_VERSION, PG_SCHEMA_VERSION)
    );
    drop(PgStore::open(&url).expect("open"));
    pg::psql_on(
        &url,
        "INSERT INTO schema_version(version, applied_ms) VALUES (99, 0)",
    );
    let err = PgStore::open(&url).expect_err("newer");
    let text = err.to_string();
    assert!(matches!(err, StoreError::Unsupported(_)), "{err}");
    assert!(
        text.contains("99") && text.contains(&format!("version {PG_SCHEMA_VERSION}")),
        "{text}"
    );
    assert!(
        PgStore::migrate(&url).is_err(),
        "a newer schema is never downgraded"
    );
}

#[test]
fn a_cut_or_tampered_chain_refuses_to_open_and_fails_verify() {
    let url = pg::migrated_database("cut");
    {
        let s = PgStore::open(&url).expect("open");
        for i in 0..3 {
            s.commit_blocking(command(&format!("c{i}")))
                .expect("commit");
        }
    }
    pg::psql_on(
        &url,
        "DELETE FROM receipts WHERE seq = 6; DELETE FROM events WHERE seq = 6",
    );
    let err = PgStore::open(&url).expect_err("cut tail");
    assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
    assert!(err.to_string().contains("removed from the end"), "{err}");
    let v = verify_url(&url).expect("verify runs");
    assert!(!v.ok, "{v:?}");
    assert!(v
        .first_broken
        .expect("broken")
        .reason
        .contains("removed from the end"),);

    let url = pg::migrated_database("tamper");
    {
        let s = PgStore::open(&url).expect("open");
        s.commit_blocking(command("t")).expect("commit");
        s.commit_blocking(command("u")).expect("commit");
    }
    pg::psql_on(
        &url,
        "UPDATE events SET line = replace(line, '\"t\"', '\"z\"') WHERE seq = 1",
    );
    let v = verify_url(&url).expect("verify runs");
    let b = v.first_broken.expect("broken");
    assert_eq!((b.seq, b.reason.as_str()), (Some(1), "hash mismatch"));
}

#[test]
fn a_password_in_the_url_is_refused_and_a_dead_server_fails_closed() {
    let err = PgStore::open("postgres://tether:secret@127.0.0.1:1/x").expect_err("password");
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
    assert!(err.to_string().contains("PGPASSWORD"), "{err}");
    // Nothing listens on port 1: a clear, retryable refusal, not a hang.
    let err = PgStore::open("postgres://tether@127.0.0.1:1/x").expect_err("no server");
    assert!(err.is_retryable(), "{err}");
}

#[test]
fn a_lost_connection_fails_the_batch_closed_and_the_store_recovers() {
    let url = pg::migrated_database("lost_link");
    let s = PgStore::open(&url).expect("open");
    s.commit_blocking(command("before")).expect("before");
    // Kill every session of this database but psql's own (the store's
    // writer and reader): what a restarted server or a cut link does.
    let db = url.rsplit('/').next().expect("db name").to_owned();
    pg::psql_on(
        &url,
        &format!(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE datname = '{db}' AND pid <> pg_backend_pid()"
        ),
    );
    // The next call may fail (the link is found dead) or succeed after a
    // reconnect; it must never report a success that did not happen.
    let mut stored = false;
    for attempt in 0..3 {
        match s.commit_blocking(command("after")) {
            Ok(_) => {
                stored = true;
                break;
            }
            Err(e) => assert!(
                e.is_retryable() || matches!(e, StoreError::Conflict(_)),
                "{attempt}: {e}"
            ),
        }
    }
    assert!(stored, "the store reconnects");
    assert!(s.receipt("after").expect("read").is_some());
    let v = verify_url(&url).expect("verify");
    assert!(v.ok && v.entries == 4, "{v:?}");
}

/// A fleet budget: two endpoints (two stores on one database) drawing at
/// once from many threads. Exactly as many draws as fit are stored, never
/// more; every other one is refused with the budget's figures, and the
/// database's rows sum to at most the cap.
#[test]
fn two_endpoints_drawing_from_one_capped_budget_never_exceed_it() {
    use tether_store::{BudgetCap, BudgetRow};
    let url = pg::migrated_database("fleet_budget");
    let a = Arc::new(PgStore::open(&url).expect("a"));
    let b = Arc::new(PgStore::open(&url).expect("b"));
    const KEY: &str = "pump-1/cap.fluid.dispense.v1/volume_ml/rolling_1h";
    let cap = BudgetCap {
        limit: 150.0,
        window_ms: Some(3_600_000),
    };
    let t0 = 10 * 3_600_000;
    let results: Vec<Result<tether_store::CommitAck, StoreError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let s = if t % 2 == 0 { &a } else { &b };
                scope.spawn(move || {
                    (0..25)
                        .map(|i| {
                            let id = format!("d{t}-{i}");
                            s.commit_blocking(Commit {
                                events: vec![EventDraft {
                                    kind: "command.admitted".into(),
                                    body: json!({"command_id": id}).into(),
                                }],
                                budget_draws: vec![BudgetRow {
                                    key: KEY.into(),
                                    reservation_id: format!("{id}#0"),
                                    amount: 3.0,
                                    ts_ms: t0 + (t * 25 + i) as u64,
                                    released: false,
                                    cap: Some(cap),
                                }],
                                ..Commit::default()
                            })
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("thread"))
            .collect()
    });
    let stored = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(stored, 50, "150 / 3 draws fit");
    for r in &results {
        match r {
            Ok(_) => {}
            Err(StoreError::BudgetExceeded(x)) => {
                assert_eq!((x.limit, x.amount), (150.0, 3.0));
                assert!(x.used + x.amount > x.limit, "{x:?}");
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }
    let sum = pg::psql_on(&url, "SELECT sum(amount) FROM budget");
    assert_eq!(sum.parse::<f64>().expect("sum"), 150.0);
    let v = verify_url(&url).expect("verify");
    assert!(v.ok && v.entries == 50, "{v:?}");
}

/// Everything a SQLite store holds: receipts, revisions, latches, budget
/// draws (one released), open operations, approvals (one updated later),
/// invocations (a copied record and one indexed at its entry).
fn fill_sqlite(s: &tether_store::SqliteStore) {
    use tether_store::{ApprovalRow, BudgetRow, InvocationRef, InvocationRow, OpenOp, RevisionRow};
    for i in 0..5 {
        s.commit_blocking(command(&format!("copy-{i}")))
            .expect("command");
    }
    let draw = |id: &str, ts_ms: u64| BudgetRow {
        key: "dev1/energy".into(),
        reservation_id: id.into(),
        amount: 1.25,
        ts_ms,
        released: false,
        cap: None,
    };
    let approval = |status: &str| ApprovalRow {
        approval_id: "appr-1".into(),
        record: json!({"status": status}),
    };
    s.commit_blocking(Commit {
        events: vec![
            EventDraft {
                kind: "misc".into(),
                body: json!({"n": 1}).into(),
            },
            EventDraft {
                kind: "invocation.accepted".into(),
                body: json!({"invocation_id": "inv_ref", "status": "accepted"}).into(),
            },
        ],
        revisions: vec![RevisionRow {
            device_id: "dev1".into(),
            resource: "state".into(),
            revision: 9,
        }],
        latches: vec![LatchRow {
            device_id: "dev1".into(),
            latched: true,
            info: json!({"by": "op", "reason": "copy test"}),
        }],
        budget_draws: vec![draw("r-1", 1_000), draw("r-2", 2_000), draw("r-0", 500)],
        budget_releases: vec!["r-2".into()],
        open_ops: vec![OpenOp {
            command_id: "running-1".into(),
            info: json!({"device_id": "dev1"}),
        }],
        approvals: vec![
            approval("pending"),
            ApprovalRow {
                approval_id: "appr-2".into(),
                record: json!({"status": "denied"}),
            },
        ],
        invocations: vec![InvocationRow {
            invocation_id: "inv_row".into(),
            info: json!({"status": "done"}).into(),
        }],
        invocation_refs: vec![InvocationRef {
            invocation_id: "inv_ref".into(),
            event: 1,
        }],
        ..Commit::default()
    })
    .expect("state");
    s.commit_blocking(Commit {
        events: vec![EventDraft {
            kind: "approval.vote".into(),
            body: json!({"approval_id": "appr-1"}).into(),
        }],
        approvals: vec![approval("approved")],
        ..Commit::default()
    })
    .expect("update");
}

#[test]
fn a_sqlite_store_copied_in_reads_back_alike_and_a_second_copy_is_refused() {
    use tether_store::SqliteStore;
    let dir = tempfile::tempdir().expect("tempdir");
    let sqlite = SqliteStore::open(dir.path()).expect("sqlite");
    fill_sqlite(&sqlite);
    drop(sqlite);
    let url = pg::migrated_database("copy_lib");
    let report = tether_store::postgres::copy_sqlite_to_url(dir.path(), &url).expect("copy");
    assert_eq!(
        (
            report.receipts,
            report.revisions,
            report.latches,
            report.budget_rows
        ),
        (5, 1, 1, 3)
    );
    assert_eq!(
        (report.open_ops, report.approvals, report.invocations),
        (1, 2, 2)
    );

    let sqlite = SqliteStore::open(dir.path()).expect("sqlite again");
    let pg_store = PgStore::open(&url).expect("open the copy");
    let (a, b): (&dyn Store, &dyn Store) = (&sqlite, &pg_store);
    assert_eq!(a.chain_head().unwrap(), b.chain_head().unwrap());
    assert_eq!(Some(report.head_seq), b.chain_head().unwrap().map(|h| h.0));
    assert_eq!(a.revisions().unwrap(), b.revisions().unwrap());
    assert_eq!(a.latches().unwrap(), b.latches().unwrap());
    assert_eq!(a.open_ops().unwrap(), b.open_ops().unwrap());
    assert_eq!(a.approvals().unwrap(), b.approvals().unwrap());
    assert_eq!(a.approvals_since(0).unwrap(), b.approvals_since(0).unwrap());
    assert_eq!(
        a.budget_rows_since(0).unwrap(),
        b.budget_rows_since(0).unwrap()
    );
    for id in ["inv_row", "inv_ref"] {
        assert_eq!(a.invocation(id).unwrap(), b.invocation(id).unwrap(), "{id}");
    }
    for i in 0..5 {
        let id = format!("copy-{i}");
        assert_eq!(a.receipt(&id).unwrap(), b.receipt(&id).unwrap(), "{id}");
    }
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    a.export_chain(&mut ea).unwrap();
    b.export_chain(&mut eb).unwrap();
    // Every entry byte for byte; the seal line after them carries the
    // export's own time.
    let entries = |v: &[u8]| {
        let text = String::from_utf8(v.to_vec()).expect("utf-8");
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        lines.pop();
        lines
    };
    assert!(entries(&ea) == entries(&eb), "the entries differ");
    // The copy takes new commits on the copied chain.
    pg_store
        .commit_blocking(command("after"))
        .expect("commit on the copy");
    assert!(verify_url(&url).unwrap().ok);
    drop(pg_store);

    let again = tether_store::postgres::copy_sqlite_to_url(dir.path(), &url);
    assert!(
        matches!(&again, Err(StoreError::Conflict(m)) if m.contains("never merges")),
        "{again:?}"
    );
}

/// The batch's statements find rows by their keys however small the tables
/// were when the statements were prepared. A generic plan that scans a whole
/// table (the cheapest while it held a page), kept for the connection's
/// life, made every later batch read every receipt: ~30 ms a batch after
/// 100,000 commands (docs/PERFORMANCE.md). The store's sessions run with
/// `enable_seqscan=off`.
#[test]
fn a_batch_never_scans_the_whole_receipts_table() {
    let url = pg::migrated_database("no_seq_scan");
    let s = PgStore::open(&url).expect("open");
    // Prepared and planned (five custom plans, then the generic one) while
    // the tables hold a page or two, each batch naming dozens of ids: a
    // whole-table scan is then the cheapest plan.
    for round in 0..8 {
        let (tx, rx) = std::sync::mpsc::channel();
        for i in 0..64 {
            let tx = tx.clone();
            s.submit(
                command(&format!("early-{round}-{i}")),
                Box::new(move |r| tx.send(r).expect("answer")),
            );
        }
        drop(tx);
        for r in rx {
            r.expect("commit");
        }
    }
    let scans = || {
        // The server publishes a backend's counts at most once a second.
        std::thread::sleep(std::time::Duration::from_millis(1_500));
        pg::psql_on(
            &url,
            "SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'receipts'",
        )
    };
    let before = scans();
    for i in 0..400 {
        s.commit_blocking(command(&format!("later-{i}")))
            .expect("commit");
    }
    let after = scans();
    assert_eq!(before, after, "the batches scanned the receipts table");
}
