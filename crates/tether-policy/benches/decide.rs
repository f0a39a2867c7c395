//! Policy decision cost: the default policy, a 50-rule policy, a rule that
//! makes Cedar run at request time, and a worst case where all 50 rules apply
//! to the request and read its input.
//!
//! `cargo bench -p tether-policy --bench decide`; the p50/p99 figures it
//! prints go into docs/PERFORMANCE.md.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use serde_json::json;
use std::time::Instant;
use tether_policy::{
    Action, BindingShape, CellShape, ControlPolicy, DeviceShape, Flags, PrincipalKind, Subject,
};

fn cell() -> CellShape {
    let temp = json!({"type": "object", "properties": {"target_temperature": {"type": "number"}}});
    let arm = json!({"type": "object", "properties": {"joints": {"type": "array", "items": {"type": "number"}}, "speed": {"type": "number"}}});
    let b = |cap: &str, risk: &str, schema: &serde_json::Value| BindingShape {
        capability: cap.into(),
        verb: "command".into(),
        risk: risk.into(),
        resource: "main".into(),
        flags: Flags::default(),
        input_schema: schema.clone(),
    };
    CellShape {
        devices: vec![
            DeviceShape {
                device_id: "thermostat-1".into(),
                mode: "simulated".into(),
                risk_class: "R1".into(),
                bindings: vec![b("cap.thermal.setpoint.v1", "R1", &temp)],
            },
            DeviceShape {
                device_id: "arm-1".into(),
                mode: "hardware".into(),
                risk_class: "R2".into(),
                bindings: vec![b("cap.motion.move_to.v1", "R2", &arm)],
            },
        ],
    }
}

fn fifty_rules() -> String {
    let mut s = String::from(tether_policy::default_source());
    for i in 0..44 {
        s.push_str(&format!(
            "@id(\"rule-{i}\") forbid(principal is Tether::Agent, action == Tether::Action::\"command\", resource) when {{ resource.device == \"dev-{i}\" && context.input has speed && context.input.speed.greaterThan(decimal(\"{i}.5\")) }};\n"
        ));
    }
    s
}

/// 44 rules that all apply to the measured request (an agent's command on
/// arm-1) and read its input: nothing can be sliced away, every rule runs.
fn fifty_rules_in_scope() -> String {
    let mut s = String::from(tether_policy::default_source());
    for i in 0..44 {
        s.push_str(&format!(
            "@id(\"arm-rule-{i}\") forbid(principal is Tether::Agent, action == Tether::Action::\"command\", resource in Tether::Device::\"arm-1\") when {{ context.input has speed && context.input.speed.greaterThan(decimal(\"{i}.5\")) }};\n"
        ));
    }
    s
}

fn percentiles(p: &ControlPolicy, label: &str) {
    let agent = Subject {
        id: "agent-1",
        kind: PrincipalKind::Agent,
        operator: false,
    };
    let input = json!({"joints": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], "speed": 0.5});
    let mut samples = Vec::with_capacity(20_000);
    for _ in 0..20_000 {
        let t = Instant::now();
        black_box(p.decide(&agent, Action::Command, 1, 0, black_box(&input)));
        samples.push(t.elapsed().as_nanos() as f64 / 1000.0);
    }
    samples.sort_by(f64::total_cmp);
    let q = |x: f64| samples[((samples.len() - 1) as f64 * x) as usize];
    println!(
        "{label}: p50 {:.2} µs, p99 {:.2} µs, max {:.2} µs",
        q(0.5),
        q(0.99),
        q(1.0)
    );
}

fn bench(c: &mut Criterion) {
    let default = ControlPolicy::default_for(&cell()).expect("default");
    let big = ControlPolicy::load("fifty.cedar", &fifty_rules(), &cell()).expect("fifty");
    assert_eq!(big.policy_ids().len(), 50);
    let dense = ControlPolicy::load("fifty-dense.cedar", &fifty_rules_in_scope(), &cell())
        .expect("fifty dense");
    let named = format!(
        "{}@id(\"no-agent-7\") forbid(principal == Tether::Agent::\"agent-7\", action, resource);\n",
        tether_policy::default_source()
    );
    let named = ControlPolicy::load("named.cedar", &named, &cell()).expect("named");
    percentiles(&default, "default policy (6 rules)");
    percentiles(
        &named,
        "default + a rule naming one agent (Cedar runs, no input read)",
    );
    percentiles(&big, "50-rule policy (44 rules name other devices)");
    percentiles(&dense, "50-rule policy (all 44 extra rules apply)");
    let agent = Subject {
        id: "agent-1",
        kind: PrincipalKind::Agent,
        operator: false,
    };
    let input = json!({"joints": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], "speed": 0.5});
    c.bench_function("decide/default", |b| {
        b.iter(|| default.decide(&agent, Action::Command, 1, 0, &input))
    });
    c.bench_function("decide/fifty", |b| {
        b.iter(|| big.decide(&agent, Action::Command, 1, 0, &input))
    });
    c.bench_function("decide/fifty_in_scope", |b| {
        b.iter(|| dense.decide(&agent, Action::Command, 1, 0, &input))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
