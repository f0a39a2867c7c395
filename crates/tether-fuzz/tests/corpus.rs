//! The committed seed corpora (`fuzz/corpus/<target>/`) replayed as ordinary
//! tests: every file of a target's corpus is run through the same target
//! function the fuzzer runs, invariants and all, so `cargo test --workspace`
//! (what CI runs) fails on any input that once crashed a target and is kept
//! there as a regression.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

/// Fewest files a corpus may hold: a corpus that lost its files (a wrong
/// path, a bad checkout) must fail, not pass over nothing.
const CORPUS_FILES_MIN: usize = 10;

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

fn replay(target: &str) {
    let run = tether_fuzz::target(target).expect("a known target");
    let dir = corpus_dir(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(
        files.len() >= CORPUS_FILES_MIN,
        "{}: {} files, expected at least {CORPUS_FILES_MIN}",
        dir.display(),
        files.len()
    );
    let mut failed = Vec::new();
    for f in &files {
        let data = std::fs::read(f).expect("a corpus file");
        if std::panic::catch_unwind(|| run(&data)).is_err() {
            failed.push(f.display().to_string());
        }
    }
    assert!(
        failed.is_empty(),
        "target `{target}` failed on {} of {} corpus files:\n  {}",
        failed.len(),
        files.len(),
        failed.join("\n  ")
    );
}

#[test]
fn the_canonical_corpus_replays() {
    replay("canonical");
}

#[test]
fn the_verify_corpus_replays() {
    replay("verify");
}

#[test]
fn the_limits_corpus_replays() {
    replay("limits");
}

#[test]
fn the_policy_corpus_replays() {
    replay("policy");
}

#[test]
fn the_loader_corpus_replays() {
    replay("loader");
}

#[test]
fn the_rpc_corpus_replays() {
    replay("rpc");
}

#[test]
fn the_rest_corpus_replays() {
    replay("rest");
}

#[test]
fn the_mcp_corpus_replays() {
    replay("mcp");
}

#[test]
fn every_target_has_a_corpus_and_a_fuzz_binary() {
    let fuzz = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let manifest = std::fs::read_to_string(fuzz.join("Cargo.toml")).expect("fuzz/Cargo.toml");
    for (name, _) in tether_fuzz::TARGETS {
        assert!(corpus_dir(name).is_dir(), "no corpus for `{name}`");
        assert!(
            fuzz.join("fuzz_targets")
                .join(format!("{name}.rs"))
                .is_file(),
            "no fuzz_targets/{name}.rs"
        );
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "fuzz/Cargo.toml has no [[bin]] `{name}`"
        );
    }
}

/// The observations the invariants judge on can tell a change: a command
/// that ran moves a revision, an e-stop sets a latch. (Were they blind, the
/// "no side effect" and "always latches" invariants could never fail.)
#[test]
fn the_observations_see_a_command_run_and_an_estop_latch() {
    use serde_json::json;
    use tether_fuzz::cell;
    let rt = cell::runtime().expect("runtime");
    rt.block_on(async {
        let kernel = cell::kernel().expect("kernel");
        let s = cell::open_session(&kernel).await.expect("session");
        let before = cell::snapshot(&kernel).await;
        assert!(before.revisions.len() >= 3, "{before:?}");
        assert!(before.revisions.iter().all(|(_, _, r)| r.is_some()), "{before:?}");
        let p = tether_kernel::Principal::local_agent();
        let set = json!({"jsonrpc":"2.0","id":1,"method":"mhs.command","params":{"session_id":s,"command_id":"obs-1","device_id":"thermostat-1","capability_id":"cap.thermal.setpoint.v1","input":{"target_temperature":30}}});
        let r = tether_server::rpc::handle_text(&kernel, &p, set.to_string().as_bytes()).await;
        let answer = String::from_utf8_lossy(&r.expect("an answer").to_bytes()).into_owned();
        eprintln!("ANSWER {answer}\nBEFORE {before:?}");
        let after = cell::snapshot(&kernel).await;
        assert_ne!(before.revisions, after.revisions);
        assert!(cell::stored(&kernel, Some("obs-1")).is_some());
        assert!(!cell::latched(&kernel, "relay-1"));
        let stop = json!({"jsonrpc":"2.0","id":2,"method":"mhs.safety.estop","params":{"device_id":"relay-1"}});
        tether_server::rpc::handle_text(&kernel, &p, stop.to_string().as_bytes()).await;
        assert!(cell::latched(&kernel, "relay-1"));
    });
}
