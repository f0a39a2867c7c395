//! JSON-RPC over HTTP: `POST /rpc` (and `GET /healthz`), with the REST tool
//! gateway (`crate::rest`) on the same server, all behind the edge
//! (`crate::edge::guard`: token, Host and Origin, content type).
//!
//! Each request runs on its own task, so an e-stop is served while a long
//! motion is in flight on another connection.

use crate::auth::Authenticator;
use crate::edge::guard::{guard as edge_guard, HttpGuard};
use crate::edge::{Edge, EdgeConfig};
use crate::json_response;
use crate::rpc::{error_response, handle_text};
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::{header, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use std::sync::Arc;
use tether_core::Code;
use tether_kernel::Kernel;

#[derive(Clone)]
struct AppState {
    kernel: Kernel,
    auth: Arc<Authenticator>,
    /// `GET /metrics` served without a token (`[telemetry] metrics_auth = false`).
    metrics_open: bool,
}

/// The router (exposed for in-process tests), behind the edge
/// (`crate::edge`): every route, the answers to unknown ones included.
/// `tls` says the listener speaks TLS (the console's cookie is then
/// `Secure`, so a browser never sends it over plain HTTP).
pub fn router(kernel: Kernel, auth: Authenticator, edge: Edge, tls: bool) -> Router {
    router_with(
        kernel,
        auth,
        edge,
        tls,
        false,
        crate::rest::FINISHED_MAX_DEFAULT,
    )
}

/// [`router`], with `GET /metrics` served without a token when
/// `metrics_open` (with principals configured it needs one otherwise), and
/// at most `rest_finished_max` finished REST invocations kept in memory.
pub fn router_with(
    kernel: Kernel,
    auth: Authenticator,
    edge: Edge,
    tls: bool,
    metrics_open: bool,
    rest_finished_max: usize,
) -> Router {
    let auth = Arc::new(auth);
    let (rest, rest_estop) =
        crate::rest::router_and_estop(kernel.clone(), Arc::clone(&auth), rest_finished_max);
    let guard = Arc::new(HttpGuard {
        edge,
        auth: Arc::clone(&auth),
        kernel: kernel.clone(),
        rest_estop,
    });
    Router::new()
        .route("/rpc", post(rpc))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .with_state(AppState {
            kernel: kernel.clone(),
            auth: Arc::clone(&auth),
            metrics_open,
        })
        .merge(rest)
        .merge(crate::console::router(kernel, auth, tls))
        .fallback(crate::rest::not_found)
        .method_not_allowed_fallback(crate::rest::method_not_allowed)
        .layer(middleware::from_fn_with_state(guard, edge_guard))
}

async fn rpc(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let parent = crate::telemetry::traceparent_header(&headers);
    let tracer = state.kernel.tracer().cloned();
    let run = rpc_traced(state, headers, body);
    crate::telemetry::request(tracer.as_ref(), "jsonrpc", "POST /rpc", parent, run).await
}

/// 401 with `WWW-Authenticate: Bearer` and a JSON-RPC error body.
fn unauthorized(e: &tether_kernel::ApiError) -> Response {
    let body = error_response(Value::Null, e.code, &e.message, e.details.clone());
    let mut response = json_response(StatusCode::UNAUTHORIZED, &body);
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        axum::http::HeaderValue::from_static("Bearer"),
    );
    response
}

/// `GET /metrics`: the kernel's counters as Prometheus text
/// (`crate::metrics`); behind the bearer token unless opened.
async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if !state.metrics_open {
        if let Err(e) = state.auth.from_headers(&headers) {
            return unauthorized(&e);
        }
    }
    let page = crate::metrics::render(&state.kernel.meters());
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        page,
    )
        .into_response()
}

async fn rpc_traced(state: AppState, headers: HeaderMap, body: Body) -> Response {
    // With principals configured every request, the e-stop included, needs a
    // valid token; it is refused before the body is even read.
    let principal = match state.auth.from_headers(&headers) {
        Ok(p) => p,
        Err(e) => return unauthorized(&e),
    };
    let bytes = match crate::read_body(body, crate::REQUEST_BYTES_MAX).await {
        crate::BodyBytes::Whole(b) => b,
        crate::BodyBytes::TooLarge(prefix) => {
            let reply = crate::rpc::too_large(&state.kernel, &principal, &prefix, None).await;
            return crate::bytes_response(StatusCode::PAYLOAD_TOO_LARGE, reply.to_bytes());
        }
        crate::BodyBytes::Broken => {
            let e = error_response(
                Value::Null,
                Code::ProtocolParseError,
                "the request body could not be read",
                json!({"reason": "body_unreadable"}),
            );
            return json_response(StatusCode::BAD_REQUEST, &e);
        }
    };
    match handle_text(&state.kernel, &principal, &bytes).await {
        Some(reply) => crate::bytes_response(StatusCode::OK, reply.to_bytes()),
        None => StatusCode::NO_CONTENT.into_response(),
    }
}

/// 200 only while the store takes writes and every hardware or hybrid device
/// is reachable; else 503, the body naming what is wrong
/// (`Kernel::health`, bounded by its probe wait).
async fn healthz(State(state): State<AppState>) -> Response {
    let health = state.kernel.health().await;
    let status = if health.ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json_response(status, &health.body)
}

/// Serves until `shutdown` resolves with the default listener settings
/// (plain TCP, the default header-read timeout and connection bounds),
/// answering the `Host` names of the listener's address and `names`'s, and
/// the origins `names` allows.
///
/// # Errors
/// The listener's I/O error.
pub async fn serve(
    kernel: Kernel,
    auth: Authenticator,
    names: EdgeConfig,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let settings = crate::listener::Edge::default();
    serve_on(kernel, auth, names, listener, settings, shutdown).await
}

/// [`serve`], meeting the network as `settings` says (TLS, header-read
/// timeout, connection bounds; `crate::listener`).
///
/// # Errors
/// The listener's I/O error.
pub async fn serve_on(
    kernel: Kernel,
    auth: Authenticator,
    names: EdgeConfig,
    listener: tokio::net::TcpListener,
    settings: crate::listener::Edge,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let edge = Edge::new(listener.local_addr()?, &names);
    let open = settings.metrics_open();
    let app = router_with(
        kernel,
        auth.clone(),
        edge,
        settings.is_tls(),
        open,
        settings.rest_finished_max(),
    );
    crate::listener::serve(listener, app, auth, settings, shutdown).await
}
