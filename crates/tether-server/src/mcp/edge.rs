//! The edge on `/mcp` (`crate::edge`): a request whose `Host`, `Origin` or
//! content type is refused is answered with a JSON-RPC error (403 or 415),
//! as every refusal on this surface is; a `tools/call` of the `estop` tool
//! among them is served first — recognised as the guard recognises it
//! (`screen`: strict JSON, a batch, text that only reads as one, the first
//! MiB of a body too large) — and the answer carries `estop_served` and the
//! receipt. The SDK's own DNS-rebinding check is handed the same names and
//! origins, so it never refuses what the edge serves.
//!
//! **Never belongs here:** which names, origins and types are served
//! (`crate::edge`), the token (checked before), anything the SDK answers.

use super::screen::{self, DefectiveEstop, Screened};
use crate::edge::{Edge, Refusal};
use crate::rpc::error_response;
use crate::BodyBytes;
use axum::body::Body;
use axum::extract::Request;
use axum::http::Method;
use axum::response::Response;
use rmcp::transport::StreamableHttpServerConfig;
use serde_json::{Map, Value};
use tether_core::json::parse_strict;
use tether_kernel::{Kernel, Principal};

/// The SDK's transport config with the edge's hosts and origins (each with
/// its port written), so its check agrees with the edge's.
pub(super) fn sdk_config(
    config: StreamableHttpServerConfig,
    edge: &Edge,
) -> StreamableHttpServerConfig {
    config
        .with_allowed_hosts(edge.hosts())
        .with_allowed_origins(edge.origins())
}

/// An `estop` tool call found in a refused body: the id to answer and the
/// arguments when they are an object (else every device is stopped).
struct Found {
    id: Option<Value>,
    arguments: Option<Map<String, Value>>,
}

impl From<DefectiveEstop> for Found {
    fn from(e: DefectiveEstop) -> Self {
        Found {
            id: e.id,
            arguments: e.arguments,
        }
    }
}

/// The `estop` tool call in a body, if it holds one, as the guard screens it.
fn estop_in(body: BodyBytes) -> Option<Found> {
    let bytes = match body {
        BodyBytes::Whole(bytes) => bytes,
        BodyBytes::TooLarge(prefix) => {
            // Its arguments were never read: every device.
            let found = screen::unparsable(&String::from_utf8_lossy(&prefix), "too large");
            return found.map(|e| Found {
                arguments: None,
                ..Found::from(e)
            });
        }
        BodyBytes::Broken => return None,
    };
    let text = std::str::from_utf8(&bytes).map_err(|_| "the body is not UTF-8".to_owned());
    match text.and_then(parse_strict) {
        Err(message) => {
            screen::unparsable(&String::from_utf8_lossy(&bytes), &message).map(Found::from)
        }
        Ok(value) => match screen::message(value) {
            Screened::Estop(e) => Some(Found::from(e)),
            Screened::Pass(Value::Object(obj)) if screen::names_estop(&obj) => Some(Found {
                id: obj.get("id").cloned(),
                arguments: obj
                    .get("params")
                    .and_then(|p| p.get("arguments"))
                    .and_then(Value::as_object)
                    .cloned(),
            }),
            Screened::Pass(_) | Screened::Refuse(_) => None,
        },
    }
}

/// Answers a request the edge refused; the `estop` tool call in a POST body
/// is served first (the device its arguments name, else every device), and
/// the refusal says so.
pub(super) async fn refused(
    kernel: &Kernel,
    principal: &Principal,
    refusal: &Refusal,
    request: Request,
) -> Response {
    let estop = if request.method() == Method::POST {
        let body: Body = request.into_body();
        estop_in(crate::read_body(body, crate::REQUEST_BYTES_MAX).await)
    } else {
        None
    };
    let mut answer = match estop {
        Some(e) => {
            let estop = DefectiveEstop {
                // Answered even when sent as a notification: this is an
                // HTTP refusal, and it must say the stop was served.
                id: Some(e.id.unwrap_or(Value::Null)),
                code: refusal.code,
                reason: refusal.reason,
                message: refusal.message.clone(),
                arguments: e.arguments,
            };
            estop
                .serve(kernel, Some(principal.clone()))
                .await
                .unwrap_or(Value::Null)
        }
        None => error_response(Value::Null, refusal.code, &refusal.message, Value::Null),
    };
    // The refusal's details (the header refused), with the stop's if any.
    let mut details = refusal.details();
    if let Some(served) = answer["error"]["data"]["details"].as_object() {
        for (k, v) in served {
            details[k] = v.clone();
        }
    }
    answer["error"]["data"]["details"] = details;
    super::http::json_error(refusal.status(), &answer)
}
