//! `[telemetry]` (issue 22 §2, docs/TELEMETRY.md): traces over OTLP
//! (HTTP/protobuf or gRPC) when `otlp_endpoint` is set, and who may read
//! `GET /metrics`.
//!
//! The spans are records of Tether's own (`tether_kernel::trace`); this
//! module installs the log subscriber and, with an endpoint, starts the
//! exporter (`tether_server::telemetry::otlp`: a bounded queue of its own,
//! so a collector that is down never slows a command) that the kernel is
//! then given as its tracer.

use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;
use tether_server::telemetry::otlp::{Exporter, Protocol};

/// Most spans waiting for export (default of `export_queue_max`).
pub const EXPORT_QUEUE_DEFAULT: usize = 8192;
/// The largest `export_queue_max`.
pub const EXPORT_QUEUE_MAX: usize = 65_536;
/// Default of `export_timeout_ms`; its bounds.
pub const EXPORT_TIMEOUT_MS_DEFAULT: u64 = 2_000;
const EXPORT_TIMEOUT_MS_RANGE: std::ops::RangeInclusive<u64> = 10..=60_000;

/// The `[telemetry]` table. Every key is optional; unknown keys are refused.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The OTLP collector (`http://host:4318`, or the full `.../v1/traces`
    /// URL, over HTTP; `http://host:4317` over gRPC); traces are off when
    /// absent.
    pub otlp_endpoint: Option<String>,
    /// `http/protobuf` (the default) or `grpc`.
    pub otlp_protocol: Option<String>,
    /// `service.name` of the spans (default `tether`).
    pub service_name: Option<String>,
    /// Spans waiting for export at most; more are dropped and counted
    /// (default 8192).
    pub export_queue_max: Option<usize>,
    /// Bound on connecting to, sending to and hearing from the collector, ms
    /// (default 2000).
    pub export_timeout_ms: Option<u64>,
    /// The share of the traces Tether starts itself that are recorded, 0 to
    /// 1 (default 1); a request with a `traceparent` follows its caller.
    pub sample_ratio: Option<f64>,
    /// Whether `GET /metrics` needs a bearer token when principals are
    /// configured (default true).
    pub metrics_auth: Option<bool>,
}

impl TelemetryConfig {
    /// Every key that cannot be used, as `(field, message)`.
    pub fn defects(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        // With a protocol that is not offered, the endpoint is still read
        // as an HTTP one, so its other defects are named too (the rule only
        // gRPC adds, no path, is left out).
        let protocol = self.protocol().unwrap_or_else(|why| {
            out.push(("telemetry.otlp_protocol".into(), why));
            Protocol::HttpProtobuf
        });
        if let Some(e) = &self.otlp_endpoint {
            if let Err(why) = tether_server::telemetry::otlp::check_endpoint(e, protocol) {
                out.push(("telemetry.otlp_endpoint".into(), why));
            }
        }
        if let Some(r) = self.sample_ratio {
            if !(0.0..=1.0).contains(&r) {
                out.push((
                    "telemetry.sample_ratio".into(),
                    "must be between 0 and 1".into(),
                ));
            }
        }
        if let Some(n) = self.export_queue_max {
            if !(1..=EXPORT_QUEUE_MAX).contains(&n) {
                out.push((
                    "telemetry.export_queue_max".into(),
                    format!("must be between 1 and {EXPORT_QUEUE_MAX}"),
                ));
            }
        }
        if let Some(ms) = self.export_timeout_ms {
            if !EXPORT_TIMEOUT_MS_RANGE.contains(&ms) {
                out.push((
                    "telemetry.export_timeout_ms".into(),
                    format!(
                        "must be between {} and {} (ms)",
                        EXPORT_TIMEOUT_MS_RANGE.start(),
                        EXPORT_TIMEOUT_MS_RANGE.end()
                    ),
                ));
            }
        }
        out
    }

    /// The protocol `otlp_protocol` names (HTTP/protobuf when absent).
    ///
    /// # Errors
    /// A name that is not offered.
    pub fn protocol(&self) -> Result<Protocol, String> {
        self.otlp_protocol
            .as_deref()
            .map_or(Ok(Protocol::HttpProtobuf), Protocol::parse)
    }

    /// Whether `GET /metrics` is served without a token.
    pub fn metrics_open(&self) -> bool {
        self.metrics_auth == Some(false)
    }
}

/// Keeps the span exporter; dropping it flushes what is queued (bounded
/// by the export timeout) and stops the export thread.
pub struct Guard {
    exporter: Option<(Arc<Exporter>, Duration)>,
}

impl Guard {
    /// The kernel's tracer, when traces are exported.
    pub fn tracer(&self) -> Option<tether_kernel::trace::TraceSink> {
        self.exporter
            .as_ref()
            .map(|(e, _)| tether_kernel::trace::TraceSink(Arc::clone(e) as _))
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some((e, wait)) = self.exporter.take() {
            e.shutdown(wait);
        }
    }
}

/// The log layer (stderr, `TETHER_LOG`) and, with `otlp_endpoint`, the
/// span exporter.
///
/// # Errors
/// The exporter could not be started, or a subscriber is already installed.
pub fn init(config: &TelemetryConfig, log_default: &str) -> anyhow::Result<Guard> {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let log_filter = tracing_subscriber::EnvFilter::try_from_env("TETHER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(log_default));
    let log = log_layer(log_filter, json_logs());
    tracing_subscriber::registry().with(log).try_init()?;
    let Some(endpoint) = &config.otlp_endpoint else {
        return Ok(Guard { exporter: None });
    };
    let timeout = Duration::from_millis(
        config
            .export_timeout_ms
            .unwrap_or(EXPORT_TIMEOUT_MS_DEFAULT),
    );
    let otlp = tether_server::telemetry::otlp::Otlp {
        endpoint: endpoint.clone(),
        protocol: config.protocol().map_err(anyhow::Error::msg)?,
        service_name: config
            .service_name
            .clone()
            .unwrap_or_else(|| "tether".into()),
        queue_max: config
            .export_queue_max
            .unwrap_or(EXPORT_QUEUE_DEFAULT)
            .max(1),
        sample_ratio: config.sample_ratio.unwrap_or(1.0),
        timeout,
    };
    let exporter = Exporter::start(&otlp).map_err(anyhow::Error::msg)?;
    Ok(Guard {
        exporter: Some((Arc::new(exporter), timeout)),
    })
}

/// Whether `TETHER_LOG_FORMAT=json` asks for one JSON object a line.
fn json_logs() -> bool {
    std::env::var("TETHER_LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json"))
}

/// The log layer on stderr (stdout belongs to the stdio protocols): text, or
/// with `json` one JSON object a line (time, level, target, message and the
/// fields of the event and its spans — which never hold a token or a raw
/// input value).
fn log_layer(
    filter: tracing_subscriber::EnvFilter,
    json: bool,
) -> Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync> {
    use tracing_subscriber::Layer as _;
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    if json {
        fmt.json().with_filter(filter).boxed()
    } else {
        fmt.with_filter(filter).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_protocols_endpoints_and_bounds_are_defects() {
        let c = TelemetryConfig {
            otlp_endpoint: Some("https://collector".into()),
            otlp_protocol: Some("http/json".into()),
            export_queue_max: Some(0),
            ..TelemetryConfig::default()
        };
        let fields: Vec<_> = c.defects().into_iter().map(|(f, _)| f).collect();
        assert_eq!(
            fields,
            [
                "telemetry.otlp_protocol",
                "telemetry.otlp_endpoint",
                "telemetry.export_queue_max"
            ]
        );
        let c = TelemetryConfig {
            otlp_endpoint: Some("https://collector".into()),
            ..TelemetryConfig::default()
        };
        let fields: Vec<_> = c.defects().into_iter().map(|(f, _)| f).collect();
        assert_eq!(fields, ["telemetry.otlp_endpoint"]);
    }

    #[test]
    fn grpc_is_offered_and_its_endpoint_names_no_path() {
        let grpc = |endpoint: &str| TelemetryConfig {
            otlp_endpoint: Some(endpoint.into()),
            otlp_protocol: Some("grpc".into()),
            ..TelemetryConfig::default()
        };
        assert!(grpc("http://127.0.0.1:4317").defects().is_empty());
        assert!(grpc("http://collector:4317/").defects().is_empty());
        let defects = grpc("http://collector:4317/v1/traces").defects();
        assert_eq!(defects.len(), 1, "{defects:?}");
        assert_eq!(defects[0].0, "telemetry.otlp_endpoint");
        assert!(defects[0].1.contains("gRPC"), "{defects:?}");
        assert_eq!(grpc("http://c:4317").protocol(), Ok(Protocol::Grpc));
        assert_eq!(
            TelemetryConfig::default().protocol(),
            Ok(Protocol::HttpProtobuf)
        );
    }
}
