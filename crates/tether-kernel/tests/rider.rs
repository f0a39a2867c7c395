//! A surface's record riding in a simulated command's first commit (the
//! REST gateway's invocation record): one commit for the record and the
//! receipt, the record first; taken by a refusal's commit too; left for the
//! surface when the command makes no commit (a replay).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

use serde_json::{json, Value};
use std::sync::Arc;
use tether_core::canonical::CanonicalText;
use tether_kernel::{
    CancelToken, CommandRequest, Kernel, Principal, Rider, RiderOutcome, SessionOpen,
};
use tether_store::{MemoryStore, Store};
use tokio::sync::oneshot;

struct Rig {
    k: Kernel,
    store: Arc<MemoryStore>,
    p: Principal,
    sid: String,
}

async fn rig() -> Rig {
    let store = Arc::new(MemoryStore::new());
    let k = common::builtin_kernel_on(store.clone());
    let p = Principal::local_agent();
    let sid = k
        .session_open(&p, SessionOpen::default())
        .await
        .expect("session")["session_id"]
        .as_str()
        .expect("sid")
        .to_owned();
    let rig = Rig { k, store, p, sid };
    // The session's entry is queued, not awaited: let it land before
    // commits are counted.
    for _ in 0..1000 {
        if rig.tail_kinds(1) == ["session.open"] {
            return rig;
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    panic!("the session's entry never landed");
}

impl Rig {
    fn setpoint(&self, degc: f64, command_id: Option<&str>) -> CommandRequest {
        CommandRequest {
            route: tether_kernel::Route::Command,
            session_id: Some(self.sid.clone()),
            device_id: "thermostat-1".into(),
            capability_id: "cap.thermal.setpoint.v1".into(),
            resource: None,
            input: json!({"target_temperature": degc}),
            command_id: command_id.map(str::to_owned),
            deadline: None,
            expected_revision: None,
            safe_place_grant: None,
            permit_id: None,
        }
    }

    /// Runs `req` with a rider; answers the receipt, the rider (to check
    /// whether it is still waiting) and its outcome receiver.
    async fn run_with_rider(
        &self,
        req: CommandRequest,
        id: &str,
    ) -> (Value, Rider, oneshot::Receiver<RiderOutcome>) {
        let record = CanonicalText::of_value(&json!({"invocation_id": id}), 4).expect("record");
        let (rider, outcome) = self.k.invocation_rider(id, record);
        let options = tether_kernel::CommandOptions {
            cancel: CancelToken::new(),
            on_admit: None,
            rider: Some(rider.clone()),
        };
        let answer = self
            .k
            .command(&self.p, req, options)
            .await
            .expect("answer")
            .into_value();
        (answer, rider, outcome)
    }

    fn commits(&self) -> u64 {
        self.store.stats().commits
    }

    fn tail_kinds(&self, n: usize) -> Vec<String> {
        self.store
            .chain_tail(n)
            .expect("tail")
            .iter()
            .map(|e| e["kind"].as_str().unwrap_or_default().to_owned())
            .collect()
    }
}

#[tokio::test]
async fn a_simulated_command_records_the_rider_and_its_receipt_in_one_commit() {
    let rig = rig().await;
    let before = rig.commits();
    let (r, rider, outcome) = rig.run_with_rider(rig.setpoint(30.0, None), "inv_a").await;
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(outcome.await.expect("told"), Ok(()));
    assert_eq!(
        rig.commits() - before,
        1,
        "one commit for both: {:?}",
        rig.tail_kinds(4)
    );
    assert_eq!(
        rig.tail_kinds(2),
        ["invocation.accepted", "command.receipt"]
    );
    // Taken: the surface has nothing left to write.
    assert!(!rider.submit_alone());
    // The receipt is stored under its command id, found through the index
    // even though the rider's entry came first in the commit.
    let id = r["command_id"].as_str().expect("id");
    let stored = rig.store.receipt(id).expect("read").expect("stored");
    assert_eq!(stored.receipt["receipt_id"], r["receipt_id"]);
}

#[tokio::test]
async fn a_refused_command_carries_the_rider_in_its_rejection_commit() {
    let rig = rig().await;
    let before = rig.commits();
    let (r, rider, outcome) = rig.run_with_rider(rig.setpoint(400.0, None), "inv_b").await;
    assert_eq!(r["status"], "rejected", "{r}");
    assert_eq!(outcome.await.expect("told"), Ok(()));
    assert_eq!(rig.commits() - before, 1, "{:?}", rig.tail_kinds(4));
    assert_eq!(
        rig.tail_kinds(2),
        ["invocation.accepted", "command.rejected"]
    );
    assert!(!rider.submit_alone());
}

#[tokio::test]
async fn a_replay_makes_no_commit_so_the_rider_is_left_for_the_surface() {
    let rig = rig().await;
    let id = "01J00000000000000000000042";
    let first = rig
        .k
        .command(
            &rig.p,
            rig.setpoint(31.0, Some(id)),
            tether_kernel::CommandOptions::plain(),
        )
        .await
        .map(tether_kernel::Answer::into_value)
        .expect("first");
    assert_eq!(first["status"], "completed", "{first}");
    let before = rig.commits();
    let (r, rider, outcome) = rig
        .run_with_rider(rig.setpoint(31.0, Some(id)), "inv_c")
        .await;
    assert_eq!(r["replayed"], true, "{r}");
    assert_eq!(rig.commits(), before, "a replay commits nothing");
    assert!(rider.submit_alone(), "still waiting");
    assert_eq!(outcome.await.expect("told"), Ok(()));
    assert_eq!(rig.tail_kinds(1), ["invocation.accepted"]);
}
