//! MCP over streamable HTTP (`tether serve --mcp-http ADDR`, path `/mcp`),
//! served by `rmcp`'s `StreamableHttpService`.
//!
//! In front of the SDK sits one guard, run on every request before the SDK
//! sees it: the bearer token is checked first (with principals configured a
//! missing or wrong token is `401`, the e-stop included, and the body is
//! never read); then the edge (`crate::edge`, `super::edge`: a `Host` or
//! `Origin` not served is `403`, a body not `application/json` `415`, an
//! `estop` call among them still served); a POST body is read up to 1 MiB
//! (`413` beyond) and parsed strictly (`400` with a JSON-RPC parse error on
//! duplicate keys, nesting deeper than 64, non-finite numbers). A `tools/call` of the `estop` tool is
//! served even when the SDK would not serve it: a defective one (bad JSON,
//! envelope or params) is latched here and answered `400` with the protocol
//! error and `details.estop_served: true`; a well-formed one the SDK refuses
//! before its handler (no or an unknown `Mcp-Session-Id`, missing request
//! metadata, headers it rejects) is latched when the SDK's `4xx` comes back,
//! and that answer is replaced the same way. Malformed `tools/call` params
//! are `400` with `-32602` `MHS.PROTOCOL.INVALID_PARAMS`. The principal and a disconnect token
//! travel to the handler in the request's extensions; the disconnect token is
//! cancelled when the response stream is dropped before its end, so a client
//! that goes away mid-call has cancelled the call.
//!
//! Both protocol generations are served: 2025-11-25 clients initialize and
//! get an `Mcp-Session-Id` (one handler, and so one set of kernel sessions,
//! per MCP session); 2026-07-28 clients send `server/discover` and
//! self-contained requests, each served by a fresh handler. An `initialize`
//! takes a slot of its principal before the SDK makes a session
//! (`sessions.rs`): past the principal's or the endpoint's bound it is `429`
//! with `Retry-After` and `MHS.PROTOCOL.LIMIT`, and no live session is ever
//! evicted to make room.

use super::screen::{self, DefectiveEstop, Screened};
use super::sessions::{BoundedSessions, Full, Owners, Slot};
use super::{Disconnect, TetherMcp};
use crate::auth::Authenticator;
use crate::edge::{Edge, EdgeConfig};
use crate::rpc::error_response;
use axum::body::{to_bytes, Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use http_body::Frame;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{json, Value};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tether_core::json::parse_strict;
use tether_core::Code;
use tether_kernel::{Kernel, Principal};
use tokio_util::sync::{CancellationToken, DropGuard};

pub use super::sessions::{
    SessionBounds, MCP_SESSIONS_LIMIT, MCP_SESSIONS_MAX_DEFAULT,
    MCP_SESSIONS_PER_PRINCIPAL_MAX_DEFAULT, RETRY_AFTER_S,
};

/// The path MCP is served on.
pub const MCP_PATH: &str = "/mcp";

/// Longest SDK error body read to say why it refused an e-stop.
const SDK_ERROR_BYTES_MAX: usize = 64 * 1024;

/// What the guard needs: who may call, the kernel to serve an e-stop the
/// SDK would not, and who opened each MCP session (bounded per principal and
/// in all, `sessions.rs`).
struct Guard {
    auth: Authenticator,
    kernel: Kernel,
    edge: Edge,
    owners: Owners,
}

const SESSION_HEADER: &str = "mcp-session-id";

/// The `Mcp-Session-Id` a request or response carries.
fn session_of(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// A session that does not belong to the caller reads as unknown (404, as
/// the SDK answers a session it does not know).
fn foreign_session() -> Response {
    let body = error_response(
        Value::Null,
        Code::ProtocolInvalidRequest,
        "session not found",
        json!({"reason": "session_unknown", "http_status": 404}),
    );
    json_error(StatusCode::NOT_FOUND, &body)
}

/// The MCP router, behind the edge (`crate::edge`: the `Host` names and
/// origins `edge` serves, JSON bodies only); the SDK's own DNS-rebinding
/// check is given the same names. `shutdown` ends every MCP session.
pub fn router(
    kernel: Kernel,
    auth: Authenticator,
    edge: Edge,
    bounds: SessionBounds,
    shutdown: CancellationToken,
) -> Router {
    let config = StreamableHttpServerConfig::default()
        .with_max_request_body_bytes(crate::REQUEST_BYTES_MAX)
        .with_cancellation_token(shutdown);
    let config = super::edge::sdk_config(config, &edge);
    let tools = super::catalogue(&kernel);
    let owners = Owners::new(bounds);
    let guard_state = Arc::new(Guard {
        auth,
        kernel: kernel.clone(),
        edge,
        owners: owners.clone(),
    });
    let service = StreamableHttpService::new(
        move || Ok(TetherMcp::for_http(kernel.clone(), tools.clone())),
        Arc::new(BoundedSessions::new(owners)),
        config,
    );
    Router::new()
        .route_service(MCP_PATH, service)
        .layer(middleware::from_fn_with_state(guard_state, guard))
}

/// Serves MCP until `shutdown` is cancelled, answering the `Host` names and
/// origins `names` allows, and meeting the network as `settings` says (TLS,
/// header-read timeout, connection bounds; `crate::listener`).
///
/// # Errors
/// The listener's I/O error.
pub async fn serve(
    kernel: Kernel,
    auth: Authenticator,
    names: EdgeConfig,
    listener: tokio::net::TcpListener,
    settings: crate::listener::Edge,
    bounds: SessionBounds,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let edge = Edge::new(listener.local_addr()?, &names);
    let app = router(kernel, auth.clone(), edge, bounds, shutdown.clone());
    crate::listener::serve(listener, app, auth, settings, async move {
        shutdown.cancelled().await;
    })
    .await
}

/// An `initialize` past a bound on MCP sessions: `429` with `Retry-After`
/// and `MHS.PROTOCOL.LIMIT` (retryable), naming the bound.
fn sessions_full(full: Full) -> Response {
    let body = error_response(
        Value::Null,
        Code::ProtocolLimit,
        &format!(
            "too many MCP sessions (at most {}); close one (DELETE {MCP_PATH}) or retry later",
            full.limit
        ),
        json!({"reason": full.reason, "key": full.key, "limit": full.limit, "http_status": 429, "retry_after_s": RETRY_AFTER_S}),
    );
    let mut response = json_error(StatusCode::TOO_MANY_REQUESTS, &body);
    response.headers_mut().insert(
        header::RETRY_AFTER,
        axum::http::HeaderValue::from(RETRY_AFTER_S),
    );
    response
}

pub(super) fn json_error(status: StatusCode, body: &Value) -> Response {
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response();
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            axum::http::HeaderValue::from_static("Bearer"),
        );
    }
    response
}

async fn guard(State(g): State<Arc<Guard>>, request: Request, next: Next) -> Response {
    let principal = match g.auth.from_headers(request.headers()) {
        Ok(p) => p,
        Err(e) => {
            let body = error_response(Value::Null, e.code, &e.message, e.details);
            return json_error(StatusCode::UNAUTHORIZED, &body);
        }
    };
    let checked = g
        .edge
        .check_head(request.uri(), request.headers())
        .and_then(|()| crate::edge::check_content_type(request.headers()));
    if let Err(refusal) = checked {
        return super::edge::refused(&g.kernel, &principal, &refusal, request).await;
    }
    let (mut request, watch, initialize) = if request.method() == Method::POST {
        match checked_body(&g.kernel, &principal, request).await {
            Ok(checked) => checked,
            Err(response) => return response,
        }
    } else {
        (request, None, false)
    };
    let session = session_of(request.headers());
    // An `initialize` without a session makes one: it takes a slot of its
    // principal first, or is refused at the bound (never evicting another).
    let slot: Option<Slot> = match (&session, initialize) {
        (None, true) => match g.owners.reserve(&principal.id) {
            Ok(slot) => Some(slot),
            Err(full) => return sessions_full(full),
        },
        _ => None,
    };
    if let Some(sid) = &session {
        if !g.owners.owned_by(sid, &principal.id) {
            return match watch {
                // An e-stop is served whatever session it names.
                Some(watch) => refused_estop(&g.kernel, principal, watch, foreign_session()).await,
                None => foreign_session(),
            };
        }
    }
    let disconnect = CancellationToken::new();
    request.extensions_mut().insert(principal.clone());
    request
        .extensions_mut()
        .insert(Disconnect(disconnect.clone()));
    let delete = request.method() == Method::DELETE;
    let mut response = next.run(request).await;
    match (slot, &session, session_of(response.headers())) {
        (Some(slot), None, Some(opened)) if response.status().is_success() => slot.bind(opened),
        (_, Some(sid), _) if delete && response.status().is_success() => g.owners.ended(sid),
        // A slot not bound (the SDK refused the initialize) is given back.
        _ => {}
    }
    if delete && response.status() == StatusCode::ACCEPTED {
        // The SDK answers a session DELETE with 202; clients (the Python SDK
        // among them) expect 200 or 204 and warn otherwise. The session is
        // gone either way, so say so plainly.
        *response.status_mut() = StatusCode::NO_CONTENT;
    }
    if let Some(watch) = watch {
        if response.status().is_client_error() {
            // The SDK refused the e-stop before its handler ran: serve it here.
            return refused_estop(&g.kernel, principal, watch, response).await;
        }
    }
    if response.status().is_client_error() && !is_json(&response) {
        return transport_refusal(response).await;
    }
    response.map(|body| {
        Body::new(Guarded {
            inner: body,
            on_drop: Some(disconnect.drop_guard()),
        })
    })
}

fn is_json(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/json"))
}

/// The SDK refuses some requests at the transport (wrong content type or
/// `Accept`, a foreign `Host`, a missing session) with plain text; every
/// refusal on this surface is a JSON-RPC error, so the text becomes one,
/// with the SDK's status kept.
async fn transport_refusal(response: Response) -> Response {
    let status = response.status();
    let bytes = to_bytes(response.into_body(), SDK_ERROR_BYTES_MAX)
        .await
        .unwrap_or_default();
    let text: String = String::from_utf8_lossy(&bytes).chars().take(512).collect();
    let message = if text.trim().is_empty() {
        format!("the MCP transport refused the request ({status})")
    } else {
        text
    };
    let body = error_response(
        Value::Null,
        Code::ProtocolInvalidRequest,
        &message,
        json!({"reason": "refused_by_transport", "http_status": status.as_u16()}),
    );
    json_error(status, &body)
}

/// A well-formed e-stop handed to the SDK: its id and arguments, in case
/// the SDK refuses it before its handler.
struct EstopWatch {
    id: Value,
    arguments: Option<serde_json::Map<String, Value>>,
}

/// Serves an e-stop the SDK answered with `4xx`, and answers the protocol
/// error saying the stop was served, with the SDK's status and reason.
async fn refused_estop(
    kernel: &Kernel,
    principal: Principal,
    watch: EstopWatch,
    response: Response,
) -> Response {
    let status = response.status();
    let bytes = to_bytes(response.into_body(), SDK_ERROR_BYTES_MAX)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes);
    // The SDK's refusal is a JSON-RPC error or plain text; keep its message.
    let why = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| text.chars().take(512).collect());
    let estop = DefectiveEstop {
        id: Some(watch.id),
        code: Code::ProtocolInvalidRequest,
        reason: "refused_by_transport",
        message: format!("the MCP transport refused the e-stop ({status}): {why}"),
        arguments: watch.arguments,
    };
    match estop.serve(kernel, Some(principal)).await {
        Some(body) => json_error(status, &body),
        None => StatusCode::ACCEPTED.into_response(),
    }
}

/// Serves a defective e-stop and answers it: `400` with the protocol error,
/// or `202` for a notification (never answered).
async fn defective_estop(
    kernel: &Kernel,
    principal: &Principal,
    estop: DefectiveEstop,
) -> Response {
    let status = if estop.code == Code::ProtocolTooLarge {
        StatusCode::PAYLOAD_TOO_LARGE
    } else {
        StatusCode::BAD_REQUEST
    };
    match estop.serve(kernel, Some(principal.clone())).await {
        Some(body) => json_error(status, &body),
        None => StatusCode::ACCEPTED.into_response(),
    }
}

/// Reads a POST body (bounded) and refuses what is not strict JSON or not a
/// usable `tools/call`; serves a defective e-stop. Answers the request to
/// hand on, what to watch if it is an e-stop, and whether it is an
/// `initialize` (which makes a session).
async fn checked_body(
    kernel: &Kernel,
    principal: &Principal,
    request: Request,
) -> Result<(Request, Option<EstopWatch>, bool), Response> {
    let (parts, body) = request.into_parts();
    let bytes = match crate::read_body(body, crate::REQUEST_BYTES_MAX).await {
        crate::BodyBytes::Whole(bytes) => bytes,
        crate::BodyBytes::TooLarge(prefix) => {
            // A call of the `estop` tool is served even when too large to
            // read: every device (its arguments were never read).
            let message = format!(
                "request too large (the limit is {} bytes)",
                crate::REQUEST_BYTES_MAX
            );
            if let Some(estop) = screen::unparsable(&String::from_utf8_lossy(&prefix), &message) {
                let estop = DefectiveEstop {
                    code: Code::ProtocolTooLarge,
                    reason: "too_large",
                    message: message.clone(),
                    arguments: None,
                    ..estop
                };
                return Err(defective_estop(kernel, principal, estop).await);
            }
            let body = error_response(
                Value::Null,
                Code::ProtocolTooLarge,
                "request too large",
                json!({"limit_bytes": crate::REQUEST_BYTES_MAX}),
            );
            return Err(json_error(StatusCode::PAYLOAD_TOO_LARGE, &body));
        }
        crate::BodyBytes::Broken => {
            let body = error_response(
                Value::Null,
                Code::ProtocolParseError,
                "the request body could not be read",
                json!({"reason": "body_unreadable"}),
            );
            return Err(json_error(StatusCode::BAD_REQUEST, &body));
        }
    };
    let text = std::str::from_utf8(&bytes).map_err(|_| "the body is not UTF-8".to_owned());
    let value = match text.and_then(parse_strict) {
        Ok(v) => v,
        Err(message) => {
            if let Some(estop) = screen::unparsable(&String::from_utf8_lossy(&bytes), &message) {
                return Err(defective_estop(kernel, principal, estop).await);
            }
            let body = error_response(
                Value::Null,
                Code::ProtocolParseError,
                "parse error",
                json!({"reason": "invalid_json", "message": message}),
            );
            return Err(json_error(StatusCode::BAD_REQUEST, &body));
        }
    };
    let initialize = value.get("method").and_then(Value::as_str) == Some("initialize");
    let watch = match screen::message(value) {
        Screened::Pass(Value::Object(obj)) if screen::names_estop(&obj) => Some(EstopWatch {
            id: obj.get("id").cloned().unwrap_or(Value::Null),
            arguments: obj
                .get("params")
                .and_then(|p| p.get("arguments"))
                .and_then(Value::as_object)
                .cloned(),
        }),
        Screened::Pass(_) => None,
        Screened::Refuse(Some(body)) => return Err(json_error(StatusCode::BAD_REQUEST, &body)),
        Screened::Refuse(None) => return Err(StatusCode::ACCEPTED.into_response()),
        Screened::Estop(estop) => return Err(defective_estop(kernel, principal, estop).await),
    };
    Ok((
        Request::from_parts(parts, Body::from(bytes)),
        watch,
        initialize,
    ))
}

/// A response body that cancels its disconnect token when dropped before
/// its last frame: the client closed the stream while the call ran.
struct Guarded {
    inner: Body,
    on_drop: Option<DropGuard>,
}

impl http_body::Body for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            // The whole answer went out: ending now is no cancellation.
            if let Some(guard) = this.on_drop.take() {
                guard.disarm();
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
