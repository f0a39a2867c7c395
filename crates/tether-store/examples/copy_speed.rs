//! What `tether store copy` costs: a SQLite store of N commands (two
//! entries and a receipt each) is made in a temporary directory, then
//! copied into the PostgreSQL store at URL (migrated here; it must hold no
//! state), verified
//! before and after as the command does.
//!
//! `cargo run --release -p tether-store --example copy_speed -- URL [N]`

use serde_json::json;
use std::sync::mpsc;
use std::time::Instant;
use tether_store::{Commit, EventDraft, ReceiptRef, SqliteStore, Store};

fn command(id: &str) -> Commit {
    let receipt = json!({"command_id": id, "status": "completed", "output": {"ok": true}});
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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let url = args.first().ok_or("usage: copy_speed URL [N]")?;
    let n: usize = args.get(1).map_or(Ok(20_000), |s| s.parse())?;
    let dir = tempfile::tempdir()?;
    {
        let store = SqliteStore::open(dir.path())?;
        let (tx, rx) = mpsc::channel();
        for i in 0..n {
            let tx = tx.clone();
            store.submit(
                command(&format!("cmd-{i}")),
                Box::new(move |r| {
                    let _ = tx.send(r.is_ok());
                }),
            );
        }
        drop(tx);
        let stored = rx.iter().filter(|ok| *ok).count();
        if stored != n {
            return Err(format!("only {stored} of {n} commits were stored").into());
        }
    }
    tether_store::PgStore::migrate(url)?;
    let started = Instant::now();
    let report = tether_store::postgres::copy_sqlite_to_url(dir.path(), url)?;
    let took = started.elapsed();
    println!(
        "copied {} entries and {} receipts in {:.2} s: {:.0} entries/s (verified before and after the commit)",
        report.entries,
        report.receipts,
        took.as_secs_f64(),
        report.entries as f64 / took.as_secs_f64()
    );
    Ok(())
}
