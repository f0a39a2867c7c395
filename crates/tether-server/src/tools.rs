//! The tool catalogue shared by the agent-facing surfaces (MCP and the REST
//! tool gateway): one tool per binding, named predictably, plus the e-stop.
//!
//! Naming rule (documented in docs/MCP.md): `{device_id}__{short}` where
//! `short` is the capability class id without its `cap.` / `x-cap.` prefix and
//! `.vN` suffix, last dotted segment only (`cap.thermal.setpoint.v1` →
//! `setpoint`). When two bindings of one device share a short name, the
//! resource is appended: `{device_id}__{short}_{resource}`. The e-stop tool is
//! named `estop` and is always listed. Characters of a device id outside
//! `A–Z a–z 0–9 _ . -` (`/`, `:`) become `_` in a tool name, and a name two
//! devices would share gets `_2`, `_3`, ... on the later ones.
//!
//! A tool is a description; calling one goes through the kernel like any
//! other request. Reset, permit, safe-place grant and approval routes are
//! never tools: a model may not reach them.

use serde_json::{json, Value};
use tether_core::catalogue;
use tether_kernel::Kernel;

/// Name of the always-listed e-stop tool.
pub const ESTOP_TOOL: &str = "estop";

/// Longest `reason` the e-stop tool's input schema advertises, in characters.
pub(crate) const ESTOP_REASON_CHARS_MAX: usize = 512;

/// What a tool does, which decides how surfaces annotate and answer it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolKind {
    /// A catalogued read binding (`mhs.resource.read` semantics).
    Read,
    /// A write (`cap.device.configure.v1`, a patch of the resource state).
    Write,
    /// An action (`mhs.command`).
    Action,
    /// The e-stop tool.
    Estop,
}

impl ToolKind {
    /// Stable wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Action => "action",
            Self::Estop => "estop",
        }
    }
}

/// One tool.
#[derive(Clone, Debug)]
pub struct Tool {
    /// Tool name (see the module doc for the rule).
    pub name: String,
    /// Read, write, action or e-stop.
    pub kind: ToolKind,
    /// The device, absent for the e-stop tool (which covers every device).
    pub device_id: Option<String>,
    /// Capability class id.
    pub capability_id: String,
    /// Resource the binding acts on (empty for the e-stop tool).
    pub resource: String,
    /// Device mode (`simulated`, `hardware`, ...).
    pub mode: String,
    /// The binding's risk (`R0`..`R3`).
    pub risk: String,
    /// The device's risk class (`R0`..`R3`, the manifest's `risk_class`);
    /// `R0` for the e-stop tool, which covers every device.
    pub risk_class: String,
    /// Whether repeating the same input has no further effect.
    pub idempotent: bool,
    /// The input schema the binding serves (what the kernel checks).
    pub input_schema: Value,
    /// Human-readable description with effective limits, units, mode and risk.
    pub description: String,
    /// The binding's effective limits block (`x-mhs-effective-limits`).
    pub effective_limits: Value,
    /// Whether a cancel reaches a running call (`false` for a binding
    /// declared `abortable = false`, and for the e-stop tool).
    pub abortable: bool,
}

impl Tool {
    /// JSON view used by the REST gateway and documentation.
    pub fn to_json(&self) -> Value {
        json!({
            "tool_id": self.name,
            "kind": self.kind.as_str(),
            "device_id": self.device_id,
            "capability_id": self.capability_id,
            "resource": self.resource,
            "mode": self.mode,
            "risk": self.risk,
            "risk_class": self.risk_class,
            "idempotent": self.idempotent,
            "read_only": self.kind == ToolKind::Read,
            "destructive": matches!(self.kind, ToolKind::Write | ToolKind::Action | ToolKind::Estop),
            "description": self.description,
            "input_schema": self.input_schema,
            "effective_limits": self.effective_limits,
        })
    }
}

/// The short name of a capability class id (`cap.motion.move_to.v1` → `move_to`).
pub fn short_name(capability_id: &str) -> String {
    let trimmed = capability_id
        .strip_prefix("x-cap.")
        .or_else(|| capability_id.strip_prefix("cap."))
        .unwrap_or(capability_id);
    let mut segments: Vec<&str> = trimmed.split('.').filter(|s| !s.is_empty()).collect();
    let versioned = segments.last().is_some_and(|s| {
        s.len() > 1 && s.starts_with('v') && s[1..].bytes().all(|b| b.is_ascii_digit())
    });
    if versioned && segments.len() > 1 {
        segments.pop();
    }
    let last = segments.last().copied().unwrap_or("tool");
    last.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Every tool the endpoint offers, in a stable order: the e-stop first, then
/// devices and bindings in manifest order.
pub fn catalogue(kernel: &Kernel) -> Vec<Tool> {
    let mut tools = vec![estop_tool()];
    for device_id in kernel.device_ids() {
        let Ok(got) = kernel.device_reference(&device_id) else {
            continue;
        };
        tools.extend(device_tools(&device_id, &got));
    }
    make_names_unique(&mut tools);
    tools
}

/// A device id as it may appear in a tool name: MCP tool names are
/// `[A-Za-z0-9_.-]` (clients refuse others) and REST puts them in a path, so
/// every other character (`/`, `:`) becomes `_`.
fn tool_safe(device_id: &str) -> String {
    device_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Two devices whose ids differ only where `tool_safe` replaced characters
/// would give two tools one name: the later ones get `_2`, `_3`, ...
fn make_names_unique(tools: &mut [Tool]) {
    let mut seen = std::collections::HashSet::new();
    for t in tools.iter_mut() {
        if seen.insert(t.name.clone()) {
            continue;
        }
        // Bounded by the number of tools: some suffix up to it is free.
        let limit = seen.len() + 2;
        for n in 2..=limit {
            let candidate = format!("{}_{n}", t.name);
            if seen.insert(candidate.clone()) {
                t.name = candidate;
                break;
            }
        }
    }
}

/// Finds a tool by name.
pub fn find(kernel: &Kernel, name: &str) -> Option<Tool> {
    catalogue(kernel).into_iter().find(|t| t.name == name)
}

fn estop_tool() -> Tool {
    Tool {
        name: ESTOP_TOOL.to_owned(),
        kind: ToolKind::Estop,
        device_id: None,
        capability_id: catalogue::ESTOP.to_owned(),
        resource: String::new(),
        mode: "any".to_owned(),
        risk: "R0".to_owned(),
        risk_class: "R0".to_owned(),
        idempotent: true,
        input_schema: json!({
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "device_id": {"type": "string", "description": "One device; omit to stop every device."},
                "reason": {"type": "string", "maxLength": ESTOP_REASON_CHARS_MAX},
            },
        }),
        description: format!(
            "Emergency stop (software). Latches the named device, or every device when none is named: \
             operations are cancelled and the stop path runs; nothing moves until an operator resets. \
             Always available, never held. {}",
            tether_core::NOT_CERTIFIED
        ),
        effective_limits: Value::Null,
        abortable: false,
    }
}

/// The tools of one device, from what [`Kernel::device_reference`] answers.
fn device_tools(device_id: &str, got: &Value) -> Vec<Tool> {
    let mode = got["mode"].as_str().unwrap_or("unknown").to_owned();
    // Unknown reads as the highest class: a description never understates.
    let risk_class = got["risk_class"].as_str().unwrap_or("R3").to_owned();
    let bindings = got["reference"]["bindings"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let shorts: Vec<String> = bindings
        .iter()
        .map(|b| short_name(b["capability_id"].as_str().unwrap_or_default()))
        .collect();
    let mut tools = Vec::with_capacity(bindings.len());
    for (i, b) in bindings.iter().enumerate() {
        // The e-stop class is served by the `estop` tool, never per binding.
        let capability_id = b["capability_id"].as_str().unwrap_or_default().to_owned();
        if capability_id == catalogue::ESTOP {
            continue;
        }
        let resource = b["resource"].as_str().unwrap_or_default().to_owned();
        let clash = shorts.iter().filter(|s| **s == shorts[i]).count() > 1;
        let device_part = tool_safe(device_id);
        let name = if clash {
            format!("{device_part}__{}_{}", shorts[i], tool_safe(&resource))
        } else {
            format!("{device_part}__{}", shorts[i])
        };
        let kind = match b["verb"].as_str() {
            Some("read") => ToolKind::Read,
            _ if capability_id == catalogue::CONFIGURE => ToolKind::Write,
            _ => ToolKind::Action,
        };
        let risk = b["risk"].as_str().unwrap_or("R3").to_owned();
        let idempotent = kind == ToolKind::Read
            || kind == ToolKind::Write
            || b["flags"]["stop_class"] == json!(true)
            || b["flags"]["safe_place"] == json!(true);
        let effective_limits = b["x-mhs-effective-limits"].clone();
        let description = describe(
            &Subject {
                device_id,
                mode: &mode,
                risk_class: &risk_class,
                risk: &risk,
            },
            kind,
            b,
            &effective_limits,
        );
        tools.push(Tool {
            name,
            kind,
            device_id: Some(device_id.to_owned()),
            capability_id,
            resource,
            mode: mode.clone(),
            risk,
            risk_class: risk_class.clone(),
            idempotent,
            input_schema: input_schema(kind, b),
            description,
            effective_limits,
            // Unknown reads as abortable: the kernel decides either way.
            abortable: b["abortable"].as_bool().unwrap_or(true),
        });
    }
    tools
}

fn input_schema(kind: ToolKind, b: &Value) -> Value {
    match kind {
        ToolKind::Read => {
            json!({"type": "object", "additionalProperties": false, "properties": {}})
        }
        _ => {
            let s = &b["input_schema"];
            if s.is_object() {
                s.clone()
            } else {
                json!({"type": "object"})
            }
        }
    }
}

/// Whose tool a description is about: the device (its mode and risk class)
/// and the binding's own risk, each labelled as what it is.
struct Subject<'a> {
    device_id: &'a str,
    mode: &'a str,
    risk_class: &'a str,
    risk: &'a str,
}

fn describe(who: &Subject<'_>, kind: ToolKind, b: &Value, limits: &Value) -> String {
    let what = b["description"]
        .as_str()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .unwrap_or_else(|| {
            format!(
                "{} `{}` on resource `{}`",
                kind.as_str(),
                b["capability_id"].as_str().unwrap_or_default(),
                b["resource"].as_str().unwrap_or_default()
            )
        });
    // Class descriptions are sentences that end in a period already.
    let what = what.trim_end_matches('.');
    let mut out = format!(
        "{what}. Device `{}`, mode {}, risk class {}; this binding's risk {}.",
        who.device_id, who.mode, who.risk_class, who.risk
    );
    let lines = limit_lines(limits);
    if !lines.is_empty() {
        out.push_str(" Limits: ");
        out.push_str(&lines.join("; "));
        out.push('.');
    }
    if kind != ToolKind::Read {
        out.push_str(" Out-of-limit input is refused, never clamped.");
    }
    out
}

fn limit_lines(limits: &Value) -> Vec<String> {
    let Some(map) = limits.get("limits").and_then(Value::as_object) else {
        return Vec::new();
    };
    let mut lines: Vec<String> = map
        .iter()
        .map(|(path, l)| {
            // Deferred to the operator and not filled: whatever other sources
            // bound, the kernel refuses any call that sets it
            // (MHS.SAFETY.LIMITS_UNSET), so no bound is shown as if in force.
            if l.get("operator_required") == Some(&Value::Bool(true))
                && l.get("operator_filled") != Some(&Value::Bool(true))
            {
                return format!(
                    "`{path}` unset (operator_required, no operator bound given): calls that set it are refused"
                );
            }
            let unit = l.get("unit").and_then(Value::as_str).unwrap_or("");
            let mut parts = vec![format!("`{path}`")];
            let bound = |key: &str| l.get(key).filter(|v| !v.is_null());
            if let Some(min) = bound("min") {
                parts.push(format!("min {}{}", number(min), sp(unit)));
            }
            if let Some(max) = bound("max") {
                parts.push(format!("max {}{}", number(max), sp(unit)));
            }
            if let Some(a) = bound("allowed") {
                parts.push(format!("allowed {}", number(a)));
            }
            if let Some(per) = bound("per") {
                parts.push(format!("per {per}"));
            }
            parts.join(" ")
        })
        .collect();
    // Cumulative budgets: what the calls together may add up to.
    for b in limits
        .get("cumulative")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let (Some(path), Some(max), Some(per)) = (
            b.get("path").and_then(Value::as_str),
            b.get("max"),
            b.get("per").and_then(Value::as_str),
        ) else {
            continue;
        };
        let unit = b.get("unit").and_then(Value::as_str).unwrap_or("");
        lines.push(format!(
            "`{path}` cumulative at most {}{} per {per}",
            number(max),
            sp(unit)
        ));
    }
    lines
}

/// A bound as text: integral numbers without a fraction (`3`, not `3.0`),
/// element-wise for per-element bounds.
fn number(v: &Value) -> String {
    match v {
        Value::Number(n) => match n.as_f64() {
            // Exact below 2^53; larger values keep their own form.
            Some(f) if f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 => {
                format!("{}", f as i64)
            }
            _ => n.to_string(),
        },
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(number).collect();
            format!("[{}]", inner.join(", "))
        }
        other => other.to_string(),
    }
}

fn sp(unit: &str) -> String {
    if unit.is_empty() {
        String::new()
    } else {
        format!(" {unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::{
        describe, estop_tool, limit_lines, make_names_unique, number, short_name, tool_safe,
        Subject, ToolKind,
    };
    use serde_json::json;

    #[test]
    fn tool_names_keep_to_the_mcp_alphabet_and_stay_unique() {
        assert_eq!(tool_safe("lab/oven:2"), "lab_oven_2");
        assert_eq!(tool_safe("arm-1.b_2"), "arm-1.b_2");
        let mut tools = vec![estop_tool(), estop_tool(), estop_tool()];
        for (t, name) in tools.iter_mut().zip(["a__x", "a__x", "a__x_2"]) {
            t.name = name.to_owned();
        }
        make_names_unique(&mut tools);
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a__x", "a__x_2", "a__x_2_2"]);
    }

    #[test]
    fn short_names_drop_prefix_and_version() {
        assert_eq!(short_name("cap.thermal.setpoint.v1"), "setpoint");
        assert_eq!(short_name("cap.motion.move_to.v1"), "move_to");
        assert_eq!(short_name("x-cap.lab.pipette.v12"), "pipette");
        assert_eq!(short_name("x-cap.weird name"), "weird_name");
        assert_eq!(short_name("cap.io.v2.relay"), "relay");
    }

    #[test]
    fn integral_bounds_print_as_integers() {
        assert_eq!(number(&json!(3.0)), "3");
        assert_eq!(number(&json!(-0.0)), "0");
        assert_eq!(number(&json!(2.5)), "2.5");
        assert_eq!(number(&json!([0.0, 1.5])), "[0, 1.5]");
        assert_eq!(number(&json!(1e300)), "1e+300");
        let lines = limit_lines(
            &json!({"limits": {"n": {"min": 0.0, "max": 3.0, "operator_required": false}}}),
        );
        assert_eq!(lines, vec!["`n` min 0 max 3"]);
    }

    #[test]
    fn an_unset_operator_required_limit_says_calls_are_refused() {
        let lines = limit_lines(&json!({"limits": {"n": {"operator_required": true}}}));
        assert_eq!(lines.len(), 1);
        assert!(lines[0].starts_with("`n` unset"), "{}", lines[0]);
        assert!(lines[0].contains("refused"), "{}", lines[0]);
        // Filled by an overlay: just the bound.
        let filled = limit_lines(
            &json!({"limits": {"n": {"max": 2.0, "operator_required": true, "operator_filled": true}}}),
        );
        assert_eq!(filled, vec!["`n` max 2"]);
        // Bounds from the class do not count: until an operator gives one,
        // calls are refused, and the line says so.
        let class_only = limit_lines(
            &json!({"limits": {"n": {"min": -1.0, "max": 9.0, "operator_required": true, "operator_filled": false}}}),
        );
        assert_eq!(class_only.len(), 1);
        assert!(class_only[0].contains("unset"), "{class_only:?}");
        assert!(!class_only[0].contains("max 9"), "{class_only:?}");
        let budget = limit_lines(
            &json!({"limits": {}, "cumulative": [{"path": "v", "max": 100.0, "per": "rolling_1h", "unit": "degC"}]}),
        );
        assert_eq!(
            budget,
            vec!["`v` cumulative at most 100 degC per rolling_1h"]
        );
    }

    #[test]
    fn descriptions_label_the_device_risk_class_and_the_binding_risk() {
        let who = Subject {
            device_id: "arm-1",
            mode: "simulated",
            risk_class: "R2",
            risk: "R0",
        };
        let b = json!({"description": "Stops the arm."});
        let d = describe(&who, ToolKind::Action, &b, &json!(null));
        assert!(
            d.starts_with(
                "Stops the arm. Device `arm-1`, mode simulated, risk class R2; this binding's risk R0."
            ),
            "{d}"
        );
        assert!(!d.contains(".."), "{d}");
    }
}
