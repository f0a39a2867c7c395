//! Approvals: durable, fingerprinted, single-use consent from people.
//!
//! A hold (or a hardware command at R2 and above that needs a permit) creates
//! one approval bound to the requester, the `command_id`, the binding and the
//! exact input digest. Operators vote through `mhs.approvals.decide`; the
//! requester never votes on its own request and agents never vote at all.
//! Quorum approvals need that many distinct operators; one denial is final.
//! An approval is used once: the same principal re-submits the same
//! `command_id` with the same input, the whole evaluation order runs again
//! (so a policy or limit that now refuses still refuses), and on dispatch the
//! approval is spent. Every request, vote and outcome is an evidence entry;
//! the latest record of each approval lives in the store, so approvals survive
//! a restart (sessions need not).

use crate::kernel::{Kernel, Principal};
use crate::ApiError;
use serde_json::{json, Value};
use std::collections::HashMap;
use tether_core::ids;
use tether_core::receipt::now_ms;
use tether_core::{Code, Refusal};
use tether_store::{ApprovalRow, Commit, EventDraft};

/// Most approvals kept (pending or decided); beyond it new holds are refused.
pub(crate) const APPROVALS_MAX: usize = 20_000;
/// Longest reason text kept from a voter, characters.
const REASON_CHARS_MAX: usize = 1024;

/// Where an approval stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Pending,
    Approved,
    Denied,
    Used,
    Expired,
    /// An e-stop of its device withdrew it before it was used: consent given
    /// before an incident never moves the machine after the reset.
    Revoked,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Denied => "denied",
            Self::Used => "used",
            Self::Expired => "expired",
            Self::Revoked => "revoked",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => Self::Pending,
            "approved" => Self::Approved,
            "denied" => Self::Denied,
            "used" => Self::Used,
            "expired" => Self::Expired,
            "revoked" => Self::Revoked,
            _ => return None,
        })
    }
}

/// One vote.
#[derive(Clone, Debug)]
struct Vote {
    by: String,
    decision: String,
    reason: String,
    at_ms: u64,
}

/// One approval. `record` is its stored form; the fields mirror it.
#[derive(Clone, Debug)]
pub(crate) struct Approval {
    pub id: String,
    key: String,
    requester_id: String,
    status: Status,
    quorum: u32,
    expires_at_ms: u64,
    votes: Vec<Vote>,
    /// The fixed part of the record (binding, digest, requester, reason...).
    base: Value,
    /// A command currently holds it between admission and dispatch.
    reserved_by: Option<String>,
    /// The creating request persists it; others only read it.
    durable: bool,
}

impl Approval {
    fn status_at(&self, now: u64) -> Status {
        match self.status {
            Status::Pending | Status::Approved if now >= self.expires_at_ms => Status::Expired,
            s => s,
        }
    }

    fn approvals(&self) -> usize {
        self.votes
            .iter()
            .filter(|v| v.decision == "approve")
            .count()
    }

    /// The stored and wire form.
    pub(crate) fn to_json(&self, now: u64) -> Value {
        let mut v = self.base.clone();
        v["approval_id"] = json!(self.id);
        v["status"] = json!(self.status_at(now).as_str());
        v["quorum"] = json!(self.quorum);
        v["approvals"] = json!(self.approvals());
        v["expires_at_ms"] = json!(self.expires_at_ms);
        v["votes"] = json!(self
            .votes
            .iter()
            .map(|x| json!({"by": x.by, "decision": x.decision, "reason": x.reason, "at_ms": x.at_ms}))
            .collect::<Vec<_>>());
        v
    }

    fn stored(&self) -> Value {
        // The stored status never says "expired": expiry is a function of time.
        let mut v = self.to_json(0);
        v["status"] = json!(self.status.as_str());
        v
    }

    fn from_stored(row: &ApprovalRow) -> Option<Self> {
        let r = &row.record;
        let votes = r["votes"]
            .as_array()?
            .iter()
            .map(|x| {
                Some(Vote {
                    by: x["by"].as_str()?.to_owned(),
                    decision: x["decision"].as_str()?.to_owned(),
                    reason: x["reason"].as_str().unwrap_or_default().to_owned(),
                    at_ms: x["at_ms"].as_u64().unwrap_or(0),
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Self {
            id: row.approval_id.clone(),
            key: r["key"].as_str()?.to_owned(),
            requester_id: r["requested_by"]["id"].as_str()?.to_owned(),
            status: Status::parse(r["status"].as_str()?)?,
            quorum: u32::try_from(r["quorum"].as_u64()?).ok()?,
            expires_at_ms: r["expires_at_ms"].as_u64()?,
            votes,
            base: r.clone(),
            reserved_by: None,
            durable: true,
        })
    }
}

/// Approvals by id, by fingerprint key, and by request (the fingerprint
/// without its command id: who asked for which binding and input).
#[derive(Debug, Default)]
pub(crate) struct Approvals {
    by_id: HashMap<String, Approval>,
    by_key: HashMap<String, String>,
    by_request: HashMap<String, String>,
}

/// Splits a fingerprint `requester|command_id|binding/digest` into its command
/// id and binding key (a command id never holds `|`).
fn split_key<'k>(requester: &str, key: &'k str) -> Option<(&'k str, &'k str)> {
    key.strip_prefix(requester)?
        .strip_prefix('|')?
        .split_once('|')
}

fn request_key(requester: &str, binding_key: &str) -> String {
    format!("{requester}|{binding_key}")
}

impl Approvals {
    fn insert(&mut self, a: Approval) {
        if let Some((_, binding_key)) = split_key(&a.requester_id, &a.key) {
            self.by_request
                .insert(request_key(&a.requester_id, binding_key), a.id.clone());
        }
        self.by_key.insert(a.key.clone(), a.id.clone());
        self.by_id.insert(a.id.clone(), a);
    }

    fn remove(&mut self, id: &str) -> Option<Approval> {
        let a = self.by_id.remove(id)?;
        self.by_key.remove(&a.key);
        if let Some((_, binding_key)) = split_key(&a.requester_id, &a.key) {
            let rk = request_key(&a.requester_id, binding_key);
            if self.by_request.get(&rk).is_some_and(|x| x == id) {
                self.by_request.remove(&rk);
            }
        }
        Some(a)
    }

    /// Rebuilds the table from stored records. A record that cannot be read
    /// is skipped with a warning: it can then never authorise anything.
    pub(crate) fn restore(rows: &[ApprovalRow]) -> Self {
        let mut t = Self::default();
        for row in rows {
            match Approval::from_stored(row) {
                Some(a) => t.insert(a),
                None => {
                    tracing::warn!(approval_id = %row.approval_id, "unreadable approval record ignored")
                }
            }
        }
        t
    }
}

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
        let Ok(mut t) = self.inner.approvals.lock() else {
            return Gate::Refused {
                refusal: lock_refusal(),
                new: None,
            };
        };
        let now = now_ms();
        let waiting = |a: &Approval, msg: &str| {
            let code = if held {
                Code::PolicyHeld
            } else {
                Code::SafetyApprovalRequired
            };
            Refusal::new(
                code,
                format!("{msg}; a person must decide (approval `{}`)", a.id),
                json!({"approval_id": a.id, "status": a.status_at(now).as_str(), "quorum": a.quorum, "approvals": a.approvals(), "reason": need.reason, "policies": need.policies, "expires_at_ms": a.expires_at_ms}),
            )
        };
        // An approval given under a smaller quorum than the policy asks for
        // now does not cover the command: the resumed command is weighed
        // again, so the approval is reopened for the votes still missing.
        if let Some(id) = t.by_key.get(&need.key).cloned() {
            if let Some(a) = t.by_id.get_mut(&id) {
                let short = a.approvals() < usize::try_from(need.quorum).unwrap_or(usize::MAX);
                if a.status_at(now) == Status::Approved && a.reserved_by.is_none() && short {
                    a.quorum = need.quorum;
                    a.status = Status::Pending;
                    a.durable = false;
                    let message = format!(
                        "the policy now asks for {} approvers and {} approved; waiting for the rest",
                        need.quorum,
                        a.approvals()
                    );
                    return Gate::Refused {
                        refusal: waiting(a, &message),
                        new: Some(id),
                    };
                }
            }
        }
        if let Some(a) = t.by_key.get(&need.key).and_then(|id| t.by_id.get(id)) {
            return match a.status_at(now) {
                Status::Approved if a.reserved_by.is_none() => Gate::Covered(a.id.clone()),
                Status::Approved => Gate::Refused {
                    refusal: Refusal::new(
                        Code::ConflictCommandIdReuse,
                        "the approval is in use by a command still in flight",
                        json!({"approval_id": a.id, "reason": "in_flight"}),
                    ),
                    new: None,
                },
                Status::Pending => Gate::Refused { refusal: waiting(a, "waiting for approval"), new: None },
                Status::Denied => Gate::Refused {
                    refusal: Refusal::new(
                        Code::PolicyDenied,
                        format!("approval `{}` was denied; the denial is final", a.id),
                        json!({"approval_id": a.id, "reason": "approval_denied", "votes": a.to_json(now)["votes"]}),
                    ),
                    new: None,
                },
                Status::Expired => Gate::Refused {
                    refusal: Refusal::new(
                        Code::PolicyApprovalExpired,
                        format!("approval `{}` expired before it was used; send the command again under a new command_id", a.id),
                        json!({"approval_id": a.id, "expires_at_ms": a.expires_at_ms}),
                    ),
                    new: None,
                },
                Status::Used => Gate::Refused {
                    refusal: Refusal::new(
                        Code::PolicyApprovalClosed,
                        format!("approval `{}` was already used; approvals are single-use", a.id),
                        json!({"approval_id": a.id, "status": "used"}),
                    ),
                    new: None,
                },
                Status::Revoked => Gate::Refused {
                    refusal: Refusal::new(
                        Code::PolicyApprovalClosed,
                        format!("approval `{}` was revoked by an e-stop of the device; send the command again under a new command_id and ask again", a.id),
                        json!({"approval_id": a.id, "status": "revoked"}),
                    ),
                    new: None,
                },
            };
        }
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
                b
            },
            reserved_by: None,
            durable: false,
        };
        let refusal = waiting(
            &draft,
            if held {
                "held by the control policy"
            } else {
                need.reason
            },
        );
        if !create {
            return Gate::Refused { refusal, new: None };
        }
        if t.by_id.len() >= APPROVALS_MAX {
            prune_closed(&mut t, now);
            if t.by_id.len() >= APPROVALS_MAX {
                return Gate::Refused {
                    refusal: Refusal::new(
                        Code::ProtocolInternal,
                        "too many approvals are open; decide some first",
                        json!({"reason": "approvals_full", "limit": APPROVALS_MAX}),
                    ),
                    new: None,
                };
            }
        }
        t.insert(draft);
        Gate::Refused {
            refusal,
            new: Some(id),
        }
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

    /// `mhs.approvals.list`: operators see every approval, others their own.
    ///
    /// # Errors
    /// `status` names no status.
    pub fn approvals_list(&self, p: &Principal, status: Option<&str>) -> Result<Value, ApiError> {
        let filter = match status {
            None => None,
            Some(s) => Some(Status::parse(s).ok_or_else(|| {
                ApiError::invalid_params(
                    "status",
                    "status must be pending, approved, denied, used or expired",
                )
            })?),
        };
        let t = self.inner.approvals.lock().map_err(|_| {
            ApiError::new(
                Code::ProtocolInternal,
                "approval table unavailable",
                json!({}),
            )
        })?;
        let now = now_ms();
        let mut list: Vec<&Approval> = t
            .by_id
            .values()
            .filter(|a| p.operator || a.requester_id == p.id)
            .filter(|a| filter.is_none_or(|f| a.status_at(now) == f))
            .collect();
        list.sort_by_key(|a| (a.base["created_at_ms"].as_u64().unwrap_or(0), a.id.clone()));
        Ok(json!({"approvals": list.iter().map(|a| a.to_json(now)).collect::<Vec<_>>()}))
    }

    /// `mhs.approvals.get`.
    ///
    /// # Errors
    /// Unknown id, or not the caller's and the caller is no operator.
    pub fn approvals_get(&self, p: &Principal, id: &str) -> Result<Value, ApiError> {
        let t = self.inner.approvals.lock().map_err(|_| {
            ApiError::new(
                Code::ProtocolInternal,
                "approval table unavailable",
                json!({}),
            )
        })?;
        match t.by_id.get(id) {
            Some(a) if p.operator || a.requester_id == p.id => Ok(a.to_json(now_ms())),
            _ => Err(unknown(id)),
        }
    }

    /// `mhs.approvals.decide`: one operator's vote.
    ///
    /// # Errors
    /// Not an operator (agents and services never decide), the requester
    /// itself, a second vote by the same operator, a closed or expired
    /// approval, or the vote could not be made durable.
    pub async fn approvals_decide(
        &self,
        p: &Principal,
        id: &str,
        decision: &str,
        reason: &str,
    ) -> Result<Value, ApiError> {
        if !matches!(decision, "approve" | "deny") {
            return Err(ApiError::invalid_params(
                "decision",
                "decision must be \"approve\" or \"deny\"",
            ));
        }
        let reason: String = reason.chars().take(REASON_CHARS_MAX).collect();
        let (record, event) = {
            let mut t = self.inner.approvals.lock().map_err(|_| {
                ApiError::new(
                    Code::ProtocolInternal,
                    "approval table unavailable",
                    json!({}),
                )
            })?;
            let now = now_ms();
            let a = t.by_id.get_mut(id).ok_or_else(|| unknown(id))?;
            check_voter(p, a, now)?;
            let before = a.status;
            a.votes.push(Vote {
                by: p.id.clone(),
                decision: decision.to_owned(),
                reason: reason.clone(),
                at_ms: now,
            });
            if decision == "deny" {
                a.status = Status::Denied;
            } else if a.approvals() >= a.quorum as usize {
                a.status = Status::Approved;
            }
            let outcome = (a.status != before).then(|| a.status.as_str());
            let event = json!({"approval_id": id, "by": p.to_json(), "decision": decision, "reason": reason, "approvals": a.approvals(), "quorum": a.quorum, "outcome": outcome});
            (a.stored(), event)
        };
        let commit = Commit {
            events: vec![EventDraft {
                kind: "approval.vote".into(),
                body: event.into(),
            }],
            approvals: vec![ApprovalRow {
                approval_id: id.to_owned(),
                record: record.clone(),
            }],
            ..Commit::default()
        };
        if let Err(e) = self.commit(commit).await {
            // Undo the vote: what was not recorded did not happen.
            self.undo_vote(id, &p.id);
            return Err(ApiError::new(
                Code::EvidenceUnavailable,
                "the vote could not be made durable and was not counted",
                json!({"reason": "vote_not_durable", "store_error": e.to_string()}),
            ));
        }
        let now = now_ms();
        self.approvals_get(p, id)
            .or_else(|_| Ok(json!({"approval_id": id, "status": record["status"], "at_ms": now})))
    }

    fn undo_vote(&self, id: &str, voter: &str) {
        if let Ok(mut t) = self.inner.approvals.lock() {
            if let Some(a) = t.by_id.get_mut(id) {
                a.votes.retain(|v| v.by != voter);
                let denied = a.votes.iter().any(|v| v.decision == "deny");
                a.status = if denied {
                    Status::Denied
                } else if a.approvals() >= a.quorum as usize {
                    Status::Approved
                } else {
                    Status::Pending
                };
            }
        }
    }
}

fn unknown(id: &str) -> ApiError {
    ApiError::new(
        Code::PolicyApprovalUnknown,
        format!("no approval `{id}` for this caller"),
        json!({"approval_id": id}),
    )
}

fn forbidden(reason: &str, message: &str) -> ApiError {
    ApiError::new(Code::AuthForbidden, message, json!({"reason": reason}))
}

fn check_voter(p: &Principal, a: &Approval, now: u64) -> Result<(), ApiError> {
    if p.kind != crate::PrincipalKind::Human || !p.operator {
        return Err(forbidden(
            "operator_required",
            "only a human operator may decide an approval; agents and services never can",
        ));
    }
    if p.id == a.requester_id {
        return Err(forbidden(
            "requester_cannot_decide",
            "the requester may not decide its own request",
        ));
    }
    // A closed approval says so to every later vote, the voter's own
    // included; `already_voted` is for one that is still open.
    match a.status_at(now) {
        Status::Pending if a.votes.iter().any(|v| v.by == p.id) => Err(forbidden(
            "already_voted",
            "this operator has already voted; a quorum needs distinct operators",
        )),
        Status::Pending => Ok(()),
        Status::Expired => Err(ApiError::new(
            Code::PolicyApprovalExpired,
            format!("approval `{}` expired", a.id),
            json!({"approval_id": a.id, "expires_at_ms": a.expires_at_ms}),
        )),
        s => Err(ApiError::new(
            Code::PolicyApprovalClosed,
            format!("approval `{}` is already {}", a.id, s.as_str()),
            json!({"approval_id": a.id, "status": s.as_str()}),
        )),
    }
}

/// Drops used and expired approvals from memory (they stay in the store).
/// Denials stay: a denial is final, so its fingerprint must keep refusing.
fn prune_closed(t: &mut Approvals, now: u64) {
    let closed: Vec<String> = t
        .by_id
        .values()
        .filter(|a| {
            matches!(
                a.status_at(now),
                Status::Used | Status::Expired | Status::Revoked
            )
        })
        .map(|a| a.id.clone())
        .collect();
    for id in closed {
        t.remove(&id);
    }
}
