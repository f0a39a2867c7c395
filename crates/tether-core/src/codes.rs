//! The one registry of `MHS.*` error codes.
//!
//! Every refusal Tether gives names one of these codes. The table below is the
//! single source of truth: the wire (JSON-RPC `error.data.mhs_code`, receipt
//! `error.mhs_code`), the retryability flag and the generated reference page
//! `docs/ERROR_CODES.md` all come from it. Adding a code means adding a row here
//! and nowhere else.

use std::fmt;

/// A registered `MHS.*` code.
///
/// The enum is closed on purpose: a code that is not in the registry cannot be
/// produced, so no surface can invent a string the docs do not describe.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Code {
    ProtocolParseError,
    ProtocolInvalidRequest,
    ProtocolMethodNotFound,
    ProtocolInvalidParams,
    ProtocolTooLarge,
    ProtocolInternal,
    ProtocolUnsupportedMediaType,
    ProtocolLimit,
    AuthUnauthenticated,
    AuthForbidden,
    AuthHardwareDisabled,
    AuthOriginRefused,
    SessionUnknown,
    SessionExpired,
    SessionCapabilityNotGranted,
    SessionLimit,
    DeviceUnknown,
    DeviceBusy,
    DeviceUnavailable,
    CapabilityUnknown,
    CapabilityNotBound,
    CapabilityInputInvalid,
    ResourceUnknown,
    ResourceFieldUnknown,
    ResourceNotWritable,
    ConflictCommandIdReuse,
    ConflictRevision,
    ModeReadOnly,
    SafetyEstopEngaged,
    SafetyEnvelopeViolation,
    SafetyLimitsUnset,
    SafetyCumulativeLimit,
    SafetyInterlockOpen,
    SafetyPermitInvalid,
    SafetyApprovalRequired,
    SafetyResetRefused,
    SafetySafeStateUnreached,
    SafetyNotCertified,
    OutcomeTimeout,
    OutcomeCancelled,
    OutcomeUnknown,
    AdapterManifestInvalid,
    AdapterDriverFailed,
    AdapterShimFailed,
    AdapterOutputInvalid,
    EvidenceUnavailable,
    OperationUnknown,
    PolicyDenied,
    PolicyHeld,
    PolicyApprovalUnknown,
    PolicyApprovalExpired,
    PolicyApprovalClosed,
}

/// Which protocol-level family a code belongs to; decides the JSON-RPC number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Envelope and parameter errors (JSON-RPC reserved range).
    Protocol,
    /// Authentication and authorisation.
    Auth,
    /// Session lifecycle and grants.
    Session,
    /// Everything that reaches the evaluation order and gets a receipt.
    Command,
    /// Endpoint-internal failures.
    Internal,
}

/// One row of the registry.
#[derive(Debug)]
pub struct CodeInfo {
    /// The enum value.
    pub code: Code,
    /// The wire string, e.g. `MHS.SAFETY.ENVELOPE_VIOLATION`.
    pub name: &'static str,
    /// JSON-RPC `error.code` used when this code is a protocol-level error.
    pub jsonrpc: i64,
    /// Whether the same request may succeed later without being changed.
    pub retryable: bool,
    /// The family.
    pub family: Family,
    /// One sentence for people: what it means and what to do.
    pub meaning: &'static str,
}

macro_rules! registry {
    ($( $code:ident => ($name:literal, $rpc:literal, $retry:literal, $fam:ident, $meaning:literal) ),* $(,)?) => {
        /// The registry, in documentation order.
        pub const REGISTRY: &[CodeInfo] = &[
            $( CodeInfo { code: Code::$code, name: $name, jsonrpc: $rpc, retryable: $retry, family: Family::$fam, meaning: $meaning } ),*
        ];
    };
}

registry! {
    ProtocolParseError => ("MHS.PROTOCOL.PARSE_ERROR", -32700, false, Protocol, "The request is not valid JSON (or has duplicate keys, excessive nesting or a number outside the f64 range)."),
    ProtocolInvalidRequest => ("MHS.PROTOCOL.INVALID_REQUEST", -32600, false, Protocol, "The JSON is not a valid JSON-RPC 2.0 request (batches and notifications are refused)."),
    ProtocolMethodNotFound => ("MHS.PROTOCOL.METHOD_NOT_FOUND", -32601, false, Protocol, "No such method."),
    ProtocolInvalidParams => ("MHS.PROTOCOL.INVALID_PARAMS", -32602, false, Protocol, "The params are missing, of the wrong type or carry unknown members; details say which."),
    ProtocolTooLarge => ("MHS.PROTOCOL.TOO_LARGE", -32600, false, Protocol, "The request exceeds the size limit of the surface."),
    ProtocolInternal => ("MHS.PROTOCOL.INTERNAL", -32603, true, Internal, "An internal error; nothing was dispatched. Report it."),
    ProtocolUnsupportedMediaType => ("MHS.PROTOCOL.UNSUPPORTED_MEDIA_TYPE", -32600, false, Protocol, "A request body that is not `application/json` (HTTP 415): browsers send such bodies across origins without asking first, so they are never served. An e-stop among them still latches."),
    ProtocolLimit => ("MHS.PROTOCOL.LIMIT", -32015, true, Protocol, "A bound on what one caller, or the endpoint, may hold open (approvals, permits, MCP sessions, connections) is reached; nothing was done. Retry later (HTTP 429 with Retry-After); details name the bound and its value."),
    AuthUnauthenticated => ("MHS.AUTH.UNAUTHENTICATED", -32001, false, Auth, "No valid credential was presented."),
    AuthForbidden => ("MHS.AUTH.FORBIDDEN", -32003, false, Auth, "The principal may not do this (for example reset a hardware latch without the operator role)."),
    AuthHardwareDisabled => ("MHS.AUTH.HARDWARE_DISABLED", -32003, false, Command, "Hardware actuation is disabled or the device is not armed."),
    AuthOriginRefused => ("MHS.AUTH.ORIGIN_REFUSED", -32004, false, Auth, "The request's Host or Origin is not one this endpoint serves (a web page, or a DNS-rebinding name); HTTP 403. details.reason says which. An e-stop among them still latches."),
    SessionUnknown => ("MHS.SESSION.UNKNOWN", -32010, false, Session, "The session id is missing or names no session of this caller; open one with mhs.session.open."),
    SessionExpired => ("MHS.SESSION.EXPIRED", -32011, false, Session, "The session expired or was closed; open a new one."),
    SessionCapabilityNotGranted => ("MHS.SESSION.CAPABILITY_NOT_GRANTED", -32012, false, Session, "The session was not granted this binding; grants never widen after open."),
    SessionLimit => ("MHS.SESSION.LIMIT", -32013, true, Session, "Too many live sessions, on the endpoint or for this caller (a tenth of the endpoint's); close some or let them expire."),
    DeviceUnknown => ("MHS.DEVICE.UNKNOWN", -32020, false, Command, "No device with this id is served by the endpoint."),
    DeviceBusy => ("MHS.DEVICE.BUSY", -32021, true, Command, "The device is held by another exclusive operation; nothing was dispatched."),
    DeviceUnavailable => ("MHS.DEVICE.UNAVAILABLE", -32022, true, Command, "The driver cannot reach the device right now."),
    CapabilityUnknown => ("MHS.CAPABILITY.UNKNOWN", -32030, false, Command, "The capability id is not catalogued, or the device binds that class to none of its resources."),
    CapabilityNotBound => ("MHS.CAPABILITY.NOT_BOUND", -32031, false, Command, "The capability is not bound to that resource of the device; details.bound_resources lists where it is."),
    CapabilityInputInvalid => ("MHS.CAPABILITY.INPUT_INVALID", -32032, false, Command, "The input does not match the binding's served schema."),
    ResourceUnknown => ("MHS.RESOURCE.UNKNOWN", -32040, false, Command, "The device has no such resource."),
    ResourceFieldUnknown => ("MHS.RESOURCE.FIELD_UNKNOWN", -32041, false, Command, "A write names a field that is not in the resource's state schema."),
    ResourceNotWritable => ("MHS.RESOURCE.NOT_WRITABLE", -32042, false, Command, "A write names a read-only field, or the resource has no configure binding."),
    ConflictCommandIdReuse => ("MHS.CONFLICT.COMMAND_ID_REUSE", -32050, false, Command, "The command_id was already used for another input, binding or principal, or is still in flight; use a fresh id."),
    ConflictRevision => ("MHS.CONFLICT.REVISION", -32051, true, Command, "expected_revision does not match the live revision; read again and retry."),
    ModeReadOnly => ("MHS.MODE.READ_ONLY", -32060, false, Command, "The device's mode accepts no commands (replay)."),
    SafetyEstopEngaged => ("MHS.SAFETY.ESTOP_ENGAGED", -32070, false, Command, "The device is latched by an e-stop; an operator must reset it before effectful commands run."),
    SafetyEnvelopeViolation => ("MHS.SAFETY.ENVELOPE_VIOLATION", -32071, false, Command, "A value is outside the effective limits; details name the path, kind, bound, value, unit and source."),
    SafetyLimitsUnset => ("MHS.SAFETY.LIMITS_UNSET", -32072, false, Command, "The call sets a value whose bound is operator_required and no operator overlay filled it, or (hardware/hybrid, R1+) a number no limit covers."),
    SafetyCumulativeLimit => ("MHS.SAFETY.CUMULATIVE_LIMIT", -32073, false, Command, "A cumulative budget would be exceeded; details give used, limit and window."),
    SafetyInterlockOpen => ("MHS.SAFETY.INTERLOCK_OPEN", -32074, true, Command, "A gating interlock reads open or unknown."),
    SafetyPermitInvalid => ("MHS.SAFETY.PERMIT_INVALID", -32075, false, Command, "The permit is missing, expired, used or bound to another input."),
    SafetyApprovalRequired => ("MHS.SAFETY.APPROVAL_REQUIRED", -32076, false, Command, "This command needs a permit from an approval route."),
    SafetyResetRefused => ("MHS.SAFETY.RESET_REFUSED", -32077, false, Command, "The reset was refused; details.reason says why. The latch is kept."),
    SafetySafeStateUnreached => ("MHS.SAFETY.SAFE_STATE_UNREACHED", -32078, true, Command, "The stop path did not confirm the safe state; the latch stays engaged and the stop is retried."),
    SafetyNotCertified => ("MHS.SAFETY.NOT_CERTIFIED", -32079, false, Command, "Feature flag: Tether is a software envelope, not a safety-rated channel; keep an independent hardware e-stop."),
    OutcomeTimeout => ("MHS.OUTCOME.TIMEOUT", -32080, true, Command, "The deadline passed; details.reason says whether anything was dispatched."),
    OutcomeCancelled => ("MHS.OUTCOME.CANCELLED", -32081, false, Command, "The operation was cancelled (by a stop, an e-stop or a cancel request)."),
    OutcomeUnknown => ("MHS.OUTCOME.UNKNOWN", -32082, false, Command, "The effect may or may not have happened; read the device before acting again."),
    AdapterManifestInvalid => ("MHS.ADAPTER.MANIFEST_INVALID", -32090, false, Command, "The device or binding declaration is defective; details.reason says how."),
    AdapterDriverFailed => ("MHS.ADAPTER.DRIVER_FAILED", -32091, false, Command, "The driver reported a failure it understands."),
    AdapterShimFailed => ("MHS.ADAPTER.SHIM_FAILED", -32092, false, Command, "The driver failed unexpectedly; the native message is not forwarded."),
    AdapterOutputInvalid => ("MHS.ADAPTER.OUTPUT_INVALID", -32093, false, Command, "The driver returned output that does not match the class output schema."),
    EvidenceUnavailable => ("MHS.EVIDENCE.UNAVAILABLE", -32095, true, Internal, "The evidence store could not make the record durable; the command was refused or its outcome is held."),
    OperationUnknown => ("MHS.OPERATION.UNKNOWN", -32096, false, Command, "No running or recently finished operation has this id."),
    PolicyDenied => ("MHS.POLICY.DENIED", -32100, false, Command, "The control policy denies this request."),
    PolicyHeld => ("MHS.POLICY.HELD", -32101, true, Command, "The control policy holds this request for people to approve; details.approval_id names it."),
    PolicyApprovalUnknown => ("MHS.POLICY.APPROVAL_UNKNOWN", -32102, false, Command, "No approval with this id is visible to the caller."),
    PolicyApprovalExpired => ("MHS.POLICY.APPROVAL_EXPIRED", -32103, false, Command, "The approval expired before it was decided or used; send the command again under a new command_id."),
    PolicyApprovalClosed => ("MHS.POLICY.APPROVAL_CLOSED", -32104, false, Command, "The approval is already decided or used (approvals are single-use); details.status says which."),
}

impl Code {
    /// The registry row of this code.
    pub fn info(self) -> &'static CodeInfo {
        // The registry lists every variant exactly once (checked by a test), so
        // the lookup always succeeds; the fallback keeps this total anyway.
        REGISTRY
            .iter()
            .find(|row| row.code == self)
            .unwrap_or(&REGISTRY[5])
    }

    /// The wire string.
    pub fn as_str(self) -> &'static str {
        self.info().name
    }

    /// Whether retrying the same request unchanged may succeed.
    pub fn retryable(self) -> bool {
        self.info().retryable
    }

    /// JSON-RPC error number.
    pub fn jsonrpc(self) -> i64 {
        self.info().jsonrpc
    }

    /// Looks a wire string up.
    pub fn from_name(name: &str) -> Option<Code> {
        REGISTRY
            .iter()
            .find(|row| row.name == name)
            .map(|row| row.code)
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Renders the registry as the Markdown reference page (`docs/ERROR_CODES.md`).
pub fn registry_markdown() -> String {
    let mut out = String::from(
        "# Error codes\n\nGenerated from `tether-core/src/codes.rs` by `tether codes`; do not edit by hand.\n\n\
         | code | JSON-RPC | retryable | meaning |\n|---|---|---|---|\n",
    );
    for row in REGISTRY {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            row.name,
            row.jsonrpc,
            if row.retryable { "yes" } else { "no" },
            row.meaning
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn every_code_is_registered_once_with_a_unique_name() {
        let mut names = HashSet::new();
        let mut codes = HashSet::new();
        for row in REGISTRY {
            assert!(names.insert(row.name), "duplicate name {}", row.name);
            assert!(codes.insert(row.code), "duplicate code {:?}", row.code);
            assert!(row.name.starts_with("MHS."));
            assert_eq!(Code::from_name(row.name), Some(row.code));
            assert_eq!(row.code.info().name, row.name);
        }
        assert_eq!(REGISTRY[5].code, Code::ProtocolInternal);
    }
}
