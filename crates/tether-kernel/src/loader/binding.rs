//! One binding: its capability (a catalogue class, or an extension that
//! carries its own input schema), its effective risk (CORE-030), the schema
//! it serves (the class merged with the binding, or the writable state
//! schema for configure), its effective limits (class, binding, envelope,
//! overlay), and the verb, flags and concurrency the kernel trusts.
//!
//! A defect is reported to the manifest's [`Ctx`] with the binding's field
//! (`bindings[i]. ...`, or the overlay file's entry for an overlay rule); a
//! binding that cannot be resolved yields `None` and is not served.
//!
//! **Never belongs here:** checks across bindings (pairs, envelope keys,
//! safety, -> `device` and `checks`), the schema algebra itself (->
//! `schema`), the limits grammar (-> `tether-limits`).

use super::checks::check_units;
use super::schema::{loosenings, merge_schema, writable_schema};
use super::{BindingSpec, Ctx};
use serde_json::{json, Value};
use tether_core::catalogue::{self, CapabilityClass, Flags, Verb};
use tether_core::manifest::{BindingDecl, Concurrency, DeviceManifest, RiskClass};
use tether_limits::{EffectiveLimits, SourceKind, SourceRules};

/// The catalogue class of a binding, when its capability is catalogued.
type Class = Option<&'static CapabilityClass>;

/// The field `f` of binding `i`.
fn at(i: usize, f: &str) -> String {
    format!("bindings[{i}].{f}")
}

/// Resolves binding `i` (`decl`) of device `m` against the catalogue and the
/// limits engine; `None` when it has a defect that leaves nothing to serve.
pub(super) fn resolve_binding(
    ctx: &mut Ctx<'_>,
    m: &DeviceManifest,
    i: usize,
    decl: &BindingDecl,
    state_schema: &Value,
    overlay_rules: &[(String, Value)],
    overlay_origin: &str,
) -> Option<BindingSpec> {
    let class = catalogue::class(&decl.capability_id);
    let is_ext = class.is_none();
    if is_ext && !extension_admissible(ctx, i, decl) {
        return None;
    }
    let risk = effective_risk(ctx, m, i, decl, class);
    let is_configure = decl.capability_id == catalogue::CONFIGURE;
    let served_schema = served_schema(ctx, i, decl, class, state_schema)?;
    if let Some(schema) = &decl.input_schema {
        check_units(ctx, &at(i, "input_schema"), schema, 0);
    }
    let sources = limit_sources(m, decl, class, overlay_rules);
    let limits = build_limits(ctx, i, decl, &served_schema, &sources, overlay_origin)?;
    let achieves = m
        .safety
        .safe_state
        .as_ref()
        .is_some_and(|s| s.achieved_by.iter().any(|a| a == &decl.capability_id));
    let verb = class.map_or(Verb::Action, |c| c.verb);
    let flags = trusted_flags(class, decl);
    let kind = super::kind::command_kind(ctx, m, i, decl, verb == Verb::Read && !is_ext, flags);
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
        concurrency: concurrency(m, decl, verb, flags),
        max_duration_ms: decl.max_duration_ms,
        kind,
        abortable: decl.abortable.unwrap_or(true),
        achieves_safe_state: achieves,
        description: if decl.description.is_empty() {
            class.map(|c| c.description.clone()).unwrap_or_default()
        } else {
            decl.description.clone()
        },
    })
}

/// A capability the catalogue does not know: its id must have the form of
/// one, and the binding must carry the input schema the class would have.
fn extension_admissible(ctx: &mut Ctx<'_>, i: usize, decl: &BindingDecl) -> bool {
    if !(catalogue::is_extension_id(&decl.capability_id)
        || catalogue::is_catalogue_id(&decl.capability_id))
    {
        ctx.defect(
            at(i, "capability_id"),
            format!(
                "`{}` is not a capability id (cap.<class>.v<N> or x-cap.<owner>.<name>.v<N>)",
                decl.capability_id
            ),
        );
        return false;
    }
    if decl.input_schema.is_none() {
        ctx.defect(
            at(i, "input_schema"),
            format!(
                "`{}` is not in the catalogue, so the binding must carry an inline input_schema",
                decl.capability_id
            ),
        );
        return false;
    }
    true
}

/// OpenMHS CORE-030: a binding's risk is never below the class floor or the
/// device's declared risk. A binding risk below the floor, or a device risk
/// below the binding's, is a defect; the result is the highest of the three.
fn effective_risk(
    ctx: &mut Ctx<'_>,
    m: &DeviceManifest,
    i: usize,
    decl: &BindingDecl,
    class: Class,
) -> RiskClass {
    let floor = class.map(|c| c.risk_floor).unwrap_or(RiskClass::R0);
    if let Some(r) = decl.risk {
        if r < floor {
            ctx.defect(at(i, "risk"), format!("binding risk {r} is below the class floor {floor}; a binding may raise a class risk, never lower it"));
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
    // What the device risks, every call on it risks: the policy, the permit
    // rule and the reference weigh this.
    declared.max(m.risk_class)
}

/// The input schema the binding serves: the resource's writable schema for
/// configure, else the binding's schema merged over its class (a loosening
/// of the class is a defect), or whichever of the two exists. `None` when
/// neither does (an extension without a schema is refused before this).
fn served_schema(
    ctx: &mut Ctx<'_>,
    i: usize,
    decl: &BindingDecl,
    class: Class,
    state_schema: &Value,
) -> Option<Value> {
    if decl.capability_id == catalogue::CONFIGURE {
        if decl.input_schema.is_some() {
            ctx.defect(
                at(i, "input_schema"),
                "a configure binding takes its input schema from the resource's state schema",
            );
        }
        return Some(writable_schema(state_schema));
    }
    match (class, &decl.input_schema) {
        (Some(c), Some(b)) => {
            for loosened in loosenings(&c.input_schema, b, "") {
                ctx.defect(at(i, "input_schema"), loosened);
            }
            Some(merge_schema(&c.input_schema, b))
        }
        (Some(c), None) => Some(c.input_schema.clone()),
        (None, Some(b)) => Some(b.clone()),
        (None, None) => None,
    }
}

/// The limit sources of a binding, lowest first: its class, the binding
/// itself, each envelope key that matches it, the operator overlay.
fn limit_sources(
    m: &DeviceManifest,
    decl: &BindingDecl,
    class: Class,
    overlay_rules: &[(String, Value)],
) -> Vec<SourceRules> {
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
            let pattern = if key.ends_with('*') {
                key.clone()
            } else {
                String::new()
            };
            sources.push(SourceRules {
                kind: SourceKind::Envelope { pattern },
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
    sources
}

/// The effective limits over the served schema; every error of the limits
/// engine is a defect, and then there are none.
fn build_limits(
    ctx: &mut Ctx<'_>,
    i: usize,
    decl: &BindingDecl,
    served_schema: &Value,
    sources: &[SourceRules],
    overlay_origin: &str,
) -> Option<EffectiveLimits> {
    match tether_limits::build(served_schema, sources) {
        Ok(l) => Some(l),
        Err(errors) => {
            for e in errors {
                // A defect of the overlay's rule is the overlay file's: named
                // as the overlay's other defects are.
                let field = if e.source == "overlay" && !overlay_origin.is_empty() {
                    format!("{overlay_origin} -> {} -> {}", decl.capability_id, e.path)
                } else {
                    at(i, &format!("limits.{}", e.path))
                };
                ctx.defect(
                    field,
                    format!("[{}] {} ({})", e.reason.as_str(), e.message, e.source),
                );
            }
            None
        }
    }
}

/// The flags the kernel trusts: the class's. An extension's declared flags
/// are never trusted to exempt it from anything; the one flag that only
/// restricts (two_person: a quorum of at least two) is honoured, since
/// ignoring it would fail open.
fn trusted_flags(class: Class, decl: &BindingDecl) -> Flags {
    class.map(|c| c.flags).unwrap_or_else(|| Flags {
        two_person: decl.flags.is_some_and(|f| f.two_person),
        ..Flags::default()
    })
}

/// A stop class always runs shared; otherwise the declared concurrency, by
/// default shared for a read, exclusive on a device where something physical
/// may move, shared elsewhere.
fn concurrency(m: &DeviceManifest, decl: &BindingDecl, verb: Verb, flags: Flags) -> Concurrency {
    if flags.stop_class {
        return Concurrency::Shared;
    }
    let default = if verb == Verb::Read {
        Concurrency::Shared
    } else if m.mode.is_physical() {
        Concurrency::Exclusive
    } else {
        Concurrency::Shared
    };
    decl.concurrency.unwrap_or(default)
}
