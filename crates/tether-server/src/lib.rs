//! # tether-server — the surfaces
//!
//! Owns the wire: the network listeners (`listener`: TLS, header-read
//! timeout, connection bounds), JSON-RPC 2.0 framing over HTTP (`POST /rpc`)
//! and stdio (one JSON value per line), MCP (the `rmcp` SDK) over stdio and streamable HTTP, the REST tool gateway
//! (`rest`), strict parsing of untrusted input, size limits, and the mapping of kernel answers to protocol
//! answers. It decides nothing: every
//! request that reaches a device goes through `tether_kernel::Kernel`.
//!
//! **Never belongs here:** limits, latches, grants, receipts (the kernel),
//! SQL (the store), device protocols (drivers).
//!
//! **Depends on:** tether-core, tether-kernel, axum, hyper, tokio, rustls, rmcp, serde_json (the store only
//! through the kernel). **Depended on by:** tether-cli.
#![deny(missing_docs)]

pub mod auth;
pub mod console;
pub mod edge;
pub mod http;
pub mod listener;
pub mod mcp;
pub mod metrics;
pub mod rest;
pub mod rpc;
pub mod stdio;
pub mod telemetry;
pub mod tools;

/// Disables Nagle's algorithm on an accepted connection. Answers go out in
/// one write but streamed ones (MCP's server-sent events) in several: with
/// Nagle on, a later part waits for the peer's delayed ACK (up to ~40 ms on
/// Linux), which an e-stop's answer must never do. A socket that refuses the
/// option still serves, only slower.
pub(crate) fn no_delay(tcp: &mut tokio::net::TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "TCP_NODELAY not set on a connection");
    }
}

/// The compact JSON text of an answer, as bytes.
///
/// Serialising a `Value` cannot fail (its keys are strings); should that ever
/// change, the answer is a JSON-RPC internal error rather than a panic.
pub(crate) fn json_bytes(v: &serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_else(|e| {
        tracing::error!(error = %e, "an answer could not be serialised");
        br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"answer could not be serialised"}}"#
            .to_vec()
    })
}

/// An HTTP answer whose body is `v` as JSON: one place for JSON-RPC over
/// HTTP and the REST gateway.
pub(crate) fn json_response(
    status: axum::http::StatusCode,
    v: &serde_json::Value,
) -> axum::response::Response {
    // Straight into bytes: `to_string` would go through `Display` and the
    // formatting machinery, a measurable cost on every answer.
    bytes_response(status, json_bytes(v))
}

/// An HTTP answer whose body is JSON text already written.
pub(crate) fn bytes_response(
    status: axum::http::StatusCode,
    json: Vec<u8>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        json,
    )
        .into_response()
}

/// Whether some member `"key"` of `text` (JSON or not) has a value that
/// begins with `value` (a JSON token, e.g. `"\"estop\""`). A textual look
/// for recognising an e-stop in text no parser accepts; one pass over the
/// (bounded) text per occurrence of the key.
pub(crate) fn text_member_is(text: &str, key: &str, value: &str) -> bool {
    let key = format!("\"{key}\"");
    text.match_indices(key.as_str()).any(|(at, k)| {
        text[at + k.len()..]
            .trim_start()
            .strip_prefix(':')
            .map(str::trim_start)
            .is_some_and(|v| v.starts_with(value))
    })
}

/// The text read the permissive way (`serde_json`'s: the last duplicate key
/// wins, escapes decoded, depth bounded by its recursion limit; a non-finite
/// number — `NaN`, an infinity, a numeral beyond f64 — read as null, as an
/// e-stop reads it), only to recognise an e-stop in text the strict parser
/// refused. Without the last, an e-stop whose name only a parser can see
/// (`"mhs.safety.\u0065stop"`) beside a duplicate key and a `NaN` read as
/// no e-stop at all.
pub(crate) fn permissive_parse(text: &str) -> Option<serde_json::Value> {
    serde_json::from_str(text).ok().or_else(|| {
        let repaired = tether_core::json::nonfinite_as_null(text)?;
        serde_json::from_str(&repaired).ok()
    })
}

/// Largest request accepted by any surface, bytes.
pub const REQUEST_BYTES_MAX: usize = 1 << 20;

/// A request body read with a size bound.
pub(crate) enum BodyBytes {
    /// The whole body, within the bound.
    Whole(Vec<u8>),
    /// Longer than the bound: its first `limit` bytes (the rest is not
    /// read), kept so an e-stop in it can still be recognised.
    TooLarge(Vec<u8>),
    /// The body could not be read (the client went away).
    Broken,
}

/// How long a client may take to send a request body. A client that
/// trickles a body (or stops half-way) would otherwise hold its connection,
/// and a descriptor, for ever.
pub const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Reads `body` up to `limit` bytes within [`BODY_READ_TIMEOUT`]. A longer
/// body is cut there: only its first `limit` bytes are held, never the
/// whole; a body not sent in time is [`BodyBytes::Broken`].
pub(crate) async fn read_body(body: axum::body::Body, limit: usize) -> BodyBytes {
    tokio::time::timeout(BODY_READ_TIMEOUT, read_body_untimed(body, limit))
        .await
        .unwrap_or(BodyBytes::Broken)
}

async fn read_body_untimed(mut body: axum::body::Body, limit: usize) -> BodyBytes {
    use http_body::Body as _;
    let mut buf = Vec::new();
    loop {
        let frame = std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await;
        let data = match frame {
            None => return BodyBytes::Whole(buf),
            Some(Err(_)) => return BodyBytes::Broken,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                Err(_) => continue, // trailers carry no body bytes
            },
        };
        let room = limit - buf.len();
        if data.len() > room {
            buf.extend_from_slice(&data[..room]);
            return BodyBytes::TooLarge(buf);
        }
        buf.extend_from_slice(&data);
    }
}

#[cfg(test)]
mod tests {
    use super::json_bytes;
    use serde_json::json;

    #[test]
    fn answers_serialise_to_the_same_text_as_display() {
        let v = json!({"a": [1, 2.5, null, true], "s": "quote \" slash \\ tab \t é \u{1F600}", "n": {"x": -0.0}});
        assert_eq!(json_bytes(&v), v.to_string().into_bytes());
        let back: serde_json::Value = serde_json::from_slice(&json_bytes(&v)).expect("json");
        assert_eq!(back, v);
    }
}
