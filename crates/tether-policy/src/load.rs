//! Loading a policy: parsing the Cedar text, reading each policy's
//! annotations, validating the set strictly against the cell's schema, and
//! building what deciding needs (the binding entities, the action and
//! principal names, the per-shape slices). Every defect names the policy.
//!
//! Never here: evaluating a request (`decide`).

use crate::annotations::{policy_meta, Meta};
use crate::entities::{action_uid, binding_entities, type_name};
use crate::schema::{build_schema, input_type};
use crate::slice::{build_slices, SLICE_WORK_MAX};
use crate::{
    default_source, Action, CellShape, ControlPolicy, PolicyError, PrincipalKind,
    DEFAULT_POLICY_NAME, POLICIES_MAX,
};
use cedar_policy::{Authorizer, PolicyId, PolicySet, ValidationMode, Validator};
use std::collections::{HashMap, HashSet};
use std::str::FromStr;

impl ControlPolicy {
    /// Parses, annotates and validates `text` (named `name` in messages) for
    /// the cell described by `cell`.
    ///
    /// # Errors
    /// Parse, annotation and validation defects, each naming the policy.
    pub fn load(name: &str, text: &str, cell: &CellShape) -> Result<Self, PolicyError> {
        let input_type = input_type(cell);
        let schema = build_schema(&input_type)?;
        let (set, meta) = parse(name, text)?;
        let result = Validator::new(schema).validate(&set, ValidationMode::Strict);
        let errors: Vec<String> = result.validation_errors().map(|e| format!("{e}")).collect();
        if !errors.is_empty() {
            return Err(PolicyError::Validation {
                name: name.to_owned(),
                message: errors.join("\n"),
            });
        }
        let bindings = cell
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| binding_entities(i, d))
            .collect::<Result<Vec<_>, _>>()?;
        let actions = [
            action_uid(Action::Read)?,
            action_uid(Action::Write)?,
            action_uid(Action::Command)?,
        ];
        let principal_types = [
            type_name(PrincipalKind::Agent.type_name())?,
            type_name(PrincipalKind::Human.type_name())?,
            type_name(PrincipalKind::Service.type_name())?,
        ];
        let slices = build_slices(
            &set,
            &meta,
            &bindings,
            &input_type,
            &principal_types,
            &actions,
            SLICE_WORK_MAX,
        )
        .map_err(|message| PolicyError::Parse {
            name: name.to_owned(),
            message,
        })?;
        Ok(Self {
            name: name.to_owned(),
            meta,
            bindings,
            slices,
            entity_cache: std::sync::Mutex::new(HashMap::new()),
            actions,
            principal_types,
            authorizer: Authorizer::new(),
        })
    }

    /// The built-in default policy for `cell`.
    ///
    /// # Errors
    /// Only if the cell cannot be described (the default text is tested).
    pub fn default_for(cell: &CellShape) -> Result<Self, PolicyError> {
        Self::load(DEFAULT_POLICY_NAME, default_source(), cell)
    }
}

/// Parses `text` into a set whose policy ids are their `@id`s, with each
/// policy's annotations.
pub(crate) fn parse(
    name: &str,
    text: &str,
) -> Result<(PolicySet, HashMap<String, Meta>), PolicyError> {
    let parsed = PolicySet::from_str(text).map_err(|e| PolicyError::Parse {
        name: name.to_owned(),
        message: render_parse_error(&e),
    })?;
    let mut policies = Vec::new();
    let mut meta = HashMap::new();
    let mut seen = HashSet::new();
    for p in parsed.policies() {
        if policies.len() >= POLICIES_MAX {
            return Err(PolicyError::Parse {
                name: name.to_owned(),
                message: format!("more than {POLICIES_MAX} policies"),
            });
        }
        let id = p
            .annotation("id")
            .map_or_else(|| p.id().to_string(), str::to_owned);
        let annotation = |message: String| PolicyError::Annotation {
            name: name.to_owned(),
            policy: id.clone(),
            message,
        };
        if !seen.insert(id.clone()) {
            return Err(annotation("the @id is used twice".into()));
        }
        let m = policy_meta(p).map_err(annotation)?;
        meta.insert(id.clone(), m);
        policies.push(p.new_id(PolicyId::new(id.as_str())));
    }
    let set = PolicySet::from_policies(policies).map_err(|e| PolicyError::Parse {
        name: name.to_owned(),
        message: e.to_string(),
    })?;
    Ok((set, meta))
}

fn render_parse_error(e: &cedar_policy::ParseErrors) -> String {
    let mut lines = Vec::new();
    for err in e.iter() {
        lines.push(err.to_string());
    }
    if lines.is_empty() {
        e.to_string()
    } else {
        lines.join("\n")
    }
}
