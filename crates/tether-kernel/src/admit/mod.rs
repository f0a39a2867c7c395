//! Steps 2 to 4: who asks, on which binding, under which `command_id`.
//!
//! **Owns:** the arrival (`arrival.rs`: the id, the device, the
//! deadline), sessions and grants (`session.rs` the table, `sessions.rs` the
//! verbs and the grant check), binding resolution and the write route
//! (`resolve.rs`), and the `command_id` claim (`idempotency.rs` the index,
//! `replay.rs` the claim against it and the store).
//! **Never belongs here:** anything that reads the input beyond its digest
//! (`check/`), anything that touches a device (`dispatch/`).
//! **Fail-closed rule:** every refusal here is a protocol error or a
//! rejected receipt before anything is claimed; a table or store that cannot
//! be read refuses.

pub(crate) mod arrival;
pub(crate) mod idempotency;
pub(crate) mod replay;
pub(crate) mod resolve;
pub(crate) mod session;
pub(crate) mod sessions;
