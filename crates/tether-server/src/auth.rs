//! Principals and bearer tokens.
//!
//! A principal is established from a bearer token, never self-declared. Tokens
//! are never stored or logged: the endpoint keeps only their SHA-256, and
//! compares digests in constant time (every configured principal is compared,
//! with no early exit). With no principals configured, the single local caller
//! is an agent.

use serde_json::json;
use sha2::{Digest, Sha256};
use tether_core::Code;
use tether_kernel::{ApiError, Principal, PrincipalKind};

/// One configured principal: who it is and the digest of its token.
#[derive(Clone)]
pub struct Credential {
    /// The principal the token establishes.
    pub principal: Principal,
    /// SHA-256 of the token.
    pub token_sha256: [u8; 32],
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print even the digest.
        f.debug_struct("Credential")
            .field("principal", &self.principal.id)
            .finish_non_exhaustive()
    }
}

/// Maps bearer tokens to principals.
#[derive(Clone, Debug, Default)]
pub struct Authenticator {
    credentials: Vec<Credential>,
    /// Principals are configured, whether or not any of their tokens is
    /// usable in this process: then every request needs a valid token, and
    /// none at all usable means nobody is served (never everybody).
    configured: bool,
}

/// SHA-256 of a token.
pub fn token_digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    diff == 0
}

impl Authenticator {
    /// No principals: every caller is the local agent.
    pub fn open() -> Self {
        Self::default()
    }

    /// The configured credentials (principals are configured: a token is
    /// required, even when `credentials` is empty because no principal's
    /// token is given to this process).
    pub fn new(credentials: Vec<Credential>) -> Self {
        Self {
            credentials,
            configured: true,
        }
    }

    /// Whether principals are configured (then every request needs a token).
    pub fn required(&self) -> bool {
        self.configured
    }

    /// The principal a request's `Authorization` header establishes. A
    /// request with several `Authorization` headers is refused: which one
    /// names the caller would be a guess (RFC 9110 allows the field once).
    ///
    /// # Errors
    /// As [`Self::authenticate`], and `reason: multiple_authorization_headers`.
    pub fn from_headers(&self, headers: &axum::http::HeaderMap) -> Result<Principal, ApiError> {
        let mut values = headers.get_all(axum::http::header::AUTHORIZATION).iter();
        let first = values.next();
        if self.required() && values.next().is_some() {
            return Err(ApiError::new(
                Code::AuthUnauthenticated,
                "send one Authorization header; this request has several",
                json!({"reason": "multiple_authorization_headers"}),
            ));
        }
        self.authenticate(bearer(first.and_then(|v| v.to_str().ok())))
    }

    /// The principal a bearer token establishes.
    ///
    /// # Errors
    /// `MHS.AUTH.UNAUTHENTICATED` with `details.reason` `missing_token` or `invalid_token`.
    pub fn authenticate(&self, token: Option<&str>) -> Result<Principal, ApiError> {
        if !self.required() {
            return Ok(Principal::local_agent());
        }
        let Some(token) = token.filter(|t| !t.is_empty()) else {
            return Err(ApiError::new(
                Code::AuthUnauthenticated,
                "a bearer token is required",
                json!({"reason": "missing_token"}),
            ));
        };
        let digest = token_digest(token);
        let mut found: Option<&Credential> = None;
        for c in &self.credentials {
            if constant_time_eq(&c.token_sha256, &digest) && found.is_none() {
                found = Some(c);
            }
        }
        found.map(|c| c.principal.clone()).ok_or_else(|| {
            ApiError::new(
                Code::AuthUnauthenticated,
                "the bearer token is not valid",
                json!({"reason": "invalid_token"}),
            )
        })
    }
}

/// Parses `Authorization: Bearer <token>`.
pub fn bearer(header: Option<&str>) -> Option<&str> {
    let h = header?.trim();
    let (scheme, token) = h.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Builds a principal from config fields, enforcing that only humans hold the
/// operator role.
///
/// # Errors
/// An unknown kind, or `operator` on a non-human.
pub fn principal(id: &str, kind: &str, roles: &[String]) -> Result<Principal, String> {
    let kind = match kind {
        "human" => PrincipalKind::Human,
        "agent" => PrincipalKind::Agent,
        "service" => PrincipalKind::Service,
        other => return Err(format!("kind `{other}` is not human, agent or service")),
    };
    let operator = roles.iter().any(|r| r == "operator");
    if operator && kind != PrincipalKind::Human {
        return Err("the operator role is for humans only; a model-controlled principal can never be an operator".into());
    }
    for r in roles {
        if r != "operator" {
            return Err(format!("unknown role `{r}` (known: operator)"));
        }
    }
    Ok(Principal {
        id: id.to_owned(),
        kind,
        operator,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth() -> Authenticator {
        Authenticator::new(vec![
            Credential {
                principal: principal("alice", "human", &["operator".into()]).expect("alice"),
                token_sha256: token_digest("op-token"),
            },
            Credential {
                principal: principal("bot", "agent", &[]).expect("bot"),
                token_sha256: token_digest("bot-token"),
            },
        ])
    }

    #[test]
    fn a_token_establishes_its_principal_and_nothing_else_does() {
        let a = auth();
        assert_eq!(a.authenticate(Some("op-token")).expect("alice").id, "alice");
        assert!(a.authenticate(Some("op-token")).expect("alice").operator);
        assert!(!a.authenticate(Some("bot-token")).expect("bot").operator);
        assert_eq!(
            a.authenticate(None).expect_err("missing").details["reason"],
            "missing_token"
        );
        assert_eq!(
            a.authenticate(Some("guess")).expect_err("invalid").details["reason"],
            "invalid_token"
        );
    }

    #[test]
    fn without_principals_the_caller_is_the_local_agent() {
        let p = Authenticator::open()
            .authenticate(Some("anything"))
            .expect("open");
        assert_eq!(p, Principal::local_agent());
        assert!(!p.operator);
    }

    #[test]
    fn only_humans_may_be_operators() {
        assert!(principal("m", "agent", &["operator".into()]).is_err());
        assert!(principal("s", "service", &["operator".into()]).is_err());
        assert!(principal("h", "robot", &[]).is_err());
        assert!(principal("h", "human", &["admin".into()]).is_err());
    }

    #[test]
    fn bearer_header_parsing() {
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(None), None);
    }
}
