//! The e-stop latch, reset and status.
//!
//! The e-stop latches first: the in-memory latch is set for every target
//! device and every running operation is cancelled before any driver I/O;
//! the latch is then persisted (a bounded wait that never blocks the stop);
//! then the stop path runs (`stop_path.rs`) and the answer comes within the
//! device's stop budget. A failed stop path keeps the latch and is retried.

use crate::admit::arrival::Arrival;
use crate::dispatch::answer::Answer;
use crate::kernel::{Kernel, LatchInfo, Principal};
use crate::order::Ctx;
use crate::CommandRequest;
use crate::{ApiError, ArmRequest, EstopRequest, ResetRequest};
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tether_core::catalogue;
use tether_core::ids::{self, CommandId};
use tether_core::receipt::now_ms;
use tether_core::{Code, Refusal, Status};
use tether_store::{Commit, EventDraft, LatchRow};

/// Receipt capability id of an endpoint e-stop.
pub const INTERNAL_ESTOP: &str = "cap.internal.safety_estop.v1";
/// Receipt capability id of a reset.
pub const INTERNAL_RESET: &str = "cap.internal.safety_reset.v1";
/// Longest the e-stop waits for its latch to become durable before it runs
/// the stop path anyway, ms.
const LATCH_PERSIST_WAIT_MS_MAX: u64 = 100;
/// Attempts to persist a latch that could not be made durable at once.
const LATCH_PERSIST_RETRIES_MAX: u32 = 10_000;

struct DeviceStop {
    device: usize,
    receipt: Value,
    completed: bool,
}

impl Kernel {
    /// `mhs.safety.estop`: stops the named devices (every device when none is
    /// named). Never refused; needs no session.
    pub async fn estop(&self, req: EstopRequest) -> Value {
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
        let mut reason = if req.reason.is_empty() {
            "e-stop requested".to_owned()
        } else {
            req.reason.clone()
        };
        if let Some(defect) = &req.envelope_defect {
            reason = format!("{reason} (request defect: {defect})");
        }
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
        let answer_by = deadline.saturating_sub(crate::kernel::answer_margin(deadline));
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
        let reason = req
            .input
            .get("reason")
            .and_then(Value::as_str)
            .unwrap_or("e-stop command")
            .to_owned();
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
        let t0 = Instant::now();
        // Latch first, every device, before any driver I/O.
        let latch_latency = self.latch_now(&targets, reason, t0);
        let stops = targets.iter().zip(latch_latency).map(|(&d, lat)| {
            self.stop_one(
                d,
                reason,
                by.clone(),
                session_id.clone(),
                command_id,
                t0,
                lat,
            )
        });
        let results: Vec<DeviceStop> = futures_join_all(stops).await;
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

    #[allow(clippy::too_many_arguments)]
    async fn stop_one(
        &self,
        d: usize,
        reason: &str,
        by: Option<Principal>,
        session_id: Option<String>,
        command_id: Option<&str>,
        t0: Instant,
        latch_latency: Duration,
    ) -> DeviceStop {
        let dev = &self.inner.devices[d];
        let cancelled = self.cancel_device_ops(d, reason);
        let revoked_permits = self.revoke_permits(d);
        let revoked_approvals = self.revoke_approvals(dev.id());
        let revoked_approval_ids: Vec<&str> = revoked_approvals
            .iter()
            .map(|r| r.approval_id.as_str())
            .collect();
        let budget = Duration::from_millis(dev.estop_budget_ms());
        // Persist the latch before any driver I/O. The wait is bounded: a store
        // that cannot make it durable must never delay the stop path itself
        // (stops always run); the answer then says the latch is held in memory.
        let info = dev.latch.lock().map(|l| l.clone()).unwrap_or_default();
        let latch_commit = Commit {
            events: vec![EventDraft {
                kind: "safety.estop".into(),
                body: json!({"device_id": dev.id(), "reason": reason, "requested_by": by.as_ref().map(Principal::to_json), "session_id": session_id, "cancelled_operations": cancelled, "revoked_permits": revoked_permits, "revoked_approvals": revoked_approval_ids}).into(),
            }],
            latches: vec![LatchRow {
                device_id: dev.id().to_owned(),
                latched: true,
                info: json!({"since_ms": info.since_ms, "reason": info.reason}),
            }],
            approvals: revoked_approvals,
            ..Commit::default()
        };
        let persist_wait = (budget / 2).min(Duration::from_millis(LATCH_PERSIST_WAIT_MS_MAX));
        let durable = self.persist_latch(d, latch_commit, persist_wait).await;
        dev.stop_confirmed.store(false, Ordering::SeqCst);
        let path = self.run_stop_path(d, t0, reason, command_id).await;
        let ctx = Ctx {
            session_id,
            t0,
            deadline: t0 + budget,
            ..Ctx::bare(
                d,
                command_id.map_or_else(|| CommandId::mint().as_str().to_owned(), str::to_owned),
                by.unwrap_or_else(Principal::local_agent),
            )
        };
        let (status, output, error) = match (&path, &durable) {
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
        };
        let completed = status == Status::Completed;
        dev.stop_confirmed.store(path.is_ok(), Ordering::SeqCst);
        let mut receipt = self.receipt(&ctx, INTERNAL_ESTOP, None, status, Some(output), error);
        receipt.extra.insert(
            "latency_ms".into(),
            json!(t0.elapsed().as_secs_f64() * 1000.0),
        );
        receipt.extra.insert(
            "latch_latency_ms".into(),
            json!(latch_latency.as_secs_f64() * 1000.0),
        );
        receipt
            .extra
            .insert("safe_state_achieved".into(), json!(path.is_ok()));
        receipt
            .extra
            .insert("cancelled_operations".into(), json!(cancelled));
        receipt
            .extra
            .insert("latch_durable".into(), json!(durable.is_ok()));
        receipt.extra.insert("not_certified".into(), json!(true));
        let wire = receipt.into_json();
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
            completed,
        }
    }

    /// Submits the latch commit and waits at most `wait` for it. Whenever it
    /// lands the latch is marked durable; if it fails, it is retried in the
    /// background (0.25 s doubling to 5 s) until durable or the latch changes.
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
        let mut delay = Duration::from_millis(250);
        for _ in 0..LATCH_PERSIST_RETRIES_MAX {
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
            let dev = &self.inner.devices[d];
            if !dev.latched.load(Ordering::SeqCst)
                || dev.latch_event_ms.load(Ordering::SeqCst) != generation
            {
                return;
            }
            let commit = Commit {
                events: vec![EventDraft {
                    kind: "safety.estop.persisted".into(),
                    body: json!({"device_id": dev.id(), "late": true}).into(),
                }],
                latches: rows.clone(),
                ..Commit::default()
            };
            if self.commit(commit).await.is_ok() {
                self.mark_latch_durable(d, generation);
                return;
            }
        }
    }

    /// `mhs.safety.reset`: releases a latch when nothing forbids it. A reset
    /// resumes nothing.
    ///
    /// # Errors
    /// Unknown device.
    pub async fn reset(&self, p: &Principal, req: ResetRequest) -> Result<Value, ApiError> {
        let d = self
            .device_index(&req.device_id)
            .ok_or_else(|| self.unknown_device(&req.device_id))?;
        let dev = &self.inner.devices[d];
        let ctx = Ctx {
            session_id: req.session_id.clone(),
            ..Ctx::bare(d, CommandId::mint().as_str().to_owned(), p.clone())
        };
        let epoch = dev.estop_epoch.load(Ordering::SeqCst);
        if let Some(refusal) = self.reset_refusal(d, p) {
            return Ok(self.reject(&ctx, INTERNAL_RESET, None, refusal).await);
        }
        // Strictly after the latch it releases, so no process orders it before.
        let reset_at = now_ms().max(dev.latch_event_ms.load(Ordering::SeqCst) + 1);
        let commit = Commit {
            events: vec![EventDraft {
                kind: "safety.reset".into(),
                body: json!({"device_id": dev.id(), "principal": p.to_json(), "reason": req.reason, "session_id": req.session_id}).into(),
            }],
            latches: vec![LatchRow {
                device_id: dev.id().to_owned(),
                latched: false,
                // Whether an operator reset it travels with the row: another
                // process that serves this device as hardware releases its
                // latch only for an operator's reset.
                info: json!({"reset_by": p.to_json(), "reset_by_operator": p.kind == crate::PrincipalKind::Human && p.operator, "reset_at_ms": reset_at}),
            }],
            ..Commit::default()
        };
        if let Err(e) = self.commit(commit).await {
            let refusal = Refusal::new(
                Code::SafetyResetRefused,
                "the reset could not be made durable; the latch is kept",
                json!({"reason": "not_durable", "store_error": e.to_string(), "latched": true}),
            );
            return Ok(self.reject(&ctx, INTERNAL_RESET, None, refusal).await);
        }
        dev.latch_event_ms.fetch_max(reset_at, Ordering::SeqCst);
        // CORE-081: the latch is released only if no e-stop engaged and no
        // stop attempt started while the reset was being made durable.
        if let Some(refusal) = self.reset_overtaken(d, epoch, reset_at).await {
            return Ok(self.reject(&ctx, INTERNAL_RESET, None, refusal).await);
        }
        dev.latched.store(false, Ordering::SeqCst);
        if let Ok(mut l) = dev.latch.lock() {
            *l = LatchInfo::default();
        }
        let receipt = self.receipt(
            &ctx,
            INTERNAL_RESET,
            None,
            Status::Completed,
            // A device whose stop leaves it disabled names the command that
            // re-enables it: the reset itself never runs it (CORE-086).
            Some(match &dev.spec.manifest.safety.estop.reenable {
                Some(cap) => json!({"latched": false, "resumed": false, "reenable": cap}),
                None => json!({"latched": false, "resumed": false}),
            }),
            None,
        );
        Ok(receipt.into_json())
    }

    /// An e-stop engaged (the epoch moved) or a stop attempt started while
    /// the reset at `reset_at` was being committed: the latch is kept, and
    /// asserted again in the store after the reset row, so no process and no
    /// restart reads the device as released.
    async fn reset_overtaken(&self, d: usize, epoch: u64, reset_at: u64) -> Option<Refusal> {
        let dev = &self.inner.devices[d];
        let reason = if dev.estop_epoch.load(Ordering::SeqCst) != epoch {
            "estop_during_reset"
        } else if dev.stops_in_flight.load(Ordering::SeqCst) > 0 {
            "stop_path_pending"
        } else {
            return None;
        };
        let since = now_ms().max(reset_at + 1);
        dev.latch_event_ms.fetch_max(since, Ordering::SeqCst);
        let reassert = Commit {
            events: vec![EventDraft {
                kind: "safety.reset.overtaken".into(),
                body: json!({"device_id": dev.id(), "reason": reason, "reset_at_ms": reset_at})
                    .into(),
            }],
            latches: vec![crate::safety::governed::trip_row(
                dev.id(),
                since,
                "the latch is kept: a stop engaged while a reset was being made",
                "reset_overtaken",
            )],
            ..Commit::default()
        };
        let durable = self.commit(reassert).await.is_ok();
        Some(Refusal::new(
            Code::SafetyResetRefused,
            "a stop engaged while the reset was being made; the latch is kept",
            json!({"reason": reason, "latched": true, "stop_reasserted": true, "latch_durable": durable}),
        ))
    }

    fn reset_refusal(&self, d: usize, p: &Principal) -> Option<Refusal> {
        let dev = &self.inner.devices[d];
        if !dev.latched.load(Ordering::SeqCst) {
            return Some(Refusal::new(
                Code::SafetyResetRefused,
                "nothing is latched",
                json!({"reason": "not_latched", "latched": false}),
            ));
        }
        if dev.terminated.load(Ordering::SeqCst) {
            return Some(Refusal::new(
                Code::SafetyResetRefused,
                "the device's stop cannot be undone without a new native session; restart the endpoint to recover",
                json!({"reason": "terminal_estop", "terminal": dev.spec.manifest.safety.estop.terminal, "latched": true, "remediation": "restart the endpoint; an operator resets the restored latch"}),
            ));
        }
        // A trip made elsewhere that this process has not applied yet must not be
        // released by a reset that never saw it: read the shared stop first.
        match self.inner.store.latches() {
            Ok(rows) => {
                if let Some(ev) = crate::safety::governed::newest_event(&rows, dev.id()) {
                    if ev.latched && ev.at_ms > dev.latch_event_ms.load(Ordering::SeqCst) {
                        return Some(Refusal::new(
                            Code::SafetyResetRefused,
                            "a newer stop was tripped by another process; it is being applied",
                            json!({"reason": "newer_stop", "tripped_at_ms": ev.at_ms, "latched": true}),
                        ));
                    }
                }
            }
            Err(e) => {
                return Some(Refusal::new(
                    Code::SafetyResetRefused,
                    "the governed stop cannot be read, so the latch is kept",
                    json!({"reason": "stop_unreadable", "store_error": e.to_string(), "latched": true}),
                ));
            }
        }
        if dev.spec.manifest.mode.is_physical() && !p.operator {
            return Some(Refusal::new(
                Code::AuthForbidden,
                "only an authenticated operator may reset a hardware latch",
                json!({"reason": "operator_required", "latched": true}),
            ));
        }
        // Before anything that reads the device: a native stop in flight
        // refuses at once (CORE-080; there is no override).
        if dev.stops_in_flight.load(Ordering::SeqCst) > 0 {
            return Some(Refusal::new(
                Code::SafetyResetRefused,
                "a stop attempt of the device is still running",
                json!({"reason": "stop_path_pending", "latched": true}),
            ));
        }
        let open: Vec<Value> = dev
            .interlock_readings()
            .into_iter()
            .filter(|(i, s)| {
                !dev.spec.manifest.interlocks[*i].reset_exempt
                    && *s != crate::InterlockState::Closed
            })
            .map(|(i, s)| json!({"id": dev.spec.manifest.interlocks[i].id, "state": s.as_str()}))
            .collect();
        if !open.is_empty() {
            return Some(Refusal::new(
                Code::SafetyResetRefused,
                "an interlock is open or unknown",
                json!({"reason": "interlock_open", "interlocks": open, "latched": true}),
            ));
        }
        let running: Vec<String> = self.running_on(d).into_iter().map(|(op, _)| op).collect();
        if !running.is_empty() {
            return Some(Refusal::new(
                Code::SafetyResetRefused,
                "an operation that ignored cancellation is still running",
                json!({"reason": "operation_running", "operations": running, "latched": true}),
            ));
        }
        None
    }

    /// `mhs.safety.arm` / `mhs.safety.disarm`: hardware actuation of a
    /// hardware or hybrid device on or off (evaluation step 6). Only an
    /// authenticated operator arms; anyone may disarm (it makes things
    /// safer). The change is durable and an evidence entry before it is
    /// answered; a disarm that cannot be made durable still applies here.
    ///
    /// # Errors
    /// `DEVICE.UNKNOWN`; invalid params for a device that is not physical;
    /// `AUTH.FORBIDDEN` (`operator_required`) for an arm by anyone else;
    /// `EVIDENCE.UNAVAILABLE` for an arm the store did not take.
    pub async fn set_armed(&self, p: &Principal, req: ArmRequest) -> Result<Value, ApiError> {
        let d = self
            .device_index(&req.device_id)
            .ok_or_else(|| self.unknown_device(&req.device_id))?;
        let dev = &self.inner.devices[d];
        if !dev.spec.manifest.mode.is_physical() {
            return Err(ApiError::new(
                Code::ProtocolInvalidParams,
                format!(
                    "device `{}` is {}: it moves nothing physical and is always armed",
                    dev.id(),
                    dev.spec.manifest.mode.as_str()
                ),
                json!({"reason": "not_physical", "mode": dev.spec.manifest.mode.as_str()}),
            ));
        }
        let operator = p.kind == crate::PrincipalKind::Human && p.operator;
        if req.armed && !operator {
            return Err(ApiError::new(
                Code::AuthForbidden,
                "only an authenticated operator may arm hardware",
                json!({"reason": "operator_required"}),
            ));
        }
        let was = dev.armed.load(Ordering::SeqCst);
        let at_ms = now_ms().max(dev.arming_ms.load(Ordering::SeqCst) + 1);
        let reason: String = req.reason.chars().take(512).collect();
        let commit = Commit {
            events: vec![EventDraft {
                kind: "safety.arming".into(),
                body: json!({"device_id": dev.id(), "armed": req.armed, "was_armed": was, "principal": p.to_json(), "reason": reason}).into(),
            }],
            latches: vec![crate::safety::governed::arming_row(
                dev.id(),
                req.armed,
                json!({"at_ms": at_ms, "by": p.to_json(), "reason": reason}),
            )],
            ..Commit::default()
        };
        if !req.armed {
            // A disarm applies before its record: it only takes power away.
            dev.armed.store(false, Ordering::SeqCst);
        }
        let durable = self.commit(commit).await;
        if let Err(e) = &durable {
            if req.armed {
                return Err(ApiError::new(
                    Code::EvidenceUnavailable,
                    "the arming could not be made durable; the device stays disarmed",
                    json!({"reason": "not_durable", "store_error": e.to_string()}),
                ));
            }
        }
        dev.arming_ms.fetch_max(at_ms, Ordering::SeqCst);
        dev.armed.store(req.armed, Ordering::SeqCst);
        Ok(json!({
            "device_id": dev.id(),
            "armed": req.armed,
            "changed": was != req.armed,
            "at_ms": at_ms,
            "durable": durable.is_ok(),
            "not_certified": true,
        }))
    }

    /// `mhs.safety.status`: per device, the latch, interlocks and running operations.
    pub fn safety_status(&self, device_id: Option<&str>) -> Result<Value, ApiError> {
        let devices: Vec<usize> = match device_id {
            Some(id) => vec![self
                .device_index(id)
                .ok_or_else(|| self.unknown_device(id))?],
            None => (0..self.inner.devices.len()).collect(),
        };
        let list: Vec<Value> = devices
            .into_iter()
            .map(|d| {
                let dev = &self.inner.devices[d];
                let latched = dev.latched.load(Ordering::SeqCst);
                let info = dev.latch.lock().map(|l| l.clone()).unwrap_or_default();
                let interlocks: Vec<Value> = dev
                    .interlock_readings()
                    .into_iter()
                    .map(|(i, s)| {
                        let il = &dev.spec.manifest.interlocks[i];
                        json!({"id": il.id, "state": s.as_str(), "description": il.description, "gating": il.required_for.is_some(), "required_for": il.required_for})
                    })
                    .collect();
                json!({
                    "device_id": dev.id(),
                    "mode": dev.spec.manifest.mode.as_str(),
                    "latched": latched,
                    "armed": dev.armed.load(Ordering::SeqCst),
                    "latch": if latched { json!({"since_ms": info.since_ms, "reason": info.reason, "durable": info.durable}) } else { Value::Null },
                    "estop": {"latency_ms": dev.estop_budget_ms(), "engaged": latched, "confirmed": latched && dev.stop_confirmed.load(Ordering::SeqCst), "terminated": dev.terminated.load(Ordering::SeqCst)},
                    "interlocks": interlocks,
                    "running_operations": self.running_on(d).into_iter().map(|(op, cap)| json!({"operation_id": op, "capability_id": cap})).collect::<Vec<_>>(),
                })
            })
            .collect();
        Ok(json!({"devices": list, "not_certified": true, "statement": tether_core::NOT_CERTIFIED}))
    }
}

/// Joins futures concurrently without pulling in the `futures` crate: each
/// runs as its own task on the current runtime... but they borrow `self`, so
/// they are polled together here instead.
async fn futures_join_all<F: std::future::Future<Output = DeviceStop>>(
    futs: impl Iterator<Item = F>,
) -> Vec<DeviceStop> {
    let mut pinned: Vec<std::pin::Pin<Box<F>>> = futs.map(Box::pin).collect();
    let mut out: Vec<Option<DeviceStop>> = (0..pinned.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in pinned.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
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

#[allow(dead_code)]
fn mint_op() -> String {
    ids::mint("op_")
}
