//! The canonical JSON writer (`tether_core::canonical`, RFC 8785) against
//! `serde_json` parse-back and a small reference writer written here.
//!
//! Invariants, for any text `serde_json` reads as a value `v`:
//! - the canonical text `c` parses back, to `v` with its numbers normalised
//!   (`normalize_numbers`), and the strict parser reads it the same;
//! - the canonical text of that parse is `c` again, byte for byte;
//! - `c` equals the reference writer's text (members in UTF-16 order of
//!   their names, the short escapes), and each number is written as the
//!   same f64 in as few digits as Rust's shortest round-trip form;
//! - the member writer (`object_text`) writes an object as the value writer
//!   does, and the bounded writer refuses exactly what is deeper than its bound.

use serde_json::{Map, Value};
use tether_core::canonical::{
    normalize_numbers, object_text, to_canonical_string, write_canonical_bounded, Member,
    MAX_MEMBERS,
};

/// Runs the target on one input.
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(v) = serde_json::from_str::<Value>(text) else {
        return;
    };
    let c = to_canonical_string(&v);
    let back: Result<Value, _> = serde_json::from_str(&c);
    assert!(back.is_ok(), "canonical text does not parse back: {c}");
    let back = back.unwrap_or_default();
    let mut normalized = v.clone();
    normalize_numbers(&mut normalized);
    assert_eq!(
        back, normalized,
        "parse(canonical(v)) differs from v with its numbers normalised"
    );
    assert_eq!(
        to_canonical_string(&back),
        c,
        "canonical text of the parse-back differs"
    );
    // The strict parser refuses nesting beyond its bound, by design.
    if tether_core::json::depth(&v) <= tether_core::json::DEPTH_MAX {
        let strict = tether_core::json::parse_strict(&c);
        assert!(
            matches!(&strict, Ok(s) if *s == back),
            "the strict parser reads canonical text differently: {strict:?}"
        );
    }
    let mut reference = String::new();
    write_reference(&v, &mut reference);
    assert_eq!(
        c, reference,
        "canonical text differs from the reference writer"
    );
    check_members(&v, &c);
    check_bounded(&v, &c);
}

/// The member writer on the members of an object writes the same text.
fn check_members(v: &Value, c: &str) {
    let Value::Object(map) = v else {
        return;
    };
    if map.len() > MAX_MEMBERS {
        return;
    }
    let mut members: Vec<(&str, Member<'_>)> = map
        .iter()
        .map(|(k, v)| (k.as_str(), Member::Value(v)))
        .collect();
    let text = object_text(&mut members, usize::MAX);
    assert!(
        matches!(&text, Ok(t) if t.as_str() == c),
        "object_text differs from to_canonical_string: {text:?}"
    );
}

/// The bounded writer succeeds exactly when the bound is at least the depth.
fn check_bounded(v: &Value, c: &str) {
    let depth = tether_core::json::depth(v);
    let mut out = String::new();
    assert!(write_canonical_bounded(v, &mut out, depth).is_ok() && out == c);
    if depth > 0 {
        let mut out = String::new();
        assert!(
            write_canonical_bounded(v, &mut out, depth - 1).is_err(),
            "the bounded writer took a value deeper than its bound"
        );
    }
}

/// RFC 8785 written the plain way: sort every object's names by their UTF-16
/// code units (a `Vec<u16>` comparison), strings through `serde_json` (which
/// writes only the required escapes), numbers as the f64 they denote.
fn write_reference(v: &Value, out: &mut String) {
    match v {
        Value::Null | Value::Bool(_) => out.push_str(&v.to_string()),
        Value::Number(n) => {
            // Tether's number text, judged on its own: it must denote the
            // same f64 and be as short as the shortest round-trip digits.
            // The digits themselves may differ from Rust's in a tie, where
            // ECMA-262 picks the even digit and Rust's formatter need not
            // (`184467440737095.1307`: `…095.12` is right, Rust says `…095.13`).
            let f = n.as_f64().unwrap_or(f64::NAN);
            let mut mine = String::new();
            tether_core::canonical::write_f64(f, &mut mine);
            let back: Option<f64> = mine.parse().ok();
            assert!(
                back == Some(f) || (f == 0.0 && mine == "0"),
                "{mine} does not denote {f}"
            );
            if f != 0.0 {
                let reference = ryu_js_like(f);
                assert_eq!(
                    digits(&mine),
                    digits(&reference),
                    "{mine} vs {reference}: not shortest"
                );
            }
            out.push_str(&mine);
        }
        Value::String(s) => out.push_str(&Value::String(s.clone()).to_string()),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_reference(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => write_reference_object(map, out),
    }
}

fn write_reference_object(map: &Map<String, Value>, out: &mut String) {
    let mut names: Vec<(Vec<u16>, &String)> = map
        .keys()
        .map(|k| (k.encode_utf16().collect(), k))
        .collect();
    names.sort();
    out.push('{');
    for (i, (_, k)) in names.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&Value::String((*k).clone()).to_string());
        out.push(':');
        if let Some(v) = map.get(*k) {
            write_reference(v, out);
        }
    }
    out.push('}');
}

/// The significant digits of a number's text (no sign, point, exponent or
/// leading and trailing zeros).
fn digits(text: &str) -> usize {
    let mantissa = text.split(['e', 'E']).next().unwrap_or_default();
    let d: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    d.trim_start_matches('0').trim_end_matches('0').len()
}

/// ECMAScript `Number.prototype.toString` of a finite non-zero f64, from the
/// shortest round-trip digits Rust's `{:e}` gives (the ECMA-262 algorithm:
/// digits `s`, exponent `n`; plain notation for `-7 < n <= 21`).
fn ryu_js_like(f: f64) -> String {
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let e: i64 = exp.parse().unwrap_or(0);
    let k = i64::try_from(digits.len()).unwrap_or(i64::MAX);
    let n = e + 1;
    let sign = if f < 0.0 { "-" } else { "" };
    let body = if k <= n && n <= 21 {
        format!(
            "{digits}{}",
            "0".repeat(usize::try_from(n - k).unwrap_or(0))
        )
    } else if 0 < n && n <= 21 {
        let (a, b) = digits.split_at(usize::try_from(n).unwrap_or(0));
        format!("{a}.{b}")
    } else if -6 < n && n <= 0 {
        format!("0.{}{digits}", "0".repeat(usize::try_from(-n).unwrap_or(0)))
    } else {
        let exp_sign = if n > 0 { "+" } else { "-" };
        let (a, b) = digits.split_at(1);
        let frac = if b.is_empty() {
            String::new()
        } else {
            format!(".{b}")
        };
        format!("{a}{frac}e{exp_sign}{}", (n - 1).abs())
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::ryu_js_like;

    #[test]
    fn the_reference_number_writer_writes_ecmascript_forms() {
        for (f, s) in [
            (1.0, "1"),
            (1.5, "1.5"),
            (1e21, "1e+21"),
            (1e20, "100000000000000000000"),
            (1e-7, "1e-7"),
            (0.000001, "0.000001"),
            (123.456e-10, "1.23456e-8"),
            (-2.5e30, "-2.5e+30"),
            (5e-324, "5e-324"),
        ] {
            assert_eq!(ryu_js_like(f), s);
        }
    }
}
