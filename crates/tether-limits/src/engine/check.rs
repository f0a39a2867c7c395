//! Checking an input against the effective limits.

use std::ops::ControlFlow;

use serde_json::Value;

use super::intersect::contains;
use super::{EffectiveLimits, EffectiveRule, Slot};
use crate::budget::{draw_with, BudgetRule, DrawError};
use crate::path::LimitPath;
use crate::schema::Resolver;
use crate::violation::{Violation, ViolationKind, Violations, VIOLATIONS_MAX};
use crate::walk::{walk, Event};

/// Schema keywords that bound a value and that limits take over on a limited node.
pub const BOUND_KEYWORDS: &[&str] = &[
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "enum",
    "const",
];

/// Collects violations up to [`VIOLATIONS_MAX`].
struct Collector {
    all: Vec<Violation>,
    truncated: bool,
}

impl Collector {
    fn push(&mut self, v: Violation) -> ControlFlow<()> {
        if self.all.len() >= VIOLATIONS_MAX {
            self.truncated = true;
            return ControlFlow::Break(());
        }
        self.all.push(v);
        ControlFlow::Continue(())
    }
}

impl EffectiveLimits {
    /// Check every value every limit path addresses in `input`: each array
    /// element, each nested leaf, and the schema default of each omitted
    /// member that declares one.
    ///
    /// # Errors
    /// [`Violations`] with the first violation and up to 16 in all.
    // The error is large but built at most once per command, off any hot
    // loop; keeping `Violations` unboxed keeps the agreed kernel API.
    #[allow(clippy::result_large_err)]
    pub fn check(&self, input: &Value) -> Result<(), Violations> {
        let resolver = Resolver::new(&self.schema);
        let mut collector = Collector {
            all: Vec::new(),
            truncated: false,
        };
        for rule in self.rules.iter().filter(|r| r.has_bounds()) {
            if check_rule(rule, input, &resolver, &mut collector).is_break() {
                break;
            }
        }
        match Violations::from_list(collector.all, collector.truncated) {
            Some(v) => Err(v),
            None => Ok(()),
        }
    }

    /// The numeric leaves that no limit covers (see
    /// [`EffectiveLimits::unlimited_paths`]) and that `input` sets, or relies
    /// on a schema default for. OpenMHS CORE-046 refuses such a call on a
    /// hardware or hybrid device at R1 or above (`no_limit`).
    pub fn unlimited_set_paths(&self, input: &Value) -> Vec<String> {
        let resolver = Resolver::new(&self.schema);
        self.unlimited
            .iter()
            .filter(|text| {
                // A path that does not parse is counted as set: fail closed.
                LimitPath::parse(text)
                    .map_or(true, |path| addresses_anything(input, &resolver, &path))
            })
            .cloned()
            .collect()
    }

    /// The operator_required paths that no narrow-only source filled and that
    /// `input` sets, or relies on a schema default for. A non-empty answer
    /// means the caller refuses with LIMITS_UNSET.
    pub fn unset_paths(&self, input: &Value) -> Vec<String> {
        let resolver = Resolver::new(&self.schema);
        self.rules
            .iter()
            .filter(|r| r.operator_required && !r.filled)
            .filter(|r| addresses_anything(input, &resolver, &r.path))
            .map(|r| r.path.to_string())
            .collect()
    }

    /// The amount `input` draws from `rule`: the sum of magnitudes of the
    /// addressed values, schema defaults of omitted members included.
    ///
    /// # Errors
    /// As [`crate::budget::draw_amount`].
    pub fn draw_amount(&self, input: &Value, rule: &BudgetRule) -> Result<f64, DrawError> {
        let resolver = Resolver::new(&self.schema);
        draw_with(input, &rule.path, Some(&resolver))
    }

    /// Paths a per-call limit covers (bounded, or deferred to the operator).
    pub fn limited_paths(&self) -> impl Iterator<Item = &LimitPath> {
        self.limited_rules().map(|r| &r.path)
    }

    /// JSON pointers (into the schema given to [`crate::build`]) of the
    /// schema nodes a limit covers. Their bound keywords belong to the limits
    /// step, see [`strip_limited_bounds`].
    pub fn limited_pointers(&self) -> Vec<&str> {
        let mut out: Vec<&str> = self
            .limited_rules()
            .flat_map(|r| r.pointers.iter().map(String::as_str))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Whether a limit covers the schema node at `pointer` (see
    /// [`EffectiveLimits::limited_pointers`]) or the limit path `path`.
    pub fn is_limited(&self, pointer_or_path: &str) -> bool {
        self.limited_rules().any(|r| {
            r.pointers.iter().any(|p| p == pointer_or_path) || r.path.to_string() == pointer_or_path
        })
    }

    fn limited_rules(&self) -> impl Iterator<Item = &EffectiveRule> {
        self.rules
            .iter()
            .filter(|r| r.has_bounds() || r.operator_required)
    }
}

/// A copy of `schema` without `minimum`, `maximum`, `exclusiveMinimum`,
/// `exclusiveMaximum`, `enum` and `const` on the nodes `limits` covers, for
/// the structure step; the caller checks the full schema after the limits.
///
/// `schema` must be the schema `limits` was built from. A node shared through
/// `$ref` loses its bounds for every user; those users still meet them in the
/// caller's later full-schema check, with the same refusal code.
pub fn strip_limited_bounds(schema: &Value, limits: &EffectiveLimits) -> Value {
    let mut out = schema.clone();
    for pointer in limits.limited_pointers() {
        if let Some(Value::Object(node)) = out.pointer_mut(pointer) {
            for key in BOUND_KEYWORDS {
                node.remove(*key);
            }
        }
    }
    out
}

fn addresses_anything(input: &Value, resolver: &Resolver<'_>, path: &LimitPath) -> bool {
    let mut found = false;
    let mut visit = |event: Event<'_>| {
        if matches!(event, Event::Leaf { .. } | Event::Mismatch { .. }) {
            found = true;
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    };
    // Too large to walk counts as set: refusing is the safe answer.
    walk(input, Some(resolver), path, &mut visit).is_err() || found
}

fn check_rule<'a>(
    rule: &EffectiveRule,
    input: &'a Value,
    resolver: &Resolver<'a>,
    collector: &mut Collector,
) -> ControlFlow<()> {
    let mut flow = ControlFlow::Continue(());
    let mut visit = |event: Event<'a>| {
        flow = match event {
            Event::Leaf {
                concrete,
                value,
                element,
            } => match leaf_violation(rule, &concrete, value, element) {
                Some(v) => collector.push(v),
                None => ControlFlow::Continue(()),
            },
            Event::LeafArray { concrete, len } => match length_violation(rule, &concrete, len) {
                Some(v) => collector.push(v),
                None => ControlFlow::Continue(()),
            },
            Event::Mismatch {
                concrete, value, ..
            } => collector.push(type_violation(rule, &concrete, value, None)),
        };
        flow
    };
    if walk(input, Some(resolver), &rule.path, &mut visit).is_err() {
        let v = Violation {
            kind: ViolationKind::Length,
            bound: Value::from(crate::walk::VISIT_MAX),
            value: Value::Null,
            ..base(rule, "$", None, describe(rule).1)
        };
        return collector.push(v);
    }
    flow
}

/// The violation fields every kind shares.
fn base(
    rule: &EffectiveRule,
    concrete: &str,
    element: Option<usize>,
    slot: Option<&Slot>,
) -> Violation {
    Violation {
        path: concrete.to_string(),
        kind: ViolationKind::Type,
        bound: Value::Null,
        value: Value::Null,
        unit: rule.unit.clone(),
        source: slot.map(|s| s.source.clone()).unwrap_or_default(),
        element_name: element.and_then(|i| rule.names.as_ref()?.get(i).cloned()),
        limit_path: rule.path.to_string(),
        reason: slot.and_then(|s| s.reason.clone()),
        provenance: slot.and_then(|s| rule.provenance_of(&s.source)),
    }
}

fn slot_at(slots: &Option<Vec<Slot>>, element: Option<usize>) -> Option<&Slot> {
    let slots = slots.as_ref()?;
    if slots.len() == 1 {
        return slots.first();
    }
    slots.get(element?)
}

/// The bound a type violation reports: the max when there is one, else the
/// min, else the allowed list; with the slot that set it.
fn describe(rule: &EffectiveRule) -> (Value, Option<&Slot>) {
    if let Some(s) = rule.max.as_ref().and_then(|v| v.first()) {
        return (Value::from(s.value), Some(s));
    }
    if let Some(s) = rule.min.as_ref().and_then(|v| v.first()) {
        return (Value::from(s.value), Some(s));
    }
    let list = rule.allowed.first();
    (
        list.map_or(Value::Null, |l| Value::Array(l.values.clone())),
        None,
    )
}

fn type_violation(
    rule: &EffectiveRule,
    concrete: &str,
    value: &Value,
    element: Option<usize>,
) -> Violation {
    let (bound, slot) = describe(rule);
    let mut v = base(rule, concrete, element, slot);
    if slot.is_none() {
        if let Some(list) = rule.allowed.first() {
            v.source.clone_from(&list.source);
            v.reason.clone_from(&list.reason);
        }
    }
    Violation {
        kind: ViolationKind::Type,
        bound,
        value: value.clone(),
        ..v
    }
}

fn length_violation(rule: &EffectiveRule, concrete: &str, len: usize) -> Option<Violation> {
    let slots = rule.max.as_ref().or(rule.min.as_ref())?;
    if slots.len() <= 1 || slots.len() == len {
        return None;
    }
    Some(Violation {
        kind: ViolationKind::Length,
        bound: Value::from(slots.len()),
        value: Value::from(len),
        ..base(rule, concrete, None, slots.first())
    })
}

fn leaf_violation(
    rule: &EffectiveRule,
    concrete: &str,
    value: &Value,
    element: Option<usize>,
) -> Option<Violation> {
    let min = slot_at(&rule.min, element);
    let max = slot_at(&rule.max, element);
    if rule.min.is_some() || rule.max.is_some() {
        // Only a finite number compares with a numeric bound; anything else
        // (string, boolean, null, object, array) fails rather than passes.
        let Some(n) = value
            .as_f64()
            .filter(|n| value.is_number() && n.is_finite())
        else {
            return Some(type_violation(rule, concrete, value, element));
        };
        if let Some(v) = range_violation(rule, concrete, value, n, element, min, max) {
            return Some(v);
        }
    }
    allowed_violation(rule, concrete, value, element)
}

fn range_violation(
    rule: &EffectiveRule,
    concrete: &str,
    value: &Value,
    n: f64,
    element: Option<usize>,
    min: Option<&Slot>,
    max: Option<&Slot>,
) -> Option<Violation> {
    let (kind, slot) = match (min, max) {
        (Some(lo), _) if n < lo.value => (ViolationKind::Min, lo),
        (_, Some(hi)) if n > hi.value => (ViolationKind::Max, hi),
        _ => return None,
    };
    Some(Violation {
        kind,
        bound: Value::from(slot.value),
        value: value.clone(),
        ..base(rule, concrete, element, Some(slot))
    })
}

fn allowed_violation(
    rule: &EffectiveRule,
    concrete: &str,
    value: &Value,
    element: Option<usize>,
) -> Option<Violation> {
    let list = rule.allowed.iter().find(|l| !contains(&l.values, value))?;
    let mut v = base(rule, concrete, element, None);
    v.source.clone_from(&list.source);
    v.reason.clone_from(&list.reason);
    Some(Violation {
        kind: ViolationKind::Allowed,
        bound: Value::Array(list.values.clone()),
        value: value.clone(),
        ..v
    })
}
