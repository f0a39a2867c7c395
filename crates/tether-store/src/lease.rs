//! Leases: who holds a name on a shared store, and until when.
//!
//! A fleet of endpoints on one store needs two facts no single process can
//! keep: which endpoints are alive (each holds `endpoint/<instance>`) and
//! which endpoint drives each physical device (`device/<device_id>`). Both
//! are leases: a row naming its holder and an expiry on the **store's**
//! clock (SQLite: the writer's host; PostgreSQL: the database server), so
//! hosts whose clocks disagree still agree on who holds what.
//!
//! **Contract of every backend.** A commit's [`LeaseDraft`]s are decided in
//! the writer's transaction, under its write lock, before anything of the
//! commit is written: a `Hold` succeeds when the name is free, already held
//! by the same holder, expired (`until_ms` before the store's now), or held
//! by the holder it `replaces`; otherwise the whole commit fails with
//! [`crate::StoreError::LeaseHeld`] and nothing of it is stored. A `Release`
//! deletes the row only while its holder holds it (a no-op otherwise, so it
//! may be retried). Leases are state, not evidence: a commit that carries
//! only leases appends nothing to the chain.
//!
//! Never here: what a lease means to the kernel (start-up refusal, renewal,
//! the loss of a device) — that is `tether-kernel`'s `fleet` module.

use serde_json::Value;

/// Longest lease a holder may ask for, ms (one hour): a longer one would
/// keep a dead owner's devices for longer than anyone would wait.
pub const LEASE_MS_MAX: u64 = 3_600_000;
/// Shortest lease, ms: renewals must fit inside it with room to spare.
pub const LEASE_MS_MIN: u64 = 100;
const _: () = assert!(LEASE_MS_MIN < LEASE_MS_MAX);

/// One lease change a commit asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseDraft {
    /// The name: `endpoint/<instance>` or `device/<device_id>`.
    pub key: String,
    /// Who asks: the endpoint process's instance id.
    pub holder: String,
    /// Take or renew, or give up.
    pub op: LeaseOp,
}

/// What a [`LeaseDraft`] does.
#[derive(Debug, Clone, PartialEq)]
pub enum LeaseOp {
    /// Take or renew the name for `lease_ms` from the store's now.
    Hold {
        /// How long the lease lasts without a renewal, ms
        /// ([`LEASE_MS_MIN`]..=[`LEASE_MS_MAX`]).
        lease_ms: u64,
        /// What readers are told about the holder (endpoint id, host, pid,
        /// devices): a JSON object.
        info: Value,
        /// A holder known to be gone (a dead process on the same host) whose
        /// unexpired lease this one may take over.
        replaces: Option<String>,
    },
    /// Give the name up.
    Release,
}

/// A lease as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseRow {
    /// The name.
    pub key: String,
    /// The holder's instance id.
    pub holder: String,
    /// When it was last taken or renewed, store clock, ms since the epoch.
    pub renewed_ms: u64,
    /// When it lapses without a renewal, store clock.
    pub until_ms: u64,
    /// What the holder said about itself.
    pub info: Value,
}

impl LeaseRow {
    /// Whether the lease still holds at the store's `now_ms`.
    pub fn live_at(&self, now_ms: u64) -> bool {
        self.until_ms >= now_ms
    }
}

/// Every lease a store holds, with the store's clock when they were read
/// (judge expiry against it, not the reader's clock).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Leases {
    /// The rows, ordered by key.
    pub rows: Vec<LeaseRow>,
    /// The store's now at the read, ms since the epoch.
    pub now_ms: u64,
}

impl Leases {
    /// The row of `key`, if any (live or not).
    pub fn get(&self, key: &str) -> Option<&LeaseRow> {
        self.rows.iter().find(|r| r.key == key)
    }
}

/// The lease name of an endpoint process.
pub fn endpoint_key(instance: &str) -> String {
    format!("endpoint/{instance}")
}

/// The lease name of a device's ownership.
pub fn device_key(device_id: &str) -> String {
    format!("device/{device_id}")
}

/// A lease the store refused: its name is held by another live holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseHeld {
    /// The name.
    pub key: String,
    /// Who holds it.
    pub holder: String,
    /// Until when (store clock).
    pub until_ms: u64,
    /// What the holder said about itself, as JSON text.
    pub info: String,
}

impl std::fmt::Display for LeaseHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is held by {} until {} ms ({})",
            self.key, self.holder, self.until_ms, self.info
        )
    }
}

/// How a backend decides one `Hold` against the stored row (`None`: free):
/// `Ok(())` to write it, `Err` to refuse the commit.
///
/// # Errors
/// [`crate::StoreError::LeaseHeld`] when another live holder has it.
pub(crate) fn decide_hold(
    draft: &LeaseDraft,
    stored: Option<&LeaseRow>,
    now_ms: u64,
) -> Result<(), crate::StoreError> {
    let LeaseOp::Hold { replaces, .. } = &draft.op else {
        return Ok(());
    };
    let Some(row) = stored else { return Ok(()) };
    let free = row.holder == draft.holder
        || !row.live_at(now_ms)
        || replaces.as_deref() == Some(row.holder.as_str());
    if free {
        return Ok(());
    }
    Err(crate::StoreError::LeaseHeld(LeaseHeld {
        key: row.key.clone(),
        holder: row.holder.clone(),
        until_ms: row.until_ms,
        info: row.info.to_string(),
    }))
}

/// Every draft of a commit decided against `stored` (a map by key), in order.
///
/// # Errors
/// The first [`crate::StoreError::LeaseHeld`].
pub(crate) fn decide_all(
    stored: &std::collections::BTreeMap<String, LeaseRow>,
    drafts: &[(LeaseDraft, String)],
    now_ms: u64,
) -> Result<(), crate::StoreError> {
    for (d, _) in drafts {
        decide_hold(d, stored.get(&d.key), now_ms)?;
    }
    Ok(())
}

/// Applies drafts already decided to a map by key (the memory store).
pub(crate) fn apply_all(
    stored: &mut std::collections::BTreeMap<String, LeaseRow>,
    drafts: &[(LeaseDraft, String)],
    now_ms: u64,
) {
    for (d, _) in drafts {
        match &d.op {
            LeaseOp::Hold { lease_ms, info, .. } => {
                stored.insert(
                    d.key.clone(),
                    LeaseRow {
                        key: d.key.clone(),
                        holder: d.holder.clone(),
                        renewed_ms: now_ms,
                        until_ms: now_ms.saturating_add(*lease_ms),
                        info: info.clone(),
                    },
                );
            }
            LeaseOp::Release => {
                if stored.get(&d.key).is_some_and(|r| r.holder == d.holder) {
                    stored.remove(&d.key);
                }
            }
        }
    }
}

/// Checks a commit's lease drafts (done in `prepare`, on the caller's thread).
pub(crate) fn check_drafts(drafts: &[LeaseDraft]) -> Result<(), crate::StoreError> {
    for d in drafts {
        if d.key.is_empty() || d.holder.is_empty() || d.key.len() > 512 || d.holder.len() > 512 {
            return Err(crate::StoreError::Invalid(format!(
                "a lease needs a key and a holder of at most 512 bytes ({:?})",
                tether_core::echo::id(&d.key)
            )));
        }
        if let LeaseOp::Hold { lease_ms, info, .. } = &d.op {
            if !(LEASE_MS_MIN..=LEASE_MS_MAX).contains(lease_ms) {
                return Err(crate::StoreError::Invalid(format!(
                    "lease {} of {lease_ms} ms is outside {LEASE_MS_MIN}..={LEASE_MS_MAX} ms",
                    tether_core::echo::id(&d.key)
                )));
            }
            if !info.is_object() {
                return Err(crate::StoreError::Invalid(format!(
                    "lease {}: info must be a JSON object",
                    tether_core::echo::id(&d.key)
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(holder: &str, until_ms: u64) -> LeaseRow {
        LeaseRow {
            key: "device/arm".into(),
            holder: holder.into(),
            renewed_ms: 0,
            until_ms,
            info: json!({}),
        }
    }

    fn hold(holder: &str, replaces: Option<&str>) -> LeaseDraft {
        LeaseDraft {
            key: "device/arm".into(),
            holder: holder.into(),
            op: LeaseOp::Hold {
                lease_ms: 1000,
                info: json!({}),
                replaces: replaces.map(str::to_owned),
            },
        }
    }

    #[test]
    fn a_hold_is_refused_only_while_another_holder_is_live() {
        assert!(decide_hold(&hold("a", None), None, 10).is_ok());
        assert!(decide_hold(&hold("a", None), Some(&row("a", 20)), 10).is_ok());
        assert!(decide_hold(&hold("b", None), Some(&row("a", 9)), 10).is_ok());
        assert!(decide_hold(&hold("b", Some("a")), Some(&row("a", 20)), 10).is_ok());
        let refused = decide_hold(&hold("b", None), Some(&row("a", 10)), 10);
        assert!(matches!(refused, Err(crate::StoreError::LeaseHeld(h)) if h.holder == "a"));
        let wrong = decide_hold(&hold("b", Some("c")), Some(&row("a", 20)), 10);
        assert!(wrong.is_err());
    }

    #[test]
    fn drafts_out_of_range_are_invalid() {
        let mut d = hold("a", None);
        assert!(check_drafts(&[d.clone()]).is_ok());
        d.op = LeaseOp::Hold {
            lease_ms: LEASE_MS_MAX + 1,
            info: json!({}),
            replaces: None,
        };
        assert!(check_drafts(&[d.clone()]).is_err());
        d.op = LeaseOp::Hold {
            lease_ms: 1000,
            info: json!([1]),
            replaces: None,
        };
        assert!(check_drafts(&[d]).is_err());
    }
}
