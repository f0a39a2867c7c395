//! `application/x-www-form-urlencoded` bodies, as the console's forms send
//! them: bounded, decoded (`+` is a space, `%XX` a byte), first value of a
//! name wins. Written here rather than pulled in: a few lines, and axum's
//! `form` feature would bring `serde_urlencoded` for this alone.

use axum::body::Body;
use std::collections::HashMap;

/// A decoded form.
pub type Form = HashMap<String, String>;

/// Fields a form may carry at most.
const FIELDS_MAX: usize = 32;

fn decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' => {
                let hex = |b: u8| char::from(b).to_digit(16);
                let hi = hex(*bytes.get(i + 1)?)?;
                let lo = hex(*bytes.get(i + 2)?)?;
                out.push(u8::try_from(hi * 16 + lo).ok()?);
                i += 3;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Parses a form body; `None` when a field does not decode or there are too
/// many.
pub fn parse(text: &str) -> Option<Form> {
    let mut out = Form::new();
    for (n, pair) in text.split('&').filter(|p| !p.is_empty()).enumerate() {
        if n >= FIELDS_MAX {
            return None;
        }
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        out.entry(decode(k)?).or_insert(decode(v)?);
    }
    Some(out)
}

/// Reads and parses a body of at most `max` bytes.
pub async fn read(body: Body, max: usize) -> Option<Form> {
    match crate::read_body(body, max).await {
        crate::BodyBytes::Whole(b) => parse(std::str::from_utf8(&b).ok()?),
        crate::BodyBytes::TooLarge(_) | crate::BodyBytes::Broken => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_decode_as_browsers_send_them() {
        let f = parse("csrf=a%2Bb&reason=door+checked&reason=second&empty=").unwrap_or_default();
        assert_eq!(f.get("csrf").map(String::as_str), Some("a+b"));
        assert_eq!(f.get("reason").map(String::as_str), Some("door checked"));
        assert_eq!(f.get("empty").map(String::as_str), Some(""));
        assert!(parse("x=%zz").is_none());
        assert!(parse(&"a=1&".repeat(FIELDS_MAX + 1)).is_none());
    }
}
