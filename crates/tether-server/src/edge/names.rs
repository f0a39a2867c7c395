//! Reading the names an HTTP head carries: a `Host` value (`host[:port]`)
//! and an `Origin` (`scheme://host[:port]`), both strictly and without
//! guessing, and both normalised for comparison (host lower-cased, IPv6
//! without its brackets, an origin's port made explicit).
//!
//! **Never belongs here:** deciding whether a name is served (the edge's
//! rules, in `super`), and anything about bodies or tokens.

use std::net::Ipv6Addr;

/// Longest `Host` or origin value read; a longer one is refused unread
/// (a DNS name is at most 253 characters).
pub(super) const NAME_CHARS_MAX: usize = 300;

/// A host and its port as a `Host` header carries them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Authority {
    /// Lower-cased; an IPv6 literal without brackets.
    pub host: String,
    /// `None` when the value names no port.
    pub port: Option<u16>,
}

impl Authority {
    /// `host[:port]` as a `Host` header writes it (IPv6 in brackets).
    pub fn write(host: &str, port: Option<u16>) -> String {
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        match port {
            Some(p) => format!("{host}:{p}"),
            None => host,
        }
    }
}

/// A web origin's scheme: only pages served over HTTP(S) are origins Tether
/// can serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Scheme {
    Http,
    Https,
}

impl Scheme {
    /// The port an origin without one means (RFC 6454 §4).
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

/// A web origin: scheme, host, and the port made explicit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Origin {
    pub scheme: Scheme,
    /// Lower-cased; an IPv6 literal without brackets.
    pub host: String,
    /// The origin's port, or its scheme's default when it names none.
    pub port: u16,
}

impl Origin {
    /// Whether the port is its scheme's default (the page was reached
    /// without naming a port).
    pub fn on_default_port(&self) -> bool {
        self.port == self.scheme.default_port()
    }

    /// `scheme://host:port`, the port always written.
    pub fn write(&self) -> String {
        format!(
            "{}://{}",
            self.scheme.as_str(),
            Authority::write(&self.host, Some(self.port))
        )
    }
}

fn port(text: &str) -> Option<u16> {
    if text.is_empty() || text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Reads `host[:port]`: a DNS name or IPv4 address (letters, digits, `-`,
/// `.`, `_`), or an IPv6 address in brackets; a port of one to five digits.
/// Anything else (user info, a path, an empty port, a bare IPv6 address, a
/// zone id) is `None`.
pub(super) fn authority(text: &str) -> Option<Authority> {
    if text.is_empty() || text.len() > NAME_CHARS_MAX {
        return None;
    }
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let ip: Ipv6Addr = host.parse().ok()?;
        let port = match after {
            "" => None,
            p => Some(port(p.strip_prefix(':')?)?),
        };
        return Some(Authority {
            host: ip.to_string(),
            port,
        });
    }
    let (host, port) = match text.rsplit_once(':') {
        Some((h, p)) => (h, Some(port(p)?)),
        None => (text, None),
    };
    let name_byte = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_');
    if host.is_empty() || !host.bytes().all(name_byte) {
        return None;
    }
    Some(Authority {
        host: host.to_ascii_lowercase(),
        port,
    })
}

/// Reads an origin, `http(s)://host[:port]` exactly (no path, not even `/`).
/// `null`, other schemes and anything malformed are `None`.
pub(super) fn origin(text: &str) -> Option<Origin> {
    let (scheme, rest) = text.split_once("://")?;
    let scheme = if scheme.eq_ignore_ascii_case("http") {
        Scheme::Http
    } else if scheme.eq_ignore_ascii_case("https") {
        Scheme::Https
    } else {
        return None;
    };
    let a = authority(rest)?;
    Some(Origin {
        scheme,
        host: a.host,
        port: a.port.unwrap_or(scheme.default_port()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_read_strictly_and_normalised() {
        let a = |h: &str, p: Option<u16>| {
            Some(Authority {
                host: h.into(),
                port: p,
            })
        };
        assert_eq!(authority("LocalHost:7878"), a("localhost", Some(7878)));
        assert_eq!(authority("127.0.0.1"), a("127.0.0.1", None));
        assert_eq!(authority("[::1]:80"), a("::1", Some(80)));
        assert_eq!(authority("[0:0::1]"), a("::1", None));
        assert_eq!(
            authority("tether.lab.example:443"),
            a("tether.lab.example", Some(443))
        );
        for bad in [
            "",
            "localhost:",
            "localhost:abc",
            "localhost:99999",
            "localhost:123456",
            "::1",
            "[::1",
            "[::1]x",
            "[fe80::1%eth0]",
            "user@localhost",
            "localhost/rpc",
            "local host",
            "*",
            "ex*ample",
            ":80",
        ] {
            assert_eq!(authority(bad), None, "{bad}");
        }
        assert_eq!(authority(&"a".repeat(NAME_CHARS_MAX + 1)), None);
    }

    #[test]
    fn origins_are_read_strictly_with_their_port_made_explicit() {
        let o = origin("HTTPS://Console.Lab.Example").expect("origin");
        assert_eq!(o.scheme, Scheme::Https);
        assert_eq!(o.host, "console.lab.example");
        assert_eq!(o.port, 443);
        assert!(o.on_default_port());
        assert_eq!(o.write(), "https://console.lab.example:443");
        let o = origin("http://[::1]:7878").expect("origin");
        assert_eq!((o.host.as_str(), o.port), ("::1", 7878));
        assert_eq!(o.write(), "http://[::1]:7878");
        for bad in [
            "null",
            "*",
            "console.lab.example",
            "https://console.lab.example/",
            "https://console.lab.example/app",
            "ftp://console.lab.example",
            "chrome-extension://abcdef",
            "file://",
            "https://",
            "https://user@console.lab.example",
            "https://console.lab.example:*",
        ] {
            assert_eq!(origin(bad), None, "{bad}");
        }
    }
}
