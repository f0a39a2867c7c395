//! The OTLP trace request, written as protobuf bytes straight from
//! Tether's span records (`opentelemetry/proto/collector/trace/v1`,
//! `ExportTraceServiceRequest`; the field numbers are the official
//! definitions', named at each write below).
//!
//! Why by hand: a batch has one resource, one scope and spans of a fixed
//! shape (ids, a name, a kind, two times, a few string attributes, flags),
//! and the export thread shares two cores with the commands. Building the
//! generated message types first costs an allocation for every id, name,
//! key and value of every span; here a span is a few dozen bytes appended
//! to a buffer that is reused batch after batch. The unit tests decode
//! what is written with the official generated types
//! (`opentelemetry-proto`), and the end-to-end test with the reference
//! Python decoder.
//!
//! **Owns:** the byte layout of a request, and the expansion of a
//! command's stage marks into its child spans.
//! **Never belongs here:** the queue and the client (`otlp`), what a span
//! carries (the surfaces and the kernel).

use std::borrow::Cow;
use tether_kernel::stages::Mark;
use tether_kernel::trace::{SpanId, SpanKind, SpanRecord, TraceId};

/// Protobuf wire types used here.
const LEN: u8 = 2;
const I64: u8 = 1;
const I32: u8 = 5;
const VARINT: u8 = 0;

/// OTLP `SpanKind` values.
const KIND_INTERNAL: u64 = 1;
const KIND_SERVER: u64 = 2;

/// `Span.flags`: the W3C sampled flag, "the parent's remoteness is known"
/// and "the parent is remote" (`SpanFlags` of trace.proto).
const FLAG_SAMPLED: u32 = 0x01;
const FLAG_HAS_IS_REMOTE: u32 = 0x100;
const FLAG_IS_REMOTE: u32 = 0x200;

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        // The low seven bits, with the "more follows" bit.
        out.push((v & 0x7f) as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint_len(v: u64) -> usize {
    // One byte per started group of seven bits (at least one).
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn key(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, (u64::from(field) << 3) | u64::from(wire));
}

fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    key(out, field, LEN);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// A `KeyValue` whose value is an `AnyValue.string_value`, as field
/// `field` of the enclosing message.
fn string_attribute(out: &mut Vec<u8>, field: u32, k: &str, v: &str) {
    let any = 1 + varint_len(v.len() as u64) + v.len();
    let kv = 1 + varint_len(k.len() as u64) + k.len() + 1 + varint_len(any as u64) + any;
    key(out, field, LEN);
    varint(out, kv as u64);
    bytes(out, 1, k.as_bytes()); // KeyValue.key
    key(out, 2, LEN); // KeyValue.value
    varint(out, any as u64);
    bytes(out, 1, v.as_bytes()); // AnyValue.string_value
}

/// One span's fields (a `Span` message's body).
struct SpanFields<'a> {
    trace_id: &'a TraceId,
    span_id: &'a SpanId,
    parent: Option<&'a SpanId>,
    parent_remote: bool,
    name: &'a str,
    kind: u64,
    start: u64,
    end: u64,
}

impl SpanFields<'_> {
    fn write<'k>(&self, out: &mut Vec<u8>, attributes: impl Iterator<Item = (&'k str, &'k str)>) {
        bytes(out, 1, self.trace_id); // Span.trace_id
        bytes(out, 2, self.span_id); // Span.span_id
        if let Some(p) = self.parent {
            bytes(out, 4, p); // Span.parent_span_id
        }
        bytes(out, 5, self.name.as_bytes()); // Span.name
        key(out, 6, VARINT); // Span.kind
        varint(out, self.kind);
        key(out, 7, I64); // Span.start_time_unix_nano
        out.extend_from_slice(&self.start.to_le_bytes());
        key(out, 8, I64); // Span.end_time_unix_nano
        out.extend_from_slice(&self.end.to_le_bytes());
        for (k, v) in attributes {
            string_attribute(out, 9, k, v); // Span.attributes
        }
        let mut flags = FLAG_SAMPLED | FLAG_HAS_IS_REMOTE;
        if self.parent_remote {
            flags |= FLAG_IS_REMOTE;
        }
        key(out, 16, I32); // Span.flags
        out.extend_from_slice(&flags.to_le_bytes());
    }
}

/// Spans gathered for one request: each already written as a
/// `ScopeSpans.spans` entry, so the request is three headers around them.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    spans: Vec<u8>,
    count: usize,
    scratch: Vec<u8>,
    ids: Vec<SpanId>,
}

impl Batch {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Spans in the batch (children of stage marks counted).
    pub(crate) fn spans(&self) -> usize {
        self.count
    }

    pub(crate) fn clear(&mut self) {
        self.spans.clear();
        self.count = 0;
    }

    /// Adds `span`, and each of its stage marks as a child span: under the
    /// stage it ran inside, or under `span` itself. `new_id` gives the
    /// children their ids.
    pub(crate) fn push(&mut self, span: &SpanRecord, mut new_id: impl FnMut() -> SpanId) {
        let kind = match span.kind {
            SpanKind::Internal => KIND_INTERNAL,
            SpanKind::Server => KIND_SERVER,
        };
        let own = SpanFields {
            trace_id: &span.cx.trace_id,
            span_id: &span.cx.span_id,
            parent: span.parent.as_ref(),
            parent_remote: span.parent_remote,
            name: span.name,
            kind,
            start: span.start_unix_ns,
            end: span.end_unix_ns,
        };
        let attributes = span.attributes.iter().map(|(k, v)| (*k, Cow::as_ref(v)));
        self.add(&own, attributes);
        self.ids.clear();
        for m in span.marks.iter() {
            let id = new_id();
            self.ids.push(id);
            self.push_mark(span, &m, id);
        }
    }

    /// The child span of `command` for its stage `m`, whose id is `id`.
    fn push_mark(&mut self, command: &SpanRecord, m: &Mark, id: SpanId) {
        let parent = m
            .parent
            .and_then(|p| self.ids.get(p).copied())
            .unwrap_or(command.cx.span_id);
        let child = SpanFields {
            trace_id: &command.cx.trace_id,
            span_id: &id,
            parent: Some(&parent),
            parent_remote: false,
            name: m.name,
            kind: KIND_INTERNAL,
            start: command.start_unix_ns.saturating_add(m.start_ns),
            end: command.start_unix_ns.saturating_add(m.end_ns),
        };
        // The name says which stage it is; it carries no attribute.
        self.add(&child, std::iter::empty());
    }

    fn add<'k>(
        &mut self,
        span: &SpanFields<'_>,
        attributes: impl Iterator<Item = (&'k str, &'k str)>,
    ) {
        self.scratch.clear();
        span.write(&mut self.scratch, attributes);
        bytes(&mut self.spans, 2, &self.scratch); // ScopeSpans.spans
        self.count += 1;
    }

    /// The whole `ExportTraceServiceRequest` into `out` (cleared first):
    /// one resource named `service`, one scope (`tether` and its version),
    /// the batch's spans.
    pub(crate) fn finish(&self, service: &str, out: &mut Vec<u8>) {
        out.clear();
        let mut scope = Vec::with_capacity(32);
        bytes(&mut scope, 1, b"tether"); // InstrumentationScope.name
        bytes(&mut scope, 2, env!("CARGO_PKG_VERSION").as_bytes()); // .version
        let scope_spans = 1 + varint_len(scope.len() as u64) + scope.len() + self.spans.len();
        let mut resource = Vec::with_capacity(64);
        string_attribute(&mut resource, 1, "service.name", service); // Resource.attributes
        let resource_spans = 1
            + varint_len(resource.len() as u64)
            + resource.len()
            + 1
            + varint_len(scope_spans as u64)
            + scope_spans;
        key(out, 1, LEN); // ExportTraceServiceRequest.resource_spans
        varint(out, resource_spans as u64);
        bytes(out, 1, &resource); // ResourceSpans.resource
        key(out, 2, LEN); // ResourceSpans.scope_spans
        varint(out, scope_spans as u64);
        bytes(out, 1, &scope); // ScopeSpans.scope
        out.extend_from_slice(&self.spans); // ScopeSpans.spans, each written
    }
}

/// What a collector's `ExportTraceServiceResponse` says it refused: its
/// `partial_success` (field 1) holds `rejected_spans` (1) and
/// `error_message` (2). An empty answer, or one without the member, refused
/// nothing: `(0, "")`. `None` when the bytes are not such a message (the
/// caller then counts the batch as taken, as the answer's status said).
pub(crate) fn partial_success(answer: &[u8]) -> Option<(u64, String)> {
    let mut rejected = 0;
    let mut message = String::new();
    for field in Fields(answer) {
        if let (1, Value::Bytes(inner)) = field? {
            for f in Fields(inner) {
                match f? {
                    (1, Value::Varint(n)) => rejected = n,
                    (2, Value::Bytes(text)) => {
                        message = String::from_utf8_lossy(text).into_owned();
                    }
                    _ => {}
                }
            }
        }
    }
    Some((rejected, message))
}

/// One field's value as read from the wire.
enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

/// The fields of a protobuf message, in order; an item is `None` where the
/// bytes stop making sense (and the iteration ends there).
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn read_varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        // At most ten bytes hold a 64-bit varint.
        for i in 0..10 {
            let (&b, rest) = self.0.split_first()?;
            self.0 = rest;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn skip(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.0.len() {
            return None;
        }
        let (taken, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(taken)
    }

    fn field(&mut self) -> Option<(u64, Value<'a>)> {
        let key = self.read_varint()?;
        let value = match (key & 7) as u8 {
            VARINT => Value::Varint(self.read_varint()?),
            LEN => {
                let n = usize::try_from(self.read_varint()?).ok()?;
                Value::Bytes(self.skip(n)?)
            }
            I64 => self.skip(8).map(|_| Value::Fixed)?,
            I32 => self.skip(4).map(|_| Value::Fixed)?,
            _ => return None,
        };
        Some((key >> 3, value))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Option<(u64, Value<'a>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let f = self.field();
        if f.is_none() {
            // Nothing after a broken field can be read.
            self.0 = &[];
        }
        Some(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use opentelemetry_proto::tonic::common::v1::KeyValue;
    use opentelemetry_proto::tonic::trace::v1::Span;
    use prost::Message as _;
    use tether_kernel::trace::SpanCx;

    fn command(marks: Vec<Mark>) -> SpanRecord {
        SpanRecord {
            cx: SpanCx {
                trace_id: [7; 16],
                span_id: [9; 8],
            },
            parent: Some([3; 8]),
            parent_remote: false,
            name: "tether.command",
            kind: SpanKind::Internal,
            start_unix_ns: 1_000_000_000_000,
            end_unix_ns: 1_000_000_050_000,
            attributes: vec![
                ("device", Cow::Borrowed("thermostat-1")),
                ("outcome", Cow::Owned("completed".into())),
            ],
            marks: marks.into(),
        }
    }

    fn mark(name: &'static str, parent: Option<usize>, start_ns: u64, end_ns: u64) -> Mark {
        Mark {
            name,
            parent,
            start_ns,
            end_ns,
        }
    }

    fn decoded(batch: &Batch, service: &str) -> (ExportTraceServiceRequest, Vec<Span>) {
        let mut body = Vec::new();
        batch.finish(service, &mut body);
        let req = ExportTraceServiceRequest::decode(body.as_slice()).expect("decodes");
        let spans = req.resource_spans[0].scope_spans[0].spans.clone();
        (req, spans)
    }

    fn attributes(kvs: &[KeyValue]) -> Vec<(String, String)> {
        kvs.iter()
            .map(|kv| {
                let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                    Some(Value::StringValue(s)) => s.clone(),
                    other => panic!("not a string: {other:?}"),
                };
                (kv.key.clone(), v)
            })
            .collect()
    }

    #[test]
    fn a_batch_decodes_with_the_official_definitions() {
        let mut batch = Batch::new();
        let mut next = 0u8;
        let ids = || {
            next += 1;
            [next; 8]
        };
        // checks (1) holds policy (2); dispatch (3) holds driver (4), which
        // holds a commit (5).
        let marks = vec![
            mark("arrive", None, 100, 200),
            mark("checks", None, 300, 900),
            mark("policy", Some(1), 400, 800),
            mark("dispatch", None, 1000, 5000),
            mark("driver", Some(3), 1100, 4000),
            mark("tether.commit", Some(4), 1200, 1300),
        ];
        batch.push(&command(marks), ids);
        assert_eq!(batch.spans(), 7);
        let (req, spans) = decoded(&batch, "tether-test");
        let resource = req.resource_spans[0].resource.as_ref().expect("resource");
        assert_eq!(
            attributes(&resource.attributes),
            [("service.name".to_owned(), "tether-test".to_owned())]
        );
        let scope = req.resource_spans[0].scope_spans[0]
            .scope
            .as_ref()
            .expect("scope");
        assert_eq!(scope.name, "tether");
        assert_eq!(scope.version, env!("CARGO_PKG_VERSION"));

        let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "tether.command",
                "arrive",
                "checks",
                "policy",
                "dispatch",
                "driver",
                "tether.commit"
            ]
        );
        let cmd = &spans[0];
        assert_eq!(cmd.trace_id, vec![7; 16]);
        assert_eq!(cmd.span_id, vec![9; 8]);
        assert_eq!(cmd.parent_span_id, vec![3; 8]);
        assert_eq!(cmd.kind, 1);
        assert_eq!(cmd.start_time_unix_nano, 1_000_000_000_000);
        assert_eq!(cmd.end_time_unix_nano, 1_000_000_050_000);
        assert_eq!(cmd.flags, 0x101);
        assert_eq!(
            attributes(&cmd.attributes),
            [
                ("device".to_owned(), "thermostat-1".to_owned()),
                ("outcome".to_owned(), "completed".to_owned())
            ]
        );
        // The stages: ids 1..=6 in order, each under its stage or the command.
        let parents: Vec<Vec<u8>> = spans[1..7]
            .iter()
            .map(|s| s.parent_span_id.clone())
            .collect();
        assert_eq!(
            parents,
            [
                vec![9; 8],
                vec![9; 8],
                vec![2; 8],
                vec![9; 8],
                vec![4; 8],
                vec![5; 8]
            ]
        );
        for (i, s) in spans[1..7].iter().enumerate() {
            assert_eq!(s.span_id, vec![u8::try_from(i + 1).expect("small"); 8]);
            assert_eq!(s.trace_id, vec![7; 16]);
            assert_eq!(s.kind, 1);
            assert!(s.attributes.is_empty(), "{s:?}");
        }
        assert_eq!(spans[3].start_time_unix_nano, 1_000_000_000_400);
        assert_eq!(spans[5].end_time_unix_nano, 1_000_000_004_000);
    }

    #[test]
    fn a_request_span_names_its_remote_parent_and_a_root_names_none() {
        let request = SpanRecord {
            cx: SpanCx {
                trace_id: [7; 16],
                span_id: [3; 8],
            },
            parent: Some([0xab; 8]),
            parent_remote: true,
            name: "POST /rpc",
            kind: SpanKind::Server,
            attributes: vec![("surface", Cow::Borrowed("jsonrpc"))],
            marks: tether_kernel::stages::Marks::default(),
            ..command(Vec::new())
        };
        let mut batch = Batch::new();
        batch.push(&request, || unreachable!("no marks"));
        let root = SpanRecord {
            parent: None,
            ..command(Vec::new())
        };
        batch.push(&root, || unreachable!("no marks"));
        let (_, spans) = decoded(&batch, "s");
        let req_span = &spans[0];
        assert_eq!(req_span.name, "POST /rpc");
        assert_eq!(req_span.kind, 2);
        assert_eq!(req_span.parent_span_id, vec![0xab; 8]);
        assert_eq!(req_span.flags, 0x301, "sampled, with a remote parent");
        assert_eq!(
            attributes(&req_span.attributes),
            [("surface".to_owned(), "jsonrpc".to_owned())]
        );
        assert!(spans[1].parent_span_id.is_empty(), "a root has no parent");
    }

    #[test]
    fn long_and_empty_texts_and_a_reused_batch_still_decode() {
        let mut batch = Batch::new();
        let long = "x".repeat(70_000);
        let mut span = command(Vec::new());
        span.attributes = vec![("a", Cow::Owned(long.clone())), ("b", Cow::Borrowed(""))];
        for round in 0..2 {
            batch.clear();
            for _ in 0..300 {
                batch.push(&span, || [1; 8]);
            }
            let (_, spans) = decoded(&batch, &long);
            assert_eq!(spans.len(), 300, "round {round}");
            assert_eq!(attributes(&spans[299].attributes)[0].1.len(), 70_000);
            assert_eq!(attributes(&spans[299].attributes)[1].1, "");
        }
        let mut empty = Vec::new();
        Batch::new().finish("s", &mut empty);
        let req = ExportTraceServiceRequest::decode(empty.as_slice()).expect("decodes");
        assert!(req.resource_spans[0].scope_spans[0].spans.is_empty());
    }

    #[test]
    fn varint_lengths_match_what_is_written() {
        for v in [0u64, 1, 127, 128, 16_383, 16_384, 1 << 35, u64::MAX] {
            let mut out = Vec::new();
            varint(&mut out, v);
            assert_eq!(out.len(), varint_len(v), "{v}");
        }
    }

    #[test]
    fn a_collector_s_partial_success_is_read_and_garbage_is_not() {
        use opentelemetry_proto::tonic::collector::trace::v1::{
            ExportTracePartialSuccess, ExportTraceServiceResponse,
        };
        let answer = ExportTraceServiceResponse {
            partial_success: Some(ExportTracePartialSuccess {
                rejected_spans: 300,
                error_message: "too old".into(),
            }),
        }
        .encode_to_vec();
        assert_eq!(partial_success(&answer), Some((300, "too old".into())));
        let whole = ExportTraceServiceResponse::default().encode_to_vec();
        assert_eq!(partial_success(&whole), Some((0, String::new())));
        assert_eq!(partial_success(&[]), Some((0, String::new())));
        // A length past the end, an unknown wire type, a varint that never ends.
        for bad in [
            &[0x0a, 0x05, 0x08][..],
            &[0x0f],
            &[
                0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            ],
        ] {
            assert_eq!(partial_success(bad), None, "{bad:?}");
        }
    }
}
