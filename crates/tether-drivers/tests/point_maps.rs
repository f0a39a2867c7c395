//! The point-mapped drivers' checkers (`modbus.tcp`, `opcua`) on the shipped
//! examples and on broken copies: the rules they share (`mapping`) hold for
//! both, and each protocol's own defects are named at their field.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use tether_core::manifest::DeviceManifest;
use tether_drivers::check_map;

const HEATER: &str = include_str!("../../../examples/modbus-heater/heater-1.toml");
const OVEN: &str = include_str!("../../../examples/opcua-oven/oven-1.toml");

fn defects(text: &str) -> Vec<(String, String)> {
    let m: DeviceManifest = toml::from_str(text).expect("manifest parses");
    check_map(&m)
}

fn has(d: &[(String, String)], path: &str, words: &str) -> bool {
    d.iter().any(|(p, m)| p == path && m.contains(words))
}

#[test]
fn the_example_maps_are_sound() {
    assert_eq!(defects(HEATER), Vec::<(String, String)>::new());
    assert_eq!(defects(OVEN), Vec::<(String, String)>::new());
}

#[test]
fn a_leased_binding_is_refused_on_a_map_without_a_lease() {
    for (text, driver) in [(HEATER, "modbus.tcp"), (OVEN, "opcua")] {
        let leased = text.replacen(
            "target = \"setpoint\"\nkind = \"time_bounded\"",
            "target = \"setpoint\"\nkind = \"leased\"",
            1,
        );
        assert_ne!(
            leased, text,
            "{driver}: the example names the setpoint kind"
        );
        let d = defects(&leased);
        assert!(has(&d, "bindings[1].kind", driver), "{driver}: {d:?}");
    }
}

#[test]
fn opcua_node_ids_types_steps_and_security_are_checked() {
    let d = defects(
        &OVEN
            .replace(
                "security = \"none\"",
                "security = \"basic256sha256\"\nusername = \"u\"",
            )
            .replace(
                "stop = [{ call = \"nsu=urn:tether:example:oven;s=Oven.Stop\" }]",
                "stop = [{ call = \"nsu=urn:tether:example:oven;s=Oven.Stop\", value = 1 }]",
            )
            .replace(
                "{ field = \"enabled\", value = true },",
                "{ field = \"enabled\", value = true, args = [] },",
            )
            .replace(
                "s=Oven.Enabled\", type = \"boolean\"",
                "s=Oven.Enabled\", type = \"double\"",
            )
            .replace(
                "node = \"nsu=urn:tether:example:oven;s=Oven.Watchdog\"",
                "node = \"ns=x;s=W\"",
            ),
    );
    for (path, words) in [
        ("driver_config.pki_dir", "Basic256Sha256"),
        ("driver_config.username", "password_env"),
        ("driver_config.stop[0]", "`call`"),
        ("driver_config.targets.setpoint[1]", "`call`"),
        ("driver_config.fields.main.enabled.type", "boolean"),
        ("driver_config.watchdog.node", "namespace index"),
    ] {
        assert!(has(&d, path, words), "{path}: {d:?}");
    }
}

#[test]
fn a_method_call_step_with_arguments_is_accepted_and_checked() {
    let with_args = OVEN.replace(
        "configure = [{ field = \"setpoint\", input = \"setpoint\" }]",
        "configure = [{ call = \"nsu=urn:tether:example:oven;s=Oven.Configure\", args = [{ type = \"double\", input = \"setpoint\" }, { type = \"uint16\", value = 3 }] }]",
    );
    assert_eq!(defects(&with_args), Vec::<(String, String)>::new());
    let bad = with_args.replace(
        "{ type = \"uint16\", value = 3 }",
        "{ type = \"uint16\", value = -3 }",
    );
    assert!(
        has(
            &defects(&bad),
            "driver_config.targets.configure[0].args[1].value",
            "cannot be written"
        ),
        "{:?}",
        defects(&bad)
    );
}
