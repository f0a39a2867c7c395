//! The fleet: this endpoint among the others on one store.
//!
//! **Owns:** the endpoint's instance id; its leases (see
//! `tether_store::lease`) — `endpoint/<instance>`, which says it is alive and
//! which devices it serves, and `device/<id>` for each `hardware` or `hybrid`
//! device, which makes it that device's one owner; taking them at start-up
//! (refusing, or waiting, while another live endpoint owns a device), renewing
//! them while it runs, giving them up at an orderly stop; which open
//! operations belong to a live endpoint and so are not this start's to
//! reconcile; the fleet's devices an e-stop may name though this endpoint
//! does not serve them.
//! **Never belongs here:** the latch and the stop path (`safety/`), SQL
//! (`tether-store`).
//! **Fail-closed rule:** a device whose lease another live endpoint holds
//! refuses the start (never two drivers on one machine); a lease lost to
//! another endpoint while running latches the device here; an owner on this
//! host whose process is gone is known dead at once, one elsewhere only when
//! its lease lapses.

use crate::kernel::{Kernel, StartError};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tether_store::lease::{device_key, endpoint_key};
use tether_store::{Commit, LeaseDraft, LeaseHeld, LeaseOp, Leases, Store, StoreError};

/// Default lease of an endpoint and its devices, ms.
pub const FLEET_LEASE_MS_DEFAULT: u64 = 5_000;
/// Renewals per lease period: a lease survives two missed renewals.
const RENEWALS_PER_LEASE: u64 = 3;
/// Pause between attempts while waiting for a device another endpoint owns.
const CLAIM_RETRY: Duration = Duration::from_millis(500);
/// Takeovers of a dead holder tried in one claim, at most (one per device
/// and the endpoint's own lease, with room).
const TAKEOVERS_MAX: usize = 64;

const _: () = assert!(FLEET_LEASE_MS_DEFAULT >= tether_store::lease::LEASE_MS_MIN);
const _: () = assert!(FLEET_LEASE_MS_DEFAULT <= tether_store::lease::LEASE_MS_MAX);

/// What this process knows of the fleet.
#[derive(Default)]
pub(crate) struct FleetState {
    /// Devices other live endpoints serve, with the endpoint id of one that
    /// does, from the last lease read.
    pub others: Mutex<HashMap<String, String>>,
    /// Whether this endpoint took its leases (a kernel in a test may not).
    pub claimed: AtomicBool,
}

/// This host's name (the kernel's, from `/proc`; `localhost` when unknown):
/// a lease holder on the same host whose process is gone is dead at once.
pub fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Who holds a lease, as its holder described itself.
fn describe(info: &Value, holder: &str) -> String {
    let s = |k: &str| {
        info.get(k)
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_owned()
    };
    let pid = info.get("pid").and_then(Value::as_u64).unwrap_or(0);
    format!(
        "endpoint `{}` (pid {pid} on host `{}`, instance {holder})",
        s("endpoint_id"),
        s("host")
    )
}

/// Whether a holder that described itself with `info` is a process of this
/// host that no longer exists (then its lease is dead whatever its expiry).
pub fn holder_gone(info: &Value, host: &str) -> bool {
    let same_host = info.get("host").and_then(Value::as_str) == Some(host);
    let pid = info.get("pid").and_then(Value::as_u64);
    match pid {
        Some(pid) if same_host && pid != u64::from(std::process::id()) => {
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
        }
        _ => false,
    }
}

/// The instances whose `endpoint/` lease is live: their open operations
/// are theirs to finish, not a start's to reconcile.
pub(crate) fn live_instances(leases: &Leases, host: &str) -> HashSet<String> {
    leases
        .rows
        .iter()
        .filter(|r| r.key.starts_with("endpoint/"))
        .filter(|r| r.live_at(leases.now_ms) && !holder_gone(&r.info, host))
        .map(|r| r.holder.clone())
        .collect()
}

impl Kernel {
    /// This process's instance id (the holder of its leases).
    pub fn instance_id(&self) -> &str {
        &self.inner.instance
    }

    /// What this endpoint says of itself in its lease.
    fn endpoint_info(&self) -> Value {
        let devices: Vec<Value> = self
            .inner
            .devices
            .iter()
            .map(|d| json!({"device_id": d.id(), "mode": d.spec.manifest.mode.as_str()}))
            .collect();
        json!({
            "endpoint_id": self.inner.config.endpoint_id,
            "host": self.inner.config.host,
            "pid": std::process::id(),
            "started_ms": self.inner.started_ms,
            "version": env!("CARGO_PKG_VERSION"),
            "devices": devices,
        })
    }

    /// The leases this endpoint holds: its own and one per physical device.
    fn lease_drafts(&self, replaces: &HashMap<String, String>) -> Vec<LeaseDraft> {
        let lease_ms = self.inner.config.fleet_lease_ms;
        let info = self.endpoint_info();
        let mut keys = vec![endpoint_key(&self.inner.instance)];
        keys.extend(
            self.inner
                .devices
                .iter()
                .filter(|d| d.spec.manifest.mode.is_physical())
                .map(|d| device_key(d.id())),
        );
        keys.into_iter()
            .map(|key| LeaseDraft {
                op: LeaseOp::Hold {
                    lease_ms,
                    info: info.clone(),
                    replaces: replaces.get(&key).cloned(),
                },
                holder: self.inner.instance.clone(),
                key,
            })
            .collect()
    }

    /// Start-up: takes the endpoint's leases on `store`. A device another
    /// live endpoint owns refuses the start, or, with
    /// `wait_for_devices_ms`, is waited for up to that long (said once).
    pub(crate) fn claim_fleet(&self, store: &dyn Store) -> Result<(), StartError> {
        if !self.inner.config.claim_devices {
            return Ok(());
        }
        let waited = Instant::now();
        let wait = Duration::from_millis(self.inner.config.wait_for_devices_ms);
        let mut replaces = HashMap::new();
        let mut said = false;
        // The leases of endpoints of this host whose process is gone are
        // given up for them with this start's own.
        let gone = self.gone_here(store)?;
        // Bounded: each round takes over one more dead holder or waits.
        loop {
            let held = match self.commit_claim(store, &replaces, &gone) {
                Ok(()) => break,
                Err(StoreError::LeaseHeld(h)) => h,
                Err(e) => return Err(StartError::Store(e)),
            };
            let info: Value = serde_json::from_str(&held.info).unwrap_or(Value::Null);
            if holder_gone(&info, &self.inner.config.host) && replaces.len() < TAKEOVERS_MAX {
                replaces.insert(held.key.clone(), held.holder.clone());
                continue;
            }
            if waited.elapsed() >= wait {
                // As a store error, so the deferred start treats it as the
                // integrity defect it is (waiting longer heals nothing);
                // `owned_error` names it for the caller.
                return Err(StartError::Store(StoreError::LeaseHeld(held)));
            }
            if !said {
                said = true;
                tracing::warn!(owner = %describe(&info, &held.holder), lease = %held.key, "waiting for a device another endpoint owns");
            }
            std::thread::sleep(CLAIM_RETRY.min(wait.saturating_sub(waited.elapsed())));
        }
        self.inner.fleet.claimed.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// The start's commit: its leases, and the release of `gone`.
    fn commit_claim(
        &self,
        store: &dyn Store,
        replaces: &HashMap<String, String>,
        gone: &[LeaseDraft],
    ) -> Result<(), StoreError> {
        let mut leases = self.lease_drafts(replaces);
        leases.extend(gone.iter().cloned());
        store
            .commit_blocking(Commit {
                leases,
                ..Commit::default()
            })
            .map(|_| ())
    }

    /// Releases of the `endpoint/` leases whose holder is a process of this
    /// host that no longer exists.
    fn gone_here(&self, store: &dyn Store) -> Result<Vec<LeaseDraft>, StartError> {
        let leases = store.leases().map_err(StartError::Store)?;
        Ok(leases
            .rows
            .iter()
            .filter(|r| r.key.starts_with("endpoint/") && r.holder != self.inner.instance)
            .filter(|r| holder_gone(&r.info, &self.inner.config.host))
            .map(|r| LeaseDraft {
                key: r.key.clone(),
                holder: r.holder.clone(),
                op: LeaseOp::Release,
            })
            .collect())
    }

    fn commit_leases(
        &self,
        store: &dyn Store,
        replaces: &HashMap<String, String>,
    ) -> Result<(), StoreError> {
        store
            .commit_blocking(Commit {
                leases: self.lease_drafts(replaces),
                ..Commit::default()
            })
            .map(|_| ())
    }

    /// The instances whose open operations this start must leave alone.
    pub(crate) fn live_others(&self, store: &dyn Store) -> Result<HashSet<String>, StartError> {
        if !self.inner.config.claim_devices {
            return Ok(HashSet::new());
        }
        let leases = store.leases().map_err(StartError::Store)?;
        let mut live = live_instances(&leases, &self.inner.config.host);
        live.remove(&self.inner.instance);
        Ok(live)
    }

    /// One renewal of every lease; a device's lease found held by another
    /// endpoint latches that device here. Then the fleet's devices are read
    /// again for the e-stop.
    fn renew_fleet(&self, runtime: &tokio::runtime::Handle) {
        if !self.inner.fleet.claimed.load(Ordering::SeqCst) {
            // Not yet taken (a store still being opened): the start takes
            // them, with its checks, never a renewal.
            return;
        }
        match self.commit_leases(self.inner.store.as_ref(), &HashMap::new()) {
            Ok(()) => {}
            Err(StoreError::LeaseHeld(h)) => self.lease_lost(&h, runtime),
            Err(e) => tracing::warn!(error = %e, "the fleet leases could not be renewed"),
        }
        if let Ok(leases) = self.inner.store.leases() {
            self.learn_fleet(&leases);
        }
    }

    /// Another endpoint holds a lease this one held: it owns that device
    /// now, so this endpoint latches it and never drives it again.
    fn lease_lost(&self, held: &LeaseHeld, runtime: &tokio::runtime::Handle) {
        let info: Value = serde_json::from_str(&held.info).unwrap_or(Value::Null);
        let owner = describe(&info, &held.holder);
        tracing::error!(lease = %held.key, %owner, "a device's ownership was lost to another endpoint; it is latched here");
        let Some(device) = held.key.strip_prefix("device/") else {
            return;
        };
        let Some(d) = self.device_index(device) else {
            return;
        };
        let kernel = self.clone();
        let reason = format!("ownership of the device lost to {owner}");
        runtime.spawn(async move {
            kernel.trip_device(d, &reason, "fleet.lease_lost").await;
        });
    }

    /// Remembers which devices other live endpoints serve.
    fn learn_fleet(&self, leases: &Leases) {
        let other_live: Vec<&tether_store::LeaseRow> = leases
            .rows
            .iter()
            .filter(|r| {
                r.key.starts_with("endpoint/")
                    && r.holder != self.inner.instance
                    && r.live_at(leases.now_ms)
            })
            .collect();
        let mut others = HashMap::new();
        for row in &other_live {
            let endpoint = row
                .info
                .get("endpoint_id")
                .and_then(Value::as_str)
                .unwrap_or("?");
            let devices = row.info.get("devices").and_then(Value::as_array);
            for dev in devices.into_iter().flatten() {
                if let Some(id) = dev.get("device_id").and_then(Value::as_str) {
                    others.insert(id.to_owned(), endpoint.to_owned());
                }
            }
        }
        let alone = other_live
            .iter()
            .all(|r| holder_gone(&r.info, &self.inner.config.host));
        if let Ok(mut ix) = self.inner.idem.lock() {
            ix.set_alone(alone);
        }
        if let Ok(mut o) = self.inner.fleet.others.lock() {
            *o = others;
        }
    }

    /// Reads the leases again (the watcher, when the store changed): who
    /// else is on the store, and which devices they serve.
    pub(crate) fn refresh_fleet(&self) {
        if !self.inner.config.claim_devices {
            return;
        }
        if let Ok(leases) = self.inner.store.leases() {
            self.learn_fleet(&leases);
        }
    }

    /// The endpoint that serves `device_id` elsewhere in the fleet, if this
    /// one does not and another live one does.
    pub fn fleet_owner_of(&self, device_id: &str) -> Option<String> {
        if self.device_index(device_id).is_some() {
            return None;
        }
        self.inner.fleet.others.lock().ok()?.get(device_id).cloned()
    }

    /// Starts the thread that renews this endpoint's leases every third of
    /// a lease; dropping the guard stops it and gives the leases up.
    ///
    /// # Errors
    /// The thread could not be started.
    pub fn start_fleet_lease(
        &self,
        runtime: tokio::runtime::Handle,
    ) -> std::io::Result<FleetLease> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let kernel = self.clone();
        if let Ok(leases) = self.inner.store.leases() {
            self.learn_fleet(&leases);
        }
        let period = Duration::from_millis(self.inner.config.fleet_lease_ms / RENEWALS_PER_LEASE);
        let handle = std::thread::Builder::new()
            .name("tether-fleet-lease".into())
            .spawn(move || {
                let mut last = Instant::now();
                // Runs for the life of the endpoint, waking every 20 ms to
                // notice the guard's drop.
                while !flag.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(20).min(period));
                    if last.elapsed() >= period {
                        last = Instant::now();
                        kernel.renew_fleet(&runtime);
                    }
                }
            })?;
        Ok(FleetLease {
            kernel: self.clone(),
            stop,
            handle: Some(handle),
        })
    }

    /// Gives the leases up (an orderly stop).
    fn release_fleet(&self) {
        if !self.inner.fleet.claimed.load(Ordering::SeqCst) {
            return;
        }
        let leases = self
            .lease_drafts(&HashMap::new())
            .into_iter()
            .map(|d| LeaseDraft {
                op: LeaseOp::Release,
                ..d
            })
            .collect();
        // State, not evidence: no entry, so the final signed checkpoint of
        // an orderly stop stays the chain's last entry.
        let r = self.inner.store.commit_blocking(Commit {
            leases,
            ..Commit::default()
        });
        if let Err(e) = r {
            tracing::warn!(error = %e, "the fleet leases could not be given up; they lapse on their own");
        }
    }
}

/// The start-up refusal for a device another endpoint owns, from the
/// store's refusal of its lease; any other error as it is.
pub(crate) fn owned_error(e: StartError) -> StartError {
    let StartError::Store(StoreError::LeaseHeld(held)) = e else {
        return e;
    };
    let info: Value = serde_json::from_str(&held.info).unwrap_or(Value::Null);
    let device = held.key.strip_prefix("device/").unwrap_or(&held.key);
    StartError::DeviceOwned {
        device: device.to_owned(),
        owner: describe(&info, &held.holder),
    }
}

/// Renews the fleet leases while alive; gives them up when dropped.
pub struct FleetLease {
    kernel: Kernel,
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Drop for FleetLease {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        self.kernel.release_fleet();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_store::LeaseRow;

    fn endpoint(holder: &str, until_ms: u64, host: &str, pid: u32) -> LeaseRow {
        LeaseRow {
            key: endpoint_key(holder),
            holder: holder.into(),
            renewed_ms: 0,
            until_ms,
            info: json!({"host": host, "pid": pid}),
        }
    }

    #[test]
    fn an_endpoint_is_live_while_its_lease_holds_and_its_process_is_not_known_dead() {
        let me = std::process::id();
        let leases = Leases {
            rows: vec![
                endpoint("live-here", 100, "h", me),
                endpoint("lapsed", 5, "elsewhere", 1),
                endpoint("live-elsewhere", 100, "elsewhere", 1),
                // A pid that cannot exist on this host.
                endpoint("dead-here", 100, "h", u32::MAX - 1),
            ],
            now_ms: 10,
        };
        let live = live_instances(&leases, "h");
        assert!(live.contains("live-here"));
        assert!(live.contains("live-elsewhere"));
        assert!(!live.contains("lapsed"));
        assert!(!live.contains("dead-here"));
    }
}
