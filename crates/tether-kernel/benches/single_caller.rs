//! One caller's durable command, one at a time, against the disk flush
//! measured in the same run (issue 21 §4: "a durable single caller ≤ one
//! flush + 20 µs p50" for a call whose admission rides in its receipt, "≤ two
//! flushes + 20 µs" for a physical call, which needs its durable start too).
//!
//! - `flush_4k_us`: a 4 KiB write and `fdatasync` of a file in the store's
//!   directory (what `dd bs=4k oflag=dsync` measures), before and after.
//! - `single_setpoint_us`: a simulated setpoint on the SQLite store (WAL,
//!   `synchronous=FULL`): one commit, its admission in its receipt.
//! - `single_physical_us`: the same thermostat declared `hardware` (the
//!   simulated driver behind it): the durable start, then the receipt.
//!
//! Each command runs in a runtime task as a surface's handler does, and is
//! answered as text. Each figure is taken twice in the same run: with every
//! commit handed to the store's writer thread (`_thread`), and with a
//! command's commit applied on the caller's own thread when the writer is
//! idle (`_inline`, the shipped default: `Store::submit_waiting`). Run: `cargo bench -p tether-kernel --bench
//! single_caller [-- COMMANDS]`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use tether_kernel::{Kernel, KernelConfig, Principal};
use tether_store::SqliteStore;

fn main() {
    let commands = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<usize>().ok())
        .unwrap_or(5_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let flush_before = flush_p50_us(dir.path());
    let setpoint_thread = run(dir.path(), "setpoint-thread", false, false, commands);
    let setpoint = run(dir.path(), "setpoint", false, true, commands);
    let physical_thread = run(dir.path(), "physical-thread", true, false, commands);
    let physical = run(dir.path(), "physical", true, true, commands);
    let flush_after = flush_p50_us(dir.path());
    let flush = (flush_before + flush_after) / 2.0;
    println!("FIGURE flush_4k_us p50_before={flush_before:.1} p50_after={flush_after:.1}");
    for (name, (p50, p99), flushes) in [
        ("single_setpoint_thread_us", setpoint_thread, 1.0),
        ("single_setpoint_us", setpoint, 1.0),
        ("single_physical_thread_us", physical_thread, 2.0),
        ("single_physical_us", physical, 2.0),
    ] {
        println!(
            "FIGURE {name} p50={p50:.1} p99={p99:.1} over_{flushes}_flushes={:.1} goal_over=20",
            p50 - flushes * flush
        );
    }
}

/// p50 of 2,000 4 KiB writes, each made durable by `fdatasync`, µs.
fn flush_p50_us(dir: &Path) -> f64 {
    let path = dir.join("flush-probe");
    let mut f = std::fs::File::create(&path).expect("probe file");
    let block = [0x5au8; 4096];
    let mut samples = Vec::with_capacity(2_000);
    for _ in 0..2_000 {
        let t = Instant::now();
        f.seek(SeekFrom::Start(0)).expect("seek");
        f.write_all(&block).expect("write");
        f.sync_data().expect("fdatasync");
        samples.push(t.elapsed().as_nanos());
    }
    drop(f);
    let _ = std::fs::remove_file(path);
    percentiles(samples).0
}

/// `commands` setpoints one at a time on a fresh SQLite store in `dir`; the
/// thermostat declared `hardware` when `physical`; commits applied on the
/// caller's thread when `inline`. (p50, p99) µs.
fn run(dir: &Path, name: &str, physical: bool, inline: bool, commands: usize) -> (f64, f64) {
    let state = dir.join(name);
    std::fs::create_dir_all(&state).expect("state dir");
    let store = Arc::new(SqliteStore::open(&state).expect("store"));
    store.set_inline_commits(inline);
    let k = kernel(Arc::clone(&store), physical);
    let rt = common::runtime();
    let p = Principal::local_agent();
    let session = common::open_session(&rt, &k, &p);
    let label = name.to_owned();
    let samples = rt.block_on(async move {
        let caller = tokio::spawn(async move {
            let mut samples = Vec::with_capacity(commands);
            let mut out = Vec::with_capacity(4096);
            for n in 0..commands {
                let req = common::setpoint(&session, 20.0 + (n % 50) as f64);
                let t = Instant::now();
                let answer = k
                    .command(&p, req, tether_kernel::CommandOptions::plain())
                    .await
                    .expect("command");
                out.clear();
                answer.write_json(&mut out);
                samples.push(t.elapsed().as_nanos());
                assert_eq!(answer.status(), Some("completed"), "{label}");
                assert!(!answer.not_durable(), "{label}");
            }
            samples
        });
        caller.await.expect("caller")
    });
    let stats = store.stats();
    println!(
        "# {name}: {} batches, {} of them on the caller's thread",
        stats.batches, stats.inline_batches
    );
    percentiles(samples)
}

/// The built-in cell on `store`; its thermostat `hardware` when `physical`
/// (its simulated driver stands in for the device).
fn kernel(store: Arc<SqliteStore>, physical: bool) -> Kernel {
    let mut sources = tether_drivers::builtin_cell();
    let drivers = {
        let cell = tether_kernel::loader::load(&sources, None).expect("cell");
        tether_drivers::build_all(cell.devices.iter().map(|d| &d.manifest)).expect("drivers")
    };
    if physical {
        for s in &mut sources {
            if s.origin.contains("thermostat") {
                s.text = s
                    .text
                    .replacen("mode = \"simulated\"", "mode = \"hardware\"", 1)
                    // A time-bounded call on hardware declares its longest run.
                    .replace(
                        "kind = \"time_bounded\"",
                        "kind = \"time_bounded\"\nmax_duration_ms = 5000",
                    );
            }
        }
    }
    let cell = tether_kernel::loader::load(&sources, None).expect("cell");
    Kernel::new(KernelConfig::standard("single"), cell, drivers, store).expect("kernel")
}

/// (p50, p99) of nanosecond samples, in µs.
fn percentiles(mut samples: Vec<u128>) -> (f64, f64) {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q) as usize] as f64 / 1000.0;
    (at(0.50), at(0.99))
}
