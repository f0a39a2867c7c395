//! `mhs.operations.get` and `mhs.operations.cancel`.
//!
//! Cancellation is cooperative: an accepted cancel means the request was
//! delivered to the running operation, never that the device stopped. The
//! operation's own receipt says how it ended. A stop, and a call of a binding
//! declared `abortable = false`, is never cancelled: the answer says so
//! (`cancel_delivered: false`), it is not an error, since the caller's wish
//! is known and the call ends within its lease or duration anyway.
//!
//! **Owns:** who may read or cancel an operation (the principal whose
//! command it runs, and human operators, whose access to another's is
//! recorded as `operation.operator_access`), and the bounded memory of
//! finished operations with their owners.
//! **Never belongs here:** the registry of running operations
//! (`registry.rs`), how a command is cancelled once asked (the driver call).
//! **Fail-closed rule:** anyone else's operation answers exactly as an id
//! that does not exist (`MHS.OPERATION.UNKNOWN`), and is left alone.

use crate::kernel::{Kernel, Principal, PrincipalKind};
use crate::ApiError;
use serde_json::{json, Value};
use tether_core::recent::RecentMap;
use tether_core::{echo, Code, Receipt, Status};
use tether_store::{Commit, EventDraft};

/// Finished operations remembered for `mhs.operations.get`.
const FINISHED_MAX: usize = 10_000;

/// What `mhs.operations.get` says of a finished operation; rendered as JSON
/// only when asked, since nearly every operation is never asked about.
#[derive(Debug)]
pub(crate) struct FinishedOp {
    status: Status,
    command_id: String,
    receipt_id: String,
    device: usize,
    capability_id: String,
    /// The principal whose command it ran: only it (and operators) may
    /// read it.
    owner: String,
}

/// A bounded memory of finished operations: id -> summary, in a
/// [`RecentMap`] (two generations only ever added to: no call rehashes a
/// whole map under this lock). Memory keeps at most `FINISHED_MAX` and at
/// least the newest half of it.
#[derive(Debug)]
pub(crate) struct Finished(RecentMap<String, FinishedOp>);

impl Default for Finished {
    fn default() -> Self {
        Self(RecentMap::new(FINISHED_MAX))
    }
}

impl Finished {
    fn insert(&mut self, op_id: &str, summary: FinishedOp) {
        self.0.insert(op_id.to_owned(), summary);
    }

    /// The newest summary kept for `op_id`.
    fn get(&self, op_id: &str) -> Option<&FinishedOp> {
        self.0.get(op_id)
    }
}

/// What a caller may do with an operation it names: its own, or another's
/// as an operator (recorded), or nothing (it reads as unknown).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Owner,
    Operator,
    None,
}

fn access(p: &Principal, owner: &str) -> Access {
    if p.id == owner {
        Access::Owner
    } else if p.kind == PrincipalKind::Human && p.operator {
        Access::Operator
    } else {
        Access::None
    }
}

impl Kernel {
    pub(crate) fn note_finished(&self, op_id: &str, device: usize, owner: &str, receipt: &Receipt) {
        let summary = FinishedOp {
            status: receipt.status,
            command_id: receipt.command_id.clone(),
            receipt_id: receipt.receipt_id.clone(),
            device,
            capability_id: receipt.capability_id.clone(),
            owner: owner.to_owned(),
        };
        if let Ok(mut f) = self.inner.finished_ops.lock() {
            f.insert(op_id, summary);
        }
    }

    fn unknown_operation(id: &str) -> ApiError {
        ApiError::new(
            Code::OperationUnknown,
            format!(
                "no running or recently finished operation `{}` for this caller",
                echo::id(id)
            ),
            json!({"operation_id": echo::id(id)}),
        )
    }

    /// An operator read or cancelled another principal's operation: the
    /// evidence says who, whose, and what.
    fn record_operator_access(&self, p: &Principal, action: &str, op_id: &str, owner: &str) {
        self.record(Commit {
            events: vec![EventDraft {
                kind: "operation.operator_access".into(),
                body: json!({"operation_id": op_id, "action": action, "operator": p.to_json(), "owner": {"id": owner}}).into(),
            }],
            ..Commit::default()
        });
    }

    /// `mhs.operations.get`: the caller's own operation, or any as an
    /// operator (recorded as evidence). Another principal's operation reads
    /// exactly as one that does not exist.
    ///
    /// # Errors
    /// `MHS.OPERATION.UNKNOWN`.
    pub fn operation_get(&self, p: &Principal, operation_id: &str) -> Result<Value, ApiError> {
        let (answer, owner) = self.operation_view(p, operation_id)?;
        if access(p, &owner) == Access::Operator {
            self.record_operator_access(p, "get", operation_id, &owner);
        }
        Ok(answer)
    }

    /// The operation as `mhs.operations.get` answers it, and its owner, if
    /// `p` may see it.
    fn operation_view(
        &self,
        p: &Principal,
        operation_id: &str,
    ) -> Result<(Value, String), ApiError> {
        if let Ok(ops) = self.inner.ops.lock() {
            if let Some(op) = ops.get(operation_id) {
                if access(p, &op.principal_id) == Access::None {
                    return Err(Self::unknown_operation(operation_id));
                }
                let answer = json!({
                    "operation_id": operation_id,
                    "state": "running",
                    "device_id": self.inner.devices[op.device].id(),
                    "capability_id": op.capability_id,
                    "cancel_requested": op.cancel.is_cancelled(),
                });
                return Ok((answer, op.principal_id.clone()));
            }
        }
        let finished = self.inner.finished_ops.lock().ok();
        let Some(op) = finished
            .as_ref()
            .and_then(|f| f.get(operation_id))
            .filter(|op| access(p, &op.owner) != Access::None)
        else {
            return Err(Self::unknown_operation(operation_id));
        };
        let answer = json!({
            "operation_id": operation_id,
            "state": "finished",
            "status": op.status.as_str(),
            "command_id": op.command_id,
            "receipt_id": op.receipt_id,
            "device_id": self.inner.devices[op.device].id(),
            "capability_id": op.capability_id,
        });
        Ok((answer, op.owner.clone()))
    }

    /// `mhs.operations.cancel`: delivers cancellation to a running operation
    /// of the caller's own, or of anyone's for an operator (recorded as
    /// evidence). Another principal's operation reads as unknown and is
    /// left running.
    ///
    /// # Errors
    /// `MHS.OPERATION.UNKNOWN`.
    pub fn operation_cancel(&self, p: &Principal, operation_id: &str) -> Result<Value, ApiError> {
        let running = match self.inner.ops.lock() {
            Ok(ops) => ops.get(operation_id).map(|op| {
                let owner = op.principal_id.clone();
                let who = access(p, &owner);
                // A stop is never cancelled; a non-abortable call ends within
                // its lease or duration, whoever asks.
                let refused = if op.stop_class {
                    Some("stop_operations_are_never_cancelled")
                } else if !op.abortable {
                    Some("not_abortable")
                } else {
                    None
                };
                if who != Access::None && refused.is_none() {
                    op.cancel.cancel();
                }
                (who, owner, refused)
            }),
            Err(_) => None,
        };
        match running {
            Some((Access::None, _, _)) => Err(Self::unknown_operation(operation_id)),
            Some((who, owner, refused)) => {
                if who == Access::Operator {
                    self.record_operator_access(p, "cancel", operation_id, &owner);
                }
                Ok(match refused {
                    Some(reason) => {
                        json!({"operation_id": operation_id, "cancel_delivered": false, "reason": reason})
                    }
                    None => {
                        json!({"operation_id": operation_id, "cancel_delivered": true, "note": "delivered, not confirmed: the operation's receipt says how it ended"})
                    }
                })
            }
            None => {
                let (finished, owner) = self.operation_view(p, operation_id)?;
                if access(p, &owner) == Access::Operator {
                    self.record_operator_access(p, "cancel", operation_id, &owner);
                }
                Ok(
                    json!({"operation_id": operation_id, "cancel_delivered": false, "reason": "already_finished", "status": finished["status"]}),
                )
            }
        }
    }

    /// The running operation of `command_id`, whatever session runs it
    /// (command ids are endpoint-wide and bound to one principal).
    pub fn operation_of_command(&self, command_id: &str) -> Option<String> {
        let ops = self.inner.ops.lock().ok()?;
        ops.iter()
            .find(|(_, op)| op.command_id == command_id)
            .map(|(id, _)| id.clone())
    }

    /// The running operation of `command_id` in session `session_id`, if any.
    ///
    /// A surface whose client cancels a call (MCP `notifications/cancelled`, a
    /// closed stream) knows the `command_id` it sent, not the operation id the
    /// kernel minted; the session scoping keeps one caller from finding
    /// another's operation.
    pub fn operation_for_command(&self, session_id: &str, command_id: &str) -> Option<String> {
        let ops = self.inner.ops.lock().ok()?;
        ops.iter()
            .find(|(_, op)| {
                op.command_id == command_id && op.session_id.as_deref() == Some(session_id)
            })
            .map(|(id, _)| id.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(n: usize) -> FinishedOp {
        FinishedOp {
            status: Status::Completed,
            command_id: format!("c{n}"),
            receipt_id: format!("r{n}"),
            device: 0,
            capability_id: "cap.thermal.setpoint.v1".into(),
            owner: "agent".into(),
        }
    }

    #[test]
    fn finished_operations_keep_the_newest_half_and_never_rehash_under_churn() {
        const GENERATION_MAX: usize = FINISHED_MAX / 2;
        let mut f = Finished::default();
        let sized = f.0.young_slots();
        for n in 0..FINISHED_MAX * 5 {
            f.insert(&format!("op-{n}"), summary(n));
            assert!(f.0.len() <= FINISHED_MAX, "after op-{n}");
            assert_eq!(f.0.young_slots(), sized, "no rehash or growth after op-{n}");
            if n % 997 == 0 {
                for back in [0, n.min(GENERATION_MAX - 1)] {
                    let id = format!("op-{}", n - back);
                    assert_eq!(
                        f.get(&id).map(|op| op.command_id.as_str()),
                        Some(format!("c{}", n - back).as_str())
                    );
                }
                // Whatever was retired is gone well before the next rotation.
                assert!(f.0.retiring_len() <= GENERATION_MAX);
            }
        }
        assert!(f.get("op-0").is_none());
    }
}
