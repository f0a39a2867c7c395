//! What callers hand the kernel: the requests of each verb, the options of a
//! command, and the two error shapes a surface answers with.
//!
//! **Owns:** the kernel's public request and error types, and the one
//! deadline bound ([`DEADLINE_MS_MAX`]).
//! **Never belongs here:** parsing them from a wire (`tether-server` does, and
//! refuses unknown fields there).

use crate::dispatch::rider::Rider;
use crate::driver::CancelToken;
use crate::kernel::Principal;
use serde_json::{json, Value};
use std::time::Duration;
use tether_core::Code;

/// A refusal answered as an error of the surface's protocol (not a receipt):
/// envelope, session and device-resolution failures.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// Registry code.
    pub code: Code,
    /// One line for people.
    pub message: String,
    /// Structured details (object).
    pub details: Value,
}

impl ApiError {
    /// An error with details.
    pub fn new(code: Code, message: impl Into<String>, details: Value) -> Self {
        Self {
            code,
            message: message.into(),
            details,
        }
    }
    /// An invalid-params error with a reason.
    pub fn invalid_params(reason: &str, message: impl Into<String>) -> Self {
        Self::new(
            Code::ProtocolInvalidParams,
            message,
            json!({"reason": reason}),
        )
    }
}

/// Longest deadline a caller may give a command, ms (one day). The surfaces
/// refuse a longer `deadline_ms`; the kernel refuses a longer `deadline`.
pub const DEADLINE_MS_MAX: u64 = 86_400_000;

/// A caller's `deadline_ms` as a deadline, or `None` when it is outside
/// `1..=DEADLINE_MS_MAX`.
pub fn deadline_from_ms(ms: u64) -> Option<Duration> {
    (1..=DEADLINE_MS_MAX)
        .contains(&ms)
        .then(|| Duration::from_millis(ms))
}

/// Which method a command came through; it decides how its binding is found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `mhs.command` (and a tool call): the named capability of the device.
    Command,
    /// `mhs.resource.write`: the `cap.device.configure.v1` binding of the
    /// named resource (a configure command).
    Write,
}

/// `mhs.command` and `mhs.resource.write`.
#[derive(Debug, Clone)]
pub struct CommandRequest {
    /// Which method: decides how the binding is found.
    pub route: Route,
    /// Session.
    pub session_id: Option<String>,
    /// Device.
    pub device_id: String,
    /// Capability id (for a write: empty or `cap.device.configure.v1`).
    pub capability_id: String,
    /// Resource (required when the class is bound to several, and for a write).
    pub resource: Option<String>,
    /// Input (for a write: the patch).
    pub input: Value,
    /// Idempotency key; minted when absent.
    pub command_id: Option<String>,
    /// Time budget from arrival, at most [`DEADLINE_MS_MAX`].
    pub deadline: Option<Duration>,
    /// Optimistic concurrency.
    pub expected_revision: Option<u64>,
    /// A single-use safe-place grant from an operator: lets this exact
    /// safe-place command (e.g. park) run while the device is latched.
    pub safe_place_grant: Option<String>,
    /// A permit from `mhs.safety.permit`, bound to this exact command.
    pub permit_id: Option<String>,
}

/// What a surface hands the kernel along with a command, beside the request.
#[derive(Debug)]
pub struct CommandOptions {
    /// The command's cancellation: the surface keeps a clone to cancel it
    /// before its operation id is known (the REST gateway answers before
    /// dispatch). Cancelled before dispatch, the command is refused
    /// (`MHS.OUTCOME.CANCELLED`, nothing dispatched); after, cancellation is
    /// cooperative as for any operation. Stop-class and safe-state commands
    /// ignore it: a stop is never cancelled.
    pub cancel: CancelToken,
    /// Fires once the command has passed steps 2 to 11 and goes on to
    /// dispatch; dropped unfired when it is refused before that (or answered
    /// by a replay). Tells an admitted command from a refused one by the real
    /// evaluation, not a dry run.
    pub on_admit: Option<tokio::sync::oneshot::Sender<()>>,
    /// A record of the surface's to write in the command's first durable
    /// commit (see [`Rider`]).
    pub rider: Option<Rider>,
}

impl CommandOptions {
    /// No token kept by the caller, no admission signal, no rider: a caller
    /// that waits for the answer and never cancels.
    pub fn plain() -> Self {
        Self::cancellable(CancelToken::new())
    }

    /// The caller keeps `cancel` (a clone of it) to cancel the command.
    pub fn cancellable(cancel: CancelToken) -> Self {
        Self {
            cancel,
            on_admit: None,
            rider: None,
        }
    }
}

/// The store could not make a record durable or read it back; the text is
/// the store's reason. A surface reports it; it never retries an effect on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvidenceFault(pub String);

impl std::fmt::Display for EvidenceFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// `mhs.resource.read`.
#[derive(Debug, Clone)]
pub struct ReadRequest {
    /// Session.
    pub session_id: Option<String>,
    /// Device.
    pub device_id: String,
    /// Resource.
    pub resource: String,
}

/// `mhs.session.open`.
#[derive(Debug, Clone, Default)]
pub struct SessionOpen {
    /// Devices to grant (all when absent).
    pub device_ids: Option<Vec<String>>,
    /// Class ids, patterns, or `(capability_id, resource)` pairs; all bindings when absent.
    pub capabilities: Option<Vec<GrantRequest>>,
    /// Lifetime without heartbeat, ms.
    pub ttl_ms: Option<u64>,
}

/// One requested grant.
#[derive(Debug, Clone)]
pub enum GrantRequest {
    /// A class id or pattern: every binding it matches.
    Class(String),
    /// One binding.
    Binding {
        /// Capability id.
        capability_id: String,
        /// Resource.
        resource: String,
    },
}

/// `mhs.safety.estop`.
#[derive(Debug, Clone, Default)]
pub struct EstopRequest {
    /// Devices to stop; every device when empty.
    pub device_ids: Vec<String>,
    /// Why.
    pub reason: String,
    /// A defect of the envelope recorded with the stop (the stop is served anyway).
    pub envelope_defect: Option<String>,
    /// Who asked (unauthenticated callers are recorded as such).
    pub requested_by: Option<Principal>,
    /// The session the caller named, if any (to pick its single device).
    pub session_id: Option<String>,
    /// The caller's deadline: the answer never comes later (the stop path
    /// goes on in the background and records its own receipt).
    pub deadline: Option<std::time::Duration>,
}

/// `mhs.safety.arm` and `mhs.safety.disarm`.
#[derive(Debug, Clone)]
pub struct ArmRequest {
    /// Device (hardware or hybrid).
    pub device_id: String,
    /// Arm (`true`, operators only) or disarm (`false`, anyone).
    pub armed: bool,
    /// Why.
    pub reason: String,
}

/// `mhs.safety.reset`.
#[derive(Debug, Clone)]
pub struct ResetRequest {
    /// Session (optional for the CLI).
    pub session_id: Option<String>,
    /// Device.
    pub device_id: String,
    /// Why.
    pub reason: String,
}
