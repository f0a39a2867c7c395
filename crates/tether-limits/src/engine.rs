//! Building the effective limits from sources, and checking inputs.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::budget::BudgetRule;
use crate::error::{LoadError, LoadErrorKind};
use crate::path::{LimitPath, PathError};
use crate::rule::{parse_rule, Bound, RuleEntry, RuleSpec};
use crate::schema::{Field, Kind, Resolver};
use crate::{SourceKind, SourceRules};

mod check;
mod intersect;
mod report;

pub use check::strip_limited_bounds;

/// Most rules one source may declare; keeps a load bounded.
pub const SOURCE_RULES_MAX: usize = 10_000;

/// A bound value and who set it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Slot {
    pub value: f64,
    pub source: String,
    pub reason: Option<String>,
}

/// One source's `allowed` list.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AllowedList {
    pub values: Vec<Value>,
    pub source: String,
    pub reason: Option<String>,
}

/// Where one contribution came from, for the reference file.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Provenance {
    pub source: String,
    pub origin: Option<&'static str>,
    pub reference: Option<String>,
    pub reason: Option<String>,
}

/// One source's parsed, schema-checked rule for a path.
#[derive(Debug, Clone)]
pub(crate) struct Contribution {
    pub source: SourceKind,
    pub narrow_only: bool,
    pub entry: RuleEntry,
}

/// Every contribution to one canonical path.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub field: Field,
    pub contributions: Vec<Contribution>,
}

/// The effective limit of one path after intersecting every source.
#[derive(Debug, Clone, PartialEq)]
pub struct EffectiveRule {
    pub(crate) path: LimitPath,
    pub(crate) unit: Option<String>,
    pub(crate) pointers: Vec<String>,
    /// Length 1 (applies to every value) or the fixed array length.
    pub(crate) min: Option<Vec<Slot>>,
    pub(crate) max: Option<Vec<Slot>>,
    pub(crate) allowed: Vec<AllowedList>,
    pub(crate) names: Option<Vec<String>>,
    pub(crate) operator_required: bool,
    pub(crate) filled: bool,
    pub(crate) narrowed: bool,
    pub(crate) provenance: Vec<Provenance>,
}

impl EffectiveRule {
    /// The canonical limit path (an array leaf ends in `[*]`).
    pub fn path(&self) -> &LimitPath {
        &self.path
    }

    /// The field's unit.
    pub fn unit(&self) -> Option<&str> {
        self.unit.as_deref()
    }

    /// Whether a regular source deferred this bound to the operator.
    pub fn is_operator_required(&self) -> bool {
        self.operator_required
    }

    /// Whether a narrow-only source supplied a bound.
    pub fn is_filled(&self) -> bool {
        self.filled
    }

    /// Whether any min, max or allowed bound applies.
    pub fn has_bounds(&self) -> bool {
        self.min.is_some() || self.max.is_some() || !self.allowed.is_empty()
    }

    /// The effective maximum per element (one entry when it applies to all).
    pub fn max_values(&self) -> Option<Vec<f64>> {
        self.max
            .as_ref()
            .map(|s| s.iter().map(|x| x.value).collect())
    }

    /// The effective minimum per element (one entry when it applies to all).
    pub fn min_values(&self) -> Option<Vec<f64>> {
        self.min
            .as_ref()
            .map(|s| s.iter().map(|x| x.value).collect())
    }
}

/// The limits of one binding: every source intersected, ready to check inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct EffectiveLimits {
    pub(crate) schema: Value,
    pub(crate) rules: Vec<EffectiveRule>,
    pub(crate) budgets: Vec<BudgetRule>,
    pub(crate) unresolved: Vec<(SourceKind, String)>,
    pub(crate) unlimited: Vec<String>,
}

/// Everything gathered from the sources before intersecting.
#[derive(Default)]
struct Gathered {
    entries: BTreeMap<String, Entry>,
    budgets: Vec<BudgetRule>,
    /// Which of `budgets` came from a narrow-only source (the overlay).
    narrow_budgets: Vec<bool>,
    unresolved: Vec<(SourceKind, String)>,
    errors: Vec<LoadError>,
}

/// Build the effective limits of one binding from its sources.
///
/// # Errors
/// Every defect found in any source, not only the first.
pub fn build(schema: &Value, sources: &[SourceRules]) -> Result<EffectiveLimits, Vec<LoadError>> {
    let resolver = Resolver::new(schema);
    let mut gathered = Gathered::default();
    for source in sources {
        gather_source(&resolver, source, &mut gathered);
    }
    let mut rules = Vec::new();
    for (key, entry) in &gathered.entries {
        match intersect::intersect(key, entry) {
            Ok(rule) => rules.push(rule),
            Err(errs) => gathered.errors.extend(errs),
        }
    }
    gathered
        .errors
        .extend(intersect::cross_path_widening(&gathered.entries));
    gathered.errors.extend(widening_budgets(&gathered));
    gathered
        .errors
        .extend(intersect::cross_path_contradictions(&gathered.entries));
    if !gathered.errors.is_empty() {
        return Err(gathered.errors);
    }
    // Sorted so the result never depends on the order the sources came in.
    gathered.budgets.sort_by(|a, b| {
        (a.path.to_string(), &a.source, a.window)
            .cmp(&(b.path.to_string(), &b.source, b.window))
            .then(a.limit.total_cmp(&b.limit))
    });
    let budgets = smallest_budget_per_pool(gathered.budgets);
    gathered.unresolved.sort();
    gathered.unresolved.dedup();
    let unlimited = report::unlimited_paths(&resolver, &rules);
    Ok(EffectiveLimits {
        schema: schema.clone(),
        rules,
        budgets,
        unresolved: gathered.unresolved,
        unlimited,
    })
}

/// A narrow-only source (the overlay) may lower a budget, never raise one:
/// an overlay budget above a regular source's on the same path and window is
/// widening and refused, as a widening bound is (it would otherwise be
/// silently dropped, and the operator would believe it in force).
fn widening_budgets(g: &Gathered) -> Vec<LoadError> {
    let mut errors = Vec::new();
    for (i, narrow) in g.budgets.iter().enumerate() {
        if !g.narrow_budgets.get(i).copied().unwrap_or(false) {
            continue;
        }
        let regular = g.budgets.iter().enumerate().filter(|(j, b)| {
            !g.narrow_budgets.get(*j).copied().unwrap_or(false)
                && b.path == narrow.path
                && b.window == narrow.window
        });
        if let Some((_, wider_than)) = regular
            .filter(|(_, b)| narrow.limit > b.limit)
            .min_by(|a, b| a.1.limit.total_cmp(&b.1.limit))
        {
            errors.push(LoadError {
                path: narrow.path.to_string(),
                reason: LoadErrorKind::WideningOverlay,
                source: narrow.source.clone(),
                message: format!(
                    "budget max {} per {} is above the {} budget {}; an overlay may only lower a budget",
                    narrow.limit,
                    narrow.window.as_str(),
                    wider_than.source,
                    wider_than.limit
                ),
            });
        }
    }
    errors
}

/// Budgets on the same path and window share one pool, so only the smallest
/// applies: kept once, a draw is counted once against it (kept twice, every
/// draw would be counted once per source and the pool would empty at half).
/// `sorted` is in the order `build` sorts it; the result keeps that order.
fn smallest_budget_per_pool(sorted: Vec<BudgetRule>) -> Vec<BudgetRule> {
    let mut kept: Vec<BudgetRule> = Vec::with_capacity(sorted.len());
    for rule in sorted {
        let same_pool = kept
            .iter_mut()
            .find(|k| k.window == rule.window && k.path == rule.path);
        match same_pool {
            Some(k) if rule.limit < k.limit => *k = rule,
            Some(_) => {}
            None => kept.push(rule),
        }
    }
    kept
}

fn gather_source(resolver: &Resolver<'_>, source: &SourceRules, out: &mut Gathered) {
    if source.rules.len() > SOURCE_RULES_MAX {
        out.errors.push(LoadError {
            path: String::new(),
            reason: LoadErrorKind::InvalidRule,
            source: source.kind.to_string(),
            message: format!("more than {SOURCE_RULES_MAX} rules in one source"),
        });
        return;
    }
    for (path, rule) in &source.rules {
        gather_rule(resolver, source, path, rule, out);
    }
}

fn gather_rule(
    resolver: &Resolver<'_>,
    source: &SourceRules,
    raw_path: &str,
    rule: &Value,
    out: &mut Gathered,
) {
    let error = |reason, message: String| LoadError {
        path: raw_path.to_string(),
        reason,
        source: source.kind.to_string(),
        message,
    };
    let parsed_path = LimitPath::parse(raw_path).map_err(|e| match e {
        PathError::TooLong { .. } => error(LoadErrorKind::PathTooLong, e.to_string()),
        PathError::Invalid(_) => error(LoadErrorKind::InvalidPath, e.to_string()),
    });
    let parsed_rule = parse_rule(rule).map_err(|defects| {
        defects
            .into_iter()
            .map(|d| error(d.kind, d.message))
            .collect::<Vec<_>>()
    });
    let path = match parsed_path {
        Ok(p) => p,
        Err(e) => {
            out.errors.push(e);
            out.errors.extend(parsed_rule.err().unwrap_or_default());
            return;
        }
    };
    let field = match resolver.resolve(&path) {
        Ok(field) => Some(field),
        Err(why) if source.require_resolve => {
            out.errors.push(error(LoadErrorKind::PathUnresolved, why));
            None
        }
        Err(_) => {
            // The caller checks that such a path resolves somewhere else.
            out.unresolved.push((source.kind.clone(), path.to_string()));
            None
        }
    };
    let entry = match parsed_rule {
        Ok(entry) => entry,
        Err(errs) => {
            out.errors.extend(errs);
            return;
        }
    };
    let Some(field) = field else { return };
    let defects = validate(&field, &entry, source.narrow_only);
    if !defects.is_empty() {
        out.errors
            .extend(defects.into_iter().map(|(k, m)| error(k, m)));
        return;
    }
    admit(source, field, entry, out);
}

/// File a checked rule: a budget goes to the budget list, anything else to
/// the entry of its canonical path.
fn admit(source: &SourceRules, field: Field, entry: RuleEntry, out: &mut Gathered) {
    if let RuleEntry::Rule(spec) = &entry {
        if let (Some(window), Some(Bound::Scalar(limit))) = (spec.per, &spec.max) {
            out.budgets.push(BudgetRule {
                path: field.canonical.clone(),
                limit: *limit,
                window,
                unit: field.unit.clone(),
                source: source.kind.to_string(),
                reason: spec.reason.clone(),
            });
            out.narrow_budgets.push(source.narrow_only);
            return;
        }
    }
    let key = field.canonical.to_string();
    let slot = out.entries.entry(key).or_insert_with(|| Entry {
        field,
        contributions: Vec::new(),
    });
    slot.contributions.push(Contribution {
        source: source.kind.clone(),
        narrow_only: source.narrow_only,
        entry,
    });
}

type Defects = Vec<(LoadErrorKind, String)>;

/// Check a parsed rule against the field its path names.
fn validate(field: &Field, entry: &RuleEntry, narrow_only: bool) -> Defects {
    let spec = match entry {
        RuleEntry::OperatorRequired if narrow_only => {
            return vec![(
                LoadErrorKind::InvalidRule,
                "a narrow-only source must give a bound, not operator_required".into(),
            )]
        }
        RuleEntry::OperatorRequired => return check_operator_required(field),
        RuleEntry::Rule(spec) => spec,
    };
    let mut defects = Vec::new();
    check_kind(field, spec, &mut defects);
    check_elements(field, spec, &mut defects);
    check_unit(field, spec, &mut defects);
    defects
}

fn check_operator_required(field: &Field) -> Defects {
    match field.kind {
        Kind::Object | Kind::Array => vec![(
            LoadErrorKind::NonNumericField,
            format!("operator_required on an {} field", field.kind.as_str()),
        )],
        _ => Vec::new(),
    }
}

fn check_kind(field: &Field, spec: &RuleSpec, defects: &mut Defects) {
    let has_range = spec.min.is_some() || spec.max.is_some();
    if has_range && !field.kind.is_numeric() {
        defects.push((
            LoadErrorKind::NonNumericField,
            format!("min/max on a {} field", field.kind.as_str()),
        ));
    }
    let Some(allowed) = &spec.allowed else { return };
    let fits = |v: &Value| match field.kind {
        Kind::Number | Kind::Integer => v.is_number(),
        Kind::String => v.is_string(),
        Kind::Boolean => v.is_boolean(),
        Kind::Unknown => true,
        Kind::Object | Kind::Array => false,
    };
    if matches!(field.kind, Kind::Object | Kind::Array) {
        defects.push((
            LoadErrorKind::NonNumericField,
            format!("allowed on an {} field", field.kind.as_str()),
        ));
    } else if let Some(bad) = allowed.iter().find(|v| !fits(v)) {
        defects.push((
            LoadErrorKind::InvalidRule,
            format!(
                "allowed value {bad} does not fit a {} field",
                field.kind.as_str()
            ),
        ));
    }
}

/// Per-element bounds and names need a fixed-length array of the same length.
fn check_elements(field: &Field, spec: &RuleSpec, defects: &mut Defects) {
    let mut lists: Vec<(&str, usize)> = Vec::new();
    for (name, bound) in [("min", &spec.min), ("max", &spec.max)] {
        if let Some(Bound::PerElement(values)) = bound {
            lists.push((name, values.len()));
        }
    }
    if let Some(names) = &spec.names {
        lists.push(("names", names.len()));
    }
    for (member, len) in lists {
        match field.element_array {
            None => defects.push((
                LoadErrorKind::ElementBoundOnScalar,
                format!("per-element {member} on a scalar field"),
            )),
            Some(None) => defects.push((
                LoadErrorKind::ElementBoundOnVariableArray,
                format!("per-element {member} on an array without a fixed length"),
            )),
            Some(Some(fixed)) if fixed != len => defects.push((
                LoadErrorKind::ElementBoundLength,
                format!("{member} has {len} entries, the array has {fixed} elements"),
            )),
            Some(Some(_)) => {}
        }
    }
}

fn check_unit(field: &Field, spec: &RuleSpec, defects: &mut Defects) {
    let Some(unit) = &spec.unit else { return };
    let Some(field_unit) = &field.unit else {
        defects.push((
            LoadErrorKind::UnitMismatch,
            format!("rule unit '{unit}' on a field that declares no x-mhs-unit"),
        ));
        return;
    };
    if crate::units::same_unit(unit, field_unit) {
        return;
    }
    let sample = first_bound(spec);
    let hint = sample
        .and_then(|v| {
            crate::units::convert(v, unit, field_unit)
                .ok()
                .map(|c| (v, c))
        })
        .map(|(v, c)| {
            format!(
                "; {v} {unit} would be {} {field_unit}, write that",
                significant(c)
            )
        })
        .unwrap_or_default();
    defects.push((
        LoadErrorKind::UnitMismatch,
        format!("rule unit '{unit}' differs from the field's '{field_unit}'{hint}"),
    ));
}

fn first_bound(spec: &RuleSpec) -> Option<f64> {
    let first = |b: &Bound| match b {
        Bound::Scalar(v) => Some(*v),
        Bound::PerElement(values) => values.first().copied(),
    };
    spec.max
        .as_ref()
        .and_then(first)
        .or_else(|| spec.min.as_ref().and_then(first))
}

/// `x` rounded to 12 significant digits, written the shortest way: a
/// conversion's binary noise (193.99999999999997 for 90 degC in degF) would
/// otherwise be copied into a manifest and refuse the exact boundary.
fn significant(x: f64) -> f64 {
    format!("{x:.11e}").parse().unwrap_or(x)
}
