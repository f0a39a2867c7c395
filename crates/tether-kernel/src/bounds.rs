//! The bounds per caller: how many approvals and permits one principal, and
//! the endpoint, may hold open, and how long a caller's free text may be.
//! Their defaults, the relation between each per-principal bound and its
//! global one, and the check a [`crate::KernelConfig`] passes at start.
//!
//! **Owns:** the defaults (`*_DEFAULT`), the limits a configured value must
//! stay within, [`check`], and the text bound's two helpers ([`within`]
//! refuses, [`cut`] shortens).
//! **Never belongs here:** counting what is open (the approval table,
//! `approvals/gate.rs`; the permit table, `check/permits.rs`), the MCP
//! session bounds (`tether-server`, where the sessions are).
//! **Fail-closed rule:** a config whose per-principal bound could let one
//! principal reach the global bound alone does not start.

use crate::ApiError;
use serde_json::json;
use tether_core::Code;

/// Open approvals (pending, or approved and unused) on the endpoint, at most.
pub const APPROVALS_OPEN_MAX_DEFAULT: usize = 1024;
/// Open approvals one principal may hold, at most.
pub const APPROVALS_OPEN_PER_PRINCIPAL_MAX_DEFAULT: usize = 64;
/// Outstanding permits on the endpoint, at most.
pub const PERMITS_MAX_DEFAULT: usize = 4096;
/// Outstanding permits of one principal, at most.
pub const PERMITS_PER_PRINCIPAL_MAX_DEFAULT: usize = 256;
/// Longest free text (a reason) a caller may hand the kernel, characters.
pub const TEXT_CHARS_MAX_DEFAULT: usize = 1024;
/// Completed command ids the idempotency index keeps in memory (about 170
/// bytes each with its digest, plus the index's table sized for the bound
/// once: ~13 MiB at 50,000; 200,000 held ~55 MiB). A miss beyond it asks the
/// store, so a replay is still recognised.
pub const IDEMPOTENCY_CACHE_MAX_DEFAULT: usize = 50_000;

/// Approvals on a page of `mhs.approvals.list` when the caller names no
/// `limit`.
pub const APPROVALS_PAGE_DEFAULT: usize = 100;
/// Most approvals on one page of `mhs.approvals.list`: a page stays well
/// under the 1 MiB a request may be (an approval with its votes is about
/// 1 KiB; each vote's reason is bounded by the text bound).
pub const APPROVALS_PAGE_MAX: usize = 500;
const _: () = assert!(APPROVALS_PAGE_DEFAULT <= APPROVALS_PAGE_MAX);

/// Smallest text bound a config may set: an e-stop reason the surfaces'
/// `estop` tool schema accepts (512 characters) is always kept whole.
pub const TEXT_CHARS_MIN: usize = 512;
/// Largest text bound a config may set, characters.
pub const TEXT_CHARS_LIMIT: usize = 65_536;
/// Largest global approvals bound a config may set: the approval table also
/// keeps denials (final, so remembered) and is capped at twice this.
pub const APPROVALS_OPEN_LIMIT: usize = 10_000;
/// Largest global permits bound a config may set.
pub const PERMITS_LIMIT: usize = 65_536;

/// Whether a per-principal bound leaves one principal unable to reach the
/// global bound alone: at least 1, and at most half of the global bound (so
/// as much again is always left to the others).
pub const fn per_principal_fits(per_principal: usize, global: usize) -> bool {
    per_principal >= 1 && per_principal <= global / 2
}

// The defaults keep that relation, and stay within what a config may set.
const _: () = assert!(per_principal_fits(
    APPROVALS_OPEN_PER_PRINCIPAL_MAX_DEFAULT,
    APPROVALS_OPEN_MAX_DEFAULT
));
const _: () = assert!(per_principal_fits(
    PERMITS_PER_PRINCIPAL_MAX_DEFAULT,
    PERMITS_MAX_DEFAULT
));
const _: () = assert!(APPROVALS_OPEN_MAX_DEFAULT <= APPROVALS_OPEN_LIMIT);
const _: () = assert!(PERMITS_MAX_DEFAULT <= PERMITS_LIMIT);
const _: () = assert!(TEXT_CHARS_MIN <= TEXT_CHARS_MAX_DEFAULT);
const _: () = assert!(TEXT_CHARS_MAX_DEFAULT <= TEXT_CHARS_LIMIT);

/// One bound of a config, by its config key, for [`check`].
pub struct Bound {
    /// The config key (`limits.permits_max`).
    pub key: &'static str,
    /// Its value.
    pub value: usize,
}

/// Every defect of a config's bounds, as one line each naming the keys:
/// a global bound outside `1..=limit`, a per-principal bound that one
/// principal could reach the global bound with, a text bound outside
/// [`TEXT_CHARS_MIN`]..=[`TEXT_CHARS_LIMIT`].
pub fn check(config: &crate::KernelConfig) -> Vec<String> {
    let mut defects = Vec::new();
    let pairs = [
        (
            Bound {
                key: "limits.approvals_open_max",
                value: config.approvals_open_max,
            },
            Bound {
                key: "limits.approvals_open_per_principal_max",
                value: config.approvals_open_per_principal_max,
            },
            APPROVALS_OPEN_LIMIT,
        ),
        (
            Bound {
                key: "limits.permits_max",
                value: config.permits_max,
            },
            Bound {
                key: "limits.permits_per_principal_max",
                value: config.permits_per_principal_max,
            },
            PERMITS_LIMIT,
        ),
    ];
    for (global, per, limit) in pairs {
        defects.extend(check_pair(&global, &per, limit));
    }
    if !(TEXT_CHARS_MIN..=TEXT_CHARS_LIMIT).contains(&config.text_chars_max) {
        defects.push(format!(
            "limits.text_chars_max = {}: must be between {TEXT_CHARS_MIN} (an e-stop reason the estop tool accepts is kept whole) and {TEXT_CHARS_LIMIT}",
            config.text_chars_max
        ));
    }
    defects.extend(check_fleet(config));
    defects
}

/// The fleet's timings: a lease the store takes, renewed well inside it;
/// a stop bound the watcher's polls fit in many times.
fn check_fleet(config: &crate::KernelConfig) -> Vec<String> {
    let mut defects = Vec::new();
    let lease = config.fleet_lease_ms;
    if !(FLEET_LEASE_MS_MIN..=tether_store::lease::LEASE_MS_MAX).contains(&lease) {
        defects.push(format!(
            "fleet.lease_ms = {lease}: must be between {FLEET_LEASE_MS_MIN} and {}",
            tether_store::lease::LEASE_MS_MAX
        ));
    }
    let bound = config.stop_bound_ms;
    if !(STOP_BOUND_MS_MIN..=STOP_BOUND_MS_MAX).contains(&bound) {
        defects.push(format!(
            "fleet.stop_bound_ms = {bound}: must be between {STOP_BOUND_MS_MIN} and {STOP_BOUND_MS_MAX}"
        ));
    }
    // An endpoint cut off from its store stops driving its devices (the
    // bound) well before its leases lapse and another may take them.
    if bound.saturating_mul(2) > lease {
        defects.push(format!(
            "fleet.stop_bound_ms = {bound}: must be at most half of fleet.lease_ms ({lease}), so an endpoint cut off from its store has stopped its physical calls before another endpoint may take its devices"
        ));
    }
    defects
}

/// Shortest fleet lease, ms (renewed every third, so every ~330 ms).
pub const FLEET_LEASE_MS_MIN: u64 = 1_000;
/// Shortest stop bound, ms: five of PostgreSQL's fallback polls.
pub const STOP_BOUND_MS_MIN: u64 = 100;
/// Longest stop bound, ms.
pub const STOP_BOUND_MS_MAX: u64 = 60_000;
const _: () = assert!(FLEET_LEASE_MS_MIN >= tether_store::lease::LEASE_MS_MIN);
const _: () = assert!(STOP_BOUND_MS_MIN >= 5 * tether_store::postgres::PG_CHANGE_POLL_MS);

/// The defects of one global bound and its per-principal bound.
pub fn check_pair(global: &Bound, per: &Bound, limit: usize) -> Vec<String> {
    let mut defects = Vec::new();
    if !(1..=limit).contains(&global.value) {
        defects.push(format!(
            "{} = {}: must be between 1 and {limit}",
            global.key, global.value
        ));
    }
    if !per_principal_fits(per.value, global.value) {
        defects.push(format!(
            "{} = {}: must be at least 1 and at most half of {} ({}), so that one principal cannot reach the endpoint's bound alone",
            per.key,
            per.value,
            global.key,
            global.value / 2
        ));
    }
    defects
}

/// `text` if it is at most `max` characters, else the refusal naming the
/// field and the bound (`MHS.PROTOCOL.INVALID_PARAMS`, `text_too_long`).
///
/// # Errors
/// The text is longer than `max` characters.
pub(crate) fn within<'t>(field: &str, text: &'t str, max: usize) -> Result<&'t str, ApiError> {
    match text.char_indices().nth(max) {
        None => Ok(text),
        Some(_) => Err(ApiError::new(
            Code::ProtocolInvalidParams,
            format!("`{field}` is longer than {max} characters; shorten it"),
            json!({"reason": "text_too_long", "field": field, "limit": max, "chars": text.chars().count(), "key": "limits.text_chars_max"}),
        )),
    }
}

/// `text` cut to at most `max` characters (for what is never refused: an
/// e-stop's reason, a disarm's).
pub(crate) fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_owned(),
        Some((at, _)) => text[..at].to_owned(),
    }
}

impl crate::Kernel {
    /// The longest free text this kernel keeps, characters
    /// (`limits.text_chars_max`): a surface cuts an e-stop's reason to it.
    pub fn text_chars_max(&self) -> usize {
        self.inner.config.text_chars_max
    }
}

/// The refusal of a request that would take one principal, or the endpoint,
/// past a bound: `MHS.PROTOCOL.LIMIT` (retryable), naming the bound, its
/// value and its config key (`null` for a fixed bound).
pub(crate) fn limit_refusal(
    what: &str,
    reason: &str,
    key: Option<&str>,
    limit: usize,
) -> tether_core::Refusal {
    tether_core::Refusal::new(
        Code::ProtocolLimit,
        format!("{what} (at most {limit}); retry once some are used, decided or expired"),
        json!({"reason": reason, "limit": limit, "key": key}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standard_config_passes_and_a_greedy_per_principal_bound_does_not() {
        let mut c = crate::KernelConfig::standard("t");
        assert!(check(&c).is_empty(), "{:?}", check(&c));
        c.permits_per_principal_max = c.permits_max;
        c.approvals_open_per_principal_max = 0;
        c.text_chars_max = 10;
        let defects = check(&c);
        assert_eq!(defects.len(), 3, "{defects:?}");
        assert!(defects[0].contains("limits.approvals_open_per_principal_max"));
        assert!(defects[1].contains("limits.permits_per_principal_max"));
        assert!(defects[2].contains("limits.text_chars_max"));
    }

    #[test]
    fn text_is_refused_or_cut_at_the_bound() {
        assert_eq!(within("reason", "abc", 3).ok(), Some("abc"));
        let e = within("reason", "abcd", 3).err().map(|e| e.details);
        assert_eq!(
            e.as_ref().map(|d| d["reason"].clone()),
            Some(json!("text_too_long"))
        );
        assert_eq!(e.map(|d| d["limit"].clone()), Some(json!(3)));
        assert_eq!(cut("ééé", 2), "éé");
    }
}
