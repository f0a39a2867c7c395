//! OPC UA nodes as points: node ids as written (`nsu=URI;s=Name`), the
//! built-in scalar types a field maps to, and values to and from them.
//!
//! **Owns:** parsing a node id into its namespace (a URI, resolved against
//! the server's namespace array on every connection, or an index) and its
//! identifier; the variable types; encoding a field value as the node's
//! type exactly (through `crate::scaling`) and decoding a reading, refusing
//! a reading whose type is not the declared one.
//! **Never here:** I/O, the config's shape (`config`).

use crate::mapping::{self, MapDefect};
use crate::scaling::Scaling;
use opcua::types::{NodeId, Variant};
use serde::Deserialize;
use serde_json::Value;
use std::str::FromStr;

/// The namespace of a node id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Namespace {
    /// A namespace URI, resolved to an index on each connection.
    Uri(String),
    /// A fixed namespace index.
    Index(u16),
}

/// A node id as written, not yet resolved against a server.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeRef {
    /// The namespace.
    pub ns: Namespace,
    /// The identifier part: `s=Oven.Setpoint`, `i=2258`, `g=…`, `b=…`.
    pub ident: String,
    /// As written, for labels.
    pub text: String,
}

impl NodeRef {
    /// Parses `nsu=URI;s=…`, `ns=N;s=…` or a bare `s=…`/`i=…` (namespace 0).
    ///
    /// # Errors
    /// A node id that does not follow that grammar.
    pub fn parse(text: &str) -> Result<NodeRef, String> {
        let (ns, ident) = if let Some(rest) = text.strip_prefix("nsu=") {
            let (uri, ident) = rest
                .split_once(';')
                .ok_or_else(|| format!("`{text}`: `nsu=URI;` needs an identifier after it"))?;
            if uri.is_empty() {
                return Err(format!("`{text}`: an empty namespace URI"));
            }
            (Namespace::Uri(uri.to_owned()), ident)
        } else if let Some(rest) = text.strip_prefix("ns=") {
            let (idx, ident) = rest
                .split_once(';')
                .ok_or_else(|| format!("`{text}`: `ns=N;` needs an identifier after it"))?;
            let idx = idx
                .parse::<u16>()
                .map_err(|_| format!("`{text}`: `{idx}` is not a namespace index"))?;
            (Namespace::Index(idx), ident)
        } else {
            (Namespace::Index(0), text)
        };
        if NodeId::from_str(&format!("ns=0;{ident}")).is_err() {
            return Err(format!(
                "`{text}`: the identifier must be `s=NAME`, `i=NUMBER`, `g=GUID` or `b=BASE64`"
            ));
        }
        Ok(NodeRef {
            ns,
            ident: ident.to_owned(),
            text: text.to_owned(),
        })
    }

    /// The node id on a server whose namespace `uri` has index `index`.
    ///
    /// # Errors
    /// An identifier the library refuses (checked when parsed: not expected).
    pub fn on(&self, index: u16) -> Result<NodeId, String> {
        NodeId::from_str(&format!("ns={index};{}", self.ident))
            .map_err(|e| format!("`{}`: {e}", self.text))
    }
}

/// A built-in scalar type a field maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VarType {
    /// Boolean.
    Boolean,
    /// SByte.
    SByte,
    /// Byte.
    Byte,
    /// Int16.
    Int16,
    /// UInt16.
    UInt16,
    /// Int32.
    Int32,
    /// UInt32.
    UInt32,
    /// Int64 (within ±2^53, what a JSON number holds exactly).
    Int64,
    /// UInt64 (up to 2^53).
    UInt64,
    /// Float (IEEE single).
    Float,
    /// Double.
    Double,
}

/// The largest integer a JSON number (an f64) holds exactly.
const EXACT_INT: f64 = 9_007_199_254_740_992.0;

const TYPES: &[(&str, VarType)] = &[
    ("boolean", VarType::Boolean),
    ("sbyte", VarType::SByte),
    ("byte", VarType::Byte),
    ("int16", VarType::Int16),
    ("uint16", VarType::UInt16),
    ("int32", VarType::Int32),
    ("uint32", VarType::UInt32),
    ("int64", VarType::Int64),
    ("uint64", VarType::UInt64),
    ("float", VarType::Float),
    ("double", VarType::Double),
];

impl VarType {
    /// Reads a type name (`double`, `uint32`, …; case-insensitive).
    pub fn parse(s: &str) -> Option<VarType> {
        let lower = s.to_ascii_lowercase();
        TYPES.iter().find(|(n, _)| *n == lower).map(|(_, t)| *t)
    }
    /// Its name as OPC UA spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            VarType::Boolean => "Boolean",
            VarType::SByte => "SByte",
            VarType::Byte => "Byte",
            VarType::Int16 => "Int16",
            VarType::UInt16 => "UInt16",
            VarType::Int32 => "Int32",
            VarType::UInt32 => "UInt32",
            VarType::Int64 => "Int64",
            VarType::UInt64 => "UInt64",
            VarType::Float => "Float",
            VarType::Double => "Double",
        }
    }
    /// The integer range, for integer types.
    fn range(self) -> Option<(f64, f64)> {
        match self {
            VarType::SByte => Some((f64::from(i8::MIN), f64::from(i8::MAX))),
            VarType::Byte => Some((0.0, f64::from(u8::MAX))),
            VarType::Int16 => Some((f64::from(i16::MIN), f64::from(i16::MAX))),
            VarType::UInt16 => Some((0.0, f64::from(u16::MAX))),
            VarType::Int32 => Some((f64::from(i32::MIN), f64::from(i32::MAX))),
            VarType::UInt32 => Some((0.0, f64::from(u32::MAX))),
            VarType::Int64 => Some((-EXACT_INT, EXACT_INT)),
            VarType::UInt64 => Some((0.0, EXACT_INT)),
            VarType::Boolean | VarType::Float | VarType::Double => None,
        }
    }
}

/// A native value: a boolean, or a number of a type (integers held exactly:
/// the ranges keep them within 2^53).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum UaValue {
    /// A Boolean node.
    Bool(bool),
    /// A numeric node and its value.
    Number(VarType, f64),
}

impl UaValue {
    /// As a variant of its type.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    pub fn to_variant(self) -> Variant {
        // Integers were checked integral and in range when encoded (or read
        // from a variant of that type), so each cast below is exact.
        match self {
            UaValue::Bool(b) => Variant::Boolean(b),
            UaValue::Number(t, x) => match t {
                VarType::SByte => Variant::SByte(x as i8),
                VarType::Byte => Variant::Byte(x as u8),
                VarType::Int16 => Variant::Int16(x as i16),
                VarType::UInt16 => Variant::UInt16(x as u16),
                VarType::Int32 => Variant::Int32(x as i32),
                VarType::UInt32 => Variant::UInt32(x as u32),
                VarType::Int64 => Variant::Int64(x as i64),
                VarType::UInt64 => Variant::UInt64(x as u64),
                VarType::Float => Variant::Float(x as f32),
                VarType::Double => Variant::Double(x),
                VarType::Boolean => Variant::Boolean(x != 0.0),
            },
        }
    }

    /// A variant as a native value, when it is a scalar of a known type.
    #[allow(clippy::cast_precision_loss)]
    pub fn of_variant(v: &Variant) -> Option<UaValue> {
        let n = |t, x: f64| Some(UaValue::Number(t, x));
        match v {
            Variant::Boolean(b) => Some(UaValue::Bool(*b)),
            Variant::SByte(x) => n(VarType::SByte, f64::from(*x)),
            Variant::Byte(x) => n(VarType::Byte, f64::from(*x)),
            Variant::Int16(x) => n(VarType::Int16, f64::from(*x)),
            Variant::UInt16(x) => n(VarType::UInt16, f64::from(*x)),
            Variant::Int32(x) => n(VarType::Int32, f64::from(*x)),
            Variant::UInt32(x) => n(VarType::UInt32, f64::from(*x)),
            // Beyond 2^53 the reading is refused by `decode`'s range check.
            Variant::Int64(x) => n(VarType::Int64, *x as f64),
            Variant::UInt64(x) => n(VarType::UInt64, *x as f64),
            Variant::Float(x) => n(VarType::Float, f64::from(*x)),
            Variant::Double(x) => n(VarType::Double, *x),
            _ => None,
        }
    }

    /// The raw value as JSON.
    pub fn to_json(self) -> Value {
        match self {
            UaValue::Bool(b) => Value::Bool(b),
            UaValue::Number(t, x) if t.range().is_some() && x.fract() == 0.0 =>
            {
                #[allow(clippy::cast_possible_truncation)]
                Value::from(x as i64)
            }
            UaValue::Number(_, x) => Value::from(x),
        }
    }

    /// The type's name (`Double`).
    pub fn type_name(self) -> &'static str {
        match self {
            UaValue::Bool(_) => VarType::Boolean.as_str(),
            UaValue::Number(t, _) => t.as_str(),
        }
    }
}

/// A variable node as written: `{ node = "nsu=…;s=…", type = "double",
/// scale?, offset?, unit? }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNode {
    node: String,
    #[serde(rename = "type")]
    data_type: String,
    scale: Option<f64>,
    offset: Option<f64>,
    unit: Option<String>,
}

/// A variable node and how its value maps to a field.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// The node id.
    pub node: NodeRef,
    /// Its built-in type.
    pub data_type: VarType,
    /// `native = raw * scale + offset`.
    pub scale: f64,
    /// See `scale`.
    pub offset: f64,
    /// The device's unit of `native`.
    pub native_unit: Option<String>,
    /// The field's declared unit.
    pub field_unit: Option<String>,
}

impl Node {
    fn scaling(&self) -> Scaling<'_> {
        Scaling {
            scale: self.scale,
            offset: self.offset,
            native_unit: self.native_unit.as_deref(),
            field_unit: self.field_unit.as_deref(),
        }
    }

    fn encode_number(&self, x: f64) -> Result<UaValue, String> {
        let raw = self.scaling().raw_of(x, &self.node.text)?;
        let t = self.data_type;
        let exact = match t {
            VarType::Double => raw,
            VarType::Float => {
                if raw.abs() > f64::from(f32::MAX) {
                    return Err(format!("{x} is out of range for Float"));
                }
                // The nearest single is what the type holds: its own
                // resolution, not a rounding the driver adds.
                #[allow(clippy::cast_possible_truncation)]
                f64::from(raw as f32)
            }
            _ => {
                let range = t.range().unwrap_or((0.0, 0.0));
                self.scaling().counts(x, raw, range, t.as_str())?
            }
        };
        Ok(UaValue::Number(t, exact))
    }
}

impl mapping::Point for Node {
    type Raw = RawNode;
    type Native = UaValue;
    const BOOL_HINT: &'static str = "a Boolean node";
    const NUMBER_HINT: &'static str = "a numeric node";
    const KIND_KEY: &'static str = "type";

    fn resolve(
        raw: &RawNode,
        at: &str,
        field_unit: Option<&str>,
        defects: &mut Vec<MapDefect>,
    ) -> Option<Self> {
        let before = defects.len();
        let node = NodeRef::parse(&raw.node)
            .map_err(|e| defects.push((format!("{at}.node"), e)))
            .ok();
        let names: Vec<&str> = TYPES.iter().map(|(n, _)| *n).collect();
        let data_type = VarType::parse(&raw.data_type).or_else(|| {
            defects.push((
                format!("{at}.type"),
                format!(
                    "unknown type `{}` (known: {})",
                    raw.data_type,
                    names.join(", ")
                ),
            ));
            None
        });
        let scale = raw.scale.unwrap_or(1.0);
        if !scale.is_finite() || scale == 0.0 {
            defects.push((
                format!("{at}.scale"),
                "must be a finite, non-zero number".into(),
            ));
        }
        let offset = raw.offset.unwrap_or(0.0);
        if !offset.is_finite() {
            defects.push((format!("{at}.offset"), "must be a finite number".into()));
        }
        if data_type == Some(VarType::Boolean) && (raw.scale.is_some() || raw.offset.is_some()) {
            defects.push((format!("{at}.scale"), "a Boolean node has no scale".into()));
        }
        mapping::check_unit(raw.unit.as_deref(), field_unit, at, defects);
        if defects.len() > before {
            return None;
        }
        Some(Node {
            node: node?,
            data_type: data_type?,
            scale,
            offset,
            native_unit: raw.unit.clone().or_else(|| field_unit.map(str::to_owned)),
            field_unit: field_unit.map(str::to_owned),
        })
    }

    fn raw_unit(raw: &RawNode) -> Option<&str> {
        raw.unit.as_deref()
    }

    fn encode(&self, v: &Value) -> Result<UaValue, String> {
        if self.data_type == VarType::Boolean {
            return v
                .as_bool()
                .map(UaValue::Bool)
                .ok_or_else(|| format!("{} takes true or false", self.node.text));
        }
        let x = v
            .as_f64()
            .filter(|x| x.is_finite())
            .ok_or_else(|| format!("{} takes a finite number", self.node.text))?;
        self.encode_number(x)
    }

    fn decode(&self, n: &UaValue) -> Result<Value, String> {
        let (t, raw) = match (self.data_type, n) {
            (VarType::Boolean, UaValue::Bool(b)) => return Ok(Value::Bool(*b)),
            (want, UaValue::Number(t, raw)) if *t == want => (*t, *raw),
            (want, got) => {
                return Err(format!(
                    "{} reads a {}, the map says {}",
                    self.node.text,
                    got.type_name(),
                    want.as_str()
                ))
            }
        };
        if let Some((lo, hi)) = t.range() {
            if raw < lo || raw > hi {
                return Err(format!("{}: {raw} is beyond 2^53", self.node.text));
            }
        }
        let v = self.scaling().field_of(raw, &self.node.text)?;
        if self.scaling().is_identity() && t.range().is_some() && v.fract() == 0.0 {
            #[allow(clippy::cast_possible_truncation)]
            return Ok(Value::from(v as i64));
        }
        Ok(Value::from(v))
    }

    fn label(&self) -> String {
        self.node.text.clone()
    }

    fn type_name(&self) -> String {
        format!("`{}` at scale {}", self.data_type.as_str(), self.scale)
    }

    fn is_bool(&self) -> bool {
        self.data_type == VarType::Boolean
    }

    fn read_only(&self) -> Option<String> {
        // Whether a node is writable is the server's to say (its access
        // level); a refused write is a failed receipt with the status code.
        None
    }

    fn field_unit(&self) -> Option<&str> {
        self.field_unit.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::Point as _;
    use serde_json::json;

    fn node(t: VarType, scale: f64) -> Node {
        Node {
            node: NodeRef::parse("nsu=urn:x;s=A").unwrap_or_else(|e| panic!("{e}")),
            data_type: t,
            scale,
            offset: 0.0,
            native_unit: Some("degC".into()),
            field_unit: Some("degC".into()),
        }
    }

    #[test]
    fn node_ids_parse_with_uri_index_or_neither() {
        let a = NodeRef::parse("nsu=urn:tether:example:oven;s=Oven.Setpoint");
        assert_eq!(
            a.map(|n| (n.ns, n.ident)),
            Ok((
                Namespace::Uri("urn:tether:example:oven".into()),
                "s=Oven.Setpoint".into()
            ))
        );
        assert_eq!(
            NodeRef::parse("ns=2;i=7").map(|n| n.ns),
            Ok(Namespace::Index(2))
        );
        assert_eq!(
            NodeRef::parse("i=2258").map(|n| n.ns),
            Ok(Namespace::Index(0))
        );
        assert!(NodeRef::parse("nsu=urn:x").is_err());
        assert!(NodeRef::parse("ns=x;s=A").is_err());
        assert!(NodeRef::parse("Oven.Setpoint").is_err());
    }

    #[test]
    fn values_encode_exactly_or_are_refused() {
        let d = node(VarType::Double, 1.0);
        assert_eq!(
            d.encode(&json!(21.5)),
            Ok(UaValue::Number(VarType::Double, 21.5))
        );
        assert!(d.encode(&json!("21")).is_err());
        let i = node(VarType::Int16, 0.1);
        assert_eq!(
            i.encode(&json!(21.5)),
            Ok(UaValue::Number(VarType::Int16, 215.0))
        );
        assert!(i.encode(&json!(21.55)).is_err());
        let u = node(VarType::UInt32, 1.0);
        assert!(u.encode(&json!(-1)).is_err());
        assert_eq!(
            u.encode(&json!(7)).map(UaValue::to_variant),
            Ok(Variant::UInt32(7))
        );
    }

    #[test]
    fn a_reading_of_another_type_is_refused() {
        let d = node(VarType::Double, 1.0);
        assert_eq!(
            d.decode(&UaValue::Number(VarType::Double, 20.5)),
            Ok(json!(20.5))
        );
        assert!(d.decode(&UaValue::Number(VarType::Float, 20.5)).is_err());
        assert!(d.decode(&UaValue::Bool(true)).is_err());
        let u = node(VarType::UInt32, 1.0);
        assert_eq!(
            u.decode(&UaValue::Number(VarType::UInt32, 7.0)),
            Ok(json!(7))
        );
    }
}
