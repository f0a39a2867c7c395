//! The group-commit writer: a bounded queue and one thread that drains it.
//!
//! One fsync costs far more than applying one commit, so the writer takes
//! everything queued (up to [`MAX_BATCH_COMMITS`]), applies it in one
//! transaction, pays one fsync, and only then answers every caller. Under load
//! the batch grows with the number of waiting callers, which is what lets
//! throughput scale past `1 / fsync latency`.
//!
//! A lone caller pays for that thread twice: its commit wakes the parked
//! writer, and the writer's answer wakes the caller's parked thread (about
//! 40 µs each on an idle virtual CPU here). So a caller that waits for its
//! commit with no bound of its own may ask for it to be applied on its own
//! thread ([`Writer::submit_waiting`]): when nothing is queued and no batch
//! is being applied, it applies a batch of one itself, as the writer thread
//! would, and everything that arrives meanwhile queues for the writer thread
//! behind it. Only a backend that allows it ([`Writer::spawn_inline`]) does
//! this, and never on a single-threaded runtime, whose only thread would stop.

use crate::prepare::{prepare, prepare_owned, Prepared};
use crate::{Commit, CommitAck, Done, StoreError};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{JoinHandle, ThreadId};

/// Most commits waiting in the queue; beyond it `submit` answers
/// [`StoreError::Overloaded`] instead of letting memory grow without bound.
pub const QUEUE_CAPACITY: usize = 65_536;

/// Most commits applied in one transaction. Bounds the latency of the first
/// commit in a batch and the size of one transaction.
pub const MAX_BATCH_COMMITS: usize = 4096;

// A full batch must fit in the queue, or the writer could never take one.
const _: () = assert!(MAX_BATCH_COMMITS <= QUEUE_CAPACITY);

/// Counters of a store's writer, for benchmarks and diagnostics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Transactions attempted (each successful one is one fsync for SQLite).
    pub batches: u64,
    /// Commits taken from the queue (succeeded or failed).
    pub commits: u64,
    /// Batches whose transaction failed (every commit in them failed).
    pub failed_batches: u64,
    /// Largest number of commits in one batch.
    pub largest_batch: u64,
    /// Times the writer found the queue empty and slept until a commit came.
    pub idle_waits: u64,
    /// Batches of one applied on the waiting caller's own thread.
    pub inline_batches: u64,
    /// Transactions that committed answered commits the backend held
    /// across batches ([`Backend::held`]; the SQLite store's journal).
    pub settled: u64,
}

/// A storage engine driven by the writer thread.
pub(crate) trait Backend: Send + 'static {
    /// Apply `batch` in one transaction with `ts_ms` as the entries' time.
    ///
    /// On `Ok`, `results` holds one result per job, in order: a commit-local
    /// failure (`Conflict`) means nothing of that commit was stored, and the
    /// others are durable. On `Err`, nothing of the batch is stored and the
    /// backend's chain head is as before the call.
    fn apply_batch(
        &mut self,
        batch: &[Job],
        ts_ms: u64,
        results: &mut Vec<Result<CommitAck, StoreError>>,
    ) -> Result<(), StoreError>;

    /// Whether answered commits wait in a transaction not yet committed
    /// (durable elsewhere: the SQLite store's journal), or a failed commit
    /// of them waits to be applied again; if so, how long the writer lets
    /// them wait while no commit comes before it calls [`Backend::settle`].
    fn held(&self) -> Option<std::time::Duration> {
        None
    }

    /// Whether what is held has reached its bounds and is committed now.
    fn settle_due(&self) -> bool {
        false
    }

    /// Commits what is held (or applies again what a failed commit left).
    /// An error leaves it held: readers are refused meanwhile.
    fn settle(&mut self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// A queued commit and its callback.
pub(crate) struct Job {
    pub commit: Prepared,
    done: Option<Done>,
}

impl Job {
    /// A commit applied again from the store's journal: nobody waits for it.
    pub(crate) fn replayed(commit: Prepared) -> Self {
        Self { commit, done: None }
    }

    fn finish(&mut self, r: Result<CommitAck, StoreError>) {
        if let Some(done) = self.done.take() {
            call_done(done, r);
        }
    }
}

impl Drop for Job {
    /// A job dropped unanswered (writer panic, shutdown race) still answers
    /// its caller: every `done` runs exactly once.
    fn drop(&mut self) {
        self.finish(Err(StoreError::Closed));
    }
}

/// Run a callback, containing a panic in it so one faulty caller cannot kill
/// the writer thread (and with it every later commit).
pub(crate) fn call_done(done: Done, r: Result<CommitAck, StoreError>) {
    let _ = catch_unwind(AssertUnwindSafe(move || done(r)));
}

struct Queue {
    jobs: VecDeque<Job>,
    /// Shutdown requested: refuse new work, drain what is queued, exit.
    closing: bool,
    /// The writer thread has exited (or never started).
    stopped: bool,
    /// The writer is (about to be) parked on the condvar; only then does a
    /// submitter pay for a wake-up syscall.
    writer_waiting: bool,
    /// A batch is being applied (by the writer thread or by a caller on its
    /// own thread), or the store's housekeeping holds the writer
    /// ([`IdleGate`]): nobody else starts one until it is answered.
    busy: bool,
    /// Threads waiting in [`IdleGate::when_idle`] or [`Writer::settle`].
    idle_waiters: usize,
    /// The writer thread's park has a timeout (it commits what the backend
    /// holds once no commit came for a while): no wake-up is needed.
    writer_timed: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Wakes [`IdleGate::when_idle`] when a batch ends with nothing queued.
    idle: Condvar,
    /// The engine; taken by whoever holds [`Queue::busy`], so never
    /// contended. `None` once the writer thread has exited.
    backend: Mutex<Option<Box<dyn Backend>>>,
    /// Whether a waiting caller may apply its own commit (the backend
    /// allows it, and nobody turned it off: [`Writer::set_inline`]).
    inline: std::sync::atomic::AtomicBool,
    /// Whether the backend allows it at all ([`Writer::spawn_inline`]).
    inline_allowed: bool,
    inline_batches: AtomicU64,
    batches: AtomicU64,
    commits: AtomicU64,
    failed_batches: AtomicU64,
    largest_batch: AtomicU64,
    idle_waits: AtomicU64,
    /// The backend holds answered commits not yet committed ([`Backend::held`]):
    /// a read first has them committed ([`Writer::settle`]). Set before the
    /// batch's callers are answered.
    held: AtomicBool,
    /// Readers waiting for what is held to be committed: the batch that
    /// ends next commits it at once.
    settle_asked: AtomicUsize,
    /// Transactions that committed answered commits held across batches.
    settled: AtomicU64,
    /// The writer thread's pause before it commits them, µs (0: none held).
    held_pause_us: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // The queue holds no invariant a panicking holder could break
        // half-way (push/drain are single calls), so a poisoned lock is usable.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies `batch` in one transaction and answers every job in it. The
    /// caller holds [`Queue::busy`]. A backend that panicked before (its
    /// lock poisoned) or is gone answers `Closed`: a transaction cut short
    /// by a panic leaves nothing the next one could trust.
    fn apply(&self, batch: &mut [Job], results: &mut Vec<Result<CommitAck, StoreError>>) {
        let n = batch.len() as u64;
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.commits.fetch_add(n, Ordering::Relaxed);
        self.largest_batch.fetch_max(n, Ordering::Relaxed);
        results.clear();
        let outcome = match self.backend.lock() {
            Ok(mut b) => match b.as_mut() {
                Some(b) => {
                    let r = b.apply_batch(batch, now_ms(), results);
                    // Before any answer: a caller that reads once answered
                    // must find its commit held, and have it committed.
                    self.note_held(b.held());
                    r
                }
                None => Err(StoreError::Closed),
            },
            Err(_) => Err(StoreError::Closed),
        };
        self.answer(batch, results, outcome);
        if self.held.load(Ordering::SeqCst) {
            // A failure is the backend's to report: it keeps what it holds
            // and refuses readers and later batches until it succeeds.
            let _ = self.settle_now(false);
        }
    }

    /// Answers every job of a batch from the backend's outcome.
    fn answer(
        &self,
        batch: &mut [Job],
        results: &mut Vec<Result<CommitAck, StoreError>>,
        outcome: Result<(), StoreError>,
    ) {
        match outcome {
            Ok(()) if results.len() == batch.len() => {
                for (job, r) in batch.iter_mut().zip(results.drain(..)) {
                    job.finish(r);
                }
            }
            Ok(()) => {
                // A backend bug; the batch is committed, but we cannot say
                // what each commit got, so nobody is told it succeeded.
                self.failed_batches.fetch_add(1, Ordering::Relaxed);
                let e = StoreError::Corrupt("store writer lost track of a batch's results".into());
                for job in batch.iter_mut() {
                    job.finish(Err(e.clone()));
                }
            }
            Err(e) => {
                self.failed_batches.fetch_add(1, Ordering::Relaxed);
                for job in batch.iter_mut() {
                    job.finish(Err(e.clone()));
                }
            }
        }
    }

    /// Commits what the backend holds, when a reader waits for it, its
    /// bounds are reached, or `always`; the caller holds [`Queue::busy`].
    /// A failure leaves it held (readers are refused until it succeeds).
    fn settle_now(&self, always: bool) -> Result<(), StoreError> {
        let Ok(mut guard) = self.backend.lock() else {
            return Err(StoreError::Closed);
        };
        let Some(b) = guard.as_mut() else {
            return Err(StoreError::Closed);
        };
        if b.held().is_none() {
            self.note_held(None);
            return Ok(());
        }
        let asked = self.settle_asked.load(Ordering::SeqCst) > 0;
        if !(always || asked || b.settle_due()) {
            return Ok(());
        }
        let r = b.settle();
        if r.is_ok() {
            self.settled.fetch_add(1, Ordering::Relaxed);
        }
        self.note_held(b.held());
        r
    }

    /// Records whether the backend holds answered commits, and the writer
    /// thread's pause before it commits them.
    fn note_held(&self, pause: Option<std::time::Duration>) {
        let us = pause.map_or(0, |p| {
            u64::try_from(p.as_micros()).unwrap_or(u64::MAX).max(1)
        });
        self.held_pause_us.store(us, Ordering::SeqCst);
        self.held.store(pause.is_some(), Ordering::SeqCst);
    }

    /// One wait for a batch (or housekeeping) to end, counted among the
    /// [`Queue::idle_waiters`] that [`Shared::release`] wakes; `None` (the
    /// queue's lock given back) once `deadline` has passed.
    fn wait_idle<'a>(
        &'a self,
        mut q: MutexGuard<'a, Queue>,
        deadline: std::time::Instant,
    ) -> Option<MutexGuard<'a, Queue>> {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return None;
        }
        q.idle_waiters += 1;
        let (mut q, _) = self
            .idle
            .wait_timeout(q, left)
            .unwrap_or_else(|p| p.into_inner());
        q.idle_waiters -= 1;
        Some(q)
    }

    /// Ends a batch: frees [`Queue::busy`] and wakes the writer thread if
    /// commits queued meanwhile and it is parked, or if the backend holds
    /// answered commits and its park has no timeout (it must commit them
    /// once the callers pause).
    fn release(&self) {
        let mut q = self.lock();
        q.busy = false;
        let held = self.held.load(Ordering::SeqCst);
        let wake = q.writer_waiting
            && (!q.jobs.is_empty() || q.closing || q.stopped || (held && !q.writer_timed));
        let idle = q.idle_waiters > 0 && (q.jobs.is_empty() || !held);
        drop(q);
        if wake {
            self.wake.notify_one();
        }
        if idle {
            self.idle.notify_all();
        }
    }
}

/// Whether this thread may block for a commit: a plain thread, or a worker
/// of a multi-threaded runtime (which hands its other tasks to another
/// thread meanwhile, [`tokio::task::block_in_place`]). A single-threaded
/// runtime would stop every task it runs.
fn may_block_here() -> Option<bool> {
    match tokio::runtime::Handle::try_current() {
        Err(_) => Some(false),
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => Some(true),
        Ok(_) => None,
    }
}

/// Handle to the writer thread; dropping it drains the queue and joins.
pub(crate) struct Writer {
    shared: Arc<Shared>,
    handle: Option<JoinHandle<()>>,
    thread_id: Option<ThreadId>,
}

impl Writer {
    fn new_shared(stopped: bool, backend: Option<Box<dyn Backend>>, inline: bool) -> Arc<Shared> {
        Arc::new(Shared {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                closing: false,
                stopped,
                writer_waiting: false,
                busy: false,
                idle_waiters: 0,
                writer_timed: false,
            }),
            wake: Condvar::new(),
            idle: Condvar::new(),
            backend: Mutex::new(backend),
            inline: std::sync::atomic::AtomicBool::new(inline),
            inline_allowed: inline,
            inline_batches: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            failed_batches: AtomicU64::new(0),
            largest_batch: AtomicU64::new(0),
            idle_waits: AtomicU64::new(0),
            held: AtomicBool::new(false),
            settle_asked: AtomicUsize::new(0),
            settled: AtomicU64::new(0),
            held_pause_us: AtomicU64::new(0),
        })
    }

    /// Start the writer thread around `backend`.
    pub(crate) fn spawn<B: Backend>(backend: B, name: &str) -> Result<Writer, StoreError> {
        Self::start(Box::new(backend), name, false)
    }

    /// [`Writer::spawn`] for a backend whose batches may also be applied on
    /// a waiting caller's thread ([`Writer::submit_waiting`]): one that does
    /// not block on an async runtime of its own.
    pub(crate) fn spawn_inline<B: Backend>(backend: B, name: &str) -> Result<Writer, StoreError> {
        Self::start(Box::new(backend), name, true)
    }

    fn start(backend: Box<dyn Backend>, name: &str, inline: bool) -> Result<Writer, StoreError> {
        let shared = Self::new_shared(false, Some(backend), inline);
        let for_thread = Arc::clone(&shared);
        let handle = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || run(&for_thread))
            .map_err(|e| StoreError::Io(format!("cannot start the store writer thread: {e}")))?;
        let thread_id = Some(handle.thread().id());
        Ok(Writer {
            shared,
            handle: Some(handle),
            thread_id,
        })
    }

    /// A writer that refuses everything with [`StoreError::Closed`].
    pub(crate) fn stopped() -> Writer {
        Writer {
            shared: Self::new_shared(true, None, false),
            handle: None,
            thread_id: None,
        }
    }

    pub(crate) fn submit(&self, commit: &Commit, done: Done) {
        self.enqueue(prepare(commit), done, false);
    }

    /// [`Writer::submit`] for a commit given up: moved, not copied.
    pub(crate) fn submit_owned(&self, commit: Commit, done: Done) {
        self.enqueue(prepare_owned(commit), done, false);
    }

    /// [`Writer::submit_owned`] from a caller that waits for the answer
    /// with no bound of its own: when the writer is idle and the backend
    /// allows it, the commit is applied on this thread before this returns
    /// (module docs). Never for a wait with a deadline (an e-stop's latch):
    /// a slow disk would hold the caller past it.
    pub(crate) fn submit_waiting(&self, commit: Commit, done: Done) {
        self.enqueue(prepare_owned(commit), done, true);
    }

    /// [`Writer::submit`] for a waiting caller ([`Writer::submit_waiting`]).
    pub(crate) fn submit_ref_waiting(&self, commit: &Commit, done: Done) {
        self.enqueue(prepare(commit), done, true);
    }

    /// Queues a prepared commit (or answers why it could not be prepared).
    fn enqueue(&self, commit: Result<Prepared, StoreError>, done: Done, waiting: bool) {
        let commit = match commit {
            Ok(c) => c,
            Err(e) => return call_done(done, Err(e)),
        };
        let mut q = self.shared.lock();
        if q.closing || q.stopped {
            drop(q);
            return call_done(done, Err(StoreError::Closed));
        }
        if q.jobs.len() >= QUEUE_CAPACITY {
            drop(q);
            return call_done(done, Err(StoreError::Overloaded));
        }
        let job = Job {
            commit,
            done: Some(done),
        };
        let inline = waiting && self.shared.inline.load(Ordering::Relaxed);
        if inline && q.jobs.is_empty() && !q.busy {
            if let Some(in_runtime) = may_block_here() {
                q.busy = true;
                drop(q);
                return self.apply_here(job, in_runtime);
            }
        }
        q.jobs.push_back(job);
        let wake = q.writer_waiting;
        drop(q);
        if wake {
            self.shared.wake.notify_one();
        }
    }

    /// Applies `job` as a batch of one on this thread; the caller took
    /// [`Queue::busy`]. A panic in the backend stops the writer as one on
    /// its own thread would: every queued commit is answered `Closed`.
    fn apply_here(&self, job: Job, in_runtime: bool) {
        let shared = &self.shared;
        shared.inline_batches.fetch_add(1, Ordering::Relaxed);
        let mut job = Some(job);
        // `None` once the job is gone: it was applied (or answered) before.
        let mut apply = || -> Option<bool> {
            let mut batch = [job.take()?];
            let mut results = Vec::with_capacity(1);
            Some(catch_unwind(AssertUnwindSafe(|| shared.apply(&mut batch, &mut results))).is_ok())
        };
        let first = if in_runtime {
            // tokio refuses to block in place on a thread that runs another
            // runtime's `block_on` (it panics before calling `apply`); the
            // commit is then applied here all the same.
            catch_unwind(AssertUnwindSafe(|| tokio::task::block_in_place(&mut apply)))
                .ok()
                .flatten()
        } else {
            apply()
        };
        let applied = match first {
            Some(ok) => ok,
            None => apply().unwrap_or(true),
        };
        if !applied {
            let left: Vec<Job> = {
                let mut q = shared.lock();
                q.stopped = true;
                q.jobs.drain(..).collect()
            };
            drop(left);
        }
        shared.release();
    }

    /// Before a read: has the answered commits the backend holds committed,
    /// so that the read finds every commit answered before it began. Waits
    /// for a batch being applied (at most `wait`); the next batch to end
    /// commits them for it. Fails when they cannot be committed (the read
    /// would miss answered commits) or the wait runs out. Never from a
    /// `done` callback: on the thread applying the batch it would wait for
    /// itself until `wait` ran out.
    pub(crate) fn settle(&self, wait: std::time::Duration) -> Result<(), StoreError> {
        let shared = &self.shared;
        if !shared.held.load(Ordering::SeqCst) {
            return Ok(());
        }
        let deadline = std::time::Instant::now() + wait;
        shared.settle_asked.fetch_add(1, Ordering::SeqCst);
        let mut q = shared.lock();
        // Each round waits for the batch being applied to end: bounded by
        // the deadline.
        let ready = loop {
            if !shared.held.load(Ordering::SeqCst) {
                break false;
            }
            if q.stopped {
                break false;
            }
            if !q.busy {
                break true;
            }
            let Some(guard) = shared.wait_idle(q, deadline) else {
                shared.settle_asked.fetch_sub(1, Ordering::SeqCst);
                return Err(StoreError::Io(format!(
                    "answered commits were not committed within {} ms for a read",
                    wait.as_millis()
                )));
            };
            q = guard;
        };
        if !ready {
            drop(q);
            shared.settle_asked.fetch_sub(1, Ordering::SeqCst);
            return Ok(());
        }
        q.busy = true;
        drop(q);
        let r = shared.settle_now(true);
        shared.settle_asked.fetch_sub(1, Ordering::SeqCst);
        shared.release();
        r
    }

    /// A handle that runs housekeeping while no commit is being applied
    /// ([`IdleGate::when_idle`]).
    pub(crate) fn idle_gate(&self) -> IdleGate {
        IdleGate(Arc::clone(&self.shared))
    }

    /// Turns off (or back on, for a backend that allows it) the batches
    /// applied on a waiting caller's thread: benchmarks compare the two.
    pub(crate) fn set_inline(&self, on: bool) {
        let on = on && self.shared.inline_allowed;
        self.shared.inline.store(on, Ordering::Relaxed);
    }

    pub(crate) fn stats(&self) -> WriterStats {
        let s = &self.shared;
        WriterStats {
            batches: s.batches.load(Ordering::Relaxed),
            commits: s.commits.load(Ordering::Relaxed),
            failed_batches: s.failed_batches.load(Ordering::Relaxed),
            largest_batch: s.largest_batch.load(Ordering::Relaxed),
            idle_waits: s.idle_waits.load(Ordering::Relaxed),
            inline_batches: s.inline_batches.load(Ordering::Relaxed),
            settled: s.settled.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.shared.lock().closing = true;
        self.shared.wake.notify_all();
        // The last handle can be dropped from a `done` callback, i.e. on the
        // writer thread itself; joining there would deadlock. The thread then
        // exits on its own once the queue is drained.
        if self.thread_id == Some(std::thread::current().id()) {
            return;
        }
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Runs the store's housekeeping between batches: while it runs, no commit
/// is applied, and commits queue for the writer thread. SQLite's checkpoint
/// uses it: a checkpoint that no commit overlaps copies the whole WAL back,
/// so the next commit starts the WAL again from its beginning, overwriting
/// what is there instead of growing the file (a write that grows the file
/// makes its `fdatasync` flush the file's size too: a second flush).
#[derive(Clone)]
pub(crate) struct IdleGate(Arc<Shared>);

impl IdleGate {
    /// Runs `f` once the writer is idle (nothing queued, no batch being
    /// applied), holding it idle meanwhile; `None`, without running `f`,
    /// when it does not become idle within `wait` or has stopped.
    pub(crate) fn when_idle<R>(
        &self,
        wait: std::time::Duration,
        f: impl FnOnce() -> R,
    ) -> Option<R> {
        let shared = &self.0;
        let deadline = std::time::Instant::now() + wait;
        let mut q = shared.lock();
        loop {
            if q.stopped || q.closing {
                return None;
            }
            if !q.busy && q.jobs.is_empty() {
                break;
            }
            q = shared.wait_idle(q, deadline)?;
        }
        q.busy = true;
        drop(q);
        // Housekeeping sees the database with every answered commit in it
        // (a checkpoint that overlaps no open transaction).
        let _ = shared.settle_now(true);
        // A panic in `f` must still free the writer.
        struct Release<'a>(&'a Shared);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                self.0.release();
            }
        }
        let _release = Release(shared);
        Some(f())
    }
}

/// Marks the writer stopped when its thread exits, normally or by panic, and
/// answers whatever is still queued with `Closed` (via `Job::drop`).
struct StopGuard(Arc<Shared>);

impl Drop for StopGuard {
    fn drop(&mut self) {
        let left: Vec<Job> = {
            let mut q = self.0.lock();
            q.stopped = true;
            q.jobs.drain(..).collect()
        };
        drop(left);
        // The engine closes here, on the writer thread, as it always did;
        // nobody holds `busy` once the queue is stopped and drained.
        let backend = match self.0.backend.lock() {
            Ok(mut b) => b.take(),
            Err(p) => p.into_inner().take(),
        };
        drop(backend);
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The writer thread's wait for work. While the backend holds answered
/// commits, the wait has a timeout: when no batch came during it, the
/// callers have paused, and the thread commits what is held.
fn park<'a>(shared: &'a Shared, mut q: MutexGuard<'a, Queue>) -> MutexGuard<'a, Queue> {
    // Timed also while a caller applies a batch: then its end needs no
    // wake-up of this thread.
    let pause = match shared.held_pause_us.load(Ordering::SeqCst) {
        0 => None,
        us => Some(std::time::Duration::from_micros(us)),
    };
    let Some(pause) = pause else {
        q.writer_waiting = true;
        q = shared.wake.wait(q).unwrap_or_else(|p| p.into_inner());
        q.writer_waiting = false;
        return q;
    };
    let seen = shared.batches.load(Ordering::Relaxed);
    q.writer_waiting = true;
    q.writer_timed = true;
    let (mut q, _) = shared
        .wake
        .wait_timeout(q, pause)
        .unwrap_or_else(|p| p.into_inner());
    q.writer_waiting = false;
    q.writer_timed = false;
    let paused = shared.batches.load(Ordering::Relaxed) == seen;
    if paused && q.jobs.is_empty() && !q.busy && !q.stopped {
        q.busy = true;
        drop(q);
        // A failure is kept by the backend; tried again after the next pause.
        let _ = shared.settle_now(true);
        shared.release();
        q = shared.lock();
    }
    q
}

fn run(shared: &Arc<Shared>) {
    let _guard = StopGuard(Arc::clone(shared));
    let mut batch: Vec<Job> = Vec::with_capacity(256);
    let mut results: Vec<Result<CommitAck, StoreError>> = Vec::with_capacity(256);
    loop {
        {
            let mut q = shared.lock();
            // Park until there is work and nobody else is applying a batch;
            // exit once shutdown is requested and the queue is drained, or
            // at once when a batch applied on a caller's thread panicked.
            if q.jobs.is_empty() && !q.closing {
                shared.idle_waits.fetch_add(1, Ordering::Relaxed);
            }
            while q.jobs.is_empty() || q.busy {
                if q.stopped || (q.closing && q.jobs.is_empty() && !q.busy) {
                    return;
                }
                q = park(shared, q);
            }
            if q.stopped {
                return;
            }
            q.busy = true;
            let n = q.jobs.len().min(MAX_BATCH_COMMITS);
            batch.extend(q.jobs.drain(..n));
        }
        shared.apply(&mut batch, &mut results);
        batch.clear();
        shared.release();
    }
}

#[cfg(test)]
mod tests;
