//! Start-up on a store that cannot be opened or written: the kernel serves
//! tripped while a background thread keeps trying to open its store.
//!
//! **Owns:** [`Kernel::start_deferred`] (the first attempt, bounded), the
//! start-up trip of every device, the opener thread and its backoff, and
//! what the kernel says of a store that is not open ([`OpenState`]).
//! **Never belongs here:** opening a store (the caller's [`OpenStore`]; the
//! kernel knows no SQL), what a restore reads (`start.rs`).
//! **Bounds:** the store's open ([`START_OPEN_WAIT_MS`]); the restore's
//! first stage, the writes a lock stops and the devices' state
//! ([`START_RESTORE_WAIT_MS`]); the rest of the restore, reads linear in
//! the store, which a large store on a loaded machine may need longer for
//! ([`START_RESTORE_READ_MS`], the endpoint serving untripped meanwhile
//! with the store not open).
//! **Fail-closed rule:** a store that does not answer at start-up never
//! lets anything act: every device is latched in memory (seeds/000: a
//! runtime whose state cannot be read at start-up starts tripped) and only
//! stops, reads, status and health are served. Once the store opens, its
//! state is restored (orphans reconciled into crashed finishes, latches,
//! receipts, budgets, approvals) and the start-up trip is made durable
//! before any call reaches the store; the trip stays latched until an
//! operator resets each device, since nobody watched the cell while the
//! endpoint could not record. An integrity defect (a corrupt chain, a newer
//! schema) refuses the start, or, found only later, ends the retries and
//! keeps the trip.

use crate::kernel::{Kernel, LatchInfo};
use crate::loader::Cell;
use crate::safety::governed::trip_row;
use crate::{Driver, KernelConfig, StartError};
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tether_core::receipt::now_ms;
use tether_store::deferred::DeferredStore;
use tether_store::{Commit, EventDraft, Store, StoreError};

/// One attempt to open the real store.
pub type OpenStore = Box<dyn FnMut() -> Result<Arc<dyn Store>, StoreError> + Send>;

/// Longest the start waits for the first attempt's open (a fresh database
/// may wait out another process's lock once, up to the store's own busy
/// timeout of 5 s).
pub const START_OPEN_WAIT_MS: u64 = 10_000;
/// Longest the start waits, once the store opened, for the restore's first
/// stage: the leases taken and the orphaned operations reconciled (the
/// restore's writes, which wait for the store's write lock) and each
/// device's latch and revisions read. A healthy disk takes milliseconds, a
/// store locked by another process does not answer; the endpoint then
/// serves tripped while the attempt goes on.
pub const START_RESTORE_WAIT_MS: u64 = 2_000;
/// Longest the rest of the restore may take once its first stage is done:
/// reading the idempotency index (up to `idempotency_cache_max` receipt
/// digests), the budget window's draws and every approval record, then
/// writing `endpoint.start`. That work is linear in the store, so a large
/// store on a loaded machine may outlast [`START_RESTORE_WAIT_MS`]; it is
/// not a lock. Past that wait the endpoint serves with its devices as the
/// store left them and the store not open yet (stops, reads, status and
/// health; nothing reaches a device that needs the store), and only a
/// restore that fails, or outlasts this bound, trips every device.
pub const START_RESTORE_READ_MS: u64 = 60_000;
/// First delay before another attempt to open the store.
const OPEN_RETRY_DELAY_FIRST: Duration = Duration::from_millis(250);
/// Longest delay between two attempts (the delay doubles up to it).
const OPEN_RETRY_DELAY_MAX: Duration = Duration::from_secs(5);
/// Granularity of the opener's sleep, so a stop request is seen promptly.
const OPEN_SLEEP_STEP: Duration = Duration::from_millis(50);
/// The source of a start-up trip, in its latch row.
pub const SOURCE_STORE_AT_START: &str = "store_unavailable_at_start";

const _: () = assert!(OPEN_RETRY_DELAY_FIRST.as_millis() <= OPEN_RETRY_DELAY_MAX.as_millis());
const _: () = assert!(START_RESTORE_WAIT_MS <= START_OPEN_WAIT_MS);
const _: () = assert!(START_RESTORE_WAIT_MS <= START_RESTORE_READ_MS);

/// Whether the kernel's store is open, and if not why (status and health).
#[derive(Debug, Default)]
pub(crate) struct OpenState {
    closed: Mutex<Option<String>>,
}

impl OpenState {
    fn set_closed(&self, why: &str) {
        if let Ok(mut c) = self.closed.lock() {
            *c = Some(why.to_owned());
        }
    }

    fn set_open(&self) {
        if let Ok(mut c) = self.closed.lock() {
            *c = None;
        }
    }

    /// `Some(why)` while the store is not open.
    pub(crate) fn closed(&self) -> Option<String> {
        self.closed.lock().map_or_else(
            |_| Some("the store's state cannot be read".into()),
            |c| c.clone(),
        )
    }
}

/// Where the first attempt stands, shared by the start and the opener.
#[derive(Debug)]
enum Phase {
    /// The store is being opened.
    Opening,
    /// The store opened; the restore's first stage (its writes, which
    /// wait for the store's write lock, and the devices' state) runs.
    Restoring,
    /// The first stage is done since the instant held; the rest of the
    /// state (index, budgets, approvals) is being read.
    Reading(Instant),
    /// As `Reading`, and the start stopped waiting for it: the endpoint
    /// serves untripped with the store not open, and a watchdog trips
    /// every device if the restore fails or outlasts
    /// [`START_RESTORE_READ_MS`] from the instant held.
    Late(Instant),
    /// The first attempt failed (the opener goes on unless it is an
    /// integrity defect).
    Failed(StoreError),
    /// The start gave up waiting and tripped every device.
    Tripped,
    /// The store is open and restored.
    Open,
}

struct Gate {
    phase: Mutex<Phase>,
    changed: Condvar,
}

/// Stops the opener's retries when dropped (the thread is not joined: an
/// attempt in progress may wait out a lock, and the endpoint's exit must
/// not wait for it).
pub struct StoreOpener {
    stop: Arc<AtomicBool>,
}

impl Drop for StoreOpener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// A kernel started by [`Kernel::start_deferred`].
pub struct DeferredStart {
    /// The kernel, serving.
    pub kernel: Kernel,
    /// `Some(why)`: the store did not open in time; every device is latched
    /// and the opener keeps trying.
    pub tripped: Option<String>,
    /// The store opened and took its writes but its state is still being
    /// read (a large store): the endpoint serves untripped, and the store
    /// opens when the restore ends ([`START_RESTORE_READ_MS`]).
    pub restoring: bool,
    /// The opener's handle: keep it for the life of the endpoint.
    pub opener: StoreOpener,
}

/// How the start's wait for the first attempt ended.
enum Waited {
    /// The store is open and restored.
    Open,
    /// Every device is tripped, for this reason.
    Tripped(String),
    /// The restore took its writes and is still reading; it goes on.
    Late,
}

/// Whether a store error is an integrity defect (never healed by waiting).
fn integrity(e: &StoreError) -> bool {
    // A device another live endpoint owns is one too: the start refuses.
    matches!(
        e,
        StoreError::Corrupt(_) | StoreError::Unsupported(_) | StoreError::LeaseHeld(_)
    )
}

impl Kernel {
    /// Starts a kernel whose store `open` opens, in a background thread.
    /// When the first attempt opens and restores within its bounds
    /// ([`START_OPEN_WAIT_MS`], then [`START_RESTORE_WAIT_MS`]) the kernel
    /// starts as [`Kernel::new`] would; when it fails or does not answer in
    /// time, every device is latched in memory and the kernel serves stops,
    /// reads, status and health while the thread tries again with a
    /// bounded backoff until the store opens.
    ///
    /// # Errors
    /// What [`Kernel::new`] refuses for the cell; an integrity defect of the
    /// store ([`StoreError::Corrupt`], [`StoreError::Unsupported`]) found
    /// by the first attempt.
    pub fn start_deferred(
        config: KernelConfig,
        cell: Cell,
        drivers: HashMap<String, Arc<dyn Driver>>,
        open: OpenStore,
    ) -> Result<DeferredStart, StartError> {
        let seat = Arc::new(DeferredStore::new("it is being opened", true));
        let kernel = Kernel::assemble(&Kernel::compile(config, cell)?, drivers, seat.clone())?;
        kernel
            .inner
            .store_open
            .set_closed("the evidence store is being opened");
        let gate = Arc::new(Gate {
            phase: Mutex::new(Phase::Opening),
            changed: Condvar::new(),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let opener = StoreOpener { stop: stop.clone() };
        {
            let (kernel, gate) = (kernel.clone(), gate.clone());
            std::thread::Builder::new()
                .name("tether-store-open".into())
                .spawn(move || kernel.open_loop(&seat, open, &gate, &stop))
                .map_err(|e| StartError::Store(StoreError::Io(e.to_string())))?;
        }
        let waited = kernel.await_first_attempt(&gate)?;
        let restoring = matches!(waited, Waited::Late);
        if restoring {
            let (kernel, gate) = (kernel.clone(), gate.clone());
            std::thread::Builder::new()
                .name("tether-restore-watch".into())
                .spawn(move || kernel.watch_late_restore(&gate))
                .map_err(|e| StartError::Store(StoreError::Io(e.to_string())))?;
        }
        Ok(DeferredStart {
            kernel,
            tripped: match waited {
                Waited::Tripped(why) => Some(why),
                Waited::Open | Waited::Late => None,
            },
            restoring,
            opener,
        })
    }

    /// Waits for the first attempt within its bounds; trips every device
    /// when it failed, or did not open or take its writes in time. A
    /// restore past its first stage is left to finish ([`Waited::Late`]).
    fn await_first_attempt(&self, gate: &Gate) -> Result<Waited, StartError> {
        let t0 = Instant::now();
        let mut restoring_since: Option<Instant> = None;
        let Ok(mut phase) = gate.phase.lock() else {
            return Err(StartError::Store(StoreError::Closed));
        };
        // A start told to wait for its devices waits that long too.
        let restore_wait = Duration::from_millis(
            START_RESTORE_WAIT_MS.saturating_add(self.inner.config.wait_for_devices_ms),
        );
        loop {
            let waited_out = match &*phase {
                Phase::Open => return Ok(Waited::Open),
                Phase::Failed(e) if integrity(e) => {
                    return Err(crate::kernel::fleet::owned_error(StartError::Store(
                        e.clone(),
                    )))
                }
                Phase::Failed(e) => Some(e.to_string()),
                Phase::Opening => (t0.elapsed() >= Duration::from_millis(START_OPEN_WAIT_MS))
                    .then(|| format!("the store did not open within {START_OPEN_WAIT_MS} ms")),
                Phase::Restoring => {
                    let since = *restoring_since.get_or_insert_with(Instant::now);
                    (since.elapsed() >= restore_wait).then(|| {
                        format!("the store opened but did not take the start's writes (leases, reconciled operations) within {START_RESTORE_WAIT_MS} ms (locked by another process, or not answering?)")
                    })
                }
                Phase::Reading(at) | Phase::Late(at) => {
                    let at = *at;
                    let since = *restoring_since.get_or_insert(at);
                    if since.elapsed() >= restore_wait {
                        // Not a lock: a large store being read. Serve
                        // untripped; the watchdog bounds the rest.
                        *phase = Phase::Late(at);
                        self.inner.store_open.set_closed(
                            "the evidence store is open and its state is still being restored",
                        );
                        tracing::warn!("the evidence store's state is still being restored; serving, and the store opens when it is done");
                        return Ok(Waited::Late);
                    }
                    None
                }
                Phase::Tripped => Some("tripped".into()),
            };
            if let Some(why) = waited_out {
                // Under the gate: the opener, if it succeeds now, sees the
                // trip and makes it durable before it seats the store.
                self.trip_for_store(&why);
                *phase = Phase::Tripped;
                return Ok(Waited::Tripped(why));
            }
            phase = match gate.changed.wait_timeout(phase, Duration::from_millis(50)) {
                Ok((p, _)) => p,
                Err(_) => return Err(StartError::Store(StoreError::Closed)),
            };
        }
    }

    /// The watchdog of a restore the start stopped waiting for: trips every
    /// device when it has not ended [`START_RESTORE_READ_MS`] after its
    /// first stage (a store that does not answer). Ends when the phase
    /// leaves `Late` (open, or tripped by the opener on a failure).
    fn watch_late_restore(&self, gate: &Gate) {
        let bound = Duration::from_millis(START_RESTORE_READ_MS);
        let Ok(mut phase) = gate.phase.lock() else {
            return;
        };
        // Bounded: the phase leaves `Late` or the bound passes.
        while let Phase::Late(at) = &*phase {
            if at.elapsed() >= bound {
                let why = format!("the store opened but its state was not restored and recorded within {START_RESTORE_READ_MS} ms after its writes (the store does not answer?)");
                self.trip_for_store(&why);
                *phase = Phase::Tripped;
                gate.changed.notify_all();
                return;
            }
            phase = match gate.changed.wait_timeout(phase, Duration::from_millis(50)) {
                Ok((p, _)) => p,
                Err(_) => return,
            };
        }
    }

    /// Latches every device in memory for a store that is not open.
    fn trip_for_store(&self, why: &str) {
        let reason = crate::bounds::cut(
            &format!("the evidence store could not be opened or written at start-up: {why}"),
            self.inner.config.text_chars_max,
        );
        self.inner.store_open.set_closed(&reason);
        for dev in &self.inner.devices {
            dev.estop_epoch.fetch_add(1, Ordering::SeqCst);
            if !dev.latched.swap(true, Ordering::SeqCst) {
                let since = now_ms().max(dev.latch_event_ms.load(Ordering::SeqCst) + 1);
                dev.latch_event_ms.store(since, Ordering::SeqCst);
                if let Ok(mut l) = dev.latch.lock() {
                    *l = LatchInfo {
                        since_ms: since,
                        reason: reason.clone(),
                        durable: false,
                    };
                }
            }
        }
        tracing::error!(reason = %reason, "serving LATCHED: every device is tripped until the store opens and an operator resets it");
    }

    /// The opener: one attempt, then again after a doubling delay, until
    /// the store is open and restored, an integrity defect is found, or the
    /// endpoint ends. Runs for the life of the endpoint at most; each round
    /// is one attempt (bounded by the store's own busy timeout) and one
    /// bounded sleep.
    fn open_loop(&self, seat: &DeferredStore, mut open: OpenStore, gate: &Gate, stop: &AtomicBool) {
        let mut delay = OPEN_RETRY_DELAY_FIRST;
        let mut last_error = String::new();
        while !stop.load(Ordering::SeqCst) {
            match self.attempt(seat, &mut open, gate) {
                Ok(()) => return,
                Err(e) => {
                    let why = e.to_string();
                    seat.note_failure(why.clone());
                    if let Ok(mut p) = gate.phase.lock() {
                        match *p {
                            Phase::Opening | Phase::Restoring | Phase::Reading(_) => {
                                *p = Phase::Failed(e.clone());
                                gate.changed.notify_all();
                            }
                            Phase::Late(_) => {
                                // The endpoint serves untripped: a restore
                                // that failed trips it now, under the gate,
                                // so the next attempt makes the trip durable.
                                self.trip_for_store(&why);
                                *p = Phase::Tripped;
                                gate.changed.notify_all();
                            }
                            Phase::Failed(_) | Phase::Tripped | Phase::Open => {}
                        }
                    }
                    if why != last_error {
                        tracing::error!(error = %why, "the evidence store cannot be opened or written; trying again");
                        last_error = why;
                    }
                    if integrity(&e) {
                        // Waiting heals no integrity defect: the trip stays.
                        tracing::error!(error = %e, "the evidence store fails its integrity checks; the endpoint stays tripped");
                        self.inner.store_open.set_closed(&e.to_string());
                        return;
                    }
                }
            }
            let until = Instant::now() + delay;
            while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                std::thread::sleep(OPEN_SLEEP_STEP);
            }
            delay = delay.saturating_mul(2).min(OPEN_RETRY_DELAY_MAX);
        }
    }

    /// One attempt: open, restore, make the start-up trip durable if there
    /// was one, then seat the store. Nothing reaches the real store through
    /// the seat before its state is in the kernel.
    fn attempt(
        &self,
        seat: &DeferredStore,
        open: &mut OpenStore,
        gate: &Gate,
    ) -> Result<(), StoreError> {
        let store = open()?;
        let fault = {
            let Ok(mut p) = gate.phase.lock() else {
                return Err(StoreError::Closed);
            };
            if matches!(*p, Phase::Opening) {
                *p = Phase::Restoring;
                gate.changed.notify_all();
            }
            matches!(*p, Phase::Tripped | Phase::Failed(_)).then(|| seat.why())
        };
        let first_stage_done = || {
            if let Ok(mut p) = gate.phase.lock() {
                if matches!(*p, Phase::Restoring) {
                    *p = Phase::Reading(Instant::now());
                    gate.changed.notify_all();
                }
            }
        };
        self.restore_from(store.as_ref(), fault.as_deref(), &first_stage_done)
            .map_err(|e| match e {
                StartError::Store(e) => e,
                other => StoreError::Invalid(other.to_string()),
            })?;
        let Ok(mut p) = gate.phase.lock() else {
            return Err(StoreError::Closed);
        };
        let tripped = matches!(*p, Phase::Tripped);
        if tripped {
            self.persist_start_trip(store.as_ref())?;
        }
        seat.open_with(store);
        self.inner.store_open.set_open();
        *p = Phase::Open;
        gate.changed.notify_all();
        if tripped {
            eprintln!("tether: the evidence store is open; its state is restored and every device stays latched until an operator resets it (mhs.safety.reset)");
        }
        Ok(())
    }

    /// Makes the start-up trip of every device still latched by it durable,
    /// re-stamped after any stored event so every process orders it last.
    fn persist_start_trip(&self, store: &dyn Store) -> Result<(), StoreError> {
        let mut rows = Vec::new();
        let mut stamped = Vec::new();
        for (d, dev) in self.inner.devices.iter().enumerate() {
            // Under the latch lock: an e-stop's late rows are checked and
            // sent under it too (`submit_latch_if_current`), and once the
            // stamp moves they are never sent, so none lands after this row.
            let Ok(held) = dev.latch.lock() else {
                continue;
            };
            if !dev.latched.load(Ordering::SeqCst) || held.durable {
                continue;
            }
            let since = held
                .since_ms
                .max(dev.latch_event_ms.load(Ordering::SeqCst) + 1);
            dev.latch_event_ms.fetch_max(since, Ordering::SeqCst);
            let info = held.clone();
            drop(held);
            rows.push(trip_row(
                dev.id(),
                since,
                &info.reason,
                SOURCE_STORE_AT_START,
            ));
            stamped.push((d, since));
        }
        let ids: Vec<&str> = rows.iter().map(|r| r.device_id.as_str()).collect();
        store.commit_blocking(Commit {
            events: vec![EventDraft {
                kind: "endpoint.store_opened".into(),
                body: json!({"endpoint_id": self.inner.config.endpoint_id, "tripped_devices": ids, "reason": self.inner.store_open.closed()}).into(),
            }],
            latches: rows,
            ..Commit::default()
        })?;
        for (d, since) in stamped {
            let dev = &self.inner.devices[d];
            if let Ok(mut l) = dev.latch.lock() {
                l.since_ms = since;
                l.durable = true;
            }
        }
        Ok(())
    }

    /// `Some(why)` while the kernel's store is not open (status, health).
    pub fn store_closed(&self) -> Option<String> {
        self.inner.store_open.closed()
    }
}
