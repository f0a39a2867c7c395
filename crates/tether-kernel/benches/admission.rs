//! Admission-path benchmarks on the built-in simulated thermostat.
//!
//! - `admission/preflight`: evaluation steps 2–11 (session, binding, latch,
//!   mode, structure, limits, schema bounds, budgets, interlocks) in process,
//!   no evidence, no dispatch.
//! - `command/memory_store`: the whole order including dispatch to the
//!   simulated driver and evidence queued to an in-memory store (no fsync).
//!   Printed beside it: the same through the store's writer thread, and with
//!   the driver call in a task of its own (`command_memory_spawned_call_us`).
//!
//! Besides criterion's estimates it prints p50/p99 from a plain timed loop,
//! because the targets are stated as percentiles. Run:
//! `cargo bench -p tether-kernel --bench admission`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

use criterion::{criterion_group, Criterion};
use serde_json::json;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::sync::Arc;
use std::time::Instant;
use tether_kernel::{
    Authorized, BoxFuture, CancelToken, CommandRequest, Driver, Kernel, KernelConfig, Principal,
    SessionOpen, Signal,
};
use tether_store::MemoryStore;

fn kernel() -> Kernel {
    kernel_on(Arc::new(MemoryStore::new()))
}

/// The built-in cell's kernel on `store`.
fn kernel_on(store: Arc<MemoryStore>) -> Kernel {
    let cell = tether_kernel::loader::load(&tether_drivers::builtin_cell(), None)
        .expect("builtin cell loads");
    let drivers =
        tether_drivers::build_all(cell.devices.iter().map(|d| &d.manifest)).expect("drivers");
    Kernel::new(KernelConfig::standard("bench"), cell, drivers, store).expect("kernel")
}

/// The same kernel with every driver call in a task of its own (as before
/// the kernel polled a prompt driver's call once inline): the spawn and its
/// two wake-ups, measured in the same run.
fn kernel_spawning() -> Kernel {
    let cell = tether_kernel::loader::load(&tether_drivers::builtin_cell(), None)
        .expect("builtin cell loads");
    let drivers = tether_drivers::build_all(cell.devices.iter().map(|d| &d.manifest))
        .expect("drivers")
        .into_iter()
        .map(|(id, d)| (id, Arc::new(Spawned(d)) as Arc<dyn Driver>))
        .collect();
    let store = Arc::new(MemoryStore::new());
    Kernel::new(KernelConfig::standard("bench"), cell, drivers, store).expect("kernel")
}

/// A driver whose calls never say they poll promptly.
struct Spawned(Arc<dyn Driver>);

impl Driver for Spawned {
    fn read(&self, call: &Authorized) -> Result<serde_json::Value, Signal> {
        self.0.read(call)
    }
    fn call(
        &self,
        call: Authorized,
        cancel: CancelToken,
    ) -> BoxFuture<'_, Result<serde_json::Value, Signal>> {
        self.0.call(call, cancel)
    }
    fn estop(&self, call: &Authorized) -> Result<(), Signal> {
        self.0.estop(call)
    }
}

/// p50/p99/p999 of 50,000 whole commands on `k`, printed as `name`.
fn whole_commands(rt: &tokio::runtime::Runtime, k: &Kernel, p: &Principal, name: &str) {
    let session = rt
        .block_on(k.session_open(p, SessionOpen::default()))
        .expect("session")["session_id"]
        .as_str()
        .expect("id")
        .to_owned();
    let mut samples = Vec::with_capacity(50_000);
    let mut out = Vec::with_capacity(4096);
    for n in 0..50_000u64 {
        let r = request(&session, 20.0 + (n % 50) as f64, None);
        let t = Instant::now();
        let answer = rt
            .block_on(k.command(p, r, tether_kernel::CommandOptions::plain()))
            .expect("command");
        // What a surface does with the answer: its text into the response
        // (parsing it back into a value is not on any surface's path).
        out.clear();
        answer.write_json(&mut out);
        samples.push(t.elapsed().as_nanos());
        assert_eq!(answer.status(), Some("completed"));
    }
    let (p50, p99, p999) = percentiles(samples);
    println!("FIGURE {name} p50={p50:.2} p99={p99:.2} p999={p999:.2}");
}

fn request(session: &str, t: f64, id: Option<String>) -> CommandRequest {
    CommandRequest {
        route: tether_kernel::Route::Command,
        session_id: Some(session.to_owned()),
        device_id: "thermostat-1".into(),
        capability_id: "cap.thermal.setpoint.v1".into(),
        resource: None,
        input: json!({"target_temperature": t}),
        command_id: id,
        deadline: None,
        expected_revision: None,
        safe_place_grant: None,
        permit_id: None,
    }
}

fn percentiles(mut samples: Vec<u128>) -> (f64, f64, f64) {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q) as usize] as f64 / 1000.0;
    (at(0.50), at(0.99), at(0.999))
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let k = kernel();
    let p = Principal::local_agent();
    let session = rt
        .block_on(k.session_open(&p, SessionOpen::default()))
        .expect("session")["session_id"]
        .as_str()
        .expect("id")
        .to_owned();
    let req = request(&session, 42.0, None);
    // What every await of a command moves and every spawn or `block_on`
    // copies: the size of the command's future.
    let fut = k.command(
        &p,
        request(&session, 42.0, None),
        tether_kernel::CommandOptions::plain(),
    );
    println!(
        "FIGURE command_future_bytes {}",
        std::mem::size_of_val(&fut)
    );
    drop(fut);

    // Percentiles first, from plain loops.
    let mut samples = Vec::with_capacity(200_000);
    for _ in 0..200_000 {
        let t = Instant::now();
        let r = k.preflight(&p, &req).expect("preflight");
        samples.push(t.elapsed().as_nanos());
        assert!(r.is_none());
    }
    let (p50, p99, p999) = percentiles(samples);
    println!("FIGURE admission_preflight_us p50={p50:.2} p99={p99:.2} p999={p999:.2}");

    // The same commands through the memory store's group-commit writer
    // thread (as the memory store committed before it applied inline): what
    // the two thread hand-offs of a commit cost, in one run.
    let with_writer = kernel_on(Arc::new(MemoryStore::with_writer()));
    whole_commands(&rt, &with_writer, &p, "command_memory_writer_thread_us");
    whole_commands(
        &rt,
        &kernel_spawning(),
        &p,
        "command_memory_spawned_call_us",
    );
    whole_commands(&rt, &k, &p, "command_memory_store_us");
    let mut n = 0u64;

    let mut g = c.benchmark_group("admission");
    g.bench_function("preflight", |b| b.iter(|| k.preflight(&p, &req)));
    g.finish();
    let mut g = c.benchmark_group("command");
    let mut out = Vec::with_capacity(4096);
    g.bench_function("memory_store", |b| {
        b.iter(|| {
            n += 1;
            let answer = rt
                .block_on(k.command(
                    &p,
                    request(&session, 20.0 + (n % 50) as f64, None),
                    tether_kernel::CommandOptions::plain(),
                ))
                .expect("command");
            out.clear();
            answer.write_json(&mut out);
            out.len()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
