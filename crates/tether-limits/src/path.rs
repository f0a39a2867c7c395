//! Limit paths: `field`, `a.b`, `a[*]`, `a[3]`, `a.b[*].c`.
//!
//! A path is identifier segments joined by dots; each segment may carry one
//! index, `[*]` (every element) or `[N]` (one element). Identifiers match
//! `[A-Za-z_][A-Za-z0-9_-]*` and the whole path is at most
//! [`PATH_LEN_MAX`] characters, so a path is always cheap to parse and print.

use std::fmt;

/// Longest accepted limit path, in bytes (all accepted characters are ASCII).
pub const PATH_LEN_MAX: usize = 256;

/// Largest element index a path may name. Far above any real array; it keeps
/// the index parse free of overflow.
pub const INDEX_MAX: usize = 1_000_000;

/// The index part of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Index {
    /// `[*]`: every element of the array.
    All,
    /// `[N]`: the element at position N.
    At(usize),
}

/// One `name` or `name[*]` or `name[N]` segment.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Segment {
    /// The member name.
    pub name: String,
    /// The optional element index applied to that member.
    pub index: Option<Index>,
}

/// A parsed limit path. Construct with [`LimitPath::parse`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LimitPath {
    segments: Vec<Segment>,
}

/// Why a string is not a limit path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Longer than [`PATH_LEN_MAX`].
    #[error("path is {len} characters long, the maximum is {PATH_LEN_MAX}")]
    TooLong {
        /// The length found.
        len: usize,
    },
    /// Does not follow the grammar.
    #[error("invalid limit path: {0}")]
    Invalid(String),
}

impl LimitPath {
    /// Parse a path string.
    ///
    /// # Errors
    /// [`PathError::TooLong`] beyond [`PATH_LEN_MAX`], [`PathError::Invalid`]
    /// for anything outside the grammar (empty segments, bad identifiers,
    /// malformed or oversized indexes, trailing characters).
    pub fn parse(text: &str) -> Result<Self, PathError> {
        if text.len() > PATH_LEN_MAX {
            return Err(PathError::TooLong { len: text.len() });
        }
        if text.is_empty() {
            return Err(PathError::Invalid("empty path".into()));
        }
        let segments = text
            .split('.')
            .map(parse_segment)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(LimitPath { segments })
    }

    /// Build a path from segments (at least one). Returns `None` for an empty
    /// list or an identifier outside the grammar.
    pub fn from_segments(segments: Vec<Segment>) -> Option<Self> {
        if segments.is_empty() || !segments.iter().all(|s| is_identifier(&s.name)) {
            return None;
        }
        Some(LimitPath { segments })
    }

    /// The segments, in order.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Whether the path names every element at each indexed level (no `[N]`).
    pub fn is_wildcard_only(&self) -> bool {
        self.segments
            .iter()
            .all(|s| !matches!(s.index, Some(Index::At(_))))
    }
}

impl fmt::Display for LimitPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, seg) in self.segments.iter().enumerate() {
            if i > 0 {
                f.write_str(".")?;
            }
            f.write_str(&seg.name)?;
            match seg.index {
                None => {}
                Some(Index::All) => f.write_str("[*]")?,
                Some(Index::At(n)) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

impl std::str::FromStr for LimitPath {
    type Err = PathError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        LimitPath::parse(s)
    }
}

fn parse_segment(text: &str) -> Result<Segment, PathError> {
    let (name, rest) = match text.find('[') {
        Some(at) => (&text[..at], Some(&text[at..])),
        None => (text, None),
    };
    if !is_identifier(name) {
        return Err(PathError::Invalid(format!("'{name}' is not an identifier")));
    }
    let index = match rest {
        None => None,
        Some(bracket) => Some(parse_index(bracket)?),
    };
    Ok(Segment {
        name: name.to_string(),
        index,
    })
}

fn parse_index(text: &str) -> Result<Index, PathError> {
    let inner = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .ok_or_else(|| PathError::Invalid(format!("malformed index '{text}'")))?;
    if inner == "*" {
        return Ok(Index::All);
    }
    // Digits only, no sign, no leading zeros beyond "0", bounded length so the
    // parse can never overflow.
    let digits_ok = !inner.is_empty()
        && inner.len() <= 7
        && inner.bytes().all(|b| b.is_ascii_digit())
        && (inner == "0" || !inner.starts_with('0'));
    let n = if digits_ok {
        inner.parse::<usize>().ok()
    } else {
        None
    };
    match n {
        Some(n) if n <= INDEX_MAX => Ok(Index::At(n)),
        _ => Err(PathError::Invalid(format!("malformed index '{text}'"))),
    }
}

/// Whether `name` matches `[A-Za-z_][A-Za-z0-9_-]*`.
pub fn is_identifier(name: &str) -> bool {
    let mut bytes = name.bytes();
    match bytes.next() {
        Some(b) if b.is_ascii_alphabetic() || b == b'_' => {}
        _ => return false,
    }
    bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A concrete location in an input document, such as `joints[0]` or
/// `a.b[2].c`, built while walking. Kept as a string because it is only ever
/// printed.
pub(crate) fn push_member(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// Append an element index to a concrete location.
pub(crate) fn push_index(prefix: &str, index: usize) -> String {
    format!("{prefix}[{index}]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grammar_accepts_the_documented_forms() {
        for text in ["field", "a.b", "a[*]", "a[3]", "a.b[*].c", "_x-1.y_2[0]"] {
            let path = LimitPath::parse(text).unwrap();
            assert_eq!(path.to_string(), text);
        }
    }

    #[test]
    fn grammar_refuses_everything_else() {
        for text in [
            "",
            ".a",
            "a.",
            "a..b",
            "1a",
            "a[]",
            "a[-1]",
            "a[01]",
            "a[*]x",
            "a[1][2]",
            "a b",
            "a[99999999]",
            "a.[0]",
            "$a",
            "a/b",
        ] {
            assert!(LimitPath::parse(text).is_err(), "{text}");
        }
    }

    #[test]
    fn path_longer_than_256_is_refused() {
        let long = "a".repeat(PATH_LEN_MAX + 1);
        assert!(matches!(
            LimitPath::parse(&long),
            Err(PathError::TooLong { .. })
        ));
        assert!(LimitPath::parse(&"a".repeat(PATH_LEN_MAX)).is_ok());
    }
}
