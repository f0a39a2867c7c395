// No Deserialize: a witness cannot arrive over the wire.
fn main() {
    let _a: tether_kernel::Authorized = serde_json::from_str("{}").unwrap();
}
