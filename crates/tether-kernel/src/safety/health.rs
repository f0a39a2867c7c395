//! Endpoint health: what `GET /healthz` answers — whether the store takes
//! writes and whether every physical device is reachable.
//!
//! **Owns:** [`StoreHealth`] (the outcome of the kernel's awaited commits,
//! and a probe write at most every [`HEALTH_PROBE_FRESH_MS`]), and
//! [`Kernel::health`].
//! **Never belongs here:** the HTTP answer (`tether-server`), the links
//! themselves (the drivers'; their wire shape is `link.rs`'s).
//! **Fail-closed rule:** unknown is not healthy. The store counts as writable
//! only while the last probe made a real row durable within
//! [`HEALTH_PROBE_WAIT_MS`], no awaited commit has failed since, and the
//! governed stop is readable; a physical device counts as reachable only
//! while its driver reports its link connected (or reports no link at all:
//! an in-process simulator has nothing to lose).
//!
//! The hot path pays one relaxed load per awaited commit (a failure flag
//! that is almost always clear); the probe runs on `/healthz`'s own task, at
//! most once per [`HEALTH_PROBE_FRESH_MS`] whoever asks and however often.

use crate::kernel::Kernel;
use crate::safety::link::link_json;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tether_core::receipt::now_ms;
use tether_store::{Commit, LatchRow, StoreError};

/// A probe's outcome is reused for this long, ms: however often `/healthz`
/// is asked, the store takes at most one probe write per period.
pub const HEALTH_PROBE_FRESH_MS: u64 = 1000;
/// Longest a probe waits for its write to become durable, ms; a store slower
/// than that counts as not writable.
pub const HEALTH_PROBE_WAIT_MS: u64 = 500;

// A probe's answer must come before the next one is due, so probes never
// pile up behind a slow store.
const _: () = assert!(HEALTH_PROBE_WAIT_MS < HEALTH_PROBE_FRESH_MS);

/// The key of an endpoint's probe row, beside the latches under a key no
/// device id can take (`#` is not allowed in one), as arming rows are.
fn probe_key(endpoint_id: &str) -> String {
    format!("#health/{endpoint_id}")
}

/// What the kernel knows of the store's writes.
#[derive(Debug, Default)]
pub(crate) struct StoreHealth {
    /// Set when an awaited commit failed for a store-level reason; cleared by
    /// the next commit (or probe) that succeeds.
    failed: AtomicBool,
    failure: Mutex<String>,
    /// The last probe: when, and its error if it failed.
    probe: tokio::sync::Mutex<Option<(Instant, Option<String>)>>,
}

/// Whether a commit's error says the store cannot take writes (a conflict,
/// an invalid commit or a budget draw over its cap is that commit's own
/// fault, not the store's).
fn store_level(e: &StoreError) -> bool {
    !matches!(
        e,
        StoreError::Conflict(_) | StoreError::Invalid(_) | StoreError::BudgetExceeded(_)
    )
}

impl StoreHealth {
    /// Notes the outcome of an awaited commit. On success this is one
    /// relaxed load unless a failure is on record.
    pub(crate) fn observe<T>(&self, r: &Result<T, StoreError>) {
        match r {
            Ok(_) => {
                if self.failed.load(Ordering::Relaxed) {
                    self.failed.store(false, Ordering::SeqCst);
                }
            }
            Err(e) if store_level(e) => {
                if let Ok(mut f) = self.failure.lock() {
                    *f = e.to_string();
                }
                self.failed.store(true, Ordering::SeqCst);
            }
            Err(_) => {}
        }
    }

    fn failure(&self) -> Option<String> {
        if !self.failed.load(Ordering::SeqCst) {
            return None;
        }
        Some(
            self.failure
                .lock()
                .map(|f| f.clone())
                .unwrap_or_else(|_| "a commit failed".into()),
        )
    }
}

/// The endpoint's health: `ok` only while the store is writable and every
/// physical device is reachable; `body` says what is wrong.
#[derive(Debug, Clone)]
pub struct Health {
    /// Healthy: `GET /healthz` answers 200, else 503.
    pub ok: bool,
    /// `{ok, uptime_s, store: {writable, error}, unreachable: [...]}`.
    pub body: Value,
}

impl Kernel {
    /// The endpoint's health (`GET /healthz`). Bounded: at most
    /// [`HEALTH_PROBE_WAIT_MS`] for the store probe, plus a wait of the same
    /// bound for a probe another caller is running.
    pub async fn health(&self) -> Health {
        let store = self.store_writable().await;
        let unreachable: Vec<Value> = self
            .inner
            .devices
            .iter()
            .filter(|dev| dev.spec.manifest.mode.is_physical())
            .filter_map(|dev| {
                let link = dev.driver.link().filter(|l| !l.connected)?;
                Some(json!({"device_id": dev.id(), "mode": dev.spec.manifest.mode.as_str(), "link": link_json(Some(&link))}))
            })
            .collect();
        let ok = store.is_ok() && unreachable.is_empty();
        let body = json!({
            "ok": ok,
            "uptime_s": self.uptime_s(),
            "store": {"writable": store.is_ok(), "error": store.err(), "unrecorded_outcomes": self.owed_outcomes()},
            "unreachable": unreachable,
        });
        Health { ok, body }
    }

    /// Whether the store takes writes now (see the module's rule).
    async fn store_writable(&self) -> Result<(), String> {
        let wait = Duration::from_millis(HEALTH_PROBE_WAIT_MS);
        let health = &self.inner.store_health;
        if let Some(why) = self.store_closed() {
            return Err(why);
        }
        if !self.inner.stop_watch.readable() {
            return Err("the governed stop cannot be read from the store".into());
        }
        let Ok(mut last) = tokio::time::timeout(wait, health.probe.lock()).await else {
            return Err("another health probe of the store is still waiting".into());
        };
        let fresh = Duration::from_millis(HEALTH_PROBE_FRESH_MS);
        if last.as_ref().is_none_or(|(at, _)| at.elapsed() >= fresh) {
            let outcome = self.probe_store(wait).await;
            *last = Some((Instant::now(), outcome.err()));
        }
        if let Some((_, Some(e))) = last.as_ref() {
            return Err(e.clone());
        }
        health.failure().map_or(Ok(()), Err)
    }

    /// One probe write: this endpoint's probe row, made durable within `wait`.
    async fn probe_store(&self, wait: Duration) -> Result<(), String> {
        let row = LatchRow {
            device_id: probe_key(&self.inner.config.endpoint_id),
            latched: false,
            info: json!({"probe_at_ms": now_ms()}),
        };
        let commit = Commit {
            latches: vec![row],
            ..Commit::default()
        };
        match tokio::time::timeout(wait, self.commit(commit)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "a probe write was not durable within {} ms",
                wait.as_millis()
            )),
        }
    }
}
