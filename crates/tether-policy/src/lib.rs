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
//! **Depends on:** no Tether crate (cedar-policy, serde_json, thiserror).
//! **Depended on by:** tether-kernel (`tether check` reaches it through the
//! kernel).
//!
//! ## Modules
//!
//! | module | owns |
//! |---|---|
//! | `load` | [`ControlPolicy::load`]: parse, validate, build what deciding needs |
//! | `annotations` | `@id`, `@reason`, `@hold`, `@quorum`; Cedar's answer → [`Verdict`] |
//! | `schema` | the Tether Cedar schema generated from the cell ([`schema_text`]) |
//! | `entities` | the binding, device and principal entities and the request context |
//! | `slice` | the per-shape policy slices built at load, and the fields they read |
//! | `slice::judge` | one policy against one request shape, in three values |
//! | `decide` | [`ControlPolicy::decide`]: one request → [`Verdict`] |
//! | `input` | the input's JSON → Cedar conversion and its type |
//! | [`shape`] | the cell as the policy sees it ([`CellShape`]) |
#![deny(missing_docs)]

mod annotations;
mod decide;
mod entities;
mod input;
mod load;
mod schema;
pub mod shape;
mod slice;

#[cfg(test)]
mod differential;

pub use schema::schema_text;
pub use shape::{BindingShape, CellShape, DeviceShape, Flags};

use annotations::Meta;
use cedar_policy::{Authorizer, EntityTypeName, EntityUid};
use entities::{BindingEnt, CachedEntities, EntityKey};
use serde_json::{json, Value};
use slice::{Slice, SHAPES_PER_BINDING};
use std::collections::HashMap;
use std::sync::Arc;

/// Name shown for the built-in policy.
pub const DEFAULT_POLICY_NAME: &str = "default.cedar (built in)";
/// Largest quorum a policy may ask for.
pub const QUORUM_MAX: u32 = 16;
/// Most policies in one set (a bound on decision cost).
pub const POLICIES_MAX: usize = 10_000;

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
}
