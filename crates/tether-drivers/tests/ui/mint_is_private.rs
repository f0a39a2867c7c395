// The only constructor is crate-private to the kernel.
fn main() {
    let _a = tether_kernel::Authorized::mint(
        "arm-1",
        "cap.motion.move_to.v1",
        "joints",
        "move_to",
        serde_json::json!({}),
        "c1",
        tether_kernel::CallKind::Effect,
        None,
    );
}
