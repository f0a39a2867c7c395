//! cargo-fuzz binary of the `rest` target; the logic and its invariants are
//! in `tether_fuzz::rest` (crates/tether-fuzz), shared with the corpus replay test.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tether_fuzz::rest::run(data));
