//! One caller's durable command, one at a time, against the disk flush
//! measured in the same run (issue 21 §4: "a durable single caller ≤ one
//! flush + 20 µs p50" for a call whose admission rides in its receipt, "≤ two
//! flushes + 20 µs" for a physical call, which needs its durable start too).
//!
//! - `flush_4k_us`: a 4 KiB write and `fdatasync` of a file in the store's
//!   directory (what `dd bs=4k oflag=dsync` measures), before and after, and
//!   interleaved with each run's commands in blocks of 100 (`flush_p50`):
//!   each run's figure over a flush is taken against the flushes of its own
//!   minutes, since this disk's flush swings from minute to minute.
//! - `single_setpoint_us`: a simulated setpoint on the SQLite store: one
//!   commit, its admission in its receipt, flushed in the store's journal
//!   and committed to SQLite's WAL without SQLite's own flush (the shipped
//!   default). `*_journal_ab`: the same run's blocks with the journal off
//!   (SQLite's `COMMIT` flushing the WAL itself, `synchronous=FULL`, as the
//!   store did before it) against those with it on, blocks alternating.
//!   `*_hold_ab`: answered records held in one open transaction for the
//!   next commands (the shipped default) against a `COMMIT` before each
//!   answer; `*_early_write_ab`: with a `COMMIT` each, the journal's record
//!   on its way to the disk while the batch's last statements run against
//!   flushed before them. Blocks of the same run rotate the four (held,
//!   committed each, flushed first, journal off), a quarter each.
//! - `single_physical_us`: the same thermostat declared `hardware` (the
//!   simulated driver behind it): the durable start, then the receipt.
//! - `command_after_wait_us` (`SINGLE_CALLER_ONLY=after-wait`): the same
//!   setpoint on the memory store, back to back against right after a
//!   4 KiB flush, a 100 µs sleep or a 100 µs spin, blocks rotating: what
//!   Tether's own work costs once its thread has waited for a disk (the
//!   CPU's caches and the idle virtual CPU's wake-up), which a durable
//!   command always has.
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
    // `SINGLE_CALLER_ONLY=setpoint` (or another run's name) runs that one
    // alone: for a profile of one path.
    let only = std::env::var("SINGLE_CALLER_ONLY").ok();
    if only.as_deref().is_none_or(|o| o == AFTER_WAIT) {
        after_wait(dir.path(), commands);
        if only.is_some() {
            return;
        }
    }
    if let Some(o) = only
        .as_deref()
        .filter(|o| !RUNS.iter().any(|r| r.name == *o) && *o != AFTER_WAIT)
    {
        let mut names: Vec<&str> = RUNS.iter().map(|r| r.name).collect();
        names.push(AFTER_WAIT);
        panic!("SINGLE_CALLER_ONLY={o:?} names no run; one of {names:?}");
    }
    let flush_before = flush_p50_us(dir.path());
    let mut flush_sum = 0.0_f64;
    let mut runs = 0.0_f64;
    for &Run {
        name,
        figure,
        physical,
        inline,
        ab,
        flushes,
    } in &RUNS
    {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let r = run(dir.path(), name, physical, inline, ab, commands);
        flush_sum += r.flush_p50;
        runs += 1.0;
        println!(
            "FIGURE {figure} p50={:.1} p99={:.1} flush_p50={:.1} over_{flushes}_flushes={:.1} goal_over=20 command_mean={:.1} commit_mean_each={:.1} outside_commits_mean={:.1}",
            r.p50,
            r.p99,
            r.flush_p50,
            r.p50 - flushes * r.flush_p50,
            r.command_mean,
            r.commit_mean,
            r.command_mean - flushes * r.commit_mean
        );
    }
    let flush_after = flush_p50_us(dir.path());
    println!(
        "FIGURE flush_4k_us p50_before={flush_before:.1} p50_after={flush_after:.1} p50_interleaved={:.1}",
        flush_sum / runs.max(1.0)
    );
}

/// One path the bench times.
struct Run {
    /// What `SINGLE_CALLER_ONLY` names it by (and its state directory).
    name: &'static str,
    /// Its `FIGURE` line's name.
    figure: &'static str,
    /// The thermostat declared `hardware` (a durable start, then the receipt).
    physical: bool,
    /// A waiting commit applied on the caller's thread when the writer is idle.
    inline: bool,
    /// The store's journal on and off in turn, a block of commands each
    /// (an A/B in one run; the run's figure is the journal-on half).
    ab: bool,
    /// Flushes a command needs: its commits.
    flushes: f64,
}

const RUNS: [Run; 4] = [
    Run {
        name: "setpoint-thread",
        figure: "single_setpoint_thread_us",
        physical: false,
        inline: false,
        ab: false,
        flushes: 1.0,
    },
    Run {
        name: "setpoint",
        figure: "single_setpoint_us",
        physical: false,
        inline: true,
        ab: true,
        flushes: 1.0,
    },
    Run {
        name: "physical-thread",
        figure: "single_physical_thread_us",
        physical: true,
        inline: false,
        ab: false,
        flushes: 2.0,
    },
    Run {
        name: "physical",
        figure: "single_physical_us",
        physical: true,
        inline: true,
        ab: true,
        flushes: 2.0,
    },
];

/// One run's figures, µs: the commands' p50 and p99, and the p50 of the
/// flushes interleaved with them (the disk's flush swings from minute to
/// minute, so a figure "over a flush" takes the flush of the same minutes).
struct RunFigures {
    p50: f64,
    p99: f64,
    flush_p50: f64,
    /// Means over the run, µs: the whole command, and its commits as the
    /// kernel times them (`GET /metrics`' commit latency: from handing a
    /// commit to the store to its durable answer). The difference is
    /// Tether's own work around the store.
    command_mean: f64,
    commit_mean: f64,
}

/// Commands and probe flushes alternate in blocks of this many.
const BLOCK: usize = 100;

/// p50 of 2,000 4 KiB writes, each made durable by `fdatasync`, µs.
fn flush_p50_us(dir: &Path) -> f64 {
    let mut samples = Vec::with_capacity(2_000);
    Probe::open(dir).samples(2_000, &mut samples);
    percentiles(samples).0
}

/// A 4 KiB probe file in a run's directory, opened once per run and sized by
/// a first, untimed, durable write: every timed write then rewrites the
/// same block without growing the file (what `dd bs=4k oflag=dsync
/// conv=notrunc` measures on an existing file).
struct Probe {
    file: std::fs::File,
    path: std::path::PathBuf,
}

const PROBE_BLOCK: [u8; 4096] = [0x5a; 4096];

impl Probe {
    fn open(dir: &Path) -> Self {
        let path = dir.join("flush-probe");
        let mut file = std::fs::File::create(&path).expect("probe file");
        file.write_all(&PROBE_BLOCK).expect("write");
        file.sync_all().expect("fsync");
        Self { file, path }
    }

    /// `n` rewrites of the block, each made durable by `fdatasync`, ns each.
    fn samples(&mut self, n: usize, samples: &mut Vec<u128>) {
        for _ in 0..n {
            let t = Instant::now();
            self.file.seek(SeekFrom::Start(0)).expect("seek");
            self.file.write_all(&PROBE_BLOCK).expect("write");
            self.file.sync_data().expect("fdatasync");
            samples.push(t.elapsed().as_nanos());
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// `commands` setpoints one at a time on a fresh SQLite store in `dir`; the
/// thermostat declared `hardware` when `physical`; commits applied on the
/// caller's thread when `inline`; every [`BLOCK`] commands, as many probe
/// flushes, and (when `ab`) the store's journal turned on or off in turn.
fn run(
    dir: &Path,
    name: &str,
    physical: bool,
    inline: bool,
    ab: bool,
    commands: usize,
) -> RunFigures {
    let state = dir.join(name);
    std::fs::create_dir_all(&state).expect("state dir");
    let store = Arc::new(SqliteStore::open(&state).expect("store"));
    store.set_inline_commits(inline);
    let switch = Arc::clone(&store);
    let k = kernel(Arc::clone(&store), physical);
    let meters = k.clone();
    let rt = common::runtime();
    let p = Principal::local_agent();
    let session = common::open_session(&rt, &k, &p);
    let label = name.to_owned();
    let mut probe = Probe::open(&state);
    let (samples, samples_off, samples_serial, samples_each, flushes) = rt.block_on(async move {
        let caller = tokio::spawn(async move {
            let mut samples = Vec::with_capacity(commands);
            let mut samples_off = Vec::with_capacity(commands);
            let mut samples_serial = Vec::with_capacity(commands);
            let mut samples_each = Vec::with_capacity(commands);
            let mut flushes = Vec::with_capacity(commands);
            let (mut journal, mut early, mut hold) = (true, true, true);
            let mut out = Vec::with_capacity(4096);
            for n in 0..commands {
                if n % BLOCK == 0 {
                    // The probe blocks this worker, as the bench means it to:
                    // nothing else runs meanwhile.
                    probe.samples(BLOCK, &mut flushes);
                    // Blocks in turn when `ab`: held, committed each,
                    // record flushed first, journal off.
                    let turn = if ab { (n / BLOCK) % 4 } else { 0 };
                    (hold, early, journal) = (turn == 0, turn != 2, turn != 3);
                    switch.set_journal(journal);
                    switch.set_early_write(early);
                    switch.set_hold(hold);
                }
                let (answer, took) = timed_setpoint(&k, &p, &session, n, &mut out).await;
                if hold {
                    samples.push(took);
                } else if journal && early {
                    samples_each.push(took);
                } else if journal {
                    samples_serial.push(took);
                } else {
                    samples_off.push(took);
                }
                assert_eq!(answer.status(), Some("completed"), "{label}");
                assert!(!answer.not_durable(), "{label}");
            }
            (samples, samples_off, samples_serial, samples_each, flushes)
        });
        caller.await.expect("caller")
    });
    let stats = store.stats();
    let journal = store.journal_stats();
    println!(
        "# {name}: {} batches, {} of them on the caller's thread, {} commits of held records; journal: {} records, {} restarts, {} batches with SQLite's flush",
        stats.batches, stats.inline_batches, stats.settled, journal.records, journal.restarts, journal.flushed_batches
    );
    if ab {
        let (on50, on99) = percentiles(samples.clone());
        let (off50, off99) = percentiles(samples_off.clone());
        println!(
            "FIGURE {name}_journal_ab on_p50={on50:.1} off_p50={off50:.1} on_p99={on99:.1} off_p99={off99:.1} on_mean={:.1} off_mean={:.1} commands_each={}",
            mean_us(&samples),
            mean_us(&samples_off),
            samples_off.len()
        );
        let (each50, each99) = percentiles(samples_each.clone());
        println!(
            "FIGURE {name}_hold_ab held_p50={on50:.1} commit_each_p50={each50:.1} held_p99={on99:.1} commit_each_p99={each99:.1} held_mean={:.1} commit_each_mean={:.1} commands_each={}",
            mean_us(&samples),
            mean_us(&samples_each),
            samples_each.len()
        );
        let (ser50, ser99) = percentiles(samples_serial.clone());
        println!(
            "FIGURE {name}_early_write_ab on_p50={each50:.1} flush_first_p50={ser50:.1} on_p99={each99:.1} flush_first_p99={ser99:.1} on_mean={:.1} flush_first_mean={:.1} commands_each={}",
            mean_us(&samples_each),
            mean_us(&samples_serial),
            samples_serial.len()
        );
    }
    let command_mean = mean_us(&samples);
    let (p50, p99) = percentiles(samples);
    let commits = meters.meters().commit;
    RunFigures {
        p50,
        p99,
        flush_p50: percentiles(flushes).0,
        command_mean,
        commit_mean: commits.sum_us as f64 / commits.count.max(1) as f64,
    }
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

/// The mean of nanosecond samples, in µs.
fn mean_us(samples: &[u128]) -> f64 {
    samples.iter().sum::<u128>() as f64 / samples.len().max(1) as f64 / 1000.0
}

/// A run's `n`th setpoint, answered and written as text, and how long that
/// took, ns.
async fn timed_setpoint(
    k: &Kernel,
    p: &Principal,
    session: &str,
    n: usize,
    out: &mut Vec<u8>,
) -> (tether_kernel::Answer, u128) {
    let req = common::setpoint(session, 20.0 + (n % 50) as f64);
    let t = Instant::now();
    let answer = k
        .command(p, req, tether_kernel::CommandOptions::plain())
        .await
        .expect("command");
    out.clear();
    answer.write_json(out);
    (answer, t.elapsed().as_nanos())
}

/// `SINGLE_CALLER_ONLY`'s name for [`after_wait`].
const AFTER_WAIT: &str = "after-wait";

/// What one caller's whole command costs on the memory store (no disk on
/// its path) back to back, and right after its thread waited: for a 4 KiB
/// write and `fdatasync` (what a durable command waits for), a 100 µs
/// sleep, or a 100 µs spin that keeps the CPU busy. Blocks of 100 commands
/// rotate the four.
fn after_wait(dir: &Path, commands: usize) {
    const WAITS: [&str; 4] = ["back_to_back", "after_flush", "after_sleep", "after_spin"];
    let store: Arc<dyn tether_store::Store> = Arc::new(tether_store::MemoryStore::new());
    let sources = tether_drivers::builtin_cell();
    let cell = tether_kernel::loader::load(&sources, None).expect("cell");
    let drivers =
        tether_drivers::build_all(cell.devices.iter().map(|d| &d.manifest)).expect("drivers");
    let k = Kernel::new(KernelConfig::standard("single"), cell, drivers, store).expect("kernel");
    let rt = common::runtime();
    let p = Principal::local_agent();
    let session = common::open_session(&rt, &k, &p);
    let mut probe = Probe::open(dir);
    let samples = rt.block_on(async move {
        let caller = tokio::spawn(async move {
            let mut samples: [Vec<u128>; 4] = Default::default();
            let mut out = Vec::with_capacity(4096);
            let mut flushed = Vec::with_capacity(1);
            let pause = std::time::Duration::from_micros(100);
            for n in 0..commands {
                let wait = (n / BLOCK) % WAITS.len();
                // Each wait blocks this worker, as the bench means it to: the
                // command then starts on the thread that waited.
                match wait {
                    1 => {
                        flushed.clear();
                        probe.samples(1, &mut flushed);
                    }
                    2 => std::thread::sleep(pause),
                    3 => {
                        let t = Instant::now();
                        while t.elapsed() < pause {
                            std::hint::spin_loop();
                        }
                    }
                    _ => {}
                }
                let (answer, took) = timed_setpoint(&k, &p, &session, n, &mut out).await;
                samples[wait].push(took);
                assert_eq!(answer.status(), Some("completed"), "after-wait");
            }
            samples
        });
        caller.await.expect("caller")
    });
    let figures: Vec<String> = WAITS
        .iter()
        .zip(samples)
        .map(|(name, s)| {
            let (p50, p99) = percentiles(s);
            format!("{name}_p50={p50:.1} {name}_p99={p99:.1}")
        })
        .collect();
    println!("FIGURE command_after_wait_us {}", figures.join(" "));
}

/// (p50, p99) of nanosecond samples, in µs.
fn percentiles(mut samples: Vec<u128>) -> (f64, f64) {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q) as usize] as f64 / 1000.0;
    (at(0.50), at(0.99))
}
