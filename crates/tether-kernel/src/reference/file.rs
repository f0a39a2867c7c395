//! The generated reference file of a device (`reference.json` and its
//! Markdown view). Built from the effective limits the kernel enforces, never
//! hand-written, deterministic for the same inputs.
//!
//! **Never belongs here:** deciding anything (it shows what the loader
//! resolved and the checks enforce; nothing reads it back to check).

use crate::loader::{BindingSpec, DeviceSpec};
use serde_json::{json, Map, Value};
use std::fmt::Write as _;
use tether_core::catalogue::{self, Verb};
use tether_core::manifest::DeviceManifest;

/// The effective-limits block of one binding (`x-mhs-effective-limits`).
pub fn effective_limits(b: &BindingSpec) -> Value {
    b.limits.to_json()
}

fn binding_entry(b: &BindingSpec) -> Value {
    json!({
        "capability_id": b.capability_id,
        "resource": b.resource,
        "verb": b.verb.as_str(),
        "declared_verb": b.declared_verb.map(Verb::as_str),
        "declared_flags": b.declared_flags.map(|f| json!({"stop_class": f.stop_class, "risk_reducing": f.risk_reducing, "safe_place": f.safe_place, "two_person": f.two_person})),
        "catalogued": b.catalogued,
        "risk": b.risk.as_str(),
        "flags": {"stop_class": b.flags.stop_class, "risk_reducing": b.flags.risk_reducing, "safe_place": b.flags.safe_place, "two_person": b.flags.two_person},
        "concurrency": b.concurrency.as_str(),
        "kind": b.kind.as_str(),
        "max_duration_ms": b.max_duration_ms,
        "abortable": b.abortable,
        "achieves_safe_state": b.achieves_safe_state,
        "description": b.description,
        "input_schema": b.served_schema,
        "x-mhs-effective-limits": effective_limits(b),
    })
}

/// The reference JSON of a device.
pub fn reference_json(spec: &DeviceSpec) -> Value {
    let m = &spec.manifest;
    let (mut measures, adjusts) = state_fields(spec);
    for b in &spec.bindings {
        if b.is_read() {
            measures.push(
                json!({"resource": b.resource, "capability_id": b.capability_id, "verb": "read"}),
            );
        }
    }
    let actions: Vec<Value> = spec
        .bindings
        .iter()
        .filter(|b| !b.is_read() && b.capability_id != catalogue::CONFIGURE)
        .map(binding_entry)
        .collect();
    let interlocks: Vec<Value> = m
        .interlocks
        .iter()
        .map(|i| json!({"id": i.id, "description": i.description, "source": format!("{:?}", i.source).to_lowercase(), "required_for": i.required_for, "reset_exempt": i.reset_exempt}))
        .collect();
    let operator_required: Vec<Value> = spec
        .bindings
        .iter()
        .flat_map(|b| {
            let unset: Vec<String> = b.limits.rules().iter().filter(|r| r.is_operator_required() && !r.is_filled()).map(|r| r.path().to_string()).collect();
            unset.into_iter().map(move |p| json!({"capability_id": b.capability_id, "resource": b.resource, "path": p}))
        })
        .collect();
    json!({
        "openmhs": "0.9",
        "generator": format!("tether {}", env!("CARGO_PKG_VERSION")),
        "device": {"device_id": m.device_id, "mode": m.mode.as_str(), "risk_class": m.risk_class.as_str(), "description": m.description, "driver": m.driver},
        "measures": measures,
        "adjusts": adjusts,
        "actions": actions,
        "bindings": spec.bindings.iter().map(binding_entry).collect::<Vec<_>>(),
        "safety": {
            "estop": {"latency_ms": m.safety.estop.latency_ms.unwrap_or(1000), "native": m.safety.estop.native.unwrap_or(true), "terminal": m.safety.estop.terminal, "reenable": m.safety.estop.reenable},
            "safe_state": m.safety.safe_state.as_ref().map(|s| json!({"description": s.description, "achieved_by": s.achieved_by})),
            "interlocks": interlocks,
            "watchdog_ms": m.safety.watchdog_ms,
            "operator_required": operator_required,
            "not_certified": true,
            "statement": tether_core::NOT_CERTIFIED,
        },
        "facts": m.facts.iter().map(|f| json!({"text": f.text, "source": f.source, "ref": f.reference})).collect::<Vec<_>>(),
        "tags": m.tags,
        "fidelity": m.fidelity.as_ref().map(|f| json!({"kind": f.kind, "notes": f.notes})),
        "overlay": {"applied": spec.overlay_applied},
        "provenance": {"manifest": spec.origin},
    })
}

/// The fields of each resource's state schema: a writable field of a
/// resource with a configure binding is an adjust (with the limits the
/// binding enforces on it), any other field a measure.
fn state_fields(spec: &DeviceSpec) -> (Vec<Value>, Vec<Value>) {
    let mut measures = Vec::new();
    let mut adjusts = Vec::new();
    for r in &spec.manifest.resources {
        let configure = spec
            .bindings
            .iter()
            .find(|b| b.capability_id == catalogue::CONFIGURE && b.resource == r.id);
        let props = r.state_schema.get("properties").and_then(Value::as_object);
        for (name, prop) in props.into_iter().flatten() {
            let read_only = prop.get("readOnly") == Some(&Value::Bool(true));
            let unit = prop
                .get("x-mhs-unit")
                .or_else(|| prop.get("items").and_then(|i| i.get("x-mhs-unit")));
            let mut entry = Map::new();
            entry.insert("resource".into(), json!(r.id));
            entry.insert("field".into(), json!(name));
            entry.insert("type".into(), json!(prop.get("type")));
            entry.insert("unit".into(), json!(unit));
            entry.insert("description".into(), json!(prop.get("description")));
            match configure {
                Some(c) if !read_only => adjusts.push(with_limits(entry, c, name)),
                _ => measures.push(Value::Object(entry)),
            }
        }
    }
    (measures, adjusts)
}

/// A writable field's entry with the limits configure binding `c` enforces
/// on field `name`: its own, those within it, and whether one is still
/// operator-required.
fn with_limits(mut e: Map<String, Value>, c: &BindingSpec, name: &str) -> Value {
    let limits = c.limits.to_json();
    let limit = limits.get("limits").and_then(|l| l.get(name)).cloned();
    // Limits on members or elements inside the field
    // (`cfg.gain`, `arr[*]`): enforced too, so shown too.
    let within: Map<String, Value> = limits
        .get("limits")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter(|(path, _)| is_within(path, name))
        .map(|(path, rule)| (path.clone(), rule.clone()))
        .collect();
    // Unset: deferred to the operator and no overlay filled it
    // (on the field or anything inside it).
    let operator_required = c.limits.rules().iter().any(|r| {
        let path = r.path().to_string();
        (path == *name || is_within(&path, name)) && r.is_operator_required() && !r.is_filled()
    });
    e.insert("limit".into(), limit.unwrap_or(Value::Null));
    e.insert("limits_within".into(), Value::Object(within));
    e.insert("operator_required".into(), json!(operator_required));
    Value::Object(e)
}

/// Whether limit path `path` addresses something inside field `name`
/// (`name.x`, `name[*]`, `name[2].y`).
fn is_within(path: &str, name: &str) -> bool {
    path.strip_prefix(name)
        .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
}

fn limit_line(path: &str, l: &Value) -> String {
    let mut s = format!("`{path}`");
    let unit = l
        .get("unit")
        .and_then(Value::as_str)
        .map(|u| format!(" {u}"))
        .unwrap_or_default();
    if let Some(min) = l.get("min").filter(|v| !v.is_null()) {
        let _ = write!(s, " min {min}{unit}");
    }
    if let Some(max) = l.get("max").filter(|v| !v.is_null()) {
        let _ = write!(s, " max {max}{unit}");
    }
    if let Some(a) = l.get("allowed").filter(|v| !v.is_null()) {
        let _ = write!(s, " allowed {a}");
    }
    if let Some(names) = l.get("names").and_then(Value::as_array) {
        let names: Vec<&str> = names.iter().filter_map(Value::as_str).collect();
        let _ = write!(s, " (elements: {})", names.join(", "));
    }
    if l.get("operator_required") == Some(&Value::Bool(true)) {
        if l.get("operator_filled") == Some(&Value::Bool(true)) {
            s.push_str(" operator_required (filled by the operator overlay)");
        } else {
            s.push_str(" operator_required: unset, calls that set it are refused until an operator overlay fills it (the bounds shown come from other sources)");
        }
    }
    if let Some(src) = l.get("sources").or_else(|| l.get("source")) {
        let _ = write!(s, " (source: {src})");
    }
    s
}

/// The Markdown view of the reference file (what `tether describe` prints).
pub fn reference_markdown(spec: &DeviceSpec) -> String {
    let r = reference_json(spec);
    let m = &spec.manifest;
    let mut out = String::new();
    markdown_header(&mut out, m);
    markdown_measures(&mut out, &r);
    markdown_adjusts(&mut out, &r);
    markdown_actions(&mut out, spec);
    markdown_safety(&mut out, m);
    out
}

/// The title, the not-certified statement, mode, risk, driver, fidelity and
/// description.
fn markdown_header(out: &mut String, m: &DeviceManifest) {
    let _ = writeln!(out, "# {} — reference\n", m.device_id);
    let _ = writeln!(out, "> {}\n", tether_core::NOT_CERTIFIED);
    let _ = writeln!(
        out,
        "- mode: **{}**, risk class: **{}**, driver: `{}`",
        m.mode.as_str(),
        m.risk_class,
        m.driver
    );
    if let Some(f) = &m.fidelity {
        let _ = writeln!(out, "- fidelity: {} — {}", f.kind, f.notes);
    }
    if !m.description.is_empty() {
        let _ = writeln!(out, "- {}", m.description);
    }
}

/// One line per measured field and per read binding of the reference JSON.
fn markdown_measures(out: &mut String, r: &Value) {
    let _ = writeln!(out, "\n## Measures\n");
    for x in r["measures"].as_array().into_iter().flatten() {
        match x.get("field") {
            Some(f) => {
                let _ = writeln!(
                    out,
                    "- `{}.{}` ({}){}",
                    x["resource"].as_str().unwrap_or(""),
                    f.as_str().unwrap_or(""),
                    x["type"].as_str().unwrap_or("-"),
                    x["unit"]
                        .as_str()
                        .map(|u| format!(" in {u}"))
                        .unwrap_or_default()
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "- `{}` on `{}` (read binding)",
                    x["capability_id"].as_str().unwrap_or(""),
                    x["resource"].as_str().unwrap_or("")
                );
            }
        }
    }
}

/// One line per writable field, with the limits on what it holds below it.
fn markdown_adjusts(out: &mut String, r: &Value) {
    let _ = writeln!(out, "\n## Adjusts (mhs.resource.write)\n");
    for x in r["adjusts"].as_array().into_iter().flatten() {
        let name = format!(
            "{}.{}",
            x["resource"].as_str().unwrap_or(""),
            x["field"].as_str().unwrap_or("")
        );
        let within = x
            .get("limits_within")
            .and_then(Value::as_object)
            .filter(|w| !w.is_empty());
        let _ = writeln!(out, "- {}", adjust_line(x, &name, within.is_some()));
        let resource = x["resource"].as_str().unwrap_or("");
        for (path, rule) in within.into_iter().flatten() {
            let _ = writeln!(
                out,
                "  - {}",
                limit_line(&format!("{resource}.{path}"), rule)
            );
        }
    }
}

/// The limit of writable field `name` (entry `x`): unset and refused until
/// an operator fills it, its own limit, only limits within, or none.
fn adjust_line(x: &Value, name: &str, has_within: bool) -> String {
    match x.get("limit").filter(|v| !v.is_null()) {
        _ if x["operator_required"] == json!(true)
            && x["operator_filled"] != json!(true)
            && !has_within =>
        {
            format!("`{name}` operator_required: refused until an operator overlay fills it")
        }
        Some(l) => limit_line(name, l),
        None if has_within => format!("`{name}`: limits on what it holds"),
        None => format!("`{name}` no limit"),
    }
}

/// A section per action binding (not a read, not configure).
fn markdown_actions(out: &mut String, spec: &DeviceSpec) {
    let _ = writeln!(out, "\n## Actions\n");
    for b in spec
        .bindings
        .iter()
        .filter(|b| !b.is_read() && b.capability_id != catalogue::CONFIGURE)
    {
        markdown_action(out, b);
    }
}

/// One action: capability, resource, risk, description and its limits.
fn markdown_action(out: &mut String, b: &BindingSpec) {
    let _ = writeln!(
        out,
        "### `{}` on `{}` — risk {}{}\n",
        b.capability_id,
        b.resource,
        b.risk,
        if b.is_stop() { ", stop class" } else { "" }
    );
    if !b.description.is_empty() {
        let _ = writeln!(out, "{}\n", b.description);
    }
    let l = b.limits.to_json();
    let mut any = false;
    if let Some(map) = l.get("limits").and_then(Value::as_object) {
        for (path, rule) in map {
            any = true;
            let _ = writeln!(out, "- {}", limit_line(path, rule));
        }
    }
    if let Some(c) = l.get("cumulative").and_then(Value::as_array) {
        for rule in c {
            any = true;
            let _ = writeln!(out, "- cumulative: {rule}");
        }
    }
    if !any {
        let _ = writeln!(out, "- no numeric limits");
    }
    let _ = writeln!(out);
}

/// The e-stop budget, the safe state, the interlocks and the not-certified
/// reminder.
fn markdown_safety(out: &mut String, m: &DeviceManifest) {
    let _ = writeln!(out, "## Safety\n");
    let _ = writeln!(
        out,
        "- e-stop budget: {} ms",
        m.safety.estop.latency_ms.unwrap_or(1000)
    );
    if let Some(s) = &m.safety.safe_state {
        let _ = writeln!(
            out,
            "- safe state: {} (achieved by: {})",
            s.description,
            s.achieved_by.join(", ")
        );
    }
    for i in &m.interlocks {
        let _ = writeln!(
            out,
            "- interlock `{}`: {} (gates: {})",
            i.id,
            i.description,
            i.required_for
                .as_ref()
                .map_or_else(|| "nothing, informative".into(), |r| r.join(", "))
        );
    }
    let _ = writeln!(out, "- not certified: Tether enforces a software envelope; keep an independent hardware e-stop.");
}
