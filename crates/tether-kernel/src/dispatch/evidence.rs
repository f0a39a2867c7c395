//! Fail-closed evidence for physical calls.
//!
//! A physical call's start is durable before dispatch (or the call is refused)
//! and is an open operation in the store until its receipt lands. If the
//! receipt cannot be recorded, a smaller "crashed finish" is tried; if even
//! that fails, the resource is held — effectful commands on it are refused
//! with `physical_evidence_unreconciled` — while a background task keeps
//! trying. On start-up, open operations left by a crash get crashed finishes.
//! Stops are exempt from all of this: they always run.

use crate::kernel::Kernel;
use serde_json::json;
use std::time::Duration;
use tether_core::ids;
use tether_core::receipt::now_ms;
use tether_core::Code;
use tether_store::{Commit, EventDraft, ReceiptRef, StoreError};

/// Delay between attempts to reconcile a held resource.
const RECONCILE_DELAY: Duration = Duration::from_millis(500);
/// Attempts before the reconciler gives up (the resource stays held).
const RECONCILE_ATTEMPTS_MAX: u32 = 100_000;

impl Kernel {
    /// The open receipts holding a resource, if any.
    pub(crate) fn unreconciled(&self, d: usize, resource: &str) -> Option<Vec<String>> {
        let held = self.inner.devices[d].unreconciled.lock().ok()?;
        held.get(resource)
            .filter(|s| !s.is_empty())
            .map(|s| s.iter().cloned().collect())
    }

    /// A crashed finish: an `unknown` receipt under the command's idempotency
    /// key (so a replay answers it instead of running the call again), an
    /// evidence entry, and the open operation closed.
    fn crashed_finish_commit(
        &self,
        d: usize,
        resource: &str,
        command_id: &str,
        operation_id: &str,
        key: &str,
        reason: &str,
    ) -> Commit {
        let dev = &self.inner.devices[d];
        let receipt = unknown_receipt(command_id, &json!(dev.id()), &json!(resource), reason);
        Commit {
            events: vec![EventDraft {
                kind: "command.finish_crashed".into(),
                body: json!({"command_id": command_id, "operation_id": operation_id, "device_id": dev.id(), "resource": resource, "reason": reason, "receipt": receipt}).into(),
            }],
            receipts: vec![ReceiptRef {
                command_id: command_id.to_owned(),
                input_digest: key.to_owned(),
                event: 0,
            }],
            closed_ops: vec![command_id.to_owned()],
            ..Commit::default()
        }
    }

    /// Records a crashed finish; when that fails too, holds the resource and
    /// starts a reconciler. Returns whether the resource is now held.
    pub(crate) async fn record_crashed_finish(
        &self,
        d: usize,
        resource: &str,
        command_id: &str,
        operation_id: &str,
        key: &str,
        reason: &str,
    ) -> bool {
        let commit = self.crashed_finish_commit(d, resource, command_id, operation_id, key, reason);
        if self.commit(commit).await.is_ok() {
            return false;
        }
        if let Ok(mut held) = self.inner.devices[d].unreconciled.lock() {
            held.entry(resource.to_owned())
                .or_default()
                .insert(command_id.to_owned());
        }
        tracing::error!(
            command_id,
            resource,
            "physical evidence unreconciled: the resource is held"
        );
        let kernel = self.clone();
        let (resource, command_id, operation_id, key, reason) = (
            resource.to_owned(),
            command_id.to_owned(),
            operation_id.to_owned(),
            key.to_owned(),
            reason.to_owned(),
        );
        tokio::spawn(async move {
            for _ in 0..RECONCILE_ATTEMPTS_MAX {
                tokio::time::sleep(RECONCILE_DELAY).await;
                let commit = kernel.crashed_finish_commit(
                    d,
                    &resource,
                    &command_id,
                    &operation_id,
                    &key,
                    &reason,
                );
                if kernel.commit(commit).await.is_ok() {
                    if let Ok(mut held) = kernel.inner.devices[d].unreconciled.lock() {
                        if let Some(set) = held.get_mut(&resource) {
                            set.remove(&command_id);
                        }
                    }
                    return;
                }
            }
        });
        true
    }
}

/// Start-up, before the idempotency index is loaded: every open operation
/// left by a crash gets a crashed finish and an `unknown` receipt under its
/// idempotency key (so a replay of its command id says so, and never runs it
/// again).
///
/// An operation written by an endpoint still alive on the store (`live`:
/// its lease holds) is its own to finish and is left alone; one without an
/// instance (written before leases) is reconciled, as before.
pub(crate) fn reconcile_orphans(
    store: &dyn tether_store::Store,
    live: &std::collections::HashSet<String>,
) -> Result<usize, StoreError> {
    let orphans: Vec<_> = store
        .open_ops()?
        .into_iter()
        .filter(|op| {
            op.info
                .get("instance")
                .and_then(serde_json::Value::as_str)
                .is_none_or(|i| !live.contains(i))
        })
        .collect();
    let count = orphans.len();
    let mut revisions = store.revisions()?;
    for op in orphans {
        let receipt_exists = store.receipt(&op.command_id)?.is_some();
        // The call was dispatched: its resource's revision advances by one
        // whatever the outcome, unknown included (the driver may have acted).
        let revision = (!receipt_exists)
            .then(|| crashed_revision(&op.info, &mut revisions))
            .flatten();
        let receipt = crashed_receipt(&op, revision.as_ref());
        let key = op
            .info
            .get("key")
            .and_then(|v| v.as_str())
            .unwrap_or("crashed")
            .to_owned();
        // A receipt that did land is the outcome; only the open record is stale.
        let receipts = if receipt_exists {
            Vec::new()
        } else {
            vec![ReceiptRef {
                command_id: op.command_id.clone(),
                input_digest: key,
                event: 0,
            }]
        };
        store.commit_blocking(Commit {
            events: vec![EventDraft { kind: "command.finish_crashed".into(), body: json!({"command_id": op.command_id, "reason": "endpoint_crashed", "open_operation": op.info, "receipt": receipt}).into() }],
            receipts,
            revisions: revision.into_iter().collect(),
            closed_ops: vec![op.command_id],
            ..Commit::default()
        })?;
    }
    Ok(count)
}

/// The revision row a crashed call leaves: one past the revision it was
/// dispatched at (or the stored one, for a record that does not say).
fn crashed_revision(
    info: &serde_json::Value,
    revisions: &mut [tether_store::RevisionRow],
) -> Option<tether_store::RevisionRow> {
    let device_id = info.get("device_id")?.as_str()?;
    let resource = info.get("resource")?.as_str()?;
    let row = revisions
        .iter_mut()
        .find(|r| r.device_id == device_id && r.resource == resource);
    let stored = row.as_ref().map_or(0, |r| r.revision);
    let before = info
        .get("revision_before")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(stored)
        .max(stored);
    let next = tether_store::RevisionRow {
        device_id: device_id.to_owned(),
        resource: resource.to_owned(),
        revision: before + 1,
    };
    // Two orphans on one resource each advance it.
    if let Some(r) = row {
        r.revision = next.revision;
    }
    Some(next)
}

/// The `unknown` receipt of a call whose finish was never recorded: what
/// its open record knows (capability, operation, mode, when it was
/// accepted, the revision it was dispatched at and the one it leaves).
fn crashed_receipt(
    op: &tether_store::OpenOp,
    revision: Option<&tether_store::RevisionRow>,
) -> serde_json::Value {
    let null = serde_json::Value::Null;
    let field = |k: &str| op.info.get(k).unwrap_or(&null).clone();
    let mut receipt = unknown_receipt(
        &op.command_id,
        op.info.get("device_id").unwrap_or(&null),
        op.info.get("resource").unwrap_or(&null),
        "endpoint_crashed",
    );
    receipt["capability_id"] = field("capability_id");
    receipt["operation_id"] = field("operation_id");
    receipt["input_digest"] = field("input_digest");
    receipt["mode"] = field("mode");
    receipt["accepted_at_ms"] = field("accepted_at_ms");
    // It was dispatched, so it had passed the policy.
    receipt["decision"] = json!("allow");
    if let Some(r) = revision {
        receipt["state_revision_before"] = json!(r.revision - 1);
        receipt["state_revision_after"] = json!(r.revision);
    }
    receipt
}

fn unknown_receipt(
    command_id: &str,
    device_id: &serde_json::Value,
    resource: &serde_json::Value,
    reason: &str,
) -> serde_json::Value {
    json!({
        "receipt_id": ids::mint("rcpt_"),
        "command_id": command_id,
        "device_id": device_id,
        "resource": resource,
        "status": "unknown",
        "output": null,
        "error": {"mhs_code": Code::OutcomeUnknown.as_str(), "message": "the finish of this call was not recorded (the endpoint stopped while it ran); read the device before acting again", "details": {"reason": reason}, "retryable": Code::OutcomeUnknown.retryable()},
        "completed_at_ms": now_ms(),
        "replayed": false,
    })
}
