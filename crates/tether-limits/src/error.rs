//! Load errors: every defect found while building the effective limits.

use std::fmt;

/// The kind of a load defect. [`LoadErrorKind::as_str`] is the stable
/// snake_case name that callers put into error details.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LoadErrorKind {
    /// The path does not resolve in the schema.
    PathUnresolved,
    /// The rule object has a member outside the closed set.
    UnknownMember,
    /// A bound on a non-numeric field or on an object.
    NonNumericField,
    /// A per-element bound (or `names`) on a scalar field.
    ElementBoundOnScalar,
    /// A per-element bound (or `names`) on an array whose length is not fixed.
    ElementBoundOnVariableArray,
    /// A per-element bound (or `names`) whose length differs from the array's.
    ElementBoundLength,
    /// The rule's unit is not the field's `x-mhs-unit`.
    UnitMismatch,
    /// The sources together allow nothing (min above max, empty allowed set).
    Contradictory,
    /// `per` names no known budget window.
    UnknownWindow,
    /// A narrow-only source allows more than the regular sources.
    WideningOverlay,
    /// `source` is vendor_doc or upstream_code without a `ref`.
    MissingRef,
    /// A bound beyond ±(2^53−1).
    IntegerOutOfRange,
    /// The rule is malformed in another way (wrong member type, no bound...).
    InvalidRule,
    /// The path is longer than 256 characters.
    PathTooLong,
    /// The path does not follow the grammar.
    InvalidPath,
    /// Two sources label the elements differently.
    NamesMismatch,
}

impl LoadErrorKind {
    /// The stable snake_case name, e.g. `"path_unresolved"`.
    pub fn as_str(self) -> &'static str {
        match self {
            LoadErrorKind::PathUnresolved => "path_unresolved",
            LoadErrorKind::UnknownMember => "unknown_member",
            LoadErrorKind::NonNumericField => "non_numeric_field",
            LoadErrorKind::ElementBoundOnScalar => "element_bound_on_scalar",
            LoadErrorKind::ElementBoundOnVariableArray => "element_bound_on_variable_array",
            LoadErrorKind::ElementBoundLength => "element_bound_length",
            LoadErrorKind::UnitMismatch => "unit_mismatch",
            LoadErrorKind::Contradictory => "contradictory",
            LoadErrorKind::UnknownWindow => "unknown_window",
            LoadErrorKind::WideningOverlay => "widening_overlay",
            LoadErrorKind::MissingRef => "missing_ref",
            LoadErrorKind::IntegerOutOfRange => "integer_out_of_range",
            LoadErrorKind::InvalidRule => "invalid_rule",
            LoadErrorKind::PathTooLong => "path_too_long",
            LoadErrorKind::InvalidPath => "invalid_path",
            LoadErrorKind::NamesMismatch => "names_mismatch",
        }
    }
}

impl fmt::Display for LoadErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One defect found by [`crate::build`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    /// The limit path as written in the source (or the canonical path for
    /// defects of the intersection).
    pub path: String,
    /// What is wrong.
    pub reason: LoadErrorKind,
    /// The source that declared the rule (`class`, `binding`, `envelope`,
    /// `envelope:<pattern>`, `overlay`), or several joined by `+`.
    pub source: String,
    /// A one-line human explanation.
    pub message: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} limit at '{}': {} ({})",
            self.source, self.path, self.message, self.reason
        )
    }
}

impl std::error::Error for LoadError {}
