//! The policy slices built at load: for each binding and request shape
//! (principal kind × action), the policies that may apply to it, the input
//! fields they read, and — when every one of them is certainly satisfied —
//! the verdict, worked out once. Identical slices are shared, and past
//! [`SLICE_WORK_MAX`] judgements every shape gets the whole set instead.
//!
//! Judging one policy against one shape, in three values, is `judge`; it
//! drops a policy only when it is certainly not satisfied, so a slice never
//! changes a decision (`differential` checks that on random policies).

mod judge;

use crate::annotations::{verdict_from, Meta};
use crate::entities::BindingEnt;
use crate::input::CType;
use crate::{Action, PrincipalKind, Verdict};
use cedar_policy::{
    Decision as CedarDecision, Effect, EntityTypeName, EntityUid, Policy, PolicySet,
};
use serde_json::Value;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// Most (request shape × policy) judgements made while slicing at load; a
/// larger cell and policy together skip slicing and evaluate the whole set
/// (slower decisions, same answers), so loading stays bounded.
pub(crate) const SLICE_WORK_MAX: usize = 4_000_000;

/// Request shapes per binding: three principal kinds × three actions.
pub(crate) const SHAPES_PER_BINDING: usize = 9;

/// The policies one request shape can meet, and the input fields they read.
#[derive(Debug)]
pub(crate) struct Slice {
    pub(crate) set: PolicySet,
    /// The input type narrowed to the fields this slice's policies name;
    /// `None` when none reads `context.input` (then nothing is converted).
    pub(crate) input_type: Option<CType>,
    /// The decision, when it is the same for every request of the shape
    /// (every policy in the slice is certainly satisfied): Cedar's answer,
    /// worked out once at load.
    pub(crate) fixed: Option<Verdict>,
    /// `fixed`'s evidence JSON, built once and shared by every request.
    pub(crate) fixed_json: Option<Arc<Value>>,
}

impl Slice {
    pub(crate) fn new(set: PolicySet, input: &CType) -> Self {
        let fields = referenced_input_fields(&set);
        Self {
            input_type: narrow(input.clone(), &fields),
            set,
            fixed: None,
            fixed_json: None,
        }
    }

    /// Cedar's decision when every policy in `set` is satisfied: any forbid
    /// denies, naming every forbid; else the permits allow or hold; an empty
    /// set denies by default.
    fn certain_verdict(set: &PolicySet, meta: &HashMap<String, Meta>) -> Verdict {
        let ids = |effect: Effect| -> Vec<String> {
            let mut v: Vec<String> = set
                .policies()
                .filter(|p| p.effect() == effect)
                .map(|p| p.id().to_string())
                .collect();
            v.sort();
            v
        };
        let forbids = ids(Effect::Forbid);
        if forbids.is_empty() {
            let permits = ids(Effect::Permit);
            let decision = if permits.is_empty() {
                CedarDecision::Deny
            } else {
                CedarDecision::Allow
            };
            verdict_from(meta, decision, permits)
        } else {
            verdict_from(meta, CedarDecision::Deny, forbids)
        }
    }
}

/// Where a (principal kind, action) pair sits in a binding's slices.
pub(crate) fn shape_index(kind: PrincipalKind, action: Action) -> usize {
    let k = match kind {
        PrincipalKind::Agent => 0,
        PrincipalKind::Human => 1,
        PrincipalKind::Service => 2,
    };
    let a = match action {
        Action::Read => 0,
        Action::Write => 1,
        Action::Command => 2,
    };
    k * 3 + a
}

/// Slices every binding's request shapes (see `slice`); past
/// `SLICE_WORK_MAX` judgements every shape gets the whole set instead.
pub(crate) fn build_slices(
    set: &PolicySet,
    meta: &HashMap<String, Meta>,
    bindings: &[Vec<BindingEnt>],
    input: &CType,
    kinds: &[EntityTypeName; 3],
    actions: &[EntityUid; 3],
    work_max: usize,
) -> Result<Vec<Vec<[Arc<Slice>; SHAPES_PER_BINDING]>>, String> {
    let policies: Vec<&Policy> = set.policies().collect();
    let binding_count: usize = bindings.iter().map(Vec::len).sum();
    let work = binding_count
        .saturating_mul(SHAPES_PER_BINDING)
        .saturating_mul(policies.len());
    let slicing = work <= work_max;
    let prepared: Vec<judge::Prepared> = if slicing {
        policies.iter().map(|p| judge::Prepared::new(p)).collect()
    } else {
        Vec::new()
    };
    let whole = (!slicing).then(|| Arc::new(Slice::new(set.clone(), input)));
    // Shared by (kept policies, decided at load): the same policies may be
    // certain for one shape and depend on the request for another.
    let mut shared: HashMap<(Vec<usize>, bool), Arc<Slice>> = HashMap::new();
    let mut out = Vec::with_capacity(bindings.len());
    for device in bindings {
        let mut per_device = Vec::with_capacity(device.len());
        for b in device {
            let mut shapes: Vec<Arc<Slice>> = Vec::with_capacity(SHAPES_PER_BINDING);
            for kind in kinds {
                for action in actions {
                    if let Some(whole) = &whole {
                        shapes.push(Arc::clone(whole));
                        continue;
                    }
                    let shape = b.shape(kind, action);
                    let judged: Vec<(usize, judge::Tri)> = prepared
                        .iter()
                        .enumerate()
                        .map(|(i, p)| (i, p.judge(&shape)))
                        .filter(|(_, t)| *t != judge::Tri::False)
                        .collect();
                    let certain = judged.iter().all(|(_, t)| *t == judge::Tri::True);
                    let key = (judged.iter().map(|(i, _)| *i).collect::<Vec<_>>(), certain);
                    if let Some(s) = shared.get(&key) {
                        shapes.push(Arc::clone(s));
                        continue;
                    }
                    let subset =
                        PolicySet::from_policies(key.0.iter().map(|&i| policies[i].clone()))
                            .map_err(|e| e.to_string())?;
                    let mut s = Slice::new(subset, input);
                    if certain {
                        let verdict = Slice::certain_verdict(&s.set, meta);
                        s.fixed_json = Some(Arc::new(verdict.to_json()));
                        s.fixed = Some(verdict);
                    }
                    let s = Arc::new(s);
                    shared.insert(key, Arc::clone(&s));
                    shapes.push(s);
                }
            }
            let shapes: [Arc<Slice>; SHAPES_PER_BINDING] = shapes
                .try_into()
                .map_err(|_| "a binding has the wrong number of request shapes".to_owned())?;
            per_device.push(shapes);
        }
        out.push(per_device);
    }
    Ok(out)
}

impl BindingEnt {
    /// The fixed facts of a request on this binding by `kind` doing `action`.
    fn shape<'a>(&'a self, kind: &'a EntityTypeName, action: &'a EntityUid) -> judge::Shape<'a> {
        use judge::Known;
        let text = |v: &str| Known::Str(v.to_owned());
        judge::Shape {
            principal_type: kind,
            action,
            binding: &self.uid,
            device: &self.device_uid,
            resource_attrs: vec![
                ("device", text(&self.device_id)),
                ("capability", text(&self.capability)),
                ("verb", text(&self.verb)),
                ("risk", text(&self.risk)),
                ("resource", text(&self.resource)),
                ("stop_class", Known::Bool(self.flags.stop_class)),
                ("risk_reducing", Known::Bool(self.flags.risk_reducing)),
                ("safe_place", Known::Bool(self.flags.safe_place)),
                ("two_person", Known::Bool(self.flags.two_person)),
            ],
            context_attrs: vec![
                ("mode", text(&self.mode)),
                ("risk_class", text(&self.risk)),
                ("device_risk_class", text(&self.device_risk)),
            ],
            flags: vec![
                ("stop_class", self.flags.stop_class),
                ("risk_reducing", self.flags.risk_reducing),
                ("safe_place", self.flags.safe_place),
                ("two_person", self.flags.two_person),
            ],
        }
    }
}

/// Top-level input fields the policies name (`context.input.x`,
/// `context.input has x`, `context.input["x"]`); `None` when some policy uses
/// `context.input` as a whole, so every field must be given. A policy can
/// observe only the fields it names, so leaving the others out changes no
/// decision and saves converting numbers nobody reads.
fn referenced_input_fields(set: &PolicySet) -> Option<BTreeSet<String>> {
    let mut fields = BTreeSet::new();
    for p in set.policies() {
        let text = p.to_string();
        // Every mention of the word `input` must be a `context.input<field>`
        // form this scan understands; anything else (`context["input"]`,
        // `context has input`, spacing it does not expect) means all fields.
        if word_count(&text, "input") != text.matches("context.input").count() {
            return None;
        }
        let mut rest = text.as_str();
        while let Some(at) = rest.find("context.input") {
            rest = &rest[at + "context.input".len()..];
            fields.insert(next_field(rest)?);
        }
    }
    Some(fields)
}

/// How often `word` appears as a whole identifier (not inside another one).
fn word_count(text: &str, word: &str) -> usize {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word)
        .filter(|(at, _)| {
            let before = text[..*at].chars().next_back();
            let after = text[at + word.len()..].chars().next();
            !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
        })
        .count()
}

/// The field named right after `context.input`, or `None` when it is used whole.
fn next_field(rest: &str) -> Option<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let quoted = |s: &str| -> Option<String> {
        let s = s.strip_prefix('"')?;
        let end = s.find('"')?;
        let name = &s[..end];
        (!name.contains('\\')).then(|| name.to_owned())
    };
    if let Some(r) = rest.strip_prefix('.') {
        let name = ident(r);
        return (!name.is_empty()).then_some(name);
    }
    if let Some(r) = rest.strip_prefix('[') {
        return quoted(r.trim_start());
    }
    let trimmed = rest.trim_start();
    if let Some(r) = trimmed.strip_prefix("has") {
        let r = r.trim_start();
        if r.starts_with('"') {
            return quoted(r);
        }
        let name = ident(r);
        return (!name.is_empty()).then_some(name);
    }
    None
}

fn narrow(t: CType, fields: &Option<BTreeSet<String>>) -> Option<CType> {
    match (t, fields) {
        (t, None) => Some(t),
        (_, Some(f)) if f.is_empty() => None,
        (CType::Record(all), Some(f)) => Some(CType::Record(
            all.into_iter().filter(|(k, _)| f.contains(k)).collect(),
        )),
        (t, Some(_)) => Some(t),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    fn fields(text: &str) -> Option<BTreeSet<String>> {
        referenced_input_fields(&PolicySet::from_str(text).expect("parses"))
    }

    #[test]
    fn only_named_input_fields_are_converted_and_anything_unusual_means_all() {
        let named = fields(
            r#"permit(principal, action, resource) when { context.input has speed && context.input.speed.greaterThan(decimal("1.0")) && context.input has "odd-name" && context.input["odd-name"] == "x" };"#,
        )
        .expect("named");
        assert_eq!(named.into_iter().collect::<Vec<_>>(), ["odd-name", "speed"]);
        assert_eq!(
            fields("permit(principal, action, resource);"),
            Some(BTreeSet::new())
        );
        for whole in [
            r#"permit(principal, action, resource) when { context["input"]["speed"] == 1 };"#,
            r#"permit(principal, action, resource) when { context has input };"#,
            r#"permit(principal, action, resource) when { context.input == {} };"#,
        ] {
            assert_eq!(fields(whole), None, "{whole}");
        }
    }
}
