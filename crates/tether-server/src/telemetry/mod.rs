//! The surfaces' part of traces (issue 22 §2, docs/TELEMETRY.md): one span
//! per request, continuing the caller's trace when it sends a W3C
//! `traceparent` (an HTTP header, or MCP's `_meta.traceparent`).
//!
//! The spans are `tracing` spans; whether they leave the process (OTLP) is
//! decided by the subscriber `tether-cli` installs. Without one they cost a
//! disabled callsite's check.
//!
//! **Owns:** the request span and the reading of `traceparent`.
//! **Never belongs here:** the exporter (`tether-cli`), the kernel's own
//! spans (`tether-kernel`: the command, its stages, the policy decision,
//! the driver call, the durable commit).
//! **Fail-closed rule:** a `traceparent` that does not parse is ignored (the
//! request starts a trace of its own); it never refuses a request, and no
//! part of it but the two ids and the sampled flag is kept.

pub mod otlp;

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The longest `traceparent` read (version 00 is 55 characters; later
/// versions may append fields).
const TRACEPARENT_CHARS_MAX: usize = 512;

/// The span of one request on `surface` (`jsonrpc`, `rest`, `mcp`), named
/// `name` (a route or method name, never caller text), whose parent is the
/// caller's span when `traceparent` names one.
pub fn request_span(
    surface: &'static str,
    name: &'static str,
    traceparent: Option<&str>,
) -> tracing::Span {
    let span = tracing::info_span!(
        "tether.request",
        otel.name = name,
        otel.kind = "server",
        surface = surface,
    );
    if span.is_disabled() {
        return span;
    }
    if let Some(cx) = traceparent.and_then(remote_context) {
        // Only fails when no OpenTelemetry layer is installed: nothing to do.
        let _ = span.set_parent(cx);
    }
    span
}

/// The `traceparent` header of an HTTP request (the first, when several).
pub fn traceparent_header(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers.get("traceparent").and_then(|v| v.to_str().ok())
}

/// The caller's span named by a W3C `traceparent`
/// (`VERSION-TRACEID-PARENTID-FLAGS`, lower-case hex), as a remote parent;
/// `None` when it does not parse, names the invalid all-zero ids, or is of
/// version `ff`.
pub(crate) fn remote_context(traceparent: &str) -> Option<opentelemetry::Context> {
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
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(parent).ok()?;
    if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
        return None;
    }
    let sampled = u8::from_str_radix(flags, 16).ok()? & 1;
    let cx = SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(sampled),
        true,
        TraceState::default(),
    );
    Some(opentelemetry::Context::new().with_remote_span_context(cx))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_names_its_trace_or_nothing() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let cx = remote_context(good).expect("parses");
        let sc = cx.span().span_context().clone();
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        assert!(sc.is_sampled() && sc.is_remote());
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
