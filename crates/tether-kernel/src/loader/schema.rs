//! The schema algebra of loading: the writable (configure) schema of a
//! resource, a binding schema merged over its class schema, and the
//! loosenings that make such a merge a defect (a binding may only narrow its
//! class, OpenMHS CORE-023).
//!
//! Every walk is bounded by [`SCHEMA_DEPTH_MAX`]; past it a walk keeps what it
//! cannot look into as written (the class schema is validated separately) or,
//! where a check could not finish, reports that as a loosening.
//!
//! **Never belongs here:** defects with a file and field (-> the callers),
//! limits (-> `tether-limits`), validating a value against a schema (->
//! `crate::kernel::compile`).

use serde_json::{json, Map, Value};
use std::collections::BTreeSet;

/// Deepest schema nesting a loader walk descends (the unit check reports a
/// deeper state or input schema, so no schema that loads is cut short).
pub(super) const SCHEMA_DEPTH_MAX: usize = 32;

/// The configure input schema: the non-readOnly properties of the state
/// schema, closed, nothing required (a write is a patch).
pub fn writable_schema(state_schema: &Value) -> Value {
    let mut props = Map::new();
    let read_only = |v: &Value| v.get("readOnly") == Some(&Value::Bool(true));
    if let Some(Value::Object(p)) = state_schema.get("properties") {
        for (k, v) in p {
            if !read_only(v) && !read_only(state_schema) {
                props.insert(k.clone(), without_read_only(v, 0));
            }
        }
    }
    let mut out = Map::new();
    out.insert("type".into(), json!("object"));
    out.insert("additionalProperties".into(), Value::Bool(false));
    out.insert("properties".into(), Value::Object(props));
    for key in ["$defs", "definitions"] {
        if let Some(Value::Object(defs)) = state_schema.get(key) {
            out.insert(
                key.into(),
                Value::Object(
                    defs.iter()
                        .map(|(name, d)| (name.clone(), without_read_only(d, 0)))
                        .collect(),
                ),
            );
        }
    }
    Value::Object(out)
}

/// A schema with every `readOnly` member left out, at any depth (nested
/// `properties` and `patternProperties`, combinators, conditionals and array
/// items): what a client is shown it may write. The kernel refuses a write of
/// a read-only field whatever this shows (see `fields`). Past
/// [`SCHEMA_DEPTH_MAX`] a schema is shown as written.
fn without_read_only(schema: &Value, depth: usize) -> Value {
    let Value::Object(obj) = schema else {
        return schema.clone();
    };
    if depth > SCHEMA_DEPTH_MAX {
        return schema.clone();
    }
    let read_only = |v: &Value| v.get("readOnly") == Some(&Value::Bool(true));
    let mut out = Map::new();
    for (k, v) in obj {
        let kept = match (k.as_str(), v) {
            ("properties" | "patternProperties", Value::Object(members)) => Value::Object(
                members
                    .iter()
                    .filter(|(_, m)| !read_only(m))
                    .map(|(n, m)| (n.clone(), without_read_only(m, depth + 1)))
                    .collect(),
            ),
            ("allOf" | "anyOf" | "oneOf" | "prefixItems" | "items", Value::Array(list)) => {
                Value::Array(
                    list.iter()
                        .map(|m| without_read_only(m, depth + 1))
                        .collect(),
                )
            }
            ("then" | "else" | "items" | "additionalProperties" | "additionalItems", m) => {
                without_read_only(m, depth + 1)
            }
            _ => v.clone(),
        };
        out.insert(k.clone(), kept);
    }
    Value::Object(out)
}

/// Where a binding schema would admit what its class schema refuses: a
/// member a closed class object does not declare, or a closed object opened
/// (`additionalProperties`). The class schema is validated as well, so such
/// a binding would publish a schema whose inputs are then refused; a binding
/// may only narrow its class (OpenMHS CORE-023: binding ∩ class).
///
/// The walk follows the properties both schemas declare, so the class (a
/// catalogue schema) bounds it; a class nested past [`SCHEMA_DEPTH_MAX`]
/// could not be checked and is reported rather than passed.
pub(super) fn loosenings(class: &Value, binding: &Value, at: &str) -> Vec<String> {
    let mut out = Vec::new();
    loosenings_within(class, binding, at, 0, &mut out);
    out
}

fn loosenings_within(
    class: &Value,
    binding: &Value,
    at: &str,
    depth: usize,
    out: &mut Vec<String>,
) {
    if depth > SCHEMA_DEPTH_MAX {
        out.push(format!(
            "{}: the class nests deeper than {SCHEMA_DEPTH_MAX} levels here, so the binding cannot be checked to narrow it",
            at
        ));
        return;
    }
    let closed = class.get("additionalProperties") == Some(&Value::Bool(false));
    if closed {
        match binding.get("additionalProperties") {
            None | Some(Value::Bool(false)) => {}
            Some(_) => out.push(format!(
                "{}additionalProperties: the class closes this object; a binding may not open it",
                prefix(at)
            )),
        }
    }
    let (Some(Value::Object(cp)), Some(Value::Object(bp))) =
        (class.get("properties"), binding.get("properties"))
    else {
        if closed {
            if let Some(Value::Object(bp)) = binding.get("properties") {
                for name in bp.keys() {
                    out.push(undeclared(at, name));
                }
            }
        }
        return;
    };
    for (name, b) in bp {
        match cp.get(name) {
            Some(c) => {
                loosenings_within(c, b, &format!("{}{name}", prefix(at)), depth + 1, out);
            }
            None if closed => out.push(undeclared(at, name)),
            None => {}
        }
    }
}

fn prefix(at: &str) -> String {
    if at.is_empty() {
        String::new()
    } else {
        format!("{at}.")
    }
}

fn undeclared(at: &str, name: &str) -> String {
    format!(
        "{}{name}: the class does not accept this member; a binding may only narrow its class",
        prefix(at)
    )
}

/// Merges a binding schema over a class schema: `properties` merge per
/// property (recursively), `required` is the union, any other keyword of the
/// binding replaces the class's. The class schema is still validated
/// separately, so a merge can never widen what the class allows.
///
/// The merge descends only where the class has the member too, so the class
/// bounds it; past [`SCHEMA_DEPTH_MAX`] the binding's schema is kept as
/// written (still under the separately validated class).
pub fn merge_schema(class: &Value, binding: &Value) -> Value {
    merge_within(class, binding, 0)
}

fn merge_within(class: &Value, binding: &Value, depth: usize) -> Value {
    match (class, binding) {
        (Value::Object(c), Value::Object(b)) if depth <= SCHEMA_DEPTH_MAX => {
            let mut out = c.clone();
            for (k, bv) in b {
                let merged = match (k.as_str(), out.get(k)) {
                    ("properties", Some(Value::Object(cp))) => merge_properties(cp, bv, depth),
                    ("required", Some(Value::Array(cr))) => {
                        let mut set: BTreeSet<String> = cr
                            .iter()
                            .filter_map(|v| v.as_str().map(str::to_owned))
                            .collect();
                        if let Value::Array(br) = bv {
                            set.extend(br.iter().filter_map(|v| v.as_str().map(str::to_owned)));
                        }
                        json!(set)
                    }
                    ("items", Some(ci)) => merge_within(ci, bv, depth + 1),
                    _ => bv.clone(),
                };
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (_, b) => b.clone(),
    }
}

/// The class's `properties` with each of the binding's merged over it.
fn merge_properties(
    class_props: &Map<String, Value>,
    binding_props: &Value,
    depth: usize,
) -> Value {
    let mut props = class_props.clone();
    if let Value::Object(bp) = binding_props {
        for (pk, pv) in bp {
            let m = props
                .get(pk)
                .map_or_else(|| pv.clone(), |cv| merge_within(cv, pv, depth + 1));
            props.insert(pk.clone(), m);
        }
    }
    Value::Object(props)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth(v: &Value) -> usize {
        match v {
            Value::Object(m) => 1 + m.values().map(depth).max().unwrap_or(0),
            Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
            _ => 0,
        }
    }

    /// The bounds of `loosenings` and `merge_schema` never cut a catalogue
    /// class short: every class schema is shallower than the walk may go.
    #[test]
    fn catalogue_schemas_fit_the_walk_bound() {
        for c in tether_core::catalogue::catalogue() {
            assert!(depth(&c.input_schema) <= SCHEMA_DEPTH_MAX, "{}", c.id);
        }
    }

    #[test]
    fn merge_and_loosenings_stop_at_the_bound() {
        let mut deep = json!({"type": "object", "additionalProperties": false});
        for _ in 0..(SCHEMA_DEPTH_MAX + 4) {
            deep =
                json!({"type": "object", "additionalProperties": false, "properties": {"x": deep}});
        }
        assert_eq!(merge_schema(&deep, &deep), deep);
        let found = loosenings(&deep, &deep, "");
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("deeper than"), "{found:?}");
    }
}
