//! The REST envelope: `{ok: true, data}` or `{ok: false, error: {code,
//! message, retryable, details}}`, the HTTP status of every registry code, and
//! strict reading of request bodies.

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tether_core::json::parse_strict;
use tether_core::Code;
use tether_kernel::ApiError;

use crate::{bytes_response, json_response};
use tether_core::canonical::{CanonicalText, MembersError};

/// An error answered with the REST envelope.
#[derive(Debug)]
pub(crate) struct RestError {
    pub code: Code,
    pub message: String,
    pub details: Value,
    /// Overrides the status the code maps to (e.g. 503 for a full table).
    pub status: Option<StatusCode>,
}

impl RestError {
    pub fn new(code: Code, message: impl Into<String>, details: Value) -> Self {
        Self {
            code,
            message: message.into(),
            details,
            status: None,
        }
    }

    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.status = Some(status);
        self
    }

    pub fn invalid(reason: &str, message: impl Into<String>) -> Self {
        Self::new(
            Code::ProtocolInvalidParams,
            message,
            json!({"reason": reason}),
        )
    }
}

/// A record that cannot be written: a receipt or error nested past the
/// evidence bound (the kernel bounds both, so this is a defect).
impl From<MembersError> for RestError {
    fn from(e: MembersError) -> Self {
        Self::new(
            Code::ProtocolInternal,
            "the invocation record cannot be written",
            json!({"reason": "record_unwritable", "defect": format!("{e:?}")}),
        )
    }
}

impl From<ApiError> for RestError {
    fn from(e: ApiError) -> Self {
        Self::new(e.code, e.message, e.details)
    }
}

/// The HTTP status of a registry code. 400 means the request could not be
/// read as asked (malformed, unknown members, wrong types); 422 means it was
/// read and the governed checks refused its input (schema, limits, budgets);
/// 409 a state of the device or of an id that conflicts and may change; 423 a
/// latched device. Documented in docs/REST.md.
pub(crate) fn status_of(code: Code) -> StatusCode {
    use Code::*;
    match code {
        ProtocolParseError | ProtocolInvalidRequest | ProtocolInvalidParams => {
            StatusCode::BAD_REQUEST
        }
        ProtocolTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ProtocolMethodNotFound
        | DeviceUnknown
        | CapabilityUnknown
        | ResourceUnknown
        | OperationUnknown
        | PolicyApprovalUnknown => StatusCode::NOT_FOUND,
        AuthUnauthenticated => StatusCode::UNAUTHORIZED,
        AuthForbidden
        | AuthHardwareDisabled
        | SessionCapabilityNotGranted
        | SafetyPermitInvalid
        | SafetyApprovalRequired
        | PolicyDenied
        | AuthOriginRefused => StatusCode::FORBIDDEN,
        CapabilityNotBound
        | CapabilityInputInvalid
        | ResourceFieldUnknown
        | ResourceNotWritable
        | SafetyEnvelopeViolation
        | SafetyLimitsUnset
        | SafetyCumulativeLimit => StatusCode::UNPROCESSABLE_ENTITY,
        SafetyEstopEngaged => StatusCode::LOCKED,
        SessionUnknown
        | SessionExpired
        | DeviceBusy
        | ConflictCommandIdReuse
        | ConflictRevision
        | ModeReadOnly
        | SafetyInterlockOpen
        | SafetyResetRefused
        | OutcomeCancelled
        | PolicyHeld
        | PolicyApprovalClosed => StatusCode::CONFLICT,
        PolicyApprovalExpired => StatusCode::GONE,
        SessionLimit | ProtocolLimit => StatusCode::TOO_MANY_REQUESTS,
        ProtocolUnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        OutcomeTimeout => StatusCode::GATEWAY_TIMEOUT,
        DeviceUnavailable | EvidenceUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        AdapterManifestInvalid
        | AdapterDriverFailed
        | AdapterShimFailed
        | AdapterOutputInvalid
        | SafetySafeStateUnreached
        | OutcomeUnknown => StatusCode::BAD_GATEWAY,
        SafetyNotCertified | ProtocolInternal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The error body.
pub(crate) fn error_body(code: Code, message: &str, details: &Value) -> Value {
    json!({
        "ok": false,
        "error": {
            "code": code.as_str(),
            "message": message,
            "retryable": code.retryable(),
            "details": details,
        }
    })
}

/// What a success carries: a value, or an object already written as
/// canonical text (an invocation record with its receipt), spliced into the
/// envelope as it is.
pub(crate) enum Data {
    Value(Value),
    Text(CanonicalText),
}

impl From<Value> for Data {
    fn from(v: Value) -> Self {
        Data::Value(v)
    }
}

/// A success: `{ok: true, data}`.
pub(crate) fn ok(status: StatusCode, data: Data) -> Response {
    match data {
        Data::Value(data) => json_response(status, &json!({"ok": true, "data": data})),
        Data::Text(text) => {
            const HEAD: &[u8] = br#"{"ok":true,"data":"#;
            let mut body = Vec::with_capacity(HEAD.len() + text.as_str().len() + 1);
            body.extend_from_slice(HEAD);
            body.extend_from_slice(text.as_str().as_bytes());
            body.push(b'}');
            bytes_response(status, body)
        }
    }
}

impl IntoResponse for RestError {
    fn into_response(self) -> Response {
        let details = if self.details.is_object() {
            self.details
        } else {
            json!({})
        };
        let status = self.status.unwrap_or_else(|| status_of(self.code));
        let mut response = json_response(status, &error_body(self.code, &self.message, &details));
        if status == StatusCode::UNAUTHORIZED {
            // RFC 9110: a 401 names the scheme it wants.
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        if status == StatusCode::TOO_MANY_REQUESTS {
            // A bound was reached (retryable): say when to try again.
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(crate::mcp::http::RETRY_AFTER_S),
            );
        }
        response
    }
}

/// Reads a body within `REQUEST_BYTES_MAX` and parses it strictly (duplicate
/// keys, depth over 64 and numbers beyond f64 are refused). An empty body is
/// `None`.
///
/// # Errors
/// `TOO_LARGE` (413), `PARSE_ERROR` (400).
pub(crate) async fn read_json(body: Body) -> Result<Option<Value>, RestError> {
    let bytes = match crate::read_body(body, crate::REQUEST_BYTES_MAX).await {
        crate::BodyBytes::Whole(bytes) => bytes,
        crate::BodyBytes::TooLarge(_) => {
            return Err(RestError::new(
                Code::ProtocolTooLarge,
                "request body too large",
                json!({"limit_bytes": crate::REQUEST_BYTES_MAX}),
            ))
        }
        crate::BodyBytes::Broken => {
            return Err(RestError::new(
                Code::ProtocolParseError,
                "the request body could not be read in time",
                json!({"reason": "body_unreadable", "timeout_s": crate::BODY_READ_TIMEOUT.as_secs()}),
            ))
        }
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let text = std::str::from_utf8(&bytes).map_err(|_| {
        RestError::new(
            Code::ProtocolParseError,
            "request body is not UTF-8",
            json!({"reason": "not_utf8"}),
        )
    })?;
    parse_strict(text).map(Some).map_err(|msg| {
        RestError::new(
            Code::ProtocolParseError,
            "request body is not valid JSON",
            json!({"reason": "invalid_json", "message": msg}),
        )
    })
}

/// A GET carries no body: anything but whitespace is refused (after the
/// same size bound as every route).
pub(crate) async fn no_body(body: Body) -> Result<(), RestError> {
    match read_json(body).await? {
        None => Ok(()),
        Some(_) => Err(RestError::invalid(
            "body_not_allowed",
            "this route takes no request body",
        )),
    }
}

/// A body of type `T`, whose unknown members are refused.
pub(crate) fn from_body<T: DeserializeOwned>(v: Value) -> Result<T, RestError> {
    if !v.is_object() {
        return Err(RestError::invalid(
            "body_not_object",
            "the request body must be a JSON object",
        ));
    }
    serde_json::from_value(v).map_err(|e| {
        // The parser's message quotes what it refused: repeated only as far
        // as an error may.
        let message = e.to_string();
        let message = tether_core::echo::text(&message);
        RestError::new(
            Code::ProtocolInvalidParams,
            format!("invalid body: {message}"),
            json!({"reason": "body_invalid", "message": message}),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registry_code_has_a_status_and_refusals_are_client_errors() {
        for row in tether_core::codes::REGISTRY {
            let s = status_of(row.code);
            assert!(s.is_client_error() || s.is_server_error(), "{}", row.name);
        }
        assert_eq!(status_of(Code::SafetyEnvelopeViolation), 422);
        assert_eq!(status_of(Code::SafetyEstopEngaged), 423);
        assert_eq!(status_of(Code::AuthUnauthenticated), 401);
        assert_eq!(status_of(Code::ProtocolTooLarge), 413);
        assert_eq!(status_of(Code::CapabilityUnknown), 404);
    }
}
