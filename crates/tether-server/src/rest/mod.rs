//! The REST tool gateway, served beside `POST /rpc` (docs/REST.md).
//!
//! | route | answers |
//! |---|---|
//! | `GET /tools` | `data.tools`: the catalogue of `crate::tools` |
//! | `GET /tools/{id}` | one tool |
//! | `GET /tools/{id}/context` | limits, live state, mode, risk, latch, interlocks |
//! | `POST /tools/{id}:invoke` | read 200, e-stop 200, write/action 202 + invocation |
//! | `GET /invocations/{id}` | the invocation record |
//! | `GET /invocations/{id}/result` | 202 while pending, 200 with the receipt |
//! | `POST /invocations/{id}/cancel` | cancellation delivered (never "stopped") |
//! | `POST /invocations/{id}/stop` | the device's stop-class command ran |
//! | `GET /openapi.json` | the OpenAPI 3 document (no token needed) |
//!
//! Every route authenticates from the bearer token before it reads the body,
//! reads at most `REQUEST_BYTES_MAX` bytes, parses strictly and refuses
//! unknown members. Tokens are never logged.

mod envelope;
mod gateway;
mod invocations;

/// The REST error envelope, for answers made before a route is reached
/// (`crate::listener`'s connection-limit refusal).
pub(crate) use envelope::error_body;

use crate::auth::Authenticator;
use crate::edge::EstopOutcome;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use envelope::{from_body, no_body, ok, read_json, Data, RestError};
use gateway::{ControlBody, Gateway, InvokeBody};
use invocations::Form;
pub use invocations::{FINISHED_MAX_DEFAULT, FINISHED_MAX_LIMIT};
use serde_json::{json, Value};
use std::sync::Arc;
use tether_core::{echo, Code};
use tether_kernel::{Kernel, Principal};

/// The OpenAPI 3 document of these routes, hand-written and served as is.
pub const OPENAPI_JSON: &str = include_str!("openapi.json");

#[derive(Clone)]
struct RestState {
    gw: Arc<Gateway>,
    auth: Arc<Authenticator>,
}

type Answer = Result<(StatusCode, Data), RestError>;

/// The gateway's routes, to be merged into the HTTP router.
pub fn router(kernel: Kernel, auth: Arc<Authenticator>) -> Router {
    router_and_estop(kernel, auth, invocations::FINISHED_MAX_DEFAULT).0
}

/// The gateway's routes, and the door through which the edge serves the
/// `estop` tool of a request it refused (`crate::edge::guard`).
/// At most `finished_max` finished invocations stay in memory.
pub(crate) fn router_and_estop(
    kernel: Kernel,
    auth: Arc<Authenticator>,
    finished_max: usize,
) -> (Router, EstopDoor) {
    let state = RestState {
        gw: Arc::new(Gateway::new(kernel, finished_max)),
        auth,
    };
    let door = EstopDoor(state.clone());
    let router = Router::new()
        .route("/tools", get(list_tools))
        .route("/tools/{tool}", axum::routing::any(tool_segment))
        .route("/tools/{tool}/context", get(context))
        .route("/invocations/{id}", get(get_invocation))
        .route("/invocations/{id}/result", get(result))
        .route("/invocations/{id}/{action}", axum::routing::post(control))
        .route("/openapi.json", get(openapi))
        .with_state(state);
    (router, door)
}

/// Serves the `estop` tool for a request the edge refused (its Host, Origin
/// or content type) exactly as its route would: a body that cannot be used
/// stops every device. Answers what became of the stop; the edge answers
/// the refusal with it.
#[derive(Clone)]
pub(crate) struct EstopDoor(RestState);

impl EstopDoor {
    pub(crate) async fn serve(&self, p: &Principal, body: Body) -> EstopOutcome {
        let answer = match self.0.gw.tool(crate::tools::ESTOP_TOOL) {
            Ok(tool) => invoke_estop(&self.0, p, tool, body).await,
            Err(e) => Err(e),
        };
        match answer {
            Ok((_, data)) => {
                let v = match data {
                    Data::Value(v) => v,
                    Data::Text(t) => serde_json::from_str(t.as_str()).unwrap_or_default(),
                };
                EstopOutcome {
                    id: Value::Null,
                    served: true,
                    receipt: v.get("receipt").cloned(),
                    error: None,
                }
            }
            Err(e) => EstopOutcome {
                id: Value::Null,
                served: e.details["estop_served"] == true,
                receipt: e.details.get("receipt").cloned(),
                error: Some(json!({"code": e.code.as_str(), "message": e.message})),
            },
        }
    }
}

/// A refusal of the edge in the envelope (403 or 415 by its code).
pub(crate) fn refusal(code: Code, message: &str, details: Value) -> Response {
    RestError::new(code, message, details).into_response()
}

fn respond(answer: Answer) -> Response {
    match answer {
        Ok((status, data)) => ok(status, data),
        Err(e) => e.into_response(),
    }
}

/// The principal from the bearer token; checked before any body is read.
fn principal(s: &RestState, headers: &HeaderMap) -> Result<Principal, RestError> {
    s.auth.from_headers(headers).map_err(RestError::from)
}

async fn list_tools(State(s): State<RestState>, headers: HeaderMap, body: Body) -> Response {
    respond(
        async {
            principal(&s, &headers)?;
            no_body(body).await?;
            Ok((StatusCode::OK, s.gw.tools_json().into()))
        }
        .await,
    )
}

/// `/tools/{id}` (GET) and `/tools/{id}:invoke` (POST) share one path
/// segment, so the method is checked here against the suffix: each answers
/// 405 with its own `Allow` for any other method.
async fn tool_segment(
    state: State<RestState>,
    method: Method,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Body,
) -> Response {
    let invoking = path.as_ref().is_ok_and(|Path(p)| p.ends_with(":invoke"));
    match (invoking, method) {
        (true, Method::POST) => invoke(state, headers, path, body).await,
        (false, Method::GET | Method::HEAD) => get_tool(state, headers, path, body).await,
        (true, _) => not_allowed("POST"),
        (false, _) => not_allowed("GET,HEAD"),
    }
}

fn not_allowed(allow: &'static str) -> Response {
    let mut r = RestError::new(
        Code::ProtocolMethodNotFound,
        "method not allowed on this route",
        json!({"reason": "method_not_allowed", "allow": allow}),
    )
    .with_status(StatusCode::METHOD_NOT_ALLOWED)
    .into_response();
    r.headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static(allow));
    r
}

async fn get_tool(
    State(s): State<RestState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Body,
) -> Response {
    respond(
        async {
            let (_, tool) = bodiless(&s, &headers, path, body).await?;
            Ok((StatusCode::OK, s.gw.tool(&tool)?.to_json().into()))
        }
        .await,
    )
}

async fn context(
    State(s): State<RestState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Body,
) -> Response {
    respond(
        async {
            let (p, tool) = bodiless(&s, &headers, path, body).await?;
            let tool = s.gw.tool(&tool)?;
            Ok((StatusCode::OK, s.gw.context(&p, tool).await?.into()))
        }
        .await,
    )
}

fn path_error(e: PathRejection) -> RestError {
    RestError::new(
        Code::ProtocolInvalidRequest,
        "the path cannot be read",
        json!({"reason": "path_invalid", "message": e.body_text()}),
    )
}

/// A route that takes a path segment and no body: the caller, checked first,
/// then the segment, then that the body is empty.
async fn bodiless(
    s: &RestState,
    headers: &HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Body,
) -> Result<(Principal, String), RestError> {
    let p = principal(s, headers)?;
    let segment = segment(path)?;
    no_body(body).await?;
    Ok((p, segment))
}

fn segment(path: Result<Path<String>, PathRejection>) -> Result<String, RestError> {
    path.map(|Path(s)| s).map_err(path_error)
}

fn no_route(path: &str) -> RestError {
    RestError::new(
        Code::ProtocolMethodNotFound,
        format!("no route `{}`", echo::text(path)),
        json!({"path": echo::text(path)}),
    )
}

async fn invoke(
    State(s): State<RestState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Body,
) -> Response {
    let parent = crate::telemetry::traceparent_header(&headers);
    let tracer = s.gw.kernel.tracer().cloned();
    let answer = async {
        let p = principal(&s, &headers)?;
        let segment = segment(path)?;
        let name = segment
            .strip_suffix(":invoke")
            .ok_or_else(|| no_route(&format!("/tools/{segment}")))?;
        let tool = s.gw.tool(name)?;
        if tool.kind == crate::tools::ToolKind::Estop {
            return invoke_estop(&s, &p, tool, body).await;
        }
        let body: InvokeBody = from_body(read_json(body).await?.unwrap_or(json!({})))?;
        s.gw.invoke(&p, tool, body).await
    };
    let route = "POST /tools/{tool}:invoke";
    respond(crate::telemetry::request(tracer.as_ref(), "rest", route, parent, answer).await)
}

/// The e-stop is served even when its request is defective: a body that is
/// too large, malformed or carries unknown members stops every device, and
/// the defect is answered with `details.estop_served` and the receipt.
async fn invoke_estop(
    s: &RestState,
    p: &Principal,
    tool: &crate::tools::Tool,
    body: Body,
) -> Answer {
    let parsed = read_json(body)
        .await
        .and_then(|v| from_body::<InvokeBody>(v.unwrap_or(json!({}))));
    match parsed {
        Ok(body) => s.gw.invoke(p, tool, body).await,
        Err(mut e) => {
            let receipt = s.gw.estop_malformed(p, &e.message).await;
            e.details["estop_served"] = json!(true);
            e.details["receipt"] = receipt;
            Err(e)
        }
    }
}

async fn get_invocation(
    State(s): State<RestState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Body,
) -> Response {
    respond(
        async {
            let (p, id) = bodiless(&s, &headers, path, body).await?;
            let view = s.gw.lookup(&p, &id)?.write(Form::View { links: false })?;
            Ok((StatusCode::OK, Data::Text(view)))
        }
        .await,
    )
}

async fn result(
    State(s): State<RestState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Body,
) -> Response {
    respond(
        async {
            let (p, id) = bodiless(&s, &headers, path, body).await?;
            let record = s.gw.lookup(&p, &id)?;
            if record.terminal() {
                let out = record.write_result()?;
                Ok((StatusCode::OK, Data::Text(out)))
            } else {
                let view = record.write(Form::View { links: false })?;
                Ok((StatusCode::ACCEPTED, Data::Text(view)))
            }
        }
        .await,
    )
}

async fn control(
    State(s): State<RestState>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
    body: Body,
) -> Response {
    respond(
        async {
            let p = principal(&s, &headers)?;
            let Path((id, action)) = path.map_err(path_error)?;
            if action != "cancel" && action != "stop" {
                return Err(no_route(&format!("/invocations/{id}/{action}")));
            }
            if let Some(v) = read_json(body).await? {
                let _: ControlBody = from_body(v)?;
            }
            if action == "cancel" {
                s.gw.cancel(&p, &id)
            } else {
                s.gw.stop(&p, &id).await
            }
        }
        .await,
    )
}

async fn openapi() -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        OPENAPI_JSON,
    )
        .into_response()
}

/// Unknown routes answer the envelope (404), like every other refusal.
pub(crate) async fn not_found(uri: axum::http::Uri) -> Response {
    no_route(uri.path()).into_response()
}

/// A known route with another method (405).
pub(crate) async fn method_not_allowed(uri: axum::http::Uri) -> Response {
    RestError::new(
        Code::ProtocolMethodNotFound,
        format!("method not allowed on `{}`", echo::text(uri.path())),
        json!({"path": echo::text(uri.path()), "reason": "method_not_allowed"}),
    )
    .with_status(StatusCode::METHOD_NOT_ALLOWED)
    .into_response()
}
