//! What Tether's annotations mean: `@id`, `@reason`, `@hold` and `@quorum`,
//! read and checked per policy at load ([`Meta`]), and applied to Cedar's
//! answer to make a [`Verdict`]: forbids deny, permits with `@hold` hold
//! (with the largest quorum asked), other permits allow, nothing denies.

use crate::{Decision, Verdict, QUORUM_MAX};
use cedar_policy::{Decision as CedarDecision, Effect, Policy};
use std::collections::HashMap;
use std::fmt::Write as _;

/// The annotations of one policy, as the decision reads them.
#[derive(Debug, Clone)]
pub(crate) struct Meta {
    hold: Option<String>,
    quorum: u32,
    reason: Option<String>,
}

/// The annotations Tether reads. Any other is refused: a misspelt `@hold`
/// (`@Hold`, `@holdd`) would otherwise leave a plain permit, which allows
/// what its author meant to hold.
const ANNOTATIONS: [&str; 4] = ["id", "reason", "hold", "quorum"];

/// The annotations of `p`, checked; what is wrong, in words.
pub(crate) fn policy_meta(p: &Policy) -> Result<Meta, String> {
    if let Some((unknown, _)) = p.annotations().find(|(k, _)| !ANNOTATIONS.contains(k)) {
        return Err(format!(
            "unknown annotation @{unknown}; Tether reads @id, @reason, @hold and @quorum \
             (names are case-sensitive)"
        ));
    }
    let hold = p.annotation("hold").map(str::to_owned);
    let quorum_text = p.annotation("quorum");
    if p.effect() == Effect::Forbid && (hold.is_some() || quorum_text.is_some()) {
        return Err("@hold and @quorum belong on permit policies, not forbid".into());
    }
    if quorum_text.is_some() && hold.is_none() {
        return Err("@quorum needs @hold on the same policy".into());
    }
    if hold.as_deref().is_some_and(|h| h.trim().is_empty()) {
        return Err("@hold needs a reason, e.g. @hold(\"an operator must approve\")".into());
    }
    let quorum = match quorum_text {
        None => 1,
        Some(q) => match q.trim().parse::<u32>() {
            Ok(n) if (1..=QUORUM_MAX).contains(&n) => n,
            _ => {
                return Err(format!(
                    "@quorum(\"{q}\") must be a whole number from 1 to {QUORUM_MAX}"
                ))
            }
        },
    };
    Ok(Meta {
        hold,
        quorum,
        reason: p.annotation("reason").map(str::to_owned),
    })
}

/// The verdict for Cedar's `decision` with its determining policies (sorted).
pub(crate) fn verdict_from(
    meta: &HashMap<String, Meta>,
    decision: CedarDecision,
    determining: Vec<String>,
) -> Verdict {
    match decision {
        CedarDecision::Deny if determining.is_empty() => Verdict::deny(
            Vec::new(),
            "no policy permits this request (default deny)".into(),
        ),
        CedarDecision::Deny => {
            let reason = reasons(meta, &determining, |m| m.reason.clone(), "forbidden by");
            Verdict::deny(determining, reason)
        }
        CedarDecision::Allow => allow_or_hold(meta, determining),
    }
}

fn allow_or_hold(meta: &HashMap<String, Meta>, permits: Vec<String>) -> Verdict {
    let holds: Vec<String> = permits
        .iter()
        .filter(|id| meta.get(*id).is_some_and(|m| m.hold.is_some()))
        .cloned()
        .collect();
    if holds.is_empty() {
        let reason = reasons(meta, &permits, |m| m.reason.clone(), "permitted by");
        return Verdict {
            decision: Decision::Allow,
            policies: permits,
            reason,
            quorum: 0,
        };
    }
    let quorum = holds
        .iter()
        .filter_map(|id| meta.get(id))
        .map(|m| m.quorum)
        .max()
        .unwrap_or(1)
        .max(1);
    let reason = reasons(meta, &holds, |m| m.hold.clone(), "held by");
    Verdict {
        decision: Decision::Hold,
        policies: holds,
        reason,
        quorum,
    }
}

fn reasons(
    meta: &HashMap<String, Meta>,
    ids: &[String],
    pick: impl Fn(&Meta) -> Option<String>,
    verb: &str,
) -> String {
    let mut out = String::new();
    for id in ids {
        if !out.is_empty() {
            out.push_str("; ");
        }
        match meta.get(id).and_then(&pick) {
            Some(r) => out.push_str(&r),
            None => {
                let _ = write!(out, "{verb} policy `{id}`");
            }
        }
    }
    out
}
