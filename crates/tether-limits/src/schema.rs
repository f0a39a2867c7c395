//! Just enough JSON Schema navigation to resolve limit paths: `properties`,
//! `items` (object or draft-07 tuple form), `prefixItems`, local `$ref` and
//! `allOf` members. Every hop is bounded, so a cyclic or hostile schema ends in
//! "does not resolve" instead of a hang.

use serde_json::Value;

use crate::path::{Index, LimitPath};

/// Most `$ref` hops followed from one node; beyond it the node does not resolve.
pub(crate) const REF_DEPTH_MAX: usize = 32;
/// Deepest `allOf` nesting looked into.
pub(crate) const ALLOF_DEPTH_MAX: usize = 4;
/// Most schema nodes one path may fan out to (tuple elements under `[*]`).
pub(crate) const BRANCH_MAX: usize = 64;

/// A schema node and its JSON pointer inside the root schema.
#[derive(Debug, Clone)]
pub(crate) struct At<'s> {
    pub value: &'s Value,
    pub pointer: String,
}

/// What kind of value a schema node describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Number,
    Integer,
    String,
    Boolean,
    Object,
    Array,
    /// No `type` and nothing to infer one from.
    Unknown,
}

impl Kind {
    pub fn is_numeric(self) -> bool {
        matches!(self, Kind::Number | Kind::Integer)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Number => "number",
            Kind::Integer => "integer",
            Kind::String => "string",
            Kind::Boolean => "boolean",
            Kind::Object => "object",
            Kind::Array => "array",
            Kind::Unknown => "untyped",
        }
    }
}

/// The field a limit path names, as the builder needs it.
#[derive(Debug, Clone)]
pub(crate) struct Field {
    /// The path, with `[*]` appended when it ended on an array.
    pub canonical: LimitPath,
    /// Kind of the leaf values.
    pub kind: Kind,
    /// The leaf's `x-mhs-unit` (or the enclosing array's).
    pub unit: Option<String>,
    /// `Some(len)` when the last segment is `[*]`: the array's fixed length,
    /// or `None` for a variable-length array.
    pub element_array: Option<Option<usize>>,
    /// Pointers of the leaf nodes and their `allOf` members.
    pub pointers: Vec<String>,
}

pub(crate) struct Resolver<'s> {
    root: &'s Value,
}

/// A JSON Pointer reference token (RFC 6901): `~` as `~0`, `/` as `~1`.
/// Borrowed when there is nothing to escape, the common case: the limits
/// step walks the schema on every command.
fn escape(key: &str) -> std::borrow::Cow<'_, str> {
    if key.contains(['~', '/']) {
        std::borrow::Cow::Owned(key.replace('~', "~0").replace('/', "~1"))
    } else {
        std::borrow::Cow::Borrowed(key)
    }
}

fn child<'s>(parent: &At<'s>, value: &'s Value, key: &str) -> At<'s> {
    let token = escape(key);
    let mut pointer = String::with_capacity(parent.pointer.len() + 1 + token.len());
    pointer.push_str(&parent.pointer);
    pointer.push('/');
    pointer.push_str(&token);
    At { value, pointer }
}

impl<'s> Resolver<'s> {
    pub fn new(root: &'s Value) -> Self {
        Resolver { root }
    }

    pub fn root(&self) -> At<'s> {
        At {
            value: self.root,
            pointer: String::new(),
        }
    }

    /// Follow `$ref` chains (local pointers only) to the node they name.
    pub fn deref(&self, at: At<'s>) -> Option<At<'s>> {
        let mut current = at;
        for _ in 0..REF_DEPTH_MAX {
            match current.value.get("$ref").and_then(Value::as_str) {
                None => return Some(current),
                Some(reference) => current = self.pointer_get(reference)?,
            }
        }
        None
    }

    fn pointer_get(&self, reference: &str) -> Option<At<'s>> {
        let pointer = reference.strip_prefix('#')?;
        if !pointer.is_empty() && !pointer.starts_with('/') {
            return None; // anchors and remote references are not followed
        }
        let value = self.root.pointer(pointer)?;
        Some(At {
            value,
            pointer: pointer.to_string(),
        })
    }

    /// The node itself plus its `allOf` members (dereferenced, bounded).
    pub fn members(&self, at: At<'s>) -> Vec<At<'s>> {
        let mut out = Vec::new();
        self.collect_members(at, 0, &mut out);
        out
    }

    fn collect_members(&self, at: At<'s>, depth: usize, out: &mut Vec<At<'s>>) {
        let Some(node) = self.deref(at) else { return };
        if out.len() >= BRANCH_MAX {
            return;
        }
        let all_of = node.value.get("allOf").and_then(Value::as_array);
        let parent = node.clone();
        out.push(node);
        if depth >= ALLOF_DEPTH_MAX {
            return;
        }
        for (i, member) in all_of.into_iter().flatten().enumerate() {
            let member_at = At {
                value: member,
                pointer: format!("{}/allOf/{i}", parent.pointer),
            };
            self.collect_members(member_at, depth + 1, out);
        }
    }

    /// The first value of `key` on the node or one of its `allOf` members.
    pub fn keyword(&self, at: &At<'s>, key: &str) -> Option<&'s Value> {
        self.members(at.clone())
            .into_iter()
            .find_map(|m| m.value.get(key))
    }

    /// The schema of member `name` of an object node.
    pub fn property(&self, at: &At<'s>, name: &str) -> Option<At<'s>> {
        for member in self.members(at.clone()) {
            let Some(props) = member.value.get("properties") else {
                continue;
            };
            if let Some(value) = props.get(name) {
                let holder = child(&member, props, "properties");
                return self.usable(child(&holder, value, name));
            }
        }
        None
    }

    /// A `false` schema admits no value, so a path through it never resolves.
    fn usable(&self, at: At<'s>) -> Option<At<'s>> {
        let node = self.deref(at)?;
        if node.value == &Value::Bool(false) {
            None
        } else {
            Some(node)
        }
    }

    /// The element schemas an index selects, with the array's fixed length.
    pub fn elements(&self, at: &At<'s>, index: Index) -> Option<(Vec<At<'s>>, Option<usize>)> {
        let shape = self.array_shape(at)?;
        let max_items = self.count(at, "maxItems");
        let min_items = self.count(at, "minItems");
        let fixed = match (min_items, max_items) {
            (Some(lo), Some(hi)) if lo == hi => Some(hi),
            _ => shape.tuple.as_ref().map(Vec::len),
        };
        let nodes = match index {
            Index::At(n) => {
                if max_items.is_some_and(|hi| n >= hi) {
                    return None;
                }
                let node = match &shape.tuple {
                    Some(tuple) if n < tuple.len() => tuple.get(n).cloned(),
                    _ => shape.rest.clone(),
                };
                vec![self.usable(node?)?]
            }
            Index::All => {
                let mut all: Vec<At<'s>> = shape.tuple.clone().unwrap_or_default();
                all.extend(shape.rest.clone());
                all.into_iter()
                    .take(BRANCH_MAX)
                    .filter_map(|n| self.usable(n))
                    .collect()
            }
        };
        if nodes.is_empty() {
            None
        } else {
            Some((nodes, fixed))
        }
    }

    fn count(&self, at: &At<'s>, key: &str) -> Option<usize> {
        self.keyword(at, key)
            .and_then(Value::as_u64)
            .and_then(|n| usize::try_from(n).ok())
    }

    fn array_shape(&self, at: &At<'s>) -> Option<ArrayShape<'s>> {
        for member in self.members(at.clone()) {
            if let Some(shape) = shape_of(&member) {
                return Some(shape);
            }
        }
        None
    }

    /// The kind of value a node describes.
    pub fn kind(&self, at: &At<'s>) -> Kind {
        if let Some(t) = self.keyword(at, "type") {
            return kind_of_type(t);
        }
        let has = |k: &str| self.keyword(at, k).is_some();
        if has("properties") {
            Kind::Object
        } else if has("items") || has("prefixItems") {
            Kind::Array
        } else if has("x-mhs-unit") {
            // Units are only ever declared on numeric leaves.
            Kind::Number
        } else {
            Kind::Unknown
        }
    }

    fn unit(&self, at: &At<'s>) -> Option<String> {
        self.keyword(at, "x-mhs-unit")
            .and_then(Value::as_str)
            .map(str::to_string)
    }

    /// Resolve a limit path to the field it names.
    pub fn resolve(&self, path: &LimitPath) -> Result<Field, String> {
        let mut walker = PathWalk {
            current: vec![self.root()],
            canonical: Vec::new(),
            element_array: None,
            array_unit: None,
        };
        let count = path.segments().len();
        for (i, seg) in path.segments().iter().enumerate() {
            walker.step(self, seg, i + 1 == count)?;
        }
        self.leaf(walker)
    }

    fn leaf(&self, walker: PathWalk<'s>) -> Result<Field, String> {
        let first = walker.current.first().ok_or("no schema node")?;
        let kind = self.kind(first);
        let unit = self.unit(first).or_else(|| walker.array_unit.clone());
        for other in walker.current.iter().skip(1) {
            let other_unit = self.unit(other).or_else(|| walker.array_unit.clone());
            if self.kind(other) != kind || other_unit != unit {
                return Err("the tuple elements under [*] differ in type or unit".into());
            }
        }
        let mut pointers = Vec::new();
        for node in &walker.current {
            pointers.extend(self.members(node.clone()).into_iter().map(|m| m.pointer));
        }
        let canonical =
            LimitPath::from_segments(walker.canonical).ok_or("empty path after resolution")?;
        Ok(Field {
            canonical,
            kind,
            unit,
            element_array: walker.element_array,
            pointers,
        })
    }
}

struct ArrayShape<'s> {
    tuple: Option<Vec<At<'s>>>,
    rest: Option<At<'s>>,
}

/// Read the array form of one node: 2020-12 `prefixItems` + `items`, draft-07
/// tuple `items` + `additionalItems`, or homogeneous `items`.
fn shape_of<'s>(node: &At<'s>) -> Option<ArrayShape<'s>> {
    let tuple_of = |key: &str, list: &'s [Value]| -> Vec<At<'s>> {
        list.iter()
            .enumerate()
            .map(|(i, v)| At {
                value: v,
                pointer: format!("{}/{key}/{i}", node.pointer),
            })
            .collect()
    };
    let sub = |key: &str| -> Option<At<'s>> {
        let v = node.value.get(key)?;
        (v.is_object() || v == &Value::Bool(true)).then(|| child(node, v, key))
    };
    if let Some(prefix) = node.value.get("prefixItems").and_then(Value::as_array) {
        return Some(ArrayShape {
            tuple: Some(tuple_of("prefixItems", prefix)),
            rest: sub("items"),
        });
    }
    match node.value.get("items") {
        Some(Value::Array(list)) => Some(ArrayShape {
            tuple: Some(tuple_of("items", list)),
            rest: sub("additionalItems"),
        }),
        Some(_) => Some(ArrayShape {
            tuple: None,
            rest: sub("items"),
        }),
        None => None,
    }
}

fn kind_of_type(t: &Value) -> Kind {
    let names: Vec<&str> = match t {
        Value::String(s) => vec![s.as_str()],
        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    // "null" beside a type means "optional value"; it does not change the kind.
    let names: Vec<&str> = names.into_iter().filter(|n| *n != "null").collect();
    let numeric = !names.is_empty() && names.iter().all(|n| *n == "number" || *n == "integer");
    match names.as_slice() {
        ["integer"] => Kind::Integer,
        _ if numeric => Kind::Number,
        ["string"] => Kind::String,
        ["boolean"] => Kind::Boolean,
        ["object"] => Kind::Object,
        ["array"] => Kind::Array,
        _ => Kind::Unknown,
    }
}

/// The state of resolving one path, segment by segment.
struct PathWalk<'s> {
    current: Vec<At<'s>>,
    canonical: Vec<crate::path::Segment>,
    element_array: Option<Option<usize>>,
    array_unit: Option<String>,
}

impl<'s> PathWalk<'s> {
    fn step(
        &mut self,
        r: &Resolver<'s>,
        seg: &crate::path::Segment,
        last: bool,
    ) -> Result<(), String> {
        let mut next = Vec::new();
        for node in &self.current {
            let found = r
                .property(node, &seg.name)
                .ok_or_else(|| format!("the schema has no member '{}' here", seg.name))?;
            next.push(found);
        }
        let ends_on_array = last && next.iter().all(|n| r.kind(n) == Kind::Array);
        let index = match seg.index {
            Some(ix) => Some(ix),
            None if ends_on_array => Some(Index::All),
            None => None,
        };
        self.canonical.push(crate::path::Segment {
            name: seg.name.clone(),
            index,
        });
        if let Some(ix) = index {
            next = self.index_into(r, &next, ix, last, &seg.name)?;
        }
        self.current = next;
        Ok(())
    }

    fn index_into(
        &mut self,
        r: &Resolver<'s>,
        arrays: &[At<'s>],
        ix: Index,
        last: bool,
        name: &str,
    ) -> Result<Vec<At<'s>>, String> {
        let mut out = Vec::new();
        let mut lengths = Vec::new();
        for array in arrays {
            let (elements, fixed) = r
                .elements(array, ix)
                .ok_or_else(|| format!("'{name}' is not an array or has no such element"))?;
            lengths.push(fixed);
            if last && self.array_unit.is_none() {
                self.array_unit = r.unit(array);
            }
            out.extend(elements);
            if out.len() > BRANCH_MAX {
                return Err("the path fans out to too many schema nodes".into());
            }
        }
        if last && ix == Index::All {
            let first = lengths.first().copied().flatten();
            let agree = lengths.iter().all(|l| *l == first);
            self.element_array = Some(if agree { first } else { None });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pointers_escape_tilde_and_slash_and_borrow_otherwise() {
        assert!(matches!(
            escape("plain"),
            std::borrow::Cow::Borrowed("plain")
        ));
        assert_eq!(escape("a/b~c"), "a~1b~0c");
        // `~` first, so an escaped slash is not escaped again.
        assert_eq!(escape("~1"), "~01");
        let schema = json!({"properties": {"a/b": {"properties": {"c~d": {"type": "number"}}}}});
        let r = Resolver::new(&schema);
        let outer = r.property(&r.root(), "a/b").expect("outer");
        let inner = r.property(&outer, "c~d").expect("inner");
        assert_eq!(inner.pointer, "/properties/a~1b/properties/c~0d");
        assert_eq!(
            schema.pointer(&inner.pointer),
            Some(&json!({"type": "number"}))
        );
    }
}
