//! The real `tether` on a real PostgreSQL store (a throwaway cluster the
//! test starts, see tether-store's `tests/common/pg.rs`): `store migrate`,
//! `serve --store URL` taking commands on the built-in cell, a restart that
//! replays a `command_id` from the database, the rows as PostgreSQL holds
//! them, `estop` and `audit verify|export --store URL`, and an endpoint that
//! refuses to start on a schema version it does not know.
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

const RELAY: &str = "relay-1";

fn serve_on(url: &str, dir: &std::path::Path) -> Server {
    Server::start_with(
        Transport::Http,
        Some(dir),
        &[OsStr::new("--store"), OsStr::new(url)],
    )
}

#[test]
fn serve_on_postgres_replays_a_command_id_after_a_restart_and_verifies() {
    let url = pg::fresh_database("serve");
    // An endpoint refuses a database without the schema, saying what to do.
    let dir = tempfile::tempdir().expect("tempdir");
    let refused = tether(&[
        "serve".as_ref(),
        "--store".as_ref(),
        url.as_str().as_ref(),
        "--state-dir".as_ref(),
        dir.path().as_os_str(),
        "--http".as_ref(),
        "127.0.0.1:0".as_ref(),
    ]);
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("tether store migrate"),
        "{}",
        refused.stderr
    );

    let migrate = tether(&["store", "migrate", "--store", &url]);
    assert_eq!(migrate.code, Some(0), "{}", migrate.stderr);
    assert!(
        migrate.stdout_text().contains("created"),
        "{}",
        migrate.stdout_text()
    );

    let mut first = serve_on(&url, dir.path());
    let sid = first.session();
    let cmd = json!({"session_id": sid, "device_id": RELAY, "capability_id": "cap.io.relay.v1", "command_id": "pg-e2e-1", "input": {"channel": 2, "on": true}});
    let done = first.command(cmd);
    assert_eq!(done["status"], "completed", "{done}");
    first.kill();

    // The receipt's row is in PostgreSQL, its entry in the chain.
    let n = pg::psql_on(
        &url,
        "SELECT count(*) FROM receipts r JOIN events e ON e.seq = r.seq WHERE r.command_id = 'pg-e2e-1'",
    );
    assert_eq!(n, "1");

    // A second endpoint process (a fresh state directory: nothing local)
    // replays the id from the database instead of running it again.
    let dir2 = tempfile::tempdir().expect("tempdir");
    let mut second = serve_on(&url, dir2.path());
    let sid2 = second.session();
    let replay = second.command(json!({"session_id": sid2, "device_id": RELAY, "capability_id": "cap.io.relay.v1", "command_id": "pg-e2e-1", "input": {"channel": 2, "on": true}}));
    assert_eq!(replay["replayed"], true, "{replay}");
    assert_eq!(replay["receipt_id"], done["receipt_id"], "{replay}");
    second.kill();

    // The governed stop from a shell, into the same store.
    let stop = tether(&[
        "estop", "--store", &url, "--device", RELAY, "--reason", "test",
    ]);
    assert_eq!(stop.code, Some(0), "{}", stop.stderr);
    let latched = pg::psql_on(
        &url,
        &format!("SELECT latched FROM latches WHERE device_id = '{RELAY}'"),
    );
    assert_eq!(latched, "t");

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
    let export = tether(&["audit", "export", "--store", &url]);
    assert_eq!(export.code, Some(0), "{}", export.stderr);
    let lines = export.stdout_text().lines().count() as u64;
    let entries = pg::psql_on(&url, "SELECT count(*) FROM events");
    assert_eq!(
        lines,
        entries.parse::<u64>().expect("count") + 1,
        "entries and the seal"
    );

    // A schema version this build does not know: refused, naming both.
    pg::psql_on(
        &url,
        "INSERT INTO schema_version(version, applied_ms) VALUES (42, 0)",
    );
    let refused = tether(&[
        "serve".as_ref(),
        "--store".as_ref(),
        url.as_str().as_ref(),
        "--state-dir".as_ref(),
        dir.path().as_os_str(),
        "--http".as_ref(),
        "127.0.0.1:0".as_ref(),
    ]);
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("version 42")
            && refused
                .stderr
                .contains(&format!("version {}", tether_store::PG_SCHEMA_VERSION)),
        "{}",
        refused.stderr
    );
}

#[test]
fn a_password_on_the_command_line_is_refused() {
    let run = tether(&[
        "audit",
        "verify",
        "--store",
        "postgres://u:secret@127.0.0.1:1/db",
    ]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("PGPASSWORD"), "{}", run.stderr);
}

/// The role SQL of docs/STORE.md ("The role an endpoint needs"), for the
/// database `db`, with `endpoint` and `auditor` as the role names.
fn documented_role_sql(db: &str, endpoint: &str, auditor: &str) -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/STORE.md"))
        .expect("docs/STORE.md");
    let section = doc
        .split("## The role an endpoint needs")
        .nth(1)
        .expect("the role section");
    let sql = section
        .split("```sql")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("the role SQL");
    sql.replace("tether_endpoint", endpoint)
        .replace("tether_auditor", auditor)
        .replace("DATABASE tether ", &format!("DATABASE {db} "))
}

#[test]
fn an_endpoint_serves_with_the_documented_role_which_cannot_rewrite_the_chain() {
    let url = pg::migrated_database("roles");
    let (server, db) = url.rsplit_once('/').expect("db");
    let endpoint = format!("ep_{db}");
    let auditor = format!("au_{db}");
    pg::psql_on(&url, &documented_role_sql(db, &endpoint, &auditor));
    let as_endpoint = server.replacen(
        "postgres://postgres@",
        &format!("postgres://{endpoint}@"),
        1,
    );
    let as_endpoint = format!("{as_endpoint}/{db}");

    // The endpoint, with only the documented rights, takes commands and
    // e-stops; another process replays from it.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut first = serve_on(&as_endpoint, dir.path());
    let sid = first.session();
    let done = first.command(json!({"session_id": sid, "device_id": RELAY, "capability_id": "cap.io.relay.v1", "command_id": "role-1", "input": {"channel": 1, "on": true}}));
    assert_eq!(done["status"], "completed", "{done}");
    first.kill();
    let stop = tether(&[
        "estop",
        "--store",
        &as_endpoint,
        "--device",
        RELAY,
        "--reason",
        "role test",
    ]);
    assert_eq!(stop.code, Some(0), "{}", stop.stderr);
    let verify = tether(&["audit", "verify", "--store", &as_endpoint]);
    assert_eq!(verify.code, Some(0), "{}", verify.stdout_text());

    // What it may not do: rewrite or remove entries, receipts or the head,
    // or change the schema.
    for sql in [
        "DELETE FROM events",
        "UPDATE events SET line = line",
        "DELETE FROM receipts",
        "UPDATE receipts SET input_digest = ''",
        "TRUNCATE events",
        "DELETE FROM chain_head",
        "DROP TABLE events",
        "ALTER TABLE events ADD COLUMN x int",
        "CREATE TABLE intruder(x int)",
    ] {
        let e = pg::psql_refused(&as_endpoint, sql);
        assert!(
            e.contains("permission denied") || e.contains("must be owner"),
            "{sql}: {e}"
        );
    }
    // The auditor reads and verifies, and writes nothing.
    let as_auditor = format!(
        "{}/{db}",
        server.replacen("postgres://postgres@", &format!("postgres://{auditor}@"), 1)
    );
    let verify = tether(&["audit", "verify", "--store", &as_auditor]);
    assert_eq!(verify.code, Some(0), "{}", verify.stdout_text());
    let e = pg::psql_refused(&as_auditor, "INSERT INTO latches VALUES ('x', true, '{}')");
    assert!(e.contains("permission denied"), "{e}");
    assert_eq!(
        pg::psql_on(
            &url,
            "SELECT count(*) FROM receipts WHERE command_id = 'role-1'"
        ),
        "1"
    );
}
