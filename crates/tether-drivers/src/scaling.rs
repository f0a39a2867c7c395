//! A field's value and a device's raw number, at the driver boundary: unit
//! conversion (declared `x-mhs-unit` ↔ the device's own), offset and scale,
//! and the exactness rule: a value the native type cannot hold *exactly* at
//! the declared scale is refused, never rounded or clamped.
//!
//! **Owns:** the arithmetic every protocol codec shares.
//! **Never here:** a protocol's types or encodings (`modbus::codec`,
//! `opcua::node`).

/// Tolerance on "this raw value is an integer": floating-point noise of a
/// decimal scale (0.3 / 0.1 = 2.9999999999999996), far below a count.
const INTEGRAL_EPS: f64 = 1e-9;

/// How a field's value maps to a raw native number:
/// `native = raw * scale + offset`, `native` in the device's unit.
#[derive(Debug, Clone, Copy)]
pub struct Scaling<'a> {
    /// See the type's doc.
    pub scale: f64,
    /// See the type's doc.
    pub offset: f64,
    /// The device's unit.
    pub native_unit: Option<&'a str>,
    /// The field's declared unit.
    pub field_unit: Option<&'a str>,
}

impl Scaling<'_> {
    /// Whether raw and field values are the same number.
    pub fn is_identity(&self) -> bool {
        self.scale == 1.0 && self.offset == 0.0 && !self.converts()
    }

    fn converts(&self) -> bool {
        matches!((self.field_unit, self.native_unit), (Some(f), Some(n)) if f != n)
    }

    /// `1 / scale` when it is an integer (0.1 → 10): dividing by it keeps
    /// decimal scales exact (215 / 10 is 21.5; 215 * 0.1 is not).
    fn divisor(&self) -> Option<f64> {
        let inv = 1.0 / self.scale;
        (self.scale.abs() < 1.0 && (inv - inv.round()).abs() < INTEGRAL_EPS).then(|| inv.round())
    }

    /// A field value as the raw number (not yet checked against a type).
    ///
    /// # Errors
    /// A unit that does not convert, or a result that is not finite.
    pub fn raw_of(&self, x: f64, label: &str) -> Result<f64, String> {
        let native = match (self.field_unit, self.native_unit) {
            (Some(f), Some(n)) if f != n => {
                tether_limits::units::convert(x, f, n).map_err(|e| e.to_string())?
            }
            _ => x,
        } - self.offset;
        let raw = match self.divisor() {
            Some(k) => native * k,
            None => native / self.scale,
        };
        if raw.is_finite() {
            Ok(raw)
        } else {
            Err(format!("{x} is out of range for {label}"))
        }
    }

    /// A raw number as the field's value.
    ///
    /// # Errors
    /// A unit that does not convert, or a result that is not finite.
    pub fn field_of(&self, raw: f64, label: &str) -> Result<f64, String> {
        let native = match self.divisor() {
            Some(k) => raw / k,
            None => raw * self.scale,
        } + self.offset;
        let v = match (self.field_unit, self.native_unit) {
            (Some(f), Some(n)) if f != n => {
                tether_limits::units::convert(native, n, f).map_err(|e| e.to_string())?
            }
            _ => native,
        };
        if v.is_finite() {
            Ok(v)
        } else {
            Err(format!("{label}: the reading is not a finite number"))
        }
    }

    /// `raw` as a whole number of counts within `lo..=hi`; `x` is the field
    /// value it came from, for the message.
    ///
    /// # Errors
    /// Off the scale's grid, or outside the type's range.
    pub fn counts(
        &self,
        x: f64,
        raw: f64,
        (lo, hi): (f64, f64),
        type_name: &str,
    ) -> Result<f64, String> {
        let rounded = raw.round();
        if (raw - rounded).abs() > INTEGRAL_EPS * rounded.abs().max(1.0) {
            return Err(format!(
                "{x} is not a whole number of counts at scale {} (declare the resolution, e.g. multipleOf)",
                self.scale
            ));
        }
        if rounded < lo || rounded > hi {
            return Err(format!(
                "{x} is {rounded} counts, outside {type_name} ({lo}..={hi})"
            ));
        }
        Ok(rounded)
    }
}
