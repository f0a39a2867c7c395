//! Shared fixtures: a 6-joint arm and helpers that build limits from rules.
#![allow(dead_code)]

use serde_json::{json, Value};
use tether_limits::{build, EffectiveLimits, LoadError, SourceKind, SourceRules};

pub const JOINT_NAMES: [&str; 6] = ["base", "shoulder", "elbow", "wrist1", "wrist2", "wrist3"];

/// The arm schema: six joint positions in rad, a speed in rad/s, and a few
/// members that exercise defaults, nesting, strings and variable arrays.
pub fn arm_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "joints": {
                "type": "array", "minItems": 6, "maxItems": 6,
                "items": {"type": "number", "x-mhs-unit": "rad"}
            },
            "speed": {"type": "number", "x-mhs-unit": "rad/s", "minimum": 0, "maximum": 10},
            "accel": {"type": "number", "x-mhs-unit": "rad/s", "default": 7.5},
            "mode": {"type": "string", "enum": ["slow", "fast", "unsafe"]},
            "waypoints": {
                "type": "array",
                "items": {"$ref": "#/$defs/waypoint"}
            },
            "gripper": {"type": "object", "properties": {
                "force": {"type": "number", "x-mhs-unit": "N"}
            }}
        },
        "$defs": {
            "waypoint": {
                "type": "object",
                "properties": {
                    "pose": {"type": "array", "items": {"type": "number", "x-mhs-unit": "m"}},
                    "dwell": {"type": "number", "x-mhs-unit": "s"}
                }
            }
        }
    })
}

pub fn rules(pairs: &[(&str, Value)]) -> Vec<(String, Value)> {
    pairs
        .iter()
        .map(|(p, v)| (p.to_string(), v.clone()))
        .collect()
}

pub fn class(pairs: &[(&str, Value)]) -> SourceRules {
    SourceRules::regular(SourceKind::Class, rules(pairs))
}

pub fn binding(pairs: &[(&str, Value)]) -> SourceRules {
    SourceRules::regular(SourceKind::Binding, rules(pairs))
}

pub fn envelope(pattern: &str, pairs: &[(&str, Value)]) -> SourceRules {
    SourceRules::regular(
        SourceKind::Envelope {
            pattern: pattern.to_string(),
        },
        rules(pairs),
    )
}

pub fn overlay(pairs: &[(&str, Value)]) -> SourceRules {
    SourceRules::overlay(rules(pairs))
}

/// Per-joint limits as a vendor would publish them.
pub fn arm_class() -> SourceRules {
    class(&[
        (
            "joints",
            json!({
                "min": [-3.0, -2.0, -2.5, -3.1, -3.1, -6.2],
                "max": [3.0, 2.0, 2.5, 3.1, 3.1, 6.2],
                "unit": "rad",
                "names": JOINT_NAMES,
                "source": "vendor_doc",
                "ref": "docs/arm-manual.md:42",
                "reason": "mechanical stops"
            }),
        ),
        (
            "speed",
            json!({"min": 0, "max": 2.0, "unit": "rad/s", "source": "class_default"}),
        ),
    ])
}

pub fn arm_limits(extra: Vec<SourceRules>) -> EffectiveLimits {
    let mut sources = vec![arm_class()];
    sources.extend(extra);
    match build(&arm_schema(), &sources) {
        Ok(limits) => limits,
        Err(errors) => panic!("unexpected load errors: {errors:?}"),
    }
}

/// The load error kinds of a build that must fail.
pub fn load_kinds(sources: &[SourceRules]) -> Vec<&'static str> {
    match build(&arm_schema(), sources) {
        Ok(_) => panic!("expected load errors"),
        Err(errors) => errors
            .iter()
            .map(|e: &LoadError| e.reason.as_str())
            .collect(),
    }
}

pub fn zero_pose() -> Value {
    json!({"joints": [0, 0, 0, 0, 0, 0], "speed": 1.0})
}
