//! The edge in front of the JSON-RPC and REST listener (`POST /rpc`, the
//! REST gateway, `/healthz`, `/openapi.json`, and the answers to unknown
//! routes): one middleware over the whole router.
//!
//! The console (`/console/…`) takes no bearer token (its session cookie is
//! the credential, checked by `crate::console`): only `Host` and `Origin`
//! (403) and, for a body, the form type (415).
//!
//! Per request: the token first — a request that needs one and has none (or
//! a wrong one) goes on to its route, which answers 401 before it reads the
//! body; `/healthz` and `/openapi.json` need none. Then `Host` and `Origin`
//! (403), then the content type (415). A refused request's body is read
//! only when its route is an e-stop's — `POST /rpc` (served when the body
//! asks for `mhs.safety.estop`, `crate::rpc::refused_estop`) or `POST
//! /tools/estop:invoke` (`crate::rest::EstopDoor`) — and the refusal then
//! carries `estop_served` and the receipt. Refusals are in the route's own
//! form: a JSON-RPC error on `/rpc`, the REST envelope elsewhere.
//!
//! **Never belongs here:** which names, origins and types are served
//! (`super`), how an e-stop is recognised or served (the surfaces).

use super::{Edge, EstopOutcome, Refusal};
use crate::auth::Authenticator;
use crate::rpc::error_response;
use axum::extract::{Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use serde_json::Value;
use std::sync::Arc;
use tether_kernel::Kernel;

/// What the middleware needs.
pub(crate) struct HttpGuard {
    pub edge: Edge,
    pub auth: Arc<Authenticator>,
    pub kernel: Kernel,
    pub rest_estop: crate::rest::EstopDoor,
}

/// The kind of route a request is for, as far as the edge cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// `/rpc`: refusals are JSON-RPC errors; a POST may be an e-stop.
    Rpc,
    /// `POST /tools/estop:invoke` (the segment as the router decodes it).
    RestEstop,
    /// `/healthz`, `/openapi.json`: no token needed.
    Open,
    /// `/console` and below: the session cookie is the credential (the
    /// console checks it), bodies are forms.
    Console,
    /// Every other path: the REST envelope.
    Rest,
}

/// Longest path segment decoded to recognise the REST e-stop route.
const SEGMENT_BYTES_MAX: usize = 256;

/// `%XX` decoded as the router decodes a path segment (an invalid escape is
/// kept as it is); `None` when the result is not UTF-8 or too long.
fn percent_decoded(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    if bytes.len() > SEGMENT_BYTES_MAX {
        return None;
    }
    let hex = |b: u8| char::from(b).to_digit(16);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| Some((hex(*bytes.get(i + 1)?)?, hex(*bytes.get(i + 2)?)?)))
            .flatten();
        match escaped {
            Some((hi, lo)) => {
                out.push(u8::try_from(hi * 16 + lo).ok()?);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

fn route_of(method: &Method, path: &str) -> Route {
    match path {
        "/rpc" => Route::Rpc,
        "/healthz" | "/openapi.json" => Route::Open,
        "/console" => Route::Console,
        _ if path.starts_with("/console/") => Route::Console,
        _ => {
            let names_estop =
                |segment: &str| segment.strip_suffix(":invoke") == Some(crate::tools::ESTOP_TOOL);
            let is_estop = *method == Method::POST
                && path.strip_prefix("/tools/").is_some_and(|segment| {
                    if segment.contains('%') {
                        percent_decoded(segment).is_some_and(|s| names_estop(&s))
                    } else {
                        names_estop(segment)
                    }
                });
            if is_estop {
                Route::RestEstop
            } else {
                Route::Rest
            }
        }
    }
}

/// The middleware: token (left to the route), Host and Origin, content
/// type; a refused e-stop is served and the refusal says so.
pub(crate) async fn guard(
    State(g): State<Arc<HttpGuard>>,
    request: Request,
    next: Next,
) -> Response {
    let route = route_of(request.method(), request.uri().path());
    if route == Route::Console {
        // Host and Origin as everywhere; no bearer token; forms only.
        let checked = g
            .edge
            .check_head(request.uri(), request.headers())
            .and_then(|()| super::check_form_type(request.headers()));
        return match checked {
            Ok(()) => next.run(request).await,
            Err(refusal) => answer(Route::Rest, &refusal, None),
        };
    }
    let principal = match g.auth.from_headers(request.headers()) {
        Ok(p) => Some(p),
        // 401 comes first, from the route itself, before any body is read.
        Err(_) if route != Route::Open => return next.run(request).await,
        Err(_) => None,
    };
    let checked = g
        .edge
        .check_head(request.uri(), request.headers())
        .and_then(|()| super::check_content_type(request.headers()));
    let Err(refusal) = checked else {
        return next.run(request).await;
    };
    let post = request.method() == Method::POST;
    let estop = match (route, principal) {
        (Route::Rpc, Some(p)) if post => {
            let body = crate::read_body(request.into_body(), crate::REQUEST_BYTES_MAX).await;
            crate::rpc::refused_estop(&g.kernel, &p, body).await
        }
        (Route::RestEstop, Some(p)) => Some(g.rest_estop.serve(&p, request.into_body()).await),
        _ => None,
    };
    answer(route, &refusal, estop.as_ref())
}

/// The refusal in the route's form, with what became of its e-stop.
fn answer(route: Route, refusal: &Refusal, estop: Option<&EstopOutcome>) -> Response {
    let mut details = refusal.details();
    if let Some(e) = estop {
        e.add_to(&mut details);
    }
    if route == Route::Rpc {
        let id = estop.map_or(Value::Null, |e| e.id.clone());
        let body = error_response(id, refusal.code, &refusal.message, details);
        return crate::json_response(refusal.status(), &body);
    }
    let mut response = crate::rest::refusal(refusal.code, &refusal.message, details);
    *response.status_mut() = refusal.status();
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn the_rest_estop_route_is_recognised_as_the_router_decodes_it() {
        let post = Method::POST;
        assert_eq!(route_of(&post, "/tools/estop:invoke"), Route::RestEstop);
        assert_eq!(route_of(&post, "/tools/%65stop%3Ainvoke"), Route::RestEstop);
        assert_eq!(route_of(&post, "/tools/%65stop%3ainvoke"), Route::RestEstop);
        assert_eq!(route_of(&Method::GET, "/tools/estop:invoke"), Route::Rest);
        assert_eq!(route_of(&post, "/tools/estop"), Route::Rest);
        assert_eq!(route_of(&post, "/tools/arm-1__stop:invoke"), Route::Rest);
        assert_eq!(route_of(&post, "/tools/estop:invoke/x"), Route::Rest);
        assert_eq!(route_of(&post, "/tools/%zzestop:invoke"), Route::Rest);
        assert_eq!(route_of(&post, "/rpc"), Route::Rpc);
        assert_eq!(route_of(&Method::GET, "/healthz"), Route::Open);
        assert_eq!(route_of(&Method::GET, "/openapi.json"), Route::Open);
        assert_eq!(route_of(&Method::GET, "/console/"), Route::Console);
        assert_eq!(route_of(&post, "/console/estop"), Route::Console);
        assert_eq!(route_of(&Method::GET, "/consoles"), Route::Rest);
        assert_eq!(percent_decoded("a%2"), Some("a%2".into()));
        assert_eq!(percent_decoded("%ff"), None);
        assert_eq!(percent_decoded(&"a".repeat(SEGMENT_BYTES_MAX + 1)), None);
    }

    #[test]
    fn refusals_are_403_or_415() {
        let headers = axum::http::HeaderMap::new();
        let edge = Edge::new(
            "127.0.0.1:7878".parse().expect("addr"),
            &super::super::EdgeConfig::default(),
        );
        let refused = edge
            .check_head(&axum::http::Uri::from_static("/rpc"), &headers)
            .expect_err("no Host");
        assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    }
}
