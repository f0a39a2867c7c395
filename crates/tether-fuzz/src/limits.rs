//! Limit paths and the limits engine (`tether_limits::build`,
//! `EffectiveLimits::check`) on generated schemas, sources and inputs.
//!
//! An input is one JSON document: `{"schema": …, "sources": [{"kind":
//! "class" | "binding" | "envelope" | "envelope:<pattern>" | "overlay",
//! "rules": {"<path>": <rule>, …}}, …], "input": …}`.
//!
//! Invariants:
//! - a limit path that parses writes back (`Display`) as text that parses to
//!   the same path, and writing that again gives the same text;
//! - `build` and `check` are functions of their arguments (twice, the same);
//! - an input `check` accepts holds every number a bounded rule addresses
//!   within that rule's effective `min` and `max` (a rule with one bound for
//!   every element, judged on the numbers present in the input).

use serde_json::Value;
use tether_limits::path::{Index, LimitPath};
use tether_limits::{build, SourceKind, SourceRules};

/// Sources read from one input, at most.
const SOURCES_MAX: usize = 8;

/// Runs the target on one input.
pub fn run(data: &[u8]) {
    let Ok(doc) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let schema = doc.get("schema").cloned().unwrap_or(Value::Null);
    let sources = sources(&doc);
    for s in &sources {
        for (path, _) in &s.rules {
            round_trip(path);
        }
    }
    let built = build(&schema, &sources);
    let again = build(&schema, &sources);
    assert_eq!(built, again, "build is not a function of its arguments");
    let Ok(limits) = built else {
        return;
    };
    let input = doc.get("input").cloned().unwrap_or(Value::Null);
    let verdict = limits.check(&input);
    assert_eq!(
        format!("{verdict:?}"),
        format!("{:?}", limits.check(&input)),
        "check is not a function of its arguments"
    );
    let _ = limits.unset_paths(&input);
    let _ = limits.to_json();
    if verdict.is_err() {
        return;
    }
    for rule in limits.rules() {
        let (max, min) = (rule.max_values(), rule.min_values());
        let one = |b: &Option<Vec<f64>>| b.as_ref().and_then(|v| (v.len() == 1).then(|| v[0]));
        let (max, min) = (one(&max), one(&min));
        if max.is_none() && min.is_none() {
            continue;
        }
        let mut found = Vec::new();
        numbers_at(&input, rule.path().segments(), &mut found);
        for x in found {
            assert!(
                max.is_none_or(|m| x <= m) && min.is_none_or(|m| x >= m),
                "check accepted {x} at {} outside [{min:?}, {max:?}]",
                rule.path()
            );
        }
    }
}

/// The sources of the document; unknown kinds are skipped.
fn sources(doc: &Value) -> Vec<SourceRules> {
    let Some(list) = doc.get("sources").and_then(Value::as_array) else {
        return Vec::new();
    };
    list.iter()
        .take(SOURCES_MAX)
        .filter_map(|s| {
            let kind = s.get("kind").and_then(Value::as_str)?;
            let rules: Vec<(String, Value)> = s
                .get("rules")
                .and_then(Value::as_object)
                .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default();
            Some(match kind {
                "class" => SourceRules::regular(SourceKind::Class, rules),
                "binding" => SourceRules::regular(SourceKind::Binding, rules),
                "overlay" => SourceRules::overlay(rules),
                "envelope" => SourceRules::regular(
                    SourceKind::Envelope {
                        pattern: "cap.fuzz.v1".into(),
                    },
                    rules,
                ),
                other => {
                    let pattern = other.strip_prefix("envelope:")?.to_owned();
                    SourceRules {
                        kind: SourceKind::Envelope { pattern },
                        rules,
                        narrow_only: false,
                        require_resolve: false,
                    }
                }
            })
        })
        .collect()
}

/// A path that parses round-trips through its written form.
pub fn round_trip(text: &str) {
    let Ok(p) = LimitPath::parse(text) else {
        return;
    };
    let written = p.to_string();
    let back = LimitPath::parse(&written);
    assert!(
        matches!(&back, Ok(b) if *b == p),
        "path `{text}` writes as `{written}`, which reads as {back:?}"
    );
    assert_eq!(back.map(|b| b.to_string()).ok(), Some(written));
}

/// The numbers of `v` the path's segments address.
fn numbers_at(v: &Value, segments: &[tether_limits::path::Segment], out: &mut Vec<f64>) {
    let Some((seg, rest)) = segments.split_first() else {
        // A value of another type than the schema's is the structure step's
        // refusal (step 7), not the limits'; only numbers are judged.
        if let Value::Number(n) = v {
            out.extend(n.as_f64());
        }
        return;
    };
    let Some(member) = v.get(&seg.name) else {
        return;
    };
    match (seg.index, member) {
        (None, m) => numbers_at(m, rest, out),
        (Some(Index::All), Value::Array(items)) => {
            items.iter().for_each(|i| numbers_at(i, rest, out));
        }
        (Some(Index::At(n)), Value::Array(items)) => {
            if let Some(i) = items.get(n) {
                numbers_at(i, rest, out);
            }
        }
        _ => {}
    }
}
