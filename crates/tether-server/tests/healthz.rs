//! `GET /healthz` over real HTTP: 200 while the store takes writes, 503 with
//! the store's error while it does not, and 200 again once it does.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

use serde_json::Value;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tether_kernel::{Kernel, KernelConfig};
use tether_store::faulty::FaultyStore;
use tether_store::{MemoryStore, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn serve(store: Arc<dyn Store>) -> SocketAddr {
    let cell = tether_kernel::loader::load(&tether_drivers::builtin_cell(), None).expect("cell");
    let drivers =
        tether_drivers::build_all(cell.devices.iter().map(|d| &d.manifest)).expect("drivers");
    let kernel =
        Kernel::new(KernelConfig::standard("healthz"), cell, drivers, store).expect("kernel");
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

async fn healthz(addr: SocketAddr) -> (u16, Value) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!("GET /healthz HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    s.write_all(head.as_bytes()).await.expect("write");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_is_503_while_the_store_takes_no_writes_and_200_again_after() {
    let store = Arc::new(FaultyStore::new(Arc::new(MemoryStore::new())));
    let addr = serve(store.clone()).await;
    let (status, body) = healthz(addr).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["ok"], true, "{body}");
    assert_eq!(body["store"]["writable"], true, "{body}");
    // Simulated devices only: nothing is unreachable.
    assert_eq!(body["unreachable"], serde_json::json!([]), "{body}");

    store.fail_writes.store(true, Ordering::SeqCst);
    // The next probe is due after the last one's freshness.
    tokio::time::sleep(Duration::from_millis(tether_kernel::HEALTH_PROBE_FRESH_MS)).await;
    let (status, body) = healthz(addr).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["ok"], false, "{body}");
    assert_eq!(body["store"]["writable"], false, "{body}");
    assert!(
        body["store"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("injected write failure")),
        "{body}"
    );
    // Asked again at once: the fresh probe's answer, no new write.
    let refused = store.refused_commits.load(Ordering::SeqCst);
    assert_eq!(healthz(addr).await.0, 503);
    assert_eq!(store.refused_commits.load(Ordering::SeqCst), refused);

    store.fail_writes.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(tether_kernel::HEALTH_PROBE_FRESH_MS)).await;
    let (status, body) = healthz(addr).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["store"]["error"], Value::Null, "{body}");
}
