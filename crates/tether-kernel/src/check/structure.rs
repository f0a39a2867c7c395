//! Steps 7 and 9: the input's structure, then the remaining schema bounds.
//!
//! **Owns:** validation against the served schema (without the bounds the
//! limits step reports better, then with them) and the write field rules of
//! a configure patch (unknown and read-only fields at any depth, CORE-022).
//! **Never belongs here:** limits with units (`tether_limits`).
//! **Fail-closed rule:** input that does not validate, or a patch the field
//! walk cannot finish, is refused.

use crate::kernel::{BindingRt, DeviceRt};
use crate::loader::BindingSpec;
use serde_json::{json, Value};
use tether_core::catalogue;
use tether_core::{echo, Code, Refusal};

/// Most validation errors reported for one input.
const SCHEMA_ERRORS_MAX: usize = 16;

/// Step 7: a configure patch's field rules first, then the served schema
/// without the bounds the limits step reports (with units and sources).
pub(crate) fn structure_step(
    dev: &DeviceRt,
    b: &BindingSpec,
    rt: &BindingRt,
    input: &Value,
) -> Result<(), Refusal> {
    if b.catalogued && b.capability_id == catalogue::CONFIGURE {
        check_configure_fields(dev, &b.resource, input)?;
    }
    check_schema(&rt.structure, rt.class_structure.as_ref(), input)
}

pub(crate) fn check_schema(
    served: &jsonschema::Validator,
    class: Option<&jsonschema::Validator>,
    input: &Value,
) -> Result<(), Refusal> {
    let mut errors = Vec::new();
    for v in std::iter::once(served).chain(class) {
        for e in v.iter_errors(input).take(SCHEMA_ERRORS_MAX) {
            // A validator's message quotes the offending instance: the
            // caller's text, repeated only as far as an error may.
            let path = e.instance_path.to_string();
            let message = e.to_string();
            errors.push(json!({"path": echo::text(&path), "message": echo::text(&message)}));
        }
        if !errors.is_empty() {
            break;
        }
    }
    if errors.is_empty() {
        return Ok(());
    }
    let first = errors[0]["message"]
        .as_str()
        .unwrap_or("invalid")
        .to_owned();
    Err(Refusal::new(
        Code::CapabilityInputInvalid,
        format!("input does not match the served schema: {first}"),
        json!({"errors": errors}),
    ))
}

/// Field names a refusal repeats: the first [`SCHEMA_ERRORS_MAX`], each as
/// an error may echo a caller's name.
fn echoed<'a>(names: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    names
        .into_iter()
        .take(SCHEMA_ERRORS_MAX)
        .map(|n| echo::id(n).into_owned())
        .collect()
}

/// CORE-022: unknown keys are `FIELD_UNKNOWN`, readOnly keys `NOT_WRITABLE`,
/// at any depth of the state schema.
pub(crate) fn check_configure_fields(
    dev: &DeviceRt,
    resource: &str,
    patch: &Value,
) -> Result<(), Refusal> {
    let Some(r) = dev
        .spec
        .manifest
        .resources
        .iter()
        .find(|r| r.id == resource)
    else {
        return Err(Refusal::new(
            Code::ResourceNotWritable,
            "resource not declared",
            json!({"reason": "resource_unknown"}),
        ));
    };
    let Value::Object(patch) = patch else {
        return Err(Refusal::new(
            Code::CapabilityInputInvalid,
            "a write patch must be a JSON object",
            json!({"errors": [{"path": "", "message": "not an object"}]}),
        ));
    };
    let report = crate::check::fields::FieldReport::of(&r.state_schema, patch);
    if report.read_only_root || report.unresolvable_ref || report.too_deep {
        let (reason, why) = if report.read_only_root {
            ("read_only", "the resource's state schema is read-only")
        } else if report.unresolvable_ref {
            (
                "unresolvable_ref",
                "the state schema has a $ref that resolves to nothing",
            )
        } else {
            (
                "patch_too_deep",
                "the patch nests deeper than the field check walks",
            )
        };
        return Err(Refusal::new(
            Code::ResourceNotWritable,
            format!("not writable: {why}"),
            json!({"fields": echoed(patch.keys()), "reason": reason}),
        ));
    }
    if !report.unknown.is_empty() {
        return Err(Refusal::new(
            Code::ResourceFieldUnknown,
            format!("unknown field(s): {}", echoed(&report.unknown).join(", ")),
            json!({"fields": echoed(&report.unknown)}),
        ));
    }
    if !report.read_only.is_empty() {
        return Err(Refusal::new(
            Code::ResourceNotWritable,
            format!(
                "read-only field(s): {}",
                echoed(&report.read_only).join(", ")
            ),
            json!({"fields": echoed(&report.read_only), "reason": "read_only"}),
        ));
    }
    Ok(())
}
