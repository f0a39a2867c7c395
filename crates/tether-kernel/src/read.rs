//! `mhs.resource.read`: the read verb's own short order — device and
//! resource, session and grant, the policy, then the driver's read under a
//! read-only witness, recorded as evidence (queued, not awaited).
//!
//! **Never belongs here:** effectful steps (latch, limits, budgets, locks):
//! a read changes nothing, so it passes only what a read can be refused for.
//! **Fail-closed rule:** a read the policy denies, or holds, is refused and
//! recorded; a driver that cannot read answers `DEVICE.UNAVAILABLE`.

use crate::dispatch::authorized::{Authorized, CallKind};
use crate::dispatch::run::signal_text;
use crate::kernel::{Kernel, Principal};
use crate::{ApiError, ReadRequest};
use serde_json::{json, Value};
use tether_core::catalogue::{self};
use tether_core::receipt::now_ms;
use tether_core::{Code, Refusal};
use tether_store::{canonical, Commit, EventDraft};

/// `MHS.RESOURCE.UNKNOWN`, naming the caller's resource as an error may
/// echo it, and the device's resources.
fn unknown_resource(dev: &crate::kernel::DeviceRt, resource: &str) -> ApiError {
    let shown = tether_core::echo::id(resource);
    ApiError::new(
        Code::ResourceUnknown,
        format!("device `{}` has no resource `{shown}`", dev.id()),
        json!({"resource": shown, "resources": dev.spec.manifest.resources.iter().map(|r| r.id.clone()).collect::<Vec<_>>()}),
    )
}

impl Kernel {
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
            return Err(unknown_resource(dev, &req.resource));
        }
        let sid = self.check_grant(
            p,
            req.session_id.as_deref(),
            |s| {
                s.grants
                    .iter()
                    .any(|&(gd, gb)| gd == d && dev.spec.bindings[gb].resource == req.resource)
            },
            || json!({"device_id": req.device_id, "resource": req.resource}),
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
            "sampled_at": dev.driver.sampled_at_ms(&req.resource).unwrap_or_else(now_ms),
            "mode": dev.spec.manifest.mode.as_str(),
        }))
    }
}
