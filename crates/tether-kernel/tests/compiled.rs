//! One compiled cell serving several kernels (`Kernel::compile`,
//! `Kernel::from_compiled`): what is shared is read-only (specs, schemas,
//! ControlPolicy); each kernel's state — latches, revisions, idempotency,
//! sessions, evidence — stays its own.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use serde_json::{json, Value};
use std::sync::Arc;
use tether_kernel::loader::load;
use tether_kernel::{
    CommandOptions, CommandRequest, EstopRequest, Kernel, KernelConfig, Principal, StartError,
};
use tether_store::{MemoryStore, Store};

fn compiled(config: KernelConfig) -> Result<tether_kernel::Compiled, StartError> {
    let cell = load(&tether_drivers::builtin_cell(), None).expect("cell");
    Kernel::compile(config, cell)
}

fn kernel_from(c: &tether_kernel::Compiled, store: Arc<dyn Store>) -> Kernel {
    let cell = load(&tether_drivers::builtin_cell(), None).expect("cell");
    let drivers =
        tether_drivers::build_all(cell.devices.iter().map(|d| &d.manifest)).expect("drivers");
    Kernel::from_compiled(c, drivers, store).expect("kernel")
}

fn setpoint(sid: &str, command_id: &str, target: f64) -> CommandRequest {
    CommandRequest {
        route: tether_kernel::Route::Command,
        session_id: Some(sid.into()),
        device_id: "thermostat-1".into(),
        capability_id: "cap.thermal.setpoint.v1".into(),
        resource: None,
        input: json!({"target_temperature": target}),
        command_id: Some(command_id.into()),
        deadline: None,
        expected_revision: None,
        safe_place_grant: None,
        permit_id: None,
    }
}

fn latched(k: &Kernel, device: &str) -> bool {
    k.safety_status(Some(device)).expect("status")["devices"][0]["latched"] == json!(true)
}

fn revisions(k: &Kernel) -> Vec<Option<u64>> {
    let list = k.devices_list();
    let devices = list["devices"].as_array().cloned().unwrap_or_default();
    devices
        .iter()
        .flat_map(|d| d["resources"].as_array().cloned().unwrap_or_default())
        .map(|r| r["revision"].as_u64())
        .collect()
}

#[tokio::test]
async fn kernels_of_one_compiled_cell_keep_their_state_apart() {
    let c = compiled(KernelConfig::standard("t")).expect("the built-in cell compiles");
    let (store_a, store_b) = (Arc::new(MemoryStore::new()), Arc::new(MemoryStore::new()));
    let a = kernel_from(&c, store_a.clone());
    let b = kernel_from(&c, store_b.clone());
    let before_b = revisions(&b);

    // A setpoint on `a` completes there and moves only `a`'s revision.
    let p = Principal::local_agent();
    let sid_a = common::open_session(&a, &p).await;
    let done = a
        .command(
            &p,
            setpoint(&sid_a, "cmd-shared-1", 30.0),
            CommandOptions::plain(),
        )
        .await
        .expect("admitted")
        .into_value();
    assert_eq!(done["status"], "completed", "{done}");
    assert_ne!(
        revisions(&a),
        before_b,
        "the setpoint moved a revision of `a`"
    );
    assert_eq!(revisions(&b), before_b, "`b` saw `a`'s setpoint");

    // The same command id on `b` is a new command there (its own index).
    let sid_b = common::open_session(&b, &p).await;
    let again = b
        .command(
            &p,
            setpoint(&sid_b, "cmd-shared-1", 25.0),
            CommandOptions::plain(),
        )
        .await
        .expect("admitted")
        .into_value();
    assert_eq!(again["status"], "completed", "{again}");
    assert_ne!(again["receipt_id"], done["receipt_id"], "{again} / {done}");

    // An e-stop on `b` latches `b` only.
    let stop: Value = b
        .estop(EstopRequest {
            device_ids: vec!["thermostat-1".into()],
            reason: "test".into(),
            ..EstopRequest::default()
        })
        .await;
    assert_eq!(stop["status"], "completed", "{stop}");
    assert!(latched(&b, "thermostat-1"));
    assert!(!latched(&a, "thermostat-1"), "`a` latched by `b`'s stop");

    // Each store holds only its own kernel's receipts.
    let on_a = store_a
        .receipt("cmd-shared-1")
        .expect("read")
        .expect("a's receipt");
    let on_b = store_b
        .receipt("cmd-shared-1")
        .expect("read")
        .expect("b's receipt");
    assert_eq!(on_a.receipt["receipt_id"], done["receipt_id"]);
    assert_eq!(on_b.receipt["receipt_id"], again["receipt_id"]);

    // A third kernel from the same compiled cell starts unlatched.
    let c3 = kernel_from(&c, Arc::new(MemoryStore::new()));
    assert!(!latched(&c3, "thermostat-1"));
}

#[test]
fn compile_refuses_what_new_refuses() {
    let bad_policy = KernelConfig {
        policy: Some(("broken.cedar".into(), "permit(principal, action".into())),
        ..KernelConfig::standard("t")
    };
    let err = compiled(bad_policy).expect_err("a policy that does not parse");
    assert!(matches!(err, StartError::Policy(_)), "{err}");
}

#[test]
fn from_compiled_refuses_a_device_without_a_driver() {
    let c = compiled(KernelConfig::standard("t")).expect("compiles");
    let cell = load(&tether_drivers::builtin_cell(), None).expect("cell");
    let mut drivers =
        tether_drivers::build_all(cell.devices.iter().map(|d| &d.manifest)).expect("drivers");
    drivers.remove("thermostat-1");
    let err = Kernel::from_compiled(&c, drivers, Arc::new(MemoryStore::new()))
        .err()
        .expect("a device without a driver");
    assert!(
        matches!(err, StartError::MissingDriver(ref d) if d == "thermostat-1"),
        "{err}"
    );
}
