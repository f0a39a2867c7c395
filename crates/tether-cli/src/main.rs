//! `tether` — the command-line entry point: serve, mcp, check, describe, audit.
//!
//! Exit codes: 0 success; 1 the thing checked is defective (a manifest defect,
//! a broken evidence chain); 2 usage, I/O or start-up errors.

mod config;

/// mimalloc instead of the system allocator: under 64 concurrent callers,
/// glibc malloc's arena contention cost about a quarter of the CPU of a
/// governed command (measured with perf; see docs/PERFORMANCE.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use tether_kernel::{Kernel, KernelConfig, Principal};
use tether_store::SqliteStore;

#[derive(Parser)]
#[command(
    name = "tether",
    version,
    about = "The governed path between AI agents and machines. A software envelope, not a safety-rated channel: keep an independent hardware e-stop."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve JSON-RPC and/or MCP over HTTP (built-in simulated cell when no --config is given).
    Serve {
        /// Endpoint config (TOML).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where evidence, latches, budgets and receipts persist.
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Serve JSON-RPC on standard input/output, one JSON value per line.
        #[arg(long, conflicts_with = "http")]
        stdio: bool,
        /// Serve JSON-RPC over HTTP at ADDR (POST /rpc); port 0 picks a free port.
        #[arg(long, value_name = "ADDR")]
        http: Option<String>,
        /// Serve MCP over streamable HTTP at ADDR (path /mcp); port 0 picks a free port.
        #[arg(long, value_name = "ADDR", conflicts_with = "stdio")]
        mcp_http: Option<String>,
    },
    /// Serve MCP on standard input/output (what an MCP client launches).
    Mcp {
        /// Endpoint config (TOML).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where evidence, latches, budgets and receipts persist.
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Environment variable holding this caller's bearer token (needed
        /// when principals are configured; never pass a token as a flag).
        #[arg(long, value_name = "NAME", default_value = "TETHER_TOKEN")]
        token_env: String,
    },
    /// Check a config (or a single device manifest, or a `.cedar` policy
    /// against the built-in cell) and print every defect. A config's policy is
    /// validated too.
    Check {
        /// Config, manifest or policy file.
        file: PathBuf,
        /// Print the Tether Cedar schema policies are validated against.
        #[arg(long)]
        schema: bool,
    },
    /// Operators: list, approve or deny held commands on a running endpoint
    /// (the operator's token comes from TETHER_TOKEN).
    Approvals {
        #[command(subcommand)]
        action: ApprovalAction,
        /// The endpoint's JSON-RPC URL.
        #[arg(long, global = true, default_value = "http://127.0.0.1:7878/rpc")]
        endpoint: String,
    },
    /// Print a device's reference file (limits with units and sources, safety).
    Describe {
        /// Device id.
        device: String,
        /// Endpoint config (TOML); the built-in cell when absent.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Print reference.json instead of Markdown.
        #[arg(long)]
        json: bool,
    },
    /// Export or verify the evidence chain.
    Audit {
        #[command(subcommand)]
        action: AuditAction,
    },
    /// Trip the governed stop from a shell: every endpoint on the state
    /// directory latches (one device, or all). Works with no endpoint running.
    Estop {
        /// Only this device (default: every device).
        #[arg(long)]
        device: Option<String>,
        /// State directory shared with the endpoints.
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Why (recorded in the evidence).
        #[arg(long, default_value = "tether estop from a shell")]
        reason: String,
    },
    /// Ask a running endpoint to reset a device's latch (operator command).
    Reset {
        /// Device to reset.
        #[arg(long)]
        device: String,
        /// The endpoint's JSON-RPC URL.
        #[arg(long, default_value = "http://127.0.0.1:7878/rpc")]
        endpoint: String,
        /// Why (recorded in the evidence).
        #[arg(long, default_value = "operator reset from a shell")]
        reason: String,
    },
    /// Arm hardware actuation of a hardware or hybrid device (operator only,
    /// token in TETHER_TOKEN).
    Arm {
        /// Device to arm.
        #[arg(long)]
        device: String,
        /// The endpoint's JSON-RPC URL.
        #[arg(long, default_value = "http://127.0.0.1:7878/rpc")]
        endpoint: String,
        /// Why (recorded in the evidence).
        #[arg(long, default_value = "armed by an operator from a shell")]
        reason: String,
    },
    /// Disarm hardware actuation of a hardware or hybrid device.
    Disarm {
        /// Device to disarm.
        #[arg(long)]
        device: String,
        /// The endpoint's JSON-RPC URL.
        #[arg(long, default_value = "http://127.0.0.1:7878/rpc")]
        endpoint: String,
        /// Why (recorded in the evidence).
        #[arg(long, default_value = "disarmed from a shell")]
        reason: String,
    },
    /// Simulator controls (for people and tests, never reachable by a model).
    Sim {
        #[command(subcommand)]
        action: SimAction,
    },
    /// Print the MHS error-code registry as Markdown.
    Codes,
}

#[derive(Subcommand)]
enum ApprovalAction {
    /// List approvals (operators see all, others their own).
    List {
        /// Only this status: pending, approved, denied, used or expired.
        #[arg(long)]
        status: Option<String>,
    },
    /// Show one approval.
    Get {
        /// Approval id.
        id: String,
    },
    /// Vote to approve.
    Approve {
        /// Approval id.
        id: String,
        /// Why (recorded in the evidence).
        #[arg(long, default_value = "approved from a shell")]
        reason: String,
    },
    /// Deny (final).
    Deny {
        /// Approval id.
        id: String,
        /// Why (recorded in the evidence).
        #[arg(long, default_value = "denied from a shell")]
        reason: String,
    },
}

#[derive(Subcommand)]
enum SimAction {
    /// Run the simulated arm as a separate controller process (leased commands
    /// over a line protocol; docs/SIM_PROTOCOL.md). Point a `remote.arm` device at it.
    Serve {
        /// Address to listen on; port 0 picks a free port and prints it.
        #[arg(long, default_value = "127.0.0.1:7879")]
        listen: String,
    },
    /// Print the external simulator's arm status (positions, moving, last stop).
    Status {
        /// The simulator's address.
        #[arg(long, default_value = "127.0.0.1:7879")]
        connect: String,
    },
    /// Open or close a simulated door contact (the `door` interlock of arm-1):
    /// of the built-in cell on a state directory, or with `--connect` of an
    /// external simulator (`tether sim serve`).
    Door {
        /// `open` or `close`.
        #[arg(value_parser = ["open", "close"])]
        state: String,
        /// Device whose door it is (built-in cell).
        #[arg(long, default_value = "arm-1")]
        device: String,
        /// State directory of the endpoint (built-in cell).
        #[arg(long, conflicts_with = "connect")]
        state_dir: Option<PathBuf>,
        /// The external simulator's address: set its door instead.
        #[arg(long)]
        connect: Option<String>,
    },
}

#[derive(Subcommand)]
enum AuditAction {
    /// Write the chain as JSON Lines to standard output.
    Export {
        /// State directory.
        #[arg(long)]
        state_dir: Option<PathBuf>,
    },
    /// Verify a chain; exit 1 naming the first broken entry.
    Verify {
        /// State directory to verify.
        #[arg(long, conflicts_with = "file")]
        state_dir: Option<PathBuf>,
        /// Exported JSON Lines file to verify.
        #[arg(long)]
        file: Option<PathBuf>,
    },
}

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

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(
        cli.command,
        Command::Check { .. } | Command::Describe { .. } | Command::Codes | Command::Audit { .. }
    ) {
        die_quietly_on_closed_pipe();
    }
    let result = match cli.command {
        Command::Serve {
            config,
            state_dir,
            stdio,
            http,
            mcp_http,
        } => serve(
            config,
            state_dir,
            Surfaces {
                stdio,
                http,
                mcp_http,
            },
        ),
        Command::Mcp {
            config,
            state_dir,
            token_env,
        } => mcp(config, state_dir, &token_env),
        Command::Check { file, schema } => Ok(check(&file, schema)),
        Command::Approvals { action, endpoint } => approvals(action, &endpoint),
        Command::Describe {
            device,
            config,
            json,
        } => describe(&device, config, json),
        Command::Audit { action } => audit(action),
        Command::Estop {
            device,
            state_dir,
            reason,
        } => estop(device.as_deref(), state_dir, &reason),
        Command::Reset {
            device,
            endpoint,
            reason,
        } => reset(&device, &endpoint, &reason),
        Command::Arm {
            device,
            endpoint,
            reason,
        } => set_armed("mhs.safety.arm", &device, &endpoint, &reason),
        Command::Disarm {
            device,
            endpoint,
            reason,
        } => set_armed("mhs.safety.disarm", &device, &endpoint, &reason),
        Command::Sim {
            action: SimAction::Serve { listen },
        } => sim_serve(&listen),
        Command::Sim {
            action: SimAction::Status { connect },
        } => sim_status(&connect),
        Command::Sim {
            action:
                SimAction::Door {
                    state,
                    device,
                    state_dir,
                    connect,
                },
        } => {
            if let Some(addr) = connect {
                sim_door_remote(&addr, &state)
            } else {
                sim_door_local(state_dir, &device, &state)
            }
        }
        Command::Codes => {
            print!("{}", tether_core::codes::registry_markdown());
            Ok(ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tether: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn print_defects(defects: &[tether_kernel::loader::Defect]) {
    for d in defects {
        eprintln!("{d}");
    }
    eprintln!("tether: {} defect(s); nothing was started", defects.len());
}

fn check(file: &std::path::Path, print_schema: bool) -> ExitCode {
    if file.extension().is_some_and(|e| e == "cedar") {
        return check_policy_file(file, print_schema);
    }
    let loaded = match config::read(Some(file)) {
        Ok(l) => l,
        Err(defects) => {
            print_defects(&defects);
            return ExitCode::from(1);
        }
    };
    if let Err(defects) = config::authenticator(&loaded, file) {
        print_defects(&defects);
        return ExitCode::from(1);
    }
    let cell = match config::load_cell(&loaded) {
        Ok(cell) => cell,
        Err(defects) => {
            print_defects(&defects);
            return ExitCode::from(1);
        }
    };
    for d in &cell.devices {
        println!(
            "ok: device `{}` ({}, {}, {} binding(s)) from {}",
            d.manifest.device_id,
            d.manifest.mode.as_str(),
            d.manifest.risk_class,
            d.bindings.len(),
            d.origin
        );
    }
    report_policy(&cell, loaded.policy.as_ref(), print_schema)
}

/// Validates a policy against a cell and says so; exit 1 on a defect.
fn report_policy(
    cell: &tether_kernel::loader::Cell,
    policy: Option<&(String, String)>,
    print_schema: bool,
) -> ExitCode {
    if print_schema {
        println!("{}", tether_kernel::policy::schema_for(cell));
    }
    let source = policy.map(|(n, t)| (n.as_str(), t.as_str()));
    match tether_kernel::policy::check_policy(cell, source) {
        Ok(p) => {
            println!(
                "ok: policy {} ({} rule(s): {})",
                p.name(),
                p.policy_ids().len(),
                p.policy_ids().join(", ")
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            eprintln!("tether: the policy is invalid; nothing was started");
            ExitCode::from(1)
        }
    }
}

/// `tether check FILE.cedar`: the policy against the built-in cell.
fn check_policy_file(file: &std::path::Path, print_schema: bool) -> ExitCode {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{}: cannot read policy: {e}", file.display());
            return ExitCode::from(1);
        }
    };
    let cell = match config::read(None).and_then(|l| config::load_cell(&l)) {
        Ok(c) => c,
        Err(defects) => {
            print_defects(&defects);
            return ExitCode::from(1);
        }
    };
    println!("checking {} against the built-in cell (use a config's `policy` key to check against yours)", file.display());
    report_policy(
        &cell,
        Some(&(file.display().to_string(), text)),
        print_schema,
    )
}

/// `tether approvals ...`: JSON-RPC calls to a running endpoint.
fn approvals(action: ApprovalAction, endpoint: &str) -> anyhow::Result<ExitCode> {
    let (method, params) = match &action {
        ApprovalAction::List { status } => (
            "mhs.approvals.list",
            match status {
                Some(s) => serde_json::json!({"status": s}),
                None => serde_json::json!({}),
            },
        ),
        ApprovalAction::Get { id } => ("mhs.approvals.get", serde_json::json!({"approval_id": id})),
        ApprovalAction::Approve { id, reason } => (
            "mhs.approvals.decide",
            serde_json::json!({"approval_id": id, "decision": "approve", "reason": reason}),
        ),
        ApprovalAction::Deny { id, reason } => (
            "mhs.approvals.decide",
            serde_json::json!({"approval_id": id, "decision": "deny", "reason": reason}),
        ),
    };
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    // The operator's token comes from the environment, never from a flag.
    let token = std::env::var("TETHER_TOKEN").ok();
    let answer = http_post_json(endpoint, &body.to_string(), token.as_deref())
        .with_context(|| format!("asking {endpoint}"))?;
    let v: serde_json::Value =
        serde_json::from_str(&answer).context("the endpoint's answer is not JSON")?;
    if let Some(e) = v.get("error") {
        eprintln!(
            "tether: {} ({})",
            e["message"].as_str().unwrap_or("refused"),
            e["data"]["mhs_code"].as_str().unwrap_or("?")
        );
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::from(1));
    }
    let result = &v["result"];
    if let ApprovalAction::List { .. } = action {
        print_approval_table(result);
    } else {
        println!("{}", serde_json::to_string_pretty(result)?);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_approval_table(result: &serde_json::Value) {
    let list = result["approvals"].as_array().cloned().unwrap_or_default();
    if list.is_empty() {
        println!("no approvals");
        return;
    }
    for a in list {
        println!(
            "{}  {:<8}  {}/{}  {}/{} votes  by {}  {}",
            a["approval_id"].as_str().unwrap_or("?"),
            a["status"].as_str().unwrap_or("?"),
            a["device_id"].as_str().unwrap_or("?"),
            a["capability_id"].as_str().unwrap_or("?"),
            a["approvals"],
            a["quorum"],
            a["requested_by"]["id"].as_str().unwrap_or("?"),
            a["reason"].as_str().unwrap_or("")
        );
    }
}

fn describe(device: &str, config: Option<PathBuf>, json: bool) -> anyhow::Result<ExitCode> {
    let loaded = config::read(config.as_deref()).map_err(|d| {
        anyhow::anyhow!(d
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n"))
    })?;
    let cell = config::load_cell(&loaded).map_err(|d| {
        anyhow::anyhow!(d
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n"))
    })?;
    let Some(spec) = cell.devices.iter().find(|d| d.manifest.device_id == device) else {
        bail!(
            "no device `{device}` (devices: {})",
            cell.devices
                .iter()
                .map(|d| d.manifest.device_id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&tether_kernel::reference::reference_json(spec))?
        );
    } else {
        print!("{}", tether_kernel::reference::reference_markdown(spec));
    }
    Ok(ExitCode::SUCCESS)
}

fn audit(action: AuditAction) -> anyhow::Result<ExitCode> {
    match action {
        AuditAction::Export { state_dir } => {
            let dir = config::state_dir(state_dir.as_deref(), None);
            let store = SqliteStore::open(&dir)
                .with_context(|| format!("opening the store in {}", dir.display()))?;
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            let n = tether_store::Store::export_chain(&store, &mut out)?;
            out.flush()?;
            eprintln!("tether: exported {n} entries from {}", dir.display());
            Ok(ExitCode::SUCCESS)
        }
        AuditAction::Verify { state_dir, file } => {
            let report = match file {
                // `-` is standard input, as for other Unix tools:
                // `tether audit export | tether audit verify --file -`.
                Some(f) if f.as_os_str() == "-" => {
                    tether_store::verify::verify_jsonl(std::io::BufReader::new(std::io::stdin()))
                }
                Some(f) => {
                    let fh = std::fs::File::open(&f)
                        .with_context(|| format!("opening {}", f.display()))?;
                    tether_store::verify::verify_jsonl(std::io::BufReader::new(fh))
                }
                None => {
                    let dir = config::state_dir(state_dir.as_deref(), None);
                    tether_store::verify::verify_store(&dir)
                        .with_context(|| format!("reading the store in {}", dir.display()))?
                }
            };
            match (&report.ok, &report.first_broken) {
                (true, _) => {
                    println!("ok: {} entries, chain intact", report.entries);
                    Ok(ExitCode::SUCCESS)
                }
                (false, Some(b)) => {
                    println!(
                        "broken: first broken entry at {b} ({} intact entries before it)",
                        report.entries
                    );
                    Ok(ExitCode::from(1))
                }
                (false, None) => {
                    println!("broken: chain did not verify");
                    Ok(ExitCode::from(1))
                }
            }
        }
    }
}

fn sim_serve(listen: &str) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        eprintln!(
            "tether-sim: listening on {} ({}; simulated arm-1, leases enforced by the controller)",
            listener.local_addr()?,
            tether_drivers::simproc::PROTOCOL
        );
        tether_drivers::simproc::serve(listener).await?;
        Ok(ExitCode::SUCCESS)
    })
}

/// Sets the door contact of the built-in cell on a state directory.
fn sim_door_local(
    state_dir: Option<PathBuf>,
    device: &str,
    state: &str,
) -> anyhow::Result<ExitCode> {
    let dir = config::state_dir(state_dir.as_deref(), None);
    let env = tether_drivers::SimEnv::in_state_dir(&dir);
    match tether_drivers::set_sim_contact(&env, device, "door", state == "close") {
        Ok(()) => {
            println!(
                "simulated door of {device} in the built-in cell on {}: {} (an external `tether sim serve` is set with --connect)",
                dir.display(),
                if state == "close" { "closed" } else { "open" }
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Err(anyhow::anyhow!("cannot write the simulator control: {e}")),
    }
}

/// Sets the door of an external simulator and says what it now reports.
fn sim_door_remote(connect: &str, state: &str) -> anyhow::Result<ExitCode> {
    use std::io::{BufRead, Write as _};
    let wanted = if state == "close" { "closed" } else { "open" };
    let mut stream = std::net::TcpStream::connect(connect)
        .with_context(|| format!("connecting to {connect}"))?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(2)))?;
    let request = serde_json::json!({"id": 1, "op": "door", "state": wanted});
    stream.write_all(format!("{request}\n").as_bytes())?;
    let mut line = String::new();
    std::io::BufReader::new(stream).read_line(&mut line)?;
    let v: serde_json::Value =
        serde_json::from_str(&line).context("the simulator's answer is not JSON")?;
    if v["ok"] != true {
        anyhow::bail!("the simulator refused the door change: {v}");
    }
    println!("simulated door at {connect}: {wanted}");
    Ok(ExitCode::SUCCESS)
}

fn sim_status(connect: &str) -> anyhow::Result<ExitCode> {
    use std::io::{BufRead, Write as _};
    let mut stream = std::net::TcpStream::connect(connect)
        .with_context(|| format!("connecting to {connect}"))?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(2)))?;
    stream.write_all(b"{\"id\":1,\"op\":\"status\",\"device\":\"arm-1\"}\n")?;
    let mut line = String::new();
    std::io::BufReader::new(stream).read_line(&mut line)?;
    let v: serde_json::Value =
        serde_json::from_str(&line).context("the simulator's answer is not JSON")?;
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(ExitCode::SUCCESS)
}

fn estop(
    device: Option<&str>,
    state_dir: Option<PathBuf>,
    reason: &str,
) -> anyhow::Result<ExitCode> {
    let dir = config::state_dir(state_dir.as_deref(), None);
    let store = SqliteStore::open(&dir)
        .with_context(|| format!("opening the store in {}", dir.display()))?;
    match tether_kernel::governed::trip_in_store(&store, device, reason, "cli") {
        Ok(since) => {
            println!(
                "governed stop latched and durable: {} (at {since} ms, state {})",
                device.unwrap_or("every device"),
                dir.display()
            );
            if device.is_some() {
                eprintln!("tether: note: the device id is not checked here; an endpoint that serves no such device stops nothing");
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            // Not durable means not acknowledged: say so and fail.
            eprintln!("tether: the stop could NOT be made durable: {e}");
            Ok(ExitCode::from(2))
        }
    }
}

fn reset(device: &str, endpoint: &str, reason: &str) -> anyhow::Result<ExitCode> {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "mhs.safety.reset", "params": {"device_id": device, "reason": reason}});
    // The operator's token comes from the environment, never from a flag
    // (flags show up in process listings).
    let token = std::env::var("TETHER_TOKEN").ok();
    // A hardware latch is released by a person at a terminal, never by a
    // script a model could run: check the device's mode first.
    let get = serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "mhs.devices.get", "params": {"device_id": device}});
    let about = http_post_json(endpoint, &get.to_string(), token.as_deref())
        .with_context(|| format!("asking {endpoint}"))?;
    let about: serde_json::Value =
        serde_json::from_str(&about).context("the endpoint's answer is not JSON")?;
    let mode = about["result"]["device"]["mode"]
        .as_str()
        .unwrap_or("unknown")
        .to_owned();
    if matches!(mode.as_str(), "hardware" | "hybrid" | "unknown")
        && !std::io::IsTerminal::is_terminal(&std::io::stdin())
    {
        eprintln!("tether: resetting a {mode} device needs an operator at an interactive terminal (and the operator's TETHER_TOKEN)");
        return Ok(ExitCode::from(2));
    }
    let answer = http_post_json(endpoint, &body.to_string(), token.as_deref())
        .with_context(|| format!("asking {endpoint}"))?;
    let v: serde_json::Value =
        serde_json::from_str(&answer).context("the endpoint's answer is not JSON")?;
    println!("{}", serde_json::to_string_pretty(&v)?);
    let completed = v["result"]["status"] == "completed";
    Ok(if completed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `tether arm` / `tether disarm`: one JSON-RPC call with the operator's
/// token from the environment; exit 0 when the endpoint says it is done.
fn set_armed(method: &str, device: &str, endpoint: &str, reason: &str) -> anyhow::Result<ExitCode> {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": {"device_id": device, "reason": reason}});
    let token = std::env::var("TETHER_TOKEN").ok();
    let answer = http_post_json(endpoint, &body.to_string(), token.as_deref())
        .with_context(|| format!("asking {endpoint}"))?;
    let v: serde_json::Value =
        serde_json::from_str(&answer).context("the endpoint's answer is not JSON")?;
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(if v.get("result").is_some() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// A minimal HTTP/1.1 POST on loopback: the CLI needs no TLS stack or HTTP
/// client crate for one request to a local endpoint.
fn http_post_json(url: &str, body: &str, token: Option<&str>) -> anyhow::Result<String> {
    use std::io::Read;
    let rest = url
        .strip_prefix("http://")
        .context("only http:// endpoints are supported")?;
    let (host, path) = rest.split_once('/').map_or((rest, ""), |(h, p)| (h, p));
    let mut stream = std::net::TcpStream::connect(host)?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "POST /{path} HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut raw = String::new();
    stream.take(16 << 20).read_to_string(&mut raw)?;
    let (_, payload) = raw
        .split_once("\r\n\r\n")
        .context("malformed HTTP answer")?;
    Ok(payload.to_owned())
}

/// Where the endpoint listens, and how.
struct Surfaces {
    /// JSON-RPC on stdin/stdout.
    stdio: bool,
    /// JSON-RPC over HTTP (`POST /rpc`).
    http: Option<String>,
    /// MCP over streamable HTTP (`/mcp`).
    mcp_http: Option<String>,
}

/// A kernel ready to serve, with the background work every endpoint runs.
/// Field order is drop order: the watcher and the reaper stop before the
/// runtime they run on.
struct Endpoint {
    kernel: Kernel,
    auth: tether_server::auth::Authenticator,
    dir: PathBuf,
    device_count: usize,
    _watcher: tether_kernel::governed::StopWatcher,
    _reaper: tokio::task::JoinHandle<()>,
    runtime: tokio::runtime::Runtime,
}

fn init_tracing() {
    // Logs go to stderr: stdout belongs to the stdio protocols.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TETHER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
}

/// The loaded config, cell and authenticator; `Err(code)` once the defects
/// were printed.
type Prepared = (
    config::Loaded,
    tether_kernel::loader::Cell,
    tether_server::auth::Authenticator,
);

fn prepare(config_path: Option<&std::path::Path>) -> Result<Prepared, ExitCode> {
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

/// Opens the store, starts the kernel, the governed-stop watcher and the
/// session reaper.
fn start(prepared: Prepared, state_dir: Option<PathBuf>) -> anyhow::Result<Endpoint> {
    let (loaded, cell, auth) = prepared;
    let dir = config::state_dir(state_dir.as_deref(), Some(&loaded));
    let drivers = tether_drivers::build_all_with(
        cell.devices.iter().map(|d| &d.manifest),
        &tether_drivers::SimEnv::in_state_dir(&dir),
    )
    .map_err(anyhow::Error::msg)?;
    let store = SqliteStore::open(&dir)
        .with_context(|| format!("opening the evidence store in {}", dir.display()))?;
    let endpoint_id = loaded
        .config
        .endpoint_id
        .clone()
        .unwrap_or_else(|| "tether-local".into());
    let device_count = cell.devices.len();
    let mut kernel_config = KernelConfig::standard(&endpoint_id);
    kernel_config.policy = loaded.policy.clone();
    if let Some(armed) = loaded.config.hardware_armed_at_start {
        kernel_config.hardware_armed_at_start = armed;
    }
    if let Some(ttl) = loaded.config.approval_ttl_s {
        // config::read refused any other value; kept as a guard.
        if !(1..=config::APPROVAL_TTL_S_MAX).contains(&ttl) {
            bail!("the config's approval_ttl_s must be between 1 and 604800 (seconds)");
        }
        kernel_config.approval_ttl_ms = ttl * 1000;
    }
    let kernel = match Kernel::new(kernel_config, cell, drivers, Arc::new(store)) {
        Ok(k) => k,
        Err(e @ tether_kernel::StartError::Policy(_)) => {
            bail!("{e}\nthe policy is invalid; nothing was started")
        }
        Err(e) => return Err(anyhow::Error::new(e).context("starting the kernel")),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // Obey stops tripped by other processes on the same state directory.
    let watcher = kernel
        .start_stop_watcher(runtime.handle().clone())
        .context("starting the governed-stop watcher")?;
    // Expired sessions get their operations cancelled and safe states run.
    let reaper = kernel.start_session_reaper(runtime.handle());
    Ok(Endpoint {
        kernel,
        auth,
        dir,
        device_count,
        _watcher: watcher,
        _reaper: reaper,
        runtime,
    })
}

/// The stdio caller, established once from the launching environment: a
/// missing or wrong token refuses start-up (fail closed).
fn stdio_principal(
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

fn serve(
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
        serve_network(kernel, auth, &surfaces, *device_count, dir).await
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
    device_count: usize,
    dir: &std::path::Path,
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
fn mcp(
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
