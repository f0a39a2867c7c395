//! The REST gateway's invocation records against the store, over real HTTP:
//! a record that cannot be made durable is never answered 202, and a long
//! motion is answered 202 while it runs, with its record already durable.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tether_store::faulty::FaultyStore;
use tether_store::{MemoryStore, Store};

async fn serve(store: Arc<dyn Store>) -> SocketAddr {
    common::serve(store, "rest-records").await
}

/// One HTTP/1.1 exchange on a fresh connection: status and JSON body.
async fn request(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, Value) {
    common::request(addr, method, path, Some(body)).await
}

fn kinds_for(store: &dyn Store, needle: &str) -> Vec<String> {
    store
        .chain_tail(64)
        .expect("tail")
        .iter()
        .filter(|e| e.to_string().contains(needle))
        .map(|e| e["kind"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invocation_that_cannot_be_recorded_is_refused_and_never_answered_202() {
    let store = Arc::new(FaultyStore::new(Arc::new(MemoryStore::new())));
    let addr = serve(store.clone()).await;
    let setpoint = "/tools/thermostat-1__setpoint:invoke";
    // Healthy first (this also opens the gateway's session).
    let (status, ok) = request(
        addr,
        "POST",
        setpoint,
        r#"{"input":{"target_temperature":30}}"#,
    )
    .await;
    assert_eq!(status, 202, "{ok}");

    store.fail_writes.store(true, Ordering::SeqCst);
    let (status, r) = request(
        addr,
        "POST",
        setpoint,
        r#"{"input":{"target_temperature":31}}"#,
    )
    .await;
    assert_eq!(status, 503, "{r}");
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["error"]["code"], "MHS.EVIDENCE.UNAVAILABLE", "{r}");
    assert_eq!(
        r["error"]["details"]["reason"], "invocation_not_durable",
        "{r}"
    );
    assert!(
        r.get("data").is_none(),
        "no invocation id is handed out: {r}"
    );

    // The store recovers: invocations are accepted again, and the first
    // one's record is intact.
    store.fail_writes.store(false, Ordering::SeqCst);
    let (status, again) = request(
        addr,
        "POST",
        setpoint,
        r#"{"input":{"target_temperature":32}}"#,
    )
    .await;
    assert_eq!(status, 202, "{again}");
    let first = ok["data"]["invocation_id"].as_str().expect("id");
    let (status, rec) = request(addr, "GET", &format!("/invocations/{first}"), "").await;
    assert_eq!(status, 200, "{rec}");
    assert_eq!(rec["data"]["invocation_id"], first, "{rec}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_motion_is_answered_while_it_runs_with_its_record_already_durable() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let addr = serve(store.clone()).await;
    // 0.8 rad at 1 rad/s: the motion runs for about 0.8 s.
    let body = json!({"input": {"joints": [0.8, 0, 0, 0, 0, 0], "speed": 1.0}}).to_string();
    let t0 = Instant::now();
    let (status, r) = request(addr, "POST", "/tools/arm-1__move_to:invoke", &body).await;
    let answered_after = t0.elapsed();
    assert_eq!(status, 202, "{r}");
    assert!(
        answered_after < Duration::from_millis(600),
        "the 202 does not wait for the motion to end ({answered_after:?})"
    );
    let id = r["data"]["invocation_id"].as_str().expect("id").to_owned();
    // Durable before the 202: the record is in the chain, the receipt not yet.
    assert_eq!(kinds_for(store.as_ref(), &id), ["invocation.accepted"]);
    let command_id = r["data"]["command_id"]
        .as_str()
        .expect("command id")
        .to_owned();
    assert!(kinds_for(store.as_ref(), &command_id)
        .iter()
        .all(|k| k != "command.receipt"));

    // Polled to its end: the receipt comes after the record in the chain.
    let mut done = Value::Null;
    for _ in 0..200 {
        let (status, res) = request(addr, "GET", &format!("/invocations/{id}/result"), "").await;
        if status == 200 {
            done = res;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(done["data"]["status"], "completed", "{done}");
    let tail = store.chain_tail(64).expect("tail");
    let at = |kind: &str, needle: &str| {
        tail.iter()
            .position(|e| e["kind"] == kind && e.to_string().contains(needle))
            .unwrap_or_else(|| panic!("no {kind} entry for {needle}"))
    };
    assert!(at("invocation.accepted", &id) < at("command.receipt", &command_id));
}
