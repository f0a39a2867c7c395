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
    }
}
