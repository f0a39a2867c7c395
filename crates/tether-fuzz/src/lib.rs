//! # tether-fuzz — the fuzz targets (issue 21, "Fuzzing")
//!
//! One module per target. Each exposes `run(data: &[u8])`, which feeds the
//! bytes to a real entry point of Tether and **asserts the invariants** that
//! must hold whatever the bytes are — not only "no panic": a refused command
//! leaves no side effect, canonical text round-trips, an e-stop request (by
//! what it asks) always latches, a mutated export never verifies unless the
//! mutation is a no-op. A violated invariant is an `assert!` failure, which
//! the fuzzer reports as a crash with its input.
//!
//! The same functions serve two callers: the cargo-fuzz harness in `fuzz/`
//! (outside the workspace, one `fuzz_target!` per module) and the corpus
//! replay test (`tests/corpus.rs`), which runs every file of
//! `fuzz/corpus/<target>/` under `cargo test --workspace`.
//!
//! **Never belongs here:** any behaviour of Tether itself; a target only
//! drives public entry points and judges what they answer.
//!
//! **Depends on:** tether-core, tether-limits, tether-policy, tether-store,
//! tether-kernel, tether-drivers, tether-server. **Depended on by:** nothing.

pub mod canonical;
pub mod cell;
pub mod limits;
pub mod loader;
pub mod mcp;
pub mod policy;
pub mod rest;
pub mod rpc;
pub mod verify;

/// One target: it runs one input and asserts its invariants.
pub type Target = fn(&[u8]);

/// Every target, by the name its corpus directory and fuzz binary carry.
pub const TARGETS: &[(&str, Target)] = &[
    ("canonical", canonical::run),
    ("verify", verify::run),
    ("limits", limits::run),
    ("policy", policy::run),
    ("loader", loader::run),
    ("rpc", rpc::run),
    ("rest", rest::run),
    ("mcp", mcp::run),
];

/// The target named `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}
