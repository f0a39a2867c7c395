//! Sessions and grants (evaluation step 2).
//!
//! A session belongs to the principal that opened it, holds one grant per
//! binding, and never widens after open. An expired or closed session keeps
//! its record for a while so later use answers `MHS.SESSION.EXPIRED` rather
//! than `UNKNOWN`.

use crate::kernel::Principal;
use std::collections::{BTreeSet, HashMap};

/// How long an ended session's record is kept, ms.
const ENDED_RETENTION_MS: u64 = 3_600_000;

/// One session.
#[derive(Debug, Clone)]
pub struct Session {
    /// Opaque id.
    pub id: String,
    /// Owner.
    pub principal: Principal,
    /// (device index, binding index) pairs granted.
    pub grants: BTreeSet<(usize, usize)>,
    /// Lifetime without heartbeat, ms.
    pub ttl_ms: u64,
    /// Expiry, ms since the epoch.
    pub expires_at_ms: u64,
    /// Closed explicitly.
    pub closed: bool,
    /// Its end was handled (operations cancelled, safe-state actions run).
    pub reaped: bool,
}

/// Why a session check failed.
#[derive(Debug, PartialEq, Eq)]
pub enum SessionFault {
    /// Unknown id (or another principal's).
    Unknown,
    /// Expired or closed.
    Expired,
    /// Too many live sessions on the endpoint.
    Full,
    /// Too many live sessions of this principal.
    PrincipalFull,
}

/// The session table. Bounded by `max` live sessions, and by
/// `per_principal_max` for each principal, so one caller (a runaway agent)
/// can never take every session from the others — the operators included.
#[derive(Debug)]
pub struct Sessions {
    map: HashMap<String, Session>,
    max: usize,
    per_principal_max: usize,
}

impl Sessions {
    /// A table for at most `max` live sessions, a tenth of them (at least
    /// one) per principal.
    pub fn new(max: usize) -> Self {
        let max = max.max(1);
        Self {
            map: HashMap::new(),
            max,
            per_principal_max: (max / 10).max(1),
        }
    }

    fn live(s: &Session, now_ms: u64) -> bool {
        !s.closed && s.expires_at_ms > now_ms
    }

    /// Opens a session.
    pub fn open(&mut self, s: Session, now_ms: u64) -> Result<(), SessionFault> {
        self.prune(now_ms);
        let (live, own) = self
            .map
            .values()
            .filter(|x| Self::live(x, now_ms))
            .fold((0usize, 0usize), |(all, own), x| {
                (all + 1, own + usize::from(x.principal.id == s.principal.id))
            });
        if own >= self.per_principal_max {
            return Err(SessionFault::PrincipalFull);
        }
        if live >= self.max {
            return Err(SessionFault::Full);
        }
        self.map.insert(s.id.clone(), s);
        Ok(())
    }

    /// The live session `id` owned by `principal`.
    pub fn get(
        &self,
        id: &str,
        principal: &Principal,
        now_ms: u64,
    ) -> Result<&Session, SessionFault> {
        match self.map.get(id) {
            Some(s) if s.principal.id != principal.id => Err(SessionFault::Unknown),
            Some(s) if Self::live(s, now_ms) => Ok(s),
            Some(_) => Err(SessionFault::Expired),
            None => Err(SessionFault::Unknown),
        }
    }

    /// Extends a live session.
    pub fn heartbeat(
        &mut self,
        id: &str,
        principal: &Principal,
        now_ms: u64,
    ) -> Result<u64, SessionFault> {
        self.get(id, principal, now_ms)?;
        let s = self.map.get_mut(id).ok_or(SessionFault::Unknown)?;
        s.expires_at_ms = now_ms.saturating_add(s.ttl_ms);
        Ok(s.expires_at_ms)
    }

    /// Closes a live session.
    pub fn close(
        &mut self,
        id: &str,
        principal: &Principal,
        now_ms: u64,
    ) -> Result<(), SessionFault> {
        self.get(id, principal, now_ms)?;
        if let Some(s) = self.map.get_mut(id) {
            s.closed = true;
            s.expires_at_ms = s.expires_at_ms.min(now_ms);
        }
        Ok(())
    }

    /// Sessions that ended and were not handled yet; marks them handled.
    pub fn take_ended(&mut self, now_ms: u64) -> Vec<String> {
        let mut out = Vec::new();
        for s in self.map.values_mut() {
            if !s.reaped && !Self::live(s, now_ms) {
                s.reaped = true;
                out.push(s.id.clone());
            }
        }
        out
    }

    /// Marks one session's end as handled (an explicit close handles it itself).
    pub fn mark_reaped(&mut self, id: &str) {
        if let Some(s) = self.map.get_mut(id) {
            s.reaped = true;
        }
    }

    /// Devices a session (live or not) holds grants on.
    pub fn devices_of(&self, id: &str) -> Option<BTreeSet<usize>> {
        self.map
            .get(id)
            .map(|s| s.grants.iter().map(|&(d, _)| d).collect())
    }

    fn prune(&mut self, now_ms: u64) {
        self.map.retain(|_, s| {
            Self::live(s, now_ms) || s.expires_at_ms.saturating_add(ENDED_RETENTION_MS) > now_ms
        });
    }
}
