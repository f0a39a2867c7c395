//! The writer's own tests: a probe backend that notes where each batch ran.

use super::*;
use crate::Commit;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::time::Duration;

/// Answers every commit, noting the thread it ran on; panics when told.
struct Probe {
    threads: Arc<Mutex<Vec<ThreadId>>>,
    panic_next: Arc<AtomicBool>,
    delay: Duration,
}

impl Backend for Probe {
    fn apply_batch(
        &mut self,
        batch: &[Job],
        _ts_ms: u64,
        results: &mut Vec<Result<CommitAck, StoreError>>,
    ) -> Result<(), StoreError> {
        assert!(
            !self.panic_next.swap(false, Ordering::SeqCst),
            "a backend that panics"
        );
        std::thread::sleep(self.delay);
        for _ in batch {
            self.threads
                .lock()
                .unwrap()
                .push(std::thread::current().id());
            results.push(Ok(CommitAck {
                first_seq: 1,
                last_seq: 0,
                head_hash: String::new(),
            }));
        }
        Ok(())
    }
}

struct Rig {
    writer: Writer,
    threads: Arc<Mutex<Vec<ThreadId>>>,
    panic_next: Arc<AtomicBool>,
}

fn rig(inline: bool, delay: Duration) -> Rig {
    let threads = Arc::new(Mutex::new(Vec::new()));
    let panic_next = Arc::new(AtomicBool::new(false));
    let probe = Probe {
        threads: Arc::clone(&threads),
        panic_next: Arc::clone(&panic_next),
        delay,
    };
    let writer = if inline {
        Writer::spawn_inline(probe, "probe-writer").unwrap()
    } else {
        Writer::spawn(probe, "probe-writer").unwrap()
    };
    Rig {
        writer,
        threads,
        panic_next,
    }
}

/// Submits a waiting commit; whether it was answered before `submit`
/// returned, and the answer.
fn submit_waiting(w: &Writer) -> (bool, Result<CommitAck, StoreError>) {
    let (tx, rx) = mpsc::channel();
    w.submit_waiting(Commit::default(), Box::new(move |r| tx.send(r).unwrap()));
    let at_once = rx.try_recv();
    let answered = at_once.is_ok();
    let r = at_once.or_else(|_| rx.recv_timeout(Duration::from_secs(10)));
    (answered, r.expect("answered"))
}

#[test]
fn an_idle_writer_lets_a_waiting_caller_apply_its_commit_on_its_own_thread() {
    let r = rig(true, Duration::ZERO);
    let (at_once, answer) = submit_waiting(&r.writer);
    assert!(at_once && answer.is_ok(), "{answer:?}");
    assert_eq!(r.threads.lock().unwrap()[0], std::thread::current().id());
    assert_eq!(r.writer.stats().inline_batches, 1);
    // A plain submit still goes to the writer thread.
    let (tx, rx) = mpsc::channel();
    r.writer
        .submit(&Commit::default(), Box::new(move |a| tx.send(a).unwrap()));
    assert!(rx.recv_timeout(Duration::from_secs(10)).unwrap().is_ok());
    assert_ne!(r.threads.lock().unwrap()[1], std::thread::current().id());
    assert_eq!(r.writer.stats().inline_batches, 1);
}

#[test]
fn a_backend_that_does_not_allow_it_keeps_every_commit_on_the_writer_thread() {
    let r = rig(false, Duration::ZERO);
    let (_, answer) = submit_waiting(&r.writer);
    assert!(answer.is_ok());
    assert_ne!(r.threads.lock().unwrap()[0], std::thread::current().id());
    assert_eq!(r.writer.stats().inline_batches, 0);
}

#[test]
fn a_single_threaded_runtime_never_blocks_for_a_commit() {
    let r = rig(true, Duration::ZERO);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let (at_once, answer) = rt.block_on(async { submit_waiting(&r.writer) });
    assert!(answer.is_ok());
    assert!(!at_once || r.writer.stats().inline_batches == 0);
    assert_eq!(r.writer.stats().inline_batches, 0);
    assert_ne!(r.threads.lock().unwrap()[0], std::thread::current().id());
}

#[test]
fn a_thread_tokio_will_not_let_block_in_place_still_applies_it_there() {
    // A single-threaded runtime's `block_on` with a multi-threaded
    // runtime's handle entered: tokio panics in `block_in_place` there.
    let r = rig(true, Duration::ZERO);
    let mt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .unwrap();
    let ct = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let (at_once, answer) = ct.block_on(async {
        let _entered = mt.handle().enter();
        submit_waiting(&r.writer)
    });
    assert!(at_once && answer.is_ok(), "{answer:?}");
    assert_eq!(r.writer.stats().inline_batches, 1);
    // The writer goes on.
    let (_, answer) = submit_waiting(&r.writer);
    assert!(answer.is_ok());
}

#[test]
fn on_a_multi_threaded_runtime_the_worker_applies_it_and_other_tasks_go_on() {
    let r = rig(true, Duration::from_millis(200));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let writer = Arc::new(r.writer);
    let w = Arc::clone(&writer);
    rt.block_on(async move {
        // A task that must keep running while a worker blocks on a commit.
        let ticks = Arc::new(AtomicU64::new(0));
        let t = Arc::clone(&ticks);
        let ticker = tokio::spawn(async move {
            for _ in 0..10 {
                tokio::time::sleep(Duration::from_millis(5)).await;
                t.fetch_add(1, Ordering::SeqCst);
            }
        });
        let commit = tokio::spawn(async move { submit_waiting(&w) });
        let (at_once, answer) = commit.await.unwrap();
        assert!(at_once && answer.is_ok(), "{answer:?}");
        ticker.await.unwrap();
        assert_eq!(ticks.load(Ordering::SeqCst), 10);
    });
    assert_eq!(writer.stats().inline_batches, 1);
}

#[test]
fn commits_queued_behind_a_caller_s_batch_go_to_the_writer_thread_in_order() {
    let r = rig(true, Duration::from_millis(100));
    let writer = Arc::new(r.writer);
    let w = Arc::clone(&writer);
    let leader = std::thread::spawn(move || submit_waiting(&w));
    // Wait until the leader holds the batch, then queue behind it.
    let t0 = std::time::Instant::now();
    while writer.stats().inline_batches == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10));
        std::thread::yield_now();
    }
    let mut rxs = Vec::new();
    for _ in 0..5 {
        let (tx, rx) = mpsc::channel();
        // Waiting or not: the writer is busy, so both queue.
        writer.submit_waiting(Commit::default(), Box::new(move |a| tx.send(a).unwrap()));
        rxs.push(rx);
    }
    let (at_once, answer) = leader.join().unwrap();
    assert!(at_once && answer.is_ok());
    for rx in rxs {
        assert!(rx.recv_timeout(Duration::from_secs(10)).unwrap().is_ok());
    }
    let threads = r.threads.lock().unwrap().clone();
    assert_eq!(threads.len(), 6);
    // The five queued ones ran together on the writer thread, after.
    assert!(threads[1..].iter().all(|t| *t == threads[1]));
    assert_ne!(threads[0], threads[1]);
    assert_eq!(writer.stats().inline_batches, 1);
    assert_eq!(writer.stats().batches, 2);
}

#[test]
fn a_panic_in_a_caller_s_batch_stops_the_writer_and_answers_closed() {
    let r = rig(true, Duration::ZERO);
    r.panic_next.store(true, Ordering::SeqCst);
    let (at_once, answer) = submit_waiting(&r.writer);
    assert!(at_once);
    assert_eq!(answer, Err(StoreError::Closed));
    for _ in 0..2 {
        let (_, answer) = submit_waiting(&r.writer);
        assert_eq!(answer, Err(StoreError::Closed));
    }
    let (tx, rx) = mpsc::channel();
    r.writer
        .submit(&Commit::default(), Box::new(move |a| tx.send(a).unwrap()));
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(10)).unwrap(),
        Err(StoreError::Closed)
    );
    drop(r.writer); // joins the writer thread, which has exited
}

#[test]
fn housekeeping_runs_between_batches_and_commits_wait_for_it() {
    let r = rig(true, Duration::ZERO);
    let gate = r.writer.idle_gate();
    let writer = Arc::new(r.writer);
    let w = Arc::clone(&writer);
    let (tx, rx) = mpsc::channel();
    let ran = gate.when_idle(Duration::from_secs(1), || {
        // Held idle: a commit submitted now queues, even a waiting one,
        // and is not applied until the housekeeping ends.
        let t = std::thread::spawn(move || {
            w.submit_waiting(Commit::default(), Box::new(move |a| tx.send(a).unwrap()));
        });
        t.join().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(r.threads.lock().unwrap().is_empty(), "applied while held");
        7
    });
    assert_eq!(ran, Some(7));
    assert!(rx.recv_timeout(Duration::from_secs(10)).unwrap().is_ok());
    assert_eq!(writer.stats().inline_batches, 0);
}

#[test]
fn housekeeping_gives_up_when_the_writer_stays_busy() {
    let r = rig(true, Duration::from_millis(300));
    let gate = r.writer.idle_gate();
    let (tx, rx) = mpsc::channel();
    r.writer
        .submit(&Commit::default(), Box::new(move |a| tx.send(a).unwrap()));
    // Let the writer thread take the batch.
    let t0 = std::time::Instant::now();
    while r.writer.stats().batches == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10));
        std::thread::yield_now();
    }
    assert_eq!(gate.when_idle(Duration::from_millis(20), || ()), None);
    assert!(rx.recv_timeout(Duration::from_secs(10)).unwrap().is_ok());
    // Idle again: it runs.
    assert_eq!(gate.when_idle(Duration::from_secs(1), || 1), Some(1));
    drop(r.writer);
    assert_eq!(gate.when_idle(Duration::from_millis(20), || ()), None);
}
