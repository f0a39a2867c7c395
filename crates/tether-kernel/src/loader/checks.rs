//! The checks of one device that look across its bindings or at the
//! manifest as a whole: the safety envelope (keys and paths), the safety
//! block (safe state, e-stop latency, terminal stop, re-enable), facts
//! (CORE-032), interlocks, and the units a schema names.
//!
//! A check reports every defect it finds to the manifest's [`Ctx`] and
//! decides nothing else; a defect keeps the cell from loading.
//!
//! **Never belongs here:** resolving a binding (-> `binding`), per-request
//! checks of the evaluation order (-> `crate::check`).

use super::schema::SCHEMA_DEPTH_MAX;
use super::{BindingSpec, Ctx};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use tether_core::catalogue;
use tether_core::manifest::DeviceManifest;
use tether_limits::SourceKind;

/// Each `safety.envelope` key is a capability id or pattern that matches a
/// bound capability, and each of its paths resolves in at least one of the
/// resolved bindings it matches.
pub(super) fn check_envelope(ctx: &mut Ctx<'_>, m: &DeviceManifest, bindings: &[BindingSpec]) {
    for (key, rules) in &m.safety.envelope {
        let field = format!("safety.envelope.\"{key}\"");
        let valid = catalogue::is_catalogue_id(key)
            || catalogue::is_extension_id(key)
            || catalogue::is_capability_pattern(key);
        if !valid {
            ctx.defect(&field, "envelope keys are capability ids or patterns (cap.*, cap.<class>.*) [envelope-key-invalid]");
            continue;
        }
        // Against the declared bindings: one whose limits failed (perhaps
        // because of this very envelope) is still bound, and its own
        // defects are already reported.
        let declared = m
            .bindings
            .iter()
            .any(|d| catalogue::key_matches(key, &d.capability_id));
        if !declared {
            ctx.defect(
                &field,
                "the envelope key matches no bound capability [envelope-unbound]",
            );
            continue;
        }
        let matched: Vec<&BindingSpec> = bindings
            .iter()
            .filter(|b| catalogue::key_matches(key, &b.capability_id))
            .collect();
        if matched.is_empty() {
            continue;
        }
        for path in rules.keys() {
            let resolved_somewhere = matched.iter().any(|b| {
                !b.limits
                    .unresolved()
                    .iter()
                    .any(|(kind, p)| matches!(kind, SourceKind::Envelope { .. }) && p == path)
            });
            if !resolved_somewhere {
                ctx.defect(
                    format!("{field}.{path}"),
                    "the envelope path resolves in none of the bindings it matches",
                );
            }
        }
    }
}

/// The safety block: every safe-state action is bound, the e-stop latency is
/// 1..=60000 ms, a terminal stop has a stop path and no re-enable, and a
/// re-enable is one plain action that accepts an empty input.
pub(super) fn check_safety(ctx: &mut Ctx<'_>, m: &DeviceManifest, bindings: &[BindingSpec]) {
    let bound = |id: &str| bindings.iter().filter(|b| b.capability_id == id).count();
    if let Some(ss) = &m.safety.safe_state {
        for (i, a) in ss.achieved_by.iter().enumerate() {
            if bound(a) == 0 {
                ctx.defect(
                    format!("safety.safe_state.achieved_by[{i}]"),
                    format!("`{a}` is not bound on this device"),
                );
            }
        }
    }
    let estop = &m.safety.estop;
    if let Some(ms) = estop.latency_ms {
        if ms == 0 || ms > 60_000 {
            ctx.defect("safety.estop.latency_ms", "must be between 1 and 60000 ms");
        }
    }
    if estop.terminal.is_some() && estop.reenable.is_some() {
        ctx.defect("safety.estop", "a terminal stop excludes a re-enable");
    }
    if estop.terminal.is_some() {
        let has_path = estop.native.unwrap_or(true)
            || bound(catalogue::ESTOP) > 0
            || m.safety
                .safe_state
                .as_ref()
                .is_some_and(|s| !s.achieved_by.is_empty());
        if !has_path {
            ctx.defect(
                "safety.estop.terminal",
                "a terminal stop needs a stop path (native, a bound e-stop or a safe-state action)",
            );
        }
    }
    if let Some(re) = &estop.reenable {
        let count = bound(re);
        let b = bindings.iter().find(|b| &b.capability_id == re);
        let bad = count != 1
            || b.is_some_and(|b| {
                b.is_read()
                    || b.is_stop()
                    || b.achieves_safe_state
                    || b.limits.check(&json!({})).is_err()
                    || !accepts_empty_input(b)
            });
        if bad {
            ctx.defect("safety.estop.reenable", format!("`{re}` must be bound to exactly one resource, accept an empty input, and be no read, stop class or safe-state action"));
        }
    }
}

/// OpenMHS CORE-032: a fact has a text, a source (`vendor_doc`,
/// `upstream_code`, `operator` or `interview`) and, for the first two, a ref
/// `path/in/clone:LINE`; a statement without them is not a fact and is not
/// published as one.
pub(super) fn check_facts(ctx: &mut Ctx<'_>, m: &DeviceManifest) {
    for (i, f) in m.facts.iter().enumerate() {
        let at = |what: &str| format!("facts[{i}].{what}");
        if f.text.trim().is_empty() {
            ctx.defect(at("text"), "a fact needs a statement");
        }
        let needs_ref = match f.source.as_str() {
            "vendor_doc" | "upstream_code" => true,
            "operator" | "interview" => false,
            other => {
                ctx.defect(
                    at("source"),
                    format!("`{other}` is not a source: vendor_doc, upstream_code, operator or interview"),
                );
                false
            }
        };
        match &f.reference {
            None if needs_ref => ctx.defect(
                at("ref"),
                format!("a {} fact needs a ref path/in/clone:LINE", f.source),
            ),
            Some(r) if !tether_limits::rule::is_source_ref(r) => ctx.defect(
                at("ref"),
                format!("ref `{r}` must have the form path/in/clone:LINE"),
            ),
            _ => {}
        }
    }
}

/// Whether `{}` is valid against the binding's served schema and its
/// class schema (a schema that does not compile accepts nothing).
fn accepts_empty_input(b: &BindingSpec) -> bool {
    let empty = json!({});
    std::iter::once(&b.served_schema)
        .chain(b.class_schema.as_ref())
        .all(|schema| crate::kernel::compile(schema).is_ok_and(|v| v.is_valid(&empty)))
}

/// Interlock ids are unique, and a `required_for` names at least one
/// capability id or pattern, each well formed.
pub(super) fn check_interlocks(ctx: &mut Ctx<'_>, m: &DeviceManifest) {
    let mut ids = BTreeSet::new();
    for (i, il) in m.interlocks.iter().enumerate() {
        if !ids.insert(il.id.clone()) {
            ctx.defect(
                format!("interlocks[{i}].id"),
                format!("interlock `{}` declared twice", il.id),
            );
        }
        if let Some(req) = &il.required_for {
            if req.is_empty() {
                ctx.defect(format!("interlocks[{i}].required_for"), "when present it must name at least one capability id or pattern; omit it for an informative interlock");
            }
            for (j, key) in req.iter().enumerate() {
                let ok = catalogue::is_catalogue_id(key)
                    || catalogue::is_extension_id(key)
                    || catalogue::is_capability_pattern(key);
                if !ok {
                    ctx.defect(
                        format!("interlocks[{i}].required_for[{j}]"),
                        format!("`{key}` is no capability id or pattern"),
                    );
                }
            }
        }
    }
}

/// Every `x-mhs-unit` must name a unit of the units table, so limits are
/// always compared in a unit Tether can convert. A schema nested deeper than
/// [`SCHEMA_DEPTH_MAX`] is a defect (and is walked no further).
pub(super) fn check_units(ctx: &mut Ctx<'_>, field: &str, schema: &Value, depth: usize) {
    if depth > SCHEMA_DEPTH_MAX {
        ctx.defect(
            field,
            format!("schema nesting is deeper than {SCHEMA_DEPTH_MAX} levels"),
        );
        return;
    }
    match schema {
        Value::Object(map) => {
            for (k, v) in map {
                if k == "x-mhs-unit" {
                    match v.as_str() {
                        Some(u) if tether_limits::units::is_known(u) => {}
                        Some(u) => ctx.defect(
                            format!("{field}.x-mhs-unit"),
                            format!(
                                "unknown unit `{u}`; see docs/MANIFESTS.md for the units table"
                            ),
                        ),
                        None => {
                            ctx.defect(format!("{field}.x-mhs-unit"), "x-mhs-unit must be a string")
                        }
                    }
                } else {
                    check_units(ctx, &format!("{field}.{k}"), v, depth + 1);
                }
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                check_units(ctx, &format!("{field}[{i}]"), v, depth + 1);
            }
        }
        _ => {}
    }
}
