//! Receipts: the typed receipt, rejected receipts recorded as evidence, the
//! evidence entry of a dispatched command's receipt, and the commits that
//! carry a surface's rider.
//!
//! **Fail-closed rule:** a rejected receipt is evidence but never the
//! recorded outcome of its `command_id`.

use crate::dispatch::answer::{write_receipt, ReceiptExtras};
use crate::dispatch::rider::Boarded;
use crate::kernel::Kernel;
use crate::order::Ctx;
use serde_json::{json, Map, Value};
use tether_core::ids::{self};
use tether_core::receipt::now_ms;
use tether_core::{Receipt, Refusal, Status};
use tether_store::canonical::CanonicalText;
use tether_store::{
    canonical, CanonicalBody, Commit, CommitAck, EventBody, EventDraft, StoreError,
};

/// The receipt back out of a receipt commit built by `finish`: the `receipt`
/// member of its only event.
pub(crate) fn take_receipt(commit: Commit) -> Value {
    // The receipt's entry, wherever a rider put it.
    let at = commit.receipts.first().map_or(0, |r| r.event);
    let receipt = commit
        .events
        .into_iter()
        .nth(at)
        .and_then(|e| match e.body {
            EventBody::Value(Value::Object(mut m)) => m.remove("receipt"),
            _ => None,
        });
    debug_assert!(receipt.is_some(), "a receipt commit holds its receipt");
    receipt.unwrap_or(Value::Null)
}

/// Where a dispatched command's admission decision is recorded.
#[derive(Clone, Copy)]
pub(crate) enum Admission {
    /// In its own entry before dispatch (a physical call, or one that drew a
    /// budget), or not at all (a read binding): the receipt's entry names
    /// the caller.
    Recorded,
    /// With the receipt, in one entry (a simulated call): the admission part
    /// keeps only what the receipt lacks. Holds the binding's risk class.
    WithReceipt(&'static str),
}

/// The evidence entry of a dispatched command's receipt, and the receipt's
/// canonical text when the entry was written as text (the common case). A
/// document the canonical writer refuses (nested past the evidence bound)
/// takes the value path, where the store refuses it as before.
pub(crate) fn receipt_event(
    ctx: &Ctx,
    receipt: Receipt,
    latency_us: u64,
    op_id: &str,
    admission: Admission,
) -> (EventDraft, Option<CanonicalText>) {
    const KIND: &str = "command.receipt";
    let extras = ReceiptExtras {
        latency_us,
        policy: ctx.policy.get().map(|p| &**p),
        approval_id: ctx.approval.get().map(String::as_str),
        operation_id: Some(op_id),
    };
    if let Ok(text) = write_receipt(&receipt, &extras) {
        if let Some(body) = receipt_body_text(ctx, &text, admission) {
            let body = CanonicalBody::new(body, Some(ctx.command_id.clone()));
            let event = EventDraft {
                kind: KIND.into(),
                body: EventBody::Canonical(body),
            };
            return (event, Some(text));
        }
    }
    let mut wire = receipt.into_json();
    if let Value::Object(m) = &mut wire {
        m.insert("latency_us".into(), json!(latency_us));
        if let Some(p) = extras.policy {
            m.insert("policy".into(), p.clone());
        }
        if let Some(id) = extras.approval_id {
            m.insert("approval_id".into(), json!(id));
        }
        m.insert("operation_id".into(), json!(op_id));
    }
    // Answered now and replayed later from the chain: both must be the same
    // document, so numbers take their canonical form here.
    canonical::normalize_numbers(&mut wire);
    let mut body = Map::with_capacity(3);
    match admission {
        Admission::WithReceipt(risk) => {
            body.insert(
                "admission".into(),
                json!({"decision": "allow", "principal": ctx.principal.to_json(), "session_id": ctx.session_id, "risk": risk}),
            );
        }
        Admission::Recorded => {
            body.insert("principal".into(), ctx.principal.to_json());
            body.insert("session_id".into(), json!(ctx.session_id));
        }
    }
    body.insert("receipt".into(), wire);
    let event = EventDraft {
        kind: KIND.into(),
        body: Value::Object(body).into(),
    };
    (event, None)
}

/// The canonical body of a receipt entry around the receipt's text: the
/// same members the value path writes.
pub(crate) fn receipt_body_text(
    ctx: &Ctx,
    receipt_text: &CanonicalText,
    admission: Admission,
) -> Option<CanonicalText> {
    use tether_store::canonical::{object_text, Member};
    let principal = object_text(
        &mut [
            ("id", Member::Str(&ctx.principal.id)),
            ("kind", Member::Str(ctx.principal.kind.as_str())),
        ],
        1,
    )
    .ok()?;
    let session = ctx.session_id.as_deref().map_or(Member::Null, Member::Str);
    match admission {
        Admission::WithReceipt(risk) => {
            let part = object_text(
                &mut [
                    ("decision", Member::Str("allow")),
                    ("principal", Member::Canonical(&principal)),
                    ("risk", Member::Str(risk)),
                    ("session_id", session),
                ],
                1,
            )
            .ok()?;
            object_text(
                &mut [
                    ("admission", Member::Canonical(&part)),
                    ("receipt", Member::Canonical(receipt_text)),
                ],
                1,
            )
            .ok()
        }
        Admission::Recorded => object_text(
            &mut [
                ("principal", Member::Canonical(&principal)),
                ("receipt", Member::Canonical(receipt_text)),
                ("session_id", session),
            ],
            1,
        )
        .ok(),
    }
}

impl Kernel {
    /// A receipt with the kernel's extra members (latency, policy verdict,
    /// approval): the value path, for refusals and every receipt that is not
    /// a dispatched command's.
    pub(crate) fn receipt(
        &self,
        ctx: &Ctx,
        capability_id: &str,
        resource: Option<&str>,
        status: Status,
        output: Option<Value>,
        error: Option<Refusal>,
    ) -> Receipt {
        let mut r = self.receipt_base(ctx, capability_id, resource, status, output, error);
        r.extra.insert(
            "latency_us".into(),
            json!(ctx.t0.elapsed().as_micros() as u64),
        );
        if let Some(p) = ctx.policy.get() {
            r.extra.insert("policy".into(), Value::clone(p));
        }
        if let Some(id) = ctx.approval.get() {
            r.extra.insert("approval_id".into(), json!(id));
        }
        r
    }

    /// The typed receipt without extra members.
    pub(crate) fn receipt_base(
        &self,
        ctx: &Ctx,
        capability_id: &str,
        resource: Option<&str>,
        status: Status,
        output: Option<Value>,
        error: Option<Refusal>,
    ) -> Receipt {
        let dev = &self.inner.devices[ctx.device];
        Receipt {
            receipt_id: ids::mint("rcpt_"),
            command_id: ctx.command_id.clone(),
            device_id: dev.id().to_owned(),
            capability_id: capability_id.to_owned(),
            resource: resource.map(str::to_owned),
            status,
            output,
            error,
            input_digest: ctx.digest.clone(),
            state_revision_before: None,
            state_revision_after: None,
            decision: ctx
                .policy
                .get()
                .and_then(|p| p.get("decision"))
                .and_then(Value::as_str)
                .map(|d| match d {
                    "allow" => "allow",
                    "hold" => "hold",
                    _ => "deny",
                }),
            mode: dev.spec.manifest.mode.as_str(),
            accepted_at_ms: ctx.accepted_at_ms,
            completed_at_ms: now_ms(),
            extra: Map::new(),
        }
    }

    pub(crate) async fn reject_binding(&self, ctx: &Ctx, refusal: Refusal) -> Value {
        let b = &self.inner.devices[ctx.device].spec.bindings[ctx.binding];
        let (cap, res) = (b.capability_id.clone(), b.resource.clone());
        let rev = self.inner.devices[ctx.device].revision(&res);
        let mut v = self.reject(ctx, &cap, Some(&res), refusal).await;
        v["state_revision_before"] = json!(rev);
        v["state_revision_after"] = json!(rev);
        v
    }

    /// A rejected receipt: evidence, never the recorded outcome of its id.
    pub(crate) async fn reject(
        &self,
        ctx: &Ctx,
        capability_id: &str,
        resource: Option<&str>,
        refusal: Refusal,
    ) -> Value {
        let receipt = self.receipt(
            ctx,
            capability_id,
            resource,
            Status::Rejected,
            None,
            Some(refusal),
        );
        let wire = receipt.into_json();
        let commit = Commit {
            events: vec![EventDraft {
                kind: "command.rejected".into(),
                body: json!({"receipt": wire, "principal": ctx.principal.to_json(), "session_id": ctx.session_id}).into(),
            }],
            ..Commit::default()
        };
        if let Err(e) = self.commit_for(ctx, commit).await {
            tracing::warn!(error = %e, "rejection evidence could not be made durable");
        }
        wire
    }

    /// Commits one of a command's records and waits until it is durable,
    /// taking the surface's rider along if it still waits (see [`Rider`]).
    pub(crate) async fn commit_for(
        &self,
        ctx: &Ctx,
        mut commit: Commit,
    ) -> Result<CommitAck, StoreError> {
        let boarded = ctx.rider.as_ref().and_then(|r| r.board(&mut commit));
        let durable = self.commit_waiting(commit).await;
        Boarded::land_opt(boarded, &durable);
        durable
    }

    /// [`Kernel::commit_for`] for a commit the caller still needs afterwards.
    pub(crate) async fn commit_ref_for(
        &self,
        ctx: &Ctx,
        commit: &mut Commit,
    ) -> Result<CommitAck, StoreError> {
        let boarded = ctx.rider.as_ref().and_then(|r| r.board(commit));
        let durable = self.commit_ref_waiting(commit).await;
        Boarded::land_opt(boarded, &durable);
        durable
    }
}
