//! `tether store copy --from DIR --to URL` with the real binary: a SQLite
//! state directory filled by a real `tether serve` (commands, budget draws,
//! a latch), copied into a throwaway PostgreSQL cluster (tether-store's
//! `tests/common/pg.rs`); the chain arrives byte for byte and verifies, an
//! endpoint on the copy replays an old command id identically and starts
//! latched, a copy is refused while an endpoint has the directory open, and
//! a second copy into the same database is refused.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;
#[path = "../../tether-store/tests/common/pg.rs"]
mod pg;

use common::{tether, Server, Transport};
use serde_json::json;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

const THERMOSTAT: &str = "thermostat-1";
const RELAY: &str = "relay-1";
const TABLES: [&str; 8] = [
    "events",
    "receipts",
    "revisions",
    "latches",
    "budget",
    "open_ops",
    "approvals",
    "invocations",
];

/// A config serving the thermostat (with a budget on its setpoints, so the
/// journal has rows) and the relay.
fn write_config(dir: &Path) -> PathBuf {
    std::fs::write(
        dir.join("thermostat-1.toml"),
        include_str!("../../tether-drivers/cell/thermostat-1.toml"),
    )
    .expect("manifest");
    std::fs::write(
        dir.join("relay-1.toml"),
        include_str!("../../tether-drivers/cell/relay-1.toml"),
    )
    .expect("manifest");
    let overlay = json!({THERMOSTAT: {"cap.thermal.setpoint.v1": {"target_temperature": {"max": 500.0, "per": "rolling_1h", "unit": "degC", "source": "operator", "reason": "site heating budget"}}}});
    std::fs::write(dir.join("site-limits.json"), overlay.to_string()).expect("overlay");
    let path = dir.join("tether.toml");
    std::fs::write(
        &path,
        // Checkpoints signed often, so the chain holds some to copy.
        "devices = [\"thermostat-1.toml\", \"relay-1.toml\"]\noverlay = \"site-limits.json\"\n[evidence]\ncheckpoint_every_entries = 2\ncheckpoint_every_ms = 50\n",
    )
    .expect("config");
    path
}

fn serve(state: &Path, cfg: &Path, store: Option<&str>) -> Server {
    let mut args = vec![OsStr::new("--config"), cfg.as_os_str()];
    if let Some(url) = store {
        args.push(OsStr::new("--store"));
        args.push(OsStr::new(url));
    }
    Server::start_with(Transport::Http, Some(state), &args)
}

fn sqlite_count(db: &Path, table: &str) -> u64 {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .expect("open the source");
    conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| {
        r.get::<_, i64>(0)
    })
    .map(|n| n as u64)
    .expect("count")
}

/// The SHA-256 of the source's entries (text and hash, in seq order).
fn sqlite_chain_digest(db: &Path) -> String {
    use sha2::Digest;
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .expect("open the source");
    let mut stmt = conn
        .prepare("SELECT seq, hash, line FROM events ORDER BY seq")
        .expect("prepare");
    let mut rows = stmt.query([]).expect("query");
    let mut all = String::new();
    while let Some(r) = rows.next().expect("row") {
        let (seq, hash, line): (i64, String, String) =
            (r.get(0).unwrap(), r.get(1).unwrap(), r.get(2).unwrap());
        all.push_str(&format!("{seq} {hash} {line}\n"));
    }
    hex::encode(sha2::Sha256::digest(all.as_bytes()))
}

const PG_CHAIN_DIGEST: &str = "SELECT encode(sha256(convert_to(string_agg(seq::text || ' ' || hash || ' ' || line || E'\\n', '' ORDER BY seq), 'UTF8')), 'hex') FROM events";

#[test]
fn a_sqlite_state_directory_copied_into_postgres_keeps_its_chain_and_replays() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path());
    let state = dir.path().join("state");
    let db = state.join(tether_store::DB_FILE_NAME);

    // A signing key: the endpoint signs checkpoints into the chain.
    let keys = tether(&[
        "keys".as_ref(),
        "init".as_ref(),
        "--state-dir".as_ref(),
        state.as_os_str(),
    ]);
    assert_eq!(keys.code, Some(0), "{}", keys.stderr);
    let public = keys
        .stdout_text()
        .lines()
        .find_map(|l| l.strip_prefix("public key:").map(|k| k.trim().to_owned()))
        .expect("public key");

    // Fill the embedded store through a real endpoint.
    let mut first = serve(&state, &cfg, None);
    let sid = first.session();
    let relay = first.command(json!({"session_id": sid, "device_id": RELAY, "capability_id": "cap.io.relay.v1", "command_id": "copy-relay-1", "input": {"channel": 1, "on": true}}));
    assert_eq!(relay["status"], "completed", "{relay}");
    for (i, t) in [18.0, 19.5, 21.0].into_iter().enumerate() {
        let r = first.command(json!({"session_id": sid, "device_id": THERMOSTAT, "capability_id": "cap.thermal.setpoint.v1", "command_id": format!("copy-set-{i}"), "input": {"target_temperature": t}}));
        assert_eq!(r["status"], "completed", "{r}");
    }
    let saved = state.join("evidence-checkpoint.json");
    common::poll_until("a signed checkpoint", common::TIMEOUT, || saved.exists());
    let url = pg::migrated_database("copy");

    // While the endpoint has the directory open, the copy is refused and
    // the target stays empty.
    let busy = tether(&[
        "store".as_ref(),
        "copy".as_ref(),
        "--from".as_ref(),
        state.as_os_str(),
        "--to".as_ref(),
        url.as_str().as_ref(),
    ]);
    assert_eq!(busy.code, Some(2), "{}", busy.stderr);
    assert!(
        busy.stderr.contains("in use by process") && busy.stderr.contains("nothing was copied"),
        "{}",
        busy.stderr
    );
    assert_eq!(pg::psql_on(&url, "SELECT count(*) FROM events"), "0");
    first.kill();

    // A latch in the source, tripped from a shell with no endpoint running.
    let stop = tether(&[
        "estop".as_ref(),
        "--state-dir".as_ref(),
        state.as_os_str(),
        "--device".as_ref(),
        RELAY.as_ref(),
        "--reason".as_ref(),
        "before the copy".as_ref(),
    ]);
    assert_eq!(stop.code, Some(0), "{}", stop.stderr);

    let counts: Vec<u64> = TABLES.iter().map(|t| sqlite_count(&db, t)).collect();
    assert!(
        counts[0] > 0 && counts[1] >= 4 && counts[3] >= 1 && counts[4] == 3,
        "{counts:?}"
    );
    let digest = sqlite_chain_digest(&db);

    let copy = tether(&[
        "store".as_ref(),
        "copy".as_ref(),
        "--from".as_ref(),
        state.as_os_str(),
        "--to".as_ref(),
        url.as_str().as_ref(),
    ]);
    assert_eq!(copy.code, Some(0), "{} {}", copy.stdout_text(), copy.stderr);
    let said = copy.stdout_text();
    assert!(
        said.contains(&format!("{} chain entries", counts[0]))
            && said.contains(&format!("{} receipts", counts[1]))
            && said.contains("3 budget rows")
            && said.contains("verified"),
        "{said}"
    );

    // Every table holds what the source held; the chain byte for byte.
    for (table, want) in TABLES.iter().zip(&counts) {
        let have = pg::psql_on(&url, &format!("SELECT count(*) FROM {table}"));
        assert_eq!(have, want.to_string(), "{table}");
    }
    assert_eq!(pg::psql_on(&url, PG_CHAIN_DIGEST), digest);
    assert_eq!(
        pg::psql_on(&url, "SELECT seq FROM chain_head"),
        counts[0].to_string()
    );
    // The source is left as it was.
    assert_eq!(sqlite_chain_digest(&db), digest);

    let verify = tether(&["audit", "verify", "--store", &url]);
    assert_eq!(
        verify.code,
        Some(0),
        "{} {}",
        verify.stdout_text(),
        verify.stderr
    );
    assert!(
        verify.stdout_text().starts_with("ok"),
        "{}",
        verify.stdout_text()
    );
    // The signed checkpoints came along: they verify with the key, and the
    // checkpoint saved beside the SQLite store is held by the copy.
    let signed: u64 = pg::psql_on(
        &url,
        "SELECT count(*) FROM events WHERE line LIKE '%\"kind\":\"evidence.checkpoint\"%'",
    )
    .parse()
    .expect("count");
    assert!(signed > 0, "no checkpoint entries were copied");
    // (`audit verify --pubkey` reads an export of a PostgreSQL store.)
    let export = tether(&["audit", "export", "--store", &url]);
    assert_eq!(export.code, Some(0), "{}", export.stderr);
    let exported = dir.path().join("copy.jsonl");
    std::fs::write(&exported, &export.stdout).expect("export file");
    let verify = tether(&[
        "audit".as_ref(),
        "verify".as_ref(),
        "--file".as_ref(),
        exported.as_os_str(),
        "--pubkey".as_ref(),
        public.as_str().as_ref(),
        "--checkpoint".as_ref(),
        saved.as_os_str(),
    ]);
    assert_eq!(
        verify.code,
        Some(0),
        "{} {}",
        verify.stdout_text(),
        verify.stderr
    );
    assert!(
        verify.stdout_text().contains("saved checkpoint: held"),
        "{}",
        verify.stdout_text()
    );

    // An endpoint on the copy (a fresh state directory: nothing local)
    // replays an old command id with the same receipt, and holds the latch.
    let fresh = tempfile::tempdir().expect("tempdir");
    let second = serve(fresh.path(), &cfg, Some(&url));
    let sid2 = second.session();
    let replay = second.command(json!({"session_id": sid2, "device_id": RELAY, "capability_id": "cap.io.relay.v1", "command_id": "copy-relay-1", "input": {"channel": 1, "on": true}}));
    assert_eq!(replay["replayed"], true, "{replay}");
    assert_eq!(replay["receipt_id"], relay["receipt_id"], "{replay}");
    assert_eq!(second.status_of(RELAY)["latched"], true);
    // A new command on the copy extends the copied chain.
    let more = second.command(json!({"session_id": sid2, "device_id": THERMOSTAT, "capability_id": "cap.thermal.setpoint.v1", "command_id": "after-copy", "input": {"target_temperature": 20.0}}));
    assert_eq!(more["status"], "completed", "{more}");
    drop(second);
    let verify = tether(&["audit", "verify", "--store", &url]);
    assert_eq!(
        verify.code,
        Some(0),
        "{} {}",
        verify.stdout_text(),
        verify.stderr
    );

    // A second copy into a database that holds a chain is refused, and
    // changes nothing there.
    let before = pg::psql_on(&url, PG_CHAIN_DIGEST);
    let again = tether(&[
        "store".as_ref(),
        "copy".as_ref(),
        "--from".as_ref(),
        state.as_os_str(),
        "--to".as_ref(),
        url.as_str().as_ref(),
    ]);
    assert_eq!(again.code, Some(2), "{}", again.stderr);
    assert!(
        again.stderr.contains("already holds state")
            && again.stderr.contains("never merges two chains"),
        "{}",
        again.stderr
    );
    assert_eq!(pg::psql_on(&url, PG_CHAIN_DIGEST), before);

    // A target without the schema is refused with what to do.
    let bare = pg::fresh_database("copy_bare");
    let unmigrated = tether(&[
        "store".as_ref(),
        "copy".as_ref(),
        "--from".as_ref(),
        state.as_os_str(),
        "--to".as_ref(),
        bare.as_str().as_ref(),
    ]);
    assert_eq!(unmigrated.code, Some(2), "{}", unmigrated.stderr);
    assert!(
        unmigrated.stderr.contains("tether store migrate"),
        "{}",
        unmigrated.stderr
    );
}
