//! What a failed check reports: one [`Violation`] per offending value, the
//! first one and up to [`VIOLATIONS_MAX`] in all.

use std::fmt;

use serde_json::{Map, Value};

/// Most violations one check collects (the first included).
pub const VIOLATIONS_MAX: usize = 16;

/// Which bound a value broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ViolationKind {
    /// Below the minimum.
    Min,
    /// Above the maximum.
    Max,
    /// Not one of the allowed values.
    Allowed,
    /// Cannot be compared with the bound (not a finite number, or not the
    /// object or array the path goes through).
    Type,
    /// An array whose length differs from its per-element bounds.
    Length,
}

impl ViolationKind {
    /// The wire spelling: `min`, `max`, `allowed`, `type` or `length`.
    pub fn as_str(self) -> &'static str {
        match self {
            ViolationKind::Min => "min",
            ViolationKind::Max => "max",
            ViolationKind::Allowed => "allowed",
            ViolationKind::Type => "type",
            ViolationKind::Length => "length",
        }
    }
}

impl fmt::Display for ViolationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One value outside the effective limits.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    /// The concrete location, e.g. `joints[0]` or `a.b[2].c`.
    pub path: String,
    /// Which bound was broken.
    pub kind: ViolationKind,
    /// The bound (a number, the allowed list, or the expected length).
    pub bound: Value,
    /// The offending value (the array length for [`ViolationKind::Length`]).
    pub value: Value,
    /// The field's unit.
    pub unit: Option<String>,
    /// The source that set the bound: `class`, `binding`, `envelope`,
    /// `envelope:<pattern>` or `overlay`.
    pub source: String,
    /// The element's label from `names`.
    pub element_name: Option<String>,
    /// The limit path whose bound was broken, e.g. `joints[*]`.
    pub limit_path: String,
    /// Why the bound exists, when the source said.
    pub reason: Option<String>,
    /// Where the broken bound comes from (`{source, origin, ref, reason}`),
    /// when the source said.
    pub provenance: Option<Value>,
}

impl Violation {
    /// The violation as the members of `error.details`.
    pub fn to_json(&self) -> Value {
        let mut out = Map::new();
        out.insert("path".into(), Value::from(self.path.as_str()));
        out.insert("kind".into(), Value::from(self.kind.as_str()));
        out.insert("bound".into(), self.bound.clone());
        out.insert("value".into(), self.value.clone());
        out.insert(
            "unit".into(),
            self.unit.as_deref().map_or(Value::Null, Value::from),
        );
        out.insert("source".into(), Value::from(self.source.as_str()));
        if let Some(name) = &self.element_name {
            out.insert("element_name".into(), Value::from(name.as_str()));
        }
        out.insert("limit_path".into(), Value::from(self.limit_path.as_str()));
        if let Some(reason) = &self.reason {
            out.insert("reason".into(), Value::from(reason.as_str()));
        }
        if let Some(p) = &self.provenance {
            out.insert("provenance".into(), p.clone());
        }
        Value::Object(out)
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = self
            .unit
            .as_deref()
            .map(|u| format!(" {u}"))
            .unwrap_or_default();
        write!(
            f,
            "{}: {} violates {} {}{} set by {}",
            self.path, self.value, self.kind, self.bound, unit, self.source
        )
    }
}

/// Every violation one check found.
#[derive(Debug, Clone, PartialEq)]
pub struct Violations {
    /// The first violation, in evaluation order.
    pub first: Violation,
    /// Up to [`VIOLATIONS_MAX`] violations, `first` included.
    pub all: Vec<Violation>,
    /// Whether more violations existed than `all` holds.
    pub truncated: bool,
}

impl Violations {
    /// Build from the collected list; `None` when it is empty.
    pub fn from_list(all: Vec<Violation>, truncated: bool) -> Option<Self> {
        let first = all.first()?.clone();
        Some(Violations {
            first,
            all,
            truncated,
        })
    }

    /// `error.details`: the first violation's members at top level, plus
    /// `violations` (all of them) and `truncated`.
    pub fn to_details(&self) -> Value {
        let mut details = self.first.to_json();
        if let Value::Object(map) = &mut details {
            let list = self.all.iter().map(Violation::to_json).collect();
            map.insert("violations".into(), Value::Array(list));
            map.insert("truncated".into(), Value::Bool(self.truncated));
        }
        details
    }
}

impl fmt::Display for Violations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.first)?;
        let more = self.all.len().saturating_sub(1);
        if more > 0 || self.truncated {
            let plus = if self.truncated { "+" } else { "" };
            write!(f, " (and {more}{plus} more)")?;
        }
        Ok(())
    }
}

impl std::error::Error for Violations {}
