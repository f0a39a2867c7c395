//! What every point-mapped driver's `[driver_config]` shares: state fields
//! mapped to native points, targets as ordered steps, the native stop,
//! interlocks with the reading that means closed, and the watchdog.
//!
//! **Owns:** the checks that do not depend on the protocol (a state field
//! without a point, a target no binding names or a binding without a target,
//! a target with no steps, an interlock without a closed value, a stop that
//! takes an input, a watchdog without `safety.watchdog_ms`, a type that
//! cannot hold a field's bounds, a unit the field does not use), each
//! reported with its path under `driver_config`.
//! **Never here:** a protocol's points themselves (see [`Point`]'s
//! implementations in `modbus::codec` and `opcua::node`), I/O.
//! **Used by:** `modbus::map`, `opcua::config`.

use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;
use tether_core::manifest::{BindingDecl, DeviceManifest};

/// A mapping defect: where (a path under `driver_config`) and what.
pub type MapDefect = (String, String);

/// Bounds on every period and timeout of a map (ms): below 5 ms a loopback
/// peer could not answer; above a minute a fault would hide.
pub const MS_MIN: u64 = 5;
/// See [`MS_MIN`].
pub const MS_MAX: u64 = 60_000;

/// A native point of some protocol: how a field's value is written and
/// read there.
pub trait Point: Clone + std::fmt::Debug + Sized {
    /// The point as written in the config.
    type Raw: Clone + std::fmt::Debug;
    /// A native reading or a value to write.
    type Native: Clone + PartialEq + std::fmt::Debug;
    /// What a boolean field maps to (in defect messages).
    const BOOL_HINT: &'static str;
    /// What a numeric field maps to (in defect messages).
    const NUMBER_HINT: &'static str;
    /// The key of a raw point a kind mismatch is reported at (`table`).
    const KIND_KEY: &'static str;

    /// Reads a raw point; `field_unit` is the field's declared unit.
    fn resolve(
        raw: &Self::Raw,
        at: &str,
        field_unit: Option<&str>,
        defects: &mut Vec<MapDefect>,
    ) -> Option<Self>;
    /// The native unit a raw point names, if any.
    fn raw_unit(raw: &Self::Raw) -> Option<&str>;
    /// A field value (declared unit) as the native value.
    ///
    /// # Errors
    /// A value the native type cannot hold exactly.
    fn encode(&self, v: &Value) -> Result<Self::Native, String>;
    /// A native reading as the field's value, in its declared unit.
    ///
    /// # Errors
    /// A reading of the wrong shape or a non-finite result.
    fn decode(&self, n: &Self::Native) -> Result<Value, String>;
    /// How receipts, probes and defects name it.
    fn label(&self) -> String;
    /// Its type as defects name it (`i16 at scale 0.1`).
    fn type_name(&self) -> String;
    /// Whether it holds a boolean.
    fn is_bool(&self) -> bool;
    /// Why a client may not write it, when the map already knows.
    fn read_only(&self) -> Option<String>;
    /// The declared unit of the field it maps.
    fn field_unit(&self) -> Option<&str>;
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
pub struct Write<P> {
    /// What is written to.
    pub point: P,
    /// What is written.
    pub source: Source,
    /// How the write is named in receipts.
    pub label: String,
}

/// A mapped field of a resource.
#[derive(Debug, Clone)]
pub struct Field<P> {
    /// The state field's name.
    pub name: String,
    /// The native point.
    pub point: P,
}

/// A mapped interlock.
#[derive(Debug, Clone)]
pub struct Interlock<P> {
    /// The manifest's interlock id.
    pub id: String,
    /// The native point.
    pub point: P,
    /// The reading that means closed.
    pub closed: Value,
}

/// The mapped watchdog.
#[derive(Debug, Clone)]
pub struct Watchdog<P> {
    /// The point fed.
    pub point: P,
    /// The field reading the device's enabled state.
    pub enabled_field: String,
    /// `safety.watchdog_ms`.
    pub period: Duration,
}

/// An interlock as written: a point and the reading that means closed.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawInterlock<R> {
    /// The point.
    #[serde(flatten)]
    pub point: R,
    /// The reading that means closed.
    pub closed: Option<Value>,
}

/// The watchdog as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWatchdog<R> {
    /// The point fed.
    #[serde(flatten)]
    pub point: R,
    /// The boolean field that reads the device's own enabled state.
    pub enabled_field: String,
}

/// The parts of a write step as written: exactly one of `field` or `point`,
/// exactly one of `input` or `value`.
#[derive(Debug, Clone, Copy)]
pub struct RawWriteParts<'a, R> {
    /// A mapped field of the resource.
    pub field: Option<&'a str>,
    /// A point not in the state, written inline.
    pub point: Option<&'a R>,
    /// The input field whose value is written.
    pub input: Option<&'a str>,
    /// A constant, in the field's declared unit.
    pub value: Option<&'a Value>,
}

/// What the generic target checks need to know of a protocol's step.
pub trait Step {
    /// The inputs it writes, each with the unit of the field it goes to.
    fn inputs(&self) -> Vec<(&str, Option<&str>)>;
}

impl<P: Point> Step for Write<P> {
    fn inputs(&self) -> Vec<(&str, Option<&str>)> {
        match &self.source {
            Source::Input(name) => vec![(name.as_str(), self.point.field_unit())],
            Source::Constant(_) => Vec::new(),
        }
    }
}

/// Reads a manifest's `[driver_config]` as `R` (unknown keys refused by
/// `R`) and resolves it with `resolve`; every defect at once.
///
/// # Errors
/// The config's shape, or every defect `resolve` found.
pub fn load<R: serde::de::DeserializeOwned, M>(
    manifest: &DeviceManifest,
    resolve: impl FnOnce(&R, &DeviceManifest, &mut Vec<MapDefect>) -> M,
) -> Result<M, Vec<MapDefect>> {
    let cfg = manifest.driver_config.clone().unwrap_or(Value::Null);
    let raw: R = serde_json::from_value(cfg)
        .map_err(|e| vec![("driver_config".to_owned(), e.to_string())])?;
    let mut defects = Vec::new();
    let map = resolve(&raw, manifest, &mut defects);
    if defects.is_empty() {
        Ok(map)
    } else {
        Err(defects)
    }
}

/// Every distinct point the mirror polls: the fields', then the
/// interlocks' (`same` says when two read the same thing).
pub fn polled<P: Point>(
    resources: &BTreeMap<String, Vec<Field<P>>>,
    interlocks: &[Interlock<P>],
    same: impl Fn(&P, &P) -> bool,
) -> Vec<P> {
    let mut out: Vec<P> = Vec::new();
    let all = resources
        .values()
        .flatten()
        .map(|f| &f.point)
        .chain(interlocks.iter().map(|i| &i.point));
    for p in all {
        if !out.iter().any(|q| same(q, p)) {
            out.push(p.clone());
        }
    }
    out
}

/// A period or timeout of the config, checked against the bounds.
pub fn ms(v: Option<u64>, default: u64, key: &str, defects: &mut Vec<MapDefect>) -> Duration {
    let ms = v.unwrap_or(default);
    if !(MS_MIN..=MS_MAX).contains(&ms) {
        defects.push((
            format!("driver_config.{key}"),
            format!("must be from {MS_MIN} to {MS_MAX} ms"),
        ));
    }
    Duration::from_millis(ms.clamp(MS_MIN, MS_MAX))
}

/// The mirror's poll period and freshness bound, checked together.
pub fn poll_and_stale(
    poll: Duration,
    stale: Duration,
    defects: &mut Vec<MapDefect>,
) -> (Duration, Duration) {
    if stale <= poll {
        defects.push((
            "driver_config.stale_ms".into(),
            "must be longer than poll_ms (else every reading is stale when read)".into(),
        ));
    }
    (poll, stale)
}

/// The declared unit (`x-mhs-unit`) of a state field, if any.
pub fn field_unit(schema: &Value, field: &str) -> Option<String> {
    schema
        .pointer(&format!("/properties/{field}/x-mhs-unit"))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// Maps every state field of every resource; every field must be mapped.
pub fn resolve_fields<P: Point>(
    raw: &BTreeMap<String, BTreeMap<String, P::Raw>>,
    m: &DeviceManifest,
    defects: &mut Vec<MapDefect>,
) -> BTreeMap<String, Vec<Field<P>>> {
    let mut out = BTreeMap::new();
    for (rid, fields) in raw {
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
            if let Some(point) = P::resolve(rp, &at, unit.as_deref(), defects) {
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
    require_every_field_mapped(m, &out, defects);
    out
}

fn require_every_field_mapped<P>(
    m: &DeviceManifest,
    out: &BTreeMap<String, Vec<Field<P>>>,
    defects: &mut Vec<MapDefect>,
) {
    for res in &m.resources {
        let props = res
            .state_schema
            .get("properties")
            .and_then(Value::as_object);
        for name in props.into_iter().flat_map(|p| p.keys()) {
            let mapped = out
                .get(&res.id)
                .is_some_and(|f| f.iter().any(|x| &x.name == name));
            if !mapped {
                defects.push((
                    format!("driver_config.fields.{}.{name}", res.id),
                    "state field has no native point: map it (every field is read from the device)"
                        .into(),
                ));
            }
        }
    }
}

/// A native unit must convert to the field's declared one.
pub fn check_unit(
    native: Option<&str>,
    field: Option<&str>,
    at: &str,
    defects: &mut Vec<MapDefect>,
) {
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
    if let Err(e) = tether_limits::units::convert(1.0, native, field) {
        defects.push((
            format!("{at}.unit"),
            format!("`{native}` is not a unit the field uses (`{field}`): {e}"),
        ));
    }
}

/// A numeric field's declared bounds (schema minimum/maximum) must be
/// representable in the point's type after scaling.
fn check_bounds_fit<P: Point>(p: &P, prop: &Value, at: &str, defects: &mut Vec<MapDefect>) {
    if p.is_bool() {
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
                    "{} cannot hold the field's {key} {bound}: {e}",
                    p.type_name()
                ),
            ));
        }
    }
}

/// A boolean state field needs a boolean point and a numeric one a numeric
/// point: the driver never guesses a truth value.
fn check_kind_fits<P: Point>(p: &P, prop: &Value, at: &str, defects: &mut Vec<MapDefect>) {
    let ty = prop.get("type").and_then(Value::as_str);
    match ty {
        Some("boolean") if !p.is_bool() => defects.push((
            format!("{at}.{}", P::KIND_KEY),
            format!("a boolean field maps to {}", P::BOOL_HINT),
        )),
        Some("number" | "integer") if p.is_bool() => defects.push((
            format!("{at}.{}", P::KIND_KEY),
            format!("a numeric field maps to {}", P::NUMBER_HINT),
        )),
        _ => {}
    }
}

/// Resolves one write step: its point (a mapped field or an inline point)
/// and where its value comes from.
pub fn resolve_write<P: Point>(
    w: RawWriteParts<'_, P::Raw>,
    at: &str,
    fields: &[Field<P>],
    defects: &mut Vec<MapDefect>,
) -> Option<Write<P>> {
    let point = match (w.field, w.point) {
        (Some(f), None) => match fields.iter().find(|x| x.name == f) {
            Some(x) => Some(x.point.clone()),
            None => {
                defects.push((
                    format!("{at}.field"),
                    format!("`{f}` is not a mapped field of the resource"),
                ));
                None
            }
        },
        (None, Some(rp)) => P::resolve(rp, &format!("{at}.point"), P::raw_unit(rp), defects),
        _ => {
            defects.push((
                at.to_owned(),
                "a write names exactly one of `field` or `point`".into(),
            ));
            None
        }
    }?;
    if let Some(why) = point.read_only() {
        defects.push((at.to_owned(), why));
        return None;
    }
    let source = write_source(&point, w.input, w.value, at, defects)?;
    Some(Write {
        label: point.label(),
        point,
        source,
    })
}

/// Where a written value comes from: exactly one of an input or a constant
/// the point can hold.
pub fn write_source<P: Point>(
    point: &P,
    input: Option<&str>,
    value: Option<&Value>,
    at: &str,
    defects: &mut Vec<MapDefect>,
) -> Option<Source> {
    match (input, value) {
        (Some(i), None) => Some(Source::Input(i.to_owned())),
        (None, Some(v)) => {
            if let Err(e) = point.encode(v) {
                defects.push((
                    format!("{at}.value"),
                    format!("the constant cannot be written: {e}"),
                ));
                return None;
            }
            Some(Source::Constant(v.clone()))
        }
        _ => {
            defects.push((
                at.to_owned(),
                "a write takes exactly one of `input` or `value`".into(),
            ));
            None
        }
    }
}

/// Every effectful binding's target, resolved step by step with `step`
/// (raw step, its path, the binding's resource fields); targets no binding
/// names are defects too.
pub fn resolve_targets<P: Point, R, S: Step>(
    raw: &BTreeMap<String, Vec<R>>,
    m: &DeviceManifest,
    resources: &BTreeMap<String, Vec<Field<P>>>,
    defects: &mut Vec<MapDefect>,
    mut step: impl FnMut(&R, &str, &[Field<P>], &mut Vec<MapDefect>) -> Option<S>,
) -> BTreeMap<String, Vec<S>> {
    let mut out = BTreeMap::new();
    for (i, b) in m.bindings.iter().enumerate() {
        let is_read = b.capability_id == tether_core::catalogue::STATE_READ;
        let target = b.target.clone().unwrap_or_else(|| b.capability_id.clone());
        if is_read || out.contains_key(&target) {
            continue;
        }
        let at = format!("driver_config.targets.{target}");
        if b.kind == Some(tether_core::manifest::CommandKind::Leased) {
            // A register or node map has no lease to renew or completion to
            // read: a "leased" command here would run unleased, and that
            // is refused rather than pretended.
            defects.push((
                format!("bindings[{i}].kind"),
                format!(
                    "`{}` maps no lease (a point to renew and a reading that says the command ended), so a `leased` binding cannot run here: declare `time_bounded` with `max_duration_ms` (the device's own watchdog stops it if Tether dies)",
                    m.driver
                ),
            ));
        }
        let Some(steps) = raw.get(&target) else {
            defects.push((
                at,
                format!(
                    "binding {i} (`{}`) has no writes for its target",
                    b.capability_id
                ),
            ));
            continue;
        };
        if steps.is_empty() {
            defects.push((at, "a target with no writes does nothing".into()));
            continue;
        }
        let fields = resources.get(&b.resource).map_or(&[][..], Vec::as_slice);
        let resolved: Vec<S> = steps
            .iter()
            .enumerate()
            .filter_map(|(k, w)| step(w, &format!("{at}[{k}]"), fields, defects))
            .collect();
        check_input_units(b, &resolved, &at, defects);
        out.insert(target, resolved);
    }
    for t in raw.keys() {
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
fn check_input_units<S: Step>(
    b: &BindingDecl,
    steps: &[S],
    at: &str,
    defects: &mut Vec<MapDefect>,
) {
    for (name, unit) in steps.iter().flat_map(Step::inputs) {
        let declared = b
            .limits
            .get(name)
            .and_then(|l| l.get("unit"))
            .and_then(Value::as_str);
        if let (Some(d), Some(f)) = (declared, unit) {
            if !tether_limits::units::same_unit(d, f) {
                defects.push((
                    at.to_owned(),
                    format!("input `{name}` is limited in `{d}` but written to a field in `{f}`"),
                ));
            }
        }
    }
}

/// The native stop's steps: required when the device declares a native
/// stop; constants only (a stop has no input).
pub fn resolve_stop<P: Point, R, S: Step>(
    raw: &[R],
    m: &DeviceManifest,
    resources: &BTreeMap<String, Vec<Field<P>>>,
    defects: &mut Vec<MapDefect>,
    mut step: impl FnMut(&R, &str, &[Field<P>], &mut Vec<MapDefect>) -> Option<S>,
) -> Vec<S> {
    let native = m.safety.estop.native.unwrap_or(true);
    if native && raw.is_empty() {
        defects.push((
            "driver_config.stop".into(),
            "the device declares a native stop (safety.estop.native) but the map has no stop writes".into(),
        ));
    }
    let fields: Vec<Field<P>> = resources.values().flatten().cloned().collect();
    raw.iter()
        .enumerate()
        .filter_map(|(k, w)| {
            let at = format!("driver_config.stop[{k}]");
            let r = step(w, &at, &fields, defects)?;
            if !r.inputs().is_empty() {
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

/// Every declared interlock needs a native input and its closed value; a
/// mapped interlock the manifest does not declare is a defect.
pub fn resolve_interlocks<P: Point>(
    raw: &BTreeMap<String, RawInterlock<P::Raw>>,
    m: &DeviceManifest,
    defects: &mut Vec<MapDefect>,
) -> Vec<Interlock<P>> {
    let mut out = Vec::new();
    for il in &m.interlocks {
        let at = format!("driver_config.interlocks.{}", il.id);
        let Some(ri) = raw.get(&il.id) else {
            defects.push((
                at,
                "the manifest declares this interlock but the map gives no native input for it"
                    .into(),
            ));
            continue;
        };
        let Some(p) = P::resolve(&ri.point, &at, P::raw_unit(&ri.point), defects) else {
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
    for id in raw.keys() {
        if !m.interlocks.iter().any(|i| &i.id == id) {
            defects.push((
                format!("driver_config.interlocks.{id}"),
                "the manifest declares no such interlock".into(),
            ));
        }
    }
    out
}

/// The watchdog: mapped exactly when `safety.watchdog_ms` is declared, on a
/// writable numeric point, with a mapped boolean enabled field.
pub fn resolve_watchdog<P: Point>(
    raw: Option<&RawWatchdog<P::Raw>>,
    m: &DeviceManifest,
    resources: &BTreeMap<String, Vec<Field<P>>>,
    defects: &mut Vec<MapDefect>,
) -> Option<Watchdog<P>> {
    let at = "driver_config.watchdog".to_owned();
    let (w, ms) = match (raw, m.safety.watchdog_ms) {
        (None, None) => return None,
        (Some(_), None) => {
            defects.push((
                at,
                "a watchdog is mapped but safety.watchdog_ms is not declared".into(),
            ));
            return None;
        }
        (None, Some(_)) => {
            defects.push((
                at,
                "safety.watchdog_ms is declared: map the watchdog point it feeds".into(),
            ));
            return None;
        }
        (Some(w), Some(ms)) => (w, ms),
    };
    let p = P::resolve(&w.point, &at, None, defects)?;
    if p.read_only().is_some() || p.is_bool() {
        defects.push((
            at.clone(),
            format!(
                "the watchdog is fed by writing numbers: `{}` is not a writable numeric point",
                p.label()
            ),
        ));
    }
    if !(20..=MS_MAX).contains(&ms) {
        defects.push((
            "safety.watchdog_ms".into(),
            format!("must be from 20 to {MS_MAX} ms to be fed"),
        ));
    }
    let enabled_is_bool = resources
        .values()
        .flatten()
        .any(|f| f.name == w.enabled_field && f.point.is_bool());
    if !enabled_is_bool {
        defects.push((
            format!("{at}.enabled_field"),
            format!(
                "`{}` is not a mapped field read from {}",
                w.enabled_field,
                P::BOOL_HINT
            ),
        ));
    }
    Some(Watchdog {
        point: p,
        enabled_field: w.enabled_field.clone(),
        period: Duration::from_millis(ms),
    })
}

/// Joins defects one a line-part, for errors that are one string.
pub fn joined(defects: &[MapDefect]) -> String {
    defects
        .iter()
        .map(|(at, msg)| format!("{at}: {msg}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The capability output: the input as applied (the class's own shape:
/// `{applied, revision}` for configure, the input's fields otherwise) and the
/// writes made, each with its point, value and raw native value.
pub fn call_output(capability_id: &str, input: &Value, writes: Value) -> Value {
    let mut out = if capability_id == tether_core::catalogue::CONFIGURE {
        serde_json::json!({"applied": input, "revision": 0})
    } else {
        match input {
            Value::Object(m) => Value::Object(m.clone()),
            _ => serde_json::json!({}),
        }
    };
    out["writes"] = writes;
    out
}
