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
