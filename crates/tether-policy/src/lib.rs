//! # tether-policy — the ControlPolicy
//!
//! Owns the decision *who may do what*: Cedar policies, validated against a
//! Tether schema generated from the served cell, turned into **allow**,
//! **hold** or **deny** with the determining policy ids and a reason.
//!
//! Decision rule: any matching `forbid` → deny; otherwise any matching
//! `permit` annotated `@hold("why")` → hold (`@quorum("N")` asks for N
//! distinct approvers); otherwise any matching `permit` → allow; otherwise
//! deny. A policy that errors while evaluated makes the decision deny: a check
//! that cannot be evaluated refuses.
//!
//! **Never belongs here:** I/O, approvals bookkeeping, sessions, limits (the
//! kernel owns those; this crate is pure and answers one question).
//!
//! **Depends on:** cedar-policy, serde_json. **Depended on by:** tether-kernel,
//! tether-cli (for `tether check`).
#![deny(missing_docs)]

mod input;
pub mod shape;
mod slice;

#[cfg(test)]
mod differential;

pub use shape::{BindingShape, CellShape, DeviceShape, Flags};

use cedar_policy::{
    Authorizer, Context, Decision as CedarDecision, Effect, Entities, Entity, EntityId,
    EntityTypeName, EntityUid, Policy, PolicyId, PolicySet, Request, RestrictedExpression, Schema,
    ValidationMode, Validator,
};
use input::CType;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;
use std::str::FromStr;
use std::sync::Arc;

/// Name shown for the built-in policy.
pub const DEFAULT_POLICY_NAME: &str = "default.cedar (built in)";
/// Largest quorum a policy may ask for.
pub const QUORUM_MAX: u32 = 16;
/// Most policies in one set (a bound on decision cost).
pub const POLICIES_MAX: usize = 10_000;
/// (principal id, kind, operator, device, binding).
type EntityKey = (String, u8, bool, usize, usize);
/// The principal's uid and the request's entities.
type CachedEntities = (EntityUid, std::sync::Arc<Entities>);

/// Most (principal, binding) entity sets kept for reuse.
const ENTITY_CACHE_MAX: usize = 4096;

/// Most (request shape × policy) judgements made while slicing at load; a
/// larger cell and policy together skip slicing and evaluate the whole set
/// (slower decisions, same answers), so loading stays bounded.
const SLICE_WORK_MAX: usize = 4_000_000;

/// Request shapes per binding: three principal kinds × three actions.
const SHAPES_PER_BINDING: usize = 9;

/// The default policy's source text.
pub fn default_source() -> &'static str {
    include_str!("../default.cedar")
}

/// Kind of principal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrincipalKind {
    /// An agent (a model or its harness).
    Agent,
    /// A person.
    Human,
    /// Another program.
    Service,
}

impl PrincipalKind {
    fn type_name(self) -> &'static str {
        match self {
            Self::Agent => "Tether::Agent",
            Self::Human => "Tether::Human",
            Self::Service => "Tether::Service",
        }
    }
}

/// Who asks.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    /// Principal id.
    pub id: &'a str,
    /// Kind.
    pub kind: PrincipalKind,
    /// Whether the principal holds the operator role.
    pub operator: bool,
}

/// What is asked (the Cedar action).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Reading state.
    Read,
    /// Writing configuration.
    Write,
    /// Running an action.
    Command,
}

impl Action {
    /// The action id.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Command => "command",
        }
    }
}

/// The outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Go on.
    Allow,
    /// Wait for people.
    Hold,
    /// Refuse.
    Deny,
}

impl Decision {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Hold => "hold",
            Self::Deny => "deny",
        }
    }
}

/// A decision with its reasons.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Allow, hold or deny.
    pub decision: Decision,
    /// The determining policy ids (forbids for a deny, holds for a hold, the
    /// satisfied permits for an allow; empty for the default deny).
    pub policies: Vec<String>,
    /// Why, in words.
    pub reason: String,
    /// Distinct approvers a hold needs (0 unless held).
    pub quorum: u32,
}

impl Verdict {
    /// The evidence and receipt view.
    pub fn to_json(&self) -> Value {
        let mut v = json!({"decision": self.decision.as_str(), "policies": self.policies, "reason": self.reason});
        if self.decision == Decision::Hold {
            v["quorum"] = json!(self.quorum);
        }
        v
    }

    fn deny(policies: Vec<String>, reason: String) -> Self {
        Self {
            decision: Decision::Deny,
            policies,
            reason,
            quorum: 0,
        }
    }
}

/// A policy that cannot be used; start-up refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The text does not parse as Cedar.
    #[error("policy {name}: does not parse: {message}")]
    Parse {
        /// Policy file name.
        name: String,
        /// Parser messages.
        message: String,
    },
    /// The policies do not validate against the Tether schema.
    #[error("policy {name}: does not validate against the Tether schema: {message}")]
    Validation {
        /// Policy file name.
        name: String,
        /// Validator messages, one per line.
        message: String,
    },
    /// An annotation is misused (`@hold` on a forbid, a bad `@quorum`, a repeated `@id`).
    #[error("policy {name}: policy `{policy}`: {message}")]
    Annotation {
        /// Policy file name.
        name: String,
        /// Policy id.
        policy: String,
        /// What is wrong.
        message: String,
    },
    /// The generated schema failed (a bug, or a cell Cedar cannot describe).
    #[error("the Tether schema for this cell could not be built: {0}")]
    Schema(String),
}

#[derive(Debug, Clone)]
struct Meta {
    hold: Option<String>,
    quorum: u32,
    reason: Option<String>,
}

#[derive(Debug, Clone)]
struct BindingEnt {
    device_ix: usize,
    binding_ix: usize,
    uid: EntityUid,
    device_uid: EntityUid,
    device_id: String,
    capability: String,
    verb: String,
    resource: String,
    device: Entity,
    binding: Entity,
    /// The context of a request whose input no policy reads.
    context_without_input: Context,
    mode: String,
    risk: String,
    device_risk: String,
    flags: Flags,
}

/// A loaded, validated ControlPolicy for one cell.
#[derive(Debug)]
pub struct ControlPolicy {
    name: String,
    meta: HashMap<String, Meta>,
    bindings: Vec<Vec<BindingEnt>>,
    /// Per binding, per (principal kind, action): the policies that may apply
    /// (see `slice`). Identical slices are shared.
    slices: Vec<Vec<[Arc<Slice>; SHAPES_PER_BINDING]>>,
    actions: [EntityUid; 3],
    /// Entities of recent (principal, binding) pairs: they depend on nothing
    /// but the principal's kind and role and the binding's static facts.
    entity_cache: std::sync::Mutex<HashMap<EntityKey, CachedEntities>>,
    /// Principal type names, parsed once: parsing a name runs Cedar's parser,
    /// which costs far more than a decision.
    principal_types: [EntityTypeName; 3],
    authorizer: Authorizer,
}

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

    /// The policy file's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Policy ids in the set.
    pub fn policy_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.meta.keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Decides one request on binding `binding` of device `device` (indices
    /// in the cell's order). Never panics; anything that cannot be evaluated
    /// denies.
    pub fn decide(
        &self,
        who: &Subject<'_>,
        action: Action,
        device: usize,
        binding: usize,
        input: &Value,
    ) -> Verdict {
        self.decide_shared(who, action, device, binding, input)
            .0
            .into_owned()
    }

    /// [`ControlPolicy::decide`] with the verdict's evidence form
    /// ([`Verdict::to_json`]). A verdict the request's shape fixes (worked
    /// out at load) is lent, with its JSON shared, so the common request
    /// builds neither.
    pub fn decide_shared(
        &self,
        who: &Subject<'_>,
        action: Action,
        device: usize,
        binding: usize,
        input: &Value,
    ) -> (std::borrow::Cow<'_, Verdict>, Arc<Value>) {
        use std::borrow::Cow;
        let verdict = match self.slice_for(who, action, device, binding) {
            Ok((b, slice)) => {
                if let (Some(fixed), Some(json)) = (&slice.fixed, &slice.fixed_json) {
                    return (Cow::Borrowed(fixed), Arc::clone(json));
                }
                self.decide_on(slice, who, action, b, input)
            }
            Err(deny) => deny,
        };
        let json = Arc::new(verdict.to_json());
        (Cow::Owned(verdict), json)
    }

    /// The binding and the policy slice of a request's shape; a deny when
    /// either is unknown.
    fn slice_for(
        &self,
        who: &Subject<'_>,
        action: Action,
        device: usize,
        binding: usize,
    ) -> Result<(&BindingEnt, &Slice), Verdict> {
        let Some(b) = self.bindings.get(device).and_then(|d| d.get(binding)) else {
            return Err(Verdict::deny(
                Vec::new(),
                "the binding is unknown to the policy".into(),
            ));
        };
        let Some(slice) = self
            .slices
            .get(device)
            .and_then(|d| d.get(binding))
            .and_then(|shapes| shapes.get(shape_index(who.kind, action)))
        else {
            return Err(Verdict::deny(
                Vec::new(),
                "no policy slice for this request".into(),
            ));
        };
        Ok((b, slice))
    }

    fn decide_on(
        &self,
        slice: &Slice,
        who: &Subject<'_>,
        action: Action,
        b: &BindingEnt,
        input: &Value,
    ) -> Verdict {
        if let Some(fixed) = &slice.fixed {
            return fixed.clone();
        }
        match self.evaluate(slice, who, action, b, input) {
            Ok(v) => v,
            Err(why) => Verdict::deny(
                Vec::new(),
                format!("the policy could not be evaluated: {why}"),
            ),
        }
    }

    fn evaluate(
        &self,
        slice: &Slice,
        who: &Subject<'_>,
        action: Action,
        b: &BindingEnt,
        input: &Value,
    ) -> Result<Verdict, String> {
        let (principal_uid, entities) = self.entities_for(who, b)?;
        let context = match &slice.input_type {
            // Nothing in the slice reads the input: the binding's context
            // with an empty input, built once at load.
            None => b.context_without_input.clone(),
            Some(t) => {
                let input = input::convert(input, t, 0)?
                    .map_or_else(|| RestrictedExpression::new_record([]), Ok)
                    .map_err(|e| e.to_string())?;
                request_context(b, input)?
            }
        };
        let action_uid = match action {
            Action::Read => &self.actions[0],
            Action::Write => &self.actions[1],
            Action::Command => &self.actions[2],
        };
        let request = Request::new(
            principal_uid,
            action_uid.clone(),
            b.uid.clone(),
            context,
            None,
        )
        .map_err(|e| e.to_string())?;
        let response = self
            .authorizer
            .is_authorized(&request, &slice.set, &entities);
        let errors: Vec<String> = response
            .diagnostics()
            .errors()
            .map(|e| e.to_string())
            .collect();
        if !errors.is_empty() {
            return Err(errors.join("; "));
        }
        let mut determining: Vec<String> = response
            .diagnostics()
            .reason()
            .map(|id| id.to_string())
            .collect();
        determining.sort();
        Ok(verdict_from(&self.meta, response.decision(), determining))
    }

    fn entities_for(
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

/// The verdict for Cedar's `decision` with its determining policies (sorted).
fn verdict_from(
    meta: &HashMap<String, Meta>,
    decision: CedarDecision,
    determining: Vec<String>,
) -> Verdict {
    match decision {
        CedarDecision::Deny if determining.is_empty() => Verdict::deny(
            Vec::new(),
            "no policy permits this request (default deny)".into(),
        ),
        CedarDecision::Deny => {
            let reason = reasons(meta, &determining, |m| m.reason.clone(), "forbidden by");
            Verdict::deny(determining, reason)
        }
        CedarDecision::Allow => allow_or_hold(meta, determining),
    }
}

fn allow_or_hold(meta: &HashMap<String, Meta>, permits: Vec<String>) -> Verdict {
    let holds: Vec<String> = permits
        .iter()
        .filter(|id| meta.get(*id).is_some_and(|m| m.hold.is_some()))
        .cloned()
        .collect();
    if holds.is_empty() {
        let reason = reasons(meta, &permits, |m| m.reason.clone(), "permitted by");
        return Verdict {
            decision: Decision::Allow,
            policies: permits,
            reason,
            quorum: 0,
        };
    }
    let quorum = holds
        .iter()
        .filter_map(|id| meta.get(id))
        .map(|m| m.quorum)
        .max()
        .unwrap_or(1)
        .max(1);
    let reason = reasons(meta, &holds, |m| m.hold.clone(), "held by");
    Verdict {
        decision: Decision::Hold,
        policies: holds,
        reason,
        quorum,
    }
}

fn reasons(
    meta: &HashMap<String, Meta>,
    ids: &[String],
    pick: impl Fn(&Meta) -> Option<String>,
    verb: &str,
) -> String {
    let mut out = String::new();
    for id in ids {
        if !out.is_empty() {
            out.push_str("; ");
        }
        match meta.get(id).and_then(&pick) {
            Some(r) => out.push_str(&r),
            None => {
                let _ = write!(out, "{verb} policy `{id}`");
            }
        }
    }
    out
}

/// The policies one request shape can meet, and the input fields they read.
#[derive(Debug)]
struct Slice {
    set: PolicySet,
    /// The input type narrowed to the fields this slice's policies name;
    /// `None` when none reads `context.input` (then nothing is converted).
    input_type: Option<CType>,
    /// The decision, when it is the same for every request of the shape
    /// (every policy in the slice is certainly satisfied): Cedar's answer,
    /// worked out once at load.
    fixed: Option<Verdict>,
    /// `fixed`'s evidence JSON, built once and shared by every request.
    fixed_json: Option<Arc<Value>>,
}

impl Slice {
    fn new(set: PolicySet, input: &CType) -> Self {
        let fields = referenced_input_fields(&set);
        Self {
            input_type: narrow(input.clone(), &fields),
            set,
            fixed: None,
            fixed_json: None,
        }
    }

    /// Cedar's decision when every policy in `set` is satisfied: any forbid
    /// denies, naming every forbid; else the permits allow or hold; an empty
    /// set denies by default.
    fn certain_verdict(set: &PolicySet, meta: &HashMap<String, Meta>) -> Verdict {
        let ids = |effect: Effect| -> Vec<String> {
            let mut v: Vec<String> = set
                .policies()
                .filter(|p| p.effect() == effect)
                .map(|p| p.id().to_string())
                .collect();
            v.sort();
            v
        };
        let forbids = ids(Effect::Forbid);
        if forbids.is_empty() {
            let permits = ids(Effect::Permit);
            let decision = if permits.is_empty() {
                CedarDecision::Deny
            } else {
                CedarDecision::Allow
            };
            verdict_from(meta, decision, permits)
        } else {
            verdict_from(meta, CedarDecision::Deny, forbids)
        }
    }
}

/// Where a (principal kind, action) pair sits in a binding's slices.
fn shape_index(kind: PrincipalKind, action: Action) -> usize {
    let k = match kind {
        PrincipalKind::Agent => 0,
        PrincipalKind::Human => 1,
        PrincipalKind::Service => 2,
    };
    let a = match action {
        Action::Read => 0,
        Action::Write => 1,
        Action::Command => 2,
    };
    k * 3 + a
}

/// Slices every binding's request shapes (see `slice`); past
/// `SLICE_WORK_MAX` judgements every shape gets the whole set instead.
fn build_slices(
    set: &PolicySet,
    meta: &HashMap<String, Meta>,
    bindings: &[Vec<BindingEnt>],
    input: &CType,
    kinds: &[EntityTypeName; 3],
    actions: &[EntityUid; 3],
    work_max: usize,
) -> Result<Vec<Vec<[Arc<Slice>; SHAPES_PER_BINDING]>>, String> {
    let policies: Vec<&Policy> = set.policies().collect();
    let binding_count: usize = bindings.iter().map(Vec::len).sum();
    let work = binding_count
        .saturating_mul(SHAPES_PER_BINDING)
        .saturating_mul(policies.len());
    let slicing = work <= work_max;
    let prepared: Vec<slice::Prepared> = if slicing {
        policies.iter().map(|p| slice::Prepared::new(p)).collect()
    } else {
        Vec::new()
    };
    let whole = (!slicing).then(|| Arc::new(Slice::new(set.clone(), input)));
    // Shared by (kept policies, decided at load): the same policies may be
    // certain for one shape and depend on the request for another.
    let mut shared: HashMap<(Vec<usize>, bool), Arc<Slice>> = HashMap::new();
    let mut out = Vec::with_capacity(bindings.len());
    for device in bindings {
        let mut per_device = Vec::with_capacity(device.len());
        for b in device {
            let mut shapes: Vec<Arc<Slice>> = Vec::with_capacity(SHAPES_PER_BINDING);
            for kind in kinds {
                for action in actions {
                    if let Some(whole) = &whole {
                        shapes.push(Arc::clone(whole));
                        continue;
                    }
                    let shape = b.shape(kind, action);
                    let judged: Vec<(usize, slice::Tri)> = prepared
                        .iter()
                        .enumerate()
                        .map(|(i, p)| (i, p.judge(&shape)))
                        .filter(|(_, t)| *t != slice::Tri::False)
                        .collect();
                    let certain = judged.iter().all(|(_, t)| *t == slice::Tri::True);
                    let key = (judged.iter().map(|(i, _)| *i).collect::<Vec<_>>(), certain);
                    if let Some(s) = shared.get(&key) {
                        shapes.push(Arc::clone(s));
                        continue;
                    }
                    let subset =
                        PolicySet::from_policies(key.0.iter().map(|&i| policies[i].clone()))
                            .map_err(|e| e.to_string())?;
                    let mut s = Slice::new(subset, input);
                    if certain {
                        let verdict = Slice::certain_verdict(&s.set, meta);
                        s.fixed_json = Some(Arc::new(verdict.to_json()));
                        s.fixed = Some(verdict);
                    }
                    let s = Arc::new(s);
                    shared.insert(key, Arc::clone(&s));
                    shapes.push(s);
                }
            }
            let shapes: [Arc<Slice>; SHAPES_PER_BINDING] = shapes
                .try_into()
                .map_err(|_| "a binding has the wrong number of request shapes".to_owned())?;
            per_device.push(shapes);
        }
        out.push(per_device);
    }
    Ok(out)
}

impl BindingEnt {
    /// The fixed facts of a request on this binding by `kind` doing `action`.
    fn shape<'a>(&'a self, kind: &'a EntityTypeName, action: &'a EntityUid) -> slice::Shape<'a> {
        use slice::Known;
        let text = |v: &str| Known::Str(v.to_owned());
        slice::Shape {
            principal_type: kind,
            action,
            binding: &self.uid,
            device: &self.device_uid,
            resource_attrs: vec![
                ("device", text(&self.device_id)),
                ("capability", text(&self.capability)),
                ("verb", text(&self.verb)),
                ("risk", text(&self.risk)),
                ("resource", text(&self.resource)),
                ("stop_class", Known::Bool(self.flags.stop_class)),
                ("risk_reducing", Known::Bool(self.flags.risk_reducing)),
                ("safe_place", Known::Bool(self.flags.safe_place)),
                ("two_person", Known::Bool(self.flags.two_person)),
            ],
            context_attrs: vec![
                ("mode", text(&self.mode)),
                ("risk_class", text(&self.risk)),
                ("device_risk_class", text(&self.device_risk)),
            ],
            flags: vec![
                ("stop_class", self.flags.stop_class),
                ("risk_reducing", self.flags.risk_reducing),
                ("safe_place", self.flags.safe_place),
                ("two_person", self.flags.two_person),
            ],
        }
    }
}

/// The Tether schema (Cedar schema syntax) for a cell, as `tether check` and
/// the docs print it.
///
/// # Errors
/// None today; kept fallible for cells Cedar cannot describe.
pub fn schema_text(cell: &CellShape) -> String {
    schema_source(&input_type(cell))
}

/// Top-level input fields the policies name (`context.input.x`,
/// `context.input has x`, `context.input["x"]`); `None` when some policy uses
/// `context.input` as a whole, so every field must be given. A policy can
/// observe only the fields it names, so leaving the others out changes no
/// decision and saves converting numbers nobody reads.
fn referenced_input_fields(set: &PolicySet) -> Option<BTreeSet<String>> {
    let mut fields = BTreeSet::new();
    for p in set.policies() {
        let text = p.to_string();
        // Every mention of the word `input` must be a `context.input<field>`
        // form this scan understands; anything else (`context["input"]`,
        // `context has input`, spacing it does not expect) means all fields.
        if word_count(&text, "input") != text.matches("context.input").count() {
            return None;
        }
        let mut rest = text.as_str();
        while let Some(at) = rest.find("context.input") {
            rest = &rest[at + "context.input".len()..];
            fields.insert(next_field(rest)?);
        }
    }
    Some(fields)
}

/// How often `word` appears as a whole identifier (not inside another one).
fn word_count(text: &str, word: &str) -> usize {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word)
        .filter(|(at, _)| {
            let before = text[..*at].chars().next_back();
            let after = text[at + word.len()..].chars().next();
            !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
        })
        .count()
}

/// The field named right after `context.input`, or `None` when it is used whole.
fn next_field(rest: &str) -> Option<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let quoted = |s: &str| -> Option<String> {
        let s = s.strip_prefix('"')?;
        let end = s.find('"')?;
        let name = &s[..end];
        (!name.contains('\\')).then(|| name.to_owned())
    };
    if let Some(r) = rest.strip_prefix('.') {
        let name = ident(r);
        return (!name.is_empty()).then_some(name);
    }
    if let Some(r) = rest.strip_prefix('[') {
        return quoted(r.trim_start());
    }
    let trimmed = rest.trim_start();
    if let Some(r) = trimmed.strip_prefix("has") {
        let r = r.trim_start();
        if r.starts_with('"') {
            return quoted(r);
        }
        let name = ident(r);
        return (!name.is_empty()).then_some(name);
    }
    None
}

fn narrow(t: CType, fields: &Option<BTreeSet<String>>) -> Option<CType> {
    match (t, fields) {
        (t, None) => Some(t),
        (_, Some(f)) if f.is_empty() => None,
        (CType::Record(all), Some(f)) => Some(CType::Record(
            all.into_iter().filter(|(k, _)| f.contains(k)).collect(),
        )),
        (t, Some(_)) => Some(t),
    }
}

fn input_type(cell: &CellShape) -> CType {
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

fn build_schema(input: &CType) -> Result<Schema, PolicyError> {
    Schema::from_cedarschema_str(&schema_source(input))
        .map(|(s, _warnings)| s)
        .map_err(|e| PolicyError::Schema(format!("{e:?}")))
}

fn parse(name: &str, text: &str) -> Result<(PolicySet, HashMap<String, Meta>), PolicyError> {
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

/// The annotations Tether reads. Any other is refused: a misspelt `@hold`
/// (`@Hold`, `@holdd`) would otherwise leave a plain permit, which allows
/// what its author meant to hold.
const ANNOTATIONS: [&str; 4] = ["id", "reason", "hold", "quorum"];

fn policy_meta(p: &Policy) -> Result<Meta, String> {
    if let Some((unknown, _)) = p.annotations().find(|(k, _)| !ANNOTATIONS.contains(k)) {
        return Err(format!(
            "unknown annotation @{unknown}; Tether reads @id, @reason, @hold and @quorum \
             (names are case-sensitive)"
        ));
    }
    let hold = p.annotation("hold").map(str::to_owned);
    let quorum_text = p.annotation("quorum");
    if p.effect() == Effect::Forbid && (hold.is_some() || quorum_text.is_some()) {
        return Err("@hold and @quorum belong on permit policies, not forbid".into());
    }
    if quorum_text.is_some() && hold.is_none() {
        return Err("@quorum needs @hold on the same policy".into());
    }
    if hold.as_deref().is_some_and(|h| h.trim().is_empty()) {
        return Err("@hold needs a reason, e.g. @hold(\"an operator must approve\")".into());
    }
    let quorum = match quorum_text {
        None => 1,
        Some(q) => match q.trim().parse::<u32>() {
            Ok(n) if (1..=QUORUM_MAX).contains(&n) => n,
            _ => {
                return Err(format!(
                    "@quorum(\"{q}\") must be a whole number from 1 to {QUORUM_MAX}"
                ))
            }
        },
    };
    Ok(Meta {
        hold,
        quorum,
        reason: p.annotation("reason").map(str::to_owned),
    })
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

fn uid(type_name: &str, id: &str) -> Result<EntityUid, String> {
    let t = EntityTypeName::from_str(type_name).map_err(|e| e.to_string())?;
    Ok(EntityUid::from_type_name_and_id(t, EntityId::new(id)))
}

fn action_uid(a: Action) -> Result<EntityUid, PolicyError> {
    uid("Tether::Action", a.as_str()).map_err(PolicyError::Schema)
}

/// The request context: the input and the binding's fixed facts.
fn request_context(b: &BindingEnt, input: RestrictedExpression) -> Result<Context, String> {
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

fn type_name(name: &str) -> Result<EntityTypeName, PolicyError> {
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

fn binding_entities(device_ix: usize, d: &DeviceShape) -> Result<Vec<BindingEnt>, PolicyError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(text: &str) -> Option<BTreeSet<String>> {
        referenced_input_fields(&PolicySet::from_str(text).expect("parses"))
    }

    #[test]
    fn only_named_input_fields_are_converted_and_anything_unusual_means_all() {
        let named = fields(
            r#"permit(principal, action, resource) when { context.input has speed && context.input.speed.greaterThan(decimal("1.0")) && context.input has "odd-name" && context.input["odd-name"] == "x" };"#,
        )
        .expect("named");
        assert_eq!(named.into_iter().collect::<Vec<_>>(), ["odd-name", "speed"]);
        assert_eq!(
            fields("permit(principal, action, resource);"),
            Some(BTreeSet::new())
        );
        for whole in [
            r#"permit(principal, action, resource) when { context["input"]["speed"] == 1 };"#,
            r#"permit(principal, action, resource) when { context has input };"#,
            r#"permit(principal, action, resource) when { context.input == {} };"#,
        ] {
            assert_eq!(fields(whole), None, "{whole}");
        }
    }
}
