//! Heap allocations per governed command: a figure that does not move with
//! the machine's load, unlike time. One caller sends setpoint commands on the
//! built-in cell, one at a time, through `Kernel::command` on the in-memory
//! store (the kernel's own path, the store's writer thread, no SQLite) and
//! then on the SQLite store; a counting allocator (around mimalloc, as the
//! binaries use) counts every allocation in the process meanwhile.
//!
//! Run: `cargo bench -p tether-kernel --bench allocations [-- COMMANDS]`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tether_kernel::Principal;
use tether_store::{MemoryStore, SqliteStore, Store};

/// Counts allocations (and bytes asked for) on top of mimalloc.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to mimalloc with the same arguments; the
// counters are plain atomics and never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let n = ALLOCS.fetch_add(1, Ordering::Relaxed);
        sample_site(n);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let n = ALLOCS.fetch_add(1, Ordering::Relaxed);
        sample_site(n);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let n = ALLOCS.fetch_add(1, Ordering::Relaxed);
        sample_site(n);
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// With `ALLOC_SITES=N`, one allocation in N records where it came from: the
/// innermost frames of this workspace's crates, printed as a table at the end.
static SAMPLE_EVERY: AtomicU64 = AtomicU64::new(0);
static SITES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

thread_local! {
    static IN_SAMPLE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn sample_site(n: u64) {
    let every = SAMPLE_EVERY.load(Ordering::Relaxed);
    // Scrambled, so a sample does not land on the same site of a command
    // that allocates in a fixed pattern.
    if every == 0 || !(n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32).is_multiple_of(every) {
        return;
    }
    // Capturing allocates: never sample inside a sample.
    if IN_SAMPLE.with(|f| f.replace(true)) {
        return;
    }
    let bt = std::backtrace::Backtrace::force_capture().to_string();
    let frames: Vec<&str> = bt
        .lines()
        .map(str::trim)
        .filter(|l| l.contains(": tether_") || l.contains(": <tether_"))
        .map(|l| l.split_once(": ").map_or(l, |x| x.1))
        .take(2)
        .collect();
    if let Ok(mut sites) = SITES.lock() {
        sites.push(frames.join("  <-  "));
    }
    IN_SAMPLE.with(|f| f.set(false));
}

fn print_sites() {
    let Ok(sites) = SITES.lock() else { return };
    let mut counts = std::collections::HashMap::<&str, usize>::new();
    for s in sites.iter() {
        *counts.entry(s.as_str()).or_default() += 1;
    }
    let mut rows: Vec<_> = counts.into_iter().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1));
    for (site, n) in rows.iter().take(40) {
        println!(
            "{:5.1}%  {site}",
            100.0 * *n as f64 / sites.len().max(1) as f64
        );
    }
}

fn main() {
    let commands: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(20_000);
    if let Some(every) = std::env::var("ALLOC_SITES")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        let dir = tempfile::tempdir().expect("tempdir");
        let sqlite = Arc::new(SqliteStore::open(dir.path()).expect("store"));
        count("sqlite", sqlite, commands, every);
        print_sites();
        return;
    }
    count("memory", Arc::new(MemoryStore::new()), commands, 0);
    let dir = tempfile::tempdir().expect("tempdir");
    let sqlite = Arc::new(SqliteStore::open(dir.path()).expect("store"));
    count("sqlite", sqlite, commands, 0);
}

/// Runs `commands` setpoint commands one after another and prints the
/// allocations per command, after a warm-up that fills caches and indexes.
/// With `sample_every` > 0, one allocation in that many records its site.
fn count(name: &str, store: Arc<dyn Store>, commands: u64, sample_every: u64) {
    let k = common::kernel_on("alloc", store);
    let rt = common::runtime();
    let p = Principal::local_agent();
    let session = common::open_session(&rt, &k, &p);
    let run = |n: u64| {
        rt.block_on(async {
            for i in 0..n {
                let req = common::setpoint(&session, 20.0 + (i % 60) as f64);
                // The surfaces' path: the receipt as canonical text.
                let r = k
                    .command(&p, req, tether_kernel::CommandOptions::plain())
                    .await
                    .expect("command");
                assert_eq!(r.status(), Some("completed"), "{r:?}");
            }
        })
    };
    run(1_000);
    SAMPLE_EVERY.store(sample_every, Ordering::Relaxed);
    let (a0, b0) = (
        ALLOCS.load(Ordering::Relaxed),
        BYTES.load(Ordering::Relaxed),
    );
    run(commands);
    SAMPLE_EVERY.store(0, Ordering::Relaxed);
    let (a1, b1) = (
        ALLOCS.load(Ordering::Relaxed),
        BYTES.load(Ordering::Relaxed),
    );
    println!(
        "FIGURE allocations_per_command store={name} commands={commands} allocations={:.1} bytes={:.0}",
        (a1 - a0) as f64 / commands as f64,
        (b1 - b0) as f64 / commands as f64
    );
}
