//! The store's budget check: a draw that carries its budget's cap is stored
//! only if it fits beside the key's counted draws, checked and stored in one
//! step of the writer's transaction — so writers sharing a store (two
//! handles on one SQLite file here, as two processes would be) never exceed
//! a budget together.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

use serde_json::json;
use std::sync::Arc;
use tether_store::{
    BudgetCap, BudgetRow, Commit, EventDraft, MemoryStore, SqliteStore, Store, StoreError,
};

const KEY: &str = "pump-1/cap.fluid.dispense.v1/volume_ml/rolling_1h";
const HOUR_MS: u64 = 3_600_000;

fn draw(id: &str, amount: f64, ts_ms: u64, cap: Option<BudgetCap>) -> BudgetRow {
    BudgetRow {
        key: KEY.into(),
        reservation_id: id.into(),
        amount,
        ts_ms,
        released: false,
        cap,
    }
}

fn hourly(limit: f64) -> Option<BudgetCap> {
    Some(BudgetCap {
        limit,
        window_ms: Some(HOUR_MS),
    })
}

/// An admission-like commit: one entry and the draws.
fn admission(id: &str, draws: Vec<BudgetRow>) -> Commit {
    Commit {
        events: vec![EventDraft {
            kind: "command.admitted".into(),
            body: json!({"command_id": id}).into(),
        }],
        budget_draws: draws,
        ..Commit::default()
    }
}

fn both(f: impl Fn(&dyn Store)) {
    f(&MemoryStore::new());
    let dir = tempfile::tempdir().expect("tempdir");
    f(&SqliteStore::open(dir.path()).expect("open"));
}

fn exceeded(r: Result<tether_store::CommitAck, StoreError>) -> tether_store::BudgetExceeded {
    match r {
        Err(StoreError::BudgetExceeded(x)) => x,
        other => panic!("expected BudgetExceeded, got {other:?}"),
    }
}

#[test]
fn a_capped_draw_that_does_not_fit_is_refused_and_nothing_of_its_commit_is_stored() {
    both(|s| {
        let t = 10 * HOUR_MS;
        s.commit_blocking(admission("a", vec![draw("a#0", 15.0, t, hourly(25.0))]))
            .expect("fits");
        let head = s.chain_head().expect("head");
        let x = exceeded(
            s.commit_blocking(admission("b", vec![draw("b#0", 11.0, t + 1, hourly(25.0))])),
        );
        assert_eq!(x.key, KEY);
        assert_eq!(x.reservation_id, "b#0");
        assert_eq!((x.used, x.limit, x.amount), (15.0, 25.0, 11.0));
        assert!(!x.to_string().is_empty());
        // Nothing of the refused commit: no entry, no row.
        assert_eq!(s.chain_head().expect("head"), head);
        let rows = s.budget_rows_since(0).expect("rows");
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].reservation_id, "a#0");
        assert_eq!(rows[0].cap, None, "the cap is checked, not stored");
        // Exactly up to the cap fits (the kernel's ledger arithmetic).
        s.commit_blocking(admission("c", vec![draw("c#0", 10.0, t + 2, hourly(25.0))]))
            .expect("the rest of the budget fits");
        assert_eq!(s.budget_used(KEY, Some(0)).expect("used"), 25.0);
        // Not retryable: the same commit would be refused again.
        assert!(!StoreError::BudgetExceeded(x).is_retryable());
    });
}

#[test]
fn only_unreleased_draws_the_window_counts_count() {
    both(|s| {
        let t = 10 * HOUR_MS;
        // Outside the hour (exactly one window back is outside), released,
        // another key, and an uncapped journal copy over the cap.
        let mut other = draw("other#0", 100.0, t, None);
        other.key = "other/key".into();
        s.commit_blocking(Commit {
            budget_draws: vec![
                draw("old#0", 100.0, t - HOUR_MS, None),
                draw("gone#0", 100.0, t - 1, None),
                other,
            ],
            budget_releases: vec!["gone#0".into()],
            ..Commit::default()
        })
        .expect("uncapped draws are recorded as given");
        s.commit_blocking(admission("a", vec![draw("a#0", 25.0, t, hourly(25.0))]))
            .expect("nothing the window counts");
        assert_eq!(
            s.budget_used(KEY, Some(t - HOUR_MS + 1)).expect("used"),
            25.0
        );
        // A session-like cap (no window) counts every unreleased draw.
        let session = Some(BudgetCap {
            limit: 125.5,
            window_ms: None,
        });
        let x = exceeded(s.commit_blocking(admission("b", vec![draw("b#0", 1.0, t, session)])));
        assert_eq!(x.used, 125.0);
        // A release given back elsewhere makes room at once.
        s.commit_blocking(Commit {
            budget_releases: vec!["a#0".into()],
            ..Commit::default()
        })
        .expect("release");
        s.commit_blocking(admission("c", vec![draw("c#0", 25.0, t + 1, hourly(25.0))]))
            .expect("the released draw no longer counts");
    });
}

#[test]
fn earlier_draws_of_the_same_commit_and_batch_count() {
    both(|s| {
        let t = 10 * HOUR_MS;
        let second = draw("a#1", 10.0, t, hourly(25.0));
        let x = exceeded(s.commit_blocking(admission(
            "a",
            vec![draw("a#0", 20.0, t, hourly(25.0)), second],
        )));
        assert_eq!(x.reservation_id, "a#1");
        assert_eq!(x.used, 20.0);
        assert!(s.budget_rows_since(0).expect("rows").is_empty());

        // Queued together, the commits land in one batch: the first two
        // fit, the third alone is refused, the fourth (another key) fits.
        let (tx, rx) = std::sync::mpsc::channel();
        for (i, amount) in [10.0, 10.0, 10.0].into_iter().enumerate() {
            let tx = tx.clone();
            let id = format!("q{i}");
            s.submit(
                admission(&id, vec![draw(&format!("{id}#0"), amount, t, hourly(25.0))]),
                Box::new(move |r| tx.send((i, r)).expect("send")),
            );
        }
        let mut other = draw("q3#0", 99.0, t, hourly(100.0));
        other.key = "other/key".into();
        let tx3 = tx.clone();
        s.submit(
            admission("q3", vec![other]),
            Box::new(move |r| tx3.send((3, r)).expect("send")),
        );
        drop(tx);
        let mut results: Vec<_> = rx.iter().collect();
        results.sort_by_key(|(i, _)| *i);
        assert!(results[0].1.is_ok() && results[1].1.is_ok(), "{results:?}");
        assert_eq!(exceeded(results[2].1.clone()).used, 20.0);
        assert!(results[3].1.is_ok(), "{results:?}");
    });
}

#[test]
fn a_cap_that_is_not_a_finite_number_is_an_invalid_commit() {
    both(|s| {
        for limit in [f64::NAN, f64::INFINITY, -1.0] {
            let cap = Some(BudgetCap {
                limit,
                window_ms: None,
            });
            let r = s.commit_blocking(admission("a", vec![draw("a#0", 1.0, 1, cap)]));
            assert!(matches!(r, Err(StoreError::Invalid(_))), "{limit}: {r:?}");
        }
    });
}

/// Two handles on one file, each with its own writer thread and connection
/// (what two endpoints on one state directory are), drawing concurrently
/// from many threads: exactly as many draws as fit are stored, never more.
#[test]
fn writers_sharing_one_sqlite_file_never_exceed_a_cap_together() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.path()).expect("open a"));
    let b: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.path()).expect("open b"));
    let t = 10 * HOUR_MS;
    let threads: Vec<_> = (0..8)
        .map(|w| {
            let s = if w % 2 == 0 { a.clone() } else { b.clone() };
            std::thread::spawn(move || {
                let mut outcomes = Vec::new();
                for i in 0..25 {
                    let id = format!("w{w}-{i}");
                    let r = s.commit_blocking(admission(
                        &id,
                        vec![draw(&format!("{id}#0"), 3.0, t + i, hourly(150.0))],
                    ));
                    outcomes.push(r);
                }
                outcomes
            })
        })
        .collect();
    let mut stored = 0;
    let mut refused = 0;
    for h in threads {
        for r in h.join().expect("thread") {
            match r {
                Ok(_) => stored += 1,
                Err(StoreError::BudgetExceeded(x)) => {
                    assert!(x.used + x.amount > x.limit, "{x:?}");
                    refused += 1;
                }
                Err(e) => panic!("unexpected store error {e}"),
            }
        }
    }
    assert_eq!(stored, 50, "150 / 3 draws fit, from both writers together");
    assert_eq!(refused, 150);
    for s in [&a, &b] {
        let rows = s.budget_rows_since(0).expect("rows");
        assert_eq!(rows.len(), 50);
        let sum: f64 = rows.iter().map(|r| r.amount).sum();
        assert!(sum <= 150.0, "{sum}");
        assert_eq!(s.budget_used(KEY, None).expect("used"), sum);
    }
}
