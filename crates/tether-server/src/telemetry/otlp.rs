//! The OTLP/HTTP span exporter behind `[telemetry] otlp_endpoint`
//! (docs/TELEMETRY.md): a tracer provider whose spans go into a bounded
//! queue of its own and leave on one export thread.
//!
//! A span is offered with `try_send`, and a full queue drops it (counted in
//! [`SPANS_DROPPED`], shown by `GET /metrics`), so a collector that is slow
//! or down never slows or blocks a command. The export thread sends batches
//! with a small blocking HTTP/1.1 client (plain HTTP, every step under the
//! export timeout); a batch the collector does not take is dropped and
//! counted, never retried.
//!
//! **Owns:** the provider, the queue, the export thread, the client.
//! **Never belongs here:** which spans exist (the surfaces and the kernel),
//! the subscriber and its filters (`tether-cli`).
//! **Fail-closed rule:** nothing here waits on a command's path: the only
//! call a span's end makes is a non-blocking offer.

use crate::metrics::{SPANS_DROPPED, SPANS_EXPORTED};
use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status};
use opentelemetry::KeyValue;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{
    IdGenerator, RandomIdGenerator, SdkTracerProvider, SpanData, SpanEvents, SpanExporter,
    SpanLinks, SpanProcessor,
};
use opentelemetry_sdk::Resource;
use std::borrow::Cow;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tether_kernel::stages;

/// Most spans in one export request.
const BATCH_MAX: usize = 512;
/// How long the export thread gathers a batch before it sends what it has.
const BATCH_WAIT: Duration = Duration::from_millis(500);
/// The largest collector answer read (its body is not needed).
const ANSWER_BYTES_MAX: usize = 64 * 1024;

/// What the exporter needs.
#[derive(Debug, Clone)]
pub struct Otlp {
    /// The collector (`http://host:4318`, or the full `.../v1/traces` URL).
    pub endpoint: String,
    /// `service.name` of the spans.
    pub service_name: String,
    /// Spans waiting for export at most (at least 1).
    pub queue_max: usize,
    /// Bound on connecting to, sending to and hearing from the collector.
    pub timeout: Duration,
    /// The share of traces Tether starts that are recorded (0 to 1); a
    /// request whose caller sent a `traceparent` follows the caller's
    /// sampled flag instead.
    pub sample_ratio: f64,
}

/// Whether `endpoint` can be exported to; why not.
///
/// # Errors
/// Not a URL, not `http://`, no host.
pub fn check_endpoint(endpoint: &str) -> Result<(), String> {
    Target::parse(endpoint).map(|_| ())
}

/// The tracer provider exporting to `otlp`, its export thread started.
///
/// # Errors
/// The endpoint does not parse, the exporter cannot be built, or the
/// thread cannot be started.
pub fn provider(otlp: &Otlp) -> Result<SdkTracerProvider, String> {
    let target = Target::parse(&otlp.endpoint)?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(BlockingHttp {
            target: target.clone(),
            timeout: otlp.timeout,
        })
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(target.url())
        .with_timeout(otlp.timeout)
        .build()
        .map_err(|e| format!("building the OTLP span exporter: {e}"))?;
    let processor = BoundedExport::start(exporter, otlp.queue_max)?;
    let ratio = if otlp.sample_ratio.is_finite() {
        otlp.sample_ratio.clamp(0.0, 1.0)
    } else {
        1.0
    };
    let sampler = opentelemetry_sdk::trace::Sampler::ParentBased(Box::new(
        opentelemetry_sdk::trace::Sampler::TraceIdRatioBased(ratio),
    ));
    Ok(SdkTracerProvider::builder()
        .with_sampler(sampler)
        .with_span_processor(processor)
        .with_resource(
            Resource::builder()
                .with_service_name(otlp.service_name.clone())
                .build(),
        )
        .build())
}

/// The `tracing` layer that turns Tether's spans into OpenTelemetry spans
/// for `provider`'s exporter, as `tether serve` installs it (and the
/// `telemetry_load` bench measures it). What the layer adds by default and
/// Tether does not need is off, since each costs time on every span or on
/// every poll of an instrumented future: source locations, thread ids and
/// names, the `target`, busy and idle times (two clock reads each time a span
/// is entered), and activating an OpenTelemetry context on each entry (no
/// other OpenTelemetry instrumentation runs in the process to read it).
pub fn layer<S>(
    provider: &SdkTracerProvider,
) -> tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    use opentelemetry::trace::TracerProvider as _;
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("tether"))
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_tracked_inactivity(false)
        .with_context_activation(false)
}

/// Where spans go: the collector's address and the request path.
#[derive(Debug, Clone)]
struct Target {
    host: String,
    port: u16,
    path: String,
}

impl Target {
    fn parse(endpoint: &str) -> Result<Self, String> {
        let u = url::Url::parse(endpoint).map_err(|e| format!("not a URL: {e}"))?;
        if u.scheme() != "http" {
            return Err("only `http://` is offered (a collector on this host or a sidecar); TLS to a collector is not supported yet".into());
        }
        let host = u.host_str().ok_or("the URL names no host")?.to_owned();
        let port = u.port_or_known_default().unwrap_or(4318);
        let path = match u.path() {
            "" | "/" => "/v1/traces".to_owned(),
            p => p.to_owned(),
        };
        Ok(Self { host, port, path })
    }

    fn url(&self) -> String {
        format!("http://{}:{}{}", self.host, self.port, self.path)
    }
}

/// A span processor with a bounded queue of its own and one export thread.
#[derive(Debug)]
struct BoundedExport {
    queue: SyncSender<Msg>,
    exporter: Arc<Mutex<opentelemetry_otlp::SpanExporter>>,
}

enum Msg {
    Span(Box<SpanData>),
    /// Flush what is queued, then answer.
    Flush(SyncSender<()>),
    Stop,
}

impl BoundedExport {
    fn start(exporter: opentelemetry_otlp::SpanExporter, queue: usize) -> Result<Self, String> {
        let (tx, rx) = sync_channel(queue.max(1));
        let exporter = Arc::new(Mutex::new(exporter));
        let worker = Arc::clone(&exporter);
        std::thread::Builder::new()
            .name("tether-otlp".into())
            .spawn(move || export_loop(&rx, &worker))
            .map_err(|e| format!("starting the span export thread: {e}"))?;
        Ok(Self {
            queue: tx,
            exporter,
        })
    }

    /// Asks the export thread and waits, at most `wait`.
    fn ask(&self, msg: impl FnOnce(SyncSender<()>) -> Msg, wait: Duration) -> OTelSdkResult {
        let (tx, rx) = sync_channel(1);
        self.queue
            .send_timeout_compat(msg(tx), wait)
            .map_err(|()| OTelSdkError::Timeout(wait))?;
        rx.recv_timeout(wait)
            .map_err(|_| OTelSdkError::Timeout(wait))
    }
}

/// `SyncSender::send` bounded in time (std has no `send_timeout` on stable).
trait SendTimeout<T> {
    fn send_timeout_compat(&self, v: T, wait: Duration) -> Result<(), ()>;
}

impl<T> SendTimeout<T> for SyncSender<T> {
    fn send_timeout_compat(&self, v: T, wait: Duration) -> Result<(), ()> {
        let until = Instant::now() + wait;
        let mut v = v;
        loop {
            match self.try_send(v) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Disconnected(_)) => return Err(()),
                Err(TrySendError::Full(back)) if Instant::now() < until => {
                    v = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(TrySendError::Full(_)) => return Err(()),
            }
        }
    }
}

impl SpanProcessor for BoundedExport {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        // Never waits: a full queue (a slow or absent collector) drops.
        if self.queue.try_send(Msg::Span(Box::new(span))).is_err() {
            SPANS_DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.ask(Msg::Flush, Duration::from_secs(5))
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.ask(Msg::Flush, timeout)?;
        // The thread ends at `Stop`; a full queue just leaves it to end with
        // the process.
        let _ = self.queue.try_send(Msg::Stop);
        Ok(())
    }

    fn set_resource(&mut self, resource: &Resource) {
        if let Ok(mut e) = self.exporter.lock() {
            e.set_resource(resource);
        }
    }
}

/// Gathers batches (up to [`BATCH_MAX`] spans or [`BATCH_WAIT`]) and sends
/// each once; ends when told or when the processor is gone.
fn export_loop(rx: &Receiver<Msg>, exporter: &Mutex<opentelemetry_otlp::SpanExporter>) {
    // A batch may pass BATCH_MAX by one command's stages (at most MARKS_MAX).
    let mut batch: Vec<SpanData> = Vec::with_capacity(BATCH_MAX + stages::MARKS_MAX);
    let ids = RandomIdGenerator::default();
    loop {
        let deadline = Instant::now() + BATCH_WAIT;
        let mut flush = None;
        let mut stop = false;
        while batch.len() < BATCH_MAX {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(Msg::Span(s)) => expand(*s, &ids, &mut batch),
                Ok(Msg::Flush(done)) => {
                    flush = Some(done);
                    break;
                }
                Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => {
                    stop = true;
                    break;
                }
                Err(RecvTimeoutError::Timeout) => break,
            }
        }
        if !batch.is_empty() {
            send(exporter, std::mem::take(&mut batch));
        }
        if let Some(done) = flush {
            let _ = done.try_send(());
        }
        if stop {
            return;
        }
    }
}

/// Adds `span` to `batch`, and when it is a command's span carrying its
/// stage table ([`stages::FIELD`]), the table's marks as its child spans
/// (built here, on the export thread, so a traced command pays two clock
/// reads a stage instead of a span a stage). The table itself is not
/// exported; one that does not decode gives no child.
fn expand(mut span: SpanData, ids: &RandomIdGenerator, batch: &mut Vec<SpanData>) {
    let Some(at) = span
        .attributes
        .iter()
        .position(|kv| kv.key.as_str() == stages::FIELD)
    else {
        batch.push(span);
        return;
    };
    let table = span.attributes.swap_remove(at);
    let marks = stages::decode(&table.value.as_str()).unwrap_or_default();
    let mut made: Vec<SpanId> = Vec::with_capacity(marks.len());
    for m in &marks {
        let id = ids.new_span_id();
        let parent = m
            .parent
            .and_then(|p| made.get(p).copied())
            .unwrap_or(span.span_context.span_id());
        made.push(id);
        batch.push(stage_span(&span, m, id, parent));
    }
    batch.push(span);
}

/// The child span of `command` for its stage `m`.
fn stage_span(command: &SpanData, m: &stages::Mark, id: SpanId, parent: SpanId) -> SpanData {
    let cx = &command.span_context;
    let at = |ns: u64| command.start_time + Duration::from_nanos(ns);
    let attributes = if m.name == "tether.commit" {
        Vec::new()
    } else {
        vec![KeyValue::new("step", m.name)]
    };
    SpanData {
        span_context: SpanContext::new(
            cx.trace_id(),
            id,
            cx.trace_flags(),
            false,
            cx.trace_state().clone(),
        ),
        parent_span_id: parent,
        parent_span_is_remote: false,
        span_kind: SpanKind::Internal,
        name: Cow::Borrowed(m.name),
        start_time: at(m.start_ns),
        end_time: at(m.end_ns),
        attributes,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status: Status::Unset,
        instrumentation_scope: command.instrumentation_scope.clone(),
    }
}

fn send(exporter: &Mutex<opentelemetry_otlp::SpanExporter>, batch: Vec<SpanData>) {
    let n = u64::try_from(batch.len()).unwrap_or(u64::MAX);
    let Ok(e) = exporter.lock() else {
        SPANS_DROPPED.fetch_add(n, Ordering::Relaxed);
        return;
    };
    // The client below never awaits anything but its own blocking work.
    match futures_executor::block_on(e.export(batch)) {
        Ok(()) => SPANS_EXPORTED.fetch_add(n, Ordering::Relaxed),
        Err(err) => {
            tracing::debug!(error = %err, "a span batch was not taken by the collector");
            SPANS_DROPPED.fetch_add(n, Ordering::Relaxed)
        }
    };
}

/// A blocking HTTP/1.1 client for the export thread: one connection per
/// batch, every step bounded by `timeout`.
#[derive(Debug, Clone)]
struct BlockingHttp {
    target: Target,
    timeout: Duration,
}

#[async_trait::async_trait]
impl HttpClient for BlockingHttp {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let status = self.post(request.body(), request.headers())?;
        let mut answer = Response::new(Bytes::new());
        *answer.status_mut() = http::StatusCode::from_u16(status)?;
        Ok(answer)
    }
}

impl BlockingHttp {
    /// POSTs `body` to the target; answers the HTTP status.
    fn post(&self, body: &[u8], headers: &http::HeaderMap) -> Result<u16, HttpError> {
        let addr: SocketAddr = (self.target.host.as_str(), self.target.port)
            .to_socket_addrs()?
            .next()
            .ok_or("the collector's host does not resolve")?;
        let mut tcp = TcpStream::connect_timeout(&addr, self.timeout)?;
        tcp.set_read_timeout(Some(self.timeout))?;
        tcp.set_write_timeout(Some(self.timeout))?;
        let mut head = format!(
            "POST {} HTTP/1.1\r\nHost: {}:{}\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.target.path,
            self.target.host,
            self.target.port,
            body.len()
        );
        for (name, value) in headers {
            if let Ok(v) = value.to_str() {
                if name != http::header::CONTENT_LENGTH && name != http::header::HOST {
                    head.push_str(&format!("{name}: {v}\r\n"));
                }
            }
        }
        head.push_str("\r\n");
        tcp.write_all(head.as_bytes())?;
        tcp.write_all(body)?;
        let mut answer = Vec::new();
        tcp.take(u64::try_from(ANSWER_BYTES_MAX).unwrap_or(u64::MAX))
            .read_to_end(&mut answer)?;
        let text = String::from_utf8_lossy(&answer);
        let status = text
            .strip_prefix("HTTP/1.")
            .and_then(|rest| rest.get(2..5))
            .and_then(|code| code.parse::<u16>().ok())
            .ok_or("the collector's answer is not HTTP")?;
        Ok(status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command_span(table: &str) -> SpanData {
        let cx = SpanContext::new(
            opentelemetry::trace::TraceId::from(7u128),
            SpanId::from(9u64),
            opentelemetry::trace::TraceFlags::SAMPLED,
            false,
            opentelemetry::trace::TraceState::default(),
        );
        let start = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        SpanData {
            span_context: cx,
            parent_span_id: SpanId::from(3u64),
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: Cow::Borrowed("tether.command"),
            start_time: start,
            end_time: start + Duration::from_micros(50),
            attributes: vec![
                KeyValue::new("device", "thermostat-1"),
                KeyValue::new(stages::FIELD, table.to_owned()),
            ],
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            instrumentation_scope: opentelemetry::InstrumentationScope::builder("tether").build(),
        }
    }

    #[test]
    fn a_command_span_s_stage_table_becomes_its_child_spans_on_the_export_thread() {
        // checks (4) holds policy (5); dispatch (6) holds driver (7).
        let table = "0 - 100 200;4 - 300 900;5 1 400 800;6 - 1000 5000;7 3 1100 4000";
        let mut batch = Vec::new();
        expand(
            command_span(table),
            &RandomIdGenerator::default(),
            &mut batch,
        );
        let names: Vec<&str> = batch.iter().map(|s| s.name.as_ref()).collect();
        assert_eq!(
            names,
            [
                "arrive",
                "checks",
                "policy",
                "dispatch",
                "driver",
                "tether.command"
            ]
        );
        let command = &batch[5];
        assert!(
            command
                .attributes
                .iter()
                .all(|kv| kv.key.as_str() != stages::FIELD),
            "the table itself is not exported"
        );
        assert_eq!(command.attributes.len(), 1);
        let id = |i: usize| batch[i].span_context.span_id();
        let cmd = command.span_context.span_id();
        let parents: Vec<SpanId> = batch[..5].iter().map(|s| s.parent_span_id).collect();
        assert_eq!(parents, [cmd, cmd, id(1), cmd, id(3)]);
        for s in &batch[..5] {
            assert_eq!(s.span_context.trace_id(), command.span_context.trace_id());
            assert!(s.span_context.is_sampled());
            assert_ne!(s.span_context.span_id(), cmd);
            assert_eq!(
                s.attributes,
                vec![KeyValue::new("step", s.name.clone().into_owned())]
            );
        }
        assert_eq!(
            batch[2].start_time,
            command.start_time + Duration::from_nanos(400)
        );
        assert_eq!(
            batch[4].end_time,
            command.start_time + Duration::from_nanos(4000)
        );
    }

    #[test]
    fn a_table_that_does_not_decode_gives_the_command_span_alone() {
        for bad in ["99 - 1 2", "0 0 1 2", "garbage"] {
            let mut batch = Vec::new();
            expand(command_span(bad), &RandomIdGenerator::default(), &mut batch);
            assert_eq!(batch.len(), 1, "{bad:?}");
            assert_eq!(batch[0].attributes.len(), 1, "{bad:?}");
        }
        let mut batch = Vec::new();
        let mut plain = command_span("");
        plain.attributes.truncate(1);
        expand(plain.clone(), &RandomIdGenerator::default(), &mut batch);
        assert_eq!(batch, vec![plain]);
    }

    #[test]
    fn an_endpoint_without_a_path_sends_to_v1_traces() {
        let t = Target::parse("http://127.0.0.1:4318").expect("parses");
        assert_eq!(t.url(), "http://127.0.0.1:4318/v1/traces");
        let t = Target::parse("http://collector/otlp/v1/traces").expect("parses");
        assert_eq!(t.url(), "http://collector:80/otlp/v1/traces");
        assert!(Target::parse("https://collector:4318").is_err());
        assert!(Target::parse("not a url").is_err());
    }
}
