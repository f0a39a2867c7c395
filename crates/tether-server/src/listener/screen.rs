//! Screened connections: admitted beyond the connection bounds, each serves
//! one request, and only an e-stop — recognised by what it asks for, as
//! loosely as the surfaces recognise one (a false positive costs a served
//! request; a false negative would refuse a stop). Anything else is answered
//! `429` with `Retry-After` and `MHS.PROTOCOL.LIMIT` (retryable): the JSON-RPC
//! error object on `/rpc` and `/mcp`, the REST envelope elsewhere.
//!
//! With principals configured a request without a valid token is handed to
//! the surface unread, which refuses it `401` before any body is read (the
//! e-stop included), as on any other connection. Until a request is handed
//! to the surface the connection is not in flight, so a screened slot is
//! never held by a body trickled in slowly.
//!
//! **Never belongs here:** serving the e-stop (the surfaces do, unchanged),
//! or parsing a request beyond recognising one.

use super::conns::ConnState;
use super::{InFlight, Surface};
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::Response;
use http_body::Frame;
use serde_json::{json, Value};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tether_core::catalogue;
use tether_core::Code;

/// Seconds a refused client is told to wait (`Retry-After`).
pub(super) const RETRY_AFTER_S: u64 = 1;

/// Serves one request of a screened connection; answers the response and,
/// when the request was handed to the surface, its mark of being in flight.
/// While the body is read the connection is not in flight, so it may be
/// shed: only an e-stop (or a `401`) holds a screened slot.
pub(super) async fn serve(
    surface: &Surface,
    conn: &Arc<ConnState>,
    request: Request,
) -> (Response, Option<InFlight>) {
    let path = request.uri().path().to_owned();
    let handed = |request: Request| async {
        match InFlight::begin(conn) {
            Some(in_flight) => (
                super::call(surface.app.clone(), request).await,
                Some(in_flight),
            ),
            None => (refusal(&path), None),
        }
    };
    if surface.auth.from_headers(request.headers()).is_err() {
        // The surface answers 401 without reading the body.
        return handed(request).await;
    }
    let rest_estop = is_rest_estop(request.method(), &path);
    let (parts, body) = request.into_parts();
    // Read as the surfaces read (bounded size and time); a body that could
    // not be read is screened as empty.
    let (prefix, complete) = match crate::read_body(body, crate::REQUEST_BYTES_MAX).await {
        crate::BodyBytes::Whole(b) => (b, true),
        crate::BodyBytes::TooLarge(b) => (b, false),
        crate::BodyBytes::Broken => (Vec::new(), true),
    };
    if !(rest_estop || names_estop(&String::from_utf8_lossy(&prefix))) {
        return (refusal(&path), None);
    }
    let body = if complete {
        Body::from(prefix)
    } else {
        // Over the size bound: the surface answers 413 and still serves
        // the e-stop from this start.
        Body::new(Oversized {
            prefix: Some(Bytes::from(prefix)),
            beyond: false,
        })
    };
    handed(Request::from_parts(parts, body)).await
}

/// `POST /tools/{tool}:invoke` of an e-stop tool (the endpoint-wide
/// `estop`, or a device's bound e-stop class, whose name ends in `estop`).
fn is_rest_estop(method: &Method, path: &str) -> bool {
    method == Method::POST
        && path
            .strip_prefix("/tools/")
            .and_then(|t| t.strip_suffix(":invoke"))
            .is_some_and(|t| t.ends_with(crate::tools::ESTOP_TOOL))
}

/// Whether text (JSON or not) asks for an e-stop: a JSON-RPC
/// `mhs.safety.estop`, an `mhs.command` naming the e-stop class, or an MCP
/// `tools/call` of the `estop` tool.
fn names_estop(text: &str) -> bool {
    let method_is = |wanted: &str| crate::text_member_is(text, "method", wanted);
    method_is("\"mhs.safety.estop\"")
        || (method_is("\"mhs.command\"") && text.contains(&format!("\"{}\"", catalogue::ESTOP)))
        || (method_is("\"tools/call\"")
            && crate::text_member_is(text, "name", &format!("\"{}\"", crate::tools::ESTOP_TOOL)))
}

/// `429` with `Retry-After` and `MHS.PROTOCOL.LIMIT`, in the form of the
/// surface the path belongs to.
pub(super) fn refusal(path: &str) -> Response {
    let code = Code::ProtocolLimit;
    let message = "too many connections: this one is served only for an e-stop; retry later";
    let details = json!({
        "reason": "connections_full",
        "retry_after_s": RETRY_AFTER_S,
    });
    let body: Value = if path == "/rpc" || path == crate::mcp::http::MCP_PATH {
        crate::rpc::error_response(Value::Null, code, message, details)
    } else {
        crate::rest::error_body(code, message, &details)
    };
    let mut response = crate::json_response(StatusCode::TOO_MANY_REQUESTS, &body);
    let headers = response.headers_mut();
    headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S));
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// The first bytes of a body over the size bound and one byte standing for
/// the rest (never read): the surface sees a body over the bound, refuses it
/// as too large and serves the e-stop its start names.
struct Oversized {
    prefix: Option<Bytes>,
    beyond: bool,
}

impl http_body::Body for Oversized {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let frame = match this.prefix.take() {
            Some(prefix) => {
                this.beyond = true;
                Some(prefix)
            }
            None if this.beyond => {
                this.beyond = false;
                Some(Bytes::from_static(b" "))
            }
            None => None,
        };
        Poll::Ready(frame.map(|b| Ok(Frame::data(b))))
    }
}

#[cfg(test)]
mod tests {
    use super::{is_rest_estop, names_estop};
    use axum::http::Method;

    #[test]
    fn every_surface_s_estop_is_recognised_and_nothing_else() {
        assert!(names_estop(
            r#"{"jsonrpc":"2.0","id":1,"method":"mhs.safety.estop"}"#
        ));
        assert!(names_estop(
            r#"{"method" : "mhs.command","params":{"capability_id":"cap.motion.estop.v1"}}"#
        ));
        assert!(names_estop(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"estop"}}"#
        ));
        assert!(names_estop(r#"{"method":"mhs.safety.estop","#));
        assert!(!names_estop(r#"{"method":"mhs.hello"}"#));
        assert!(!names_estop(
            r#"{"method":"tools/call","params":{"name":"move_to"}}"#
        ));
        assert!(is_rest_estop(&Method::POST, "/tools/estop:invoke"));
        assert!(!is_rest_estop(&Method::GET, "/tools/estop:invoke"));
        assert!(!is_rest_estop(&Method::POST, "/tools/move_to:invoke"));
    }
}
