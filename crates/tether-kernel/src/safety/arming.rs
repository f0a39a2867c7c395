//! Arming: `mhs.safety.arm` and `mhs.safety.disarm`, hardware actuation of
//! a hardware or hybrid device on or off (read by evaluation step 6).
//!
//! **Owns:** the arming change, its durable row and evidence entry.
//! **Never belongs here:** the arming *check* of the evaluation order
//! (`check/mode.rs`), the arming restored at start (`kernel/start.rs`).
//! **Fail-closed rule:** only an authenticated operator arms, and an arm the
//! store did not take leaves the device disarmed; a disarm only takes power
//! away, so it applies before its record and stands even when the record
//! fails.

use crate::kernel::{Kernel, Principal};
use crate::{ApiError, ArmRequest};
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use tether_core::receipt::now_ms;
use tether_core::Code;
use tether_store::{Commit, EventDraft};

impl Kernel {
    /// `mhs.safety.arm` / `mhs.safety.disarm`: hardware actuation of a
    /// hardware or hybrid device on or off (evaluation step 6). Only an
    /// authenticated operator arms; anyone may disarm (it makes things
    /// safer). The change is durable and an evidence entry before it is
    /// answered; a disarm that cannot be made durable still applies here.
    ///
    /// # Errors
    /// `DEVICE.UNKNOWN`; invalid params for a device that is not physical;
    /// `AUTH.FORBIDDEN` (`operator_required`) for an arm by anyone else;
    /// `EVIDENCE.UNAVAILABLE` for an arm the store did not take.
    pub async fn set_armed(&self, p: &Principal, req: ArmRequest) -> Result<Value, ApiError> {
        let d = self
            .device_index(&req.device_id)
            .ok_or_else(|| self.unknown_device(&req.device_id))?;
        let dev = &self.inner.devices[d];
        if !dev.spec.manifest.mode.is_physical() {
            return Err(ApiError::new(
                Code::ProtocolInvalidParams,
                format!(
                    "device `{}` is {}: it moves nothing physical and is always armed",
                    dev.id(),
                    dev.spec.manifest.mode.as_str()
                ),
                json!({"reason": "not_physical", "mode": dev.spec.manifest.mode.as_str()}),
            ));
        }
        let operator = p.kind == crate::PrincipalKind::Human && p.operator;
        if req.armed && !operator {
            return Err(ApiError::new(
                Code::AuthForbidden,
                "only an authenticated operator may arm hardware",
                json!({"reason": "operator_required"}),
            ));
        }
        let was = dev.armed.load(Ordering::SeqCst);
        let at_ms = now_ms().max(dev.arming_ms.load(Ordering::SeqCst) + 1);
        // An arm's reason over the bound is refused; a disarm only takes
        // power away, so, like an e-stop, it is never refused for its text:
        // its reason is cut.
        let max = self.inner.config.text_chars_max;
        let reason = if req.armed {
            crate::bounds::within("reason", &req.reason, max)?.to_owned()
        } else {
            crate::bounds::cut(&req.reason, max)
        };
        let commit = Commit {
            events: vec![EventDraft {
                kind: "safety.arming".into(),
                body: json!({"device_id": dev.id(), "armed": req.armed, "was_armed": was, "principal": p.to_json(), "reason": reason}).into(),
            }],
            latches: vec![crate::safety::governed::arming_row(
                dev.id(),
                req.armed,
                json!({"at_ms": at_ms, "by": p.to_json(), "reason": reason}),
            )],
            ..Commit::default()
        };
        if !req.armed {
            // A disarm applies before its record: it only takes power away.
            dev.armed.store(false, Ordering::SeqCst);
        }
        let durable = self.commit(commit).await;
        if let Err(e) = &durable {
            if req.armed {
                return Err(ApiError::new(
                    Code::EvidenceUnavailable,
                    "the arming could not be made durable; the device stays disarmed",
                    json!({"reason": "not_durable", "store_error": e.to_string()}),
                ));
            }
        }
        dev.arming_ms.fetch_max(at_ms, Ordering::SeqCst);
        dev.armed.store(req.armed, Ordering::SeqCst);
        Ok(json!({
            "device_id": dev.id(),
            "armed": req.armed,
            "changed": was != req.armed,
            "at_ms": at_ms,
            "durable": durable.is_ok(),
            "not_certified": true,
        }))
    }
}
