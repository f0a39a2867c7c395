//! The e-stop of a device another endpoint of the fleet serves.
//!
//! **Owns:** [`Kernel::estop_fleet`]: the trip row written into the shared
//! store for devices this endpoint knows only from the fleet's leases; their
//! owner's governed-stop watcher latches them, aborts their calls and runs
//! their stop path within its bound.
//! **Never belongs here:** the local latch and stop path (`estop.rs`), the
//! leases (`kernel/fleet.rs`).
//! **Fail-closed rule:** never refused; a trip the store does not take at
//! once is answered `latch_durable: false` and retried in the background
//! until it is durable (bounded), since the owner only learns of it there.

use crate::kernel::Kernel;
use crate::safety::governed::trip_row;
use crate::Principal;
use serde_json::{json, Value};
use std::time::Duration;
use tether_core::{ids, receipt::now_ms, Code};
use tether_store::{Commit, EventDraft};

/// Longest an answer waits for the trip to be durable.
const FLEET_TRIP_WAIT: Duration = Duration::from_secs(2);
/// Delay between background attempts to make a trip durable.
const FLEET_TRIP_RETRY: Duration = Duration::from_millis(200);
/// Background attempts, at most (ten minutes of them).
const FLEET_TRIP_RETRIES_MAX: u32 = 3_000;

impl Kernel {
    /// Trips `device_ids` (served by other endpoints of the fleet) through
    /// the store. Answers an e-stop receipt saying whether the trip is durable.
    pub async fn estop_fleet(
        &self,
        device_ids: &[String],
        reason: &str,
        by: Option<&Principal>,
    ) -> Value {
        let reason = if reason.is_empty() {
            "fleet e-stop"
        } else {
            reason
        };
        let reason = crate::bounds::cut(reason, self.inner.config.text_chars_max);
        let since = now_ms();
        let owners: Vec<Value> = device_ids
            .iter()
            .map(|d| json!({"device_id": d, "served_by": self.fleet_owner_of(d)}))
            .collect();
        let by_json = by.map(Principal::to_json);
        let commit = Commit {
            events: vec![EventDraft {
                kind: "safety.estop.fleet".into(),
                body: json!({"device_ids": device_ids, "served_by": owners, "reason": reason, "requested_by": by_json, "endpoint_id": self.inner.config.endpoint_id}).into(),
            }],
            latches: device_ids
                .iter()
                .map(|d| trip_row(d, since, &reason, "fleet_estop"))
                .collect(),
            ..Commit::default()
        };
        let durable = matches!(
            tokio::time::timeout(FLEET_TRIP_WAIT, self.commit(commit.clone())).await,
            Ok(Ok(_))
        );
        if !durable {
            self.spawn_fleet_trip_retry(commit);
        }
        let error = (!durable).then(|| json!({"mhs_code": Code::EvidenceUnavailable.as_str(), "message": "the store did not take the trip yet: the owning endpoints learn of it only there; it is retried until durable", "retryable": true}));
        json!({
            "receipt_id": ids::mint("rcpt_"),
            "capability_id": crate::safety::estop::INTERNAL_ESTOP,
            "device_ids": device_ids,
            "status": if durable { "completed" } else { "failed" },
            "output": {"latched": durable, "latch_durable": durable, "scope": "fleet", "served_by": owners, "stop_path": "run by the owning endpoint"},
            "error": error,
            "safe_state_achieved": false,
            "latch_durable": durable,
            "not_certified": true,
        })
    }

    /// Retries a fleet trip until the store takes it (bounded).
    fn spawn_fleet_trip_retry(&self, commit: Commit) {
        let kernel = self.clone();
        tokio::spawn(async move {
            for _ in 0..FLEET_TRIP_RETRIES_MAX {
                tokio::time::sleep(FLEET_TRIP_RETRY).await;
                if kernel.commit(commit.clone()).await.is_ok() {
                    return;
                }
            }
            tracing::error!(
                "a fleet e-stop could not be made durable; its owners never learned of it"
            );
        });
    }
}
