//! Single-use safe-place grants.
//!
//! While a device is latched, nothing effectful runs. An operator may still
//! need to move it to its safe place (park an arm). A safe-place grant lets
//! exactly one command run while latched: on one safe-place binding, with the
//! exact input it names, within 60 s. Only an authenticated operator may
//! grant; the grant is consumed atomically with the latch re-check when the
//! operation is registered.

use crate::kernel::{Kernel, Principal};
use crate::ApiError;
use serde_json::{json, Value};
use std::collections::HashMap;
use tether_core::ids;
use tether_core::receipt::now_ms;
use tether_core::{Code, Refusal};
use tether_store::{canonical, Commit, EventDraft};

/// How long a grant is valid, ms.
pub const SAFE_PLACE_GRANT_TTL_MS: u64 = 60_000;
/// Most outstanding grants at once.
const GRANTS_MAX: usize = 1024;
/// Most outstanding grants of one operator: one operator never takes every
/// grant from the others.
const GRANTS_PER_PRINCIPAL_MAX: usize = 64;
const _: () = assert!(crate::bounds::per_principal_fits(
    GRANTS_PER_PRINCIPAL_MAX,
    GRANTS_MAX
));

#[derive(Debug, Clone)]
pub(crate) struct Grant {
    device: usize,
    binding: usize,
    digest: String,
    expires_at_ms: u64,
    principal_id: String,
}

/// Outstanding grants by id.
#[derive(Debug, Default)]
pub(crate) struct Grants {
    by_id: HashMap<String, Grant>,
}

/// Why one more grant of `principal` may not be made now, if it may not:
/// the operator, or the endpoint, holds its bound (`MHS.PROTOCOL.LIMIT`).
fn grants_bound(grants: &Grants, principal: &str) -> Option<Refusal> {
    let mine = grants
        .by_id
        .values()
        .filter(|g| g.principal_id == principal)
        .count();
    if mine >= GRANTS_PER_PRINCIPAL_MAX {
        return Some(crate::bounds::limit_refusal(
            "this operator already holds its bound of outstanding safe-place grants",
            "grants_per_principal_full",
            None,
            GRANTS_PER_PRINCIPAL_MAX,
        ));
    }
    (grants.by_id.len() >= GRANTS_MAX).then(|| {
        crate::bounds::limit_refusal(
            "the endpoint holds its bound of outstanding safe-place grants",
            "grants_full",
            None,
            GRANTS_MAX,
        )
    })
}

impl Kernel {
    /// `mhs.safety.grant_safe_place`: an operator lets one exact safe-place
    /// command run while the device is latched.
    ///
    /// # Errors
    /// Not an operator (`MHS.AUTH.FORBIDDEN`), unknown device or binding, a
    /// binding that is not a catalogued safe-place class.
    pub fn grant_safe_place(
        &self,
        p: &Principal,
        device_id: &str,
        capability_id: &str,
        resource: Option<&str>,
        input: &Value,
    ) -> Result<Value, ApiError> {
        if !p.operator {
            return Err(ApiError::new(
                Code::AuthForbidden,
                "only an authenticated operator may grant a safe-place command",
                json!({"reason": "operator_required"}),
            ));
        }
        let d = self
            .device_index(device_id)
            .ok_or_else(|| self.unknown_device(device_id))?;
        let dev = &self.inner.devices[d];
        let found: Vec<usize> = dev
            .spec
            .bindings
            .iter()
            .enumerate()
            .filter(|(_, b)| {
                b.capability_id == capability_id && resource.is_none_or(|r| r == b.resource)
            })
            .map(|(i, _)| i)
            .collect();
        let [bi] = found[..] else {
            return Err(ApiError::new(Code::CapabilityNotBound, "name exactly one bound safe-place binding (capability_id and, if needed, resource)", json!({"capability_id": tether_core::echo::id(capability_id), "matches": found.len()})));
        };
        let b = &dev.spec.bindings[bi];
        if !(b.catalogued && b.flags.safe_place) {
            return Err(ApiError::invalid_params(
                "not_safe_place",
                format!(
                    "`{}` is not a safe-place class",
                    tether_core::echo::id(capability_id)
                ),
            ));
        }
        let grant_id = ids::mint_secret("spg_");
        let expires_at_ms = now_ms() + SAFE_PLACE_GRANT_TTL_MS;
        let digest = canonical::digest(input);
        {
            let mut grants = self.inner.grants.lock().map_err(|_| {
                ApiError::new(Code::ProtocolInternal, "grant table unavailable", json!({}))
            })?;
            let now = now_ms();
            grants.by_id.retain(|_, g| g.expires_at_ms > now);
            if let Some(r) = grants_bound(&grants, &p.id) {
                return Err(ApiError::new(r.code, r.message, r.details));
            }
            grants.by_id.insert(
                grant_id.clone(),
                Grant {
                    device: d,
                    binding: bi,
                    digest: digest.clone(),
                    expires_at_ms,
                    principal_id: p.id.clone(),
                },
            );
        }
        self.record(Commit {
            events: vec![EventDraft { kind: "safety.safe_place_grant".into(), body: json!({"device_id": device_id, "capability_id": b.capability_id, "resource": b.resource, "input_digest": digest, "operator": p.to_json(), "expires_at_ms": expires_at_ms}).into() }],
            ..Commit::default()
        });
        Ok(
            json!({"grant_id": grant_id, "device_id": device_id, "capability_id": b.capability_id, "resource": b.resource, "input_digest": digest, "expires_at_ms": expires_at_ms, "single_use": true}),
        )
    }

    /// Checks (and, when `consume`, uses up) a grant for this exact command.
    pub(crate) fn check_grant_for(
        &self,
        grant_id: &str,
        d: usize,
        bi: usize,
        digest: &str,
        consume: bool,
    ) -> Result<(), Refusal> {
        let invalid = |why: &str| {
            Refusal::new(
                Code::SafetyEstopEngaged,
                format!("the device is latched and the safe-place grant is not valid: {why}"),
                json!({"reason": "safe_place_grant_invalid", "detail": why}),
            )
        };
        let mut grants = self
            .inner
            .grants
            .lock()
            .map_err(|_| invalid("grant table unavailable"))?;
        let g = grants
            .by_id
            .get(grant_id)
            .ok_or_else(|| invalid("unknown or already used"))?;
        if g.expires_at_ms <= now_ms() {
            grants.by_id.remove(grant_id);
            return Err(invalid("expired"));
        }
        if g.device != d || g.binding != bi {
            return Err(invalid("granted for another binding"));
        }
        if g.digest != digest {
            return Err(invalid("granted for another input"));
        }
        if consume {
            grants.by_id.remove(grant_id);
        }
        Ok(())
    }
}
