//! Intersecting the contributions to one path.
//!
//! Regular sources (class, binding, envelope) intersect into one side,
//! narrow-only sources (the operator overlay) into another; the narrow side
//! may only tighten the regular one. Every choice below is a min, a max or a
//! set intersection with a total tie-break, so the result never depends on
//! the order the sources were given in.

use serde_json::Value;

use super::{AllowedList, Contribution, EffectiveRule, Entry, Provenance, Slot};
use crate::error::{LoadError, LoadErrorKind};
use crate::rule::{Bound, RuleEntry, RuleSpec};

/// The intersection of one group of sources.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Side {
    pub min: Option<Vec<Slot>>,
    pub max: Option<Vec<Slot>>,
    pub allowed: Vec<AllowedList>,
}

impl Side {
    fn fold<'a>(contributions: impl Iterator<Item = &'a Contribution>, len: usize) -> Side {
        let mut side = Side::default();
        for c in contributions {
            if let RuleEntry::Rule(spec) = &c.entry {
                side = side.meet(&Side::of(spec, &c.source.to_string(), len));
            }
        }
        side.allowed
            .sort_by_cached_key(|l| (l.source.clone(), Value::Array(l.values.clone()).to_string()));
        side
    }

    fn of(spec: &RuleSpec, source: &str, len: usize) -> Side {
        let slots = |bound: &Option<Bound>| {
            bound
                .as_ref()
                .map(|b| expand(b, len, source, spec.reason.as_ref()))
        };
        Side {
            min: slots(&spec.min),
            max: slots(&spec.max),
            allowed: spec
                .allowed
                .iter()
                .map(|values| AllowedList {
                    values: values.clone(),
                    source: source.to_string(),
                    reason: spec.reason.clone(),
                })
                .collect(),
        }
    }

    fn meet(&self, other: &Side) -> Side {
        let mut allowed = self.allowed.clone();
        allowed.extend(other.allowed.iter().cloned());
        Side {
            min: meet_slots(&self.min, &other.min, Prefer::Larger),
            max: meet_slots(&self.max, &other.max, Prefer::Smaller),
            allowed,
        }
    }

    /// The bounds that apply to element `i` alone (per-element slots pick
    /// theirs; a single slot applies to every element).
    fn element(&self, i: usize) -> Side {
        let pick = |slots: &Option<Vec<Slot>>| {
            slots
                .as_ref()
                .and_then(|s| s.get(i).or_else(|| s.first()).cloned())
                .map(|slot| vec![slot])
        };
        Side {
            min: pick(&self.min),
            max: pick(&self.max),
            allowed: self.allowed.clone(),
        }
    }

    fn has_bound(&self) -> bool {
        self.min.is_some() || self.max.is_some() || !self.allowed.is_empty()
    }

    /// The values every list allows; `None` when no list applies.
    fn allowed_set(&self) -> Option<Vec<Value>> {
        let (first, rest) = self.allowed.split_first()?;
        let mut set: Vec<Value> = Vec::new();
        for v in &first.values {
            let in_all = rest.iter().all(|l| contains(&l.values, v));
            if in_all && !contains(&set, v) {
                set.push(v.clone());
            }
        }
        Some(set)
    }

    fn same_bounds(&self, other: &Side) -> bool {
        values(&self.min) == values(&other.min)
            && values(&self.max) == values(&other.max)
            && self.allowed_set() == other.allowed_set()
    }
}

fn values(slots: &Option<Vec<Slot>>) -> Option<Vec<f64>> {
    slots.as_ref().map(|s| s.iter().map(|x| x.value).collect())
}

/// Whether `list` holds `v`; numbers compare by value, so 1 and 1.0 are equal.
pub(crate) fn contains(list: &[Value], v: &Value) -> bool {
    list.iter().any(|x| same_value(x, v))
}

pub(crate) fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

fn expand(bound: &Bound, len: usize, source: &str, reason: Option<&String>) -> Vec<Slot> {
    let slot = |value: f64| Slot {
        value,
        source: source.to_string(),
        reason: reason.cloned(),
    };
    match bound {
        Bound::Scalar(v) => vec![slot(*v)],
        Bound::PerElement(values) if values.len() == len => {
            values.iter().map(|v| slot(*v)).collect()
        }
        // Lengths were checked against the field; a mismatch cannot reach here.
        Bound::PerElement(values) => values.iter().take(len).map(|v| slot(*v)).collect(),
    }
}

#[derive(Clone, Copy)]
enum Prefer {
    Smaller,
    Larger,
}

fn meet_slots(a: &Option<Vec<Slot>>, b: &Option<Vec<Slot>>, prefer: Prefer) -> Option<Vec<Slot>> {
    let (a, b) = match (a, b) {
        (None, None) => return None,
        (Some(x), None) | (None, Some(x)) => return Some(x.clone()),
        (Some(a), Some(b)) => (a, b),
    };
    let len = a.len().max(b.len());
    let at = |s: &[Slot], i: usize| s.get(i).or_else(|| s.first()).cloned();
    let mut out = Vec::with_capacity(len);
    for i in 0..len {
        let (Some(x), Some(y)) = (at(a, i), at(b, i)) else {
            continue;
        };
        out.push(choose(x, y, prefer));
    }
    Some(out)
}

/// The tighter slot; on equal values the smaller (source, reason) wins, so
/// the reported source is the same whatever the order.
fn choose(x: Slot, y: Slot, prefer: Prefer) -> Slot {
    let y_tighter = match prefer {
        Prefer::Smaller => y.value < x.value,
        Prefer::Larger => y.value > x.value,
    };
    let tie_to_y = x.value == y.value && (&y.source, &y.reason) < (&x.source, &x.reason);
    if y_tighter || tie_to_y {
        y
    } else {
        x
    }
}

/// Intersect every contribution of one path.
pub(crate) fn intersect(key: &str, entry: &Entry) -> Result<EffectiveRule, Vec<LoadError>> {
    let len = slot_len(entry);
    let regular = Side::fold(entry.contributions.iter().filter(|c| !c.narrow_only), len);
    let overlay = Side::fold(entry.contributions.iter().filter(|c| c.narrow_only), len);
    let mut errors = Vec::new();
    let names = agreed_names(key, entry, &mut errors);
    widening(key, &regular, &overlay, &mut errors);
    let effective = regular.meet(&overlay);
    contradictions(key, &effective, &mut errors);
    if entry.field.kind == crate::schema::Kind::Integer {
        no_integer_allowed(key, &effective, &mut errors);
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let operator_required = entry
        .contributions
        .iter()
        .any(|c| !c.narrow_only && c.entry == RuleEntry::OperatorRequired);
    let filled = overlay.has_bound();
    let narrowed = filled && (!effective.same_bounds(&regular) || operator_required);
    Ok(EffectiveRule {
        path: entry.field.canonical.clone(),
        unit: entry.field.unit.clone(),
        pointers: entry.field.pointers.clone(),
        min: effective.min,
        max: effective.max,
        allowed: effective.allowed,
        names,
        operator_required,
        filled,
        narrowed,
        provenance: provenance(entry),
    })
}

/// One slot, unless some source bounds elements one by one.
fn slot_len(entry: &Entry) -> usize {
    let per_element = entry.contributions.iter().any(|c| match &c.entry {
        RuleEntry::Rule(spec) => {
            matches!(spec.min, Some(Bound::PerElement(_)))
                || matches!(spec.max, Some(Bound::PerElement(_)))
        }
        RuleEntry::OperatorRequired => false,
    });
    match entry.field.element_array {
        Some(Some(len)) if per_element => len,
        _ => 1,
    }
}

fn load_error(key: &str, reason: LoadErrorKind, source: String, message: String) -> LoadError {
    LoadError {
        path: key.to_string(),
        reason,
        source,
        message,
    }
}

fn agreed_names(key: &str, entry: &Entry, errors: &mut Vec<LoadError>) -> Option<Vec<String>> {
    let mut all: Vec<(String, &Vec<String>)> = entry
        .contributions
        .iter()
        .filter_map(|c| match &c.entry {
            RuleEntry::Rule(RuleSpec { names: Some(n), .. }) => Some((c.source.to_string(), n)),
            _ => None,
        })
        .collect();
    all.sort();
    let (first_source, first) = all.first()?.clone();
    for (source, names) in all.iter().skip(1) {
        if *names != first {
            errors.push(load_error(
                key,
                LoadErrorKind::NamesMismatch,
                format!("{first_source}+{source}"),
                format!("element names {first:?} and {names:?} disagree"),
            ));
        }
    }
    Some(first.clone())
}

fn widening(key: &str, regular: &Side, overlay: &Side, errors: &mut Vec<LoadError>) {
    let pairs = [
        ("max", &regular.max, &overlay.max, Prefer::Smaller),
        ("min", &regular.min, &overlay.min, Prefer::Larger),
    ];
    for (member, reg, ovl, prefer) in pairs {
        let (Some(reg), Some(ovl)) = (reg, ovl) else {
            continue;
        };
        if let Some((r, o)) = first_wider(reg, ovl, prefer) {
            errors.push(load_error(
                key,
                LoadErrorKind::WideningOverlay,
                o.source.clone(),
                format!(
                    "{member} {} would widen the {member} {} set by {}",
                    o.value, r.value, r.source
                ),
            ));
        }
    }
    if let Some(ovl) = overlay.allowed_set() {
        if let Some((extra, bound)) = outside_range(&ovl, regular) {
            let source = allowed_source(overlay);
            errors.push(load_error(
                key,
                LoadErrorKind::WideningOverlay,
                source,
                format!("allowed value {extra} is outside the regular {bound}"),
            ));
        }
    }
    if let (Some(reg), Some(ovl)) = (regular.allowed_set(), overlay.allowed_set()) {
        if let Some(extra) = ovl.iter().find(|v| !contains(&reg, v)) {
            let source = allowed_source(overlay);
            errors.push(load_error(
                key,
                LoadErrorKind::WideningOverlay,
                source,
                format!("allowed value {extra} is not allowed by the regular sources"),
            ));
        }
    }
}

/// A numeric value of `allowed` that the regular min or max forbids (for
/// per-element bounds: beyond every element's), and which bound.
fn outside_range(allowed: &[Value], regular: &Side) -> Option<(Value, String)> {
    let widest = |slots: &Option<Vec<Slot>>, prefer: Prefer| {
        slots.as_ref().and_then(|s| {
            s.iter().map(|x| x.value).reduce(|a, b| match prefer {
                Prefer::Smaller => a.min(b),
                Prefer::Larger => a.max(b),
            })
        })
    };
    // The loosest bound over the elements: a value past it is allowed nowhere.
    let max = widest(&regular.max, Prefer::Larger);
    let min = widest(&regular.min, Prefer::Smaller);
    allowed.iter().find_map(|v| {
        let x = v.as_f64()?;
        match (min, max) {
            (_, Some(m)) if x > m => Some((v.clone(), format!("max {m}"))),
            (Some(m), _) if x < m => Some((v.clone(), format!("min {m}"))),
            _ => None,
        }
    })
}

/// An overlay rule and a regular rule on different paths that address the
/// same elements (`a[2]` and `a[*]`, `objs[0].p` and `objs[*].p`) are never
/// compared by [`intersect`], which sees one path at a time: here each
/// overlay rule is held against every regular rule covering, or covered by,
/// its path, element by element, and may not be looser.
pub(crate) fn cross_path_widening(
    entries: &std::collections::BTreeMap<String, Entry>,
) -> Vec<LoadError> {
    let mut errors = Vec::new();
    for (key, narrow) in entries {
        if !narrow.contributions.iter().any(|c| c.narrow_only) {
            continue;
        }
        let overlay_len = slot_len(narrow);
        let overlay = Side::fold(
            narrow.contributions.iter().filter(|c| c.narrow_only),
            overlay_len,
        );
        for (other_key, regular_entry) in entries {
            if other_key == key || regular_entry.contributions.iter().all(|c| c.narrow_only) {
                continue;
            }
            let o = &narrow.field.canonical;
            let r = &regular_entry.field.canonical;
            // Which slot of each side speaks for the shared element.
            let (o_slot, r_slot) = if let Some(element) = covers(r, o) {
                (0, element)
            } else if let Some(element) = covers(o, r) {
                (element, 0)
            } else {
                continue;
            };
            let regular_len = slot_len(regular_entry);
            let regular = Side::fold(
                regular_entry
                    .contributions
                    .iter()
                    .filter(|c| !c.narrow_only),
                regular_len,
            );
            widening(
                key,
                &regular.element(r_slot),
                &overlay.element(o_slot),
                &mut errors,
            );
        }
    }
    errors
}

/// Whether `general` addresses every element `specific` does, with `[*]`
/// where `specific` has `[N]` (at least once; the same path is not a
/// cover). Answers the element index of the last segment when that is where
/// they differ (it picks a per-element bound), else 0.
fn covers(general: &crate::path::LimitPath, specific: &crate::path::LimitPath) -> Option<usize> {
    use crate::path::Index;
    let (g, s) = (general.segments(), specific.segments());
    if g.len() != s.len() {
        return None;
    }
    let mut substituted = false;
    let mut element = 0;
    for (i, (gs, ss)) in g.iter().zip(s).enumerate() {
        if gs.name != ss.name {
            return None;
        }
        match (gs.index, ss.index) {
            (a, b) if a == b => {}
            (Some(Index::All), Some(Index::At(n))) => {
                substituted = true;
                if i + 1 == g.len() {
                    element = n;
                }
            }
            _ => return None,
        }
    }
    substituted.then_some(element)
}

/// The source named for an `allowed` defect: the overlay's first list.
fn allowed_source(overlay: &Side) -> String {
    overlay
        .allowed
        .first()
        .map(|l| l.source.clone())
        .unwrap_or_default()
}

fn first_wider<'a>(
    reg: &'a [Slot],
    ovl: &'a [Slot],
    prefer: Prefer,
) -> Option<(&'a Slot, &'a Slot)> {
    let len = reg.len().max(ovl.len());
    (0..len).find_map(|i| {
        let r = reg.get(i).or_else(|| reg.first())?;
        let o = ovl.get(i).or_else(|| ovl.first())?;
        let wider = match prefer {
            Prefer::Smaller => o.value > r.value,
            Prefer::Larger => o.value < r.value,
        };
        wider.then_some((r, o))
    })
}

/// An integer field whose allowed values are all fractional admits nothing.
fn no_integer_allowed(key: &str, side: &Side, errors: &mut Vec<LoadError>) {
    let Some(set) = side.allowed_set() else {
        return;
    };
    let integral = |v: &Value| v.as_f64().is_some_and(|x| x.fract() == 0.0);
    if !set.is_empty() && !set.iter().any(integral) {
        let names: Vec<&str> = side.allowed.iter().map(|l| l.source.as_str()).collect();
        errors.push(load_error(
            key,
            LoadErrorKind::Contradictory,
            names.join("+"),
            "the field is an integer and no allowed value is one".into(),
        ));
    }
}

/// Sources that bound the same element under two spellings (`a[*]` or
/// per-element bounds on `a`, and `a[2]`) are intersected for that element:
/// a min above the max there, or no allowed value left, is contradictory
/// even though neither path alone is.
pub(crate) fn cross_path_contradictions(
    entries: &std::collections::BTreeMap<String, Entry>,
) -> Vec<LoadError> {
    let mut errors = Vec::new();
    for (key, specific) in entries {
        for (other_key, general) in entries {
            if other_key == key {
                continue;
            }
            let Some(element) = covers(&general.field.canonical, &specific.field.canonical) else {
                continue;
            };
            let g = Side::fold(general.contributions.iter(), slot_len(general)).element(element);
            let s = Side::fold(specific.contributions.iter(), slot_len(specific)).element(0);
            contradictions(key, &g.meet(&s), &mut errors);
        }
    }
    errors
}

fn contradictions(key: &str, side: &Side, errors: &mut Vec<LoadError>) {
    if let (Some(min), Some(max)) = (&side.min, &side.max) {
        if let Some((lo, hi)) = first_wider(max, min, Prefer::Smaller).map(|(hi, lo)| (lo, hi)) {
            errors.push(load_error(
                key,
                LoadErrorKind::Contradictory,
                format!("{}+{}", lo.source, hi.source),
                format!("min {} is above max {}", lo.value, hi.value),
            ));
            return;
        }
    }
    let Some(set) = side.allowed_set() else {
        return;
    };
    let sources = || {
        let names: Vec<&str> = side.allowed.iter().map(|l| l.source.as_str()).collect();
        names.join("+")
    };
    if set.is_empty() {
        errors.push(load_error(
            key,
            LoadErrorKind::Contradictory,
            sources(),
            "the allowed lists have no value in common".into(),
        ));
        return;
    }
    if !any_allowed_in_range(&set, side) {
        errors.push(load_error(
            key,
            LoadErrorKind::Contradictory,
            sources(),
            "no allowed value lies within min and max".into(),
        ));
    }
}

/// Whether, at every element, some allowed number passes min and max.
fn any_allowed_in_range(set: &[Value], side: &Side) -> bool {
    let numbers: Vec<f64> = set.iter().filter_map(Value::as_f64).collect();
    if numbers.len() != set.len() || (side.min.is_none() && side.max.is_none()) {
        return true;
    }
    let len = side
        .min
        .as_ref()
        .map_or(1, Vec::len)
        .max(side.max.as_ref().map_or(1, Vec::len));
    let bound = |s: &Option<Vec<Slot>>, i: usize| {
        s.as_ref()
            .and_then(|v| v.get(i).or_else(|| v.first()))
            .map(|x| x.value)
    };
    (0..len).all(|i| {
        let lo = bound(&side.min, i).unwrap_or(f64::NEG_INFINITY);
        let hi = bound(&side.max, i).unwrap_or(f64::INFINITY);
        numbers.iter().any(|v| *v >= lo && *v <= hi)
    })
}

fn provenance(entry: &Entry) -> Vec<Provenance> {
    let mut out: Vec<Provenance> = entry
        .contributions
        .iter()
        .map(|c| match &c.entry {
            RuleEntry::Rule(spec) => Provenance {
                source: c.source.to_string(),
                origin: spec.origin.map(|o| o.as_str()),
                reference: spec.reference.clone(),
                reason: spec.reason.clone(),
            },
            RuleEntry::OperatorRequired => Provenance {
                source: c.source.to_string(),
                origin: None,
                reference: None,
                reason: Some(crate::rule::OPERATOR_REQUIRED.to_string()),
            },
        })
        .collect();
    out.sort();
    out.dedup();
    out
}
