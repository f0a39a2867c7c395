//! The journal: a batch's record flushed before its callers are answered,
//! so SQLite's commit itself need not flush.
//!
//! SQLite's own durable commit of one small batch writes and flushes several
//! 4 KiB WAL frames (the table and index pages it touched), which costs far
//! more than flushing one small record. So a batch is written here as one
//! checksummed record, whose write to the disk starts at once; the batch's
//! last statements run while the device takes it; the record is flushed;
//! SQLite then commits the batch with `synchronous=NORMAL` (written to the
//! WAL, not flushed), and only then are the callers answered. Nothing of a
//! batch is visible to a reader before its record is on the disk. Should
//! the machine lose power before SQLite's WAL reaches the disk, the next
//! open applies the records past the database's head again
//! (`SqliteBackend::replay`). Every kind of commit is journalled:
//! a batch committed with SQLite's own flush flushes every WAL frame written
//! since the last flush, and an e-stop's latch must not wait for that. Only a
//! batch whose record is too large for the space left commits with SQLite's
//! flush, which also makes every earlier record unnecessary: the journal
//! then starts again from its beginning under a new generation.
//!
//! Layout: the file is written once with zeros to [`JOURNAL_BYTES`], so a
//! record's flush never changes the file's size (a data-only flush). Records
//! follow each other from offset 0: magic, generation, body length, body, and
//! the SHA-256 of all of that. Reading stops at the first frame that is not
//! a whole, checksummed record of the first record's generation, so a torn
//! write or an earlier generation's leftovers end the journal.
//!
//! One process writes a store's journal: it holds an exclusive lock on the
//! file; another process on the store commits with SQLite's full flush.
//!
//! Never here: deciding or applying a commit (that is `apply`).

mod codec;

pub(super) use codec::{encode_commits, encode_meta};

use super::head::Head;
use crate::prepare::Prepared;
use crate::StoreError;
use codec::decode;
use sha2::{Digest, Sha256};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The journal file in a state directory, beside the database.
pub const JOURNAL_FILE_NAME: &str = "tether.journal";

/// Where a journal found beside a database that did not exist yet is copied
/// before it starts again ([`Opened::set_aside`]).
pub const SET_ASIDE_FILE_NAME: &str = "tether.journal.set-aside";

/// The journal's size: about 2,500 records of a setpoint before the
/// journal starts again (one batch committed with SQLite's full flush).
pub(super) const JOURNAL_BYTES: u64 = 4 << 20;

/// Largest record written; a larger batch commits with SQLite's flush (it
/// carries many commits, so one flush is already shared by all of them).
pub(super) const MAX_RECORD_BYTES: usize = 256 << 10;

const MAGIC: [u8; 4] = *b"TJR1";
const HEADER_BYTES: usize = 4 + 8 + 4;
const DIGEST_BYTES: usize = 32;

// A record must fit the journal with room to spare, and its length field.
const _: () = assert!((MAX_RECORD_BYTES as u64) < JOURNAL_BYTES / 4);
const _: () = assert!(MAX_RECORD_BYTES <= u32::MAX as usize);

/// One batch as journalled: enough to apply it again onto the head it
/// started from and to check that this rebuilds the head it ended at.
pub(super) struct Record {
    /// Its place in its generation: 0, 1, 2, … (a batch without entries
    /// leaves the chain's head where it was, so the head alone cannot say
    /// which records the database holds; `journal_at` in `meta` does).
    pub index: u64,
    pub ts_ms: u64,
    pub start: Head,
    pub end: Head,
    pub commits: Vec<Prepared>,
}

/// The open journal of this process.
pub(super) struct Journal {
    file: File,
    path: PathBuf,
    /// Where the next record goes.
    offset: u64,
    /// The generation of the records now being written.
    generation: u64,
    /// Every record written so far is covered by a flush of SQLite's WAL:
    /// the next record starts the journal again under a new generation.
    restart: bool,
    /// The index of the next record in its generation.
    next_index: u64,
    /// The frame being written (reused).
    frame: Vec<u8>,
    /// Records written and restarts, for tests and benchmarks.
    pub(super) records_written: u64,
    pub(super) restarts: u64,
}

/// Where a record goes: its generation and its index in it. The database
/// keeps the last one it committed (`meta`, key `journal_at`, "GEN INDEX").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Position {
    pub generation: u64,
    pub index: u64,
}

impl Position {
    /// Whether a record at `self` is newer than what the database committed.
    pub(super) fn after(self, committed: Option<Position>) -> bool {
        match committed {
            None => true,
            Some(c) => (self.generation, self.index) > (c.generation, c.index),
        }
    }
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.generation, self.index)
    }
}

impl std::str::FromStr for Position {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        let (g, i) = s.split_once(' ').ok_or(())?;
        Ok(Position {
            generation: g.parse().map_err(|_| ())?,
            index: i.parse().map_err(|_| ())?,
        })
    }
}

/// What opening the journal found.
pub(super) struct Opened {
    /// The journal, when this process may write it.
    pub journal: Option<Journal>,
    /// The records of its current generation, in order (maybe already in
    /// the database: the replay skips those), and that generation.
    pub records: Vec<Record>,
    pub generation: u64,
    /// Why there is no journal, when there is none.
    pub why_not: Option<String>,
    /// Another process holds the journal: it is alive, and it writes the
    /// records (none were read).
    pub held_elsewhere: bool,
    /// The records were read under the journal's lock: no live process can
    /// be writing any of them.
    pub locked: bool,
}

/// What [`Opened::set_aside`] did.
#[derive(Debug, Default)]
pub(super) struct SetAside {
    /// How many records there were.
    pub records: u64,
    /// Why the copy failed, if it did.
    pub copy_error: Option<String>,
}

impl Opened {
    /// The position of the last record read, if any.
    pub(super) fn last(&self) -> Option<Position> {
        self.records.last().map(|r| Position {
            generation: self.generation,
            index: r.index,
        })
    }

    /// Sets the records aside unapplied: the file is first copied to
    /// [`SET_ASIDE_FILE_NAME`] (for an operator; nothing reads it back), then
    /// the journal starts again over them. A failed copy is reported, and the
    /// journal starts again all the same: its records must never reach this
    /// database (which records them as held: `schema::migrate`).
    pub(super) fn set_aside(&mut self, dir: &Path) -> SetAside {
        let records = self.records.len() as u64;
        if records == 0 {
            return SetAside::default();
        }
        self.records.clear();
        let copied = std::fs::copy(dir.join(JOURNAL_FILE_NAME), dir.join(SET_ASIDE_FILE_NAME));
        if let Some(j) = self.journal.as_mut() {
            j.covered();
        }
        SetAside {
            records,
            copy_error: copied.err().map(|e| e.to_string()),
        }
    }
}

impl Journal {
    /// Opens (creating and sizing if needed) the journal in `dir` and reads
    /// its records. Never fails the store: a journal that cannot be opened,
    /// locked or sized leaves the store committing with SQLite's flush, and
    /// says why; a journal that cannot even be read is an error (its records
    /// may be answered commits the database lacks).
    pub(super) fn open(dir: &Path) -> Result<Opened, StoreError> {
        let path = dir.join(JOURNAL_FILE_NAME);
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) => return Self::read_only(&path, format!("cannot open it for writing: {e}")),
        };
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                // Another process writes it, and it read the records when it
                // opened the store.
                return Ok(Opened {
                    journal: None,
                    records: Vec::new(),
                    generation: 0,
                    why_not: Some("another process on this store holds the journal".into()),
                    held_elsewhere: true,
                    locked: false,
                });
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Self::read_only(&path, format!("cannot lock it: {e}"));
            }
        }
        let bytes = read_all(&file, &path)?;
        let scanned_len = bytes.len() as u64;
        let scanned = scan(&bytes);
        let mut journal = Journal {
            file,
            path,
            offset: scanned.end,
            generation: scanned.generation,
            restart: scanned.records.is_empty(),
            next_index: scanned.records.len() as u64,
            frame: Vec::with_capacity(4096),
            records_written: 0,
            restarts: 0,
        };
        let why_not = journal.size().err();
        if why_not.is_some() {
            // Give back what the sizing took (a full disk): the journal is
            // not used, and the bytes it had are kept.
            let _ = journal.file.set_len(journal.offset.max(scanned_len));
        }
        Ok(Opened {
            journal: why_not.is_none().then_some(journal),
            records: scanned.records,
            generation: scanned.generation,
            why_not,
            held_elsewhere: false,
            locked: true,
        })
    }

    /// The records of a journal this process may not write (still applied
    /// on open: the database may lack them).
    fn read_only(path: &Path, why: String) -> Result<Opened, StoreError> {
        let scanned = match File::open(path) {
            Ok(f) => scan(&read_all(&f, path)?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => scan(&[]),
            Err(e) => {
                return Err(StoreError::Io(format!(
                    "cannot read the journal {}: {e}",
                    path.display()
                )))
            }
        };
        Ok(Opened {
            journal: None,
            records: scanned.records,
            generation: scanned.generation,
            why_not: Some(why),
            held_elsewhere: false,
            locked: false,
        })
    }

    /// Writes the file to its full size with zeros, once, and flushes it and
    /// its directory entry. Bytes already written are kept.
    fn size(&mut self) -> Result<(), String> {
        let len = self
            .file
            .metadata()
            .map_err(|e| format!("cannot stat it: {e}"))?
            .len();
        if len >= JOURNAL_BYTES {
            return Ok(());
        }
        let zeros = vec![0u8; 64 << 10];
        let mut at = len;
        while at < JOURNAL_BYTES {
            let n = (JOURNAL_BYTES - at).min(zeros.len() as u64) as usize;
            self.file
                .write_all_at(&zeros[..n], at)
                .map_err(|e| format!("cannot size it: {e}"))?;
            at += n as u64;
        }
        self.file
            .sync_all()
            .map_err(|e| format!("cannot flush it: {e}"))?;
        if let Some(dir) = self.path.parent() {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| format!("cannot flush its directory: {e}"))?;
        }
        Ok(())
    }

    /// Whether a record of `body_len` bytes fits where it would be written.
    pub(super) fn fits(&self, body_len: usize) -> bool {
        let frame = (HEADER_BYTES + body_len + DIGEST_BYTES) as u64;
        let at = if self.restart { 0 } else { self.offset };
        body_len <= MAX_RECORD_BYTES && at + frame <= JOURNAL_BYTES
    }

    /// Where the next record goes; starts the journal again first when
    /// every record so far is covered.
    pub(super) fn position(&mut self) -> Position {
        if self.restart {
            self.offset = 0;
            self.generation = next_generation(self.generation);
            self.next_index = 0;
            self.restart = false;
            self.restarts += 1;
        }
        Position {
            generation: self.generation,
            index: self.next_index,
        }
    }

    /// Writes the record at [`Journal::position`] (`meta` then `body`, see
    /// [`encode_meta`] and [`encode_commits`]) and starts its way to the disk
    /// without waiting for it; [`Journal::flush`] waits. Between the two the
    /// batch's remaining statements run while the device takes the record
    /// (docs/PERFORMANCE.md, "The record's write started early"). Returns
    /// where it starts, for [`Journal::void`]. Nothing of the batch may be
    /// committed or answered before the flush.
    pub(super) fn write(&mut self, meta: &[u8], body: &[u8]) -> Result<u64, StoreError> {
        debug_assert!(!self.restart, "position() comes first");
        let len = meta.len() + body.len();
        debug_assert!(self.fits(len));
        let len32 = u32::try_from(len)
            .map_err(|_| StoreError::Invalid("a journal record is too large".into()))?;
        self.frame.clear();
        self.frame.extend_from_slice(&MAGIC);
        self.frame.extend_from_slice(&self.generation.to_le_bytes());
        self.frame.extend_from_slice(&len32.to_le_bytes());
        self.frame.extend_from_slice(meta);
        self.frame.extend_from_slice(body);
        let digest = Sha256::digest(&self.frame);
        self.frame.extend_from_slice(&digest);
        let at = self.offset;
        self.file
            .write_all_at(&self.frame, at)
            .map_err(|e| journal_io(&self.path, "write", e))?;
        start_writeback(&self.file, at, self.frame.len());
        self.offset = at + self.frame.len() as u64;
        self.next_index += 1;
        self.records_written += 1;
        Ok(at)
    }

    /// The whole frame of the last record written, as it is in the file: a
    /// batch whose `COMMIT` waits keeps it, to apply it again should that
    /// `COMMIT` fail ([`records_of`]).
    pub(super) fn last_frame(&self) -> &[u8] {
        &self.frame
    }

    /// Waits until every record written is on the disk (a data-only flush:
    /// the file's size never changes).
    pub(super) fn flush(&mut self) -> Result<(), StoreError> {
        self.file
            .sync_data()
            .map_err(|e| journal_io(&self.path, "flush", e))
    }

    /// [`Journal::write`] then [`Journal::flush`].
    #[cfg(test)]
    pub(super) fn append(&mut self, meta: &[u8], body: &[u8]) -> Result<u64, StoreError> {
        let at = self.write(meta, body)?;
        self.flush()?;
        Ok(at)
    }

    /// A record whose batch failed after it was written: the next record is
    /// written in its place, and its magic is overwritten now, so the open
    /// after a crash does not apply a batch whose callers were told it failed.
    pub(super) fn void(&mut self, at: u64) {
        self.offset = at;
        self.next_index = self.next_index.saturating_sub(1);
        // Best effort: if this fails, a later record written at `at` replaces
        // it; if none is, the open after a power loss may apply the batch
        // (its commits then stand as if their answers were lost).
        let _ = self
            .file
            .write_all_at(&[0u8; 4], at)
            .and_then(|()| self.file.sync_data());
    }

    /// Makes every record written from now on come after the position the
    /// database committed last, so that the open after a power loss applies
    /// it: a clock set back (generations follow the clock) or a journal
    /// replaced by hand would otherwise give new records older positions.
    pub(super) fn follow(&mut self, committed: Option<Position>) {
        let Some(c) = committed else { return };
        let next = Position {
            generation: self.generation,
            index: self.next_index,
        };
        if self.restart || !next.after(Some(c)) {
            self.generation = self.generation.max(c.generation);
            self.restart = true;
        }
    }

    /// Every record so far is covered by a flush of SQLite's WAL.
    pub(super) fn covered(&mut self) {
        self.restart = true;
    }
}

/// Asks the kernel to start writing `len` bytes at `at` to the device now,
/// without waiting (Linux's `sync_file_range` with `SYNC_FILE_RANGE_WRITE`).
/// Only a head start for the flush that follows: it promises nothing about
/// durability, so its failure is ignored (the flush still writes it all).
#[cfg(target_os = "linux")]
fn start_writeback(file: &File, at: u64, len: usize) {
    use std::os::unix::io::AsRawFd;
    let (Ok(at), Ok(len)) = (libc::off64_t::try_from(at), libc::off64_t::try_from(len)) else {
        return;
    };
    // SAFETY: the descriptor is open for as long as `file` is borrowed, and
    // the call reads no memory of this process.
    let _ =
        unsafe { libc::sync_file_range(file.as_raw_fd(), at, len, libc::SYNC_FILE_RANGE_WRITE) };
}

#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &File, _at: u64, _len: usize) {}

fn journal_io(path: &Path, what: &str, e: std::io::Error) -> StoreError {
    StoreError::Io(format!("cannot {what} the journal {}: {e}", path.display()))
}

/// A generation above `previous` that no earlier run used: the clock's
/// nanoseconds when they are higher (a journal reset by hand starts at 0).
fn next_generation(previous: u64) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    now.max(previous.saturating_add(1))
}

fn read_all(file: &File, path: &Path) -> Result<Vec<u8>, StoreError> {
    let mut f = file;
    let mut bytes = Vec::new();
    f.seek(SeekFrom::Start(0))
        .and_then(|_| f.take(JOURNAL_BYTES).read_to_end(&mut bytes))
        .map_err(|e| journal_io(path, "read", e))?;
    Ok(bytes)
}

struct Scanned {
    generation: u64,
    records: Vec<Record>,
    /// Where the records end (the next record's place).
    end: u64,
}

/// The whole, checksummed records of the first record's generation, in
/// order from offset 0, up to the first frame that is not one.
fn scan(bytes: &[u8]) -> Scanned {
    let mut out = Scanned {
        generation: 0,
        records: Vec::new(),
        end: 0,
    };
    let mut at = 0usize;
    // Each record takes at least a header and a digest: the loop is bounded.
    while let Some((generation, body, next)) = frame_at(bytes, at) {
        if out.records.is_empty() {
            out.generation = generation;
        } else if generation != out.generation {
            break;
        }
        let Some(record) = decode(body) else { break };
        if record.index != out.records.len() as u64 {
            break;
        }
        out.records.push(record);
        at = next;
        out.end = next as u64;
    }
    out
}

/// The records in frames kept from [`Journal::last_frame`], in order: one
/// generation, consecutive indexes; reading stops at the first that is not.
pub(super) fn records_of(frames: &[u8]) -> (u64, Vec<Record>) {
    let mut generation = 0;
    let mut records: Vec<Record> = Vec::new();
    let mut at = 0usize;
    // Each frame takes at least a header and a digest: the loop is bounded.
    while let Some((g, body, next)) = frame_at(frames, at) {
        let Some(record) = decode(body) else { break };
        if let Some(prev) = records.last() {
            if g != generation || record.index != prev.index + 1 {
                break;
            }
        }
        generation = g;
        records.push(record);
        at = next;
    }
    (generation, records)
}

/// The frame at `at`: its generation, body and the offset after it.
fn frame_at(bytes: &[u8], at: usize) -> Option<(u64, &[u8], usize)> {
    let header = bytes.get(at..at.checked_add(HEADER_BYTES)?)?;
    if header[..4] != MAGIC {
        return None;
    }
    let generation = u64::from_le_bytes(header[4..12].try_into().ok()?);
    let len = u32::from_le_bytes(header[12..16].try_into().ok()?) as usize;
    if len > MAX_RECORD_BYTES {
        return None;
    }
    let body_end = at + HEADER_BYTES + len;
    let digest = bytes.get(body_end..body_end.checked_add(DIGEST_BYTES)?)?;
    if Sha256::digest(&bytes[at..body_end]).as_slice() != digest {
        return None;
    }
    Some((
        generation,
        &bytes[at + HEADER_BYTES..body_end],
        body_end + DIGEST_BYTES,
    ))
}

/// A journal file for tests: its records as this build reads them.
#[cfg(test)]
pub(super) fn records_in(dir: &Path) -> Vec<Record> {
    std::fs::read(dir.join(JOURNAL_FILE_NAME))
        .map(|b| scan(&b).records)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prepare::{PreparedEvent, PreparedLatch, PreparedReceipt};
    use crate::{
        ApprovalRow, BudgetCap, BudgetRow, InvocationRef, LatchRow, LeaseDraft, LeaseOp, OpenOp,
        ReceiptRef, RevisionRow,
    };

    fn head(seq: u64) -> Head {
        Head {
            seq,
            hash: format!("sha256:{seq:064x}"),
        }
    }

    fn setpoint(id: &str) -> Prepared {
        let mut c = Prepared::empty();
        c.events.push(PreparedEvent {
            kind_json: "\"command\"".into(),
            body_json: format!("{{\"id\":\"{id}\"}}"),
        });
        c.receipts.push(PreparedReceipt {
            row: ReceiptRef {
                command_id: id.into(),
                input_digest: "sha256:00".into(),
                event: 0,
            },
        });
        c.revisions.push(RevisionRow {
            device_id: "t1".into(),
            resource: "setpoint".into(),
            revision: 7,
        });
        c.open_ops.push((
            OpenOp {
                command_id: id.into(),
                info: serde_json::json!({"d": 1}),
            },
            "{\"d\":1}".into(),
        ));
        c.closed_ops.push("older".into());
        c.invocation_refs.push(InvocationRef {
            invocation_id: "inv_1".into(),
            event: 0,
        });
        c
    }

    /// A commit with one of everything else a commit may hold.
    fn state(id: &str) -> Prepared {
        let mut c = setpoint(id);
        c.latches.push(PreparedLatch {
            row: LatchRow {
                device_id: "t1".into(),
                latched: true,
                info: serde_json::json!({"by": "op"}),
            },
            info_json: "{\"by\":\"op\"}".into(),
        });
        for (prefix, released, cap) in [
            (
                "r",
                false,
                BudgetCap {
                    limit: 12.5,
                    window_ms: Some(3_600_000),
                },
            ),
            (
                "s",
                true,
                BudgetCap {
                    limit: 1.0,
                    window_ms: None,
                },
            ),
        ] {
            c.budget_draws.push(BudgetRow {
                key: "t1/energy".into(),
                reservation_id: format!("{prefix}-{id}"),
                amount: 0.1,
                ts_ms: 42,
                released,
                cap: Some(cap),
            });
        }
        c.budget_draws[1].cap = None;
        c.budget_releases.push("r-old".into());
        let record = serde_json::json!({"status": "pending"});
        let approval = ApprovalRow {
            approval_id: "appr-1".into(),
            record,
        };
        c.approvals
            .push((approval, "{\"status\":\"pending\"}".into()));
        c.invocations.push(("inv_2".into(), "{\"x\":1}".into()));
        let hold = LeaseOp::Hold {
            lease_ms: 5000,
            info: serde_json::json!({"pid": 7}),
            replaces: Some("ep-0".into()),
        };
        let draft = |key: &str, holder: &str, op| LeaseDraft {
            key: key.into(),
            holder: holder.into(),
            op,
        };
        c.leases
            .push((draft("device/t1", "ep-1", hold), "{\"pid\":7}".into()));
        c.leases.push((
            draft("endpoint/ep-0", "ep-0", LeaseOp::Release),
            String::new(),
        ));
        c
    }

    #[test]
    fn every_kind_of_row_reads_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = writable(dir.path());
        let written = state("z");
        let (mut meta, mut body) = (Vec::new(), Vec::new());
        let index = j.position().index;
        encode_meta(&mut meta, index, 9, &head(4), &head(5));
        encode_commits(&mut body, std::iter::once(&written));
        j.append(&meta, &body).unwrap();
        let recs = records_in(dir.path());
        let c = &recs[0].commits[0];
        assert_eq!(c.latches[0].row, written.latches[0].row);
        assert_eq!(c.latches[0].info_json, written.latches[0].info_json);
        assert_eq!(c.budget_draws, written.budget_draws);
        assert_eq!(c.budget_releases, written.budget_releases);
        assert_eq!(c.approvals, written.approvals);
        assert_eq!(c.invocations, written.invocations);
        assert_eq!(c.leases, written.leases);
        // Written again from what was read, the body is the same bytes.
        let mut again = Vec::new();
        encode_commits(&mut again, recs[0].commits.iter());
        assert_eq!(again, body);
    }

    fn writable(dir: &Path) -> Journal {
        Journal::open(dir).unwrap().journal.expect("writable")
    }

    fn write(j: &mut Journal, start: u64, ids: &[&str]) -> u64 {
        let commits: Vec<Prepared> = ids.iter().map(|id| setpoint(id)).collect();
        let (mut meta, mut body) = (Vec::new(), Vec::new());
        let index = j.position().index;
        encode_meta(&mut meta, index, 5, &head(start), &head(start + 1));
        encode_commits(&mut body, commits.iter());
        j.append(&meta, &body).expect("append")
    }

    #[test]
    fn records_read_back_in_order_with_every_field() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = writable(dir.path());
        write(&mut j, 0, &["a"]);
        write(&mut j, 1, &["b", "c"]);
        let recs = records_in(dir.path());
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[1].start, head(1));
        assert_eq!(recs[1].end, head(2));
        assert_eq!(recs[1].ts_ms, 5);
        let c = &recs[1].commits[1];
        assert_eq!(c.receipts[0].row.command_id, "c");
        assert_eq!(c.events[0].body_json, "{\"id\":\"c\"}");
        assert_eq!(c.revisions[0].revision, 7);
        assert_eq!(c.open_ops[0].0.info, serde_json::json!({"d": 1}));
        assert_eq!(c.closed_ops, ["older"]);
        assert_eq!(c.invocation_refs[0].invocation_id, "inv_1");
        assert_eq!(
            std::fs::metadata(dir.path().join(JOURNAL_FILE_NAME))
                .unwrap()
                .len(),
            JOURNAL_BYTES
        );
    }

    #[test]
    fn a_torn_or_altered_record_ends_the_journal() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = writable(dir.path());
        write(&mut j, 0, &["a"]);
        let second = write(&mut j, 1, &["b"]);
        write(&mut j, 2, &["c"]);
        drop(j);
        let path = dir.path().join(JOURNAL_FILE_NAME);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[second as usize + HEADER_BYTES + 3] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let recs = records_in(dir.path());
        assert_eq!(
            recs.len(),
            1,
            "only the record before the altered one stands"
        );
        // Reopened, the next record goes where the altered one was.
        let opened = Journal::open(dir.path()).unwrap();
        assert_eq!(opened.records.len(), 1);
        assert_eq!(opened.journal.expect("writable").offset, second);
    }

    #[test]
    fn a_restart_leaves_no_record_of_the_older_generation_readable() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = writable(dir.path());
        write(&mut j, 0, &["a"]);
        write(&mut j, 1, &["b", "c", "d"]);
        write(&mut j, 2, &["e"]);
        j.covered();
        write(&mut j, 3, &["f"]);
        assert_eq!(
            j.restarts, 2,
            "the first record of a fresh journal starts one too"
        );
        let recs = records_in(dir.path());
        assert_eq!(
            recs.len(),
            1,
            "the older records past the new one are another generation"
        );
        assert_eq!(recs[0].commits[0].receipts[0].row.command_id, "f");
    }

    #[test]
    fn a_voided_record_is_not_read_and_its_place_is_reused() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = writable(dir.path());
        write(&mut j, 0, &["a"]);
        let at = write(&mut j, 1, &["b"]);
        j.void(at);
        assert_eq!(records_in(dir.path()).len(), 1);
        assert_eq!(write(&mut j, 1, &["c"]), at);
        let recs = records_in(dir.path());
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[1].commits[0].receipts[0].row.command_id, "c");
    }

    #[test]
    fn a_second_opener_does_not_write_the_journal() {
        let dir = tempfile::tempdir().unwrap();
        let first = Journal::open(dir.path()).unwrap();
        assert!(first.journal.is_some());
        let second = Journal::open(dir.path()).unwrap();
        assert!(second.journal.is_none());
        assert!(second.why_not.unwrap().contains("another process"));
    }

    #[test]
    fn records_written_after_a_clock_set_back_still_come_after_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = writable(dir.path());
        // The database committed a record of a generation from the future.
        let ahead = Position {
            generation: u64::MAX - 10,
            index: 3,
        };
        j.follow(Some(ahead));
        let next = j.position();
        assert!(next.after(Some(ahead)), "{next:?}");
        // A database that committed this journal's record 0 leaves record 1
        // where it goes.
        let other = tempfile::tempdir().unwrap();
        let mut k = writable(other.path());
        write(&mut k, 0, &["a"]);
        let next = k.position();
        k.follow(Some(Position { index: 0, ..next }));
        assert_eq!(k.position(), next);
        assert_eq!(next.index, 1);
    }

    #[test]
    fn a_defective_count_is_refused_not_allocated() {
        let mut body = Vec::new();
        encode_meta(&mut body, 0, 1, &head(0), &head(1));
        body.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&body).is_none());
    }
}
