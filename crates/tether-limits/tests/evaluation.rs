//! Evaluation invariants: what `check` and `unset_paths` see and report.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

use common::*;
use serde_json::{json, Value};
use tether_limits::{build, strip_limited_bounds, ViolationKind};

fn kinds_at(limits: &tether_limits::EffectiveLimits, input: Value) -> Vec<(String, &'static str)> {
    match limits.check(&input) {
        Ok(()) => vec![],
        Err(v) => v
            .all
            .iter()
            .map(|v| (v.path.clone(), v.kind.as_str()))
            .collect(),
    }
}

#[test]
fn in_range_input_passes() {
    assert!(arm_limits(vec![]).check(&zero_pose()).is_ok());
}

#[test]
fn every_array_element_is_checked() {
    let limits = arm_limits(vec![]);
    for i in 0..6 {
        let mut joints = vec![0.0; 6];
        joints[i] = 7.0;
        let refused = limits.check(&json!({"joints": joints})).err();
        let first = refused.map(|v| v.first);
        let first = first.as_ref();
        assert_eq!(first.map(|v| v.path.clone()), Some(format!("joints[{i}]")));
        assert_eq!(first.map(|v| v.kind), Some(ViolationKind::Max));
        assert_eq!(
            first.and_then(|v| v.element_name.clone()),
            Some(JOINT_NAMES[i].to_string())
        );
    }
    // Per-element bounds: 2.2 passes the base (3.0) and fails the shoulder (2.0).
    let v = kinds_at(&limits, json!({"joints": [2.2, 2.2, 0, 0, 0, 0]}));
    assert_eq!(v, [("joints[1]".to_string(), "max")]);
}

#[test]
fn violation_reports_bound_value_unit_source_and_reason() {
    let limits = arm_limits(vec![]);
    let refused = limits.check(&json!({"joints": [0, 0, -2.6, 0, 0, 0]}));
    let details = refused
        .map_err(|v| v.to_details())
        .err()
        .unwrap_or_default();
    assert_eq!(details["path"], "joints[2]");
    assert_eq!(details["kind"], "min");
    assert_eq!(details["bound"], -2.5);
    assert_eq!(details["value"], -2.6);
    assert_eq!(details["unit"], "rad");
    assert_eq!(details["source"], "class");
    assert_eq!(details["element_name"], "elbow");
    assert_eq!(details["limit_path"], "joints[*]");
    assert_eq!(details["reason"], "mechanical stops");
    assert_eq!(details["violations"].as_array().map(Vec::len), Some(1));
}

#[test]
fn every_nested_leaf_is_checked() {
    let limits = arm_limits(vec![binding(&[
        (
            "waypoints[*].pose",
            json!({"min": -1.0, "max": 1.0, "unit": "m"}),
        ),
        ("waypoints[*].dwell", json!({"max": 5, "unit": "s"})),
    ])]);
    let input = json!({"waypoints": [
        {"pose": [0, 0.5, 0.9], "dwell": 1},
        {"pose": [0, 1.5], "dwell": 9},
        {"pose": [-2]}
    ]});
    let v = kinds_at(&limits, input);
    assert_eq!(
        v,
        [
            ("waypoints[1].dwell".to_string(), "max"),
            ("waypoints[1].pose[1]".to_string(), "max"),
            ("waypoints[2].pose[0]".to_string(), "min"),
        ]
    );
}

#[test]
fn strings_booleans_and_null_never_pass_a_numeric_bound() {
    let limits = arm_limits(vec![]);
    for bad in [
        json!("1.0"),
        json!(true),
        json!(null),
        json!({}),
        json!([1.0]),
    ] {
        let v = kinds_at(&limits, json!({"speed": bad}));
        assert_eq!(v, [("speed".to_string(), "type")], "{bad}");
        let v = kinds_at(&limits, json!({"joints": [0, 0, bad, 0, 0, 0]}));
        assert_eq!(v, [("joints[2]".to_string(), "type")], "{bad}");
    }
    // A path that runs through a non-object or non-array also fails.
    let v = kinds_at(&limits, json!({"joints": "all zero"}));
    assert_eq!(v, [("joints".to_string(), "type")]);
}

#[test]
fn absent_optional_field_is_skipped() {
    let limits = arm_limits(vec![binding(&[(
        "gripper.force",
        json!({"max": 20, "unit": "N"}),
    )])]);
    assert!(limits.check(&json!({})).is_ok());
    assert!(limits.check(&json!({"gripper": {}})).is_ok());
    assert!(limits.check(&json!({"gripper": {"force": 30}})).is_err());
}

#[test]
fn schema_default_of_omitted_field_is_evaluated() {
    let limits = arm_limits(vec![binding(&[(
        "accel",
        json!({"max": 5.0, "unit": "rad/s"}),
    )])]);
    let refused = limits.check(&json!({"speed": 1.0})).err();
    let first = refused.map(|v| v.first);
    assert_eq!(first.as_ref().map(|v| v.path.as_str()), Some("accel"));
    assert_eq!(first.as_ref().map(|v| v.value.clone()), Some(json!(7.5)));
    assert!(limits.check(&json!({"accel": 4.0})).is_ok());
}

#[test]
fn length_of_a_per_element_bounded_array_is_checked() {
    let limits = arm_limits(vec![]);
    let v = kinds_at(&limits, json!({"joints": [0, 0, 0]}));
    assert_eq!(v, [("joints".to_string(), "length")]);
}

#[test]
fn violations_are_capped_at_sixteen_and_marked_truncated() {
    let limits = arm_limits(vec![binding(&[("waypoints[*].dwell", json!({"max": 1}))])]);
    let waypoints: Vec<Value> = (0..40).map(|_| json!({"dwell": 2})).collect();
    let refused = limits.check(&json!({"waypoints": waypoints})).err();
    let v = refused.as_ref();
    assert_eq!(v.map(|v| v.all.len()), Some(16));
    assert_eq!(v.map(|v| v.truncated), Some(true));
    assert_eq!(v.map(|v| v.first.path.as_str()), Some("waypoints[0].dwell"));
}

#[test]
fn one_element_path_checks_only_that_element() {
    let limits = arm_limits(vec![binding(&[(
        "joints[5]",
        json!({"max": 1.0, "unit": "rad"}),
    )])]);
    assert!(limits
        .check(&json!({"joints": [2, 0, 0, 0, 0, 0.5]}))
        .is_ok());
    let v = kinds_at(&limits, json!({"joints": [0, 0, 0, 0, 0, 1.5]}));
    assert_eq!(v, [("joints[5]".to_string(), "max")]);
}

#[test]
fn operator_required_unfilled_is_reported_unset() {
    let limits = arm_limits(vec![binding(&[
        ("gripper.force", json!("operator_required")),
        ("accel", json!("operator_required")),
    ])]);
    // Not set, but the schema default of accel is relied on.
    assert_eq!(limits.unset_paths(&json!({})), ["accel"]);
    assert_eq!(
        limits.unset_paths(&json!({"gripper": {"force": 3}})),
        ["accel", "gripper.force"]
    );
    let filled = arm_limits(vec![
        binding(&[("accel", json!("operator_required"))]),
        overlay(&[(
            "accel",
            json!({"max": 8, "unit": "rad/s", "source": "operator"}),
        )]),
    ]);
    assert!(filled.unset_paths(&json!({})).is_empty());
    assert!(filled.check(&json!({"accel": 9})).is_err());
}

#[test]
fn overlay_tightens_and_is_reported_as_the_source() {
    let limits = arm_limits(vec![overlay(&[("speed", json!({"max": 0.5}))])]);
    let refused = limits.check(&json!({"speed": 1.0})).err();
    assert_eq!(refused.map(|v| v.first.source), Some("overlay".to_string()));
    assert_eq!(limits.to_json()["narrowed"], json!(["speed"]));
}

#[test]
fn envelope_source_names_its_pattern() {
    let limits = arm_limits(vec![
        envelope("cap.motion.*", &[("speed", json!({"max": 1.0}))]),
        envelope("cap.motion.joint.v1", &[("speed", json!({"max": 1.5}))]),
    ]);
    let refused = limits.check(&json!({"speed": 1.2})).err();
    assert_eq!(
        refused.map(|v| v.first.source),
        Some("envelope:cap.motion.*".to_string())
    );
    let refused = arm_limits(vec![envelope(
        "cap.motion.joint.v1",
        &[("speed", json!({"max": 1.0}))],
    )])
    .check(&json!({"speed": 1.2}))
    .err();
    assert_eq!(
        refused.map(|v| v.first.source),
        Some("envelope".to_string())
    );
}

#[test]
fn limited_nodes_lose_their_schema_bounds_for_the_structure_step() {
    let limits = arm_limits(vec![]);
    assert!(limits.is_limited("/properties/speed"));
    assert!(limits.is_limited("joints[*]"));
    assert!(!limits.is_limited("/properties/accel"));
    let stripped = strip_limited_bounds(&arm_schema(), &limits);
    assert_eq!(stripped["properties"]["speed"].get("maximum"), None);
    assert_eq!(stripped["properties"]["speed"]["x-mhs-unit"], "rad/s");
    // Unlimited nodes keep their bounds.
    assert_eq!(
        stripped["properties"]["mode"]["enum"],
        arm_schema()["properties"]["mode"]["enum"]
    );
}

#[test]
fn reference_json_lists_limits_budgets_and_unlimited_leaves() {
    let limits = arm_limits(vec![
        binding(&[("speed", json!({"max": 500, "per": "rolling_1h"}))]),
        binding(&[("gripper.force", json!("operator_required"))]),
    ]);
    let doc = limits.to_json();
    let joints = &doc["limits"]["joints[*]"];
    assert_eq!(joints["max"], json!([3.0, 2.0, 2.5, 3.1, 3.1, 6.2]));
    assert_eq!(joints["unit"], "rad");
    assert_eq!(joints["names"], json!(JOINT_NAMES));
    assert_eq!(joints["sources"], json!(["class"]));
    assert_eq!(joints["provenance"][0]["ref"], "docs/arm-manual.md:42");
    assert_eq!(doc["limits"]["speed"]["max"], 2.0);
    assert_eq!(doc["cumulative"][0]["per"], "rolling_1h");
    assert_eq!(doc["operator_required"], json!(["gripper.force"]));
    assert_eq!(
        doc["unlimited"],
        json!(["accel", "waypoints[*].dwell", "waypoints[*].pose[*]"])
    );
    assert_eq!(limits.budgets().len(), 1);
}

#[test]
fn tuple_arrays_and_refs_resolve() {
    let schema = json!({
        "type": "object",
        "properties": {
            "target": {"$ref": "#/definitions/xyz"},
            "cfg": {"allOf": [{"$ref": "#/$defs/cfg"}]}
        },
        "definitions": {"xyz": {"type": "array", "items": [
            {"type": "number", "x-mhs-unit": "m"},
            {"type": "number", "x-mhs-unit": "m"},
            {"type": "number", "x-mhs-unit": "m"}
        ], "additionalItems": false}},
        "$defs": {"cfg": {"type": "object", "properties": {
            "temp": {"type": "number", "x-mhs-unit": "degC", "maximum": 300}
        }}}
    });
    let sources = [class(&[
        (
            "target",
            json!({"max": [1, 2, 3], "unit": "m", "names": ["x", "y", "z"]}),
        ),
        ("cfg.temp", json!({"max": 80, "unit": "degC"})),
    ])];
    let limits = match build(&schema, &sources) {
        Ok(l) => l,
        Err(e) => panic!("{e:?}"),
    };
    let v = kinds_at(
        &limits,
        json!({"target": [0.5, 2.5, 0], "cfg": {"temp": 81}}),
    );
    assert_eq!(
        v,
        [
            ("cfg.temp".to_string(), "max"),
            ("target[1]".to_string(), "max")
        ]
    );
    let stripped = strip_limited_bounds(&schema, &limits);
    assert_eq!(
        stripped["$defs"]["cfg"]["properties"]["temp"].get("maximum"),
        None
    );
}

#[test]
fn budgets_on_one_pool_keep_only_the_smallest() {
    let limits = arm_limits(vec![
        binding(&[("speed", json!({"max": 500, "per": "session"}))]),
        envelope(
            "cap.motion.*",
            &[("speed", json!({"max": 300, "per": "session"}))],
        ),
        binding(&[("accel", json!({"max": 9, "per": "session"}))]),
        envelope(
            "cap.motion.*",
            &[("speed", json!({"max": 800, "per": "rolling_1h"}))],
        ),
    ]);
    let pools: Vec<(String, &str, f64)> = limits
        .budgets()
        .iter()
        .map(|b| (b.path.to_string(), b.window.as_str(), b.limit))
        .collect();
    assert_eq!(pools.len(), 3, "{pools:?}");
    assert!(
        pools.contains(&("speed".into(), "session", 300.0)),
        "{pools:?}"
    );
    assert!(
        pools.contains(&("speed".into(), "rolling_1h", 800.0)),
        "{pools:?}"
    );
    assert!(
        pools.contains(&("accel".into(), "session", 9.0)),
        "{pools:?}"
    );
}
