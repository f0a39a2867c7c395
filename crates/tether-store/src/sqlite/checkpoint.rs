//! The checkpointer: a thread with its own connection that copies the WAL
//! back into the database in small passive passes, so that the only writer
//! never pays for a large checkpoint inside its commit.
//!
//! Each round runs two passes. The first runs beside the commits and copies
//! what the WAL holds. The second waits (briefly) for a moment when no
//! commit is being applied and holds the writer idle while it copies the
//! few frames committed during the first ([`IdleGate`]). A pass that no
//! commit overlaps leaves nothing behind, so the next commit starts the WAL
//! file again from its beginning and overwrites blocks it already has; a
//! pass overlapped by commits leaves frames behind, the WAL never restarts,
//! and every later commit grows the file, whose `fdatasync` must then flush
//! the file's new size as well (a second flush: ~140 µs a commit here,
//! docs/PERFORMANCE.md). Under load the writer is never idle: the second
//! pass is skipped, as the WAL then restarts only when the load pauses.

use super::BUSY_TIMEOUT;
use crate::writer::IdleGate;
use crate::StoreError;
use rusqlite::Connection;
use std::path::Path;
use std::sync::Mutex;

/// How often the checkpointer copies the WAL back into the database. Short,
/// so each pass (and its database sync) is small and the writer's backstop
/// checkpoint, when the WAL reaches its size, finds little left to copy: at
/// 250 ms the e-stop's latch commit under REST load waited ~100 ms behind
/// that backstop, at 40 ms 16-75 ms (docs/PERFORMANCE.md, sixth pass).
const CHECKPOINT_INTERVAL: std::time::Duration = std::time::Duration::from_millis(40);

/// How long a pass waits for the writer to be idle before it runs beside
/// the commits instead.
const IDLE_WAIT: std::time::Duration = std::time::Duration::from_millis(10);

/// A thread with its own connection that runs passive checkpoints, which
/// never block the writer.
pub(super) struct Checkpointer {
    stop: std::sync::Arc<(Mutex<bool>, std::sync::Condvar)>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Checkpointer {
    pub(super) fn spawn(path: &Path, gate: IdleGate) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        let stop = std::sync::Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("tether-store-ckpt".into())
            .spawn(move || checkpoint_loop(&conn, &flag, &gate))
            .map_err(|e| StoreError::Io(format!("cannot start the checkpoint thread: {e}")))?;
        Ok(Self {
            stop,
            handle: Some(handle),
        })
    }
}

fn checkpoint_loop(conn: &Connection, stop: &(Mutex<bool>, std::sync::Condvar), gate: &IdleGate) {
    let (lock, cv) = stop;
    let mut stopped = lock.lock().unwrap_or_else(|p| p.into_inner());
    // Runs until the store is dropped; each round waits at most one interval.
    while !*stopped {
        let (guard, _) = cv
            .wait_timeout(stopped, CHECKPOINT_INTERVAL)
            .unwrap_or_else(|p| p.into_inner());
        stopped = guard;
        if *stopped {
            break;
        }
        drop(stopped);
        // A failed passive checkpoint is retried next round; the WAL keeps
        // every committed frame meanwhile, so nothing is lost.
        let pass = || {
            let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
        };
        pass();
        let _ = gate.when_idle(IDLE_WAIT, pass);
        stopped = lock.lock().unwrap_or_else(|p| p.into_inner());
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        let (lock, cv) = &*self.stop;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cv.notify_all();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
