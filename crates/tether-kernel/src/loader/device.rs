//! One device: its header (id, fidelity, resources), its resources (unique
//! ids, object state schemas, authority only on a hybrid device), the
//! overlay entries split by the capability they narrow, each binding
//! resolved in manifest order (-> `binding`), the device-wide checks (->
//! `checks`), and last that every schema it will serve compiles.
//!
//! Every defect goes to the [`Ctx`] of the manifest; a binding with a defect
//! is left out of the device, and the device's defects keep the cell from
//! loading.
//!
//! **Never belongs here:** resolving a binding's schema or limits (->
//! `binding`), what a check decides (-> `checks`), cell-wide checks (->
//! `mod.rs`).

use super::binding::resolve_binding;
use super::checks::{check_envelope, check_facts, check_interlocks, check_safety, check_units};
use super::{Ctx, DeviceSpec, ManifestSource};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use tether_core::catalogue;
use tether_core::manifest::{self, DeviceManifest, Mode};

/// The overlay rules of one device, by the capability id they narrow.
type OverlayByCapability = BTreeMap<String, Vec<(String, Value)>>;

/// Resolves one parsed manifest into a device, collecting its defects.
pub(super) fn resolve_device(
    ctx: &mut Ctx<'_>,
    manifest: DeviceManifest,
    src: &ManifestSource,
    overlay: Option<&BTreeMap<String, Value>>,
    overlay_origin: &str,
) -> DeviceSpec {
    check_device_header(ctx, &manifest);
    let resources = check_resources(ctx, &manifest);
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
        if let Some(b) = resolve_binding(ctx, &manifest, i, decl, state_schema, &ov, overlay_origin)
        {
            bindings.push(b);
        }
    }
    check_envelope(ctx, &manifest, &bindings);
    check_safety(ctx, &manifest, &bindings);
    check_interlocks(ctx, &manifest);
    check_facts(ctx, &manifest);
    DeviceSpec {
        manifest,
        origin: src.origin.clone(),
        bindings,
        overlay_applied,
    }
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

/// Checks each resource and returns the state schemas by resource id (of two
/// resources with the same id, the later is the one a binding gets).
fn check_resources<'m>(ctx: &mut Ctx<'_>, m: &'m DeviceManifest) -> BTreeMap<String, &'m Value> {
    let mut resources = BTreeMap::new();
    for (i, r) in m.resources.iter().enumerate() {
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
        if r.authority.is_some() && m.mode != Mode::Hybrid {
            ctx.defect(
                format!("resources[{i}].authority"),
                "authority is declared only on a hybrid device (it says which side drives the resource)",
            );
        }
    }
    resources
}

/// Splits the device's overlay entries by capability id. Keys that are not
/// capability ids are state-parameter paths and apply to the configure
/// binding of the resource whose writable schema resolves them.
fn split_overlay(
    ctx: &mut Ctx<'_>,
    m: &DeviceManifest,
    overlay: Option<&BTreeMap<String, Value>>,
    origin: &str,
) -> OverlayByCapability {
    let mut out = OverlayByCapability::new();
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

/// Whether the first segment of limit path `path` is a top-level property of
/// the state schema that is not `readOnly`.
fn writable_path_exists(state_schema: &Value, path: &str) -> bool {
    let head = path.split(['.', '[']).next().unwrap_or(path);
    state_schema
        .get("properties")
        .and_then(|p| p.get(head))
        .is_some_and(|prop| prop.get("readOnly") != Some(&Value::Bool(true)))
}

/// Every schema the kernel will serve must compile: `check` refuses what
/// `serve` would (a bad `type`, an unresolvable `$ref`, a bad pattern...).
pub(super) fn check_schemas_compile(ctx: &mut Ctx<'_>, spec: &DeviceSpec) {
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
