//! One test per load defect: each is refused at build, with its reason.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

use common::*;
use serde_json::json;
use tether_limits::{build, SourceKind, SourceRules};

#[test]
fn unknown_member_is_a_load_error() {
    assert_eq!(
        load_kinds(&[class(&[("speed", json!({"maxx": 2}))])]),
        ["unknown_member"]
    );
    let legacy = load_kinds(&[class(&[("speed", json!({"max": 2, "limit": 3}))])]);
    assert_eq!(legacy, ["unknown_member"]);
}

#[test]
fn unresolved_path_is_a_load_error() {
    assert_eq!(
        load_kinds(&[class(&[("sped", json!({"max": 2}))])]),
        ["path_unresolved"]
    );
    assert_eq!(
        load_kinds(&[class(&[("speed.x", json!({"max": 2}))])]),
        ["path_unresolved"]
    );
    assert_eq!(
        load_kinds(&[class(&[("joints[6]", json!({"max": 2}))])]),
        ["path_unresolved"]
    );
}

#[test]
fn unresolved_path_of_a_lenient_source_is_recorded_not_refused() {
    let mut env = envelope("cap.motion.*", &[("gantry_x", json!({"max": 1}))]);
    env.require_resolve = false;
    let limits = arm_limits(vec![env]);
    assert_eq!(limits.unresolved().len(), 1);
    assert_eq!(limits.unresolved()[0].1, "gantry_x");
    assert_eq!(
        limits.unresolved()[0].0.to_string(),
        "envelope:cap.motion.*"
    );
}

#[test]
fn bound_on_non_numeric_field_is_a_load_error() {
    assert_eq!(
        load_kinds(&[class(&[("mode", json!({"max": 2}))])]),
        ["non_numeric_field"]
    );
    assert_eq!(
        load_kinds(&[class(&[("gripper", json!({"max": 2}))])]),
        ["non_numeric_field"]
    );
    assert_eq!(
        load_kinds(&[class(&[("waypoints", json!({"max": 2}))])]),
        ["non_numeric_field"]
    );
}

#[test]
fn allowed_on_a_string_field_is_accepted() {
    let limits = arm_limits(vec![binding(&[(
        "mode",
        json!({"allowed": ["slow", "fast"]}),
    )])]);
    assert!(limits.check(&json!({"mode": "slow"})).is_ok());
    let refused = limits.check(&json!({"mode": "unsafe"}));
    assert_eq!(refused.map_err(|v| v.first.kind.as_str()), Err("allowed"));
}

#[test]
fn per_element_bound_on_scalar_is_a_load_error() {
    assert_eq!(
        load_kinds(&[class(&[("speed", json!({"max": [1, 2]}))])]),
        ["element_bound_on_scalar"]
    );
    assert_eq!(
        load_kinds(&[class(&[("joints[2]", json!({"max": [1, 2, 3, 4, 5, 6]}))])]),
        ["element_bound_on_scalar"]
    );
}

#[test]
fn per_element_bound_on_variable_array_is_a_load_error() {
    assert_eq!(
        load_kinds(&[class(&[("waypoints[*].pose", json!({"max": [1, 2, 3]}))])]),
        ["element_bound_on_variable_array"]
    );
}

#[test]
fn per_element_bound_of_wrong_length_is_a_load_error() {
    assert_eq!(
        load_kinds(&[class(&[("joints", json!({"max": [1, 2, 3]}))])]),
        ["element_bound_length"]
    );
    assert_eq!(
        load_kinds(&[class(&[("joints", json!({"max": 1, "names": ["a", "b"]}))])]),
        ["element_bound_length"]
    );
}

#[test]
fn unit_mismatch_is_a_load_error_even_when_convertible() {
    let errors = match build(
        &arm_schema(),
        &[class(&[("speed", json!({"max": 90, "unit": "deg/s"}))])],
    ) {
        Ok(_) => panic!("deg/s on a rad/s field must be refused"),
        Err(e) => e,
    };
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].reason.as_str(), "unit_mismatch");
    // The message tells the author what to write instead.
    assert!(
        errors[0].message.contains("1.5707"),
        "{}",
        errors[0].message
    );
    assert_eq!(
        load_kinds(&[class(&[("speed", json!({"max": 1, "unit": "m"}))])]),
        ["unit_mismatch"]
    );
}

#[test]
fn unit_alias_matches_its_canonical_spelling() {
    let schema = json!({"type": "object", "properties": {
        "torque": {"type": "number", "x-mhs-unit": "N.m"}}});
    let ok = build(
        &schema,
        &[class(&[("torque", json!({"max": 5, "unit": "N*m"}))])],
    );
    assert!(ok.is_ok());
}

#[test]
fn contradictory_sources_are_a_load_error() {
    let kinds = load_kinds(&[
        class(&[("speed", json!({"min": 1.5}))]),
        binding(&[("speed", json!({"max": 1.0}))]),
    ]);
    assert_eq!(kinds, ["contradictory"]);
    let kinds = load_kinds(&[
        class(&[("mode", json!({"allowed": ["slow"]}))]),
        binding(&[("mode", json!({"allowed": ["fast"]}))]),
    ]);
    assert_eq!(kinds, ["contradictory"]);
    let kinds = load_kinds(&[class(&[("speed", json!({"allowed": [5, 6], "max": 2}))])]);
    assert_eq!(kinds, ["contradictory"]);
}

#[test]
fn sources_that_contradict_under_two_spellings_are_a_load_error() {
    // Per-element max 2.0 for the shoulder, and a min of 2.5 on joints[1].
    let kinds = load_kinds(&[
        arm_class(),
        binding(&[("joints[1]", json!({"min": 2.5, "unit": "rad"}))]),
    ]);
    assert_eq!(kinds, ["contradictory"]);
    // The same min on a joint whose max is above it is fine.
    let built = build(
        &arm_schema(),
        &[
            arm_class(),
            binding(&[("joints[0]", json!({"min": 2.5, "unit": "rad"}))]),
        ],
    );
    assert!(built.is_ok(), "{built:?}");
}

#[test]
fn an_integer_field_whose_allowed_values_are_all_fractional_is_a_load_error() {
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
    let built = build(&schema, &[class(&[("n", json!({"allowed": [1.5]}))])]);
    let kinds: Vec<&str> = built
        .expect_err("refused")
        .iter()
        .map(|e| e.reason.as_str())
        .collect();
    assert_eq!(kinds, ["contradictory"]);
    assert!(build(&schema, &[class(&[("n", json!({"allowed": [1.5, 2]}))])]).is_ok());
}

#[test]
fn unknown_window_is_a_load_error() {
    assert_eq!(
        load_kinds(&[class(&[("speed", json!({"max": 100, "per": "fortnight"}))])]),
        ["unknown_window"]
    );
}

#[test]
fn overlay_that_widens_is_a_load_error() {
    let kinds = load_kinds(&[arm_class(), overlay(&[("speed", json!({"max": 3.0}))])]);
    assert_eq!(kinds, ["widening_overlay"]);
    let kinds = load_kinds(&[arm_class(), overlay(&[("speed", json!({"min": -1.0}))])]);
    assert_eq!(kinds, ["widening_overlay"]);
    let kinds = load_kinds(&[
        arm_class(),
        overlay(&[("joints[*]", json!({"max": [3.0, 2.0, 2.6, 3.1, 3.1, 6.2]}))]),
    ]);
    assert_eq!(kinds, ["widening_overlay"]);
    let kinds = load_kinds(&[
        class(&[("mode", json!({"allowed": ["slow", "fast"]}))]),
        overlay(&[("mode", json!({"allowed": ["slow", "unsafe"]}))]),
    ]);
    assert_eq!(kinds, ["widening_overlay"]);
}

#[test]
fn an_overlay_budget_above_a_regular_one_is_widening() {
    let regular = || class(&[("speed", json!({"max": 100, "per": "session"}))]);
    let kinds = load_kinds(&[
        regular(),
        overlay(&[("speed", json!({"max": 500, "per": "session"}))]),
    ]);
    assert_eq!(kinds, ["widening_overlay"]);
    // Lower is narrowing; another window is a pool of its own.
    for (max, per) in [(50, "session"), (500, "rolling_1h")] {
        let built = build(
            &arm_schema(),
            &[
                regular(),
                overlay(&[("speed", json!({"max": max, "per": per}))]),
            ],
        );
        assert!(built.is_ok(), "{max} per {per}: {built:?}");
    }
}

#[test]
fn a_cited_ref_must_name_a_file_and_line() {
    for bad in [
        "see the manual",
        "manual.pdf",
        "manual.pdf:",
        "manual.pdf:0",
        "a b.md:3",
    ] {
        assert_eq!(
            load_kinds(&[class(&[(
                "speed",
                json!({"max": 2, "source": "vendor_doc", "ref": bad})
            )])]),
            ["missing_ref"],
            "{bad}"
        );
    }
    let built = build(
        &arm_schema(),
        &[class(&[(
            "speed",
            json!({"max": 2, "source": "vendor_doc", "ref": "docs/arm.md:12"}),
        )])],
    );
    assert!(built.is_ok(), "{built:?}");
}

#[test]
fn missing_ref_is_a_load_error() {
    assert_eq!(
        load_kinds(&[class(&[(
            "speed",
            json!({"max": 2, "source": "vendor_doc"})
        )])]),
        ["missing_ref"]
    );
    assert_eq!(
        load_kinds(&[class(&[(
            "speed",
            json!({"max": 2, "source": "upstream_code"})
        )])]),
        ["missing_ref"]
    );
}

#[test]
fn integer_beyond_2_pow_53_is_a_load_error() {
    assert_eq!(
        load_kinds(&[class(&[(
            "speed",
            json!({"max": 9_007_199_254_740_992_u64})
        )])]),
        ["integer_out_of_range"]
    );
    assert_eq!(
        load_kinds(&[class(&[(
            "speed",
            json!({"min": -9_007_199_254_740_992_i64})
        )])]),
        ["integer_out_of_range"]
    );
    assert!(build(
        &arm_schema(),
        &[class(&[(
            "speed",
            json!({"max": 9_007_199_254_740_991_u64})
        )])]
    )
    .is_ok());
}

#[test]
fn path_too_long_is_a_load_error() {
    let long = format!("a{}", ".b".repeat(128));
    assert_eq!(
        load_kinds(&[class(&[(&long, json!({"max": 1}))])]),
        ["path_too_long"]
    );
    assert_eq!(
        load_kinds(&[class(&[("joints[x]", json!({"max": 1}))])]),
        ["invalid_path"]
    );
}

#[test]
fn names_that_disagree_are_a_load_error() {
    let kinds = load_kinds(&[
        arm_class(),
        binding(&[(
            "joints",
            json!({"max": 9, "names": ["a", "b", "c", "d", "e", "f"]}),
        )]),
    ]);
    assert_eq!(kinds, ["names_mismatch"]);
}

#[test]
fn every_defect_is_reported_not_only_the_first() {
    let kinds = load_kinds(&[
        class(&[("sped", json!({"max": 2})), ("speed", json!({"maxx": 2}))]),
        binding(&[("mode", json!({"max": 1}))]),
    ]);
    assert_eq!(
        kinds,
        ["path_unresolved", "unknown_member", "non_numeric_field"]
    );
}

#[test]
fn load_error_displays_one_line() {
    let errors = build(&arm_schema(), &[class(&[("speed", json!({"maxx": 2}))])])
        .err()
        .unwrap_or_default();
    let line = errors.first().map(ToString::to_string).unwrap_or_default();
    assert!(line.starts_with("class limit at 'speed'"), "{line}");
    assert!(line.contains("(unknown_member)"));
    assert!(!line.contains('\n'));
}

#[test]
fn overlay_may_not_be_operator_required_itself() {
    assert_eq!(
        load_kinds(&[
            class(&[("speed", json!("operator_required"))]),
            overlay(&[("speed", json!("operator_required"))])
        ]),
        ["invalid_rule"]
    );
    let other = SourceRules::regular(SourceKind::Binding, rules(&[("speed", json!(5))]));
    assert_eq!(load_kinds(&[other]), ["invalid_rule"]);
}

#[test]
fn an_overlay_on_another_spelling_of_the_same_elements_may_not_widen() {
    // One joint against the per-element class bounds (joint 2 max 2.5).
    let kinds = load_kinds(&[arm_class(), overlay(&[("joints[2]", json!({"max": 2.6}))])]);
    assert_eq!(kinds, ["widening_overlay"]);
    // An element of a variable array against its `[*]` rule.
    let kinds = load_kinds(&[
        binding(&[("waypoints[*].dwell", json!({"max": 10}))]),
        overlay(&[("waypoints[0].dwell", json!({"max": 20}))]),
    ]);
    assert_eq!(kinds, ["widening_overlay"]);
    // `[*]` in the overlay against one element's regular rule.
    let kinds = load_kinds(&[
        binding(&[("waypoints[3].dwell", json!({"max": 10}))]),
        overlay(&[("waypoints[*].dwell", json!({"max": 20}))]),
    ]);
    assert_eq!(kinds, ["widening_overlay"]);
    // Narrowing one element is fine.
    let loads = |sources: &[tether_limits::SourceRules]| {
        tether_limits::build(&arm_schema(), sources)
            .map(|_| ())
            .map_err(|e| format!("{e:?}"))
    };
    assert_eq!(
        loads(&[arm_class(), overlay(&[("joints[2]", json!({"max": 2.0}))])]),
        Ok(())
    );
    assert_eq!(
        loads(&[
            binding(&[("waypoints[*].dwell", json!({"max": 10}))]),
            overlay(&[("waypoints[0].dwell", json!({"max": 5}))]),
        ]),
        Ok(())
    );
}

#[test]
fn an_overlay_may_not_allow_values_the_regular_range_forbids() {
    let kinds = load_kinds(&[
        binding(&[("speed", json!({"max": 2}))]),
        overlay(&[("speed", json!({"allowed": [1, 5]}))]),
    ]);
    assert_eq!(kinds, ["widening_overlay"]);
    assert!(tether_limits::build(
        &arm_schema(),
        &[
            binding(&[("speed", json!({"max": 2}))]),
            overlay(&[("speed", json!({"allowed": [0.5, 1]}))]),
        ]
    )
    .is_ok());
}

#[test]
fn a_unit_hint_is_rounded_so_it_can_be_copied() {
    let schema =
        json!({"type": "object", "properties": {"t": {"type": "number", "x-mhs-unit": "degF"}}});
    let errors = tether_limits::build(
        &schema,
        &[binding(&[("t", json!({"max": 90, "unit": "degC"}))])],
    )
    .err()
    .unwrap_or_default();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].message.contains("would be 194 degF"),
        "{}",
        errors[0].message
    );
}
