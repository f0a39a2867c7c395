//! Kernel answers as MCP values: tools with annotations, receipts and
//! refusals as tool results, reference files as resources.

use crate::tools::{self, ToolKind};
use rmcp::model::{
    CallToolResult, ContentBlock, JsonObject, ReadResourceResult, Resource, ResourceContents,
    ResourceTemplate, Tool, ToolAnnotations,
};
use rmcp::ErrorData as McpError;
use serde_json::{json, Value};
use std::sync::Arc;
use tether_core::Code;
use tether_kernel::{ApiError, Kernel};

/// Prefix of every resource URI.
const URI_PREFIX: &str = "tether://devices/";
const REFERENCE_JSON: &str = "reference.json";
const REFERENCE_MD: &str = "reference.md";

/// A catalogue tool as an MCP tool. Hints follow the kind: reads are
/// read-only; writes, actions and the e-stop change the world.
pub(super) fn tool(t: &tools::Tool) -> Tool {
    let schema: JsonObject = t.input_schema.as_object().cloned().unwrap_or_default();
    let read_only = t.kind == ToolKind::Read;
    let annotations = ToolAnnotations::new()
        .read_only(read_only)
        .destructive(!read_only)
        .idempotent(t.idempotent);
    Tool::new(t.name.clone(), t.description.clone(), Arc::new(schema)).annotate(annotations)
}

/// A receipt as a tool result: completed is a success; anything else
/// (rejected, failed, cancelled, unknown) is an error result naming the code.
pub(super) fn receipt(receipt: &Value) -> CallToolResult {
    let status = receipt["status"].as_str().unwrap_or("unknown");
    let full = ContentBlock::text(receipt.to_string());
    let mut result = if status == "completed" {
        CallToolResult::success(vec![ContentBlock::text(completed_line(receipt)), full])
    } else {
        let e = &receipt["error"];
        let line = refusal_line(
            e["mhs_code"]
                .as_str()
                .unwrap_or(Code::OutcomeUnknown.as_str()),
            e["message"].as_str().unwrap_or(status),
            &e["details"],
            status,
        );
        CallToolResult::error(vec![ContentBlock::text(line), full])
    };
    result.structured_content = Some(receipt.clone());
    result
}

/// An e-stop's receipt as a tool result. The receipt of a stop that covered
/// several devices is the first device's (with the rest under
/// `x-vendor.estop`), so the first text names every device stopped, and says
/// when the device the call named is not served (which stopped them all).
pub(super) fn estop(receipt: &Value, unknown: Option<&str>) -> CallToolResult {
    let mut result = self::receipt(receipt);
    let line = estop_line(receipt, unknown);
    if let Some(first) = result.content.first_mut() {
        *first = ContentBlock::text(line);
    }
    result
}

/// `(device_id, status)` of every device an e-stop receipt covers.
fn stopped_devices(receipt: &Value) -> Vec<(String, String)> {
    let text = |v: &Value, default: &str| v.as_str().unwrap_or(default).to_owned();
    match receipt["x-vendor.estop"]["devices"].as_array() {
        Some(list) => list
            .iter()
            .map(|d| (text(&d["device_id"], "?"), text(&d["status"], "unknown")))
            .collect(),
        None => vec![(
            text(&receipt["device_id"], "?"),
            text(&receipt["status"], "unknown"),
        )],
    }
}

fn estop_line(receipt: &Value, unknown: Option<&str>) -> String {
    let devices = stopped_devices(receipt);
    let every = unknown.is_some() || receipt["x-vendor.estop"]["scope"] == "all_devices";
    let all_completed = devices.iter().all(|(_, s)| s == "completed");
    let names: Vec<String> = devices
        .iter()
        .map(|(id, status)| {
            if all_completed {
                id.clone()
            } else {
                format!("{id} ({status})")
            }
        })
        .collect();
    let mut line = String::new();
    if let Some(d) = unknown {
        line.push_str(&format!(
            "No device `{d}` is served here, so every device was stopped. "
        ));
    }
    let scope = if every { "every device" } else { "device" };
    if all_completed {
        line.push_str(&format!(
            "E-stop completed: stopped {scope}: {}. Latched until an operator resets.",
            names.join(", ")
        ));
    } else {
        let e = &receipt["error"];
        line.push_str(&refusal_line(
            e["mhs_code"]
                .as_str()
                .unwrap_or(Code::OutcomeUnknown.as_str()),
            e["message"]
                .as_str()
                .unwrap_or("the stop path did not complete"),
            &e["details"],
            receipt["status"].as_str().unwrap_or("unknown"),
        ));
        line.push_str(&format!(
            " E-stop latched {scope}: {}; the latch stays and a failed stop path is retried.",
            names.join(", ")
        ));
    }
    line
}

/// An error the kernel answered before any receipt (session, device,
/// input shape) as an error result naming the code.
pub(super) fn api_error(e: &ApiError) -> CallToolResult {
    let body = json!({
        "mhs_code": e.code.as_str(),
        "message": e.message,
        "details": e.details,
        "retryable": e.code.retryable(),
    });
    let line = refusal_line(e.code.as_str(), &e.message, &e.details, "rejected");
    let mut result = CallToolResult::error(vec![
        ContentBlock::text(line),
        ContentBlock::text(body.to_string()),
    ]);
    result.structured_content = Some(json!({"error": body}));
    result
}

/// A read's answer (`revision`, `state`, ...) as a success.
pub(super) fn read(answer: &Value) -> CallToolResult {
    let line = format!(
        "revision {}: {}",
        answer["revision"],
        answer.get("state").unwrap_or(&Value::Null)
    );
    let mut result = CallToolResult::success(vec![ContentBlock::text(line)]);
    result.structured_content = Some(answer.clone());
    result
}

fn completed_line(receipt: &Value) -> String {
    let mut line = format!(
        "completed: {} on {}",
        receipt["capability_id"].as_str().unwrap_or("command"),
        receipt["device_id"].as_str().unwrap_or("the endpoint")
    );
    if let Some(after) = receipt.get("state_revision_after").filter(|v| !v.is_null()) {
        line.push_str(&format!(", revision now {after}"));
    }
    if let Some(out) = receipt.get("output").filter(|v| !v.is_null()) {
        line.push_str(&format!(", output {out}"));
    }
    line
}

/// One line a model can act on: the code, what was wrong (path, bound,
/// value, unit), and what happens next.
fn refusal_line(code: &str, message: &str, details: &Value, status: &str) -> String {
    let mut line = format!("{code} ({status}): {message}.");
    if let Some(path) = details.get("path").and_then(Value::as_str) {
        line.push_str(&format!(" Path `{path}`"));
        if let Some(value) = details.get("value") {
            line.push_str(&format!(": value {value}"));
        }
        if let Some(bound) = details.get("bound").filter(|b| !b.is_null()) {
            let kind = details
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or("bound");
            let unit = details
                .get("unit")
                .and_then(Value::as_str)
                .map(|u| format!(" {u}"))
                .unwrap_or_default();
            line.push_str(&format!(", {kind} bound {bound}{unit}"));
        }
        line.push('.');
    }
    line.push_str(&detail_sentences(details));
    if let Some(id) = details.get("approval_id").and_then(Value::as_str) {
        line.push_str(&held_sentences(id, details));
    }
    if status == "rejected" {
        line.push_str(" Nothing was dispatched.");
    }
    line
}

/// A hold in words: the approval, why, how many people must agree and how
/// many have, and what the model does next (wait, then call again).
fn held_sentences(id: &str, details: &Value) -> String {
    let mut out = format!(
        " Held for approval `{id}`: a person must approve or deny it; a model cannot. Nothing runs until then."
    );
    if let Some(reason) = details.get("reason").and_then(Value::as_str) {
        out.push_str(&format!(" Why: {reason}."));
    }
    if let Some(q) = details.get("quorum").and_then(Value::as_u64) {
        let have = details
            .get("approvals")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let people = if q == 1 { "operator" } else { "operators" };
        out.push_str(&format!(
            " It needs {q} {people} to approve; {have} have so far."
        ));
    }
    out.push_str(
        " Tell the user a person must decide. Once approved, call this tool again with exactly the same arguments: it resumes this hold and runs; a denial is final.",
    );
    out
}

/// The details other refusals carry, in words a model can act on: schema
/// errors with their paths, a budget's limit, use and request, unset or
/// unknown fields, open interlocks.
fn detail_sentences(details: &Value) -> String {
    let mut out = String::new();
    let list = |key: &str| -> Vec<String> {
        details
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .take(8)
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
            .collect()
    };
    if let Some(errors) = details.get("errors").and_then(Value::as_array) {
        for e in errors.iter().take(4) {
            let path = e.get("path").and_then(Value::as_str).unwrap_or("");
            let message = e
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("invalid");
            let at = if path.is_empty() { "the input" } else { path };
            out.push_str(&format!(" At `{at}`: {message}."));
        }
    }
    if let (Some(limit), Some(used), Some(requested)) = (
        details.get("limit"),
        details.get("used"),
        details.get("requested"),
    ) {
        let unit = details
            .get("unit")
            .and_then(Value::as_str)
            .map(|u| format!(" {u}"))
            .unwrap_or_default();
        let path = details
            .get("limit_path")
            .and_then(Value::as_str)
            .unwrap_or("the value");
        let window = details
            .get("window")
            .and_then(Value::as_str)
            .unwrap_or("its window");
        out.push_str(&format!(
            " Budget of `{path}` per {window}: limit {limit}{unit}, used {used}{unit}, this call asks {requested}{unit}."
        ));
    }
    let paths = list("paths");
    if !paths.is_empty() {
        out.push_str(&format!(" Paths: {}.", paths.join(", ")));
    }
    let fields = list("fields");
    if !fields.is_empty() {
        out.push_str(&format!(" Fields: {}.", fields.join(", ")));
    }
    if let Some(interlocks) = details.get("interlocks").and_then(Value::as_array) {
        let named: Vec<String> = interlocks
            .iter()
            .take(8)
            .map(|i| {
                format!(
                    "`{}` {}",
                    i.get("id").and_then(Value::as_str).unwrap_or("?"),
                    i.get("state").and_then(Value::as_str).unwrap_or("unknown")
                )
            })
            .collect();
        if !named.is_empty() {
            out.push_str(&format!(" Interlocks: {}.", named.join(", ")));
        }
    }
    out
}

fn uri(device_id: &str, file: &str) -> String {
    format!("{URI_PREFIX}{device_id}/{file}")
}

/// Two resources per device: its reference file as JSON and as Markdown.
pub(super) fn resources(device_ids: &[String]) -> Vec<Resource> {
    device_ids
        .iter()
        .flat_map(|id| {
            [
                Resource::new(uri(id, REFERENCE_JSON), format!("{id} reference (JSON)"))
                    .with_mime_type("application/json")
                    .with_description(format!(
                        "Effective limits with units, interlocks and safety declarations of `{id}`."
                    )),
                Resource::new(uri(id, REFERENCE_MD), format!("{id} reference (Markdown)"))
                    .with_mime_type("text/markdown")
                    .with_description(format!("The reference file of `{id}` for people.")),
            ]
        })
        .collect()
}

/// The URI templates of the reference files.
pub(super) fn resource_templates() -> Vec<ResourceTemplate> {
    vec![
        ResourceTemplate::new(
            format!("{URI_PREFIX}{{device_id}}/{REFERENCE_JSON}"),
            "device reference (JSON)",
        )
        .with_mime_type("application/json"),
        ResourceTemplate::new(
            format!("{URI_PREFIX}{{device_id}}/{REFERENCE_MD}"),
            "device reference (Markdown)",
        )
        .with_mime_type("text/markdown"),
    ]
}

/// Reads `tether://devices/{device_id}/reference.json|.md`.
pub(super) fn read_reference(kernel: &Kernel, uri: &str) -> Result<ReadResourceResult, McpError> {
    let not_found = || {
        McpError::resource_not_found(
            format!("no resource `{}`", tether_core::echo::text(uri)),
            None,
        )
    };
    let rest = uri.strip_prefix(URI_PREFIX).ok_or_else(not_found)?;
    // A device id may hold `/`; the file name never does.
    let (device_id, file) = rest.rsplit_once('/').ok_or_else(not_found)?;
    let got = kernel.device_get(device_id).map_err(|_| not_found())?;
    let contents = match file {
        REFERENCE_JSON => {
            let text = serde_json::to_string_pretty(&got["reference"])
                .map_err(|e| McpError::internal_error(e.to_string(), None))?;
            ResourceContents::text(text, uri).with_mime_type("application/json")
        }
        REFERENCE_MD => {
            let text = got["reference_md"].as_str().unwrap_or_default().to_owned();
            ResourceContents::text(text, uri).with_mime_type("text/markdown")
        }
        _ => return Err(not_found()),
    };
    Ok(ReadResourceResult::new(vec![contents]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_envelope_violation_names_code_path_value_and_bound() {
        let details = json!({"path": "target_temperature", "kind": "max", "bound": 90.0, "value": 120, "unit": "degC"});
        let line = refusal_line(
            "MHS.SAFETY.ENVELOPE_VIOLATION",
            "too hot",
            &details,
            "rejected",
        );
        assert!(line.starts_with("MHS.SAFETY.ENVELOPE_VIOLATION"), "{line}");
        assert!(line.contains("`target_temperature`"), "{line}");
        assert!(line.contains("value 120"), "{line}");
        assert!(line.contains("max bound 90.0 degC"), "{line}");
        assert!(line.contains("Nothing was dispatched"), "{line}");
    }

    #[test]
    fn a_hold_names_the_approval_and_the_person_who_must_decide() {
        let line = refusal_line(
            "MHS.POLICY.HELD",
            "held",
            &json!({"approval_id": "apr_1", "reason": "setpoints above 60 degC need two operators", "quorum": 2, "approvals": 1}),
            "rejected",
        );
        assert!(line.contains("`apr_1`"), "{line}");
        assert!(line.contains("a person must approve or deny"), "{line}");
        assert!(
            line.contains("Why: setpoints above 60 degC need two operators."),
            "{line}"
        );
        assert!(
            line.contains("needs 2 operators to approve; 1 have so far"),
            "{line}"
        );
        assert!(
            line.contains("call this tool again with exactly the same arguments"),
            "{line}"
        );
    }

    #[test]
    fn other_refusals_name_their_paths_budgets_fields_and_interlocks() {
        let schema = refusal_line(
            "MHS.CAPABILITY.INPUT_INVALID",
            "input does not match",
            &json!({"errors": [{"path": "/joints/5", "message": "\"x\" is not of type \"number\""}]}),
            "rejected",
        );
        assert!(schema.contains("`/joints/5`"), "{schema}");
        let budget = refusal_line(
            "MHS.SAFETY.CUMULATIVE_LIMIT",
            "budget exceeded",
            &json!({"used": 90.0, "limit": 100.0, "requested": 20.0, "window": "rolling_1h", "limit_path": "target_temperature", "unit": "degC"}),
            "rejected",
        );
        for part in [
            "limit 100",
            "used 90",
            "asks 20",
            "rolling_1h",
            "`target_temperature`",
        ] {
            assert!(budget.contains(part), "{part}: {budget}");
        }
        let unset = refusal_line(
            "MHS.SAFETY.LIMITS_UNSET",
            "unset",
            &json!({"paths": ["gain"], "reason": "operator_required"}),
            "rejected",
        );
        assert!(unset.contains("Paths: gain."), "{unset}");
        let door = refusal_line(
            "MHS.SAFETY.INTERLOCK_OPEN",
            "open",
            &json!({"interlocks": [{"id": "door", "state": "open"}]}),
            "rejected",
        );
        assert!(door.contains("`door` open"), "{door}");
    }

    #[test]
    fn a_completed_receipt_is_a_success_and_a_refusal_is_an_error() {
        let ok = receipt(&json!({"status": "completed", "device_id": "d", "capability_id": "c"}));
        assert_eq!(ok.is_error, Some(false));
        let refused = receipt(
            &json!({"status": "rejected", "error": {"mhs_code": "MHS.SAFETY.ESTOP_ENGAGED", "message": "latched", "details": {}}}),
        );
        assert_eq!(refused.is_error, Some(true));
    }

    #[test]
    fn an_all_device_estop_names_every_device_and_an_unknown_one() {
        let receipt = json!({
            "status": "completed", "device_id": "thermostat-1",
            "capability_id": "cap.internal.safety_estop.v1",
            "x-vendor.estop": {"scope": "all_devices", "devices": [
                {"device_id": "thermostat-1", "status": "completed"},
                {"device_id": "arm-1", "status": "completed"},
                {"device_id": "relay-1", "status": "completed"},
            ]},
        });
        let result = estop(&receipt, None);
        assert_eq!(result.is_error, Some(false));
        let first = result.content[0]
            .as_text()
            .map(|t| t.text.clone())
            .unwrap_or_default();
        assert!(
            first.contains("stopped every device: thermostat-1, arm-1, relay-1"),
            "{first}"
        );
        let result = estop(&receipt, Some("nope"));
        let first = result.content[0]
            .as_text()
            .map(|t| t.text.clone())
            .unwrap_or_default();
        assert!(
            first.starts_with("No device `nope` is served here"),
            "{first}"
        );
        assert!(first.contains("relay-1"), "{first}");
    }

    #[test]
    fn a_one_device_estop_names_it_and_a_failed_stop_says_so() {
        let one = json!({"status": "completed", "device_id": "arm-1"});
        let first = estop(&one, None).content[0]
            .as_text()
            .map(|t| t.text.clone())
            .unwrap_or_default();
        assert!(first.contains("stopped device: arm-1."), "{first}");
        let failed = json!({
            "status": "failed", "device_id": "arm-1",
            "error": {"mhs_code": "MHS.SAFETY.SAFE_STATE_UNREACHED", "message": "no", "details": {}},
            "x-vendor.estop": {"scope": "all_devices", "devices": [
                {"device_id": "arm-1", "status": "failed"},
                {"device_id": "relay-1", "status": "completed"},
            ]},
        });
        let result = estop(&failed, None);
        assert_eq!(result.is_error, Some(true));
        let first = result.content[0]
            .as_text()
            .map(|t| t.text.clone())
            .unwrap_or_default();
        assert!(
            first.starts_with("MHS.SAFETY.SAFE_STATE_UNREACHED"),
            "{first}"
        );
        assert!(
            first.contains("arm-1 (failed), relay-1 (completed)"),
            "{first}"
        );
    }

    #[test]
    fn resource_uris_round_trip_their_device() {
        let list = resources(&["arm-1".to_owned()]);
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].uri, "tether://devices/arm-1/reference.json");
    }
}
