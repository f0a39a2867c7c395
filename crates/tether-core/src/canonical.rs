//! RFC 8785 (JSON Canonicalization Scheme) serialisation and SHA-256 helpers.
//!
//! The evidence chain hashes the canonical form of every entry, and the kernel
//! digests command inputs the same way, so two processes (or two versions of
//! Tether) that hold equal JSON values always agree on the bytes. The rules:
//!
//! * object members are sorted by the UTF-16 code units of their names (not by
//!   UTF-8 bytes: a name with a character above U+FFFF sorts *before* one with
//!   a character in U+E000..=U+FFFF);
//! * no insignificant whitespace;
//! * strings carry only the required escapes (`\"`, `\\`, `\b`, `\f`, `\n`,
//!   `\r`, `\t`, other control characters as `\u00xx` in lower case); every
//!   other character, including non-ASCII, is written as-is in UTF-8;
//! * numbers are written as ECMAScript `Number.prototype.toString` writes the
//!   IEEE-754 double they denote; integers held as `i64`/`u64` are first
//!   converted to `f64` (so integers beyond 2^53 lose precision exactly as they
//!   would in JavaScript), and `-0` is written `0`.
//!
//! The writer appends straight into one `String` buffer; no intermediate
//! values are built except a small sorted index for objects whose members are
//! not already in UTF-16 order.

use serde_json::{Map, Number, Value};
use sha2::{Digest, Sha256};
use std::cmp::Ordering;

/// Deepest nesting of arrays/objects accepted in an event body, a receipt or a
/// latch's info. `serde_json` refuses to parse beyond 128 levels, so anything
/// stored must stay well below that for a verifier to be able to read it back.
pub const MAX_BODY_DEPTH: usize = 64;

// Stored documents must parse back with serde_json's default recursion limit.
const _: () = assert!(MAX_BODY_DEPTH < 128);
// A request body the strict parser accepts fits in an evidence body.
const _: () = assert!(crate::json::DEPTH_MAX <= MAX_BODY_DEPTH);

/// Serialise `v` in RFC 8785 canonical form.
pub fn to_canonical_string(v: &Value) -> String {
    let mut out = String::with_capacity(128);
    write_canonical(v, &mut out);
    out
}

/// Append the RFC 8785 canonical form of `v` to `out`.
///
/// Recursion follows the nesting of `v`; values parsed by `serde_json` are at
/// most 128 levels deep, and the store refuses deeper entry bodies before they
/// reach this writer (see [`write_canonical_bounded`]).
pub fn write_canonical(v: &Value, out: &mut String) {
    // An unlimited depth cannot fail.
    let _ = write_value(v, out, usize::MAX);
}

/// Write the canonical form of `v` to an [`std::io::Write`] sink.
pub fn write_canonical_to<W: std::io::Write + ?Sized>(v: &Value, w: &mut W) -> std::io::Result<()> {
    w.write_all(to_canonical_string(v).as_bytes())
}

/// Nesting deeper than the limit given to [`write_canonical_bounded`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooDeep;

/// Like [`write_canonical`], but refuses values nested deeper than `max_depth`
/// arrays/objects (the top-level container counts as depth 1). On error `out`
/// holds a partial serialisation and must be discarded.
pub fn write_canonical_bounded(
    v: &Value,
    out: &mut String,
    max_depth: usize,
) -> Result<(), TooDeep> {
    write_value(v, out, max_depth)
}

/// `sha256:` followed by the lower-case hex SHA-256 of the canonical form of
/// `v`: the input digest of a command.
pub fn digest(v: &Value) -> String {
    let mut s = String::with_capacity(7 + 64);
    s.push_str("sha256:");
    s.push_str(&sha256_hex(to_canonical_string(v)));
    s
}

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: impl AsRef<[u8]>) -> String {
    hex::encode(Sha256::digest(bytes.as_ref()))
}

fn write_value(v: &Value, out: &mut String, depth_left: usize) -> Result<(), TooDeep> {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            let depth_left = enter(depth_left)?;
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(item, out, depth_left)?;
            }
            out.push(']');
        }
        Value::Object(map) => {
            let depth_left = enter(depth_left)?;
            write_object(map, out, depth_left)?;
        }
    }
    Ok(())
}

fn enter(depth_left: usize) -> Result<usize, TooDeep> {
    depth_left.checked_sub(1).ok_or(TooDeep)
}

fn write_object(
    map: &Map<String, Value>,
    out: &mut String,
    depth_left: usize,
) -> Result<(), TooDeep> {
    out.push('{');
    // serde_json's default map is a BTreeMap ordered by UTF-8 bytes, which
    // already equals UTF-16 order unless names mix supplementary characters
    // with U+E000..=U+FFFF. Checking adjacent pairs is O(n) and lets the common
    // case skip the allocation and sort; it also keeps us correct if another
    // crate in the build turns on serde_json's `preserve_order`.
    let mut sorted = true;
    let mut prev: Option<&str> = None;
    for k in map.keys() {
        if let Some(p) = prev {
            if cmp_utf16(p, k) != Ordering::Less {
                sorted = false;
                break;
            }
        }
        prev = Some(k);
    }
    if sorted {
        for (i, (k, v)) in map.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            write_string(k, out);
            out.push(':');
            write_value(v, out, depth_left)?;
        }
    } else {
        let mut members: Vec<(&String, &Value)> = map.iter().collect();
        members.sort_by(|a, b| cmp_utf16(a.0, b.0));
        for (i, (k, v)) in members.into_iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            write_string(k, out);
            out.push(':');
            write_value(v, out, depth_left)?;
        }
    }
    out.push('}');
    Ok(())
}

/// JSON text in RFC 8785 canonical form. Only this module makes one, so a
/// holder knows the text's form without parsing it again (the store writes
/// it into the chain as it is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonicalText(String);

impl CanonicalText {
    /// The canonical form of `v`, refusing nesting deeper than `max_depth`.
    ///
    /// # Errors
    /// [`TooDeep`].
    pub fn of_value(v: &Value, max_depth: usize) -> Result<Self, TooDeep> {
        let mut out = String::with_capacity(128);
        write_value(v, &mut out, max_depth)?;
        Ok(Self(out))
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The text, owned.
    pub fn into_string(self) -> String {
        self.0
    }

    /// Whether the text is an object (it starts with `{`).
    pub fn is_object(&self) -> bool {
        self.0.starts_with('{')
    }
}

/// The canonical text of the object with `members` (see [`write_members`]).
///
/// # Errors
/// As [`write_members`].
pub fn object_text(
    members: &mut [(&str, Member<'_>)],
    max_depth: usize,
) -> Result<CanonicalText, MembersError> {
    // A size estimate, so a large object (a receipt) is not regrown as it is written.
    let estimate: usize = members
        .iter()
        .map(|(name, m)| {
            name.len()
                + 4
                + match m {
                    Member::Str(s) => s.len() + 2,
                    Member::Canonical(t) => t.as_str().len(),
                    _ => 16,
                }
        })
        .sum();
    let mut out = String::with_capacity(estimate + 2);
    write_members(members, &mut out, max_depth)?;
    Ok(CanonicalText(out))
}

/// The value of one member written by [`write_members`].
#[derive(Debug, Clone, Copy)]
pub enum Member<'a> {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A non-negative integer (written as its f64 denotes, like any number).
    U64(u64),
    /// A string.
    Str(&'a str),
    /// Any JSON value, written canonically (depth-bounded).
    Value(&'a Value),
    /// Text this module already wrote in canonical form; copied as is.
    Canonical(&'a CanonicalText),
}

/// Most members [`write_members`] sorts in place: the sort is an insertion
/// sort (no allocation), quadratic only in this bound.
pub const MAX_MEMBERS: usize = 64;

/// Too many members, or a member nested deeper than allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MembersError {
    /// More than [`MAX_MEMBERS`] members.
    TooMany,
    /// A `Value` member nested deeper than the limit.
    TooDeep,
}

/// Append the canonical form of the object with `members`, without building
/// a `Value` for it: a typed document (a receipt) is written straight to
/// text. Members are sorted here in UTF-16 order (a stable insertion sort, so
/// a list given already sorted costs one pass); when a name occurs more than
/// once the last occurrence wins, as inserting into a map would. `Value`
/// members may nest at most `max_depth` containers. On error `out` holds a
/// partial serialisation and must be discarded.
pub fn write_members(
    members: &mut [(&str, Member<'_>)],
    out: &mut String,
    max_depth: usize,
) -> Result<(), MembersError> {
    if members.len() > MAX_MEMBERS {
        return Err(MembersError::TooMany);
    }
    sort_members(members);
    out.push('{');
    let mut first = true;
    for (i, (name, value)) in members.iter().enumerate() {
        let shadowed = members.get(i + 1).is_some_and(|(next, _)| next == name);
        if shadowed {
            continue;
        }
        if !first {
            out.push(',');
        }
        first = false;
        write_string(name, out);
        out.push(':');
        match *value {
            Member::Null => out.push_str("null"),
            Member::Bool(true) => out.push_str("true"),
            Member::Bool(false) => out.push_str("false"),
            Member::U64(u) => write_u64_number(u, out),
            Member::Str(s) => write_string(s, out),
            Member::Value(v) => {
                write_value(v, out, max_depth).map_err(|_| MembersError::TooDeep)?
            }
            Member::Canonical(text) => out.push_str(text.as_str()),
        }
    }
    out.push('}');
    Ok(())
}

/// Stable insertion sort by UTF-16 name order; bounded by [`MAX_MEMBERS`].
fn sort_members(members: &mut [(&str, Member<'_>)]) {
    for i in 1..members.len() {
        let mut j = i;
        while j > 0 && cmp_utf16(members[j - 1].0, members[j].0) == Ordering::Greater {
            members.swap(j - 1, j);
            j -= 1;
        }
    }
}

/// Compare two strings by their UTF-16 code units.
///
/// UTF-8 byte order equals code point order, and code point order equals
/// UTF-16 order except when, at the first difference, one character is in
/// U+E000..=U+FFFF (UTF-8 lead byte 0xEE/0xEF) and the other is above U+FFFF
/// (lead byte 0xF0..=0xF4): its surrogate (0xD800..=0xDBFF) sorts lower.
/// Differing bytes that are both >= 0xEE are necessarily lead bytes, because
/// continuation bytes are < 0xC0 — so a byte scan decides every case.
pub fn cmp_utf16(a: &str, b: &str) -> Ordering {
    let (ab, bb) = (a.as_bytes(), b.as_bytes());
    let common = ab.iter().zip(bb.iter()).take_while(|(x, y)| x == y).count();
    match (ab.get(common), bb.get(common)) {
        (Some(&x), Some(&y)) => {
            let (sup_x, sup_y) = (x >= 0xF0, y >= 0xF0);
            if x >= 0xEE && y >= 0xEE && sup_x != sup_y {
                if sup_x {
                    Ordering::Less
                } else {
                    Ordering::Greater
                }
            } else {
                x.cmp(&y)
            }
        }
        _ => ab.len().cmp(&bb.len()),
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Append `s` as a JSON string literal with only the escapes RFC 8785 requires.
pub fn write_string(s: &str, out: &mut String) {
    out.push('"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &str = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            0x0c => "\\f",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x00..=0x1f => "",
            _ => continue,
        };
        // Copy the run of bytes that needed no escape in one go. Slicing at
        // `i` is on a char boundary because `b` is ASCII.
        out.push_str(&s[start..i]);
        if esc.is_empty() {
            out.push_str("\\u00");
            out.push(HEX[(b >> 4) as usize] as char);
            out.push(HEX[(b & 0x0f) as usize] as char);
        } else {
            out.push_str(esc);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// 2^53: every integer of smaller magnitude is exactly representable in an f64.
const EXACT_INT: u64 = 1 << 53;

fn write_number(n: &Number, out: &mut String) {
    if let Some(u) = n.as_u64() {
        if u <= EXACT_INT {
            write_u64(u, out);
            return;
        }
    } else if let Some(i) = n.as_i64() {
        if i.unsigned_abs() <= EXACT_INT {
            if i < 0 {
                out.push('-');
            }
            write_u64(i.unsigned_abs(), out);
            return;
        }
    }
    // Non-integers, and integers beyond 2^53, go through the f64 they denote.
    // serde_json never holds NaN or infinities, but map them to null rather
    // than emit something that is not JSON.
    write_f64(n.as_f64().unwrap_or(f64::NAN), out);
}

/// Rewrites every number of `v` as reading back its canonical text would give
/// it (`30.0` becomes `30`, an integer beyond 2^53 the integer its f64
/// denotes), so a document answered from memory equals the same document read
/// back from the chain. Strings, keys and structure are untouched.
pub fn normalize_numbers(v: &mut Value) {
    // An explicit stack: a document's depth never becomes this thread's.
    let mut stack: Vec<&mut Value> = vec![v];
    while let Some(node) = stack.pop() {
        match node {
            Value::Number(n) => {
                if let Some(back) = round_trip_number(n) {
                    *n = back;
                }
            }
            Value::Array(items) => stack.extend(items.iter_mut()),
            Value::Object(members) => stack.extend(members.values_mut()),
            Value::Null | Value::Bool(_) | Value::String(_) => {}
        }
    }
}

/// The number `n`'s canonical text denotes when parsed, when it differs from
/// `n` in value or type; `None` for the common case where it is `n` itself.
fn round_trip_number(n: &Number) -> Option<Number> {
    let exact = n.as_u64().is_some_and(|u| u <= EXACT_INT)
        || n.as_i64().is_some_and(|i| i.unsigned_abs() <= EXACT_INT);
    if exact {
        return None;
    }
    let mut text = String::with_capacity(24);
    write_number(n, &mut text);
    match serde_json::from_str::<Number>(&text) {
        Ok(back) if back != *n => Some(back),
        _ => None,
    }
}

/// Append an f64 the way ECMAScript's `Number.prototype.toString` does.
pub fn write_f64(f: f64, out: &mut String) {
    if !f.is_finite() {
        out.push_str("null");
    } else if f == 0.0 {
        // Covers -0, which ECMAScript prints as "0".
        out.push('0');
    } else {
        let mut buf = ryu_js::Buffer::new();
        out.push_str(buf.format_finite(f));
    }
}

/// Append a u64 in decimal (for integers below 2^53 this is also the
/// ECMAScript form).
pub fn write_u64(mut u: u64, out: &mut String) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    // At most 20 iterations: u64::MAX has 20 decimal digits.
    loop {
        i -= 1;
        buf[i] = b'0' + (u % 10) as u8;
        u /= 10;
        if u == 0 {
            break;
        }
    }
    for &d in &buf[i..] {
        out.push(d as char);
    }
}

/// Append a u64 as the canonical JSON number for its f64 value (exact up to
/// 2^53, beyond as the f64 it rounds to).
pub fn write_u64_number(u: u64, out: &mut String) {
    if u <= EXACT_INT {
        write_u64(u, out);
    } else {
        write_f64(u as f64, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn written_members_equal_the_canonical_form_of_the_same_object() {
        let nested = json!({"z": [1.0, -0.0, 1e21], "a": {"y": "\u{1F600}", "b": null}});
        let inner = CanonicalText::of_value(&json!({"k": 2, "e": true}), 64).expect("shallow");
        let mut members = [
            ("status", Member::Str("completed")),
            ("output", Member::Value(&nested)),
            ("\u{FF61}", Member::Bool(false)),
            ("\u{1F600}", Member::Null),
            ("big", Member::U64(u64::MAX)),
            ("n", Member::U64(42)),
            ("error", Member::Canonical(&inner)),
            ("esc", Member::Str("a\"b\\c\n\u{1}")),
        ];
        let mut out = String::new();
        write_members(&mut members, &mut out, 64).expect("written");
        let expected = json!({
            "status": "completed", "output": nested, "\u{FF61}": false, "\u{1F600}": null,
            "big": u64::MAX, "n": 42, "error": {"k": 2, "e": true}, "esc": "a\"b\\c\n\u{1}",
        });
        assert_eq!(out, to_canonical_string(&expected));
    }

    #[test]
    fn the_last_of_two_members_with_one_name_wins_and_limits_hold() {
        let mut members = [
            ("b", Member::U64(1)),
            ("a", Member::Str("first")),
            ("a", Member::Str("second")),
        ];
        let mut out = String::new();
        write_members(&mut members, &mut out, 64).expect("written");
        assert_eq!(out, r#"{"a":"second","b":1}"#);

        let deep = json!([[[1]]]);
        let mut out = String::new();
        let mut members = [("d", Member::Value(&deep))];
        assert_eq!(
            write_members(&mut members, &mut out, 2),
            Err(MembersError::TooDeep)
        );
        let mut out = String::new();
        let mut members = [("d", Member::Value(&deep))];
        assert_eq!(write_members(&mut members, &mut out, 3), Ok(()));

        let names: Vec<String> = (0..=MAX_MEMBERS).map(|i| format!("m{i}")).collect();
        let mut many: Vec<(&str, Member)> =
            names.iter().map(|n| (n.as_str(), Member::Null)).collect();
        assert_eq!(
            write_members(&mut many, &mut String::new(), 64),
            Err(MembersError::TooMany)
        );
    }

    fn num(f: f64) -> String {
        let mut s = String::new();
        write_f64(f, &mut s);
        s
    }

    #[test]
    fn rfc8785_number_vectors() {
        // From RFC 8785 appendix B and the ECMAScript Number serialisation.
        let cases: &[(u64, &str)] = &[
            (0x0000000000000000, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            (0x43143ff3c1cb0959, "1424953923781206.2"),
        ];
        for (bits, want) in cases {
            assert_eq!(num(f64::from_bits(*bits)), *want, "bits {bits:#018x}");
        }
        assert_eq!(num(1e21), "1e+21");
        assert_eq!(num(1e-7), "1e-7");
        assert_eq!(num(0.000001), "0.000001");
        assert_eq!(num(1e20), "100000000000000000000");
        assert_eq!(num(-1.5), "-1.5");
        assert_eq!(num(f64::NAN), "null");
    }

    #[test]
    fn integers_go_through_f64() {
        assert_eq!(to_canonical_string(&json!(0)), "0");
        assert_eq!(to_canonical_string(&json!(-0.0)), "0");
        assert_eq!(to_canonical_string(&json!(42)), "42");
        assert_eq!(to_canonical_string(&json!(-42)), "-42");
        assert_eq!(to_canonical_string(&json!(1.0)), "1");
        assert_eq!(
            to_canonical_string(&json!(9007199254740993u64)),
            "9007199254740992"
        );
        assert_eq!(
            to_canonical_string(&json!(u64::MAX)),
            "18446744073709552000"
        );
        assert_eq!(
            to_canonical_string(&json!(i64::MIN)),
            "-9223372036854776000"
        );
    }

    #[test]
    fn rfc8785_sample_object() {
        // RFC 8785 §3.2.2 input (numbers as f64 after parsing).
        let input = r#"{
            "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
            "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
            "literals": [null, true, false]
        }"#;
        let v: Value = serde_json::from_str(input).expect("valid test input");
        assert_eq!(
            to_canonical_string(&v),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
    }

    #[test]
    fn keys_sort_by_utf16_code_units() {
        // U+1F600 (surrogates D83D DE00) sorts before U+E000 in UTF-16 but
        // after it in UTF-8 / code point order.
        let mut m = Map::new();
        m.insert("\u{E000}".into(), json!(1));
        m.insert("\u{1F600}".into(), json!(2));
        m.insert("a".into(), json!(3));
        let s = to_canonical_string(&Value::Object(m));
        assert_eq!(s, "{\"a\":3,\"\u{1F600}\":2,\"\u{E000}\":1}");

        // RFC 8785 §3.2.3 sorting example.
        let v: Value = serde_json::from_str(
            r#"{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}"#,
        )
        .expect("valid test input");
        let want = "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\
            \"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\
            \"😀\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}";
        assert_eq!(to_canonical_string(&v), want);
    }

    #[test]
    fn string_escapes() {
        let v = json!("a\"b\\c\u{8}\u{c}\n\r\t\u{0}\u{1f}\u{7f}é/");
        assert_eq!(
            to_canonical_string(&v),
            "\"a\\\"b\\\\c\\b\\f\\n\\r\\t\\u0000\\u001f\u{7f}é/\""
        );
    }

    #[test]
    fn nested_and_whitespace_free() {
        let v = json!({"b": [1, {"z": null, "a": true}], "a": {}, "c": []});
        assert_eq!(
            to_canonical_string(&v),
            r#"{"a":{},"b":[1,{"a":true,"z":null}],"c":[]}"#
        );
    }

    #[test]
    fn digest_and_hash() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let d = digest(&json!({"b": 1, "a": 2}));
        assert_eq!(d, format!("sha256:{}", sha256_hex(br#"{"a":2,"b":1}"#)));
    }

    #[test]
    fn bounded_depth() {
        let v = json!({"a": [[1]]});
        let mut s = String::new();
        assert_eq!(write_canonical_bounded(&v, &mut s, 3), Ok(()));
        let mut s = String::new();
        assert_eq!(write_canonical_bounded(&v, &mut s, 2), Err(TooDeep));
        let mut s = String::new();
        assert_eq!(write_canonical_bounded(&json!(1), &mut s, 0), Ok(()));
    }

    #[test]
    fn normalizing_turns_whole_floats_into_integers() {
        let mut v = json!({"t": 30.0, "half": 0.5, "neg": -2.0, "zero": -0.0, "n": [1, 2.0]});
        normalize_numbers(&mut v);
        assert_eq!(
            v,
            json!({"t": 30, "half": 0.5, "neg": -2, "zero": 0, "n": [1, 2]})
        );
        assert!(v["t"].is_u64() && v["neg"].is_i64());
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        fn utf16_cmp_reference(a: &str, b: &str) -> Ordering {
            a.encode_utf16().cmp(b.encode_utf16())
        }

        fn interesting_char() -> impl Strategy<Value = char> {
            prop_oneof![
                any::<char>(),
                proptest::char::range('\u{E000}', '\u{FFFF}'),
                proptest::char::range('\u{10000}', '\u{10FFFF}'),
                proptest::char::range('a', 'c'),
            ]
        }

        fn interesting_string() -> impl Strategy<Value = String> {
            proptest::collection::vec(interesting_char(), 0..4)
                .prop_map(|v| v.into_iter().collect())
        }

        proptest! {
            #[test]
            fn cmp_utf16_matches_reference(a in interesting_string(), b in interesting_string()) {
                prop_assert_eq!(cmp_utf16(&a, &b), utf16_cmp_reference(&a, &b));
            }

            #[test]
            fn f64_round_trips(bits in any::<u64>()) {
                let f = f64::from_bits(bits);
                prop_assume!(f.is_finite());
                let s = num_str(f);
                let back: f64 = s.parse().map_err(|_| TestCaseError::fail("unparseable"))?;
                prop_assert_eq!(back, if f == 0.0 { 0.0 } else { f });
            }

            #[test]
            fn canonical_round_trips(s in "\\PC*", f in any::<f64>()) {
                prop_assume!(f.is_finite());
                let v = serde_json::json!({"s": s, "f": f, "k": {"x": [s.clone()]}});
                let c = to_canonical_string(&v);
                let back: Value = serde_json::from_str(&c).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(to_canonical_string(&back), c);
            }

            #[test]
            fn normalized_numbers_equal_their_read_back(
                f in any::<f64>(), u in any::<u64>(), i in any::<i64>(), small in -100i32..100
            ) {
                prop_assume!(f.is_finite());
                let mut v = serde_json::json!({"f": f, "u": u, "i": i, "whole": f64::from(small), "a": [f, {"n": u}]});
                let back: Value = serde_json::from_str(&to_canonical_string(&v))
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                normalize_numbers(&mut v);
                prop_assert_eq!(&v, &back);
                // Normalising is idempotent and keeps the canonical text.
                let text = to_canonical_string(&v);
                normalize_numbers(&mut v);
                prop_assert_eq!(to_canonical_string(&v), text);
            }
        }

        fn member_value() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<u64>().prop_map(Value::from),
                any::<i64>().prop_map(Value::from),
                any::<f64>()
                    .prop_filter("finite", |f| f.is_finite())
                    .prop_map(Value::from),
                interesting_string().prop_map(Value::String),
            ];
            leaf.prop_recursive(3, 16, 4, |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                    proptest::collection::vec((interesting_string(), inner), 0..4)
                        .prop_map(|kv| Value::Object(kv.into_iter().collect())),
                ]
            })
        }

        proptest! {
            /// Members in any order (names repeated, the last winning) write
            /// the canonical form of the object a map would hold.
            #[test]
            fn written_members_are_the_canonical_object(
                members in proptest::collection::vec((interesting_string(), member_value()), 0..12)
            ) {
                let mut map = Map::new();
                for (k, v) in &members {
                    map.insert(k.clone(), v.clone());
                }
                let mut list: Vec<(&str, Member)> = members
                    .iter()
                    .map(|(k, v)| (k.as_str(), Member::Value(v)))
                    .collect();
                let mut out = String::new();
                prop_assert!(write_members(&mut list, &mut out, 64).is_ok());
                prop_assert_eq!(out, to_canonical_string(&Value::Object(map)));
            }
        }

        fn num_str(f: f64) -> String {
            let mut s = String::new();
            write_f64(f, &mut s);
            s
        }
    }
}
