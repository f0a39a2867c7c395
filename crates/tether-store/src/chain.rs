//! The evidence-chain entry format: sealing new entries and checking stored ones.
//!
//! An entry is the JSON object
//! `{"seq", "ts_ms", "kind", "body", "prev_hash", "hash"}` where `hash` is the
//! lower-case hex SHA-256 of the RFC 8785 form of the entry *without* `hash`,
//! and `prev_hash` is the previous entry's `hash` (64 zeros for seq 1). The
//! stored and exported text of an entry is the canonical form of the whole
//! object, `hash` included, so every byte of it is determined by its content.

use crate::StoreError;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use tether_core::canonical::{self, sha256_hex, write_string, write_u64_number};

/// `prev_hash` of the first entry.
pub const GENESIS_PREV_HASH: &str =
    "0000000000000000000000000000000000000000000000000000000000000000";

/// Largest canonical entry (one line of the export) the store accepts or a
/// verifier reads. Keeps a single event from bloating a batch or a verifier
/// from reading an unbounded line.
pub const MAX_ENTRY_BYTES: usize = 4 << 20;

/// Deepest nesting accepted in an event body (defined with the canonical
/// writer, which enforces it).
pub use tether_core::canonical::MAX_BODY_DEPTH;

/// The member names of an entry, in canonical (sorted) order.
pub(crate) const MEMBERS: [&str; 6] = ["body", "hash", "kind", "prev_hash", "seq", "ts_ms"];

/// A sealed entry: its hash and its canonical text (hash included).
pub(crate) struct Sealed {
    pub hash: String,
    pub line: String,
}

/// Seal one entry from its pre-serialised canonical parts.
///
/// `kind_json` and `body_json` are already canonical JSON (a string literal
/// and an object); the rest is spliced around them so the body is never
/// re-serialised on the writer thread. `scratch` is reused between calls to
/// avoid an allocation per entry.
pub(crate) fn seal(
    seq: u64,
    ts_ms: u64,
    kind_json: &str,
    body_json: &str,
    prev_hash: &str,
    scratch: &mut String,
) -> Sealed {
    // Members after "hash" in sorted order: kind, prev_hash, seq, ts_ms.
    scratch.clear();
    scratch.push_str(",\"kind\":");
    scratch.push_str(kind_json);
    scratch.push_str(",\"prev_hash\":\"");
    scratch.push_str(prev_hash);
    scratch.push_str("\",\"seq\":");
    write_u64_number(seq, scratch);
    scratch.push_str(",\"ts_ms\":");
    write_u64_number(ts_ms, scratch);
    scratch.push('}');
    let tail = scratch.as_str();

    let mut line = String::with_capacity(body_json.len() + tail.len() + 90);
    line.push_str("{\"body\":");
    line.push_str(body_json);
    line.push_str(tail);
    let hash = sha256_hex(line.as_bytes());

    // Rebuild as the full entry: insert the hash member after "body".
    line.truncate(8 + body_json.len());
    line.push_str(",\"hash\":\"");
    line.push_str(&hash);
    line.push('"');
    line.push_str(tail);
    Sealed { hash, line }
}

/// Canonical JSON string literal for an event kind.
pub(crate) fn kind_json(kind: &str) -> String {
    let mut s = String::with_capacity(kind.len() + 2);
    write_string(kind, &mut s);
    s
}

/// What a self-consistent entry says about its place in the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EntryLink {
    pub seq: u64,
    pub hash: String,
    pub prev_hash: String,
    /// The body, for a checkpoint entry (kind
    /// [`crate::checkpoint::CHECKPOINT_KIND`]) only: what a verifier with
    /// public keys checks.
    pub checkpoint: Option<Value>,
}

/// Why an entry's text is broken, and its `seq` when that could be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EntryError {
    pub reason: String,
    pub seq: Option<u64>,
}

impl EntryError {
    fn new(reason: impl Into<String>, seq: Option<u64>) -> Self {
        EntryError {
            reason: reason.into(),
            seq,
        }
    }
}

/// Check one entry's text on its own: it parses, has exactly the entry
/// members with the right types, is in canonical form, and its hash
/// recomputes.
///
/// The fast path ([`check_entry_fast`]) accepts only lines the full check
/// ([`check_entry_reference`]) accepts, with the same result; anything it
/// does not accept goes through the full check, which then names the
/// reason. So the outcome is the reference's, for every input.
pub(crate) fn check_entry_text(line: &[u8]) -> Result<EntryLink, EntryError> {
    match check_entry_fast(line) {
        Some(link) => Ok(link),
        None => check_entry_reference(line),
    }
}

/// Bodies nested deeper than this are left to the reference check, well
/// inside serde_json's recursion limit (128) that the reference parse meets.
const FAST_MAX_DEPTH: usize = 100;

/// A validator of RFC 8785 text as [`canonical::write_canonical`] writes it:
/// it accepts a value's bytes only when they are exactly the canonical form of
/// the value they parse to, without building that value. Whatever it is not
/// sure of (escaped member names, numbers other than short integers that do
/// not re-write identically) it declines (`None`), never guesses.
struct CanonicalScan<'a, 's> {
    b: &'a [u8],
    i: usize,
    scratch: &'s mut String,
}

impl<'a> CanonicalScan<'a, '_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, lit: &[u8]) -> Option<()> {
        let end = self.i.checked_add(lit.len())?;
        (self.b.get(self.i..end)? == lit).then(|| self.i = end)
    }

    fn value(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'{' => self.object(depth.checked_sub(1)?),
            b'[' => self.array(depth.checked_sub(1)?),
            b'"' => self.string().map(|_| ()),
            b't' => self.eat(b"true"),
            b'f' => self.eat(b"false"),
            b'n' => self.eat(b"null"),
            _ => self.number(),
        }
    }

    /// Members strictly in UTF-16 order of their names: sorted, and no
    /// name twice (a repeated name would collapse when parsed).
    fn object(&mut self, depth: usize) -> Option<()> {
        self.eat(b"{")?;
        if self.eat(b"}").is_some() {
            return Some(());
        }
        let mut prev: Option<&str> = None;
        loop {
            let key = self.string()?;
            // An escaped name would need decoding to be ordered: leave it.
            if key.contains(&b'\\') {
                return None;
            }
            let key = std::str::from_utf8(key).ok()?;
            if let Some(p) = prev {
                if canonical::cmp_utf16(p, key) != std::cmp::Ordering::Less {
                    return None;
                }
            }
            prev = Some(key);
            self.eat(b":")?;
            self.value(depth)?;
            if self.eat(b"}").is_some() {
                return Some(());
            }
            self.eat(b",")?;
        }
    }

    fn array(&mut self, depth: usize) -> Option<()> {
        self.eat(b"[")?;
        if self.eat(b"]").is_some() {
            return Some(());
        }
        loop {
            self.value(depth)?;
            if self.eat(b"]").is_some() {
                return Some(());
            }
            self.eat(b",")?;
        }
    }

    /// A string literal with exactly the escapes `write_string` writes; its
    /// raw content (between the quotes).
    fn string(&mut self) -> Option<&'a [u8]> {
        self.eat(b"\"")?;
        let start = self.i;
        loop {
            match self.peek()? {
                b'"' => break,
                b'\\' => {
                    self.i += 1;
                    match self.peek()? {
                        b'"' | b'\\' | b'b' | b'f' | b'n' | b'r' | b't' => self.i += 1,
                        b'u' => self.control_escape()?,
                        _ => return None,
                    }
                }
                0x00..=0x1f => return None,
                _ => self.i += 1,
            }
        }
        let b = self.b;
        let raw = b.get(start..self.i)?;
        self.i += 1;
        Some(raw)
    }

    /// `u00xx` (after the backslash): lower-case hex, a control character
    /// without a short escape of its own.
    fn control_escape(&mut self) -> Option<()> {
        let hex = self.b.get(self.i + 1..self.i + 5)?;
        let (high, d) = match hex {
            [b'0', b'0', b'0', d] => (0, *d),
            [b'0', b'0', b'1', d] => (16, *d),
            _ => return None,
        };
        let low = match d {
            b'0'..=b'9' => d - b'0',
            b'a'..=b'f' => d - b'a' + 10,
            _ => return None,
        };
        // These have a short form, which is the canonical one.
        if matches!(high + low, 0x08 | 0x09 | 0x0a | 0x0c | 0x0d) {
            return None;
        }
        self.i += 5;
        Some(())
    }

    /// A number written as the canonical writer writes the value it parses
    /// to: short integers directly, anything else by re-writing it.
    fn number(&mut self) -> Option<()> {
        let start = self.i;
        while matches!(
            self.peek(),
            Some(b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
        ) {
            self.i += 1;
        }
        let tok = self.b.get(start..self.i)?;
        let digits = tok.strip_prefix(b"-").unwrap_or(tok);
        // Below 10^15 (< 2^53) an integer is written as its digits, without
        // leading zeros; "-0" is written "0".
        let short_int = !digits.is_empty()
            && digits.len() <= 15
            && digits.iter().all(u8::is_ascii_digit)
            && (digits.first() != Some(&b'0') || tok == b"0");
        if short_int {
            return Some(());
        }
        let n: serde_json::Number = serde_json::from_slice(tok).ok()?;
        self.scratch.clear();
        canonical::write_canonical(&Value::Number(n), self.scratch);
        (self.scratch.as_bytes() == tok).then_some(())
    }
}

/// The common case, without building the whole entry as a value: a line in
/// canonical form is exactly
/// `{"body":B,"hash":"H","kind":K,"prev_hash":"P","seq":N,"ts_ms":T}` (the
/// members sorted, no whitespace), so the top level is checked by its bytes,
/// the body by parsing it and writing it canonically to compare, and the
/// hash over the line with the `,"hash":"H"` member spliced out. `None`
/// means "not shown intact here", never "broken".
fn check_entry_fast(line: &[u8]) -> Option<EntryLink> {
    if line.len() > MAX_ENTRY_BYTES || std::str::from_utf8(line).is_err() {
        return None;
    }
    let rest = line.strip_prefix(b"{\"body\":")?;
    if rest.first() != Some(&b'{') {
        return None;
    }
    let mut scratch = String::new();
    let mut scan = CanonicalScan {
        b: rest,
        i: 0,
        scratch: &mut scratch,
    };
    scan.value(FAST_MAX_DEPTH)?;
    let body_len = scan.i;
    let body_raw = rest.get(..body_len)?;
    let hash_at = 8 + body_len;
    let t = rest.get(body_len..)?.strip_prefix(b",\"hash\":\"")?;
    let (hash, t) = take_hex(t)?;
    let t = t.strip_prefix(b"\",\"kind\":")?;
    let (kind, t) = take_string(t, &mut scratch)?;
    let t = t.strip_prefix(b",\"prev_hash\":\"")?;
    let (prev_hash, t) = take_hex(t)?;
    let t = t.strip_prefix(b"\",\"seq\":")?;
    let (seq, t) = take_u64(t, b',', &mut scratch)?;
    let t = t.strip_prefix(b",\"ts_ms\":")?;
    let (_ts_ms, t) = take_u64(t, b'}', &mut scratch)?;
    if t != b"}" || seq < 1 {
        return None;
    }
    // The member `,"hash":"<64>"` is 74 bytes; the rest is what was hashed.
    let mut hasher = Sha256::new();
    hasher.update(line.get(..hash_at)?);
    hasher.update(line.get(hash_at + 74..)?);
    if !hex_equals(&hasher.finalize(), hash) {
        return None;
    }
    // Only a checkpoint's body is wanted as a value (one entry in ~1,000).
    let checkpoint = if kind == crate::checkpoint::CHECKPOINT_KIND {
        Some(serde_json::from_slice(body_raw).ok()?)
    } else {
        None
    };
    Some(EntryLink {
        seq,
        hash: std::str::from_utf8(hash).ok()?.to_string(),
        prev_hash: std::str::from_utf8(prev_hash).ok()?.to_string(),
        checkpoint,
    })
}

/// Whether `hex` is the lower-case hex spelling of `digest`.
fn hex_equals(digest: &[u8], hex: &[u8]) -> bool {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    hex.len() == 2 * digest.len()
        && digest
            .iter()
            .zip(hex.chunks_exact(2))
            .all(|(d, h)| h == [DIGITS[usize::from(d >> 4)], DIGITS[usize::from(d & 0x0f)]])
}

/// 64 lower-case hex digits and the closing quote, then what follows.
fn take_hex(t: &[u8]) -> Option<(&[u8], &[u8])> {
    let hex = t.get(..64)?;
    let ok = hex
        .iter()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b));
    ok.then(|| (hex, t.get(64..).unwrap_or_default()))
}

/// A JSON string literal in canonical form at the start of `t`: its value
/// and what follows it.
fn take_string<'a>(t: &'a [u8], scratch: &mut String) -> Option<(Cow<'a, str>, &'a [u8])> {
    if t.first() != Some(&b'"') {
        return None;
    }
    // Find the closing quote: the first `"` not escaped by a backslash.
    let mut i = 1;
    let end = loop {
        match t.get(i)? {
            b'\\' => i += 2,
            b'"' => break i + 1,
            _ => i += 1,
        }
    };
    let raw = t.get(..end)?;
    let after = t.get(end..).unwrap_or_default();
    let inner = raw.get(1..end - 1)?;
    // Without escapes or control characters the literal is its own value
    // and canonical (the line is UTF-8, checked first).
    if inner.iter().all(|&b| b >= 0x20 && b != b'\\') {
        return Some((Cow::Borrowed(std::str::from_utf8(inner).ok()?), after));
    }
    let value: String = serde_json::from_slice(raw).ok()?;
    scratch.clear();
    write_string(&value, scratch);
    (scratch.as_bytes() == raw).then_some((Cow::Owned(value), after))
}

/// A non-negative integer in canonical form, ended by `stop`.
fn take_u64<'a>(t: &'a [u8], stop: u8, scratch: &mut String) -> Option<(u64, &'a [u8])> {
    let len = t.iter().position(|&b| b == stop)?;
    let digits = t.get(..len)?;
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    // Below 10^15 (< 2^53) the canonical spelling is the digits without
    // leading zeros; larger values are re-written to compare.
    if digits.len() <= 15 && (digits.first() != Some(&b'0') || digits == b"0") {
        return Some((n, t.get(len..).unwrap_or_default()));
    }
    scratch.clear();
    write_u64_number(n, scratch);
    (scratch.as_bytes() == digits).then(|| (n, t.get(len..).unwrap_or_default()))
}

/// The full check, on a parsed value: the reference the fast path must agree
/// with, and what names the reason an entry is broken.
pub(crate) fn check_entry_reference(line: &[u8]) -> Result<EntryLink, EntryError> {
    if line.len() > MAX_ENTRY_BYTES {
        return Err(EntryError::new(
            format!("line longer than {MAX_ENTRY_BYTES} bytes"),
            None,
        ));
    }
    let text = std::str::from_utf8(line)
        .map_err(|_| EntryError::new("unparseable line: not UTF-8", None))?;
    let value: Value = serde_json::from_str(text)
        .map_err(|e| EntryError::new(format!("unparseable line: {e}"), None))?;
    let Value::Object(map) = &value else {
        return Err(EntryError::new("entry is not a JSON object", None));
    };
    let seq = map.get("seq").and_then(Value::as_u64);
    let link = check_members(map).map_err(|r| EntryError::new(r, seq))?;
    // Canonical form is what makes every byte significant: without it a
    // re-spelled escape or exponent would leave the parsed value (and so the
    // hash) unchanged.
    if canonical::to_canonical_string(&value) != text {
        return Err(EntryError::new("line is not in canonical form", seq));
    }
    let Value::Object(mut without_hash) = value else {
        return Err(EntryError::new("entry is not a JSON object", seq));
    };
    without_hash.remove("hash");
    let stripped = Value::Object(without_hash);
    if sha256_hex(canonical::to_canonical_string(&stripped)) != link.hash {
        return Err(EntryError::new("hash mismatch", seq));
    }
    let mut link = link;
    if let Value::Object(mut m) = stripped {
        if map_kind_is_checkpoint(&m) {
            link.checkpoint = m.remove("body");
        }
    }
    Ok(link)
}

fn check_members(map: &Map<String, Value>) -> Result<EntryLink, String> {
    for name in MEMBERS {
        if !map.contains_key(name) {
            return Err(format!("missing member \"{name}\""));
        }
    }
    if let Some(extra) = map.keys().find(|k| !MEMBERS.contains(&k.as_str())) {
        return Err(format!("unexpected member \"{extra}\""));
    }
    let seq = map
        .get("seq")
        .and_then(Value::as_u64)
        .filter(|s| *s >= 1)
        .ok_or("seq is not a positive integer")?;
    map.get("ts_ms")
        .and_then(Value::as_u64)
        .ok_or("ts_ms is not a non-negative integer")?;
    map.get("kind")
        .and_then(Value::as_str)
        .ok_or("kind is not a string")?;
    map.get("body")
        .and_then(Value::as_object)
        .ok_or("body is not an object")?;
    let hash = hex_member(map, "hash")?;
    let prev_hash = hex_member(map, "prev_hash")?;
    Ok(EntryLink {
        seq,
        hash,
        prev_hash,
        checkpoint: None,
    })
}

fn map_kind_is_checkpoint(map: &Map<String, Value>) -> bool {
    map.get("kind").and_then(Value::as_str) == Some(crate::checkpoint::CHECKPOINT_KIND)
}

fn hex_member(map: &Map<String, Value>, name: &str) -> Result<String, String> {
    match map.get(name).and_then(Value::as_str) {
        Some(s) if is_hash_hex(s) => Ok(s.to_string()),
        _ => Err(format!("{name} is not 64 lower-case hex digits")),
    }
}

/// 64 lower-case hex digits.
pub(crate) fn is_hash_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The body of the stored chain entry `line` (`null` if it has none).
fn entry_body(line: &str) -> Result<Value, serde_json::Error> {
    let mut entry: Value = serde_json::from_str(line)?;
    Ok(entry
        .get_mut("body")
        .map(Value::take)
        .unwrap_or(Value::Null))
}

/// The receipt of `command_id` out of the chain entry `line` that records it.
pub(crate) fn receipt_from_entry(command_id: &str, line: &str) -> Result<Value, StoreError> {
    let receipt = entry_body(line)
        .map_err(|e| {
            StoreError::Corrupt(format!(
                "stored chain entry for {command_id:?} is not valid JSON: {e}"
            ))
        })?
        .get_mut("receipt")
        .map(Value::take)
        .unwrap_or(Value::Null);
    if receipt.get("command_id").and_then(Value::as_str) != Some(command_id) {
        return Err(StoreError::Corrupt(format!(
            "the chain entry indexed for command_id {command_id:?} does not hold its receipt"
        )));
    }
    Ok(receipt)
}

/// The receipt of `command_id` as a receipts row leads to it: out of its
/// chain entry `line` while the chain holds it, else the document the row
/// kept when that entry was archived (`kept`). Neither is corruption.
pub(crate) fn receipt_from_row(
    command_id: &str,
    line: Option<String>,
    kept: Option<String>,
    seq: i64,
) -> Result<Value, StoreError> {
    match (line, kept) {
        (Some(line), _) => receipt_from_entry(command_id, &line),
        (None, Some(kept)) => {
            let receipt: Value = serde_json::from_str(&kept).map_err(|e| {
                StoreError::Corrupt(format!(
                    "the kept receipt of command_id {command_id:?} is not valid JSON: {e}"
                ))
            })?;
            if receipt.get("command_id").and_then(Value::as_str) != Some(command_id) {
                return Err(StoreError::Corrupt(format!(
                    "the kept receipt of command_id {command_id:?} is another command's"
                )));
            }
            Ok(receipt)
        }
        (None, None) => Err(StoreError::Corrupt(format!(
            "the receipt of command_id {command_id:?} is indexed at entry {seq}, which is missing (and no archive kept it)"
        ))),
    }
}

/// The invocation record held as the body of the chain entry `line`, which
/// must name `invocation_id`.
pub(crate) fn invocation_from_entry(
    invocation_id: &str,
    line: &str,
) -> Result<crate::EventBody, StoreError> {
    let body = entry_body(line).map_err(|e| {
        StoreError::Corrupt(format!(
            "stored chain entry for invocation {invocation_id:?} is not valid JSON: {e}"
        ))
    })?;
    if body.get("invocation_id").and_then(Value::as_str) != Some(invocation_id) {
        return Err(StoreError::Corrupt(format!(
            "the chain entry indexed for invocation {invocation_id:?} does not hold its record"
        )));
    }
    Ok(body.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn sealed_line_is_canonical_entry() {
        let body = json!({"z": 1, "a": "x\ny", "n": 1.5});
        let mut scratch = String::new();
        let s = seal(
            7,
            1_700_000_000_123,
            &kind_json("command.started"),
            &canonical::to_canonical_string(&body),
            GENESIS_PREV_HASH,
            &mut scratch,
        );
        let without = json!({
            "seq": 7, "ts_ms": 1_700_000_000_123u64, "kind": "command.started",
            "body": body, "prev_hash": GENESIS_PREV_HASH,
        });
        let want_hash = sha256_hex(canonical::to_canonical_string(&without));
        assert_eq!(s.hash, want_hash);
        let mut with = without.clone();
        with["hash"] = json!(want_hash);
        assert_eq!(s.line, canonical::to_canonical_string(&with));
        let link = check_entry_text(s.line.as_bytes()).expect("intact entry");
        assert_eq!(link.seq, 7);
        assert_eq!(link.prev_hash, GENESIS_PREV_HASH);
    }

    #[test]
    fn broken_entries_are_named() {
        let mut scratch = String::new();
        let s = seal(1, 5, &kind_json("k"), "{}", GENESIS_PREV_HASH, &mut scratch);
        let tampered = s.line.replace("\"ts_ms\":5", "\"ts_ms\":6");
        assert_eq!(reason(&tampered), "hash mismatch");
        let spaced = s.line.replace("\"seq\":1", "\"seq\": 1");
        assert_eq!(reason(&spaced), "line is not in canonical form");
        let ctl = seal(
            1,
            5,
            &kind_json("k"),
            "{\"a\":\"\\u001f\"}",
            GENESIS_PREV_HASH,
            &mut scratch,
        );
        assert_eq!(reason(&ctl.line), "ok");
        // Same parsed value, different bytes: only the canonical check sees it.
        assert_eq!(
            reason(&ctl.line.replace("u001f", "u001F")),
            "line is not in canonical form"
        );
        assert!(reason("{").starts_with("unparseable line"));
        assert_eq!(reason(r#"{"seq":1}"#), "missing member \"body\"");
        let extra = s.line.replace("{\"body\"", "{\"aaa\":1,\"body\"");
        assert_eq!(reason(&extra), "unexpected member \"aaa\"");
    }

    /// The fast path accepts only what the reference accepts, with the same
    /// link; the combined check always answers as the reference does.
    fn agree(line: &[u8]) -> Option<EntryLink> {
        let want = check_entry_reference(line);
        let fast = check_entry_fast(line);
        if let Some(f) = &fast {
            assert_eq!(
                Ok(f.clone()),
                want,
                "fast path accepted {:?}",
                String::from_utf8_lossy(line)
            );
        }
        assert_eq!(check_entry_text(line), want);
        fast
    }

    fn sealed(seq: u64, ts: u64, kind_raw: &str, body_raw: &str) -> String {
        seal(
            seq,
            ts,
            kind_raw,
            body_raw,
            GENESIS_PREV_HASH,
            &mut String::new(),
        )
        .line
    }

    #[test]
    fn fast_path_matches_reference_on_hand_made_lines() {
        let body = r#"{"a":[1,2.5,-3,"x\u001f\n"],"hash":"nested","z":{"hash":1}}"#;
        let good = sealed(3, 9, &kind_json("k\"q"), body);
        assert!(
            agree(good.as_bytes()).is_some(),
            "intact entry takes the fast path"
        );
        let cp = sealed(
            4,
            9,
            &kind_json(crate::checkpoint::CHECKPOINT_KIND),
            "{\"x\":1}",
        );
        let link = agree(cp.as_bytes()).expect("checkpoint");
        assert_eq!(link.checkpoint, Some(serde_json::json!({"x": 1})));
        // Hashes that match their (non-canonical) text: only the canonical
        // checks refuse these.
        let bodies = [
            "{\"a\": 1}",
            " {\"a\":1}",
            "{\"a\":\"\\u001F\"}",
            "{\"a\":1e0}",
            "{\"a\":1E1}",
            "{\"a\":10.0}",
            "{\"b\":1,\"a\":2}",
            "{\"a\":1,\"a\":1}",
            "{\"a\":\"\\u0041\"}",
            "[1]",
            "1",
            "{\"a\":-0}",
            "{\"a\":9007199254740993}",
            "{\"a\":1}x",
            "{",
        ];
        for b in bodies {
            assert!(agree(sealed(1, 2, "\"k\"", b).as_bytes()).is_none(), "{b}");
        }
        for k in ["\"\\u0041\"", "\"a\\/\"", "1", "\"a", "\"\\\""] {
            assert!(agree(sealed(1, 2, k, "{}").as_bytes()).is_none(), "{k}");
        }
        // UTF-16 order, not UTF-8 order: U+1F600 sorts before U+E000.
        let utf16 = sealed(1, 2, "\"k\"", "{\"\u{1f600}\":1,\"\u{e000}\":2}");
        assert!(agree(utf16.as_bytes()).is_some());
        let utf8 = sealed(1, 2, "\"k\"", "{\"\u{e000}\":2,\"\u{1f600}\":1}");
        assert!(agree(utf8.as_bytes()).is_none());
        for b in [
            "{\"\\u0001\":1}",
            "{\"a\":\"\\u007f\"}",
            "{\"a\":\"\\u001f\\u0000\\b\"}",
        ] {
            agree(sealed(1, 2, "\"k\"", b).as_bytes());
        }
        let deep = format!("{}{}", "[".repeat(126), "]".repeat(126));
        agree(sealed(1, 2, "\"k\"", &format!("{{\"a\":{deep}}}")).as_bytes());
        for big in [0, 9_007_199_254_740_993, u64::MAX] {
            agree(sealed(big, big, "\"k\"", "{}").as_bytes());
        }
        let line = sealed(1, 2, "\"k\"", "{}");
        for variant in [
            line.replace("{\"body\":{}", "{\"body\":{},\"body\":{}"),
            line.replace("\"seq\":1", "\"seq\":\"1\""),
            line.replace("\"seq\":1", "\"seq\":01"),
            line.replace("\"ts_ms\":2}", "\"ts_ms\":2,\"zz\":1}"),
            line.replace(",\"seq\":1", ""),
            format!("{line} "),
            format!(" {line}"),
        ] {
            assert!(agree(variant.as_bytes()).is_none(), "{variant}");
        }
        let mut bad_utf8 = line.clone().into_bytes();
        bad_utf8.insert(9, 0xff);
        assert!(agree(&bad_utf8).is_none());
    }

    fn reason(line: &str) -> String {
        match check_entry_text(line.as_bytes()) {
            Ok(_) => "ok".into(),
            Err(e) => e.reason,
        }
    }

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            "[a-z\\u{0}-\\u{1f}\"\\\\\u{e000}\u{1f600}]{0,6}".prop_map(Value::String),
        ]
    }

    fn json_value() -> impl Strategy<Value = Value> {
        leaf().prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map(
                    "(hash|body|seq|[a-z\u{e000}\u{1f600}]{0,3})",
                    inner,
                    0..4
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Byte-level damage to a line: insert, replace, delete, truncate.
    fn damage(line: &[u8], op: u8, at: usize, byte: u8) -> Vec<u8> {
        let mut v = line.to_vec();
        let at = at % (v.len() + 1);
        match op % 4 {
            0 => v.insert(at, byte),
            1 if at < v.len() => v[at] = byte,
            2 if at < v.len() => {
                v.remove(at);
            }
            _ => v.truncate(at),
        }
        v
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

        #[test]
        fn fast_path_agrees_with_reference(
            body in prop::collection::btree_map("(hash|[a-z]{1,3})", json_value(), 0..4),
            kind in "[a-z.\"\\\\\u{1}\u{e9}]{0,8}",
            seq in prop_oneof![1u64..1000, any::<u64>()],
            ts in any::<u64>(),
            op in any::<u8>(),
            at in any::<usize>(),
            byte in prop::sample::select(vec![b' ', b'"', b'\\', b',', b'}', b'{', b'0', b'e', b'E', b'a', b'F', 0xff, 0x1f]),
        ) {
            let body = Value::Object(body.into_iter().collect());
            let body_raw = canonical::to_canonical_string(&body);
            let line = sealed(seq, ts, &kind_json(&kind), &body_raw);
            let fast = agree(line.as_bytes());
            if seq <= 1 << 53 && ts <= 1 << 53 {
                prop_assert!(fast.is_some(), "sealed entry missed the fast path: {line}");
            }
            agree(&damage(line.as_bytes(), op, at, byte));
            // Damage inside the body, resealed so the hash matches the text:
            // only the canonical checks can refuse it.
            let body_damaged = damage(body_raw.as_bytes(), op, at, byte);
            if let Ok(b) = std::str::from_utf8(&body_damaged) {
                agree(sealed(seq, ts, &kind_json(&kind), b).as_bytes());
            }
            let respelled = body_raw.replace("u001f", "u001F").replace("\\n", "\\u000a");
            agree(sealed(seq, ts, &kind_json(&kind), &respelled).as_bytes());
        }
    }
}
