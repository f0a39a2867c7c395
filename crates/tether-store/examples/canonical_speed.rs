//! Rough per-call cost of canonical serialisation and digest for a small
//! command input (not a benchmark suite; figures vary by machine).
//!
//! ```text
//! cargo run --release -p tether-store --example canonical_speed
//! ```
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

use serde_json::json;
use std::hint::black_box;
use std::time::Instant;
use tether_store::canonical::{digest, to_canonical_string};

fn main() {
    let v = json!({
        "command_id": "01J9Z3M4K5N6P7Q8R9S0T1V2W3",
        "binding": "cap.motion.move.v1@axis",
        "input": {"target": {"position_mm": 12.5, "speed": 10}, "mode": "absolute"},
        "deadline_ms": 1_700_000_000_000u64,
    });
    const N: u32 = 1_000_000;
    let t = Instant::now();
    let mut bytes = 0usize;
    for _ in 0..N {
        bytes += black_box(to_canonical_string(black_box(&v))).len();
    }
    let per = t.elapsed().as_nanos() as f64 / f64::from(N);
    println!(
        "to_canonical_string: {per:.0} ns/call ({} bytes)",
        bytes / N as usize
    );
    let t = Instant::now();
    for _ in 0..N {
        black_box(digest(black_box(&v)));
    }
    let per = t.elapsed().as_nanos() as f64 / f64::from(N);
    println!("digest (canonical + sha256 + hex): {per:.0} ns/call");
}
