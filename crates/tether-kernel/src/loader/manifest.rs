//! Reading the texts: a manifest (TOML, or JSON when the origin ends in
//! `.json`) into a [`DeviceManifest`], with draft-07 tuples rewritten to the
//! draft 2020-12 form, and the operator overlay into entries per device.
//!
//! A text that does not read is one [`Defect`] naming the file (and the
//! device and field when they can still be told), never a panic.
//!
//! **Never belongs here:** checking what a manifest says (-> `device`,
//! `binding`, `checks`) or applying the overlay to a device (-> `device`).

use super::{Defect, ManifestSource, OverlaySource};
use serde_json::Value;
use std::collections::BTreeMap;
use tether_core::manifest::{self, DeviceManifest};

/// The overlay: device id -> (capability id or state-parameter path -> rules).
pub(super) type Overlay = BTreeMap<String, BTreeMap<String, Value>>;

/// Parses manifest text as TOML, or JSON when the origin ends in `.json`.
pub(super) fn parse_manifest(src: &ManifestSource) -> Result<DeviceManifest, String> {
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

/// The defect of a manifest that does not read: the device and the field
/// when they can still be told, `-` otherwise.
pub(super) fn parse_defect(src: &ManifestSource, message: String) -> Defect {
    Defect {
        file: src.origin.clone(),
        device: loosely_read_device_id(src).unwrap_or_else(|| "-".into()),
        field: field_named_in(&message).unwrap_or_else(|| "-".into()),
        message,
    }
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

// A JSON manifest is refused beyond `DEPTH_MAX`, so its schemas are rewritten whole.
const _: () = assert!(TUPLE_REWRITE_DEPTH_MAX >= tether_core::json::DEPTH_MAX);

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
        let rest = message.get(message.find(lead)? + lead.len()..)?;
        rest.find('`')
            .and_then(|end| rest.get(..end))
            .map(str::to_owned)
    })
    .filter(|f| !f.is_empty())
}

/// Parses the overlay: a JSON object keyed by device id, each mapping to an
/// object. The first shape error is the overlay's one defect.
pub(super) fn parse_overlay(src: &OverlaySource) -> Result<Overlay, Defect> {
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
