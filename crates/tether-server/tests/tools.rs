//! The tool catalogue of the built-in cell: names, kinds and descriptions.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

use std::sync::Arc;
use tether_kernel::{Kernel, KernelConfig};
use tether_server::tools::{catalogue, ToolKind, ESTOP_TOOL};
use tether_store::MemoryStore;

fn builtin_kernel() -> Kernel {
    let cell = tether_kernel::loader::load(&tether_drivers::builtin_cell(), None).expect("cell");
    let drivers =
        tether_drivers::build_all(cell.devices.iter().map(|d| &d.manifest)).expect("drivers");
    Kernel::new(
        KernelConfig::standard("tools-test"),
        cell,
        drivers,
        Arc::new(MemoryStore::new()),
    )
    .expect("kernel")
}

#[test]
fn builtin_cell_tools_are_named_predictably() {
    let kernel = builtin_kernel();
    let tools = catalogue(&kernel);
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    for expected in [
        ESTOP_TOOL,
        "thermostat-1__setpoint",
        "thermostat-1__configure",
        "thermostat-1__read",
        "arm-1__move_to",
        "arm-1__park",
        "arm-1__stop",
        "relay-1__relay",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    let mut sorted = names.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(
        sorted.len(),
        names.len(),
        "tool names are unique: {names:?}"
    );
    assert_eq!(names[0], ESTOP_TOOL, "the e-stop is listed first");
    assert!(
        !names.iter().any(|n| n.contains("__estop")),
        "the e-stop class is served by the estop tool only"
    );
}

#[test]
fn descriptions_print_limits_units_mode_and_risk() {
    let kernel = builtin_kernel();
    let tools = catalogue(&kernel);
    let setpoint = tools
        .iter()
        .find(|t| t.name == "thermostat-1__setpoint")
        .expect("setpoint tool");
    assert_eq!(setpoint.kind, ToolKind::Action);
    assert!(
        setpoint.description.contains("target_temperature"),
        "{}",
        setpoint.description
    );
    assert!(
        setpoint.description.contains("degC"),
        "{}",
        setpoint.description
    );
    assert!(
        setpoint.description.contains("max 90"),
        "{}",
        setpoint.description
    );
    assert!(
        setpoint.description.contains("simulated"),
        "{}",
        setpoint.description
    );
    assert!(
        setpoint.description.contains(&setpoint.risk),
        "{}",
        setpoint.description
    );
    let read = tools
        .iter()
        .find(|t| t.name == "thermostat-1__read")
        .expect("read tool");
    assert_eq!(read.kind, ToolKind::Read);
    assert_eq!(read.to_json()["read_only"], true);
    let mv = tools
        .iter()
        .find(|t| t.name == "arm-1__move_to")
        .expect("move");
    assert_eq!(mv.to_json()["destructive"], true);
    assert!(mv.input_schema["properties"]["joints"].is_object());
}
