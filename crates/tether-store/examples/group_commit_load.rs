//! Group-commit load harness: N threads each make M durable commits through
//! `commit_blocking`, like N concurrent callers of the kernel.
//!
//! ```text
//! cargo run --release -p tether-store --example group_commit_load -- [threads] [commits_per_thread] [--memory] [--inflight=K] [--kernel-shape]
//! ```
//!
//! By default each thread waits for each commit (`commit_blocking`), so at
//! most `threads` commits are in flight and throughput is bounded by
//! `threads / (fsync latency + apply time)`. With `--inflight=K` each thread
//! keeps up to K commits outstanding through `submit`, as a server with many
//! connections per worker would.
//!
//! Each commit is what one decided physical command stores: a "started" and
//! a "receipt" event, the receipt index and a revision; with `--kernel-shape`,
//! what a simulated one stores: one ~1 KB entry (admission and receipt), the
//! receipt index and a revision. Prints commits/s and the
//! number of batches (one transaction and one fsync each for SQLite). The
//! store lives in a temporary directory under `$TMPDIR`; point that at the disk
//! you want to measure.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

use serde_json::json;
use std::sync::mpsc;
use std::time::Instant;
use tether_store::{
    Commit, CommitAck, EventDraft, MemoryStore, ReceiptRef, RevisionRow, SqliteStore, Store,
    StoreError, WriterStats,
};

fn commit(t: usize, i: usize) -> Commit {
    let id = format!("01J{t:05}{i:010}");
    let input = json!({"target": {"position_mm": i as f64 * 0.5, "speed": 10}, "mode": "absolute"});
    let digest = tether_store::canonical::digest(&input);
    Commit {
        events: vec![
            EventDraft {
                kind: "command.started".into(),
                body: json!({"command_id": id, "binding": "cap.motion.move.v1@axis", "device_id": "sim-arm",
                             "principal": {"id": "agent-7", "kind": "agent"}, "input_digest": digest, "decision": "allow"}).into(),
            },
            EventDraft {
                kind: "command.receipt".into(),
                body: json!({"command_id": id, "revisions": {"axis": i}, "latency_ms": 1.25,
                             "receipt": {"command_id": id, "status": "completed", "output": {"position_mm": i as f64 * 0.5}}}).into(),
            },
        ],
        receipts: vec![ReceiptRef {
            command_id: id.clone(),
            input_digest: digest,
            event: 1,
        }],
        revisions: vec![RevisionRow {
            device_id: "sim-arm".into(),
            resource: format!("axis{t}"),
            revision: i as u64,
        }],
        ..Commit::default()
    }
}

/// What the kernel stores for one simulated command: a single entry holding
/// the admission and the receipt (about 1 KB of canonical JSON), the receipt
/// index and a revision.
fn kernel_commit(t: usize, i: usize) -> Commit {
    let id = format!("01J{t:05}{i:010}");
    let input = json!({"target_temperature": 20 + (i % 50)});
    let digest = tether_store::canonical::digest(&input);
    let receipt = json!({
        "receipt_id": format!("rcpt_01J{t:05}{i:010}"), "command_id": id, "device_id": "thermostat-1",
        "capability_id": "cap.thermal.setpoint.v1", "resource": "main", "status": "completed",
        "output": {"target_temperature": 20 + (i % 50)}, "error": null, "input_digest": digest,
        "state_revision_before": i, "state_revision_after": i + 1, "decision": "allow", "mode": "simulated",
        "accepted_at_ms": 1_796_020_744_014u64, "completed_at_ms": 1_796_020_744_015u64, "replayed": false,
        "latency_us": 728, "operation_id": format!("op_01J{t:05}{i:010}"),
        "policy": {"decision": "allow", "policies": ["simulated-allowed"], "reason": "permitted by policy `simulated-allowed`"}
    });
    Commit {
        events: vec![EventDraft {
            kind: "command.receipt".into(),
            body: json!({"admission": {"decision": "allow", "principal": {"id": "local", "kind": "agent"}, "risk": "R1",
                         "session_id": "mhs_s_01M8NJVBMYFZB3YZ5GJCX3YZBC_beddf9afe047fc0d"}, "receipt": receipt}).into(),
        }],
        receipts: vec![ReceiptRef {
            command_id: id,
            input_digest: digest,
            event: 0,
        }],
        revisions: vec![RevisionRow {
            device_id: "thermostat-1".into(),
            resource: "main".into(),
            revision: i as u64 + 1,
        }],
        ..Commit::default()
    }
}

fn fail(e: StoreError) -> ! {
    eprintln!("commit failed: {e}");
    std::process::exit(1);
}

fn run(
    store: &dyn Store,
    make: fn(usize, usize) -> Commit,
    threads: usize,
    per_thread: usize,
    inflight: usize,
) -> f64 {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                if inflight <= 1 {
                    for i in 0..per_thread {
                        if let Err(e) = store.commit_blocking(make(t, i)) {
                            fail(e);
                        }
                    }
                    return;
                }
                // A window of `inflight` outstanding commits per thread.
                let (tx, rx) = mpsc::channel::<Result<CommitAck, StoreError>>();
                let mut outstanding = 0;
                for i in 0..per_thread {
                    if outstanding == inflight {
                        match rx.recv() {
                            Ok(Ok(_)) => outstanding -= 1,
                            Ok(Err(e)) => fail(e),
                            Err(_) => fail(StoreError::Closed),
                        }
                    }
                    let tx = tx.clone();
                    store.submit(
                        make(t, i),
                        Box::new(move |r| {
                            let _ = tx.send(r);
                        }),
                    );
                    outstanding += 1;
                }
                for _ in 0..outstanding {
                    match rx.recv() {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => fail(e),
                        Err(_) => fail(StoreError::Closed),
                    }
                }
            });
        }
    });
    start.elapsed().as_secs_f64()
}

fn report(
    kind: &str,
    threads: usize,
    per_thread: usize,
    inflight: usize,
    secs: f64,
    stats: WriterStats,
) {
    let n = (threads * per_thread) as f64;
    println!(
        "{kind}: {threads} threads x {per_thread} commits (in flight per thread: {inflight}) = {n} commits \
         in {secs:.3} s -> {:.0} commits/s; \
         {} batches (fsyncs), {:.1} commits/batch avg, largest {}, failed batches {}",
        n / secs,
        stats.batches,
        stats.commits as f64 / stats.batches.max(1) as f64,
        stats.largest_batch,
        stats.failed_batches,
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let memory = args.iter().any(|a| a == "--memory");
    let make: fn(usize, usize) -> Commit = if args.iter().any(|a| a == "--kernel-shape") {
        kernel_commit
    } else {
        commit
    };
    let nums: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let threads = nums.first().copied().unwrap_or(64).max(1);
    let per_thread = nums.get(1).copied().unwrap_or(2000).max(1);
    let inflight = args
        .iter()
        .find_map(|a| a.strip_prefix("--inflight="))
        .and_then(|k| k.parse().ok())
        .unwrap_or(1usize)
        .max(1);

    if memory {
        let store = MemoryStore::with_writer();
        let secs = run(&store, make, threads, per_thread, inflight);
        report("memory", threads, per_thread, inflight, secs, store.stats());
        return;
    }
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("cannot create a temporary directory: {e}");
            std::process::exit(1);
        }
    };
    let store = match SqliteStore::open(dir.path()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cannot open the store: {e}");
            std::process::exit(1);
        }
    };
    let secs = run(&store, make, threads, per_thread, inflight);
    report("sqlite", threads, per_thread, inflight, secs, store.stats());
    drop(store);
    let t = Instant::now();
    match tether_store::verify::verify_store(dir.path()) {
        Ok(r) => println!(
            "verify_store: ok={} entries={} in {:.3} s",
            r.ok,
            r.entries,
            t.elapsed().as_secs_f64()
        ),
        Err(e) => println!("verify_store failed: {e}"),
    }
}
