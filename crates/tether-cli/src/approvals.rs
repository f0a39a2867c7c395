//! `tether approvals list|get|approve|deny`: operators see and vote on held
//! commands at a running endpoint, over JSON-RPC (`mhs.approvals.*`).

use crate::cli::ApprovalAction;
use crate::rpc;
use std::process::ExitCode;

/// Approvals asked for per page: the largest page.
const LIST_PAGE: usize = tether_kernel::bounds::APPROVALS_PAGE_MAX;
/// Pages `tether approvals list` reads at most: every approval the endpoint
/// can hold (open ones, and as many denials).
const LIST_PAGES_MAX: usize = 2 * tether_kernel::bounds::APPROVALS_OPEN_LIMIT / LIST_PAGE + 1;
const _: () =
    assert!(LIST_PAGES_MAX * LIST_PAGE >= 2 * tether_kernel::bounds::APPROVALS_OPEN_LIMIT);

/// `tether approvals ...`: JSON-RPC calls to a running endpoint.
pub fn approvals(action: ApprovalAction, endpoint: &str) -> anyhow::Result<ExitCode> {
    let token = rpc::operator_token();
    if let ApprovalAction::List { status } = &action {
        return list(endpoint, status.as_deref(), token.as_deref());
    }
    let (method, params) = match &action {
        ApprovalAction::Get { id } => ("mhs.approvals.get", serde_json::json!({"approval_id": id})),
        ApprovalAction::Approve { id, reason } => (
            "mhs.approvals.decide",
            serde_json::json!({"approval_id": id, "decision": "approve", "reason": reason}),
        ),
        ApprovalAction::Deny { id, reason } => (
            "mhs.approvals.decide",
            serde_json::json!({"approval_id": id, "decision": "deny", "reason": reason}),
        ),
        ApprovalAction::List { .. } => return Ok(ExitCode::from(2)),
    };
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let v = rpc::call(endpoint, &body, token.as_deref())?;
    if let Some(code) = refused(&v)? {
        return Ok(code);
    }
    println!("{}", serde_json::to_string_pretty(&v["result"])?);
    Ok(ExitCode::SUCCESS)
}

/// Prints a refusal and answers exit 1, or `None` when `v` is a result.
fn refused(v: &serde_json::Value) -> anyhow::Result<Option<ExitCode>> {
    let Some(e) = v.get("error") else {
        return Ok(None);
    };
    eprintln!(
        "tether: {}",
        rpc::refusal_text(e, rpc::operator_token().as_deref())
    );
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(Some(ExitCode::from(1)))
}

/// `tether approvals list`: every page of `mhs.approvals.list` (each
/// `next_cursor` followed, at most [`LIST_PAGES_MAX`] pages), one line per
/// approval.
fn list(endpoint: &str, status: Option<&str>, token: Option<&str>) -> anyhow::Result<ExitCode> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..LIST_PAGES_MAX {
        let mut params = serde_json::json!({"limit": LIST_PAGE});
        if let Some(s) = status {
            params["status"] = serde_json::json!(s);
        }
        if let Some(c) = &cursor {
            params["cursor"] = serde_json::json!(c);
        }
        let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "mhs.approvals.list", "params": params});
        let v = rpc::call(endpoint, &body, token)?;
        if let Some(code) = refused(&v)? {
            return Ok(code);
        }
        all.extend(
            v["result"]["approvals"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
        );
        match v["result"]["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => {
                cursor = None;
                break;
            }
        }
    }
    print_approval_table(&all);
    if cursor.is_some() {
        eprintln!("tether: more approvals than {LIST_PAGES_MAX} pages; narrow with --status");
    }
    Ok(ExitCode::SUCCESS)
}

/// One line per approval: id, status, device/capability, votes, requester,
/// reason.
fn print_approval_table(list: &[serde_json::Value]) {
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
