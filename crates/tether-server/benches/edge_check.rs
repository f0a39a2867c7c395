//! What the edge costs per request: `Edge::check_head` and
//! `check_content_type` on the head of a served request (loopback `Host`, no
//! `Origin`, a JSON body), of one with the endpoint's own `Origin` and a
//! configured public name, and of a refused one. Single thread, no I/O.
//!
//! Run: `cargo bench -p tether-server --bench edge_check [-- ITERATIONS]`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

use axum::http::{HeaderMap, HeaderValue, Uri};
use std::hint::black_box;
use std::time::Instant;
use tether_server::edge::{check_content_type, Edge, EdgeConfig};

fn head(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(*k, HeaderValue::from_str(v).expect("value"));
    }
    h
}

fn main() {
    let n: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(2_000_000);
    let config = EdgeConfig::parse(
        &["tether.lab.example".to_owned()],
        &["https://console.lab.example".to_owned()],
    )
    .expect("config");
    let edge = Edge::new("127.0.0.1:7878".parse().expect("addr"), &config);
    let uri = Uri::from_static("/rpc");
    let cases = [
        (
            "served_loopback_json",
            head(&[
                ("host", "127.0.0.1:7878"),
                ("content-type", "application/json"),
                ("content-length", "120"),
            ]),
            true,
        ),
        (
            "served_public_name_origin_charset",
            head(&[
                ("host", "tether.lab.example"),
                ("origin", "https://console.lab.example"),
                ("content-type", "application/json; charset=utf-8"),
                ("content-length", "120"),
            ]),
            true,
        ),
        (
            "refused_foreign_origin",
            head(&[
                ("host", "127.0.0.1:7878"),
                ("origin", "http://evil.example"),
                ("content-type", "text/plain"),
                ("content-length", "120"),
            ]),
            false,
        ),
    ];
    for (name, headers, served) in &cases {
        let check = || {
            edge.check_head(black_box(&uri), black_box(headers))
                .and_then(|()| check_content_type(black_box(headers)))
                .is_ok()
        };
        assert_eq!(check(), *served, "{name}");
        for _ in 0..n / 10 {
            black_box(check());
        }
        let t = Instant::now();
        for _ in 0..n {
            black_box(check());
        }
        let ns = t.elapsed().as_secs_f64() * 1e9 / n as f64;
        println!("FIGURE edge_check case={name} iterations={n} ns_per_request={ns:.0}");
    }
}
