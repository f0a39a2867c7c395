//! `GET /healthz` over real HTTP: 200 while the store takes writes, 503 with
//! the store's error while it does not, and 200 again once it does.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

use serde_json::Value;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tether_store::faulty::FaultyStore;
use tether_store::{MemoryStore, Store};

async fn serve(store: Arc<dyn Store>) -> SocketAddr {
    common::serve(store, "healthz").await
}

async fn healthz(addr: SocketAddr) -> (u16, Value) {
    common::request(addr, "GET", "/healthz", None).await
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
