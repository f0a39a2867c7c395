//! The params of each JSON-RPC method as strict types (unknown members are
//! refused), and how each becomes the kernel's request.
//!
//! A member that is accepted but not used (`client`, `mhs_version`, ...) is
//! kept as a field named `_…`: refusing it would break clients that send it.
//!
//! **Never belongs here:** the e-stop's params (read leniently, in
//! `estop`), and calling the kernel (in `dispatch`).

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::Duration;
use tether_core::Code;
use tether_kernel::{
    deadline_from_ms, ApiError, ArmRequest, CommandRequest, GrantRequest, ReadRequest,
    ResetRequest, Route, SessionOpen, DEADLINE_MS_MAX,
};

/// `params` as `T`, or `MHS.PROTOCOL.INVALID_PARAMS` saying why not.
pub(super) fn parse<T: DeserializeOwned>(params: Value) -> Result<T, ApiError> {
    serde_json::from_value(params).map_err(|e| {
        // The parser's message quotes what it refused (a member's name, a
        // value): the caller's text, repeated only as far as an error may.
        let message = e.to_string();
        let message = tether_core::echo::text(&message);
        ApiError::new(
            Code::ProtocolInvalidParams,
            format!("invalid params: {message}"),
            json!({"reason": "params_invalid", "message": message}),
        )
    })
}

/// A caller's `deadline_ms`, refused outside `1..=DEADLINE_MS_MAX`.
fn deadline(ms: Option<u64>) -> Result<Option<Duration>, ApiError> {
    match ms {
        None => Ok(None),
        Some(ms) => deadline_from_ms(ms).map(Some).ok_or_else(|| {
            ApiError::new(
                Code::ProtocolInvalidParams,
                format!("deadline_ms must be between 1 and {DEADLINE_MS_MAX}"),
                json!({"reason": "deadline_invalid"}),
            )
        }),
    }
}

/// `mhs.hello` and `mhs.devices.list`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HelloParams {
    #[serde(default, rename = "client")]
    _client: Option<Value>,
    #[serde(default, rename = "mhs_version")]
    _mhs_version: Option<String>,
}

/// `mhs.devices.get`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DeviceParams {
    pub device_id: String,
}

/// `mhs.safety.status`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StatusParams {
    #[serde(default)]
    pub device_id: Option<String>,
}

/// One grant asked for at `mhs.session.open`: a capability class, or a
/// class bound to one resource.
#[derive(Deserialize)]
#[serde(untagged)]
enum GrantParam {
    Class(String),
    Binding {
        capability_id: String,
        resource: String,
    },
}

/// `mhs.session.open`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct OpenParams {
    #[serde(default)]
    device_ids: Option<Vec<String>>,
    #[serde(default)]
    device_id: Option<String>,
    #[serde(default)]
    capabilities: Option<Vec<GrantParam>>,
    #[serde(default)]
    ttl_ms: Option<u64>,
    #[serde(default, rename = "client")]
    _client: Option<Value>,
}

impl OpenParams {
    /// The kernel's session request: `device_id` joins `device_ids`.
    pub fn into_request(self) -> SessionOpen {
        let device_ids = match (self.device_ids, self.device_id) {
            (Some(mut ids), Some(one)) => {
                ids.push(one);
                Some(ids)
            }
            (ids, one) => ids.or(one.map(|d| vec![d])),
        };
        let capabilities = self.capabilities.map(|list| {
            list.into_iter()
                .map(|g| match g {
                    GrantParam::Class(c) => GrantRequest::Class(c),
                    GrantParam::Binding {
                        capability_id,
                        resource,
                    } => GrantRequest::Binding {
                        capability_id,
                        resource,
                    },
                })
                .collect()
        });
        SessionOpen {
            device_ids,
            capabilities,
            ttl_ms: self.ttl_ms,
        }
    }
}

/// `mhs.session.heartbeat` and `mhs.session.close`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SessionParams {
    pub session_id: String,
}

/// `mhs.resource.read`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReadParams {
    #[serde(default)]
    session_id: Option<String>,
    device_id: String,
    resource: String,
}

impl ReadParams {
    /// The kernel's read request.
    pub fn into_request(self) -> ReadRequest {
        ReadRequest {
            session_id: self.session_id,
            device_id: self.device_id,
            resource: self.resource,
        }
    }
}

/// `mhs.resource.write`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WriteParams {
    #[serde(default)]
    session_id: Option<String>,
    device_id: String,
    resource: String,
    patch: Value,
    #[serde(default)]
    capability_id: Option<String>,
    #[serde(default)]
    command_id: Option<String>,
    #[serde(default)]
    expected_revision: Option<u64>,
    #[serde(default)]
    deadline_ms: Option<u64>,
}

impl WriteParams {
    /// The kernel's command request on the write route.
    ///
    /// # Errors
    /// `MHS.PROTOCOL.INVALID_PARAMS` for a deadline out of range.
    pub fn into_request(self) -> Result<CommandRequest, ApiError> {
        Ok(CommandRequest {
            route: Route::Write,
            session_id: self.session_id,
            device_id: self.device_id,
            capability_id: self.capability_id.unwrap_or_default(),
            resource: Some(self.resource),
            input: self.patch,
            command_id: self.command_id,
            deadline: deadline(self.deadline_ms)?,
            expected_revision: self.expected_revision,
            safe_place_grant: None,
            permit_id: None,
        })
    }
}

/// `mhs.command` (any class but the e-stop's).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CommandParams {
    #[serde(default)]
    session_id: Option<String>,
    device_id: String,
    capability_id: String,
    #[serde(default)]
    resource: Option<String>,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    command_id: Option<String>,
    #[serde(default)]
    expected_revision: Option<u64>,
    #[serde(default)]
    deadline_ms: Option<u64>,
    #[serde(default)]
    safe_place_grant: Option<String>,
    #[serde(default)]
    permit_id: Option<String>,
}

impl CommandParams {
    /// The kernel's command request on the command route.
    ///
    /// # Errors
    /// `MHS.PROTOCOL.INVALID_PARAMS` for a deadline out of range.
    pub fn into_request(self) -> Result<CommandRequest, ApiError> {
        Ok(CommandRequest {
            route: Route::Command,
            session_id: self.session_id,
            device_id: self.device_id,
            capability_id: self.capability_id,
            resource: self.resource,
            input: self.input.unwrap_or_else(|| json!({})),
            command_id: self.command_id,
            deadline: deadline(self.deadline_ms)?,
            expected_revision: self.expected_revision,
            safe_place_grant: self.safe_place_grant,
            permit_id: self.permit_id,
        })
    }
}

/// `mhs.safety.permit`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PermitParams {
    #[serde(default)]
    session_id: Option<String>,
    device_id: String,
    capability_id: String,
    #[serde(default)]
    resource: Option<String>,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    ttl_ms: Option<u64>,
}

impl PermitParams {
    /// The command the permit is for (it is not run), and the permit's
    /// lifetime asked for.
    pub fn into_request(self) -> (CommandRequest, Option<u64>) {
        let command = CommandRequest {
            route: Route::Command,
            session_id: self.session_id,
            device_id: self.device_id,
            capability_id: self.capability_id,
            resource: self.resource,
            input: self.input.unwrap_or_else(|| json!({})),
            command_id: None,
            deadline: None,
            expected_revision: None,
            safe_place_grant: None,
            permit_id: None,
        };
        (command, self.ttl_ms)
    }
}

/// `mhs.safety.grant_safe_place`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GrantParams {
    pub device_id: String,
    pub capability_id: String,
    #[serde(default)]
    pub resource: Option<String>,
    #[serde(default)]
    pub input: Option<Value>,
}

/// `mhs.approvals.list`: a status filter and one page (`limit`, `cursor`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ApprovalListParams {
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub limit: Option<u64>,
    #[serde(default)]
    pub cursor: Option<String>,
}

/// `mhs.approvals.get`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ApprovalGetParams {
    pub approval_id: String,
}

/// `mhs.approvals.decide`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ApprovalDecideParams {
    pub approval_id: String,
    pub decision: String,
    #[serde(default)]
    pub reason: Option<String>,
}

/// `mhs.operations.get` and `mhs.operations.cancel`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct OperationParams {
    pub operation_id: String,
    #[serde(default, rename = "session_id")]
    _session_id: Option<String>,
    #[serde(default, rename = "reason")]
    _reason: Option<String>,
}

/// `mhs.safety.arm` and `mhs.safety.disarm`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ArmParams {
    device_id: String,
    #[serde(default)]
    reason: Option<String>,
}

impl ArmParams {
    /// The kernel's arm request: `armed` says arm or disarm.
    pub fn into_request(self, armed: bool) -> ArmRequest {
        ArmRequest {
            device_id: self.device_id,
            armed,
            reason: self.reason.unwrap_or_default(),
        }
    }
}

/// `mhs.safety.reset` (of an e-stop latch).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ResetParams {
    device_id: String,
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default, rename = "command_id")]
    _command_id: Option<String>,
}

impl ResetParams {
    /// The kernel's reset request.
    pub fn into_request(self) -> ResetRequest {
        ResetRequest {
            session_id: self.session_id,
            device_id: self.device_id,
            reason: self.reason.unwrap_or_default(),
        }
    }
}
