//! The group-commit writer: a bounded queue and one thread that drains it.
//!
//! One fsync costs far more than applying one commit, so the writer takes
//! everything queued (up to [`MAX_BATCH_COMMITS`]), applies it in one
//! transaction, pays one fsync, and only then answers every caller. Under load
//! the batch grows with the number of waiting callers, which is what lets
//! throughput scale past `1 / fsync latency`.

use crate::prepare::{prepare, prepare_owned, Prepared};
use crate::{Commit, CommitAck, Done, StoreError};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
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
}

/// A queued commit and its callback.
pub(crate) struct Job {
    pub commit: Prepared,
    done: Option<Done>,
}

impl Job {
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
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    batches: AtomicU64,
    commits: AtomicU64,
    failed_batches: AtomicU64,
    largest_batch: AtomicU64,
    idle_waits: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // The queue holds no invariant a panicking holder could break
        // half-way (push/drain are single calls), so a poisoned lock is usable.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Handle to the writer thread; dropping it drains the queue and joins.
pub(crate) struct Writer {
    shared: Arc<Shared>,
    handle: Option<JoinHandle<()>>,
    thread_id: Option<ThreadId>,
}

impl Writer {
    fn new_shared(stopped: bool) -> Arc<Shared> {
        Arc::new(Shared {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                closing: false,
                stopped,
                writer_waiting: false,
            }),
            wake: Condvar::new(),
            batches: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            failed_batches: AtomicU64::new(0),
            largest_batch: AtomicU64::new(0),
            idle_waits: AtomicU64::new(0),
        })
    }

    /// Start the writer thread around `backend`.
    pub(crate) fn spawn<B: Backend>(backend: B, name: &str) -> Result<Writer, StoreError> {
        let shared = Self::new_shared(false);
        let for_thread = Arc::clone(&shared);
        let handle = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || run(for_thread, backend))
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
            shared: Self::new_shared(true),
            handle: None,
            thread_id: None,
        }
    }

    pub(crate) fn submit(&self, commit: &Commit, done: Done) {
        match prepare(commit) {
            Ok(c) => self.enqueue(c, done),
            Err(e) => call_done(done, Err(e)),
        }
    }

    /// [`Writer::submit`] for a commit given up: moved, not copied.
    pub(crate) fn submit_owned(&self, commit: Commit, done: Done) {
        match prepare_owned(commit) {
            Ok(c) => self.enqueue(c, done),
            Err(e) => call_done(done, Err(e)),
        }
    }

    fn enqueue(&self, commit: Prepared, done: Done) {
        let mut q = self.shared.lock();
        if q.closing || q.stopped {
            drop(q);
            return call_done(done, Err(StoreError::Closed));
        }
        if q.jobs.len() >= QUEUE_CAPACITY {
            drop(q);
            return call_done(done, Err(StoreError::Overloaded));
        }
        q.jobs.push_back(Job {
            commit,
            done: Some(done),
        });
        let wake = q.writer_waiting;
        drop(q);
        if wake {
            self.shared.wake.notify_one();
        }
    }

    pub(crate) fn stats(&self) -> WriterStats {
        let s = &self.shared;
        WriterStats {
            batches: s.batches.load(Ordering::Relaxed),
            commits: s.commits.load(Ordering::Relaxed),
            failed_batches: s.failed_batches.load(Ordering::Relaxed),
            largest_batch: s.largest_batch.load(Ordering::Relaxed),
            idle_waits: s.idle_waits.load(Ordering::Relaxed),
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
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn run<B: Backend>(shared: Arc<Shared>, mut backend: B) {
    let _guard = StopGuard(Arc::clone(&shared));
    let mut batch: Vec<Job> = Vec::with_capacity(256);
    let mut results: Vec<Result<CommitAck, StoreError>> = Vec::with_capacity(256);
    loop {
        {
            let mut q = shared.lock();
            // Park until there is work; exit once shutdown is requested and
            // the queue is drained.
            if q.jobs.is_empty() && !q.closing {
                shared.idle_waits.fetch_add(1, Ordering::Relaxed);
            }
            while q.jobs.is_empty() {
                if q.closing {
                    return;
                }
                q.writer_waiting = true;
                q = shared.wake.wait(q).unwrap_or_else(|p| p.into_inner());
                q.writer_waiting = false;
            }
            let n = q.jobs.len().min(MAX_BATCH_COMMITS);
            batch.extend(q.jobs.drain(..n));
        }

        let n = batch.len() as u64;
        shared.batches.fetch_add(1, Ordering::Relaxed);
        shared.commits.fetch_add(n, Ordering::Relaxed);
        shared.largest_batch.fetch_max(n, Ordering::Relaxed);

        results.clear();
        match backend.apply_batch(&batch, now_ms(), &mut results) {
            Ok(()) if results.len() == batch.len() => {
                for (job, r) in batch.iter_mut().zip(results.drain(..)) {
                    job.finish(r);
                }
            }
            Ok(()) => {
                // A backend bug; the batch is committed, but we cannot say
                // what each commit got, so nobody is told it succeeded.
                shared.failed_batches.fetch_add(1, Ordering::Relaxed);
                let e = StoreError::Corrupt("store writer lost track of a batch's results".into());
                for job in batch.iter_mut() {
                    job.finish(Err(e.clone()));
                }
            }
            Err(e) => {
                shared.failed_batches.fetch_add(1, Ordering::Relaxed);
                for job in batch.iter_mut() {
                    job.finish(Err(e.clone()));
                }
            }
        }
        batch.clear();
    }
}
