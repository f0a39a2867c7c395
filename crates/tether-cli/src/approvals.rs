//! `tether approvals list|get|approve|deny`: operators see and vote on held
//! commands at a running endpoint, over JSON-RPC (`mhs.approvals.*`).

use crate::cli::ApprovalAction;
use crate::rpc;
use std::process::ExitCode;

/// `tether approvals ...`: JSON-RPC calls to a running endpoint.
pub fn approvals(action: ApprovalAction, endpoint: &str) -> anyhow::Result<ExitCode> {
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
    let token = rpc::operator_token();
    let v = rpc::call(endpoint, &body, token.as_deref())?;
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

/// One line per approval: id, status, device/capability, votes, requester,
/// reason.
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
