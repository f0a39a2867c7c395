//! A throwaway PostgreSQL cluster for tests, shared by the tests of one test
//! binary, each test in a database of its own.
//!
//! Unless `TETHER_TEST_PG_URL` names a server to use (a URL whose role may
//! create databases), the first caller makes a cluster with `initdb` and
//! starts it with `pg_ctl` from Debian's server binaries
//! (/usr/lib/postgresql/*/bin), in a temporary directory, on a free
//! loopback port with its socket in that directory, trusting local
//! connections. PostgreSQL refuses to run as root, so as root the cluster
//! belongs to, and runs as, the `postgres` user. Nothing depends on a server
//! already running on the machine. A watcher process stops the cluster and
//! removes its directory once the test binary has exited (Rust runs no
//! destructor of a static).
#![allow(dead_code, clippy::expect_used, clippy::panic, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// The admin URL of the shared server (without a database name).
fn server() -> &'static str {
    static SERVER: OnceLock<String> = OnceLock::new();
    SERVER.get_or_init(|| match std::env::var("TETHER_TEST_PG_URL") {
        Ok(url) if !url.is_empty() => url.trim_end_matches('/').to_owned(),
        _ => start_cluster(),
    })
}

/// `psql`, from the PATH or beside the server binaries.
fn psql() -> PathBuf {
    let beside = bin_dir().join("psql");
    if beside.exists() {
        return beside;
    }
    PathBuf::from("psql")
}

fn bin_dir() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL server binaries in /usr/lib/postgresql (Debian's `postgresql` package)")
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("initdb").exists())
        .collect();
    // The newest major version installed.
    dirs.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    dirs.pop()
        .expect("no initdb under /usr/lib/postgresql/*/bin")
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// A command that runs `program` as the cluster's owner.
fn as_owner(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local addr").port()
}

fn run(mut c: Command, what: &str) {
    let out = c.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn start_cluster() -> String {
    start_cluster_with(&[], "")
}

/// A cluster of its own serving TLS with `cert_pem` (its chain) and
/// `key_pem` (`ssl=on`; clear-text connections are still accepted, so a
/// client that asks for no TLS gets none); answers its admin URL
/// (`postgres://postgres@127.0.0.1:PORT`, without a database name).
pub fn start_tls_cluster(cert_pem: &str, key_pem: &str) -> String {
    start_cluster_with(
        &[("server.crt", cert_pem), ("server.key", key_pem)],
        "-c ssl=on -c ssl_cert_file={dir}/server.crt -c ssl_key_file={dir}/server.key",
    )
}

/// Makes and starts a cluster; `files` are written into its directory
/// (mode 0600, owned by the cluster's owner) before it starts, and `extra`
/// server options are added, `{dir}` standing for that directory.
fn start_cluster_with(files: &[(&str, &str)], extra: &str) -> String {
    let bin = bin_dir();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("tether-pg-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("cluster dir");
    if is_root() {
        let mut c = Command::new("chown");
        c.arg("postgres:postgres").arg(&dir);
        run(c, "chown the cluster directory to postgres");
    }
    let data = dir.join("data");
    let mut init = as_owner(&bin.join("initdb"));
    init.arg("-D")
        .arg(&data)
        .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"]);
    run(init, "initdb");
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write a cluster file");
        let mut c = Command::new("chmod");
        c.arg("600").arg(&path);
        run(c, "chmod a cluster file");
        if is_root() {
            let mut c = Command::new("chown");
            c.arg("postgres:postgres").arg(&path);
            run(c, "chown a cluster file to postgres");
        }
    }
    let extra = extra.replace("{dir}", &dir.display().to_string());
    let port = free_port();
    let mut start = as_owner(&bin.join("pg_ctl"));
    start
        .arg("-D")
        .arg(&data)
        .arg("-l")
        .arg(dir.join("log"))
        .args(["-w", "-t", "120", "-o"])
        .arg(format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200 {extra}",
            dir.display()
        ))
        .arg("start");
    run(start, "pg_ctl start");
    spawn_reaper(&bin, &dir, &data);
    format!("postgres://postgres@127.0.0.1:{port}")
}

/// Stops the cluster and removes its directory once this process is gone.
fn spawn_reaper(bin: &Path, dir: &Path, data: &Path) {
    let stop = if is_root() {
        format!(
            "runuser -u postgres -- {} -D {} stop -m immediate",
            bin.join("pg_ctl").display(),
            data.display()
        )
    } else {
        format!(
            "{} -D {} stop -m immediate",
            bin.join("pg_ctl").display(),
            data.display()
        )
    };
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done; {stop} >/dev/null 2>&1; rm -rf {dir}",
        pid = std::process::id(),
        dir = dir.display()
    );
    // setsid -f: the watcher runs in a session of its own (it outlives a
    // test harness whose process group is killed); setsid itself returns.
    let started = Command::new("setsid")
        .args(["-f", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("start the cluster's reaper");
    assert!(started.success(), "setsid -f failed: {started}");
}

/// Runs `sql` on `url` with psql; returns its unaligned, tuples-only output.
pub fn psql_on(url: &str, sql: &str) -> String {
    let out = Command::new(psql())
        .args([
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            url,
            "-c",
            sql,
        ])
        .output()
        .expect("run psql");
    assert!(
        out.status.success(),
        "psql {sql:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A new, empty database of its own; returns its URL.
pub fn fresh_database(hint: &str) -> String {
    fresh_database_on(server(), hint)
}

/// [`fresh_database`] on the server of `admin` (`postgres://user@host:port`).
pub fn fresh_database_on(admin: &str, hint: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let clean: String = hint
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .take(30)
        .collect::<String>()
        .to_ascii_lowercase();
    let name = format!("t{}_{n}_{clean}", std::process::id());
    psql_on(
        &format!("{admin}/postgres"),
        &format!("CREATE DATABASE {name}"),
    );
    format!("{admin}/{name}")
}

/// Runs `sql` on `url` with psql, which must fail; answers its error output.
pub fn psql_refused(url: &str, sql: &str) -> String {
    let out = Command::new(psql())
        .args([
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            url,
            "-c",
            sql,
        ])
        .output()
        .expect("run psql");
    assert!(
        !out.status.success(),
        "psql {sql:?} succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).trim().to_owned()
}

/// [`fresh_database`] with the Tether schema made (`migrate`).
pub fn migrated_database(hint: &str) -> String {
    let url = fresh_database(hint);
    tether_store::PgStore::migrate(&url).expect("migrate a fresh database");
    url
}
