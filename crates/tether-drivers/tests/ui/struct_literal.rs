// A struct literal needs the private fields.
fn main() {
    let _a = tether_kernel::Authorized {
        device_id: String::new(),
    };
}
