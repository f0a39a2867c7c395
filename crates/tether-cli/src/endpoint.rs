//! Starting an endpoint, shared by `tether serve` and `tether mcp`: logging,
//! the config read and checked (defects printed, exit 2), the evidence store,
//! the kernel with its governed-stop watcher, session reaper and link
//! monitor, the checkpointer (with a signing key), and the stdio caller's
//! principal.

use crate::check::print_defects;
use crate::config;
use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use tether_kernel::{Kernel, KernelConfig, Principal};
use tether_store::{PgStore, SqliteStore, Store};

/// Every approval TTL the config accepts converts to milliseconds without
/// overflow (`start` multiplies by 1000).
const _: () = assert!(config::APPROVAL_TTL_S_MAX <= u64::MAX / 1000);

/// A kernel ready to serve, with the background work every endpoint runs.
/// Field order is drop order: the watcher, the reaper and the link monitor
/// stop before the runtime they run on.
pub struct Endpoint {
    pub kernel: Kernel,
    pub auth: tether_server::auth::Authenticator,
    pub dir: PathBuf,
    /// `state DIR` or `store URL`, for messages.
    pub store_shown: String,
    pub device_count: usize,
    /// The MCP HTTP session bounds (`[http]`).
    pub mcp_sessions: tether_server::mcp::http::SessionBounds,
    /// Dropped first: the leases are given up before anything else stops.
    _fleet: tether_kernel::FleetLease,
    _watcher: tether_kernel::governed::StopWatcher,
    _reaper: tokio::task::JoinHandle<()>,
    _link_monitor: Option<tokio::task::JoinHandle<()>>,
    _opener: tether_kernel::StoreOpener,
    /// Signs checkpoints of the chain when the state directory has a key.
    pub checkpointer: Option<tether_kernel::checkpoints::Checkpointer>,
    pub runtime: tokio::runtime::Runtime,
}

/// The default log filter: warnings, except the OPC UA library's own log,
/// which is off: it reports a missing client certificate as an error under
/// security `none` (where none is needed), and every failure that matters
/// reaches the operator through the driver (receipts, the device's link).
/// `TETHER_LOG=warn,opcua_client=debug` shows it.
const LOG_DEFAULT: &str = "warn,opcua_client=off,opcua_core=off,opcua_crypto=off";

/// Logging to stderr (stdout belongs to the stdio protocols), filtered by
/// `TETHER_LOG` (default [`LOG_DEFAULT`]), and traces over OTLP when
/// `[telemetry] otlp_endpoint` is set (`crate::telemetry`). An exporter that
/// cannot be built leaves logging on and says why: traces are never a
/// reason not to serve.
pub fn init_tracing(
    telemetry: &crate::telemetry::TelemetryConfig,
) -> Option<crate::telemetry::Guard> {
    match crate::telemetry::init(telemetry, LOG_DEFAULT) {
        Ok(guard) => Some(guard),
        Err(e) => {
            eprintln!("tether: traces are off: {e:#}");
            None
        }
    }
}

/// The loaded config, cell and authenticator; `Err(code)` once the defects
/// were printed.
pub type Prepared = (
    config::Loaded,
    tether_kernel::loader::Cell,
    tether_server::auth::Authenticator,
);

/// Reads the config, loads the cell and builds the authenticator; every
/// defect is printed and start-up ends with exit 2.
pub fn prepare(config_path: Option<&Path>) -> Result<Prepared, ExitCode> {
    let loaded = config::read(config_path).map_err(|d| {
        print_defects(&d);
        ExitCode::from(2)
    })?;
    let cell = config::load_cell(&loaded).map_err(|d| {
        print_defects(&d);
        ExitCode::from(2)
    })?;
    let origin = config_path.map_or_else(|| PathBuf::from("(built-in)"), PathBuf::from);
    let auth = config::authenticator(&loaded, &origin).map_err(|d| {
        print_defects(&d);
        ExitCode::from(2)
    })?;
    Ok((loaded, cell, auth))
}

/// Opens the store, starts the kernel, the governed-stop watcher, the
/// session reaper and the link monitor.
/// Its spans go to `tracer` (the OTLP exporter), when traces are on.
pub fn start(
    prepared: Prepared,
    choice: crate::store::StoreChoice,
    tracer: Option<tether_kernel::trace::TraceSink>,
) -> anyhow::Result<Endpoint> {
    let (loaded, cell, auth) = prepared;
    let dir = config::state_dir(choice.state_dir.as_deref(), Some(&loaded));
    let drivers = tether_drivers::build_all_with(
        cell.devices.iter().map(|d| &d.manifest),
        &tether_drivers::SimEnv::in_state_dir(&dir),
    )
    .map_err(anyhow::Error::msg)?;
    // Simulated devices keep their files in the state directory whichever
    // store holds the evidence.
    let url = choice.url(Some(&loaded));
    let store_shown = url.as_ref().map_or_else(
        || format!("state {}", dir.display()),
        |u| format!("store {u}"),
    );
    let endpoint_id = loaded
        .config
        .endpoint_id
        .clone()
        .unwrap_or_else(|| "tether-local".into());
    let device_count = cell.devices.len();
    let mcp_sessions = crate::bounds::mcp_sessions(&loaded.config.http);
    let mut kernel_config = kernel_config(&loaded, &choice, &endpoint_id)?;
    kernel_config.tracer = tracer;
    // Opened by the kernel's opener thread: a store that cannot be opened
    // or written now is tried again while the endpoint serves tripped.
    let open_dir = dir.clone();
    let open: tether_kernel::OpenStore = Box::new(move || match &url {
        Some(u) => PgStore::open(u).map(|s| Arc::new(s) as Arc<dyn Store>),
        None => SqliteStore::open(&open_dir).map(|s| {
            say_journal(&s);
            Arc::new(s) as Arc<dyn Store>
        }),
    });
    let started = match Kernel::start_deferred(kernel_config, cell, drivers, open) {
        Ok(s) => s,
        Err(e @ tether_kernel::StartError::Policy(_)) => {
            bail!("{e}\nthe policy is invalid; nothing was started")
        }
        Err(e @ tether_kernel::StartError::Store(_)) => {
            // An integrity defect: waiting heals none, so nothing starts.
            return Err(anyhow::Error::new(e)
                .context(format!("opening the evidence store ({store_shown})")));
        }
        Err(e) => return Err(anyhow::Error::new(e).context("starting the kernel")),
    };
    if let Some(why) = &started.tripped {
        eprintln!(
            "tether: the evidence store ({store_shown}) cannot be opened or written ({why}): serving LATCHED (every device tripped; e-stops, status, health and reads are served) and trying again"
        );
    }
    if started.restoring {
        eprintln!(
            "tether: the evidence store ({store_shown}) is open and its state is still being restored (a large store): serving (e-stops, status, health and reads; commands are refused until it is done); the store opens when the restore ends, or every device is tripped if it fails or outlasts {} ms",
            tether_kernel::START_RESTORE_READ_MS
        );
    }
    let kernel = started.kernel;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // Obey stops tripped by other processes on the same state directory.
    let watcher = kernel
        .start_stop_watcher(runtime.handle().clone())
        .context("starting the governed-stop watcher")?;
    // Expired sessions get their operations cancelled and safe states run.
    let reaper = kernel.start_session_reaper(runtime.handle());
    // A physical device whose link stays down past its watchdog period is
    // latched; link changes are recorded (none to watch: `None`).
    let link_monitor = kernel.start_link_monitor(runtime.handle());
    // The leases of this endpoint and its physical devices, renewed while
    // it runs and given up when it stops.
    let fleet = kernel
        .start_fleet_lease(runtime.handle().clone())
        .context("starting the fleet lease")?;
    // Checkpoints of the chain head, signed off the command path.
    let checkpointer =
        crate::evidence::start(&kernel, runtime.handle(), &dir, &loaded.config.evidence)?;
    Ok(Endpoint {
        kernel,
        auth,
        dir,
        store_shown,
        device_count,
        mcp_sessions,
        _fleet: fleet,
        _watcher: watcher,
        _reaper: reaper,
        _link_monitor: link_monitor,
        _opener: started.opener,
        checkpointer,
        runtime,
    })
}

/// Tells the operator what the SQLite store's journal did at open, when it
/// did more than its usual nothing.
fn say_journal(store: &SqliteStore) {
    let j = store.journal_stats();
    if j.replayed > 0 {
        eprintln!(
            "tether: the evidence store's journal held {} flushed batch(es) its database lacked (a power loss, or a kill between the journal's flush and SQLite's commit): applied before serving",
            j.replayed
        );
    }
    if j.discarded > 0 {
        let kept = match &j.set_aside_error {
            None => format!("copied to {}", tether_store::JOURNAL_SET_ASIDE_FILE_NAME),
            Some(e) => format!("could not be copied aside ({e})"),
        };
        eprintln!(
            "tether: {} held {} record(s) written for a database that is gone (a new database was made): not applied, {kept}",
            tether_store::JOURNAL_FILE_NAME,
            j.discarded
        );
    }
    if let Some(why) = &j.why_off {
        eprintln!(
            "tether: the evidence store commits without its journal ({why}): each commit waits for SQLite's own flush"
        );
    }
}

/// The kernel's settings from the config: limits, policy, the fleet's,
/// arming at start and the approvals' lifetime.
fn kernel_config(
    loaded: &config::Loaded,
    choice: &crate::store::StoreChoice,
    endpoint_id: &str,
) -> anyhow::Result<KernelConfig> {
    let mut kernel_config = KernelConfig::standard(endpoint_id);
    kernel_config.policy = loaded.policy.clone();
    loaded.config.limits.apply(&mut kernel_config);
    apply_fleet(&loaded.config.fleet, choice, &mut kernel_config)?;
    if let Some(armed) = loaded.config.hardware_armed_at_start {
        kernel_config.hardware_armed_at_start = armed;
    }
    if let Some(ttl) = loaded.config.approval_ttl_s {
        // config::read refused any other value; kept as a guard.
        if !(1..=config::APPROVAL_TTL_S_MAX).contains(&ttl) {
            bail!(
                "the config's approval_ttl_s must be between 1 and {} (seconds)",
                config::APPROVAL_TTL_S_MAX
            );
        }
        kernel_config.approval_ttl_ms = ttl * 1000;
    }
    Ok(kernel_config)
}

/// The `[fleet]` settings and `--wait-for-devices` into the kernel's
/// (the kernel checks their ranges at start).
fn apply_fleet(
    fleet: &config::FleetConfig,
    choice: &crate::store::StoreChoice,
    kernel_config: &mut KernelConfig,
) -> anyhow::Result<()> {
    if let Some(ms) = fleet.lease_ms {
        kernel_config.fleet_lease_ms = ms;
    }
    if let Some(ms) = fleet.stop_bound_ms {
        kernel_config.stop_bound_ms = ms;
    }
    let wait_s = choice
        .wait_for_devices_s
        .or(fleet.wait_for_devices_s)
        .unwrap_or(0);
    if wait_s > WAIT_FOR_DEVICES_S_MAX {
        bail!("--wait-for-devices / fleet.wait_for_devices_s = {wait_s}: at most {WAIT_FOR_DEVICES_S_MAX} seconds");
    }
    kernel_config.wait_for_devices_ms = wait_s * 1000;
    Ok(())
}

/// Longest wait for devices another endpoint owns, seconds (a week).
const WAIT_FOR_DEVICES_S_MAX: u64 = 7 * 86_400;

/// The stdio caller, established once from the launching environment: a
/// missing or wrong token refuses start-up (fail closed).
pub fn stdio_principal(
    auth: &tether_server::auth::Authenticator,
    token_env: &str,
) -> Result<Principal, ExitCode> {
    let token = std::env::var(token_env).ok();
    auth.authenticate(token.as_deref()).map_err(|e| {
        eprintln!(
            "tether: {} ({}): set {token_env} to this caller's token",
            e.message, e.code
        );
        ExitCode::from(2)
    })
}
