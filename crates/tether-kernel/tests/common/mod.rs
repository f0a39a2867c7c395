//! Shared kernel test rigs.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Arc;
use tether_kernel::loader::{load, ManifestSource};
use tether_kernel::{Driver, Kernel, KernelConfig, Principal, SessionOpen};
use tether_store::{MemoryStore, Store};

/// A kernel over the built-in simulated cell and an in-memory store.
pub fn builtin_kernel() -> Kernel {
    builtin_kernel_on(Arc::new(MemoryStore::new()))
}

/// A kernel over the built-in simulated cell and `store`.
pub fn builtin_kernel_on(store: Arc<dyn Store>) -> Kernel {
    let cell = load(&tether_drivers::builtin_cell(), None).expect("cell");
    let drivers =
        tether_drivers::build_all(cell.devices.iter().map(|d| &d.manifest)).expect("drivers");
    Kernel::new(KernelConfig::standard("t"), cell, drivers, store).expect("kernel")
}

/// A kernel serving one device from manifest text, with the given driver.
pub fn single_device_kernel(
    device_id: &str,
    text: &str,
    driver: Arc<dyn Driver>,
    store: Arc<dyn Store>,
) -> Kernel {
    single_device_kernel_with(device_id, text, driver, store, KernelConfig::standard("t"))
}

/// The same, with an explicit kernel config (a policy, a TTL, ...).
pub fn single_device_kernel_with(
    device_id: &str,
    text: &str,
    driver: Arc<dyn Driver>,
    store: Arc<dyn Store>,
    config: KernelConfig,
) -> Kernel {
    let src = ManifestSource {
        origin: format!("{device_id}.toml"),
        text: text.into(),
    };
    let cell = load(&[src], None).expect("the test manifest loads");
    let mut drivers: HashMap<String, Arc<dyn Driver>> = HashMap::new();
    drivers.insert(device_id.into(), driver);
    Kernel::new(config, cell, drivers, store).expect("kernel")
}

/// Opens a session granting everything; returns its id.
pub async fn open_session(k: &Kernel, p: &Principal) -> String {
    k.session_open(p, SessionOpen::default())
        .await
        .expect("session")["session_id"]
        .as_str()
        .expect("session id")
        .to_owned()
}
