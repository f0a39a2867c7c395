//! JSON-RPC 2.0 handling shared by every transport.
//!
//! A request is checked in this order: size, strict JSON (no duplicate keys,
//! bounded depth, finite numbers), e-stop recognition (a request is an e-stop
//! by what it asks for, so a malformed envelope still latches), envelope,
//! method, params. Batches and notifications are refused with an error.

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::Duration;
use tether_core::catalogue;
use tether_core::json::parse_strict;
use tether_core::Code;
use tether_kernel::{
    deadline_from_ms, Answer, ApiError, CommandOptions, CommandRequest, EstopRequest, GrantRequest,
    Kernel, Principal, ReadRequest, ResetRequest, Route, SessionOpen, DEADLINE_MS_MAX,
};

/// A JSON-RPC error response.
pub fn error_response(id: Value, code: Code, message: &str, details: Value) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {
            "code": code.jsonrpc(),
            "message": message,
            "data": {"mhs_code": code.as_str(), "details": details, "retryable": code.retryable()},
        }
    })
}

fn api_error_response(id: Value, e: ApiError) -> Value {
    error_response(id, e.code, &e.message, e.details)
}

/// One JSON-RPC answer: a result, whose document may be a receipt's
/// canonical text spliced in as it is, or any other response as a value.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A success response.
    Result {
        /// The request's id.
        id: Value,
        /// The result document.
        result: Answer,
    },
    /// An error response (or any complete response object).
    Value(Value),
}

impl Reply {
    fn error(id: Value, code: Code, message: &str, details: Value) -> Self {
        Reply::Value(error_response(id, code, message, details))
    }

    /// The response as JSON text.
    pub fn to_bytes(&self) -> Vec<u8> {
        match self {
            Reply::Value(v) => crate::json_bytes(v),
            Reply::Result { id, result } => {
                let mut out = Vec::with_capacity(1280);
                out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
                match serde_json::to_writer(&mut out, id) {
                    Ok(()) => {}
                    // An id parsed from JSON always serialises; keep the
                    // answer valid if it did not.
                    Err(_) => out.extend_from_slice(b"null"),
                }
                out.extend_from_slice(br#","result":"#);
                result.write_json(&mut out);
                out.push(b'}');
                out
            }
        }
    }

    /// The response as a value.
    pub fn into_value(self) -> Value {
        match self {
            Reply::Value(v) => v,
            Reply::Result { id, result } => {
                json!({"jsonrpc": "2.0", "id": id, "result": result.into_value()})
            }
        }
    }
}

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

/// The text read the permissive way (`serde_json`'s: the last duplicate key
/// wins, depth bounded by its recursion limit), only to recognise an e-stop.
fn lenient_parse(text: &str) -> Option<Value> {
    serde_json::from_str(text).ok()
}

/// Whether text that is not strict JSON reads as an e-stop: some `"method"`
/// member names `mhs.safety.estop`, or an `mhs.command` names the e-stop
/// class. A textual look, bounded by the (≤ 1 MiB) text; a false positive
/// stops devices, which for a request that mentions the e-stop is the safe
/// mistake.
pub(crate) fn names_estop_loosely(text: &str) -> bool {
    let method_is = |wanted: &str| crate::text_member_is(text, "method", wanted);
    method_is("\"mhs.safety.estop\"")
        || (method_is("\"mhs.command\"") && text.contains(&format!("\"{}\"", catalogue::ESTOP)))
}

/// Whether a JSON object asks for an e-stop (by method, whatever the envelope).
fn estop_target(obj: &serde_json::Map<String, Value>) -> bool {
    match obj.get("method").and_then(Value::as_str) {
        Some("mhs.safety.estop") => true,
        Some("mhs.command") => {
            obj.get("params")
                .and_then(|p| p.get("capability_id"))
                .and_then(Value::as_str)
                == Some(catalogue::ESTOP)
        }
        _ => false,
    }
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
        Some(Value::String(_)) => {}
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => {}
        Some(_) => return Some(("id_invalid", "id must be a string or an integer".into())),
    }
    if !obj.get("method").is_some_and(Value::is_string) {
        return Some(("method_missing", "method must be a string".into()));
    }
    for k in obj.keys() {
        if !matches!(k.as_str(), "jsonrpc" | "id" | "method" | "params") {
            return Some(("unknown_member", format!("unknown envelope member `{k}`")));
        }
    }
    None
}

fn usable_id(obj: &serde_json::Map<String, Value>) -> Value {
    match obj.get("id") {
        Some(Value::String(s)) => json!(s),
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Value::Number(n.clone()),
        _ => Value::Null,
    }
}

async fn serve_malformed_estop(
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
        .take(512)
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

fn parse<T: DeserializeOwned>(params: Value) -> Result<T, ApiError> {
    serde_json::from_value(params).map_err(|e| {
        ApiError::new(
            Code::ProtocolInvalidParams,
            format!("invalid params: {e}"),
            json!({"reason": "params_invalid", "message": e.to_string()}),
        )
    })
}

fn deadline(ms: Option<u64>) -> Result<Option<Duration>, ApiError> {
    match ms {
        None => Ok(None),
        Some(ms) => deadline_from_ms(ms).map(Some).ok_or_else(|| {
            ApiError::new(
                Code::ProtocolInvalidParams,
                format!("deadline_ms must be between 1 and {DEADLINE_MS_MAX}"),
                json!({"reason": "deadline_invalid"}),
            )
        }),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HelloParams {
    #[serde(default)]
    #[allow(dead_code)]
    client: Option<Value>,
    #[serde(default)]
    #[allow(dead_code)]
    mhs_version: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeviceParams {
    device_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StatusParams {
    #[serde(default)]
    device_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum GrantParam {
    Class(String),
    Binding {
        capability_id: String,
        resource: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OpenParams {
    #[serde(default)]
    device_ids: Option<Vec<String>>,
    #[serde(default)]
    device_id: Option<String>,
    #[serde(default)]
    capabilities: Option<Vec<GrantParam>>,
    #[serde(default)]
    ttl_ms: Option<u64>,
    #[serde(default)]
    #[allow(dead_code)]
    client: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionParams {
    session_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadParams {
    #[serde(default)]
    session_id: Option<String>,
    device_id: String,
    resource: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteParams {
    #[serde(default)]
    session_id: Option<String>,
    device_id: String,
    resource: String,
    patch: Value,
    #[serde(default)]
    capability_id: Option<String>,
    #[serde(default)]
    command_id: Option<String>,
    #[serde(default)]
    expected_revision: Option<u64>,
    #[serde(default)]
    deadline_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CommandParams {
    #[serde(default)]
    session_id: Option<String>,
    device_id: String,
    capability_id: String,
    #[serde(default)]
    resource: Option<String>,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    command_id: Option<String>,
    #[serde(default)]
    expected_revision: Option<u64>,
    #[serde(default)]
    deadline_ms: Option<u64>,
    #[serde(default)]
    safe_place_grant: Option<String>,
    #[serde(default)]
    permit_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PermitParams {
    #[serde(default)]
    session_id: Option<String>,
    device_id: String,
    capability_id: String,
    #[serde(default)]
    resource: Option<String>,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    ttl_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantParams {
    device_id: String,
    capability_id: String,
    #[serde(default)]
    resource: Option<String>,
    #[serde(default)]
    input: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApprovalListParams {
    #[serde(default)]
    status: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApprovalGetParams {
    approval_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApprovalDecideParams {
    approval_id: String,
    decision: String,
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OperationParams {
    operation_id: String,
    #[serde(default)]
    #[allow(dead_code)]
    session_id: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ArmParams {
    device_id: String,
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResetParams {
    device_id: String,
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    command_id: Option<String>,
}

/// Params of an e-stop are read leniently: nothing about them may prevent the stop.
fn estop_request(
    principal: &Principal,
    params: &Value,
    kernel: &Kernel,
) -> (EstopRequest, Option<ApiError>) {
    let mut ids = Vec::new();
    let mut error = None;
    let mut add = |v: &Value| match v.as_str() {
        Some(id) if kernel.device_ids().iter().any(|d| d == id) => ids.push(id.to_owned()),
        Some(id) => {
            error = Some(ApiError::new(
                Code::DeviceUnknown,
                format!("no device `{id}` is served here"),
                json!({"device_id": id}),
            ));
        }
        None => {}
    };
    if let Some(v) = params.get("device_id") {
        add(v);
    }
    if let Some(Value::Array(list)) = params.get("device_ids") {
        list.iter().take(1024).for_each(&mut add);
    }
    let reason = params
        .get("reason")
        .and_then(Value::as_str)
        .unwrap_or("")
        .chars()
        .take(512)
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
        error,
    )
}

/// Serves a well-formed e-stop. A well-formed but unknown device id stops
/// nothing and is `MHS.DEVICE.UNKNOWN`.
async fn serve_estop(kernel: &Kernel, p: &Principal, params: &Value) -> Result<Value, ApiError> {
    if let Some(defect) = estop_params_defect(params) {
        return Err(serve_estop_with_defective_params(kernel, p, params, defect).await);
    }
    let (req, error) = estop_request(p, params, kernel);
    match error {
        Some(e) if req.device_ids.is_empty() => Err(e),
        _ => Ok(kernel.estop(req).await),
    }
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
        .take(512)
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

/// Routes one method. Commands and writes answer with the kernel's
/// [`Answer`] (a receipt's canonical text spliced into the response); every
/// other method answers a value.
async fn dispatch(
    kernel: &Kernel,
    p: &Principal,
    method: &str,
    params: Value,
) -> Result<Answer, ApiError> {
    let is_estop = params.get("capability_id").and_then(Value::as_str) == Some(catalogue::ESTOP);
    match method {
        "mhs.resource.write" => {
            let q: WriteParams = parse(params)?;
            let req = CommandRequest {
                route: Route::Write,
                session_id: q.session_id,
                device_id: q.device_id,
                capability_id: q.capability_id.unwrap_or_default(),
                resource: Some(q.resource),
                input: q.patch,
                command_id: q.command_id,
                deadline: deadline(q.deadline_ms)?,
                expected_revision: q.expected_revision,
                safe_place_grant: None,
                permit_id: None,
            };
            kernel.command(p, req, CommandOptions::plain()).await
        }
        "mhs.command" if !is_estop => {
            let q: CommandParams = parse(params)?;
            let req = CommandRequest {
                route: Route::Command,
                session_id: q.session_id,
                device_id: q.device_id,
                capability_id: q.capability_id,
                resource: q.resource,
                input: q.input.unwrap_or_else(|| json!({})),
                command_id: q.command_id,
                deadline: deadline(q.deadline_ms)?,
                expected_revision: q.expected_revision,
                safe_place_grant: q.safe_place_grant,
                permit_id: q.permit_id,
            };
            kernel.command(p, req, CommandOptions::plain()).await
        }
        _ => dispatch_value(kernel, p, method, params)
            .await
            .map(Answer::from),
    }
}

async fn dispatch_value(
    kernel: &Kernel,
    p: &Principal,
    method: &str,
    params: Value,
) -> Result<Value, ApiError> {
    match method {
        "mhs.hello" => {
            let _: HelloParams = parse(params)?;
            Ok(kernel.hello(p))
        }
        "mhs.devices.list" => {
            let _: HelloParams = parse(params)?;
            Ok(kernel.devices_list())
        }
        "mhs.devices.get" => {
            let q: DeviceParams = parse(params)?;
            kernel.device_get(&q.device_id)
        }
        "mhs.session.open" => {
            let q: OpenParams = parse(params)?;
            let device_ids = match (q.device_ids, q.device_id) {
                (Some(mut ids), Some(one)) => {
                    ids.push(one);
                    Some(ids)
                }
                (ids, one) => ids.or(one.map(|d| vec![d])),
            };
            let capabilities = q.capabilities.map(|list| {
                list.into_iter()
                    .map(|g| match g {
                        GrantParam::Class(c) => GrantRequest::Class(c),
                        GrantParam::Binding {
                            capability_id,
                            resource,
                        } => GrantRequest::Binding {
                            capability_id,
                            resource,
                        },
                    })
                    .collect()
            });
            kernel
                .session_open(
                    p,
                    SessionOpen {
                        device_ids,
                        capabilities,
                        ttl_ms: q.ttl_ms,
                    },
                )
                .await
        }
        "mhs.session.heartbeat" => {
            let q: SessionParams = parse(params)?;
            kernel.session_heartbeat(p, &q.session_id)
        }
        "mhs.session.close" => {
            let q: SessionParams = parse(params)?;
            kernel.session_close(p, &q.session_id).await
        }
        "mhs.resource.read" => {
            let q: ReadParams = parse(params)?;
            kernel
                .read(
                    p,
                    ReadRequest {
                        session_id: q.session_id,
                        device_id: q.device_id,
                        resource: q.resource,
                    },
                )
                .await
        }

        "mhs.command"
            if params.get("capability_id").and_then(Value::as_str) == Some(catalogue::ESTOP) =>
        {
            // The command form of the e-stop shares the e-stop path: it needs no
            // session, grant or valid command_id, and is never refused by them.
            let mut stop = params.clone();
            if let Some(reason) = params.get("input").and_then(|i| i.get("reason")) {
                stop["reason"] = reason.clone();
            }
            serve_estop(kernel, p, &stop).await
        }

        "mhs.safety.estop" => serve_estop(kernel, p, &params).await,
        "mhs.safety.reset" => {
            let q: ResetParams = parse(params)?;
            kernel
                .reset(
                    p,
                    ResetRequest {
                        session_id: q.session_id,
                        device_id: q.device_id,
                        reason: q.reason.unwrap_or_default(),
                    },
                )
                .await
        }
        "mhs.operations.get" => {
            let q: OperationParams = parse(params)?;
            kernel.operation_get(&q.operation_id)
        }
        "mhs.operations.cancel" => {
            let q: OperationParams = parse(params)?;
            kernel.operation_cancel(&q.operation_id)
        }
        "mhs.safety.permit" => {
            let q: PermitParams = parse(params)?;
            let req = CommandRequest {
                route: Route::Command,
                session_id: q.session_id,
                device_id: q.device_id,
                capability_id: q.capability_id,
                resource: q.resource,
                input: q.input.unwrap_or_else(|| json!({})),
                command_id: None,
                deadline: None,
                expected_revision: None,
                safe_place_grant: None,
                permit_id: None,
            };
            kernel.permit(p, &req, q.ttl_ms).await
        }
        "mhs.safety.grant_safe_place" => {
            let q: GrantParams = parse(params)?;
            kernel.grant_safe_place(
                p,
                &q.device_id,
                &q.capability_id,
                q.resource.as_deref(),
                &q.input.unwrap_or_else(|| json!({})),
            )
        }
        "mhs.safety.arm" | "mhs.safety.disarm" => {
            let q: ArmParams = parse(params)?;
            kernel
                .set_armed(
                    p,
                    tether_kernel::ArmRequest {
                        device_id: q.device_id,
                        armed: method == "mhs.safety.arm",
                        reason: q.reason.unwrap_or_default(),
                    },
                )
                .await
        }
        "mhs.safety.status" => {
            let q: StatusParams = parse(params)?;
            kernel.safety_status(q.device_id.as_deref())
        }
        "mhs.approvals.list" => {
            let q: ApprovalListParams = parse(params)?;
            kernel.approvals_list(p, q.status.as_deref())
        }
        "mhs.approvals.get" => {
            let q: ApprovalGetParams = parse(params)?;
            kernel.approvals_get(p, &q.approval_id)
        }
        "mhs.approvals.decide" => {
            let q: ApprovalDecideParams = parse(params)?;
            kernel
                .approvals_decide(
                    p,
                    &q.approval_id,
                    &q.decision,
                    q.reason.as_deref().unwrap_or(""),
                )
                .await
        }
        other => Err(ApiError::new(
            Code::ProtocolMethodNotFound,
            format!("no method `{other}`"),
            json!({"method": other, "methods": kernel.hello(p)["methods"].clone()}),
        )),
    }
}
