//! The governed stop: every process that shares a store obeys one stop.
//!
//! A trip anywhere — `mhs.safety.estop` in any endpoint, or `tether estop`
//! from a shell — is a latch row in the shared store. Each endpoint runs a
//! watcher thread that polls the store's change token every
//! [`STOP_POLL_MS`] and, when it moves, re-reads the latch rows. A row newer
//! than what this process applied latches the device here too: running
//! operations are cancelled and the native stop runs. A reset row newer than
//! the local latch releases it. The row `*` stands for every device.
//!
//! If the store cannot be read, the watcher marks the stop unreadable: every
//! in-flight call on a physical device is cancelled and new physical calls are
//! refused until a read succeeds again.

use crate::kernel::{Kernel, LatchInfo};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tether_core::receipt::now_ms;
use tether_store::{Commit, EventDraft, LatchRow};

/// Poll interval of the watcher on a local store, ms (PostgreSQL's is its
/// own, behind `LISTEN`: `Store::change_poll_ms`).
pub const STOP_POLL_MS: u64 = 2;
/// The default guaranteed bound of the governed stop, ms: a watcher that
/// has not read the store for this long counts as unable to
/// (`KernelConfig::stop_bound_ms`).
pub const STOP_BOUND_MS_DEFAULT: u64 = 250;
/// How often the guard looks at the watcher, per bound.
const GUARD_TICKS_PER_BOUND: u64 = 10;

// Stale means many polls missed, never one slow poll.
const _: () = assert!(STOP_BOUND_MS_DEFAULT >= 10 * STOP_POLL_MS);
const _: () = assert!(crate::bounds::STOP_BOUND_MS_MIN / GUARD_TICKS_PER_BOUND >= 1);
/// How often, at most, the watcher merges approval writes.
const APPROVAL_SYNC: Duration = Duration::from_millis(crate::approvals::APPROVAL_SYNC_MS);
/// The latch row that stands for every device.
pub const ALL_DEVICES: &str = "*";

/// The newest latch or reset event that applies to a device.
#[derive(Debug, Clone, PartialEq)]
pub struct LatchEvent {
    /// Latched (a trip) or not (a reset).
    pub latched: bool,
    /// When it happened, ms since the epoch.
    pub at_ms: u64,
    /// Why (for trips).
    pub reason: String,
    /// For a reset: whether a human operator made it (`false` when the row
    /// does not say, as rows written before this was recorded).
    pub by_operator: bool,
}

fn event_of(row: &LatchRow) -> LatchEvent {
    let at = |k: &str| row.info.get(k).and_then(Value::as_u64).unwrap_or(0);
    LatchEvent {
        latched: row.latched,
        at_ms: if row.latched {
            at("since_ms")
        } else {
            at("reset_at_ms")
        },
        reason: row
            .info
            .get("reason")
            .and_then(Value::as_str)
            .unwrap_or("governed stop")
            .to_owned(),
        by_operator: row
            .info
            .get("reset_by_operator")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    }
}

/// The newest event among the device's own row and the all-devices row.
pub fn newest_event(rows: &[LatchRow], device_id: &str) -> Option<LatchEvent> {
    rows.iter()
        .filter(|r| r.device_id == device_id || r.device_id == ALL_DEVICES)
        .map(event_of)
        // On a tie a trip wins: when in doubt, stay stopped.
        .max_by_key(|e| (e.at_ms, e.latched))
}

/// The key of a device's arming row. Arming is kept beside the latch, in the
/// same table, under a key no device id can take (`#` is not allowed in one),
/// so every process on the state directory sees it and a restart keeps it.
pub fn arming_key(device_id: &str) -> String {
    format!("#arming/{device_id}")
}

/// Whether the store says the device is armed, and since when (`None`: no
/// row, never set).
pub fn arming_of(rows: &[LatchRow], device_id: &str) -> Option<(bool, u64)> {
    let key = arming_key(device_id);
    rows.iter().find(|r| r.device_id == key).map(|r| {
        let at = r.info.get("at_ms").and_then(Value::as_u64).unwrap_or(0);
        (r.latched, at)
    })
}

/// The arming row of a device: `armed`, who set it, when and why.
pub fn arming_row(device_id: &str, armed: bool, info: Value) -> LatchRow {
    LatchRow {
        device_id: arming_key(device_id),
        latched: armed,
        info,
    }
}

/// A latch row for a trip at `since_ms`.
pub fn trip_row(device_id: &str, since_ms: u64, reason: &str, source: &str) -> LatchRow {
    LatchRow {
        device_id: device_id.to_owned(),
        latched: true,
        info: json!({"since_ms": since_ms, "reason": reason, "source": source}),
    }
}

/// Health of the watcher, read on the path of every physical call.
#[derive(Debug, Default)]
pub struct WatchHealth {
    running: AtomicBool,
    unreadable: AtomicBool,
    last_ok_ms: AtomicU64,
    /// The bound, ms (set when the watcher starts).
    bound_ms: AtomicU64,
}

impl WatchHealth {
    /// Whether a physical call may start: the stop was read recently. Without a
    /// watcher (in-process use with a single kernel) the in-memory latch is
    /// the whole truth.
    pub fn readable(&self) -> bool {
        if !self.running.load(Ordering::SeqCst) {
            return true;
        }
        !self.unreadable.load(Ordering::SeqCst)
            && now_ms().saturating_sub(self.last_ok_ms.load(Ordering::SeqCst))
                <= self.bound_ms.load(Ordering::SeqCst)
    }
}

/// Stops the watcher thread when dropped.
pub struct StopWatcher {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
    guard: Option<std::thread::JoinHandle<()>>,
}

impl Drop for StopWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for h in [self.handle.take(), self.guard.take()]
            .into_iter()
            .flatten()
        {
            let _ = h.join();
        }
    }
}

/// Writes a governed stop into a store directly (what `tether estop` does);
/// returns when it is durable.
///
/// # Errors
/// The store's error: the stop is then not acknowledged.
pub fn trip_in_store(
    store: &dyn tether_store::Store,
    device_id: Option<&str>,
    reason: &str,
    source: &str,
) -> Result<u64, tether_store::StoreError> {
    let since = now_ms();
    let target = device_id.unwrap_or(ALL_DEVICES);
    // Never refused, like every e-stop: a longer reason is cut to the
    // default text bound (no endpoint's config is read here).
    let reason = &crate::bounds::cut(reason, crate::bounds::TEXT_CHARS_MAX_DEFAULT);
    store.commit_blocking(Commit {
        events: vec![EventDraft {
            kind: "safety.estop".into(),
            body: json!({"device_id": target, "reason": reason, "source": source, "pid": std::process::id()}).into(),
        }],
        latches: vec![trip_row(target, since, reason, source)],
        ..Commit::default()
    })?;
    Ok(since)
}

impl Kernel {
    /// Starts the governed-stop watcher. Reactions (cancelling operations and
    /// running native stops) are spawned on `runtime`.
    ///
    /// # Errors
    /// The thread could not be started.
    pub fn start_stop_watcher(
        &self,
        runtime: tokio::runtime::Handle,
    ) -> std::io::Result<StopWatcher> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let kernel = self.clone();
        kernel
            .inner
            .stop_watch
            .last_ok_ms
            .store(now_ms(), Ordering::SeqCst);
        let health = &kernel.inner.stop_watch;
        health
            .bound_ms
            .store(kernel.inner.config.stop_bound_ms, Ordering::SeqCst);
        health.running.store(true, Ordering::SeqCst);
        let handle = std::thread::Builder::new()
            .name("tether-stop-watch".into())
            .spawn(move || kernel.watch_loop(&flag, &runtime))?;
        let kernel = self.clone();
        let flag = stop.clone();
        let guard = std::thread::Builder::new()
            .name("tether-stop-guard".into())
            .spawn(move || kernel.guard_loop(&flag))?;
        Ok(StopWatcher {
            stop,
            handle: Some(handle),
            guard: Some(guard),
        })
    }

    /// The bound kept whatever the store does: a watcher stuck in a read
    /// (a cut link, a stopped database) cannot notice its own silence, so
    /// this thread does, and aborts the physical calls once the stop has
    /// gone unread for longer than the bound.
    fn guard_loop(&self, stop: &AtomicBool) {
        let tick =
            Duration::from_millis((self.inner.config.stop_bound_ms / GUARD_TICKS_PER_BOUND).max(1));
        // Runs for the life of the endpoint; each round sleeps one tick.
        while !stop.load(Ordering::SeqCst) {
            std::thread::sleep(tick);
            if !self.inner.stop_watch.readable() {
                self.stop_unreadable("the governed stop was not read within its bound");
            }
        }
    }

    fn watch_loop(&self, stop: &AtomicBool, runtime: &tokio::runtime::Handle) {
        let mut last_token: Option<u64> = None;
        let mut approvals_synced = Instant::now();
        let mut approvals_behind = false;
        // Runs for the life of the endpoint; each round sleeps one poll interval.
        let poll = Duration::from_millis(self.inner.store.change_poll_ms().max(1));
        while !stop.load(Ordering::SeqCst) {
            // Woken early by a backend that hears of commits (LISTEN).
            self.inner.store.wait_change(poll);
            let health = &self.inner.stop_watch;
            let token = match self.inner.store.change_token() {
                Ok(t) => t,
                Err(e) => {
                    self.stop_unreadable(&e.to_string());
                    continue;
                }
            };
            if approvals_behind && approvals_synced.elapsed() >= APPROVAL_SYNC {
                // Other processes' holds and votes, and who else is on the
                // store, at most every 100 ms.
                self.sync_approvals();
                self.refresh_fleet();
                approvals_synced = Instant::now();
                approvals_behind = false;
            }
            if last_token == Some(token) {
                health.last_ok_ms.store(now_ms(), Ordering::SeqCst);
                health.unreadable.store(false, Ordering::SeqCst);
                continue;
            }
            approvals_behind = true;
            // What other processes wrote: this process's own rows are in
            // its memory already.
            match self.inner.store.latches_committed() {
                Ok(rows) => {
                    last_token = Some(token);
                    health.last_ok_ms.store(now_ms(), Ordering::SeqCst);
                    health.unreadable.store(false, Ordering::SeqCst);
                    self.apply_latch_rows(&rows, runtime);
                }
                Err(e) => self.stop_unreadable(&e.to_string()),
            }
        }
        self.inner.stop_watch.running.store(false, Ordering::SeqCst);
    }

    /// The stop cannot be read: abort in-flight physical calls.
    fn stop_unreadable(&self, why: &str) {
        let was = self
            .inner
            .stop_watch
            .unreadable
            .swap(true, Ordering::SeqCst);
        if was {
            return;
        }
        tracing::error!(
            error = why,
            "the governed stop cannot be read; physical calls are aborted and refused"
        );
        for (d, dev) in self.inner.devices.iter().enumerate() {
            if dev.spec.manifest.mode.is_physical() {
                self.cancel_device_ops(d, "governed stop unreadable");
            }
        }
    }

    /// Applies store rows newer than what this process knows.
    fn apply_latch_rows(&self, rows: &[LatchRow], runtime: &tokio::runtime::Handle) {
        for dev in &self.inner.devices {
            // Arming set by another process (or `tether disarm` against it):
            // a disarm applies at once; an arm too, since only an operator
            // could have written it.
            if let Some((armed, at_ms)) = arming_of(rows, dev.id()) {
                let newer = at_ms > dev.arming_ms.load(Ordering::SeqCst);
                if newer && dev.spec.manifest.mode.is_physical() {
                    dev.arming_ms.store(at_ms, Ordering::SeqCst);
                    dev.armed.store(armed, Ordering::SeqCst);
                }
            }
        }
        for (d, dev) in self.inner.devices.iter().enumerate() {
            let Some(ev) = newest_event(rows, dev.id()) else {
                continue;
            };
            let known = dev.latch_event_ms.load(Ordering::SeqCst);
            if ev.at_ms <= known {
                continue;
            }
            dev.latch_event_ms.store(ev.at_ms, Ordering::SeqCst);
            let latched = dev.latched.load(Ordering::SeqCst);
            if ev.latched && !latched {
                let kernel = self.clone();
                runtime.spawn(async move { kernel.trip_observed(d, ev).await });
            } else if !ev.latched && latched {
                self.release_observed(d, &ev);
            }
        }
    }

    /// A trip made elsewhere: latch here, cancel, run the native stop.
    async fn trip_observed(&self, d: usize, ev: LatchEvent) {
        let dev = &self.inner.devices[d];
        let t0 = Instant::now();
        dev.estop_epoch.fetch_add(1, Ordering::SeqCst);
        if dev.latched.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Ok(mut l) = dev.latch.lock() {
            *l = LatchInfo {
                since_ms: ev.at_ms,
                reason: ev.reason.clone(),
                durable: true,
            };
        }
        let cancelled = self.cancel_device_ops(d, &ev.reason);
        // From the trip (its row's time) to this endpoint's latch and the
        // cancel of its calls: the fleet stop's propagation.
        let cancel_delay_ms = now_ms().saturating_sub(ev.at_ms);
        // As a local e-stop does: consent given before the trip is withdrawn.
        let revoked_permits = self.revoke_permits(d);
        let revoked_approvals = self.revoke_approvals(dev.id());
        let revoked_approval_ids: Vec<String> = revoked_approvals
            .iter()
            .map(|r| r.approval_id.clone())
            .collect();
        dev.stop_confirmed.store(false, Ordering::SeqCst);
        let path = self.run_stop_path(d, t0, &ev.reason, None).await;
        dev.stop_confirmed.store(path.is_ok(), Ordering::SeqCst);
        let failure = path
            .as_ref()
            .err()
            .map(|f| json!({"reason": f.reason, "message": f.message}));
        let delay_ms = now_ms().saturating_sub(ev.at_ms);
        self.record(Commit {
            events: vec![EventDraft {
                kind: "safety.estop.observed".into(),
                body: json!({"device_id": dev.id(), "reason": ev.reason, "tripped_at_ms": ev.at_ms, "observed_delay_ms": delay_ms, "cancel_delay_ms": cancel_delay_ms, "cancelled_operations": cancelled, "stop_path_failure": failure, "revoked_permits": revoked_permits, "revoked_approvals": revoked_approval_ids}).into(),
            }],
            approvals: revoked_approvals,
            ..Commit::default()
        });
        if path.is_err() {
            self.spawn_stop_retry(d, String::new());
        }
    }

    /// A reset made elsewhere: release the local latch unless operations that
    /// ignored cancellation are still running (then it stays until a local reset).
    fn release_observed(&self, d: usize, ev: &LatchEvent) {
        let dev = &self.inner.devices[d];
        if !self.running_on(d).is_empty() {
            return;
        }
        // Here the device may be hardware where the other process serves it
        // as simulated (configs that disagree): only an operator's reset may
        // release a physical latch, whoever wrote the row. A terminal stop
        // that ran here keeps its latch for this endpoint's life (CORE-087),
        // and a native stop still in flight here blocks any release.
        let refused = if dev.terminated.load(Ordering::SeqCst) {
            Some("terminal_estop")
        } else if dev.stops_in_flight.load(Ordering::SeqCst) > 0 {
            Some("stop_path_pending")
        } else if dev.spec.manifest.mode.is_physical() && !ev.by_operator {
            Some("operator_required")
        } else {
            None
        };
        if let Some(reason) = refused {
            self.record(Commit {
                events: vec![EventDraft {
                    kind: "safety.reset.observed".into(),
                    body: json!({"device_id": dev.id(), "reset_at_ms": ev.at_ms, "applied": false, "reason": reason}).into(),
                }],
                ..Commit::default()
            });
            tracing::warn!(
                device_id = dev.id(),
                reason,
                "a reset made in another process was not applied to this latch"
            );
            return;
        }
        dev.latched.store(false, Ordering::SeqCst);
        if let Ok(mut l) = dev.latch.lock() {
            *l = LatchInfo::default();
        }
        self.record(Commit {
            events: vec![EventDraft {
                kind: "safety.reset.observed".into(),
                body: json!({"device_id": dev.id(), "reset_at_ms": ev.at_ms}).into(),
            }],
            ..Commit::default()
        });
    }
}
