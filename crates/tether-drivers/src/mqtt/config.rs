//! The MQTT mapping: `[driver_config]` of a device served by the `mqtt`
//! driver, parsed and checked against the manifest as a whole.
//!
//! **Owns:** the shape of the mapping, every defect it can have (reported
//! with the field path under `driver_config`, all at once), and the parsed
//! [`Config`] the driver runs from. **Never belongs here:** network I/O,
//! clocks, rendering a payload for a call (`template.rs`).

use super::template;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::time::Duration;
use tether_core::catalogue;
use tether_core::manifest::DeviceManifest;
use tether_limits::units;

/// A mapping defect: the field path (from `driver_config`) and the message.
pub type Defect = (String, String);

/// Longest staleness bound, lease and timeouts a mapping may declare (ms).
const MS_MAX: u64 = 600_000;
/// Default bound on one native publish (broker acknowledgement), ms.
const PUBLISH_TIMEOUT_MS: u64 = 1_000;
/// Default bound on a device acknowledgement of a command, ms.
const ACK_TIMEOUT_MS: u64 = 2_000;
/// Default longest run of one leased command, ms.
const RUN_MAX_MS: u64 = 600_000;

/// The four topics.
#[derive(Debug, Clone)]
pub struct Topics {
    /// Commands (QoS 1).
    pub cmd: String,
    /// Acknowledgements from the device.
    pub ack: String,
    /// Retained state from the device.
    pub state: String,
    /// Lease renewals (QoS 1).
    pub lease: String,
}

/// How an acknowledgement reads.
#[derive(Debug, Clone)]
pub struct AckMap {
    /// The member holding the status.
    pub status_field: String,
    /// The member holding the device's reason, if any.
    pub reason_field: String,
    /// Status values.
    pub accepted: String,
    /// Finished.
    pub done: String,
    /// Refused by the device.
    pub rejected: String,
    /// Ended early (a stop, a lease loss).
    pub stopped: String,
}

/// One resource field read from the state message.
#[derive(Debug, Clone)]
pub struct FieldMap {
    /// The resource field.
    pub name: String,
    /// Dotted path in the state message.
    pub path: String,
    /// The native unit, if the device speaks another than the schema.
    pub native_unit: Option<String>,
    /// The state schema's `x-mhs-unit`.
    pub schema_unit: Option<String>,
}

/// One interlock read from the state message.
#[derive(Debug, Clone)]
pub struct InterlockMap {
    /// The manifest interlock id.
    pub id: String,
    /// Dotted path in the state message.
    pub path: String,
    /// The native value that means closed.
    pub closed: Value,
}

/// One binding target.
#[derive(Debug, Clone)]
pub struct Target {
    /// The command payload template.
    pub payload: Value,
    /// Input field → (schema unit, native unit) where they differ.
    pub input_units: BTreeMap<String, (String, String)>,
    /// Longest run of one command.
    pub run_max: Duration,
}

/// The parsed mapping.
#[derive(Debug, Clone)]
pub struct Config {
    /// Broker host.
    pub host: String,
    /// Broker port.
    pub port: u16,
    /// MQTT client id.
    pub client_id: String,
    /// MQTT 5 (else 3.1.1).
    pub v5: bool,
    /// Keep-alive, seconds.
    pub keep_alive_s: u64,
    /// TCP connect + CONNACK bound, seconds.
    pub connect_timeout_s: u64,
    /// Bound on one publish (until the broker's PUBACK).
    pub publish_timeout: Duration,
    /// Bound on the device's first acknowledgement of a command.
    pub ack_timeout: Duration,
    /// The member of an acknowledgement that carries the `command_id`.
    pub correlation_field: String,
    /// Topics.
    pub topics: Topics,
    /// Acknowledgements.
    pub ack: AckMap,
    /// The resource the state message maps to.
    pub resource: String,
    /// A state message older than this is unknown.
    pub stale_after: Duration,
    /// Mapped state fields.
    pub fields: Vec<FieldMap>,
    /// Mapped interlocks.
    pub interlocks: Vec<InterlockMap>,
    /// The lease.
    pub lease: Duration,
    /// The lease renewal payload template.
    pub lease_payload: Value,
    /// The native stop payload template.
    pub stop_payload: Value,
    /// Binding targets.
    pub targets: BTreeMap<String, Target>,
}

/// Reads members of one table, remembering defects and refusing unknown keys.
struct Table<'a> {
    map: Option<&'a Map<String, Value>>,
    path: String,
}

impl<'a> Table<'a> {
    fn new(v: Option<&'a Value>, path: &str, known: &[&str], d: &mut Vec<Defect>) -> Self {
        let map = match v {
            None => None,
            Some(Value::Object(m)) => {
                for k in m.keys().filter(|k| !known.contains(&k.as_str())) {
                    d.push((
                        join(path, k),
                        format!("unknown key (known: {})", known.join(", ")),
                    ));
                }
                Some(m)
            }
            Some(_) => {
                d.push((path.to_owned(), "must be a table".into()));
                None
            }
        };
        Self {
            map,
            path: path.to_owned(),
        }
    }
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.and_then(|m| m.get(key))
    }
    fn at(&self, key: &str) -> String {
        join(&self.path, key)
    }
    fn string(&self, key: &str, default: Option<&str>, d: &mut Vec<Defect>) -> String {
        match self.get(key) {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            None if default.is_some() => default.unwrap_or_default().to_owned(),
            None if self.map.is_some() => {
                d.push((self.at(key), "required (a non-empty string)".into()));
                String::new()
            }
            None => String::new(),
            Some(_) => {
                d.push((self.at(key), "must be a non-empty string".into()));
                String::new()
            }
        }
    }
    fn int(&self, key: &str, default: u64, range: (u64, u64), d: &mut Vec<Defect>) -> u64 {
        match self.get(key) {
            None => default,
            Some(v) => match v.as_u64().filter(|n| (range.0..=range.1).contains(n)) {
                Some(n) => n,
                None => {
                    d.push((
                        self.at(key),
                        format!("must be an integer from {} to {}", range.0, range.1),
                    ));
                    default
                }
            },
        }
    }
    fn entries(&self) -> impl Iterator<Item = (&'a String, &'a Value)> {
        self.map.into_iter().flat_map(|m| m.iter())
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

const TOP: &[&str] = &[
    "broker",
    "client_id",
    "protocol",
    "keep_alive_s",
    "connect_timeout_s",
    "publish_timeout_ms",
    "ack_timeout_ms",
    "correlation_field",
    "topics",
    "ack",
    "state",
    "interlocks",
    "lease",
    "stop",
    "targets",
];

/// Parses and checks the mapping of `manifest`.
///
/// # Errors
/// Every defect, with its path under `driver_config`.
pub fn parse(manifest: &DeviceManifest) -> Result<Config, Vec<Defect>> {
    let mut d = Vec::new();
    let Some(cfg) = manifest.driver_config.as_ref() else {
        return Err(vec![(
            "driver_config".into(),
            "the mqtt driver needs a [driver_config] mapping (docs/DRIVERS.md)".into(),
        )]);
    };
    let top = Table::new(Some(cfg), "driver_config", TOP, &mut d);
    let (host, port) = broker(&top, &mut d);
    let protocol = top.string("protocol", Some("3.1.1"), &mut d);
    let v5 = match protocol.as_str() {
        "5" | "5.0" => true,
        "3.1.1" => false,
        _ => {
            d.push((top.at("protocol"), "must be \"3.1.1\" or \"5\"".into()));
            false
        }
    };
    // rumqttc accepts keep-alives of at least 1 s (3.1.1) and 5 s (5).
    let keep_alive_s = top.int("keep_alive_s", 5, (if v5 { 5 } else { 1 }, 3600), &mut d);
    let default_id = format!("tether-{}", manifest.device_id);
    let topics = topics(&top, &mut d);
    let ack = ack_map(&top, &mut d);
    let (resource, stale_after, fields) = state_map(&top, manifest, &mut d);
    let lease_t = Table::new(
        top.get("lease"),
        &top.at("lease"),
        &["lease_ms", "payload"],
        &mut d,
    );
    let lease = lease_t.int("lease_ms", 1000, (20, 60_000), &mut d);
    let lease_payload = payload_of(&lease_t, &mut d);
    let stop_t = Table::new(top.get("stop"), &top.at("stop"), &["payload"], &mut d);
    let stop_payload = payload_of(&stop_t, &mut d);
    let correlation_field = top.string("correlation_field", Some("command_id"), &mut d);
    for (t, at) in [(&lease_t, "lease"), (&stop_t, "stop")] {
        template::check(
            &t.get("payload").cloned().unwrap_or(Value::Null),
            &BTreeMap::new(),
            &top.at(at),
            &mut d,
        );
    }
    let targets = targets(&top, manifest, &mut d);
    let interlocks = interlocks(&top, manifest, &mut d);
    let config = Config {
        host,
        port,
        client_id: top.string("client_id", Some(&default_id), &mut d),
        v5,
        keep_alive_s,
        connect_timeout_s: top.int("connect_timeout_s", 2, (1, 60), &mut d),
        publish_timeout: ms(top.int(
            "publish_timeout_ms",
            PUBLISH_TIMEOUT_MS,
            (1, MS_MAX),
            &mut d,
        )),
        ack_timeout: ms(top.int("ack_timeout_ms", ACK_TIMEOUT_MS, (1, MS_MAX), &mut d)),
        correlation_field,
        topics,
        ack,
        resource,
        stale_after,
        fields,
        interlocks,
        lease: ms(lease),
        lease_payload,
        stop_payload,
        targets,
    };
    if d.is_empty() {
        Ok(config)
    } else {
        Err(d)
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn broker(top: &Table<'_>, d: &mut Vec<Defect>) -> (String, u16) {
    let text = top.string("broker", None, d);
    if top.get("broker").is_none() {
        d.push((
            top.at("broker"),
            "required: the broker's host:port, e.g. \"127.0.0.1:1883\"".into(),
        ));
        return (String::new(), 0);
    }
    match text.rsplit_once(':').map(|(h, p)| (h, p.parse::<u16>())) {
        Some((h, Ok(p))) if !h.is_empty() && p > 0 => (h.trim_matches(['[', ']']).to_owned(), p),
        _ => {
            if !text.is_empty() {
                d.push((top.at("broker"), format!("`{text}` is not host:port")));
            }
            (String::new(), 0)
        }
    }
}

fn topics(top: &Table<'_>, d: &mut Vec<Defect>) -> Topics {
    let at = top.at("topics");
    if top.get("topics").is_none() {
        d.push((
            at.clone(),
            "required: the cmd, ack, state and lease topics".into(),
        ));
    }
    let t = Table::new(top.get("topics"), &at, &["cmd", "ack", "state", "lease"], d);
    let mut one = |k: &str| {
        let s = t.string(k, None, d);
        if s.contains(['+', '#']) {
            d.push((t.at(k), "a topic name, not a filter: no `+` or `#`".into()));
        }
        s
    };
    Topics {
        cmd: one("cmd"),
        ack: one("ack"),
        state: one("state"),
        lease: one("lease"),
    }
}

fn ack_map(top: &Table<'_>, d: &mut Vec<Defect>) -> AckMap {
    let keys = [
        "status_field",
        "reason_field",
        "accepted",
        "done",
        "rejected",
        "stopped",
    ];
    let t = Table::new(top.get("ack"), &top.at("ack"), &keys, d);
    AckMap {
        status_field: t.string("status_field", Some("status"), d),
        reason_field: t.string("reason_field", Some("reason"), d),
        accepted: t.string("accepted", Some("accepted"), d),
        done: t.string("done", Some("done"), d),
        rejected: t.string("rejected", Some("rejected"), d),
        stopped: t.string("stopped", Some("stopped"), d),
    }
}

fn payload_of(t: &Table<'_>, d: &mut Vec<Defect>) -> Value {
    match t.get("payload") {
        Some(v @ Value::Object(_)) => v.clone(),
        Some(_) => {
            d.push((
                t.at("payload"),
                "must be a table (the JSON object to publish)".into(),
            ));
            Value::Null
        }
        None => {
            d.push((
                t.at("payload"),
                "required: the JSON payload template".into(),
            ));
            Value::Null
        }
    }
}

/// The unit of a schema property, if it declares one.
fn unit_of(schema: &Value, field: &str) -> Option<String> {
    schema
        .pointer(&format!("/properties/{field}/x-mhs-unit"))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// Checks a native unit against the field's declared one.
fn check_unit(native: &str, declared: Option<&str>, at: String, d: &mut Vec<Defect>) {
    match declared {
        None => d.push((
            at,
            format!("unit `{native}` given, but the field declares no x-mhs-unit"),
        )),
        Some(decl) => match (units::dimension(native), units::dimension(decl)) {
            (None, _) => d.push((
                at,
                format!("unknown unit `{native}` (docs/MANIFESTS.md, Units)"),
            )),
            (Some(a), Some(b)) if a != b => d.push((
                at,
                format!("unit `{native}` ({a}) is not a unit the field uses (`{decl}`, {b})"),
            )),
            _ => {}
        },
    }
}

fn state_map(
    top: &Table<'_>,
    manifest: &DeviceManifest,
    d: &mut Vec<Defect>,
) -> (String, Duration, Vec<FieldMap>) {
    let at = top.at("state");
    let t = Table::new(
        top.get("state"),
        &at,
        &["resource", "stale_after_ms", "fields"],
        d,
    );
    let only = match manifest.resources.as_slice() {
        [one] => Some(one.id.as_str()),
        _ => None,
    };
    let resource = t.string("resource", only, d);
    let schema = manifest
        .resources
        .iter()
        .find(|r| r.id == resource)
        .map(|r| &r.state_schema);
    if schema.is_none() && !resource.is_empty() {
        d.push((
            t.at("resource"),
            format!("the device declares no resource `{resource}`"),
        ));
    }
    let stale = t.int("stale_after_ms", 1000, (1, MS_MAX), d);
    let mut fields = Vec::new();
    let ft = Table::new(t.get("fields"), &t.at("fields"), &[], &mut Vec::new());
    for (name, spec) in ft.entries() {
        let fat = ft.at(name);
        let f = Table::new(Some(spec), &fat, &["path", "unit"], d);
        let path = f.string("path", Some(name), d);
        let schema_unit = schema.and_then(|s| unit_of(s, name));
        let known = schema.is_some_and(|s| s.pointer(&format!("/properties/{name}")).is_some());
        if schema.is_some() && !known {
            d.push((
                fat.clone(),
                format!("resource `{resource}` has no field `{name}` in its state schema"),
            ));
        }
        let native_unit = f.get("unit").and_then(Value::as_str).map(str::to_owned);
        if let Some(u) = &native_unit {
            check_unit(u, schema_unit.as_deref(), f.at("unit"), d);
        }
        fields.push(FieldMap {
            name: name.clone(),
            path,
            native_unit,
            schema_unit,
        });
    }
    (resource, ms(stale), fields)
}

fn interlocks(
    top: &Table<'_>,
    manifest: &DeviceManifest,
    d: &mut Vec<Defect>,
) -> Vec<InterlockMap> {
    let t = Table::new(
        top.get("interlocks"),
        &top.at("interlocks"),
        &[],
        &mut Vec::new(),
    );
    let mut out = Vec::new();
    for (id, spec) in t.entries() {
        let at = t.at(id);
        let it = Table::new(Some(spec), &at, &["path", "closed"], d);
        if !manifest.interlocks.iter().any(|i| &i.id == id) {
            d.push((
                at.clone(),
                format!("the device declares no interlock `{id}`"),
            ));
        }
        let path = it.string("path", Some(id), d);
        let closed = match it.get("closed") {
            Some(v @ (Value::String(_) | Value::Bool(_) | Value::Number(_))) => v.clone(),
            Some(_) => {
                d.push((
                    it.at("closed"),
                    "must be a string, boolean or number".into(),
                ));
                Value::Null
            }
            None => {
                d.push((
                    it.at("closed"),
                    "required: the native value that means closed".into(),
                ));
                Value::Null
            }
        };
        out.push(InterlockMap {
            id: id.clone(),
            path,
            closed,
        });
    }
    for (i, il) in manifest.interlocks.iter().enumerate() {
        if !out.iter().any(|m| m.id == il.id) {
            d.push((
                format!("interlocks[{i}]"),
                format!("interlock `{}` is not mapped in driver_config.interlocks: it would always read unknown", il.id),
            ));
        }
    }
    out
}

/// The targets a manifest's effectful bindings name, with their input schemas.
fn effectful_targets(manifest: &DeviceManifest) -> Vec<(usize, String, Value)> {
    let mut out = Vec::new();
    for (i, b) in manifest.bindings.iter().enumerate() {
        let class = catalogue::class(&b.capability_id);
        let read = class.is_some_and(|c| c.verb == catalogue::Verb::Read);
        let stop = class.is_some_and(|c| c.flags.stop_class);
        if read || stop {
            continue;
        }
        let mut props = Map::new();
        for schema in [class.map(|c| &c.input_schema), b.input_schema.as_ref()]
            .into_iter()
            .flatten()
        {
            if let Some(p) = schema.get("properties").and_then(Value::as_object) {
                for (k, v) in p {
                    let merged = props
                        .entry(k.clone())
                        .or_insert_with(|| Value::Object(Map::new()));
                    if let (Some(m), Some(v)) = (merged.as_object_mut(), v.as_object()) {
                        m.extend(v.clone());
                    }
                }
            }
        }
        let target = b.target.clone().unwrap_or_else(|| b.capability_id.clone());
        out.push((i, target, serde_json::json!({"properties": props})));
    }
    out
}

fn targets(
    top: &Table<'_>,
    manifest: &DeviceManifest,
    d: &mut Vec<Defect>,
) -> BTreeMap<String, Target> {
    let bound = effectful_targets(manifest);
    let t = Table::new(top.get("targets"), &top.at("targets"), &[], &mut Vec::new());
    let mut out = BTreeMap::new();
    for (name, spec) in t.entries() {
        let at = t.at(name);
        let tt = Table::new(
            Some(spec),
            &at,
            &["payload", "input_units", "max_run_ms"],
            d,
        );
        let payload = payload_of(&tt, d);
        let Some((_, _, schema)) = bound.iter().find(|(_, n, _)| n == name) else {
            d.push((
                at,
                format!("no effectful binding of this device has target `{name}`"),
            ));
            continue;
        };
        let mut input_units = BTreeMap::new();
        let ut = Table::new(
            tt.get("input_units"),
            &tt.at("input_units"),
            &[],
            &mut Vec::new(),
        );
        for (field, unit) in ut.entries() {
            let uat = ut.at(field);
            let declared = unit_of(schema, field);
            match unit.as_str() {
                Some(native) => {
                    check_unit(native, declared.as_deref(), uat, d);
                    if let Some(decl) = declared {
                        input_units.insert(field.clone(), (decl, native.to_owned()));
                    }
                }
                None => d.push((uat, "must be a unit string".into())),
            }
        }
        let fields: BTreeMap<String, ()> = schema
            .get("properties")
            .and_then(Value::as_object)
            .map(|p| p.keys().map(|k| (k.clone(), ())).collect())
            .unwrap_or_default();
        template::check(&payload, &fields, &at, d);
        if !template::places_command_id(&payload) {
            d.push((
                tt.at("payload"),
                "must place \"$command_id\" so an acknowledgement can be matched".into(),
            ));
        }
        let run_max = ms(tt.int("max_run_ms", RUN_MAX_MS, (1, 86_400_000), d));
        out.insert(
            name.clone(),
            Target {
                payload,
                input_units,
                run_max,
            },
        );
    }
    for (i, name, _) in &bound {
        if !out.contains_key(name) && !d.iter().any(|(p, _)| p == &t.at(name)) {
            d.push((
                format!("bindings[{i}].target"),
                format!("target `{name}` has no template in driver_config.targets.{name}"),
            ));
        }
    }
    out
}
