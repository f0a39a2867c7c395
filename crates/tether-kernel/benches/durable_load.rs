//! Load benchmark: governed commands with durable evidence (SQLite, WAL, the
//! store's journal, group commit) from 64 concurrent callers in process, and
//! the e-stop latency measured while that load runs.
//!
//! Run: `cargo bench -p tether-kernel --bench durable_load` (optionally
//! `-- CALLERS COMMANDS_PER_CALLER`). Prints `FIGURE` lines for the docs. The
//! same load then runs on the in-memory store (no SQLite, no sync), and the
//! ratio of the two is printed: what the disk costs, measured in one run.
//! With `DURABLE_LOAD_PG=1` the same load also runs on the PostgreSQL store
//! (a throwaway local cluster, or the server `TETHER_TEST_PG_URL` names) and
//! its ratio to SQLite's figure of the same run is printed.
//! `DURABLE_LOAD_PG_ENDPOINTS=4` also runs four endpoints (kernels with a
//! store handle each) on one database at once and prints their sum.
//! `DURABLE_LOAD_INLINE=0` hands every SQLite commit to the writer thread
//! (no commit applied on a waiting caller's thread): to compare the two.
//! `DURABLE_LOAD_HOLD=0` commits every SQLite batch before its answers (no
//! transaction held open across batches): to compare the two.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;
#[path = "../../tether-store/tests/common/pg.rs"]
mod pg;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tether_kernel::{EstopRequest, Principal, ResetRequest};
use tether_store::{MemoryStore, SqliteStore, Store};

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let callers = args.first().copied().unwrap_or(64);
    let per_caller = args.get(1).copied().unwrap_or(1500);
    // DURABLE_LOAD_KEEP=1 leaves the state directory behind (its path is printed) to inspect.
    let dir = tempfile::tempdir().expect("tempdir");
    if std::env::var_os("DURABLE_LOAD_KEEP").is_some() {
        eprintln!("state directory kept: {}", dir.path().display());
    }
    // DURABLE_LOAD_MEMORY_ONLY=1 runs only the in-memory half (to profile the
    // kernel's own path).
    if std::env::var_os("DURABLE_LOAD_MEMORY_ONLY").is_some() {
        run_load(Arc::new(MemoryStore::new()), callers, per_caller).print("memory_load", callers);
        return;
    }
    let sqlite = Arc::new(SqliteStore::open(dir.path()).expect("store"));
    sqlite.set_inline_commits(std::env::var("DURABLE_LOAD_INLINE").as_deref() != Ok("0"));
    // DURABLE_LOAD_JOURNAL=0: every batch committed with SQLite's own flush
    // (the store's journal off), to compare the two.
    sqlite.set_journal(std::env::var("DURABLE_LOAD_JOURNAL").as_deref() != Ok("0"));
    // `DURABLE_LOAD_HOLD=0`: every batch commits before its answers instead of
    // holding its transaction open for the next (docs/STORE.md).
    sqlite.set_hold(std::env::var("DURABLE_LOAD_HOLD").as_deref() != Ok("0"));
    let durable = run_load(sqlite.clone(), callers, per_caller);
    let stats = sqlite.stats();
    let journal = sqlite.journal_stats();
    durable.print("durable_load", callers);
    println!(
        "FIGURE durable_load_batches batches={} commits={} commits_per_batch={:.1} largest_batch={} writer_idle_waits={} inline_batches={} journal_records={} journal_restarts={}",
        stats.batches,
        stats.commits,
        stats.commits as f64 / stats.batches.max(1) as f64,
        stats.largest_batch,
        stats.idle_waits,
        stats.inline_batches,
        journal.records,
        journal.restarts
    );
    drop(sqlite);
    if std::env::var_os("DURABLE_LOAD_PG").is_some() {
        let url = pg::migrated_database("durable_load");
        let store = Arc::new(tether_store::PgStore::open(&url).expect("PostgreSQL store"));
        let on_pg = run_load(store.clone(), callers, per_caller);
        let stats = store.stats();
        on_pg.print("durable_load_postgres", callers);
        println!(
            "FIGURE durable_load_postgres_batches batches={} commits_per_batch={:.1} largest_batch={} postgres_vs_sqlite={:.2}",
            stats.batches,
            stats.commits as f64 / stats.batches.max(1) as f64,
            stats.largest_batch,
            on_pg.per_second() / durable.per_second().max(f64::MIN_POSITIVE)
        );
    }
    // Last: its load must not sit in the cluster's WAL under the one-endpoint figure.
    if let Some(n) = std::env::var("DURABLE_LOAD_PG_ENDPOINTS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|n| (1..=16).contains(n))
    {
        fleet_load(n, callers, per_caller);
    }
    if std::env::var_os("DURABLE_LOAD_KEEP").is_some() {
        let _kept = dir.keep();
    }
    // DURABLE_LOAD_DURABLE_ONLY=1 skips the in-memory half (to profile the
    // durable path alone).
    if std::env::var_os("DURABLE_LOAD_DURABLE_ONLY").is_some() {
        return;
    }
    // The same load on the in-memory store, in the same run: the same
    // kernel, writer thread and hand-offs, no SQLite and no sync. The ratio
    // says how much of the ceiling the disk takes, on this machine, today.
    let memory = run_load(Arc::new(MemoryStore::new()), callers, per_caller);
    memory.print("memory_load", callers);
    println!(
        "FIGURE durable_vs_memory throughput_ratio={:.2} cpu_ratio={:.2}",
        durable.per_second() / memory.per_second().max(f64::MIN_POSITIVE),
        durable.cpu_us_per_command().unwrap_or(f64::NAN)
            / memory.cpu_us_per_command().unwrap_or(f64::NAN)
    );
}

/// What one load run measured.
struct Load {
    completed: u64,
    seconds: f64,
    cpu_seconds: Option<f64>,
    estop_ms: Vec<f64>,
}

impl Load {
    fn per_second(&self) -> f64 {
        self.completed as f64 / self.seconds
    }

    fn cpu_us_per_command(&self) -> Option<f64> {
        self.cpu_seconds
            .map(|c| c * 1e6 / self.completed.max(1) as f64)
    }

    fn print(&self, name: &str, callers: u64) {
        println!(
            "FIGURE {name} callers={callers} commands={} seconds={:.2} commands_per_s={:.0}",
            self.completed,
            self.seconds,
            self.per_second()
        );
        // CPU time per command is steadier than wall-clock throughput on a
        // shared machine: it tells whether a change made the path cheaper.
        if let (Some(cpu), Some(per)) = (self.cpu_seconds, self.cpu_us_per_command()) {
            println!(
                "FIGURE {name}_cpu cpu_seconds={cpu:.2} cpu_us_per_command={per:.1} cores_busy={:.2}",
                cpu / self.seconds
            );
        }
        let mut e = self.estop_ms.clone();
        e.sort_by(f64::total_cmp);
        if let (Some(mid), Some(max)) = (e.get(e.len() / 2), e.last()) {
            println!(
                "FIGURE {name}_estop_under_load_ms p50={mid:.2} max={max:.2} (n={})",
                e.len()
            );
        }
    }
}

/// `callers` tasks each send `per_caller` setpoint commands through a kernel
/// on the built-in cell and `store`; meanwhile 20 e-stops of `relay-1` are
/// timed.
/// `n` endpoints on one PostgreSQL database at once, each a kernel with its
/// own store handle (its own writer and connections, as a process would
/// have), `callers / n` callers each: the fleet's throughput together.
fn fleet_load(n: u64, callers: u64, per_caller: u64) {
    let url = pg::migrated_database("durable_load_fleet");
    let each = (callers / n).max(1);
    let started = Instant::now();
    let loads: Vec<Load> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|_| {
                let url = url.clone();
                scope.spawn(move || {
                    let store =
                        Arc::new(tether_store::PgStore::open(&url).expect("PostgreSQL store"));
                    run_load(store, each, per_caller)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("endpoint"))
            .collect()
    });
    let seconds = started.elapsed().as_secs_f64();
    let completed: u64 = loads.iter().map(|l| l.completed).sum();
    println!(
        "FIGURE durable_load_postgres_fleet endpoints={n} callers_each={each} commands={completed} seconds={seconds:.2} commands_per_s={:.0}",
        completed as f64 / seconds
    );
}

fn run_load(store: Arc<dyn Store>, callers: u64, per_caller: u64) -> Load {
    let k = common::kernel_on("load", store);
    let rt = common::runtime();
    let p = Principal::local_agent();
    let session = common::open_session(&rt, &k, &p);

    let started = Instant::now();
    let cpu_before = common::cpu::process_cpu_seconds();
    let (completed, estop_ms) = rt.block_on(async {
        let mut tasks = Vec::new();
        for c in 0..callers {
            let k = k.clone();
            let p = p.clone();
            let session = session.clone();
            tasks.push(tokio::spawn(async move {
                let mut ok = 0u64;
                for i in 0..per_caller {
                    let req = common::setpoint(&session, 20.0 + ((c + i) % 60) as f64);
                    // The surfaces' path: the receipt as canonical text.
                    let answer = k
                        .command(&p, req, tether_kernel::CommandOptions::plain())
                        .await;
                    if answer.is_ok_and(|a| a.status() == Some("completed")) {
                        ok += 1;
                    }
                }
                ok
            }));
        }
        // E-stops of relay-1 (not under load itself) while the load runs.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut estop_ms = Vec::new();
        for _ in 0..20 {
            let t = Instant::now();
            let r = k
                .estop(EstopRequest {
                    device_ids: vec!["relay-1".into()],
                    reason: "bench".into(),
                    ..EstopRequest::default()
                })
                .await;
            estop_ms.push(t.elapsed().as_secs_f64() * 1000.0);
            assert_eq!(r["status"], "completed");
            let _ = k
                .reset(
                    &p,
                    ResetRequest {
                        session_id: None,
                        device_id: "relay-1".into(),
                        reason: "bench".into(),
                    },
                )
                .await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap_or(0);
        }
        (total, estop_ms)
    });
    let seconds = started.elapsed().as_secs_f64();
    let cpu_seconds = common::cpu::process_cpu_seconds()
        .zip(cpu_before)
        .map(|(a, b)| a - b);
    drop(k);
    drop(rt);
    Load {
        completed,
        seconds,
        cpu_seconds,
        estop_ms,
    }
}
