//! Decisions of the default policy and of custom policies, and load defects.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

use serde_json::json;
use tether_policy::{
    Action, BindingShape, CellShape, ControlPolicy, Decision, DeviceShape, Flags, PolicyError,
    PrincipalKind, Subject,
};

fn binding(
    cap: &str,
    verb: &str,
    risk: &str,
    stop: bool,
    schema: serde_json::Value,
) -> BindingShape {
    BindingShape {
        capability: cap.into(),
        verb: verb.into(),
        risk: risk.into(),
        resource: "main".into(),
        flags: Flags {
            stop_class: stop,
            ..Flags::default()
        },
        input_schema: schema,
    }
}

/// Device 0: simulated thermostat; device 1: a hardware press.
fn cell() -> CellShape {
    let temp = json!({"type": "object", "properties": {"target_temperature": {"type": "number"}}});
    let press = json!({"type": "object", "properties": {"force": {"type": "number"}, "joints": {"type": "array", "items": {"type": "number"}}}});
    CellShape {
        devices: vec![
            DeviceShape {
                device_id: "thermostat-1".into(),
                mode: "simulated".into(),
                risk_class: "R1".into(),
                bindings: vec![
                    binding(
                        "cap.state.read.v1",
                        "read",
                        "R0",
                        false,
                        json!({"type": "object"}),
                    ),
                    binding(
                        "cap.thermal.setpoint.v1",
                        "command",
                        "R1",
                        false,
                        temp.clone(),
                    ),
                ],
            },
            DeviceShape {
                device_id: "press-1".into(),
                mode: "hardware".into(),
                risk_class: "R3".into(),
                bindings: vec![
                    binding(
                        "cap.state.read.v1",
                        "read",
                        "R0",
                        false,
                        json!({"type": "object"}),
                    ),
                    binding(
                        "x-cap.press.close.v1",
                        "command",
                        "R2",
                        false,
                        press.clone(),
                    ),
                    binding("x-cap.press.slam.v1", "command", "R3", false, press),
                    binding(
                        "cap.motion.stop.v1",
                        "command",
                        "R3",
                        true,
                        json!({"type": "object"}),
                    ),
                    binding("cap.thermal.setpoint.v1", "command", "R1", false, temp),
                ],
            },
        ],
    }
}

const AGENT: Subject<'static> = Subject {
    id: "agent-7",
    kind: PrincipalKind::Agent,
    operator: false,
};
const OPERATOR: Subject<'static> = Subject {
    id: "alice",
    kind: PrincipalKind::Human,
    operator: true,
};

#[test]
fn default_policy_reads_simulated_hardware_and_stops() {
    let p = ControlPolicy::default_for(&cell()).expect("default policy loads");
    let v = |who: &Subject<'_>, a: Action, d: usize, b: usize| {
        p.decide(who, a, d, b, &json!({})).decision
    };
    assert_eq!(
        v(&AGENT, Action::Read, 1, 0),
        Decision::Allow,
        "reads allowed"
    );
    assert_eq!(
        v(&AGENT, Action::Command, 0, 1),
        Decision::Allow,
        "simulated allowed"
    );
    assert_eq!(
        v(&AGENT, Action::Command, 1, 4),
        Decision::Allow,
        "hardware R1 allowed"
    );
    assert_eq!(
        v(&AGENT, Action::Command, 1, 1),
        Decision::Hold,
        "hardware R2 held"
    );
    assert_eq!(
        v(&OPERATOR, Action::Command, 1, 2),
        Decision::Hold,
        "R3 held for people"
    );
    assert_eq!(
        v(&AGENT, Action::Command, 1, 2),
        Decision::Deny,
        "R3 denied to agents"
    );
    assert_eq!(
        v(&AGENT, Action::Command, 1, 3),
        Decision::Allow,
        "stops never held"
    );
    let held = p.decide(&AGENT, Action::Command, 1, 1, &json!({}));
    assert_eq!(held.policies, vec!["hardware-r2-up-held".to_owned()]);
    assert_eq!(held.quorum, 1);
    assert!(held.reason.contains("operator"), "{}", held.reason);
    let denied = p.decide(&AGENT, Action::Command, 1, 2, &json!({}));
    assert_eq!(denied.policies, vec!["agents-no-r3-hardware".to_owned()]);
}

const THRESHOLD: &str = r#"
@id("reads") permit(principal, action == Tether::Action::"read", resource);
@id("setpoints") permit(principal, action == Tether::Action::"command", resource)
  when { resource.capability == "cap.thermal.setpoint.v1" };
@id("hot-needs-two")
@hold("setpoints above 60 degC need two operators")
@quorum("2")
permit(principal is Tether::Agent, action == Tether::Action::"command", resource)
  when { context.input has target_temperature && context.input.target_temperature.greaterThan(decimal("60.0")) };
@id("never-above-85") @reason("nothing above 85 degC")
forbid(principal, action, resource)
  when { context.input has target_temperature && context.input.target_temperature.greaterThan(decimal("85.0")) };
"#;

#[test]
fn thresholds_on_input_hold_with_quorum_and_forbid_wins() {
    let p = ControlPolicy::load("threshold.cedar", THRESHOLD, &cell()).expect("loads");
    let at = |t: f64| {
        p.decide(
            &AGENT,
            Action::Command,
            0,
            1,
            &json!({"target_temperature": t}),
        )
    };
    assert_eq!(at(40.0).decision, Decision::Allow);
    let held = at(60.5);
    assert_eq!(held.decision, Decision::Hold);
    assert_eq!(held.quorum, 2);
    assert_eq!(held.policies, vec!["hot-needs-two".to_owned()]);
    let denied = at(90.0);
    assert_eq!(denied.decision, Decision::Deny);
    assert_eq!(denied.reason, "nothing above 85 degC");
    // Not an agent: the hold does not apply.
    let human = p.decide(
        &OPERATOR,
        Action::Command,
        0,
        1,
        &json!({"target_temperature": 70.0}),
    );
    assert_eq!(human.decision, Decision::Allow);
    // Nothing permits the press: default deny.
    let none = p.decide(&AGENT, Action::Command, 1, 1, &json!({"force": 1.0}));
    assert_eq!(none.decision, Decision::Deny);
    assert!(none.policies.is_empty());
}

#[test]
fn numbers_outside_cedar_range_deny() {
    let p = ControlPolicy::load("threshold.cedar", THRESHOLD, &cell()).expect("loads");
    let v = p.decide(
        &AGENT,
        Action::Command,
        0,
        1,
        &json!({"target_temperature": 1e300}),
    );
    assert_eq!(v.decision, Decision::Deny);
    assert!(v.reason.contains("could not be evaluated"), "{}", v.reason);
}

#[test]
fn unknown_binding_denies() {
    let p = ControlPolicy::default_for(&cell()).expect("loads");
    assert_eq!(
        p.decide(&AGENT, Action::Read, 9, 0, &json!({})).decision,
        Decision::Deny
    );
}

#[test]
fn sets_from_arrays_are_usable() {
    let text = r#"@id("p") permit(principal, action, resource)
      when { context.input has joints && context.input.joints.contains(decimal("1.5")) };"#;
    let p = ControlPolicy::load("sets.cedar", text, &cell()).expect("loads");
    let yes = p.decide(
        &AGENT,
        Action::Command,
        1,
        1,
        &json!({"joints": [0.0, 1.5]}),
    );
    let no = p.decide(
        &AGENT,
        Action::Command,
        1,
        1,
        &json!({"joints": [0.0, 1.25]}),
    );
    assert_eq!(
        (yes.decision, no.decision),
        (Decision::Allow, Decision::Deny)
    );
}

fn load_err(text: &str) -> PolicyError {
    ControlPolicy::load("bad.cedar", text, &cell()).expect_err("must refuse")
}

#[test]
fn defects_refuse_with_the_policy_named() {
    let e = load_err("permit(principal, action, resource");
    assert!(matches!(e, PolicyError::Parse { .. }), "{e}");
    assert!(e.to_string().contains("bad.cedar"), "{e}");

    let e = load_err(
        r#"@id("typo") permit(principal, action, resource) when { resource.capabilty == "x" };"#,
    );
    assert!(matches!(e, PolicyError::Validation { .. }), "{e}");
    assert!(e.to_string().contains("typo"), "{e}");

    let e = load_err(
        r#"@id("unguarded") permit(principal, action, resource) when { context.input.target_temperature.greaterThan(decimal("1.0")) };"#,
    );
    assert!(
        matches!(e, PolicyError::Validation { .. }),
        "an optional input field needs `has`: {e}"
    );

    let e = load_err(r#"@id("f") @hold("x") forbid(principal, action, resource);"#);
    assert!(
        matches!(e, PolicyError::Annotation { ref policy, .. } if policy == "f"),
        "{e}"
    );

    let e = load_err(r#"@id("q") @hold("x") @quorum("zero") permit(principal, action, resource);"#);
    assert!(e.to_string().contains("@quorum"), "{e}");

    let e = load_err(r#"@id("q") @quorum("2") permit(principal, action, resource);"#);
    assert!(e.to_string().contains("@hold"), "{e}");

    let e = load_err(
        r#"@id("a") permit(principal, action, resource); @id("a") permit(principal, action, resource);"#,
    );
    assert!(e.to_string().contains("twice"), "{e}");

    // A misspelt hold would leave a plain permit (allow): refused.
    for typo in [
        r#"@Hold("x")"#,
        r#"@holdd("x")"#,
        r#"@hold("x") @Quorum("2")"#,
    ] {
        let e = load_err(&format!(
            r#"@id("t") {typo} permit(principal, action, resource);"#
        ));
        assert!(
            matches!(e, PolicyError::Annotation { ref policy, .. } if policy == "t"),
            "{typo}: {e}"
        );
        assert!(e.to_string().contains("unknown annotation"), "{e}");
    }

    let e = load_err(r#"permit(principal is Tether::Robot, action, resource);"#);
    assert!(matches!(e, PolicyError::Validation { .. }), "{e}");
}
