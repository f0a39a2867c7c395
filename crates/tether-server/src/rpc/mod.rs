//! JSON-RPC 2.0 handling shared by every transport.
//!
//! A request is checked in this order: size, strict JSON (no duplicate keys,
//! bounded depth, finite numbers), e-stop recognition (a request is an e-stop
//! by what it asks for, so a malformed envelope still latches), envelope,
//! method, params. Batches and notifications are refused with an error.
//!
//! | module | owns |
//! |---|---|
//! | `envelope` | the order of checks, from the request's bytes to its method |
//! | `estop` | recognising an e-stop in any request, and serving it leniently |
//! | `params` | each method's params as strict types, and the kernel request they become |
//! | `dispatch` | the router from method to group, one function per group |
//! | `reply` | the responses: the shared error object, and results with spliced receipts |
//! | `refused` | the e-stop in a request the edge refused, served by the same path |
//!
//! **Never belongs here:** framing or transport (`crate::http`,
//! `crate::stdio`), and any rule about devices (the kernel).

mod dispatch;
mod envelope;
mod estop;
mod params;
mod refused;
mod reply;

pub use envelope::{handle_text, handle_value, too_large};
pub(crate) use estop::estop_params_defect;
pub(crate) use refused::refused_estop;
pub use reply::{error_response, Reply};
