//! Step 10's approval gate, and an approval's life after it: made durable
//! before its hold is answered, reserved by the command it covers, given
//! back on a later refusal, spent on dispatch, revoked by an e-stop.
//!
//! **Owns:** [`Kernel::approval_gate`] (covered, still waiting, closed, or a
//! new approval), [`Need`] and [`Gate`], persisting a new approval,
//! reserve / release / spend, revocation, and the open approval a request
//! without a command id of its own resumes.
//! **Never belongs here:** votes (`verbs.rs`); deciding that a command needs
//! an approval (`check/policy.rs`).
//! **Fail-closed rule:** only an approved, unused, unreserved approval whose
//! quorum is still the policy's covers a command; a table that cannot be
//! locked refuses; a principal at its bound of open approvals, or an
//! endpoint at its own, refuses new holds (`MHS.PROTOCOL.LIMIT`); a new
//! approval that
//! cannot be made durable is forgotten and the hold refused as
//! `EVIDENCE.UNAVAILABLE`.

use crate::approvals::{
    prune_closed, request_key, split_key, Approval, Approvals, Status, APPROVALS_MAX,
};
use crate::bounds::limit_refusal;
use crate::kernel::{Kernel, Principal};
use serde_json::{json, Value};
use tether_core::ids;
use tether_core::receipt::now_ms;
use tether_core::{Code, Refusal};
use tether_store::{ApprovalRow, Commit, EventDraft};

/// What the request needs from an approval.
pub(crate) struct Need<'a> {
    /// The fingerprint: requester, command id, binding, input digest.
    pub key: String,
    pub kind: &'static str,
    pub quorum: u32,
    pub reason: &'a str,
    pub policies: &'a [String],
    /// Binding and request facts recorded with a new approval.
    pub facts: Value,
    pub requester: &'a Principal,
}

/// The gate's answer.
pub(crate) enum Gate {
    /// An approved, unused approval covers this exact request.
    Covered(String),
    /// Not (yet) approved: the refusal to answer with. `new` names an
    /// approval created by this request that must be made durable.
    Refused {
        refusal: Refusal,
        new: Option<String>,
    },
}

fn lock_refusal() -> Refusal {
    Refusal::new(
        Code::ProtocolInternal,
        "the approval table is unavailable",
        json!({"reason": "approvals_unavailable"}),
    )
}

/// One request at the gate: what it needs, whether the control policy held
/// it (else the permit route asks), and when.
struct Ask<'a, 'n> {
    need: &'a Need<'n>,
    held: bool,
    now: u64,
}

impl Ask<'_, '_> {
    /// The refusal of a request whose approval a person must still decide.
    fn waiting(&self, a: &Approval, msg: &str) -> Refusal {
        let code = if self.held {
            Code::PolicyHeld
        } else {
            Code::SafetyApprovalRequired
        };
        let need = self.need;
        Refusal::new(
            code,
            format!("{msg}; a person must decide (approval `{}`)", a.id),
            json!({"approval_id": a.id, "status": a.status_at(self.now).as_str(), "quorum": a.quorum, "approvals": a.approvals(), "reason": need.reason, "policies": need.policies, "expires_at_ms": a.expires_at_ms}),
        )
    }
}

impl Kernel {
    /// Whether any approval is open for a request (cheap: one lock).
    pub(crate) fn approvals_open(&self) -> bool {
        self.inner
            .approvals
            .lock()
            .is_ok_and(|t| !t.by_request.is_empty())
    }

    /// The command id of an open approval (pending, or approved and not in
    /// use) that `requester` holds for exactly this binding and input. A
    /// request that brings no command id of its own resumes it: a surface that
    /// mints ids (MCP) would otherwise make a new hold on every retry, and
    /// the approval people decided could never be used. The whole evaluation
    /// order still runs for the resumed command.
    pub(crate) fn open_approval_command_id(
        &self,
        requester: &str,
        binding_key: &str,
    ) -> Option<String> {
        let t = self.inner.approvals.lock().ok()?;
        if t.by_request.is_empty() {
            return None;
        }
        let id = t.by_request.get(&request_key(requester, binding_key))?;
        let a = t.by_id.get(id)?;
        let open = match a.status_at(now_ms()) {
            Status::Pending => true,
            Status::Approved => a.reserved_by.is_none(),
            Status::Denied | Status::Used | Status::Expired | Status::Revoked => false,
        };
        if !open {
            return None;
        }
        split_key(requester, &a.key).map(|(command_id, _)| command_id.to_owned())
    }

    /// An e-stop of device `device_id` revokes its open approvals (pending,
    /// or approved and not yet used): each record as it must be stored.
    pub(crate) fn revoke_approvals(&self, device_id: &str) -> Vec<ApprovalRow> {
        self.revoke_approvals_before(device_id, u64::MAX)
    }

    /// As [`Self::revoke_approvals`], for the approvals requested before
    /// `before_ms` only: a trip this process did not see (made by `tether
    /// estop` while no endpoint ran) revokes what was asked for before it.
    pub(crate) fn revoke_approvals_before(
        &self,
        device_id: &str,
        before_ms: u64,
    ) -> Vec<ApprovalRow> {
        let Ok(mut t) = self.inner.approvals.lock() else {
            return Vec::new();
        };
        let now = now_ms();
        let mut rows = Vec::new();
        for a in t.by_id.values_mut() {
            let open = matches!(a.status_at(now), Status::Pending | Status::Approved);
            let before = a.base["created_at_ms"].as_u64().unwrap_or(0) < before_ms;
            if open && before && a.base["device_id"].as_str() == Some(device_id) {
                a.status = Status::Revoked;
                a.base["revoked_at_ms"] = json!(now);
                rows.push(ApprovalRow {
                    approval_id: a.id.clone(),
                    record: a.stored(),
                });
            }
        }
        rows
    }

    /// Step 10's approval gate. `create` is false for dry runs.
    pub(crate) fn approval_gate(&self, need: &Need<'_>, held: bool, create: bool) -> Gate {
        // A quorum met in another process covers this retry at once.
        self.sync_approvals();
        let Ok(mut t) = self.inner.approvals.lock() else {
            return Gate::Refused {
                refusal: lock_refusal(),
                new: None,
            };
        };
        let ask = Ask {
            need,
            held,
            now: now_ms(),
        };
        if let Some(gate) = reopen_short(&mut t, &ask) {
            return gate;
        }
        if let Some(a) = t.by_key.get(&need.key).and_then(|id| t.by_id.get(id)) {
            return existing(a, &ask);
        }
        self.create_approval(&mut t, &ask, create)
    }

    /// A request no approval answers yet: a new pending approval, kept in
    /// the table (not yet durable) unless this is a dry run or the table is
    /// full.
    fn create_approval(&self, t: &mut Approvals, ask: &Ask<'_, '_>, create: bool) -> Gate {
        let (need, now) = (ask.need, ask.now);
        let id = ids::mint_secret("appr_");
        let draft = Approval {
            id: id.clone(),
            key: need.key.clone(),
            requester_id: need.requester.id.clone(),
            status: Status::Pending,
            quorum: need.quorum.max(1),
            expires_at_ms: now.saturating_add(self.inner.config.approval_ttl_ms),
            votes: Vec::new(),
            base: {
                let mut b = need.facts.clone();
                b["key"] = json!(need.key);
                b["kind"] = json!(need.kind);
                b["requested_by"] = need.requester.to_json();
                b["reason"] = json!(need.reason);
                b["policies"] = json!(need.policies);
                b["created_at_ms"] = json!(now);
                // The record as every endpoint reads it back from the store
                // (`5.0` written `5`): this process's copy, which a merge now
                // keeps, must show the same numbers.
                tether_core::canonical::normalize_numbers(&mut b);
                b
            },
            reserved_by: None,
            durable: false,
        };
        let refusal = ask.waiting(
            &draft,
            if ask.held {
                "held by the control policy"
            } else {
                need.reason
            },
        );
        if !create {
            return Gate::Refused { refusal, new: None };
        }
        if let Some(refusal) = self.approvals_bound(t, &need.requester.id, now) {
            return Gate::Refused { refusal, new: None };
        }
        t.insert(draft);
        Gate::Refused {
            refusal,
            new: Some(id),
        }
    }

    /// Why a new approval of `requester` may not be opened now, if it may
    /// not: the requester already holds its bound of open approvals, the
    /// endpoint holds its bound, or the table (denials included) is full.
    /// Closed approvals are pruned first when the table is large enough for
    /// a bound to be near.
    fn approvals_bound(&self, t: &mut Approvals, requester: &str, now: u64) -> Option<Refusal> {
        let config = &self.inner.config;
        let per = config.approvals_open_per_principal_max;
        if t.by_id.len() < per {
            return None;
        }
        prune_closed(t, now);
        let (mut total, mut mine) = (0usize, 0usize);
        for a in t.by_id.values() {
            if matches!(a.status_at(now), Status::Pending | Status::Approved) {
                total += 1;
                if a.requester_id == requester {
                    mine += 1;
                }
            }
        }
        if mine >= per {
            return Some(limit_refusal(
                "this principal already holds its bound of open approvals",
                "approvals_open_per_principal_full",
                Some("limits.approvals_open_per_principal_max"),
                per,
            ));
        }
        if total >= config.approvals_open_max {
            return Some(limit_refusal(
                "the endpoint holds its bound of open approvals",
                "approvals_open_full",
                Some("limits.approvals_open_max"),
                config.approvals_open_max,
            ));
        }
        (t.by_id.len() >= APPROVALS_MAX).then(|| {
            limit_refusal(
                "the approval table is full (denials are kept)",
                "approvals_full",
                None,
                APPROVALS_MAX,
            )
        })
    }

    /// Makes a new approval durable before its hold is answered. On failure
    /// the approval is forgotten and the refusal says evidence is unavailable.
    pub(crate) async fn persist_new_approval(&self, id: &str) -> Result<(), Refusal> {
        let record = {
            let Ok(t) = self.inner.approvals.lock() else {
                return Err(lock_refusal());
            };
            match t.by_id.get(id) {
                Some(a) if !a.durable => a.stored(),
                _ => return Ok(()),
            }
        };
        let commit = Commit {
            events: vec![EventDraft {
                kind: "approval.requested".into(),
                body: record.clone().into(),
            }],
            approvals: vec![ApprovalRow {
                approval_id: id.to_owned(),
                record,
            }],
            ..Commit::default()
        };
        match self.commit(commit).await {
            Ok(_) => {
                if let Ok(mut t) = self.inner.approvals.lock() {
                    if let Some(a) = t.by_id.get_mut(id) {
                        a.durable = true;
                    }
                }
                Ok(())
            }
            Err(e) => {
                if let Ok(mut t) = self.inner.approvals.lock() {
                    t.remove(id);
                }
                Err(Refusal::new(
                    Code::EvidenceUnavailable,
                    "the approval request could not be made durable; nothing was held",
                    json!({"reason": "approval_not_durable", "store_error": e.to_string()}),
                ))
            }
        }
    }

    /// Reserves a covering approval when the operation registers.
    pub(crate) fn reserve_approval(&self, id: &str, command_id: &str) -> Result<(), Refusal> {
        let mut t = self.inner.approvals.lock().map_err(|_| lock_refusal())?;
        let now = now_ms();
        match t.by_id.get_mut(id) {
            Some(a) if a.status_at(now) == Status::Approved && a.reserved_by.is_none() => {
                a.reserved_by = Some(command_id.to_owned());
                Ok(())
            }
            Some(a) => Err(Refusal::new(
                Code::PolicyApprovalClosed,
                format!("approval `{id}` can no longer be used"),
                json!({"approval_id": id, "status": a.status_at(now).as_str()}),
            )),
            None => Err(Refusal::new(
                Code::PolicyApprovalUnknown,
                format!("approval `{id}` is gone"),
                json!({"approval_id": id}),
            )),
        }
    }

    /// The command was refused after reserving: the approval is given back.
    pub(crate) fn release_approval(&self, id: &str) {
        if let Ok(mut t) = self.inner.approvals.lock() {
            if let Some(a) = t.by_id.get_mut(id) {
                a.reserved_by = None;
            }
        }
    }

    /// The command was dispatched: the approval is spent, durably.
    pub(crate) async fn spend_approval(&self, id: &str, command_id: &str) {
        let record = {
            let Ok(mut t) = self.inner.approvals.lock() else {
                return;
            };
            let Some(a) = t.by_id.get_mut(id) else { return };
            if a.status == Status::Revoked {
                // An e-stop withdrew it while its command was in flight; the
                // revocation stands.
                return;
            }
            a.status = Status::Used;
            a.base["used_by_command_id"] = json!(command_id);
            a.stored()
        };
        let commit = Commit {
            events: vec![EventDraft {
                kind: "approval.used".into(),
                body: json!({"approval_id": id, "command_id": command_id}).into(),
            }],
            approvals: vec![ApprovalRow {
                approval_id: id.to_owned(),
                record,
            }],
            ..Commit::default()
        };
        if let Err(e) = self.commit(commit).await {
            // The receipt is durable: a re-submission replays it, and the key
            // includes the command id, so the approval cannot cover another.
            tracing::warn!(error = %e, approval_id = id, "approval use could not be recorded");
        }
    }
}

/// An approval given under a smaller quorum than the policy asks for now
/// does not cover the command: the resumed command is weighed again, so the
/// approval is reopened for the votes still missing (and must be made
/// durable again).
fn reopen_short(t: &mut Approvals, ask: &Ask<'_, '_>) -> Option<Gate> {
    let need = ask.need;
    let id = t.by_key.get(&need.key).cloned()?;
    let a = t.by_id.get_mut(&id)?;
    let short = a.approvals() < usize::try_from(need.quorum).unwrap_or(usize::MAX);
    if a.status_at(ask.now) != Status::Approved || a.reserved_by.is_some() || !short {
        return None;
    }
    a.quorum = need.quorum;
    a.status = Status::Pending;
    a.durable = false;
    let message = format!(
        "the policy now asks for {} approvers and {} approved; waiting for the rest",
        need.quorum,
        a.approvals()
    );
    Some(Gate::Refused {
        refusal: ask.waiting(a, &message),
        new: Some(id),
    })
}

/// The answer of the approval this exact request already has: covered when
/// approved and free, else why not (in use, waiting, denied, expired, used,
/// revoked).
fn existing(a: &Approval, ask: &Ask<'_, '_>) -> Gate {
    let now = ask.now;
    let closed = |refusal| Gate::Refused { refusal, new: None };
    match a.status_at(now) {
        Status::Approved if a.reserved_by.is_none() => Gate::Covered(a.id.clone()),
        Status::Approved => closed(Refusal::new(
            Code::ConflictCommandIdReuse,
            "the approval is in use by a command still in flight",
            json!({"approval_id": a.id, "reason": "in_flight"}),
        )),
        Status::Pending => closed(ask.waiting(a, "waiting for approval")),
        Status::Denied => closed(Refusal::new(
            Code::PolicyDenied,
            format!("approval `{}` was denied; the denial is final", a.id),
            json!({"approval_id": a.id, "reason": "approval_denied", "votes": a.to_json(now)["votes"]}),
        )),
        Status::Expired => closed(Refusal::new(
            Code::PolicyApprovalExpired,
            format!("approval `{}` expired before it was used; send the command again under a new command_id", a.id),
            json!({"approval_id": a.id, "expires_at_ms": a.expires_at_ms}),
        )),
        Status::Used => closed(Refusal::new(
            Code::PolicyApprovalClosed,
            format!("approval `{}` was already used; approvals are single-use", a.id),
            json!({"approval_id": a.id, "status": "used"}),
        )),
        Status::Revoked => closed(Refusal::new(
            Code::PolicyApprovalClosed,
            format!("approval `{}` was revoked by an e-stop of the device; send the command again under a new command_id and ask again", a.id),
            json!({"approval_id": a.id, "status": "revoked"}),
        )),
    }
}
