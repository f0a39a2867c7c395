//! Which keys of a write patch the resource's state schema declares, and
//! which of them are read-only (OpenMHS CORE-022).
//!
//! A key is declared when a schema that applies at its place names it in
//! `properties`, matches it with a `patternProperties` pattern, or admits it
//! through an `additionalProperties` schema (or `true`). The schemas that
//! apply at a place are the schema itself and, transitively, its local
//! `$ref`, the members of `allOf`, `anyOf` and `oneOf`, and `then` and
//! `else`: a key any of them declares is known, and a key any of them marks
//! `readOnly` is not writable. Array elements follow `items` (a schema for
//! every element, or the draft-07 tuple form: one schema per position, then
//! `additionalItems`) and `prefixItems`. A read-only root, or a `$ref` that
//! does not resolve inside the schema, makes the whole write not writable.
//!
//! Bounded: patch depth, elements per array and schemas per place are capped,
//! and a patch beyond a cap is refused rather than half checked.

use serde_json::{Map, Value};

/// Deepest patch nesting walked (objects and arrays).
const DEPTH_MAX: usize = 16;
/// Schemas gathered for one place (the expansion of combinators and refs).
const SCHEMAS_PER_PLACE_MAX: usize = 64;
/// Elements of one array walked.
const ELEMENTS_MAX: usize = 1024;

/// What is wrong with a patch, field by field (dotted paths, `[i]` for
/// array elements).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct FieldReport {
    /// Keys no applicable schema declares.
    pub unknown: Vec<String>,
    /// Keys (or elements) an applicable schema marks `readOnly`.
    pub read_only: Vec<String>,
    /// The state schema itself is read-only.
    pub read_only_root: bool,
    /// A local `$ref` that resolves to nothing (or is not a string).
    pub unresolvable_ref: bool,
    /// The patch goes deeper or wider than the walk's bounds.
    pub too_deep: bool,
}

impl FieldReport {
    /// Checks `patch` (an object) against `state_schema`.
    pub(crate) fn of(state_schema: &Value, patch: &Map<String, Value>) -> FieldReport {
        let mut report = FieldReport::default();
        let mut walk = Walk {
            root: state_schema,
            report: &mut report,
        };
        let schemas = walk.expand_all(&[state_schema]);
        if schemas.iter().any(|s| is_read_only(s)) {
            walk.report.read_only_root = true;
            return report;
        }
        walk.object(&schemas, patch, "", 0);
        report
    }
}

struct Walk<'a, 'r> {
    root: &'a Value,
    report: &'r mut FieldReport,
}

impl<'a> Walk<'a, '_> {
    /// The schemas that apply at one place, given the ones named for it.
    fn expand_all(&mut self, named: &[&'a Value]) -> Vec<&'a Value> {
        let mut out = Vec::new();
        for s in named {
            self.expand(s, &mut out, 0);
        }
        out
    }

    fn expand(&mut self, schema: &'a Value, out: &mut Vec<&'a Value>, depth: usize) {
        if depth > DEPTH_MAX || out.len() >= SCHEMAS_PER_PLACE_MAX {
            self.report.too_deep = true;
            return;
        }
        if !schema.is_object() {
            return; // `true`/`false` schemas declare no keys
        }
        out.push(schema);
        match schema.get("$ref") {
            None => {}
            Some(Value::String(r)) => match resolve_local(self.root, r) {
                Some(target) => self.expand(target, out, depth + 1),
                None => self.report.unresolvable_ref = true,
            },
            Some(_) => self.report.unresolvable_ref = true,
        }
        for key in ["allOf", "anyOf", "oneOf"] {
            if let Some(Value::Array(members)) = schema.get(key) {
                for m in members {
                    self.expand(m, out, depth + 1);
                }
            }
        }
        for key in ["then", "else"] {
            if let Some(m) = schema.get(key) {
                self.expand(m, out, depth + 1);
            }
        }
    }

    fn object(
        &mut self,
        schemas: &[&'a Value],
        patch: &Map<String, Value>,
        prefix: &str,
        depth: usize,
    ) {
        if depth > DEPTH_MAX {
            self.report.too_deep = true;
            return;
        }
        for (key, value) in patch {
            let path = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            let Some(named) = key_schemas(schemas, key) else {
                self.report.unknown.push(path);
                continue;
            };
            let at = self.expand_all(&named);
            if at.iter().any(|s| is_read_only(s)) {
                self.report.read_only.push(path);
                continue;
            }
            self.value(&at, value, &path, depth + 1);
        }
    }

    fn value(&mut self, schemas: &[&'a Value], value: &Value, path: &str, depth: usize) {
        match value {
            Value::Object(inner) => self.object(schemas, inner, path, depth),
            Value::Array(items) => self.array(schemas, items, path, depth),
            _ => {}
        }
    }

    fn array(&mut self, schemas: &[&'a Value], items: &[Value], path: &str, depth: usize) {
        if depth > DEPTH_MAX || items.len() > ELEMENTS_MAX {
            self.report.too_deep = true;
            return;
        }
        for (i, item) in items.iter().enumerate() {
            let named: Vec<&'a Value> = schemas
                .iter()
                .filter_map(|s| element_schema(s, i))
                .collect();
            let at = self.expand_all(&named);
            let here = format!("{path}[{i}]");
            if at.iter().any(|s| is_read_only(s)) {
                self.report.read_only.push(here);
                continue;
            }
            self.value(&at, item, &here, depth + 1);
        }
    }
}

/// The schemas that declare `key` among `schemas`, or `None` when none does.
fn key_schemas<'a>(schemas: &[&'a Value], key: &str) -> Option<Vec<&'a Value>> {
    let mut named = Vec::new();
    let mut known = false;
    for s in schemas {
        let mut declared_here = false;
        if let Some(p) = s.get("properties").and_then(|p| p.get(key)) {
            named.push(p);
            declared_here = true;
        }
        if let Some(Value::Object(patterns)) = s.get("patternProperties") {
            for (pattern, p) in patterns {
                if pattern_matches(pattern, key) {
                    named.push(p);
                    declared_here = true;
                }
            }
        }
        if !declared_here {
            match s.get("additionalProperties") {
                Some(p @ Value::Object(_)) => {
                    named.push(p);
                    declared_here = true;
                }
                Some(Value::Bool(true)) => declared_here = true,
                _ => {}
            }
        }
        known |= declared_here;
    }
    known.then_some(named)
}

/// The schema that element `i` of an array follows under `s`, if any.
fn element_schema(s: &Value, i: usize) -> Option<&Value> {
    if let Some(Value::Array(prefix)) = s.get("prefixItems") {
        return prefix.get(i).or_else(|| s.get("items"));
    }
    match s.get("items") {
        // Draft-07 tuple form.
        Some(Value::Array(tuple)) => tuple.get(i).or_else(|| s.get("additionalItems")),
        Some(items) => Some(items),
        None => None,
    }
}

fn is_read_only(s: &Value) -> bool {
    s.get("readOnly") == Some(&Value::Bool(true))
}

/// A JSON pointer `$ref` inside the same document (`#`, `#/$defs/x`).
fn resolve_local<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    reference
        .strip_prefix('#')
        .and_then(|ptr| root.pointer(ptr))
}

/// Whether a `patternProperties` pattern (ECMA 262, unanchored) matches.
/// A pattern that does not compile matches every key, so a read-only
/// declaration behind it is never missed (the loader refuses such schemas).
fn pattern_matches(pattern: &str, key: &str) -> bool {
    match fancy_regex::Regex::new(pattern) {
        Ok(re) => re.is_match(key).unwrap_or(true),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn report(schema: Value, patch: Value) -> FieldReport {
        FieldReport::of(&schema, patch.as_object().expect("object"))
    }

    fn schema() -> Value {
        json!({"type": "object", "properties": {
            "setpoint": {"type": "number"},
            "cfg": {"allOf": [
                {"type": "object", "properties": {"a": {"type": "number"}}},
                {"properties": {"b": {"type": "number", "readOnly": true}}}]},
            "alt": {"anyOf": [
                {"type": "object", "properties": {"p": {"type": "number"}}},
                {"type": "object", "properties": {"q": {"readOnly": true}}}]},
            "one": {"oneOf": [{"properties": {"s": {"readOnly": true}}}]},
            "cond": {"type": "object", "properties": {"k": {"type": "number"}},
                     "if": {"properties": {"k": {"const": 1}}},
                     "then": {"properties": {"t": {"readOnly": true}}},
                     "else": {"properties": {"e": {"type": "number"}}}},
            "pp": {"type": "object", "patternProperties": {"^ch[0-9]$": {"readOnly": true}, "^w[0-9]$": {"type": "number"}}},
            "tup": {"type": "array", "items": [{"type": "number"},
                     {"type": "object", "properties": {"z": {"readOnly": true}, "y": {"type": "number"}}}]},
            "pre": {"type": "array", "prefixItems": [{"readOnly": true}], "items": {"type": "object", "properties": {"m": {"type": "number"}}}},
            "ref": {"$ref": "#/$defs/limited"},
            "bad": {"$ref": "#/$defs/missing"},
            "open": {"type": "object", "additionalProperties": {"type": "object", "properties": {"r": {"readOnly": true}}}}
        }, "$defs": {"limited": {"type": "object", "properties": {"g": {"type": "number"}, "h": {"readOnly": true}}}}})
    }

    #[test]
    fn declared_writable_keys_pass_through_every_combinator() {
        let r = report(
            schema(),
            json!({"setpoint": 1, "cfg": {"a": 1}, "alt": {"p": 1}, "cond": {"k": 2, "e": 1},
                   "pp": {"w1": 1}, "tup": [1, {"y": 2}], "ref": {"g": 1},
                   "open": {"any": {}}}),
        );
        assert_eq!(r, FieldReport::default());
    }

    #[test]
    fn read_only_keys_are_found_at_any_depth() {
        for (patch, path) in [
            (json!({"cfg": {"b": 1}}), "cfg.b"),
            (json!({"alt": {"q": 1}}), "alt.q"),
            (json!({"one": {"s": 1}}), "one.s"),
            (json!({"cond": {"k": 1, "t": 1}}), "cond.t"),
            (json!({"pp": {"ch1": 1}}), "pp.ch1"),
            (json!({"tup": [1, {"z": 1}]}), "tup[1].z"),
            (json!({"pre": [5]}), "pre[0]"),
            (json!({"ref": {"h": 1}}), "ref.h"),
            (json!({"open": {"x": {"r": 1}}}), "open.x.r"),
        ] {
            let r = report(schema(), patch.clone());
            assert_eq!(r.read_only, vec![path.to_owned()], "{patch}");
            assert!(r.unknown.is_empty(), "{patch}: {r:?}");
        }
    }

    #[test]
    fn unknown_keys_are_found_at_any_depth() {
        for (patch, path) in [
            (json!({"nosuch": 1}), "nosuch"),
            (json!({"cfg": {"nosuch": 1}}), "cfg.nosuch"),
            (json!({"pp": {"nosuch": 1}}), "pp.nosuch"),
            (json!({"tup": [1, {"nosuch": 1}]}), "tup[1].nosuch"),
            (json!({"ref": {"nosuch": 1}}), "ref.nosuch"),
        ] {
            let r = report(schema(), patch.clone());
            assert_eq!(r.unknown, vec![path.to_owned()], "{patch}");
        }
    }

    #[test]
    fn a_read_only_root_or_a_dangling_ref_refuses_the_write() {
        let r = report(
            json!({"type": "object", "readOnly": true, "properties": {"a": {}}}),
            json!({"a": 1}),
        );
        assert!(r.read_only_root);
        let r = report(schema(), json!({"bad": {"x": 1}}));
        assert!(r.unresolvable_ref, "{r:?}");
    }

    #[test]
    fn a_patch_deeper_than_the_bound_is_refused() {
        let mut deep = json!(1);
        let mut schema = json!({"type": "number"});
        for _ in 0..(DEPTH_MAX + 2) {
            deep = json!({"n": deep});
            schema = json!({"type": "object", "properties": {"n": schema}});
        }
        let r = report(schema, deep);
        assert!(r.too_deep, "{r:?}");
    }
}
