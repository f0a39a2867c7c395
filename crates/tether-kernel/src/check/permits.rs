//! Permits: single-use consent for one exact command.
//!
//! A permit is bound to the exact input digest, the binding, the session and
//! the principal; it expires; it is consumed atomically when the operation is
//! registered and given back when the command is then refused before dispatch
//! (unless an e-stop revoked it). A command on a `hardware` or `hybrid` device
//! at risk R2 or above needs one, and such a permit can only come from an
//! approval route — never from the model asking for it.
//!
//! **Owns:** `mhs.safety.permit`, the permit table, the check of a permit
//! against a command (step 10), giving a consumed permit back, revocation by
//! an e-stop and release when a session ends.
//! **Never belongs here:** the approval route that stands in for a permit
//! (`approvals/`), deciding which bindings need one beyond
//! [`permit_required`].
//! **Fail-closed rule:** a permit table that cannot be locked refuses; a
//! permit covers only its exact device, binding, input, session and
//! principal, once, before it expires; the table is bounded per principal
//! and in all (`limits.permits_per_principal_max`, `limits.permits_max`),
//! and a permit beyond either is refused `MHS.PROTOCOL.LIMIT`.

use crate::bounds::limit_refusal;
use crate::kernel::{DeviceRt, Kernel, Principal};
use crate::loader::BindingSpec;
use crate::{ApiError, CommandRequest};
use serde_json::json;
use std::collections::HashMap;
use tether_core::ids;
use tether_core::manifest::RiskClass;
use tether_core::receipt::now_ms;
use tether_core::{Code, Refusal};
use tether_store::{canonical, Commit, EventDraft};

/// Default and longest permit lifetime, ms.
const PERMIT_TTL_MS_DEFAULT: u64 = 60_000;
const PERMIT_TTL_MS_MAX: u64 = 600_000;

#[derive(Debug, Clone)]
pub(crate) struct Permit {
    device: usize,
    binding: usize,
    digest: String,
    session_id: String,
    principal_id: String,
    expires_at_ms: u64,
    used: bool,
}

/// Outstanding permits by id.
#[derive(Debug, Default)]
pub(crate) struct Permits {
    by_id: HashMap<String, Permit>,
}

/// Whether a binding's commands need a permit.
pub(crate) fn permit_required(mode_physical: bool, b: &BindingSpec) -> bool {
    let exempt = b.is_read() || b.is_stop() || b.achieves_safe_state;
    // A two-person operation runs only on the approval of two operators, in
    // every mode and at every risk (LumenFlow: denied until quorum approvals).
    let two_person = b.flags.two_person;
    !exempt && (two_person || (mode_physical && b.risk >= RiskClass::R2))
}

/// The one binding of the device a permit names: the capability, on the
/// named resource when one is named.
fn permit_binding(dev: &DeviceRt, req: &CommandRequest) -> Result<usize, ApiError> {
    let found: Vec<usize> = dev
        .spec
        .bindings
        .iter()
        .enumerate()
        .filter(|(_, b)| {
            b.capability_id == req.capability_id
                && req.resource.as_deref().is_none_or(|r| r == b.resource)
        })
        .map(|(i, _)| i)
        .collect();
    match found[..] {
        [bi] => Ok(bi),
        [] => Err(ApiError::new(
            Code::SafetyPermitInvalid,
            "the capability is not bound to that resource",
            json!({"bound_resources": dev.spec.bindings.iter().filter(|b| b.capability_id == req.capability_id).map(|b| b.resource.clone()).collect::<Vec<_>>()}),
        )),
        _ => Err(ApiError::new(
            Code::ProtocolInvalidParams,
            "the class is bound several times; name the resource",
            json!({"reason": "resource_required"}),
        )),
    }
}

impl Kernel {
    /// `mhs.safety.permit`: a permit for one exact command of the caller's
    /// session. Permits that need an approval route are refused here.
    ///
    /// # Errors
    /// Session and resolution errors; `MHS.SAFETY.APPROVAL_REQUIRED` for a
    /// hardware or hybrid binding at R2 and above.
    pub async fn permit(
        &self,
        p: &Principal,
        req: &CommandRequest,
        ttl_ms: Option<u64>,
    ) -> Result<serde_json::Value, ApiError> {
        let d = self
            .device_index(&req.device_id)
            .ok_or_else(|| self.unknown_device(&req.device_id))?;
        let dev = &self.inner.devices[d];
        let bi = permit_binding(dev, req)?;
        let sid = self.check_grant(
            p,
            req.session_id.as_deref(),
            |s| s.grants.contains(&(d, bi)),
            || json!({"device_id": req.device_id, "capability_id": req.capability_id}),
        )?;
        let b = &dev.spec.bindings[bi];
        if permit_required(dev.spec.manifest.mode.is_physical(), b) {
            return Err(ApiError::new(
                Code::SafetyApprovalRequired,
                "a permit for a hardware command at R2 or above, or for a two-person operation, comes only from an approval route: send the command itself; its refusal names an approval (details.approval_id) for operators to decide, then send the same command_id again",
                json!({"reason": "approval_route_required", "risk": b.risk.as_str(), "two_person": b.flags.two_person, "mode": dev.spec.manifest.mode.as_str(), "route": "mhs.command -> mhs.approvals.decide (operators) -> mhs.command with the same command_id"}),
            ));
        }
        let ttl = ttl_ms.unwrap_or(PERMIT_TTL_MS_DEFAULT);
        if ttl == 0 || ttl > PERMIT_TTL_MS_MAX {
            return Err(ApiError::invalid_params(
                "ttl_ms",
                "ttl_ms must be between 1 and 600000",
            ));
        }
        let digest = canonical::digest(&req.input);
        let permit_id = ids::mint_secret("permit_");
        let expires_at_ms = now_ms().saturating_add(ttl);
        self.insert_permit(
            permit_id.clone(),
            Permit {
                device: d,
                binding: bi,
                digest: digest.clone(),
                session_id: sid.clone(),
                principal_id: p.id.clone(),
                expires_at_ms,
                used: false,
            },
        )?;
        self.record(Commit {
            events: vec![EventDraft { kind: "safety.permit".into(), body: json!({"device_id": dev.id(), "capability_id": b.capability_id, "resource": b.resource, "input_digest": digest, "session_id": sid, "principal": p.to_json(), "expires_at_ms": expires_at_ms}).into() }],
            ..Commit::default()
        });
        Ok(
            json!({"permit_id": permit_id, "device_id": dev.id(), "capability_id": b.capability_id, "resource": b.resource, "input_digest": digest, "expires_at_ms": expires_at_ms, "single_use": true}),
        )
    }

    /// Adds a permit to the table, after dropping the expired and used
    /// ones; refused (`MHS.PROTOCOL.LIMIT`) when the principal, or the
    /// endpoint, already holds its bound of outstanding permits.
    fn insert_permit(&self, permit_id: String, permit: Permit) -> Result<(), ApiError> {
        let mut permits = self.inner.permits.lock().map_err(|_| {
            ApiError::new(
                Code::ProtocolInternal,
                "permit table unavailable",
                json!({}),
            )
        })?;
        let now = now_ms();
        permits
            .by_id
            .retain(|_, x| x.expires_at_ms > now && !x.used);
        let config = &self.inner.config;
        let mine = permits
            .by_id
            .values()
            .filter(|x| x.principal_id == permit.principal_id)
            .count();
        let refusal = if mine >= config.permits_per_principal_max {
            Some(limit_refusal(
                "this principal already holds its bound of outstanding permits",
                "permits_per_principal_full",
                Some("limits.permits_per_principal_max"),
                config.permits_per_principal_max,
            ))
        } else if permits.by_id.len() >= config.permits_max {
            Some(limit_refusal(
                "the endpoint holds its bound of outstanding permits",
                "permits_full",
                Some("limits.permits_max"),
                config.permits_max,
            ))
        } else {
            None
        };
        if let Some(r) = refusal {
            return Err(ApiError::new(r.code, r.message, r.details));
        }
        permits.by_id.insert(permit_id, permit);
        Ok(())
    }

    /// Checks a permit against this exact command; `consume` marks it used.
    pub(crate) fn check_permit(
        &self,
        permit_id: &str,
        ctx: &crate::order::Ctx,
        consume: bool,
    ) -> Result<(), Refusal> {
        let invalid = |why: &str| {
            Refusal::new(
                Code::SafetyPermitInvalid,
                format!("the permit is not valid for this command: {why}"),
                json!({"reason": why}),
            )
        };
        let mut permits = self
            .inner
            .permits
            .lock()
            .map_err(|_| invalid("permit_table_unavailable"))?;
        let x = permits
            .by_id
            .get_mut(permit_id)
            .ok_or_else(|| invalid("unknown"))?;
        if x.used {
            return Err(invalid("used"));
        }
        if x.expires_at_ms <= now_ms() {
            return Err(invalid("expired"));
        }
        if x.device != ctx.device || x.binding != ctx.binding {
            return Err(invalid("other_binding"));
        }
        if x.digest != ctx.digest {
            return Err(invalid("other_input"));
        }
        if ctx.session_id.as_deref() != Some(x.session_id.as_str())
            || x.principal_id != ctx.principal.id
        {
            return Err(invalid("other_session_or_principal"));
        }
        if consume {
            x.used = true;
        }
        Ok(())
    }

    /// Gives a consumed permit back (the command was refused before dispatch).
    pub(crate) fn give_back_permit(&self, permit_id: &str) {
        if let Ok(mut permits) = self.inner.permits.lock() {
            if let Some(x) = permits.by_id.get_mut(permit_id) {
                x.used = false;
            }
        }
    }

    /// An e-stop revokes every permit of the device.
    pub(crate) fn revoke_permits(&self, d: usize) -> usize {
        self.inner
            .permits
            .lock()
            .map(|mut p| {
                let before = p.by_id.len();
                p.by_id.retain(|_, x| x.device != d);
                before - p.by_id.len()
            })
            .unwrap_or(0)
    }

    /// A session's end releases its permits.
    pub(crate) fn release_session_permits(&self, sid: &str) {
        if let Ok(mut p) = self.inner.permits.lock() {
            p.by_id.retain(|_, x| x.session_id != sid);
        }
    }
}
