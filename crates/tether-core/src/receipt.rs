//! Receipts: the record of one command's outcome.

use crate::codes::Code;
use serde_json::{json, Map, Value};

/// Terminal status of a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// The effect happened.
    Completed,
    /// Refused by the evaluation order; no side effect.
    Rejected,
    /// Dispatched and failed.
    Failed,
    /// Dispatched and cancelled.
    Cancelled,
    /// Dispatched; the outcome is unknown.
    Unknown,
}

impl Status {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Completed => "completed",
            Status::Rejected => "rejected",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
            Status::Unknown => "unknown",
        }
    }
}

/// A refusal or failure with its registry code.
#[derive(Clone, Debug)]
pub struct Refusal {
    /// The code.
    pub code: Code,
    /// One line for people.
    pub message: String,
    /// Structured details (an object).
    pub details: Value,
}

impl Refusal {
    /// A refusal with details.
    pub fn new(code: Code, message: impl Into<String>, details: Value) -> Self {
        Self {
            code,
            message: message.into(),
            details,
        }
    }

    /// A refusal with an empty details object.
    pub fn bare(code: Code, message: impl Into<String>) -> Self {
        Self::new(code, message, Value::Object(Map::new()))
    }

    /// The wire error object of a receipt.
    pub fn to_json(&self) -> Value {
        json!({
            "mhs_code": self.code.as_str(),
            "message": self.message,
            "details": self.details,
            "retryable": self.code.retryable(),
        })
    }
}

/// A receipt under construction; `to_json` renders the wire shape.
#[derive(Clone, Debug)]
pub struct Receipt {
    /// `rcpt_<ULID>`.
    pub receipt_id: String,
    /// The idempotency key.
    pub command_id: String,
    /// Device.
    pub device_id: String,
    /// Capability class id.
    pub capability_id: String,
    /// Resource.
    pub resource: Option<String>,
    /// Status.
    pub status: Status,
    /// Driver output when completed.
    pub output: Option<Value>,
    /// Error when not completed.
    pub error: Option<Refusal>,
    /// Digest of the input (JCS + SHA-256).
    pub input_digest: String,
    /// Revision before dispatch.
    pub state_revision_before: Option<u64>,
    /// Revision after the command.
    pub state_revision_after: Option<u64>,
    /// The policy decision: `allow` for a dispatched command, `hold` or `deny` for a refusal at step 10, absent when refused before it.
    pub decision: Option<&'static str>,
    /// Device mode.
    pub mode: &'static str,
    /// Wall clock when accepted, ms since the epoch.
    pub accepted_at_ms: u64,
    /// Wall clock when finished, ms since the epoch.
    pub completed_at_ms: u64,
    /// Extra members (e.g. e-stop latencies).
    pub extra: Map<String, Value>,
}

impl Receipt {
    /// The wire object. `replayed` is added by the caller on replay.
    pub fn to_json(&self) -> Value {
        self.clone().into_json()
    }

    /// The wire object, moving this receipt's strings and output into it
    /// instead of copying them (the kernel's path for every command).
    pub fn into_json(self) -> Value {
        const FIXED_MEMBERS: usize = 18;
        let mut m = Map::with_capacity(FIXED_MEMBERS + self.extra.len());
        m.insert("receipt_id".into(), Value::String(self.receipt_id));
        m.insert("command_id".into(), Value::String(self.command_id));
        m.insert("device_id".into(), Value::String(self.device_id));
        m.insert("capability_id".into(), Value::String(self.capability_id));
        m.insert(
            "resource".into(),
            self.resource.map(Value::String).unwrap_or(Value::Null),
        );
        m.insert("status".into(), Value::from(self.status.as_str()));
        m.insert("output".into(), self.output.unwrap_or(Value::Null));
        m.insert(
            "error".into(),
            self.error
                .as_ref()
                .map(Refusal::to_json)
                .unwrap_or(Value::Null),
        );
        m.insert("input_digest".into(), Value::String(self.input_digest));
        m.insert(
            "state_revision_before".into(),
            json!(self.state_revision_before),
        );
        m.insert(
            "state_revision_after".into(),
            json!(self.state_revision_after),
        );
        m.insert("decision".into(), json!(self.decision));
        m.insert("mode".into(), Value::from(self.mode));
        m.insert("accepted_at_ms".into(), Value::from(self.accepted_at_ms));
        m.insert("completed_at_ms".into(), Value::from(self.completed_at_ms));
        m.insert("replayed".into(), Value::Bool(false));
        debug_assert!(m.len() <= FIXED_MEMBERS);
        for (k, v) in self.extra {
            m.insert(k, v);
        }
        Value::Object(m)
    }
}

/// Wall clock in ms since the Unix epoch (0 if the clock is before 1970).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
