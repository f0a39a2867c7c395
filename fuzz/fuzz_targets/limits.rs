//! cargo-fuzz binary of the `limits` target; the logic and its invariants are
//! in `tether_fuzz::limits` (crates/tether-fuzz), shared with the corpus replay test.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tether_fuzz::limits::run(data));
