//! The `Driver` trait: the seam between the kernel and devices.
//!
//! A driver translates; it never decides. It converts native units to the
//! declared ones at its boundary, reports every non-success as a [`Signal`],
//! observes cancellation, and returns promptly from `estop`. Every method that
//! touches a device takes an [`Authorized`] witness only the kernel can mint.

use crate::dispatch::authorized::Authorized;
use serde_json::Value;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

/// A boxed future, so the trait stays object-safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How a driver reports an outcome that is not a success.
#[derive(Debug, Clone, PartialEq)]
pub enum Signal {
    /// The call stopped because cancellation was requested.
    Cancelled,
    /// A failure the driver understands; nothing further happened.
    Failed {
        /// Short machine reason.
        reason: String,
        /// For people.
        message: String,
    },
    /// Refused by the device; nothing actuated.
    Busy,
    /// The effect may have happened (for example a native timeout).
    OutcomeUnknown {
        /// For people.
        message: String,
    },
    /// A failure the device reported: nothing happened. `native` (the
    /// native code, the writes made) goes to the receipt's details; the
    /// driver filters it, never forwarding a peer's text unbounded.
    NativeFailed {
        /// Short machine reason.
        reason: String,
        /// For people.
        message: String,
        /// What the device said, as data.
        native: Value,
    },
    /// The effect may have happened in part: `native` says what was done
    /// (for example the writes of a target made before one failed).
    NativeUnknown {
        /// For people.
        message: String,
        /// What is known to have been done, as data.
        native: Value,
    },
}

/// An interlock reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterlockState {
    /// Closed: the gated capabilities may run.
    Closed,
    /// Open: they may not.
    Open,
    /// Unknown counts as open.
    Unknown,
}

impl InterlockState {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            InterlockState::Closed => "closed",
            InterlockState::Open => "open",
            InterlockState::Unknown => "unknown",
        }
    }
}

/// A driver's link to its device (a network peer): what `mhs.devices.list`,
/// `mhs.safety.status` and `GET /healthz` show, and what the kernel latches
/// on when it stays down longer than the device's watchdog period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// Whether the driver holds a working connection to the device now.
    pub connected: bool,
    /// Wall-clock ms since which `connected` has held its current value.
    pub since_ms: u64,
    /// The last native failure seen on the link (filtered, for people),
    /// kept after a reconnect so an operator can see what happened.
    pub last_error: Option<String>,
}

/// Cooperative cancellation flag shared by the kernel and a running call.
#[derive(Clone, Debug, Default)]
pub struct CancelToken {
    inner: Arc<CancelInner>,
}

#[derive(Debug, Default)]
struct CancelInner {
    cancelled: AtomicBool,
    notify: Notify,
}

impl CancelToken {
    /// A fresh token.
    pub fn new() -> Self {
        Self::default()
    }
    /// Requests cancellation; idempotent.
    pub fn cancel(&self) {
        self.inner.cancelled.store(true, Ordering::SeqCst);
        self.inner.notify.notify_waiters();
    }
    /// Whether cancellation was requested.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::SeqCst)
    }
    /// Resolves once cancellation is requested.
    pub async fn cancelled(&self) {
        loop {
            let notified = self.inner.notify.notified();
            if self.is_cancelled() {
                return;
            }
            notified.await;
        }
    }
}

/// A device driver.
pub trait Driver: Send + Sync + 'static {
    /// The state document of the resource named by the witness, in declared
    /// units. Must be quick and side-effect free.
    fn read(&self, call: &Authorized) -> Result<Value, Signal>;

    /// Performs an admitted call and returns the capability output (never an
    /// `{output, state}` wrapper). Must observe `cancel` and the deadline.
    fn call(&self, call: Authorized, cancel: CancelToken) -> BoxFuture<'_, Result<Value, Signal>>;

    /// Whether a call's first poll always returns at once, without blocking
    /// the thread: an in-process simulator that computes its answer or starts
    /// a timer. The kernel then polls each call once on the caller's task and
    /// spares it a task of its own when it finishes there (one caller's
    /// command costs a spawn and two cross-thread wake-ups less). The default
    /// is `false`: every call runs in its own task, so a call that blocks in
    /// a poll cannot hold its caller past the deadline.
    fn polls_promptly(&self) -> bool {
        false
    }

    /// The native stop. May run while a call is in flight; must not wait for
    /// a lock a running call holds; must return promptly.
    fn estop(&self, call: &Authorized) -> Result<(), Signal>;

    /// Interlock readings by id. An interlock the driver does not report is
    /// unknown, which blocks like open.
    fn interlocks(&self) -> Vec<(String, InterlockState)> {
        Vec::new()
    }

    /// The link to the device, for drivers that speak to a network peer;
    /// `None` for in-process simulators (nothing to lose). Must be quick.
    fn link(&self) -> Option<Link> {
        None
    }

    /// When the state a `read` of `resource` answers now was sampled (wall
    /// ms), for drivers that mirror a device's own reports (an MQTT state
    /// message's receive time); `None` means "now". Must be quick.
    fn sampled_at_ms(&self, _resource: &str) -> Option<u64> {
        None
    }
}
