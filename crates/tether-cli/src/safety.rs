//! The safety commands from a shell: `tether estop` (the governed stop,
//! written straight into the store of a state directory, no endpoint needed),
//! and `tether reset`, `arm` and `disarm` (operator calls to a running
//! endpoint).

use crate::rpc;
use crate::store::StoreChoice;
use std::process::ExitCode;

/// `tether estop`: latches the governed stop in the store; exit 0 only once
/// it is durable, 2 when it is not.
pub fn estop(device: Option<&str>, choice: StoreChoice, reason: &str) -> anyhow::Result<ExitCode> {
    let opened = crate::store::open_for_shell(&choice)?;
    match tether_kernel::governed::trip_in_store(opened.store.as_ref(), device, reason, "cli") {
        Ok(since) => {
            println!(
                "governed stop latched and durable: {} (at {since} ms, {})",
                device.unwrap_or("every device"),
                opened.shown
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

/// `tether reset`: asks a running endpoint to reset a device's latch (exit 0
/// when completed, 1 when refused); a hardware or hybrid device only from an
/// interactive terminal.
pub fn reset(device: &str, endpoint: &str, reason: &str) -> anyhow::Result<ExitCode> {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "mhs.safety.reset", "params": {"device_id": device, "reason": reason}});
    let token = rpc::operator_token();
    // A hardware latch is released by a person at a terminal, never by a
    // script a model could run: check the device's mode first.
    let get = serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "mhs.devices.get", "params": {"device_id": device}});
    let about = rpc::call(endpoint, &get, token.as_deref())?;
    if let Some(e) = about.get("error") {
        // The real cause (no token, a token the endpoint does not know, an
        // unknown device), not a guess about terminals.
        eprintln!(
            "tether: cannot reset `{device}`: {}",
            rpc::refusal_text(e, token.as_deref())
        );
        return Ok(ExitCode::from(1));
    }
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
    let v = rpc::call(endpoint, &body, token.as_deref())?;
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
pub fn set_armed(
    method: &str,
    device: &str,
    endpoint: &str,
    reason: &str,
) -> anyhow::Result<ExitCode> {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": {"device_id": device, "reason": reason}});
    let token = rpc::operator_token();
    let v = rpc::call(endpoint, &body, token.as_deref())?;
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(if v.get("result").is_some() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
