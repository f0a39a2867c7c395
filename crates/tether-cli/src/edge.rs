//! How `tether serve`'s network listeners meet the network: the config's
//! `[http]` table made into a `tether_server::listener::Edge` (the TLS files
//! read, the connection bound checked against the open-files limit), and
//! the start-up rules for a listener reachable from the network — without
//! `[[principals]]` it is refused unless `--insecure-no-auth` says otherwise
//! (loudly), and without TLS it is warned about.
//!
//! **Never belongs here:** the accept loop, TLS sessions and the connection
//! table (`tether_server::listener`), reading the config file (`config`).

use crate::config::Loaded;
use anyhow::{bail, Context};
use std::net::SocketAddr;
use std::time::Duration;
use tether_server::listener::{
    Bounds, Edge, Tls, CONNECTIONS_MAX_DEFAULT, CONNECTIONS_PER_PEER_MAX_DEFAULT,
    DESCRIPTORS_BESIDES_CONNECTIONS, HEADER_READ_TIMEOUT_DEFAULT,
};

/// The edge the config asks for. `open_files` is the process's open-files
/// limit (after `serve` raised it), when known: `connections_max` plus the
/// descriptors the endpoint needs besides must fit under it. A configured
/// bound that does not fit refuses start-up; the default is lowered to fit.
///
/// # Errors
/// A TLS file that cannot be used (named), or a `connections_max` over
/// what the open-files limit leaves.
pub fn edge(loaded: &Loaded, open_files: Option<u64>) -> anyhow::Result<Edge> {
    let http = &loaded.config.http;
    let tls = match (&http.tls_cert, &http.tls_key) {
        (Some(cert), Some(key)) => Some(
            Tls::from_pem_files(&loaded.base.join(cert), &loaded.base.join(key))
                .map_err(anyhow::Error::msg)
                .context("TLS for the network listeners ([http] in the config)")?,
        ),
        // `config::read` refused one without the other.
        (None, None) => None,
        _ => bail!("[http] tls_cert and tls_key go together: give both or neither"),
    };
    let room = open_files.map(|n| {
        usize::try_from(n)
            .unwrap_or(usize::MAX)
            .saturating_sub(DESCRIPTORS_BESIDES_CONNECTIONS)
    });
    let connections_max = match (http.connections_max, room) {
        (Some(n), Some(room)) if n > room => bail!(
            "[http] connections_max = {n} does not fit under the open-files limit ({}): at most {room} (the endpoint keeps {DESCRIPTORS_BESIDES_CONNECTIONS} descriptors for itself); lower it or raise the limit (ulimit -n)",
            open_files.unwrap_or_default()
        ),
        (Some(n), _) => n,
        (None, Some(room)) if room < CONNECTIONS_MAX_DEFAULT => {
            if room == 0 {
                bail!(
                    "the open-files limit ({}) leaves no descriptor for connections: raise it (ulimit -n) above {DESCRIPTORS_BESIDES_CONNECTIONS}",
                    open_files.unwrap_or_default()
                );
            }
            eprintln!(
                "tether: warning: the open-files limit ({}) holds {room} connections, fewer than the default {CONNECTIONS_MAX_DEFAULT}: connections_max is {room}",
                open_files.unwrap_or_default()
            );
            room
        }
        (None, _) => CONNECTIONS_MAX_DEFAULT,
    };
    let per_peer = http
        .connections_per_peer_max
        .unwrap_or(CONNECTIONS_PER_PEER_MAX_DEFAULT)
        .min(connections_max);
    let header_read_timeout = http
        .header_read_timeout_ms
        .map_or(HEADER_READ_TIMEOUT_DEFAULT, Duration::from_millis);
    Ok(Edge::new(
        tls,
        header_read_timeout,
        Bounds {
            connections_max,
            connections_per_peer_max: per_peer,
        },
    ))
}

/// Which listener, for messages.
#[derive(Clone, Copy)]
pub enum Listener {
    /// `--http`: JSON-RPC and the REST gateway.
    Rpc,
    /// `--mcp-http`: MCP over streamable HTTP.
    Mcp,
}

impl Listener {
    /// The flag that names it.
    pub fn flag(self) -> &'static str {
        match self {
            Listener::Rpc => "--http",
            Listener::Mcp => "--mcp-http",
        }
    }

    fn serves(self) -> &'static str {
        match self {
            Listener::Rpc => "JSON-RPC and the REST gateway",
            Listener::Mcp => "MCP",
        }
    }
}

/// The start-up rules for a listener, checked before anything starts. On a
/// loopback address (every address `addr` resolves to) nothing is asked.
/// Reachable from the network: without principals it is refused (the bearer
/// token is the only thing between the network and the devices) unless
/// `insecure_no_auth`, which serves it with a warning; and without TLS,
/// tokens would cross the network in clear: a warning.
///
/// # Errors
/// An address that does not resolve; a non-loopback listener, no
/// principals and no `--insecure-no-auth`.
pub fn check_exposure(
    which: Listener,
    addr: &str,
    auth_required: bool,
    insecure_no_auth: bool,
    tls: bool,
) -> anyhow::Result<()> {
    use std::net::ToSocketAddrs;
    let flag = which.flag();
    let resolved: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .with_context(|| format!("{flag} {addr}: not an address to listen on"))?
        .collect();
    if resolved.iter().all(|a| a.ip().is_loopback()) {
        return Ok(());
    }
    if !auth_required {
        if !insecure_no_auth {
            let port = resolved.first().map_or(0, SocketAddr::port);
            bail!(
                "{flag} {addr} is not a loopback address and no [[principals]] are configured: anyone who reaches it could command the devices. Configure [[principals]] in the config (callers then need a bearer token), or bind a loopback address ({flag} 127.0.0.1:{port})"
            );
        }
        eprintln!(
            "tether: WARNING: --insecure-no-auth: {flag} {addr} serves {} to the network WITHOUT AUTHENTICATION; anyone who reaches it can command the devices. Configure [[principals]] instead.",
            which.serves()
        );
    }
    if !tls {
        eprintln!(
            "tether: warning: {flag} {addr} is reachable from the network over plain HTTP: bearer tokens cross it in clear. Set tls_cert and tls_key in [http] of the config."
        );
    }
    Ok(())
}
