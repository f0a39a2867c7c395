//! # tether-kernel — the membrane
//!
//! Owns the evaluation order every write and action passes, the sealed
//! [`Authorized`] witness, the [`Driver`] trait, and the safety duties: the
//! e-stop latch, the stop path, the governed stop, reset, arming. Only this
//! crate decides, and only this crate can authorize a driver call.
//!
//! The order is visible as stages, one folder each (each module opens with
//! what it owns, what never belongs in it and the fail-closed rule it keeps):
//!
//! | stage | module | steps |
//! |---|---|---|
//! | the order itself | [`order`](crate::order) | `Kernel::command`, 1–12 as a sequence |
//! | admission | `admit/` | 2 session and grant, 3 binding, 4 `command_id` |
//! | checks | `check/` | 5 latch, 6 mode, 7 structure, 8 limits, 9 schema bounds, 10 policy, permit, budgets, 11 interlocks |
//! | dispatch | `dispatch/` | 12 lock, revision, durable start, the witness, the driver call, output, receipt, fail-closed evidence |
//! | safety | `safety/` | e-stop, stop path, governed stop, reset, arming, safe-place grants, status |
//! | approvals | `approvals/` | holds made durable, votes, quorum, single use |
//! | reads | `read` | `mhs.resource.read` |
//! | reference | `reference/` | `mhs.hello`, devices, the generated reference file |
//! | loading | `loader/` | manifests and overlay → the cell |
//! | the object | `kernel/` | `Kernel`, its state, start-up, the door to the store |
//! | signed checkpoints | [`checkpoints`] | the chain head signed in the background, never on a command's path |
//! | stage timings | [`stages`] | a traced command's stages, carried on its span for the exporter |
//!
//! **Architecture invariant:** [`Authorized`] has no public constructor; the
//! compile-fail tests in `tether-drivers/tests/ui` pin that, and
//! `tether-cli/tests/architecture.rs` that nothing outside this crate's `src`
//! calls its mint.
//!
//! **Architecture invariant:** the kernel is the only door to the store on the
//! request path: it alone appends to the evidence chain, and a surface reads
//! what it needs through kernel methods (`Kernel::invocation_record`, …).
//!
//! **Never belongs here:** wire framing (JSON-RPC, HTTP, MCP → `tether-server`),
//! device protocols (→ `tether-drivers`), SQL (→ `tether-store`), the limits
//! grammar (→ `tether-limits`), Cedar (→ `tether-policy`).
#![deny(missing_docs)]

mod admit;
mod approvals;
pub mod bounds;
mod check;
pub mod checkpoints;
mod clock;
mod dispatch;
pub mod driver;
mod kernel;
pub mod lease;
pub mod loader;
pub mod meters;
mod order;
mod read;
pub mod reference;
mod request;
mod safety;
pub mod stages;
pub mod trace;

pub use admit::sessions::SESSION_TTL_MS_MAX;
pub use check::policy;
pub use dispatch::answer::Answer;
pub use dispatch::authorized::{Authorized, CallKind};
pub use dispatch::rider::{Rider, RiderOutcome};
pub use driver::{BoxFuture, CancelToken, Driver, InterlockState, Link, Signal};
pub use kernel::{
    holder_gone, this_host, Compiled, DeferredStart, FleetLease, Kernel, KernelConfig, OpenStore,
    Principal, PrincipalKind, StartError, StoreOpener, FLEET_LEASE_MS_DEFAULT,
    START_RESTORE_READ_MS, START_RESTORE_WAIT_MS,
};
pub use request::{
    deadline_from_ms, ApiError, ArmRequest, CommandOptions, CommandRequest, EstopRequest,
    EvidenceFault, GrantRequest, ReadRequest, ResetRequest, Route, SessionOpen, DEADLINE_MS_MAX,
};
pub use safety::governed;
pub use safety::health::{Health, HEALTH_PROBE_FRESH_MS, HEALTH_PROBE_WAIT_MS};
pub use safety::link::{link_poll_period, LINK_POLL_MS_MAX, LINK_POLL_MS_MIN};
pub use tether_core::manifest::CommandKind;
