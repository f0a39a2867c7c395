//! # tether-core — the contracts of Tether
//!
//! Owns the vocabulary every other crate speaks: identifier newtypes
//! ([`ids`]), the one registry of `MHS.*` error codes ([`codes`]), the device
//! manifest shapes ([`manifest`]), the capability catalogue shipped as data
//! ([`catalogue`]), receipts ([`receipt`]) and strict JSON parsing for untrusted
//! input ([`json`]), and canonical JSON (RFC 8785) with its SHA-256 digests
//! ([`canonical`]): the form evidence is hashed in; and how much of a
//! caller's id an error may repeat ([`echo`]); and the bounded map of recent
//! entries the kernel and the gateway remember lately-finished work in
//! ([`recent`]).
//!
//! **Never belongs here:** I/O, clocks other than the wall clock used to stamp
//! receipts, decisions, limits evaluation (that is `tether-limits`), storage
//! (`tether-store`), the evaluation order (`tether-kernel`), wire framing
//! (`tether-server`).
//!
//! **Depended on by:** every other Tether crate except `tether-limits`, which
//! is deliberately free of it (pure limits, no vocabulary of the wire).
//! `tether-store` uses only [`canonical`].
#![deny(missing_docs)]

pub mod canonical;
pub mod catalogue;
pub mod codes;
pub mod echo;
pub mod ids;
pub mod json;
pub mod manifest;
pub mod receipt;
pub mod recent;

pub use codes::Code;
pub use receipt::{Receipt, Refusal, Status};

/// Text carried by every surface: Tether is not a safety-rated channel.
pub const NOT_CERTIFIED: &str = "Tether is a software envelope, not a safety-rated channel. It certifies no device, process or experiment, and its e-stop never replaces an independent hardware emergency stop, which remains the device owner's duty.";
