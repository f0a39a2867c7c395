//! The stages a traced command ran, as timings carried with its span
//! (issue 22 §2, docs/TELEMETRY.md).
//!
//! A trace shows each stage of the evaluation order that ran (`arrive`,
//! `resolve`, `grant`, `claim`, `checks` and its `policy`, `dispatch` and
//! its `driver`, each durable `tether.commit`) as a child span of the
//! command. Built one by one on the caller's thread, those ten spans would
//! cost more CPU than the command itself. Here a stage is a [`Mark`]
//! instead: two clock reads into a small table the command's task holds.
//! When the command ends, [`Kernel::command`](crate::Kernel) hands the
//! marks over with its trace span (`crate::trace`), and the exporter
//! (`tether_server::telemetry`, on its own thread) writes each as a child
//! span. For logs the table is also written, as text ([`decode`] reads it
//! back), on the command's `tracing` span as the field [`FIELD`].
//!
//! **Owns:** the table, its text form and the names of the stages.
//! **Never belongs here:** OpenTelemetry types (the exporter's), what a
//! stage does (the stage modules).
//! **Fail-closed rule:** nothing here can refuse or delay a command: with
//! no traced span there is no table (one task-local lookup per stage), a
//! full table drops marks beyond [`MARKS_MAX`], and a field that does not
//! decode gives no child spans.

use std::fmt::Write as _;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The name of the command span's field that carries the table.
pub const FIELD: &str = "tether.stages";

/// The stages a table may name; a mark is stored as its index here.
pub const NAMES: &[&str] = &[
    "arrive",
    "resolve",
    "grant",
    "claim",
    "checks",
    "policy",
    "dispatch",
    "driver",
    "tether.commit",
];

/// A stage of the evaluation order a trace shows, named by [`NAMES`] at
/// its own index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Stage {
    /// Step 2a: the id, the device, the deadline.
    Arrive = 0,
    /// Step 3: the binding.
    Resolve,
    /// Step 2b: the session's grant.
    Grant,
    /// Step 4: the `command_id` claim.
    Claim,
    /// Steps 5 to 11.
    Checks,
    /// Step 10, inside the checks.
    Policy,
    /// Step 12.
    Dispatch,
    /// The driver call, inside dispatch.
    Driver,
    /// An awaited durable commit.
    Commit,
}

// Each stage's index names it in NAMES.
const _: () = assert!(NAMES.len() == Stage::Commit as usize + 1);

impl Stage {
    /// Its name in a trace.
    #[must_use]
    pub const fn name(self) -> &'static str {
        NAMES[self as usize]
    }
}

/// The most marks one command records (a command runs at most ten; a stage
/// beyond the bound is left out of its trace, nothing else changes).
pub const MARKS_MAX: usize = 32;

const _: () = assert!(NAMES.len() < u8::MAX as usize);

/// One stage of a traced command: its name, the stage it ran inside (an
/// index into the same table; `None` for the command itself), and its
/// start and end in nanoseconds after the command began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    /// One of [`NAMES`].
    pub name: &'static str,
    /// The enclosing stage's index in the table, or `None`: the command.
    pub parent: Option<usize>,
    /// Nanoseconds from the command's start to the stage's start.
    pub start_ns: u64,
    /// Nanoseconds from the command's start to the stage's end (the
    /// table's writing, for a stage still running then: a call left
    /// behind at its deadline).
    pub end_ns: u64,
}

#[derive(Debug)]
struct Open {
    name: u8,
    parent: Option<u8>,
    start_ns: u64,
    end_ns: Option<u64>,
}

#[derive(Debug)]
struct Table {
    base: Instant,
    marks: Vec<Open>,
    /// The stages open now, innermost last (indexes into `marks`).
    open: Vec<u8>,
}

/// A traced command's table, shared by its stages (a driver call that
/// moves to a task of its own takes its mark with it).
#[derive(Debug, Clone)]
pub(crate) struct Stages(Arc<Mutex<Table>>);

tokio::task_local! {
    static CURRENT: Stages;
}

fn since(base: Instant) -> u64 {
    u64::try_from(base.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl Stages {
    /// A table for a command that began at `base`.
    pub(crate) fn new(base: Instant) -> Self {
        Self(Arc::new(Mutex::new(Table {
            base,
            marks: Vec::with_capacity(12),
            open: Vec::with_capacity(4),
        })))
    }

    /// Runs `fut` (the command's order) with this table as its task's.
    pub(crate) async fn scope<F: Future>(self, fut: F) -> F::Output {
        CURRENT.scope(self, fut).await
    }

    fn open(&self, stage: Stage) -> Option<Guard> {
        let name = stage as u8;
        let mut t = self.0.lock().ok()?;
        if t.marks.len() >= MARKS_MAX {
            return None;
        }
        let me = u8::try_from(t.marks.len()).ok()?;
        let start_ns = since(t.base);
        let parent = t.open.last().copied();
        t.marks.push(Open {
            name,
            parent,
            start_ns,
            end_ns: None,
        });
        t.open.push(me);
        Some(Guard {
            stages: self.clone(),
            me,
        })
    }

    /// The table's marks; a stage still open ends now.
    pub(crate) fn marks(&self) -> Vec<Mark> {
        let Ok(t) = self.0.lock() else {
            return Vec::new();
        };
        let now = since(t.base);
        t.marks
            .iter()
            .filter_map(|m| {
                Some(Mark {
                    name: NAMES.get(usize::from(m.name)).copied()?,
                    parent: m.parent.map(usize::from),
                    start_ns: m.start_ns,
                    end_ns: m.end_ns.unwrap_or(now).max(m.start_ns),
                })
            })
            .collect()
    }

    /// The table in its text form (see [`decode`]): each mark as
    /// `name parent start end` (the name's index in [`NAMES`], the parent's
    /// index or `-` for the command), marks separated by `;`. A stage
    /// still open ends now.
    pub(crate) fn encode(&self) -> String {
        let Ok(t) = self.0.lock() else {
            return String::new();
        };
        let now = since(t.base);
        let mut out = String::with_capacity(t.marks.len() * 24);
        for m in &t.marks {
            if !out.is_empty() {
                out.push(';');
            }
            let _ = write!(out, "{} ", m.name);
            match m.parent {
                Some(p) => {
                    let _ = write!(out, "{p} ");
                }
                None => out.push_str("- "),
            }
            let _ = write!(out, "{} {}", m.start_ns, m.end_ns.unwrap_or(now));
        }
        out
    }
}

/// An open stage: ends when dropped.
#[derive(Debug)]
pub(crate) struct Guard {
    stages: Stages,
    me: u8,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let Ok(mut t) = self.stages.0.lock() else {
            return;
        };
        let end = since(t.base);
        if let Some(m) = t.marks.get_mut(usize::from(self.me)) {
            m.end_ns = Some(end);
        }
        // Usually the innermost; a call left behind may end after others.
        if let Some(at) = t.open.iter().rposition(|i| *i == self.me) {
            t.open.remove(at);
        }
    }
}

/// Opens the stage `name` in the current task's table, if its command is
/// traced; the stage ends when the guard is dropped.
pub(crate) fn enter(stage: Stage) -> Option<Guard> {
    CURRENT.try_with(|s| s.open(stage)).ok().flatten()
}

/// Runs a synchronous stage as a mark of its command's table.
pub(crate) fn step<T>(stage: Stage, f: impl FnOnce() -> T) -> T {
    let _stage = enter(stage);
    f()
}

/// Runs an asynchronous stage as a mark of its command's table.
pub(crate) async fn stage<F: Future>(stage: Stage, fut: F) -> F::Output {
    let _stage = enter(stage);
    fut.await
}

/// The marks of a table's text form, each checked: a known name, a parent
/// that comes before it, an end not before its start. `None` when any
/// part does not parse (the exporter then adds no child span), or when the
/// text names more than [`MARKS_MAX`] marks.
#[must_use]
pub fn decode(text: &str) -> Option<Vec<Mark>> {
    let mut marks = Vec::new();
    if text.is_empty() {
        return Some(marks);
    }
    for (i, part) in text.split(';').enumerate() {
        if i >= MARKS_MAX {
            return None;
        }
        let mut f = part.split(' ');
        let name = NAMES.get(f.next()?.parse::<usize>().ok()?)?;
        let parent = match f.next()? {
            "-" => None,
            p => Some(p.parse::<usize>().ok().filter(|p| *p < i)?),
        };
        let start_ns = f.next()?.parse::<u64>().ok()?;
        let end_ns = f.next()?.parse::<u64>().ok()?;
        if f.next().is_some() || end_ns < start_ns {
            return None;
        }
        marks.push(Mark {
            name,
            parent,
            start_ns,
            end_ns,
        });
    }
    Some(marks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_table_records_nested_stages_and_decodes_back() {
        let stages = Stages::new(Instant::now());
        stages
            .clone()
            .scope(async {
                step(Stage::Arrive, || ());
                step(Stage::Checks, || step(Stage::Policy, || ()));
                stage(Stage::Dispatch, async {
                    let _driver = enter(Stage::Driver);
                    step(Stage::Commit, || ());
                })
                .await;
            })
            .await;
        let marks = decode(&stages.encode()).expect("decodes");
        let names: Vec<_> = marks.iter().map(|m| m.name).collect();
        assert_eq!(
            names,
            [
                "arrive",
                "checks",
                "policy",
                "dispatch",
                "driver",
                "tether.commit"
            ]
        );
        let parents: Vec<_> = marks.iter().map(|m| m.parent).collect();
        assert_eq!(
            parents,
            [None, None, Some(1), None, Some(3), Some(4)],
            "{marks:?}"
        );
        for m in &marks {
            assert!(m.start_ns <= m.end_ns, "{m:?}");
            if let Some(p) = m.parent {
                assert!(marks[p].start_ns <= m.start_ns && m.end_ns <= marks[p].end_ns);
            }
        }
    }

    #[tokio::test]
    async fn outside_a_traced_command_a_stage_records_nothing_and_still_runs() {
        assert!(enter(Stage::Arrive).is_none());
        assert_eq!(step(Stage::Arrive, || 7), 7);
        assert_eq!(stage(Stage::Claim, async { 8 }).await, 8);
    }

    #[tokio::test]
    async fn a_table_keeps_at_most_its_bound_and_a_stage_left_open_ends_at_encoding() {
        let stages = Stages::new(Instant::now());
        let left = stages
            .clone()
            .scope(async {
                for _ in 0..MARKS_MAX + 5 {
                    step(Stage::Commit, || ());
                }
                enter(Stage::Driver)
            })
            .await;
        assert!(left.is_none(), "the table was full");
        let marks = decode(&stages.encode()).expect("decodes");
        assert_eq!(marks.len(), MARKS_MAX);
        let open = Stages::new(Instant::now());
        let guard = open.clone().scope(async { enter(Stage::Driver) }).await;
        assert!(guard.is_some());
        let marks = decode(&open.encode()).expect("decodes");
        assert_eq!(marks.len(), 1);
        assert!(marks[0].end_ns >= marks[0].start_ns);
        drop(guard);
    }

    #[test]
    fn text_that_is_not_a_table_decodes_to_nothing() {
        assert_eq!(decode(""), Some(vec![]));
        assert!(decode("0 - 1 2").is_some());
        for bad in [
            "99 - 1 2",
            "0 0 1 2",
            "0 - 2 1",
            "0 - 1",
            "0 - 1 2 3",
            "x - 1 2",
            "0 - 1 2;1 5 3 4",
            "0 - -1 2",
            "0 - 1 2;",
        ] {
            assert!(decode(bad).is_none(), "{bad:?} must not decode");
        }
        let many = vec!["0 - 1 2"; MARKS_MAX + 1].join(";");
        assert!(decode(&many).is_none());
    }
}
