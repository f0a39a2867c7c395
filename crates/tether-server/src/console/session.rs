//! The console's sign-in sessions: a principal's bearer token, checked once,
//! becomes a random session id in an HTTP-only, `SameSite=Strict` cookie;
//! each session carries its own CSRF token, which every state-changing form
//! sends back.
//!
//! **Owns:** the bounded session table, idle and absolute expiry, cookie
//! text, constant-time CSRF comparison.
//! **Never here:** what a principal may do (the kernel decides, through the
//! same calls as JSON-RPC), tokens themselves (never stored: only the
//! principal they established).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};
use tether_kernel::Principal;

/// The cookie's name.
pub const COOKIE: &str = "tether_console";
/// Sessions kept at most; the least recently used goes first beyond it.
pub const SESSIONS_MAX: usize = 256;
/// A session unused this long is gone.
pub const IDLE: Duration = Duration::from_secs(30 * 60);
/// A session lasts at most this long, used or not.
pub const ABSOLUTE: Duration = Duration::from_secs(8 * 60 * 60);

/// One signed-in browser.
#[derive(Clone, Debug)]
pub struct Session {
    /// Who signed in (the local caller when no principals are configured).
    pub principal: Principal,
    /// The token every form carries.
    pub csrf: String,
    /// The kernel session the console reads state in.
    pub kernel_session: Option<String>,
    created: Instant,
    used: Instant,
}

/// The table.
#[derive(Debug, Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, Session>>,
}

fn fresh_secret() -> String {
    tether_core::ids::token()
}

/// Equal in time independent of where they differ.
pub fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

impl Sessions {
    /// Opens a session for `principal`; answers its id (the cookie value).
    pub fn open(&self, principal: Principal) -> String {
        let id = fresh_secret();
        let now = Instant::now();
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.retain(|_, s| alive(s, now));
        if map.len() >= SESSIONS_MAX {
            if let Some(oldest) = map
                .iter()
                .min_by_key(|(_, s)| s.used)
                .map(|(k, _)| k.clone())
            {
                map.remove(&oldest);
            }
        }
        map.insert(
            id.clone(),
            Session {
                principal,
                csrf: fresh_secret(),
                kernel_session: None,
                created: now,
                used: now,
            },
        );
        id
    }

    /// The live session of a cookie value, marked used.
    pub fn get(&self, id: &str) -> Option<Session> {
        let now = Instant::now();
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        let s = map.get_mut(id)?;
        if !alive(s, now) {
            map.remove(id);
            return None;
        }
        s.used = now;
        Some(s.clone())
    }

    /// Remembers the kernel session a console session reads in.
    pub fn set_kernel_session(&self, id: &str, kernel_session: String) {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = map.get_mut(id) {
            s.kernel_session = Some(kernel_session);
        }
    }

    /// Signs out.
    pub fn close(&self, id: &str) -> Option<Session> {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id)
    }
}

fn alive(s: &Session, now: Instant) -> bool {
    now.duration_since(s.used) < IDLE && now.duration_since(s.created) < ABSOLUTE
}

/// The `Set-Cookie` value of a session (`Path=/console`, never readable by
/// scripts, never sent by another site; with `secure`, on a TLS listener,
/// never sent over plain HTTP either).
pub fn set_cookie(id: &str, secure: bool) -> String {
    format!(
        "{COOKIE}={id}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={}{}",
        ABSOLUTE.as_secs(),
        secure_attribute(secure)
    )
}

/// The `Set-Cookie` value that removes it.
pub fn clear_cookie(secure: bool) -> String {
    format!(
        "{COOKIE}=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0{}",
        secure_attribute(secure)
    )
}

fn secure_attribute(secure: bool) -> &'static str {
    if secure {
        "; Secure"
    } else {
        ""
    }
}

/// The session id a request's `Cookie` header carries.
pub fn cookie_of(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_owned())
        .filter(|v| !v.is_empty() && v.len() <= 128)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_open_find_and_close() {
        let t = Sessions::default();
        let id = t.open(Principal::local_agent());
        let s = t.get(&id).expect("open");
        assert_eq!(s.principal.id, Principal::local_agent().id);
        assert!(s.csrf.len() > 32);
        assert!(t.get("nope").is_none());
        assert!(t.close(&id).is_some());
        assert!(t.get(&id).is_none());
    }

    #[test]
    fn csrf_comparison_and_cookies() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "ab"));
        let mut h = axum::http::HeaderMap::new();
        h.insert(
            axum::http::header::COOKIE,
            axum::http::HeaderValue::from_static("a=1; tether_console=xyz; b=2"),
        );
        assert_eq!(cookie_of(&h).as_deref(), Some("xyz"));
        assert!(set_cookie("q", false).contains("HttpOnly; SameSite=Strict"));
        assert!(!set_cookie("q", false).contains("Secure"));
        assert!(set_cookie("q", true).ends_with("; Secure"));
        assert!(clear_cookie(true).contains("Max-Age=0; Secure"));
    }
}
