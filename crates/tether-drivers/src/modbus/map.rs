//! The register map: what a `modbus.tcp` manifest's `[driver_config]` says,
//! read into types and checked against the manifest it belongs to.
//!
//! **Owns:** the config's shape (serde, unknown keys refused), its defaults,
//! and every mapping defect `tether check` reports (unknown table, a type that
//! cannot hold a field's bounds after scaling, a unit the field does not use,
//! a target without writes, an interlock without a closed value, …).
//! **Never here:** I/O, encoding of values (see `codec`), decisions.

use super::codec::{DataType, Point, Table, WordOrder};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;
use tether_core::manifest::DeviceManifest;

/// Connect timeout when the config names none.
const CONNECT_TIMEOUT_MS_DEFAULT: u64 = 1000;
/// Request timeout when the config names none.
const REQUEST_TIMEOUT_MS_DEFAULT: u64 = 500;
/// Poll period of the state mirror when the config names none.
const POLL_MS_DEFAULT: u64 = 100;
/// Freshness bound of the mirror when the config names none.
const STALE_MS_DEFAULT: u64 = 1000;
/// Bounds on every period and timeout of the config (ms): below 5 ms a
/// loopback peer could not answer; above a minute a fault would hide.
const MS_MIN: u64 = 5;
const MS_MAX: u64 = 60_000;

/// `[driver_config]` of a `modbus.tcp` device, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    address: String,
    #[serde(default = "unit_id_default")]
    unit_id: u8,
    connect_timeout_ms: Option<u64>,
    request_timeout_ms: Option<u64>,
    poll_ms: Option<u64>,
    stale_ms: Option<u64>,
    /// resource id → field name → point.
    #[serde(default)]
    fields: BTreeMap<String, BTreeMap<String, RawPoint>>,
    /// binding target → ordered writes.
    #[serde(default)]
    targets: BTreeMap<String, Vec<RawWrite>>,
    /// The native stop: ordered writes.
    #[serde(default)]
    stop: Vec<RawWrite>,
    /// interlock id → point and the value that means closed.
    #[serde(default)]
    interlocks: BTreeMap<String, RawInterlock>,
    watchdog: Option<RawWatchdog>,
}

fn unit_id_default() -> u8 {
    1
}

/// A native point as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPoint {
    table: String,
    address: u32,
    #[serde(rename = "type")]
    data_type: Option<String>,
    word_order: Option<String>,
    scale: Option<f64>,
    offset: Option<f64>,
    unit: Option<String>,
}

/// One write of a target or of the stop, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWrite {
    /// A mapped field of the binding's resource (or of the device's first
    /// resource, for the stop).
    field: Option<String>,
    /// A point not in the state, written inline.
    point: Option<RawPoint>,
    /// The input field whose value is written.
    input: Option<String>,
    /// A constant, in the field's declared unit.
    value: Option<Value>,
}

/// An interlock as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawInterlock {
    #[serde(flatten)]
    point: RawPoint,
    closed: Option<Value>,
}

/// The watchdog as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWatchdog {
    #[serde(flatten)]
    point: RawPoint,
    /// The boolean field that reads the device's own enabled state.
    enabled_field: String,
}

/// Where a written value comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// An input field of the call (skipped when the input lacks it).
    Input(String),
    /// A constant, in the point's declared unit.
    Constant(Value),
}

/// One resolved write.
#[derive(Debug, Clone)]
pub struct Write {
    /// What is written to.
    pub point: Point,
    /// What is written.
    pub source: Source,
    /// How the write is named in receipts (`holding:0`).
    pub label: String,
}

/// A mapped field of a resource.
#[derive(Debug, Clone)]
pub struct Field {
    /// The state field's name.
    pub name: String,
    /// The native point.
    pub point: Point,
}

/// A mapped interlock.
#[derive(Debug, Clone)]
pub struct Interlock {
    /// The manifest's interlock id.
    pub id: String,
    /// The native point.
    pub point: Point,
    /// The reading that means closed.
    pub closed: Value,
}

/// The mapped watchdog.
#[derive(Debug, Clone)]
pub struct Watchdog {
    /// The register fed.
    pub point: Point,
    /// The field reading the device's enabled state.
    pub enabled_field: String,
    /// `safety.watchdog_ms`.
    pub period: Duration,
}

/// A checked map, ready for the driver.
#[derive(Debug, Clone)]
pub struct Map {
    /// `host:port` of the device.
    pub address: String,
    /// Modbus unit id.
    pub unit_id: u8,
    /// Bound on opening a connection.
    pub connect_timeout: Duration,
    /// Bound on one request.
    pub request_timeout: Duration,
    /// Period of the state mirror.
    pub poll: Duration,
    /// Age after which a mirrored reading is unknown.
    pub stale: Duration,
    /// resource id → fields.
    pub resources: BTreeMap<String, Vec<Field>>,
    /// target → ordered writes.
    pub targets: BTreeMap<String, Vec<Write>>,
    /// The native stop's writes.
    pub stop: Vec<Write>,
    /// Interlocks.
    pub interlocks: Vec<Interlock>,
    /// The watchdog, if mapped.
    pub watchdog: Option<Watchdog>,
}

/// A mapping defect: where (a path under `driver_config`) and what.
pub type MapDefect = (String, String);

impl Map {
    /// Reads and checks a manifest's map. Every defect is reported, not just
    /// the first.
    ///
    /// # Errors
    /// Every defect found.
    pub fn of(manifest: &DeviceManifest) -> Result<Map, Vec<MapDefect>> {
        let cfg = manifest.driver_config.clone().unwrap_or(Value::Null);
        let raw: RawConfig = serde_json::from_value(cfg)
            .map_err(|e| vec![("driver_config".to_owned(), e.to_string())])?;
        let mut defects = Vec::new();
        let map = resolve(&raw, manifest, &mut defects);
        if defects.is_empty() {
            Ok(map)
        } else {
            Err(defects)
        }
    }

    /// [`Map::of`] with its defects joined one after another, and the
    /// device's socket address: what building a driver or a probe needs.
    ///
    /// # Errors
    /// Every defect, joined.
    pub fn load(manifest: &DeviceManifest) -> Result<(Map, std::net::SocketAddr), String> {
        let map = Map::of(manifest).map_err(|d| {
            d.iter()
                .map(|(at, msg)| format!("{at}: {msg}"))
                .collect::<Vec<_>>()
                .join("; ")
        })?;
        let addr = map
            .address
            .parse()
            .map_err(|_| format!("driver_config.address `{}` is not host:port", map.address))?;
        Ok((map, addr))
    }

    /// The fields of a resource.
    pub fn fields(&self, resource: &str) -> &[Field] {
        self.resources.get(resource).map_or(&[], Vec::as_slice)
    }

    /// Every distinct point the mirror polls: fields, interlocks.
    pub fn polled(&self) -> Vec<Point> {
        let mut out: Vec<Point> = Vec::new();
        let all = self
            .resources
            .values()
            .flatten()
            .map(|f| &f.point)
            .chain(self.interlocks.iter().map(|i| &i.point));
        for p in all {
            if !out.iter().any(|q| q.same_registers(p)) {
                out.push(p.clone());
            }
        }
        out
    }
}

fn ms(v: Option<u64>, default: u64, key: &str, defects: &mut Vec<MapDefect>) -> Duration {
    let ms = v.unwrap_or(default);
    if !(MS_MIN..=MS_MAX).contains(&ms) {
        defects.push((
            format!("driver_config.{key}"),
            format!("must be from {MS_MIN} to {MS_MAX} ms"),
        ));
    }
    Duration::from_millis(ms.clamp(MS_MIN, MS_MAX))
}

fn resolve(raw: &RawConfig, m: &DeviceManifest, defects: &mut Vec<MapDefect>) -> Map {
    if raw.address.parse::<std::net::SocketAddr>().is_err() {
        defects.push((
            "driver_config.address".into(),
            format!(
                "`{}` is not host:port with a literal IP address",
                raw.address
            ),
        ));
    }
    let request_timeout = ms(
        raw.request_timeout_ms,
        REQUEST_TIMEOUT_MS_DEFAULT,
        "request_timeout_ms",
        defects,
    );
    let poll = ms(raw.poll_ms, POLL_MS_DEFAULT, "poll_ms", defects);
    let stale = ms(raw.stale_ms, STALE_MS_DEFAULT, "stale_ms", defects);
    if stale <= poll {
        defects.push((
            "driver_config.stale_ms".into(),
            "must be longer than poll_ms (else every reading is stale when read)".into(),
        ));
    }
    let resources = resolve_fields(raw, m, defects);
    let targets = resolve_targets(raw, m, &resources, defects);
    let stop = resolve_stop(raw, m, &resources, defects);
    let interlocks = resolve_interlocks(raw, m, defects);
    let watchdog = resolve_watchdog(raw, m, &resources, defects);
    Map {
        address: raw.address.clone(),
        unit_id: raw.unit_id,
        connect_timeout: ms(
            raw.connect_timeout_ms,
            CONNECT_TIMEOUT_MS_DEFAULT,
            "connect_timeout_ms",
            defects,
        ),
        request_timeout,
        poll,
        stale,
        resources,
        targets,
        stop,
        interlocks,
        watchdog,
    }
}

/// The declared unit (`x-mhs-unit`) of a state field, if any.
fn field_unit(schema: &Value, field: &str) -> Option<String> {
    schema
        .pointer(&format!("/properties/{field}/x-mhs-unit"))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

fn resolve_fields(
    raw: &RawConfig,
    m: &DeviceManifest,
    defects: &mut Vec<MapDefect>,
) -> BTreeMap<String, Vec<Field>> {
    let mut out = BTreeMap::new();
    for (rid, fields) in &raw.fields {
        let here = format!("driver_config.fields.{rid}");
        let Some(res) = m.resources.iter().find(|r| &r.id == rid) else {
            defects.push((here, format!("the manifest has no resource `{rid}`")));
            continue;
        };
        let mut resolved = Vec::new();
        for (name, rp) in fields {
            let at = format!("{here}.{name}");
            let Some(prop) = res.state_schema.pointer(&format!("/properties/{name}")) else {
                defects.push((at, format!("resource `{rid}` has no state field `{name}`")));
                continue;
            };
            let unit = field_unit(&res.state_schema, name);
            if let Some(point) = point(rp, &at, unit.as_deref(), defects) {
                check_bounds_fit(&point, prop, &at, defects);
                check_kind_fits(&point, prop, &at, defects);
                resolved.push(Field {
                    name: name.clone(),
                    point,
                });
            }
        }
        out.insert(rid.clone(), resolved);
    }
    for res in &m.resources {
        let props = res
            .state_schema
            .get("properties")
            .and_then(Value::as_object);
        for name in props.into_iter().flat_map(|p| p.keys()) {
            let mapped = out
                .get(&res.id)
                .is_some_and(|f: &Vec<Field>| f.iter().any(|x| &x.name == name));
            if !mapped {
                defects.push((
                    format!("driver_config.fields.{}.{name}", res.id),
                    "state field has no native point: map it (every field is read from the device)"
                        .into(),
                ));
            }
        }
    }
    out
}

/// Reads a raw point: table, type, word order, scale, offset, unit.
pub(crate) fn point(
    rp: &RawPoint,
    at: &str,
    field_unit: Option<&str>,
    defects: &mut Vec<MapDefect>,
) -> Option<Point> {
    let before = defects.len();
    let table = Table::parse(&rp.table).ok_or_else(|| {
        defects.push((
            format!("{at}.table"),
            format!(
                "unknown register table `{}` (known: holding, input, coil, discrete)",
                rp.table
            ),
        ));
    });
    let data_type = match (&table, rp.data_type.as_deref()) {
        (Ok(t), None) if t.is_bits() => Some(DataType::Bool),
        (Err(()), None) => None,
        (Ok(_), None) => {
            defects.push((
                format!("{at}.type"),
                "a register needs a type: u16, i16, u32, i32 or f32".into(),
            ));
            None
        }
        (_, Some(s)) => DataType::parse(s).or_else(|| {
            defects.push((
                format!("{at}.type"),
                format!("unknown type `{s}` (known: bool, u16, i16, u32, i32, f32)"),
            ));
            None
        }),
    };
    if let (Ok(t), Some(dt)) = (&table, data_type) {
        if t.is_bits() != (dt == DataType::Bool) {
            defects.push((
                format!("{at}.type"),
                format!(
                    "type `{}` does not fit the `{}` table",
                    dt.as_str(),
                    t.as_str()
                ),
            ));
        }
    }
    let word_order = match rp.word_order.as_deref() {
        None => WordOrder::HighFirst,
        Some(s) => WordOrder::parse(s).unwrap_or_else(|| {
            defects.push((
                format!("{at}.word_order"),
                format!("unknown word order `{s}` (known: high_first, low_first)"),
            ));
            WordOrder::HighFirst
        }),
    };
    let scale = rp.scale.unwrap_or(1.0);
    if !scale.is_finite() || scale == 0.0 {
        defects.push((
            format!("{at}.scale"),
            "must be a finite, non-zero number".into(),
        ));
    }
    let offset = rp.offset.unwrap_or(0.0);
    if !offset.is_finite() {
        defects.push((format!("{at}.offset"), "must be a finite number".into()));
    }
    check_unit(rp.unit.as_deref(), field_unit, at, defects);
    if defects.len() > before {
        return None;
    }
    let (Ok(table), Some(data_type)) = (table, data_type) else {
        return None;
    };
    let words = data_type.words();
    if u32::from(words) + rp.address > 65_536 {
        defects.push((
            format!("{at}.address"),
            "beyond the 65536 addresses of a table".into(),
        ));
        return None;
    }
    Some(Point {
        table,
        address: u16::try_from(rp.address).unwrap_or(u16::MAX),
        data_type,
        word_order,
        scale,
        offset,
        native_unit: rp.unit.clone().or_else(|| field_unit.map(str::to_owned)),
        field_unit: field_unit.map(str::to_owned),
    })
}

fn check_unit(native: Option<&str>, field: Option<&str>, at: &str, defects: &mut Vec<MapDefect>) {
    let Some(native) = native else {
        return;
    };
    let Some(field) = field else {
        defects.push((
            format!("{at}.unit"),
            format!("the field declares no x-mhs-unit, so `{native}` cannot be converted to it"),
        ));
        return;
    };
    match tether_limits::units::convert(1.0, native, field) {
        Ok(_) => {}
        Err(e) => defects.push((
            format!("{at}.unit"),
            format!("`{native}` is not a unit the field uses (`{field}`): {e}"),
        )),
    }
}

/// A numeric field's declared bounds (schema minimum/maximum) must be
/// representable in the point's type after scaling.
fn check_bounds_fit(p: &Point, prop: &Value, at: &str, defects: &mut Vec<MapDefect>) {
    if p.data_type == DataType::Bool {
        return;
    }
    for key in ["minimum", "maximum"] {
        let Some(bound) = prop.get(key).and_then(Value::as_f64) else {
            continue;
        };
        if let Err(e) = p.encode(&Value::from(bound)) {
            defects.push((
                format!("{at}.type"),
                format!(
                    "`{}` at scale {} cannot hold the field's {key} {bound}: {e}",
                    p.data_type.as_str(),
                    p.scale
                ),
            ));
        }
    }
}

/// A boolean state field needs a bit (or a register read as 0/1 is refused:
/// the driver never guesses a truth value).
fn check_kind_fits(p: &Point, prop: &Value, at: &str, defects: &mut Vec<MapDefect>) {
    let ty = prop.get("type").and_then(Value::as_str);
    let bits = p.data_type == DataType::Bool;
    match ty {
        Some("boolean") if !bits => defects.push((
            format!("{at}.table"),
            "a boolean field maps to a coil or a discrete input".into(),
        )),
        Some("number" | "integer") if bits => defects.push((
            format!("{at}.table"),
            "a numeric field maps to a holding or input register".into(),
        )),
        _ => {}
    }
}

fn resolve_write(
    w: &RawWrite,
    at: &str,
    fields: &[Field],
    defects: &mut Vec<MapDefect>,
) -> Option<Write> {
    let point = match (&w.field, &w.point) {
        (Some(f), None) => match fields.iter().find(|x| &x.name == f) {
            Some(x) => Some(x.point.clone()),
            None => {
                defects.push((
                    format!("{at}.field"),
                    format!("`{f}` is not a mapped field of the resource"),
                ));
                None
            }
        },
        (None, Some(rp)) => point(rp, &format!("{at}.point"), rp.unit.as_deref(), defects),
        _ => {
            defects.push((
                at.to_owned(),
                "a write names exactly one of `field` or `point`".into(),
            ));
            None
        }
    }?;
    if !point.table.is_writable() {
        defects.push((
            at.to_owned(),
            format!("`{}` is a read-only table", point.table.as_str()),
        ));
        return None;
    }
    let source = match (&w.input, &w.value) {
        (Some(i), None) => Source::Input(i.clone()),
        (None, Some(v)) => {
            if let Err(e) = point.encode(v) {
                defects.push((
                    format!("{at}.value"),
                    format!("the constant cannot be written: {e}"),
                ));
                return None;
            }
            Source::Constant(v.clone())
        }
        _ => {
            defects.push((
                at.to_owned(),
                "a write takes exactly one of `input` or `value`".into(),
            ));
            return None;
        }
    };
    Some(Write {
        label: point.label(),
        point,
        source,
    })
}

fn resolve_targets(
    raw: &RawConfig,
    m: &DeviceManifest,
    resources: &BTreeMap<String, Vec<Field>>,
    defects: &mut Vec<MapDefect>,
) -> BTreeMap<String, Vec<Write>> {
    let mut out = BTreeMap::new();
    for (i, b) in m.bindings.iter().enumerate() {
        let is_read = b.capability_id == tether_core::catalogue::STATE_READ;
        let target = b.target.clone().unwrap_or_else(|| b.capability_id.clone());
        if is_read || out.contains_key(&target) {
            continue;
        }
        let at = format!("driver_config.targets.{target}");
        let Some(writes) = raw.targets.get(&target) else {
            defects.push((
                at,
                format!(
                    "binding {i} (`{}`) has no writes for its target",
                    b.capability_id
                ),
            ));
            continue;
        };
        if writes.is_empty() {
            defects.push((at, "a target with no writes does nothing".into()));
            continue;
        }
        let fields = resources.get(&b.resource).map_or(&[][..], Vec::as_slice);
        let resolved: Vec<Write> = writes
            .iter()
            .enumerate()
            .filter_map(|(k, w)| resolve_write(w, &format!("{at}[{k}]"), fields, defects))
            .collect();
        check_input_units(b, &resolved, &at, defects);
        out.insert(target, resolved);
    }
    for t in raw.targets.keys() {
        let bound = m
            .bindings
            .iter()
            .any(|b| b.target.as_deref().unwrap_or(&b.capability_id) == t);
        if !bound {
            defects.push((
                format!("driver_config.targets.{t}"),
                "no binding has this target".into(),
            ));
        }
    }
    out
}

/// An input written to a field must be declared in the field's unit (the
/// kernel checks limits in the input's unit; the driver converts only
/// between the field's unit and the native one).
fn check_input_units(
    b: &tether_core::manifest::BindingDecl,
    writes: &[Write],
    at: &str,
    defects: &mut Vec<MapDefect>,
) {
    for w in writes {
        let Source::Input(name) = &w.source else {
            continue;
        };
        let declared = b
            .limits
            .get(name)
            .and_then(|l| l.get("unit"))
            .and_then(Value::as_str);
        if let (Some(d), Some(f)) = (declared, w.point.field_unit.as_deref()) {
            if !tether_limits::units::same_unit(d, f) {
                defects.push((
                    at.to_owned(),
                    format!("input `{name}` is limited in `{d}` but written to a field in `{f}`"),
                ));
            }
        }
    }
}

fn resolve_stop(
    raw: &RawConfig,
    m: &DeviceManifest,
    resources: &BTreeMap<String, Vec<Field>>,
    defects: &mut Vec<MapDefect>,
) -> Vec<Write> {
    let native = m.safety.estop.native.unwrap_or(true);
    if native && raw.stop.is_empty() {
        defects.push((
            "driver_config.stop".into(),
            "the device declares a native stop (safety.estop.native) but the map has no stop writes".into(),
        ));
    }
    let fields: Vec<Field> = resources.values().flatten().cloned().collect();
    raw.stop
        .iter()
        .enumerate()
        .filter_map(|(k, w)| {
            let at = format!("driver_config.stop[{k}]");
            let r = resolve_write(w, &at, &fields, defects)?;
            if matches!(r.source, Source::Input(_)) {
                defects.push((
                    at,
                    "a stop write takes a constant `value` (a stop has no input)".into(),
                ));
                return None;
            }
            Some(r)
        })
        .collect()
}

fn resolve_interlocks(
    raw: &RawConfig,
    m: &DeviceManifest,
    defects: &mut Vec<MapDefect>,
) -> Vec<Interlock> {
    let mut out = Vec::new();
    for il in &m.interlocks {
        let at = format!("driver_config.interlocks.{}", il.id);
        let Some(ri) = raw.interlocks.get(&il.id) else {
            defects.push((
                at,
                "the manifest declares this interlock but the map gives no native input for it"
                    .into(),
            ));
            continue;
        };
        let Some(p) = point(&ri.point, &at, ri.point.unit.as_deref(), defects) else {
            continue;
        };
        let Some(closed) = ri.closed.clone() else {
            defects.push((
                format!("{at}.closed"),
                "an interlock needs the reading that means closed".into(),
            ));
            continue;
        };
        if let Err(e) = p.encode(&closed) {
            defects.push((
                format!("{at}.closed"),
                format!("the point cannot read this value: {e}"),
            ));
            continue;
        }
        out.push(Interlock {
            id: il.id.clone(),
            point: p,
            closed,
        });
    }
    for id in raw.interlocks.keys() {
        if !m.interlocks.iter().any(|i| &i.id == id) {
            defects.push((
                format!("driver_config.interlocks.{id}"),
                "the manifest declares no such interlock".into(),
            ));
        }
    }
    out
}

fn resolve_watchdog(
    raw: &RawConfig,
    m: &DeviceManifest,
    resources: &BTreeMap<String, Vec<Field>>,
    defects: &mut Vec<MapDefect>,
) -> Option<Watchdog> {
    let at = "driver_config.watchdog".to_owned();
    match (raw.watchdog.as_ref(), m.safety.watchdog_ms) {
        (None, None) => None,
        (Some(_), None) => {
            defects.push((
                at,
                "a watchdog is mapped but safety.watchdog_ms is not declared".into(),
            ));
            None
        }
        (None, Some(_)) => {
            defects.push((
                at,
                "safety.watchdog_ms is declared: map the watchdog register it feeds".into(),
            ));
            None
        }
        (Some(w), Some(ms)) => {
            let p = point(&w.point, &at, None, defects)?;
            if !p.table.is_writable() || p.data_type == DataType::Bool {
                defects.push((at.clone(), "the watchdog is a holding register".into()));
            }
            if !(20..=MS_MAX).contains(&ms) {
                defects.push((
                    "safety.watchdog_ms".into(),
                    format!("must be from 20 to {MS_MAX} ms to be fed"),
                ));
            }
            let enabled_is_bit = resources
                .values()
                .flatten()
                .any(|f| f.name == w.enabled_field && f.point.data_type == DataType::Bool);
            if !enabled_is_bit {
                defects.push((
                    format!("{at}.enabled_field"),
                    format!(
                        "`{}` is not a mapped coil or discrete input",
                        w.enabled_field
                    ),
                ));
            }
            Some(Watchdog {
                point: p,
                enabled_field: w.enabled_field.clone(),
                period: Duration::from_millis(ms),
            })
        }
    }
}
