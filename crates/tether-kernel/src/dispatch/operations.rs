//! `mhs.operations.get` and `mhs.operations.cancel`.
//!
//! Cancellation is cooperative: an accepted cancel means the request was
//! delivered to the running operation, never that the device stopped. The
//! operation's own receipt says how it ended.

use crate::kernel::Kernel;
use crate::ApiError;
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use tether_core::{Code, Receipt, Status};

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
}

/// A bounded memory of finished operations: id -> summary.
#[derive(Debug, Default)]
pub(crate) struct Finished {
    by_id: HashMap<String, FinishedOp>,
    order: VecDeque<String>,
}

impl Finished {
    fn insert(&mut self, op_id: &str, summary: FinishedOp) {
        self.by_id.insert(op_id.to_owned(), summary);
        self.order.push_back(op_id.to_owned());
        while self.order.len() > FINISHED_MAX {
            if let Some(old) = self.order.pop_front() {
                self.by_id.remove(&old);
            }
        }
    }
}

impl Kernel {
    pub(crate) fn note_finished(&self, op_id: &str, device: usize, receipt: &Receipt) {
        let summary = FinishedOp {
            status: receipt.status,
            command_id: receipt.command_id.clone(),
            receipt_id: receipt.receipt_id.clone(),
            device,
            capability_id: receipt.capability_id.clone(),
        };
        if let Ok(mut f) = self.inner.finished_ops.lock() {
            f.insert(op_id, summary);
        }
    }

    fn unknown_operation(id: &str) -> ApiError {
        ApiError::new(
            Code::OperationUnknown,
            format!("no running or recently finished operation `{id}`"),
            json!({"operation_id": id}),
        )
    }

    /// `mhs.operations.get`.
    ///
    /// # Errors
    /// `MHS.OPERATION.UNKNOWN`.
    pub fn operation_get(&self, operation_id: &str) -> Result<Value, ApiError> {
        if let Ok(ops) = self.inner.ops.lock() {
            if let Some(op) = ops.get(operation_id) {
                return Ok(json!({
                    "operation_id": operation_id,
                    "state": "running",
                    "device_id": self.inner.devices[op.device].id(),
                    "capability_id": op.capability_id,
                    "cancel_requested": op.cancel.is_cancelled(),
                }));
            }
        }
        let finished = self.inner.finished_ops.lock().ok();
        let Some(op) = finished.as_ref().and_then(|f| f.by_id.get(operation_id)) else {
            return Err(Self::unknown_operation(operation_id));
        };
        Ok(json!({
            "operation_id": operation_id,
            "state": "finished",
            "status": op.status.as_str(),
            "command_id": op.command_id,
            "receipt_id": op.receipt_id,
            "device_id": self.inner.devices[op.device].id(),
            "capability_id": op.capability_id,
        }))
    }

    /// `mhs.operations.cancel`: delivers cancellation to a running operation.
    ///
    /// # Errors
    /// `MHS.OPERATION.UNKNOWN`.
    pub fn operation_cancel(&self, operation_id: &str) -> Result<Value, ApiError> {
        if let Ok(ops) = self.inner.ops.lock() {
            if let Some(op) = ops.get(operation_id) {
                if op.stop_class {
                    return Ok(
                        json!({"operation_id": operation_id, "cancel_delivered": false, "reason": "stop_operations_are_never_cancelled"}),
                    );
                }
                op.cancel.cancel();
                return Ok(
                    json!({"operation_id": operation_id, "cancel_delivered": true, "note": "delivered, not confirmed: the operation's receipt says how it ended"}),
                );
            }
        }
        let finished = self.operation_get(operation_id)?;
        Ok(
            json!({"operation_id": operation_id, "cancel_delivered": false, "reason": "already_finished", "status": finished["status"]}),
        )
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
