//! The register map: what a `modbus.tcp` manifest's `[driver_config]` says,
//! read into types and checked against the manifest it belongs to.
//!
//! **Owns:** the config's shape (serde, unknown keys refused), its defaults,
//! and the Modbus side of the mapping defects `tether check` reports (an
//! unknown register table or type, a read-only table written, an address
//! past the table); the defects every protocol shares are `crate::mapping`'s.
//! **Never here:** I/O, encoding of values (see `codec`), decisions.

use super::codec::{DataType, Point, Table, WordOrder};
use crate::mapping::{self, MapDefect, RawInterlock, RawWatchdog, RawWriteParts};
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
    interlocks: BTreeMap<String, RawInterlock<RawPoint>>,
    watchdog: Option<RawWatchdog<RawPoint>>,
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

/// A resolved write.
pub type Write = mapping::Write<Point>;
/// A mapped field.
pub type Field = mapping::Field<Point>;
/// A mapped interlock.
pub type Interlock = mapping::Interlock<Point>;
/// The mapped watchdog.
pub type Watchdog = mapping::Watchdog<Point>;
pub use mapping::Source;

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

impl Map {
    /// Reads and checks a manifest's map. Every defect is reported, not just
    /// the first.
    ///
    /// # Errors
    /// Every defect found.
    pub fn of(manifest: &DeviceManifest) -> Result<Map, Vec<MapDefect>> {
        mapping::load(manifest, resolve)
    }

    /// [`Map::of`] with its defects joined one after another, and the
    /// device's socket address: what building a driver or a probe needs.
    ///
    /// # Errors
    /// Every defect, joined.
    pub fn load(manifest: &DeviceManifest) -> Result<(Map, std::net::SocketAddr), String> {
        let map = Map::of(manifest).map_err(|d| mapping::joined(&d))?;
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
        mapping::polled(&self.resources, &self.interlocks, Point::same_registers)
    }
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
    let ms = mapping::ms;
    let request_timeout = ms(
        raw.request_timeout_ms,
        REQUEST_TIMEOUT_MS_DEFAULT,
        "request_timeout_ms",
        defects,
    );
    let (poll, stale) = mapping::poll_and_stale(
        ms(raw.poll_ms, POLL_MS_DEFAULT, "poll_ms", defects),
        ms(raw.stale_ms, STALE_MS_DEFAULT, "stale_ms", defects),
        defects,
    );
    let resources = mapping::resolve_fields(&raw.fields, m, defects);
    let targets = mapping::resolve_targets(&raw.targets, m, &resources, defects, write);
    let stop = mapping::resolve_stop(&raw.stop, m, &resources, defects, write);
    let interlocks = mapping::resolve_interlocks(&raw.interlocks, m, defects);
    let watchdog = mapping::resolve_watchdog(raw.watchdog.as_ref(), m, &resources, defects);
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

fn write(w: &RawWrite, at: &str, fields: &[Field], defects: &mut Vec<MapDefect>) -> Option<Write> {
    let parts = RawWriteParts {
        field: w.field.as_deref(),
        point: w.point.as_ref(),
        input: w.input.as_deref(),
        value: w.value.as_ref(),
    };
    mapping::resolve_write(parts, at, fields, defects)
}

impl mapping::Point for Point {
    type Raw = RawPoint;
    type Native = super::codec::Native;
    const BOOL_HINT: &'static str = "a coil or a discrete input";
    const NUMBER_HINT: &'static str = "holding or input register";
    const KIND_KEY: &'static str = "table";

    fn resolve(
        raw: &RawPoint,
        at: &str,
        field_unit: Option<&str>,
        defects: &mut Vec<MapDefect>,
    ) -> Option<Self> {
        point(raw, at, field_unit, defects)
    }
    fn raw_unit(raw: &RawPoint) -> Option<&str> {
        raw.unit.as_deref()
    }
    fn encode(&self, v: &Value) -> Result<Self::Native, String> {
        Point::encode(self, v)
    }
    fn decode(&self, n: &Self::Native) -> Result<Value, String> {
        Point::decode(self, n)
    }
    fn label(&self) -> String {
        Point::label(self)
    }
    fn type_name(&self) -> String {
        format!("`{}` at scale {}", self.data_type.as_str(), self.scale)
    }
    fn is_bool(&self) -> bool {
        self.data_type == DataType::Bool
    }
    fn read_only(&self) -> Option<String> {
        (!self.table.is_writable())
            .then(|| format!("`{}` is a read-only table", self.table.as_str()))
    }
    fn field_unit(&self) -> Option<&str> {
        self.field_unit.as_deref()
    }
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
    mapping::check_unit(rp.unit.as_deref(), field_unit, at, defects);
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
