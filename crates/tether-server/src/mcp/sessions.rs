//! MCP HTTP sessions (`Mcp-Session-Id`): who opened each, and how many one
//! principal, and the endpoint, may hold at once.
//!
//! An `initialize` takes a slot of its principal before the SDK sees it
//! ([`Owners::reserve`]); a principal at its bound, or an endpoint at its
//! own, is refused `429` with `Retry-After` and `MHS.PROTOCOL.LIMIT`
//! (retryable) and no session is made. The SDK's session manager is wrapped
//! ([`BoundedSessions`]): a session it creates is noted, and a session that
//! ends — closed by `DELETE`, idle past the SDK's keep-alive, or with the
//! endpoint — frees its slot. A live session is never evicted to make room:
//! another principal's session keeps working whatever one principal does.
//!
//! **Owns:** the owner table, the bounds ([`SessionBounds`]) and their
//! defaults, the slot an `initialize` holds until its session is made.
//! **Never belongs here:** authentication and the request screen (`http.rs`),
//! the kernel sessions an MCP session opens (`mod.rs`, bounded by the kernel).
//! **Fail-closed rule:** a table that cannot be locked refuses new sessions
//! and reads every session as foreign.

use futures_core::Stream;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError,
};
use rmcp::transport::streamable_http_server::session::{EventStore, ServerSseMessage};
use rmcp::transport::streamable_http_server::{SessionId, SessionManager};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// MCP sessions the endpoint holds at once, by default. An idle session
/// costs about 135 KB and lives 300 s without a request (the SDK's
/// keep-alive), so the default bounds them near 70 MB.
pub const MCP_SESSIONS_MAX_DEFAULT: usize = 512;
/// MCP sessions one principal holds at once, by default: an agent needs one
/// per conversation; a sixteenth of the endpoint's leaves room for others.
pub const MCP_SESSIONS_PER_PRINCIPAL_MAX_DEFAULT: usize = 32;
/// Largest endpoint bound a config may set.
pub const MCP_SESSIONS_LIMIT: usize = 65_536;
/// Seconds a client refused for a bound is told to wait (`Retry-After`).
pub const RETRY_AFTER_S: u64 = 5;

const _: () = assert!(tether_kernel::bounds::per_principal_fits(
    MCP_SESSIONS_PER_PRINCIPAL_MAX_DEFAULT,
    MCP_SESSIONS_MAX_DEFAULT
));
const _: () = assert!(MCP_SESSIONS_MAX_DEFAULT <= MCP_SESSIONS_LIMIT);

/// How many MCP sessions one principal, and the endpoint, may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionBounds {
    /// Sessions on the endpoint, at most (`http.mcp_sessions_max`).
    pub total_max: usize,
    /// Sessions of one principal, at most
    /// (`http.mcp_sessions_per_principal_max`); at most half of `total_max`.
    pub per_principal_max: usize,
}

impl SessionBounds {
    /// The defaults.
    pub const STANDARD: SessionBounds = SessionBounds {
        total_max: MCP_SESSIONS_MAX_DEFAULT,
        per_principal_max: MCP_SESSIONS_PER_PRINCIPAL_MAX_DEFAULT,
    };

    /// Every defect, naming the config keys: the endpoint's bound outside
    /// `1..=`[`MCP_SESSIONS_LIMIT`], or a per-principal bound that lets one
    /// principal reach it alone.
    pub fn check(&self) -> Vec<String> {
        use tether_kernel::bounds::{check_pair, Bound};
        check_pair(
            &Bound {
                key: "http.mcp_sessions_max",
                value: self.total_max,
            },
            &Bound {
                key: "http.mcp_sessions_per_principal_max",
                value: self.per_principal_max,
            },
            MCP_SESSIONS_LIMIT,
        )
    }
}

impl Default for SessionBounds {
    fn default() -> Self {
        Self::STANDARD
    }
}

/// Why an `initialize` was refused: which bound, and its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Full {
    pub reason: &'static str,
    pub key: &'static str,
    pub limit: usize,
}

/// The owner table. Counts hold every slot taken: sessions made and
/// `initialize` requests still with the SDK.
struct Table {
    bounds: SessionBounds,
    /// Session → the principal that opened it.
    by_session: HashMap<String, String>,
    /// Sessions the SDK made whose `initialize` has not come back yet.
    made: HashSet<String>,
    /// Slots taken per principal (sessions and pending `initialize`s).
    per_principal: HashMap<String, usize>,
    total: usize,
}

impl Table {
    fn release(&mut self, principal: &str) {
        self.total = self.total.saturating_sub(1);
        if let Some(n) = self.per_principal.get_mut(principal) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_principal.remove(principal);
            }
        }
    }
}

/// The shared owner table: the guard reads and fills it, the session
/// manager empties it as sessions end.
#[derive(Clone)]
pub(super) struct Owners(Arc<Mutex<Table>>);

impl Owners {
    pub(super) fn new(bounds: SessionBounds) -> Self {
        Self(Arc::new(Mutex::new(Table {
            bounds,
            by_session: HashMap::new(),
            made: HashSet::new(),
            per_principal: HashMap::new(),
            total: 0,
        })))
    }

    /// Takes a slot for one `initialize` of `principal`, or says which bound
    /// is reached. The slot is given back when dropped unbound.
    pub(super) fn reserve(&self, principal: &str) -> Result<Slot, Full> {
        let full = Full {
            reason: "mcp_sessions_full",
            key: "http.mcp_sessions_max",
            limit: 0,
        };
        let Ok(mut t) = self.0.lock() else {
            return Err(full);
        };
        let mine = t.per_principal.get(principal).copied().unwrap_or(0);
        if mine >= t.bounds.per_principal_max {
            return Err(Full {
                reason: "mcp_sessions_per_principal_full",
                key: "http.mcp_sessions_per_principal_max",
                limit: t.bounds.per_principal_max,
            });
        }
        if t.total >= t.bounds.total_max {
            return Err(Full {
                limit: t.bounds.total_max,
                ..full
            });
        }
        t.total += 1;
        *t.per_principal.entry(principal.to_owned()).or_insert(0) += 1;
        Ok(Slot {
            owners: self.clone(),
            principal: principal.to_owned(),
            bound: false,
        })
    }

    /// Whether `session` is a live session of `principal`.
    pub(super) fn owned_by(&self, session: &str, principal: &str) -> bool {
        self.0
            .lock()
            .is_ok_and(|t| t.by_session.get(session).is_some_and(|p| p == principal))
    }

    /// The SDK made `session` (its `initialize` is still under way). Refused
    /// when the endpoint's bound is already reached: every `initialize` took
    /// a slot first, so that never happens to one the guard let through.
    fn made(&self, session: &str) -> bool {
        let Ok(mut t) = self.0.lock() else {
            return false;
        };
        if t.made.len() + t.by_session.len() >= t.bounds.total_max {
            return false;
        }
        t.made.insert(session.to_owned());
        true
    }

    /// `session` ended: its slot is free.
    pub(super) fn ended(&self, session: &str) {
        if let Ok(mut t) = self.0.lock() {
            t.made.remove(session);
            if let Some(principal) = t.by_session.remove(session) {
                t.release(&principal);
            }
        }
    }

    /// Live sessions (for tests and status).
    #[cfg(test)]
    fn live(&self) -> usize {
        self.0.lock().map_or(0, |t| t.by_session.len())
    }
}

/// One principal's slot for a session being made.
pub(super) struct Slot {
    owners: Owners,
    principal: String,
    bound: bool,
}

impl Slot {
    /// The SDK answered the `initialize` with `session`: the slot is that
    /// session's until it ends. A session that already ended (or that the
    /// SDK never made) gives the slot back.
    pub(super) fn bind(mut self, session: String) {
        if let Ok(mut t) = self.owners.0.lock() {
            if t.made.remove(&session) {
                t.by_session.insert(session, self.principal.clone());
                self.bound = true;
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.bound {
            if let Ok(mut t) = self.owners.0.lock() {
                t.release(&self.principal);
            }
        }
    }
}

/// The SDK refused to make a session past the endpoint's bound.
#[derive(Debug)]
pub(super) enum BoundedError {
    Inner(LocalSessionManagerError),
    Full,
}

impl std::fmt::Display for BoundedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Inner(e) => e.fmt(f),
            Self::Full => f.write_str("the endpoint holds its bound of MCP sessions"),
        }
    }
}

impl std::error::Error for BoundedError {}

impl From<LocalSessionManagerError> for BoundedError {
    fn from(e: LocalSessionManagerError) -> Self {
        Self::Inner(e)
    }
}

/// The SDK's in-memory session manager, telling the owner table when a
/// session is made and when it ends.
pub(super) struct BoundedSessions {
    inner: LocalSessionManager,
    owners: Owners,
}

impl BoundedSessions {
    pub(super) fn new(owners: Owners) -> Self {
        Self {
            inner: LocalSessionManager::default(),
            owners,
        }
    }
}

impl SessionManager for BoundedSessions {
    type Error = BoundedError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let (id, transport) = self.inner.create_session().await?;
        if !self.owners.made(&id) {
            let _ = self.inner.close_session(&id).await;
            return Err(BoundedError::Full);
        }
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        Ok(self.inner.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        Ok(self.inner.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        let closed = self.inner.close_session(id).await;
        self.owners.ended(id);
        Ok(closed?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.create_stream(id, message).await?)
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        Ok(self.inner.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.create_standalone_stream(id).await?)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.resume(id, last_event_id).await?)
    }

    fn event_store(&self) -> Option<Arc<dyn EventStore>> {
        self.inner.event_store()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds(total_max: usize, per_principal_max: usize) -> Owners {
        Owners::new(SessionBounds {
            total_max,
            per_principal_max,
        })
    }

    fn open(o: &Owners, principal: &str, session: &str) -> Result<(), Full> {
        let slot = o.reserve(principal)?;
        assert!(o.made(session));
        slot.bind(session.to_owned());
        Ok(())
    }

    #[test]
    fn one_principal_stops_at_its_bound_and_never_evicts_another() {
        let o = bounds(4, 2);
        open(&o, "b", "b1").expect("b's session");
        open(&o, "a", "a1").expect("a1");
        open(&o, "a", "a2").expect("a2");
        let refused = open(&o, "a", "a3").expect_err("a's third");
        assert_eq!(refused.reason, "mcp_sessions_per_principal_full");
        assert_eq!(refused.limit, 2);
        assert!(o.owned_by("b1", "b"), "b's session survives a's flood");
        assert!(!o.owned_by("b1", "a"));
        open(&o, "b", "b2").expect("b opens another");
        let refused = open(&o, "c", "c1").expect_err("the endpoint is full");
        assert_eq!(refused.reason, "mcp_sessions_full");
        o.ended("a1");
        open(&o, "c", "c1").expect("an ended session frees its slot");
        assert_eq!(o.live(), 4);
    }

    #[test]
    fn a_slot_not_bound_is_given_back_and_a_session_that_ended_first_is_not_kept() {
        let o = bounds(2, 1);
        drop(o.reserve("a").expect("slot"));
        let slot = o.reserve("a").expect("the dropped slot came back");
        assert!(o.made("s1"));
        o.ended("s1");
        slot.bind("s1".to_owned());
        assert_eq!(o.live(), 0);
        o.reserve("a")
            .expect("the slot of a session that ended came back");
    }

    #[test]
    fn the_defaults_pass_and_a_greedy_per_principal_bound_does_not() {
        assert!(SessionBounds::STANDARD.check().is_empty());
        let greedy = SessionBounds {
            total_max: 10,
            per_principal_max: 10,
        };
        let defects = greedy.check();
        assert_eq!(defects.len(), 1, "{defects:?}");
        assert!(defects[0].contains("http.mcp_sessions_per_principal_max"));
    }
}
