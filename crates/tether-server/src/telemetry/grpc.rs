//! OTLP over gRPC for the export thread (`otlp_protocol = "grpc"`,
//! docs/TELEMETRY.md): the same `ExportTraceServiceRequest` bytes
//! [`super::proto`] writes, sent as the unary call
//! `TraceService/Export` over one HTTP/2 connection (hyper's client).
//!
//! gRPC is HTTP/2 with a five-byte frame before each message and the call's
//! status in the response's trailers (`grpc-status`, `grpc-message`), or in
//! its headers when the server answers with nothing else. No gRPC runtime
//! is needed for one unary call whose message is already written, so none
//! is brought in (tonic would add its own transport stack and code
//! generation for what these hundred lines do).
//!
//! The export thread is a plain thread: the client keeps a current-thread
//! tokio runtime of its own, used only while a batch is sent, and one
//! connection, opened on first use and again after any failure. Every
//! exchange is bounded by the export timeout; a batch that fails is
//! dropped by the caller and never sent again.
//!
//! **Owns:** the gRPC framing, the connection, the reading of the status.
//! **Never belongs here:** the message's bytes (`proto`), the queue and
//! what is counted (`otlp`).

use super::otlp::Target;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http2::SendRequest;
use std::time::Duration;

/// The unary method spans are exported with.
const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
/// The largest answer read (a response message holds at most a count and a
/// message).
const ANSWER_BYTES_MAX: usize = 64 * 1024;
/// The largest frame this client sends (the message's length is a `u32` on
/// the wire; a batch is about 200 KB).
const MESSAGE_MAX: usize = 64 * 1024 * 1024;

/// How long the runtime runs the open connection's task before a call
/// reuses it (see `settle`).
const REUSE_PAUSE: Duration = Duration::from_millis(1);
/// How many times the runtime runs its ready tasks after that pause.
const SETTLE_YIELDS: usize = 4;

/// The names of the gRPC status codes, for the log and the error.
const STATUS_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// A gRPC client of one collector, for the export thread.
pub(super) struct GrpcClient {
    target: Target,
    timeout: Duration,
    rt: tokio::runtime::Runtime,
    conn: Option<SendRequest<Full<Bytes>>>,
}

impl std::fmt::Debug for GrpcClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcClient")
            .field("target", &self.target)
            .field("connected", &self.conn.is_some())
            .finish_non_exhaustive()
    }
}

impl GrpcClient {
    /// A client of `target`; nothing is connected yet.
    ///
    /// # Errors
    /// The runtime could not be built.
    pub(super) fn new(target: Target, timeout: Duration) -> Result<Self, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("the gRPC exporter's runtime: {e}"))?;
        Ok(Self {
            target,
            timeout,
            rt,
            conn: None,
        })
    }

    /// Sends one encoded `ExportTraceServiceRequest`; answers what the
    /// collector's response says it rejected (`rejected_spans`, its
    /// message).
    ///
    /// # Errors
    /// No connection, a timeout, an HTTP or gRPC status other than OK, an
    /// answer that is not gRPC. The connection is dropped on any error.
    pub(super) fn export(&mut self, message: &[u8]) -> Result<(u64, String), String> {
        if message.len() > MESSAGE_MAX {
            return Err(format!("a batch of {} bytes is too large", message.len()));
        }
        let framed = frame(message);
        let Self {
            target,
            timeout,
            rt,
            conn,
        } = self;
        let result = rt.block_on(async {
            tokio::time::timeout(*timeout, exchange(target, conn, framed))
                .await
                .unwrap_or_else(|_| Err(format!("no answer within {timeout:?}")))
        });
        if result.is_err() {
            // Whatever state it is in, a new one is opened next time.
            *conn = None;
        }
        result
    }
}

/// The message in its gRPC frame: not compressed, its length, the bytes.
fn frame(message: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(message.len() + 5);
    out.push(0);
    // `export` refused anything longer than MESSAGE_MAX, which fits.
    let len = u32::try_from(message.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(message);
    Bytes::from(out)
}

/// One call on the open connection (opened first if there is none, or if
/// the collector closed it while idle).
///
/// A batch is never sent twice: it goes to a second connection only when
/// hyper hands the request back, which it does only for a request that was
/// never written to the first one (`TrySendError::take_message`).
async fn exchange(
    target: &Target,
    conn: &mut Option<SendRequest<Full<Bytes>>>,
    framed: Bytes,
) -> Result<(u64, String), String> {
    let request = hyper::Request::post(format!(
        "http://{}:{}{EXPORT_PATH}",
        target.host, target.port
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .header("user-agent", concat!("tether/", env!("CARGO_PKG_VERSION")))
    .body(Full::new(framed))
    .map_err(|e| format!("the request: {e}"))?;
    let sender = ready_sender(target, conn).await?;
    let response = match sender.try_send_request(request).await {
        Ok(response) => response,
        Err(mut refused) => {
            let Some(request) = refused.take_message() else {
                return Err(format!("sending: {}", refused.into_error()));
            };
            // The connection closed before the request was written to it
            // (a GOAWAY read after the check above): a new one takes it.
            *conn = None;
            let sender = ready_sender(target, conn).await?;
            sender
                .send_request(request)
                .await
                .map_err(|e| format!("sending on a new connection: {e}"))?
        }
    };
    read_answer(response).await
}

/// The open connection when it is still usable, else a new one, ready to
/// take a request.
async fn ready_sender<'c>(
    target: &Target,
    conn: &'c mut Option<SendRequest<Full<Bytes>>>,
) -> Result<&'c mut SendRequest<Full<Bytes>>, String> {
    if conn.is_some() {
        settle().await;
    }
    let reusable = match conn.as_mut() {
        Some(sender) if !sender.is_closed() => sender.ready().await.is_ok(),
        _ => false,
    };
    if !reusable {
        let mut fresh = connect(target).await?;
        fresh
            .ready()
            .await
            .map_err(|e| format!("the new connection is not ready: {e}"))?;
        *conn = Some(fresh);
    }
    conn.as_mut().ok_or_else(|| "no connection".to_owned())
}

/// Lets the runtime's driver and the connection's tasks read what came
/// while the thread slept (a GOAWAY, a close), so a dead connection is
/// seen before it is reused. A yield alone is not enough: the socket's
/// readiness is only seen when the runtime parks on its driver, which this
/// short sleep makes it do. The sleep's wake-up can be polled before the
/// tasks the same park woke (a busy machine parks late), so a few yields
/// follow to let the chain (the h2 task, then hyper's dispatch task) run
/// out. A close seen later still loses nothing: see `exchange`.
async fn settle() {
    tokio::time::sleep(REUSE_PAUSE).await;
    for _ in 0..SETTLE_YIELDS {
        tokio::task::yield_now().await;
    }
}

async fn connect(target: &Target) -> Result<SendRequest<Full<Bytes>>, String> {
    let tcp = tokio::net::TcpStream::connect((target.host.as_str(), target.port))
        .await
        .map_err(|e| format!("connecting to {}:{}: {e}", target.host, target.port))?;
    let _ = tcp.set_nodelay(true);
    let (sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .map_err(|e| format!("the HTTP/2 handshake: {e}"))?;
    // Driven while this thread's runtime runs a call; it ends with the
    // connection.
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "the gRPC collector's connection ended");
        }
    });
    Ok(sender)
}

/// The call's outcome from its response: the HTTP status, the gRPC status
/// (trailers, or the headers of a trailers-only answer), and the partial
/// success the response message may hold.
async fn read_answer(
    response: hyper::Response<hyper::body::Incoming>,
) -> Result<(u64, String), String> {
    let (parts, mut body) = response.into_parts();
    if parts.status != hyper::StatusCode::OK {
        return Err(format!("HTTP status {}", parts.status.as_u16()));
    }
    let mut status = grpc_status(&parts.headers);
    let mut data = Vec::new();
    while status.is_none() {
        let Some(frame) = body.frame().await else {
            break;
        };
        let frame = frame.map_err(|e| format!("reading the answer: {e}"))?;
        match frame.into_data() {
            Ok(chunk) => {
                if data.len() + chunk.len() > ANSWER_BYTES_MAX {
                    return Err("the answer is too large".into());
                }
                data.extend_from_slice(&chunk);
            }
            Err(frame) => {
                if let Some(trailers) = frame.trailers_ref() {
                    status = grpc_status(trailers);
                }
            }
        }
    }
    match status {
        None => Err("the answer carries no grpc-status".into()),
        Some((0, _)) => Ok(rejected(&data)),
        Some((code, message)) => Err(format!(
            "grpc-status {code} ({}): {message}",
            STATUS_NAMES
                .get(usize::try_from(code).unwrap_or(usize::MAX))
                .unwrap_or(&"?")
        )),
    }
}

/// `grpc-status` and `grpc-message` when the map holds a status.
fn grpc_status(headers: &hyper::HeaderMap) -> Option<(u32, String)> {
    let code = headers.get("grpc-status")?.to_str().ok()?.trim();
    let message = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .unwrap_or("")
        .to_owned();
    // A status that does not parse is not OK.
    Some((code.parse().unwrap_or(u32::from(u8::MAX)), message))
}

/// What an OK answer's message says was rejected: nothing unless an
/// uncompressed response frame holds a `partial_success`.
fn rejected(data: &[u8]) -> (u64, String) {
    let message = match data {
        [0, a, b, c, d, rest @ ..] => {
            let len = u32::from_be_bytes([*a, *b, *c, *d]);
            rest.get(..usize::try_from(len).unwrap_or(usize::MAX))
        }
        _ => None,
    };
    message
        .and_then(super::proto::partial_success)
        .unwrap_or((0, String::new()))
}

/// A gRPC collector for the tests: hyper's HTTP/2 server on a thread of its
/// own, decoding each call with the official message types.
#[cfg(test)]
pub(super) mod collector {
    use bytes::Bytes;
    use http_body_util::{BodyExt as _, Full};
    use opentelemetry_proto::tonic::collector::trace::v1::{
        ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
    };
    use prost::Message as _;
    use std::sync::{Arc, Mutex};

    /// How the collector answers every call.
    #[derive(Debug, Clone, Copy)]
    pub(in super::super) enum Answer {
        /// OK, rejecting this many spans (a partial success when not 0).
        Ok(i64),
        /// Only headers, with this `grpc-status`.
        Status(u32),
        /// The call is read and never answered.
        Never,
        /// OK, and the connection is closed this many milliseconds after
        /// each call is answered.
        OkThenClose(u64),
    }

    /// What the collector saw.
    #[derive(Debug, Default)]
    pub(in super::super) struct Seen {
        /// Span counts, one per call.
        pub calls: Vec<usize>,
        /// Connections accepted.
        pub connections: usize,
        /// Every call's path, content type and `te`.
        pub heads: Vec<(String, String, String)>,
    }

    /// Starts the collector; answers its port and what it sees.
    pub(in super::super) fn start(answer: Answer) -> (u16, Arc<Mutex<Seen>>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let seen = Arc::new(Mutex::new(Seen::default()));
        let keep = seen.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(serve(listener, answer, keep));
        });
        (port, seen)
    }

    async fn serve(listener: std::net::TcpListener, answer: Answer, seen: Arc<Mutex<Seen>>) {
        let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            seen.lock().expect("seen").connections += 1;
            let seen = seen.clone();
            let answered = Arc::new(tokio::sync::Notify::new());
            let told = answered.clone();
            let service = hyper::service::service_fn(move |req| {
                call(req, answer, seen.clone(), told.clone())
            });
            let conn =
                hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), service);
            tokio::spawn(async move {
                let mut conn = std::pin::pin!(conn);
                if let Answer::OkThenClose(after_ms) = answer {
                    // Once the first call is answered (and then idle for
                    // `after_ms`), say goodbye (GOAWAY) and close.
                    tokio::select! {
                        _ = conn.as_mut() => return,
                        () = answered.notified() => {}
                    }
                    let idle = tokio::time::sleep(std::time::Duration::from_millis(after_ms));
                    tokio::select! {
                        _ = conn.as_mut() => return,
                        () = idle => {}
                    }
                    conn.as_mut().graceful_shutdown();
                }
                let _ = conn.await;
            });
        }
    }

    type Reply =
        hyper::Response<http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>>;

    async fn call(
        req: hyper::Request<hyper::body::Incoming>,
        answer: Answer,
        seen: Arc<Mutex<Seen>>,
        answered: Arc<tokio::sync::Notify>,
    ) -> Result<Reply, std::convert::Infallible> {
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned()
        };
        let head = (
            req.uri().path().to_owned(),
            header("content-type"),
            header("te"),
        );
        let body = req.into_body().collect().await.map(|b| b.to_bytes());
        let body = body.unwrap_or_default();
        let (flag, len) = (
            body[0],
            u32::from_be_bytes([body[1], body[2], body[3], body[4]]),
        );
        assert_eq!(flag, 0, "uncompressed");
        assert_eq!(len as usize, body.len() - 5, "one whole frame");
        let msg = ExportTraceServiceRequest::decode(&body[5..]).expect("decodes");
        let spans = msg.resource_spans[0].scope_spans[0].spans.len();
        {
            let mut s = seen.lock().expect("seen");
            s.calls.push(spans);
            s.heads.push(head);
        }
        let reply = hyper::Response::builder()
            .status(200)
            .header("content-type", "application/grpc");
        match answer {
            Answer::Ok(rejected) => {
                let response = ExportTraceServiceResponse {
                    partial_success: (rejected != 0).then(|| ExportTracePartialSuccess {
                        rejected_spans: rejected,
                        error_message: "over quota".into(),
                    }),
                }
                .encode_to_vec();
                Ok(reply.body(ok_body(&response)).expect("reply"))
            }
            Answer::OkThenClose(_) => {
                answered.notify_one();
                Ok(reply.body(ok_body(&[])).expect("reply"))
            }
            Answer::Status(code) => Ok(reply
                .header("grpc-status", code.to_string())
                .header("grpc-message", "collector is shedding load")
                .body(Full::new(Bytes::new()).boxed())
                .expect("reply")),
            Answer::Never => {
                std::future::pending::<()>().await;
                unreachable!("never answers")
            }
        }
    }

    /// A response message in its frame, then the OK trailers.
    fn ok_body(
        message: &[u8],
    ) -> http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible> {
        let mut framed = vec![0];
        framed.extend_from_slice(&u32::try_from(message.len()).expect("len").to_be_bytes());
        framed.extend_from_slice(message);
        let mut trailers = hyper::HeaderMap::new();
        trailers.insert("grpc-status", hyper::header::HeaderValue::from_static("0"));
        Full::new(Bytes::from(framed))
            .with_trailers(async move { Some(Ok(trailers)) })
            .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::collector::{start, Answer};
    use super::*;
    use crate::telemetry::otlp::Protocol;

    fn client(port: u16, timeout: Duration) -> GrpcClient {
        let target = Target::parse_for_tests(&format!("http://127.0.0.1:{port}"), Protocol::Grpc);
        GrpcClient::new(target, timeout).expect("client")
    }

    fn request(spans: usize) -> Vec<u8> {
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
        use prost::Message as _;
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans: vec![Span::default(); spans],
                    ..ScopeSpans::default()
                }],
                ..ResourceSpans::default()
            }],
        }
        .encode_to_vec()
    }

    #[test]
    fn a_batch_is_one_export_call_and_the_connection_is_kept() {
        let (port, seen) = start(Answer::Ok(0));
        let mut c = client(port, Duration::from_secs(5));
        for n in [3, 5, 8] {
            assert_eq!(c.export(&request(n)), Ok((0, String::new())));
        }
        let seen = seen.lock().expect("seen");
        assert_eq!(seen.calls, [3, 5, 8]);
        assert_eq!(seen.connections, 1, "one connection for every call");
        for (path, content_type, te) in &seen.heads {
            assert_eq!(path, EXPORT_PATH);
            assert_eq!(content_type, "application/grpc");
            assert_eq!(te, "trailers");
        }
    }

    #[test]
    fn a_partial_success_is_what_was_rejected_and_a_status_is_an_error() {
        let (port, _) = start(Answer::Ok(2));
        let mut c = client(port, Duration::from_secs(5));
        assert_eq!(c.export(&request(5)), Ok((2, "over quota".into())));

        let (port, seen) = start(Answer::Status(14));
        let mut c = client(port, Duration::from_secs(5));
        let e = c.export(&request(4)).expect_err("refused");
        assert!(e.contains("14 (UNAVAILABLE)"), "{e}");
        assert!(e.contains("shedding load"), "{e}");
        assert_eq!(seen.lock().expect("seen").calls, [4], "sent once");
    }

    #[test]
    fn a_connection_the_collector_closed_is_replaced_before_a_batch_is_sent() {
        // Closed at once after an answer, and closed while the client was
        // idle between two batches (a collector's idle timeout): the second
        // is noticed only because the runtime runs before a reuse.
        for close_after_ms in [0, 100] {
            let (port, seen) = start(Answer::OkThenClose(close_after_ms));
            let mut c = client(port, Duration::from_secs(5));
            for n in [1, 2, 3] {
                assert_eq!(
                    c.export(&request(n)),
                    Ok((0, String::new())),
                    "call {n}, closed {close_after_ms} ms after an answer"
                );
                std::thread::sleep(Duration::from_millis(600));
            }
            let seen = seen.lock().expect("seen");
            assert_eq!(seen.calls, [1, 2, 3], "no batch lost, none sent twice");
            assert_eq!(seen.connections, 3);
        }
    }

    #[test]
    fn batches_sent_back_to_back_to_a_collector_that_closes_after_each_lose_nothing() {
        // The GOAWAY races the next batch: read before the check, the
        // connection is replaced; read after it, hyper hands the unwritten
        // request back and a new connection takes it. Either way every
        // batch arrives once.
        let (port, seen) = start(Answer::OkThenClose(0));
        let mut c = client(port, Duration::from_secs(5));
        let sent: Vec<usize> = (1..=40).collect();
        for &n in &sent {
            assert_eq!(c.export(&request(n)), Ok((0, String::new())), "call {n}");
        }
        let seen = seen.lock().expect("seen");
        assert_eq!(seen.calls, sent, "no batch lost, none sent twice");
        assert!(seen.connections >= 2, "{} connections", seen.connections);
    }

    #[test]
    fn a_silent_or_absent_collector_is_an_error_within_the_timeout() {
        let (port, seen) = start(Answer::Never);
        let mut c = client(port, Duration::from_millis(300));
        let t = std::time::Instant::now();
        let e = c.export(&request(1)).expect_err("no answer");
        assert!(e.contains("no answer within"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert_eq!(seen.lock().expect("seen").calls, [1]);

        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = closed.local_addr().expect("addr").port();
        drop(closed);
        let mut c = client(port, Duration::from_secs(5));
        let e = c.export(&request(1)).expect_err("nobody listening");
        assert!(e.contains("connecting"), "{e}");
    }

    #[test]
    fn an_answer_without_a_status_or_frame_is_read_safely() {
        assert_eq!(rejected(&[]), (0, String::new()));
        assert_eq!(
            rejected(&[1, 0, 0, 0, 2, 8, 1]),
            (0, String::new()),
            "compressed"
        );
        assert_eq!(rejected(&[0, 0, 0, 0, 9, 8]), (0, String::new()), "short");
        assert_eq!(
            rejected(&[0, 0, 0, 0, 4, 0x0a, 2, 8, 6]),
            (6, String::new())
        );
        let mut h = hyper::HeaderMap::new();
        assert_eq!(grpc_status(&h), None);
        h.insert("grpc-status", hyper::header::HeaderValue::from_static("x"));
        assert_eq!(grpc_status(&h), Some((255, String::new())), "not OK");
    }
}
