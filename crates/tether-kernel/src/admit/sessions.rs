//! Step 2: sessions and grants, as the kernel serves them.
//!
//! **Owns:** `mhs.session.open|heartbeat|close`, the end of a session (its
//! operations cancelled, the safe-state actions of the devices it drove), and
//! the grant check every command and read passes.
//! **Never belongs here:** the session table's bookkeeping (`session.rs`),
//! anything about the binding or the input.
//! **Fail-closed rule:** no live session of the caller, or no grant for the
//! binding, refuses; an unreadable session table refuses.

use crate::admit::session::{Session, SessionFault};
use crate::kernel::{Kernel, Principal};
use crate::{ApiError, CommandRequest, GrantRequest, SessionOpen};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use tether_core::catalogue::{self};
use tether_core::ids::{self};
use tether_core::receipt::now_ms;
use tether_core::{echo, Code};
use tether_store::{Commit, EventDraft};

/// Longest session lifetime a client may ask for, ms.
pub const SESSION_TTL_MS_MAX: u64 = 86_400_000;

pub(crate) fn session_error(fault: SessionFault, sid: &str) -> ApiError {
    match fault {
        SessionFault::Unknown => ApiError::new(
            Code::SessionUnknown,
            format!(
                "no live session `{}` for this caller; open one with mhs.session.open",
                echo::id(sid)
            ),
            json!({"session_id": echo::id(sid)}),
        ),
        SessionFault::Expired => ApiError::new(
            Code::SessionExpired,
            format!("session `{}` expired or was closed", echo::id(sid)),
            json!({"session_id": echo::id(sid)}),
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
    /// `mhs.session.open`.
    ///
    /// # Errors
    /// Unknown devices, ungrantable capabilities, a full session table.
    pub async fn session_open(&self, p: &Principal, req: SessionOpen) -> Result<Value, ApiError> {
        let grants = self.grants_asked(&req)?;
        let ttl_ms = req.ttl_ms.unwrap_or(self.inner.config.session_ttl_ms);
        if ttl_ms == 0 || ttl_ms > SESSION_TTL_MS_MAX {
            return Err(ApiError::invalid_params(
                "ttl_ms",
                format!("ttl_ms must be between 1 and {SESSION_TTL_MS_MAX}"),
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

    /// The bindings a session open asks for: of the named devices (every
    /// device when none is named), those the requested classes, patterns or
    /// exact bindings match (all when none is named).
    ///
    /// # Errors
    /// An unknown device; an exact binding bound on none of the devices.
    fn grants_asked(&self, req: &SessionOpen) -> Result<BTreeSet<(usize, usize)>, ApiError> {
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
        let mut grants = BTreeSet::new();
        for &d in &devices {
            let dev = &self.inner.devices[d];
            for (bi, b) in dev.spec.bindings.iter().enumerate() {
                let wanted = req.capabilities.as_ref().is_none_or(|list| {
                    list.iter().any(|g| match g {
                        GrantRequest::Class(k) => catalogue::key_matches(k, &b.capability_id),
                        GrantRequest::Binding {
                            capability_id,
                            resource,
                        } => capability_id == &b.capability_id && resource == &b.resource,
                    })
                });
                if wanted {
                    grants.insert((d, bi));
                }
            }
        }
        for g in req.capabilities.iter().flatten() {
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
                        format!(
                            "`{}` is not bound to resource `{}` on the requested devices",
                            echo::id(capability_id),
                            echo::id(resource)
                        ),
                        json!({"capability_id": echo::id(capability_id), "resource": echo::id(resource)}),
                    ));
                }
            }
        }
        Ok(grants)
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
    /// operations excepted) and returns them as `(operation_id, device)`,
    /// with the devices of the session's non-abortable operations, which
    /// are left to end within their lease or duration.
    pub(crate) fn cancel_session_ops(&self, sid: &str) -> (Vec<(String, usize)>, Vec<usize>) {
        let Ok(ops) = self.inner.ops.lock() else {
            return (Vec::new(), Vec::new());
        };
        let mine = ops
            .iter()
            .filter(|(_, op)| op.session_id.as_deref() == Some(sid) && !op.stop_class);
        let mut cancelled = Vec::new();
        let mut running = Vec::new();
        for (id, op) in mine {
            if op.abortable {
                op.cancel.cancel();
                cancelled.push((id.clone(), op.device));
            } else {
                running.push(op.device);
            }
        }
        (cancelled, running)
    }

    /// A session ended (closed or expired): cancel its operations and run the
    /// safe-state actions of every device it was driving (a non-abortable
    /// operation still running there included).
    pub(crate) async fn end_session(&self, sid: &str, why: &str) -> Vec<String> {
        self.release_session_permits(sid);
        let (cancelled, not_abortable) = self.cancel_session_ops(sid);
        let mut devices: Vec<usize> = cancelled.iter().map(|(_, d)| *d).collect();
        devices.extend(not_abortable);
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
            let deadline = crate::clock::after(
                Instant::now(),
                Duration::from_millis(self.inner.devices[d].estop_budget_ms()),
            );
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

    pub(crate) fn sessions_lock(
        &self,
    ) -> Result<std::sync::MutexGuard<'_, crate::admit::session::Sessions>, ApiError> {
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
        what: impl FnOnce() -> Value,
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
                what(),
            ));
        }
        Ok(sid.to_owned())
    }

    /// Step 2b: the resolved binding is granted to the caller's session.
    ///
    /// # Errors
    /// Session errors; `SESSION.CAPABILITY_NOT_GRANTED`.
    pub(crate) fn grant_step(
        &self,
        p: &Principal,
        req: &CommandRequest,
        d: usize,
        bi: usize,
    ) -> Result<String, ApiError> {
        let b = &self.inner.devices[d].spec.bindings[bi];
        self.check_grant(
            p,
            req.session_id.as_deref(),
            |s| s.grants.contains(&(d, bi)),
            || json!({"device_id": req.device_id, "capability_id": b.capability_id, "resource": b.resource}),
        )
    }
}
