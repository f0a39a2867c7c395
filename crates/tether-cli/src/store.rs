//! Which store a command uses, and `tether store`: the SQLite file of a
//! state directory (the embedded default), or a PostgreSQL store shared by a
//! fleet, named by `--store URL`, `TETHER_STORE_URL` or the config's `store`.
//! A password is never part of the URL: it comes from `PGPASSWORD` or a
//! passfile (`PGPASSFILE`, `~/.pgpass`), so that it shows neither in `ps` nor
//! in a config file (docs/STORE.md).

use crate::cli::StoreAction;
use crate::config;
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use tether_store::{PgStore, SqliteStore, Store};

/// The store flags of a command: a state directory and/or a store URL.
#[derive(Debug, Default, Clone)]
pub struct StoreChoice {
    /// `--state-dir`.
    pub state_dir: Option<PathBuf>,
    /// `--store` / `TETHER_STORE_URL`.
    pub store: Option<String>,
    /// `--wait-for-devices` (serve, mcp): how long a start waits for a
    /// device another endpoint owns, seconds.
    pub wait_for_devices_s: Option<u64>,
}

impl StoreChoice {
    /// The PostgreSQL URL to use: the flag, else the config's `store`.
    pub fn url(&self, loaded: Option<&config::Loaded>) -> Option<String> {
        self.store
            .clone()
            .filter(|u| !u.is_empty())
            .or_else(|| loaded.and_then(|l| l.config.store.clone()))
    }
}

/// An opened store and how to name it in messages.
pub struct Opened {
    pub store: Arc<dyn Store>,
    /// `state DIR` or `store URL`.
    pub shown: String,
}

/// Opens the PostgreSQL store at `url` when given, else the SQLite store in
/// `dir`. A PostgreSQL schema this build does not know refuses, naming both
/// versions.
pub fn open(url: Option<&str>, dir: &Path) -> anyhow::Result<Opened> {
    match url {
        Some(url) => {
            let store = PgStore::open(url)
                .with_context(|| format!("opening the PostgreSQL store {url}"))?;
            Ok(Opened {
                store: Arc::new(store),
                shown: format!("store {url}"),
            })
        }
        None => {
            let store = SqliteStore::open(dir)
                .with_context(|| format!("opening the evidence store in {}", dir.display()))?;
            Ok(Opened {
                store: Arc::new(store),
                shown: format!("state {}", dir.display()),
            })
        }
    }
}

/// Opens the store a shell command (`estop`, `audit`) names: the URL, else
/// the state directory (flag, environment, default).
pub fn open_for_shell(choice: &StoreChoice) -> anyhow::Result<Opened> {
    let dir = config::state_dir(choice.state_dir.as_deref(), None);
    open(choice.url(None).as_deref(), &dir)
}

/// Runs one `tether store` action.
pub fn store(action: StoreAction) -> anyhow::Result<ExitCode> {
    match action {
        StoreAction::Migrate { store } => {
            let (before, after) = PgStore::migrate(&store)
                .with_context(|| format!("migrating the PostgreSQL store {store}"))?;
            if before == after {
                println!("store {store}: schema version {after}, already current");
            } else if before == 0 {
                println!("store {store}: schema created at version {after}");
            } else {
                println!("store {store}: schema upgraded from version {before} to {after}");
            }
            Ok(ExitCode::SUCCESS)
        }
        StoreAction::Copy { from, to } => copy(&from, &to),
    }
}

/// `tether store copy --from DIR --to URL`.
fn copy(from: &Path, to: &str) -> anyhow::Result<ExitCode> {
    if let Some(pid) = holder_of(from)? {
        anyhow::bail!(
            "{} is in use by process {pid} (a running endpoint?): stop every endpoint on it, then copy; nothing was copied",
            from.display()
        );
    }
    let r = tether_store::postgres::copy_sqlite_to_url(from, to)
        .with_context(|| format!("copying {} into {to}", from.display()))?;
    println!(
        "copied {} into {to}: {} chain entries (head seq {}, {}), {} receipts, {} revisions, {} latches, {} budget rows, {} open operations, {} approvals, {} invocations",
        from.display(),
        r.entries,
        r.head_seq,
        r.head_hash,
        r.receipts,
        r.revisions,
        r.latches,
        r.budget_rows,
        r.open_ops,
        r.approvals,
        r.invocations
    );
    println!(
        "verified: the chain on {to} checks entry by entry and ends at the copied head; the source is unchanged (serve with --store {to} from now on)"
    );
    Ok(ExitCode::SUCCESS)
}

/// The id of another process that has the SQLite store of `dir` open, if
/// any. In WAL mode every connection holds a shared lock on the wal-index's
/// "dead man switch" byte (offset 128 of `tether.db-shm`, see SQLite's
/// walformat document) for as long as it is open; asking whether a write
/// lock there would be granted names a holder without taking anything.
fn holder_of(dir: &Path) -> anyhow::Result<Option<i32>> {
    use std::os::fd::AsRawFd;
    let shm = dir.join(format!("{}-shm", tether_store::DB_FILE_NAME));
    let file = match std::fs::OpenOptions::new().read(true).open(&shm) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("opening {}", shm.display())),
    };
    // SAFETY: a zeroed `flock` is a valid value of the plain C struct; the
    // fields that matter are set below.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = 128;
    lock.l_len = 1;
    // SAFETY: F_GETLK only reads and writes `lock`, which outlives the call,
    // on a descriptor `file` keeps open.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETLK, &mut lock) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("asking who holds {}", shm.display()));
    }
    Ok((lock.l_type != libc::F_UNLCK as libc::c_short).then_some(lock.l_pid))
}
