//! The network listeners' accept loop, shared by JSON-RPC with the REST
//! gateway (`crate::http`) and MCP (`crate::mcp::http`): TLS when configured
//! (`tls`), a bound on the time a client may take to send a request's
//! headers (which also bounds how long a keep-alive connection may idle),
//! and the connection table (`conns`) that bounds connections in total and
//! per peer address while always leaving room for an e-stop (`screen`).
//! Each connection is served by hyper's HTTP/1 connection with the surface's
//! axum router, unchanged; `TCP_NODELAY` is set on every accepted socket;
//! when `shutdown` resolves, accepting stops, quiet connections close and
//! requests in flight are answered first (the caller bounds that wait).
//!
//! **Never belongs here:** what a request means or who may send it (the
//! surfaces, `auth`), and anything the kernel decides.

mod conns;
mod screen;
mod tls;

pub use conns::{Bounds, ConnTable, Occupancy, SCREENED_CONNECTIONS_MAX};
pub use tls::Tls;

use crate::auth::Authenticator;
use axum::body::{Body, Bytes};
use axum::response::Response;
use axum::Router;
use conns::{Admitted, ConnState};
use http_body::Frame;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Default `header_read_timeout_ms`: a client has this long to send a
/// request's headers (and a TLS client its handshake), and a keep-alive
/// connection may idle this long between requests.
pub const HEADER_READ_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Longest `header_read_timeout_ms` the config accepts.
pub const HEADER_READ_TIMEOUT_MS_MAX: u64 = 600_000;
/// Default `connections_max`: far above what the endpoint serves at once
/// (the load benches drive 64 callers), small enough that, with the
/// descriptors the endpoint needs besides, it fits under the common hard
/// open-files limit of 4,096.
pub const CONNECTIONS_MAX_DEFAULT: usize = 1024;
/// Default `connections_per_peer_max`: a quarter of the total, so one
/// address (a client, or a NAT in front of many) never holds every
/// connection; on loopback, where every client shares one address, it is
/// the effective bound, and shedding keeps room for the e-stop there.
pub const CONNECTIONS_PER_PEER_MAX_DEFAULT: usize = 256;
/// Descriptors the endpoint keeps for itself beside the bounded
/// connections: the screened pool, the store (SQLite and its WAL), the
/// listeners, drivers' sockets and files, standard streams, a connection
/// being accepted. `connections_max` plus this must fit under the
/// open-files limit.
pub const DESCRIPTORS_BESIDES_CONNECTIONS: usize = 256;

const _: () = assert!(CONNECTIONS_PER_PEER_MAX_DEFAULT <= CONNECTIONS_MAX_DEFAULT);
const _: () = assert!(SCREENED_CONNECTIONS_MAX * 2 <= DESCRIPTORS_BESIDES_CONNECTIONS);
const _: () = assert!(CONNECTIONS_MAX_DEFAULT + DESCRIPTORS_BESIDES_CONNECTIONS <= 4096);
const _: () =
    assert!(HEADER_READ_TIMEOUT_DEFAULT.as_millis() <= HEADER_READ_TIMEOUT_MS_MAX as u128);

/// Connections the kernel may hold for the accept loop (capped by
/// `net.core.somaxconn`): under a flood, a full accept queue drops a new
/// connection's SYN, and its client (an e-stop's, say) retries only after
/// a second.
pub const ACCEPT_BACKLOG: u32 = 4096;

/// Binds a listener at `addr` (a name is resolved; the first address that
/// binds is used) with [`ACCEPT_BACKLOG`] and `SO_REUSEADDR`, as
/// `tokio::net::TcpListener::bind` does with a smaller backlog.
///
/// # Errors
/// No address resolved, or none could be bound (the last error).
pub async fn bind(addr: &str) -> std::io::Result<tokio::net::TcpListener> {
    let mut last = None;
    for a in tokio::net::lookup_host(addr).await? {
        let socket = if a.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        #[cfg(unix)]
        socket.set_reuseaddr(true)?;
        match socket.bind(a).and_then(|()| socket.listen(ACCEPT_BACKLOG)) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{addr} resolves to no address"),
        )
    }))
}

/// Pause after an accept error that is not about one connection (the
/// process is out of descriptors, say), so the loop never spins.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);
/// Pause between two tries to admit a connection when every slot holds a
/// connection not yet read or a request in flight: accepting waits (new
/// connections wait in the kernel's queue, in order) while the connections
/// just accepted are read.
const ADMIT_RETRY: Duration = Duration::from_millis(1);
/// Fewest seconds between two warnings that connections are being shed.
const SHED_WARNING_EVERY: Duration = Duration::from_secs(10);

/// How the listeners meet the network: TLS, the header-read timeout and the
/// connection table. Clones share one table, so every listener of an
/// endpoint counts against the same bounds.
#[derive(Clone, Debug)]
pub struct Edge {
    tls: Option<Tls>,
    header_read_timeout: Duration,
    table: Arc<ConnTable>,
    /// `GET /metrics` without a token (`crate::http::router_with`).
    metrics_open: bool,
    /// Finished REST invocations kept in memory (`crate::rest`).
    rest_finished_max: usize,
}

impl Default for Edge {
    fn default() -> Self {
        Edge::new(
            None,
            HEADER_READ_TIMEOUT_DEFAULT,
            Bounds {
                connections_max: CONNECTIONS_MAX_DEFAULT,
                connections_per_peer_max: CONNECTIONS_PER_PEER_MAX_DEFAULT,
            },
        )
    }
}

impl Edge {
    /// An edge with `tls` (plain TCP when `None`), the header-read timeout
    /// (at least 1 ms) and the connection bounds (each at least 1, the
    /// per-peer one at most the total).
    pub fn new(tls: Option<Tls>, header_read_timeout: Duration, bounds: Bounds) -> Self {
        Self {
            tls,
            header_read_timeout: header_read_timeout.max(Duration::from_millis(1)),
            table: Arc::new(ConnTable::new(bounds)),
            metrics_open: false,
            rest_finished_max: crate::rest::FINISHED_MAX_DEFAULT,
        }
    }

    /// This edge, keeping at most `max` finished REST invocations in memory
    /// (older ones are read from the store).
    #[must_use]
    pub fn with_rest_finished_max(mut self, max: usize) -> Self {
        self.rest_finished_max = max;
        self
    }

    /// Finished REST invocations kept in memory, at most.
    pub fn rest_finished_max(&self) -> usize {
        self.rest_finished_max
    }

    /// This edge, serving `GET /metrics` without a token when `open`.
    #[must_use]
    pub fn with_metrics_open(mut self, open: bool) -> Self {
        self.metrics_open = open;
        self
    }

    /// Whether `GET /metrics` is served without a token.
    pub fn metrics_open(&self) -> bool {
        self.metrics_open
    }

    /// Whether the listeners speak TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// `https` with TLS, else `http`.
    pub fn scheme(&self) -> &'static str {
        if self.is_tls() {
            "https"
        } else {
            "http"
        }
    }

    /// The connection table the listeners share.
    pub fn table(&self) -> &ConnTable {
        &self.table
    }
}

/// What every connection of one listener is served with.
struct Surface {
    app: Router,
    auth: Authenticator,
    edge: Edge,
    closing: CancellationToken,
}

/// Serves `app` on `listener` until `shutdown` resolves; then stops
/// accepting, closes quiet connections and waits for the others to answer
/// what they are serving.
///
/// # Errors
/// None today: accept errors are logged and retried; the type leaves room.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    auth: Authenticator,
    edge: Edge,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let closing = CancellationToken::new();
    let stop = closing.clone();
    let shutdown = tokio::spawn(async move {
        shutdown.await;
        stop.cancel();
    });
    let surface = Arc::new(Surface {
        app,
        auth,
        edge,
        closing,
    });
    let tasks = TaskTracker::new();
    let mut warned: Option<(tokio::time::Instant, u64)> = None;
    loop {
        let accepted = tokio::select! {
            () = surface.closing.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (mut tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a connection failed; retrying");
                tokio::select! {
                    () = surface.closing.cancelled() => break,
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                }
            }
        };
        crate::no_delay(&mut tcp);
        let Some(admitted) = admit(&surface, peer.ip()).await else {
            // Every slot, screened ones included, kept a request in flight
            // (or a connection not yet read) for a whole header-read
            // timeout: this one is closed unread.
            tracing::debug!(%peer, "connection refused: every connection is busy");
            continue;
        };
        warn_when_shedding(&surface.edge.table, &mut warned);
        tasks.spawn(connection(tcp, admitted, Arc::clone(&surface)));
    }
    // New connections are refused from here on.
    drop(listener);
    surface.closing.cancel();
    shutdown.abort();
    tasks.close();
    tasks.wait().await;
    Ok(())
}

/// Admits a connection from `peer`, waiting (at most a header-read timeout,
/// or until shutdown) while every slot holds a connection not yet read or a
/// request in flight; meanwhile nothing else is accepted.
async fn admit(surface: &Surface, peer: IpAddr) -> Option<Admitted> {
    let deadline = tokio::time::Instant::now() + surface.edge.header_read_timeout;
    loop {
        if let Some(admitted) = surface.edge.table.admit(peer) {
            return Some(admitted);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::select! {
            () = surface.closing.cancelled() => return None,
            () = tokio::time::sleep(ADMIT_RETRY) => {}
        }
    }
}

/// An accept error about one connection only (the peer went away).
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}

/// Warns (at most every [`SHED_WARNING_EVERY`]) that the bounds are
/// reached and quiet connections are being shed.
fn warn_when_shedding(table: &ConnTable, warned: &mut Option<(tokio::time::Instant, u64)>) {
    let now = tokio::time::Instant::now();
    let occupancy = table.occupancy();
    let seen = warned.map_or(0, |(_, seen)| seen);
    let due = warned.is_none_or(|(at, _)| now.duration_since(at) >= SHED_WARNING_EVERY);
    if occupancy.shed_total > seen && due {
        let bounds = table.bounds();
        tracing::warn!(
            connections_max = bounds.connections_max,
            connections_per_peer_max = bounds.connections_per_peer_max,
            shed = occupancy.shed_total - seen,
            screened = occupancy.screened,
            "the connection bounds are reached: quiet connections are being shed"
        );
        *warned = Some((now, occupancy.shed_total));
    }
}

/// One connection: the TLS handshake (bounded by the header-read timeout),
/// then HTTP/1 until the peer closes, the connection is shed, or the
/// listener shuts down.
async fn connection(tcp: tokio::net::TcpStream, admitted: Admitted, surface: Arc<Surface>) {
    let shed = admitted.conn.shed_token();
    let tcp = Watched {
        io: tcp,
        conn: Arc::clone(&admitted.conn),
    };
    let Some(tls) = &surface.edge.tls else {
        serve_io(tcp, &admitted, &surface).await;
        return;
    };
    let handshake =
        tokio::time::timeout(surface.edge.header_read_timeout, tls.acceptor.accept(tcp));
    let stream = tokio::select! {
        done = handshake => match done {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "TLS handshake failed");
                return;
            }
            Err(_) => return,
        },
        () = shed.cancelled() => return,
        () = surface.closing.cancelled() => return,
    };
    serve_io(stream, &admitted, &surface).await;
}

async fn serve_io<I>(io: I, admitted: &Admitted, surface: &Arc<Surface>)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = Service {
        surface: Arc::clone(surface),
        conn: Arc::clone(&admitted.conn),
        screened: admitted.screened,
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(surface.edge.header_read_timeout)
        .keep_alive(!admitted.screened);
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let shed = admitted.conn.shed_token();
    tokio::select! {
        done = conn.as_mut() => {
            if let Err(e) = done {
                tracing::debug!(error = %e, "connection ended");
            }
        }
        // Shed while quiet: dropping it closes the socket.
        () = shed.cancelled() => {}
        () = surface.closing.cancelled() => {
            if !admitted.conn.close_if_quiet() {
                // A request in flight is answered first.
                conn.as_mut().graceful_shutdown();
                let _ = conn.as_mut().await;
            }
        }
    }
}

/// The hyper service of one connection: marks the request in flight, serves
/// it (screened or not) and tracks its answer to the end.
struct Service {
    surface: Arc<Surface>,
    conn: Arc<ConnState>,
    screened: bool,
}

type Answer = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl hyper::service::Service<hyper::Request<Incoming>> for Service {
    type Response = Response;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, request: hyper::Request<Incoming>) -> Self::Future {
        let request = request.map(Body::new);
        let surface = Arc::clone(&self.surface);
        if self.screened {
            // In flight only once it is known to be an e-stop: a screened
            // connection reading another request's body may be shed.
            let conn = Arc::clone(&self.conn);
            return Box::pin(async move {
                let (response, in_flight) = screen::serve(&surface, &conn, request).await;
                Ok(tracked(response, in_flight))
            });
        }
        let Some(in_flight) = InFlight::begin(&self.conn) else {
            // Shed a moment ago: the connection is closing and this request
            // never starts (the client sees the connection close).
            let path = request.uri().path().to_owned();
            return Box::pin(async move { Ok(screen::refusal(&path)) });
        };
        Box::pin(async move {
            let response = call(surface.app.clone(), request).await;
            Ok(tracked(response, Some(in_flight)))
        })
    }
}

/// Serves one request with the surface's router.
async fn call(app: Router, request: axum::extract::Request) -> Response {
    use tower::ServiceExt;
    match app.oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

/// The answer, keeping its request in flight until its body ends.
fn tracked(response: Response, in_flight: Option<InFlight>) -> Response {
    match in_flight {
        None => response,
        Some(in_flight) => response.map(|inner| {
            Body::new(Tracked {
                inner,
                _in_flight: in_flight,
            })
        }),
    }
}

/// A request in flight; dropped when its answer's body ended (or was
/// dropped, or never made).
struct InFlight(Arc<ConnState>);

impl InFlight {
    /// Marks a request in flight on `conn`; `None` when the connection was
    /// shed (the request must not start).
    fn begin(conn: &Arc<ConnState>) -> Option<InFlight> {
        conn.begin().then(|| InFlight(Arc::clone(conn)))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.answered();
    }
}

/// An answer's body, keeping its request in flight until hyper drops it.
struct Tracked {
    inner: Body,
    _in_flight: InFlight,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The connection's socket, telling the connection's state when a read finds
/// nothing to read (it now waits for its client) and when writes are
/// flushed (an answer that ended is quiet only once its last bytes left).
/// Under TLS it sits below the TLS session, so a stalled handshake reads as
/// waiting too.
struct Watched<I> {
    io: I,
    conn: Arc<ConnState>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if read.is_pending() {
            this.conn.waiting();
        }
        read
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let flushed = Pin::new(&mut this.io).poll_flush(cx);
        if let Poll::Ready(Ok(())) = flushed {
            this.conn.flushed();
        }
        flushed
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
