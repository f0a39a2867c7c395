//! `tether serve` and `tether mcp`: the endpoint's surfaces (JSON-RPC on
//! stdio or HTTP, MCP on stdio or streamable HTTP), and the orderly shutdown
//! on Ctrl-C or SIGTERM (running operations cancelled, their receipts
//! recorded, in-flight requests answered, each wait bounded).

use crate::edge::{check_exposure, Listener};
use crate::endpoint::{init_tracing, prepare, start, stdio_principal, Endpoint};
use crate::telemetry::Guard;
use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tether_kernel::{Kernel, Principal};
use tether_server::edge::{Edge, EdgeConfig};

/// Where the endpoint listens, and how.
pub struct Surfaces {
    /// JSON-RPC on stdin/stdout.
    pub stdio: bool,
    /// JSON-RPC over HTTP (`POST /rpc`).
    pub http: Option<String>,
    /// MCP over streamable HTTP (`/mcp`).
    pub mcp_http: Option<String>,
    /// Serve a non-loopback listener without principals anyway.
    pub insecure_no_auth: bool,
}

/// Raises the soft limit on open files to the hard limit, and answers the
/// limit in force (`None` when unknown). Every HTTP client holds a
/// descriptor; the connection bounds (`[http] connections_max`) are kept
/// under this limit so that stalled clients never use up the descriptors an
/// e-stop needs. A limit that cannot be raised is left as it is.
fn raise_open_files_limit() -> Option<u64> {
    #[cfg(unix)]
    // SAFETY: getrlimit/setrlimit on a local struct; no memory is shared.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return None;
        }
        if lim.rlim_cur < lim.rlim_max {
            let wanted = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) == 0 {
                lim = wanted;
            } else {
                tracing::debug!("the open-files limit could not be raised");
            }
        }
        #[allow(clippy::useless_conversion)] // rlim_t is not u64 everywhere
        u64::try_from(lim.rlim_cur).ok()
    }
    #[cfg(not(unix))]
    None
}

/// `tether serve`: the built-in cell or the config's, on the chosen surfaces.
pub fn serve(
    config_path: Option<PathBuf>,
    choice: crate::store::StoreChoice,
    surfaces: Surfaces,
) -> anyhow::Result<ExitCode> {
    if !surfaces.stdio && surfaces.http.is_none() && surfaces.mcp_http.is_none() {
        bail!("choose a transport: --stdio, --http ADDR or --mcp-http ADDR (for example --http 127.0.0.1:7878)");
    }
    let open_files = raise_open_files_limit();
    let prepared = match prepare(config_path.as_deref()) {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    // Kept to the end: dropping it flushes the queued spans (bounded).
    let telemetry = init_tracing(&prepared.0.config.telemetry);
    let origin = config_path
        .clone()
        .unwrap_or_else(|| PathBuf::from("(built-in)"));
    let names = match crate::config::edge(&prepared.0, &origin) {
        Ok(e) => e,
        Err(defects) => {
            crate::check::print_defects(&defects);
            return Ok(ExitCode::from(2));
        }
    };
    // TLS files, bounds and who may reach the listeners are checked before
    // anything starts.
    let settings = if surfaces.stdio {
        tether_server::listener::Edge::default()
    } else {
        crate::edge::edge(&prepared.0, open_files)?
            .with_metrics_open(prepared.0.config.telemetry.metrics_open())
            .with_rest_finished_max(crate::bounds::rest_finished_max(&prepared.0.config))
    };
    for (which, addr) in [
        (Listener::Rpc, &surfaces.http),
        (Listener::Mcp, &surfaces.mcp_http),
    ] {
        if let Some(addr) = addr {
            check_exposure(
                which,
                addr,
                prepared.2.required(),
                surfaces.insecure_no_auth,
                settings.is_tls(),
            )?;
        }
    }
    let principal = if surfaces.stdio {
        match stdio_principal(&prepared.2, "TETHER_TOKEN") {
            Ok(p) => Some(p),
            Err(code) => return Ok(code),
        }
    } else {
        None
    };
    let endpoint = start(prepared, choice, telemetry.as_ref().and_then(Guard::tracer))?;
    eprintln!("tether: evidence kept in the {}", endpoint.store_shown);
    let Endpoint {
        kernel,
        auth,
        dir,
        device_count,
        runtime,
        mcp_sessions,
        checkpointer,
        ..
    } = &endpoint;
    runtime.block_on(async {
        if surfaces.stdio {
            eprintln!(
                "tether: serving JSON-RPC on stdio ({device_count} devices, state {})",
                dir.display()
            );
            eprintln!("tether: {}", tether_core::NOT_CERTIFIED);
            tether_server::stdio::serve(
                kernel.clone(),
                principal.unwrap_or_else(Principal::local_agent),
                tokio::io::stdin(),
                tokio::io::stdout(),
            )
            .await?;
            settle(kernel, checkpointer.as_ref()).await;
            return Ok(ExitCode::SUCCESS);
        }
        let code = serve_network(
            kernel,
            auth,
            (&names, &settings),
            &surfaces,
            (*device_count, *mcp_sessions),
            dir,
        )
        .await?;
        // Last, once every operation recorded how it ended: the chain ends signed.
        settle(kernel, checkpointer.as_ref()).await;
        Ok(code)
    })
}

/// Binds `addr`, checked again: a listener reachable from the network
/// without principals is served only with `--insecure-no-auth` (the check
/// before start-up resolved the same name; `edge::check_exposure`).
async fn bind(
    addr: &str,
    which: Listener,
    auth: &tether_server::auth::Authenticator,
    surfaces: &Surfaces,
) -> anyhow::Result<tokio::net::TcpListener> {
    let listener = tether_server::listener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    let local = listener.local_addr()?;
    if !local.ip().is_loopback() && !auth.required() && !surfaces.insecure_no_auth {
        bail!("{} {addr} is bound to {local}, not a loopback address, and no [[principals]] are configured", which.flag());
    }
    Ok(listener)
}

/// JSON-RPC over HTTP and/or MCP over streamable HTTP until Ctrl-C.
async fn serve_network(
    kernel: &Kernel,
    auth: &tether_server::auth::Authenticator,
    (names, settings): (&EdgeConfig, &tether_server::listener::Edge),
    surfaces: &Surfaces,
    (device_count, mcp_sessions): (usize, tether_server::mcp::http::SessionBounds),
    dir: &Path,
) -> anyhow::Result<ExitCode> {
    let shutdown = tokio_util::sync::CancellationToken::new();
    let mut servers = tokio::task::JoinSet::new();
    if let Some(addr) = &surfaces.http {
        let listener = bind(addr, Listener::Rpc, auth, surfaces).await?;
        eprintln!(
            "tether: listening on {}://{}/rpc ({device_count} devices, state {})",
            settings.scheme(),
            listener.local_addr()?,
            dir.display()
        );
        eprintln!(
            "tether: operator console at {}://{}/console/",
            settings.scheme(),
            listener.local_addr()?
        );
        say_served_names(&listener, names)?;
        let done = shutdown.clone();
        let server = tether_server::http::serve_on(
            kernel.clone(),
            auth.clone(),
            names.clone(),
            listener,
            settings.clone(),
            async move {
                done.cancelled().await;
            },
        );
        servers.spawn(server);
    }
    if let Some(addr) = &surfaces.mcp_http {
        let listener = bind(addr, Listener::Mcp, auth, surfaces).await?;
        eprintln!(
            "tether: MCP listening on {}://{}{} ({device_count} devices, state {})",
            settings.scheme(),
            listener.local_addr()?,
            tether_server::mcp::http::MCP_PATH,
            dir.display()
        );
        say_served_names(&listener, names)?;
        let server = tether_server::mcp::http::serve(
            kernel.clone(),
            auth.clone(),
            names.clone(),
            listener,
            settings.clone(),
            mcp_sessions,
            shutdown.clone(),
        );
        servers.spawn(server);
    }
    eprintln!("tether: {}", tether_core::NOT_CERTIFIED);
    tokio::select! {
        () = stop_requested() => {}
        // A listener that fails ends the endpoint (and says why).
        Some(ended) = servers.join_next() => ended??,
    }
    wind_down(kernel).await;
    shutdown.cancel();
    // In-flight requests end quickly once their operations are cancelled;
    // the wait is bounded all the same.
    let _ = tokio::time::timeout(SHUTDOWN_WAIT, async {
        while servers.join_next().await.is_some() {}
    })
    .await;
    Ok(ExitCode::SUCCESS)
}

/// Says which `Host` names a listener answers (the rest are refused 403).
fn say_served_names(listener: &tokio::net::TcpListener, edge: &EdgeConfig) -> anyhow::Result<()> {
    let served = Edge::new(listener.local_addr()?, edge).hosts();
    eprintln!(
        "tether: http://{} answers Host {} (others: [http] public_names)",
        listener.local_addr()?,
        served.join(", ")
    );
    Ok(())
}

/// Longest wait, at shutdown, for running operations to end and then for
/// in-flight requests to be answered.
const SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Ctrl-C, or SIGTERM (what a service manager sends): either ends the
/// endpoint the same orderly way.
async fn stop_requested() {
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Cancels every running operation and waits (bounded) until each has
/// recorded how it ended, so a motion interrupted by a shutdown reads
/// `cancelled`, not `unknown`. Stops are left to finish.
async fn wind_down(kernel: &Kernel) {
    let asked = kernel.cancel_all_operations("endpoint shutting down");
    if asked > 0 {
        eprintln!("tether: shutting down: cancelling {asked} running operation(s)");
    }
    let deadline = tokio::time::Instant::now() + SHUTDOWN_WAIT;
    while kernel.running_operations() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Longest wait, at the end, for the store to take the `unknown` outcomes
/// it did not take while it failed.
const OWED_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Before the process ends: the `unknown` outcomes the store did not take
/// are offered once more (bounded), so that a restart replays their ids
/// instead of running them (those still not on record are named on
/// stderr); then the chain ends signed (`evidence::finish`).
async fn settle(kernel: &Kernel, checkpointer: Option<&tether_kernel::checkpoints::Checkpointer>) {
    if kernel.owed_outcomes() > 0 {
        let left = kernel.record_owed_outcomes(OWED_WAIT).await;
        if left > 0 {
            eprintln!("tether: shutting down: {left} unknown outcome(s) could not be recorded; a restart does not know their command ids");
        }
    }
    crate::evidence::finish(checkpointer).await;
}

/// `tether mcp`: MCP on stdio for a client that launches the endpoint.
pub fn mcp(
    config_path: Option<PathBuf>,
    choice: crate::store::StoreChoice,
    token_env: &str,
) -> anyhow::Result<ExitCode> {
    let prepared = match prepare(config_path.as_deref()) {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    let telemetry = init_tracing(&prepared.0.config.telemetry);
    let principal = match stdio_principal(&prepared.2, token_env) {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    let endpoint = start(prepared, choice, telemetry.as_ref().and_then(Guard::tracer))?;
    eprintln!("tether: evidence kept in the {}", endpoint.store_shown);
    eprintln!(
        "tether: serving MCP on stdio ({} devices, state {})",
        endpoint.device_count,
        endpoint.dir.display()
    );
    eprintln!("tether: {}", tether_core::NOT_CERTIFIED);
    let kernel = endpoint.kernel.clone();
    let checkpointer = endpoint.checkpointer.as_ref();
    endpoint.runtime.block_on(async move {
        tether_server::mcp::stdio::serve(
            kernel.clone(),
            principal,
            tokio::io::stdin(),
            tokio::io::stdout(),
        )
        .await?;
        settle(&kernel, checkpointer).await;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}
