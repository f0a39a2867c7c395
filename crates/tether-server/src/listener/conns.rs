//! The connection table: every open connection of the network listeners,
//! what it is doing (quiet, a request in flight, an answer still being
//! flushed), and the admission of a new one against the bounds — in total
//! (`connections_max`) and per peer address (`connections_per_peer_max`).
//!
//! At a bound, a quiet connection is shed to make room: one whose headers
//! are not complete (stalled: everything it sent was read, and it sends no
//! more) or that waits for its next request (idle keep-alive), the one
//! quiet the longest first. A connection with a request in flight, whose
//! answer is not yet flushed, or that was accepted and not yet read (its
//! request may be waiting in the socket: an e-stop sent at once must never
//! be shed before it is read) is never shed.
//! When nothing can be shed, the new connection is admitted *screened*
//! (a small pool of its own, [`SCREENED_CONNECTIONS_MAX`]): it is served
//! one request, and only an e-stop is served there (`super::screen`); the
//! rest are answered `429`. On loopback every client shares one address,
//! so the bounds alone could never keep room for an e-stop: shedding does.
//!
//! **Never belongs here:** reading or answering requests (`super`,
//! `super::screen`), and what a request means (the surfaces).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// Connections admitted beyond the bounds, at most, each served one request
/// and only if it is an e-stop. Small: they exist so that an e-stop finds
/// room when every admitted connection has a request in flight.
pub const SCREENED_CONNECTIONS_MAX: usize = 64;

/// Accepted, not yet waiting for the client (its first bytes may be in the
/// socket unread): never shed.
const FRESH: u8 = 4;
/// Waiting for the client, no request in flight, nothing left to flush:
/// may be shed.
const QUIET: u8 = 0;
/// A request is in flight (from its headers to the end of its answer).
const BUSY: u8 = 1;
/// The answer's body ended; its last bytes may still be in a buffer.
const DRAINING: u8 = 2;
/// Shed: the connection is being closed; a request arriving now is not
/// served (it never started).
const SHED: u8 = 3;

/// One connection's state, shared by the table, its task and its IO.
#[derive(Debug)]
pub(super) struct ConnState {
    state: AtomicU8,
    /// Milliseconds since the table's epoch at which it last became quiet.
    quiet_since_ms: AtomicU64,
    /// Cancelled when the connection is shed: its task drops it.
    shed: CancellationToken,
    epoch: Instant,
}

impl ConnState {
    fn new(epoch: Instant) -> Self {
        Self {
            state: AtomicU8::new(FRESH),
            quiet_since_ms: AtomicU64::new(ms_since(epoch)),
            shed: CancellationToken::new(),
            epoch,
        }
    }

    /// A request arrived: the connection is busy until its answer is
    /// flushed. `false` when the connection was shed already (the request
    /// must not start: the connection is being closed).
    pub(super) fn begin(&self) -> bool {
        loop {
            let now = self.state.load(Ordering::SeqCst);
            if now == SHED {
                return false;
            }
            if self
                .state
                .compare_exchange(now, BUSY, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                return true;
            }
        }
    }

    /// A read found nothing more to read: a fresh connection is now waiting
    /// for its client (quiet).
    pub(super) fn waiting(&self) {
        if self
            .state
            .compare_exchange(FRESH, QUIET, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            self.quiet_since_ms
                .store(ms_since(self.epoch), Ordering::SeqCst);
        }
    }

    /// The answer's body ended (or was dropped): quiet once flushed.
    pub(super) fn answered(&self) {
        let _ = self
            .state
            .compare_exchange(BUSY, DRAINING, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// The connection's writes were flushed: an answer that ended is out.
    pub(super) fn flushed(&self) {
        if self
            .state
            .compare_exchange(DRAINING, QUIET, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            self.quiet_since_ms
                .store(ms_since(self.epoch), Ordering::SeqCst);
        }
    }

    /// Resolves when the connection is shed.
    pub(super) fn shed_token(&self) -> CancellationToken {
        self.shed.clone()
    }

    /// At shutdown: closes the connection now if no request is in flight
    /// on it (`true`); one with a request in flight is left to answer it.
    pub(super) fn close_if_quiet(&self) -> bool {
        let _ = self
            .state
            .compare_exchange(FRESH, QUIET, Ordering::SeqCst, Ordering::SeqCst);
        self.try_shed()
    }

    /// Sheds the connection if it is quiet; `false` when it is not.
    fn try_shed(&self) -> bool {
        let shed = self
            .state
            .compare_exchange(QUIET, SHED, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
        if shed {
            self.shed.cancel();
        }
        shed
    }

    fn quiet_since(&self) -> Option<u64> {
        (self.state.load(Ordering::SeqCst) == QUIET)
            .then(|| self.quiet_since_ms.load(Ordering::SeqCst))
    }
}

fn ms_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The bounds a table enforces.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Connections open at once, in total (screened ones aside).
    pub connections_max: usize,
    /// Connections open at once from one peer address.
    pub connections_per_peer_max: usize,
}

struct Entry {
    peer: IpAddr,
    screened: bool,
    conn: Arc<ConnState>,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    entries: HashMap<u64, Entry>,
    per_peer: HashMap<IpAddr, usize>,
    admitted: usize,
    screened: usize,
    shed_total: u64,
}

impl Inner {
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.entries.remove(&id)?;
        if entry.screened {
            self.screened = self.screened.saturating_sub(1);
        } else {
            self.admitted = self.admitted.saturating_sub(1);
            if let Some(n) = self.per_peer.get_mut(&entry.peer) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.per_peer.remove(&entry.peer);
                }
            }
        }
        Some(entry)
    }

    /// Sheds the connection quiet the longest among those `pick` accepts;
    /// `false` when none is quiet. One pass over the table per candidate
    /// that stopped being quiet meanwhile, so at most `entries` passes.
    fn shed_oldest(&mut self, pick: impl Fn(&Entry) -> bool) -> bool {
        for _ in 0..=self.entries.len() {
            let victim = self
                .entries
                .iter()
                .filter(|(_, e)| pick(e))
                .filter_map(|(id, e)| e.conn.quiet_since().map(|t| (t, *id)))
                .min();
            let Some((_, id)) = victim else {
                return false;
            };
            let shed = self.entries.get(&id).is_some_and(|e| e.conn.try_shed());
            if shed {
                self.remove(id);
                self.shed_total = self.shed_total.saturating_add(1);
                return true;
            }
        }
        false
    }
}

/// Every open connection of the listeners that share it.
pub struct ConnTable {
    bounds: Bounds,
    epoch: Instant,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for ConnTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnTable")
            .field("bounds", &self.bounds)
            .finish_non_exhaustive()
    }
}

/// An admitted connection; dropping it takes the connection off the table.
pub(super) struct Admitted {
    table: Arc<ConnTable>,
    id: u64,
    /// Its state, shared with its task and its IO.
    pub(super) conn: Arc<ConnState>,
    /// Admitted beyond the bounds: one request, and only an e-stop is served.
    pub(super) screened: bool,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if let Ok(mut inner) = self.table.inner.lock() {
            inner.remove(self.id);
        }
    }
}

/// What the table holds, for logs and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Occupancy {
    /// Connections admitted within the bounds.
    pub admitted: usize,
    /// Screened connections.
    pub screened: usize,
    /// Connections shed since the table was made.
    pub shed_total: u64,
}

impl ConnTable {
    /// An empty table enforcing `bounds` (each at least 1; the per-peer
    /// bound at most the total).
    pub fn new(bounds: Bounds) -> Self {
        let connections_max = bounds.connections_max.max(1);
        let bounds = Bounds {
            connections_max,
            connections_per_peer_max: bounds.connections_per_peer_max.clamp(1, connections_max),
        };
        Self {
            bounds,
            epoch: Instant::now(),
            inner: Mutex::new(Inner::default()),
        }
    }

    /// The bounds in force.
    pub fn bounds(&self) -> Bounds {
        self.bounds
    }

    /// What the table holds now.
    pub fn occupancy(&self) -> Occupancy {
        self.inner.lock().map_or(
            Occupancy {
                admitted: 0,
                screened: 0,
                shed_total: 0,
            },
            |i| Occupancy {
                admitted: i.admitted,
                screened: i.screened,
                shed_total: i.shed_total,
            },
        )
    }

    /// Admits a connection from `peer`: within the bounds (shedding a quiet
    /// connection of that peer, or any quiet one, when a bound is reached),
    /// else screened (shedding a quiet screened one when that pool is
    /// full); `None` when even that pool holds only requests in flight.
    pub(super) fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<Admitted> {
        let mut inner = self.inner.lock().ok()?;
        let peer_full =
            inner.per_peer.get(&peer).copied().unwrap_or(0) >= self.bounds.connections_per_peer_max;
        let room = if peer_full {
            inner.shed_oldest(|e| !e.screened && e.peer == peer)
        } else if inner.admitted >= self.bounds.connections_max {
            inner.shed_oldest(|e| !e.screened)
        } else {
            true
        };
        let screened = !room;
        if screened
            && inner.screened >= SCREENED_CONNECTIONS_MAX
            && !inner.shed_oldest(|e| e.screened)
        {
            return None;
        }
        let id = inner.next_id;
        inner.next_id = inner.next_id.wrapping_add(1);
        let conn = Arc::new(ConnState::new(self.epoch));
        if screened {
            inner.screened += 1;
        } else {
            inner.admitted += 1;
            *inner.per_peer.entry(peer).or_insert(0) += 1;
        }
        inner.entries.insert(
            id,
            Entry {
                peer,
                screened,
                conn: Arc::clone(&conn),
            },
        );
        drop(inner);
        Some(Admitted {
            table: Arc::clone(self),
            id,
            conn,
            screened,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn table(max: usize, per_peer: usize) -> Arc<ConnTable> {
        Arc::new(ConnTable::new(Bounds {
            connections_max: max,
            connections_per_peer_max: per_peer,
        }))
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    /// Admits a connection that then waits for its client (quiet).
    fn quiet(t: &Arc<ConnTable>, peer: IpAddr) -> Admitted {
        let a = t.admit(peer).unwrap();
        a.conn.waiting();
        a
    }

    #[test]
    fn a_connection_not_yet_read_is_never_shed() {
        let t = table(1, 1);
        let fresh = t.admit(ip(1)).unwrap();
        let next = t.admit(ip(1)).unwrap();
        assert!(next.screened, "the only connection is unread: screened");
        assert!(!fresh.conn.shed_token().is_cancelled());
        fresh.conn.waiting();
        let last = t.admit(ip(1)).unwrap();
        assert!(!last.screened);
        assert!(fresh.conn.shed_token().is_cancelled());
    }

    #[test]
    fn at_the_bound_the_oldest_quiet_connection_is_shed() {
        let t = table(2, 2);
        let a = quiet(&t, ip(1));
        let b = quiet(&t, ip(1));
        let c = t.admit(ip(1)).unwrap();
        assert!(!c.screened);
        assert!(a.conn.shed_token().is_cancelled(), "the oldest is shed");
        assert!(!b.conn.shed_token().is_cancelled());
        assert_eq!(t.occupancy().admitted, 2);
        assert_eq!(t.occupancy().shed_total, 1);
    }

    #[test]
    fn a_connection_with_a_request_in_flight_is_never_shed() {
        let t = table(1, 1);
        let busy = t.admit(ip(1)).unwrap();
        assert!(busy.conn.begin());
        let next = t.admit(ip(1)).unwrap();
        assert!(next.screened, "no room and nothing quiet: screened");
        assert!(!busy.conn.shed_token().is_cancelled());
        // Answered but not flushed: still not shed.
        busy.conn.answered();
        let again = t.admit(ip(1)).unwrap();
        assert!(again.screened);
        assert!(!busy.conn.shed_token().is_cancelled());
        // Flushed: now it may go.
        busy.conn.flushed();
        let last = t.admit(ip(1)).unwrap();
        assert!(!last.screened);
        assert!(busy.conn.shed_token().is_cancelled());
        assert!(
            !busy.conn.begin(),
            "a request on a shed connection never starts"
        );
    }

    #[test]
    fn the_per_peer_bound_sheds_that_peers_connections_only() {
        let t = table(10, 2);
        let other = quiet(&t, ip(9));
        let a = quiet(&t, ip(1));
        let _b = quiet(&t, ip(1));
        let _c = t.admit(ip(1)).unwrap();
        assert!(a.conn.shed_token().is_cancelled());
        assert!(!other.conn.shed_token().is_cancelled());
    }

    #[test]
    fn the_screened_pool_is_bounded_and_sheds_its_own_quiet_ones() {
        let t = table(1, 1);
        let busy = t.admit(ip(1)).unwrap();
        assert!(busy.conn.begin());
        let mut screened: Vec<_> = (0..SCREENED_CONNECTIONS_MAX)
            .map(|_| quiet(&t, ip(1)))
            .collect();
        assert!(screened.iter().all(|s| s.screened));
        assert_eq!(t.occupancy().screened, SCREENED_CONNECTIONS_MAX);
        // Full of quiet ones: the oldest makes room.
        let more = t.admit(ip(1)).unwrap();
        assert!(more.screened);
        assert!(screened[0].conn.shed_token().is_cancelled());
        // Full of requests in flight: refused.
        assert!(more.conn.begin());
        for s in &mut screened[1..] {
            assert!(s.conn.begin());
        }
        assert!(t.admit(ip(1)).is_none());
    }

    #[test]
    fn a_closed_connection_leaves_the_table() {
        let t = table(1, 1);
        let a = t.admit(ip(1)).unwrap();
        drop(a);
        assert_eq!(t.occupancy().admitted, 0);
        let b = t.admit(ip(1)).unwrap();
        assert!(!b.screened);
    }
}
