//! cargo-fuzz binary of the `mcp` target; the logic and its invariants are
//! in `tether_fuzz::mcp` (crates/tether-fuzz), shared with the corpus replay test.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tether_fuzz::mcp::run(data));
