//! The checkpointer: a thread with its own connection that copies the WAL
//! back into the database in small passive passes, so that the only writer
//! never pays for a large checkpoint inside its commit.

use super::BUSY_TIMEOUT;
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

/// A thread with its own connection that runs passive checkpoints, which
/// never block the writer.
pub(super) struct Checkpointer {
    stop: std::sync::Arc<(Mutex<bool>, std::sync::Condvar)>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Checkpointer {
    pub(super) fn spawn(path: &Path) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        let stop = std::sync::Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("tether-store-ckpt".into())
            .spawn(move || checkpoint_loop(&conn, &flag))
            .map_err(|e| StoreError::Io(format!("cannot start the checkpoint thread: {e}")))?;
        Ok(Self {
            stop,
            handle: Some(handle),
        })
    }
}

fn checkpoint_loop(conn: &Connection, stop: &(Mutex<bool>, std::sync::Condvar)) {
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
        let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
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
