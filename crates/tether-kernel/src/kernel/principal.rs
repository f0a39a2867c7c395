//! Who is asking: [`Principal`] and [`PrincipalKind`].
//!
//! **Owns:** the principal a surface hands the kernel, its evidence form,
//! and the narrowing of a principal seen through a model-driven surface.
//! **Never belongs here:** tokens and authentication (`tether-server`),
//! what a principal may do (`check/policy.rs`, grants in `admit/`).
//! **Fail-closed rule:** the evidence form never carries credentials, and
//! [`Principal::model_controlled`] only ever narrows (never an operator).

use serde_json::{json, Value};

/// A principal (who is asking). Issue-4 adds tokens; today every caller is
/// the single local agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// Stable id.
    pub id: String,
    /// human, agent or service.
    pub kind: PrincipalKind,
    /// Whether this human holds the operator role.
    pub operator: bool,
}

/// Kinds of principal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrincipalKind {
    /// A person.
    Human,
    /// A model-controlled caller.
    Agent,
    /// Another program.
    Service,
}

impl PrincipalKind {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            PrincipalKind::Human => "human",
            PrincipalKind::Agent => "agent",
            PrincipalKind::Service => "service",
        }
    }
}

impl Principal {
    /// The single local caller when no principals are configured: an agent.
    pub fn local_agent() -> Self {
        Self {
            id: "local".into(),
            kind: PrincipalKind::Agent,
            operator: false,
        }
    }
    /// The same principal as seen through a surface a model drives (MCP):
    /// an agent, never an operator, whatever its token names. A model that
    /// holds a person's token acts as a model (DESIGN §1), for the policy
    /// (`Tether::Agent`), for approvals and for resets alike.
    #[must_use]
    pub fn model_controlled(self) -> Self {
        Self {
            id: self.id,
            kind: PrincipalKind::Agent,
            operator: false,
        }
    }
    /// Evidence form (never carries credentials).
    pub fn to_json(&self) -> Value {
        json!({"id": self.id, "kind": self.kind.as_str()})
    }
}
