//! `GET /metrics`: the kernel's counters (`Kernel::meters`) in the
//! Prometheus text exposition format (version 0.0.4), on the `/rpc`
//! listener (docs/TELEMETRY.md).
//!
//! Written here rather than through a metrics library: every value is
//! already an atomic the kernel keeps, so the page is one pass over a copy;
//! a registry would only hold a second copy of each.
//!
//! **Owns:** the page, its names and labels, and who may read it.
//! **Never belongs here:** counting (the kernel, atomics only).
//! **Fail-closed rule:** every label value is a manifest id, an outcome of
//! the receipt grammar or a registry code — never request text — so the
//! series are bounded by the cell; with principals configured the page
//! needs a bearer token unless the config opens it (`[telemetry]
//! metrics_auth = false`).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use tether_kernel::meters::{HistogramView, MetersView, BUCKETS_US, OUTCOMES};

/// The content type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The capability label of commands naming one the device does not bind.
const OTHER_CAPABILITY: &str = "_other";

/// Spans the OTLP exporter dropped because its bounded queue was full or
/// the collector did not take them (`tether-cli` counts them here).
pub static SPANS_DROPPED: AtomicU64 = AtomicU64::new(0);

/// Spans the OTLP exporter handed to the collector.
pub static SPANS_EXPORTED: AtomicU64 = AtomicU64::new(0);

/// The page for `view`.
pub fn render(view: &MetersView) -> String {
    let mut out = String::with_capacity(8 * 1024);
    commands(&mut out, view);
    family(
        &mut out,
        "tether_refusals_total",
        "counter",
        "Refusals (rejected receipts and protocol errors of commands), by registry code.",
    );
    for (code, n) in &view.refusals {
        line(&mut out, "tether_refusals_total", &[("code", code)], *n);
    }
    histogram(
        &mut out,
        "tether_decision_seconds",
        "Time of a command's checks (steps 5-11, the policy decision among them).",
        &view.decision,
    );
    histogram(
        &mut out,
        "tether_commit_seconds",
        "From handing an awaited commit to the store to its durable answer.",
        &view.commit,
    );
    histogram(
        &mut out,
        "tether_estop_seconds",
        "From an e-stop's arrival at the kernel to its answer.",
        &view.estop,
    );
    devices(&mut out, view);
    store(&mut out, view);
    telemetry(&mut out);
    out
}

fn commands(out: &mut String, view: &MetersView) {
    family(
        out,
        "tether_commands_total",
        "counter",
        "Commands answered, by device, capability and outcome (the receipt's status; held apart).",
    );
    for d in &view.devices {
        let caps = d
            .capabilities
            .iter()
            .map(String::as_str)
            .chain([OTHER_CAPABILITY]);
        for (row, cap) in caps.enumerate() {
            for (col, outcome) in OUTCOMES.iter().enumerate() {
                let labels = [
                    ("device", d.id.as_str()),
                    ("capability", cap),
                    ("outcome", outcome),
                ];
                line(out, "tether_commands_total", &labels, d.commands(row, col));
            }
        }
    }
}

fn devices(out: &mut String, view: &MetersView) {
    family(
        out,
        "tether_latched_devices",
        "gauge",
        "Devices latched now.",
    );
    let latched = view.devices.iter().filter(|d| d.latched).count();
    line(out, "tether_latched_devices", &[], count(latched));
    family(
        out,
        "tether_device_latched",
        "gauge",
        "1 while the device is latched.",
    );
    for d in &view.devices {
        line(
            out,
            "tether_device_latched",
            &[("device", &d.id)],
            u64::from(d.latched),
        );
    }
    family(
        out,
        "tether_driver_errors_total",
        "counter",
        "Driver calls that ended in an error other than cancellation, by device.",
    );
    for d in &view.devices {
        line(
            out,
            "tether_driver_errors_total",
            &[("device", &d.id)],
            d.driver_errors,
        );
    }
    family(
        out,
        "tether_pending_approvals",
        "gauge",
        "Approvals waiting for a decision.",
    );
    line(out, "tether_pending_approvals", &[], view.pending_approvals);
}

fn store(out: &mut String, view: &MetersView) {
    family(
        out,
        "tether_store_queue_depth",
        "gauge",
        "Commits handed to the store and not answered yet.",
    );
    line(out, "tether_store_queue_depth", &[], view.store_in_flight);
    let Some(s) = view.store else { return };
    family(
        out,
        "tether_store_batches_total",
        "counter",
        "Store transactions (one fsync each for SQLite); commits over batches is the mean batch size.",
    );
    line(out, "tether_store_batches_total", &[], s.batches);
    family(
        out,
        "tether_store_commits_total",
        "counter",
        "Commits the store writer took.",
    );
    line(out, "tether_store_commits_total", &[], s.commits);
    family(
        out,
        "tether_store_largest_batch",
        "gauge",
        "The largest number of commits in one store transaction so far.",
    );
    line(out, "tether_store_largest_batch", &[], s.largest_batch);
}

fn telemetry(out: &mut String) {
    family(
        out,
        "tether_otlp_spans_exported_total",
        "counter",
        "Spans the OTLP exporter handed to the collector.",
    );
    let exported = SPANS_EXPORTED.load(Ordering::Relaxed);
    line(out, "tether_otlp_spans_exported_total", &[], exported);
    family(
        out,
        "tether_otlp_spans_dropped_total",
        "counter",
        "Spans dropped: the export queue was full or the collector did not take them.",
    );
    let dropped = SPANS_DROPPED.load(Ordering::Relaxed);
    line(out, "tether_otlp_spans_dropped_total", &[], dropped);
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn line(out: &mut String, name: &str, labels: &[(&str, &str)], value: u64) {
    out.push_str(name);
    labels_into(out, labels, None);
    let _ = writeln!(out, " {value}");
}

/// `{k="v",...}` (with `le` last when given); nothing for no labels.
fn labels_into(out: &mut String, labels: &[(&str, &str)], le: Option<&str>) {
    if labels.is_empty() && le.is_none() {
        return;
    }
    out.push('{');
    let all = labels.iter().copied().chain(le.map(|v| ("le", v)));
    for (i, (k, v)) in all.enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(k);
        out.push_str("=\"");
        for c in v.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out.push('}');
}

fn histogram(out: &mut String, name: &str, help: &str, h: &HistogramView) {
    family(out, name, "histogram", help);
    let mut cumulative = 0u64;
    for (i, n) in h.buckets.iter().enumerate() {
        cumulative = cumulative.saturating_add(*n);
        let le = BUCKETS_US
            .get(i)
            .map_or_else(|| "+Inf".to_owned(), |us| seconds(*us));
        let _ = write!(out, "{name}_bucket");
        labels_into(out, &[], Some(&le));
        let _ = writeln!(out, " {cumulative}");
    }
    let _ = writeln!(out, "{name}_sum {}", seconds(h.sum_us));
    let _ = writeln!(out, "{name}_count {}", h.count);
}

/// Microseconds as seconds, exactly (no float rounding): `2500` → `0.0025`.
fn seconds(us: u64) -> String {
    let whole = us / 1_000_000;
    let frac = us % 1_000_000;
    if frac == 0 {
        return format!("{whole}");
    }
    let digits = format!("{frac:06}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::seconds;

    #[test]
    fn seconds_are_written_exactly() {
        assert_eq!(seconds(100), "0.0001");
        assert_eq!(seconds(2_500), "0.0025");
        assert_eq!(seconds(1_000_000), "1");
        assert_eq!(seconds(2_500_000), "2.5");
    }
}
