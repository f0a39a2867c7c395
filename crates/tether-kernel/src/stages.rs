//! The stages a traced command ran, as timings carried with its span
//! (issue 22 §2, docs/TELEMETRY.md).
//!
//! A trace shows each stage of the evaluation order that ran (`arrive`,
//! `resolve`, `grant`, `claim`, `checks` and its `policy`, `dispatch` and
//! its `driver`, each durable `tether.commit`) as a child span of the
//! command. Built one by one on the caller's thread, those ten spans would
//! cost more CPU than the command itself. Here a stage is a [`Mark`]
//! instead: a slot in a fixed table of atomics the command's task holds,
//! written with two clock reads and a few plain stores (no lock, no
//! allocation past the table's one). When the command ends,
//! [`Kernel::command`](crate::Kernel) seals the table into [`Marks`] and
//! hands it over with its trace span (`crate::trace`); the exporter
//! (`tether_server::telemetry`, on its own thread) reads it there and
//! writes each mark as a child span. For logs the table is also written,
//! as text ([`decode`] reads it back), on the command's `tracing` span as
//! the field [`FIELD`].
//!
//! **Owns:** the table, its text form and the names of the stages.
//! **Never belongs here:** OpenTelemetry types (the exporter's), what a
//! stage does (the stage modules).
//! **Fail-closed rule:** nothing here can refuse or delay a command: with
//! no traced span there is no table (one task-local lookup per stage), a
//! full table drops marks beyond [`MARKS_MAX`], a stage whose guard ends
//! outside its table's task is closed by the seal, and a field that does
//! not decode gives no child spans.

use std::fmt::Write as _;
use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
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
// A slot's head packs a name and a parent (index + 1) into a byte each.
const _: () = assert!(MARKS_MAX < u8::MAX as usize);

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
    /// table's sealing, for a stage still running then: a call left
    /// behind at its deadline).
    pub end_ns: u64,
}

/// A slot's head once its stage opened: the name's index in the low byte,
/// the parent's index + 1 (0: the command) in the next one.
const OPENED: u32 = 1 << 16;

/// One mark as the table holds it. Atomics, not a lock: a stage's open
/// and end are a few plain stores, and a driver call left behind in a task
/// of its own may still end its stage while the exporter reads the rest.
#[derive(Debug, Default)]
struct Slot {
    /// 0 until the stage opens, then `OPENED | parent + 1 << 8 | name`.
    head: AtomicU32,
    start_ns: AtomicU64,
    /// The end + 1; 0 while the stage runs.
    end_ns: AtomicU64,
}

#[derive(Debug)]
struct Table {
    base: Instant,
    /// Slots handed out (those past [`MARKS_MAX`] were refused).
    len: AtomicUsize,
    /// The innermost stage open now: its index + 1, or 0 for none.
    top: AtomicUsize,
    slots: [Slot; MARKS_MAX],
}

/// A traced command's table, shared by its stages (a driver call that
/// moves to a task of its own carries it there, see [`carry`]).
#[derive(Debug, Clone)]
pub(crate) struct Stages(Arc<Table>);

tokio::task_local! {
    static CURRENT: Stages;
}

fn since(base: Instant) -> u64 {
    u64::try_from(base.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// A slot's parent, from its head.
fn parent_of(head: u32) -> Option<usize> {
    usize::try_from((head >> 8) & 0xff).ok()?.checked_sub(1)
}

impl Table {
    /// Opens a stage under the innermost open one; its slot's index, or
    /// `None` when the table is full. Only the command's own task opens
    /// stages, so the slots below `len` are written in order.
    fn open(&self, stage: Stage) -> Option<usize> {
        if self.len.load(Ordering::Relaxed) >= MARKS_MAX {
            return None;
        }
        let me = self.len.fetch_add(1, Ordering::Relaxed);
        let slot = self.slots.get(me)?;
        let parent = self.top.load(Ordering::Relaxed).min(me);
        slot.start_ns.store(since(self.base), Ordering::Relaxed);
        let parent = u32::try_from(parent).unwrap_or(0);
        slot.head
            .store(OPENED | parent << 8 | stage as u32, Ordering::Relaxed);
        self.top.store(me + 1, Ordering::Relaxed);
        Some(me)
    }

    /// Ends the stage in slot `me`; when it was the innermost, the
    /// innermost becomes the nearest enclosing stage still open.
    fn close(&self, me: usize) {
        let Some(slot) = self.slots.get(me) else {
            return;
        };
        let end = since(self.base).saturating_add(1);
        slot.end_ns.store(end, Ordering::Relaxed);
        // Usually the innermost; a call left behind may end after others.
        if self.top.load(Ordering::Relaxed) != me + 1 {
            return;
        }
        let mut up = parent_of(slot.head.load(Ordering::Relaxed));
        // Parents have smaller indexes: the walk ends within the table.
        for _ in 0..MARKS_MAX {
            match up.and_then(|p| self.slots.get(p)) {
                Some(s) if s.end_ns.load(Ordering::Relaxed) != 0 => {
                    up = parent_of(s.head.load(Ordering::Relaxed));
                }
                _ => break,
            }
        }
        self.top.store(up.map_or(0, |p| p + 1), Ordering::Relaxed);
    }

    /// The slots opened, in order from the first: those a seal holds (a
    /// mark's parent always comes before it).
    fn opened(&self) -> usize {
        let claimed = self.len.load(Ordering::Relaxed).min(MARKS_MAX);
        self.slots[..claimed]
            .iter()
            .take_while(|s| s.head.load(Ordering::Relaxed) & OPENED != 0)
            .count()
    }

    /// Slot `i` as a mark (its name's index beside it), a stage still
    /// open, or ending after `now`, ending at `now`; `None` for a slot not
    /// opened.
    fn read(&self, i: usize, now: u64) -> Option<(usize, Mark)> {
        let slot = self.slots.get(i)?;
        let head = slot.head.load(Ordering::Relaxed);
        if head & OPENED == 0 {
            return None;
        }
        let index = usize::try_from(head & 0xff).ok()?;
        let start_ns = slot.start_ns.load(Ordering::Relaxed);
        let end_ns = match slot.end_ns.load(Ordering::Relaxed) {
            0 => now,
            e => (e - 1).min(now),
        };
        let mark = Mark {
            name: NAMES.get(index).copied()?,
            parent: parent_of(head).filter(|p| *p < i),
            start_ns,
            end_ns: end_ns.max(start_ns),
        };
        Some((index, mark))
    }
}

impl Stages {
    /// A table for a command that began at `base`.
    pub(crate) fn new(base: Instant) -> Self {
        Self(Arc::new(Table {
            base,
            len: AtomicUsize::new(0),
            top: AtomicUsize::new(0),
            slots: Default::default(),
        }))
    }

    /// Runs `fut` (the command's order) with this table as its task's.
    pub(crate) async fn scope<F: Future>(self, fut: F) -> F::Output {
        CURRENT.scope(self, fut).await
    }

    /// The table's marks as of now, for the command's trace span: a stage
    /// still open (or ending later) ends now. Copies nothing: the exporter
    /// reads the table on its own thread.
    pub(crate) fn seal(&self) -> Marks {
        Marks(Repr::Sealed {
            table: Arc::clone(&self.0),
            len: self.0.opened(),
            now: since(self.0.base),
        })
    }

    /// The table in its text form (see [`decode`]): each mark as
    /// `name parent start end` (the name's index in [`NAMES`], the parent's
    /// index or `-` for the command), marks separated by `;`. A stage
    /// still open ends now.
    pub(crate) fn encode(&self) -> String {
        let table = &self.0;
        let now = since(table.base);
        let len = table.opened();
        let mut out = String::with_capacity(len * 24);
        for (index, m) in (0..len).filter_map(|i| table.read(i, now)) {
            if !out.is_empty() {
                out.push(';');
            }
            let _ = write!(out, "{index} ");
            match m.parent {
                Some(p) => {
                    let _ = write!(out, "{p} ");
                }
                None => out.push_str("- "),
            }
            let _ = write!(out, "{} {}", m.start_ns, m.end_ns);
        }
        out
    }
}

/// A command's marks as its trace span carries them to the exporter:
/// its sealed table, or (in tests and for spans built elsewhere) a list.
#[derive(Debug, Clone)]
pub struct Marks(Repr);

impl Default for Marks {
    /// No marks (an empty list allocates nothing).
    fn default() -> Self {
        Self(Repr::Listed(Vec::new()))
    }
}

#[derive(Debug, Clone)]
enum Repr {
    Listed(Vec<Mark>),
    Sealed {
        table: Arc<Table>,
        len: usize,
        now: u64,
    },
}

impl Marks {
    /// How many marks.
    #[must_use]
    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::Listed(list) => list.len(),
            Repr::Sealed { len, .. } => *len,
        }
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Mark `i`, in the order the stages opened.
    #[must_use]
    pub fn get(&self, i: usize) -> Option<Mark> {
        match &self.0 {
            Repr::Listed(list) => list.get(i).cloned(),
            Repr::Sealed { table, len, now } if i < *len => table.read(i, *now).map(|(_, m)| m),
            Repr::Sealed { .. } => None,
        }
    }

    /// The marks in order.
    pub fn iter(&self) -> impl Iterator<Item = Mark> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }
}

impl From<Vec<Mark>> for Marks {
    fn from(list: Vec<Mark>) -> Self {
        Self(Repr::Listed(list))
    }
}

/// An open stage: ends when dropped, in the table of the task it is
/// dropped in (the task that opened it, or one it was [`carry`]-ed into).
#[derive(Debug)]
pub(crate) struct Guard {
    me: usize,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = CURRENT.try_with(|s| s.0.close(self.me));
    }
}

/// Opens the stage `name` in the current task's table, if its command is
/// traced; the stage ends when the guard is dropped.
pub(crate) fn enter(stage: Stage) -> Option<Guard> {
    let me = CURRENT.try_with(|s| s.0.open(stage)).ok().flatten()?;
    Some(Guard { me })
}

/// `fut` with the calling task's table, for a task of its own: a stage
/// opened here and ended there (a driver call moved to its own task) ends
/// in the right table.
pub(crate) fn carry<F: Future>(fut: F) -> impl Future<Output = F::Output> {
    let here = CURRENT.try_with(Clone::clone).ok();
    async move {
        match here {
            Some(s) => s.scope(fut).await,
            None => fut.await,
        }
    }
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
        // The exporter's read of the sealed table says what the text says.
        let sealed = stages.seal();
        assert_eq!(sealed.len(), marks.len());
        let read: Vec<_> = sealed.iter().map(|m| (m.name, m.parent)).collect();
        let text: Vec<_> = marks.iter().map(|m| (m.name, m.parent)).collect();
        assert_eq!(read, text);
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

    #[tokio::test]
    async fn a_stage_carried_into_a_task_of_its_own_ends_there_and_never_after_the_seal() {
        let stages = Stages::new(Instant::now());
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let call = stages
            .clone()
            .scope(async {
                let dispatch = enter(Stage::Dispatch);
                let driver = enter(Stage::Driver);
                let call = tokio::spawn(carry(async move {
                    let _driver = driver;
                    let _ = wait.await;
                }));
                // The command leaves the call behind; its next stage hangs
                // under the stage still open (as a trace of it would show).
                drop(dispatch);
                step(Stage::Commit, || ());
                // Not a future itself: the test awaits it later.
                Some(call)
            })
            .await
            .expect("the call's handle");
        let early = stages.seal();
        let m: Vec<_> = early.iter().collect();
        assert_eq!(m.len(), 3, "{m:?}");
        assert_eq!((m[1].name, m[1].parent), ("driver", Some(0)));
        assert_eq!((m[2].name, m[2].parent), ("tether.commit", Some(1)));
        go.send(()).expect("the call waits");
        call.await.expect("the call ends");
        // Ended in its own task, in the command's table.
        let late = stages.seal();
        let Repr::Sealed { table, .. } = &late.0 else {
            panic!("a sealed table");
        };
        assert_ne!(table.slots[1].end_ns.load(Ordering::Relaxed), 0);
        // A seal taken before the end keeps its own view: no mark of it
        // ends after it.
        let before = early.get(1).expect("the driver mark");
        let Repr::Sealed { now, .. } = &early.0 else {
            panic!("a sealed table");
        };
        assert!(before.end_ns <= *now);
        assert!(early.iter().all(|m| m.end_ns <= *now));
    }

    #[test]
    fn a_list_of_marks_reads_as_itself() {
        let list = vec![Mark {
            name: "checks",
            parent: None,
            start_ns: 1,
            end_ns: 2,
        }];
        let marks = Marks::from(list.clone());
        assert_eq!(marks.iter().collect::<Vec<_>>(), list);
        assert!(Marks::default().is_empty());
        assert!(marks.get(1).is_none());
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
