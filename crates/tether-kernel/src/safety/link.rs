//! Device links: what a network driver reports of its connection to the
//! device ([`Driver::link`](crate::Driver::link)), shown in
//! `mhs.devices.list` and `mhs.safety.status`, weighed by `GET /healthz`,
//! and the link-loss latch.
//!
//! **Owns:** the wire shape of a link ([`link_json`]) and the link monitor,
//! started with the endpoint beside the session reaper. For each physical
//! (hardware or hybrid) device whose driver reports a link, the monitor
//! records each change of the link as evidence (`device.link`); for such a
//! device whose manifest declares `safety.watchdog_ms`, it trips the latch
//! when the link has been down longer than that — once per outage, through
//! the e-stop path (`estop.rs`: latch in memory, cancel, durable latch,
//! stop path, retried until it succeeds) with source `link`.
//! **Never belongs here:** reconnecting (the driver's duty), releasing the
//! latch (`reset.rs`: an operator's reset on hardware, refused while the
//! link is still down).
//! **Fail-closed rule:** an outage is measured both on the monotonic clock
//! (from when the monitor first saw it) and from the driver's wall-clock
//! `since_ms`, and the longer counts; a link never up since the driver
//! started is down since then. Tether's trip is a software envelope: the
//! controller's own watchdog and a hardware e-stop stay the device's
//! safety functions.

use crate::driver::Link;
use crate::kernel::Kernel;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tether_core::receipt::now_ms;
use tether_store::{Commit, EventDraft};

/// Fastest the monitor polls, ms: a device with a very short watchdog must
/// not make it spin (each round asks every physical driver for its link).
pub const LINK_POLL_MS_MIN: u64 = 10;
/// Slowest the monitor polls, ms: a link change shows in the evidence within
/// this, whatever the watchdog periods.
pub const LINK_POLL_MS_MAX: u64 = 250;
/// The monitor polls this many times per smallest watchdog period, so a trip
/// comes at most a tenth of the period late.
const LINK_POLLS_PER_WATCHDOG: u64 = 10;
/// Longest last error shown, characters (drivers filter it; this bounds it).
pub const LINK_ERROR_CHARS_MAX: usize = 200;

const _: () = assert!(LINK_POLL_MS_MIN * 10 <= LINK_POLL_MS_MAX);

/// The wire shape of a link: `{state, since_ms, last_error}`, `null` for a
/// driver that reports none.
pub(crate) fn link_json(link: Option<&Link>) -> Value {
    match link {
        None => Value::Null,
        Some(l) => json!({
            "state": if l.connected { "connected" } else { "reconnecting" },
            "since_ms": l.since_ms,
            "last_error": l.last_error.as_deref().map(|e| crate::bounds::cut(e, LINK_ERROR_CHARS_MAX)),
        }),
    }
}

/// The monitor's poll period for the smallest declared watchdog period (ms):
/// a tenth of it, within [`LINK_POLL_MS_MIN`]..=[`LINK_POLL_MS_MAX`];
/// [`LINK_POLL_MS_MAX`] when no device declares one.
pub fn link_poll_period(smallest_watchdog_ms: Option<u64>) -> Duration {
    let ms = smallest_watchdog_ms.map_or(LINK_POLL_MS_MAX, |w| w / LINK_POLLS_PER_WATCHDOG);
    Duration::from_millis(ms.clamp(LINK_POLL_MS_MIN, LINK_POLL_MS_MAX))
}

/// One outage of one device's link, as the monitor saw it.
#[derive(Debug, Clone, Copy)]
struct Outage {
    /// The driver's `since_ms` of the down link: a new value is a new outage.
    since_ms: u64,
    /// When the monitor first saw it down.
    seen: Instant,
    /// Whether this outage tripped (or found the device latched already).
    handled: bool,
}

/// What the monitor keeps per physical device.
#[derive(Debug, Default)]
struct Watched {
    /// The link state last seen (`None` before the first reading).
    connected: Option<bool>,
    outage: Option<Outage>,
}

impl Kernel {
    /// Starts the link monitor on `runtime` (aborted with it); `None` when
    /// no device is physical (nothing to watch).
    pub fn start_link_monitor(
        &self,
        runtime: &tokio::runtime::Handle,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let devices: Vec<usize> = (0..self.inner.devices.len())
            .filter(|&d| self.inner.devices[d].spec.manifest.mode.is_physical())
            .collect();
        if devices.is_empty() {
            return None;
        }
        let smallest = devices
            .iter()
            .filter_map(|&d| self.inner.devices[d].spec.manifest.safety.watchdog_ms)
            .min();
        let period = link_poll_period(smallest);
        let kernel = self.clone();
        Some(runtime.spawn(async move {
            let mut watched: Vec<Watched> = devices.iter().map(|_| Watched::default()).collect();
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // Runs for the life of the endpoint (aborted with the runtime);
            // each round asks each physical driver once (quick by contract).
            loop {
                tick.tick().await;
                for (&d, w) in devices.iter().zip(watched.iter_mut()) {
                    if let Some(reason) = kernel.watch_link(d, w) {
                        let k = kernel.clone();
                        // Its own task: a stop path within its budget never
                        // delays the watch of the other devices.
                        tokio::spawn(async move { k.trip_link_lost(d, &reason).await });
                    }
                }
            }
        }))
    }

    /// One reading of device `d`'s link: records a change, and answers the
    /// latch reason when this outage has just outlasted the watchdog period.
    fn watch_link(&self, d: usize, w: &mut Watched) -> Option<String> {
        let dev = &self.inner.devices[d];
        let link = dev.driver.link()?;
        if w.connected != Some(link.connected) && (w.connected.is_some() || !link.connected) {
            self.record(Commit {
                events: vec![EventDraft {
                    kind: "device.link".into(),
                    body: json!({"device_id": dev.id(), "link": link_json(Some(&link))}).into(),
                }],
                ..Commit::default()
            });
        }
        w.connected = Some(link.connected);
        if link.connected {
            w.outage = None;
            return None;
        }
        let outage = match w.outage {
            Some(o) if o.since_ms == link.since_ms => w.outage.insert(o),
            _ => w.outage.insert(Outage {
                since_ms: link.since_ms,
                seen: Instant::now(),
                handled: false,
            }),
        };
        let watchdog_ms = dev.spec.manifest.safety.watchdog_ms?;
        let seen_ms = u64::try_from(outage.seen.elapsed().as_millis()).unwrap_or(u64::MAX);
        let down_ms = seen_ms.max(now_ms().saturating_sub(link.since_ms));
        if outage.handled || down_ms <= watchdog_ms {
            return None;
        }
        outage.handled = true;
        if dev.latched.load(Ordering::SeqCst) {
            // Already stopped (an e-stop, a restored latch): the latch holds,
            // and a reset waits for the link (`reset.rs`).
            return None;
        }
        let error = link
            .last_error
            .as_deref()
            .map(|e| {
                format!(
                    "; last error: {}",
                    crate::bounds::cut(e, LINK_ERROR_CHARS_MAX)
                )
            })
            .unwrap_or_default();
        Some(format!(
            "link to the device lost for {down_ms} ms, longer than its watchdog period of {watchdog_ms} ms{error}"
        ))
    }

    /// The link-loss trip: the e-stop path with source `link`.
    async fn trip_link_lost(&self, d: usize, reason: &str) {
        tracing::error!(
            device_id = self.inner.devices[d].id(),
            reason,
            "the device's link stayed down past its watchdog period; latched"
        );
        let _ = self.trip_device(d, reason, SOURCE_LINK).await;
    }
}

/// The source of a link-loss latch (in its row and its `safety.estop` entry).
pub const SOURCE_LINK: &str = "link";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_poll_period_is_a_tenth_of_the_smallest_watchdog_within_its_bounds() {
        assert_eq!(link_poll_period(Some(1000)), Duration::from_millis(100));
        assert_eq!(
            link_poll_period(Some(20)),
            Duration::from_millis(LINK_POLL_MS_MIN)
        );
        assert_eq!(
            link_poll_period(Some(0)),
            Duration::from_millis(LINK_POLL_MS_MIN)
        );
        assert_eq!(
            link_poll_period(Some(60_000)),
            Duration::from_millis(LINK_POLL_MS_MAX)
        );
        assert_eq!(
            link_poll_period(None),
            Duration::from_millis(LINK_POLL_MS_MAX)
        );
    }

    #[test]
    fn a_link_is_shown_with_its_state_since_and_a_bounded_last_error() {
        assert_eq!(link_json(None), Value::Null);
        let l = Link {
            connected: false,
            since_ms: 7,
            last_error: Some("x".repeat(500)),
        };
        let v = link_json(Some(&l));
        assert_eq!(v["state"], "reconnecting");
        assert_eq!(v["since_ms"], 7);
        assert!(v["last_error"]
            .as_str()
            .is_some_and(|e| e.chars().count() <= LINK_ERROR_CHARS_MAX));
        let up = Link {
            connected: true,
            since_ms: 9,
            last_error: None,
        };
        assert_eq!(link_json(Some(&up))["state"], "connected");
        assert_eq!(link_json(Some(&up))["last_error"], Value::Null);
    }
}
