//! The unit table and conversion between units of one dimension.
//!
//! Every unit maps to an SI base of its dimension by an affine transform
//! `base = value * scale + offset`. The offset is non-zero only for the
//! temperature scales, and conversion treats every value as an **absolute**
//! quantity: `convert(10.0, "degC", "K")` is 283.15, which is right for a
//! temperature and wrong for a temperature *difference* (a rise of 10 degC is a
//! rise of 10 K). Limits bound absolute values, so this is the conversion the
//! engine needs; a caller converting a difference must drop the offset itself.
//!
//! Spellings are exact and case-sensitive (`mm` is not `Mm`). A few aliases are
//! accepted and map to one canonical spelling, see [`canonical`]:
//! `N*m` and `Nm` for `N.m`, `deg/s` is canonical (no alias), `ratio` for `1`.

use std::fmt;

/// The physical dimension of a unit. Units convert only within one dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dimension {
    /// Length, SI base metre (`m`).
    Length,
    /// Plane angle, SI base radian (`rad`).
    Angle,
    /// Absolute temperature, SI base kelvin (`K`).
    Temperature,
    /// Time, SI base second (`s`).
    Time,
    /// Linear speed, SI base metre per second (`m/s`).
    Speed,
    /// Angular speed, SI base radian per second (`rad/s`).
    AngularSpeed,
    /// Force, SI base newton (`N`).
    Force,
    /// Torque, SI base newton metre (`N.m`).
    Torque,
    /// Pressure, SI base pascal (`Pa`).
    Pressure,
    /// Electric potential, SI base volt (`V`).
    Voltage,
    /// Electric current, SI base ampere (`A`).
    Current,
    /// Power, SI base watt (`W`).
    Power,
    /// Dimensionless ratio, base `1` (so `%` is 0.01).
    Ratio,
    /// Volume, SI base cubic metre (`m3`); lab volumes in `L`, `mL`, `uL`.
    Volume,
    /// Volumetric flow, SI base cubic metre per second (`m3/s`).
    Flow,
    /// Mass, SI base kilogram (`kg`).
    Mass,
    /// Frequency, SI base hertz (`Hz`).
    Frequency,
    /// Energy, SI base joule (`J`).
    Energy,
    /// Linear acceleration, SI base metre per second squared (`m/s2`).
    Acceleration,
    /// Angular acceleration, SI base radian per second squared (`rad/s2`).
    AngularAcceleration,
}

impl Dimension {
    /// The snake_case name of the dimension, as printed in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Dimension::Length => "length",
            Dimension::Angle => "angle",
            Dimension::Temperature => "temperature",
            Dimension::Time => "time",
            Dimension::Speed => "speed",
            Dimension::AngularSpeed => "angular_speed",
            Dimension::Force => "force",
            Dimension::Torque => "torque",
            Dimension::Pressure => "pressure",
            Dimension::Voltage => "voltage",
            Dimension::Current => "current",
            Dimension::Power => "power",
            Dimension::Ratio => "ratio",
            Dimension::Volume => "volume",
            Dimension::Flow => "flow",
            Dimension::Mass => "mass",
            Dimension::Frequency => "frequency",
            Dimension::Energy => "energy",
            Dimension::Acceleration => "acceleration",
            Dimension::AngularAcceleration => "angular_acceleration",
        }
    }
}

impl fmt::Display for Dimension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row of the unit table: `base = value * scale + offset`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UnitDef {
    /// The canonical spelling.
    pub name: &'static str,
    /// The dimension the unit measures.
    pub dimension: Dimension,
    /// Multiplier to the SI base of the dimension.
    pub scale: f64,
    /// Offset added after scaling (temperature scales only).
    pub offset: f64,
}

const fn unit(name: &'static str, dimension: Dimension, scale: f64) -> UnitDef {
    UnitDef {
        name,
        dimension,
        scale,
        offset: 0.0,
    }
}

const PI: f64 = std::f64::consts::PI;
const DEG: f64 = PI / 180.0;

/// Every unit the engine knows, canonical spellings only.
pub const UNITS: &[UnitDef] = &[
    unit("m", Dimension::Length, 1.0),
    unit("mm", Dimension::Length, 1e-3),
    unit("cm", Dimension::Length, 1e-2),
    unit("um", Dimension::Length, 1e-6),
    unit("km", Dimension::Length, 1e3),
    unit("in", Dimension::Length, 0.0254),
    unit("ft", Dimension::Length, 0.3048),
    unit("rad", Dimension::Angle, 1.0),
    unit("deg", Dimension::Angle, DEG),
    unit("mrad", Dimension::Angle, 1e-3),
    unit("rev", Dimension::Angle, 2.0 * PI),
    UnitDef {
        name: "degC",
        dimension: Dimension::Temperature,
        scale: 1.0,
        offset: 273.15,
    },
    UnitDef {
        name: "degF",
        dimension: Dimension::Temperature,
        scale: 5.0 / 9.0,
        offset: 273.15 - 32.0 * 5.0 / 9.0,
    },
    unit("K", Dimension::Temperature, 1.0),
    unit("s", Dimension::Time, 1.0),
    unit("ms", Dimension::Time, 1e-3),
    unit("us", Dimension::Time, 1e-6),
    unit("min", Dimension::Time, 60.0),
    unit("h", Dimension::Time, 3600.0),
    unit("m/s", Dimension::Speed, 1.0),
    unit("mm/s", Dimension::Speed, 1e-3),
    unit("km/h", Dimension::Speed, 1000.0 / 3600.0),
    unit("rad/s", Dimension::AngularSpeed, 1.0),
    unit("deg/s", Dimension::AngularSpeed, DEG),
    unit("rpm", Dimension::AngularSpeed, 2.0 * PI / 60.0),
    unit("N", Dimension::Force, 1.0),
    unit("kN", Dimension::Force, 1e3),
    unit("lbf", Dimension::Force, 4.448_221_615_260_5),
    unit("N.m", Dimension::Torque, 1.0),
    unit("Pa", Dimension::Pressure, 1.0),
    unit("kPa", Dimension::Pressure, 1e3),
    unit("bar", Dimension::Pressure, 1e5),
    unit("psi", Dimension::Pressure, 6_894.757_293_168_361),
    unit("V", Dimension::Voltage, 1.0),
    unit("mV", Dimension::Voltage, 1e-3),
    unit("kV", Dimension::Voltage, 1e3),
    unit("A", Dimension::Current, 1.0),
    unit("mA", Dimension::Current, 1e-3),
    unit("W", Dimension::Power, 1.0),
    unit("kW", Dimension::Power, 1e3),
    unit("mW", Dimension::Power, 1e-3),
    unit("1", Dimension::Ratio, 1.0),
    unit("%", Dimension::Ratio, 1e-2),
    unit("m3", Dimension::Volume, 1.0),
    unit("L", Dimension::Volume, 1e-3),
    unit("mL", Dimension::Volume, 1e-6),
    unit("uL", Dimension::Volume, 1e-9),
    unit("m3/s", Dimension::Flow, 1.0),
    unit("L/min", Dimension::Flow, 1e-3 / 60.0),
    unit("mL/min", Dimension::Flow, 1e-6 / 60.0),
    unit("mL/s", Dimension::Flow, 1e-6),
    unit("uL/min", Dimension::Flow, 1e-9 / 60.0),
    unit("kg", Dimension::Mass, 1.0),
    unit("g", Dimension::Mass, 1e-3),
    unit("mg", Dimension::Mass, 1e-6),
    unit("Hz", Dimension::Frequency, 1.0),
    unit("kHz", Dimension::Frequency, 1e3),
    unit("J", Dimension::Energy, 1.0),
    unit("kJ", Dimension::Energy, 1e3),
    unit("Wh", Dimension::Energy, 3600.0),
    unit("m/s2", Dimension::Acceleration, 1.0),
    unit("mm/s2", Dimension::Acceleration, 1e-3),
    unit("rad/s2", Dimension::AngularAcceleration, 1.0),
    unit("deg/s2", Dimension::AngularAcceleration, DEG),
];

/// Accepted alternative spellings and the canonical unit each stands for.
const ALIASES: &[(&str, &str)] = &[("N*m", "N.m"), ("Nm", "N.m"), ("ratio", "1")];

/// Why a conversion failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    /// The unit is not in the table.
    #[error("unknown unit '{0}'")]
    Unknown(String),
    /// The units measure different dimensions.
    #[error("cannot convert {from} ({from_dim}) to {to} ({to_dim})")]
    DimensionMismatch {
        /// Source unit.
        from: String,
        /// Its dimension.
        from_dim: Dimension,
        /// Target unit.
        to: String,
        /// Its dimension.
        to_dim: Dimension,
    },
    /// The value or the result is not a finite number.
    #[error("conversion of a non-finite value")]
    NonFinite,
}

/// The canonical spelling of `unit`, resolving aliases; `None` when unknown.
pub fn canonical(unit: &str) -> Option<&'static str> {
    if let Some(def) = lookup(unit) {
        return Some(def.name);
    }
    None
}

/// The table row of `unit` (aliases accepted).
pub fn lookup(unit: &str) -> Option<&'static UnitDef> {
    let name = ALIASES
        .iter()
        .find(|(alias, _)| *alias == unit)
        .map_or(unit, |(_, canon)| *canon);
    UNITS.iter().find(|def| def.name == name)
}

/// The dimension of `unit`, or `None` when the unit is unknown.
pub fn dimension(unit: &str) -> Option<Dimension> {
    lookup(unit).map(|def| def.dimension)
}

/// Whether `unit` is in the table (aliases count).
pub fn is_known(unit: &str) -> bool {
    lookup(unit).is_some()
}

/// Whether two spellings name the same unit: equal strings, or the same
/// canonical unit through an alias.
pub fn same_unit(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    matches!((canonical(a), canonical(b)), (Some(x), Some(y)) if x == y)
}

/// Convert an absolute `value` from unit `from` to unit `to`.
///
/// # Errors
/// [`UnitError::Unknown`] for a unit outside the table,
/// [`UnitError::DimensionMismatch`] across dimensions and
/// [`UnitError::NonFinite`] when the value or result is not finite.
pub fn convert(value: f64, from: &str, to: &str) -> Result<f64, UnitError> {
    let src = lookup(from).ok_or_else(|| UnitError::Unknown(from.to_string()))?;
    let dst = lookup(to).ok_or_else(|| UnitError::Unknown(to.to_string()))?;
    if src.dimension != dst.dimension {
        return Err(UnitError::DimensionMismatch {
            from: from.to_string(),
            from_dim: src.dimension,
            to: to.to_string(),
            to_dim: dst.dimension,
        });
    }
    if !value.is_finite() {
        return Err(UnitError::NonFinite);
    }
    if src.name == dst.name {
        // Same unit: return the value untouched so no rounding creeps in.
        return Ok(value);
    }
    let base = value * src.scale + src.offset;
    let out = (base - dst.offset) / dst.scale;
    if out.is_finite() {
        Ok(out)
    } else {
        Err(UnitError::NonFinite)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    #[test]
    fn known_conversions_match_their_definitions() {
        assert!(close(convert(1.0, "in", "mm").unwrap_or(f64::NAN), 25.4));
        assert!(close(convert(180.0, "deg", "rad").unwrap_or(f64::NAN), PI));
        assert!(close(
            convert(100.0, "degC", "degF").unwrap_or(f64::NAN),
            212.0
        ));
        assert!(close(convert(0.0, "degC", "K").unwrap_or(f64::NAN), 273.15));
        assert!(close(
            convert(60.0, "rpm", "rad/s").unwrap_or(f64::NAN),
            2.0 * PI
        ));
        assert!(close(convert(1.0, "bar", "kPa").unwrap_or(f64::NAN), 100.0));
        assert!(close(convert(50.0, "%", "1").unwrap_or(f64::NAN), 0.5));
        assert!(close(
            convert(36.0, "km/h", "m/s").unwrap_or(f64::NAN),
            10.0
        ));
    }

    #[test]
    fn conversion_across_dimensions_is_refused() {
        assert!(matches!(
            convert(1.0, "m", "s"),
            Err(UnitError::DimensionMismatch { .. })
        ));
        assert!(matches!(
            convert(1.0, "furlong", "m"),
            Err(UnitError::Unknown(_))
        ));
    }

    #[test]
    fn aliases_resolve_to_one_canonical_spelling() {
        assert_eq!(canonical("N*m"), Some("N.m"));
        assert_eq!(canonical("Nm"), Some("N.m"));
        assert!(same_unit("N*m", "N.m"));
        assert!(!same_unit("deg", "rad"));
        assert_eq!(dimension("psi"), Some(Dimension::Pressure));
        assert!(!is_known("Deg"));
    }

    #[test]
    fn table_has_no_duplicate_spellings() {
        for (i, a) in UNITS.iter().enumerate() {
            assert!(
                UNITS[i + 1..].iter().all(|b| b.name != a.name),
                "{}",
                a.name
            );
            assert!(a.scale > 0.0 && a.scale.is_finite());
        }
    }
}
