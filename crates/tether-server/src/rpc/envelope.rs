//! The order of checks up to the method, on every JSON-RPC transport: size,
//! UTF-8, strict JSON (no duplicate keys, bounded depth, finite numbers),
//! one object (batches are refused), the envelope's members, params an
//! object; then the method is dispatched. At each step a request that asks
//! for an e-stop is served anyway (`estop`), and the refusal says so.
//!
//! **Never belongs here:** what a method does or its params' shapes (in
//! `dispatch` and `params`), and how a response is written (in `reply`).

use super::dispatch::dispatch;
use super::estop::{estop_target, lenient_parse, names_estop_loosely, serve_malformed_estop};
use super::reply::{api_error_response, Reply};
use serde_json::{json, Value};
use tether_core::json::parse_strict;
use tether_core::{echo, Code};
use tether_kernel::{Kernel, Principal};

/// The answer to a request longer than [`crate::REQUEST_BYTES_MAX`], of
/// which `prefix` is the start: `MHS.PROTOCOL.TOO_LARGE`. A request that
/// reads as an e-stop is still one: every device is stopped (which one it
/// meant was never read) and the error says the stop was served.
pub async fn too_large(
    kernel: &Kernel,
    principal: &Principal,
    prefix: &[u8],
    size: Option<usize>,
) -> Reply {
    let mut details = json!({"limit_bytes": crate::REQUEST_BYTES_MAX});
    if let Some(n) = size {
        details["size_bytes"] = json!(n);
    }
    if names_estop_loosely(&String::from_utf8_lossy(prefix)) {
        let mut every = serde_json::Map::new();
        every.insert("params".into(), json!({}));
        let receipt = serve_malformed_estop(kernel, principal, &every, "request too large").await;
        details["estop_served"] = json!(true);
        details["receipt"] = receipt;
    }
    Reply::error(
        Value::Null,
        Code::ProtocolTooLarge,
        "request too large",
        details,
    )
}

/// Handles one request text; `None` means no answer (an e-stop notification).
pub async fn handle_text(kernel: &Kernel, principal: &Principal, text: &[u8]) -> Option<Reply> {
    if text.len() > crate::REQUEST_BYTES_MAX {
        return Some(Reply::error(
            Value::Null,
            Code::ProtocolTooLarge,
            "request too large",
            json!({"limit_bytes": crate::REQUEST_BYTES_MAX, "size_bytes": text.len()}),
        ));
    }
    let Ok(text) = std::str::from_utf8(text) else {
        return Some(Reply::error(
            Value::Null,
            Code::ProtocolParseError,
            "request is not UTF-8",
            json!({"reason": "not_utf8"}),
        ));
    };
    let value = match parse_strict(text) {
        Ok(v) => v,
        Err(msg) => {
            // NaN, an infinity or a numeral beyond f64 in an e-stop reads as
            // null and the stop is served as if it had been written so
            // (OpenMHS CORE-076); in any other request it is a parse error.
            let repaired = tether_core::json::nonfinite_as_null(text);
            if let Some(Ok(Value::Object(obj))) = repaired.as_deref().map(parse_strict) {
                if estop_target(&obj) {
                    return handle_object(kernel, principal, obj).await;
                }
            }
            let mut details = json!({"reason": "invalid_json", "message": msg});
            // Text that reads as an e-stop though it is not strict JSON (a
            // duplicate key, truncated) latches, and the parse error says so.
            // Which device it meant cannot be trusted (the permissive reading
            // keeps the last of two keys), so it stops every device.
            if names_estop_loosely(text) {
                let lenient =
                    lenient_parse(text).or_else(|| repaired.as_deref().and_then(lenient_parse));
                let reason = lenient
                    .as_ref()
                    .and_then(|v| v.get("params"))
                    .and_then(|p| p.get("reason"))
                    .cloned();
                let mut every = serde_json::Map::new();
                every.insert("params".into(), json!({"reason": reason}));
                let defect = format!("request is not strict JSON: {msg}");
                let receipt = serve_malformed_estop(kernel, principal, &every, &defect).await;
                details["estop_served"] = json!(true);
                details["receipt"] = receipt;
            }
            return Some(Reply::error(
                Value::Null,
                Code::ProtocolParseError,
                "parse error",
                details,
            ));
        }
    };
    handle_value(kernel, principal, value).await
}

/// Handles a parsed value.
pub async fn handle_value(kernel: &Kernel, principal: &Principal, value: Value) -> Option<Reply> {
    match value {
        Value::Object(obj) => handle_object(kernel, principal, obj).await,
        Value::Array(items) => {
            // A batch is refused, but an e-stop inside it still latches.
            let stop = items
                .iter()
                .filter_map(Value::as_object)
                .find(|o| estop_target(o))
                .cloned();
            let mut details = json!({"reason": "batch_unsupported"});
            if let Some(o) = stop {
                let receipt =
                    serve_malformed_estop(kernel, principal, &o, "sent inside a batch").await;
                details["estop_served"] = json!(true);
                details["receipt"] = receipt;
            }
            Some(Reply::error(
                Value::Null,
                Code::ProtocolInvalidRequest,
                "batches are not supported; send one request at a time",
                details,
            ))
        }
        _ => Some(Reply::error(
            Value::Null,
            Code::ProtocolInvalidRequest,
            "a request must be a JSON object",
            json!({"reason": "not_an_object"}),
        )),
    }
}

/// Longest string `id` a request may carry: every answer repeats it, so an
/// answer never grows with a request's id beyond what an error may echo.
const REQUEST_ID_CHARS_MAX: usize = echo::TEXT_ECHO_CHARS_MAX;

fn id_fits(id: &str) -> bool {
    id.char_indices().nth(REQUEST_ID_CHARS_MAX).is_none()
}

/// The first defect of a JSON-RPC envelope, as `(details.reason, message)`.
fn envelope_defect(obj: &serde_json::Map<String, Value>) -> Option<(&'static str, String)> {
    if obj.get("jsonrpc") != Some(&json!("2.0")) {
        return Some(("jsonrpc_version", "\"jsonrpc\" must be \"2.0\"".into()));
    }
    match obj.get("id") {
        None => {
            return Some((
                "notification",
                "notifications are not supported; every request needs an id".into(),
            ))
        }
        Some(Value::String(s)) if id_fits(s) => {}
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => {}
        Some(_) => {
            return Some((
                "id_invalid",
                format!(
                    "id must be a string of at most {REQUEST_ID_CHARS_MAX} characters or an integer"
                ),
            ))
        }
    }
    if !obj.get("method").is_some_and(Value::is_string) {
        return Some(("method_missing", "method must be a string".into()));
    }
    for k in obj.keys() {
        if !matches!(k.as_str(), "jsonrpc" | "id" | "method" | "params") {
            return Some((
                "unknown_member",
                format!("unknown envelope member `{}`", echo::id(k)),
            ));
        }
    }
    None
}

/// The request's id when it is a valid one, else `null` (for the answer).
fn usable_id(obj: &serde_json::Map<String, Value>) -> Value {
    match obj.get("id") {
        Some(Value::String(s)) if id_fits(s) => json!(s),
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Value::Number(n.clone()),
        _ => Value::Null,
    }
}

/// Handles one request object: envelope, params shape, then the method.
async fn handle_object(
    kernel: &Kernel,
    principal: &Principal,
    obj: serde_json::Map<String, Value>,
) -> Option<Reply> {
    let id = usable_id(&obj);
    if let Some((reason, message)) = envelope_defect(&obj) {
        if estop_target(&obj) {
            let receipt = serve_malformed_estop(kernel, principal, &obj, &message).await;
            // An e-stop sent as a notification (no id at all) is never
            // answered, whatever else is wrong with its envelope.
            if reason == "notification" || !obj.contains_key("id") {
                return None;
            }
            return Some(Reply::error(
                id,
                Code::ProtocolInvalidRequest,
                &message,
                json!({"reason": reason, "estop_served": true, "receipt": receipt}),
            ));
        }
        return Some(Reply::error(
            id,
            Code::ProtocolInvalidRequest,
            &message,
            json!({"reason": reason}),
        ));
    }
    let method = obj
        .get("method")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let params_usable = obj.get("params").is_none_or(Value::is_object);
    if !params_usable {
        if estop_target(&obj) || method == "mhs.safety.estop" {
            let receipt =
                serve_malformed_estop(kernel, principal, &obj, "params is not an object").await;
            return Some(Reply::error(
                id,
                Code::ProtocolInvalidParams,
                "params must be an object",
                json!({"reason": "params_not_object", "estop_served": true, "receipt": receipt}),
            ));
        }
        return Some(Reply::error(
            id,
            Code::ProtocolInvalidParams,
            "params must be an object",
            json!({"reason": "params_not_object"}),
        ));
    }
    // Taken, not copied: the request is not needed past this point.
    let mut obj = obj;
    let params = obj.remove("params").unwrap_or_else(|| json!({}));
    let answer = dispatch(kernel, principal, &method, params).await;
    Some(match answer {
        Ok(result) => Reply::Result { id, result },
        Err(e) => Reply::Value(api_error_response(id, e)),
    })
}
