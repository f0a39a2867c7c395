//! cargo-fuzz binary of the `policy` target; the logic and its invariants are
//! in `tether_fuzz::policy` (crates/tether-fuzz), shared with the corpus replay test.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tether_fuzz::policy::run(data));
