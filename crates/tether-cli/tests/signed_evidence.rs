//! Signed checkpoints with the real binary: `tether keys` makes and guards
//! the key (a key file others may read is refused, by `keys show` and by
//! `serve`); a served endpoint with a key signs checkpoints under load and at
//! SIGTERM, keeps the newest beside the store, and `tether audit verify`
//! checks them, a saved checkpoint and a slice from `export --since`;
//! without a key nothing is signed and `serve` says so.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

use common::{poll_until, tether, Run, Server, Transport};
use serde_json::{json, Value};
use std::ffi::OsStr;
use std::path::Path;
use std::time::Duration;

fn run(args: &[&OsStr]) -> Run {
    tether(args)
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// `tether keys ACTION --state-dir DIR [extra]`.
fn keys(action: &str, dir: &Path, extra: &[&str]) -> Run {
    let mut args = vec![os("keys"), os(action), os("--state-dir"), dir.as_os_str()];
    args.extend(extra.iter().map(|e| os(e)));
    run(&args)
}

/// The `public key:` and `key id:` lines of `keys init|show`.
fn key_of(r: &Run) -> (String, String) {
    assert_eq!(
        r.code,
        Some(0),
        "keys failed: {} {}",
        r.stdout_text(),
        r.stderr
    );
    let out = r.stdout_text();
    let field = |name: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name:?} in {out:?}"))
            .trim()
            .to_owned()
    };
    (field("public key:"), field("key id:"))
}

#[cfg(unix)]
fn mode_of(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).expect("meta").permissions().mode() & 0o777
}

#[cfg(unix)]
fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

#[cfg(unix)]
#[test]
fn keys_are_made_private_shown_again_rotated_and_refused_when_others_may_read_them() {
    let dir = tempfile::tempdir().expect("dir");
    let state = dir.path().join("state");
    let (public, id) = key_of(&keys("init", &state, &[]));
    assert!(
        public.starts_with("ed25519:") && public.len() == 8 + 64,
        "{public}"
    );
    assert_eq!(id.len(), 16, "{id}");
    let key_file = state.join("evidence-signing.key");
    assert_eq!(mode_of(&key_file), 0o600);
    assert_eq!(
        key_of(&keys("show", &state, &[])),
        (public.clone(), id.clone())
    );
    // A second init never replaces a key silently.
    let again = keys("init", &state, &[]);
    assert_eq!(again.code, Some(2), "{}", again.stderr);
    assert!(
        again.stderr.contains("already holds a signing key"),
        "{}",
        again.stderr
    );

    // Readable by others: refused by every command that loads it.
    set_mode(&key_file, 0o644);
    let shown = keys("show", &state, &[]);
    assert_eq!(shown.code, Some(2), "{}", shown.stdout_text());
    assert!(
        shown.stderr.contains("mode 0644") && shown.stderr.contains("refusing it"),
        "{}",
        shown.stderr
    );
    let served = run(&[
        os("serve"),
        os("--state-dir"),
        state.as_os_str(),
        os("--http"),
        os("127.0.0.1:0"),
    ]);
    assert_eq!(served.code, Some(2), "serve must refuse: {}", served.stderr);
    assert!(served.stderr.contains("mode 0644"), "{}", served.stderr);
    set_mode(&key_file, 0o600);

    // Rotation: a new key, the old public key kept.
    let (public2, id2) = key_of(&keys("rotate", &state, &[]));
    assert_ne!(id2, id);
    assert_eq!(mode_of(&key_file), 0o600);
    let all = keys("show", &state, &["--all"]);
    let listed = all.stdout_text();
    assert!(
        listed.contains(&public) && listed.contains(&public2),
        "{listed}"
    );
}

/// `[evidence]` with short periods, the built-in cell.
fn signing_config(dir: &Path) -> std::path::PathBuf {
    let cfg = dir.join("tether.toml");
    std::fs::write(
        &cfg,
        "builtin_cell = true\n[evidence]\ncheckpoint_every_entries = 40\ncheckpoint_every_ms = 200\n",
    )
    .expect("config");
    cfg
}

fn relay(sid: &str, id: &str, on: bool) -> Value {
    json!({"session_id": sid, "device_id": "relay-1", "capability_id": "cap.io.relay.v1",
        "command_id": id, "input": {"channel": 1, "on": on}})
}

fn export(args: &[&OsStr]) -> Vec<Value> {
    let r = run(args);
    assert_eq!(r.code, Some(0), "export failed: {}", r.stderr);
    String::from_utf8(r.stdout)
        .expect("utf8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

fn verify(args: &[&OsStr]) -> Run {
    let mut all = vec![os("audit"), os("verify")];
    all.extend_from_slice(args);
    run(&all)
}

fn assert_ok(r: &Run, what: &str) -> String {
    let out = r.stdout_text();
    assert_eq!(r.code, Some(0), "{what}: {out} {}", r.stderr);
    assert!(out.starts_with("ok"), "{what}: {out}");
    out
}

#[test]
fn a_served_endpoint_signs_under_load_and_at_shutdown_and_the_file_matches_the_chain() {
    let work = tempfile::tempdir().expect("dir");
    let state = work.path().join("state");
    let (public, _) = key_of(&keys("init", &state, &[]));
    let cfg = signing_config(work.path());
    let mut s = Server::start_with(
        Transport::Http,
        Some(&state),
        &[os("--config"), cfg.as_os_str()],
    );
    assert!(
        s.stderr_text().contains("evidence is signed"),
        "{}",
        s.stderr_text()
    );
    let checkpoint_file = state.join("evidence-checkpoint.json");

    // Load from four callers at once.
    std::thread::scope(|scope| {
        for t in 0..4 {
            let s = &s;
            scope.spawn(move || {
                let sid = s.session();
                // Callers on one relay bank may be refused as busy; every
                // answer is evidence all the same.
                for i in 0..40 {
                    let r = s.command(relay(&sid, &format!("load-{t}-{i}"), i % 2 == 0));
                    assert!(r["status"].is_string(), "{r}");
                }
            });
        }
    });
    poll_until(
        "a checkpoint beside the store",
        Duration::from_secs(30),
        || checkpoint_file.exists(),
    );
    let saved_mid = work.path().join("saved-mid.json");
    let shown = run(&[
        os("audit"),
        os("checkpoint"),
        os("--state-dir"),
        state.as_os_str(),
    ]);
    assert_eq!(shown.code, Some(0), "{}", shown.stderr);
    std::fs::write(&saved_mid, &shown.stdout).expect("save");
    // An export taken now, before more entries and the final checkpoint.
    let early = work.path().join("early.jsonl");
    let early_run = run(&[
        os("audit"),
        os("export"),
        os("--state-dir"),
        state.as_os_str(),
    ]);
    std::fs::write(&early, &early_run.stdout).expect("early");
    let sid = s.session();
    for i in 0..5 {
        s.command(relay(&sid, &format!("tail-{i}"), true));
    }

    let status = s.terminate().expect("exits on SIGTERM");
    assert!(status.success(), "{status:?}: {}", s.stderr_text());
    // A final checkpoint, or none needed: the periodic one may have signed
    // the head after the last command (the chain's checks below hold alike).
    let said = s.stderr_text();
    assert!(
        said.contains("signed the final checkpoint") || said.contains("the chain ends signed"),
        "{said}"
    );

    // The chain: several checkpoints, the last entry is the final one, and
    // the file beside the store is exactly it.
    let chain = export(&[
        os("audit"),
        os("export"),
        os("--state-dir"),
        state.as_os_str(),
    ]);
    let entries = &chain[..chain.len() - 1];
    let checkpoints: Vec<&Value> = entries
        .iter()
        .filter(|e| e["kind"] == "evidence.checkpoint")
        .collect();
    assert!(
        checkpoints.len() >= 3,
        "checkpoints under load: {}",
        checkpoints.len()
    );
    let last = entries.last().expect("entries");
    assert_eq!(last["kind"], "evidence.checkpoint", "{last}");
    let file: Value =
        serde_json::from_str(&std::fs::read_to_string(&checkpoint_file).expect("file"))
            .expect("json");
    assert_eq!(file["entry_seq"], last["seq"], "{file}");
    assert_eq!(file["entry_hash"], last["hash"], "{file}");
    assert_eq!(file["body"], last["body"], "{file}");
    let signed = &last["body"]["signed"];
    assert_eq!(
        signed["seq"].as_u64().expect("seq") + 1,
        last["seq"].as_u64().expect("seq")
    );
    assert_eq!(signed["endpoint_id"], "tether-local");

    // The store verifies with its own public keys, the tail signed.
    let out = assert_ok(
        &verify(&[
            os("--state-dir"),
            state.as_os_str(),
            os("--require-signed-tail"),
        ]),
        "store",
    );
    assert!(out.contains("unsigned tail: 0 entries"), "{out}");
    // With the key given, and the checkpoint saved mid-run still held.
    let out = assert_ok(
        &verify(&[
            os("--state-dir"),
            state.as_os_str(),
            os("--pubkey"),
            os(&public),
            os("--checkpoint"),
            saved_mid.as_os_str(),
        ]),
        "saved",
    );
    assert!(out.contains("saved checkpoint: held"), "{out}");
    // The export taken before the final checkpoint does not hold it: cut back.
    let cut = verify(&[
        os("--file"),
        early.as_os_str(),
        os("--pubkey"),
        os(&public),
        os("--checkpoint"),
        checkpoint_file.as_os_str(),
    ]);
    assert_eq!(cut.code, Some(1), "{}", cut.stdout_text());
    assert!(
        cut.stdout_text().contains("entries were cut from its end"),
        "{}",
        cut.stdout_text()
    );

    // A slice from the middle verifies alone, with the key only.
    let mid = checkpoints[checkpoints.len() / 2]["seq"]
        .as_u64()
        .expect("seq")
        + 3;
    let slice = work.path().join("slice.jsonl");
    let r = run(&[
        os("audit"),
        os("export"),
        os("--state-dir"),
        state.as_os_str(),
        os("--since"),
        os(&mid.to_string()),
    ]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    std::fs::write(&slice, &r.stdout).expect("slice");
    let out = assert_ok(
        &verify(&[os("--file"), slice.as_os_str(), os("--pubkey"), os(&public)]),
        "slice",
    );
    assert!(out.contains("slice: seq"), "{out}");
    let unkeyed = verify(&[os("--file"), slice.as_os_str()]);
    assert_eq!(unkeyed.code, Some(1), "{}", unkeyed.stdout_text());
}

#[test]
fn without_a_key_the_endpoint_says_evidence_is_unsigned_and_signs_nothing() {
    let work = tempfile::tempdir().expect("dir");
    let state = work.path().join("state");
    let mut s = Server::start(Transport::Http, Some(&state));
    assert!(
        s.stderr_text().contains("evidence is unsigned"),
        "{}",
        s.stderr_text()
    );
    let sid = s.session();
    let r = s.command(relay(&sid, "unsigned-1", true));
    assert_eq!(r["status"], "completed", "{r}");
    let status = s.terminate().expect("exits");
    assert!(status.success());
    assert!(!state.join("evidence-checkpoint.json").exists());
    let chain = export(&[
        os("audit"),
        os("export"),
        os("--state-dir"),
        state.as_os_str(),
    ]);
    assert!(chain.iter().all(|e| e["kind"] != "evidence.checkpoint"));
    let strict = verify(&[
        os("--state-dir"),
        state.as_os_str(),
        os("--require-signed-tail"),
    ]);
    assert_eq!(
        strict.code,
        Some(2),
        "no key to check with: {}",
        strict.stderr
    );
}
