//! `tether sim serve|status|door`: the simulator's controls, for people and
//! tests (never reachable by a model): the simulated arm as a separate
//! controller process, its status, and the door contact of the `door`
//! interlock, of the built-in cell on a state directory or of an external
//! simulator.

use crate::cli::SimAction;
use crate::config;
use anyhow::Context;
use std::path::PathBuf;
use std::process::ExitCode;

/// Runs one `tether sim` action.
pub fn sim(action: SimAction) -> anyhow::Result<ExitCode> {
    match action {
        SimAction::Serve { listen } => serve(&listen),
        SimAction::Status { connect } => status(&connect),
        SimAction::Door {
            state,
            device,
            state_dir,
            connect,
        } => {
            if let Some(addr) = connect {
                door_remote(&addr, &state)
            } else {
                door_local(state_dir, &device, &state)
            }
        }
    }
}

/// The simulated arm as a controller process on `listen`, until it is
/// stopped or its listener fails.
fn serve(listen: &str) -> anyhow::Result<ExitCode> {
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
fn door_local(state_dir: Option<PathBuf>, device: &str, state: &str) -> anyhow::Result<ExitCode> {
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
fn door_remote(connect: &str, state: &str) -> anyhow::Result<ExitCode> {
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

/// Prints what the external simulator reports about its arm.
fn status(connect: &str) -> anyhow::Result<ExitCode> {
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
