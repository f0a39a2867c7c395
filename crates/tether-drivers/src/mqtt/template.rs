//! JSON payload templates: constants with placeholders.
//!
//! A template is the JSON object to publish. A string member that is exactly
//! a placeholder is replaced: `"$command_id"` (the correlation value),
//! `"$lease_ms"` (the lease, an integer) and `"$input.<field>"` (an input
//! field, converted to its native unit when `input_units` names one).
//! Everything else is published as written.
//!
//! **Owns:** placeholder syntax, checking a template, rendering one.
//! **Never belongs here:** topics, I/O, deciding whether a value is allowed
//! (the kernel checked the input before the driver sees it).

use super::config::Defect;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use tether_limits::units;

/// Deepest nesting a template may have.
const DEPTH_MAX: usize = 16;

/// What a rendering fills in.
pub struct Fill<'a> {
    /// The correlation value.
    pub command_id: &'a str,
    /// The lease, ms.
    pub lease_ms: u64,
    /// The call's input (declared units).
    pub input: &'a Value,
    /// Input field → (declared unit, native unit).
    pub input_units: &'a BTreeMap<String, (String, String)>,
}

enum Slot<'a> {
    CommandId,
    LeaseMs,
    Input(&'a str),
    Unknown,
}

fn slot(s: &str) -> Option<Slot<'_>> {
    let rest = s.strip_prefix('$')?;
    Some(match rest {
        "command_id" => Slot::CommandId,
        "lease_ms" => Slot::LeaseMs,
        _ => rest
            .strip_prefix("input.")
            .map_or(Slot::Unknown, Slot::Input),
    })
}

/// Checks a template: placeholders known, input fields in the binding's
/// input schema (`fields`; empty means no `$input` is allowed), depth bound.
pub fn check(t: &Value, fields: &BTreeMap<String, ()>, at: &str, d: &mut Vec<Defect>) {
    walk_check(t, fields, at, 0, d);
}

fn walk_check(
    t: &Value,
    fields: &BTreeMap<String, ()>,
    at: &str,
    depth: usize,
    d: &mut Vec<Defect>,
) {
    if depth > DEPTH_MAX {
        d.push((
            at.to_owned(),
            format!("nested deeper than {DEPTH_MAX} levels"),
        ));
        return;
    }
    match t {
        Value::String(s) => match slot(s) {
            None | Some(Slot::CommandId | Slot::LeaseMs) => {}
            Some(Slot::Input(f)) if fields.contains_key(f) => {}
            Some(Slot::Input(f)) => d.push((
                at.to_owned(),
                format!("`$input.{f}`: the binding's input has no field `{f}`"),
            )),
            Some(Slot::Unknown) => d.push((
                at.to_owned(),
                format!(
                    "unknown placeholder `{s}` (known: $command_id, $lease_ms, $input.<field>)"
                ),
            )),
        },
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                walk_check(v, fields, &format!("{at}[{i}]"), depth + 1, d);
            }
        }
        Value::Object(m) => {
            for (k, v) in m {
                walk_check(v, fields, &format!("{at}.{k}"), depth + 1, d);
            }
        }
        _ => {}
    }
}

/// Whether a template places `$command_id` somewhere.
pub fn places_command_id(t: &Value) -> bool {
    fn walk(t: &Value, depth: usize) -> bool {
        depth <= DEPTH_MAX
            && match t {
                Value::String(s) => s == "$command_id",
                Value::Array(a) => a.iter().any(|v| walk(v, depth + 1)),
                Value::Object(m) => m.values().any(|v| walk(v, depth + 1)),
                _ => false,
            }
    }
    walk(t, 0)
}

/// Renders a template.
///
/// # Errors
/// An input field the call lacks (an optional field absent from the input
/// leaves its member out), or a conversion that fails.
pub fn render(t: &Value, fill: &Fill<'_>) -> Result<Value, String> {
    Ok(walk_render(t, fill, 0)?.unwrap_or(Value::Null))
}

fn walk_render(t: &Value, fill: &Fill<'_>, depth: usize) -> Result<Option<Value>, String> {
    if depth > DEPTH_MAX {
        return Err("template nested too deep".into());
    }
    Ok(Some(match t {
        Value::String(s) => match slot(s) {
            None => t.clone(),
            Some(Slot::CommandId) => Value::from(fill.command_id),
            Some(Slot::LeaseMs) => Value::from(fill.lease_ms),
            Some(Slot::Input(f)) => match fill.input.get(f) {
                None => return Ok(None),
                Some(v) => native(f, v, fill.input_units)?,
            },
            Some(Slot::Unknown) => return Err(format!("unknown placeholder `{s}`")),
        },
        Value::Array(a) => {
            let mut out = Vec::with_capacity(a.len());
            for v in a {
                if let Some(x) = walk_render(v, fill, depth + 1)? {
                    out.push(x);
                }
            }
            Value::Array(out)
        }
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, v) in m {
                if let Some(x) = walk_render(v, fill, depth + 1)? {
                    out.insert(k.clone(), x);
                }
            }
            Value::Object(out)
        }
        other => other.clone(),
    }))
}

/// An input value in the device's native unit.
fn native(
    field: &str,
    v: &Value,
    input_units: &BTreeMap<String, (String, String)>,
) -> Result<Value, String> {
    let Some((declared, native)) = input_units.get(field) else {
        return Ok(v.clone());
    };
    let x = v
        .as_f64()
        .ok_or_else(|| format!("input `{field}` is not a number; it has a native unit"))?;
    let y = units::convert(x, declared, native).map_err(|e| format!("input `{field}`: {e}"))?;
    serde_json::Number::from_f64(y)
        .map(Value::Number)
        .ok_or_else(|| format!("input `{field}` converts to a non-finite number"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_placeholders_and_constants() {
        let t = json!({"command_id": "$command_id", "op": "dose", "volume_ml": "$input.volume_ml", "lease_ms": "$lease_ms", "opt": "$input.absent"});
        let units = BTreeMap::new();
        let out = render(
            &t,
            &Fill {
                command_id: "01X",
                lease_ms: 1000,
                input: &json!({"volume_ml": 2.5}),
                input_units: &units,
            },
        );
        assert_eq!(
            out,
            Ok(json!({"command_id": "01X", "op": "dose", "volume_ml": 2.5, "lease_ms": 1000}))
        );
    }

    #[test]
    fn converts_inputs_to_their_native_unit() {
        let t = json!({"v": "$input.volume_ml"});
        let units = BTreeMap::from([("volume_ml".to_owned(), ("mL".to_owned(), "uL".to_owned()))]);
        let out = render(
            &t,
            &Fill {
                command_id: "x",
                lease_ms: 1,
                input: &json!({"volume_ml": 2}),
                input_units: &units,
            },
        );
        let v = out.ok().and_then(|o| o["v"].as_f64()).unwrap_or_default();
        assert!((v - 2000.0).abs() < 1e-9, "{v}");
    }

    #[test]
    fn check_names_unknown_placeholders_and_fields() {
        let mut d = Vec::new();
        let fields = BTreeMap::from([("volume_ml".to_owned(), ())]);
        check(
            &json!({"a": "$nope", "b": "$input.rate", "c": "$input.volume_ml"}),
            &fields,
            "t",
            &mut d,
        );
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(d.iter().any(|(p, _)| p == "t.a"));
        assert!(d
            .iter()
            .any(|(p, m)| p == "t.b" && m.contains("no field `rate`")));
        assert!(places_command_id(&json!({"x": ["$command_id"]})));
        assert!(!places_command_id(&json!({"x": "command_id"})));
    }
}
