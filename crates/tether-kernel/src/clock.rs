//! Deadlines on the monotonic clock, computed without overflow.
//!
//! Budgets and deadlines are bounded where they enter (a caller's deadline
//! by `DEADLINE_MS_MAX`, a stop budget at load), so an `Instant` plus one of
//! them always fits; these helpers keep that true without a panic path if a
//! bound is ever lifted.

use std::time::{Duration, Instant};

/// The longest span [`after`] falls back to when `from + span` cannot be
/// represented: a day, longer than any budget the kernel accepts.
const FALLBACK_SPAN: Duration = Duration::from_secs(86_400);

// The fallback must cover the longest deadline a caller may give.
const _: () = assert!(FALLBACK_SPAN.as_millis() >= crate::request::DEADLINE_MS_MAX as u128);

/// `from + span`, or the latest instant the clock can represent within a
/// day of `from` when that overflows.
pub(crate) fn after(from: Instant, span: Duration) -> Instant {
    from.checked_add(span)
        .or_else(|| from.checked_add(FALLBACK_SPAN))
        .unwrap_or(from)
}
