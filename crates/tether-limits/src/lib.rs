//! The limits grammar and engine of Tether.
//!
//! `tether-limits` turns declared limits into a verdict on one input. It owns:
//!
//! - the **rule grammar** ([`rule`]): a closed object `{min, max, allowed,
//!   unit, reason, source, ref, names, per}` or the literal
//!   `"operator_required"`;
//! - **limit paths** ([`path`]): `field`, `a.b`, `a[*]`, `a[3]`, `a.b[*].c`;
//! - the **unit table** ([`units`]) and conversion within a dimension;
//! - the **intersection of sources** ([`build`]): class, binding, device
//!   envelopes and the narrow-only operator overlay become one
//!   [`EffectiveLimits`], or every defect as a [`LoadError`];
//! - **evaluation** ([`EffectiveLimits::check`]): every array element and
//!   every nested leaf, schema defaults of omitted members included;
//! - **cumulative budgets** ([`budget`]): windows, the amount a call draws,
//!   and a pure in-memory ledger.
//!
//! **Architecture Invariant:** this crate does no I/O, reads no clock and
//! starts no thread. Callers pass `now_ms`, so every verdict can be replayed
//! from the evidence log. It holds no store (the kernel journals budget draws
//! through `tether-store`) and no policy (allow / hold / deny is
//! `tether-policy`'s); it never decides a refusal code either: it reports
//! violations and the kernel maps them to `MHS.SAFETY.*` codes.
//!
//! **Depended on by:** `tether-kernel`, and tools that render or check
//! limits (the reference-file generator, `tether check`). It depends on no
//! other workspace crate.
//!
//! ```
//! use serde_json::json;
//! use tether_limits::{build, SourceKind, SourceRules};
//!
//! let schema = json!({"type": "object", "properties": {
//!     "speed": {"type": "number", "x-mhs-unit": "rad/s"}}});
//! let class = SourceRules::regular(SourceKind::Class, vec![
//!     ("speed".to_string(), json!({"max": 2.0, "unit": "rad/s"})),
//! ]);
//! let limits = build(&schema, &[class]).expect("valid limits");
//! assert!(limits.check(&json!({"speed": 1.5})).is_ok());
//! let refused = limits.check(&json!({"speed": 3.0})).unwrap_err();
//! assert_eq!(refused.first.kind.as_str(), "max");
//! ```
#![deny(missing_docs)]

use std::fmt;

use serde_json::Value;

pub mod budget;
mod engine;
mod error;
pub mod path;
pub mod rule;
mod schema;
pub mod units;
mod violation;
mod walk;

pub use budget::{BudgetRule, Window};
pub use engine::{build, strip_limited_bounds, EffectiveLimits, EffectiveRule};
pub use error::{LoadError, LoadErrorKind};
pub use path::LimitPath;
pub use violation::{Violation, ViolationKind, Violations, VIOLATIONS_MAX};

/// Which declaration a set of rules comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SourceKind {
    /// The capability class limits.
    Class,
    /// The binding's own limits (including its clamp).
    Binding,
    /// A device envelope entry; `pattern` is its key: an exact capability id
    /// (`cap.motion.joint.v1`) or a pattern (`cap.motion.*`, `cap.*`).
    Envelope {
        /// The envelope key.
        pattern: String,
    },
    /// The operator overlay (site limits).
    Overlay,
}

impl fmt::Display for SourceKind {
    /// `class`, `binding`, `envelope` for an exact key, `envelope:<pattern>`
    /// for a pattern key, `overlay`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceKind::Class => f.write_str("class"),
            SourceKind::Binding => f.write_str("binding"),
            SourceKind::Envelope { pattern } if pattern.contains('*') => {
                write!(f, "envelope:{pattern}")
            }
            SourceKind::Envelope { .. } => f.write_str("envelope"),
            SourceKind::Overlay => f.write_str("overlay"),
        }
    }
}

/// One source's rules for one binding.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceRules {
    /// Where the rules come from.
    pub kind: SourceKind,
    /// `(limit path, rule JSON)` pairs, as declared.
    pub rules: Vec<(String, Value)>,
    /// The source may only tighten what the regular sources allow (and fill
    /// `operator_required` bounds). True for the operator overlay.
    pub narrow_only: bool,
    /// A path that does not resolve is a load error. False for envelope
    /// pattern keys, whose paths need only resolve in one matching binding:
    /// the miss is recorded in [`EffectiveLimits::unresolved`] instead.
    pub require_resolve: bool,
}

impl SourceRules {
    /// A regular source whose every path must resolve.
    pub fn regular(kind: SourceKind, rules: Vec<(String, Value)>) -> Self {
        SourceRules {
            kind,
            rules,
            narrow_only: false,
            require_resolve: true,
        }
    }

    /// The operator overlay: narrow-only, every path must resolve.
    pub fn overlay(rules: Vec<(String, Value)>) -> Self {
        SourceRules {
            kind: SourceKind::Overlay,
            rules,
            narrow_only: true,
            require_resolve: true,
        }
    }
}
