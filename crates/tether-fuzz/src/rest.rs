//! The HTTP surface: REST bodies and paths, `POST /rpc`, behind the edge
//! (`tether_server::http::router`, the router `tether serve --http` serves),
//! called in process, on a kernel on the memory store with the built-in cell.
//!
//! An input is up to [`LINES_MAX`] requests separated by a line `--`, each
//! written like HTTP/1.1: `METHOD /path`, header lines `Name: value`, an
//! empty line, the body. Without a `Host` header the listen address is sent,
//! without a `Content-Type` one `application/json` is; `$I` in a path stands
//! for the last invocation id answered.
//!
//! Invariants after each request:
//! - every answer but a server-sent event stream is JSON with `ok` (REST)
//!   or `jsonrpc` (`/rpc`), and a 2xx REST answer says `ok: true`; the
//!   answers without a body are `204` to a `POST /rpc` e-stop sent as a
//!   notification (no `id`), which JSON-RPC serves and never answers, and
//!   every answer to `HEAD`, which HTTP never gives one;
//! - a `POST /tools/estop:invoke` latched the device its `input.device_id`
//!   names (every device when it names none or the body is defective), and a
//!   `POST /rpc` whose body asks for an e-stop latched as over JSON-RPC —
//!   whatever the edge refused (Host, Origin, content type) or the body;
//! - a refused invocation (an error status) moved no revision (judged while
//!   no operation runs and no earlier invocation of the input was accepted).

use crate::cell::{self, LINES_MAX};
use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, Request};
use serde_json::Value;
use std::time::Duration;
use tether_kernel::Kernel;
use tower::ServiceExt;

/// The address the router believes it listens on.
const LISTEN: &str = "127.0.0.1:7878";

/// Answer bytes read, at most.
const ANSWER_BYTES_MAX: usize = 4 << 20;

/// How long an answer may take to be read whole. Generous: only a stream
/// (server-sent events) should ever reach it, and it is then not judged.
const ANSWER_WAIT: Duration = Duration::from_secs(5);

/// Runs the target on one input.
pub fn run(data: &[u8]) {
    let rt = cell::runtime();
    assert!(rt.is_some(), "no runtime");
    let Some(rt) = rt else { return };
    rt.block_on(async {
        let kernel = cell::kernel();
        assert!(kernel.is_some(), "the built-in cell did not start");
        let Some(kernel) = kernel else { return };
        let Ok(listen) = LISTEN.parse() else { return };
        let edge =
            tether_server::edge::Edge::new(listen, &tether_server::edge::EdgeConfig::default());
        let router = tether_server::http::router(
            kernel.clone(),
            tether_server::auth::Authenticator::open(),
            edge,
            false,
        );
        let text = String::from_utf8_lossy(data);
        let mut last_invocation = String::from("inv_none");
        let mut accepted = false;
        for part in text.split("\n--\n").take(LINES_MAX) {
            let part = part.replace("$I", &last_invocation);
            if let Some(id) = one(&kernel, &router, &part, accepted).await {
                last_invocation = id;
                accepted = true;
            }
        }
        kernel.cancel_all_operations("fuzz input done");
    });
}

/// One request, parsed from `part`.
struct Parsed {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

fn parse(part: &str) -> Option<Parsed> {
    let (head, body) = part.split_once("\n\n").unwrap_or((part, ""));
    let mut lines = head.lines();
    let (method, path) = lines.next()?.split_once(' ')?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Some(Parsed {
        method: method.to_owned(),
        path: path.trim().to_owned(),
        headers,
        body: body.as_bytes().to_vec(),
    })
}

fn request(p: &Parsed) -> Option<Request<Body>> {
    let mut b = Request::builder()
        .method(p.method.as_str())
        .uri(p.path.as_str());
    let has = |name: &str| p.headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
    if !has("host") {
        b = b.header("host", LISTEN);
    }
    if !has("content-type") && !p.body.is_empty() {
        b = b.header("content-type", "application/json");
    }
    for (n, v) in &p.headers {
        let (Ok(n), Ok(v)) = (
            HeaderName::try_from(n.as_str()),
            HeaderValue::try_from(v.as_str()),
        ) else {
            continue;
        };
        b = b.header(n, v);
    }
    b.body(Body::from(p.body.clone())).ok()
}

/// Sends one request, judges it; answers the invocation id it answered.
///
/// A refusal is judged only while no invocation was accepted earlier in the
/// input: an accepted one runs on its own task and may move a revision at
/// any moment, before the kernel counts it as a running operation.
async fn one(
    kernel: &Kernel,
    router: &axum::Router,
    part: &str,
    accepted_before: bool,
) -> Option<String> {
    let parsed = parse(part)?;
    let req = request(&parsed)?;
    let route = parsed.path.split('?').next().unwrap_or_default().to_owned();
    let post = parsed.method == "POST";
    let before = cell::snapshot(kernel).await;
    let Ok(response) = router.clone().oneshot(req).await;
    let status = response.status();
    let stream = response
        .headers()
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let body = tokio::time::timeout(
        ANSWER_WAIT,
        axum::body::to_bytes(response.into_body(), ANSWER_BYTES_MAX),
    )
    .await;
    let empty = matches!(&body, Ok(Ok(bytes)) if bytes.is_empty());
    let answer: Option<Value> = match body {
        Ok(Ok(bytes)) => serde_json::from_slice(&bytes).ok(),
        _ => None,
    };
    let json_route =
        route == "/rpc" || route.starts_with("/tools") || route.starts_with("/invocations");
    // An e-stop sent over JSON-RPC as a notification (no `id`) is served and
    // never answered: `204 No Content`, as `rpc::handle_text` answers `None`.
    let unanswered_estop = post
        && route == "/rpc"
        && status == axum::http::StatusCode::NO_CONTENT
        && empty
        && crate::rpc::Asked::of(&parsed.body).estop;
    // An answer to `HEAD` has no body, whatever its status (HTTP; hyper
    // drops one a handler writes).
    let head = parsed.method.eq_ignore_ascii_case("HEAD");
    if json_route && !stream && !unanswered_estop && !head {
        assert!(
            answer.is_some(),
            "{} {route}: {status} answered no JSON",
            parsed.method
        );
    }
    if post && route == "/tools/estop:invoke" {
        judge_rest_estop(kernel, &parsed.body, status.as_u16());
    } else if post && route == "/rpc" {
        let asked = crate::rpc::Asked::of(&parsed.body);
        if asked.estop {
            crate::rpc::judge_estop(kernel, &asked, answer.as_ref());
        }
    } else if post
        && !accepted_before
        && route.starts_with("/tools/")
        && route.ends_with(":invoke")
        && !status.is_success()
    {
        let after = cell::snapshot(kernel).await;
        crate::rpc::judge_refusal(&before, &after);
    }
    if route.starts_with("/tools") || route.starts_with("/invocations") {
        if let Some(a) = &answer {
            let ok = a.get("ok").and_then(Value::as_bool);
            assert!(ok.is_some(), "a REST answer without `ok`: {a}");
            if status.is_success() {
                assert_eq!(ok, Some(true), "a {status} answered ok: false: {a}");
            }
        }
    }
    answer
        .as_ref()
        .and_then(|a| a.pointer("/data/invocation_id"))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// The REST e-stop latched what its body asks (every device when the body
/// cannot be read or names no device).
fn judge_rest_estop(kernel: &Kernel, body: &[u8], status: u16) {
    let body: Option<Value> = if body.is_empty() {
        Some(Value::Object(serde_json::Map::new()))
    } else {
        serde_json::from_slice(body).ok()
    };
    let input = body.as_ref().filter(|b| b.is_object()).map(|b| {
        b.get("input")
            .cloned()
            .unwrap_or(Value::Object(serde_json::Map::new()))
    });
    // A well-formed `device_id` naming no device stops nothing (404), and so
    // does it behind an edge refusal (403, 415): the edge serves the e-stop
    // the body asks for, no wider.
    let _ = status;
    let Some(must) = cell::estop_must_latch(kernel, input.as_ref(), false) else {
        return;
    };
    for d in must {
        assert!(
            cell::latched(kernel, &d),
            "POST /tools/estop:invoke ({status}) left `{d}` unlatched"
        );
    }
}
