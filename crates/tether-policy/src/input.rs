//! The `context.input` type: derived from the served input schemas of every
//! binding, and the conversion of a command's input into Cedar values.
//!
//! Cedar needs one context type per action, but inputs differ per binding, so
//! the input type is the union of every binding's fields, each optional
//! (policies test `context.input has x` first, as Cedar's validator demands).
//! Numbers become Cedar `decimal`s (four fractional digits); arrays become
//! sets (Cedar has no lists: order and duplicates are lost, so a policy can
//! ask `contains` but not "element 3"). A field whose type differs between two
//! bindings is left out of the union, so no policy can mistype it.

use cedar_policy::RestrictedExpression;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Largest magnitude a Cedar decimal holds (i64 with four fractional digits).
const DECIMAL_ABS_MAX: f64 = 922_337_203_685_477.0;
/// Deepest nesting followed in schemas and inputs.
const DEPTH_MAX: usize = 16;

/// A Cedar type for part of the input.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CType {
    Decimal,
    Str,
    Bool,
    Set(Box<CType>),
    Record(BTreeMap<String, CType>),
}

/// The Cedar type of a JSON Schema, if it has one.
pub(crate) fn from_schema(schema: &Value, depth: usize) -> Option<CType> {
    if depth > DEPTH_MAX {
        return None;
    }
    match schema.get("type").and_then(Value::as_str)? {
        "number" | "integer" => Some(CType::Decimal),
        "string" => Some(CType::Str),
        "boolean" => Some(CType::Bool),
        "array" => {
            let items = schema.get("items").filter(|i| i.is_object())?;
            from_schema(items, depth + 1).map(|t| CType::Set(Box::new(t)))
        }
        "object" => {
            let mut fields = BTreeMap::new();
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (name, prop) in props {
                    if let Some(t) = from_schema(prop, depth + 1) {
                        fields.insert(name.clone(), t);
                    }
                }
            }
            Some(CType::Record(fields))
        }
        _ => None,
    }
}

/// Union of two record types; fields whose types conflict are dropped.
pub(crate) fn union(a: &mut BTreeMap<String, CType>, b: &BTreeMap<String, CType>) {
    let mut conflicts = Vec::new();
    for (name, tb) in b {
        match a.get_mut(name) {
            None => {
                a.insert(name.clone(), tb.clone());
            }
            Some(ta) => {
                if !merge(ta, tb) {
                    conflicts.push(name.clone());
                }
            }
        }
    }
    for name in conflicts {
        a.remove(&name);
    }
}

fn merge(a: &mut CType, b: &CType) -> bool {
    match (a, b) {
        (CType::Record(fa), CType::Record(fb)) => {
            union(fa, fb);
            true
        }
        (CType::Set(ea), CType::Set(eb)) => merge(ea, eb),
        (x, y) => x == y,
    }
}

/// The type in Cedar schema syntax.
pub(crate) fn schema_text(t: &CType) -> String {
    match t {
        CType::Decimal => "decimal".into(),
        CType::Str => "String".into(),
        CType::Bool => "Bool".into(),
        CType::Set(e) => format!("Set<{}>", schema_text(e)),
        CType::Record(fields) => {
            let mut s = String::from("{");
            for (i, (name, ft)) in fields.iter().enumerate() {
                if i > 0 {
                    s.push_str(", ");
                }
                let _ = write!(s, "{}?: {}", quoted(name), schema_text(ft));
            }
            s.push('}');
            s
        }
    }
}

/// A Cedar string literal.
pub(crate) fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Converts an input value to a Cedar value of type `t`. Parts the type does
/// not know are left out (`Ok(None)`); a number Cedar cannot hold is an
/// error, so the decision fails closed.
pub(crate) fn convert(
    v: &Value,
    t: &CType,
    depth: usize,
) -> Result<Option<RestrictedExpression>, String> {
    if depth > DEPTH_MAX {
        return Err("input nested too deeply for the policy".into());
    }
    match (t, v) {
        (CType::Decimal, Value::Number(n)) => {
            let x = n.as_f64().ok_or("number not representable")?;
            decimal(x).map(|s| Some(RestrictedExpression::new_decimal(s)))
        }
        (CType::Str, Value::String(s)) => Ok(Some(RestrictedExpression::new_string(s.clone()))),
        (CType::Bool, Value::Bool(b)) => Ok(Some(RestrictedExpression::new_bool(*b))),
        (CType::Set(e), Value::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                match convert(item, e, depth + 1)? {
                    Some(x) => out.push(x),
                    // A set with a hole would misstate the input: leave it out.
                    None => return Ok(None),
                }
            }
            Ok(Some(RestrictedExpression::new_set(out)))
        }
        (CType::Record(fields), Value::Object(map)) => {
            let mut out = Vec::with_capacity(fields.len());
            for (name, ft) in fields {
                if let Some(fv) = map.get(name) {
                    if let Some(x) = convert(fv, ft, depth + 1)? {
                        out.push((name.clone(), x));
                    }
                }
            }
            RestrictedExpression::new_record(out)
                .map(Some)
                .map_err(|e| e.to_string())
        }
        _ => Ok(None),
    }
}

/// A Cedar decimal literal for `x`, rounded to four fractional digits.
pub(crate) fn decimal(x: f64) -> Result<String, String> {
    if !x.is_finite() {
        return Err(format!("{x} is not a finite number"));
    }
    if x.abs() >= DECIMAL_ABS_MAX {
        return Err(format!("{x} is outside the range of a Cedar decimal"));
    }
    Ok(format!("{x:.4}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn schema_types_map_to_cedar() {
        let s = json!({"type": "object", "properties": {
            "t": {"type": "number"}, "n": {"type": "integer"}, "on": {"type": "boolean"},
            "joints": {"type": "array", "items": {"type": "number"}},
            "odd": {"type": ["number", "null"]}}});
        let t = from_schema(&s, 0).expect("type");
        assert_eq!(
            schema_text(&t),
            "{\"joints\"?: Set<decimal>, \"n\"?: decimal, \"on\"?: Bool, \"t\"?: decimal}"
        );
    }

    #[test]
    fn conflicting_fields_leave_the_union() {
        let mut a = match from_schema(
            &json!({"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "string"}}}),
            0,
        ) {
            Some(CType::Record(f)) => f,
            other => panic!("{other:?}"),
        };
        let b = match from_schema(
            &json!({"type": "object", "properties": {"x": {"type": "string"}, "z": {"type": "boolean"}}}),
            0,
        ) {
            Some(CType::Record(f)) => f,
            other => panic!("{other:?}"),
        };
        union(&mut a, &b);
        assert_eq!(a.keys().cloned().collect::<Vec<_>>(), vec!["y", "z"]);
    }

    #[test]
    fn decimals_are_refused_outside_cedar_range() {
        assert_eq!(decimal(60.0).as_deref(), Ok("60.0000"));
        assert_eq!(decimal(-0.5).as_deref(), Ok("-0.5000"));
        assert!(decimal(1e18).is_err());
        assert!(decimal(f64::NAN).is_err());
    }

    #[test]
    fn names_are_quoted_safely() {
        assert_eq!(quoted("a\"b\\c"), "\"a\\\"b\\\\c\"");
    }
}
