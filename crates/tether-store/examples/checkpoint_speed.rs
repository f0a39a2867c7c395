//! Signed checkpoints: the cost of one signature, and `verify` speed on an
//! export with and without checking its checkpoints (docs/PERFORMANCE.md).
//!
//! `cargo run --release -p tether-store --example checkpoint_speed -- [entries] [every]`
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::json;
use std::time::Instant;
use tether_store::checkpoint::{CheckpointSigner, KeyRing, CHECKPOINT_KIND};
use tether_store::verify::{verify_jsonl, verify_jsonl_with, VerifyOptions};
use tether_store::{Commit, EventDraft, MemoryStore, Store};

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let entries = args.first().copied().unwrap_or(200_000);
    let every = args.get(1).copied().unwrap_or(1000);
    let signer = CheckpointSigner::from_seed(&[9u8; 32]);
    let n = 10_000u32;
    let t = Instant::now();
    for i in 0..n {
        std::hint::black_box(signer.sign(u64::from(i), &"ab".repeat(32), 1, "cell"));
    }
    println!(
        "sign: {:.1} us per checkpoint (body included)",
        t.elapsed().as_secs_f64() * 1e6 / f64::from(n)
    );
    let store = MemoryStore::new();
    let mut batch = Vec::new();
    for i in 0..entries {
        batch.push(EventDraft {
            kind: "command.started".into(),
            body: json!({"command_id": format!("c{i}"), "device_id": "thermostat-1", "input": {"target_temperature": 21.5}}).into(),
        });
        if batch.len() as u64 == every {
            store
                .commit_blocking(Commit {
                    events: std::mem::take(&mut batch),
                    ..Commit::default()
                })
                .expect("commit");
            let (seq, head) = store.chain_head().expect("head").expect("some");
            store
                .commit_blocking(Commit {
                    events: vec![EventDraft {
                        kind: CHECKPOINT_KIND.into(),
                        body: signer.sign(seq, &head, 1, "cell").into(),
                    }],
                    ..Commit::default()
                })
                .expect("checkpoint");
        }
    }
    let mut out = Vec::new();
    let total = store.export_chain(&mut out).expect("export");
    let t = Instant::now();
    let plain = verify_jsonl(&out[..]);
    let plain_s = t.elapsed().as_secs_f64();
    let mut ring = KeyRing::new();
    ring.add(signer.public_key());
    let opts = VerifyOptions {
        keys: Some(ring),
        saved: None,
        require_signed_tail: false,
    };
    let t = Instant::now();
    let (signed, report) = verify_jsonl_with(&out[..], &opts).expect("opts");
    let signed_s = t.elapsed().as_secs_f64();
    assert!(plain.ok && signed.ok);
    println!(
        "verify {total} entries ({} MB, {} checkpoints): {:.0} entries/s without keys, {:.0} entries/s checking signatures",
        out.len() / 1_000_000,
        report.checkpoints,
        total as f64 / plain_s,
        total as f64 / signed_s
    );
}
