//! Strict JSON parsing for everything that arrives from outside.
//!
//! `serde_json` keeps the last of two equal keys; for a governance kernel that
//! is a way to smuggle a second value past a reviewer, so duplicate keys are
//! refused here. Nesting is bounded so a hostile document cannot exhaust the
//! stack, and numbers that overflow an f64 are refused by `serde_json` itself
//! (never clamped to infinity).

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use std::fmt;

/// Deepest nesting of arrays and objects accepted from outside.
pub const DEPTH_MAX: usize = 64;

/// Parses `text` strictly: no duplicate keys, depth at most [`DEPTH_MAX`],
/// no trailing data.
///
/// # Errors
/// A message saying what is wrong and where (line and column when known).
pub fn parse_strict(text: &str) -> Result<Value, String> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = StrictSeed { depth: 0 }
        .deserialize(&mut de)
        .map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())?;
    Ok(value)
}

struct StrictSeed {
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for StrictSeed {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(StrictVisitor { depth: self.depth })
    }
}

struct StrictVisitor {
    depth: usize,
}

impl StrictVisitor {
    fn nested<E: de::Error>(&self) -> Result<usize, E> {
        let next = self.depth + 1;
        if next > DEPTH_MAX {
            return Err(E::custom(format!("nesting deeper than {DEPTH_MAX} levels")));
        }
        Ok(next)
    }
}

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("number is not finite"))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let depth = self.nested()?;
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(StrictSeed { depth })? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let depth = self.nested()?;
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(de::Error::custom(format!(
                    "duplicate key `{}`",
                    crate::echo::id(&key)
                )));
            }
            let v = map.next_value_seed(StrictSeed { depth })?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

/// The text with every non-finite number written outside a string — the
/// bare words `NaN`, `Infinity` (either sign) and a numeral beyond f64 such
/// as `1e999` — replaced by `null`; `None` when there is none.
///
/// Only for recognising an e-stop: OpenMHS reads such values in an e-stop
/// request as null and still serves the stop. Everything else that arrives
/// with them is refused by [`parse_strict`] as before. One pass, no
/// allocation unless something is replaced.
pub fn nonfinite_as_null(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out: Option<String> = None;
    let mut copied = 0; // bytes of `text` already accounted for in `out`
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => i = string_end(bytes, i),
            b'-' | b'+' | b'0'..=b'9' | b'N' | b'I' => {
                let end = token_end(bytes, i);
                if is_nonfinite(&text[i..end]) {
                    let o = out.get_or_insert_with(|| String::with_capacity(text.len()));
                    o.push_str(&text[copied..i]);
                    o.push_str("null");
                    copied = end;
                }
                i = end.max(i + 1);
            }
            _ => i += 1,
        }
    }
    out.map(|mut o| {
        o.push_str(&text[copied..]);
        o
    })
}

/// The index just past the string that opens at `start` (a quote), or the
/// end of the text for an unterminated one.
fn string_end(bytes: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// The end of a bare token (a numeral or a word) that starts at `start`.
fn token_end(bytes: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while i < bytes.len()
        && (bytes[i].is_ascii_alphanumeric() || matches!(bytes[i], b'.' | b'+' | b'-'))
    {
        i += 1;
    }
    i
}

/// Whether a bare token stands for a number that is not finite.
fn is_nonfinite(token: &str) -> bool {
    let word = token.trim_start_matches(['-', '+']);
    if matches!(word, "NaN" | "Infinity" | "inf" | "nan") {
        return true;
    }
    // A numeral (digits first, once the sign is off) that f64 reads as
    // infinite; anything else is left for the parser to judge.
    word.starts_with(|c: char| c.is_ascii_digit())
        && token.parse::<f64>().is_ok_and(|x| x.is_infinite())
}

/// Depth of a value (scalars are 0).
pub fn depth(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        Value::Object(o) => 1 + o.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        assert!(parse_strict(r#"{"a":1,"a":2}"#)
            .unwrap_err()
            .contains("duplicate key"));
        assert!(parse_strict(r#"{"x":{"b":1,"b":1}}"#).is_err());
        assert!(parse_strict(r#"{"a":1,"b":2}"#).is_ok());
    }

    #[test]
    fn deep_nesting_is_refused() {
        let deep = "[".repeat(DEPTH_MAX + 1) + &"]".repeat(DEPTH_MAX + 1);
        assert!(parse_strict(&deep).unwrap_err().contains("nesting"));
        let ok = "[".repeat(DEPTH_MAX) + &"]".repeat(DEPTH_MAX);
        assert!(parse_strict(&ok).is_ok());
    }

    #[test]
    fn nonfinite_numbers_outside_strings_read_as_null() {
        let t = r#"{"a":NaN,"b":-Infinity,"c":1e999,"d":"NaN 1e999","e":[Infinity, 2.5, -1e400]}"#;
        let fixed = nonfinite_as_null(t).expect("repaired");
        assert_eq!(
            parse_strict(&fixed).unwrap(),
            serde_json::json!({"a": null, "b": null, "c": null, "d": "NaN 1e999", "e": [null, 2.5, null]})
        );
        // Nothing to repair: no copy.
        assert!(nonfinite_as_null(r#"{"a":1.5,"b":"NaN","c":true}"#).is_none());
        // Escaped quotes keep the scan inside the string.
        assert!(nonfinite_as_null(r#"{"a":"x\" NaN"}"#).is_none());
        // Words that are not numbers are left for the parser.
        assert!(nonfinite_as_null(r#"{"a":Nope}"#).is_none());
    }

    #[test]
    fn overflowing_numbers_and_trailing_data_are_refused() {
        assert!(parse_strict("1e999").is_err());
        assert!(parse_strict("-1e400").is_err());
        assert!(parse_strict("NaN").is_err());
        assert!(parse_strict("{} {}").is_err());
        assert_eq!(parse_strict("1.5").unwrap(), serde_json::json!(1.5));
    }
}
