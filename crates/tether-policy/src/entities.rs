//! The Cedar entities and context of a request: the device and binding
//! entities built once per binding at load ([`BindingEnt`]), the principal
//! entity, the request context, and the bounded cache of recent
//! (principal, binding) entity sets.

use crate::{Action, ControlPolicy, DeviceShape, Flags, PolicyError, PrincipalKind, Subject};
use cedar_policy::{
    Context, Entities, Entity, EntityId, EntityTypeName, EntityUid, RestrictedExpression,
};
use std::collections::{HashMap, HashSet};
use std::str::FromStr;

/// (principal id, kind, operator, device, binding).
pub(crate) type EntityKey = (String, u8, bool, usize, usize);
/// The principal's uid and the request's entities.
pub(crate) type CachedEntities = (EntityUid, std::sync::Arc<Entities>);

/// Most (principal, binding) entity sets kept for reuse.
const ENTITY_CACHE_MAX: usize = 4096;

/// A binding of the cell with everything a request on it reuses.
#[derive(Debug, Clone)]
pub(crate) struct BindingEnt {
    pub(crate) device_ix: usize,
    pub(crate) binding_ix: usize,
    pub(crate) uid: EntityUid,
    pub(crate) device_uid: EntityUid,
    pub(crate) device_id: String,
    pub(crate) capability: String,
    pub(crate) verb: String,
    pub(crate) resource: String,
    pub(crate) device: Entity,
    pub(crate) binding: Entity,
    /// The context of a request whose input no policy reads.
    pub(crate) context_without_input: Context,
    pub(crate) mode: String,
    pub(crate) risk: String,
    pub(crate) device_risk: String,
    pub(crate) flags: Flags,
}

impl ControlPolicy {
    /// The principal's uid and the request's entities (principal, device,
    /// binding), from the cache when the pair was seen recently.
    pub(crate) fn entities_for(
        &self,
        who: &Subject<'_>,
        b: &BindingEnt,
    ) -> Result<(EntityUid, std::sync::Arc<Entities>), String> {
        let kind_ix: u8 = match who.kind {
            PrincipalKind::Agent => 0,
            PrincipalKind::Human => 1,
            PrincipalKind::Service => 2,
        };
        let key = (
            who.id.to_owned(),
            kind_ix,
            who.operator,
            b.device_ix,
            b.binding_ix,
        );
        if let Some(hit) = self
            .entity_cache
            .lock()
            .ok()
            .and_then(|c| c.get(&key).cloned())
        {
            return Ok(hit);
        }
        let principal = principal_entity(who, &self.principal_types[usize::from(kind_ix)])?;
        let uid = principal.uid();
        let entities = std::sync::Arc::new(
            Entities::from_entities([principal, b.device.clone(), b.binding.clone()], None)
                .map_err(|e| e.to_string())?,
        );
        if let Ok(mut c) = self.entity_cache.lock() {
            // Bounded: a full cache is emptied rather than grown.
            if c.len() >= ENTITY_CACHE_MAX {
                c.clear();
            }
            c.insert(key, (uid.clone(), std::sync::Arc::clone(&entities)));
        }
        Ok((uid, entities))
    }
}

fn uid(type_name: &str, id: &str) -> Result<EntityUid, String> {
    let t = EntityTypeName::from_str(type_name).map_err(|e| e.to_string())?;
    Ok(EntityUid::from_type_name_and_id(t, EntityId::new(id)))
}

pub(crate) fn action_uid(a: Action) -> Result<EntityUid, PolicyError> {
    uid("Tether::Action", a.as_str()).map_err(PolicyError::Schema)
}

/// The request context: the input and the binding's fixed facts.
pub(crate) fn request_context(
    b: &BindingEnt,
    input: RestrictedExpression,
) -> Result<Context, String> {
    Context::from_pairs([
        ("input".to_owned(), input),
        (
            "mode".to_owned(),
            RestrictedExpression::new_string(b.mode.clone()),
        ),
        (
            "risk_class".to_owned(),
            RestrictedExpression::new_string(b.risk.clone()),
        ),
        (
            "device_risk_class".to_owned(),
            RestrictedExpression::new_string(b.device_risk.clone()),
        ),
        ("flags".to_owned(), flags_record(b.flags)?),
    ])
    .map_err(|e| e.to_string())
}

fn flags_record(f: Flags) -> Result<RestrictedExpression, String> {
    RestrictedExpression::new_record([
        (
            "stop_class".to_owned(),
            RestrictedExpression::new_bool(f.stop_class),
        ),
        (
            "risk_reducing".to_owned(),
            RestrictedExpression::new_bool(f.risk_reducing),
        ),
        (
            "safe_place".to_owned(),
            RestrictedExpression::new_bool(f.safe_place),
        ),
        (
            "two_person".to_owned(),
            RestrictedExpression::new_bool(f.two_person),
        ),
    ])
    .map_err(|e| e.to_string())
}

pub(crate) fn type_name(name: &str) -> Result<EntityTypeName, PolicyError> {
    EntityTypeName::from_str(name).map_err(|e| PolicyError::Schema(e.to_string()))
}

fn principal_entity(who: &Subject<'_>, kind: &EntityTypeName) -> Result<Entity, String> {
    let roles = if who.operator {
        vec![RestrictedExpression::new_string("operator".into())]
    } else {
        Vec::new()
    };
    let attrs = HashMap::from([
        ("roles".to_owned(), RestrictedExpression::new_set(roles)),
        (
            "operator".to_owned(),
            RestrictedExpression::new_bool(who.operator),
        ),
    ]);
    let uid = EntityUid::from_type_name_and_id(kind.clone(), EntityId::new(who.id));
    Entity::new(uid, attrs, HashSet::new()).map_err(|e| e.to_string())
}

pub(crate) fn binding_entities(
    device_ix: usize,
    d: &DeviceShape,
) -> Result<Vec<BindingEnt>, PolicyError> {
    let schema_err = PolicyError::Schema;
    let device_uid = uid("Tether::Device", &d.device_id).map_err(schema_err)?;
    let device = Entity::new(
        device_uid.clone(),
        HashMap::from([
            (
                "mode".to_owned(),
                RestrictedExpression::new_string(d.mode.clone()),
            ),
            (
                "risk_class".to_owned(),
                RestrictedExpression::new_string(d.risk_class.clone()),
            ),
        ]),
        HashSet::new(),
    )
    .map_err(|e| PolicyError::Schema(e.to_string()))?;
    d.bindings
        .iter()
        .enumerate()
        .map(|(binding_ix, b)| {
            let id = format!("{}/{}/{}", d.device_id, b.capability, b.resource);
            let buid = uid("Tether::Binding", &id).map_err(PolicyError::Schema)?;
            let s = |v: &str| RestrictedExpression::new_string(v.to_owned());
            let attrs = HashMap::from([
                ("device".to_owned(), s(&d.device_id)),
                ("capability".to_owned(), s(&b.capability)),
                ("verb".to_owned(), s(&b.verb)),
                ("risk".to_owned(), s(&b.risk)),
                ("resource".to_owned(), s(&b.resource)),
                (
                    "stop_class".to_owned(),
                    RestrictedExpression::new_bool(b.flags.stop_class),
                ),
                (
                    "risk_reducing".to_owned(),
                    RestrictedExpression::new_bool(b.flags.risk_reducing),
                ),
                (
                    "safe_place".to_owned(),
                    RestrictedExpression::new_bool(b.flags.safe_place),
                ),
                (
                    "two_person".to_owned(),
                    RestrictedExpression::new_bool(b.flags.two_person),
                ),
            ]);
            let binding = Entity::new(buid.clone(), attrs, HashSet::from([device_uid.clone()]))
                .map_err(|e| PolicyError::Schema(e.to_string()))?;
            let mut ent = BindingEnt {
                device_ix,
                binding_ix,
                uid: buid,
                device_uid: device_uid.clone(),
                device_id: d.device_id.clone(),
                capability: b.capability.clone(),
                verb: b.verb.clone(),
                resource: b.resource.clone(),
                device: device.clone(),
                binding,
                context_without_input: Context::empty(),
                mode: d.mode.clone(),
                risk: b.risk.clone(),
                device_risk: d.risk_class.clone(),
                flags: b.flags,
            };
            ent.context_without_input = request_context(
                &ent,
                RestrictedExpression::new_record([])
                    .map_err(|e| PolicyError::Schema(e.to_string()))?,
            )
            .map_err(PolicyError::Schema)?;
            Ok(ent)
        })
        .collect()
}
