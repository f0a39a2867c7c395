//! Step 10's policy part: the kernel's view of the ControlPolicy.
//!
//! The policy crate is pure; this module describes the cell to it, maps a
//! principal to a Cedar subject, and turns a verdict plus the permit rule into
//! either "go on" or a refusal, creating approvals for holds.

use crate::approvals::{Gate, Need};
use crate::check::Effects;
use crate::kernel::{Kernel, KernelConfig, Principal, PrincipalKind};
use crate::loader::{BindingSpec, Cell, DeviceSpec};
use crate::order::Ctx;
use serde_json::{json, Value};
use tether_core::catalogue::Verb;
use tether_core::{Code, Refusal};
use tether_policy::{
    Action, BindingShape, CellShape, ControlPolicy, Decision, DeviceShape, Flags, PolicyError,
    Subject, Verdict,
};

/// The cell as the policy layer sees it (device and binding order kept).
fn shape<'a>(specs: impl Iterator<Item = &'a DeviceSpec>) -> CellShape {
    CellShape {
        devices: specs
            .map(|d| DeviceShape {
                device_id: d.manifest.device_id.clone(),
                mode: d.manifest.mode.as_str().to_owned(),
                risk_class: d.manifest.risk_class.as_str().to_owned(),
                bindings: d.bindings.iter().map(binding_shape).collect(),
            })
            .collect(),
    }
}

/// Loads and validates a policy for a loaded cell without starting anything
/// (`tether check`); `None` checks the built-in default.
///
/// # Errors
/// The policy's parse, annotation or validation defects.
pub fn check_policy(
    cell: &Cell,
    policy: Option<(&str, &str)>,
) -> Result<ControlPolicy, PolicyError> {
    let shape = shape(cell.devices.iter());
    match policy {
        Some((name, text)) => ControlPolicy::load(name, text, &shape),
        None => ControlPolicy::default_for(&shape),
    }
}

/// The Tether Cedar schema for a loaded cell (what policies are validated against).
pub fn schema_for(cell: &Cell) -> String {
    tether_policy::schema_text(&shape(cell.devices.iter()))
}

fn binding_shape(b: &BindingSpec) -> BindingShape {
    BindingShape {
        capability: b.capability_id.clone(),
        verb: b.verb.as_str().to_owned(),
        risk: b.risk.as_str().to_owned(),
        resource: b.resource.clone(),
        flags: Flags {
            stop_class: b.flags.stop_class,
            risk_reducing: b.flags.risk_reducing,
            safe_place: b.flags.safe_place,
            two_person: b.flags.two_person,
        },
        input_schema: b.served_schema.clone(),
    }
}

/// Loads the configured policy, or the built-in default.
pub(crate) fn load(config: &KernelConfig, cell: &Cell) -> Result<ControlPolicy, PolicyError> {
    let cell = shape(cell.devices.iter());
    match &config.policy {
        Some((name, text)) => ControlPolicy::load(name, text, &cell),
        None => ControlPolicy::default_for(&cell),
    }
}

pub(crate) fn subject(p: &Principal) -> Subject<'_> {
    Subject {
        id: &p.id,
        kind: match p.kind {
            PrincipalKind::Agent => tether_policy::PrincipalKind::Agent,
            PrincipalKind::Human => tether_policy::PrincipalKind::Human,
            PrincipalKind::Service => tether_policy::PrincipalKind::Service,
        },
        operator: p.operator,
    }
}

/// The Cedar action of a binding.
pub(crate) fn action_of(b: &BindingSpec) -> Action {
    match b.verb {
        Verb::Read => Action::Read,
        Verb::Write => Action::Write,
        _ => Action::Command,
    }
}

fn denied(v: &Verdict) -> Refusal {
    Refusal::new(
        Code::PolicyDenied,
        format!("the control policy denies this request: {}", v.reason),
        json!({"policy": v.to_json()}),
    )
}

/// A hold on a read is served as a deny: reads change nothing a person could
/// approve, and a read never waits. The verdict as recorded then says deny,
/// and that a hold was turned into it (`hold_denied`).
fn read_hold_as_deny(v: &Verdict) -> (Verdict, Value) {
    let mut shown = v.clone();
    shown.decision = Decision::Deny;
    shown.reason = format!("{} (a hold on a read is served as a deny)", v.reason);
    let mut json = shown.to_json();
    json["hold_denied"] = json!(true);
    (shown, json)
}

/// What step 10 decided.
pub(crate) enum PolicyStep {
    /// Go on; `approval` names an approved approval that covers the request.
    Go { approval: Option<String> },
    /// Refused; `new_approval` must be made durable before answering.
    Refused {
        refusal: Refusal,
        new_approval: Option<String>,
    },
}

impl Kernel {
    /// Whether the command carries a valid safe-place grant that stands for
    /// an operator's approval (see `policy_step`).
    fn safe_place_grant_decides(&self, ctx: &Ctx, b: &BindingSpec) -> bool {
        let dev = &self.inner.devices[ctx.device];
        let Some(grant) = &ctx.safe_place_grant else {
            return false;
        };
        !b.flags.two_person
            && dev.latched.load(std::sync::atomic::Ordering::SeqCst)
            && self
                .check_grant_for(grant, ctx.device, ctx.binding, &ctx.digest, false)
                .is_ok()
    }

    /// Decides a read (no approvals: a read is allowed or denied).
    pub(crate) fn policy_read(&self, p: &Principal, d: usize, bi: usize) -> Result<Value, Refusal> {
        let v = self
            .inner
            .policy
            .decide(&subject(p), Action::Read, d, bi, &Value::Null);
        match v.decision {
            Decision::Allow => Ok(v.to_json()),
            Decision::Hold => {
                let (shown, json) = read_hold_as_deny(&v);
                let mut refusal = denied(&shown);
                refusal.details["policy"] = json;
                Err(refusal)
            }
            Decision::Deny => Err(denied(&v)),
        }
    }

    /// Step 10: the policy verdict, then the approval route for holds and for
    /// hardware commands at R2 and above that carry no permit.
    pub(crate) fn policy_step(&self, ctx: &Ctx, b: &BindingSpec, create: bool) -> PolicyStep {
        let dev = &self.inner.devices[ctx.device];
        let (verdict, json) = self.inner.policy.decide_shared(
            &subject(&ctx.principal),
            action_of(b),
            ctx.device,
            ctx.binding,
            &ctx.input,
        );
        let hold = verdict.decision == Decision::Hold;
        // Stops are never held: a stop waits for nobody. The receipt's policy
        // block then says what was decided, and that a hold was set aside.
        let read_hold = hold && b.verb == Verb::Read;
        let json = if read_hold {
            std::sync::Arc::new(read_hold_as_deny(&verdict).1)
        } else if hold && b.is_stop() {
            let mut shown = (*json).clone();
            shown["decision"] = json!("allow");
            shown["hold_ignored"] = json!(true);
            shown["reason"] = json!(format!(
                "{} (a hold never applies to a stop)",
                verdict.reason
            ));
            std::sync::Arc::new(shown)
        } else {
            json
        };
        let _ = ctx.policy.set(json);
        // A hold on a read is served as a deny, as for `mhs.resource.read`:
        // a read changes nothing a person could approve, and never waits.
        if read_hold {
            let (shown, json) = read_hold_as_deny(&verdict);
            let mut refusal = denied(&shown);
            refusal.details["policy"] = json;
            return PolicyStep::Refused {
                refusal,
                new_approval: None,
            };
        }
        if verdict.decision == Decision::Deny {
            return PolicyStep::Refused {
                refusal: denied(&verdict),
                new_approval: None,
            };
        }
        let held = hold && !b.is_stop();
        let needs_permit = ctx.permit_id.is_none()
            && crate::check::permits::permit_required(dev.spec.manifest.mode.is_physical(), b);
        if !held && !needs_permit {
            return PolicyStep::Go { approval: None };
        }
        // An operator's safe-place grant is that operator's decision on this
        // exact command (one binding, one input, once): it satisfies a hold
        // and the permit route while the device is latched, as an approval
        // would. It never stands in for two operators.
        if self.safe_place_grant_decides(ctx, b) {
            return PolicyStep::Go { approval: None };
        }
        // A two-person binding is satisfied only by a quorum of two or more.
        let quorum =
            if held { verdict.quorum } else { 1 }.max(if b.flags.two_person { 2 } else { 1 });
        let reason = if held {
            verdict.reason.clone()
        } else if b.flags.two_person {
            "a two-person operation runs only on the approval of two operators".to_owned()
        } else {
            "a hardware command at R2 or above needs a permit from an approval route".to_owned()
        };
        let policies = if held {
            verdict.policies.clone()
        } else {
            Vec::new()
        };
        let need = Need {
            key: format!("{}|{}|{}", ctx.principal.id, ctx.command_id, ctx.key),
            kind: if held { "hold" } else { "permit" },
            quorum,
            reason: &reason,
            policies: &policies,
            // What the operator decides on: the exact input (its digest
            // binds the approval) and the limits it was checked against.
            facts: json!({"device_id": dev.id(), "capability_id": b.capability_id, "resource": b.resource, "input_digest": ctx.digest, "input": ctx.input, "limits": crate::reference::effective_limits(b), "command_id": ctx.command_id, "session_id": ctx.session_id, "risk": b.risk.as_str(), "mode": dev.spec.manifest.mode.as_str(), "command_kind": b.kind.as_str()}),
            requester: &ctx.principal,
        };
        match self.approval_gate(&need, held, create) {
            Gate::Covered(id) => PolicyStep::Go { approval: Some(id) },
            Gate::Refused { refusal, new } => PolicyStep::Refused {
                refusal,
                new_approval: new,
            },
        }
    }

    /// Step 10's policy part as go-on or a refusal: an approval that covers
    /// the command is noted for registration, one this command created for
    /// its hold is noted to be made durable before the hold is answered.
    pub(crate) fn policy_gate(
        &self,
        ctx: &Ctx,
        b: &BindingSpec,
        effects: Effects,
    ) -> Result<(), Refusal> {
        match self.policy_step(ctx, b, effects == Effects::Real) {
            PolicyStep::Go { approval } => {
                if let Some(id) = approval {
                    let _ = ctx.approval.set(id);
                }
                Ok(())
            }
            PolicyStep::Refused {
                refusal,
                new_approval,
            } => {
                if let Some(id) = new_approval {
                    let _ = ctx.new_approval.set(id);
                }
                Err(refusal)
            }
        }
    }
}
