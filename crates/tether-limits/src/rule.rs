//! One source's rule for one path, parsed from the closed rule object.
//!
//! The rule object is closed on purpose: a misspelt member (`maxx`) or the
//! legacy `limit` would otherwise be ignored and silently remove a bound. This
//! module checks only what the rule says about itself; whether it fits the
//! field it names is checked against the schema by the builder.

use serde_json::{Map, Value};

use crate::budget::Window;
use crate::error::LoadErrorKind;

/// Largest magnitude a bound may have: ±(2^53−1), the range in which every
/// integer is exact in an f64, so a bound never changes value when compared.
pub const BOUND_ABS_MAX: f64 = 9_007_199_254_740_991.0;

/// The literal that defers a bound to the operator overlay.
pub const OPERATOR_REQUIRED: &str = "operator_required";

/// Members a rule object may have; anything else is a load error.
pub const RULE_MEMBERS: &[&str] = &[
    "min", "max", "allowed", "unit", "reason", "source", "ref", "names", "per",
];

/// Longest `allowed` list and `names` list accepted; keeps intersection cheap.
pub const LIST_LEN_MAX: usize = 4096;

/// A `min` or `max` value.
#[derive(Debug, Clone, PartialEq)]
pub enum Bound {
    /// One number for the field, or for every element of a numeric array.
    Scalar(f64),
    /// One number per element of a fixed-length array.
    PerElement(Vec<f64>),
}

/// Where a rule's value comes from (the rule's `source` member).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Origin {
    /// A vendor document; requires `ref`.
    VendorDoc,
    /// Upstream source code; requires `ref`.
    UpstreamCode,
    /// The capability class default.
    ClassDefault,
    /// An operator's decision.
    Operator,
}

impl Origin {
    /// Parse the wire spelling.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "vendor_doc" => Some(Origin::VendorDoc),
            "upstream_code" => Some(Origin::UpstreamCode),
            "class_default" => Some(Origin::ClassDefault),
            "operator" => Some(Origin::Operator),
            _ => None,
        }
    }

    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::VendorDoc => "vendor_doc",
            Origin::UpstreamCode => "upstream_code",
            Origin::ClassDefault => "class_default",
            Origin::Operator => "operator",
        }
    }

    fn requires_ref(self) -> bool {
        matches!(self, Origin::VendorDoc | Origin::UpstreamCode)
    }
}

/// A parsed rule object.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RuleSpec {
    /// Lower bound.
    pub min: Option<Bound>,
    /// Upper bound, or the budget when `per` is set.
    pub max: Option<Bound>,
    /// The allowed values.
    pub allowed: Option<Vec<Value>>,
    /// The unit the bounds are written in; must be the field's unit.
    pub unit: Option<String>,
    /// Why the bound exists.
    pub reason: Option<String>,
    /// Where the value comes from.
    pub origin: Option<Origin>,
    /// The document or code the value was taken from.
    pub reference: Option<String>,
    /// Labels of the array elements.
    pub names: Option<Vec<String>>,
    /// Budget window; turns `max` into a cumulative budget.
    pub per: Option<Window>,
}

/// What a source says about a path.
#[derive(Debug, Clone, PartialEq)]
pub enum RuleEntry {
    /// `"operator_required"`: the operator overlay must supply the bound.
    OperatorRequired,
    /// A rule object.
    Rule(RuleSpec),
}

/// One defect of a rule object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleDefect {
    /// What kind of defect.
    pub kind: LoadErrorKind,
    /// Human explanation.
    pub message: String,
}

fn defect(kind: LoadErrorKind, message: impl Into<String>) -> RuleDefect {
    RuleDefect {
        kind,
        message: message.into(),
    }
}

/// Parse a rule value: the literal `"operator_required"` or a closed object.
///
/// # Errors
/// Every defect found, not only the first, so an author fixes them in one go.
pub fn parse_rule(value: &Value) -> Result<RuleEntry, Vec<RuleDefect>> {
    match value {
        Value::String(s) if s == OPERATOR_REQUIRED => Ok(RuleEntry::OperatorRequired),
        Value::Object(map) => parse_object(map).map(RuleEntry::Rule),
        _ => Err(vec![defect(
            LoadErrorKind::InvalidRule,
            "a rule is an object or the string \"operator_required\"",
        )]),
    }
}

fn parse_object(map: &Map<String, Value>) -> Result<RuleSpec, Vec<RuleDefect>> {
    let mut defects = Vec::new();
    for key in map.keys() {
        if !RULE_MEMBERS.contains(&key.as_str()) {
            defects.push(defect(
                LoadErrorKind::UnknownMember,
                format!(
                    "unknown rule member '{key}' (allowed: {})",
                    RULE_MEMBERS.join(", ")
                ),
            ));
        }
    }
    let mut spec = RuleSpec {
        min: take(map, "min", &mut defects, parse_bound),
        max: take(map, "max", &mut defects, parse_bound),
        allowed: take(map, "allowed", &mut defects, parse_allowed),
        unit: take(map, "unit", &mut defects, parse_string),
        reason: take(map, "reason", &mut defects, parse_string),
        origin: take(map, "source", &mut defects, parse_origin),
        reference: take(map, "ref", &mut defects, parse_string),
        names: take(map, "names", &mut defects, parse_names),
        per: take(map, "per", &mut defects, parse_window),
    };
    check_consistency(&mut spec, &mut defects);
    if defects.is_empty() {
        Ok(spec)
    } else {
        Err(defects)
    }
}

/// Parse member `key` with `parse` when present, recording its defect.
fn take<T>(
    map: &Map<String, Value>,
    key: &str,
    defects: &mut Vec<RuleDefect>,
    parse: fn(&str, &Value) -> Result<T, RuleDefect>,
) -> Option<T> {
    let value = map.get(key)?;
    match parse(key, value) {
        Ok(v) => Some(v),
        Err(d) => {
            defects.push(d);
            None
        }
    }
}

/// Whether `text` is a source reference of the form `path/in/clone:LINE`
/// (a non-empty path without spaces, a colon, a line number from 1).
pub fn is_source_ref(text: &str) -> bool {
    let Some((path, line)) = text.rsplit_once(':') else {
        return false;
    };
    !path.is_empty()
        && !path.chars().any(char::is_whitespace)
        && !line.is_empty()
        && line.len() <= 9
        && line.bytes().all(|b| b.is_ascii_digit())
        && line.parse::<u32>().is_ok_and(|n| n >= 1)
}

fn check_consistency(spec: &mut RuleSpec, defects: &mut Vec<RuleDefect>) {
    if let Some(origin) = spec.origin {
        if origin.requires_ref() && spec.reference.is_none() {
            defects.push(defect(
                LoadErrorKind::MissingRef,
                format!("source {} requires a ref", origin.as_str()),
            ));
        }
    }
    let cited = spec.origin.is_some_and(Origin::requires_ref);
    if let Some(r) = spec.reference.as_ref().filter(|_| cited) {
        if !is_source_ref(r) {
            defects.push(defect(
                LoadErrorKind::MissingRef,
                format!("ref `{r}` must have the form path/in/clone:LINE"),
            ));
        }
    }
    let bounds_nothing = spec.min.is_none() && spec.max.is_none() && spec.allowed.is_none();
    if bounds_nothing && defects.is_empty() {
        defects.push(defect(
            LoadErrorKind::InvalidRule,
            "the rule sets no min, max or allowed",
        ));
    }
    if spec.per.is_some() {
        check_budget_shape(spec, defects);
    }
}

/// A budget is one scalar `max` and nothing else that bounds a single call:
/// mixing both in one rule would make it unclear which one a refusal means.
fn check_budget_shape(spec: &RuleSpec, defects: &mut Vec<RuleDefect>) {
    if !matches!(spec.max, Some(Bound::Scalar(m)) if m >= 0.0) {
        defects.push(defect(
            LoadErrorKind::InvalidRule,
            "a budget (per) needs a non-negative scalar max",
        ));
    }
    if spec.min.is_some() || spec.allowed.is_some() || spec.names.is_some() {
        defects.push(defect(
            LoadErrorKind::InvalidRule,
            "a budget (per) takes only max; declare min/allowed/names in a separate rule",
        ));
    }
}

fn parse_number(key: &str, value: &Value) -> Result<f64, RuleDefect> {
    let n = value
        .as_f64()
        .filter(|_| value.is_number())
        .ok_or_else(|| {
            defect(
                LoadErrorKind::InvalidRule,
                format!("{key} must be a number or an array of numbers"),
            )
        })?;
    if !n.is_finite() || n.abs() > BOUND_ABS_MAX {
        return Err(defect(
            LoadErrorKind::IntegerOutOfRange,
            format!("{key} {value} is beyond ±(2^53−1)"),
        ));
    }
    Ok(n)
}

fn parse_bound(key: &str, value: &Value) -> Result<Bound, RuleDefect> {
    match value {
        Value::Array(items) => {
            if items.is_empty() || items.len() > LIST_LEN_MAX {
                return Err(defect(
                    LoadErrorKind::InvalidRule,
                    format!("{key} array must have 1 to {LIST_LEN_MAX} numbers"),
                ));
            }
            let nums = items
                .iter()
                .map(|v| parse_number(key, v))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Bound::PerElement(nums))
        }
        _ => parse_number(key, value).map(Bound::Scalar),
    }
}

fn parse_allowed(key: &str, value: &Value) -> Result<Vec<Value>, RuleDefect> {
    let items = value
        .as_array()
        .filter(|a| a.len() <= LIST_LEN_MAX)
        .ok_or_else(|| {
            defect(
                LoadErrorKind::InvalidRule,
                format!("{key} must be an array of at most {LIST_LEN_MAX} values"),
            )
        })?;
    for item in items {
        match item {
            Value::Number(_) => {
                parse_number(key, item)?;
            }
            Value::String(_) | Value::Bool(_) => {}
            _ => {
                return Err(defect(
                    LoadErrorKind::InvalidRule,
                    format!("{key} holds numbers, strings or booleans, not {item}"),
                ))
            }
        }
    }
    Ok(items.clone())
}

fn parse_string(key: &str, value: &Value) -> Result<String, RuleDefect> {
    match value.as_str() {
        Some(s) if !s.is_empty() => Ok(s.to_string()),
        _ => Err(defect(
            LoadErrorKind::InvalidRule,
            format!("{key} must be a non-empty string"),
        )),
    }
}

fn parse_origin(key: &str, value: &Value) -> Result<Origin, RuleDefect> {
    value.as_str().and_then(Origin::parse).ok_or_else(|| {
        defect(
            LoadErrorKind::InvalidRule,
            format!("{key} must be vendor_doc, upstream_code, class_default or operator"),
        )
    })
}

fn parse_names(key: &str, value: &Value) -> Result<Vec<String>, RuleDefect> {
    let bad = || {
        defect(
            LoadErrorKind::InvalidRule,
            format!("{key} must be a non-empty array of strings"),
        )
    };
    let items = value
        .as_array()
        .filter(|a| !a.is_empty() && a.len() <= LIST_LEN_MAX)
        .ok_or_else(bad)?;
    items
        .iter()
        .map(|v| v.as_str().map(str::to_string).ok_or_else(bad))
        .collect()
}

fn parse_window(key: &str, value: &Value) -> Result<Window, RuleDefect> {
    let text = value.as_str().ok_or_else(|| {
        defect(
            LoadErrorKind::InvalidRule,
            format!("{key} must be a string"),
        )
    })?;
    Window::parse(text).ok_or_else(|| {
        defect(
            LoadErrorKind::UnknownWindow,
            format!("unknown window '{text}' (session, rolling_1h, rolling_24h, rolling_7d)"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kinds(value: Value) -> Vec<LoadErrorKind> {
        match parse_rule(&value) {
            Ok(_) => vec![],
            Err(d) => d.into_iter().map(|d| d.kind).collect(),
        }
    }

    #[test]
    fn typo_and_legacy_members_are_refused() {
        assert_eq!(
            kinds(json!({"maxx": 1})),
            vec![LoadErrorKind::UnknownMember]
        );
        assert!(kinds(json!({"max": 1, "limit": 2})).contains(&LoadErrorKind::UnknownMember));
    }

    #[test]
    fn operator_required_literal_defers_the_bound() {
        assert_eq!(
            parse_rule(&json!("operator_required")),
            Ok(RuleEntry::OperatorRequired)
        );
        assert_eq!(
            kinds(json!("operator-required")),
            vec![LoadErrorKind::InvalidRule]
        );
    }

    #[test]
    fn budget_rules_take_only_a_scalar_max() {
        assert!(kinds(json!({"max": 10, "per": "session"})).is_empty());
        assert_eq!(
            kinds(json!({"max": 10, "per": "daily"})),
            vec![LoadErrorKind::UnknownWindow]
        );
        assert_eq!(
            kinds(json!({"max": 10, "min": 0, "per": "session"})),
            vec![LoadErrorKind::InvalidRule]
        );
    }

    #[test]
    fn bound_members_have_strict_types() {
        assert_eq!(kinds(json!({"max": "5"})), vec![LoadErrorKind::InvalidRule]);
        assert_eq!(
            kinds(json!({"max": [1, "x"]})),
            vec![LoadErrorKind::InvalidRule]
        );
        assert_eq!(
            kinds(json!({"allowed": [null]})),
            vec![LoadErrorKind::InvalidRule]
        );
        assert_eq!(
            kinds(json!({"reason": "x"})),
            vec![LoadErrorKind::InvalidRule]
        );
    }
}
