//! The approval verbs: `mhs.approvals.list`, `mhs.approvals.get` and
//! `mhs.approvals.decide`, and who may vote.
//!
//! **Owns:** what each caller may see (operators every approval, others
//! their own), a vote and the status it moves the approval to, and the
//! voter checks (a human operator, not the requester, once per approval,
//! only while it is pending).
//! **Never belongs here:** the gate a command passes and an approval's use
//! (`gate.rs`).
//! **Fail-closed rule:** an approval the caller may not see answers as
//! unknown; a vote that cannot be made durable is undone and not counted;
//! an unlocked table refuses.

use crate::approvals::{Approval, Status, Vote};
use crate::bounds::{APPROVALS_PAGE_DEFAULT, APPROVALS_PAGE_MAX};
use crate::kernel::{Kernel, Principal};
use crate::ApiError;
use serde_json::{json, Value};
use tether_core::receipt::now_ms;
use tether_core::Code;
use tether_store::{ApprovalRow, Commit, EventDraft};

/// A page's `limit`: the default when absent, refused when 0 or over the
/// maximum.
fn page_limit(limit: Option<u64>) -> Result<usize, ApiError> {
    match limit {
        None => Ok(APPROVALS_PAGE_DEFAULT),
        Some(n) => usize::try_from(n)
            .ok()
            .filter(|n| (1..=APPROVALS_PAGE_MAX).contains(n))
            .ok_or_else(|| {
                ApiError::new(
                    Code::ProtocolInvalidParams,
                    format!("limit must be between 1 and {APPROVALS_PAGE_MAX}"),
                    json!({"reason": "limit_invalid", "limit_max": APPROVALS_PAGE_MAX}),
                )
            }),
    }
}

/// A `cursor` as (created at, approval id): the last approval of the page
/// before.
fn parse_cursor(cursor: &str) -> Result<(u64, String), ApiError> {
    cursor
        .split_once('.')
        .and_then(|(at, id)| Some((at.parse::<u64>().ok()?, id)))
        .filter(|(_, id)| id.starts_with("appr_") && id.len() <= 64)
        .map(|(at, id)| (at, id.to_owned()))
        .ok_or_else(|| {
            ApiError::invalid_params(
                "cursor_invalid",
                "cursor must be the next_cursor of an earlier page",
            )
        })
}

/// The approval table cannot be locked.
fn table_unavailable() -> ApiError {
    ApiError::new(
        Code::ProtocolInternal,
        "approval table unavailable",
        json!({}),
    )
}

impl Kernel {
    /// `mhs.approvals.list`: operators see every approval, others their own;
    /// oldest first, one page at a time (`limit`, default
    /// [`APPROVALS_PAGE_DEFAULT`], at most [`APPROVALS_PAGE_MAX`]; `cursor`
    /// the previous page's `next_cursor`, which is `null` on the last page).
    ///
    /// # Errors
    /// `status` names no status; `limit` is 0 or over the maximum; `cursor`
    /// is not one this method answered.
    pub fn approvals_list(
        &self,
        p: &Principal,
        status: Option<&str>,
        limit: Option<u64>,
        cursor: Option<&str>,
    ) -> Result<Value, ApiError> {
        let filter = match status {
            None => None,
            Some(s) => Some(Status::parse(s).ok_or_else(|| {
                ApiError::invalid_params(
                    "status",
                    "status must be pending, approved, denied, used, expired or revoked",
                )
            })?),
        };
        let limit = page_limit(limit)?;
        let after = cursor.map(parse_cursor).transpose()?;
        self.sync_approvals();
        let t = self
            .inner
            .approvals
            .lock()
            .map_err(|_| table_unavailable())?;
        let now = now_ms();
        let mut list: Vec<(u64, &Approval)> = t
            .by_id
            .values()
            .filter(|a| p.operator || a.requester_id == p.id)
            .filter(|a| filter.is_none_or(|f| a.status_at(now) == f))
            .map(|a| (a.base["created_at_ms"].as_u64().unwrap_or(0), a))
            .filter(|(at, a)| {
                after
                    .as_ref()
                    .is_none_or(|(c_at, c_id)| (*at, a.id.as_str()) > (*c_at, c_id.as_str()))
            })
            .collect();
        list.sort_by(|(x_at, x), (y_at, y)| (x_at, &x.id).cmp(&(y_at, &y.id)));
        let more = list.len() > limit;
        list.truncate(limit);
        let next_cursor = match list.last() {
            Some((at, a)) if more => json!(format!("{at}.{}", a.id)),
            _ => Value::Null,
        };
        Ok(json!({
            "approvals": list.iter().map(|(_, a)| a.to_json(now)).collect::<Vec<_>>(),
            "next_cursor": next_cursor,
        }))
    }

    /// `mhs.approvals.get`.
    ///
    /// # Errors
    /// Unknown id, or not the caller's and the caller is no operator.
    pub fn approvals_get(&self, p: &Principal, id: &str) -> Result<Value, ApiError> {
        self.sync_approvals();
        let found = {
            let t = self
                .inner
                .approvals
                .lock()
                .map_err(|_| table_unavailable())?;
            t.by_id.get(id).cloned()
        };
        // Memory holds the open approvals and the newest closed ones; an
        // older one is read from the store, where every one is kept, and
        // not brought back into memory (which stays bounded).
        let a = match found {
            Some(a) => a,
            None => self.stored_approval(id)?.ok_or_else(|| unknown(id))?,
        };
        if p.operator || a.requester_id == p.id {
            Ok(a.to_json(now_ms()))
        } else {
            Err(unknown(id))
        }
    }

    /// An approval that is not in memory, read from the store. A store that
    /// cannot be read is said so, not taken for an unknown id.
    fn stored_approval(&self, id: &str) -> Result<Option<Approval>, ApiError> {
        if !id.starts_with("appr_") || id.len() > 64 {
            return Ok(None);
        }
        let row = self.inner.store.approval(id).map_err(|e| {
            ApiError::new(
                Code::EvidenceUnavailable,
                "the approval is not in memory and the store cannot be read now",
                json!({"reason": "store_unavailable", "store_error": e.to_string()}),
            )
        })?;
        Ok(row.as_ref().and_then(Approval::from_stored))
    }

    /// Why a vote on an approval that is not in memory is refused: an old
    /// closed one read from the store says it is closed (or why this voter
    /// may not vote), as it would in memory; anything else is unknown.
    fn vote_not_in_memory(&self, p: &Principal, id: &str, now: u64) -> ApiError {
        match self.stored_approval(id) {
            Err(e) => e,
            Ok(None) => unknown(id),
            Ok(Some(a)) => check_voter(p, &a, now).err().unwrap_or_else(|| unknown(id)),
        }
    }

    /// `mhs.approvals.decide`: one operator's vote.
    ///
    /// # Errors
    /// A reason over the text bound (`text_too_long`); not an operator
    /// (agents and services never decide), the requester itself, a second vote by the same operator, a closed or expired
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
        let reason =
            crate::bounds::within("reason", reason, self.inner.config.text_chars_max)?.to_owned();
        // Votes another process recorded count before this one is added.
        self.sync_approvals();
        let (record, event) = {
            let mut t = self
                .inner
                .approvals
                .lock()
                .map_err(|_| table_unavailable())?;
            let now = now_ms();
            let Some(a) = t.by_id.get_mut(id) else {
                drop(t);
                return Err(self.vote_not_in_memory(p, id, now));
            };
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
        format!(
            "no approval `{}` for this caller",
            tether_core::echo::id(id)
        ),
        json!({"approval_id": tether_core::echo::id(id)}),
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
