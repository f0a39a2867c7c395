//! The evaluation order (DESIGN §3) of every write and action, in one place.
//!
//! [`Kernel::command`] is the whole order as a sequence of calls, each a
//! stage that answers go-on or a refusal: the route (a write names the
//! resource's configure binding), the arrival (the `command_id`, the device,
//! a live session: step 2), the binding (step 3) and its grant, the
//! `command_id` claim (step 4), the checks (steps 5–11, `check/`), then
//! dispatch (step 12, `dispatch/`). Read it top to bottom to know what a
//! command passes.
//!
//! **Owns:** the order itself and [`Ctx`], what a command carries through it.
//! **Never belongs here:** the rule of any one step (each lives in its
//! stage module), wire framing (`tether-server`).
//! **Fail-closed rule:** a refusal before dispatch leaves no side effect —
//! the id claim is given back, budget reservations are released, no
//! revision moves, and the rejected receipt is evidence but never the
//! recorded outcome of its `command_id`.

use crate::admit::arrival::Arrival;
use crate::admit::resolve::{idempotency_key, resolve, Resolve};
use crate::check::Effects;
use crate::dispatch::answer::Answer;
use crate::dispatch::rider::Rider;
use crate::kernel::{Kernel, Principal};
use crate::stages::{stage, step, Stage, Stages};
use crate::trace::{Active, SpanKind};
use crate::{ApiError, CommandOptions, CommandRequest, Route};
use serde_json::{json, Value};
use std::borrow::Cow;
use std::time::Instant;
use tracing::Instrument;

use tether_core::{Code, Refusal};
use tether_store::canonical;

/// Everything the steps after binding resolution need to know.
pub(crate) struct Ctx {
    pub device: usize,
    /// The binding; `usize::MAX` before one is resolved (a refusal of step
    /// 3, or a stop's or reset's own receipt).
    pub binding: usize,
    pub command_id: String,
    /// Whether this endpoint minted `command_id` (new by construction).
    pub id_minted: bool,
    pub digest: String,
    /// Idempotency key: the binding and the input digest, so one id can
    /// never replay another binding's receipt.
    pub key: String,
    pub input: Value,
    pub principal: Principal,
    pub session_id: Option<String>,
    pub accepted_at_ms: u64,
    pub t0: Instant,
    pub deadline: Instant,
    pub expected_revision: Option<u64>,
    pub safe_place_grant: Option<String>,
    pub permit_id: Option<String>,
    /// Step 10's verdict (decision, determining policies, reason), once made.
    pub policy: std::sync::OnceLock<std::sync::Arc<Value>>,
    /// An approved approval that covers this command (reserved at registration).
    pub approval: std::sync::OnceLock<String>,
    /// An approval this command created, to be made durable before the hold is answered.
    pub new_approval: std::sync::OnceLock<String>,
    /// The surface's record for the command's first commit, until taken.
    pub rider: Option<Rider>,
}

impl Ctx {
    /// A context for `command_id` on device `device`, arrived at
    /// `(t0, accepted_at_ms)`, that knows nothing else yet: no binding, no
    /// input, due at once. Callers fill in what they know with
    /// struct-update syntax. The clock is read by the caller, once.
    pub(crate) fn bare(
        device: usize,
        command_id: String,
        principal: Principal,
        (t0, accepted_at_ms): (Instant, u64),
    ) -> Self {
        Self {
            device,
            binding: usize::MAX,
            command_id,
            id_minted: false,
            digest: String::new(),
            key: String::new(),
            input: Value::Null,
            principal,
            session_id: None,
            accepted_at_ms,
            t0,
            deadline: t0,
            expected_revision: None,
            safe_place_grant: None,
            permit_id: None,
            policy: std::sync::OnceLock::new(),
            approval: std::sync::OnceLock::new(),
            new_approval: std::sync::OnceLock::new(),
            rider: None,
        }
    }
}

/// The command's labels on its span and in its trace: the capability (only
/// one the device binds), the decision, the outcome and the refusal code —
/// never an input value or a token.
struct Labels<'a> {
    capability: Option<&'a str>,
    decision: Option<&'static str>,
    outcome: &'static str,
    code: Option<&'static str>,
}

impl<'a> Labels<'a> {
    fn of(answer: &Answer, counted: &crate::meters::Counted<'a>) -> Self {
        let decision = answer.string_member("decision").and_then(|d| {
            ["allow", "hold", "deny"]
                .into_iter()
                .find(|k| *k == d.as_ref())
        });
        Self {
            capability: counted.capability,
            decision,
            outcome: counted.outcome,
            code: counted.code.map(|c| c.as_str()),
        }
    }

    fn record_on(&self, span: &tracing::Span) {
        span.record("outcome", self.outcome);
        if let Some(c) = self.capability {
            span.record("capability", c);
        }
        if let Some(d) = self.decision {
            span.record("decision", d);
        }
        if let Some(code) = self.code {
            span.record("refusal_code", code);
        }
    }
}

/// The attributes of a command's trace span (docs/TELEMETRY.md).
fn attributes(
    device: Option<&str>,
    p: &Principal,
    labels: Option<Labels<'_>>,
    error: Option<&'static str>,
) -> Vec<(&'static str, Cow<'static, str>)> {
    let mut out = Vec::with_capacity(6);
    if let Some(d) = device {
        out.push(("device", Cow::Owned(d.to_owned())));
    }
    if let Some(l) = labels {
        if let Some(c) = l.capability {
            out.push(("capability", Cow::Owned(c.to_owned())));
        }
        if let Some(d) = l.decision {
            out.push(("decision", Cow::Borrowed(d)));
        }
        out.push(("outcome", Cow::Borrowed(l.outcome)));
        if let Some(code) = l.code {
            out.push(("refusal_code", Cow::Borrowed(code)));
        }
    }
    if let Some(code) = error {
        out.push(("refusal_code", Cow::Borrowed(code)));
    }
    out.push(("principal_kind", Cow::Borrowed(p.kind.as_str())));
    out
}

impl Kernel {
    /// `mhs.command` and `mhs.resource.write`: the whole evaluation order,
    /// one stage per line. Answers a receipt, also when refused; with its
    /// canonical text when it has one (see [`Answer`]), so a dispatched
    /// command's receipt is written once and never built as a value.
    /// `options` carry the caller's cancel token, admission signal and rider
    /// (see [`CommandOptions`]).
    ///
    /// # Errors
    /// Protocol-level refusals only (session, device, params, a write to a
    /// resource that cannot be written); every refusal inside the order is
    /// a rejected receipt.
    pub async fn command(
        &self,
        p: &Principal,
        req: CommandRequest,
        options: CommandOptions,
    ) -> Result<Answer, ApiError> {
        // Known devices only: a caller's string is never a label.
        let device = self.device_index(&req.device_id);
        let device_id = device.map(|d| self.inner.devices[d].id());
        let span = tracing::info_span!(
            "tether.command",
            device = device_id,
            capability = tracing::field::Empty,
            decision = tracing::field::Empty,
            outcome = tracing::field::Empty,
            refusal_code = tracing::field::Empty,
            principal_kind = p.kind.as_str(),
            { crate::stages::FIELD } = tracing::field::Empty,
        );
        let traced = Active::start(self.tracer(), "tether.command", SpanKind::Internal);
        // A traced command's stages are timed into a table, not built as
        // spans of their own (crate::stages); an untraced one has none.
        let logged = !span.is_disabled();
        let stages = (traced.is_some() || logged)
            .then(|| Stages::new(traced.as_ref().map_or_else(Instant::now, Active::started)));
        // On the heap: the order's future is some 20 KB, and every wrapper
        // below, every `spawn` and every `block_on` of a caller would copy
        // it whole (PERFORMANCE.md, "The command's future").
        let order = Box::pin(self.command_order(p, req, options));
        let answer = match &stages {
            Some(s) => s.clone().scope(order).instrument(span.clone()).await,
            None => order.instrument(span.clone()).await,
        };
        if let (Some(s), true) = (&stages, logged) {
            span.record(crate::stages::FIELD, s.encode().as_str());
        }
        let meters = &self.inner.meters;
        let (labels, error) = match &answer {
            Ok(a) => {
                let counted = meters.command(device, a);
                let labels = (logged || traced.is_some()).then(|| Labels::of(a, &counted));
                (labels, None)
            }
            Err(e) => {
                meters.refusal(e.code);
                span.record("refusal_code", e.code.as_str());
                (None, Some(e.code.as_str()))
            }
        };
        if let (Some(l), true) = (&labels, logged) {
            l.record_on(&span);
        }
        if let Some(t) = traced {
            let marks = stages.map(|s| s.seal()).unwrap_or_default();
            t.finish(attributes(device_id, p, labels, error), marks);
        }
        answer
    }

    /// [`Kernel::command`]'s order, one stage per line; each stage that
    /// runs is timed as a child of the command in its trace (named by the
    /// stage), so a trace shows how far a command went.
    async fn command_order(
        &self,
        p: &Principal,
        mut req: CommandRequest,
        options: CommandOptions,
    ) -> Result<Answer, ApiError> {
        let CommandOptions {
            cancel,
            on_admit,
            rider,
        } = options;
        if req.route == Route::Write {
            self.write_route(&mut req)?; // a write names the configure binding
        }
        let arrival = step(Stage::Arrive, || self.arrive(p, &req))?; // the id, the device, step 2a, the deadline
        let binding = match step(Stage::Resolve, || self.resolve_step(&req, arrival.device))? {
            Ok(binding) => binding, // step 3
            Err(refusal) => {
                return Ok(self
                    .reject_unresolved(p, &req, &arrival, rider, refusal)
                    .await)
            }
        };
        let session_id = step(Stage::Grant, || {
            self.grant_step(p, &req, arrival.device, binding)
        })?; // step 2b
        if self.is_estop_binding(arrival.device, binding) {
            return Ok(self.estop_binding(p, &req, &arrival).await); // stops skip the rest
        }
        let ctx = self.context(p, req, arrival, (binding, session_id), rider);
        let claim = stage(Stage::Claim, self.claim_step(&ctx)).await;
        if let Err(answer) = claim {
            return Ok(answer); // step 4: a replay, or a reused id refused
        }
        let t_checks = Instant::now();
        let checked = step(Stage::Checks, || self.checks(&ctx, Effects::Real)); // steps 5 to 11
        self.inner.meters.decision.observe(t_checks.elapsed());
        match checked {
            Ok(admitted) => {
                if let Some(tx) = on_admit {
                    // The receiver may have stopped waiting; dispatch goes on.
                    let _ = tx.send(());
                }
                // Step 12.
                // Boxed: the dispatch future is most of the order's size.
                let dispatch = Box::pin(self.dispatch(ctx, admitted, cancel));
                stage(Stage::Dispatch, dispatch).await
            }
            Err(refusal) => Ok(self.refuse_checked(&ctx, refusal).await),
        }
    }

    /// The command's context once its binding is granted: the idempotency
    /// key, and the `command_id` — a request without its own id that
    /// repeats a held one (same principal, binding and input) takes that
    /// hold's id, so it resumes the approval instead of making another.
    fn context(
        &self,
        p: &Principal,
        req: CommandRequest,
        arrival: Arrival,
        (binding, session_id): (usize, String),
        rider: Option<Rider>,
    ) -> Ctx {
        let dev = &self.inner.devices[arrival.device];
        let (b, _) = dev.binding(binding);
        let key = idempotency_key(
            &p.id,
            dev.id(),
            &b.capability_id,
            &b.resource,
            &arrival.digest,
        );
        let held = arrival
            .id_minted
            .then(|| self.open_approval_command_id(&p.id, &key))
            .flatten();
        let (command_id, id_minted) = match held {
            Some(held) => (held, false),
            None => (arrival.command_id, arrival.id_minted),
        };
        Ctx {
            binding,
            id_minted,
            key,
            digest: arrival.digest,
            input: req.input,
            session_id: Some(session_id),
            deadline: arrival.deadline,
            expected_revision: req.expected_revision,
            safe_place_grant: req.safe_place_grant,
            permit_id: req.permit_id,
            rider,
            ..Ctx::bare(
                arrival.device,
                command_id,
                p.clone(),
                (arrival.t0, arrival.accepted_at_ms),
            )
        }
    }

    /// The `command_id` of an open hold (pending, or approved and unused)
    /// that `p` holds for exactly this request — binding and input — or
    /// `None`. A surface that mints the id of a request that brought none
    /// (MCP, REST) asks this first: a repeated call then resumes the hold
    /// people decided instead of making another one each time. The whole
    /// evaluation order still runs for the resumed command.
    pub fn held_command_id(&self, p: &Principal, req: &CommandRequest) -> Option<String> {
        if !self.approvals_open() {
            return None;
        }
        let d = self.device_index(&req.device_id)?;
        let dev = &self.inner.devices[d];
        let Resolve::Found(bi) = resolve(dev, &req.capability_id, req.resource.as_deref()) else {
            return None;
        };
        let (b, _) = dev.binding(bi);
        let digest = canonical::digest(&req.input);
        let key = idempotency_key(&p.id, dev.id(), &b.capability_id, &b.resource, &digest);
        self.open_approval_command_id(&p.id, &key)
    }

    /// The checks of `command` that answer a protocol error rather than a
    /// receipt — the device, a binding that needs its resource named, the
    /// caller's live session and grant — with no side effect: what a surface
    /// checks before it records anything for the command.
    ///
    /// # Errors
    /// `DEVICE.UNKNOWN`, invalid params, session and grant errors.
    pub fn reachable(&self, p: &Principal, req: &CommandRequest) -> Result<(), ApiError> {
        let d = self
            .device_index(&req.device_id)
            .ok_or_else(|| self.unknown_device(&req.device_id))?;
        let dev = &self.inner.devices[d];
        match resolve(dev, &req.capability_id, req.resource.as_deref()) {
            Resolve::Found(bi) => self.check_grant(
                p,
                req.session_id.as_deref(),
                |s| s.grants.contains(&(d, bi)),
                || json!({}),
            )?,
            Resolve::ResourceRequired(r) => {
                return Err(ApiError::new(
                    Code::ProtocolInvalidParams,
                    "resource required",
                    json!({"reason": "resource_required", "resources": r}),
                ))
            }
            // The command itself records this refusal (a rejected receipt).
            Resolve::Unknown | Resolve::NotBound(_) => {
                self.check_grant(p, req.session_id.as_deref(), |_| true, || json!({}))?
            }
        };
        Ok(())
    }

    /// A dry run of steps 2 to 11 for one command: the same checks
    /// `command` makes before the device lock, with no side effect at all (no
    /// idempotency claim, no evidence, budget reservations released at once,
    /// no dispatch). Used by benchmarks and by clients that want to know
    /// whether a command would be admitted right now.
    ///
    /// # Errors
    /// The protocol-level refusals of `command`; a refusal inside the order is
    /// `Ok(Some(refusal))`.
    pub fn preflight(
        &self,
        p: &Principal,
        req: &CommandRequest,
    ) -> Result<Option<Refusal>, ApiError> {
        let d = self
            .device_index(&req.device_id)
            .ok_or_else(|| self.unknown_device(&req.device_id))?;
        let dev = &self.inner.devices[d];
        let bi = match resolve(dev, &req.capability_id, req.resource.as_deref()) {
            Resolve::Found(bi) => bi,
            Resolve::Unknown => {
                return Ok(Some(Refusal::bare(
                    Code::CapabilityUnknown,
                    "capability not bound",
                )))
            }
            Resolve::NotBound(r) => {
                return Ok(Some(Refusal::new(
                    Code::CapabilityNotBound,
                    "capability not bound to that resource",
                    json!({"bound_resources": r}),
                )))
            }
            Resolve::ResourceRequired(r) => {
                return Err(ApiError::new(
                    Code::ProtocolInvalidParams,
                    "resource required",
                    json!({"reason": "resource_required", "resources": r}),
                ))
            }
        };
        let sid = self.check_grant(
            p,
            req.session_id.as_deref(),
            |s| s.grants.contains(&(d, bi)),
            || json!({}),
        )?;
        let ctx = Ctx {
            binding: bi,
            input: req.input.clone(),
            session_id: Some(sid),
            expected_revision: req.expected_revision,
            safe_place_grant: req.safe_place_grant.clone(),
            permit_id: req.permit_id.clone(),
            ..Ctx::bare(d, "preflight".into(), p.clone(), (Instant::now(), 0))
        };
        match self.checks(&ctx, Effects::DryRun) {
            Ok(admitted) => {
                self.release_budgets(&admitted.reservations);
                Ok(None)
            }
            Err(r) => Ok(Some(r)),
        }
    }
}
