//! What a point-mapped driver's tasks share: the state mirror, the link,
//! the watchdog feed and the stop epoch — the same for every protocol.
//!
//! **Owns:** the mirror of every polled point with the time its request was
//! sent (a reading is fresh for `stale` after that), the link state shown to
//! operators, and the rules of feeding the watchdog (armed just before a
//! command, disarmed when the device reads disabled after the last command
//! ended, or by a stop). Everything here is quick and never awaits.
//! **Never here:** I/O (each protocol's `tasks`), what a point means.
//! **Used by:** `modbus::shared`, `opcua`.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tether_kernel::Link;

/// One mirrored reading.
#[derive(Debug, Clone)]
pub struct Sample<N> {
    /// When the request that read it was sent.
    pub at: Instant,
    /// The reading, or why the device refused it.
    pub value: Result<N, String>,
}

/// The watchdog feed.
#[derive(Debug, Default)]
struct Feed {
    /// Whether the feeder writes the watchdog point.
    armed: bool,
    /// When the last command ended (a disabled reading sent after it disarms).
    quiet_since: Option<Instant>,
    /// The value written next.
    counter: u32,
}

/// How the mirror learns that the device reads disabled.
#[derive(Debug, Clone)]
pub struct Enabled<K, N> {
    /// The point of the device's enabled reading.
    pub key: K,
    /// The reading that means disabled.
    pub disabled: N,
}

/// State shared by a driver and its tasks. `K` names a point, `N` is a
/// native reading.
#[derive(Debug)]
pub struct Mirror<K, N> {
    stale: Duration,
    /// The enabled reading, when the device has a watchdog to feed.
    watchdog: Option<Enabled<K, N>>,
    samples: Mutex<HashMap<K, Sample<N>>>,
    link: Mutex<Link>,
    feed: Mutex<Feed>,
    /// Commands running now (the feed is never disarmed under one).
    pub calls_in_flight: AtomicUsize,
    /// Command writes sent and not yet answered (a stop re-asserts itself
    /// after them: the device may apply them after the stop's own writes).
    pub writes_in_flight: AtomicUsize,
    /// Bumped by every stop: a command that sees it move sends nothing more.
    pub stop_epoch: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain data: a panic elsewhere leaves it consistent.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<K: Hash + Eq + Clone, N: Clone + PartialEq> Mirror<K, N> {
    /// Fresh state: disconnected since now, nothing mirrored, feed disarmed
    /// (a restarted endpoint never resumes its predecessor's feeding).
    /// `watchdog` is `None` when the device has no watchdog to feed.
    pub fn new(stale: Duration, watchdog: Option<Enabled<K, N>>) -> Self {
        Self {
            stale,
            watchdog,
            samples: Mutex::new(HashMap::new()),
            link: Mutex::new(Link {
                connected: false,
                since_ms: crate::now_ms(),
                last_error: None,
            }),
            feed: Mutex::new(Feed::default()),
            calls_in_flight: AtomicUsize::new(0),
            writes_in_flight: AtomicUsize::new(0),
            stop_epoch: AtomicU64::new(0),
        }
    }

    /// Records a reading.
    pub fn record(&self, key: K, sample: Sample<N>) {
        lock(&self.samples).insert(key, sample);
    }

    /// A reading younger than the freshness bound.
    ///
    /// # Errors
    /// Why there is none: never read, too old, or refused by the device.
    pub fn fresh(&self, key: &K) -> Result<N, String> {
        let samples = lock(&self.samples);
        let Some(s) = samples.get(key) else {
            return Err("not read from the device yet".into());
        };
        let age = s.at.elapsed();
        if age > self.stale {
            return Err(format!(
                "last read {} ms ago (fresh for {} ms)",
                age.as_millis(),
                self.stale.as_millis()
            ));
        }
        s.value.clone()
    }

    /// The sample itself, whatever its age.
    pub fn sample(&self, key: &K) -> Option<Sample<N>> {
        lock(&self.samples).get(key).cloned()
    }

    /// The link now.
    pub fn link(&self) -> Link {
        lock(&self.link).clone()
    }

    /// The link answered.
    pub fn link_up(&self) {
        let mut l = lock(&self.link);
        if !l.connected {
            l.connected = true;
            l.since_ms = crate::now_ms();
        }
    }

    /// The link failed; `error` is already filtered.
    pub fn link_down(&self, error: String) {
        let mut l = lock(&self.link);
        if l.connected {
            l.connected = false;
            l.since_ms = crate::now_ms();
        }
        l.last_error = Some(error);
    }

    /// A native error seen on a lane that did not break the link.
    pub fn note_error(&self, error: String) {
        lock(&self.link).last_error = Some(error);
    }

    /// Arms the feed for a command about to start; the next value to write.
    pub fn arm(&self) -> Option<u32> {
        self.watchdog.as_ref()?;
        let mut f = lock(&self.feed);
        f.armed = true;
        f.quiet_since = None;
        f.counter = f.counter.wrapping_add(1);
        Some(f.counter)
    }

    /// A command ended: a disabled reading sent after now disarms the feed.
    pub fn call_ended(&self) {
        lock(&self.feed).quiet_since = Some(Instant::now());
    }

    /// Stops feeding (a stop, or the device reads disabled).
    pub fn disarm(&self) {
        lock(&self.feed).armed = false;
    }

    /// The value the feeder writes now, if armed.
    pub fn next_feed(&self) -> Option<u32> {
        let mut f = lock(&self.feed);
        if !f.armed {
            return None;
        }
        f.counter = f.counter.wrapping_add(1);
        Some(f.counter)
    }

    /// Whether the feed is armed.
    pub fn armed(&self) -> bool {
        lock(&self.feed).armed
    }

    /// Disarms the feed when the device's enabled reading, read after the
    /// last command ended and with none running, says disabled.
    pub fn disarm_if_disabled(&self) {
        let Some(enabled) = self.watchdog.as_ref() else {
            return;
        };
        if self.calls_in_flight.load(Ordering::SeqCst) > 0 {
            return;
        }
        let sample = self.sample(&enabled.key);
        let mut f = lock(&self.feed);
        let Some(quiet) = f.quiet_since else {
            return;
        };
        if let Some(Sample { at, value: Ok(v) }) = sample {
            if at > quiet && v == enabled.disabled {
                f.armed = false;
            }
        }
    }
}

/// What a point-mapped driver's `Driver` methods share: answers from the
/// mirror, a call handed to the driver's runtime, a stop waited for within
/// its deadline.
pub mod answer {
    use crate::mapping::{Field, Interlock, Point};
    use serde_json::{Map, Value};
    use std::time::Instant;
    use tether_kernel::{InterlockState, Signal};

    fn unknown(message: String) -> Signal {
        Signal::OutcomeUnknown { message }
    }

    /// A resource's state from the mirror (`fresh` reads one point's fresh
    /// reading): unknown when any field is stale, unread or undecodable.
    ///
    /// # Errors
    /// `OutcomeUnknown` naming the field and why.
    pub fn read<P: Point>(
        fields: &[Field<P>],
        fresh: impl Fn(&P) -> Result<P::Native, String>,
    ) -> Result<Value, Signal> {
        let mut doc = Map::new();
        for f in fields {
            let native = fresh(&f.point).map_err(|e| {
                unknown(format!(
                    "`{}` ({}) is unknown: {e}",
                    f.name,
                    f.point.label()
                ))
            })?;
            let v = f
                .point
                .decode(&native)
                .map_err(|e| unknown(format!("`{}`: {e}", f.name)))?;
            doc.insert(f.name.clone(), v);
        }
        Ok(Value::Object(doc))
    }

    /// Each interlock's state from the mirror: closed only when its fresh
    /// reading is the closed value; a stale or unread one is unknown.
    pub fn interlocks<P: Point>(
        ils: &[Interlock<P>],
        fresh: impl Fn(&P) -> Result<P::Native, String>,
    ) -> Vec<(String, InterlockState)> {
        ils.iter()
            .map(|il| {
                let state = match (fresh(&il.point), il.point.encode(&il.closed)) {
                    (Ok(reading), Ok(closed)) if reading == closed => InterlockState::Closed,
                    (Ok(_), Ok(_)) => InterlockState::Open,
                    _ => InterlockState::Unknown,
                };
                (il.id.clone(), state)
            })
            .collect()
    }

    /// How long a call may run when the kernel gives no deadline (it always
    /// does; this only bounds the wait if it ever did not).
    const CALL_MAX: std::time::Duration = std::time::Duration::from_secs(30);

    /// What a call runs from: its target's steps, its capability and input,
    /// and its deadline.
    pub type CallParts<T> = (Vec<T>, (String, Value), Instant);

    /// The parts of a call from the witness and the map's targets.
    ///
    /// # Errors
    /// `Failed` (`unknown_target`) when the map has no steps for its target.
    pub fn call_parts<T: Clone>(
        targets: &std::collections::BTreeMap<String, Vec<T>>,
        call: &tether_kernel::Authorized,
    ) -> Result<CallParts<T>, Signal> {
        let target = call.target();
        let steps = targets.get(target).cloned().ok_or_else(|| Signal::Failed {
            reason: "unknown_target".into(),
            message: format!("the device's map has no target `{target}`"),
        })?;
        let input = (call.capability_id().to_owned(), call.input().clone());
        let until = call.deadline().unwrap_or_else(|| Instant::now() + CALL_MAX);
        Ok((steps, input, until))
    }

    /// Runs `call` on the driver's runtime and answers its result (a task
    /// that ended abnormally is unknown).
    ///
    /// # Errors
    /// The call's own signal, or `OutcomeUnknown`.
    pub async fn on_runtime(
        runtime: &tokio::runtime::Handle,
        call: impl std::future::Future<Output = Result<Value, Signal>> + Send + 'static,
    ) -> Result<Value, Signal> {
        runtime
            .spawn(call)
            .await
            .unwrap_or_else(|_| Err(unknown("the driver's call task ended abnormally".into())))
    }

    /// Waits (blocking: the kernel's stop path is synchronous) for a native
    /// stop running on the driver's runtime, until `until`; unconfirmed by
    /// then is unknown, naming `peer`.
    ///
    /// # Errors
    /// The stop's own failure, or `OutcomeUnknown` past the deadline.
    pub fn stop_within(
        runtime: &tokio::runtime::Handle,
        stopping: impl std::future::Future<Output = Result<(), Signal>> + Send + 'static,
        until: Instant,
        peer: &str,
    ) -> Result<(), Signal> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        runtime.spawn(async move {
            let _ = tx.send(stopping.await);
        });
        match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
            Ok(r) => r,
            Err(_) => Err(unknown(format!(
                "the native stop was not confirmed by {peer} within its deadline"
            ))),
        }
    }
}

/// The loops a point-mapped driver's lanes share: feeding the watchdog and
/// a stop that re-asserts itself after an in-flight command write.
pub mod lanes {
    use super::Mirror;
    use std::future::Future;
    use std::hash::Hash;
    use std::ops::Deref;
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, Weak};
    use std::time::{Duration, Instant};
    use tether_kernel::Signal;

    /// Feeds the watchdog every third of `period` while armed (so it changes
    /// at least twice per period even when one write is late), until the
    /// driver is dropped (the weak references end the loop). `feed` writes
    /// one value, bounded by the instant it is given.
    pub async fn feed_loop<S, L, K, N, F, Fut>(
        shared: Weak<S>,
        lanes: Weak<L>,
        period: Duration,
        feed: F,
    ) where
        S: Deref<Target = Mirror<K, N>>,
        K: Hash + Eq + Clone,
        N: Clone + PartialEq,
        F: Fn(Arc<S>, Arc<L>, u32, Instant) -> Fut,
        Fut: Future<Output = ()>,
    {
        let every = (period / 3).max(Duration::from_millis(5));
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let (Some(s), Some(l)) = (shared.upgrade(), lanes.upgrade()) else {
                return;
            };
            if let Some(v) = s.next_feed() {
                feed(s, l, v, Instant::now() + every).await;
            }
        }
    }

    /// Before each step of a call: a cancellation or a stop since `epoch`
    /// ends it — cancelled when nothing was sent, else unknown listing the
    /// steps `made` of `total`.
    ///
    /// # Errors
    /// As above.
    pub fn may_continue<K, N>(
        s: &Mirror<K, N>,
        cancel: &tether_kernel::CancelToken,
        epoch: u64,
        made: &[serde_json::Value],
        total: usize,
    ) -> Result<(), Signal>
    where
        K: Hash + Eq + Clone,
        N: Clone + PartialEq,
    {
        if !cancel.is_cancelled() && s.stop_epoch.load(Ordering::SeqCst) == epoch {
            return Ok(());
        }
        Err(if made.is_empty() {
            Signal::Cancelled
        } else {
            Signal::NativeUnknown {
                message: format!("stopped after {} of {total} writes", made.len()),
                native: serde_json::json!({"writes_made": made}),
            }
        })
    }

    /// A command write in flight (a stop re-asserts itself after it), for as
    /// long as the guard lives.
    pub struct InFlight<'a>(&'a std::sync::atomic::AtomicUsize);

    impl<'a> InFlight<'a> {
        /// Counts one more write in flight.
        pub fn new<K, N>(s: &'a Mirror<K, N>) -> Self {
            s.writes_in_flight.fetch_add(1, Ordering::SeqCst);
            InFlight(&s.writes_in_flight)
        }
    }

    impl Drop for InFlight<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// A call under way (the feed is never disarmed under one); ends it when
    /// dropped, so a disabled reading taken after it can disarm the feed.
    pub struct CallGuard<'a, K: Hash + Eq + Clone, N: Clone + PartialEq>(&'a Mirror<K, N>);

    impl<'a, K: Hash + Eq + Clone, N: Clone + PartialEq> CallGuard<'a, K, N> {
        /// Starts a call: refused when already cancelled; answers the stop
        /// epoch it runs under and the watchdog value to feed just before it
        /// (the device sees the feed move first).
        ///
        /// # Errors
        /// `Cancelled`.
        pub fn begin(
            s: &'a Mirror<K, N>,
            cancel: &tether_kernel::CancelToken,
        ) -> Result<(Self, u64, Option<u32>), Signal> {
            let epoch = s.stop_epoch.load(Ordering::SeqCst);
            if cancel.is_cancelled() {
                return Err(Signal::Cancelled);
            }
            s.calls_in_flight.fetch_add(1, Ordering::SeqCst);
            let feed = s.arm();
            Ok((CallGuard(s), epoch, feed))
        }
    }

    impl<K: Hash + Eq + Clone, N: Clone + PartialEq> Drop for CallGuard<'_, K, N> {
        fn drop(&mut self) {
            self.0.calls_in_flight.fetch_sub(1, Ordering::SeqCst);
            self.0.call_ended();
        }
    }

    /// The native stop: bumps the stop epoch (a running target sends nothing
    /// more), disarms the feed and runs `send` once by `until`. A command
    /// write that was in flight may still be applied after it, so once that
    /// write has been answered the stop is sent again in the background,
    /// bounded by twice `request_timeout`.
    ///
    /// # Errors
    /// The first send's failure.
    pub async fn stop_and_reassert<S, K, N, F, Fut>(
        s: Arc<S>,
        request_timeout: Duration,
        until: Instant,
        send: F,
    ) -> Result<(), Signal>
    where
        S: Deref<Target = Mirror<K, N>> + Send + Sync + 'static,
        K: Hash + Eq + Clone,
        N: Clone + PartialEq,
        F: Fn(Instant) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), Signal>> + Send,
    {
        s.stop_epoch.fetch_add(1, Ordering::SeqCst);
        s.disarm();
        let pending = s.writes_in_flight.load(Ordering::SeqCst) > 0;
        send(until).await?;
        if pending {
            tokio::spawn(async move {
                let bound = Instant::now() + request_timeout * 2;
                // Bounded by `bound`: polls the counter every millisecond.
                while s.writes_in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < bound {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                if let Err(e) = send(Instant::now() + request_timeout).await {
                    s.note_error(format!("re-asserting the stop: {e:?}"));
                }
            });
        }
        Ok(())
    }
}
