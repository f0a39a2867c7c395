//! The driver call: polled once inline, then (if it waits) run in its own
//! task under the command's deadline,
//! watched for a gating interlock that opens, and its outcome classified.
//!
//! **Fail-closed rule:** a call that ignores cancellation past its deadline
//! (plus a grace) is left behind as `unknown`; output that does not match the
//! output schema is a failure, never a success.

use crate::check::interlocks::{gating_interlocks, open_interlocks};
use crate::dispatch::authorized::Authorized;
use crate::driver::{CancelToken, Signal};
use crate::kernel::{DeviceRt, Kernel};
use crate::loader::BindingSpec;
use serde_json::{json, Value};
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};
use tether_core::{Code, Refusal, Status};
use tracing::Instrument;

/// How long a cancelled call may take to return before its outcome is unknown.
pub(crate) const CANCEL_GRACE: Duration = Duration::from_millis(1000);

/// How often the interlocks of a running operation are read, ms.
pub(crate) const INTERLOCK_POLL_MS: u64 = 20;

// An interlock that opens is noticed well within the grace a cancelled
// call has to return.
const _: () = assert!((INTERLOCK_POLL_MS as u128) < CANCEL_GRACE.as_millis());

pub(crate) enum DriverOutcome {
    Returned(Result<Value, Signal>),
    InterlockOpened(Result<Value, Signal>, Value),
    DeadlineCancelled(Result<Value, Signal>),
    Abandoned,
}

pub(crate) fn classify(
    outcome: DriverOutcome,
    output_schema: Option<&jsonschema::Validator>,
) -> (Status, Option<Value>, Option<Refusal>) {
    match outcome {
        DriverOutcome::Returned(Ok(out)) | DriverOutcome::DeadlineCancelled(Ok(out)) => {
            if output_schema.is_none_or(|v| v.is_valid(&out)) {
                (Status::Completed, Some(out), None)
            } else {
                (Status::Failed, None, Some(Refusal::new(Code::AdapterOutputInvalid, "the driver output does not match the output schema", json!({"reason": "output_invalid"}))))
            }
        }
        DriverOutcome::Returned(Err(s)) => signal_outcome(s),
        DriverOutcome::InterlockOpened(result, open) => (
            if result.is_ok() { Status::Failed } else { Status::Cancelled },
            None,
            Some(Refusal::new(
                Code::SafetyInterlockOpen,
                "a gating interlock opened during the operation, which was stopped",
                json!({"reason": "opened_during_operation", "interlocks": open}),
            )),
        ),
        DriverOutcome::DeadlineCancelled(Err(_)) => (Status::Failed, None, Some(Refusal::new(Code::OutcomeTimeout, "the deadline passed during the operation; it was cancelled", json!({"reason": "deadline_exceeded_during_dispatch"})))),
        DriverOutcome::Abandoned => (Status::Unknown, None, Some(Refusal::new(Code::OutcomeUnknown, "the deadline passed and the driver did not confirm cancellation; read the device before acting again", json!({"reason": "deadline_exceeded_cancel_unconfirmed"})))),
    }
}

pub(crate) fn signal_outcome(s: Signal) -> (Status, Option<Value>, Option<Refusal>) {
    match s {
        Signal::Cancelled => (
            Status::Cancelled,
            None,
            Some(Refusal::new(
                Code::OutcomeCancelled,
                "the operation was cancelled",
                json!({"reason": "cancelled"}),
            )),
        ),
        Signal::Failed { reason, message } => (
            Status::Failed,
            None,
            Some(Refusal::new(
                Code::AdapterDriverFailed,
                message,
                json!({"reason": reason}),
            )),
        ),
        Signal::NativeFailed {
            reason,
            message,
            native,
        } => (
            Status::Failed,
            None,
            Some(Refusal::new(
                Code::AdapterDriverFailed,
                message,
                json!({"reason": reason, "native": native}),
            )),
        ),
        Signal::NativeUnknown { message, native } => (
            Status::Unknown,
            None,
            Some(Refusal::new(
                Code::OutcomeUnknown,
                message,
                json!({"reason": "driver_outcome_unknown", "native": native}),
            )),
        ),
        Signal::Busy => (
            Status::Rejected,
            None,
            Some(Refusal::new(
                Code::DeviceBusy,
                "the device refused the call; nothing was actuated",
                json!({"reason": "driver_busy"}),
            )),
        ),
        Signal::OutcomeUnknown { message } => (
            Status::Unknown,
            None,
            Some(Refusal::new(
                Code::OutcomeUnknown,
                message,
                json!({"reason": "driver_outcome_unknown"}),
            )),
        ),
    }
}

pub(crate) fn signal_text(s: &Signal) -> String {
    match s {
        Signal::Cancelled => "cancelled".into(),
        Signal::Failed { message, .. } => message.clone(),
        Signal::Busy => "busy".into(),
        Signal::OutcomeUnknown { message } | Signal::NativeUnknown { message, .. } => {
            message.clone()
        }
        Signal::NativeFailed { message, .. } => message.clone(),
    }
}

fn driver_panicked() -> Signal {
    Signal::Failed {
        reason: "driver_panicked".into(),
        message: "the driver task ended abnormally".into(),
    }
}

enum FirstPoll<T> {
    Ready(T),
    Pending,
    Panicked,
}

/// Polls `fut` once with the caller's waker. A panic in the driver is caught
/// here as the driver's task would have caught it, so it fails the call, never
/// the caller.
async fn poll_once<F: Future>(mut fut: Pin<&mut F>) -> FirstPoll<F::Output> {
    std::future::poll_fn(|cx| {
        let polled =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fut.as_mut().poll(cx)));
        Poll::Ready(match polled {
            Ok(Poll::Ready(out)) => FirstPoll::Ready(out),
            Ok(Poll::Pending) => FirstPoll::Pending,
            Err(_) => FirstPoll::Panicked,
        })
    })
    .await
}

impl Kernel {
    /// Runs the driver call, in its own task once it waits, so a call that
    /// ignores cancellation can be left behind (its outcome unknown) without holding
    /// the caller past its deadline.
    pub(crate) async fn run_driver(
        &self,
        dev: &DeviceRt,
        b: &BindingSpec,
        auth: Authorized,
        cancel: CancelToken,
        op_id: &str,
        deadline: Instant,
    ) -> DriverOutcome {
        if b.is_read() {
            let out = dev
                .driver
                .read(&auth)
                .map(|state| json!({"revision": dev.revision(&b.resource), "state": state}));
            self.unregister_op(op_id);
            return DriverOutcome::Returned(out);
        }
        let driver = dev.driver.clone();
        let task_cancel = cancel.clone();
        let kernel = self.clone();
        let op = op_id.to_owned();
        let device = self.device_index(dev.id());
        // The call's mark goes with it, into a task of its own if need be.
        let stage = crate::stages::enter(crate::stages::Stage::Driver);
        let mut call = Box::pin(async move {
            let _stage = stage;
            let r = driver.call(auth, task_cancel).await;
            kernel.unregister_op(&op);
            if matches!(&r, Err(s) if !matches!(s, Signal::Cancelled)) {
                if let Some(d) = device {
                    kernel.inner.meters.driver_error(d);
                }
            }
            r
        });
        // A call that finishes at once (a simulated setpoint) is answered
        // without a task of its own: a spawn and two wake-ups across threads
        // were most of one caller's whole command on the memory store.
        // Only for a driver that says its polls never block (`polls_promptly`).
        if dev.driver.polls_promptly() {
            match poll_once(call.as_mut()).await {
                FirstPoll::Ready(r) => return DriverOutcome::Returned(r),
                FirstPoll::Panicked => return DriverOutcome::Returned(Err(driver_panicked())),
                FirstPoll::Pending => {}
            }
        }
        // Pending: the call moves to its own task, whose first poll registers
        // the task's own waker (a future wakes only the waker of its latest
        // poll), so the caller can leave it behind at the deadline.
        // Logs keep the command's span; the call's mark ends in its table.
        let mut handle = tokio::spawn(crate::stages::carry(call).in_current_span());
        let sleep = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline));
        // A non-abortable call is not stopped by an interlock that opens:
        // Tether cannot abort it, so it ends within its lease or duration
        // (the interlock gated its start, and gates the next call).
        let gated = if b.abortable {
            gating_interlocks(dev, b)
        } else {
            Vec::new()
        };
        let watch = self.watch_interlocks(dev, b, &gated);
        tokio::select! {
            joined = &mut handle => DriverOutcome::Returned(joined.unwrap_or_else(|_| Err(driver_panicked()))),
            () = sleep => {
                cancel.cancel();
                match tokio::time::timeout(CANCEL_GRACE, &mut handle).await {
                    Ok(joined) => DriverOutcome::DeadlineCancelled(joined.unwrap_or(Err(Signal::Cancelled))),
                    Err(_) => DriverOutcome::Abandoned,
                }
            }
            opened = watch => {
                // An interlock that opens while the operation runs stops it.
                cancel.cancel();
                match tokio::time::timeout(CANCEL_GRACE, &mut handle).await {
                    Ok(joined) => DriverOutcome::InterlockOpened(joined.unwrap_or(Err(Signal::Cancelled)), opened),
                    Err(_) => DriverOutcome::Abandoned,
                }
            }
        }
    }

    /// Resolves (with the open interlocks) when a gating interlock of the
    /// running operation stops reading closed; never resolves otherwise.
    pub(crate) async fn watch_interlocks(
        &self,
        dev: &DeviceRt,
        _b: &BindingSpec,
        gated: &[usize],
    ) -> Value {
        if gated.is_empty() {
            return std::future::pending().await;
        }
        let mut tick = tokio::time::interval(Duration::from_millis(INTERLOCK_POLL_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Runs as long as the operation; the select! above drops it when the call ends.
        loop {
            tick.tick().await;
            let open = open_interlocks(dev, gated);
            if !open.is_empty() {
                return json!(open);
            }
        }
    }
}
