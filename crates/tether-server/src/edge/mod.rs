//! The edge: what an HTTP request's head must be before anything past the
//! token reads its body. No web page may drive the endpoint, so every HTTP
//! listener (`POST /rpc`, the REST gateway, `/healthz`, `/openapi.json`,
//! `/mcp`) serves only
//!
//! - a `Host` it is reached by: its listen address (on loopback also
//!   `localhost`; on an unspecified address the loopback names) with its own
//!   port, and the configured `[http] public_names` — else 403
//!   `MHS.AUTH.ORIGIN_REFUSED`, `reason: host_not_served` (a DNS-rebinding
//!   page names its own host);
//! - an `Origin`, when one is sent, that is the endpoint's own (`http` or
//!   `https`, a served host and its port) or one of `[http] allowed_origins`
//!   — else 403, `reason: origin_not_allowed` (a page on another site);
//! - a body, when there is one, declared `application/json` (with at most a
//!   `charset=utf-8` parameter) — else 415 `MHS.PROTOCOL.UNSUPPORTED_MEDIA_TYPE`
//!   (the bodies a page may send across origins without a preflight).
//!
//! The token is checked before this (401 first); an e-stop refused here is
//! still served by the surface (`guard` for JSON-RPC and REST, `mcp::edge`
//! for MCP), whose answer is the refusal with `estop_served` and the receipt.
//! No CORS header is ever sent: a preflight is refused like any other request.
//!
//! | module | owns |
//! |---|---|
//! | `names` | reading a `Host` and an `Origin` value |
//! | `guard` | the middleware in front of `/rpc`, REST and `/healthz` |
//!
//! **Never belongs here:** tokens (`crate::auth`), recognising or serving an
//! e-stop (`crate::rpc`, `crate::rest`, `crate::mcp`), and any rule about
//! devices.

pub(crate) mod guard;
mod names;

use axum::http::{header, HeaderMap, StatusCode, Uri};
use names::{Authority, Origin};
use serde_json::{json, Value};
use std::net::{IpAddr, SocketAddr};
use tether_core::Code;

/// Entries of `[http] public_names` accepted, at most.
pub const PUBLIC_NAMES_MAX: usize = 64;
/// Entries of `[http] allowed_origins` accepted, at most.
pub const ALLOWED_ORIGINS_MAX: usize = 64;
/// Characters of a refused value echoed in `details`, at most.
const ECHO_CHARS_MAX: usize = 256;
// An echoed value is never longer than what is read.
const _: () = assert!(ECHO_CHARS_MAX <= names::NAME_CHARS_MAX);

/// The `[http]` keys of the edge, read and checked: the names the endpoint
/// is also reached by, and the browser origins allowed to call it.
#[derive(Clone, Debug, Default)]
pub struct EdgeConfig {
    names: Vec<Authority>,
    origins: Vec<Origin>,
}

impl EdgeConfig {
    /// Reads `public_names` (`host` or `host:port`; an IPv6 address in
    /// brackets) and `allowed_origins` (`http(s)://host[:port]`, no path).
    ///
    /// # Errors
    /// Every entry that cannot be read, as `(key[index], message)`, and a
    /// list longer than its bound.
    pub fn parse(
        public_names: &[String],
        allowed_origins: &[String],
    ) -> Result<EdgeConfig, Vec<(String, String)>> {
        let mut defects = Vec::new();
        let mut config = EdgeConfig::default();
        for (key, len, max) in [
            ("public_names", public_names.len(), PUBLIC_NAMES_MAX),
            (
                "allowed_origins",
                allowed_origins.len(),
                ALLOWED_ORIGINS_MAX,
            ),
        ] {
            if len > max {
                defects.push((key.to_owned(), format!("{len} entries; at most {max}")));
            }
        }
        for (i, text) in public_names.iter().take(PUBLIC_NAMES_MAX).enumerate() {
            match names::authority(text.trim()) {
                Some(a) => config.names.push(a),
                None => defects.push((
                    format!("public_names[{i}]"),
                    format!("`{text}` is not a host name or address with an optional port (e.g. `tether.lab.example` or `tether.lab.example:8443`; an IPv6 address in brackets)"),
                )),
            }
        }
        for (i, text) in allowed_origins.iter().take(ALLOWED_ORIGINS_MAX).enumerate() {
            match names::origin(text.trim()) {
                Some(o) => config.origins.push(o),
                None => defects.push((
                    format!("allowed_origins[{i}]"),
                    format!("`{text}` is not an origin: write `https://host` or `http://host:port`, without a path (`*` and `null` are never allowed)"),
                )),
            }
        }
        if defects.is_empty() {
            Ok(config)
        } else {
            Err(defects)
        }
    }
}

/// One `Host` the listener serves.
#[derive(Clone, Debug)]
struct HostRule {
    host: String,
    port: u16,
    /// Also served without a port (the scheme's default: a proxy in front,
    /// or a listener on port 80).
    portless: bool,
}

/// The edge of one listener: the hosts it serves and the origins allowed.
#[derive(Clone, Debug)]
pub struct Edge {
    hosts: Vec<HostRule>,
    allowed: Vec<Origin>,
}

/// A request the edge refuses: 403 or 415, with a stable reason.
#[derive(Clone, Debug)]
pub struct Refusal {
    /// `MHS.AUTH.ORIGIN_REFUSED` or `MHS.PROTOCOL.UNSUPPORTED_MEDIA_TYPE`.
    pub code: Code,
    /// `details.reason`: `host_not_served`, `origin_not_allowed`,
    /// `content_type_missing`, `content_type_not_json` or `content_type_parameter`.
    pub reason: &'static str,
    /// One line for people, saying what to change.
    pub message: String,
    /// The refused header and its value (cut), echoed in `details`.
    seen: Option<(&'static str, String)>,
}

impl Refusal {
    fn new(code: Code, reason: &'static str, message: String) -> Self {
        Self {
            code,
            reason,
            message,
            seen: None,
        }
    }

    fn seeing(mut self, key: &'static str, value: &str) -> Self {
        self.seen = Some((key, value.chars().take(ECHO_CHARS_MAX).collect()));
        self
    }

    /// 403 for a Host or Origin, 415 for a content type.
    pub fn status(&self) -> StatusCode {
        if self.code == Code::ProtocolUnsupportedMediaType {
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        } else {
            StatusCode::FORBIDDEN
        }
    }

    /// `{reason, <header>: value}`.
    pub fn details(&self) -> Value {
        let mut d = json!({"reason": self.reason});
        if let Some((k, v)) = &self.seen {
            d[*k] = json!(v);
        }
        d
    }
}

/// The hosts a listen address is reached by on its own: the address, and
/// `localhost` on loopback; on an unspecified address (`0.0.0.0`, `[::]`)
/// the loopback names (every other name goes in `public_names`).
fn listen_hosts(ip: IpAddr) -> Vec<String> {
    if ip.is_unspecified() {
        let mut hosts = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        if ip.is_ipv6() {
            hosts.push("::1".to_owned());
        }
        return hosts;
    }
    let literal = ip.to_string();
    if ip.is_loopback() {
        vec!["localhost".to_owned(), literal]
    } else {
        vec![literal]
    }
}

impl Edge {
    /// The edge of a listener on `listen` with the configured names.
    pub fn new(listen: SocketAddr, config: &EdgeConfig) -> Edge {
        let port = listen.port();
        let mut hosts: Vec<HostRule> = listen_hosts(listen.ip())
            .into_iter()
            .map(|host| HostRule {
                host,
                port,
                portless: port == 80,
            })
            .collect();
        for name in &config.names {
            hosts.push(match name.port {
                // A bare name: on this listener's port, or through a proxy on
                // the scheme's default port.
                None => HostRule {
                    host: name.host.clone(),
                    port,
                    portless: true,
                },
                Some(p) => HostRule {
                    host: name.host.clone(),
                    port: p,
                    portless: p == 80 || p == 443,
                },
            });
        }
        Edge {
            hosts,
            allowed: config.origins.clone(),
        }
    }

    /// The `Host` values served, as a client writes them.
    pub fn hosts(&self) -> Vec<String> {
        let mut out = Vec::new();
        for r in &self.hosts {
            out.push(Authority::write(&r.host, Some(r.port)));
            if r.portless {
                out.push(Authority::write(&r.host, None));
            }
        }
        out
    }

    /// The origins served, each with its port written: the endpoint's own
    /// (both schemes, each served host) and the configured ones.
    pub fn origins(&self) -> Vec<String> {
        let mut out = Vec::new();
        for r in &self.hosts {
            for scheme in [names::Scheme::Http, names::Scheme::Https] {
                let mut ports = vec![r.port];
                if r.portless {
                    ports.push(scheme.default_port());
                }
                for port in ports {
                    let o = Origin {
                        scheme,
                        host: r.host.clone(),
                        port,
                    };
                    let o = o.write();
                    if !out.contains(&o) {
                        out.push(o);
                    }
                }
            }
        }
        for o in self.allowed.iter().map(Origin::write) {
            if !out.contains(&o) {
                out.push(o);
            }
        }
        out
    }

    fn serves_host(&self, a: &Authority) -> bool {
        self.hosts.iter().any(|r| {
            r.host == a.host
                && match a.port {
                    Some(p) => p == r.port,
                    None => r.portless,
                }
        })
    }

    fn allows_origin(&self, o: &Origin) -> bool {
        let own = self
            .hosts
            .iter()
            .any(|r| r.host == o.host && (o.port == r.port || (r.portless && o.on_default_port())));
        own || self.allowed.contains(o)
    }

    /// Checks `Host` (exactly one, served; and the request target's
    /// authority when it has one) and `Origin` (when sent: exactly one,
    /// allowed).
    ///
    /// # Errors
    /// The refusal (403 `host_not_served` or `origin_not_allowed`).
    pub fn check_head(&self, uri: &Uri, headers: &HeaderMap) -> Result<(), Refusal> {
        let host_refusal = |why: &str, value: &str| {
            Refusal::new(
                Code::AuthOriginRefused,
                "host_not_served",
                format!("{why}; this endpoint serves Host {}; a name it is also reached by goes in [http] public_names", self.hosts().join(", ")),
            )
            .seeing("host", value)
        };
        let mut values = headers.get_all(header::HOST).iter();
        let host = match (values.next(), values.next()) {
            (Some(h), None) => h.to_str().unwrap_or_default(),
            (None, _) => return Err(host_refusal("the request has no Host header", "")),
            (Some(_), Some(_)) => {
                return Err(host_refusal("the request has several Host headers", ""))
            }
        };
        if !names::authority(host).is_some_and(|a| self.serves_host(&a)) {
            return Err(host_refusal(
                &format!("Host `{host}` is not served here"),
                host,
            ));
        }
        if let Some(target) = uri.authority() {
            let target = target.as_str();
            if !names::authority(target).is_some_and(|a| self.serves_host(&a)) {
                return Err(host_refusal(
                    &format!("the request target names `{target}`, which is not served here"),
                    target,
                ));
            }
        }
        let origin_refusal = |why: &str, value: &str| {
            Refusal::new(
                Code::AuthOriginRefused,
                "origin_not_allowed",
                format!("{why}; an origin allowed to call goes in [http] allowed_origins"),
            )
            .seeing("origin", value)
        };
        let mut values = headers.get_all(header::ORIGIN).iter();
        let origin = match (values.next(), values.next()) {
            (None, _) => return Ok(()),
            (Some(o), None) => o.to_str().unwrap_or_default(),
            (Some(_), Some(_)) => {
                return Err(origin_refusal("the request has several Origin headers", ""))
            }
        };
        if names::origin(origin).is_some_and(|o| self.allows_origin(&o)) {
            return Ok(());
        }
        Err(origin_refusal(
            &format!("requests from the web page `{origin}` are not served"),
            origin,
        ))
    }
}

/// Whether a request's head says it carries a body: a `Content-Length` other
/// than 0, or a `Transfer-Encoding`.
fn carries_body(headers: &HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get_all(header::CONTENT_LENGTH)
            .iter()
            .any(|v| v.to_str().map_or(true, |s| s.trim() != "0"))
}

/// The console's forms: a body must be `application/x-www-form-urlencoded`
/// (what a browser form sends; the console reads nothing else).
///
/// # Errors
/// 415 naming what was sent.
pub fn check_form_type(headers: &HeaderMap) -> Result<(), Refusal> {
    if !carries_body(headers) {
        return Ok(());
    }
    let value = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let essence = value.split(';').next().unwrap_or_default().trim();
    if essence.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
        return Ok(());
    }
    Err(Refusal::new(
        Code::ProtocolUnsupportedMediaType,
        "content_type_not_form",
        format!(
            "a body of type `{essence}` is not served here; the console takes its own forms only"
        ),
    )
    .seeing("content_type", value))
}

/// Checks that a body, when the request carries one, is declared
/// `application/json` (the type and `charset` compared without regard to
/// case): exactly one `Content-Type`, no parameter but `charset=utf-8`
/// (quoted or not). A request without a body needs none.
///
/// # Errors
/// The refusal (415 `content_type_missing`, `content_type_not_json` or
/// `content_type_parameter`).
pub fn check_content_type(headers: &HeaderMap) -> Result<(), Refusal> {
    if !carries_body(headers) {
        return Ok(());
    }
    let refusal = |reason: &'static str, message: &str, value: &str| {
        Refusal::new(
            Code::ProtocolUnsupportedMediaType,
            reason,
            format!("{message}; send the body as `Content-Type: application/json`"),
        )
        .seeing("content_type", value)
    };
    let mut values = headers.get_all(header::CONTENT_TYPE).iter();
    let value = match (values.next(), values.next()) {
        (None, _) => {
            return Err(refusal(
                "content_type_missing",
                "the request has a body but no Content-Type",
                "",
            ))
        }
        (Some(v), None) => v.to_str().unwrap_or_default(),
        (Some(_), Some(_)) => {
            return Err(refusal(
                "content_type_not_json",
                "the request has several Content-Type headers",
                "",
            ))
        }
    };
    let mut parts = value.split(';');
    let essence = parts.next().unwrap_or_default().trim();
    if !essence.eq_ignore_ascii_case("application/json") {
        return Err(refusal(
            "content_type_not_json",
            &format!("a body of type `{essence}` is not served"),
            value,
        ));
    }
    for param in parts.map(str::trim).filter(|p| !p.is_empty()) {
        let utf8 = param.split_once('=').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("charset")
                && v.trim().trim_matches('"').eq_ignore_ascii_case("utf-8")
        });
        if !utf8 {
            return Err(refusal(
                "content_type_parameter",
                &format!("the parameter `{param}` is not served (JSON is UTF-8; only `charset=utf-8` may be given)"),
                value,
            ));
        }
    }
    Ok(())
}

/// What became of the e-stop in a request the edge refused.
#[derive(Debug)]
pub(crate) struct EstopOutcome {
    /// The request's id when it had a usable one (JSON-RPC, MCP), else `null`.
    pub id: Value,
    /// Whether the stop was served (a latch set).
    pub served: bool,
    /// The e-stop's receipt, when its answer carried one.
    pub receipt: Option<Value>,
    /// The e-stop's own error, when its answer was one (`{code, message}`).
    pub error: Option<Value>,
}

impl EstopOutcome {
    /// Adds `estop_served`, `receipt` and `estop_error` to a refusal's details.
    pub fn add_to(&self, details: &mut Value) {
        details["estop_served"] = json!(self.served);
        if let Some(r) = &self.receipt {
            details["receipt"] = r.clone();
        }
        if let Some(e) = &self.error {
            details["estop_error"] = e.clone();
        }
    }
}

#[cfg(test)]
mod tests;
