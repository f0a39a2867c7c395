//! Which other handles have the store open: the journal's writer holds
//! answered records in an open transaction (`apply::hold`) only while no
//! other handle could be waiting for SQLite's write lock or reading the file.
//!
//! Every handle that does not write the journal keeps a shared lock on
//! [`PRESENCE_FILE_NAME`] while it is open; the writer asks, with a
//! non-blocking exclusive lock it gives back at once, whether anyone holds
//! one. `flock` locks belong to the open file, so closing this handle never
//! touches SQLite's own `fcntl` locks on its files. A process that opens the
//! database without Tether (the `sqlite3` shell) is not seen: its reads may
//! lag the answers by the bound of a held transaction (docs/STORE.md).
//!
//! Never here: SQLite's files or the journal's lock (`journal`).

use std::fs::{File, OpenOptions, TryLockError};
use std::path::Path;
use std::time::Duration;

/// The file whose shared locks say which other handles have the store open.
pub const PRESENCE_FILE_NAME: &str = "tether.presence";

/// Tries at most this many times for the shared lock (the writer's probe
/// holds the exclusive one for a few microseconds).
const ANNOUNCE_TRIES: u32 = 200;
const ANNOUNCE_BACKOFF: Duration = Duration::from_micros(250);

/// This handle's part in the store's presence.
pub(super) enum Presence {
    /// It does not write the journal: others see it while it is open (the
    /// lock lives as long as the file).
    Announced { _lock: File },
    /// It writes the journal: it asks whether anyone else is there.
    Probe(File),
    /// The file could not be opened or locked: a writer then never holds
    /// a transaction open (it cannot know who waits).
    Unknown,
}

impl Presence {
    /// A handle that does not write the journal: shows itself to the one that does.
    pub(super) fn announce(dir: &Path) -> Presence {
        let Some(file) = open(dir) else {
            return Presence::Unknown;
        };
        // Bounded: a probe gives its lock back at once.
        for _ in 0..ANNOUNCE_TRIES {
            match file.try_lock_shared() {
                Ok(()) => return Presence::Announced { _lock: file },
                Err(TryLockError::WouldBlock) => std::thread::sleep(ANNOUNCE_BACKOFF),
                Err(TryLockError::Error(_)) => break,
            }
        }
        tracing::warn!(
            "could not show this process to the one writing the evidence store's journal; its reads may lag answered commits by a few milliseconds"
        );
        Presence::Unknown
    }

    /// The handle that writes the journal.
    pub(super) fn probe(dir: &Path) -> Presence {
        open(dir).map_or(Presence::Unknown, Presence::Probe)
    }

    /// Whether no other handle has the store open now (`false` when it
    /// cannot be told).
    pub(super) fn alone(&self) -> bool {
        let Presence::Probe(file) = self else {
            return false;
        };
        match file.try_lock() {
            Ok(()) => {
                let _ = file.unlock();
                true
            }
            Err(_) => false,
        }
    }
}

fn open(dir: &Path) -> Option<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join(PRESENCE_FILE_NAME))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_sees_an_announced_handle_until_it_closes() {
        let dir = tempfile::tempdir().unwrap();
        let probe = Presence::probe(dir.path());
        assert!(probe.alone());
        let other = Presence::announce(dir.path());
        assert!(matches!(other, Presence::Announced { .. }));
        assert!(!probe.alone());
        // A second probe sees it too, and the first probe's own file is no
        // announcement.
        assert!(!Presence::probe(dir.path()).alone());
        drop(other);
        assert!(probe.alone());
        assert!(!Presence::Unknown.alone());
    }
}
