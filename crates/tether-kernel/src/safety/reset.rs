//! Reset: `mhs.safety.reset`, the one way a latch is released.
//!
//! A reset releases the latch of one device when nothing forbids it, and
//! resumes nothing: a device whose stop leaves it disabled names the command
//! that re-enables it.
//!
//! **Owns:** the refusals of a reset (nothing latched, a terminal stop, a
//! newer stop tripped elsewhere, no operator for hardware, a physical
//! device's link down, a stop still in flight, an open interlock, an
//! operation still running), the durable reset
//! row, and a reset overtaken by a stop while it was being made durable.
//! **Never belongs here:** setting a latch (`estop.rs`, `governed.rs`),
//! arming (`arming.rs`).
//! **Fail-closed rule:** a reset that cannot read the shared stop, or be made
//! durable, or that a stop overtook, keeps the latch (and asserts it again
//! in the store after the reset row).

use crate::kernel::{Kernel, LatchInfo, Principal};
use crate::order::Ctx;
use crate::{ApiError, ResetRequest};
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::time::Instant;
use tether_core::ids::CommandId;
use tether_core::receipt::now_ms;
use tether_core::{Code, Refusal, Status};
use tether_store::{Commit, EventDraft, LatchRow};

/// Receipt capability id of a reset.
pub const INTERNAL_RESET: &str = "cap.internal.safety_reset.v1";

impl Kernel {
    /// `mhs.safety.reset`: releases a latch when nothing forbids it. A reset
    /// resumes nothing.
    ///
    /// # Errors
    /// Unknown device; a reason over the text bound (`text_too_long`).
    pub async fn reset(&self, p: &Principal, req: ResetRequest) -> Result<Value, ApiError> {
        let d = self
            .device_index(&req.device_id)
            .ok_or_else(|| self.unknown_device(&req.device_id))?;
        let dev = &self.inner.devices[d];
        crate::bounds::within("reason", &req.reason, self.inner.config.text_chars_max)?;
        // The session is only recorded: kept as an error would echo it.
        let session_id = req
            .session_id
            .as_deref()
            .map(|s| tether_core::echo::id(s).into_owned());
        let ctx = Ctx {
            session_id: session_id.clone(),
            ..Ctx::bare(
                d,
                CommandId::mint().as_str().to_owned(),
                p.clone(),
                (Instant::now(), now_ms()),
            )
        };
        let epoch = dev.estop_epoch.load(Ordering::SeqCst);
        if let Some(refusal) = self.reset_refusal(d, p) {
            return Ok(self.reject(&ctx, INTERNAL_RESET, None, refusal).await);
        }
        // Strictly after the latch it releases, so no process orders it before.
        let reset_at = now_ms().max(dev.latch_event_ms.load(Ordering::SeqCst) + 1);
        let commit = Commit {
            events: vec![EventDraft {
                kind: "safety.reset".into(),
                body: json!({"device_id": dev.id(), "principal": p.to_json(), "reason": req.reason, "session_id": session_id}).into(),
            }],
            latches: vec![LatchRow {
                device_id: dev.id().to_owned(),
                latched: false,
                // Whether an operator reset it travels with the row: another
                // process that serves this device as hardware releases its
                // latch only for an operator's reset.
                info: json!({"reset_by": p.to_json(), "reset_by_operator": p.kind == crate::PrincipalKind::Human && p.operator, "reset_at_ms": reset_at}),
            }],
            ..Commit::default()
        };
        if let Err(e) = self.commit(commit).await {
            let refusal = Refusal::new(
                Code::SafetyResetRefused,
                "the reset could not be made durable; the latch is kept",
                json!({"reason": "not_durable", "store_error": e.to_string(), "latched": true}),
            );
            return Ok(self.reject(&ctx, INTERNAL_RESET, None, refusal).await);
        }
        dev.latch_event_ms.fetch_max(reset_at, Ordering::SeqCst);
        // CORE-081: the latch is released only if no e-stop engaged and no
        // stop attempt started while the reset was being made durable.
        if let Some(refusal) = self.reset_overtaken(d, epoch, reset_at).await {
            return Ok(self.reject(&ctx, INTERNAL_RESET, None, refusal).await);
        }
        dev.latched.store(false, Ordering::SeqCst);
        if let Ok(mut l) = dev.latch.lock() {
            *l = LatchInfo::default();
        }
        let receipt = self.receipt(
            &ctx,
            INTERNAL_RESET,
            None,
            Status::Completed,
            // A device whose stop leaves it disabled names the command that
            // re-enables it: the reset itself never runs it (CORE-086).
            Some(match &dev.spec.manifest.safety.estop.reenable {
                Some(cap) => json!({"latched": false, "resumed": false, "reenable": cap}),
                None => json!({"latched": false, "resumed": false}),
            }),
            None,
        );
        Ok(receipt.into_json())
    }

    /// An e-stop engaged (the epoch moved) or a stop attempt started while
    /// the reset at `reset_at` was being committed: the latch is kept, and
    /// asserted again in the store after the reset row, so no process and no
    /// restart reads the device as released.
    async fn reset_overtaken(&self, d: usize, epoch: u64, reset_at: u64) -> Option<Refusal> {
        let dev = &self.inner.devices[d];
        let reason = if dev.estop_epoch.load(Ordering::SeqCst) != epoch {
            "estop_during_reset"
        } else if dev.stops_in_flight.load(Ordering::SeqCst) > 0 {
            "stop_path_pending"
        } else {
            return None;
        };
        let since = now_ms().max(reset_at + 1);
        dev.latch_event_ms.fetch_max(since, Ordering::SeqCst);
        let reassert = Commit {
            events: vec![EventDraft {
                kind: "safety.reset.overtaken".into(),
                body: json!({"device_id": dev.id(), "reason": reason, "reset_at_ms": reset_at})
                    .into(),
            }],
            latches: vec![crate::safety::governed::trip_row(
                dev.id(),
                since,
                "the latch is kept: a stop engaged while a reset was being made",
                "reset_overtaken",
            )],
            ..Commit::default()
        };
        let durable = self.commit(reassert).await.is_ok();
        Some(Refusal::new(
            Code::SafetyResetRefused,
            "a stop engaged while the reset was being made; the latch is kept",
            json!({"reason": reason, "latched": true, "stop_reasserted": true, "latch_durable": durable}),
        ))
    }

    fn reset_refusal(&self, d: usize, p: &Principal) -> Option<Refusal> {
        let dev = &self.inner.devices[d];
        if !dev.latched.load(Ordering::SeqCst) {
            return Some(Refusal::new(
                Code::SafetyResetRefused,
                "nothing is latched",
                json!({"reason": "not_latched", "latched": false}),
            ));
        }
        if dev.terminated.load(Ordering::SeqCst) {
            return Some(Refusal::new(
                Code::SafetyResetRefused,
                "the device's stop cannot be undone without a new native session; restart the endpoint to recover",
                json!({"reason": "terminal_estop", "terminal": dev.spec.manifest.safety.estop.terminal, "latched": true, "remediation": "restart the endpoint; an operator resets the restored latch"}),
            ));
        }
        // A trip made elsewhere that this process has not applied yet must not be
        // released by a reset that never saw it: read the shared stop first.
        match self.inner.store.latches() {
            Ok(rows) => {
                if let Some(ev) = crate::safety::governed::newest_event(&rows, dev.id()) {
                    if ev.latched && ev.at_ms > dev.latch_event_ms.load(Ordering::SeqCst) {
                        return Some(Refusal::new(
                            Code::SafetyResetRefused,
                            "a newer stop was tripped by another process; it is being applied",
                            json!({"reason": "newer_stop", "tripped_at_ms": ev.at_ms, "latched": true}),
                        ));
                    }
                }
            }
            Err(e) => {
                return Some(Refusal::new(
                    Code::SafetyResetRefused,
                    "the governed stop cannot be read, so the latch is kept",
                    json!({"reason": "stop_unreadable", "store_error": e.to_string(), "latched": true}),
                ));
            }
        }
        if dev.spec.manifest.mode.is_physical() && !p.operator {
            return Some(Refusal::new(
                Code::AuthForbidden,
                "only an authenticated operator may reset a hardware latch",
                json!({"reason": "operator_required", "latched": true}),
            ));
        }
        // A physical device out of reach cannot be looked at; resetting it
        // now would also end a link-loss latch before its outage did.
        if dev.spec.manifest.mode.is_physical() {
            if let Some(link) = dev.driver.link().filter(|l| !l.connected) {
                return Some(Refusal::new(
                    Code::SafetyResetRefused,
                    "the device's link is down; reset it once the link is back",
                    json!({"reason": "link_down", "link": crate::safety::link::link_json(Some(&link)), "latched": true}),
                ));
            }
        }
        // Before anything that reads the device: a native stop in flight
        // refuses at once (CORE-080; there is no override).
        if dev.stops_in_flight.load(Ordering::SeqCst) > 0 {
            return Some(Refusal::new(
                Code::SafetyResetRefused,
                "a stop attempt of the device is still running",
                json!({"reason": "stop_path_pending", "latched": true}),
            ));
        }
        let open: Vec<Value> = dev
            .interlock_readings()
            .into_iter()
            .filter(|(i, s)| {
                !dev.spec.manifest.interlocks[*i].reset_exempt
                    && *s != crate::InterlockState::Closed
            })
            .map(|(i, s)| json!({"id": dev.spec.manifest.interlocks[i].id, "state": s.as_str()}))
            .collect();
        if !open.is_empty() {
            return Some(Refusal::new(
                Code::SafetyResetRefused,
                "an interlock is open or unknown",
                json!({"reason": "interlock_open", "interlocks": open, "latched": true}),
            ));
        }
        let running: Vec<String> = self.running_on(d).into_iter().map(|(op, _)| op).collect();
        if !running.is_empty() {
            return Some(Refusal::new(
                Code::SafetyResetRefused,
                "an operation that ignored cancellation is still running",
                json!({"reason": "operation_running", "operations": running, "latched": true}),
            ));
        }
        None
    }
}
