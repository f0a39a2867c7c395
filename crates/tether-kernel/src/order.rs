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

use crate::admit::resolve::{idempotency_key, resolve, Resolve};
use crate::dispatch::answer::Answer;
use crate::dispatch::rider::Rider;
use crate::kernel::{Kernel, Principal};
use crate::{ApiError, CommandOptions, CommandRequest, Route, DEADLINE_MS_MAX};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tether_core::catalogue::{self};
use tether_core::ids::CommandId;
use tether_core::receipt::now_ms;
use tether_core::{Code, Refusal};
use tether_store::canonical;

/// Everything the steps after binding resolution need to know.
pub(crate) struct Ctx {
    pub device: usize,
    pub binding: usize,
    pub command_id: String,
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

impl Kernel {
    /// `mhs.command` and `mhs.resource.write`: the whole evaluation order.
    /// Answers a receipt, also when refused; with its canonical text when it
    /// has one (see [`Answer`]), so a dispatched command's receipt is written
    /// once and never built as a value. `options` carry the caller's cancel
    /// token, admission signal and rider (see [`CommandOptions`]).
    ///
    /// # Errors
    /// Protocol-level refusals only (session, device, params, a write to a
    /// resource that cannot be written); every refusal inside the order is
    /// a rejected receipt.
    pub async fn command(
        &self,
        p: &Principal,
        mut req: CommandRequest,
        options: CommandOptions,
    ) -> Result<Answer, ApiError> {
        if req.route == Route::Write {
            self.write_route(&mut req)?;
        }
        let CommandOptions {
            cancel,
            on_admit,
            rider,
        } = options;
        let t0 = Instant::now();
        let accepted_at_ms = now_ms();
        // An id the endpoint mints is new by construction (a ULID: time plus
        // 80 random bits), so step 4 needs no look-up in the store for it.
        let minted_id = req.command_id.is_none();
        let command_id = match &req.command_id {
            Some(raw) => CommandId::parse(raw)
                .map_err(|e| {
                    ApiError::new(
                        Code::ProtocolInvalidParams,
                        format!("command_id: {e}"),
                        json!({"reason": "command_id_invalid"}),
                    )
                })?
                .as_str()
                .to_owned(),
            None => CommandId::mint().as_str().to_owned(),
        };
        let d = self
            .device_index(&req.device_id)
            .ok_or_else(|| self.unknown_device(&req.device_id))?;
        let dev = &self.inner.devices[d];
        // Step 2a: a live session of the caller (grant checked after resolution).
        self.check_grant(p, req.session_id.as_deref(), |_| true, json!({}))?;
        let digest = canonical::digest(&req.input);
        let deadline = self.deadline_from(t0, req.deadline)?;
        let early = |code: Code, message: String, details: Value| {
            Ctx {
                device: d,
                binding: usize::MAX,
                command_id: command_id.clone(),
                digest: digest.clone(),
                key: String::new(),
                input: Value::Null,
                principal: p.clone(),
                session_id: req.session_id.clone(),
                accepted_at_ms,
                t0,
                deadline,
                expected_revision: None,
                safe_place_grant: None,
                permit_id: None,
                policy: std::sync::OnceLock::new(),
                approval: std::sync::OnceLock::new(),
                new_approval: std::sync::OnceLock::new(),
                rider: rider.clone(),
            }
            .pre_binding_refusal(code, message, details, &req)
        };
        // Step 3: binding resolution.
        let bi = match resolve(dev, &req.capability_id, req.resource.as_deref()) {
            Resolve::Found(bi) => bi,
            Resolve::Unknown => {
                let (ctx, refusal, cap, res) = early(
                    Code::CapabilityUnknown,
                    format!(
                        "`{}` is not bound on device `{}`",
                        req.capability_id, req.device_id
                    ),
                    json!({"capability_id": req.capability_id, "bound": dev.spec.bindings.iter().map(|b| b.capability_id.clone()).collect::<Vec<_>>()}),
                );
                return Ok(self
                    .reject(&ctx, &cap, res.as_deref(), refusal)
                    .await
                    .into());
            }
            Resolve::NotBound(bound) => {
                let (ctx, refusal, cap, res) = early(
                    Code::CapabilityNotBound,
                    format!(
                        "`{}` is not bound to resource `{}`",
                        req.capability_id,
                        req.resource.clone().unwrap_or_default()
                    ),
                    json!({"bound_resources": bound}),
                );
                return Ok(self
                    .reject(&ctx, &cap, res.as_deref(), refusal)
                    .await
                    .into());
            }
            Resolve::ResourceRequired(resources) => {
                return Err(ApiError::new(
                    Code::ProtocolInvalidParams,
                    format!(
                        "`{}` is bound to several resources; name one",
                        req.capability_id
                    ),
                    json!({"reason": "resource_required", "resources": resources}),
                ))
            }
        };
        let (b, _) = dev.binding(bi);
        // Step 2b: the resolved binding is granted.
        let sid = self.check_grant(
            p,
            req.session_id.as_deref(),
            |s| s.grants.contains(&(d, bi)),
            json!({"device_id": req.device_id, "capability_id": b.capability_id, "resource": b.resource}),
        )?;
        if b.catalogued && b.capability_id == catalogue::ESTOP {
            let reason = req
                .input
                .get("reason")
                .and_then(Value::as_str)
                .unwrap_or("e-stop command")
                .to_owned();
            return Ok(self
                .estop_devices(vec![d], &reason, Some(p.clone()), None, Some(&command_id))
                .await
                .into());
        }
        let key = idempotency_key(&p.id, dev.id(), &b.capability_id, &b.resource, &digest);
        // A request without its own id that repeats a held one (same
        // principal, binding and input) takes that hold's id, so it resumes
        // the approval instead of making another.
        let (command_id, minted_id) = match minted_id
            .then(|| self.open_approval_command_id(&p.id, &key))
            .flatten()
        {
            Some(held) => (held, false),
            None => (command_id, minted_id),
        };
        let ctx = Ctx {
            device: d,
            binding: bi,
            command_id,
            key,
            digest,
            input: req.input,
            principal: p.clone(),
            session_id: Some(sid),
            accepted_at_ms,
            t0,
            deadline,
            expected_revision: req.expected_revision,
            safe_place_grant: req.safe_place_grant.clone(),
            permit_id: req.permit_id.clone(),
            policy: std::sync::OnceLock::new(),
            approval: std::sync::OnceLock::new(),
            new_approval: std::sync::OnceLock::new(),
            rider,
        };
        // Step 4: idempotency.
        let begin = if minted_id {
            self.claim_minted(&ctx.command_id, &ctx.key)
        } else {
            self.begin_idempotent(&ctx.command_id, &ctx.key)
        };
        match begin {
            Ok(None) => {}
            Ok(Some(replay)) => return Ok(replay.into()),
            Err(reason) => {
                let refusal = Refusal::new(
                    Code::ConflictCommandIdReuse,
                    format!(
                        "command_id `{}` was already used ({reason})",
                        ctx.command_id
                    ),
                    json!({"reason": reason, "command_id": ctx.command_id}),
                );
                return Ok(self.reject_binding(&ctx, refusal).await.into());
            }
        }
        match self.admit(&ctx, true) {
            Ok(admitted) => {
                if let Some(tx) = on_admit {
                    // The receiver may have stopped waiting; dispatch goes on.
                    let _ = tx.send(());
                }
                self.dispatch(ctx, admitted, cancel).await
            }
            Err(refusal) => {
                // A hold answers only once its approval is durable.
                let refusal = match ctx.new_approval.get() {
                    Some(id) => match self.persist_new_approval(id).await {
                        Ok(()) => refusal,
                        Err(e) => e,
                    },
                    None => refusal,
                };
                self.abort_idempotent(&ctx.command_id);
                Ok(self.reject_binding(&ctx, refusal).await.into())
            }
        }
    }

    /// When a command arriving at `t0` must be done: its own deadline (at
    /// most [`DEADLINE_MS_MAX`]) or the configured default.
    ///
    /// # Errors
    /// A deadline longer than [`DEADLINE_MS_MAX`], or one the clock cannot
    /// represent.
    pub(crate) fn deadline_from(
        &self,
        t0: Instant,
        asked: Option<Duration>,
    ) -> Result<Instant, ApiError> {
        let budget = asked.unwrap_or(Duration::from_millis(self.inner.config.default_deadline_ms));
        let invalid = || {
            ApiError::new(
                Code::ProtocolInvalidParams,
                format!("deadline_ms must be between 1 and {DEADLINE_MS_MAX}"),
                json!({"reason": "deadline_invalid"}),
            )
        };
        if asked.is_some_and(|d| d.as_millis() > u128::from(DEADLINE_MS_MAX)) {
            return Err(invalid());
        }
        t0.checked_add(budget).ok_or_else(invalid)
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
                json!({}),
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
                self.check_grant(p, req.session_id.as_deref(), |_| true, json!({}))?
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
            json!({}),
        )?;
        let now = Instant::now();
        let ctx = Ctx {
            device: d,
            binding: bi,
            command_id: "preflight".into(),
            digest: String::new(),
            key: String::new(),
            input: req.input.clone(),
            principal: p.clone(),
            session_id: Some(sid),
            accepted_at_ms: 0,
            t0: now,
            deadline: now,
            expected_revision: req.expected_revision,
            safe_place_grant: req.safe_place_grant.clone(),
            permit_id: req.permit_id.clone(),
            policy: std::sync::OnceLock::new(),
            approval: std::sync::OnceLock::new(),
            new_approval: std::sync::OnceLock::new(),
            rider: None,
        };
        match self.admit(&ctx, false) {
            Ok(admitted) => {
                self.release_budgets(&admitted.reservations);
                Ok(None)
            }
            Err(r) => Ok(Some(r)),
        }
    }
}

impl Ctx {
    fn pre_binding_refusal(
        self,
        code: Code,
        message: String,
        details: Value,
        req: &CommandRequest,
    ) -> (Ctx, Refusal, String, Option<String>) {
        (
            self,
            Refusal::new(code, message, details),
            req.capability_id.clone(),
            req.resource.clone(),
        )
    }
}
