//! MCP surface on the official Rust SDK (`rmcp`), over stdio ([`stdio`]) and
//! streamable HTTP ([`http`]).
//!
//! The projection is deliberately thin: one tool per binding from
//! [`crate::tools::catalogue`], device reference files as resources, and
//! every call handed to the kernel (`Kernel::read|command|estop`; a write is a
//! command on `Route::Write`). A
//! refusal is a tool result with `isError: true` whose text names the code so a
//! model can correct itself; protocol defects stay errors of the protocol.
//! Reset, permit, safe-place grant and approval routes are never tools.
//!
//! Each MCP connection (a stdio process, a streamable-HTTP session, or one
//! stateless 2026-07-28 request) owns the kernel sessions it opened, one per
//! principal. They are opened on first use, renewed while calls run, reopened
//! when they expired, and closed when the connection ends, which cancels any
//! operation still running.

mod edge;
pub mod http;
mod render;
mod screen;
mod sessions;
pub mod stdio;

use crate::tools::{self, ToolKind};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ProgressToken, ReadResourceRequestParams, ReadResourceResponse,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tether_core::Code;
use tether_kernel::{
    Answer, ApiError, CommandOptions, CommandRequest, EstopRequest, Kernel, Principal, ReadRequest,
    Route, SessionOpen,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How often a running call renews its kernel session and reports progress.
const PROGRESS_INTERVAL_MS: u64 = 250;
/// How often a cancelled call looks for its operation to deliver the cancel.
const CANCEL_POLL_MS: u64 = 10;
/// Longest a cancel is chased before the operation is left to its deadline.
/// The kernel's own deadline (300 s by default) ends the call anyway.
const CANCEL_CHASE_MS_MAX: u64 = 300_000;
// A chase shorter than one poll would look for the operation only once.
const _: () = assert!(CANCEL_POLL_MS < CANCEL_CHASE_MS_MAX);
/// How long a connection that ended waits for its calls to record their
/// receipts (they were cancelled; the kernel leaves a call that ignores
/// cancellation behind after 1 s of grace).
pub const INFLIGHT_DRAIN_MS_MAX: u64 = 5_000;
/// Kernel sessions one MCP connection may hold (one per principal).
const SESSIONS_PER_CONNECTION_MAX: usize = 64;
// A reason the estop tool's schema accepts is kept whole: the kernel's text
// bound (`limits.text_chars_max`), to which an e-stop reason is cut, is
// never smaller.
const _: () =
    assert!(tether_kernel::bounds::TEXT_CHARS_MIN >= crate::tools::ESTOP_REASON_CHARS_MAX);

/// Told to every client at start: what Tether is, and what it is not.
const INSTRUCTIONS: &str = "Tether governs these devices: every tool call is checked against declared \
limits (with units), interlocks, mode and e-stop latches, and recorded before anything moves. A refused \
call returns isError with an MHS.* code, the path, the bound and the value: correct the input, never retry \
blindly. A call held for approval names an approval id: a person must decide; you cannot. The `estop` tool \
is always available. Tether is a software envelope, not a safety-rated channel: it never replaces a \
hardware e-stop.";

/// Set by the HTTP surface on a request whose client went away; a call
/// watching it cancels its operation.
#[derive(Clone, Debug)]
pub struct Disconnect(pub CancellationToken);

/// The tools an endpoint offers: built once from the kernel's cell (which
/// does not change while it runs) and shared by every connection.
pub type Catalogue = Arc<[tools::Tool]>;

/// Builds the shared tool catalogue of `kernel`.
pub fn catalogue(kernel: &Kernel) -> Catalogue {
    tools::catalogue(kernel).into()
}

/// The MCP server handler: a kernel and the connection it serves.
#[derive(Clone)]
pub struct TetherMcp {
    kernel: Kernel,
    catalogue: Catalogue,
    conn: Arc<Connection>,
}

/// What one MCP connection owns.
struct Connection {
    kernel: Kernel,
    /// The caller over stdio, established once at start-up. Over HTTP the
    /// principal comes with each request (set by the bearer-token check).
    principal: Option<Principal>,
    /// Kernel session per principal (`kind:id` → principal, session id).
    sessions: tokio::sync::Mutex<HashMap<String, (Principal, String)>>,
    /// Cancelled when the client's stream ends (stdio EOF).
    closed: CancellationToken,
    /// Kernel calls still running, so an ending connection can wait for
    /// their receipts before the process exits.
    inflight: TaskTracker,
    runtime: tokio::runtime::Handle,
}

impl Drop for Connection {
    fn drop(&mut self) {
        // A connection that ends with sessions still open closes them, which
        // cancels their running operations (the kernel records how they ended).
        let sessions = std::mem::take(self.sessions.get_mut());
        if sessions.is_empty() {
            return;
        }
        let kernel = self.kernel.clone();
        self.runtime.spawn(async move {
            close_all(&kernel, sessions).await;
        });
    }
}

async fn close_all(kernel: &Kernel, sessions: HashMap<String, (Principal, String)>) {
    for (_, (p, sid)) in sessions {
        // Already expired or closed is fine: nothing is left to cancel.
        let _ = kernel.session_close(&p, &sid).await;
    }
}

impl TetherMcp {
    fn new(
        kernel: Kernel,
        catalogue: Catalogue,
        principal: Option<Principal>,
        closed: CancellationToken,
    ) -> Self {
        let conn = Connection {
            kernel: kernel.clone(),
            principal,
            sessions: tokio::sync::Mutex::new(HashMap::new()),
            closed,
            inflight: TaskTracker::new(),
            runtime: tokio::runtime::Handle::current(),
        };
        Self {
            kernel,
            catalogue,
            conn: Arc::new(conn),
        }
    }

    /// A handler for one stdio process: `principal` was established from the
    /// launching environment; `closed` is cancelled when stdin ends.
    ///
    /// Must be called inside a Tokio runtime.
    pub fn for_stdio(kernel: Kernel, principal: Principal, closed: CancellationToken) -> Self {
        let catalogue = catalogue(&kernel);
        Self::new(kernel, catalogue, Some(principal), closed)
    }

    /// A handler for one streamable-HTTP session (or one stateless request):
    /// the principal comes with each request.
    ///
    /// Must be called inside a Tokio runtime.
    pub fn for_http(kernel: Kernel, catalogue: Catalogue) -> Self {
        Self::new(kernel, catalogue, None, CancellationToken::new())
    }

    /// Closes every kernel session this connection opened (idempotent),
    /// which cancels their running operations.
    pub async fn close_sessions(&self) {
        let sessions = std::mem::take(&mut *self.conn.sessions.lock().await);
        close_all(&self.kernel, sessions).await;
    }

    /// Waits (at most [`INFLIGHT_DRAIN_MS_MAX`]) for the kernel calls still
    /// running to finish, so their receipts are recorded before the process
    /// exits. Answers whether they all finished.
    pub async fn drain(&self) -> bool {
        self.conn.inflight.close();
        tokio::time::timeout(
            Duration::from_millis(INFLIGHT_DRAIN_MS_MAX),
            self.conn.inflight.wait(),
        )
        .await
        .is_ok()
    }

    fn find(&self, name: &str) -> Option<&tools::Tool> {
        self.catalogue.iter().find(|t| t.name == name)
    }

    /// The caller: fixed over stdio, from the request over HTTP. A request
    /// that carries no principal is refused (fail closed).
    ///
    /// Every MCP caller is model-controlled: the principal is an agent and
    /// never an operator here, whatever its token names (see
    /// [`Principal::model_controlled`]).
    /// `tools/call` inside its request span.
    async fn call_tool_traced(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let Some(tool) = self.find(&request.name).cloned() else {
            return Err(McpError::invalid_params(
                format!(
                    "no tool `{}`; list the tools first",
                    tether_core::echo::id(&request.name)
                ),
                None,
            ));
        };
        let args = Value::Object(request.arguments.unwrap_or_default());
        // The e-stop is served before anything that could fail: no session,
        // and no principal needed beyond what the transport already checked.
        if tool.kind == ToolKind::Estop {
            return Ok(self
                .call_estop(&args, self.principal(&ctx).ok())
                .await
                .into());
        }
        let p = self.principal(&ctx)?;
        let result = match tool.kind {
            ToolKind::Read => self.call_read(&tool, &args, &p).await,
            _ => self.call_effect(&tool, args, &p, &ctx).await,
        };
        if let Some(approval_id) = held_approval(&result) {
            self.send_to_console(&ctx, &approval_id);
        }
        Ok(result.into())
    }

    fn principal(&self, ctx: &RequestContext<RoleServer>) -> Result<Principal, McpError> {
        if let Some(p) = &self.conn.principal {
            return Ok(p.clone().model_controlled());
        }
        ctx.extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Principal>())
            .cloned()
            .map(Principal::model_controlled)
            .ok_or_else(|| McpError::invalid_request("no authenticated principal", None))
    }

    /// The caller's kernel session: reused while live, reopened once expired.
    async fn kernel_session(&self, p: &Principal) -> Result<String, ApiError> {
        let key = format!("{}:{}", p.kind.as_str(), p.id);
        let mut sessions = self.conn.sessions.lock().await;
        if let Some((_, sid)) = sessions.get(&key) {
            if self.kernel.session_heartbeat(p, sid).is_ok() {
                return Ok(sid.clone());
            }
        }
        if sessions.len() >= SESSIONS_PER_CONNECTION_MAX && !sessions.contains_key(&key) {
            return Err(ApiError::new(
                Code::ProtocolInternal,
                "too many principals on one MCP connection",
                json!({"limit": SESSIONS_PER_CONNECTION_MAX}),
            ));
        }
        // Every binding is granted: each one is a listed tool, and the kernel
        // still checks each call (grants never widen after open).
        let opened = self.kernel.session_open(p, SessionOpen::default()).await?;
        let sid = opened["session_id"]
            .as_str()
            .ok_or_else(|| {
                ApiError::new(
                    Code::ProtocolInternal,
                    "the kernel opened a session without an id",
                    json!({}),
                )
            })?
            .to_owned();
        sessions.insert(key, (p.clone(), sid.clone()));
        Ok(sid)
    }

    async fn call_estop(&self, args: &Value, p: Option<Principal>) -> CallToolResult {
        let (receipt, unknown) = estop_receipt(&self.kernel, args.as_object(), p, None).await;
        render::estop(&receipt, unknown.as_deref())
    }

    async fn call_read(&self, tool: &tools::Tool, args: &Value, p: &Principal) -> CallToolResult {
        if args.as_object().is_some_and(|m| !m.is_empty()) {
            return render::api_error(&ApiError::new(
                Code::CapabilityInputInvalid,
                "this read takes no arguments",
                json!({"reason": "unexpected_arguments"}),
            ));
        }
        let sid = match self.kernel_session(p).await {
            Ok(s) => s,
            Err(e) => return render::api_error(&e),
        };
        let req = ReadRequest {
            session_id: Some(sid),
            device_id: tool.device_id.clone().unwrap_or_default(),
            resource: tool.resource.clone(),
        };
        match self.kernel.read(p, req).await {
            Ok(v) => render::read(&v),
            Err(e) => render::api_error(&e),
        }
    }

    async fn call_effect(
        &self,
        tool: &tools::Tool,
        args: Value,
        p: &Principal,
        ctx: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        let sid = match self.kernel_session(p).await {
            Ok(s) => s,
            Err(e) => return render::api_error(&e),
        };
        let write = tool.kind == ToolKind::Write;
        let mut req = CommandRequest {
            route: if write { Route::Write } else { Route::Command },
            session_id: Some(sid.clone()),
            device_id: tool.device_id.clone().unwrap_or_default(),
            capability_id: tool.capability_id.clone(),
            resource: Some(tool.resource.clone()),
            input: args,
            command_id: None,
            deadline: None,
            expected_revision: None,
            safe_place_grant: None,
            permit_id: None,
        };
        // A tool call carries no command id; the id is chosen here (to find
        // the call's operation for a cancel). A call that repeats an open
        // hold of this principal takes that hold's id, so it resumes it.
        let command_id = self
            .kernel
            .held_command_id(p, &req)
            .unwrap_or_else(|| tether_core::ids::CommandId::mint().to_string());
        req.command_id = Some(command_id.clone());
        // The kernel call runs in its own task: if this handler is abandoned
        // the command still finishes and records its receipt.
        let kernel = self.kernel.clone();
        let caller = p.clone();
        // The command's spans stay children of the call's.
        let run = async move {
            kernel
                .command(&caller, req, CommandOptions::plain())
                .await
                .map(Answer::into_value)
        };
        let task = self.conn.inflight.spawn(tether_kernel::trace::carry(
            tracing::Instrument::in_current_span(run),
        ));
        let call = RunningCall {
            principal: p,
            session_id: &sid,
            command_id: &command_id,
            tool_name: &tool.name,
        };
        match self.supervise(&call, ctx, task).await {
            Ok(Ok(receipt)) => render::receipt(&receipt),
            Ok(Err(e)) => render::api_error(&e),
            Err(why) => render::api_error(&ApiError::new(
                Code::ProtocolInternal,
                why,
                json!({"command_id": command_id}),
            )),
        }
    }

    /// Waits for the kernel call, renewing the session and reporting progress;
    /// if the client cancels or goes away, delivers the cancel to the
    /// operation and answers without waiting for it.
    async fn supervise(
        &self,
        call: &RunningCall<'_>,
        ctx: &RequestContext<RoleServer>,
        mut task: JoinHandle<Result<Value, ApiError>>,
    ) -> Result<Result<Value, ApiError>, &'static str> {
        let progress = ctx.meta.get_progress_token();
        let disconnect = disconnect_token(ctx);
        let started = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(PROGRESS_INTERVAL_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        // Bounded: the kernel ends every call by its deadline.
        loop {
            tokio::select! {
                joined = &mut task => return joined.map_err(|_| "the kernel call ended abnormally"),
                () = ctx.ct.cancelled() => break,
                () = self.conn.closed.cancelled() => break,
                () = disconnect.cancelled() => break,
                _ = tick.tick() => {
                    // A long motion must not outlive its session.
                    let _ = self.kernel.session_heartbeat(call.principal, call.session_id);
                    if let Some(token) = &progress {
                        self.report_progress(ctx, token, call, started).await;
                    }
                }
            }
        }
        let kernel = self.kernel.clone();
        let (sid, cid) = (call.session_id.to_owned(), call.command_id.to_owned());
        let who = call.principal.clone();
        self.conn
            .inflight
            .spawn(async move { deliver_cancel(&kernel, &who, &sid, &cid, &task).await });
        Err("the call was cancelled by the client")
    }

    async fn report_progress(
        &self,
        ctx: &RequestContext<RoleServer>,
        token: &ProgressToken,
        call: &RunningCall<'_>,
        started: Instant,
    ) {
        let elapsed_s = started.elapsed().as_secs_f64();
        let op = self
            .kernel
            .operation_for_command(call.session_id, call.command_id)
            .unwrap_or_else(|| "admission".to_owned());
        let message = format!(
            "{} running for {elapsed_s:.1} s (operation {op})",
            call.tool_name
        );
        let param = ProgressNotificationParam::new(token.clone(), elapsed_s).with_message(message);
        // A client that stopped listening for progress is no reason to stop.
        let _ = ctx.peer.notify_progress(param).await;
    }
}

/// The console's public URL (`console_url` in the endpoint config), for
/// held calls: one endpoint process serves one config, so it is set once at
/// start-up ([`set_console_url`]).
static CONSOLE_URL: std::sync::OnceLock<url::Url> = std::sync::OnceLock::new();

/// How long an MCP host may keep the approval page open before the
/// elicitation is dropped (the hold itself lasts its approval's TTL).
const ELICITATION_WAIT: Duration = Duration::from_secs(600);

/// Sets the console URL held calls point MCP hosts to; the first call wins.
///
/// # Errors
/// Not an absolute `http` or `https` URL.
pub fn set_console_url(text: &str) -> Result<(), String> {
    let u = url::Url::parse(text).map_err(|e| format!("console_url `{text}`: {e}"))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(format!("console_url `{text}` is not an http(s) URL"));
    }
    let _ = CONSOLE_URL.set(u);
    Ok(())
}

/// The approval a refused tool call is held for, if it is.
fn held_approval(result: &CallToolResult) -> Option<String> {
    let s = result.structured_content.as_ref()?;
    let err = if s["error"].is_object() {
        &s["error"]
    } else {
        s
    };
    let code = err["mhs_code"].as_str()?;
    (code == Code::PolicyHeld.as_str() || code == Code::SafetyApprovalRequired.as_str())
        .then(|| err["details"]["approval_id"].as_str().map(str::to_owned))
        .flatten()
}

impl TetherMcp {
    /// Sends an MCP host that supports URL elicitation the console's page
    /// for a held call's approval, so the person at the host can open it.
    /// In the background and bounded: the tool result (the hold, which
    /// names the approval) is answered at once either way; a host that does
    /// not support it, or a protocol that forbids server requests, just gets
    /// the result.
    fn send_to_console(&self, ctx: &RequestContext<RoleServer>, approval_id: &str) {
        let Some(base) = CONSOLE_URL.get() else {
            return;
        };
        let Ok(page) = base.join(&format!("approvals#{approval_id}")) else {
            return;
        };
        let peer = ctx.peer.clone();
        let id = approval_id.to_owned();
        // Not tracked with the kernel calls: a host that keeps the page
        // open must not hold up a clean exit.
        self.conn.runtime.spawn(async move {
            let message = format!(
                "A person must approve or deny this request before it runs (approval {id}). Open the Tether console to see it; an operator decides there."
            );
            let asked = peer.elicit_url_with_timeout(message, page, id, Some(ELICITATION_WAIT));
            if let Err(e) = asked.await {
                tracing::debug!(error = %e, "the MCP host was not sent the approval page");
            }
        });
    }
}

/// The e-stop behind the `estop` tool and behind a defective request for it
/// (`defect` says what was wrong; it is recorded in the latch reason). A
/// device named in `args` that the endpoint serves is stopped alone; any
/// other request stops every device: when a model asks to stop, stopping too
/// much is the safe mistake. Answers the receipt and the named device when
/// it is not served.
async fn estop_receipt(
    kernel: &Kernel,
    args: Option<&serde_json::Map<String, Value>>,
    p: Option<Principal>,
    defect: Option<&str>,
) -> (Value, Option<String>) {
    let known = kernel.device_ids();
    let named = args
        .and_then(|a| a.get("device_id"))
        .and_then(Value::as_str);
    let device_ids = named
        .filter(|d| known.iter().any(|k| k == d))
        .map(|d| vec![d.to_owned()])
        .unwrap_or_default();
    let reason: String = args
        .and_then(|a| a.get("reason"))
        .and_then(Value::as_str)
        .unwrap_or("estop tool (MCP)")
        .chars()
        .take(kernel.text_chars_max())
        .collect();
    if let Some(d) = named.filter(|d| defect.is_none() && kernel.fleet_owner_of(d).is_some()) {
        // Served by another endpoint of the fleet: tripped through the store.
        let receipt = kernel
            .estop_fleet(&[d.to_owned()], &reason, p.as_ref())
            .await;
        return (receipt, None);
    }
    let unknown = named
        .filter(|_| device_ids.is_empty())
        .map(|d| tether_core::echo::id(d).into_owned());
    let unknown_defect = unknown
        .as_deref()
        .map(|d| format!("unknown device `{d}`: every device was stopped"));
    let envelope_defect = match (defect, unknown_defect) {
        (Some(d), Some(u)) => Some(format!("{d}; {u}")),
        (Some(d), None) => Some(d.to_owned()),
        (None, u) => u,
    };
    let receipt = kernel
        .estop(EstopRequest {
            device_ids,
            reason,
            envelope_defect,
            requested_by: p,
            session_id: None,
            deadline: None,
        })
        .await;
    (receipt, unknown)
}

/// The call being supervised, for progress and cancellation.
struct RunningCall<'a> {
    principal: &'a Principal,
    session_id: &'a str,
    command_id: &'a str,
    tool_name: &'a str,
}

fn disconnect_token(ctx: &RequestContext<RoleServer>) -> CancellationToken {
    ctx.extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Disconnect>())
        .map(|d| d.0.clone())
        // Stdio has no per-request stream: a token nobody cancels.
        .unwrap_or_default()
}

/// Delivers a cancel to the operation of `command_id` as soon as it exists.
/// The cancel can arrive while the command is still being admitted (before
/// the kernel registered an operation), so this looks again until the call
/// ends or the bound passes.
async fn deliver_cancel(
    kernel: &Kernel,
    principal: &Principal,
    session_id: &str,
    command_id: &str,
    task: &JoinHandle<Result<Value, ApiError>>,
) {
    let until = Instant::now() + Duration::from_millis(CANCEL_CHASE_MS_MAX);
    while !task.is_finished() && Instant::now() < until {
        if let Some(op) = kernel.operation_for_command(session_id, command_id) {
            let _ = kernel.operation_cancel(principal, &op);
            return;
        }
        tokio::time::sleep(Duration::from_millis(CANCEL_POLL_MS)).await;
    }
}

impl ServerHandler for TetherMcp {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_resources()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(
                Implementation::new("tether", env!("CARGO_PKG_VERSION")).with_title("Tether"),
            )
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let listed: Vec<Tool> = self.catalogue.iter().map(render::tool).collect();
        Ok(ListToolsResult::with_all_items(listed))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.find(name).map(render::tool)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let parent = traceparent(&ctx);
        let tracer = self.kernel.tracer().cloned();
        let call = self.call_tool_traced(request, ctx);
        crate::telemetry::request(tracer.as_ref(), "mcp", "tools/call", parent, call).await
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        Ok(ListResourcesResult::with_all_items(render::resources(
            &self.kernel.device_ids(),
        )))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        Ok(ListResourceTemplatesResult::with_all_items(
            render::resource_templates(),
        ))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        render::read_reference(&self.kernel, &request.uri).map(Into::into)
    }
}

/// The caller's W3C `traceparent`: MCP's `_meta.traceparent` first, then the
/// HTTP request's header (streamable HTTP).
fn traceparent(ctx: &RequestContext<RoleServer>) -> Option<crate::telemetry::Remote> {
    if let Some(tp) = ctx.meta.get_traceparent() {
        return crate::telemetry::remote_context(tp);
    }
    let parts = ctx.extensions.get::<axum::http::request::Parts>()?;
    crate::telemetry::traceparent_header(&parts.headers)
}
