//! What the routes do: tools, context, invoke, and the invocation lifecycle.
//!
//! The gateway decides nothing: every read, write, action and stop goes
//! through `Kernel` with the caller's principal, on a session the gateway
//! keeps for that principal.

use super::envelope::{Data, RestError};
use super::invocations::{self, Finished, Form, Invocation, Outcome, Record, Table};
use crate::tools::{Tool, ToolKind};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tether_core::canonical;
use tether_core::catalogue;
use tether_core::ids::{self, CommandId};
use tether_core::receipt::now_ms;
use tether_core::{echo, Code};
use tether_kernel::{
    deadline_from_ms, ApiError, CancelToken, CommandOptions, CommandRequest, EstopRequest,
    EvidenceFault, Kernel, Principal, ReadRequest, Rider, RiderOutcome, Route, SessionOpen,
    DEADLINE_MS_MAX,
};

/// The gateway's session lifetime: at least the longest deadline, and renewed
/// at every invocation, so a session never expires under a running command
/// (an expiry would cancel it).
const SESSION_TTL_MS: u64 = 86_400_000;
// A session must outlive the longest command it runs (see above).
const _: () = assert!(SESSION_TTL_MS >= DEADLINE_MS_MAX);
// ... and the kernel must grant a session that long.
const _: () = assert!(SESSION_TTL_MS <= tether_kernel::SESSION_TTL_MS_MAX);
/// How long an invoke whose command was not admitted waits for its rejected
/// receipt before answering 202 instead.
const REFUSAL_WAIT: Duration = Duration::from_secs(2);
/// How long an admitted command has to take the invocation's record into
/// its first commit before the record is written alone. A setpoint or a
/// relay reaches its receipt's commit within microseconds; a motion commits
/// only when it ends, and its 202 must not wait for that.
const RIDER_BOARDING_WAIT: Duration = Duration::from_millis(5);
/// Deadline of the device stop run by `POST /invocations/{id}/stop`.
const STOP_DEADLINE: Duration = Duration::from_secs(10);
// The stop is a kernel command: the kernel refuses a deadline over DEADLINE_MS_MAX.
const _: () = assert!(STOP_DEADLINE.as_millis() <= DEADLINE_MS_MAX as u128);
// A reason the estop tool's schema accepts is kept whole: the kernel's text
// bound (`limits.text_chars_max`), to which an e-stop reason is cut, is
// never smaller.
const _: () =
    assert!(tether_kernel::bounds::TEXT_CHARS_MIN >= crate::tools::ESTOP_REASON_CHARS_MAX);

/// The body of `POST /tools/{id}:invoke`. A member may be absent but never
/// `null` (strict: `null` is not a value of any of them).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct InvokeBody {
    #[serde(default, deserialize_with = "present")]
    pub input: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    pub deadline_ms: Option<u64>,
    #[serde(default, deserialize_with = "present")]
    pub command_id: Option<String>,
}

/// A member that is present must hold a value: `null` is refused.
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    let v = Value::deserialize(d)?;
    if v.is_null() {
        return Err(serde::de::Error::custom("null is not allowed here"));
    }
    T::deserialize(v)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

/// The optional body of `POST /invocations/{id}/cancel|stop`: an empty
/// object (members are refused, so a misspelt option is never ignored).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ControlBody {}

/// The REST gateway over one kernel.
pub(crate) struct Gateway {
    pub kernel: Kernel,
    tools: Vec<Tool>,
    by_name: HashMap<String, usize>,
    /// One kernel session per principal id (bounded by the configured
    /// principals, which are finite).
    sessions: Mutex<HashMap<String, String>>,
    table: Mutex<Table>,
}

fn internal(what: &str) -> RestError {
    RestError::new(
        Code::ProtocolInternal,
        format!("{what} unavailable"),
        json!({"reason": "lock_poisoned"}),
    )
}

impl Gateway {
    /// The tool catalogue is fixed for the life of the kernel (limits are
    /// resolved at load), so it is built once.
    /// `finished_max` bounds the finished invocations kept in memory.
    pub fn new(kernel: Kernel, finished_max: usize) -> Self {
        let tools = crate::tools::catalogue(&kernel);
        let by_name = tools
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Self {
            kernel,
            tools,
            by_name,
            sessions: Mutex::new(HashMap::new()),
            table: Mutex::new(Table::new(finished_max)),
        }
    }

    pub fn tools_json(&self) -> Value {
        json!({"tools": self.tools.iter().map(Tool::to_json).collect::<Vec<_>>()})
    }

    pub fn tool(&self, name: &str) -> Result<&Tool, RestError> {
        self.by_name
            .get(name)
            .and_then(|&i| self.tools.get(i))
            .ok_or_else(|| {
                RestError::new(
                    Code::CapabilityUnknown,
                    format!("no tool `{}`; GET /tools lists them", echo::id(name)),
                    json!({"tool_id": echo::id(name)}),
                )
            })
    }

    // ----- sessions ---------------------------------------------------

    /// The principal's gateway session, renewed; opened (again) when absent,
    /// expired or closed.
    async fn session_for(&self, p: &Principal) -> Result<String, RestError> {
        let known = self
            .sessions
            .lock()
            .map_err(|_| internal("session map"))?
            .get(&p.id)
            .cloned();
        if let Some(sid) = known {
            if self.kernel.session_heartbeat(p, &sid).is_ok() {
                return Ok(sid);
            }
        }
        let opened = self
            .kernel
            .session_open(
                p,
                SessionOpen {
                    device_ids: None,
                    capabilities: None,
                    ttl_ms: Some(SESSION_TTL_MS),
                },
            )
            .await?;
        let sid = opened["session_id"]
            .as_str()
            .ok_or_else(|| internal("session id"))?
            .to_owned();
        self.sessions
            .lock()
            .map_err(|_| internal("session map"))?
            .insert(p.id.clone(), sid.clone());
        Ok(sid)
    }

    // ----- context ----------------------------------------------------

    /// What a planner needs before invoking: limits, live state, mode and
    /// risk, the latch, interlocks, running operations and the device's link.
    pub async fn context(&self, p: &Principal, tool: &Tool) -> Result<Value, RestError> {
        let mut out = tool.to_json();
        let Some(device_id) = tool.device_id.clone() else {
            out["devices"] = self.kernel.safety_status(None)?["devices"].clone();
            return Ok(json!({"tool": out["tool_id"], "context": out}));
        };
        let status = self.kernel.safety_status(Some(&device_id))?;
        let dev = &status["devices"][0];
        out["latched"] = dev["latched"].clone();
        out["latch"] = dev["latch"].clone();
        out["interlocks"] = dev["interlocks"].clone();
        out["running_operations"] = dev["running_operations"].clone();
        out["link"] = dev["link"].clone();
        let sid = self.session_for(p).await?;
        let read = self
            .kernel
            .read(
                p,
                ReadRequest {
                    session_id: Some(sid),
                    device_id,
                    resource: tool.resource.clone(),
                },
            )
            .await;
        match read {
            Ok(r) => {
                out["state"] = json!({"revision": r["revision"], "state": r["state"], "state_hash": r["state_hash"], "sampled_at": r["sampled_at"]});
                out["state_error"] = Value::Null;
            }
            Err(e) => {
                out["state"] = Value::Null;
                out["state_error"] = json!({"code": e.code.as_str(), "message": e.message});
            }
        }
        out["not_certified"] = json!(true);
        Ok(json!({"tool": out["tool_id"], "context": out}))
    }

    // ----- invoke -----------------------------------------------------

    /// Reads answer 200 with the result, the e-stop 200 with its receipt,
    /// writes and actions 202 with an invocation (or the refusal as an error).
    pub async fn invoke(
        self: &Arc<Self>,
        p: &Principal,
        tool: &Tool,
        body: InvokeBody,
    ) -> Result<(StatusCode, Data), RestError> {
        if tool.kind == ToolKind::Estop {
            // Nothing about the request may prevent a stop: a non-object input
            // stops every device and an invalid deadline is ignored.
            let deadline = body.deadline_ms.and_then(deadline_from_ms);
            let input = body.input.unwrap_or_else(|| json!({}));
            if let Some(defect) = estop_input_defect(&input) {
                // A defective e-stop still stops, every device: which one it
                // meant is unknown. The answer is the defect's error.
                let receipt = self.estop_malformed(p, &defect).await;
                // The same code as any tool's input that does not match
                // its schema (422), with the stop's receipt.
                return Err(RestError::new(
                    Code::CapabilityInputInvalid,
                    format!("estop input: {defect}; every device was stopped"),
                    json!({"reason": "input_invalid", "message": defect, "estop_served": true, "receipt": receipt}),
                ));
            }
            return self.estop(p, input, deadline).await;
        }
        let input = body.input.unwrap_or_else(|| json!({}));
        if !input.is_object() {
            return Err(RestError::invalid(
                "input_not_object",
                "input must be a JSON object",
            ));
        }
        let deadline = match body.deadline_ms {
            None => None,
            Some(ms) => Some(deadline_from_ms(ms).ok_or_else(|| {
                RestError::invalid(
                    "deadline_invalid",
                    format!("deadline_ms must be between 1 and {DEADLINE_MS_MAX}"),
                )
            })?),
        };
        let command_id = match body.command_id {
            Some(raw) => Some(CommandId::parse(&raw).map_err(|e| {
                RestError::invalid("command_id_invalid", format!("command_id: {e}"))
            })?),
            None => None,
        };
        match tool.kind {
            ToolKind::Estop => unreachable_estop(),
            ToolKind::Read => self.read(p, tool, &input).await,
            ToolKind::Write | ToolKind::Action => {
                let mut req = CommandRequest {
                    route: if tool.kind == ToolKind::Write {
                        Route::Write
                    } else {
                        Route::Command
                    },
                    session_id: Some(self.session_for(p).await?),
                    device_id: tool.device_id.clone().unwrap_or_default(),
                    capability_id: tool.capability_id.clone(),
                    resource: Some(tool.resource.clone()),
                    input,
                    command_id: None,
                    deadline,
                    expected_revision: None,
                    safe_place_grant: None,
                    permit_id: None,
                };
                // An invocation without a command id that repeats an open
                // hold of this principal resumes it (as MCP tool calls do).
                let command_id = match command_id {
                    Some(id) => id.as_str().to_owned(),
                    None => self
                        .kernel
                        .held_command_id(p, &req)
                        .unwrap_or_else(|| CommandId::mint().as_str().to_owned()),
                };
                req.command_id = Some(command_id);
                self.invoke_command(p, tool, req).await
            }
        }
    }

    async fn read(
        &self,
        p: &Principal,
        tool: &Tool,
        input: &Value,
    ) -> Result<(StatusCode, Data), RestError> {
        if input.as_object().is_some_and(|o| !o.is_empty()) {
            return Err(RestError::new(
                Code::CapabilityInputInvalid,
                "a read takes no input",
                json!({"reason": "read_takes_no_input"}),
            ));
        }
        let sid = self.session_for(p).await?;
        let result = self
            .kernel
            .read(
                p,
                ReadRequest {
                    session_id: Some(sid),
                    device_id: tool.device_id.clone().unwrap_or_default(),
                    resource: tool.resource.clone(),
                },
            )
            .await?;
        Ok((
            StatusCode::OK,
            json!({"tool_id": tool.name, "result": result}).into(),
        ))
    }

    /// The e-stop tool: served at once, never queued behind an invocation.
    async fn estop(
        &self,
        p: &Principal,
        input: Value,
        deadline: Option<Duration>,
    ) -> Result<(StatusCode, Data), RestError> {
        let named = input.get("device_id").and_then(Value::as_str);
        let device_ids: Vec<String> = named.map(|d| vec![d.to_owned()]).unwrap_or_default();
        if let Some(d) = named {
            if self.kernel.fleet_owner_of(d).is_some() {
                // Served by another endpoint of the fleet: its trip goes
                // through the store and its owner stops it.
                let reason = input
                    .get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or("e-stop (REST)");
                let receipt = self.kernel.estop_fleet(&device_ids, reason, Some(p)).await;
                return Ok((
                    StatusCode::OK,
                    json!({"tool_id": crate::tools::ESTOP_TOOL, "receipt": receipt}).into(),
                ));
            }
            if !self.kernel.device_ids().iter().any(|x| x == d) {
                return Err(RestError::new(
                    Code::DeviceUnknown,
                    format!(
                        "no device `{}` is served here; nothing was stopped",
                        echo::id(d)
                    ),
                    json!({"device_id": echo::id(d)}),
                ));
            }
        }
        let reason = input
            .get("reason")
            .and_then(Value::as_str)
            .unwrap_or("e-stop (REST)")
            .chars()
            .take(self.kernel.text_chars_max())
            .collect();
        let receipt = self
            .kernel
            .estop(EstopRequest {
                device_ids,
                reason,
                envelope_defect: None,
                requested_by: Some(p.clone()),
                session_id: None,
                deadline,
            })
            .await;
        // A stop whose path did not confirm is an error answer (`ok: false`,
        // 502), so a client that reads `ok` never takes it for a success; the
        // latch is set either way, and the receipt says what happened.
        if receipt["status"] != "completed" {
            let error = &receipt["error"];
            let code = error["mhs_code"]
                .as_str()
                .and_then(Code::from_name)
                .unwrap_or(Code::SafetySafeStateUnreached);
            let reason = error["details"]["reason"].clone();
            return Err(RestError::new(
                code,
                format!(
                    "the e-stop latched but its stop path did not confirm: {}",
                    error["message"].as_str().unwrap_or("not confirmed")
                ),
                json!({"reason": reason, "latched": true, "estop_served": true, "receipt": receipt}),
            ));
        }
        Ok((
            StatusCode::OK,
            json!({"tool_id": crate::tools::ESTOP_TOOL, "receipt": receipt}).into(),
        ))
    }

    /// A malformed e-stop request still stops: every device.
    pub async fn estop_malformed(&self, p: &Principal, defect: &str) -> Value {
        self.kernel
            .estop(EstopRequest {
                device_ids: Vec::new(),
                reason: "e-stop (REST, malformed request)".into(),
                envelope_defect: Some(defect.to_owned()),
                requested_by: Some(p.clone()),
                session_id: None,
                deadline: None,
            })
            .await
    }

    async fn invoke_command(
        self: &Arc<Self>,
        p: &Principal,
        tool: &Tool,
        req: CommandRequest,
    ) -> Result<(StatusCode, Data), RestError> {
        // Protocol errors before anything is recorded; a refusal inside the
        // evaluation order comes from the real command below.
        self.kernel.reachable(p, &req)?;
        // A stop is never cancelled, nor a binding declared not abortable.
        let cancellable = tool.abortable
            && !catalogue::class(&tool.capability_id).is_some_and(|c| c.flags.stop_class);
        let record = Record {
            invocation_id: ids::mint("inv_"),
            attempt_id: ids::mint("att_"),
            tool_id: tool.name.clone(),
            device_id: tool.device_id.clone(),
            capability_id: tool.capability_id.clone(),
            resource: Some(tool.resource.clone()),
            command_id: req.command_id.clone(),
            input_digest: canonical::digest(&req.input),
            principal_id: p.id.clone(),
            principal_kind: p.kind.as_str().to_owned(),
            accepted_at_ms: now_ms(),
            status: invocations::PENDING.to_owned(),
            cancel_requested: false,
            stop_requested: false,
            receipt: None,
            error: None,
            finished_at_ms: None,
            running_operation: None,
        };
        let inv_id = record.invocation_id.clone();
        // The 202's body: the record as accepted (pending), whatever the
        // command has done by the time it is sent.
        let view = record.write(Form::View { links: true })?;
        let cancel = CancelToken::new();
        let (rider, durable) = self.retain(record, cancel.clone(), cancellable)?;
        let (admitted, on_admit) = tokio::sync::oneshot::channel();
        let options = CommandOptions {
            cancel: cancel.clone(),
            on_admit: Some(admitted),
            rider: Some(rider.clone()),
        };
        // The command's spans stay children of the request's.
        let run = Arc::clone(self).run(p.clone(), req, options, inv_id.clone());
        let run = tether_kernel::trace::carry(tracing::Instrument::in_current_span(run));
        let run = tokio::spawn(run);
        // Answer 202 once the command has passed steps 2-11 (it goes on to
        // dispatch) and the invocation is durable; a command refused by them
        // is answered with its refusal once the rejected receipt is recorded.
        let refused = self.admission(on_admit, run, &rider).await;
        // The sender is dropped unanswered only if the store went away.
        let stored = durable
            .await
            .unwrap_or_else(|_| Err(EvidenceFault("the store dropped the record".into())));
        if let Some(rejected) = refused {
            if let Err(e) = &stored {
                tracing::warn!(invocation_id = %inv_id, error = %e, "a refused invocation's record is not durable");
            }
            return Err(refusal_error(&inv_id, &rejected));
        }
        if let Err(e) = stored {
            return Err(self.not_retained(&inv_id, &cancel, &e));
        }
        Ok((StatusCode::ACCEPTED, Data::Text(view)))
    }

    /// Waits until the command is admitted or refused, and sees that its
    /// invocation's record is on its way to the store either way. Answers
    /// the rejected receipt of a refused command.
    async fn admission(
        &self,
        on_admit: tokio::sync::oneshot::Receiver<()>,
        run: tokio::task::JoinHandle<Option<Value>>,
        rider: &Rider,
    ) -> Option<Value> {
        if on_admit.await.is_ok() {
            // Most commands reach their first commit at once and carry the
            // record in it; one that does not (a motion commits when it
            // ends) must not hold the 202 back, so the record goes alone.
            if tokio::time::timeout(RIDER_BOARDING_WAIT, rider.boarded())
                .await
                .is_err()
            {
                rider.submit_alone();
            }
            return None;
        }
        match tokio::time::timeout(REFUSAL_WAIT, run).await {
            // Refused: the rejection's commit carried the record.
            Ok(Ok(Some(rejected))) => Some(rejected),
            _ => {
                // Replayed (`run` wrote the record alone), or undecided
                // after the wait: the record goes alone unless taken.
                rider.submit_alone();
                None
            }
        }
    }

    /// Retains the invocation in memory and hands back its record as a
    /// rider for the command's first commit (see [`Rider`]), with the
    /// receiver that learns when it is durable.
    fn retain(
        &self,
        record: Record,
        cancel: CancelToken,
        cancellable: bool,
    ) -> Result<(Rider, tokio::sync::oneshot::Receiver<RiderOutcome>), RestError> {
        // The entry holds the record (pending); the store's row only
        // indexes that entry, so the record is stored once.
        let event = record.write(Form::Row)?;
        let inv_id = record.invocation_id.clone();
        let inserted = self
            .table
            .lock()
            .map_err(|_| internal("invocation table"))?
            .insert(Invocation {
                record,
                cancel,
                cancellable,
            });
        if !inserted {
            return Err(RestError::new(
                Code::ProtocolLimit,
                "too many invocations are pending; retry later",
                json!({"reason": "too_many_pending_invocations", "limit": invocations::PENDING_MAX}),
            ));
        }
        Ok(self.kernel.invocation_rider(&inv_id, event))
    }

    /// The invocation's record could not be made durable: it is not
    /// retained and its command, if under way, is cancelled. A physical or
    /// budgeted command carried the record in its admission commit, so it
    /// was refused before dispatch; a simulated one may have run.
    fn not_retained(&self, inv_id: &str, cancel: &CancelToken, e: &EvidenceFault) -> RestError {
        cancel.cancel();
        let outcome = Outcome::Error(
            json!({"mhs_code": Code::EvidenceUnavailable.as_str(), "message": "not accepted"}),
        );
        if let Ok(mut t) = self.table.lock() {
            t.finish(inv_id, outcome, now_ms(), false);
        }
        RestError::new(
            Code::EvidenceUnavailable,
            "the invocation could not be recorded durably, so it is not retained; a command \
             already under way was cancelled (nothing physical is dispatched without that record)",
            json!({"reason": "invocation_not_durable", "store_error": e.to_string()}),
        )
    }

    /// Runs the command and records how it ended. Answers the receipt when
    /// it was rejected (for the refusal answer of `invoke_command`).
    async fn run(
        self: Arc<Self>,
        p: Principal,
        req: CommandRequest,
        options: CommandOptions,
        inv_id: String,
    ) -> Option<Value> {
        let rider = options.rider.clone();
        let answer = self.kernel.command(&p, req, options).await;
        // A command answered without any commit of its own (a replay, a
        // protocol error) leaves the record to be written here, before the
        // record of how it ended.
        if let Some(rider) = rider {
            rider.submit_alone();
        }
        let outcome = match answer {
            Ok(receipt) => Outcome::receipt(receipt),
            Err(e) => Outcome::Error(api_error_json(&e)),
        };
        let rejected = match &outcome {
            Outcome::Receipt { receipt, .. } if outcome.rejected() => {
                Some(receipt.clone().into_value())
            }
            Outcome::Error(e) => Some(json!({"status": "rejected", "error": e})),
            Outcome::Receipt { .. } => None,
        };
        self.finish(&inv_id, outcome);
        rejected
    }

    fn finish(&self, inv_id: &str, outcome: Outcome) {
        // A dispatched command's receipt is durable under its command_id
        // (the kernel's receipts table), where a restart finds it through the
        // accepted record: nothing more to write. A refusal is evidence but
        // never the stored outcome of its id, so the invocation keeps it, as
        // does one whose receipt could not be made durable (`x-tether`).
        let stored_by_kernel = match &outcome {
            Outcome::Receipt { receipt, .. } => !outcome.rejected() && !receipt.not_durable(),
            Outcome::Error(_) => false,
        };
        let finished = self
            .table
            .lock()
            .ok()
            .and_then(|mut t| t.finish(inv_id, outcome, now_ms(), !stored_by_kernel));
        let Some(Some(finished)) = finished else {
            return;
        };
        let Finished { event, row } = finished;
        let (Ok(event), Ok(row)) = (event, row) else {
            tracing::error!(invocation_id = %inv_id, "an invocation's finish record cannot be written");
            return;
        };
        // Queued, not awaited: the answer does not depend on it.
        self.kernel.record_invocation_finished(inv_id, event, row);
    }

    // ----- lifecycle --------------------------------------------------

    /// The invocation record for its owner: memory first, then the store.
    /// Another principal's invocation reads as unknown.
    pub fn lookup(&self, p: &Principal, inv_id: &str) -> Result<Record, RestError> {
        let unknown = || {
            RestError::new(
                Code::OperationUnknown,
                format!("no invocation `{}` for this caller", echo::id(inv_id)),
                json!({"invocation_id": echo::id(inv_id)}),
            )
        };
        let in_memory = self
            .table
            .lock()
            .map_err(|_| internal("invocation table"))?
            .get(inv_id)
            .map(|i| i.record.clone());
        let record = match in_memory {
            Some(record) => record,
            None => self.recover(inv_id)?.ok_or_else(unknown)?,
        };
        if record.principal_id != p.id {
            return Err(unknown());
        }
        let mut record = record;
        if record.pending() {
            record.running_operation = record
                .command_id
                .as_deref()
                .and_then(|c| self.kernel.operation_of_command(c));
        }
        Ok(record)
    }

    /// A record from the store (after a restart or an eviction). A store that
    /// cannot be read refuses rather than guessing.
    fn recover(&self, inv_id: &str) -> Result<Option<Record>, RestError> {
        let unavailable = |e: EvidenceFault| {
            RestError::new(
                Code::EvidenceUnavailable,
                "the invocation record cannot be read right now",
                json!({"reason": "store_unreadable", "store_error": e.to_string()}),
            )
        };
        let Some(info) = self.kernel.invocation_record(inv_id).map_err(unavailable)? else {
            return Ok(None);
        };
        let receipt = match info["command_id"].as_str() {
            Some(cid) if info["status"] == invocations::PENDING => {
                self.kernel.stored_receipt(cid).map_err(unavailable)?
            }
            _ => None,
        };
        Record::recovered(&info, receipt).map(Some).map_err(|member| {
            RestError::new(
                Code::EvidenceUnavailable,
                "the stored invocation record cannot be read",
                json!({"reason": "record_unreadable", "invocation_id": inv_id, "member": member}),
            )
        })
    }

    /// Delivers cancellation; never waits for, nor claims, a stop.
    pub fn cancel(&self, p: &Principal, inv_id: &str) -> Result<(StatusCode, Data), RestError> {
        let record = self.lookup(p, inv_id)?;
        let mut table = self
            .table
            .lock()
            .map_err(|_| internal("invocation table"))?;
        let Some(inv) = table.get_mut(inv_id).filter(|i| i.pending()) else {
            return Ok((
                StatusCode::OK,
                json!({"invocation_id": inv_id, "cancel_delivered": false, "reason": "already_finished", "status": record.status}).into(),
            ));
        };
        if !inv.cancellable {
            let reason =
                if catalogue::class(&record.capability_id).is_some_and(|c| c.flags.stop_class) {
                    "stop_operations_are_never_cancelled"
                } else {
                    "not_abortable"
                };
            return Ok((
                StatusCode::OK,
                json!({"invocation_id": inv_id, "cancel_delivered": false, "reason": reason, "status": invocations::PENDING}).into(),
            ));
        }
        inv.cancel.cancel();
        inv.record.cancel_requested = true;
        Ok((
            StatusCode::ACCEPTED,
            json!({"invocation_id": inv_id, "cancel_delivered": true, "status": invocations::PENDING,
                   "note": "delivered, not confirmed: the invocation's result says how it ended"}).into(),
        ))
    }

    /// Runs the device's stop-class command (e.g. `cap.motion.stop.v1`),
    /// which cancels every running operation of the device and asks the
    /// driver to halt. Not an e-stop: nothing is latched.
    pub async fn stop(&self, p: &Principal, inv_id: &str) -> Result<(StatusCode, Data), RestError> {
        let record = self.lookup(p, inv_id)?;
        let pending = self
            .table
            .lock()
            .map_err(|_| internal("invocation table"))?
            .get(inv_id)
            .is_some_and(Invocation::pending);
        // An `unknown` outcome proves nothing about the device (the endpoint
        // lost track of the call, e.g. a crash mid-motion), so a stop asked
        // for it still runs the device's stop; only a known end declines.
        let outcome_unknown = record.status == "unknown";
        if !pending && !outcome_unknown {
            return Ok((
                StatusCode::OK,
                json!({"invocation_id": inv_id, "stop_delivered": false, "reason": "already_finished", "status": record.status}).into(),
            ));
        }
        let device_id = record.device_id.unwrap_or_default();
        let stop = self.stop_tool(&device_id).ok_or_else(|| {
            RestError::new(
                Code::CapabilityNotBound,
                format!("device `{device_id}` has no stop binding; cancel the invocation, or use the estop tool"),
                json!({"reason": "no_stop_binding", "device_id": device_id}),
            )
            .with_status(StatusCode::CONFLICT)
        })?;
        if let Ok(mut t) = self.table.lock() {
            if let Some(inv) = t.get_mut(inv_id) {
                inv.record.stop_requested = true;
            }
        }
        let req = CommandRequest {
            route: Route::Command,
            session_id: Some(self.session_for(p).await?),
            device_id: device_id.clone(),
            capability_id: stop.capability_id.clone(),
            resource: Some(stop.resource.clone()),
            input: json!({}),
            command_id: None,
            deadline: Some(STOP_DEADLINE),
            expected_revision: None,
            safe_place_grant: None,
            permit_id: None,
        };
        let receipt = self
            .kernel
            .command(p, req, CommandOptions::plain())
            .await?
            .into_value();
        Ok((
            StatusCode::OK,
            json!({"invocation_id": inv_id, "stop_delivered": true, "stop_tool": stop.name, "stop_receipt": receipt,
                   "note": "the device's stop ran (see stop_receipt); the invocation's result says how it ended"}).into(),
        ))
    }

    fn stop_tool(&self, device_id: &str) -> Option<&Tool> {
        self.tools.iter().find(|t| {
            t.device_id.as_deref() == Some(device_id)
                && t.capability_id != catalogue::ESTOP
                && catalogue::class(&t.capability_id).is_some_and(|c| c.flags.stop_class)
        })
    }
}

/// What makes an e-stop tool input unusable: not an object, a member the tool
/// does not declare, or a declared member of the wrong type.
fn estop_input_defect(input: &Value) -> Option<String> {
    let Some(members) = input.as_object() else {
        return Some("input must be a JSON object".into());
    };
    if let Some(name) = members
        .keys()
        .find(|k| !matches!(k.as_str(), "device_id" | "reason"))
    {
        return Some(format!("unknown member `{}`", echo::id(name)));
    }
    crate::rpc::estop_params_defect(input)
}

/// The e-stop is served before this match; kept total without a panic.
fn unreachable_estop() -> Result<(StatusCode, Data), RestError> {
    Err(internal("e-stop routing"))
}

fn api_error_json(e: &ApiError) -> Value {
    json!({"mhs_code": e.code.as_str(), "message": e.message, "details": e.details, "retryable": e.code.retryable()})
}

/// A rejected receipt as the REST error: the receipt's code, message and
/// details (path, bound, value, ... for limits), plus the receipt itself and
/// the invocation that retains it.
fn refusal_error(inv_id: &str, rejected: &Value) -> RestError {
    let err = &rejected["error"];
    // A code the registry does not know (or none) is an internal error.
    let code = err["mhs_code"]
        .as_str()
        .or_else(|| err["code"].as_str())
        .and_then(Code::from_name)
        .unwrap_or(Code::ProtocolInternal);
    let mut details = if err["details"].is_object() {
        err["details"].clone()
    } else {
        json!({})
    };
    details["invocation_id"] = json!(inv_id);
    details["receipt"] = if rejected.get("receipt_id").is_some() {
        rejected.clone()
    } else {
        Value::Null
    };
    RestError::new(code, err["message"].as_str().unwrap_or("refused"), details)
}
