//! `tether` — the command-line entry point: serve, mcp, check, describe, audit.
//!
//! Exit codes: 0 success; 1 the thing checked is defective (a manifest defect,
//! a broken evidence chain); 2 usage, I/O or start-up errors.
//!
//! This file parses the command line, dispatches to the subcommand's module
//! and maps its outcome to an exit code. The command line is in `cli`; the
//! endpoint config in `config`; `serve` (with `endpoint`) serves, `check`,
//! `describe` and `audit` report, `safety` and `approvals` are the operator's
//! commands (over `rpc` to a running endpoint), `sim` drives the simulator,
//! `mcp_bridge` serves stdio MCP as a client of a running endpoint.

mod approvals;
mod audit;
mod bounds;
mod check;
mod cli;
mod config;
mod describe;
mod edge;
mod endpoint;
mod evidence;
mod fleet;
mod follow;
mod keys;
mod mcp_bridge;
mod rpc;
mod safety;
mod serve;
mod sim;
mod store;
mod telemetry;

/// mimalloc instead of the system allocator: under 64 concurrent callers,
/// glibc malloc's arena contention cost about a quarter of the CPU of a
/// governed command (measured with perf; see docs/PERFORMANCE.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;
use cli::{Cli, Command};
use std::process::ExitCode;

/// Commands that only print a report (`check`, `describe`, `codes`,
/// `audit export|verify`) end quietly when their reader goes away
/// (`tether audit export | head -1`), as Unix tools do: Rust ignores SIGPIPE,
/// so printing to a closed pipe would otherwise panic or fail with an error.
/// Serving commands keep ignoring it, so a peer that hangs up is an I/O
/// error, never a kill.
fn die_quietly_on_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: restores the default disposition of one signal before any
    // thread starts; no handler runs our code.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(
        cli.command,
        Command::Check { .. }
            | Command::Describe { .. }
            | Command::Probe { .. }
            | Command::Codes
            | Command::Token { .. }
            | Command::Audit { .. }
            | Command::Keys { .. }
    ) {
        die_quietly_on_closed_pipe();
    }
    match run(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tether: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// `serve` and `mcp`: the commands that run an endpoint.
fn run_endpoint(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve {
            config,
            state_dir,
            store,
            stdio,
            http,
            mcp_http,
            insecure_no_auth,
            wait_for_devices,
        } => serve::serve(
            config,
            store::StoreChoice {
                state_dir,
                store,
                wait_for_devices_s: wait_for_devices,
            },
            serve::Surfaces {
                stdio,
                http,
                mcp_http,
                insecure_no_auth,
            },
        ),
        Command::Mcp {
            token_env,
            endpoint: Some(endpoint),
            ..
        } => mcp_bridge::run(&endpoint, &token_env),
        Command::Mcp {
            config,
            state_dir,
            store,
            token_env,
            wait_for_devices,
            endpoint: None,
        } => serve::mcp(
            config,
            store::StoreChoice {
                state_dir,
                store,
                wait_for_devices_s: wait_for_devices,
            },
            &token_env,
        ),
        _ => unreachable_command(),
    }
}

/// Never reached: `run` hands only `serve` and `mcp` to [`run_endpoint`].
fn unreachable_command() -> anyhow::Result<ExitCode> {
    anyhow::bail!("internal error: not an endpoint command")
}

/// Runs one subcommand; an `Err` is a usage, I/O or start-up error (exit 2).
fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        c @ (Command::Serve { .. } | Command::Mcp { .. }) => run_endpoint(c),
        Command::Fleet { action } => fleet::fleet(action),
        Command::Check { file, schema } => Ok(check::check(&file, schema)),
        Command::Approvals { action, endpoint } => approvals::approvals(action, &endpoint),
        Command::Describe {
            device,
            config,
            json,
        } => describe::describe(&device, config, json),
        Command::Probe {
            device,
            config,
            timeout_ms,
        } => describe::probe(&device, &config, timeout_ms),
        Command::Audit { action } => audit::audit(action),
        Command::Store { action } => store::store(action),
        Command::Keys { action } => keys::keys(action),
        Command::Estop {
            device,
            state_dir,
            store,
            reason,
        } => safety::estop(
            device.as_deref(),
            store::StoreChoice {
                state_dir,
                store,
                ..Default::default()
            },
            &reason,
        ),
        Command::Reset {
            device,
            endpoint,
            reason,
        } => safety::reset(&device, &endpoint, &reason),
        Command::Arm {
            device,
            endpoint,
            reason,
        } => safety::set_armed("mhs.safety.arm", &device, &endpoint, &reason),
        Command::Disarm {
            device,
            endpoint,
            reason,
        } => safety::set_armed("mhs.safety.disarm", &device, &endpoint, &reason),
        Command::Sim { action } => sim::sim(action),
        Command::Codes => {
            print!("{}", tether_core::codes::registry_markdown());
            Ok(ExitCode::SUCCESS)
        }
        Command::Token {
            action: cli::TokenAction::New,
        } => {
            let token = tether_core::ids::token();
            let digest = hex::encode(tether_server::auth::token_digest(&token));
            println!("{token}");
            println!("token_sha256 = \"{digest}\"");
            eprintln!("tether: the first line is the token (keep it secret, give it to its caller); the second goes in that principal's [[principals]] entry");
            Ok(ExitCode::SUCCESS)
        }
    }
}
