//! The e-stop on JSON-RPC: recognising one in any request, however malformed
//! (a request is an e-stop by what it asks for, not by how well it is
//! written), and serving it leniently: nothing about its params may prevent
//! the stop; a defect widens it to every device.
//!
//! **Never belongs here:** the latch, its receipt or which devices a stop
//! reaches once asked (the kernel's `estop`), and any other method.

use serde_json::{json, Value};
use tether_core::catalogue;
use tether_core::{echo, Code};
use tether_kernel::{deadline_from_ms, ApiError, EstopRequest, Kernel, Principal};

/// Entries of `device_ids` looked at, at most (the rest is ignored).
const DEVICE_IDS_MAX: usize = 1024;

/// The text read the permissive way (`serde_json`'s: the last duplicate key
/// wins, depth bounded by its recursion limit), only to recognise an e-stop.
pub(super) fn lenient_parse(text: &str) -> Option<Value> {
    crate::permissive_parse(text)
}

/// Whether text that is not strict JSON reads as an e-stop: some `"method"`
/// member names `mhs.safety.estop`, or an `mhs.command` names the e-stop
/// class. A textual look, bounded by the (≤ 1 MiB) text; a false positive
/// stops devices, which for a request that mentions the e-stop is the safe
/// mistake.
///
/// Text the permissive parser still reads (a duplicate key, nesting beyond
/// the strict bound) is also judged by what that parse asks, alone or in a
/// batch, so a method written with escapes (`"mhs.safety.\u0065stop"`),
/// which the textual look cannot see, still stops (found by the `rpc` fuzz
/// target).
pub(super) fn names_estop_loosely(text: &str) -> bool {
    let method_is = |wanted: &str| crate::text_member_is(text, "method", wanted);
    let textual = method_is("\"mhs.safety.estop\"")
        || (method_is("\"mhs.command\"") && text.contains(&format!("\"{}\"", catalogue::ESTOP)));
    textual
        || lenient_parse(text).is_some_and(|v| match v {
            Value::Object(o) => estop_target(&o),
            Value::Array(items) => items.iter().filter_map(Value::as_object).any(estop_target),
            _ => false,
        })
}

/// Whether a JSON object asks for an e-stop (by method, whatever the envelope).
pub(super) fn estop_target(obj: &serde_json::Map<String, Value>) -> bool {
    match obj.get("method").and_then(Value::as_str) {
        Some("mhs.safety.estop") => true,
        Some("mhs.command") => is_estop_command(obj.get("params")),
        _ => false,
    }
}

/// Whether the params of an `mhs.command` name the e-stop class.
pub(super) fn is_estop_command(params: Option<&Value>) -> bool {
    params
        .and_then(|p| p.get("capability_id"))
        .and_then(Value::as_str)
        == Some(catalogue::ESTOP)
}

/// Serves the e-stop of a request whose envelope (or text) is defective,
/// recording the defect in the latch's reason; answers the receipt.
pub(super) async fn serve_malformed_estop(
    kernel: &Kernel,
    principal: &Principal,
    obj: &serde_json::Map<String, Value>,
    defect: &str,
) -> Value {
    // Params that cannot be used are ignored: the stop covers every device.
    let params = obj.get("params").and_then(Value::as_object);
    let device_ids: Vec<String> = params
        .and_then(|p| p.get("device_id"))
        .and_then(Value::as_str)
        .map(|s| vec![s.to_owned()])
        .into_iter()
        .flatten()
        .filter(|id| kernel.device_ids().contains(id))
        .collect();
    let reason = params
        .and_then(|p| p.get("reason"))
        .and_then(Value::as_str)
        .unwrap_or("e-stop")
        .chars()
        .take(kernel.text_chars_max())
        .collect::<String>();
    kernel
        .estop(EstopRequest {
            device_ids,
            reason,
            envelope_defect: Some(defect.to_owned()),
            requested_by: Some(principal.clone()),
            session_id: None,
            deadline: None,
        })
        .await
}

/// Params of an e-stop are read leniently: nothing about them may prevent the stop.
fn estop_request(
    principal: &Principal,
    params: &Value,
    kernel: &Kernel,
) -> (EstopRequest, Vec<String>, Option<ApiError>) {
    let mut ids = Vec::new();
    let mut fleet = Vec::new();
    let mut error = None;
    let mut add = |v: &Value| match v.as_str() {
        Some(id) if kernel.device_ids().iter().any(|d| d == id) => ids.push(id.to_owned()),
        // Served by another endpoint of the fleet: tripped through the store.
        Some(id) if kernel.fleet_owner_of(id).is_some() => fleet.push(id.to_owned()),
        Some(id) => {
            error = Some(ApiError::new(
                Code::DeviceUnknown,
                format!("no device `{}` is served here", echo::id(id)),
                json!({"device_id": echo::id(id)}),
            ));
        }
        None => {}
    };
    if let Some(v) = params.get("device_id") {
        add(v);
    }
    if let Some(Value::Array(list)) = params.get("device_ids") {
        list.iter().take(DEVICE_IDS_MAX).for_each(&mut add);
    }
    let reason = params
        .get("reason")
        .and_then(Value::as_str)
        .unwrap_or("")
        .chars()
        .take(kernel.text_chars_max())
        .collect();
    let session_id = params
        .get("session_id")
        .and_then(Value::as_str)
        .map(str::to_owned);
    (
        EstopRequest {
            device_ids: ids,
            reason,
            envelope_defect: None,
            requested_by: Some(principal.clone()),
            session_id,
            // An invalid deadline is ignored (the device's budget applies).
            deadline: params
                .get("deadline_ms")
                .and_then(Value::as_u64)
                .and_then(deadline_from_ms),
        },
        fleet,
        error,
    )
}

/// Serves a well-formed e-stop. A well-formed but unknown device id stops
/// nothing and is `MHS.DEVICE.UNKNOWN`.
pub(super) async fn serve_estop(
    kernel: &Kernel,
    p: &Principal,
    params: &Value,
) -> Result<Value, ApiError> {
    if let Some(defect) = estop_params_defect(params) {
        return Err(serve_estop_with_defective_params(kernel, p, params, defect).await);
    }
    let (req, fleet, error) = estop_request(p, params, kernel);
    if !fleet.is_empty() {
        // Devices of other endpoints first (their owners stop them); then
        // this endpoint's own, whose receipt carries the fleet's.
        let remote = kernel.estop_fleet(&fleet, &req.reason, Some(p)).await;
        if req.device_ids.is_empty() {
            return Ok(remote);
        }
        let mut local = kernel.estop(req).await;
        local["fleet"] = remote;
        return Ok(local);
    }
    match error {
        Some(e) if req.device_ids.is_empty() => Err(e),
        _ => Ok(kernel.estop(req).await),
    }
}

/// Serves the command form of the e-stop (`mhs.command` of the e-stop
/// class): it shares the e-stop path, so it needs no session, grant or valid
/// command_id, and is never refused by them.
pub(super) async fn serve_estop_command(
    kernel: &Kernel,
    p: &Principal,
    params: &Value,
) -> Result<Value, ApiError> {
    let mut stop = params.clone();
    if let Some(reason) = params.get("input").and_then(|i| i.get("reason")) {
        stop["reason"] = reason.clone();
    }
    serve_estop(kernel, p, &stop).await
}

/// A member of e-stop params that is present but cannot be used: the request
/// is still an e-stop (recognised by its method), so it is served — but on
/// every device, since which one it meant is unknown.
pub(crate) fn estop_params_defect(params: &Value) -> Option<String> {
    let not_string = |name: &str| params.get(name).is_some_and(|v| !v.is_string());
    for name in ["device_id", "reason", "session_id"] {
        if not_string(name) {
            return Some(format!("`{name}` must be a string"));
        }
    }
    match params.get("device_ids") {
        Some(Value::Array(ids)) if ids.iter().all(Value::is_string) => None,
        Some(_) => Some("`device_ids` must be an array of strings".into()),
        None => None,
    }
}

/// Latches every device for an e-stop whose params are defective, recording
/// the defect in the latch's reason, and answers the defect's error with
/// `estop_served` and the receipt.
async fn serve_estop_with_defective_params(
    kernel: &Kernel,
    p: &Principal,
    params: &Value,
    defect: String,
) -> ApiError {
    let reason = params
        .get("reason")
        .and_then(Value::as_str)
        .unwrap_or("e-stop")
        .chars()
        .take(kernel.text_chars_max())
        .collect::<String>();
    let receipt = kernel
        .estop(EstopRequest {
            device_ids: Vec::new(),
            reason,
            envelope_defect: Some(defect.clone()),
            requested_by: Some(p.clone()),
            session_id: None,
            deadline: None,
        })
        .await;
    ApiError::new(
        Code::ProtocolInvalidParams,
        format!("invalid e-stop params: {defect}; every device was stopped"),
        json!({"reason": "params_invalid", "message": defect, "estop_served": true, "receipt": receipt}),
    )
}

#[cfg(test)]
mod tests {
    use super::names_estop_loosely;

    /// Regression (the `rpc` fuzz target): a method written with JSON
    /// escapes in text the strict parser refuses (here a duplicate `id`) was
    /// not recognised as an e-stop, so nothing latched.
    #[test]
    fn an_escaped_estop_method_in_text_that_is_not_strict_json_is_an_estop() {
        for text in [
            r#"{"jsonrpc":"2.0","id":1,"id":1,"method":"mhs.safety.\u0065stop","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"id":1,"m\u0065thod":"mhs.safety.estop"}"#,
            r#"{"jsonrpc":"2.0","id":1,"id":1,"method":"mhs.command","params":{"capability_id":"cap.motion.\u0065stop.v1"}}"#,
            r#"[{"jsonrpc":"2.0","id":1,"id":1,"method":"mhs.safety.\u0065stop"}]"#,
        ] {
            assert!(names_estop_loosely(text), "{text}");
        }
        assert!(!names_estop_loosely(
            r#"{"jsonrpc":"2.0","id":1,"id":1,"method":"mhs.hello","params":{"reason":"mhs.safety.\u0065stop"}}"#
        ));
    }

    #[test]
    fn an_escaped_estop_method_beside_a_non_finite_number_is_an_estop() {
        for text in [
            r#"{"jsonrpc":"2.0","id":1,"id":1,"method":"mhs.safety.\u0065stop","params":{"deadline_ms":NaN}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"mhs.safety.\u0065stop","params":{"deadline_ms":1e999}}"#,
            r#"[{"jsonrpc":"2.0","id":1,"method":"mhs.command","params":{"capability_id":"cap.motion.\u0065stop.v1","x":-Infinity}}]"#,
        ] {
            assert!(names_estop_loosely(text), "{text}");
        }
        assert!(!names_estop_loosely(
            r#"{"jsonrpc":"2.0","id":1,"method":"mhs.hello","params":{"reason":"mhs.safety.\u0065stop","x":NaN}}"#
        ));
    }
}
