//! Leases (who holds a name on a shared store, and until when), the same on
//! every backend: two handles on one store stand for two endpoint processes.
//! A hold by one refuses another's until it lapses, is given up or is taken
//! over from a holder known dead; a refused commit stores nothing; a commit
//! of leases alone adds nothing to the chain. On PostgreSQL, also the
//! `LISTEN` wake-up of the governed-stop watcher.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/pg.rs"]
mod pg;

use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tether_store::lease::{device_key, endpoint_key};
use tether_store::{
    Commit, EventDraft, LatchRow, LeaseDraft, LeaseOp, MemoryStore, PgStore, SqliteStore, Store,
    StoreError,
};

fn hold(key: &str, holder: &str, lease_ms: u64, replaces: Option<&str>) -> LeaseDraft {
    LeaseDraft {
        key: key.into(),
        holder: holder.into(),
        op: LeaseOp::Hold {
            lease_ms,
            info: json!({"endpoint_id": holder, "host": "test", "pid": 1}),
            replaces: replaces.map(str::to_owned),
        },
    }
}

fn release(key: &str, holder: &str) -> LeaseDraft {
    LeaseDraft {
        key: key.into(),
        holder: holder.into(),
        op: LeaseOp::Release,
    }
}

fn leases(v: Vec<LeaseDraft>) -> Commit {
    Commit {
        leases: v,
        ..Commit::default()
    }
}

fn holder_of(s: &dyn Store, key: &str) -> Option<String> {
    s.leases()
        .expect("leases")
        .get(key)
        .map(|r| r.holder.clone())
}

/// The contract, with `a` and `b` two handles on one store.
fn contract(a: &dyn Store, b: &dyn Store) {
    let arm = device_key("arm-1");
    let head = a.chain_head().expect("head");
    a.commit_blocking(leases(vec![
        hold(&endpoint_key("A"), "A", 60_000, None),
        hold(&arm, "A", 60_000, None),
    ]))
    .expect("A takes the arm");
    // Leases are state, not evidence: nothing appended.
    assert_eq!(a.chain_head().expect("head"), head);
    let rows = b.leases().expect("b reads");
    let row = rows.get(&arm).expect("row");
    assert_eq!(row.holder, "A");
    assert!(row.live_at(rows.now_ms));
    assert!(row.until_ms >= row.renewed_ms + 60_000);

    // B may not take it, and a commit carrying the refused lease stores nothing.
    let refused = b.commit_blocking(Commit {
        events: vec![EventDraft {
            kind: "endpoint.start".into(),
            body: json!({"endpoint_id": "B"}).into(),
        }],
        latches: vec![LatchRow {
            device_id: "arm-1".into(),
            latched: true,
            info: json!({"since_ms": 1}),
        }],
        leases: vec![hold(&arm, "B", 60_000, None)],
        ..Commit::default()
    });
    match refused {
        Err(StoreError::LeaseHeld(h)) => {
            assert_eq!(h.key, arm);
            assert_eq!(h.holder, "A");
            assert!(h.info.contains("\"endpoint_id\":\"A\""), "{}", h.info);
        }
        other => panic!("expected LeaseHeld, got {other:?}"),
    }
    assert_eq!(b.chain_head().expect("head"), head);
    assert!(b.latches().expect("latches").is_empty());

    // A renews; a release by someone else changes nothing.
    a.commit_blocking(leases(vec![hold(&arm, "A", 60_000, None)]))
        .expect("renew");
    b.commit_blocking(leases(vec![release(&arm, "B")]))
        .expect("a stray release is a no-op");
    assert_eq!(holder_of(b, &arm).as_deref(), Some("A"));

    // B takes over from A, known dead; A's renewal is then refused.
    b.commit_blocking(leases(vec![hold(&arm, "B", 60_000, Some("A"))]))
        .expect("takeover");
    assert_eq!(holder_of(a, &arm).as_deref(), Some("B"));
    assert!(matches!(
        a.commit_blocking(leases(vec![hold(&arm, "A", 60_000, None)])),
        Err(StoreError::LeaseHeld(h)) if h.holder == "B"
    ));

    // B gives it up; then anyone may take it.
    b.commit_blocking(leases(vec![release(&arm, "B")]))
        .expect("release");
    assert_eq!(holder_of(a, &arm), None);

    // A short lease lapses on its own.
    let pump = device_key("pump-1");
    a.commit_blocking(leases(vec![hold(&pump, "A", 100, None)]))
        .expect("short lease");
    assert!(b
        .commit_blocking(leases(vec![hold(&pump, "B", 60_000, None)]))
        .is_err());
    std::thread::sleep(Duration::from_millis(250));
    let rows = b.leases().expect("leases");
    assert!(!rows.get(&pump).expect("row").live_at(rows.now_ms));
    b.commit_blocking(leases(vec![hold(&pump, "B", 60_000, None)]))
        .expect("a lapsed lease is free");
    assert_eq!(holder_of(a, &pump).as_deref(), Some("B"));

    // Out-of-range drafts are refused before the writer.
    assert!(matches!(
        a.commit_blocking(leases(vec![hold(&pump, "A", 1, None)])),
        Err(StoreError::Invalid(_))
    ));
}

#[test]
fn leases_on_the_memory_store() {
    let s = MemoryStore::new();
    contract(&s, &s);
}

#[test]
fn leases_on_one_sqlite_file_through_two_handles() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = SqliteStore::open(dir.path()).expect("a");
    let b = SqliteStore::open(dir.path()).expect("b");
    contract(&a, &b);
}

#[test]
fn leases_on_postgresql_through_two_endpoints() {
    let url = pg::migrated_database("leases");
    let a = PgStore::open(&url).expect("a");
    let b = PgStore::open(&url).expect("b");
    contract(&a, &b);
    // The rows as PostgreSQL holds them.
    let n = pg::psql_on(&url, "SELECT count(*) FROM leases");
    assert_eq!(
        n, "2",
        "endpoint/A and device/pump-1 (device/arm-1 was given up)"
    );
}

#[test]
fn on_postgresql_a_trip_wakes_the_other_endpoints_watcher_at_once() {
    let url = pg::migrated_database("listen");
    let a = Arc::new(PgStore::open(&url).expect("a"));
    let b = Arc::new(PgStore::open(&url).expect("b"));
    // Let b's listener connect and LISTEN (it reconnects every 500 ms).
    std::thread::sleep(Duration::from_millis(800));
    // Absorb what b heard so far (its connect), as a watcher would.
    b.wait_change(Duration::from_millis(10));
    let waiter = {
        let b = Arc::clone(&b);
        std::thread::spawn(move || {
            let t0 = Instant::now();
            b.wait_change(Duration::from_secs(60));
            t0.elapsed()
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let token = b.change_token().expect("token");
    a.commit_blocking(Commit {
        events: vec![EventDraft {
            kind: "safety.estop".into(),
            body: json!({"device_id": "arm-1"}).into(),
        }],
        latches: vec![LatchRow {
            device_id: "arm-1".into(),
            latched: true,
            info: json!({"since_ms": 5}),
        }],
        ..Commit::default()
    })
    .expect("trip");
    let waited = waiter.join().expect("waiter");
    // Woken by the notification, not by the 60 s fallback.
    assert!(waited < Duration::from_secs(30), "waited {waited:?}");
    assert_ne!(b.change_token().expect("token"), token);
    assert!(b.latches().expect("latches")[0].latched);
    assert_eq!(
        b.change_poll_ms(),
        tether_store::postgres::PG_CHANGE_POLL_MS
    );
}
