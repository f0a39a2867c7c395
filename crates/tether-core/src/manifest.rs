//! Device manifests: what a device is and what may be done to it.
//!
//! These are the data-transfer shapes of a manifest file (TOML or JSON). They
//! are deliberately strict (`deny_unknown_fields`) so a typo never silently
//! drops a declaration. The semantic checks that need the limits engine (bound
//! paths, units, risk floors, duplicate bindings) run in the kernel's loader,
//! which reports every defect with the file, the device and the field.

use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;

/// How a device relates to the physical world.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// A simulated device; nothing physical moves.
    Simulated,
    /// A physical device.
    Hardware,
    /// Part simulated, part physical.
    Hybrid,
    /// Replays recorded state; refuses every command.
    Replay,
}

impl Mode {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Simulated => "simulated",
            Mode::Hardware => "hardware",
            Mode::Hybrid => "hybrid",
            Mode::Replay => "replay",
        }
    }

    /// Whether something physical may move.
    pub fn is_physical(self) -> bool {
        matches!(self, Mode::Hardware | Mode::Hybrid)
    }
}

/// Risk class R0 (none) to R3 (severe).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
pub enum RiskClass {
    /// No credible harm.
    R0,
    /// Minor, recoverable harm to equipment or process.
    R1,
    /// Damage to equipment or risk of injury.
    R2,
    /// Severe harm possible.
    R3,
}

impl RiskClass {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            RiskClass::R0 => "R0",
            RiskClass::R1 => "R1",
            RiskClass::R2 => "R2",
            RiskClass::R3 => "R3",
        }
    }
}

impl fmt::Display for RiskClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a physical command is bounded in time: how its controller stops on
/// its own when Tether goes silent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum CommandKind {
    /// Sent with a lease the controller enforces; a driver runs it through
    /// the kernel's leased-command runner.
    Leased,
    /// Bounded by a declared maximum duration (`max_duration_ms`). The
    /// default of a simulated or replay device's binding that declares no
    /// kind; a hardware or hybrid device has no default.
    #[default]
    TimeBounded,
    /// Reduces risk (stop, hold, de-energise); always allowed to run.
    RiskReducing,
}

impl CommandKind {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            CommandKind::Leased => "leased",
            CommandKind::TimeBounded => "time_bounded",
            CommandKind::RiskReducing => "risk_reducing",
        }
    }
}

/// How concurrent commands on one device interact.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Concurrency {
    /// No device lock.
    Shared,
    /// Waits for the device lock (bounded by the deadline).
    Serialized,
    /// Refused with `MHS.DEVICE.BUSY` when the device lock is held.
    Exclusive,
}

impl Concurrency {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Concurrency::Shared => "shared",
            Concurrency::Serialized => "serialized",
            Concurrency::Exclusive => "exclusive",
        }
    }
}

/// Where an interlock reading comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InterlockSource {
    /// A hardware contact.
    Hardware,
    /// A software condition.
    Software,
    /// A person's switch.
    Operator,
    /// A simulated contact.
    Simulated,
}

/// A device manifest.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceManifest {
    /// Unique within the endpoint.
    pub device_id: String,
    /// Mode.
    pub mode: Mode,
    /// Risk class; never below the highest class floor of its bindings.
    pub risk_class: RiskClass,
    /// The driver that serves it (built-in: `sim.thermostat`, `sim.arm`, `sim.relay`).
    pub driver: String,
    /// Driver-specific settings.
    #[serde(default)]
    pub driver_config: Option<Value>,
    /// For people.
    #[serde(default)]
    pub description: String,
    /// How faithful a simulation is (required for simulated devices).
    #[serde(default)]
    pub fidelity: Option<Fidelity>,
    /// State documents.
    pub resources: Vec<ResourceDecl>,
    /// Capability bindings.
    pub bindings: Vec<BindingDecl>,
    /// Interlocks.
    #[serde(default)]
    pub interlocks: Vec<InterlockDecl>,
    /// Safety declarations.
    #[serde(default)]
    pub safety: SafetyDecl,
    /// Facts with sources.
    #[serde(default)]
    pub facts: Vec<Fact>,
    /// Free tags.
    #[serde(default)]
    pub tags: Vec<String>,
}

/// Fidelity statement of a simulation.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fidelity {
    /// `simulated`, `emulated`, `replayed`.
    pub kind: String,
    /// What the simulation does and does not model.
    pub notes: String,
}

/// A resource: a state document with a schema.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceDecl {
    /// Resource id, unique on the device.
    pub id: String,
    /// For people.
    #[serde(default)]
    pub description: String,
    /// JSON Schema of the state; numeric leaves carry `x-mhs-unit`.
    pub state_schema: Value,
    /// On a hybrid device: who drives this resource. `hardware` (the
    /// default on a hybrid device) is driven by the physical side, which a
    /// model may read but never command; `model` may be commanded by agents.
    /// Declared only on hybrid devices.
    #[serde(default)]
    pub authority: Option<Authority>,
}

/// Who drives a resource of a hybrid device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Authority {
    /// The physical controller: a model-controlled principal never commands it.
    Hardware,
    /// The model side of the hybrid: agents may command it.
    Model,
}

impl Authority {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Authority::Hardware => "hardware",
            Authority::Model => "model",
        }
    }
}

/// A capability binding: (capability_id, resource).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindingDecl {
    /// Class id or extension id.
    pub capability_id: String,
    /// Resource id.
    pub resource: String,
    /// Narrows the class input schema; required for extensions.
    #[serde(default)]
    pub input_schema: Option<Value>,
    /// Output schema; required for extensions.
    #[serde(default)]
    pub output_schema: Option<Value>,
    /// Binding limits keyed by limit path.
    #[serde(default)]
    pub limits: BTreeMap<String, Value>,
    /// Raises the class risk floor for this binding.
    #[serde(default)]
    pub risk: Option<RiskClass>,
    /// Driver target (native operation name).
    #[serde(default)]
    pub target: Option<String>,
    /// Command kind, as written: `None` when the binding declares none. On
    /// a hardware or hybrid device an effectful binding must declare one
    /// (the loader refuses it otherwise); elsewhere the default applies.
    #[serde(default)]
    pub kind: Option<CommandKind>,
    /// `false`: a trip, an e-stop or a cancel never cancels a running call
    /// in Tether; it ends within its lease or duration. Default `true`.
    #[serde(default)]
    pub abortable: Option<bool>,
    /// Concurrency against other commands on the device.
    #[serde(default)]
    pub concurrency: Option<Concurrency>,
    /// Declared verb of an extension (never trusted for safety exemptions).
    #[serde(default)]
    pub verb: Option<crate::catalogue::Verb>,
    /// Declared flags of an extension (never trusted for safety exemptions).
    #[serde(default)]
    pub flags: Option<crate::catalogue::Flags>,
    /// Longest the operation may run, in ms.
    #[serde(default)]
    pub max_duration_ms: Option<u64>,
    /// For people.
    #[serde(default)]
    pub description: String,
}

/// An interlock.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterlockDecl {
    /// Stable id.
    pub id: String,
    /// For people.
    pub description: String,
    /// Where the reading comes from.
    pub source: InterlockSource,
    /// Capability ids or patterns it gates; absent means informative only.
    #[serde(default)]
    pub required_for: Option<Vec<String>>,
    /// Whether a reset ignores it.
    #[serde(default)]
    pub reset_exempt: bool,
}

/// Safety declarations.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SafetyDecl {
    /// The e-stop.
    #[serde(default)]
    pub estop: EstopDecl,
    /// The safe state.
    #[serde(default)]
    pub safe_state: Option<SafeStateDecl>,
    /// Controller watchdog, ms.
    #[serde(default)]
    pub watchdog_ms: Option<u64>,
    /// Device envelope: key = capability id or pattern, value = limits by path.
    #[serde(default)]
    pub envelope: BTreeMap<String, BTreeMap<String, Value>>,
}

/// E-stop declaration.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EstopDecl {
    /// Stop budget, ms (1000 when undeclared).
    #[serde(default)]
    pub latency_ms: Option<u64>,
    /// Whether the driver has a native stop.
    #[serde(default)]
    pub native: Option<bool>,
    /// Why the stop cannot be undone without a new native session.
    #[serde(default)]
    pub terminal: Option<String>,
    /// The capability that re-enables the device after a reset.
    #[serde(default)]
    pub reenable: Option<String>,
}

/// Safe state declaration.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SafeStateDecl {
    /// What the safe state is.
    pub description: String,
    /// Capabilities that achieve it (run after the native stop).
    #[serde(default)]
    pub achieved_by: Vec<String>,
}

/// A fact with a source.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fact {
    /// The statement.
    pub text: String,
    /// vendor_doc, upstream_code, operator or interview.
    pub source: String,
    /// `path/in/clone:LINE`; required for vendor_doc and upstream_code.
    #[serde(default, rename = "ref")]
    pub reference: Option<String>,
}

/// Parses a manifest from TOML text.
///
/// # Errors
/// The deserializer's message, which names the field and the position.
pub fn from_toml(text: &str) -> Result<DeviceManifest, String> {
    toml::from_str(text).map_err(|e| e.to_string())
}

/// The `device_id` of manifest text that the strict reading refuses (an
/// unknown field, a duplicate key), read permissively so a defect can name
/// its device; `None` when even that fails.
pub fn device_id_of(text: &str, json: bool) -> Option<String> {
    if json {
        let v: serde_json::Value = serde_json::from_str(text).ok()?;
        v.get("device_id")?.as_str().map(str::to_owned)
    } else {
        let v: toml::Value = toml::from_str(text).ok()?;
        v.get("device_id")?.as_str().map(str::to_owned)
    }
}

/// Parses a manifest from JSON text (strictly: duplicate keys are refused).
///
/// # Errors
/// The parser's or deserializer's message.
pub fn from_json(text: &str) -> Result<DeviceManifest, String> {
    let value = crate::json::parse_strict(text)?;
    serde_json::from_value(value).map_err(|e| e.to_string())
}
