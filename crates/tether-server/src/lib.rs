//! # tether-server — the surfaces
//!
//! Owns the wire: JSON-RPC 2.0 framing over HTTP (`POST /rpc`) and stdio (one
//! JSON value per line), MCP (the `rmcp` SDK) over stdio and streamable HTTP, the REST tool gateway
//! (`rest`), strict parsing of untrusted input, size limits, and the mapping of kernel answers to protocol
//! answers. It decides nothing: every
//! request that reaches a device goes through `tether_kernel::Kernel`.
//!
//! **Never belongs here:** limits, latches, grants, receipts (the kernel),
//! SQL (the store), device protocols (drivers).
//!
//! **Depends on:** tether-core, tether-kernel, tether-store, rmcp, axum. **Depended on by:** tether-cli.
#![deny(missing_docs)]

pub mod auth;
pub mod http;
pub mod mcp;
pub mod rest;
pub mod rpc;
pub mod stdio;
pub mod tools;

/// Largest request accepted by any surface, bytes.
pub const REQUEST_BYTES_MAX: usize = 1 << 20;
