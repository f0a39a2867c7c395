//! The capability catalogue, shipped as data (`data/catalogue.json`).
//!
//! A class says what a capability means independent of any device: its verb,
//! its input and output schemas, its class-default limits, its risk floor and
//! its flags. Classes are named `cap.<class>.v<N>`. Anything else a manifest
//! binds must be an extension `x-cap.<owner>.<name>.v<N>` with an inline schema;
//! an extension's declared verb is never trusted where the verb matters.

use crate::manifest::RiskClass;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// The three primitives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verb {
    /// Reads state; never advances a revision; exempt from the latch.
    Read,
    /// Writes resource fields (`cap.device.configure.v1`).
    Write,
    /// Any other command.
    Action,
}

impl Verb {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Read => "read",
            Verb::Write => "write",
            Verb::Action => "action",
        }
    }
}

/// Closed set of class flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Flags {
    /// A stop class: never refused by the latch, budgets or missing bounds.
    #[serde(default)]
    pub stop_class: bool,
    /// Reduces risk (stop, hold, de-energise).
    #[serde(default)]
    pub risk_reducing: bool,
    /// Moves to a declared safe place.
    #[serde(default)]
    pub safe_place: bool,
    /// Needs two distinct people to approve.
    #[serde(default)]
    pub two_person: bool,
    /// The operation observes cancellation.
    #[serde(default)]
    pub abortable: bool,
}

/// One catalogued capability class.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapabilityClass {
    /// `cap.<class>.v<N>`.
    pub id: String,
    /// The verb.
    pub verb: Verb,
    /// The lowest risk class a binding of this class may have.
    pub risk_floor: RiskClass,
    /// Flags.
    pub flags: Flags,
    /// For people and model tool descriptions.
    pub description: String,
    /// Class input schema (JSON Schema).
    pub input_schema: Value,
    /// Class output schema, checked against driver output.
    pub output_schema: Value,
    /// Class-default limits keyed by limit path.
    pub limits: BTreeMap<String, Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogueFile {
    /// Required in the file; read by no code yet (one version ships).
    #[serde(rename = "catalogue_version")]
    _catalogue_version: String,
    classes: Vec<CapabilityClass>,
}

/// The configure class id.
pub const CONFIGURE: &str = "cap.device.configure.v1";
/// The catalogued read class id.
pub const STATE_READ: &str = "cap.state.read.v1";
/// The catalogued e-stop class id.
pub const ESTOP: &str = "cap.motion.estop.v1";
/// The catalogued controlled-stop class id.
pub const STOP: &str = "cap.motion.stop.v1";

/// The shipped catalogue.
pub fn catalogue() -> &'static [CapabilityClass] {
    static CATALOGUE: OnceLock<Vec<CapabilityClass>> = OnceLock::new();
    CATALOGUE.get_or_init(|| {
        // The file is compiled in and covered by a test, so a parse failure
        // here is a build defect; an empty catalogue would refuse every binding.
        serde_json::from_str::<CatalogueFile>(include_str!("../data/catalogue.json"))
            .map(|f| f.classes)
            .unwrap_or_default()
    })
}

/// Looks a catalogued class up.
pub fn class(id: &str) -> Option<&'static CapabilityClass> {
    catalogue().iter().find(|c| c.id == id)
}

/// `cap.<class>.v<N>` where `<class>` is dot-separated lowercase words.
pub fn is_catalogue_id(id: &str) -> bool {
    id.strip_prefix("cap.").is_some_and(versioned_name)
}

/// `x-cap.<owner>.<name>.v<N>`.
pub fn is_extension_id(id: &str) -> bool {
    id.strip_prefix("x-cap.")
        .is_some_and(|rest| versioned_name(rest) && rest.split('.').count() >= 3)
}

/// A capability id pattern: `cap.*`, `cap.<class>.*`, `x-cap.*`, `x-cap.<owner>.*`.
pub fn is_capability_pattern(key: &str) -> bool {
    let Some(stem) = key.strip_suffix(".*") else {
        return false;
    };
    stem == "cap"
        || stem == "x-cap"
        || stem
            .strip_prefix("cap.")
            .or_else(|| stem.strip_prefix("x-cap."))
            .is_some_and(|s| s.split('.').all(word))
}

/// Whether an envelope key (id or pattern) matches a capability id.
pub fn key_matches(key: &str, capability_id: &str) -> bool {
    match key.strip_suffix('*') {
        Some(prefix) => capability_id.starts_with(prefix),
        None => key == capability_id,
    }
}

fn word(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

fn versioned_name(rest: &str) -> bool {
    let parts: Vec<&str> = rest.split('.').collect();
    let Some((last, head)) = parts.split_last() else {
        return false;
    };
    let version_ok = last
        .strip_prefix('v')
        .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
    version_ok && !head.is_empty() && head.iter().all(|w| word(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_catalogue_parses_and_holds_the_required_classes() {
        for id in [
            CONFIGURE,
            STATE_READ,
            "cap.thermal.setpoint.v1",
            "cap.motion.move_to.v1",
            "cap.motion.park.v1",
            STOP,
            ESTOP,
            "cap.io.relay.v1",
            "cap.fluid.dispense.v1",
        ] {
            let c = class(id).unwrap_or_else(|| panic!("{id} missing"));
            assert!(is_catalogue_id(&c.id));
        }
        assert!(class(STOP).is_some_and(|c| c.flags.stop_class));
        assert!(class(ESTOP).is_some_and(|c| c.flags.stop_class));
        assert!(class("cap.motion.park.v1").is_some_and(|c| c.flags.safe_place));
        assert_eq!(class(STATE_READ).map(|c| c.verb), Some(Verb::Read));
        let dispense = class("cap.fluid.dispense.v1").unwrap_or_else(|| panic!("dispense"));
        assert_eq!(
            (dispense.verb, dispense.risk_floor),
            (Verb::Action, RiskClass::R1)
        );
        assert_eq!(
            dispense
                .input_schema
                .pointer("/properties/volume_ml/x-mhs-unit"),
            Some(&serde_json::json!("mL"))
        );
        assert_eq!(
            dispense
                .input_schema
                .pointer("/properties/rate_ml_min/x-mhs-unit"),
            Some(&serde_json::json!("mL/min"))
        );
    }

    #[test]
    fn ids_and_patterns_have_a_strict_shape() {
        assert!(is_catalogue_id("cap.motion.move_to.v1"));
        assert!(!is_catalogue_id("cap.motion.move_to"));
        assert!(!is_catalogue_id("cap.Motion.v1"));
        assert!(is_extension_id("x-cap.acme.gripper.v2"));
        assert!(!is_extension_id("x-cap.gripper.v2"));
        assert!(is_capability_pattern("cap.*"));
        assert!(is_capability_pattern("cap.motion.*"));
        assert!(!is_capability_pattern("cap.mo*"));
        assert!(key_matches("cap.motion.*", "cap.motion.park.v1"));
        assert!(!key_matches("cap.motion.*", "cap.thermal.setpoint.v1"));
        assert!(key_matches("cap.io.relay.v1", "cap.io.relay.v1"));
    }
}
