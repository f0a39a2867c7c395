//! The `Authorized` witness can only be minted inside `tether-kernel`.
//!
//! Each file in `tests/ui/` tries one way a driver (or any crate outside the
//! kernel) might fabricate a witness; each must fail to compile with the
//! recorded error.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

#[test]
fn authorized_cannot_be_minted_outside_the_kernel() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
