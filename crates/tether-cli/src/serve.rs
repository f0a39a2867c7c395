//! `tether serve` and `tether mcp`: the endpoint's surfaces (JSON-RPC on
//! stdio or HTTP, MCP on stdio or streamable HTTP), and the orderly shutdown
//! on Ctrl-C or SIGTERM (running operations cancelled, their receipts
//! recorded, in-flight requests answered, each wait bounded).

use crate::endpoint::{init_tracing, prepare, start, stdio_principal, Endpoint};
use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tether_kernel::{Kernel, Principal};

/// Where the endpoint listens, and how.
pub struct Surfaces {
    /// JSON-RPC on stdin/stdout.
    pub stdio: bool,
    /// JSON-RPC over HTTP (`POST /rpc`).
    pub http: Option<String>,
    /// MCP over streamable HTTP (`/mcp`).
    pub mcp_http: Option<String>,
}

/// Raises the soft limit on open files to the hard limit. Every HTTP client
/// holds a descriptor; at the common soft limit of 1,024, that many stalled
/// clients would leave no descriptor to accept the connection an e-stop
/// arrives on. A limit that cannot be raised is left as it is.
fn raise_open_files_limit() {
    #[cfg(unix)]
    // SAFETY: getrlimit/setrlimit on a local struct; no memory is shared.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                tracing::debug!("the open-files limit could not be raised");
            }
        }
    }
}

/// `tether serve`: the built-in cell or the config's, on the chosen surfaces.
pub fn serve(
    config_path: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    surfaces: Surfaces,
) -> anyhow::Result<ExitCode> {
    if !surfaces.stdio && surfaces.http.is_none() && surfaces.mcp_http.is_none() {
        bail!("choose a transport: --stdio, --http ADDR or --mcp-http ADDR (for example --http 127.0.0.1:7878)");
    }
    init_tracing();
    raise_open_files_limit();
    let prepared = match prepare(config_path.as_deref()) {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    let principal = if surfaces.stdio {
        match stdio_principal(&prepared.2, "TETHER_TOKEN") {
            Ok(p) => Some(p),
            Err(code) => return Ok(code),
        }
    } else {
        None
    };
    let endpoint = start(prepared, state_dir)?;
    let Endpoint {
        kernel,
        auth,
        dir,
        device_count,
        runtime,
        mcp_sessions,
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
            return Ok(ExitCode::SUCCESS);
        }
        serve_network(kernel, auth, &surfaces, (*device_count, *mcp_sessions), dir).await
    })
}

/// Binds `addr`, refusing a non-loopback MCP listener without principals:
/// there the bearer token is the only thing between the network and the devices.
async fn bind(
    addr: &str,
    what: &str,
    auth: &tether_server::auth::Authenticator,
) -> anyhow::Result<tokio::net::TcpListener> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    if what == "mcp" && !listener.local_addr()?.ip().is_loopback() && !auth.required() {
        bail!("--mcp-http {addr} is not a loopback address: configure [[principals]] so that callers need a bearer token");
    }
    Ok(listener)
}

/// JSON-RPC over HTTP and/or MCP over streamable HTTP until Ctrl-C.
async fn serve_network(
    kernel: &Kernel,
    auth: &tether_server::auth::Authenticator,
    surfaces: &Surfaces,
    (device_count, mcp_sessions): (usize, tether_server::mcp::http::SessionBounds),
    dir: &Path,
) -> anyhow::Result<ExitCode> {
    let shutdown = tokio_util::sync::CancellationToken::new();
    let mut servers = tokio::task::JoinSet::new();
    if let Some(addr) = &surfaces.http {
        let listener = bind(addr, "rpc", auth).await?;
        eprintln!(
            "tether: listening on http://{}/rpc ({device_count} devices, state {})",
            listener.local_addr()?,
            dir.display()
        );
        let done = shutdown.clone();
        let server =
            tether_server::http::serve(kernel.clone(), auth.clone(), listener, async move {
                done.cancelled().await;
            });
        servers.spawn(server);
    }
    if let Some(addr) = &surfaces.mcp_http {
        let listener = bind(addr, "mcp", auth).await?;
        eprintln!(
            "tether: MCP listening on http://{}{} ({device_count} devices, state {})",
            listener.local_addr()?,
            tether_server::mcp::http::MCP_PATH,
            dir.display()
        );
        let server = tether_server::mcp::http::serve(
            kernel.clone(),
            auth.clone(),
            listener,
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

/// `tether mcp`: MCP on stdio for a client that launches the endpoint.
pub fn mcp(
    config_path: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    token_env: &str,
) -> anyhow::Result<ExitCode> {
    init_tracing();
    let prepared = match prepare(config_path.as_deref()) {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    let principal = match stdio_principal(&prepared.2, token_env) {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    let endpoint = start(prepared, state_dir)?;
    eprintln!(
        "tether: serving MCP on stdio ({} devices, state {})",
        endpoint.device_count,
        endpoint.dir.display()
    );
    eprintln!("tether: {}", tether_core::NOT_CERTIFIED);
    let kernel = endpoint.kernel.clone();
    endpoint.runtime.block_on(async move {
        tether_server::mcp::stdio::serve(kernel, principal, tokio::io::stdin(), tokio::io::stdout())
            .await
    })?;
    Ok(ExitCode::SUCCESS)
}
