//! JSON-RPC responses: the error object every surface shares, and [`Reply`],
//! a success whose result may be a receipt's canonical text spliced in as it
//! is.
//!
//! **Never belongs here:** parsing a request, recognising an e-stop, or
//! calling the kernel; this module only shapes what goes back on the wire.

use serde_json::{json, Value};
use tether_core::Code;
use tether_kernel::{Answer, ApiError};

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

/// A kernel refusal as a JSON-RPC error response.
pub(super) fn api_error_response(id: Value, e: ApiError) -> Value {
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
    pub(super) fn error(id: Value, code: Code, message: &str, details: Value) -> Self {
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
