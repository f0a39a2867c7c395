//! The generated docs stay in step with the registry.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

#[test]
fn error_code_page_is_generated_from_the_registry() {
    let page = include_str!("../../../docs/ERROR_CODES.md");
    assert_eq!(
        page,
        tether_core::codes::registry_markdown(),
        "docs/ERROR_CODES.md is stale: regenerate it with `cargo run -- codes > docs/ERROR_CODES.md`"
    );
}
