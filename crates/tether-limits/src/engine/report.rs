//! Reading the effective limits: accessors and the reference-file JSON.

use serde_json::{json, Map, Value};

use super::{EffectiveLimits, EffectiveRule, Slot};
use crate::budget::BudgetRule;
use crate::path::{Index, LimitPath, Segment};
use crate::schema::{At, Kind, Resolver};
use crate::SourceKind;

/// Deepest schema nesting enumerated when listing numeric leaves.
const LEAF_DEPTH_MAX: usize = 16;
/// Most numeric leaves listed; a schema with more is reported truncated.
const LEAF_COUNT_MAX: usize = 1024;

impl EffectiveLimits {
    /// The rules with `per`: cumulative budgets, each applied separately.
    pub fn budgets(&self) -> &[BudgetRule] {
        &self.budgets
    }

    /// Paths of sources built with `require_resolve: false` that did not
    /// resolve here; the caller checks each resolves in some binding.
    pub fn unresolved(&self) -> &[(SourceKind, String)] {
        &self.unresolved
    }

    /// Numeric leaves of the schema (arrays as `[*]`) that no limit covers.
    pub fn unlimited_paths(&self) -> &[String] {
        &self.unlimited
    }

    /// Every effective rule, sorted by canonical path.
    pub fn rules(&self) -> &[EffectiveRule] {
        &self.rules
    }

    /// The effective rule of a canonical path (`joints[*]`, `speed`).
    pub fn rule(&self, path: &str) -> Option<&EffectiveRule> {
        self.rules.iter().find(|r| r.path.to_string() == path)
    }

    /// The effective limits as JSON, for the generated reference file.
    pub fn to_json(&self) -> Value {
        let mut limits = Map::new();
        for rule in &self.rules {
            limits.insert(rule.path.to_string(), rule.to_json());
        }
        let list = |pred: fn(&EffectiveRule) -> bool| -> Vec<Value> {
            self.rules
                .iter()
                .filter(|r| pred(r))
                .map(|r| Value::from(r.path.to_string()))
                .collect()
        };
        json!({
            "limits": limits,
            "cumulative": self.budgets.iter().map(BudgetRule::to_json).collect::<Vec<_>>(),
            "operator_required": list(|r| r.operator_required),
            "unlimited": self.unlimited,
            "narrowed": list(|r| r.narrowed),
        })
    }
}

impl EffectiveRule {
    /// The rule as one entry of the reference file's `limits`.
    pub fn to_json(&self) -> Value {
        let mut out = Map::new();
        if let Some(min) = &self.min {
            out.insert("min".into(), slots_json(min));
        }
        if let Some(max) = &self.max {
            out.insert("max".into(), slots_json(max));
        }
        if let Some(set) = self.allowed_set() {
            out.insert("allowed".into(), Value::Array(set));
        }
        if let Some(unit) = &self.unit {
            out.insert("unit".into(), Value::from(unit.as_str()));
        }
        if let Some(names) = &self.names {
            out.insert("names".into(), json!(names));
        }
        if let Some(reason) = self.provenance.iter().find_map(|p| p.reason.clone()) {
            out.insert("reason".into(), Value::from(reason));
        }
        let mut sources: Vec<&str> = self.provenance.iter().map(|p| p.source.as_str()).collect();
        sources.dedup();
        out.insert("sources".into(), json!(sources));
        out.insert("provenance".into(), self.provenance_json());
        out.insert(
            "operator_required".into(),
            Value::Bool(self.operator_required),
        );
        if self.operator_required {
            // Whether an operator's overlay gave the bound; until then every
            // call that sets the value is refused, whatever other sources say.
            out.insert("operator_filled".into(), Value::Bool(self.filled));
        }
        Value::Object(out)
    }

    fn allowed_set(&self) -> Option<Vec<Value>> {
        let (first, rest) = self.allowed.split_first()?;
        let mut set = Vec::new();
        for v in &first.values {
            let keep = rest
                .iter()
                .all(|l| super::intersect::contains(&l.values, v))
                && !super::intersect::contains(&set, v);
            if keep {
                set.push(v.clone());
            }
        }
        Some(set)
    }

    /// The provenance entry of one source, if that source gave one with
    /// more than its name (an origin, a reference or a reason).
    pub(crate) fn provenance_of(&self, source: &str) -> Option<Value> {
        let p = self.provenance.iter().find(|p| p.source == source)?;
        if p.origin.is_none() && p.reference.is_none() && p.reason.is_none() {
            return None;
        }
        Some(provenance_entry(p))
    }

    fn provenance_json(&self) -> Value {
        Value::Array(self.provenance.iter().map(provenance_entry).collect())
    }
}

/// One source's provenance: `{source, origin?, ref?, reason?}`.
fn provenance_entry(p: &super::Provenance) -> Value {
    let mut m = Map::new();
    m.insert("source".into(), Value::from(p.source.as_str()));
    if let Some(o) = p.origin {
        m.insert("origin".into(), Value::from(o));
    }
    if let Some(r) = &p.reference {
        m.insert("ref".into(), Value::from(r.as_str()));
    }
    if let Some(r) = &p.reason {
        m.insert("reason".into(), Value::from(r.as_str()));
    }
    Value::Object(m)
}

/// One number when every element shares the bound, else one per element.
fn slots_json(slots: &[Slot]) -> Value {
    match slots {
        [one] => Value::from(one.value),
        many => Value::Array(many.iter().map(|s| Value::from(s.value)).collect()),
    }
}

/// The schema's numeric leaves that no wildcard-only limit path covers. A
/// limit on one element (`a[2]`) does not cover the others, so the leaf stays
/// listed.
pub(crate) fn unlimited_paths(resolver: &Resolver<'_>, rules: &[EffectiveRule]) -> Vec<String> {
    let mut leaves = Vec::new();
    collect_leaves(resolver, resolver.root(), &mut Vec::new(), 0, &mut leaves);
    let covered: Vec<String> = rules
        .iter()
        .filter(|r| (r.has_bounds() || r.operator_required) && r.path.is_wildcard_only())
        .map(|r| r.path.to_string())
        .collect();
    leaves.sort();
    leaves.dedup();
    leaves.retain(|p| !covered.contains(p));
    leaves
}

fn collect_leaves(
    r: &Resolver<'_>,
    node: At<'_>,
    prefix: &mut Vec<Segment>,
    depth: usize,
    out: &mut Vec<String>,
) {
    if depth > LEAF_DEPTH_MAX || out.len() >= LEAF_COUNT_MAX {
        return;
    }
    let mut names: Vec<String> = Vec::new();
    for member in r.members(node.clone()) {
        if let Some(props) = member.value.get("properties").and_then(Value::as_object) {
            names.extend(props.keys().cloned());
        }
    }
    names.sort();
    names.dedup();
    for name in names {
        let Some(child) = r.property(&node, &name) else {
            continue;
        };
        prefix.push(Segment { name, index: None });
        visit_member(r, child, prefix, depth, out);
        prefix.pop();
    }
}

fn visit_member(
    r: &Resolver<'_>,
    child: At<'_>,
    prefix: &mut Vec<Segment>,
    depth: usize,
    out: &mut Vec<String>,
) {
    let mut node = child;
    if r.kind(&node) == Kind::Array {
        if let Some(last) = prefix.last_mut() {
            last.index = Some(Index::All);
        }
        // Arrays of arrays cannot be addressed by the grammar; stop there.
        let Some((elements, _)) = r.elements(&node, Index::All) else {
            return;
        };
        let Some(first) = elements.into_iter().next() else {
            return;
        };
        node = first;
    }
    match r.kind(&node) {
        Kind::Number | Kind::Integer => {
            if let Some(path) = LimitPath::from_segments(prefix.clone()) {
                out.push(path.to_string());
            }
        }
        Kind::Object => collect_leaves(r, node, prefix, depth + 1, out),
        _ => {}
    }
}
