//! cargo-fuzz binary of the `canonical` target; the logic and its invariants are
//! in `tether_fuzz::canonical` (crates/tether-fuzz), shared with the corpus replay test.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tether_fuzz::canonical::run(data));
