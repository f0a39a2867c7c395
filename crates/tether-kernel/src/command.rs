//! The evaluation order (DESIGN §3) for writes, actions and reads.
//!
//! `Kernel::command` holds the branching; each step is a small helper that
//! returns a verdict. A refusal before dispatch leaves no side effect: the
//! idempotency claim is dropped, budget reservations are released, no
//! revision moves, and the rejected receipt is evidence but never the recorded
//! outcome of its `command_id`.

use crate::answer::{write_receipt, Answer, ReceiptExtras};
use crate::authorized::{Authorized, CallKind};
use crate::driver::{CancelToken, InterlockState, Signal};
use crate::idempotency::Begin;
use crate::kernel::{DeviceRt, Kernel, Principal, RunningOp};
use crate::loader::BindingSpec;
use crate::policy::PolicyStep;
use crate::rider::{Boarded, Rider};
use crate::session::{Session, SessionFault};
use crate::{
    ApiError, CommandOptions, CommandRequest, GrantRequest, ReadRequest, Route, SessionOpen,
    DEADLINE_MS_MAX,
};
use serde_json::{json, Map, Value};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tether_core::catalogue::{self, Verb};
use tether_core::ids::{self, CommandId};
use tether_core::manifest::{Concurrency, Mode, RiskClass};
use tether_core::receipt::now_ms;
use tether_core::{Code, Receipt, Refusal, Status};
use tether_store::canonical::CanonicalText;
use tether_store::{
    canonical, BudgetRow, CanonicalBody, Commit, CommitAck, EventBody, EventDraft, ReceiptRef,
    RevisionRow, StoreError,
};

/// Most validation errors reported for one input.
const SCHEMA_ERRORS_MAX: usize = 16;
/// How long a cancelled call may take to return before its outcome is unknown.
const CANCEL_GRACE: Duration = Duration::from_millis(1000);
/// How often the interlocks of a running operation are read, ms.
const INTERLOCK_POLL_MS: u64 = 20;
/// Longest session lifetime a client may ask for, ms.
const SESSION_TTL_MS_MAX: u64 = 86_400_000;

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

enum Resolve {
    Found(usize),
    Unknown,
    NotBound(Vec<String>),
    ResourceRequired(Vec<String>),
}

/// What admission hands to dispatch.
struct Admitted {
    reservations: Vec<BudgetRow>,
}

fn session_error(fault: SessionFault, sid: &str) -> ApiError {
    match fault {
        SessionFault::Unknown => ApiError::new(
            Code::SessionUnknown,
            format!("no live session `{sid}` for this caller; open one with mhs.session.open"),
            json!({"session_id": sid}),
        ),
        SessionFault::Expired => ApiError::new(
            Code::SessionExpired,
            format!("session `{sid}` expired or was closed"),
            json!({"session_id": sid}),
        ),
        SessionFault::Full => ApiError::new(
            Code::SessionLimit,
            "too many live sessions on this endpoint; close some or let them expire",
            json!({"reason": "sessions_full"}),
        ),
        SessionFault::PrincipalFull => ApiError::new(
            Code::SessionLimit,
            "this caller holds too many live sessions; close some or let them expire",
            json!({"reason": "principal_sessions_full"}),
        ),
    }
}

impl Kernel {
    // ----- sessions -------------------------------------------------------

    /// `mhs.session.open`.
    ///
    /// # Errors
    /// Unknown devices, ungrantable capabilities, a full session table.
    pub async fn session_open(&self, p: &Principal, req: SessionOpen) -> Result<Value, ApiError> {
        let devices: Vec<usize> = match &req.device_ids {
            Some(ids) => ids
                .iter()
                .map(|id| {
                    self.device_index(id).ok_or_else(|| {
                        self.device(id).err().unwrap_or_else(|| {
                            ApiError::invalid_params("device_ids", "unknown device")
                        })
                    })
                })
                .collect::<Result<_, _>>()?,
            None => (0..self.inner.devices.len()).collect(),
        };
        let mut grants = std::collections::BTreeSet::new();
        for &d in &devices {
            let dev = &self.inner.devices[d];
            for (bi, b) in dev.spec.bindings.iter().enumerate() {
                let wanted = match &req.capabilities {
                    None => true,
                    Some(list) => list.iter().any(|g| match g {
                        GrantRequest::Class(k) => catalogue::key_matches(k, &b.capability_id),
                        GrantRequest::Binding {
                            capability_id,
                            resource,
                        } => capability_id == &b.capability_id && resource == &b.resource,
                    }),
                };
                if wanted {
                    grants.insert((d, bi));
                }
            }
        }
        if let Some(list) = &req.capabilities {
            for g in list {
                if let GrantRequest::Binding {
                    capability_id,
                    resource,
                } = g
                {
                    let found = grants.iter().any(|&(d, bi)| {
                        let b = &self.inner.devices[d].spec.bindings[bi];
                        &b.capability_id == capability_id && &b.resource == resource
                    });
                    if !found {
                        return Err(ApiError::new(
                            Code::CapabilityNotBound,
                            format!("`{capability_id}` is not bound to resource `{resource}` on the requested devices"),
                            json!({"capability_id": capability_id, "resource": resource}),
                        ));
                    }
                }
            }
        }
        let ttl_ms = req.ttl_ms.unwrap_or(self.inner.config.session_ttl_ms);
        if ttl_ms == 0 || ttl_ms > SESSION_TTL_MS_MAX {
            return Err(ApiError::invalid_params(
                "ttl_ms",
                "ttl_ms must be between 1 and 86400000",
            ));
        }
        let now = now_ms();
        let session = Session {
            id: ids::mint_secret("mhs_s_"),
            principal: p.clone(),
            grants,
            ttl_ms,
            expires_at_ms: now.saturating_add(ttl_ms),
            closed: false,
            reaped: false,
        };
        let granted: Vec<Value> = session
            .grants
            .iter()
            .map(|&(d, bi)| {
                let dev = &self.inner.devices[d];
                let b = &dev.spec.bindings[bi];
                json!({"device_id": dev.id(), "capability_id": b.capability_id, "resource": b.resource, "verb": b.verb.as_str()})
            })
            .collect();
        let answer = json!({
            "session_id": session.id,
            "principal": p.to_json(),
            "granted": granted,
            "ttl_ms": ttl_ms,
            "expires_at_ms": session.expires_at_ms,
            "heartbeat_ms": ttl_ms / 3,
        });
        let sid = session.id.clone();
        self.sessions_lock()?
            .open(session, now)
            .map_err(|f| session_error(f, &sid))?;
        self.record(Commit {
            events: vec![EventDraft {
                kind: "session.open".into(),
                body: json!({"session_id": sid, "principal": p.to_json(), "grants": answer["granted"].as_array().map_or(0, Vec::len), "ttl_ms": ttl_ms}).into(),
            }],
            ..Commit::default()
        });
        Ok(answer)
    }

    /// `mhs.session.heartbeat`.
    ///
    /// # Errors
    /// Unknown or expired session.
    pub fn session_heartbeat(&self, p: &Principal, sid: &str) -> Result<Value, ApiError> {
        let expires = self
            .sessions_lock()?
            .heartbeat(sid, p, now_ms())
            .map_err(|f| session_error(f, sid))?;
        Ok(json!({"session_id": sid, "expires_at_ms": expires}))
    }

    /// `mhs.session.close`: ends the session and cancels its running operations.
    ///
    /// # Errors
    /// Unknown or expired session.
    pub async fn session_close(&self, p: &Principal, sid: &str) -> Result<Value, ApiError> {
        self.sessions_lock()?
            .close(sid, p, now_ms())
            .map_err(|f| session_error(f, sid))?;
        if let Ok(mut sessions) = self.inner.sessions.lock() {
            sessions.mark_reaped(sid);
        }
        let cancelled = self.end_session(sid, "closed").await;
        self.record(Commit {
            events: vec![EventDraft {
                kind: "session.close".into(),
                body: json!({"session_id": sid, "principal": p.to_json(), "cancelled_operations": cancelled}).into(),
            }],
            ..Commit::default()
        });
        Ok(json!({"session_id": sid, "closed": true, "cancelled_operations": cancelled}))
    }

    /// Cancels a session's running operations (stop-class and safe-state
    /// operations excepted) and returns them as `(operation_id, device)`.
    pub(crate) fn cancel_session_ops(&self, sid: &str) -> Vec<(String, usize)> {
        let Ok(ops) = self.inner.ops.lock() else {
            return Vec::new();
        };
        ops.iter()
            .filter(|(_, op)| op.session_id.as_deref() == Some(sid) && !op.stop_class)
            .map(|(id, op)| {
                op.cancel.cancel();
                (id.clone(), op.device)
            })
            .collect()
    }

    /// A session ended (closed or expired): cancel its operations and run the
    /// safe-state actions of every device it was driving.
    pub(crate) async fn end_session(&self, sid: &str, why: &str) -> Vec<String> {
        self.release_session_permits(sid);
        let cancelled = self.cancel_session_ops(sid);
        let mut devices: Vec<usize> = cancelled.iter().map(|(_, d)| *d).collect();
        devices.sort_unstable();
        devices.dedup();
        let mut safe_state = Vec::new();
        for d in devices {
            let actions: Vec<String> = self.inner.devices[d]
                .spec
                .manifest
                .safety
                .safe_state
                .as_ref()
                .map(|s| s.achieved_by.clone())
                .unwrap_or_default();
            if actions.is_empty() {
                tracing::warn!(session = sid, device = self.inner.devices[d].id(), "session ended; the device declares no safe-state action, relying on cancellation");
                continue;
            }
            let deadline =
                Instant::now() + Duration::from_millis(self.inner.devices[d].estop_budget_ms());
            let result = self.run_safe_state_actions(d, deadline, &actions).await;
            safe_state.push(json!({"device_id": self.inner.devices[d].id(), "actions": actions, "ok": result.is_ok()}));
        }
        let ops: Vec<String> = cancelled.into_iter().map(|(op, _)| op).collect();
        self.record(Commit {
            events: vec![EventDraft {
                kind: "session.end".into(),
                body: json!({"session_id": sid, "why": why, "cancelled_operations": ops, "safe_state": safe_state}).into(),
            }],
            ..Commit::default()
        });
        ops
    }

    fn sessions_lock(
        &self,
    ) -> Result<std::sync::MutexGuard<'_, crate::session::Sessions>, ApiError> {
        self.inner.sessions.lock().map_err(|_| {
            ApiError::new(
                Code::ProtocolInternal,
                "session table unavailable",
                json!({}),
            )
        })
    }

    /// Step 2: the session is live, owned by the caller, and grants the binding.
    pub(crate) fn check_grant(
        &self,
        p: &Principal,
        sid: Option<&str>,
        grant: impl Fn(&Session) -> bool,
        what: Value,
    ) -> Result<String, ApiError> {
        let Some(sid) = sid else {
            return Err(ApiError::new(
                Code::SessionUnknown,
                "session_id is required; open a session with mhs.session.open",
                json!({"reason": "missing"}),
            ));
        };
        let sessions = self.sessions_lock()?;
        let s = sessions
            .get(sid, p, now_ms())
            .map_err(|f| session_error(f, sid))?;
        if !grant(s) {
            return Err(ApiError::new(
                Code::SessionCapabilityNotGranted,
                "the session was not granted this binding",
                what,
            ));
        }
        Ok(sid.to_owned())
    }

    // ----- reads ----------------------------------------------------------

    /// `mhs.resource.read`: `{revision, state, state_hash, sampled_at}`.
    ///
    /// # Errors
    /// Session, device or resource errors; a driver that cannot read.
    pub async fn read(&self, p: &Principal, req: ReadRequest) -> Result<Value, ApiError> {
        let d = self
            .device_index(&req.device_id)
            .ok_or_else(|| self.unknown_device(&req.device_id))?;
        let dev = &self.inner.devices[d];
        if !dev
            .spec
            .manifest
            .resources
            .iter()
            .any(|r| r.id == req.resource)
        {
            return Err(ApiError::new(
                Code::ResourceUnknown,
                format!(
                    "device `{}` has no resource `{}`",
                    req.device_id, req.resource
                ),
                json!({"resource": req.resource, "resources": dev.spec.manifest.resources.iter().map(|r| r.id.clone()).collect::<Vec<_>>()}),
            ));
        }
        let sid = self.check_grant(
            p,
            req.session_id.as_deref(),
            |s| {
                s.grants
                    .iter()
                    .any(|&(gd, gb)| gd == d && dev.spec.bindings[gb].resource == req.resource)
            },
            json!({"device_id": req.device_id, "resource": req.resource}),
        )?;
        // Reads skip the effectful steps but not the policy.
        let policy_binding = dev
            .spec
            .bindings
            .iter()
            .position(|b| b.resource == req.resource && b.is_read())
            .or_else(|| {
                dev.spec
                    .bindings
                    .iter()
                    .position(|b| b.resource == req.resource)
            });
        let policy = match policy_binding {
            Some(bi) => self.policy_read(p, d, bi),
            None => Err(Refusal::new(
                Code::PolicyDenied,
                "no binding on this resource for the policy to judge",
                json!({"reason": "no_binding"}),
            )),
        };
        let policy = match policy {
            Ok(v) => v,
            Err(r) => {
                self.record(Commit {
                    events: vec![EventDraft {
                        kind: "resource.read".into(),
                        body: json!({"device_id": req.device_id, "resource": req.resource, "session_id": sid, "principal": p.to_json(), "decision": "deny", "error": r.to_json()}).into(),
                    }],
                    ..Commit::default()
                });
                return Err(ApiError::new(r.code, r.message.clone(), r.details.clone()));
            }
        };
        let auth = Authorized::mint(
            dev.id(),
            catalogue::STATE_READ,
            &req.resource,
            "read",
            Value::Null,
            "",
            CallKind::Read,
            None,
        );
        let revision = dev.revision(&req.resource);
        let state = dev.driver.read(&auth).map_err(|s| {
            ApiError::new(
                Code::DeviceUnavailable,
                format!("the driver could not read: {}", signal_text(&s)),
                json!({"reason": "read_failed"}),
            )
        })?;
        let state_hash = canonical::digest(&state);
        self.record(Commit {
            events: vec![EventDraft {
                kind: "resource.read".into(),
                body: json!({"device_id": req.device_id, "resource": req.resource, "session_id": sid, "principal": p.to_json(), "revision": revision, "state_hash": state_hash, "decision": "allow", "policy": policy}).into(),
            }],
            ..Commit::default()
        });
        Ok(json!({
            "device_id": req.device_id,
            "resource": req.resource,
            "revision": revision,
            "state": state,
            "state_hash": state_hash,
            "sampled_at": now_ms(),
            "mode": dev.spec.manifest.mode.as_str(),
        }))
    }

    pub(crate) fn unknown_device(&self, id: &str) -> ApiError {
        self.device(id)
            .err()
            .unwrap_or_else(|| ApiError::new(Code::DeviceUnknown, "unknown device", json!({})))
    }

    // ----- writes ---------------------------------------------------------

    /// A write (`Route::Write`) is a command of the resource's configure
    /// binding: checks the resource has one and names it.
    ///
    /// # Errors
    /// `RESOURCE.UNKNOWN`; `NOT_WRITABLE` when the resource has no configure
    /// binding or another class is named.
    fn write_route(&self, req: &mut CommandRequest) -> Result<(), ApiError> {
        let dev = self.device(&req.device_id)?;
        let resource = req
            .resource
            .clone()
            .ok_or_else(|| ApiError::invalid_params("resource_required", "resource is required"))?;
        if !dev.spec.manifest.resources.iter().any(|r| r.id == resource) {
            return Err(ApiError::new(
                Code::ResourceUnknown,
                format!("device `{}` has no resource `{resource}`", req.device_id),
                json!({"resource": resource}),
            ));
        }
        if !req.capability_id.is_empty() && req.capability_id != catalogue::CONFIGURE {
            return Err(ApiError::new(
                Code::ResourceNotWritable,
                "mhs.resource.write always uses cap.device.configure.v1",
                json!({"reason": "write_class_not_configure", "capability_id": req.capability_id}),
            ));
        }
        let bound = dev
            .spec
            .bindings
            .iter()
            .any(|b| b.capability_id == catalogue::CONFIGURE && b.resource == resource);
        if !bound {
            return Err(ApiError::new(
                Code::ResourceNotWritable,
                format!("resource `{resource}` has no cap.device.configure.v1 binding"),
                json!({"reason": "configure_unbound", "resource": resource}),
            ));
        }
        req.capability_id = catalogue::CONFIGURE.to_owned();
        Ok(())
    }

    // ----- commands -------------------------------------------------------

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
    fn deadline_from(&self, t0: Instant, asked: Option<Duration>) -> Result<Instant, ApiError> {
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

    fn begin_idempotent(
        &self,
        command_id: &str,
        digest: &str,
    ) -> Result<Option<Value>, &'static str> {
        let begin = match self.inner.idem.lock() {
            Ok(mut ix) => ix.begin(command_id, digest),
            Err(_) => return Err("index_unavailable"),
        };
        match begin {
            Begin::Fresh => Ok(None),
            Begin::Replay(r) => Ok(Some(replayed(r))),
            Begin::Reuse(reason) => Err(reason),
            Begin::Unknown => match self.inner.store.receipt(command_id) {
                Ok(Some(row)) if row.input_digest == digest => Ok(Some(replayed(row.receipt))),
                Ok(Some(_)) => Err("input_differs"),
                Ok(None) => match self.inner.idem.lock() {
                    Ok(mut ix) => {
                        if ix.claim(command_id, digest) {
                            Ok(None)
                        } else {
                            Err("in_flight")
                        }
                    }
                    Err(_) => Err("index_unavailable"),
                },
                // A check that cannot be evaluated refuses.
                Err(_) => Err("store_unavailable"),
            },
        }
    }

    /// Step 4 for an id this endpoint just minted: nothing can hold it yet,
    /// so it is claimed without asking the store (which an index that has
    /// evicted entries would otherwise do for every command).
    fn claim_minted(&self, command_id: &str, digest: &str) -> Result<Option<Value>, &'static str> {
        let Ok(mut ix) = self.inner.idem.lock() else {
            return Err("index_unavailable");
        };
        if ix.claim(command_id, digest) {
            Ok(None)
        } else {
            Err("in_flight")
        }
    }

    fn abort_idempotent(&self, command_id: &str) {
        if let Ok(mut ix) = self.inner.idem.lock() {
            ix.abort(command_id);
        }
    }

    /// Steps 5 to 11. Pure checks plus the budget reservation (released by
    /// the caller on any later refusal).
    fn admit(&self, ctx: &Ctx, create: bool) -> Result<Admitted, Refusal> {
        let dev = &self.inner.devices[ctx.device];
        let (b, rt) = dev.binding(ctx.binding);
        // Step 5: latch (an operator's safe-place grant lets its one exact command through).
        if Kernel::is_effectful(b) && dev.latched.load(Ordering::SeqCst) {
            match &ctx.safe_place_grant {
                Some(g) => self.check_grant_for(g, ctx.device, ctx.binding, &ctx.digest, false)?,
                None => return Err(latched_refusal(dev)),
            }
        }
        // Step 6: mode, hybrid authority, arming.
        if dev.spec.manifest.mode == Mode::Replay && !b.is_read() {
            return Err(Refusal::new(
                Code::ModeReadOnly,
                "a replay device accepts no commands",
                json!({"mode": "replay"}),
            ));
        }
        check_authority(dev, b, &ctx.principal)?;
        check_armed(dev, b)?;
        // Step 7: structure (configure field rules first).
        if b.catalogued && b.capability_id == catalogue::CONFIGURE {
            check_configure_fields(dev, &b.resource, &ctx.input)?;
        }
        check_schema(&rt.structure, rt.class_structure.as_ref(), &ctx.input)?;
        // Step 8: limits on every element and leaf, then unset operator bounds.
        if let Err(v) = b.limits.check(&ctx.input) {
            let first = &v.first;
            return Err(Refusal::new(
                Code::SafetyEnvelopeViolation,
                format!(
                    "{} = {} violates {} bound {}{} (source: {})",
                    first.path,
                    first.value,
                    first.kind.as_str(),
                    first.bound,
                    first
                        .unit
                        .as_deref()
                        .map(|u| format!(" {u}"))
                        .unwrap_or_default(),
                    first.source
                ),
                v.to_details(),
            ));
        }
        if !b.is_stop() && !b.is_read() {
            let unset = b.limits.unset_paths(&ctx.input);
            if !unset.is_empty() {
                return Err(Refusal::new(
                    Code::SafetyLimitsUnset,
                    "the input sets a value whose bound is operator_required and no operator overlay filled it",
                    json!({"paths": unset, "reason": "operator_required"}),
                ));
            }
            // CORE-046 (strict): a physical call at R1 or above never sets a
            // number no limit bounds. Tether always runs strict.
            if dev.spec.manifest.mode.is_physical() && b.risk >= RiskClass::R1 {
                let unbounded = b.limits.unlimited_set_paths(&ctx.input);
                if !unbounded.is_empty() {
                    return Err(Refusal::new(
                        Code::SafetyLimitsUnset,
                        "the input sets a number no limit bounds; a hardware call at R1 or above needs a limit on every number it sets",
                        json!({"paths": unbounded, "reason": "no_limit"}),
                    ));
                }
            }
        }
        // Step 9: remaining schema bounds.
        check_schema(&rt.full, rt.class_full.as_ref(), &ctx.input)?;
        // Step 10: policy (allow / hold / deny, with the approval route), then
        // the permit bound to the exact input digest, then budgets.
        match self.policy_step(ctx, b, create) {
            PolicyStep::Go { approval } => {
                if let Some(id) = approval {
                    let _ = ctx.approval.set(id);
                }
            }
            PolicyStep::Refused {
                refusal,
                new_approval,
            } => {
                if let Some(id) = new_approval {
                    let _ = ctx.new_approval.set(id);
                }
                return Err(refusal);
            }
        }
        if let Some(id) = &ctx.permit_id {
            self.check_permit(id, ctx, false)?;
        }
        let reservations = if Kernel::is_effectful(b) {
            self.reserve_budgets(ctx, b)?
        } else {
            Vec::new()
        };
        // Step 11: interlocks.
        if let Err(r) = check_interlocks(dev, b) {
            self.release_budgets(&reservations);
            return Err(r);
        }
        Ok(Admitted { reservations })
    }

    fn reserve_budgets(&self, ctx: &Ctx, b: &BindingSpec) -> Result<Vec<BudgetRow>, Refusal> {
        let rules = b.limits.budgets();
        if rules.is_empty() {
            return Ok(Vec::new());
        }
        let dev = &self.inner.devices[ctx.device];
        let now = now_ms();
        let mut ledger =
            self.inner.budgets.lock().map_err(|_| {
                Refusal::bare(Code::SafetyCumulativeLimit, "budget ledger unavailable")
            })?;
        let mut rows = Vec::new();
        for (i, rule) in rules.iter().enumerate() {
            let amount = b
                .limits
                .draw_amount(&ctx.input, rule)
                .map_err(|e| budget_draw_refusal(rule, &e))?;
            if amount == 0.0 {
                continue;
            }
            let mut key = format!(
                "{}/{}/{}/{}",
                dev.id(),
                b.capability_id,
                rule.path,
                rule.window.as_str()
            );
            if rule.window == tether_limits::budget::Window::Session {
                key.push('/');
                key.push_str(ctx.session_id.as_deref().unwrap_or("-"));
            }
            let reservation_id = format!("{}#{i}", ctx.command_id);
            if let Err(ex) =
                ledger.try_reserve(&key, rule.window, rule.limit, amount, now, &reservation_id)
            {
                for r in &rows {
                    let r: &BudgetRow = r;
                    ledger.release(&r.reservation_id);
                }
                let (used, limit) = match &ex {
                    tether_limits::budget::BudgetError::Exceeded { used, limit, .. } => {
                        (*used, *limit)
                    }
                    _ => (f64::NAN, rule.limit),
                };
                let used = if used.is_finite() {
                    json!(used)
                } else {
                    Value::Null
                };
                return Err(Refusal::new(
                    Code::SafetyCumulativeLimit,
                    format!(
                        "cumulative budget of {} over {} would be exceeded",
                        rule.path,
                        rule.window.as_str()
                    ),
                    json!({"used": used, "limit": limit, "requested": amount, "window": rule.window.as_str(), "limit_path": rule.path.to_string(), "unit": rule.unit}),
                ));
            }
            rows.push(BudgetRow {
                key,
                reservation_id,
                amount,
                ts_ms: now,
                released: false,
            });
        }
        Ok(rows)
    }

    fn release_budgets(&self, rows: &[BudgetRow]) {
        if rows.is_empty() {
            return;
        }
        if let Ok(mut ledger) = self.inner.budgets.lock() {
            for r in rows {
                ledger.release(&r.reservation_id);
            }
        }
    }

    /// Whether a call's start is made durable, as an open operation, before
    /// it is dispatched: every effectful call on a physical device, and on a
    /// simulated one every call that runs for a while (an exclusive or
    /// time-bounded operation, such as a motion). A process that dies while
    /// such a call runs leaves the open operation, and start-up records the
    /// id's outcome as `unknown`, so the same `command_id` is never run a
    /// second time. A simulated instant call (a setpoint) writes its
    /// admission with its receipt: one commit instead of two, and between
    /// dispatch and that commit there is only the driver's own call.
    pub(crate) fn start_is_tracked(mode: Mode, b: &BindingSpec) -> bool {
        if !Kernel::is_effectful(b) {
            return false;
        }
        mode.is_physical() || b.concurrency == Concurrency::Exclusive || b.max_duration_ms.is_some()
    }

    /// Step 12: lock, revision, durable admission evidence, dispatch, output
    /// validation, receipt.
    async fn dispatch(
        &self,
        ctx: Ctx,
        admitted: Admitted,
        caller_cancel: CancelToken,
    ) -> Result<Answer, ApiError> {
        let dev = &self.inner.devices[ctx.device];
        let (b, _) = dev.binding(ctx.binding);
        if Kernel::is_effectful(b) {
            if let Some(open) = self.unreconciled(ctx.device, &b.resource) {
                return Ok(self
                    .refuse_admitted(
                        &ctx,
                        &admitted.reservations,
                        Refusal::new(
                            Code::EvidenceUnavailable,
                            "the resource is held: a physical call's finish could not be recorded yet",
                            json!({"reason": "physical_evidence_unreconciled", "open_receipts": open}),
                        ),
                    )
                    .await);
            }
        }
        let guard = match Kernel::concurrency(b) {
            Concurrency::Shared => None,
            Concurrency::Exclusive => match dev.lock.try_lock() {
                Ok(g) => Some(g),
                Err(_) => {
                    return Ok(self
                        .refuse_admitted(
                            &ctx,
                            &admitted.reservations,
                            Refusal::new(
                                Code::DeviceBusy,
                                format!(
                                    "device `{}` is busy with an exclusive operation",
                                    dev.id()
                                ),
                                json!({"concurrency": "exclusive"}),
                            ),
                        )
                        .await)
                }
            },
            Concurrency::Serialized => {
                let wait = ctx.deadline.saturating_duration_since(Instant::now());
                match tokio::time::timeout(wait, dev.lock.lock()).await {
                    Ok(g) => Some(g),
                    Err(_) => {
                        return Ok(self
                            .refuse_admitted(
                                &ctx,
                                &admitted.reservations,
                                timeout_refusal("waiting_for_device_lock"),
                            )
                            .await)
                    }
                }
            }
        };
        let before = dev.revision(&b.resource);
        if let Some(expected) = ctx.expected_revision {
            if expected != before {
                return Ok(self
                    .refuse_admitted(
                        &ctx,
                        &admitted.reservations,
                        Refusal::new(
                            Code::ConflictRevision,
                            format!("expected revision {expected}, live revision is {before}"),
                            json!({"expected_revision": expected, "revision": before}),
                        ),
                    )
                    .await);
            }
        }
        if Instant::now() >= ctx.deadline {
            return Ok(self
                .refuse_admitted(&ctx, &admitted.reservations, timeout_refusal("checks"))
                .await);
        }
        // Stops and safe-state actions are exempt: they always run.
        if dev.spec.manifest.mode.is_physical() && Kernel::is_effectful(b) {
            if let Err(r) = self.reread_governed_stop(ctx.device) {
                return Ok(self.refuse_admitted(&ctx, &admitted.reservations, r).await);
            }
        }
        let op_id = ids::mint("op_");
        // A stop is never cancelled, so it never runs on the caller's token.
        let cancel = if Kernel::is_effectful(b) {
            caller_cancel
        } else {
            CancelToken::new()
        };
        if let Err(r) = self.register_op(&ctx, b, &op_id, &cancel) {
            return Ok(self.refuse_admitted(&ctx, &admitted.reservations, r).await);
        }
        let mut admission = Admission::Recorded;
        if !b.is_read() {
            // A physical call, or one that draws a budget, waits until its
            // admission is durable before dispatch (fail-closed evidence). A
            // simulated call writes its admission in the same commit as its
            // receipt: nothing physical can happen in between, and one commit
            // instead of two halves the evidence cost of the common case.
            let tracked = Kernel::start_is_tracked(dev.spec.manifest.mode, b);
            let must_be_durable = tracked || !admitted.reservations.is_empty();
            let durable = if must_be_durable {
                // A tracked call's start is also an open operation: if the
                // process dies before its finish is recorded, start-up finds it
                // and records a crashed finish (`unknown`) under its id.
                let open_ops = if tracked {
                    vec![tether_store::OpenOp {
                        command_id: ctx.command_id.clone(),
                        info: json!({"device_id": dev.id(), "resource": b.resource, "capability_id": b.capability_id, "operation_id": op_id, "input_digest": ctx.digest, "key": ctx.key, "started_at_ms": now_ms(), "accepted_at_ms": ctx.accepted_at_ms, "mode": dev.spec.manifest.mode.as_str(), "revision_before": before}),
                    }]
                } else {
                    Vec::new()
                };
                let decision = Commit {
                    events: vec![EventDraft {
                        kind: "command.admitted".into(),
                        body: self.admitted_body(&ctx, b, &op_id).into(),
                    }],
                    budget_draws: admitted.reservations.clone(),
                    open_ops,
                    ..Commit::default()
                };
                self.commit_for(&ctx, decision).await.map(|_| ())
            } else {
                // The receipt repeats the binding, input digest and operation;
                // the admission part keeps only what the receipt lacks.
                admission = Admission::WithReceipt(b.risk.as_str());
                Ok(())
            };
            if let Err(e) = durable {
                self.unregister_op(&op_id);
                if matches!(e, StoreError::Conflict(_)) && tracked {
                    // Another process on this store ran or runs this id.
                    return Ok(self.ran_elsewhere(&ctx, &admitted.reservations).await);
                }
                return Ok(self
                    .refuse_admitted(
                        &ctx,
                        &admitted.reservations,
                        Refusal::new(
                            Code::EvidenceUnavailable,
                            "the admission could not be made durable, so nothing was dispatched",
                            json!({"reason": "started_not_durable", "store_error": e.to_string()}),
                        ),
                    )
                    .await);
            }
            // The stop and the arming are read again once the admission is
            // durable, right before dispatch: a trip or disarm another
            // process made durable while this admission was being written
            // refuses the call (the first read came before that wait).
            if dev.spec.manifest.mode.is_physical() && Kernel::is_effectful(b) {
                if let Err(r) = self.reread_governed_stop(ctx.device) {
                    self.unregister_op(&op_id);
                    let answer = self.refuse_admitted(&ctx, &admitted.reservations, r).await;
                    if tracked {
                        self.close_open_op(&ctx.command_id).await;
                    }
                    return Ok(answer);
                }
            }
        }
        // A time-bounded binding (`max_duration_ms`) runs no longer than that,
        // whatever deadline the caller gave.
        let cap = b.max_duration_ms.map(Duration::from_millis);
        let run_deadline = cap.map_or(ctx.deadline, |d| ctx.deadline.min(Instant::now() + d));
        let capped = run_deadline < ctx.deadline;
        let auth = Authorized::mint(
            dev.id(),
            &b.capability_id,
            &b.resource,
            &b.target,
            ctx.input.clone(),
            &ctx.command_id,
            if b.is_stop() {
                CallKind::Stop
            } else {
                CallKind::Effect
            },
            Some(run_deadline),
        );
        if b.is_stop() {
            // A stop cancels the running operations of its device first.
            self.cancel_device_ops(ctx.device, "stop requested");
        }
        if let Some(id) = ctx.approval.get() {
            // Dispatched: the approval is spent whatever the outcome.
            self.spend_approval(id, &ctx.command_id).await;
        }
        let result = self
            .run_driver(dev, b, auth, cancel, &op_id, run_deadline)
            .await;
        // A configure command's output is built by the kernel ({applied, revision}),
        // so the driver's own answer is not held to the class output schema.
        let is_configure = b.catalogued && b.capability_id == catalogue::CONFIGURE;
        let (_, rt) = dev.binding(ctx.binding);
        let (status, output, mut error) = classify(result, (!is_configure).then_some(&rt.output));
        if let Some(e) = error
            .as_mut()
            .filter(|e| capped && e.code == Code::OutcomeTimeout)
        {
            // The binding's own bound ended it, not the caller's deadline.
            e.message =
                "the operation ran for the binding's max_duration_ms and was cancelled".into();
            e.details["reason"] = json!("max_duration_exceeded");
            e.details["max_duration_ms"] = json!(b.max_duration_ms);
        }
        let after = if status != Status::Rejected && !b.is_read() {
            dev.revisions
                .get(&b.resource)
                .map_or(before, |r| r.fetch_add(1, Ordering::SeqCst) + 1)
        } else {
            before
        };
        // The device lock covers the effect and its revision, not the wait for
        // the receipt to become durable: holding it across the fsync would
        // serialise every command of the device behind the disk.
        drop(guard);
        self.finish(
            ctx,
            b,
            (before, after),
            (status, output, error),
            &op_id,
            admission,
        )
        .await
    }

    async fn refuse_admitted(
        &self,
        ctx: &Ctx,
        reservations: &[BudgetRow],
        refusal: Refusal,
    ) -> Answer {
        self.release_budgets(reservations);
        if let Some(id) = &ctx.permit_id {
            // Refused before dispatch: the permit is given back (a revoked one is gone).
            self.give_back_permit(id);
        }
        if let Some(id) = ctx.approval.get() {
            // Likewise the approval: it was not used.
            self.release_approval(id);
        }
        self.abort_idempotent(&ctx.command_id);
        self.reject_binding(ctx, refusal).await.into()
    }

    /// Before a physical call: the watcher is healthy and the store's latch
    /// rows hold no trip this process has not applied. A stop that cannot be
    /// read refuses the call.
    fn reread_governed_stop(&self, d: usize) -> Result<(), Refusal> {
        let dev = &self.inner.devices[d];
        let unreadable = |why: String| {
            Refusal::new(
                Code::SafetyEstopEngaged,
                "the governed stop cannot be read, so no physical call may start",
                json!({"reason": "stop_unreadable", "detail": why}),
            )
        };
        if !self.inner.stop_watch.readable() {
            return Err(unreadable(
                "the stop watcher has not read the store recently".into(),
            ));
        }
        let rows = self
            .inner
            .store
            .latches()
            .map_err(|e| unreadable(e.to_string()))?;
        if let Some(ev) = crate::governed::newest_event(&rows, dev.id()) {
            // A trip this process has not applied: newer than what it knows,
            // or known (the watcher records the time first) but not latched
            // here yet (the watcher latches on its own task, a moment later).
            let unapplied = ev.at_ms > dev.latch_event_ms.load(Ordering::SeqCst)
                || !dev.latched.load(Ordering::SeqCst);
            if ev.latched && unapplied {
                return Err(Refusal::new(
                    Code::SafetyEstopEngaged,
                    format!(
                        "a governed stop of `{}` was tripped by another process",
                        dev.id()
                    ),
                    json!({"reason": "governed_stop", "device_id": dev.id(), "tripped_at_ms": ev.at_ms, "latch_reason": ev.reason}),
                ));
            }
        }
        // Arming made by another process (or here since step 6) binds this
        // call too: a disarm this process has not applied yet refuses it.
        if let Some((armed, at_ms)) = crate::governed::arming_of(&rows, dev.id()) {
            if at_ms > dev.arming_ms.load(Ordering::SeqCst) {
                dev.arming_ms.fetch_max(at_ms, Ordering::SeqCst);
                dev.armed.store(armed, Ordering::SeqCst);
            }
        }
        if !dev.armed.load(Ordering::SeqCst) {
            return Err(Refusal::new(
                Code::AuthHardwareDisabled,
                format!("device `{}` was disarmed", dev.id()),
                json!({"reason": "not_armed", "device_id": dev.id()}),
            ));
        }
        Ok(())
    }

    /// A command id whose operation another process on this store already
    /// ran (its receipt is the outcome: a replay when this is the same
    /// request) or is running (refused `in_flight`). Nothing is dispatched
    /// here.
    async fn ran_elsewhere(&self, ctx: &Ctx, reservations: &[BudgetRow]) -> Answer {
        if let Ok(Some(row)) = self.inner.store.receipt(&ctx.command_id) {
            if row.input_digest == ctx.key {
                self.release_budgets(reservations);
                self.abort_idempotent(&ctx.command_id);
                return replayed(row.receipt).into();
            }
        }
        let refusal = Refusal::new(
            Code::ConflictCommandIdReuse,
            format!(
                "command_id `{}` already ran or is running on another endpoint of this state directory",
                ctx.command_id
            ),
            json!({"reason": "in_flight", "command_id": ctx.command_id, "where": "another_endpoint"}),
        );
        self.refuse_admitted(ctx, reservations, refusal).await
    }

    /// Closes the open operation a refusal after a durable admission left
    /// (nothing was dispatched; its rejected receipt is the outcome).
    async fn close_open_op(&self, command_id: &str) {
        let closed = Commit {
            closed_ops: vec![command_id.to_owned()],
            ..Commit::default()
        };
        if let Err(e) = self.commit(closed).await {
            // Start-up closes it then (the receipt exists, so nothing is
            // counted twice).
            tracing::warn!(command_id, error = %e, "an open operation could not be closed");
        }
    }

    fn register_op(
        &self,
        ctx: &Ctx,
        b: &BindingSpec,
        op_id: &str,
        cancel: &CancelToken,
    ) -> Result<(), Refusal> {
        let dev = &self.inner.devices[ctx.device];
        let mut ops =
            self.inner.ops.lock().map_err(|_| {
                Refusal::bare(Code::ProtocolInternal, "operation table unavailable")
            })?;
        // The latch is checked again atomically with registration, so a command
        // that passed step 5 before an e-stop never runs after it.
        if Kernel::is_effectful(b) && dev.latched.load(Ordering::SeqCst) {
            match &ctx.safe_place_grant {
                Some(g) => self.check_grant_for(g, ctx.device, ctx.binding, &ctx.digest, true)?,
                None => return Err(latched_refusal(dev)),
            }
        }
        // Checked under the operation table's lock: a cancel delivered before
        // this point refuses the command, one delivered after reaches the
        // running operation.
        if cancel.is_cancelled() {
            return Err(Refusal::new(
                Code::OutcomeCancelled,
                "cancelled before dispatch; nothing was dispatched",
                json!({"reason": "cancelled_before_dispatch"}),
            ));
        }
        if let Some(id) = &ctx.permit_id {
            self.check_permit(id, ctx, true)?;
        }
        if let Some(id) = ctx.approval.get() {
            if let Err(r) = self.reserve_approval(id, &ctx.command_id) {
                if let Some(pid) = &ctx.permit_id {
                    self.give_back_permit(pid);
                }
                return Err(r);
            }
        }
        ops.insert(
            op_id.to_owned(),
            RunningOp {
                device: ctx.device,
                capability_id: b.capability_id.clone(),
                cancel: cancel.clone(),
                stop_class: !Kernel::is_effectful(b),
                session_id: ctx.session_id.clone(),
                command_id: ctx.command_id.clone(),
            },
        );
        Ok(())
    }

    pub(crate) fn unregister_op(&self, op_id: &str) {
        if let Ok(mut ops) = self.inner.ops.lock() {
            ops.remove(op_id);
        }
    }

    pub(crate) fn cancel_device_ops(&self, device: usize, _why: &str) -> Vec<String> {
        let Ok(ops) = self.inner.ops.lock() else {
            return Vec::new();
        };
        ops.iter()
            .filter(|(_, op)| op.device == device && !op.stop_class)
            .map(|(id, op)| {
                op.cancel.cancel();
                id.clone()
            })
            .collect()
    }

    fn admitted_body(&self, ctx: &Ctx, b: &BindingSpec, op_id: &str) -> Value {
        let dev = &self.inner.devices[ctx.device];
        json!({
            "command_id": ctx.command_id,
            "operation_id": op_id,
            "device_id": dev.id(),
            "capability_id": b.capability_id,
            "resource": b.resource,
            "input_digest": ctx.digest,
            "principal": ctx.principal.to_json(),
            "session_id": ctx.session_id,
            "decision": "allow",
            "risk": b.risk.as_str(),
            "mode": dev.spec.manifest.mode.as_str(),
        })
    }

    /// Runs the driver call in its own task so a call that ignores
    /// cancellation can be left behind (its outcome unknown) without holding
    /// the caller past its deadline.
    async fn run_driver(
        &self,
        dev: &DeviceRt,
        b: &BindingSpec,
        auth: Authorized,
        cancel: CancelToken,
        op_id: &str,
        deadline: Instant,
    ) -> DriverOutcome {
        if b.is_read() {
            let out = dev
                .driver
                .read(&auth)
                .map(|state| json!({"revision": dev.revision(&b.resource), "state": state}));
            self.unregister_op(op_id);
            return DriverOutcome::Returned(out);
        }
        let driver = dev.driver.clone();
        let task_cancel = cancel.clone();
        let kernel = self.clone();
        let op = op_id.to_owned();
        let mut handle = tokio::spawn(async move {
            let r = driver.call(auth, task_cancel).await;
            kernel.unregister_op(&op);
            r
        });
        let sleep = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline));
        let gated = gating_interlocks(dev, b);
        let watch = self.watch_interlocks(dev, b, &gated);
        tokio::select! {
            joined = &mut handle => DriverOutcome::Returned(joined.unwrap_or_else(|_| Err(Signal::Failed { reason: "driver_panicked".into(), message: "the driver task ended abnormally".into() }))),
            () = sleep => {
                cancel.cancel();
                match tokio::time::timeout(CANCEL_GRACE, &mut handle).await {
                    Ok(joined) => DriverOutcome::DeadlineCancelled(joined.unwrap_or(Err(Signal::Cancelled))),
                    Err(_) => DriverOutcome::Abandoned,
                }
            }
            opened = watch => {
                // An interlock that opens while the operation runs stops it.
                cancel.cancel();
                match tokio::time::timeout(CANCEL_GRACE, &mut handle).await {
                    Ok(joined) => DriverOutcome::InterlockOpened(joined.unwrap_or(Err(Signal::Cancelled)), opened),
                    Err(_) => DriverOutcome::Abandoned,
                }
            }
        }
    }

    /// Resolves (with the open interlocks) when a gating interlock of the
    /// running operation stops reading closed; never resolves otherwise.
    async fn watch_interlocks(&self, dev: &DeviceRt, _b: &BindingSpec, gated: &[usize]) -> Value {
        if gated.is_empty() {
            return std::future::pending().await;
        }
        let mut tick = tokio::time::interval(Duration::from_millis(INTERLOCK_POLL_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Runs as long as the operation; the select! above drops it when the call ends.
        loop {
            tick.tick().await;
            let open = open_interlocks(dev, gated);
            if !open.is_empty() {
                return json!(open);
            }
        }
    }

    async fn finish(
        &self,
        ctx: Ctx,
        b: &BindingSpec,
        (before, after): (u64, u64),
        (status, output, error): (Status, Option<Value>, Option<Refusal>),
        op_id: &str,
        admission: Admission,
    ) -> Result<Answer, ApiError> {
        let dev = &self.inner.devices[ctx.device];
        let is_configure = b.catalogued && b.capability_id == catalogue::CONFIGURE;
        if status == Status::Rejected {
            // The device refused before actuating: no side effect, like any refusal.
            self.abort_idempotent(&ctx.command_id);
            let refusal =
                error.unwrap_or_else(|| Refusal::bare(Code::DeviceBusy, "the device refused"));
            return Ok(self.reject_binding(&ctx, refusal).await.into());
        }
        let advances = !b.is_read();
        let physical = dev.spec.manifest.mode.is_physical() && Kernel::is_effectful(b);
        let mut output = output;
        if is_configure && status == Status::Completed {
            output = Some(json!({"applied": ctx.input, "revision": after}));
        }
        let latency_us = ctx.t0.elapsed().as_micros() as u64;
        let mut receipt = self.receipt_base(
            &ctx,
            &b.capability_id,
            Some(&b.resource),
            status,
            output,
            error,
        );
        receipt.state_revision_before = Some(before);
        receipt.state_revision_after = Some(after);
        receipt.decision = Some("allow");
        self.note_finished(op_id, ctx.device, &receipt);
        // The entry is where the receipt is stored (the receipts table only
        // indexes it). The commit is serialised from a borrow; the answer is
        // the receipt's canonical text, or on the value path the receipt
        // taken back out of the commit, so it is never copied as a tree.
        let (event, text) = receipt_event(&ctx, receipt, latency_us, op_id, admission);
        let commit = Commit {
            events: vec![event],
            receipts: vec![ReceiptRef {
                command_id: ctx.command_id.clone(),
                input_digest: ctx.key.clone(),
                event: 0,
            }],
            revisions: if advances {
                vec![RevisionRow {
                    device_id: dev.id().to_owned(),
                    resource: b.resource.clone(),
                    revision: after,
                }]
            } else {
                Vec::new()
            },
            closed_ops: if Kernel::start_is_tracked(dev.spec.manifest.mode, b) {
                vec![ctx.command_id.clone()]
            } else {
                Vec::new()
            },
            ..Commit::default()
        };
        let (durable, answer) = match text {
            // The store moves the canonical body in; the answer is the text.
            Some(text) => (self.commit_for(&ctx, commit).await, Answer::Canonical(text)),
            None => {
                let mut commit = commit;
                let durable = self.commit_ref_for(&ctx, &mut commit).await;
                (durable, Answer::Value(take_receipt(commit)))
            }
        };
        if let Ok(mut ix) = self.inner.idem.lock() {
            match &durable {
                // Stored: a replay reads it back from the store, so the index
                // keeps only the id and digest.
                Ok(_) => ix.complete_stored(&ctx.command_id, &ctx.key),
                // Not stored: the index is the only copy a replay can answer.
                Err(_) => ix.complete(&ctx.command_id, &ctx.key, answer.clone().into_value()),
            }
        }
        match durable {
            Ok(_) => Ok(answer),
            Err(e) => {
                tracing::error!(command_id = %ctx.command_id, error = %e, "receipt could not be made durable");
                let mut w = answer.into_value();
                w["x-tether"] = json!({"evidence": "not_durable", "store_error": e.to_string()});
                if physical {
                    let held = self
                        .record_crashed_finish(
                            ctx.device,
                            &b.resource,
                            &ctx.command_id,
                            op_id,
                            &ctx.key,
                            "receipt_not_durable",
                        )
                        .await;
                    w["x-tether"]["finish"] = json!(if held {
                        "held_unreconciled"
                    } else {
                        "crashed_finish_recorded"
                    });
                }
                Ok(w.into())
            }
        }
    }

    /// A receipt with the kernel's extra members (latency, policy verdict,
    /// approval): the value path, for refusals and every receipt that is not
    /// a dispatched command's.
    pub(crate) fn receipt(
        &self,
        ctx: &Ctx,
        capability_id: &str,
        resource: Option<&str>,
        status: Status,
        output: Option<Value>,
        error: Option<Refusal>,
    ) -> Receipt {
        let mut r = self.receipt_base(ctx, capability_id, resource, status, output, error);
        r.extra.insert(
            "latency_us".into(),
            json!(ctx.t0.elapsed().as_micros() as u64),
        );
        if let Some(p) = ctx.policy.get() {
            r.extra.insert("policy".into(), Value::clone(p));
        }
        if let Some(id) = ctx.approval.get() {
            r.extra.insert("approval_id".into(), json!(id));
        }
        r
    }

    /// The typed receipt without extra members.
    fn receipt_base(
        &self,
        ctx: &Ctx,
        capability_id: &str,
        resource: Option<&str>,
        status: Status,
        output: Option<Value>,
        error: Option<Refusal>,
    ) -> Receipt {
        let dev = &self.inner.devices[ctx.device];
        Receipt {
            receipt_id: ids::mint("rcpt_"),
            command_id: ctx.command_id.clone(),
            device_id: dev.id().to_owned(),
            capability_id: capability_id.to_owned(),
            resource: resource.map(str::to_owned),
            status,
            output,
            error,
            input_digest: ctx.digest.clone(),
            state_revision_before: None,
            state_revision_after: None,
            decision: ctx
                .policy
                .get()
                .and_then(|p| p.get("decision"))
                .and_then(Value::as_str)
                .map(|d| match d {
                    "allow" => "allow",
                    "hold" => "hold",
                    _ => "deny",
                }),
            mode: dev.spec.manifest.mode.as_str(),
            accepted_at_ms: ctx.accepted_at_ms,
            completed_at_ms: now_ms(),
            extra: Map::new(),
        }
    }

    async fn reject_binding(&self, ctx: &Ctx, refusal: Refusal) -> Value {
        let b = &self.inner.devices[ctx.device].spec.bindings[ctx.binding];
        let (cap, res) = (b.capability_id.clone(), b.resource.clone());
        let rev = self.inner.devices[ctx.device].revision(&res);
        let mut v = self.reject(ctx, &cap, Some(&res), refusal).await;
        v["state_revision_before"] = json!(rev);
        v["state_revision_after"] = json!(rev);
        v
    }

    /// A rejected receipt: evidence, never the recorded outcome of its id.
    pub(crate) async fn reject(
        &self,
        ctx: &Ctx,
        capability_id: &str,
        resource: Option<&str>,
        refusal: Refusal,
    ) -> Value {
        let receipt = self.receipt(
            ctx,
            capability_id,
            resource,
            Status::Rejected,
            None,
            Some(refusal),
        );
        let wire = receipt.into_json();
        let commit = Commit {
            events: vec![EventDraft {
                kind: "command.rejected".into(),
                body: json!({"receipt": wire, "principal": ctx.principal.to_json(), "session_id": ctx.session_id}).into(),
            }],
            ..Commit::default()
        };
        if let Err(e) = self.commit_for(ctx, commit).await {
            tracing::warn!(error = %e, "rejection evidence could not be made durable");
        }
        wire
    }

    /// Commits one of a command's records and waits until it is durable,
    /// taking the surface's rider along if it still waits (see [`Rider`]).
    async fn commit_for(&self, ctx: &Ctx, mut commit: Commit) -> Result<CommitAck, StoreError> {
        let boarded = ctx.rider.as_ref().and_then(|r| r.board(&mut commit));
        let durable = self.commit(commit).await;
        Boarded::land_opt(boarded, &durable);
        durable
    }

    /// [`Kernel::commit_for`] for a commit the caller still needs afterwards.
    async fn commit_ref_for(
        &self,
        ctx: &Ctx,
        commit: &mut Commit,
    ) -> Result<CommitAck, StoreError> {
        let boarded = ctx.rider.as_ref().and_then(|r| r.board(commit));
        let durable = self.commit_ref(commit).await;
        Boarded::land_opt(boarded, &durable);
        durable
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

enum DriverOutcome {
    Returned(Result<Value, Signal>),
    InterlockOpened(Result<Value, Signal>, Value),
    DeadlineCancelled(Result<Value, Signal>),
    Abandoned,
}

fn classify(
    outcome: DriverOutcome,
    output_schema: Option<&jsonschema::Validator>,
) -> (Status, Option<Value>, Option<Refusal>) {
    match outcome {
        DriverOutcome::Returned(Ok(out)) | DriverOutcome::DeadlineCancelled(Ok(out)) => {
            if output_schema.is_none_or(|v| v.is_valid(&out)) {
                (Status::Completed, Some(out), None)
            } else {
                (Status::Failed, None, Some(Refusal::new(Code::AdapterOutputInvalid, "the driver output does not match the output schema", json!({"reason": "output_invalid"}))))
            }
        }
        DriverOutcome::Returned(Err(s)) => signal_outcome(s),
        DriverOutcome::InterlockOpened(result, open) => (
            if result.is_ok() { Status::Failed } else { Status::Cancelled },
            None,
            Some(Refusal::new(
                Code::SafetyInterlockOpen,
                "a gating interlock opened during the operation, which was stopped",
                json!({"reason": "opened_during_operation", "interlocks": open}),
            )),
        ),
        DriverOutcome::DeadlineCancelled(Err(_)) => (Status::Failed, None, Some(Refusal::new(Code::OutcomeTimeout, "the deadline passed during the operation; it was cancelled", json!({"reason": "deadline_exceeded_during_dispatch"})))),
        DriverOutcome::Abandoned => (Status::Unknown, None, Some(Refusal::new(Code::OutcomeUnknown, "the deadline passed and the driver did not confirm cancellation; read the device before acting again", json!({"reason": "deadline_exceeded_cancel_unconfirmed"})))),
    }
}

fn signal_outcome(s: Signal) -> (Status, Option<Value>, Option<Refusal>) {
    match s {
        Signal::Cancelled => (
            Status::Cancelled,
            None,
            Some(Refusal::new(
                Code::OutcomeCancelled,
                "the operation was cancelled",
                json!({"reason": "cancelled"}),
            )),
        ),
        Signal::Failed { reason, message } => (
            Status::Failed,
            None,
            Some(Refusal::new(
                Code::AdapterDriverFailed,
                message,
                json!({"reason": reason}),
            )),
        ),
        Signal::Busy => (
            Status::Rejected,
            None,
            Some(Refusal::new(
                Code::DeviceBusy,
                "the device refused the call; nothing was actuated",
                json!({"reason": "driver_busy"}),
            )),
        ),
        Signal::OutcomeUnknown { message } => (
            Status::Unknown,
            None,
            Some(Refusal::new(
                Code::OutcomeUnknown,
                message,
                json!({"reason": "driver_outcome_unknown"}),
            )),
        ),
    }
}

fn signal_text(s: &Signal) -> String {
    match s {
        Signal::Cancelled => "cancelled".into(),
        Signal::Failed { message, .. } => message.clone(),
        Signal::Busy => "busy".into(),
        Signal::OutcomeUnknown { message } => message.clone(),
    }
}

fn replayed(mut r: Value) -> Value {
    r["replayed"] = json!(true);
    r
}

/// Step 6, hybrid authority: a model-controlled principal (an agent) never
/// commands a resource the physical side of a hybrid device drives.
fn check_authority(dev: &DeviceRt, b: &BindingSpec, p: &Principal) -> Result<(), Refusal> {
    if dev.spec.manifest.mode != Mode::Hybrid || !Kernel::is_effectful(b) || b.is_stop() {
        return Ok(());
    }
    let authority = dev
        .spec
        .manifest
        .resources
        .iter()
        .find(|r| r.id == b.resource)
        .and_then(|r| r.authority)
        .unwrap_or(tether_core::manifest::Authority::Hardware);
    if authority == tether_core::manifest::Authority::Hardware
        && p.kind == crate::PrincipalKind::Agent
    {
        return Err(Refusal::new(
            Code::SafetyEnvelopeViolation,
            format!(
                "resource `{}` of hybrid device `{}` is driven by its hardware side; a model may read it but not command it",
                b.resource,
                dev.id()
            ),
            json!({"authority": authority.as_str(), "resource": b.resource, "reason": "hardware_authority"}),
        ));
    }
    Ok(())
}

/// Step 6, arming: hardware actuation needs an armed device. Stops are
/// never refused for it (a stop makes things safer).
fn check_armed(dev: &DeviceRt, b: &BindingSpec) -> Result<(), Refusal> {
    if !dev.spec.manifest.mode.is_physical() || !Kernel::is_effectful(b) || b.is_stop() {
        return Ok(());
    }
    if dev.armed.load(Ordering::SeqCst) {
        return Ok(());
    }
    Err(Refusal::new(
        Code::AuthHardwareDisabled,
        format!(
            "device `{}` is not armed; an operator arms it (mhs.safety.arm, tether arm)",
            dev.id()
        ),
        json!({"reason": "not_armed", "device_id": dev.id()}),
    ))
}

/// CORE-061: a deadline that passed during the checks is
/// `deadline_exceeded_before_dispatch`, wherever it passed (`waiting` says
/// where: the checks, or the wait for the device lock).
fn timeout_refusal(waiting: &str) -> Refusal {
    Refusal::new(
        Code::OutcomeTimeout,
        "the deadline passed before dispatch; nothing was dispatched",
        json!({"reason": "deadline_exceeded_before_dispatch", "while": waiting}),
    )
}

pub(crate) fn latched_refusal(dev: &DeviceRt) -> Refusal {
    let info = dev.latch.lock().map(|l| l.clone()).unwrap_or_default();
    Refusal::new(
        Code::SafetyEstopEngaged,
        format!(
            "device `{}` is latched by an e-stop; an operator must reset it",
            dev.id()
        ),
        json!({"device_id": dev.id(), "latched_since_ms": info.since_ms, "latch_reason": info.reason}),
    )
}

/// What a `command_id` is bound to: the principal, the binding and the
/// input (its digest). The same id with the same key replays; with another
/// key — other input, another binding, or another principal — it is a reuse:
/// one principal never receives another's receipt by guessing its id.
fn idempotency_key(
    principal_id: &str,
    device_id: &str,
    capability_id: &str,
    resource: &str,
    digest: &str,
) -> String {
    format!("{device_id}/{capability_id}/{resource}/{digest}@{principal_id}")
}

fn resolve(dev: &DeviceRt, capability_id: &str, resource: Option<&str>) -> Resolve {
    let matches: Vec<(usize, &BindingSpec)> = dev
        .spec
        .bindings
        .iter()
        .enumerate()
        .filter(|(_, b)| b.capability_id == capability_id)
        .collect();
    if matches.is_empty() {
        return Resolve::Unknown;
    }
    match resource {
        Some(r) => matches.iter().find(|(_, b)| b.resource == r).map_or_else(
            || Resolve::NotBound(matches.iter().map(|(_, b)| b.resource.clone()).collect()),
            |(i, _)| Resolve::Found(*i),
        ),
        None if matches.len() == 1 => Resolve::Found(matches[0].0),
        None => {
            Resolve::ResourceRequired(matches.iter().map(|(_, b)| b.resource.clone()).collect())
        }
    }
}

fn check_schema(
    served: &jsonschema::Validator,
    class: Option<&jsonschema::Validator>,
    input: &Value,
) -> Result<(), Refusal> {
    let mut errors = Vec::new();
    for v in std::iter::once(served).chain(class) {
        for e in v.iter_errors(input).take(SCHEMA_ERRORS_MAX) {
            errors.push(json!({"path": e.instance_path.to_string(), "message": e.to_string()}));
        }
        if !errors.is_empty() {
            break;
        }
    }
    if errors.is_empty() {
        return Ok(());
    }
    let first = errors[0]["message"]
        .as_str()
        .unwrap_or("invalid")
        .to_owned();
    Err(Refusal::new(
        Code::CapabilityInputInvalid,
        format!("input does not match the served schema: {first}"),
        json!({"errors": errors}),
    ))
}

/// CORE-022: unknown keys are `FIELD_UNKNOWN`, readOnly keys `NOT_WRITABLE`,
/// at any depth of the state schema.
fn check_configure_fields(dev: &DeviceRt, resource: &str, patch: &Value) -> Result<(), Refusal> {
    let Some(r) = dev
        .spec
        .manifest
        .resources
        .iter()
        .find(|r| r.id == resource)
    else {
        return Err(Refusal::new(
            Code::ResourceNotWritable,
            "resource not declared",
            json!({"reason": "resource_unknown"}),
        ));
    };
    let Value::Object(patch) = patch else {
        return Err(Refusal::new(
            Code::CapabilityInputInvalid,
            "a write patch must be a JSON object",
            json!({"errors": [{"path": "", "message": "not an object"}]}),
        ));
    };
    let report = crate::fields::FieldReport::of(&r.state_schema, patch);
    if report.read_only_root || report.unresolvable_ref || report.too_deep {
        let (reason, why) = if report.read_only_root {
            ("read_only", "the resource's state schema is read-only")
        } else if report.unresolvable_ref {
            (
                "unresolvable_ref",
                "the state schema has a $ref that resolves to nothing",
            )
        } else {
            (
                "patch_too_deep",
                "the patch nests deeper than the field check walks",
            )
        };
        return Err(Refusal::new(
            Code::ResourceNotWritable,
            format!("not writable: {why}"),
            json!({"fields": patch.keys().collect::<Vec<_>>(), "reason": reason}),
        ));
    }
    if !report.unknown.is_empty() {
        return Err(Refusal::new(
            Code::ResourceFieldUnknown,
            format!("unknown field(s): {}", report.unknown.join(", ")),
            json!({"fields": report.unknown}),
        ));
    }
    if !report.read_only.is_empty() {
        return Err(Refusal::new(
            Code::ResourceNotWritable,
            format!("read-only field(s): {}", report.read_only.join(", ")),
            json!({"fields": report.read_only, "reason": "read_only"}),
        ));
    }
    Ok(())
}

/// Indexes of the interlocks that gate this binding.
fn gating_interlocks(dev: &DeviceRt, b: &BindingSpec) -> Vec<usize> {
    dev.spec
        .manifest
        .interlocks
        .iter()
        .enumerate()
        .filter(|(_, il)| {
            il.required_for.as_ref().is_some_and(|keys| {
                keys.iter()
                    .any(|k| catalogue::key_matches(k, &b.capability_id))
            })
        })
        .map(|(i, _)| i)
        .collect()
}

/// The gating interlocks that do not read closed (unknown counts as open).
fn open_interlocks(dev: &DeviceRt, gating: &[usize]) -> Vec<Value> {
    dev.interlock_readings()
        .iter()
        .filter(|(i, s)| gating.contains(i) && *s != InterlockState::Closed)
        .map(|(i, s)| {
            let il = &dev.spec.manifest.interlocks[*i];
            json!({"id": il.id, "state": s.as_str(), "description": il.description})
        })
        .collect()
}

pub(crate) fn check_interlocks(dev: &DeviceRt, b: &BindingSpec) -> Result<(), Refusal> {
    let gating = gating_interlocks(dev, b);
    if gating.is_empty() {
        return Ok(());
    }
    let open = open_interlocks(dev, &gating);
    if open.is_empty() {
        return Ok(());
    }
    Err(Refusal::new(
        Code::SafetyInterlockOpen,
        "a gating interlock is open or unknown",
        json!({"interlocks": open}),
    ))
}

#[allow(dead_code)]
fn verb_name(v: Verb) -> &'static str {
    v.as_str()
}

/// The receipt back out of a receipt commit built by `finish`: the `receipt`
/// member of its only event.
fn take_receipt(commit: Commit) -> Value {
    // The receipt's entry, wherever a rider put it.
    let at = commit.receipts.first().map_or(0, |r| r.event);
    let receipt = commit
        .events
        .into_iter()
        .nth(at)
        .and_then(|e| match e.body {
            EventBody::Value(Value::Object(mut m)) => m.remove("receipt"),
            _ => None,
        });
    debug_assert!(receipt.is_some(), "a receipt commit holds its receipt");
    receipt.unwrap_or(Value::Null)
}

/// Where a dispatched command's admission decision is recorded.
#[derive(Clone, Copy)]
enum Admission {
    /// In its own entry before dispatch (a physical call, or one that drew a
    /// budget), or not at all (a read binding): the receipt's entry names
    /// the caller.
    Recorded,
    /// With the receipt, in one entry (a simulated call): the admission part
    /// keeps only what the receipt lacks. Holds the binding's risk class.
    WithReceipt(&'static str),
}

/// The evidence entry of a dispatched command's receipt, and the receipt's
/// canonical text when the entry was written as text (the common case). A
/// document the canonical writer refuses (nested past the evidence bound)
/// takes the value path, where the store refuses it as before.
fn receipt_event(
    ctx: &Ctx,
    receipt: Receipt,
    latency_us: u64,
    op_id: &str,
    admission: Admission,
) -> (EventDraft, Option<CanonicalText>) {
    const KIND: &str = "command.receipt";
    let extras = ReceiptExtras {
        latency_us,
        policy: ctx.policy.get().map(|p| &**p),
        approval_id: ctx.approval.get().map(String::as_str),
        operation_id: Some(op_id),
    };
    if let Ok(text) = write_receipt(&receipt, &extras) {
        if let Some(body) = receipt_body_text(ctx, &text, admission) {
            let body = CanonicalBody::new(body, Some(ctx.command_id.clone()));
            let event = EventDraft {
                kind: KIND.into(),
                body: EventBody::Canonical(body),
            };
            return (event, Some(text));
        }
    }
    let mut wire = receipt.into_json();
    if let Value::Object(m) = &mut wire {
        m.insert("latency_us".into(), json!(latency_us));
        if let Some(p) = extras.policy {
            m.insert("policy".into(), p.clone());
        }
        if let Some(id) = extras.approval_id {
            m.insert("approval_id".into(), json!(id));
        }
        m.insert("operation_id".into(), json!(op_id));
    }
    // Answered now and replayed later from the chain: both must be the same
    // document, so numbers take their canonical form here.
    canonical::normalize_numbers(&mut wire);
    let mut body = Map::with_capacity(3);
    match admission {
        Admission::WithReceipt(risk) => {
            body.insert(
                "admission".into(),
                json!({"decision": "allow", "principal": ctx.principal.to_json(), "session_id": ctx.session_id, "risk": risk}),
            );
        }
        Admission::Recorded => {
            body.insert("principal".into(), ctx.principal.to_json());
            body.insert("session_id".into(), json!(ctx.session_id));
        }
    }
    body.insert("receipt".into(), wire);
    let event = EventDraft {
        kind: KIND.into(),
        body: Value::Object(body).into(),
    };
    (event, None)
}

/// The canonical body of a receipt entry around the receipt's text: the
/// same members the value path writes.
fn receipt_body_text(
    ctx: &Ctx,
    receipt_text: &CanonicalText,
    admission: Admission,
) -> Option<CanonicalText> {
    use tether_store::canonical::{object_text, Member};
    let principal = object_text(
        &mut [
            ("id", Member::Str(&ctx.principal.id)),
            ("kind", Member::Str(ctx.principal.kind.as_str())),
        ],
        1,
    )
    .ok()?;
    let session = ctx.session_id.as_deref().map_or(Member::Null, Member::Str);
    match admission {
        Admission::WithReceipt(risk) => {
            let part = object_text(
                &mut [
                    ("decision", Member::Str("allow")),
                    ("principal", Member::Canonical(&principal)),
                    ("risk", Member::Str(risk)),
                    ("session_id", session),
                ],
                1,
            )
            .ok()?;
            object_text(
                &mut [
                    ("admission", Member::Canonical(&part)),
                    ("receipt", Member::Canonical(receipt_text)),
                ],
                1,
            )
            .ok()
        }
        Admission::Recorded => object_text(
            &mut [
                ("principal", Member::Canonical(&principal)),
                ("receipt", Member::Canonical(receipt_text)),
                ("session_id", session),
            ],
            1,
        )
        .ok(),
    }
}

/// A value a budget cannot draw from (not a number, a sum that is not
/// finite, too many values): refused with the same violation details as a
/// bound's, so a caller can correct it the same way.
fn budget_draw_refusal(
    rule: &tether_limits::BudgetRule,
    e: &tether_limits::budget::DrawError,
) -> Refusal {
    let (path, value) = match e {
        tether_limits::budget::DrawError::NotANumber { path, value } => {
            (path.clone(), value.clone())
        }
        _ => (rule.path.to_string(), Value::Null),
    };
    let violation = json!({"path": path, "kind": "type", "bound": rule.limit, "value": value, "unit": rule.unit, "source": rule.source, "limit_path": rule.path.to_string()});
    let mut details = violation.clone();
    details["violations"] = json!([violation]);
    details["truncated"] = json!(false);
    details["window"] = json!(rule.window.as_str());
    Refusal::new(
        Code::SafetyEnvelopeViolation,
        format!("budget path: {e}"),
        details,
    )
}
