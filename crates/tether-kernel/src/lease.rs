//! The leased-command runner.
//!
//! A physical command that runs in a controller outside this process is sent
//! with a lease. While the call runs the runner renews the lease at half its
//! length; when the call is cancelled it stops renewing and sends the
//! controller's own stop. If this process dies nothing renews, and the
//! controller stops by itself when the lease lapses — the reason leases exist.
//! A stop that arrives while the command is still being sent is honoured: the
//! runner stops as soon as the send returns.

use crate::driver::{BoxFuture, CancelToken, Signal};
use serde_json::Value;
use std::time::Duration;

/// Where a leased command stands after a renewal.
#[derive(Debug, Clone, PartialEq)]
pub enum Progress {
    /// Still running; the lease was extended.
    Running,
    /// Finished; the capability output.
    Done(Value),
}

/// A controller that runs commands under a lease.
pub trait LeasedController: Send {
    /// Starts the command with a lease.
    fn send(&mut self, lease: Duration) -> BoxFuture<'_, Result<(), Signal>>;
    /// Extends the lease and reports progress.
    fn renew(&mut self, lease: Duration) -> BoxFuture<'_, Result<Progress, Signal>>;
    /// The controller's own stop.
    fn stop(&mut self) -> BoxFuture<'_, Result<(), Signal>>;
}

/// Runs one leased command to its end, renewing at half the lease, for at
/// most `duration_max` (then it is stopped and its outcome is unknown).
///
/// # Errors
/// `Cancelled` after a cancellation (the controller's stop was sent);
/// `OutcomeUnknown` when the controller cannot be reached or the bound passed;
/// the controller's own signals otherwise.
pub async fn run_leased(
    ctrl: &mut dyn LeasedController,
    lease: Duration,
    duration_max: Duration,
    cancel: &CancelToken,
) -> Result<Value, Signal> {
    assert!(
        lease >= Duration::from_millis(2),
        "a lease shorter than 2 ms cannot be renewed at half its length"
    );
    // Sending is not interrupted (a half-written command is worse than a
    // complete one followed by a stop); a stop that came meanwhile is
    // honoured right after.
    ctrl.send(lease).await?;
    if cancel.is_cancelled() {
        let _ = ctrl.stop().await;
        return Err(Signal::Cancelled);
    }
    let renew_every = lease / 2;
    let rounds_max = (duration_max.as_millis() / renew_every.as_millis().max(1)) as u64 + 1;
    for _ in 0..rounds_max {
        tokio::select! {
            () = tokio::time::sleep(renew_every) => {}
            () = cancel.cancelled() => {
                let _ = ctrl.stop().await;
                return Err(Signal::Cancelled);
            }
        }
        match ctrl.renew(lease).await {
            Ok(Progress::Running) => {}
            Ok(Progress::Done(out)) => return Ok(out),
            Err(Signal::OutcomeUnknown { message }) => {
                // Unreachable controller: it will stop itself within one lease.
                return Err(Signal::OutcomeUnknown {
                    message: format!(
                        "{message}; the controller stops itself when the lease lapses"
                    ),
                });
            }
            Err(other) => return Err(other),
        }
    }
    let _ = ctrl.stop().await;
    Err(Signal::OutcomeUnknown {
        message: "the command outlived its longest duration and was stopped".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::{Arc, Mutex};

    #[derive(Default)]
    struct Script {
        log: Arc<Mutex<Vec<String>>>,
        renewals_until_done: usize,
    }

    impl LeasedController for Script {
        fn send(&mut self, _lease: Duration) -> BoxFuture<'_, Result<(), Signal>> {
            Box::pin(async move {
                self.log.lock().map(|mut l| l.push("send".into())).ok();
                Ok(())
            })
        }
        fn renew(&mut self, _lease: Duration) -> BoxFuture<'_, Result<Progress, Signal>> {
            Box::pin(async move {
                self.log.lock().map(|mut l| l.push("renew".into())).ok();
                if self.renewals_until_done == 0 {
                    return Ok(Progress::Done(json!({"ok": true})));
                }
                self.renewals_until_done -= 1;
                Ok(Progress::Running)
            })
        }
        fn stop(&mut self) -> BoxFuture<'_, Result<(), Signal>> {
            Box::pin(async move {
                self.log.lock().map(|mut l| l.push("stop".into())).ok();
                Ok(())
            })
        }
    }

    #[tokio::test]
    async fn renews_until_done_without_stopping() {
        let mut c = Script {
            renewals_until_done: 2,
            ..Script::default()
        };
        let out = run_leased(
            &mut c,
            Duration::from_millis(20),
            Duration::from_secs(5),
            &CancelToken::new(),
        )
        .await;
        assert_eq!(out, Ok(json!({"ok": true})));
        assert_eq!(
            c.log.lock().map(|l| l.clone()).unwrap_or_default(),
            vec!["send", "renew", "renew", "renew"]
        );
    }

    #[tokio::test]
    async fn cancellation_stops_renewing_and_sends_the_controller_stop() {
        let mut c = Script {
            renewals_until_done: 1_000,
            ..Script::default()
        };
        let cancel = CancelToken::new();
        let trigger = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(35)).await;
            trigger.cancel();
        });
        let out = run_leased(
            &mut c,
            Duration::from_millis(20),
            Duration::from_secs(5),
            &cancel,
        )
        .await;
        assert_eq!(out, Err(Signal::Cancelled));
        let log = c.log.lock().map(|l| l.clone()).unwrap_or_default();
        assert_eq!(log.last().map(String::as_str), Some("stop"));
        assert!(log.iter().filter(|x| *x == "renew").count() <= 4, "{log:?}");
    }

    #[tokio::test]
    async fn a_stop_that_arrives_while_sending_is_honoured() {
        let mut c = Script {
            renewals_until_done: 1_000,
            ..Script::default()
        };
        let cancel = CancelToken::new();
        cancel.cancel();
        let out = run_leased(
            &mut c,
            Duration::from_millis(20),
            Duration::from_secs(5),
            &cancel,
        )
        .await;
        assert_eq!(out, Err(Signal::Cancelled));
        assert_eq!(
            c.log.lock().map(|l| l.clone()).unwrap_or_default(),
            vec!["send", "stop"]
        );
    }
}
