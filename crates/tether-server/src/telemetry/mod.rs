//! The surfaces' part of traces (issue 22 §2, docs/TELEMETRY.md): one span
//! per request, continuing the caller's trace when it sends a W3C
//! `traceparent` (an HTTP header, or MCP's `_meta.traceparent`).
//!
//! The span is a record of Tether's own (`tether_kernel::trace`), handed
//! to the kernel's tracer (the OTLP exporter, [`otlp`]) when it ends; the
//! request's future runs with it as its task's trace context, so the
//! kernel's command and e-stop spans are its children. A `tracing` span of
//! the same request is kept for logs (free when no log filter wants it).
//!
//! **Owns:** the request span and the reading of `traceparent`.
//! **Never belongs here:** the exporter's wire and queue ([`otlp`]), the
//! kernel's own spans (`tether-kernel`: the command, its stages, the
//! e-stop).
//! **Fail-closed rule:** a `traceparent` that does not parse is ignored (the
//! request starts a trace of its own); it never refuses a request, and no
//! part of it but the two ids and the sampled flag is kept.

mod grpc;
pub mod otlp;
mod proto;

use std::borrow::Cow;
use std::future::Future;
use tether_kernel::trace::{self, Active, Current, SpanCx, SpanKind, TraceSink};
use tracing::Instrument;

/// The longest `traceparent` read (version 00 is 55 characters; later
/// versions may append fields).
const TRACEPARENT_CHARS_MAX: usize = 512;

/// A caller's span, named by a W3C `traceparent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remote {
    /// The caller's trace and span.
    pub cx: SpanCx,
    /// The caller's sampled flag: a trace the caller does not record is
    /// not recorded here either.
    pub sampled: bool,
}

/// Runs `fut`, a request on `surface` (`jsonrpc`, `rest`, `mcp`) named
/// `name` (a route or method name, never caller text), as one span: a
/// child of the caller's span when `parent` names one, otherwise the root
/// of a trace of its own (if the sampler keeps it).
pub async fn request<F: Future>(
    tracer: Option<&TraceSink>,
    surface: &'static str,
    name: &'static str,
    parent: Option<Remote>,
    fut: F,
) -> F::Output {
    let fut = fut.instrument(tracing::info_span!(
        "tether.request",
        route = name,
        surface = surface
    ));
    let Some(tracer) = tracer else {
        return fut.await;
    };
    let active = match parent {
        Some(r) if r.sampled => Some(Active::child_of(tracer, r.cx, true, name, SpanKind::Server)),
        Some(_) => None,
        None => Active::root(tracer, name, SpanKind::Server),
    };
    let Some(active) = active else {
        // Not recorded: nothing under it is either.
        return trace::scope(Current::Unsampled, fut).await;
    };
    let out = trace::scope(Current::Span(active.cx()), fut).await;
    active.finish(
        vec![("surface", Cow::Borrowed(surface))],
        tether_kernel::stages::Marks::default(),
    );
    out
}

/// The `traceparent` header of an HTTP request (the first, when several),
/// read as a caller's span.
pub fn traceparent_header(headers: &axum::http::HeaderMap) -> Option<Remote> {
    headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(remote_context)
}

/// The caller's span named by a W3C `traceparent`
/// (`VERSION-TRACEID-PARENTID-FLAGS`, lower-case hex); `None` when it does
/// not parse, names the invalid all-zero ids, or is of version `ff`.
pub fn remote_context(traceparent: &str) -> Option<Remote> {
    if traceparent.len() > TRACEPARENT_CHARS_MAX {
        return None;
    }
    let mut parts = traceparent.trim().split('-');
    let version = parts.next()?;
    let trace = parts.next()?;
    let parent = parts.next()?;
    let flags = parts.next()?;
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    // Version 00 has exactly four fields; a later version may have more.
    let extra = parts.next().is_some();
    if !hex(version, 2) || version == "ff" || (version == "00" && extra) {
        return None;
    }
    if !hex(trace, 32) || !hex(parent, 16) || !hex(flags, 2) {
        return None;
    }
    let mut cx = SpanCx {
        trace_id: [0; 16],
        span_id: [0; 8],
    };
    hex::decode_to_slice(trace, &mut cx.trace_id).ok()?;
    hex::decode_to_slice(parent, &mut cx.span_id).ok()?;
    if cx.trace_id == [0; 16] || cx.span_id == [0; 8] {
        return None;
    }
    let sampled = u8::from_str_radix(flags, 16).ok()? & 1 == 1;
    Some(Remote { cx, sampled })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_names_its_trace_or_nothing() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let r = remote_context(good).expect("parses");
        assert_eq!(
            hex::encode(r.cx.trace_id),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(hex::encode(r.cx.span_id), "00f067aa0ba902b7");
        assert!(r.sampled);
        let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        assert!(!remote_context(unsampled).expect("parses").sampled);
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
        ] {
            assert!(remote_context(bad).is_none(), "{bad:?} must not parse");
        }
    }
}
