//! Step 2a: a command arrives — its `command_id` (parsed, or minted here),
//! its device, a live session of the caller, and when it must be done.
//!
//! **Owns:** [`Arrival`], what the order knows before the binding is found,
//! and the deadline arithmetic (checked, bounded by [`DEADLINE_MS_MAX`]).
//! **Never belongs here:** the grant of the binding (step 2b, after
//! resolution, `sessions.rs`).
//! **Fail-closed rule:** a malformed id, an unknown device, no live session
//! or a deadline out of range is a protocol error; nothing is recorded.

use crate::kernel::{Kernel, Principal};
use crate::{ApiError, CommandRequest, DEADLINE_MS_MAX};
use serde_json::json;
use std::time::{Duration, Instant};
use tether_core::canonical;
use tether_core::ids::CommandId;
use tether_core::receipt::now_ms;
use tether_core::Code;

/// A command as it arrives, before its binding is resolved.
pub(crate) struct Arrival {
    pub device: usize,
    pub command_id: String,
    /// An id the endpoint mints is new by construction (a ULID: time plus
    /// 80 random bits), so step 4 needs no look-up in the store for it.
    pub id_minted: bool,
    pub digest: String,
    pub accepted_at_ms: u64,
    pub t0: Instant,
    pub deadline: Instant,
}

impl Kernel {
    /// Step 2a.
    ///
    /// # Errors
    /// `command_id_invalid`, `DEVICE.UNKNOWN`, session errors,
    /// `deadline_invalid`.
    pub(crate) fn arrive(&self, p: &Principal, req: &CommandRequest) -> Result<Arrival, ApiError> {
        let t0 = Instant::now();
        let accepted_at_ms = now_ms();
        let command_id = match &req.command_id {
            Some(raw) => CommandId::parse(raw).map_err(|e| {
                ApiError::new(
                    Code::ProtocolInvalidParams,
                    format!("command_id: {e}"),
                    json!({"reason": "command_id_invalid"}),
                )
            })?,
            None => CommandId::mint(),
        };
        let device = self
            .device_index(&req.device_id)
            .ok_or_else(|| self.unknown_device(&req.device_id))?;
        // A live session of the caller (the grant is checked after resolution).
        self.check_grant(p, req.session_id.as_deref(), |_| true, || json!({}))?;
        Ok(Arrival {
            device,
            command_id: command_id.as_str().to_owned(),
            id_minted: req.command_id.is_none(),
            digest: canonical::digest(&req.input),
            accepted_at_ms,
            t0,
            deadline: self.deadline_from(t0, req.deadline)?,
        })
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
}
