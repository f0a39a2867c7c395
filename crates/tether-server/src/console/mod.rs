//! The operator console: `/console/` on the JSON-RPC listener, server-
//! rendered pages for the people who stop, approve and reset.
//!
//! **Owns:** sign-in (a bearer token becomes an HTTP-only, `SameSite=Strict`
//! session cookie, `session`), CSRF on every state-changing form, the pages
//! (`html`), the live regions (server-sent events of rendered fragments), and
//! the embedded script and style (`assets/`: no CDN, nothing fetched at run
//! time).
//! **Never here:** authority. Every action is the JSON-RPC call the CLI
//! makes (`crate::rpc::handle_text`, as the signed-in principal): the same
//! rules, refusals and evidence; the console only shows and asks.
//! **Edge:** `crate::edge::guard` checks `Host` and `Origin` for these routes
//! as for every other (the console's own origin is the endpoint's), takes no
//! bearer token on them (the cookie is the credential) and lets a POST
//! through only as a form (`application/x-www-form-urlencoded`).

mod form;
mod html;
mod session;

use crate::auth::Authenticator;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use html::Viewer;
use serde_json::{json, Value};
use session::{Session, Sessions};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tether_kernel::{Kernel, Principal};

/// A form body's bound.
const FORM_BYTES_MAX: usize = 16 * 1024;
/// Live streams open at once, at most (each re-renders four times a second).
const STREAMS_MAX: usize = 64;
/// How often a live stream sends fresh fragments (well under 1 s behind).
const LIVE_EVERY: Duration = Duration::from_millis(250);
/// Approvals a page shows at most (one page of `mhs.approvals.list`).
const APPROVALS_SHOWN: u64 = 100;
/// Evidence entries the evidence page shows (the newest).
const EVIDENCE_SHOWN: usize = 50;

const SCRIPT: &str = include_str!("assets/console.js");
const STYLE: &str = include_str!("assets/console.css");

#[derive(Clone)]
struct Console {
    kernel: Kernel,
    auth: Arc<Authenticator>,
    sessions: Arc<Sessions>,
    streams: Arc<AtomicUsize>,
    /// The listener speaks TLS: the cookie is `Secure`.
    secure: bool,
}

impl Console {
    /// The `Set-Cookie` value of session `id` on this listener.
    fn cookie(&self, id: &str) -> String {
        session::set_cookie(id, self.secure)
    }
}

/// The console's routes (merged into the JSON-RPC listener's router);
/// `secure` when the listener speaks TLS.
pub fn router(kernel: Kernel, auth: Arc<Authenticator>, secure: bool) -> Router {
    let state = Console {
        kernel,
        auth,
        sessions: Arc::new(Sessions::default()),
        streams: Arc::new(AtomicUsize::new(0)),
        secure,
    };
    Router::new()
        .route("/console", get(|| async { redirect("/console/") }))
        .route("/console/", get(devices_page))
        .route("/console/login", get(login_page).post(login))
        .route("/console/logout", post(logout))
        .route("/console/devices/{id}", get(device_page))
        .route("/console/approvals", get(approvals_page))
        .route("/console/approvals/decide", post(decide))
        .route("/console/estop", post(estop))
        .route(
            "/console/reset",
            post(|s, h, b| device_action(s, h, b, "mhs.safety.reset")),
        )
        .route(
            "/console/arm",
            post(|s, h, b| device_action(s, h, b, "mhs.safety.arm")),
        )
        .route(
            "/console/disarm",
            post(|s, h, b| device_action(s, h, b, "mhs.safety.disarm")),
        )
        .route("/console/events", get(events))
        .route("/console/evidence", get(evidence_page))
        .route("/console/evidence/verify", get(evidence_verify))
        .route("/console/evidence/export", get(evidence_export))
        .route(
            "/console/static/console.js",
            get(|| async { asset(SCRIPT, "text/javascript") }),
        )
        .route(
            "/console/static/console.css",
            get(|| async { asset(STYLE, "text/css") }),
        )
        .with_state(state)
}

fn asset(text: &'static str, mime: &'static str) -> Response {
    let mut r = text.into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(mime));
    r
}

fn redirect(to: &'static str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    r.headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static(to));
    r
}

fn page(status: StatusCode, text: String) -> Response {
    let mut r = (status, text).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // Scripts and styles only from here; never framed by another page.
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'self'; frame-ancestors 'none'; form-action 'self'"),
    );
    r
}

fn with_cookie(mut r: Response, cookie: &str) -> Response {
    if let Ok(v) = HeaderValue::from_str(cookie) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

/// The session of a page request: the cookie's, or (no principals) a new
/// local one; `Err` answers the request (to sign-in, or refused).
fn viewer_session(
    c: &Console,
    headers: &HeaderMap,
) -> Result<(String, Session, bool), Box<Response>> {
    if let Some(id) = session::cookie_of(headers) {
        if let Some(s) = c.sessions.get(&id) {
            return Ok((id, s, false));
        }
    }
    if c.auth.required() {
        return Err(Box::new(redirect("/console/login")));
    }
    let id = c.sessions.open(Principal::local_agent());
    let s = c
        .sessions
        .get(&id)
        .ok_or_else(|| Box::new(page(StatusCode::INTERNAL_SERVER_ERROR, "session".into())))?;
    Ok((id, s, true))
}

fn viewer<'a>(c: &Console, s: &'a Session) -> Viewer<'a> {
    Viewer {
        id: &s.principal.id,
        kind: s.principal.kind.as_str(),
        operator: s.principal.operator,
        local: !c.auth.required(),
        csrf: &s.csrf,
    }
}

/// One JSON-RPC call as `p`, in process: the result, or the error object.
async fn rpc(kernel: &Kernel, p: &Principal, method: &str, params: Value) -> Result<Value, Value> {
    let request = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let text = serde_json::to_vec(&request).unwrap_or_default();
    let Some(reply) = crate::rpc::handle_text(kernel, p, &text).await else {
        return Err(json!({"message": "no answer"}));
    };
    let v: Value = serde_json::from_slice(&reply.to_bytes()).unwrap_or(Value::Null);
    match v.get("error") {
        Some(e) => Err(e.clone()),
        None => Ok(v["result"].clone()),
    }
}

fn refusal_text(e: &Value) -> String {
    let code = e["data"]["mhs_code"].as_str().unwrap_or("refused");
    let message = e["message"].as_str().unwrap_or("refused");
    let reason = e["data"]["details"]["reason"]
        .as_str()
        .map(|r| format!(" ({r})"))
        .unwrap_or_default();
    format!("Refused: {message}{reason} [{code}]")
}

/// The devices table with live state.
async fn devices_html(c: &Console, id: &str, s: &Session) -> String {
    let mut status = c.kernel.safety_status(None).unwrap_or(Value::Null);
    let list = c.kernel.devices_list();
    let mut states = serde_json::Map::new();
    let sid = kernel_session(c, id, s).await;
    for d in status["devices"].as_array_mut().into_iter().flatten() {
        let did = d["device_id"].as_str().unwrap_or_default().to_owned();
        let summary = list["devices"]
            .as_array()
            .and_then(|l| l.iter().find(|x| x["device_id"] == did.as_str()))
            .cloned()
            .unwrap_or(Value::Null);
        d["risk_class"] = summary["risk_class"].clone();
        let resource = summary["resources"][0]["resource"].clone();
        if let (Some(sid), Value::String(resource)) = (&sid, resource) {
            let read = rpc(
                &c.kernel,
                &s.principal,
                "mhs.resource.read",
                json!({"session_id": sid, "device_id": did, "resource": resource}),
            )
            .await;
            if let Ok(r) = read {
                states.insert(did, r["state"].clone());
            }
        }
    }
    html::devices_fragment(&status, &states)
}

/// The kernel session this console session reads state in (opened once).
async fn kernel_session(c: &Console, id: &str, s: &Session) -> Option<String> {
    if let Some(k) = &s.kernel_session {
        return Some(k.clone());
    }
    let opened = rpc(
        &c.kernel,
        &s.principal,
        "mhs.session.open",
        json!({"client": {"name": "tether-console"}}),
    )
    .await
    .ok()?;
    let k = opened["session_id"].as_str()?.to_owned();
    c.sessions.set_kernel_session(id, k.clone());
    Some(k)
}

async fn approvals_html(c: &Console, s: &Session) -> String {
    let v = viewer(c, s);
    match rpc(
        &c.kernel,
        &s.principal,
        "mhs.approvals.list",
        json!({"limit": APPROVALS_SHOWN}),
    )
    .await
    {
        Ok(list) => html::approvals_fragment(&list, &v),
        Err(e) => format!("<p>{}</p>", html::esc(&refusal_text(&e))),
    }
}

async fn devices_page(State(c): State<Console>, headers: HeaderMap) -> Response {
    let (id, s, fresh) = match viewer_session(&c, &headers) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let body = format!(
        "<section data-live=\"devices\">{}</section>",
        devices_html(&c, &id, &s).await
    );
    let r = page(
        StatusCode::OK,
        html::layout("Devices", &viewer(&c, &s), &body, None),
    );
    if fresh {
        with_cookie(r, &c.cookie(&id))
    } else {
        r
    }
}

async fn device_page(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(device): Path<String>,
) -> Response {
    let (id, s, fresh) = match viewer_session(&c, &headers) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let v = viewer(&c, &s);
    let (Ok(about), Ok(status)) = (
        c.kernel.device_get(&device),
        c.kernel.safety_status(Some(&device)),
    ) else {
        return page(
            StatusCode::NOT_FOUND,
            html::layout("Unknown device", &v, "<p>No such device.</p>", None),
        );
    };
    let body = html::device_page(&about, &status, &v);
    let r = page(
        StatusCode::OK,
        html::layout(&format!("Device {device}"), &v, &body, None),
    );
    if fresh {
        with_cookie(r, &c.cookie(&id))
    } else {
        r
    }
}

async fn approvals_page(State(c): State<Console>, headers: HeaderMap) -> Response {
    let (id, s, fresh) = match viewer_session(&c, &headers) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let body = format!(
        "<section data-live=\"approvals\">{}</section>",
        approvals_html(&c, &s).await
    );
    let r = page(
        StatusCode::OK,
        html::layout("Approvals", &viewer(&c, &s), &body, None),
    );
    if fresh {
        with_cookie(r, &c.cookie(&id))
    } else {
        r
    }
}

async fn login_page(State(c): State<Console>) -> Response {
    if !c.auth.required() {
        return redirect("/console/");
    }
    page(StatusCode::OK, html::login(None))
}

async fn login(State(c): State<Console>, body: Body) -> Response {
    let Some(f) = form::read(body, FORM_BYTES_MAX).await else {
        return page(
            StatusCode::BAD_REQUEST,
            html::login(Some("The form could not be read.")),
        );
    };
    let token = f.get("token").map(String::as_str);
    match c.auth.authenticate(token) {
        Ok(p) if c.auth.required() => {
            let id = c.sessions.open(p);
            with_cookie(redirect("/console/"), &c.cookie(&id))
        }
        Ok(_) => redirect("/console/"),
        Err(_) => page(
            StatusCode::UNAUTHORIZED,
            html::login(Some("That token is not valid here.")),
        ),
    }
}

/// A state-changing form: its session (from the cookie, else 401) and its
/// CSRF token (else 403); nothing is done before both are checked.
async fn checked_form(
    c: &Console,
    headers: &HeaderMap,
    body: Body,
) -> Result<(String, Session, form::Form), Box<Response>> {
    let refused = |status: StatusCode, text: &str| {
        Box::new(page(status, format!("<!doctype html><title>Refused</title><p>{}</p><p><a href=\"/console/\">Back to the console</a></p>", html::esc(text))))
    };
    let Some(id) = session::cookie_of(headers) else {
        return Err(refused(
            StatusCode::UNAUTHORIZED,
            "Not signed in: nothing was done.",
        ));
    };
    let Some(s) = c.sessions.get(&id) else {
        return Err(refused(
            StatusCode::UNAUTHORIZED,
            "The session has ended: sign in again. Nothing was done.",
        ));
    };
    let Some(f) = form::read(body, FORM_BYTES_MAX).await else {
        return Err(refused(
            StatusCode::BAD_REQUEST,
            "The form could not be read: nothing was done.",
        ));
    };
    let ok = f.get("csrf").is_some_and(|t| session::same(t, &s.csrf));
    if !ok {
        return Err(refused(
            StatusCode::FORBIDDEN,
            "The form's CSRF token does not match this session: nothing was done.",
        ));
    }
    Ok((id, s, f))
}

async fn logout(State(c): State<Console>, headers: HeaderMap, body: Body) -> Response {
    match checked_form(&c, &headers, body).await {
        Ok((id, _, _)) => {
            c.sessions.close(&id);
            with_cookie(redirect("/console/login"), &session::clear_cookie(c.secure))
        }
        Err(r) => *r,
    }
}

async fn estop(State(c): State<Console>, headers: HeaderMap, body: Body) -> Response {
    let (id, s, f) = match checked_form(&c, &headers, body).await {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let mut params = json!({"reason": f.get("reason").cloned().unwrap_or_else(|| "e-stop from the operator console".into())});
    if let Some(d) = f.get("device_id").filter(|d| !d.is_empty()) {
        params["device_id"] = json!(d);
    }
    let (notice, at) = match rpc(&c.kernel, &s.principal, "mhs.safety.estop", params).await {
        Ok(r) => (estop_notice(&r), r["completed_at_ms"].as_u64()),
        Err(e) => (refusal_text(&e), None),
    };
    // When the latch was durable, for whoever measures the path (the
    // browser test compares it with the click).
    let stamp = at
        .map(|ms| format!("<p hidden id=\"estop-at\" data-at-ms=\"{ms}\"></p>"))
        .unwrap_or_default();
    let body = format!(
        "{stamp}<section data-live=\"devices\">{}</section>",
        devices_html(&c, &id, &s).await
    );
    page(
        StatusCode::OK,
        html::layout("Devices", &viewer(&c, &s), &body, Some(&notice)),
    )
}

/// What the e-stop's receipt says, in words: which devices latched, whether
/// each reached its safe state, whether the latch is durable.
fn estop_notice(r: &Value) -> String {
    let one = [r.clone()];
    let devices = r["x-vendor.estop"]["devices"]
        .as_array()
        .map_or(&one[..], Vec::as_slice);
    let each: Vec<String> = devices
        .iter()
        .map(|d| {
            let safe = if d["safe_state_achieved"] == Value::Bool(true) {
                "safe state reached"
            } else {
                "safe state NOT confirmed"
            };
            format!(
                "{} {} ({safe})",
                d["device_id"].as_str().unwrap_or("?"),
                d["status"].as_str().unwrap_or("?")
            )
        })
        .collect();
    let durable = if r["latch_durable"] == Value::Bool(true) {
        "the latch is durable"
    } else {
        "the latch is NOT yet durable (held in memory, retried)"
    };
    format!("E-STOP: {}; {durable}.", each.join(", "))
}

async fn device_action(
    State(c): State<Console>,
    headers: HeaderMap,
    body: Body,
    method: &'static str,
) -> Response {
    let (id, s, f) = match checked_form(&c, &headers, body).await {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let device = f.get("device_id").cloned().unwrap_or_default();
    let reason = f.get("reason").cloned().unwrap_or_default();
    let notice = match rpc(
        &c.kernel,
        &s.principal,
        method,
        json!({"device_id": device, "reason": reason}),
    )
    .await
    {
        Ok(r) if r["status"] == "rejected" => refusal_text(
            &json!({"message": r["error"]["message"], "data": {"mhs_code": r["error"]["mhs_code"], "details": r["error"]["details"]}}),
        ),
        Ok(r) => format!("{method}: {}", r["status"].as_str().unwrap_or("done")),
        Err(e) => refusal_text(&e),
    };
    let v = viewer(&c, &s);
    let body = match (
        c.kernel.device_get(&device),
        c.kernel.safety_status(Some(&device)),
    ) {
        (Ok(about), Ok(status)) => html::device_page(&about, &status, &v),
        _ => format!(
            "<section data-live=\"devices\">{}</section>",
            devices_html(&c, &id, &s).await
        ),
    };
    page(
        StatusCode::OK,
        html::layout(&format!("Device {device}"), &v, &body, Some(&notice)),
    )
}

async fn decide(State(c): State<Console>, headers: HeaderMap, body: Body) -> Response {
    let (_, s, f) = match checked_form(&c, &headers, body).await {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let params = json!({
        "approval_id": f.get("approval_id").cloned().unwrap_or_default(),
        "decision": f.get("decision").cloned().unwrap_or_default(),
        "reason": f.get("reason").cloned().unwrap_or_default(),
    });
    let notice = match rpc(&c.kernel, &s.principal, "mhs.approvals.decide", params).await {
        Ok(r) => format!(
            "Vote recorded: approval {} is {} ({} of {} approvals).",
            r["approval_id"].as_str().unwrap_or("?"),
            r["status"].as_str().unwrap_or("?"),
            r["approvals"],
            r["quorum"]
        ),
        Err(e) => refusal_text(&e),
    };
    let body = format!(
        "<section data-live=\"approvals\">{}</section>",
        approvals_html(&c, &s).await
    );
    page(
        StatusCode::OK,
        html::layout("Approvals", &viewer(&c, &s), &body, Some(&notice)),
    )
}

/// A stream's slot: freed when the stream ends.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The receiving end of a live stream, as a body.
struct Live(tokio::sync::mpsc::Receiver<Bytes>);

impl futures_core::Stream for Live {
    type Item = Result<Bytes, std::convert::Infallible>;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|o| o.map(Ok))
    }
}

fn sse_event(name: &str, html: &str) -> Bytes {
    // One `data:` line per line of the fragment (fragments hold none).
    let mut out = format!("event: {name}\n");
    for line in html.lines() {
        out.push_str("data: ");
        out.push_str(line);
        out.push('\n');
    }
    out.push('\n');
    Bytes::from(out)
}

/// `GET /console/events[?live=devices,approvals,evidence]`: those fragments
/// (default: devices and approvals), rendered afresh every [`LIVE_EVERY`],
/// for as long as the page is open and its session lives; at most
/// [`STREAMS_MAX`] at once.
async fn events(State(c): State<Console>, headers: HeaderMap, uri: axum::http::Uri) -> Response {
    let wanted: Vec<&'static str> = ["devices", "approvals", "evidence"]
        .into_iter()
        .filter(|r| {
            uri.query()
                .is_none_or(|q| q.split([',', '=', '&']).any(|x| x == *r))
        })
        .collect();
    if wanted.is_empty() {
        return StatusCode::BAD_REQUEST.into_response();
    }
    let Some(id) = session::cookie_of(&headers).filter(|id| c.sessions.get(id).is_some()) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    if c.streams.fetch_add(1, Ordering::SeqCst) >= STREAMS_MAX {
        c.streams.fetch_sub(1, Ordering::SeqCst);
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let slot = Slot(c.streams.clone());
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(2);
    tokio::spawn(async move {
        let _slot = slot;
        let mut tick = tokio::time::interval(LIVE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Ends when the page goes (the send fails) or the session does.
        loop {
            tick.tick().await;
            let Some(s) = c.sessions.get(&id) else { return };
            for region in &wanted {
                let html = match *region {
                    "devices" => devices_html(&c, &id, &s).await,
                    "approvals" => approvals_html(&c, &s).await,
                    _ => evidence_tail_html(&c, &s),
                };
                if tx.send(sse_event(region, &html)).await.is_err() {
                    return;
                }
            }
        }
    });
    let mut r = Body::from_stream(Live(rx)).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// Who may read the evidence here: operators, or the single local caller
/// when no principals are configured.
fn may_read_evidence(c: &Console, s: &Session) -> bool {
    s.principal.operator || !c.auth.required()
}

fn evidence_tail_html(c: &Console, s: &Session) -> String {
    if !may_read_evidence(c, s) {
        return "<p>The evidence is shown to operators only.</p>".to_owned();
    }
    match c.kernel.evidence_tail(EVIDENCE_SHOWN) {
        Ok(entries) => html::evidence_fragment(&entries),
        Err(e) => format!("<p>{}</p>", html::esc(&e.message)),
    }
}

async fn evidence_page(State(c): State<Console>, headers: HeaderMap) -> Response {
    evidence_with(&c, &headers, false).await
}

async fn evidence_verify(State(c): State<Console>, headers: HeaderMap) -> Response {
    evidence_with(&c, &headers, true).await
}

async fn evidence_with(c: &Console, headers: &HeaderMap, verify: bool) -> Response {
    let (id, s, fresh) = match viewer_session(c, headers) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let v = viewer(c, &s);
    let verified = if verify && may_read_evidence(c, &s) {
        let k = c.kernel.clone();
        let r = tokio::task::spawn_blocking(move || k.evidence_verify()).await;
        Some(match r {
            Ok(Ok(report)) => report,
            Ok(Err(e)) => json!({"ok": null, "error": e.message}),
            Err(_) => json!({"ok": null, "error": "the verification ended abnormally"}),
        })
    } else {
        None
    };
    let body = html::evidence_page(&evidence_tail_html(c, &s), verified.as_ref());
    let r = page(StatusCode::OK, html::layout("Evidence", &v, &body, None));
    if fresh {
        with_cookie(r, &c.cookie(&id))
    } else {
        r
    }
}

/// `GET /console/evidence/export`: the whole chain as `tether audit export`
/// writes it, streamed (bounded chunks in flight) as a download.
async fn evidence_export(State(c): State<Console>, headers: HeaderMap) -> Response {
    let Some(s) = session::cookie_of(&headers).and_then(|id| c.sessions.get(&id)) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    if !may_read_evidence(&c, &s) {
        return StatusCode::FORBIDDEN.into_response();
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let kernel = c.kernel.clone();
    tokio::task::spawn_blocking(move || {
        let mut w = std::io::BufWriter::with_capacity(64 * 1024, ChannelWriter(tx));
        if let Err(e) = kernel.evidence_export(&mut w) {
            tracing::warn!(error = %e.message, "console export stopped");
        }
        let _ = std::io::Write::flush(&mut w);
    });
    let mut r = Body::from_stream(Live(rx)).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    h.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_static("attachment; filename=\"tether-evidence.jsonl\""),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// The export's writer: each buffered write is a chunk of the body; a
/// client that goes away ends the export.
struct ChannelWriter(tokio::sync::mpsc::Sender<Bytes>);

impl std::io::Write for ChannelWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0
            .blocking_send(Bytes::copy_from_slice(b))
            .map_err(|_| std::io::Error::other("the download was closed"))?;
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
