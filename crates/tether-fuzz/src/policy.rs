//! The Cedar policy loader (`tether_kernel::policy::check_policy`, which
//! `tether check` and start-up use) on the built-in cell, and `decide` on
//! every request shape of a policy that loads.
//!
//! An input is the policy text.
//!
//! Invariants:
//! - Tether never loads text Cedar itself refuses to parse;
//! - a loaded policy decides every (principal kind, operator role, action,
//!   device, binding) without panicking, the same way twice, and the same
//!   through `decide` and `decide_shared` (with the same evidence JSON);
//! - a hold needs at least one approver; an allow names the permits that
//!   allowed it.

use serde_json::{json, Value};
use std::str::FromStr;
use std::sync::OnceLock;
use tether_kernel::loader::Cell;
use tether_policy::{Action, Decision, PrincipalKind, Subject};

fn builtin() -> Option<&'static Cell> {
    static CELL: OnceLock<Option<Cell>> = OnceLock::new();
    CELL.get_or_init(|| tether_kernel::loader::load(&tether_drivers::builtin_cell(), None).ok())
        .as_ref()
}

/// Runs the target on one input.
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let cell = builtin();
    assert!(cell.is_some(), "the built-in cell does not load");
    let Some(cell) = cell else { return };
    let Ok(policy) = tether_kernel::policy::check_policy(cell, Some(("fuzz.cedar", text))) else {
        return;
    };
    assert!(
        cedar_policy::PolicySet::from_str(text).is_ok(),
        "Tether loaded a policy Cedar does not parse"
    );
    let inputs = [json!({}), json!({"target_temperature": 30}), Value::Null];
    let kinds = [
        PrincipalKind::Agent,
        PrincipalKind::Human,
        PrincipalKind::Service,
    ];
    let actions = [Action::Read, Action::Write, Action::Command];
    for (d, dev) in cell.devices.iter().enumerate() {
        // One past the last binding: an unknown binding must deny.
        for b in 0..=dev.bindings.len() {
            for kind in kinds {
                for operator in [false, true] {
                    for action in actions {
                        let who = Subject {
                            id: "fuzz",
                            kind,
                            operator,
                        };
                        for input in &inputs {
                            judge(&policy, &who, action, d, b, input, b == dev.bindings.len());
                        }
                    }
                }
            }
        }
    }
}

fn judge(
    policy: &tether_policy::ControlPolicy,
    who: &Subject<'_>,
    action: Action,
    d: usize,
    b: usize,
    input: &Value,
    unknown: bool,
) {
    let v = policy.decide(who, action, d, b, input);
    assert_eq!(
        v,
        policy.decide(who, action, d, b, input),
        "decide is not a function"
    );
    let (shared, json) = policy.decide_shared(who, action, d, b, input);
    assert_eq!(*shared, v, "decide_shared differs from decide");
    assert_eq!(*json, v.to_json(), "the shared evidence JSON differs");
    if unknown {
        assert_eq!(
            v.decision,
            Decision::Deny,
            "an unknown binding was not denied"
        );
    }
    match v.decision {
        Decision::Hold => assert!(v.quorum >= 1, "a hold with no approver: {v:?}"),
        Decision::Allow => assert!(!v.policies.is_empty(), "an allow names no permit: {v:?}"),
        Decision::Deny => {}
    }
}
