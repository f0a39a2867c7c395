//! Values to and from Modbus words and bits, at the driver boundary.
//!
//! **Owns:** tables, data types, word order, scale and offset, and the unit
//! conversion between a field's declared unit (`x-mhs-unit`) and the
//! device's native one. A value the native type cannot hold *exactly* at the
//! declared scale is refused, never rounded or clamped.
//! **Never here:** I/O, the register map's checks (see `map`).

use crate::scaling::Scaling;
use serde_json::Value;

/// A Modbus table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Table {
    /// Holding registers (read/write words).
    Holding,
    /// Input registers (read-only words).
    Input,
    /// Coils (read/write bits).
    Coil,
    /// Discrete inputs (read-only bits).
    Discrete,
}

impl Table {
    /// Reads a table name.
    pub fn parse(s: &str) -> Option<Table> {
        match s {
            "holding" => Some(Table::Holding),
            "input" => Some(Table::Input),
            "coil" => Some(Table::Coil),
            "discrete" => Some(Table::Discrete),
            _ => None,
        }
    }
    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Table::Holding => "holding",
            Table::Input => "input",
            Table::Coil => "coil",
            Table::Discrete => "discrete",
        }
    }
    /// Whether it holds bits.
    pub fn is_bits(self) -> bool {
        matches!(self, Table::Coil | Table::Discrete)
    }
    /// Whether a client may write it.
    pub fn is_writable(self) -> bool {
        matches!(self, Table::Holding | Table::Coil)
    }
}

/// A native data type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataType {
    /// One bit.
    Bool,
    /// Unsigned 16-bit.
    U16,
    /// Signed 16-bit, two's complement.
    I16,
    /// Unsigned 32-bit over two registers.
    U32,
    /// Signed 32-bit over two registers.
    I32,
    /// IEEE 754 single over two registers.
    F32,
}

impl DataType {
    /// Reads a type name.
    pub fn parse(s: &str) -> Option<DataType> {
        match s {
            "bool" => Some(DataType::Bool),
            "u16" => Some(DataType::U16),
            "i16" => Some(DataType::I16),
            "u32" => Some(DataType::U32),
            "i32" => Some(DataType::I32),
            "f32" => Some(DataType::F32),
            _ => None,
        }
    }
    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            DataType::Bool => "bool",
            DataType::U16 => "u16",
            DataType::I16 => "i16",
            DataType::U32 => "u32",
            DataType::I32 => "i32",
            DataType::F32 => "f32",
        }
    }
    /// Registers (or bits) it spans.
    pub fn words(self) -> u16 {
        match self {
            DataType::Bool | DataType::U16 | DataType::I16 => 1,
            DataType::U32 | DataType::I32 | DataType::F32 => 2,
        }
    }
    /// The integer range, for integer types.
    fn range(self) -> Option<(f64, f64)> {
        match self {
            DataType::U16 => Some((0.0, f64::from(u16::MAX))),
            DataType::I16 => Some((f64::from(i16::MIN), f64::from(i16::MAX))),
            DataType::U32 => Some((0.0, f64::from(u32::MAX))),
            DataType::I32 => Some((f64::from(i32::MIN), f64::from(i32::MAX))),
            DataType::Bool | DataType::F32 => None,
        }
    }
}

/// Which register of a 32-bit value comes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WordOrder {
    /// The high word at the lower address (Modbus's own byte order, most
    /// devices).
    HighFirst,
    /// The low word at the lower address ("word swapped").
    LowFirst,
}

impl WordOrder {
    /// Reads a word order name.
    pub fn parse(s: &str) -> Option<WordOrder> {
        match s {
            "high_first" => Some(WordOrder::HighFirst),
            "low_first" => Some(WordOrder::LowFirst),
            _ => None,
        }
    }
}

/// A native reading or a value to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Native {
    /// A coil or discrete input.
    Bit(bool),
    /// One or two registers, in address order.
    Words(Vec<u16>),
}

impl Native {
    /// The raw value as JSON: a bit, or the registers.
    pub fn to_json(&self) -> Value {
        match self {
            Native::Bit(b) => Value::Bool(*b),
            Native::Words(w) => Value::from(w.clone()),
        }
    }
}

/// One native point and how its value maps to a field.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// Table.
    pub table: Table,
    /// First address.
    pub address: u16,
    /// Type.
    pub data_type: DataType,
    /// Word order of 32-bit types.
    pub word_order: WordOrder,
    /// `native = raw * scale + offset`.
    pub scale: f64,
    /// See `scale`.
    pub offset: f64,
    /// The device's unit of `native`.
    pub native_unit: Option<String>,
    /// The field's declared unit.
    pub field_unit: Option<String>,
}

impl Point {
    /// `holding:0`, as receipts and probes name it.
    pub fn label(&self) -> String {
        format!("{}:{}", self.table.as_str(), self.address)
    }

    /// Whether two points read the same registers the same way.
    pub fn same_registers(&self, other: &Point) -> bool {
        self.table == other.table
            && self.address == other.address
            && self.data_type.words() == other.data_type.words()
    }

    fn scaling(&self) -> Scaling<'_> {
        Scaling {
            scale: self.scale,
            offset: self.offset,
            native_unit: self.native_unit.as_deref(),
            field_unit: self.field_unit.as_deref(),
        }
    }

    /// A field value (declared unit) as the native words or bit.
    ///
    /// # Errors
    /// The wrong JSON type, a non-finite number, a value off the scale's grid
    /// or outside the type's range.
    pub fn encode(&self, v: &Value) -> Result<Native, String> {
        if self.data_type == DataType::Bool {
            return v
                .as_bool()
                .map(Native::Bit)
                .ok_or_else(|| format!("{} takes true or false", self.label()));
        }
        let x = v
            .as_f64()
            .filter(|x| x.is_finite())
            .ok_or_else(|| format!("{} takes a finite number", self.label()))?;
        let raw = self.scaling().raw_of(x, &self.label())?;
        self.raw_to_words(x, raw).map(Native::Words)
    }

    fn raw_to_words(&self, x: f64, raw: f64) -> Result<Vec<u16>, String> {
        if self.data_type == DataType::F32 {
            if raw.abs() > f64::from(f32::MAX) {
                return Err(format!("{x} is out of range for f32"));
            }
            // f32 keeps about seven digits: the nearest single is what the
            // type holds; that is the type's own resolution, not a rounding
            // the driver adds.
            #[allow(clippy::cast_possible_truncation)]
            let bits = (raw as f32).to_bits();
            return Ok(self.order([(bits >> 16) as u16, (bits & 0xFFFF) as u16]));
        }
        let range = self.data_type.range().unwrap_or((0.0, 0.0));
        let rounded = self
            .scaling()
            .counts(x, raw, range, self.data_type.as_str())?;
        // In range and integral: the casts below are exact.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let words = match self.data_type {
            DataType::U16 => vec![rounded as u16],
            DataType::I16 => vec![(rounded as i16) as u16],
            DataType::U32 => {
                let v = rounded as u32;
                self.order([(v >> 16) as u16, (v & 0xFFFF) as u16])
            }
            DataType::I32 => {
                let v = (rounded as i32) as u32;
                self.order([(v >> 16) as u16, (v & 0xFFFF) as u16])
            }
            DataType::Bool | DataType::F32 => Vec::new(),
        };
        Ok(words)
    }

    fn order(&self, [hi, lo]: [u16; 2]) -> Vec<u16> {
        match self.word_order {
            WordOrder::HighFirst => vec![hi, lo],
            WordOrder::LowFirst => vec![lo, hi],
        }
    }

    fn unorder(&self, w: &[u16]) -> Option<u32> {
        let (hi, lo) = match (self.word_order, w) {
            (WordOrder::HighFirst, [hi, lo]) => (*hi, *lo),
            (WordOrder::LowFirst, [lo, hi]) => (*hi, *lo),
            _ => return None,
        };
        Some((u32::from(hi) << 16) | u32::from(lo))
    }

    /// A native reading as the field's value, in its declared unit.
    ///
    /// # Errors
    /// A reading of the wrong shape, or a non-finite result.
    pub fn decode(&self, n: &Native) -> Result<Value, String> {
        let words = match (self.data_type, n) {
            (DataType::Bool, Native::Bit(b)) => return Ok(Value::Bool(*b)),
            (DataType::Bool, Native::Words(_)) | (_, Native::Bit(_)) => {
                return Err(format!("{}: a reading of the wrong kind", self.label()))
            }
            (_, Native::Words(w)) => w,
        };
        let raw: f64 = match (self.data_type, words.as_slice()) {
            (DataType::U16, [w]) => f64::from(*w),
            #[allow(clippy::cast_possible_wrap)]
            (DataType::I16, [w]) => f64::from(*w as i16),
            (DataType::U32, w) => f64::from(self.unorder(w).ok_or("short reading")?),
            #[allow(clippy::cast_possible_wrap)]
            (DataType::I32, w) => f64::from(self.unorder(w).ok_or("short reading")? as i32),
            (DataType::F32, w) => {
                f64::from(f32::from_bits(self.unorder(w).ok_or("short reading")?))
            }
            _ => return Err(format!("{}: a reading of the wrong length", self.label())),
        };
        let v = self.scaling().field_of(raw, &self.label())?;
        // Integral values of integer types read as JSON integers.
        if self.scale == 1.0
            && self.offset == 0.0
            && self.data_type != DataType::F32
            && v.fract() == 0.0
        {
            #[allow(clippy::cast_possible_truncation)]
            return Ok(Value::from(v as i64));
        }
        Ok(Value::from(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn reg(dt: DataType, scale: f64) -> Point {
        Point {
            table: Table::Holding,
            address: 0,
            data_type: dt,
            word_order: WordOrder::HighFirst,
            scale,
            offset: 0.0,
            native_unit: Some("degC".into()),
            field_unit: Some("degC".into()),
        }
    }

    #[test]
    fn decimal_scales_are_exact_both_ways() {
        let p = reg(DataType::I16, 0.1);
        assert_eq!(p.encode(&json!(21.5)), Ok(Native::Words(vec![215])));
        assert_eq!(p.encode(&json!(0.3)), Ok(Native::Words(vec![3])));
        assert_eq!(p.encode(&json!(-5.0)), Ok(Native::Words(vec![0xFFCE])));
        assert_eq!(p.decode(&Native::Words(vec![215])), Ok(json!(21.5)));
        assert_eq!(p.decode(&Native::Words(vec![0xFFCE])), Ok(json!(-5.0)));
    }

    #[test]
    fn off_grid_and_out_of_range_values_are_refused_not_rounded() {
        let p = reg(DataType::I16, 0.1);
        assert!(p.encode(&json!(21.55)).is_err());
        assert!(p.encode(&json!(3276.8)).is_err());
        assert!(p.encode(&json!(3276.7)).is_ok());
        assert!(p.encode(&json!("21")).is_err());
        let u = reg(DataType::U16, 1.0);
        assert!(u.encode(&json!(-1)).is_err());
        assert!(u.encode(&json!(65536)).is_err());
    }

    #[test]
    fn thirty_two_bit_types_follow_the_word_order() {
        let mut p = reg(DataType::U32, 1.0);
        assert_eq!(p.encode(&json!(65537)), Ok(Native::Words(vec![1, 1])));
        assert_eq!(p.encode(&json!(0x0001_0002)), Ok(Native::Words(vec![1, 2])));
        p.word_order = WordOrder::LowFirst;
        assert_eq!(p.encode(&json!(0x0001_0002)), Ok(Native::Words(vec![2, 1])));
        assert_eq!(p.decode(&Native::Words(vec![2, 1])), Ok(json!(0x0001_0002)));
        let i = reg(DataType::I32, 1.0);
        assert_eq!(
            i.decode(&i.encode(&json!(-70000)).unwrap_or(Native::Bit(false))),
            Ok(json!(-70000))
        );
        let f = reg(DataType::F32, 1.0);
        assert_eq!(
            f.decode(&f.encode(&json!(1.5)).unwrap_or(Native::Bit(false))),
            Ok(json!(1.5))
        );
    }

    #[test]
    fn units_convert_at_the_boundary() {
        let mut p = reg(DataType::I16, 0.1);
        p.native_unit = Some("degF".into());
        // 100 degC is 212 degF: 2120 counts.
        assert_eq!(p.encode(&json!(100)), Ok(Native::Words(vec![2120])));
        let back = p
            .decode(&Native::Words(vec![2120]))
            .ok()
            .and_then(|v| v.as_f64())
            .unwrap_or(0.0);
        assert!((back - 100.0).abs() < 1e-9);
    }
}
