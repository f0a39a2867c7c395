//! The OTLP span exporter behind `[telemetry] otlp_endpoint`
//! (docs/TELEMETRY.md): the kernel's [`Tracer`], whose spans go into a
//! bounded queue of its own and leave on one export thread, over HTTP with
//! protobuf bodies or over gRPC ([`Protocol`]).
//!
//! A span is offered with `try_send`, and a full queue drops it (counted in
//! [`SPANS_DROPPED`], shown by `GET /metrics`), so a collector that is slow
//! or down never slows or blocks a command. The export thread turns a
//! command's stage marks into its child spans, writes each batch as an
//! OTLP `ExportTraceServiceRequest` (protobuf, [`super::proto`]) and sends
//! it with a small blocking HTTP/1.1 client or as a gRPC call
//! ([`super::grpc`]), plain text on the wire, every step under the export
//! timeout; a batch (or the part of one) the collector does not take is
//! dropped and counted, never retried. The export thread runs below the
//! command path's priority ([`EXPORT_NICE`]): on a busy machine its spans
//! wait in the queue, not the commands.
//!
//! **Owns:** the ids and the sampler, the queue, the export thread and its
//! priority, the client.
//! **Never belongs here:** which spans exist and what they carry (the
//! surfaces and the kernel), the subscriber and its filters (`tether-cli`).
//! **Fail-closed rule:** nothing here waits on a command's path: the only
//! call a span's end makes is a non-blocking offer.

use super::grpc::GrpcClient;
use super::proto::Batch;
use crate::metrics::{SPANS_DROPPED, SPANS_EXPORTED};
use rand::Rng as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant};
use tether_kernel::trace::{SpanCx, SpanId, SpanRecord, TraceId, Tracer};

/// Most spans in one export request (a command's stages may pass it by
/// one command's marks, at most `stages::MARKS_MAX`): about 200 KB.
const BATCH_MAX: usize = 2048;
/// How long spans gather, once some came, before the export thread takes
/// them: at 40,000 commands a second about 800 commands' spans, well
/// inside the default queue of 8,192.
const GATHER: Duration = Duration::from_millis(20);
/// The export thread's wait for a first span when none is queued; a flush
/// or a stop is answered at once.
const IDLE_WAIT: Duration = Duration::from_millis(500);
/// Gather rounds before the export thread looks at its idle wait again.
const ROUNDS_MAX: usize = 1_000;
/// The largest collector answer read (its body holds at most a partial
/// success).
const ANSWER_BYTES_MAX: usize = 64 * 1024;

/// How spans travel to the collector (`[telemetry] otlp_protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// `http/protobuf`: `POST /v1/traces` with a protobuf body (collectors
    /// listen on 4318).
    #[default]
    HttpProtobuf,
    /// `grpc`: the unary call `TraceService/Export` over HTTP/2 (collectors
    /// listen on 4317).
    Grpc,
}

impl Protocol {
    /// The protocol named as OTLP's own configuration names it.
    ///
    /// # Errors
    /// Any other name.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "http/protobuf" => Ok(Self::HttpProtobuf),
            "grpc" => Ok(Self::Grpc),
            other => Err(format!(
                "`{other}` is not offered: `http/protobuf` (the default) or `grpc`"
            )),
        }
    }
}

/// What the exporter needs.
#[derive(Debug, Clone)]
pub struct Otlp {
    /// The collector: `http://host:4318` or the full `.../v1/traces` URL
    /// over HTTP; `http://host:4317` over gRPC.
    pub endpoint: String,
    /// HTTP with protobuf bodies, or gRPC.
    pub protocol: Protocol,
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

/// Whether `endpoint` can be exported to over `protocol`; why not.
///
/// # Errors
/// Not a URL, not `http://`, no host; a path with gRPC.
pub fn check_endpoint(endpoint: &str, protocol: Protocol) -> Result<(), String> {
    Target::parse(endpoint, protocol).map(|_| ())
}

/// The exporter: ids, the sampler and the queue to the export thread.
#[derive(Debug)]
pub struct Exporter {
    queue: SyncSender<Msg>,
    sampler: Sampler,
}

enum Msg {
    Span(Box<SpanRecord>),
    /// Send what is queued, then answer.
    Flush(SyncSender<()>),
    Stop,
}

/// Keeps a trace Tether starts when its id falls under the ratio, the
/// rule of OpenTelemetry's `TraceIdRatioBased` sampler: the id's last
/// eight bytes, as a number, below `ratio` of their range.
#[derive(Debug, Clone, Copy)]
struct Sampler {
    /// `ratio × 2⁶³`; the id's last eight bytes shifted right by one are
    /// compared with it.
    threshold: u64,
    all: bool,
}

impl Sampler {
    fn new(ratio: f64) -> Self {
        let ratio = if ratio.is_finite() {
            ratio.clamp(0.0, 1.0)
        } else {
            1.0
        };
        // Exact below 2⁶³ for every ratio < 1; 1 keeps every trace.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let threshold = (ratio * (1u64 << 63) as f64) as u64;
        Self {
            threshold,
            all: ratio >= 1.0,
        }
    }

    fn keeps(self, trace_id: &TraceId) -> bool {
        let mut low = [0u8; 8];
        low.copy_from_slice(&trace_id[8..]);
        self.all || (u64::from_be_bytes(low) >> 1) < self.threshold
    }
}

/// Random bytes that are not all zero (the W3C invalid id).
fn nonzero<const N: usize>() -> [u8; N] {
    let mut rng = rand::thread_rng();
    loop {
        let mut id = [0u8; N];
        rng.fill(&mut id[..]);
        if id != [0; N] {
            return id;
        }
    }
}

/// The export thread's span ids for stage marks: SplitMix64 from a random
/// seed. A command's stages need ids unique within its trace, not ids an
/// outsider cannot guess (the trace id, from the OS-seeded generator, is
/// what keeps traces apart); ten ChaCha draws a command were about a
/// twentieth of the export thread's samples in a profile.
struct MarkIds(u64);

impl MarkIds {
    fn new() -> Self {
        Self(rand::thread_rng().gen())
    }

    fn next(&mut self) -> SpanId {
        // Bounded: a zero comes once in 2⁶⁴ draws.
        for _ in 0..4 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            if z != 0 {
                return z.to_be_bytes();
            }
        }
        nonzero::<8>()
    }
}

impl Tracer for Exporter {
    fn start_trace(&self) -> Option<SpanCx> {
        let trace_id = nonzero::<16>();
        self.sampler.keeps(&trace_id).then(|| SpanCx {
            trace_id,
            span_id: nonzero::<8>(),
        })
    }

    fn span_id(&self) -> SpanId {
        nonzero::<8>()
    }

    fn offer(&self, span: SpanRecord) {
        let n = 1 + span.marks.len() as u64;
        // Never waits: a full queue (a slow or absent collector) drops.
        if self.queue.try_send(Msg::Span(Box::new(span))).is_err() {
            SPANS_DROPPED.fetch_add(n, Ordering::Relaxed);
        }
    }
}

impl Exporter {
    /// The exporter to `otlp`, its export thread started.
    ///
    /// # Errors
    /// The endpoint does not parse, or the thread cannot be started.
    pub fn start(otlp: &Otlp) -> Result<Self, String> {
        let target = Target::parse(&otlp.endpoint, otlp.protocol)?;
        let (tx, rx) = sync_channel(otlp.queue_max.max(1));
        let mut client = match otlp.protocol {
            Protocol::HttpProtobuf => Client::Http(BlockingHttp {
                target,
                timeout: otlp.timeout,
            }),
            Protocol::Grpc => Client::Grpc(Box::new(GrpcClient::new(target, otlp.timeout)?)),
        };
        let service = otlp.service_name.clone();
        std::thread::Builder::new()
            .name("tether-otlp".into())
            .spawn(move || {
                yield_to_commands();
                export_loop(&rx, &mut client, &service);
            })
            .map_err(|e| format!("starting the span export thread: {e}"))?;
        Ok(Self {
            queue: tx,
            sampler: Sampler::new(otlp.sample_ratio),
        })
    }

    /// Sends what is queued and waits for it, at most `wait`.
    ///
    /// # Errors
    /// The export thread did not answer in time.
    pub fn flush(&self, wait: Duration) -> Result<(), String> {
        let (tx, rx) = sync_channel(1);
        let until = Instant::now() + wait;
        let mut msg = Msg::Flush(tx);
        // `SyncSender` has no `send_timeout` on stable: offer until due.
        loop {
            match self.queue.try_send(msg) {
                Ok(()) => break,
                Err(TrySendError::Full(back)) if Instant::now() < until => {
                    msg = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => return Err("the span export queue did not take the flush".into()),
            }
        }
        rx.recv_timeout(until.saturating_duration_since(Instant::now()))
            .map_err(|_| "the span export thread did not flush in time".to_owned())
    }

    /// Flushes (at most `wait`) and ends the export thread.
    pub fn shutdown(&self, wait: Duration) {
        if let Err(e) = self.flush(wait) {
            tracing::debug!(error = %e, "the span exporter did not flush at shutdown");
        }
        // A full queue leaves the thread to end with the process.
        let _ = self.queue.try_send(Msg::Stop);
    }
}

/// What the export thread does next.
enum Next {
    Go,
    /// Answer once what is gathered is sent.
    Flush(SyncSender<()>),
    Stop,
}

/// How far below the command path the export thread is scheduled: the
/// Linux nice value it sets for itself (the command path keeps 0).
const EXPORT_NICE: libc::c_int = 10;

/// Lowers the calling thread's scheduling priority to [`EXPORT_NICE`], so
/// that on a busy machine the callers and the store's writer run first:
/// measured under `telemetry_load` on two cores (docs/PERFORMANCE.md),
/// the export thread's bursts otherwise stall the writer's group commits.
/// Spans wait in the bounded queue meanwhile, and are dropped (counted)
/// only when the contention outlasts it. A refusal (a sandbox that forbids
/// it) leaves the priority as it was.
fn yield_to_commands() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `gettid` and `setpriority` take and return plain
        // integers; on Linux, `PRIO_PROCESS` with a thread id changes that
        // thread only.
        let done = unsafe {
            let tid = libc::id_t::try_from(libc::gettid()).unwrap_or(0);
            libc::setpriority(libc::PRIO_PROCESS, tid, EXPORT_NICE)
        };
        if done != 0 {
            tracing::debug!("the span export thread keeps its priority (setpriority refused)");
        }
    }
}

/// Takes one message into `batch`.
fn take(msg: Msg, batch: &mut Batch, ids: &mut MarkIds) -> Next {
    match msg {
        Msg::Span(s) => {
            batch.push(&s, || ids.next());
            Next::Go
        }
        Msg::Flush(done) => Next::Flush(done),
        Msg::Stop => Next::Stop,
    }
}

/// Waits (at most [`IDLE_WAIT`]) for the first span of a burst, lets spans
/// gather for [`GATHER`], then sends what came, [`BATCH_MAX`] spans a
/// request, until the queue is found empty. While
/// it sleeps a span's offer wakes nobody: at tens of thousands of commands
/// a second, waking this thread for each cost the callers more than the
/// encoding. Ends when told or when the exporter is gone.
fn export_loop(rx: &Receiver<Msg>, client: &mut Client, service: &str) {
    let mut batch = Batch::new();
    let mut body = Vec::new();
    let mut ids = MarkIds::new();
    loop {
        let mut next = match rx.recv_timeout(IDLE_WAIT) {
            Ok(msg) => take(msg, &mut batch, &mut ids),
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => Next::Stop,
        };
        // A bounded number of rounds between two looks at the idle wait:
        // the loop also ends when the queue is found empty.
        for round in 0..ROUNDS_MAX {
            // Only the first round sleeps: a later one runs because the
            // last request was full and more is waiting.
            if round == 0 && matches!(next, Next::Go) {
                std::thread::sleep(GATHER);
            }
            let mut empty = false;
            while matches!(next, Next::Go) && batch.spans() < BATCH_MAX {
                next = match rx.try_recv() {
                    Ok(msg) => take(msg, &mut batch, &mut ids),
                    Err(std::sync::mpsc::TryRecvError::Empty) => {
                        empty = true;
                        break;
                    }
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => Next::Stop,
                };
            }
            if batch.spans() > 0 {
                batch.finish(service, &mut body);
                send(client, &body, batch.spans());
                batch.clear();
            }
            match std::mem::replace(&mut next, Next::Go) {
                Next::Go if empty => break,
                Next::Go => {}
                Next::Flush(done) => {
                    let _ = done.try_send(());
                }
                Next::Stop => return,
            }
        }
    }
}

/// The export thread's client, by protocol.
#[derive(Debug)]
enum Client {
    Http(BlockingHttp),
    Grpc(Box<GrpcClient>),
}

impl Client {
    /// Sends one encoded batch; answers what the collector said it
    /// rejected of it (count, message).
    fn export(&mut self, body: &[u8]) -> Result<(u64, String), String> {
        match self {
            Self::Http(http) => match http.post(body)? {
                (status, answer) if (200..300).contains(&status) => Ok(answer
                    .as_deref()
                    .and_then(super::proto::partial_success)
                    .unwrap_or((0, String::new()))),
                (status, _) => Err(format!("HTTP status {status}")),
            },
            Self::Grpc(grpc) => grpc.export(body),
        }
    }
}

/// Sends one encoded batch of `n` spans; counts them exported, or dropped:
/// all of them when the batch failed, those the collector says it rejected
/// when it took only part.
fn send(client: &mut Client, body: &[u8], n: usize) {
    let n = u64::try_from(n).unwrap_or(u64::MAX);
    match client.export(body) {
        Ok((0, _)) => {
            SPANS_EXPORTED.fetch_add(n, Ordering::Relaxed);
        }
        Ok((rejected, message)) => {
            let rejected = rejected.min(n);
            tracing::debug!(rejected, %message, "the collector rejected part of a span batch");
            SPANS_EXPORTED.fetch_add(n - rejected, Ordering::Relaxed);
            SPANS_DROPPED.fetch_add(rejected, Ordering::Relaxed);
        }
        Err(e) => {
            tracing::debug!(error = %e, "a span batch did not reach the collector");
            SPANS_DROPPED.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// Where spans go: the collector's address and, over HTTP, the request
/// path.
#[derive(Debug, Clone)]
pub(super) struct Target {
    pub(super) host: String,
    pub(super) port: u16,
    path: String,
}

impl Target {
    fn parse(endpoint: &str, protocol: Protocol) -> Result<Self, String> {
        let u = url::Url::parse(endpoint).map_err(|e| format!("not a URL: {e}"))?;
        if u.scheme() != "http" {
            return Err("only `http://` is offered (a collector on this host or a sidecar); TLS to a collector is not supported yet".into());
        }
        let host = u.host_str().ok_or("the URL names no host")?.to_owned();
        // As any URL: a port not named is the scheme's (80).
        let port = u.port_or_known_default().unwrap_or(80);
        let path = match (protocol, u.path()) {
            (Protocol::HttpProtobuf, "" | "/") => "/v1/traces".to_owned(),
            (Protocol::HttpProtobuf, p) => p.to_owned(),
            (Protocol::Grpc, "" | "/") => String::new(),
            (Protocol::Grpc, p) => {
                return Err(format!(
                    "a gRPC endpoint is `http://host:port` (the call's path is fixed), not `{p}`"
                ))
            }
        };
        Ok(Self { host, port, path })
    }

    #[cfg(test)]
    pub(super) fn parse_for_tests(endpoint: &str, protocol: Protocol) -> Self {
        Self::parse(endpoint, protocol).expect("a target")
    }

    #[cfg(test)]
    fn url(&self) -> String {
        format!("http://{}:{}{}", self.host, self.port, self.path)
    }
}

/// A blocking HTTP/1.1 client for the export thread: one connection per
/// batch, every step bounded by `timeout`.
#[derive(Debug, Clone)]
struct BlockingHttp {
    target: Target,
    timeout: Duration,
}

impl BlockingHttp {
    /// POSTs `body` (an OTLP protobuf request) to the target; answers the
    /// HTTP status and the answer's protobuf body, when it has one.
    fn post(&self, body: &[u8]) -> Result<(u16, Option<Vec<u8>>), String> {
        let io = |e: std::io::Error| e.to_string();
        let addr: SocketAddr = (self.target.host.as_str(), self.target.port)
            .to_socket_addrs()
            .map_err(io)?
            .next()
            .ok_or("the collector's host does not resolve")?;
        let mut tcp = TcpStream::connect_timeout(&addr, self.timeout).map_err(io)?;
        tcp.set_read_timeout(Some(self.timeout)).map_err(io)?;
        tcp.set_write_timeout(Some(self.timeout)).map_err(io)?;
        let head = format!(
            "POST {} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.target.path,
            self.target.host,
            self.target.port,
            body.len()
        );
        tcp.write_all(head.as_bytes()).map_err(io)?;
        tcp.write_all(body).map_err(io)?;
        let mut answer = Vec::new();
        tcp.take(u64::try_from(ANSWER_BYTES_MAX).unwrap_or(u64::MAX))
            .read_to_end(&mut answer)
            .map_err(io)?;
        let status = answer
            .strip_prefix(b"HTTP/1.")
            .and_then(|rest| rest.get(2..5))
            .and_then(|code| std::str::from_utf8(code).ok()?.parse::<u16>().ok())
            .ok_or_else(|| "the collector's answer is not HTTP".to_owned())?;
        Ok((status, protobuf_body(&answer).map(<[u8]>::to_vec)))
    }
}

/// The body of a whole HTTP/1.1 answer (read to its close) when it is
/// protobuf and not chunked: the collector's `ExportTraceServiceResponse`.
fn protobuf_body(answer: &[u8]) -> Option<&[u8]> {
    let end = answer.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&answer[..end]).to_ascii_lowercase();
    let header = |name: &str| {
        head.lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(n, _)| n.trim() == name)
            .map(|(_, v)| v.trim().to_owned())
    };
    if header("content-type").as_deref() != Some("application/x-protobuf")
        || header("transfer-encoding").is_some()
    {
        return None;
    }
    let body = &answer[end + 4..];
    match header("content-length").map(|n| n.parse::<usize>()) {
        Some(Ok(n)) => body.get(..n),
        Some(Err(_)) => None,
        None => Some(body),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_without_a_path_sends_to_v1_traces() {
        let http = Protocol::HttpProtobuf;
        let t = Target::parse("http://127.0.0.1:4318", http).expect("parses");
        assert_eq!(t.url(), "http://127.0.0.1:4318/v1/traces");
        let t = Target::parse("http://collector/otlp/v1/traces", http).expect("parses");
        assert_eq!(t.url(), "http://collector:80/otlp/v1/traces");
        assert!(Target::parse("https://collector:4318", http).is_err());
        assert!(Target::parse("not a url", http).is_err());
        let t = Target::parse("http://collector:4317/", Protocol::Grpc).expect("parses");
        assert_eq!((t.host.as_str(), t.port), ("collector", 4317));
        assert!(Target::parse("http://collector:4317/v1/traces", Protocol::Grpc).is_err());
        assert!(Target::parse("https://collector:4317", Protocol::Grpc).is_err());
    }

    #[test]
    fn mark_ids_are_never_zero_and_do_not_repeat() {
        let mut ids = MarkIds::new();
        let drawn: std::collections::HashSet<SpanId> = (0..50_000).map(|_| ids.next()).collect();
        assert_eq!(drawn.len(), 50_000);
        assert!(!drawn.contains(&[0; 8]));
        // Two exporters start from different seeds.
        assert_ne!(MarkIds::new().next(), MarkIds::new().next());
    }

    #[test]
    fn the_sampler_keeps_its_share_of_traces() {
        let ids: Vec<TraceId> = (0..20_000).map(|_| nonzero::<16>()).collect();
        let kept = |ratio: f64| {
            let s = Sampler::new(ratio);
            ids.iter().filter(|id| s.keeps(id)).count()
        };
        assert_eq!(kept(1.0), ids.len());
        assert_eq!(kept(f64::NAN), ids.len());
        assert_eq!(kept(0.0), 0);
        let tenth = kept(0.1);
        assert!((1_600..2_400).contains(&tenth), "kept {tenth} of 20,000");
    }

    /// One HTTP request read whole from `conn`: its head and its body (by
    /// `Content-Length`).
    fn read_request(conn: &mut TcpStream) -> (String, Vec<u8>) {
        let mut got = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = conn.read(&mut buf).expect("read");
            assert!(n > 0, "closed early");
            got.extend_from_slice(&buf[..n]);
            let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            let head = String::from_utf8_lossy(&got[..end]).into_owned();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .and_then(|v| v.trim().parse().ok())
                .expect("length");
            if got.len() >= end + 4 + len {
                return (head, got[end + 4..end + 4 + len].to_vec());
            }
        }
    }

    /// A collector that takes one request and answers `status` with
    /// `body` (as protobuf); answers the request's head and body.
    fn one_request(
        status: u16,
        body: Vec<u8>,
    ) -> (u16, std::thread::JoinHandle<(String, Vec<u8>)>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let handle = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().expect("accept");
            let (head, got) = read_request(&mut conn);
            let answer = format!(
                "HTTP/1.1 {status} X\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            conn.write_all(answer.as_bytes()).expect("answer");
            conn.write_all(&body).expect("answer");
            (head, got)
        });
        (port, handle)
    }

    fn http_client(port: u16) -> BlockingHttp {
        BlockingHttp {
            target: Target::parse(&format!("http://127.0.0.1:{port}"), Protocol::HttpProtobuf)
                .expect("target"),
            timeout: Duration::from_secs(5),
        }
    }

    #[test]
    fn a_batch_is_posted_as_protobuf_and_a_refusal_is_a_status() {
        for status in [200, 503] {
            let (port, collector) = one_request(status, Vec::new());
            let client = http_client(port);
            assert_eq!(client.post(b"\x0a\x00"), Ok((status, Some(Vec::new()))));
            let (head, body) = collector.join().expect("collector");
            assert!(head.starts_with("POST /v1/traces HTTP/1.1"), "{head}");
            assert!(
                head.contains("Content-Type: application/x-protobuf"),
                "{head}"
            );
            assert_eq!(body, b"\x0a\x00");
        }
        // Nobody listening: an error, promptly.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = closed.local_addr().expect("addr").port();
        drop(closed);
        assert!(http_client(port).post(b"").is_err());
    }

    #[test]
    fn a_partial_success_over_http_is_what_the_collector_rejected() {
        use opentelemetry_proto::tonic::collector::trace::v1::{
            ExportTracePartialSuccess, ExportTraceServiceResponse,
        };
        use prost::Message as _;
        let answer = ExportTraceServiceResponse {
            partial_success: Some(ExportTracePartialSuccess {
                rejected_spans: 7,
                error_message: "spans too old".into(),
            }),
        }
        .encode_to_vec();
        let (port, collector) = one_request(200, answer);
        let mut client = Client::Http(http_client(port));
        assert_eq!(client.export(b""), Ok((7, "spans too old".into())));
        collector.join().expect("collector");
        // A refusal is an error whatever its body says.
        let (port, collector) = one_request(400, b"\x0a\x02\x08\x01".to_vec());
        let mut client = Client::Http(http_client(port));
        assert!(client.export(b"").is_err());
        collector.join().expect("collector");
    }

    #[test]
    fn an_answer_s_body_is_read_only_when_it_is_whole_protobuf() {
        let ok = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 2\r\n\r\n\x0a\x00junk";
        assert_eq!(protobuf_body(ok), Some(&b"\x0a\x00"[..]));
        let json = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{}";
        assert_eq!(protobuf_body(json), None);
        let chunked = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n";
        assert_eq!(protobuf_body(chunked), None);
        let short = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 9\r\n\r\n\x0a";
        assert_eq!(protobuf_body(short), None);
        assert_eq!(protobuf_body(b"HTTP/1.1 200 OK\r\n"), None);
    }

    /// A collector that takes requests until dropped, answering 200 and
    /// keeping each request's span count.
    fn collector() -> (u16, std::sync::Arc<std::sync::Mutex<Vec<usize>>>) {
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use prost::Message as _;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let keep = seen.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let (_, body) = read_request(&mut conn);
                let req = ExportTraceServiceRequest::decode(body.as_slice()).expect("decodes");
                let n = req.resource_spans[0].scope_spans[0].spans.len();
                keep.lock().expect("seen").push(n);
                let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
            }
        });
        (port, seen)
    }

    fn record(i: u64) -> SpanRecord {
        let mark = |name, parent| tether_kernel::stages::Mark {
            name,
            parent,
            start_ns: 10,
            end_ns: 20,
        };
        SpanRecord {
            cx: SpanCx {
                trace_id: [1; 16],
                span_id: i.to_be_bytes(),
            },
            parent: None,
            parent_remote: false,
            name: "tether.command",
            kind: tether_kernel::trace::SpanKind::Internal,
            start_unix_ns: 1,
            end_unix_ns: 2,
            attributes: Vec::new(),
            marks: vec![mark("checks", None), mark("policy", Some(0))].into(),
        }
    }

    #[test]
    fn every_span_offered_reaches_the_collector_in_bounded_requests() {
        let (port, seen) = collector();
        let exporter = Exporter::start(&Otlp {
            endpoint: format!("http://127.0.0.1:{port}"),
            protocol: Protocol::HttpProtobuf,
            service_name: "t".into(),
            queue_max: 4096,
            timeout: Duration::from_secs(5),
            sample_ratio: 1.0,
        })
        .expect("exporter");
        // In bursts, so that some land while the thread gathers and some
        // while it waits for a first span.
        for burst in 0..4u64 {
            for i in 0..1_000 {
                exporter.offer(record(burst * 1_000 + i + 1));
            }
            if burst == 1 {
                std::thread::sleep(IDLE_WAIT + GATHER);
            }
        }
        exporter.flush(Duration::from_secs(10)).expect("flushed");
        let counts = seen.lock().expect("seen").clone();
        assert_eq!(counts.iter().sum::<usize>(), 12_000, "{counts:?}");
        let largest = counts.iter().max().copied().unwrap_or(0);
        assert!(
            largest <= BATCH_MAX + tether_kernel::stages::MARKS_MAX,
            "{counts:?}"
        );
        assert!(counts.len() >= 12_000 / (BATCH_MAX + 3), "{counts:?}");
        exporter.shutdown(Duration::from_secs(5));
    }

    fn grpc_exporter(port: u16, queue_max: usize) -> Exporter {
        Exporter::start(&Otlp {
            endpoint: format!("http://127.0.0.1:{port}"),
            protocol: Protocol::Grpc,
            service_name: "t".into(),
            queue_max,
            timeout: Duration::from_secs(5),
            sample_ratio: 1.0,
        })
        .expect("exporter")
    }

    #[test]
    fn over_grpc_every_span_reaches_the_collector_and_a_rejection_is_counted() {
        use super::super::grpc::collector::{start, Answer};
        let (port, seen) = start(Answer::Ok(0));
        let exporter = grpc_exporter(port, 4096);
        for burst in 0..3u64 {
            for i in 0..1_000 {
                exporter.offer(record(burst * 1_000 + i + 1));
            }
            std::thread::sleep(GATHER * 2);
        }
        exporter.flush(Duration::from_secs(10)).expect("flushed");
        let seen = seen.lock().expect("seen");
        // Each record is the command and its two stages.
        assert_eq!(seen.calls.iter().sum::<usize>(), 9_000, "{:?}", seen.calls);
        assert_eq!(seen.connections, 1);
        drop(seen);
        exporter.shutdown(Duration::from_secs(5));

        // A collector that takes part of each batch: the rest is dropped.
        let (port, seen) = start(Answer::Ok(1));
        let exporter = grpc_exporter(port, 64);
        let (exported, dropped) = (
            SPANS_EXPORTED.load(Ordering::Relaxed),
            SPANS_DROPPED.load(Ordering::Relaxed),
        );
        exporter.offer(record(1));
        exporter.flush(Duration::from_secs(10)).expect("flushed");
        assert_eq!(seen.lock().expect("seen").calls, [3]);
        // Other tests run beside this one and move the counters too.
        assert!(SPANS_EXPORTED.load(Ordering::Relaxed) - exported >= 2);
        assert!(SPANS_DROPPED.load(Ordering::Relaxed) - dropped >= 1);
        exporter.shutdown(Duration::from_secs(5));
    }

    #[test]
    fn a_dead_collector_drops_spans_and_a_flush_still_answers() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = closed.local_addr().expect("addr").port();
        drop(closed);
        let exporter = Exporter::start(&Otlp {
            endpoint: format!("http://127.0.0.1:{port}"),
            protocol: Protocol::HttpProtobuf,
            service_name: "t".into(),
            queue_max: 8,
            timeout: Duration::from_secs(1),
            sample_ratio: 1.0,
        })
        .expect("exporter");
        let dropped = SPANS_DROPPED.load(Ordering::Relaxed);
        // More than the queue holds: the rest are dropped at the offer.
        for i in 0..100 {
            exporter.offer(record(i + 1));
        }
        exporter.flush(Duration::from_secs(10)).expect("flushed");
        // Every span was dropped, at the offer or at the refused send.
        assert!(
            SPANS_DROPPED.load(Ordering::Relaxed) - dropped >= 300,
            "dropped {}",
            SPANS_DROPPED.load(Ordering::Relaxed) - dropped
        );
    }
}
