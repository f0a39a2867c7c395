//! cargo-fuzz binary of the `verify` target; the logic and its invariants are
//! in `tether_fuzz::verify` (crates/tether-fuzz), shared with the corpus replay test.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tether_fuzz::verify::run(data));
