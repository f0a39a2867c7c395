//! What a command answers, and a receipt written once as canonical text.
//!
//! The common command (dispatched, completed, durable) renders its receipt
//! once, straight from typed fields into RFC 8785 text: that text goes into
//! the evidence entry and is what the caller is answered with, so the
//! receipt never exists as a `serde_json::Value` tree on the hot path. The
//! surfaces splice the text into their envelopes. Every other answer (a
//! refusal, a replay, a read, an e-stop receipt) is a `Value` as before.
//!
//! Both forms denote the same document: the text is canonical, so parsing it
//! gives what the chain gives back on a replay (numbers in canonical form).

use serde_json::Value;
use std::borrow::Cow;
use tether_core::{Receipt, Refusal};
use tether_store::canonical::{self, CanonicalText, Member, MembersError};
use tether_store::MAX_BODY_DEPTH;

/// A command's answer: a document as a value or as canonical JSON text.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// A JSON document.
    Value(Value),
    /// The canonical text of a JSON object: a dispatched command's receipt,
    /// given only once it is durable (one that could not be made durable is
    /// answered as a `Value` marked `x-tether`).
    Canonical(CanonicalText),
}

impl From<Value> for Answer {
    fn from(v: Value) -> Self {
        Answer::Value(v)
    }
}

impl Answer {
    /// The document as a value (parses canonical text).
    pub fn into_value(self) -> Value {
        match self {
            Answer::Value(v) => v,
            Answer::Canonical(text) => parse_canonical(text.as_str()),
        }
    }

    /// Appends the document as JSON to `out`.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        match self {
            Answer::Value(v) => {
                if let Err(e) = serde_json::to_writer(&mut *out, v) {
                    // A `Value` always serialises; keep the output JSON if not.
                    tracing::error!(error = %e, "an answer could not be serialised");
                    out.extend_from_slice(b"null");
                }
            }
            Answer::Canonical(text) => out.extend_from_slice(text.as_str().as_bytes()),
        }
    }

    /// The document's `status` member, when it is a string.
    pub fn status(&self) -> Option<&str> {
        match self {
            Answer::Value(v) => v.get("status").and_then(Value::as_str),
            Answer::Canonical(text) => plain_string(top_level_raw(text.as_str(), "status")?),
        }
    }

    /// Top-level member `name`, when it is a string.
    pub fn string_member(&self, name: &str) -> Option<Cow<'_, str>> {
        match self {
            Answer::Value(v) => v.get(name).and_then(Value::as_str).map(Cow::Borrowed),
            Answer::Canonical(text) => {
                let raw = top_level_raw(text.as_str(), name)?;
                match plain_string(raw) {
                    Some(plain) => Some(Cow::Borrowed(plain)),
                    // Escapes: let the parser undo them.
                    None => serde_json::from_str::<String>(raw).ok().map(Cow::Owned),
                }
            }
        }
    }

    /// A copy of top-level member `name` (`None` when absent).
    pub fn member(&self, name: &str) -> Option<Value> {
        match self {
            Answer::Value(v) => v.get(name).cloned(),
            Answer::Canonical(text) => {
                serde_json::from_str(top_level_raw(text.as_str(), name)?).ok()
            }
        }
    }

    /// Whether the kernel marks this receipt as not durable (`x-tether`).
    pub fn not_durable(&self) -> bool {
        match self {
            Answer::Value(v) => v.get("x-tether").is_some(),
            // Only a durable receipt is answered as canonical text.
            Answer::Canonical(_) => false,
        }
    }

    /// Whether the document has a top-level member `name`.
    pub fn has_member(&self, name: &str) -> bool {
        match self {
            Answer::Value(v) => v.get(name).is_some(),
            Answer::Canonical(text) => top_level_raw(text.as_str(), name).is_some(),
        }
    }
}

/// Parses text this crate wrote canonically; `Null` (logged) if it does not
/// parse, which would be a defect of the writer.
fn parse_canonical(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| {
        debug_assert!(false, "canonical text does not parse: {e}");
        tracing::error!(error = %e, "a canonical answer does not parse");
        Value::Null
    })
}

/// The contents of a JSON string literal that holds no escape.
fn plain_string(raw: &str) -> Option<&str> {
    let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
    (!inner.contains('\\')).then_some(inner)
}

/// The raw JSON text of top-level member `name` of canonical object text
/// (compact: no whitespace between tokens), for a `name` without escapes.
/// `None` when absent or when the text is not such an object. Every step
/// moves forward, so the walk is bounded by the text's length.
fn top_level_raw<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let bytes = text.as_bytes();
    let mut i = usize::from(bytes.first() == Some(&b'{'));
    if i == 0 {
        return None;
    }
    while i < bytes.len() && bytes[i] == b'"' {
        let key_end = string_end(bytes, i)?;
        let key = text.get(i + 1..key_end - 1)?;
        if bytes.get(key_end) != Some(&b':') {
            return None;
        }
        let value_start = key_end + 1;
        let value_end = value_end(bytes, value_start)?;
        if key == name {
            return text.get(value_start..value_end);
        }
        i = value_end;
        match bytes.get(i) {
            Some(b',') => i += 1,
            _ => return None,
        }
    }
    None
}

/// Index just past the string literal that starts at `start` (a `"`).
fn string_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    // Jump between quotes and backslashes: strings are most of a receipt.
    while let Some(at) = bytes
        .get(i..)
        .and_then(|rest| memchr::memchr2(b'"', b'\\', rest))
    {
        i += at;
        match bytes[i] {
            b'"' => return Some(i + 1),
            _ => i += 2,
        }
    }
    None
}

/// Index just past the JSON value that starts at `start`.
fn value_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = start;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i = string_end(bytes, i)?;
                if depth == 0 {
                    return Some(i);
                }
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' if depth == 0 => return Some(i),
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            b',' if depth == 0 => return Some(i),
            _ => {}
        }
        i += 1;
    }
    None
}

/// How deep a document member of a receipt may nest: the receipt sits one
/// level inside its event body, and the body as a whole is bounded.
const RECEIPT_MEMBER_DEPTH: usize = MAX_BODY_DEPTH - 2;

/// Receipt members the kernel adds beside the typed ones (the same names
/// `Kernel::receipt` puts in `extra` on the value path).
pub(crate) struct ReceiptExtras<'a> {
    pub latency_us: u64,
    pub policy: Option<&'a Value>,
    pub approval_id: Option<&'a str>,
    pub operation_id: Option<&'a str>,
}

/// The canonical text of `r` with `extras` (and `r.extra`): the same
/// document `Receipt::into_json` builds, with the extras inserted, in
/// canonical form.
///
/// # Errors
/// A member nested deeper than the evidence bound allows.
pub(crate) fn write_receipt(
    r: &Receipt,
    extras: &ReceiptExtras<'_>,
) -> Result<CanonicalText, MembersError> {
    let error_text = r.error.as_ref().map(refusal_text).transpose()?;
    fn opt_u64(v: Option<u64>) -> Member<'static> {
        v.map_or(Member::Null, Member::U64)
    }
    fn opt_str(v: Option<&str>) -> Member<'_> {
        v.map_or(Member::Null, Member::Str)
    }
    let mut members: Vec<(&str, Member<'_>)> = Vec::with_capacity(20 + r.extra.len());
    // In UTF-16 order already, so the sort is one pass.
    members.extend([
        ("accepted_at_ms", Member::U64(r.accepted_at_ms)),
        ("capability_id", Member::Str(&r.capability_id)),
        ("command_id", Member::Str(&r.command_id)),
        ("completed_at_ms", Member::U64(r.completed_at_ms)),
        ("decision", opt_str(r.decision)),
        ("device_id", Member::Str(&r.device_id)),
        (
            "error",
            error_text.as_ref().map_or(Member::Null, Member::Canonical),
        ),
        ("input_digest", Member::Str(&r.input_digest)),
        ("mode", Member::Str(r.mode)),
        (
            "output",
            r.output.as_ref().map_or(Member::Null, Member::Value),
        ),
        ("receipt_id", Member::Str(&r.receipt_id)),
        ("replayed", Member::Bool(false)),
        ("resource", opt_str(r.resource.as_deref())),
        ("state_revision_after", opt_u64(r.state_revision_after)),
        ("state_revision_before", opt_u64(r.state_revision_before)),
        ("status", Member::Str(r.status.as_str())),
    ]);
    // As on the value path: `extra` members are inserted after the fixed
    // ones (a name in both takes the extra's value), the kernel's after those.
    members.extend(r.extra.iter().map(|(k, v)| (k.as_str(), Member::Value(v))));
    members.push(("latency_us", Member::U64(extras.latency_us)));
    if let Some(p) = extras.policy {
        members.push(("policy", Member::Value(p)));
    }
    if let Some(id) = extras.approval_id {
        members.push(("approval_id", Member::Str(id)));
    }
    if let Some(id) = extras.operation_id {
        members.push(("operation_id", Member::Str(id)));
    }
    canonical::object_text(&mut members, RECEIPT_MEMBER_DEPTH)
}

/// The wire error object of a receipt (`Refusal::to_json`), canonically.
fn refusal_text(e: &Refusal) -> Result<CanonicalText, MembersError> {
    let mut members = [
        ("details", Member::Value(&e.details)),
        ("message", Member::Str(&e.message)),
        ("mhs_code", Member::Str(e.code.as_str())),
        ("retryable", Member::Bool(e.code.retryable())),
    ];
    canonical::object_text(&mut members, RECEIPT_MEMBER_DEPTH - 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Map};
    use tether_core::{Code, Status};

    fn receipt(status: Status, error: Option<Refusal>, output: Option<Value>) -> Receipt {
        let mut extra = Map::new();
        extra.insert("x-note".into(), json!({"b": 1.0, "a": [true]}));
        Receipt {
            receipt_id: "rcpt_01".into(),
            command_id: "01CMD".into(),
            device_id: "thermostat-1".into(),
            capability_id: "cap.thermal.setpoint.v1".into(),
            resource: Some("main".into()),
            status,
            output,
            error,
            input_digest: "sha256:00".into(),
            state_revision_before: Some(3),
            state_revision_after: None,
            decision: Some("allow"),
            mode: "simulated",
            accepted_at_ms: 1_700_000_000_000,
            completed_at_ms: 1_700_000_000_001,
            extra,
        }
    }

    /// The value path's document for the same receipt and extras.
    fn value_path(r: &Receipt, x: &ReceiptExtras<'_>) -> Value {
        let mut v = r.clone().into_json();
        v["latency_us"] = json!(x.latency_us);
        if let Some(p) = x.policy {
            v["policy"] = p.clone();
        }
        if let Some(id) = x.approval_id {
            v["approval_id"] = json!(id);
        }
        if let Some(id) = x.operation_id {
            v["operation_id"] = json!(id);
        }
        canonical::normalize_numbers(&mut v);
        v
    }

    #[test]
    fn the_written_receipt_is_the_canonical_form_of_the_value_path_receipt() {
        let policy = json!({"decision": "allow", "policies": ["p"], "reason": "r \"q\""});
        let refusal = Refusal::new(
            Code::SafetyEnvelopeViolation,
            "above max",
            json!({"path": "/t", "bound": 90.0, "value": 1e300}),
        );
        let cases = [
            receipt(
                Status::Completed,
                None,
                Some(json!({"target_temperature": 51.0})),
            ),
            receipt(Status::Failed, Some(refusal.clone()), None),
            receipt(Status::Cancelled, Some(refusal), Some(json!([1, -0.0]))),
            receipt(Status::Unknown, None, None),
        ];
        for r in &cases {
            for x in [
                ReceiptExtras {
                    latency_us: 17,
                    policy: Some(&policy),
                    approval_id: Some("appr_1"),
                    operation_id: Some("op_1"),
                },
                ReceiptExtras {
                    latency_us: 0,
                    policy: None,
                    approval_id: None,
                    operation_id: None,
                },
            ] {
                let text = write_receipt(r, &x).expect("written");
                let expected = value_path(r, &x);
                assert_eq!(text.as_str(), canonical::to_canonical_string(&expected));
                let answer = Answer::Canonical(text);
                assert_eq!(answer.status(), Some(r.status.as_str()));
                assert_eq!(answer.clone().into_value(), expected);
                let mut bytes = Vec::new();
                answer.write_json(&mut bytes);
                assert_eq!(serde_json::from_slice::<Value>(&bytes).ok(), Some(expected));
            }
        }
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn text() -> impl Strategy<Value = String> {
            "[a-z\"\\\n\u{1}\u{E000}\u{1F600} ]{0,6}"
        }

        fn document() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::from),
                any::<i64>().prop_map(Value::from),
                any::<f64>()
                    .prop_filter("finite", |f| f.is_finite())
                    .prop_map(Value::from),
                text().prop_map(Value::from),
            ];
            leaf.prop_recursive(3, 12, 3, |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                    proptest::collection::vec((text(), inner), 0..3)
                        .prop_map(|kv| Value::Object(kv.into_iter().collect())),
                ]
            })
        }

        fn status() -> impl Strategy<Value = Status> {
            prop_oneof![
                Just(Status::Completed),
                Just(Status::Failed),
                Just(Status::Cancelled),
                Just(Status::Unknown),
                Just(Status::Rejected),
            ]
        }

        proptest! {
            /// Whatever the fields hold, the written receipt is the canonical
            /// form of the value path's receipt.
            #[test]
            fn any_receipt_is_written_as_the_value_paths_canonical_form(
                st in status(),
                ids in proptest::array::uniform4(text()),
                output in proptest::option::of(document()),
                error in proptest::option::of((text(), document())),
                revisions in (proptest::option::of(any::<u64>()), proptest::option::of(any::<u64>())),
                extra in proptest::collection::vec((text(), document()), 0..3),
                policy in proptest::option::of(document()),
                latency in any::<u64>(),
            ) {
                let mut r = receipt(st, None, output);
                r.receipt_id = ids[0].clone();
                r.command_id = ids[1].clone();
                r.device_id = ids[2].clone();
                r.input_digest = ids[3].clone();
                r.resource = None;
                r.error = error.map(|(m, d)| Refusal::new(Code::ProtocolInternal, m, d));
                (r.state_revision_before, r.state_revision_after) = revisions;
                r.extra = extra.into_iter().collect();
                let x = ReceiptExtras {
                    latency_us: latency,
                    policy: policy.as_ref(),
                    approval_id: Some(&ids[0]),
                    operation_id: None,
                };
                let written = write_receipt(&r, &x);
                prop_assert!(written.is_ok());
                let written = written.map(CanonicalText::into_string).unwrap_or_default();
                prop_assert_eq!(written, canonical::to_canonical_string(&value_path(&r, &x)));
            }

            /// Reading a member out of canonical text gives what the parsed
            /// text holds, for any object and any name.
            #[test]
            fn members_read_from_canonical_text_are_the_documents(
                members in proptest::collection::vec((text(), document()), 0..6),
                probe in text(),
            ) {
                let doc = Value::Object(members.into_iter().collect());
                let text = CanonicalText::of_value(&doc, 16);
                prop_assert!(text.is_ok());
                let answer = Answer::Canonical(text.unwrap_or_else(|_| unreachable!()));
                // What the text denotes (numbers in canonical form).
                let doc = answer.clone().into_value();
                let names: Vec<String> = doc
                    .as_object()
                    .map(|o| o.keys().cloned().collect())
                    .unwrap_or_default();
                for name in names.iter().chain(std::iter::once(&probe)) {
                    // Names with escapes are not looked up (ids and words are plain).
                    if canonical::to_canonical_string(&Value::from(name.as_str())).contains('\\') {
                        continue;
                    }
                    prop_assert_eq!(answer.member(name), doc.get(name).cloned());
                    prop_assert_eq!(answer.has_member(name), doc.get(name).is_some());
                    prop_assert_eq!(
                        answer.string_member(name).map(|c| c.into_owned()),
                        doc.get(name).and_then(Value::as_str).map(str::to_owned)
                    );
                }
            }
        }
    }

    #[test]
    fn an_output_nested_past_the_evidence_bound_is_refused() {
        let mut deep = json!(1);
        for _ in 0..RECEIPT_MEMBER_DEPTH + 1 {
            deep = json!([deep]);
        }
        let r = receipt(Status::Completed, None, Some(deep));
        let x = ReceiptExtras {
            latency_us: 1,
            policy: None,
            approval_id: None,
            operation_id: None,
        };
        assert_eq!(write_receipt(&r, &x), Err(MembersError::TooDeep));
    }

    #[test]
    fn status_is_read_from_the_top_level_only() {
        let text = |v: Value| CanonicalText::of_value(&v, 8).expect("shallow");
        let a = Answer::Canonical(text(
            json!({"output": {"status": "nested"}, "s": "\"status\":", "status": "completed"}),
        ));
        assert_eq!(a.status(), Some("completed"));
        let b = Answer::Canonical(text(json!({"output": {"status": "nested"}})));
        assert_eq!(b.status(), None);
        let c = Answer::Canonical(text(json!({"status": "a \"quoted\" word"})));
        assert_eq!(c.status(), None, "a value with escapes is not read");
        assert_eq!(
            c.string_member("status").as_deref(),
            Some("a \"quoted\" word"),
            "but it is by string_member"
        );
        assert_eq!(
            Answer::Value(json!({"status": "failed"})).status(),
            Some("failed")
        );
        assert!(Answer::Value(json!({"status": "completed", "x-tether": {}})).not_durable());
        assert!(!Answer::Value(json!({"status": "completed"})).not_durable());
        assert!(
            !a.not_durable(),
            "canonical text is only ever a durable receipt"
        );
    }
}
