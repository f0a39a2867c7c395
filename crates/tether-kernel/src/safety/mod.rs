//! The safety duties: the e-stop and its latch (`estop.rs`), the stop path
//! (`stop_path.rs`), the governed stop shared by every process on a store
//! (`governed.rs`), reset (`reset.rs`), arming (`arming.rs`), single-use
//! safe-place grants (`grants.rs`), the safety status (`status.rs`), device
//! links and the link-loss latch (`link.rs`) and the endpoint's health
//! (`health.rs`, `GET /healthz`), and the e-stop of a device another endpoint
//! of the fleet serves (`fleet_stop.rs`).
//!
//! **Owns:** everything that stops, and everything that may undo a stop.
//! **Never belongs here:** the latch *check* of the evaluation order
//! (`check/latch.rs`), which only reads what this stage sets.
//! **Fail-closed rule:** an e-stop is never refused and never waits on the
//! store for long (the latch is set in memory before any driver I/O, and a
//! store that fails can delay the stop path by at most the bounded latch
//! wait); a reset that cannot read the shared stop, or be made durable,
//! keeps the latch.

pub(crate) mod arming;
pub(crate) mod estop;
pub(crate) mod fleet_stop;
pub mod governed;
pub(crate) mod grants;
pub(crate) mod health;
pub(crate) mod link;
pub(crate) mod reset;
pub(crate) mod status;
pub(crate) mod stop_path;
