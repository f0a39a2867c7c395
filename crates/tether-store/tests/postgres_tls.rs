//! TLS to PostgreSQL: a throwaway cluster of its own with `ssl=on` and a
//! server certificate signed by a CA the test makes (rcgen, ring), reached
//! with the `sslmode` / `sslrootcert` of the store URL. `verify-full`
//! succeeds with the right CA and host name and fails, saying which check
//! refused, with a wrong CA or host; `verify-ca` ignores the name;
//! `require` encrypts without a root; `require` to a server without TLS is
//! refused rather than run in clear. The server's own view
//! (`pg_stat_ssl`) shows Tether's sessions encrypted.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/pg.rs"]
mod pg;

use std::sync::OnceLock;
use tether_store::{PgStore, StoreError};

/// A CA and the server certificate it signed for `db.test`, PEM.
struct Pki {
    ca: String,
    cert: String,
    key: String,
}

fn make_pki(ca_name: &str, server_name: &str) -> Pki {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, ca_name);
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let mut params = rcgen::CertificateParams::new(vec![server_name.to_owned()]).unwrap();
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca).unwrap();
    Pki {
        ca: ca.pem(),
        cert: cert.pem(),
        key: key.serialize_pem(),
    }
}

struct Tls {
    /// `postgres://postgres@127.0.0.1:PORT`.
    admin: String,
    port: u16,
    dir: tempfile::TempDir,
}

/// The TLS cluster every test of this binary shares, with `ca.pem` (the
/// right CA) and `wrong-ca.pem` (another) in a directory of their own.
fn tls() -> &'static Tls {
    static TLS: OnceLock<Tls> = OnceLock::new();
    TLS.get_or_init(|| {
        let pki = make_pki("tether test CA", "db.test");
        let other = make_pki("some other CA", "db.test");
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("ca.pem"), &pki.ca).unwrap();
        std::fs::write(dir.path().join("wrong-ca.pem"), &other.ca).unwrap();
        let admin = pg::start_tls_cluster(&pki.cert, &pki.key);
        let port = admin
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("port");
        Tls { admin, port, dir }
    })
}

/// A migrated database on the TLS cluster, and the URL for it as `host`
/// with `query` (the connection itself goes to 127.0.0.1: `hostaddr`).
fn url_for(db: &str, host: &str, query: &str) -> String {
    let t = tls();
    format!(
        "postgres://postgres@{host}:{}/{db}?hostaddr=127.0.0.1&{query}",
        t.port
    )
}

fn root(name: &str) -> String {
    tls().dir.path().join(name).display().to_string()
}

fn fresh_db(hint: &str) -> String {
    let url = pg::fresh_database_on(&tls().admin, hint);
    url.rsplit('/').next().expect("db name").to_owned()
}

/// How many of the server's sessions named `tether` use TLS, and how many
/// do not.
fn tether_sessions(db: &str) -> (String, String) {
    let q = |ssl: bool| {
        pg::psql_on(
            &format!("{}/postgres", tls().admin),
            &format!(
                "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
                 WHERE a.application_name = 'tether' AND a.datname = '{db}' AND s.ssl = {ssl}"
            ),
        )
    };
    (q(true), q(false))
}

fn refusal(r: Result<PgStore, StoreError>) -> String {
    match r {
        Ok(_) => panic!("the store opened"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn verify_full_with_the_right_ca_and_host_encrypts_and_serves() {
    let db = fresh_db("tls_full");
    let url = url_for(
        &db,
        "db.test",
        &format!("sslmode=verify-full&sslrootcert={}", root("ca.pem")),
    );
    PgStore::migrate(&url).expect("migrate over verify-full");
    let store = PgStore::open(&url).expect("open over verify-full");
    // The writer's and the reader's sessions, both encrypted.
    let (encrypted, clear) = tether_sessions(&db);
    assert!(
        encrypted.parse::<u32>().unwrap() >= 2 && clear == "0",
        "{encrypted} {clear}"
    );
    let report = tether_store::postgres::verify_url(&url).expect("verify");
    assert!(report.ok);
    drop(store);
}

#[test]
fn verify_full_refuses_a_wrong_ca_or_a_wrong_host_saying_which() {
    let db = fresh_db("tls_refused");
    let wrong_ca = url_for(
        &db,
        "db.test",
        &format!("sslmode=verify-full&sslrootcert={}", root("wrong-ca.pem")),
    );
    let e = refusal(PgStore::open(&wrong_ca));
    assert!(
        e.contains("invalid peer certificate")
            && e.contains("UnknownIssuer")
            && e.contains("sslmode=verify-full")
            && e.contains("wrong-ca.pem"),
        "{e}"
    );
    let wrong_host = url_for(
        &db,
        "other.test",
        &format!("sslmode=verify-full&sslrootcert={}", root("ca.pem")),
    );
    let e = refusal(PgStore::open(&wrong_host));
    assert!(
        e.contains("invalid peer certificate")
            && e.contains("not valid for name \"other.test\"")
            && e.contains("db.test"),
        "{e}"
    );
    // verify-ca checks the chain, not the name.
    let ca_only = url_for(
        &db,
        "other.test",
        &format!("sslmode=verify-ca&sslrootcert={}", root("ca.pem")),
    );
    PgStore::migrate(&ca_only).expect("verify-ca ignores the host name");
    let e = refusal(PgStore::open(&url_for(
        &db,
        "db.test",
        &format!("sslmode=verify-ca&sslrootcert={}", root("wrong-ca.pem")),
    )));
    assert!(e.contains("UnknownIssuer"), "{e}");
    // verify-full without a root file to check against is refused up front.
    let e = refusal(PgStore::open(&url_for(
        &db,
        "db.test",
        "sslmode=verify-full",
    )));
    assert!(e.contains("sslrootcert"), "{e}");
}

#[test]
fn require_encrypts_without_a_root_and_never_runs_in_clear() {
    let db = fresh_db("tls_require");
    let url = url_for(&db, "db.test", "sslmode=require");
    PgStore::migrate(&url).expect("migrate over require");
    let store = PgStore::open(&url).expect("open over require");
    let (encrypted, clear) = tether_sessions(&db);
    assert!(
        encrypted.parse::<u32>().unwrap() >= 2 && clear == "0",
        "{encrypted} {clear}"
    );
    drop(store);
    // `prefer` is taken as `require`.
    let prefer = url_for(&db, "db.test", "sslmode=prefer");
    drop(PgStore::open(&prefer).expect("open over prefer"));

    // A server without TLS (the shared test cluster): refused, not clear text.
    let plain = pg::migrated_database("tls_plain");
    let e = refusal(PgStore::open(&format!("{plain}?sslmode=require")));
    assert!(e.contains("sslmode=require"), "{e}");
    // No sslmode: no TLS, as before.
    drop(PgStore::open(&plain).expect("open without TLS"));
}
