//! What the server's HTTP tests share: the built-in cell served over real
//! HTTP on a store the test controls, and one HTTP/1.1 exchange.
#![allow(dead_code, clippy::expect_used)]

use serde_json::Value;
use std::net::SocketAddr;
use std::sync::Arc;
use tether_kernel::{Kernel, KernelConfig};
use tether_store::Store;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Serves the built-in cell on `store` (no principals) at a free loopback
/// port, for the life of the test's runtime.
pub async fn serve(store: Arc<dyn Store>, endpoint_id: &str) -> SocketAddr {
    let cell = tether_kernel::loader::load(&tether_drivers::builtin_cell(), None).expect("cell");
    let drivers =
        tether_drivers::build_all(cell.devices.iter().map(|d| &d.manifest)).expect("drivers");
    let kernel =
        Kernel::new(KernelConfig::standard(endpoint_id), cell, drivers, store).expect("kernel");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(tether_server::http::serve(
        kernel,
        tether_server::auth::Authenticator::open(),
        tether_server::edge::EdgeConfig::default(),
        listener,
        std::future::pending(),
    ));
    addr
}

/// One HTTP/1.1 exchange on a fresh connection: status and JSON body. A
/// body, when given, goes as `application/json`.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, Value) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let content = body
        .map(|b| {
            format!(
                "content-type: application/json\r\ncontent-length: {}\r\n",
                b.len()
            )
        })
        .unwrap_or_default();
    let head =
        format!("{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n{content}\r\n");
    s.write_all(head.as_bytes()).await.expect("write");
    s.write_all(body.unwrap_or_default().as_bytes())
        .await
        .expect("write");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.expect("read");
    let text = String::from_utf8(raw).expect("utf-8");
    let (head, body) = text.split_once("\r\n\r\n").expect("a response");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status");
    (status, serde_json::from_str(body).expect("json body"))
}
