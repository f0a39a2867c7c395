//! Loading a cell: manifests + operator overlay -> resolved devices.
//!
//! Every defect is collected (not just the first) and reported with the file,
//! the device and the field, so `tether check` can print them all and
//! `tether serve` refuses to start with a message a plant engineer can act on.

use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use tether_core::catalogue::{self, Flags, Verb};
use tether_core::manifest::{self, Concurrency, DeviceManifest, Mode, RiskClass};
use tether_limits::{EffectiveLimits, SourceKind, SourceRules};

/// A manifest's text and where it came from.
#[derive(Clone, Debug)]
pub struct ManifestSource {
    /// File path or `builtin:<name>`.
    pub origin: String,
    /// The text.
    pub text: String,
}

/// The operator overlay (`site-limits.json`) and where it came from.
#[derive(Clone, Debug)]
pub struct OverlaySource {
    /// File path.
    pub origin: String,
    /// The text.
    pub text: String,
}

/// One load defect: file, device, field, message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Defect {
    /// File (or `builtin:...`).
    pub file: String,
    /// Device id, or `-` when the device is not known yet.
    pub device: String,
    /// The field path inside the manifest (e.g. `bindings[2].limits.speed`).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Defect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: device `{}`: {}: {}",
            self.file, self.device, self.field, self.message
        )
    }
}

/// A binding after resolution against the catalogue and the limits engine.
#[derive(Debug)]
pub struct BindingSpec {
    /// Capability id.
    pub capability_id: String,
    /// Resource id.
    pub resource: String,
    /// The trusted verb: the catalogue's, or `Action` for an extension.
    pub verb: Verb,
    /// The trusted flags: the catalogue's, or none for an extension.
    pub flags: Flags,
    /// Declared verb of an extension (shown, never trusted).
    pub declared_verb: Option<Verb>,
    /// Declared flags of an extension (shown; only `two_person` is honoured).
    pub declared_flags: Option<Flags>,
    /// Whether the class is catalogued.
    pub catalogued: bool,
    /// Effective risk: max(class floor, binding risk, device risk) (CORE-030).
    pub risk: RiskClass,
    /// The served input schema (binding merged over class), with bounds.
    pub served_schema: Value,
    /// The class schema, checked too so a binding can never widen it.
    pub class_schema: Option<Value>,
    /// Output schema.
    pub output_schema: Value,
    /// Effective limits.
    pub limits: EffectiveLimits,
    /// Driver target.
    pub target: String,
    /// Concurrency.
    pub concurrency: Concurrency,
    /// Longest run, ms.
    pub max_duration_ms: Option<u64>,
    /// A `safe_state.achieved_by` action.
    pub achieves_safe_state: bool,
    /// For people.
    pub description: String,
}

impl BindingSpec {
    /// A stop class (trusted flag).
    pub fn is_stop(&self) -> bool {
        self.flags.stop_class
    }
    /// A catalogued read (the only reads the latch exempts).
    pub fn is_read(&self) -> bool {
        self.catalogued && self.verb == Verb::Read
    }
}

/// A device after loading.
#[derive(Debug)]
pub struct DeviceSpec {
    /// The manifest as written.
    pub manifest: DeviceManifest,
    /// Where it came from.
    pub origin: String,
    /// Resolved bindings, in manifest order.
    pub bindings: Vec<BindingSpec>,
    /// Whether an overlay narrowed or filled any bound of this device.
    pub overlay_applied: bool,
}

/// A loaded cell.
#[derive(Debug, Default)]
pub struct Cell {
    /// Devices in load order.
    pub devices: Vec<DeviceSpec>,
    /// Overlay origin, when one was given.
    pub overlay_origin: Option<String>,
}

struct Ctx<'a> {
    file: &'a str,
    device: String,
    defects: Vec<Defect>,
}

impl Ctx<'_> {
    fn defect(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.defects.push(Defect {
            file: self.file.to_owned(),
            device: self.device.clone(),
            field: field.into(),
            message: message.into(),
        });
    }
}

/// Parses manifest text as TOML, or JSON when the origin ends in `.json`.
fn parse_manifest(src: &ManifestSource) -> Result<DeviceManifest, String> {
    let mut m = if src.origin.ends_with(".json") {
        manifest::from_json(&src.text)
    } else {
        manifest::from_toml(&src.text)
    }?;
    for r in &mut m.resources {
        tuple_items_as_prefix_items(&mut r.state_schema);
    }
    for b in &mut m.bindings {
        for schema in [&mut b.input_schema, &mut b.output_schema]
            .into_iter()
            .flatten()
        {
            tuple_items_as_prefix_items(schema);
        }
    }
    Ok(m)
}

/// The `device_id` of a manifest the strict reading refused (an unknown
/// field, a duplicate key), read the permissive way so the defect can name
/// the device; `None` when even that fails.
fn loosely_read_device_id(src: &ManifestSource) -> Option<String> {
    manifest::device_id_of(&src.text, src.origin.ends_with(".json"))
}

/// Deepest nesting [`tuple_items_as_prefix_items`] rewrites; deeper schemas
/// are left as written (and refused by the compile check if they need it).
const TUPLE_REWRITE_DEPTH_MAX: usize = 64;

/// Manifests may write a tuple the draft-07 way (`items: [..]`, the rest in
/// `additionalItems`). A schema that names no `$schema` is read as draft
/// 2020-12, where that form is `prefixItems` (and `items` for the rest), so
/// it is rewritten at load: the limits engine, the write checks and the
/// validator then all read one form. A schema that names its draft is left
/// to that draft.
fn tuple_items_as_prefix_items(schema: &mut Value) {
    if schema.get("$schema").is_some() {
        return;
    }
    rewrite_tuples(schema, 0);
}

fn rewrite_tuples(node: &mut Value, depth: usize) {
    if depth >= TUPLE_REWRITE_DEPTH_MAX {
        return;
    }
    match node {
        Value::Object(members) => {
            if members.get("items").is_some_and(Value::is_array)
                && !members.contains_key("prefixItems")
            {
                if let Some(tuple) = members.remove("items") {
                    members.insert("prefixItems".into(), tuple);
                }
                if let Some(rest) = members.remove("additionalItems") {
                    members.insert("items".into(), rest);
                }
            }
            for child in members.values_mut() {
                rewrite_tuples(child, depth + 1);
            }
        }
        Value::Array(items) => {
            for child in items {
                rewrite_tuples(child, depth + 1);
            }
        }
        _ => {}
    }
}

/// The field a deserializer's message names (`unknown field `x``,
/// `missing field `y``), so a parse defect points at it as others do.
fn field_named_in(message: &str) -> Option<String> {
    [
        "unknown field `",
        "missing field `",
        "duplicate field `",
        "duplicate key `",
    ]
    .iter()
    .find_map(|lead| {
        let rest = &message[message.find(lead)? + lead.len()..];
        rest.find('`').map(|end| rest[..end].to_owned())
    })
    .filter(|f| !f.is_empty())
}

type Overlay = BTreeMap<String, BTreeMap<String, Value>>;

fn parse_overlay(src: &OverlaySource) -> Result<Overlay, Defect> {
    let fail = |message: String| Defect {
        file: src.origin.clone(),
        device: "-".into(),
        field: "-".into(),
        message,
    };
    let value = tether_core::json::parse_strict(&src.text).map_err(fail)?;
    let Value::Object(top) = value else {
        return Err(fail(
            "the overlay must be a JSON object keyed by device id".into(),
        ));
    };
    let mut out = Overlay::new();
    for (device, entries) in top {
        let Value::Object(entries) = entries else {
            return Err(fail(format!("`{device}` must map to an object")));
        };
        out.insert(device, entries.into_iter().collect());
    }
    Ok(out)
}

/// Loads and checks a cell.
///
/// # Errors
/// Every defect found, each naming the file, the device and the field.
pub fn load(
    manifests: &[ManifestSource],
    overlay: Option<&OverlaySource>,
) -> Result<Cell, Vec<Defect>> {
    let mut defects = Vec::new();
    let overlay_map = match overlay.map(parse_overlay).transpose() {
        Ok(o) => o.unwrap_or_default(),
        Err(d) => {
            defects.push(d);
            Overlay::new()
        }
    };
    let overlay_origin = overlay.map(|o| o.origin.clone()).unwrap_or_default();
    let mut cell = Cell {
        devices: Vec::new(),
        overlay_origin: overlay.map(|o| o.origin.clone()),
    };
    let mut seen = BTreeMap::<String, String>::new();
    for src in manifests {
        let manifest = match parse_manifest(src) {
            Ok(m) => m,
            Err(message) => {
                defects.push(Defect {
                    file: src.origin.clone(),
                    device: loosely_read_device_id(src).unwrap_or_else(|| "-".into()),
                    field: field_named_in(&message).unwrap_or_else(|| "-".into()),
                    message,
                });
                continue;
            }
        };
        // A second manifest with the same id is a defect, but its body is
        // still checked so `tether check` prints every defect at once.
        let first_origin = seen.get(&manifest.device_id).cloned();
        if let Some(first) = &first_origin {
            defects.push(Defect {
                file: src.origin.clone(),
                device: manifest.device_id.clone(),
                field: "device_id".into(),
                message: format!("device id already declared in {first}"),
            });
        } else {
            seen.insert(manifest.device_id.clone(), src.origin.clone());
        }
        let dev_overlay = overlay_map.get(&manifest.device_id);
        let mut ctx = Ctx {
            file: &src.origin,
            device: manifest.device_id.clone(),
            defects: Vec::new(),
        };
        let spec = resolve_device(&mut ctx, manifest, src, dev_overlay, &overlay_origin);
        if let Some(spec) = &spec {
            check_schemas_compile(&mut ctx, spec);
        }
        defects.append(&mut ctx.defects);
        if let (Some(spec), None) = (spec, first_origin) {
            cell.devices.push(spec);
        }
    }
    for device in overlay_map.keys() {
        if !seen.contains_key(device) {
            defects.push(Defect {
                file: overlay_origin.clone(),
                device: device.clone(),
                field: device.clone(),
                message: "the overlay names a device this endpoint does not serve".into(),
            });
        }
    }
    if defects.is_empty() {
        Ok(cell)
    } else {
        Err(defects)
    }
}

/// Every schema the kernel will serve must compile: `check` refuses what
/// `serve` would (a bad `type`, an unresolvable `$ref`, a bad pattern...).
fn check_schemas_compile(ctx: &mut Ctx<'_>, spec: &DeviceSpec) {
    for b in &spec.bindings {
        if let Err(e) = crate::kernel::binding_rt(&spec.manifest.device_id, b) {
            let index = spec
                .manifest
                .bindings
                .iter()
                .position(|d| d.capability_id == b.capability_id && d.resource == b.resource);
            let field = match index {
                Some(i) => format!("bindings[{i}].input_schema"),
                None => format!("bindings({}, {})", b.capability_id, b.resource),
            };
            ctx.defect(field, e.to_string());
        }
    }
}

fn resolve_device(
    ctx: &mut Ctx<'_>,
    manifest: DeviceManifest,
    src: &ManifestSource,
    overlay: Option<&BTreeMap<String, Value>>,
    overlay_origin: &str,
) -> Option<DeviceSpec> {
    check_device_header(ctx, &manifest);
    let mut resources = BTreeMap::new();
    for (i, r) in manifest.resources.iter().enumerate() {
        if resources.insert(r.id.clone(), &r.state_schema).is_some() {
            ctx.defect(
                format!("resources[{i}].id"),
                format!("resource `{}` declared twice", r.id),
            );
        }
        check_units(
            ctx,
            &format!("resources[{i}].state_schema"),
            &r.state_schema,
            0,
        );
        if !r.state_schema.is_object() || r.state_schema.get("type") != Some(&json!("object")) {
            ctx.defect(
                format!("resources[{i}].state_schema"),
                "a state schema must be a JSON Schema object with \"type\": \"object\"",
            );
        }
        if r.authority.is_some() && manifest.mode != Mode::Hybrid {
            ctx.defect(
                format!("resources[{i}].authority"),
                "authority is declared only on a hybrid device (it says which side drives the resource)",
            );
        }
    }
    let overlay_split = split_overlay(ctx, &manifest, overlay, overlay_origin);
    let mut pairs = BTreeMap::new();
    let mut bindings = Vec::new();
    let mut overlay_applied = false;
    for (i, decl) in manifest.bindings.iter().enumerate() {
        let pair = (decl.capability_id.clone(), decl.resource.clone());
        if let Some(first) = pairs.insert(pair, i) {
            ctx.defect(
                format!("bindings[{i}]"),
                format!(
                    "the pair ({}, {}) is already bound by bindings[{first}]; a pair may appear once",
                    decl.capability_id, decl.resource
                ),
            );
            continue;
        }
        let Some(state_schema) = resources.get(&decl.resource) else {
            ctx.defect(
                format!("bindings[{i}].resource"),
                format!("resource `{}` is not declared", decl.resource),
            );
            continue;
        };
        let ov = overlay_split
            .get(&decl.capability_id)
            .cloned()
            .unwrap_or_default();
        if !ov.is_empty() {
            overlay_applied = true;
        }
        if let Some(b) = resolve_binding(ctx, &manifest, i, state_schema, &ov, overlay_origin) {
            bindings.push(b);
        }
    }
    check_envelope(ctx, &manifest, &bindings);
    check_safety(ctx, &manifest, &bindings);
    check_interlocks(ctx, &manifest);
    check_facts(ctx, &manifest);
    Some(DeviceSpec {
        manifest,
        origin: src.origin.clone(),
        bindings,
        overlay_applied,
    })
}

fn check_device_header(ctx: &mut Ctx<'_>, m: &DeviceManifest) {
    if let Err(e) = tether_core::ids::DeviceId::parse(&m.device_id) {
        ctx.defect("device_id", format!("invalid device id: {e}"));
    }
    if m.mode == manifest::Mode::Simulated && m.fidelity.is_none() {
        ctx.defect(
            "fidelity",
            "a simulated device must state its fidelity (kind and notes)",
        );
    }
    if m.resources.is_empty() {
        ctx.defect("resources", "a device needs at least one resource");
    }
}

/// Splits the device's overlay entries by capability id. Keys that are not
/// capability ids are state-parameter paths and apply to the configure
/// binding of the resource whose writable schema resolves them.
fn split_overlay(
    ctx: &mut Ctx<'_>,
    m: &DeviceManifest,
    overlay: Option<&BTreeMap<String, Value>>,
    origin: &str,
) -> BTreeMap<String, Vec<(String, Value)>> {
    let mut out: BTreeMap<String, Vec<(String, Value)>> = BTreeMap::new();
    let Some(overlay) = overlay else {
        return out;
    };
    let field = |k: &str| format!("{origin} -> {k}");
    for (key, value) in overlay {
        if catalogue::is_catalogue_id(key) || catalogue::is_extension_id(key) {
            if !m.bindings.iter().any(|b| &b.capability_id == key) {
                ctx.defect(
                    field(key),
                    "the overlay names a capability the device does not bind",
                );
                continue;
            }
            let Value::Object(rules) = value else {
                ctx.defect(
                    field(key),
                    "a capability entry must map limit paths to rules",
                );
                continue;
            };
            let entry = out.entry(key.clone()).or_default();
            entry.extend(rules.iter().map(|(p, r)| (p.clone(), r.clone())));
        } else {
            let writable = m.bindings.iter().any(|b| {
                b.capability_id == catalogue::CONFIGURE
                    && m.resources
                        .iter()
                        .find(|r| r.id == b.resource)
                        .is_some_and(|r| writable_path_exists(&r.state_schema, key))
            });
            if !writable {
                ctx.defect(
                    field(key),
                    "the overlay names a parameter that is not a writable field of a configured resource",
                );
                continue;
            }
            out.entry(catalogue::CONFIGURE.to_owned())
                .or_default()
                .push((key.clone(), value.clone()));
        }
    }
    out
}

fn writable_path_exists(state_schema: &Value, path: &str) -> bool {
    let head = path.split(['.', '[']).next().unwrap_or(path);
    state_schema
        .get("properties")
        .and_then(|p| p.get(head))
        .is_some_and(|prop| prop.get("readOnly") != Some(&Value::Bool(true)))
}

fn resolve_binding(
    ctx: &mut Ctx<'_>,
    m: &DeviceManifest,
    i: usize,
    state_schema: &Value,
    overlay_rules: &[(String, Value)],
    overlay_origin: &str,
) -> Option<BindingSpec> {
    let decl = &m.bindings[i];
    let at = |f: &str| format!("bindings[{i}].{f}");
    let class = catalogue::class(&decl.capability_id);
    let is_ext = class.is_none();
    if is_ext
        && !(catalogue::is_extension_id(&decl.capability_id)
            || catalogue::is_catalogue_id(&decl.capability_id))
    {
        ctx.defect(
            at("capability_id"),
            format!(
                "`{}` is not a capability id (cap.<class>.v<N> or x-cap.<owner>.<name>.v<N>)",
                decl.capability_id
            ),
        );
        return None;
    }
    if is_ext && decl.input_schema.is_none() {
        ctx.defect(
            at("input_schema"),
            format!(
                "`{}` is not in the catalogue, so the binding must carry an inline input_schema",
                decl.capability_id
            ),
        );
        return None;
    }
    let floor = class.map(|c| c.risk_floor).unwrap_or(RiskClass::R0);
    if let Some(r) = decl.risk {
        if r < floor {
            ctx.defect(at("risk"), format!("binding risk {r} is below the class floor {floor}; a binding may raise a class risk, never lower it"));
        }
    }
    let declared = decl.risk.map_or(floor, |r| r.max(floor));
    if m.risk_class < declared {
        ctx.defect(
            "risk_class",
            format!(
                "device risk {} is below the floor {} of binding `{}`",
                m.risk_class, declared, decl.capability_id
            ),
        );
    }
    // OpenMHS CORE-030: a binding's risk is never below the class floor or
    // the device's declared risk. What the device risks, every call on it
    // risks: the policy, the permit rule and the reference weigh this.
    let risk = declared.max(m.risk_class);
    let is_configure = decl.capability_id == catalogue::CONFIGURE;
    let served_schema = if is_configure {
        if decl.input_schema.is_some() {
            ctx.defect(
                at("input_schema"),
                "a configure binding takes its input schema from the resource's state schema",
            );
        }
        writable_schema(state_schema)
    } else {
        match (class, &decl.input_schema) {
            (Some(c), Some(b)) => {
                for loosened in loosenings(&c.input_schema, b, "") {
                    ctx.defect(at("input_schema"), loosened);
                }
                merge_schema(&c.input_schema, b)
            }
            (Some(c), None) => c.input_schema.clone(),
            (None, Some(b)) => b.clone(),
            (None, None) => return None,
        }
    };
    if let Some(schema) = &decl.input_schema {
        check_units(ctx, &at("input_schema"), schema, 0);
    }
    let mut sources = Vec::new();
    if let Some(c) = class {
        sources.push(SourceRules {
            kind: SourceKind::Class,
            rules: c
                .limits
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            narrow_only: false,
            require_resolve: true,
        });
    }
    sources.push(SourceRules {
        kind: SourceKind::Binding,
        rules: decl
            .limits
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        narrow_only: false,
        require_resolve: true,
    });
    for (key, rules) in &m.safety.envelope {
        if catalogue::key_matches(key, &decl.capability_id) {
            let kind = if key.ends_with('*') {
                SourceKind::Envelope {
                    pattern: key.clone(),
                }
            } else {
                SourceKind::Envelope {
                    pattern: String::new(),
                }
            };
            sources.push(SourceRules {
                kind,
                rules: rules.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                narrow_only: false,
                require_resolve: false,
            });
        }
    }
    if !overlay_rules.is_empty() {
        sources.push(SourceRules {
            kind: SourceKind::Overlay,
            rules: overlay_rules.to_vec(),
            narrow_only: true,
            require_resolve: true,
        });
    }
    let limits = match tether_limits::build(&served_schema, &sources) {
        Ok(l) => l,
        Err(errors) => {
            for e in errors {
                // A defect of the overlay's rule is the overlay file's: named
                // as the overlay's other defects are.
                let field = if e.source == "overlay" && !overlay_origin.is_empty() {
                    format!("{overlay_origin} -> {} -> {}", decl.capability_id, e.path)
                } else {
                    at(&format!("limits.{}", e.path))
                };
                ctx.defect(
                    field,
                    format!("[{}] {} ({})", e.reason.as_str(), e.message, e.source),
                );
            }
            return None;
        }
    };
    let achieves = m
        .safety
        .safe_state
        .as_ref()
        .is_some_and(|s| s.achieved_by.iter().any(|a| a == &decl.capability_id));
    let verb = class.map_or(Verb::Action, |c| c.verb);
    // An extension's declared flags are never trusted to exempt it from
    // anything; the one flag that only restricts (two_person: a quorum of at
    // least two) is honoured, since ignoring it would fail open.
    let flags = class.map(|c| c.flags).unwrap_or_else(|| Flags {
        two_person: is_ext && decl.flags.is_some_and(|f| f.two_person),
        ..Flags::default()
    });
    let default_concurrency = if verb == Verb::Read || flags.stop_class {
        Concurrency::Shared
    } else if m.mode.is_physical() {
        Concurrency::Exclusive
    } else {
        Concurrency::Shared
    };
    let output_schema = decl
        .output_schema
        .clone()
        .or_else(|| class.map(|c| c.output_schema.clone()))
        .unwrap_or_else(|| json!({"type": "object"}));
    Some(BindingSpec {
        capability_id: decl.capability_id.clone(),
        resource: decl.resource.clone(),
        verb,
        flags,
        declared_verb: if is_ext { decl.verb } else { None },
        declared_flags: if is_ext { decl.flags } else { None },
        catalogued: !is_ext,
        risk,
        served_schema,
        class_schema: class
            .filter(|_| !is_configure)
            .map(|c| c.input_schema.clone()),
        output_schema,
        limits,
        target: decl
            .target
            .clone()
            .unwrap_or_else(|| decl.capability_id.clone()),
        concurrency: if flags.stop_class {
            Concurrency::Shared
        } else {
            decl.concurrency.unwrap_or(default_concurrency)
        },
        max_duration_ms: decl.max_duration_ms,
        achieves_safe_state: achieves,
        description: if decl.description.is_empty() {
            class.map(|c| c.description.clone()).unwrap_or_default()
        } else {
            decl.description.clone()
        },
    })
}

/// The configure input schema: the non-readOnly properties of the state
/// schema, closed, nothing required (a write is a patch).
pub fn writable_schema(state_schema: &Value) -> Value {
    let mut props = Map::new();
    let read_only = |v: &Value| v.get("readOnly") == Some(&Value::Bool(true));
    if let Some(Value::Object(p)) = state_schema.get("properties") {
        for (k, v) in p {
            if !read_only(v) && !read_only(state_schema) {
                props.insert(k.clone(), without_read_only(v, 0));
            }
        }
    }
    let mut out = json!({"type": "object", "additionalProperties": false, "properties": props});
    for key in ["$defs", "definitions"] {
        if let Some(Value::Object(defs)) = state_schema.get(key) {
            out[key] = Value::Object(
                defs.iter()
                    .map(|(name, d)| (name.clone(), without_read_only(d, 0)))
                    .collect(),
            );
        }
    }
    out
}

/// A schema with every `readOnly` member left out, at any depth (nested
/// `properties` and `patternProperties`, combinators, conditionals and array
/// items): what a client is shown it may write. The kernel refuses a write of
/// a read-only field whatever this shows (see `fields`).
fn without_read_only(schema: &Value, depth: usize) -> Value {
    let Value::Object(obj) = schema else {
        return schema.clone();
    };
    if depth > 32 {
        return schema.clone();
    }
    let read_only = |v: &Value| v.get("readOnly") == Some(&Value::Bool(true));
    let mut out = Map::new();
    for (k, v) in obj {
        let kept = match (k.as_str(), v) {
            ("properties" | "patternProperties", Value::Object(members)) => Value::Object(
                members
                    .iter()
                    .filter(|(_, m)| !read_only(m))
                    .map(|(n, m)| (n.clone(), without_read_only(m, depth + 1)))
                    .collect(),
            ),
            ("allOf" | "anyOf" | "oneOf" | "prefixItems" | "items", Value::Array(list)) => {
                Value::Array(
                    list.iter()
                        .map(|m| without_read_only(m, depth + 1))
                        .collect(),
                )
            }
            ("then" | "else" | "items" | "additionalProperties" | "additionalItems", m) => {
                without_read_only(m, depth + 1)
            }
            _ => v.clone(),
        };
        out.insert(k.clone(), kept);
    }
    Value::Object(out)
}

/// Where a binding schema would admit what its class schema refuses: a
/// member a closed class object does not declare, or a closed object opened
/// (`additionalProperties`). The class schema is validated as well, so such
/// a binding would publish a schema whose inputs are then refused; a binding
/// may only narrow its class (OpenMHS CORE-023: binding ∩ class).
fn loosenings(class: &Value, binding: &Value, at: &str) -> Vec<String> {
    let mut out = Vec::new();
    let closed = class.get("additionalProperties") == Some(&Value::Bool(false));
    if closed {
        match binding.get("additionalProperties") {
            None | Some(Value::Bool(false)) => {}
            Some(_) => out.push(format!(
                "{}additionalProperties: the class closes this object; a binding may not open it",
                prefix(at)
            )),
        }
    }
    let (Some(Value::Object(cp)), Some(Value::Object(bp))) =
        (class.get("properties"), binding.get("properties"))
    else {
        if closed {
            if let Some(Value::Object(bp)) = binding.get("properties") {
                for name in bp.keys() {
                    out.push(undeclared(at, name));
                }
            }
        }
        return out;
    };
    for (name, b) in bp {
        match cp.get(name) {
            Some(c) => out.extend(loosenings(c, b, &format!("{}{name}", prefix(at)))),
            None if closed => out.push(undeclared(at, name)),
            None => {}
        }
    }
    out
}

fn prefix(at: &str) -> String {
    if at.is_empty() {
        String::new()
    } else {
        format!("{at}.")
    }
}

fn undeclared(at: &str, name: &str) -> String {
    format!(
        "{}{name}: the class does not accept this member; a binding may only narrow its class",
        prefix(at)
    )
}

/// Merges a binding schema over a class schema: `properties` merge per
/// property (recursively), `required` is the union, any other keyword of the
/// binding replaces the class's. The class schema is still validated
/// separately, so a merge can never widen what the class allows.
pub fn merge_schema(class: &Value, binding: &Value) -> Value {
    match (class, binding) {
        (Value::Object(c), Value::Object(b)) => {
            let mut out = c.clone();
            for (k, bv) in b {
                let merged = match (k.as_str(), out.get(k)) {
                    ("properties", Some(Value::Object(cp))) => {
                        let mut props = cp.clone();
                        if let Value::Object(bp) = bv {
                            for (pk, pv) in bp {
                                let m = props
                                    .get(pk)
                                    .map_or_else(|| pv.clone(), |cv| merge_schema(cv, pv));
                                props.insert(pk.clone(), m);
                            }
                        }
                        Value::Object(props)
                    }
                    ("required", Some(Value::Array(cr))) => {
                        let mut set: BTreeSet<String> = cr
                            .iter()
                            .filter_map(|v| v.as_str().map(str::to_owned))
                            .collect();
                        if let Value::Array(br) = bv {
                            set.extend(br.iter().filter_map(|v| v.as_str().map(str::to_owned)));
                        }
                        json!(set)
                    }
                    ("items", Some(ci)) => merge_schema(ci, bv),
                    _ => bv.clone(),
                };
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (_, b) => b.clone(),
    }
}

fn check_envelope(ctx: &mut Ctx<'_>, m: &DeviceManifest, bindings: &[BindingSpec]) {
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

fn check_safety(ctx: &mut Ctx<'_>, m: &DeviceManifest, bindings: &[BindingSpec]) {
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
fn check_facts(ctx: &mut Ctx<'_>, m: &DeviceManifest) {
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

fn check_interlocks(ctx: &mut Ctx<'_>, m: &DeviceManifest) {
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

/// Deepest schema nesting the unit check walks.
const SCHEMA_DEPTH_MAX: usize = 32;

/// Every `x-mhs-unit` must name a unit of the units table, so limits are
/// always compared in a unit Tether can convert.
fn check_units(ctx: &mut Ctx<'_>, field: &str, schema: &Value, depth: usize) {
    if depth > SCHEMA_DEPTH_MAX {
        ctx.defect(field, "schema nesting is deeper than 32 levels");
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
