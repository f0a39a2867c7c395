//! The bounds per caller in the endpoint config: the `[limits]` table (what
//! one principal, and the endpoint, may hold open in the kernel, and the
//! text bound) and the MCP session bounds of `[http]`; checked at load, each
//! defect naming its key.
//!
//! **Owns:** [`LimitsConfig`], turning it and `[http]`'s session bounds into
//! the kernel's and the MCP surface's settings, and their check.
//! **Never belongs here:** the defaults and relations themselves
//! (`tether_kernel::bounds`, `tether_server::mcp::http::SessionBounds`), and
//! counting anything (the kernel and the surfaces do).

use crate::config::{EndpointConfig, HttpConfig};
use serde::Deserialize;
use tether_kernel::KernelConfig;
use tether_server::mcp::http::SessionBounds;

/// The `[limits]` table: every key is optional; an absent one keeps the
/// kernel's default (`tether_kernel::bounds`).
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Open approvals on the endpoint, at most (default 1,024).
    pub approvals_open_max: Option<usize>,
    /// Open approvals of one principal, at most (default 64; at most half of
    /// `approvals_open_max`).
    pub approvals_open_per_principal_max: Option<usize>,
    /// Outstanding permits on the endpoint, at most (default 4,096).
    pub permits_max: Option<usize>,
    /// Outstanding permits of one principal, at most (default 256; at most
    /// half of `permits_max`).
    pub permits_per_principal_max: Option<usize>,
    /// Longest free text (reasons), characters (default 1,024, 512..=65,536).
    pub text_chars_max: Option<usize>,
    /// Completed command ids (with their receipts' digests) the kernel keeps
    /// in memory for replay checks (default 50,000, about 170 bytes each;
    /// 1..=10,000,000). An id beyond it is looked up in the store, so it is
    /// still replayed, never run again.
    pub idempotency_cache_max: Option<usize>,
    /// Finished REST invocations kept in memory (default 10,000, about
    /// 1.5 KB each; 1..=1,000,000). Older ones are read from the store.
    pub rest_finished_max: Option<usize>,
}

/// Largest `idempotency_cache_max` a config may set.
pub const IDEMPOTENCY_CACHE_LIMIT: usize = 10_000_000;

impl LimitsConfig {
    /// Sets the kernel settings this table names.
    pub fn apply(&self, k: &mut KernelConfig) {
        let set = |slot: &mut usize, v: Option<usize>| {
            if let Some(v) = v {
                *slot = v;
            }
        };
        set(&mut k.approvals_open_max, self.approvals_open_max);
        set(
            &mut k.approvals_open_per_principal_max,
            self.approvals_open_per_principal_max,
        );
        set(&mut k.permits_max, self.permits_max);
        set(
            &mut k.permits_per_principal_max,
            self.permits_per_principal_max,
        );
        set(&mut k.text_chars_max, self.text_chars_max);
        set(&mut k.idempotency_cache_max, self.idempotency_cache_max);
    }

    /// The defects of the memory bounds this table names.
    fn memory_defects(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (key, value, limit) in [
            (
                "idempotency_cache_max",
                self.idempotency_cache_max,
                IDEMPOTENCY_CACHE_LIMIT,
            ),
            (
                "rest_finished_max",
                self.rest_finished_max,
                tether_server::rest::FINISHED_MAX_LIMIT,
            ),
        ] {
            if let Some(v) = value.filter(|v| !(1..=limit).contains(v)) {
                out.push(format!("limits.{key} = {v}: must be 1..={limit}"));
            }
        }
        out
    }
}

/// Finished REST invocations kept in memory (`[limits] rest_finished_max`).
pub fn rest_finished_max(config: &EndpointConfig) -> usize {
    config
        .limits
        .rest_finished_max
        .unwrap_or(tether_server::rest::FINISHED_MAX_DEFAULT)
}

/// The MCP session bounds `[http]` names (the defaults where it does not).
pub fn mcp_sessions(http: &HttpConfig) -> SessionBounds {
    SessionBounds {
        total_max: http
            .mcp_sessions_max
            .unwrap_or(SessionBounds::STANDARD.total_max),
        per_principal_max: http
            .mcp_sessions_per_principal_max
            .unwrap_or(SessionBounds::STANDARD.per_principal_max),
    }
}

/// Every defect of the config's bounds, one line each naming the keys: a
/// value out of range, or a per-principal bound with which one principal
/// could reach the endpoint's bound alone.
pub fn defects(config: &EndpointConfig) -> Vec<String> {
    let mut kernel = KernelConfig::standard("-");
    config.limits.apply(&mut kernel);
    let mut defects = tether_kernel::bounds::check(&kernel);
    defects.extend(config.limits.memory_defects());
    defects.extend(mcp_sessions(&config.http).check());
    defects
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_table_keeps_the_defaults_and_a_greedy_share_is_a_defect() {
        let none: EndpointConfig = toml::from_str("builtin_cell = true").expect("config");
        assert!(defects(&none).is_empty());
        let greedy: EndpointConfig = toml::from_str(
            "builtin_cell = true\n[limits]\npermits_max = 10\npermits_per_principal_max = 6\n[http]\nmcp_sessions_max = 8\nmcp_sessions_per_principal_max = 5\n",
        )
        .expect("config");
        let d = defects(&greedy);
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(d[0].contains("limits.permits_per_principal_max"), "{d:?}");
        assert!(
            d[1].contains("http.mcp_sessions_per_principal_max"),
            "{d:?}"
        );
    }

    #[test]
    fn an_unknown_key_is_refused() {
        assert!(toml::from_str::<EndpointConfig>("[limits]\npermit_max = 3\n").is_err());
    }
}
