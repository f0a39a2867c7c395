//! Trace spans as records of Tether's own (issue 22 §2, docs/TELEMETRY.md).
//!
//! A request, a command and an e-stop are each one span of a trace; a
//! command's stages ride on its span as marks (crate::stages). A span is
//! an [`Active`] while it runs and a [`SpanRecord`] once it ends, handed to
//! the [`Tracer`] the endpoint installed (`KernelConfig::tracer`; the OTLP
//! exporter, `tether_server::telemetry::otlp`), which encodes and sends it
//! on a thread of its own. A task carries the span its children hang under
//! ([`scope`], [`current`]; [`carry`] takes it into a spawned task).
//!
//! Why not `tracing` spans through `tracing-opentelemetry`: measured under
//! `durable_load` (docs/PERFORMANCE.md, "Telemetry on against off"), the
//! layer's bookkeeping of one command span cost about 15 µs of the caller's
//! CPU even when the trace was not sampled, more than the rest of the
//! traced command's extra work together. A record here costs a clock read
//! at each end, a few small allocations and a non-blocking offer; with no
//! tracer it costs one branch. The `tracing` spans stay, for logs.
//!
//! **Owns:** the record, the task's trace context, the choice of a span's
//! parent (the task's span; none when the task's trace is not sampled; a
//! new trace otherwise).
//! **Never belongs here:** randomness and the sampling ratio (the
//! tracer's), the wire format and the queue (the exporter's), which
//! attributes a span carries (its owner: the surfaces, `order.rs`).
//! **Fail-closed rule:** tracing never refuses or delays: [`Tracer::offer`]
//! must not block, and with no tracer or an unsampled trace nothing is
//! recorded.

use crate::stages::Marks;
use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A trace's id (W3C trace context: 16 bytes, never all zero).
pub type TraceId = [u8; 16];
/// A span's id (8 bytes, never all zero).
pub type SpanId = [u8; 8];

/// A recorded span's place: its trace and its own id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanCx {
    /// The trace.
    pub trace_id: TraceId,
    /// The span.
    pub span_id: SpanId,
}

/// What a span stands for, as OTLP names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// Work inside Tether (a command, an e-stop, a stage).
    Internal,
    /// A request Tether serves (a surface's span).
    Server,
}

/// An ended span.
#[derive(Debug, Clone)]
pub struct SpanRecord {
    /// Its trace and id.
    pub cx: SpanCx,
    /// Its parent's id; `None` for a trace's root.
    pub parent: Option<SpanId>,
    /// Whether the parent is a caller's span (a W3C `traceparent`).
    pub parent_remote: bool,
    /// A fixed name (a route, a method, `tether.command`), never caller text.
    pub name: &'static str,
    /// What it stands for.
    pub kind: SpanKind,
    /// Its start, nanoseconds since the Unix epoch.
    pub start_unix_ns: u64,
    /// Its end, nanoseconds since the Unix epoch (never before the start).
    pub end_unix_ns: u64,
    /// Its attributes (never a token or an input value).
    pub attributes: Vec<(&'static str, Cow<'static, str>)>,
    /// A command's stages, each a child span once exported (empty
    /// otherwise).
    pub marks: Marks,
}

/// Where ended spans go: the endpoint's exporter.
pub trait Tracer: Send + Sync + 'static {
    /// A new trace's root context, or `None` when the sampler leaves the
    /// trace out (`[telemetry] sample_ratio`).
    fn start_trace(&self) -> Option<SpanCx>;
    /// A new span id, for a span of a trace already recorded.
    fn span_id(&self) -> SpanId;
    /// Takes an ended span. Never blocks: a full queue drops it (and counts).
    fn offer(&self, span: SpanRecord);
}

/// The installed [`Tracer`] (a cheap clone), in a kernel's settings.
#[derive(Clone)]
pub struct TraceSink(pub Arc<dyn Tracer>);

impl std::fmt::Debug for TraceSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TraceSink")
    }
}

/// What a task's new spans hang under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Current {
    /// A recorded span: new spans are its children.
    Span(SpanCx),
    /// A trace that is not recorded (its caller's sampled flag was off):
    /// no span of it is recorded, and none starts a trace of its own.
    Unsampled,
}

tokio::task_local! {
    static CURRENT: Current;
}

/// The current task's trace context, if it runs in one.
#[must_use]
pub fn current() -> Option<Current> {
    CURRENT.try_with(|c| *c).ok()
}

/// Runs `fut` with `current` as its task's trace context.
pub async fn scope<F: Future>(current: Current, fut: F) -> F::Output {
    CURRENT.scope(current, fut).await
}

/// `fut` with the calling task's trace context, for a task of its own
/// (`tokio::spawn` starts a task with none).
pub fn carry<F: Future>(fut: F) -> impl Future<Output = F::Output> {
    let here = current();
    async move {
        match here {
            Some(c) => scope(c, fut).await,
            None => fut.await,
        }
    }
}

fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// A span that is running; [`Active::finish`] hands it to its tracer.
pub struct Active {
    tracer: Arc<dyn Tracer>,
    record: SpanRecord,
    started: Instant,
}

impl Active {
    /// A span named `name` under the current task's span: its child when
    /// the task's trace is recorded, `None` when it is not, and a new
    /// trace's root (if sampled) when the task is in no trace.
    #[must_use]
    pub fn start(tracer: Option<&TraceSink>, name: &'static str, kind: SpanKind) -> Option<Self> {
        let tracer = tracer?;
        match current() {
            Some(Current::Span(parent)) => Some(Self::child_of(tracer, parent, false, name, kind)),
            Some(Current::Unsampled) => None,
            None => Self::root(tracer, name, kind),
        }
    }

    /// A new trace's root span, `None` when the sampler leaves it out.
    #[must_use]
    pub fn root(tracer: &TraceSink, name: &'static str, kind: SpanKind) -> Option<Self> {
        let cx = tracer.0.start_trace()?;
        Some(Self::new(tracer, cx, None, false, name, kind))
    }

    /// A span whose parent is `parent`; `remote` when that is a caller's
    /// span (named by a `traceparent`).
    #[must_use]
    pub fn child_of(
        tracer: &TraceSink,
        parent: SpanCx,
        remote: bool,
        name: &'static str,
        kind: SpanKind,
    ) -> Self {
        let cx = SpanCx {
            trace_id: parent.trace_id,
            span_id: tracer.0.span_id(),
        };
        Self::new(tracer, cx, Some(parent.span_id), remote, name, kind)
    }

    fn new(
        tracer: &TraceSink,
        cx: SpanCx,
        parent: Option<SpanId>,
        parent_remote: bool,
        name: &'static str,
        kind: SpanKind,
    ) -> Self {
        let start_unix_ns = unix_ns(SystemTime::now());
        Self {
            tracer: Arc::clone(&tracer.0),
            record: SpanRecord {
                cx,
                parent,
                parent_remote,
                name,
                kind,
                start_unix_ns,
                end_unix_ns: start_unix_ns,
                attributes: Vec::new(),
                marks: Marks::default(),
            },
            started: Instant::now(),
        }
    }

    /// Its place, for its children ([`Current::Span`]).
    #[must_use]
    pub fn cx(&self) -> SpanCx {
        self.record.cx
    }

    /// When it started, on the monotonic clock (a command's stages are
    /// timed from it).
    #[must_use]
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Ends the span now and offers it, with `attributes` and `marks`.
    pub fn finish(mut self, attributes: Vec<(&'static str, Cow<'static, str>)>, marks: Marks) {
        let took = u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.record.end_unix_ns = self.record.start_unix_ns.saturating_add(took);
        self.record.attributes = attributes;
        self.record.marks = marks;
        self.tracer.offer(self.record);
    }
}

/// Runs `fut` as the span `name` under the current task's span (see
/// [`Active::start`]), its children under it; without a tracer, just `fut`.
pub async fn in_span<F: Future>(
    tracer: Option<&TraceSink>,
    name: &'static str,
    kind: SpanKind,
    fut: F,
) -> F::Output {
    let Some(active) = Active::start(tracer, name, kind) else {
        return fut.await;
    };
    let out = scope(Current::Span(active.cx()), fut).await;
    active.finish(Vec::new(), Marks::default());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU8, Ordering};
    use std::sync::Mutex;

    /// Ids counted from 1; records kept; samples what `sample` says.
    struct Probe {
        next: AtomicU8,
        sample: bool,
        spans: Mutex<Vec<SpanRecord>>,
    }

    impl Tracer for Probe {
        fn start_trace(&self) -> Option<SpanCx> {
            let n = self.next.fetch_add(1, Ordering::Relaxed) + 1;
            self.sample.then_some(SpanCx {
                trace_id: [n; 16],
                span_id: [n; 8],
            })
        }
        fn span_id(&self) -> SpanId {
            [self.next.fetch_add(1, Ordering::Relaxed) + 1; 8]
        }
        fn offer(&self, span: SpanRecord) {
            self.spans.lock().expect("spans").push(span);
        }
    }

    fn probe(sample: bool) -> (Arc<Probe>, TraceSink) {
        let p = Arc::new(Probe {
            next: AtomicU8::new(0),
            sample,
            spans: Mutex::new(Vec::new()),
        });
        let sink = TraceSink(p.clone());
        (p, sink)
    }

    #[tokio::test]
    async fn a_span_outside_any_trace_is_a_root_and_its_children_hang_under_it() {
        let (p, sink) = probe(true);
        in_span(Some(&sink), "outer", SpanKind::Server, async {
            in_span(Some(&sink), "inner", SpanKind::Internal, async {}).await;
            // A spawned task keeps the context it was carried with.
            let own = sink.clone();
            let spawned = async move {
                in_span(Some(&own), "spawned", SpanKind::Internal, async {}).await;
            };
            tokio::spawn(carry(spawned)).await.expect("task");
        })
        .await;
        let spans = p.spans.lock().expect("spans");
        let names: Vec<_> = spans.iter().map(|s| s.name).collect();
        assert_eq!(names, ["inner", "spawned", "outer"]);
        let outer = &spans[2];
        assert_eq!(outer.parent, None);
        assert_eq!(outer.kind, SpanKind::Server);
        for child in &spans[..2] {
            assert_eq!(child.parent, Some(outer.cx.span_id), "{child:?}");
            assert_eq!(child.cx.trace_id, outer.cx.trace_id);
            assert_ne!(child.cx.span_id, outer.cx.span_id);
            assert!(!child.parent_remote);
            assert!(outer.start_unix_ns <= child.start_unix_ns);
            assert!(child.end_unix_ns <= outer.end_unix_ns);
        }
    }

    #[tokio::test]
    async fn an_unsampled_trace_records_nothing_and_starts_no_trace_of_its_own() {
        let (p, sink) = probe(true);
        scope(Current::Unsampled, async {
            assert!(Active::start(Some(&sink), "x", SpanKind::Internal).is_none());
            in_span(Some(&sink), "y", SpanKind::Internal, async {}).await;
        })
        .await;
        assert!(p.spans.lock().expect("spans").is_empty());
        let (p, sink) = probe(false);
        in_span(Some(&sink), "z", SpanKind::Internal, async {}).await;
        assert!(p.spans.lock().expect("spans").is_empty());
        // No tracer: the future still runs.
        assert_eq!(in_span(None, "w", SpanKind::Internal, async { 5 }).await, 5);
    }

    #[test]
    fn a_remote_parent_is_marked_remote() {
        let (p, sink) = probe(true);
        let caller = SpanCx {
            trace_id: [9; 16],
            span_id: [8; 8],
        };
        Active::child_of(&sink, caller, true, "POST /rpc", SpanKind::Server)
            .finish(vec![("surface", "jsonrpc".into())], Marks::default());
        let spans = p.spans.lock().expect("spans");
        assert_eq!(spans[0].cx.trace_id, [9; 16]);
        assert_eq!(spans[0].parent, Some([8; 8]));
        assert!(spans[0].parent_remote);
        assert_eq!(spans[0].attributes[0].1, "jsonrpc");
    }
}
