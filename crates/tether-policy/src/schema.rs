//! The Tether Cedar schema generated from the served cell: the entity and
//! action types, with the input type the union of the bindings' input
//! fields. Policies are validated against it strictly at load.

use crate::input::{self, CType};
use crate::{CellShape, PolicyError};
use cedar_policy::Schema;
use std::collections::BTreeMap;

/// The Tether schema (Cedar schema syntax) for a cell, as `tether check` and
/// the docs print it. Whether Cedar accepts it is checked when a policy is
/// loaded for the cell ([`PolicyError::Schema`]).
pub fn schema_text(cell: &CellShape) -> String {
    schema_source(&input_type(cell))
}

/// The union of the bindings' input fields: the schema's `Input` type.
pub(crate) fn input_type(cell: &CellShape) -> CType {
    let mut fields = BTreeMap::new();
    for d in &cell.devices {
        for b in &d.bindings {
            if let Some(CType::Record(f)) = input::from_schema(&b.input_schema, 0) {
                input::union(&mut fields, &f);
            }
        }
    }
    CType::Record(fields)
}

fn schema_source(input: &CType) -> String {
    format!(
        r#"namespace Tether {{
  type Input = {input};
  type Flags = {{ stop_class: Bool, risk_reducing: Bool, safe_place: Bool, two_person: Bool }};
  entity Agent = {{ roles: Set<String>, operator: Bool }};
  entity Human = {{ roles: Set<String>, operator: Bool }};
  entity Service = {{ roles: Set<String>, operator: Bool }};
  entity Device = {{ mode: String, risk_class: String }};
  entity Binding in [Device] = {{
    device: String, capability: String, verb: String, risk: String, resource: String,
    stop_class: Bool, risk_reducing: Bool, safe_place: Bool, two_person: Bool
  }};
  action read, write, command appliesTo {{
    principal: [Agent, Human, Service],
    resource: [Binding],
    context: {{ input: Input, mode: String, risk_class: String, device_risk_class: String, flags: Flags }}
  }};
}}
"#,
        input = input::schema_text(input)
    )
}

/// The cell's schema, for validating policies.
pub(crate) fn build_schema(input: &CType) -> Result<Schema, PolicyError> {
    Schema::from_cedarschema_str(&schema_source(input))
        .map(|(s, _warnings)| s)
        .map_err(|e| PolicyError::Schema(format!("{e:?}")))
}
