//! The MQTT mapping checker on the shipped example and on broken copies of it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use tether_core::manifest::DeviceManifest;
use tether_drivers::mqtt::check;

const EXAMPLE: &str = include_str!("../../../examples/mqtt-pump/pump-1.toml");

fn manifest(text: &str) -> DeviceManifest {
    toml::from_str(text).expect("manifest parses")
}

fn defects(edit: impl Fn(String) -> String) -> Vec<(String, String)> {
    check(&manifest(&edit(EXAMPLE.to_owned())))
}

fn has(d: &[(String, String)], path: &str, words: &str) -> bool {
    d.iter().any(|(p, m)| p == path && m.contains(words))
}

#[test]
fn the_example_mapping_is_sound() {
    assert_eq!(check(&manifest(EXAMPLE)), Vec::<(String, String)>::new());
}

#[test]
fn every_defect_is_reported_with_its_field_at_once() {
    let d = defects(|t| {
        t.replace(
            "lease = \"lab/pump-1/lease\"",
            "lease = \"lab/pump-1/lease\"\nextra = \"lab/x\"",
        )
        .replace("ack = \"lab/pump-1/ack\"", "ack = \"lab/pump-1/+\"")
        .replace(
            "fields.door = { path = \"door\" }",
            "fields.door = { path = \"door\" }\nfields.flow = { path = \"f\" }",
        )
        .replace(
            "unit = \"mL\" }\nfields.door",
            "unit = \"mL/min\" }\nfields.door",
        )
        .replace("closed = \"closed\"", "")
        .replace(
            "[driver_config.targets.dose]",
            "[driver_config.targets.other]",
        )
        .replace("broker = \"127.0.0.1:1883\"", "broker = \"nowhere\"")
    });
    assert!(
        has(&d, "driver_config.topics.extra", "unknown key"),
        "{d:#?}"
    );
    assert!(
        has(&d, "driver_config.topics.ack", "not a filter"),
        "{d:#?}"
    );
    assert!(
        has(&d, "driver_config.state.fields.flow", "no field `flow`"),
        "{d:#?}"
    );
    assert!(
        has(
            &d,
            "driver_config.state.fields.dispensed_ml.unit",
            "not a unit the field uses"
        ),
        "{d:#?}"
    );
    assert!(
        has(&d, "driver_config.interlocks.door.closed", "closed"),
        "{d:#?}"
    );
    assert!(
        has(&d, "driver_config.targets.other", "no effectful binding"),
        "{d:#?}"
    );
    assert!(has(&d, "bindings[0].target", "no template"), "{d:#?}");
    assert!(has(&d, "driver_config.broker", "host:port"), "{d:#?}");
}

#[test]
fn templates_name_known_placeholders_and_inputs_and_place_the_command_id() {
    let d = defects(|t| {
        t.replace(
            "volume_ml = \"$input.volume_ml\"",
            "volume_ml = \"$input.volume\"",
        )
        .replace("lease_ms = \"$lease_ms\" }", "lease_ms = \"$lease\" }")
        .replace(
            "payload = { command_id = \"$command_id\", op = \"dose\"",
            "payload = { id = \"x\", op = \"dose\"",
        )
    });
    assert!(
        has(
            &d,
            "driver_config.targets.dose.volume_ml",
            "no field `volume`"
        ),
        "{d:#?}"
    );
    assert!(
        has(
            &d,
            "driver_config.targets.dose.lease_ms",
            "unknown placeholder"
        ),
        "{d:#?}"
    );
    assert!(
        has(&d, "driver_config.targets.dose.payload", "$command_id"),
        "{d:#?}"
    );
}

#[test]
fn an_unmapped_interlock_and_a_unit_on_a_unitless_field_are_defects() {
    let d = defects(|t| {
        t.replace(
            "[driver_config.interlocks.door]\npath = \"door\"\nclosed = \"closed\"\n",
            "",
        )
        .replace(
            "fields.running = { path = \"running\" }",
            "fields.running = { path = \"running\", unit = \"mL\" }",
        )
    });
    assert!(has(&d, "interlocks[0]", "always read unknown"), "{d:#?}");
    assert!(
        has(
            &d,
            "driver_config.state.fields.running.unit",
            "declares no x-mhs-unit"
        ),
        "{d:#?}"
    );
}

#[test]
fn mqtt_5_needs_a_keep_alive_of_five_seconds_or_more() {
    let d = defects(|t| {
        t.replace("protocol = \"3.1.1\"", "protocol = \"5\"")
            .replace("keep_alive_s = 5", "keep_alive_s = 2")
    });
    assert!(
        has(&d, "driver_config.keep_alive_s", "from 5 to 3600"),
        "{d:#?}"
    );
    let d = defects(|t| t.replace("protocol = \"3.1.1\"", "protocol = \"4\""));
    assert!(has(&d, "driver_config.protocol", "3.1.1"), "{d:#?}");
}

#[test]
fn a_driver_with_a_broker_that_is_down_builds_and_answers_unknown_at_once() {
    let text = EXAMPLE.replace("127.0.0.1:1883", "127.0.0.1:9");
    let driver = tether_drivers::build(&manifest(&text)).expect("builds without a broker");
    let link = driver.link().expect("a network driver reports its link");
    assert!(!link.connected);
    let t0 = std::time::Instant::now();
    let readings = driver.interlocks();
    assert_eq!(
        readings,
        vec![("door".to_owned(), tether_kernel::InterlockState::Unknown)]
    );
    assert!(t0.elapsed() < std::time::Duration::from_millis(50));
}
