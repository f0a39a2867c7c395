//! Walk an input document along a limit path and report every value the path
//! addresses. Shared by evaluation, the unset check and budget draws, so all
//! three see exactly the same values (schema defaults included).

use std::ops::ControlFlow;

use serde_json::Value;

use crate::path::{push_index, push_member, Index, LimitPath};
use crate::schema::{At, Resolver};

/// Most values one walk may visit. An input that addresses more is refused
/// rather than partially checked.
pub(crate) const VISIT_MAX: usize = 1 << 20;

/// Something the walk found.
pub(crate) enum Event<'a> {
    /// A value the path addresses. `element` is its position in the array of
    /// the path's last `[*]` segment, when that segment is last.
    Leaf {
        concrete: String,
        value: &'a Value,
        element: Option<usize>,
    },
    /// The array under the path's last `[*]` segment, before its elements.
    LeafArray { concrete: String, len: usize },
    /// A value on the way is not the object or array the path needs.
    Mismatch { concrete: String, value: &'a Value },
}

/// The walk stopped because the input addresses more than [`VISIT_MAX`] values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooLarge;

pub(crate) struct Walk<'a, 'v> {
    path: &'v LimitPath,
    resolver: Option<&'v Resolver<'a>>,
    visits: usize,
    visit: &'v mut dyn FnMut(Event<'a>) -> ControlFlow<()>,
}

/// Walk `input` along `path`, calling `visit` for each event until it breaks.
/// With a resolver, omitted members that declare a schema `default` are
/// walked as if the input held the default.
pub(crate) fn walk<'a>(
    input: &'a Value,
    schema: Option<&Resolver<'a>>,
    path: &LimitPath,
    visit: &mut dyn FnMut(Event<'a>) -> ControlFlow<()>,
) -> Result<(), TooLarge> {
    let root = schema.map(Resolver::root);
    let mut state = Walk {
        path,
        resolver: schema,
        visits: 0,
        visit,
    };
    match state.step(input, root, 0, String::new(), None) {
        Step::TooLarge => Err(TooLarge),
        Step::Go | Step::Stop => Ok(()),
    }
}

enum Step {
    Go,
    Stop,
    TooLarge,
}

impl From<ControlFlow<()>> for Step {
    fn from(flow: ControlFlow<()>) -> Self {
        match flow {
            ControlFlow::Continue(()) => Step::Go,
            ControlFlow::Break(()) => Step::Stop,
        }
    }
}

impl<'a> Walk<'a, '_> {
    fn step(
        &mut self,
        value: &'a Value,
        node: Option<At<'a>>,
        depth: usize,
        concrete: String,
        element: Option<usize>,
    ) -> Step {
        self.visits += 1;
        if self.visits > VISIT_MAX {
            return Step::TooLarge;
        }
        let Some(seg) = self.path.segments().get(depth) else {
            return (self.visit)(Event::Leaf {
                concrete,
                value,
                element,
            })
            .into();
        };
        let Some(object) = value.as_object() else {
            return self.mismatch(concrete, value);
        };
        let child_node = match (self.resolver, &node) {
            (Some(r), Some(n)) => r.property(n, &seg.name),
            _ => None,
        };
        let child = match object.get(&seg.name) {
            Some(v) => v,
            None => match self.default_of(child_node.as_ref()) {
                Some(v) => v,
                // Absent and no default: an optional field that is not set.
                None => return Step::Go,
            },
        };
        let concrete = push_member(&concrete, &seg.name);
        let last = depth + 1 == self.path.segments().len();
        match seg.index {
            None => self.step(child, child_node, depth + 1, concrete, None),
            Some(index) => self.elements(child, child_node, depth, concrete, index, last),
        }
    }

    fn elements(
        &mut self,
        value: &'a Value,
        node: Option<At<'a>>,
        depth: usize,
        concrete: String,
        index: Index,
        last: bool,
    ) -> Step {
        let Some(items) = value.as_array() else {
            return self.mismatch(concrete, value);
        };
        let chosen: Vec<(usize, &'a Value)> = match index {
            Index::All => items.iter().enumerate().collect(),
            Index::At(n) => items.get(n).map(|v| (n, v)).into_iter().collect(),
        };
        if last && index == Index::All {
            let event = Event::LeafArray {
                concrete: concrete.clone(),
                len: items.len(),
            };
            if let Step::Stop = Step::from((self.visit)(event)) {
                return Step::Stop;
            }
        }
        for (i, item) in chosen {
            let item_node = self.element_node(node.as_ref(), i);
            let element = (last && index == Index::All).then_some(i);
            match self.step(
                item,
                item_node,
                depth + 1,
                push_index(&concrete, i),
                element,
            ) {
                Step::Go => {}
                other => return other,
            }
        }
        Step::Go
    }

    fn element_node(&self, node: Option<&At<'a>>, i: usize) -> Option<At<'a>> {
        let (r, n) = (self.resolver?, node?);
        r.elements(n, Index::At(i))
            .and_then(|(nodes, _)| nodes.into_iter().next())
    }

    fn default_of(&self, node: Option<&At<'a>>) -> Option<&'a Value> {
        let (r, n) = (self.resolver?, node?);
        r.keyword(n, "default")
    }

    fn mismatch(&mut self, concrete: String, value: &'a Value) -> Step {
        // The input root has no name of its own; `$` is the usual spelling.
        let concrete = if concrete.is_empty() {
            "$".to_string()
        } else {
            concrete
        };
        (self.visit)(Event::Mismatch { concrete, value }).into()
    }
}
