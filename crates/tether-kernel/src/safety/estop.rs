//! The e-stop: `mhs.safety.estop` and a bound `cap.motion.estop.v1`.
//!
//! The e-stop latches first: the in-memory latch is set for every target
//! device and every running operation is cancelled before any driver I/O;
//! the latch is then persisted (a bounded wait that never blocks the stop);
//! then the stop path runs (`stop_path.rs`) and the answer, the device's
//! e-stop receipt, comes within its stop budget. A failed stop path keeps the
//! latch and is retried.
//!
//! **Owns:** the latch (set in memory, made durable with a bounded wait and
//! retried in the background), what a stop withdraws (running operations,
//! permits, approvals), the stop of several devices at once, and the e-stop
//! receipt.
//! **Never belongs here:** the stop path itself (`stop_path.rs`), undoing a
//! stop (`reset.rs`), the latch check of the evaluation order
//! (`check/latch.rs`).
//! **Fail-closed rule:** an e-stop is never refused and needs no session; a
//! store that cannot take the latch delays the stop path by at most
//! [`LATCH_PERSIST_WAIT_MS_MAX`], and the answer then says the latch is held
//! in memory only.

use crate::admit::arrival::Arrival;
use crate::dispatch::answer::Answer;
use crate::kernel::{answer_margin, Kernel, LatchInfo, Principal};
use crate::kernel::{ANSWER_MARGIN_MS_MAX, ESTOP_BUDGET_MS_DEFAULT};
use crate::order::Ctx;
use crate::safety::stop_path::{StopDone, StopFailure};
use crate::trace::SpanKind;
use crate::CommandRequest;
use crate::EstopRequest;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tether_core::catalogue;
use tether_core::ids::{self, CommandId};
use tether_core::receipt::now_ms;
use tether_core::{Code, Refusal, Status};
use tether_store::{Commit, EventDraft, LatchRow};
use tracing::Instrument;

/// Receipt capability id of an endpoint e-stop.
pub const INTERNAL_ESTOP: &str = "cap.internal.safety_estop.v1";
/// The source of an e-stop a caller asked for (in its latch row and entry).
pub const SOURCE_ESTOP: &str = "estop";
/// Longest the e-stop waits for its latch to become durable before it runs
/// the stop path anyway, ms (and never more than half the stop budget).
const LATCH_PERSIST_WAIT_MS_MAX: u64 = 100;
/// Attempts to persist a latch that could not be made durable at once.
const LATCH_PERSIST_RETRIES_MAX: u32 = 10_000;
/// First delay before a latch that did not become durable is written again.
const LATCH_RETRY_DELAY_FIRST: Duration = Duration::from_millis(250);
/// Longest delay between two attempts (the delay doubles up to it).
const LATCH_RETRY_DELAY_MAX: Duration = Duration::from_secs(5);

// The stop path starts after the latch wait and the answer is built after
// it: a device with the default budget keeps at least half of it to stop.
const _: () =
    assert!(LATCH_PERSIST_WAIT_MS_MAX + ANSWER_MARGIN_MS_MAX <= ESTOP_BUDGET_MS_DEFAULT / 2);
// The retry delay doubles from the first towards the longest, never down.
const _: () = assert!(LATCH_RETRY_DELAY_FIRST.as_millis() <= LATCH_RETRY_DELAY_MAX.as_millis());

/// What one e-stop asks of each device it stops.
struct StopRequest<'a> {
    reason: &'a str,
    by: Option<Principal>,
    session_id: Option<String>,
    /// The command a bound e-stop class arrived as; `None` mints one.
    command_id: Option<&'a str>,
    /// What tripped it: [`SOURCE_ESTOP`] for a request, another source for a
    /// trip the kernel makes itself (`link.rs`: [`super::link::SOURCE_LINK`]).
    source: &'a str,
    /// When the e-stop arrived: latencies and the stop budget count from it.
    t0: Instant,
}

/// What one device's stop did, for its receipt.
struct StopOutcome<'a> {
    path: &'a Result<StopDone, StopFailure>,
    latch_durable: &'a Result<(), String>,
    cancelled: &'a [String],
    latch_latency: Duration,
    budget: Duration,
}

struct DeviceStop {
    device: usize,
    receipt: Value,
    completed: bool,
}

/// The latch reason of an e-stop: the caller's reason (or a default) and
/// the request's defect, if any, within `max` characters. An e-stop is never
/// refused for its text: a longer reason is cut, and the defect keeps room
/// of its own (at most half the bound) so a long reason never hides it.
fn latch_reason(reason: &str, defect: Option<&str>, max: usize) -> String {
    let reason = if reason.is_empty() {
        "e-stop requested"
    } else {
        reason
    };
    let Some(defect) = defect else {
        return crate::bounds::cut(reason, max);
    };
    let note = format!(" (request defect: {})", crate::bounds::cut(defect, max / 2));
    let room = max.saturating_sub(note.chars().count());
    format!("{}{note}", crate::bounds::cut(reason, room))
}

impl Kernel {
    /// `mhs.safety.estop`: stops the named devices (every device when none is
    /// named). Never refused; needs no session.
    pub async fn estop(&self, req: EstopRequest) -> Value {
        let t0 = Instant::now();
        let stop = self
            .estop_untimed(req)
            .instrument(tracing::info_span!("tether.estop"));
        let answer =
            crate::trace::in_span(self.tracer(), "tether.estop", SpanKind::Internal, stop).await;
        self.inner.meters.estop.observe(t0.elapsed());
        answer
    }

    /// [`Kernel::estop`] without its latency measured.
    async fn estop_untimed(&self, req: EstopRequest) -> Value {
        let mut targets: Vec<usize> = req
            .device_ids
            .iter()
            .filter_map(|id| self.device_index(id))
            .collect();
        if targets.is_empty() {
            targets = self
                .session_single_device(req.session_id.as_deref())
                .map_or_else(|| (0..self.inner.devices.len()).collect(), |d| vec![d]);
        }
        let reason = latch_reason(
            &req.reason,
            req.envelope_defect.as_deref(),
            self.inner.config.text_chars_max,
        );
        // Only recorded (the target was picked above): a caller's text, kept
        // as an error would echo it.
        let mut req = req;
        req.session_id = req
            .session_id
            .map(|s| tether_core::echo::id(&s).into_owned());
        let Some(deadline) = req.deadline else {
            return self
                .estop_devices(targets, &reason, req.requested_by, req.session_id, None)
                .await;
        };
        // Latch now, so whatever the deadline the answer is true about it; the
        // stop path then runs in its own task.
        let t0 = Instant::now();
        self.latch_now(&targets, &reason, t0);
        let kernel = self.clone();
        let devices = targets.clone();
        let mut task = tokio::spawn(async move {
            kernel
                .estop_devices(devices, &reason, req.requested_by, req.session_id, None)
                .await
        });
        let answer_by = deadline.saturating_sub(answer_margin(deadline));
        match tokio::time::timeout(answer_by, &mut task).await {
            Ok(Ok(answer)) => answer,
            _ => json!({
                "receipt_id": ids::mint("rcpt_"),
                "capability_id": INTERNAL_ESTOP,
                "device_ids": targets.iter().map(|&d| self.inner.devices[d].id()).collect::<Vec<_>>(),
                "status": "failed",
                "output": {"latched": true},
                "error": {"mhs_code": Code::SafetySafeStateUnreached.as_str(), "message": "the caller's deadline passed before the stop path confirmed; the latch is set and the stop path goes on", "details": {"reason": "timeout", "latched": true, "stop_path": "running"}, "retryable": true},
                "latch_latency_ms": 0.0,
                "latency_ms": t0.elapsed().as_secs_f64() * 1000.0,
                "safe_state_achieved": false,
                "not_certified": true,
            }),
        }
    }

    /// Sets the in-memory latch of every target (idempotent); returns the
    /// latch latency of each, measured from `t0`.
    fn latch_now(&self, targets: &[usize], reason: &str, t0: Instant) -> Vec<Duration> {
        let mut latch_latency = Vec::with_capacity(targets.len());
        for &d in targets {
            let dev = &self.inner.devices[d];
            dev.estop_epoch.fetch_add(1, Ordering::SeqCst);
            let was = dev.latched.swap(true, Ordering::SeqCst);
            if let Ok(mut l) = dev.latch.lock() {
                if !was {
                    // Strictly newer than any event this process applied, so
                    // every process orders this trip after it.
                    let since = now_ms().max(dev.latch_event_ms.load(Ordering::SeqCst) + 1);
                    dev.latch_event_ms.store(since, Ordering::SeqCst);
                    *l = LatchInfo {
                        since_ms: since,
                        reason: reason.to_owned(),
                        durable: false,
                    };
                }
            }
            latch_latency.push(t0.elapsed());
        }
        latch_latency
    }

    fn session_single_device(&self, sid: Option<&str>) -> Option<usize> {
        let sid = sid?;
        let sessions = self.inner.sessions.lock().ok()?;
        // Any session record counts here: the e-stop never needs a live one.
        let devices = sessions.devices_of(sid)?;
        if devices.len() == 1 {
            devices.into_iter().next()
        } else {
            None
        }
    }

    /// Whether binding `bi` of device `d` is the catalogued e-stop class: a
    /// command of it is served as the device's e-stop, not as a command.
    pub(crate) fn is_estop_binding(&self, d: usize, bi: usize) -> bool {
        let b = &self.inner.devices[d].spec.bindings[bi];
        b.catalogued && b.capability_id == catalogue::ESTOP
    }

    /// A command of a bound `cap.motion.estop.v1`: the device's e-stop,
    /// under the command's own id (none of the later steps apply to a stop).
    pub(crate) async fn estop_binding(
        &self,
        p: &Principal,
        req: &CommandRequest,
        arrival: &Arrival,
    ) -> Answer {
        // Cut, never refused: an e-stop is served whatever its text.
        let reason = crate::bounds::cut(
            req.input
                .get("reason")
                .and_then(Value::as_str)
                .unwrap_or("e-stop command"),
            self.inner.config.text_chars_max,
        );
        self.estop_devices(
            vec![arrival.device],
            &reason,
            Some(p.clone()),
            None,
            Some(&arrival.command_id),
        )
        .await
        .into()
    }

    /// The shared e-stop path for `mhs.safety.estop` and a bound
    /// `cap.motion.estop.v1`. Devices are stopped concurrently.
    pub(crate) async fn estop_devices(
        &self,
        targets: Vec<usize>,
        reason: &str,
        by: Option<Principal>,
        session_id: Option<String>,
        command_id: Option<&str>,
    ) -> Value {
        let stop = StopRequest {
            reason,
            by,
            session_id,
            command_id,
            source: SOURCE_ESTOP,
            t0: Instant::now(),
        };
        self.stop_devices(targets, stop).await
    }

    /// A trip the kernel makes itself (a link lost past its watchdog
    /// period): device `d`'s e-stop path, by no principal, its latch row and
    /// entry naming `source`. Answers the e-stop receipt (also recorded).
    pub(crate) async fn trip_device(&self, d: usize, reason: &str, source: &str) -> Value {
        let reason = crate::bounds::cut(reason, self.inner.config.text_chars_max);
        let stop = StopRequest {
            reason: &reason,
            by: None,
            session_id: None,
            command_id: None,
            source,
            t0: Instant::now(),
        };
        self.stop_devices(vec![d], stop).await
    }

    /// The e-stop path of `targets`: latch all, then stop each concurrently.
    async fn stop_devices(&self, targets: Vec<usize>, stop: StopRequest<'_>) -> Value {
        // Latch first, every device, before any driver I/O.
        let latch_latency = self.latch_now(&targets, stop.reason, stop.t0);
        let stops = targets
            .iter()
            .zip(latch_latency)
            .map(|(&d, lat)| self.stop_one(d, &stop, lat));
        let results: Vec<DeviceStop> = join_stops(stops).await;
        if results.len() == 1 {
            return results
                .into_iter()
                .next()
                .map(|r| r.receipt)
                .unwrap_or(Value::Null);
        }
        let first_bad = results.iter().position(|r| !r.completed).unwrap_or(0);
        let devices: Vec<Value> = results
            .iter()
            .map(|r| json!({"device_id": self.inner.devices[r.device].id(), "status": r.receipt["status"], "receipt_id": r.receipt["receipt_id"], "safe_state_achieved": r.receipt["safe_state_achieved"], "error": r.receipt["error"]}))
            .collect();
        let mut answer = results
            .get(first_bad)
            .map(|r| r.receipt.clone())
            .unwrap_or(Value::Null);
        let scope = if results.len() == self.inner.devices.len() {
            "all_devices"
        } else {
            "devices"
        };
        answer["x-vendor.estop"] = json!({"scope": scope, "devices": devices});
        answer
    }

    /// One device's stop, its latch already set: cancel, persist the latch,
    /// run the stop path, answer with the e-stop receipt (evidence too).
    async fn stop_one(
        &self,
        d: usize,
        stop: &StopRequest<'_>,
        latch_latency: Duration,
    ) -> DeviceStop {
        let dev = &self.inner.devices[d];
        let cancelled = self.cancel_device_ops(d, stop.reason);
        let budget = Duration::from_millis(dev.estop_budget_ms());
        let latch_durable = self.commit_latch(d, stop, &cancelled, budget).await;
        dev.stop_confirmed.store(false, Ordering::SeqCst);
        let path = self
            .run_stop_path(d, stop.t0, stop.reason, stop.command_id)
            .await;
        dev.stop_confirmed.store(path.is_ok(), Ordering::SeqCst);
        let outcome = StopOutcome {
            path: &path,
            latch_durable: &latch_durable,
            cancelled: &cancelled,
            latch_latency,
            budget,
        };
        let wire = self.stop_receipt(d, stop, &outcome);
        self.record(Commit {
            events: vec![EventDraft {
                kind: "safety.estop.receipt".into(),
                body: json!({"receipt": wire}).into(),
            }],
            ..Commit::default()
        });
        if path.is_err() {
            self.spawn_stop_retry(
                d,
                wire["receipt_id"].as_str().unwrap_or_default().to_owned(),
            );
        }
        DeviceStop {
            device: d,
            receipt: wire,
            // Completed exactly when the stop path succeeded (a latch that is
            // not yet durable is said in the error, not in the status).
            completed: path.is_ok(),
        }
    }

    /// Withdraws the device's permits and open approvals and persists the
    /// latch with them, before any driver I/O. The wait is bounded (half the
    /// stop budget, at most [`LATCH_PERSIST_WAIT_MS_MAX`]): a store that
    /// cannot make it durable must never delay the stop path itself (stops
    /// always run); the answer then says the latch is held in memory.
    async fn commit_latch(
        &self,
        d: usize,
        stop: &StopRequest<'_>,
        cancelled: &[String],
        budget: Duration,
    ) -> Result<(), String> {
        let dev = &self.inner.devices[d];
        let revoked_permits = self.revoke_permits(d);
        let revoked_approvals = self.revoke_approvals(dev.id());
        let revoked_approval_ids: Vec<&str> = revoked_approvals
            .iter()
            .map(|r| r.approval_id.as_str())
            .collect();
        let info = dev.latch.lock().map(|l| l.clone()).unwrap_or_default();
        let latch_commit = Commit {
            events: vec![EventDraft {
                kind: "safety.estop".into(),
                body: json!({"device_id": dev.id(), "reason": stop.reason, "source": stop.source, "requested_by": stop.by.as_ref().map(Principal::to_json), "session_id": stop.session_id, "cancelled_operations": cancelled, "revoked_permits": revoked_permits, "revoked_approvals": revoked_approval_ids}).into(),
            }],
            latches: vec![LatchRow {
                device_id: dev.id().to_owned(),
                latched: true,
                info: json!({"since_ms": info.since_ms, "reason": info.reason, "source": stop.source}),
            }],
            approvals: revoked_approvals,
            ..Commit::default()
        };
        let persist_wait = (budget / 2).min(Duration::from_millis(LATCH_PERSIST_WAIT_MS_MAX));
        self.persist_latch(d, latch_commit, persist_wait).await
    }

    /// The e-stop receipt of one device, as sent on the wire.
    fn stop_receipt(&self, d: usize, stop: &StopRequest<'_>, outcome: &StopOutcome<'_>) -> Value {
        let t0 = stop.t0;
        let ctx = Ctx {
            session_id: stop.session_id.clone(),
            // A budget too large for the clock leaves a deadline already
            // passed, as `Ctx::bare` has it.
            deadline: t0.checked_add(outcome.budget).unwrap_or(t0),
            ..Ctx::bare(
                d,
                stop.command_id
                    .map_or_else(|| CommandId::mint().as_str().to_owned(), str::to_owned),
                stop.by.clone().unwrap_or_else(Principal::local_agent),
                (t0, now_ms()),
            )
        };
        let (status, output, error) = stop_status(outcome.path, outcome.latch_durable);
        let mut receipt = self.receipt(&ctx, INTERNAL_ESTOP, None, status, Some(output), error);
        let extra = [
            ("latency_ms", json!(t0.elapsed().as_secs_f64() * 1000.0)),
            (
                "latch_latency_ms",
                json!(outcome.latch_latency.as_secs_f64() * 1000.0),
            ),
            ("safe_state_achieved", json!(outcome.path.is_ok())),
            ("cancelled_operations", json!(outcome.cancelled)),
            ("latch_durable", json!(outcome.latch_durable.is_ok())),
            ("not_certified", json!(true)),
        ];
        for (key, value) in extra {
            receipt.extra.insert(key.into(), value);
        }
        receipt.into_json()
    }

    /// Submits the latch commit and waits at most `wait` for it. Whenever it
    /// lands the latch is marked durable; if it fails, it is retried in the
    /// background ([`LATCH_RETRY_DELAY_FIRST`] doubling to
    /// [`LATCH_RETRY_DELAY_MAX`]) until durable or the latch changes.
    async fn persist_latch(&self, d: usize, commit: Commit, wait: Duration) -> Result<(), String> {
        let generation = self.inner.devices[d].latch_event_ms.load(Ordering::SeqCst);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let kernel = self.clone();
        let runtime = tokio::runtime::Handle::try_current().ok();
        let row = commit.latches.clone();
        self.inner.store.submit(
            commit,
            Box::new(move |r| {
                match &r {
                    Ok(_) => kernel.mark_latch_durable(d, generation),
                    Err(_) => {
                        if let Some(rt) = runtime {
                            let k = kernel.clone();
                            rt.spawn(
                                async move { k.retry_latch_persist(d, generation, row).await },
                            );
                        }
                    }
                }
                let _ = tx.send(r);
            }),
        );
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(Ok(_))) => Ok(()),
            Ok(Ok(Err(e))) => Err(e.to_string()),
            Ok(Err(_)) => Err("the store dropped the commit".into()),
            Err(_) => Err(format!("not durable within {} ms", wait.as_millis())),
        }
    }

    fn mark_latch_durable(&self, d: usize, generation: u64) {
        let dev = &self.inner.devices[d];
        if dev.latch_event_ms.load(Ordering::SeqCst) == generation {
            if let Ok(mut l) = dev.latch.lock() {
                l.durable = true;
            }
        }
    }

    async fn retry_latch_persist(&self, d: usize, generation: u64, rows: Vec<LatchRow>) {
        let mut delay = LATCH_RETRY_DELAY_FIRST;
        for _ in 0..LATCH_PERSIST_RETRIES_MAX {
            tokio::time::sleep(delay).await;
            delay = delay.saturating_mul(2).min(LATCH_RETRY_DELAY_MAX);
            let Some(answer) = self.submit_latch_if_current(d, generation, &rows) else {
                return; // a newer latch (or a reset) took its place
            };
            if matches!(answer.await, Ok(Ok(_))) {
                self.mark_latch_durable(d, generation);
                return;
            }
        }
    }

    /// Hands the late latch rows to the store if the latch is still the one
    /// they record; `None` when it is not. Checked and submitted under the
    /// device's latch lock: a store that opens re-stamps its start-up trip
    /// under the same lock before it is seated, so rows from before that
    /// trip either fail on the closed store or are never sent, and never
    /// land after the trip's own row (found by `deferred_start` under load).
    fn submit_latch_if_current(
        &self,
        d: usize,
        generation: u64,
        rows: &[LatchRow],
    ) -> Option<
        tokio::sync::oneshot::Receiver<Result<tether_store::CommitAck, tether_store::StoreError>>,
    > {
        let dev = &self.inner.devices[d];
        let held = dev.latch.lock().ok()?;
        if !dev.latched.load(Ordering::SeqCst)
            || dev.latch_event_ms.load(Ordering::SeqCst) != generation
        {
            return None;
        }
        let commit = Commit {
            events: vec![EventDraft {
                kind: "safety.estop.persisted".into(),
                body: json!({"device_id": dev.id(), "late": true}).into(),
            }],
            latches: rows.to_vec(),
            ..Commit::default()
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        // The answer only wakes the waiting task: nothing in it takes the
        // latch lock, so the store may answer right here.
        self.inner.store.submit(
            commit,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        drop(held);
        Some(rx)
    }
}

/// The status, output and error of an e-stop receipt: failed when the stop
/// path failed (the latch holds and the path is retried); completed
/// otherwise, with an evidence error when the latch is not yet durable.
fn stop_status(
    path: &Result<StopDone, StopFailure>,
    latch_durable: &Result<(), String>,
) -> (Status, Value, Option<Refusal>) {
    match (path, latch_durable) {
        (Ok(done), Ok(())) => (Status::Completed, done.output(), None),
        (Err(f), _) => (
            Status::Failed,
            json!({"latched": true}),
            Some(Refusal::new(
                Code::SafetySafeStateUnreached,
                f.message.clone(),
                json!({"reason": f.reason, "latched": true, "retrying": true}),
            )),
        ),
        (Ok(done), Err(e)) => (
            Status::Completed,
            done.output(),
            Some(Refusal::new(
                Code::EvidenceUnavailable,
                "the latch is held in memory and not yet durable",
                json!({"reason": "latch_not_durable", "store_error": e}),
            )),
        ),
    }
}

/// Polls the stops of several devices together, without pulling in the
/// `futures` crate: they borrow `self`, so they cannot be spawned as tasks.
/// Answers in the order of `futs`.
async fn join_stops<F: std::future::Future<Output = DeviceStop>>(
    futs: impl Iterator<Item = F>,
) -> Vec<DeviceStop> {
    let mut pinned: Vec<std::pin::Pin<Box<F>>> = futs.map(Box::pin).collect();
    let mut out: Vec<Option<DeviceStop>> = (0..pinned.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, slot) in pinned.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *slot = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}
