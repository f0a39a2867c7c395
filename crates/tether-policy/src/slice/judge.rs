//! Slicing: which policies can possibly apply to one request *shape*.
//!
//! Most of a Tether request is fixed before it arrives: the binding (and so
//! its device, attributes and flags), the context's `mode`, `risk_class`,
//! `device_risk_class` and `flags`, the action, and the principal's kind.
//! Only the principal's id and roles and the `input` vary. At load time each
//! policy is judged against every fixed shape with a three-valued reading of
//! its scope and conditions; a policy that is *definitely* not satisfied for a
//! shape is left out of that shape's slice, and Cedar evaluates only the
//! slice. Cedar's cost grows with every policy in the set it is given, so a
//! 50-rule policy whose rules name other devices costs about what the default
//! policy costs.
//!
//! Soundness rule: a policy is dropped only when Cedar would certainly find it
//! *not satisfied without an error* for every request of that shape. Anything
//! this reader does not understand is `Unknown`, and unknown keeps the policy.
//! An error to the left of a decided `false` also keeps it (Cedar evaluates
//! `&&` and `||` left to right, and an error must still deny).
//!
//! When every policy left in a slice is *certainly satisfied* (its truth does
//! not depend on who exactly asks or on the input), the decision Cedar would
//! reach is the same for every request of that shape, so it is computed once
//! at load and Cedar is not called at request time. The crate's differential
//! test (`differential.rs`) compares sliced and precomputed decisions with
//! Cedar's on the whole set, for random policies.

use cedar_policy::{ActionConstraint, EntityUid, Policy, PrincipalConstraint, ResourceConstraint};
use serde_json::Value;

/// A three-valued truth: what is known before the request arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tri {
    True,
    False,
    Unknown,
}

impl Tri {
    fn from_bool(b: bool) -> Self {
        if b {
            Tri::True
        } else {
            Tri::False
        }
    }

    fn not(self) -> Self {
        match self {
            Tri::True => Tri::False,
            Tri::False => Tri::True,
            Tri::Unknown => Tri::Unknown,
        }
    }

    /// Cedar's left-to-right `&&`: a decided `false` on the left ends it;
    /// an unknown left side may be an error, so the whole is unknown.
    fn and(self, right: impl FnOnce() -> Tri) -> Self {
        match self {
            Tri::False => Tri::False,
            Tri::True => right(),
            Tri::Unknown => Tri::Unknown,
        }
    }

    /// Cedar's left-to-right `||`.
    fn or(self, right: impl FnOnce() -> Tri) -> Self {
        match self {
            Tri::True => Tri::True,
            Tri::False => right(),
            Tri::Unknown => Tri::Unknown,
        }
    }
}

/// A value known before the request arrives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Known {
    Str(String),
    Bool(bool),
    Long(i64),
}

/// The fixed part of one request shape.
pub(crate) struct Shape<'a> {
    /// The principal kind's entity type name, e.g. `Tether::Agent`.
    pub principal_type: &'a cedar_policy::EntityTypeName,
    pub action: &'a EntityUid,
    pub binding: &'a EntityUid,
    pub device: &'a EntityUid,
    /// The binding entity's attributes.
    pub resource_attrs: Vec<(&'static str, Known)>,
    /// The context's fixed fields (`mode`, `risk_class`, `device_risk_class`).
    pub context_attrs: Vec<(&'static str, Known)>,
    /// `context.flags.*`.
    pub flags: Vec<(&'static str, bool)>,
}

fn lookup<'v, T>(list: &'v [(&'static str, T)], name: &str) -> Option<&'v T> {
    list.iter().find(|(k, _)| *k == name).map(|(_, v)| v)
}

/// Deepest expression nesting the reader follows before answering unknown.
const DEPTH_MAX: usize = 64;

/// One policy, read once: its scope and its conditions in Cedar's JSON form.
pub(crate) struct Prepared {
    principal: PrincipalConstraint,
    action: ActionConstraint,
    resource: ResourceConstraint,
    /// `None` when the policy could not be rendered as JSON (then unknown).
    conditions: Option<Vec<Value>>,
}

impl Prepared {
    pub(crate) fn new(policy: &Policy) -> Self {
        let conditions = policy
            .to_json()
            .ok()
            .and_then(|json| json.get("conditions").and_then(Value::as_array).cloned());
        Self {
            principal: policy.principal_constraint(),
            action: policy.action_constraint(),
            resource: policy.resource_constraint(),
            conditions,
        }
    }

    /// Whether every request of `shape` satisfies the policy: `False` only
    /// when none does (and none errors), `True` only when all do (without an
    /// error), otherwise `Unknown`.
    pub(crate) fn judge(&self, shape: &Shape<'_>) -> Tri {
        principal(&self.principal, shape)
            .and(|| action(&self.action, shape))
            .and(|| resource(&self.resource, shape))
            .and(|| self.conditions(shape))
    }

    /// The `when` / `unless` clauses, left to right, as Cedar joins them.
    fn conditions(&self, shape: &Shape<'_>) -> Tri {
        let Some(clauses) = &self.conditions else {
            return Tri::Unknown;
        };
        let mut acc = Tri::True;
        for clause in clauses {
            let body = clause
                .get("body")
                .map_or(Tri::Unknown, |b| truth(b, shape, 0));
            let this = match clause.get("kind").and_then(Value::as_str) {
                Some("when") => body,
                Some("unless") => body.not(),
                _ => Tri::Unknown,
            };
            acc = acc.and(|| this);
        }
        acc
    }
}

fn principal(c: &PrincipalConstraint, shape: &Shape<'_>) -> Tri {
    match c {
        PrincipalConstraint::Any => Tri::True,
        PrincipalConstraint::Is(t) => Tri::from_bool(t == shape.principal_type),
        PrincipalConstraint::Eq(e) if e.type_name() != shape.principal_type => Tri::False,
        PrincipalConstraint::IsIn(t, _) if t != shape.principal_type => Tri::False,
        // The principal's id is not fixed by the shape.
        PrincipalConstraint::Eq(_) | PrincipalConstraint::In(_) | PrincipalConstraint::IsIn(..) => {
            Tri::Unknown
        }
    }
}

fn action(c: &ActionConstraint, shape: &Shape<'_>) -> Tri {
    // The schema declares no action groups, so `in` is membership by equality.
    match c {
        ActionConstraint::Any => Tri::True,
        ActionConstraint::Eq(a) => Tri::from_bool(a == shape.action),
        ActionConstraint::In(list) => Tri::from_bool(list.iter().any(|a| a == shape.action)),
    }
}

fn resource(c: &ResourceConstraint, shape: &Shape<'_>) -> Tri {
    let binding_type = shape.binding.type_name();
    // A binding's only ancestor is its device.
    let within = |e: &EntityUid| -> Tri {
        if e == shape.binding || e == shape.device {
            Tri::True
        } else if e.type_name() == binding_type || e.type_name() == shape.device.type_name() {
            Tri::False
        } else {
            Tri::Unknown
        }
    };
    match c {
        ResourceConstraint::Any => Tri::True,
        ResourceConstraint::Eq(e) => Tri::from_bool(e == shape.binding),
        ResourceConstraint::Is(t) => Tri::from_bool(t == binding_type),
        ResourceConstraint::In(e) => within(e),
        ResourceConstraint::IsIn(t, e) => Tri::from_bool(t == binding_type).and(|| within(e)),
    }
}

/// The truth of a boolean expression in Cedar's JSON form (EST).
fn truth(e: &Value, shape: &Shape<'_>, depth: usize) -> Tri {
    if depth >= DEPTH_MAX {
        return Tri::Unknown;
    }
    let next = depth + 1;
    let Some((op, arg)) = single_entry(e) else {
        return Tri::Unknown;
    };
    let side = |name: &str| arg.get(name);
    match op {
        "Value" => match arg {
            Value::Bool(b) => Tri::from_bool(*b),
            _ => Tri::Unknown,
        },
        "!" => side("arg").map_or(Tri::Unknown, |a| truth(a, shape, next).not()),
        "&&" | "||" => {
            let (Some(l), Some(r)) = (side("left"), side("right")) else {
                return Tri::Unknown;
            };
            let left = truth(l, shape, next);
            let right = || truth(r, shape, next);
            if op == "&&" {
                left.and(right)
            } else {
                left.or(right)
            }
        }
        "==" | "!=" => {
            let (Some(l), Some(r)) = (side("left"), side("right")) else {
                return Tri::Unknown;
            };
            match (known(l, shape, next), known(r, shape, next)) {
                // Cedar's `==` compares across types without an error.
                (Some(a), Some(b)) => Tri::from_bool((a == b) == (op == "==")),
                _ => Tri::Unknown,
            }
        }
        "if-then-else" => {
            let (Some(c), Some(t), Some(f)) = (side("if"), side("then"), side("else")) else {
                return Tri::Unknown;
            };
            match truth(c, shape, next) {
                Tri::True => truth(t, shape, next),
                Tri::False => truth(f, shape, next),
                Tri::Unknown => Tri::Unknown,
            }
        }
        "." => match known(e, shape, depth) {
            Some(Known::Bool(b)) => Tri::from_bool(b),
            _ => Tri::Unknown,
        },
        _ => Tri::Unknown,
    }
}

/// A value fixed by the shape: literals, `resource.<attr>`,
/// `context.<fixed field>` and `context.flags.<flag>`.
fn known(e: &Value, shape: &Shape<'_>, depth: usize) -> Option<Known> {
    if depth >= DEPTH_MAX {
        return None;
    }
    let (op, arg) = single_entry(e)?;
    match op {
        "Value" => match arg {
            Value::String(s) => Some(Known::Str(s.clone())),
            Value::Bool(b) => Some(Known::Bool(*b)),
            Value::Number(n) => n.as_i64().map(Known::Long),
            _ => None,
        },
        "." => {
            let attr = arg.get("attr")?.as_str()?;
            let left = arg.get("left")?;
            match var(left) {
                Some("resource") => lookup(&shape.resource_attrs, attr).cloned(),
                Some("context") => lookup(&shape.context_attrs, attr).cloned(),
                _ => {
                    // `context.flags.<flag>`
                    let (inner_op, inner) = single_entry(left)?;
                    let is_flags = inner_op == "."
                        && inner.get("attr")?.as_str()? == "flags"
                        && var(inner.get("left")?) == Some("context");
                    if is_flags {
                        lookup(&shape.flags, attr).map(|b| Known::Bool(*b))
                    } else {
                        None
                    }
                }
            }
        }
        _ => None,
    }
}

fn var(e: &Value) -> Option<&str> {
    e.as_object()?.get("Var")?.as_str()
}

fn single_entry(e: &Value) -> Option<(&str, &Value)> {
    let obj = e.as_object()?;
    if obj.len() != 1 {
        return None;
    }
    obj.iter().next().map(|(k, v)| (k.as_str(), v))
}
