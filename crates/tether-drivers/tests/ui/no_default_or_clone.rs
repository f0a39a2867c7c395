// No Default and no Clone: a witness cannot be conjured or duplicated.
fn duplicate(a: &tether_kernel::Authorized) -> tether_kernel::Authorized {
    a.clone()
}

fn conjure() -> tether_kernel::Authorized {
    Default::default()
}

fn main() {
    let _ = duplicate;
    let _ = conjure;
}
