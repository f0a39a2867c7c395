//! The edge's rules on their own: which `Host` and `Origin` a listener
//! serves, and which content types.

use super::*;
use axum::http::HeaderValue;

fn edge(listen: &str, names: &[&str], origins: &[&str]) -> Edge {
    let own = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let config = EdgeConfig::parse(&own(names), &own(origins)).expect("config");
    Edge::new(listen.parse().expect("listen address"), &config)
}

fn head(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(*k, HeaderValue::from_str(v).expect("header value"));
    }
    h
}

fn check(e: &Edge, pairs: &[(&'static str, &str)]) -> Result<(), &'static str> {
    e.check_head(&Uri::from_static("/rpc"), &head(pairs))
        .map_err(|r| r.reason)
}

#[test]
fn a_loopback_listener_serves_localhost_and_its_address_on_its_port() {
    let e = edge("127.0.0.1:7878", &[], &[]);
    for host in ["localhost:7878", "127.0.0.1:7878", "LOCALHOST:7878"] {
        assert_eq!(check(&e, &[("host", host)]), Ok(()), "{host}");
    }
    for host in [
        "localhost",
        "127.0.0.1",
        "localhost:7879",
        "127.0.0.2:7878",
        "[::1]:7878",
        "evil.example:7878",
        "evil.example",
        "localhost.:7878",
        "",
    ] {
        assert_eq!(
            check(&e, &[("host", host)]),
            Err("host_not_served"),
            "{host}"
        );
    }
    assert_eq!(check(&e, &[]), Err("host_not_served"), "no Host");
    assert_eq!(
        check(
            &e,
            &[("host", "localhost:7878"), ("host", "localhost:7878")]
        ),
        Err("host_not_served"),
        "two Hosts"
    );
    assert_eq!(e.hosts(), ["localhost:7878", "127.0.0.1:7878"]);
}

#[test]
fn other_listen_addresses() {
    let v6 = edge("[::1]:7878", &[], &[]);
    assert_eq!(check(&v6, &[("host", "[::1]:7878")]), Ok(()));
    assert_eq!(check(&v6, &[("host", "localhost:7878")]), Ok(()));
    assert_eq!(
        check(&v6, &[("host", "127.0.0.1:7878")]),
        Err("host_not_served")
    );
    // Port 80: a Host without a port means it.
    let p80 = edge("127.0.0.1:80", &[], &[]);
    assert_eq!(check(&p80, &[("host", "localhost")]), Ok(()));
    assert_eq!(check(&p80, &[("host", "localhost:80")]), Ok(()));
    // A public address: itself only.
    let lan = edge("192.168.1.5:7878", &[], &[]);
    assert_eq!(check(&lan, &[("host", "192.168.1.5:7878")]), Ok(()));
    assert_eq!(
        check(&lan, &[("host", "localhost:7878")]),
        Err("host_not_served")
    );
    // Every address: the loopback names; any other name must be configured.
    let any = edge("0.0.0.0:7878", &[], &[]);
    assert_eq!(check(&any, &[("host", "127.0.0.1:7878")]), Ok(()));
    assert_eq!(check(&any, &[("host", "localhost:7878")]), Ok(()));
    assert_eq!(
        check(&any, &[("host", "0.0.0.0:7878")]),
        Err("host_not_served")
    );
    assert_eq!(
        check(&any, &[("host", "192.168.1.5:7878")]),
        Err("host_not_served")
    );
    let any = edge(
        "0.0.0.0:7878",
        &["192.168.1.5", "tether.lab.example:8443"],
        &[],
    );
    assert_eq!(check(&any, &[("host", "192.168.1.5:7878")]), Ok(()));
    assert_eq!(check(&any, &[("host", "tether.lab.example:8443")]), Ok(()));
    assert_eq!(
        check(&any, &[("host", "tether.lab.example:7878")]),
        Err("host_not_served")
    );
    assert_eq!(
        check(&any, &[("host", "tether.lab.example")]),
        Err("host_not_served"),
        "8443 is no scheme's default"
    );
}

#[test]
fn a_public_name_is_served_on_the_listen_port_and_without_a_port() {
    let e = edge("127.0.0.1:7878", &["Tether.Lab.Example"], &[]);
    for host in ["tether.lab.example:7878", "tether.lab.example"] {
        assert_eq!(check(&e, &[("host", host)]), Ok(()), "{host}");
    }
    for host in [
        "tether.lab.example:80",
        "lab.example:7878",
        "x.tether.lab.example",
    ] {
        assert_eq!(
            check(&e, &[("host", host)]),
            Err("host_not_served"),
            "{host}"
        );
    }
}

#[test]
fn the_request_target_authority_must_be_served_too() {
    let e = edge("127.0.0.1:7878", &[], &[]);
    let headers = head(&[("host", "127.0.0.1:7878")]);
    let uri = Uri::from_static("http://evil.example/rpc");
    assert_eq!(
        e.check_head(&uri, &headers).map_err(|r| r.reason),
        Err("host_not_served")
    );
    let uri = Uri::from_static("http://localhost:7878/rpc");
    assert!(e.check_head(&uri, &headers).is_ok());
}

#[test]
fn origins_are_the_endpoints_own_or_configured() {
    let e = edge(
        "127.0.0.1:7878",
        &["tether.lab.example"],
        &["https://console.lab.example", "http://localhost:3000"],
    );
    let host = ("host", "127.0.0.1:7878");
    for origin in [
        "http://127.0.0.1:7878",
        "http://localhost:7878",
        "http://tether.lab.example:7878",
        // Through a proxy on the scheme's default port.
        "https://tether.lab.example",
        "http://tether.lab.example",
        "https://console.lab.example",
        "https://console.lab.example:443",
        "HTTPS://CONSOLE.LAB.EXAMPLE",
        "http://localhost:3000",
    ] {
        assert_eq!(check(&e, &[host, ("origin", origin)]), Ok(()), "{origin}");
    }
    for origin in [
        "http://evil.example",
        "http://evil.example:7878",
        "null",
        "http://localhost:7879",
        "http://localhost",
        "https://console.lab.example:8443",
        "http://console.lab.example",
        "https://evil.console.lab.example",
        "http://localhost:3000/",
        "chrome-extension://abc",
        "",
    ] {
        assert_eq!(
            check(&e, &[host, ("origin", origin)]),
            Err("origin_not_allowed"),
            "{origin}"
        );
    }
    assert_eq!(
        check(
            &e,
            &[
                host,
                ("origin", "http://localhost:7878"),
                ("origin", "http://localhost:7878")
            ]
        ),
        Err("origin_not_allowed"),
        "two Origins"
    );
}

#[test]
fn the_sdk_is_given_every_host_and_origin_with_its_port() {
    let e = edge(
        "127.0.0.1:7878",
        &["tether.lab.example"],
        &["https://console.lab.example"],
    );
    assert_eq!(
        e.hosts(),
        [
            "localhost:7878",
            "127.0.0.1:7878",
            "tether.lab.example:7878",
            "tether.lab.example"
        ]
    );
    let origins = e.origins();
    for o in [
        "http://localhost:7878",
        "https://localhost:7878",
        "http://127.0.0.1:7878",
        "http://tether.lab.example:7878",
        "http://tether.lab.example:80",
        "https://tether.lab.example:443",
        "https://console.lab.example:443",
    ] {
        assert!(origins.iter().any(|x| x == o), "{o} in {origins:?}");
    }
    assert!(
        origins.iter().all(|o| o
            .rsplit(':')
            .next()
            .is_some_and(|p| p.parse::<u16>().is_ok())),
        "{origins:?}"
    );
}

#[test]
fn bad_config_entries_are_named() {
    let own = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let defects = EdgeConfig::parse(
        &own(&["ok.example", "http://x", ""]),
        &own(&["*", "https://ok.example", "null", "ok.example"]),
    )
    .expect_err("defects");
    let fields: Vec<&str> = defects.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(
        fields,
        [
            "public_names[1]",
            "public_names[2]",
            "allowed_origins[0]",
            "allowed_origins[2]",
            "allowed_origins[3]"
        ]
    );
    let many = vec!["a.example".to_owned(); PUBLIC_NAMES_MAX + 1];
    let defects = EdgeConfig::parse(&many, &[]).expect_err("too many");
    assert_eq!(defects[0].0, "public_names");
}

fn content(pairs: &[(&'static str, &str)]) -> Result<(), &'static str> {
    check_content_type(&head(pairs)).map_err(|r| r.reason)
}

#[test]
fn a_body_must_be_declared_json() {
    let len = ("content-length", "2");
    for ct in [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON;Charset=\"UTF-8\"",
        "application/json;",
    ] {
        assert_eq!(content(&[len, ("content-type", ct)]), Ok(()), "{ct}");
    }
    for (ct, reason) in [
        ("text/plain", "content_type_not_json"),
        ("text/plain; charset=utf-8", "content_type_not_json"),
        ("application/x-www-form-urlencoded", "content_type_not_json"),
        ("multipart/form-data; boundary=x", "content_type_not_json"),
        ("application/json-patch+json", "content_type_not_json"),
        ("application/jsonx", "content_type_not_json"),
        ("application/json; charset=latin1", "content_type_parameter"),
        ("application/json; foo=bar", "content_type_parameter"),
        ("application/json; charset", "content_type_parameter"),
    ] {
        assert_eq!(content(&[len, ("content-type", ct)]), Err(reason), "{ct}");
    }
    assert_eq!(content(&[len]), Err("content_type_missing"));
    assert_eq!(
        content(&[("transfer-encoding", "chunked")]),
        Err("content_type_missing")
    );
    assert_eq!(
        content(&[
            len,
            ("content-type", "application/json"),
            ("content-type", "application/json")
        ]),
        Err("content_type_not_json")
    );
    // No body: no type needed, whatever is declared.
    assert_eq!(content(&[]), Ok(()));
    assert_eq!(content(&[("content-length", "0")]), Ok(()));
    assert_eq!(
        content(&[("content-length", "0"), ("content-type", "text/plain")]),
        Ok(())
    );
}

#[test]
fn refusals_carry_their_code_reason_and_what_was_seen() {
    let e = edge("127.0.0.1:7878", &[], &[]);
    let r = e
        .check_head(
            &Uri::from_static("/"),
            &head(&[
                ("host", "127.0.0.1:7878"),
                ("origin", "http://evil.example"),
            ]),
        )
        .expect_err("refused");
    assert_eq!(r.code, Code::AuthOriginRefused);
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        r.details(),
        json!({"reason": "origin_not_allowed", "origin": "http://evil.example"})
    );
    let long = format!("{}.example:7878", "a".repeat(400));
    let r = e
        .check_head(&Uri::from_static("/"), &head(&[("host", &long)]))
        .expect_err("refused");
    assert_eq!(
        r.details()["host"].as_str().map(str::len),
        Some(ECHO_CHARS_MAX)
    );
    let r = check_content_type(&head(&[
        ("content-length", "1"),
        ("content-type", "text/plain"),
    ]))
    .expect_err("refused");
    assert_eq!(r.code, Code::ProtocolUnsupportedMediaType);
    assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(r.details()["content_type"], "text/plain");
}
