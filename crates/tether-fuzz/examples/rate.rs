//! How fast a target runs its committed corpus, outside libFuzzer: every
//! file of `fuzz/corpus/<target>/` run `ROUNDS` times through the same
//! function the fuzzer calls, with the time of a kernel-driven target's
//! set-up (runtime, kernel, session) timed apart.
//!
//!   cargo run --release -p tether-fuzz --example rate -- rpc 20
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::path::PathBuf;
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "rpc".into());
    let rounds: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(10);
    let run = tether_fuzz::target(&name).expect("a known target");
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(&name);
    let mut inputs: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .expect("the corpus directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .map(|p| std::fs::read(p).expect("a corpus file"))
        .collect();
    inputs.sort();
    set_up(rounds);
    let t = Instant::now();
    for _ in 0..rounds {
        for data in &inputs {
            run(data);
        }
    }
    let n = rounds * inputs.len();
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{name}: {n} inputs in {secs:.2} s = {:.0} inputs/s ({:.0} us each)",
        n as f64 / secs,
        secs * 1e6 / n as f64
    );
}

/// The set-up every kernel-driven input pays, timed by part, after the
/// once-a-process compile of the cell (timed alone).
fn set_up(rounds: usize) {
    let t = Instant::now();
    drop(tether_fuzz::cell::kernel().expect("a kernel"));
    println!(
        "the first kernel (the cell compiled): {} us",
        t.elapsed().as_micros()
    );
    let (mut rt_us, mut k_us, mut s_us, mut drop_us) = (0u128, 0u128, 0u128, 0u128);
    for _ in 0..rounds {
        let t = Instant::now();
        let rt = tether_fuzz::cell::runtime().expect("a runtime");
        rt_us += t.elapsed().as_micros();
        rt.block_on(async {
            let t = Instant::now();
            let kernel = tether_fuzz::cell::kernel().expect("a kernel");
            k_us += t.elapsed().as_micros();
            let t = Instant::now();
            let _ = tether_fuzz::cell::open_session(&kernel).await;
            s_us += t.elapsed().as_micros();
            let t = Instant::now();
            drop(kernel);
            drop_us += t.elapsed().as_micros();
        });
    }
    let r = rounds as u128;
    println!(
        "set-up of each input, mean of {rounds}: runtime {} us, kernel {} us, session {} us, kernel dropped {} us",
        rt_us / r,
        k_us / r,
        s_us / r,
        drop_us / r
    );
}
