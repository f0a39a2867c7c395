//! A commit as one append, measured before it is built (docs/PERFORMANCE.md,
//! "One durable caller"): what one caller's durable commit could cost if the
//! flush were of a record appended to a journal of its own, with SQLite's
//! B-tree work done beside that flush instead of before it.
//!
//! Four ways to make the same commit durable, interleaved commit by commit so
//! that they meet the same disk (its flush swings between ~40 and ~300 µs
//! here), each timed from start to durable:
//!
//! - `sqlite_full`: SQLite alone, WAL, `synchronous=FULL` (what the store did
//!   before its journal: five pages, their frames, one `fdatasync` of the
//!   WAL);
//! - `journal_only`: a ~1.2 KB record written into a preallocated journal
//!   file and `fdatasync`ed (the floor of any design that flushes one record);
//! - `journal_then_sqlite`: that record flushed, then the SQLite commit with
//!   `synchronous=OFF` (the journal makes it durable) on the same thread;
//! - `journal_beside_sqlite`: the record written, its `fdatasync` handed to a
//!   flusher thread, the SQLite commit (`synchronous=OFF`) run meanwhile, and
//!   both awaited.
//!
//! `cargo run --release -p tether-store --example commit_overlap -- [commits] [dir]`
//! (dir: on the disk to measure, default the system's temp directory).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use rusqlite::{params, Connection};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::time::{Duration, Instant};

/// The journal's preallocated size: written with zeros and synced once, so
/// that no record's flush also has to record a new file size.
const JOURNAL_BYTES: u64 = 64 << 20;
/// About what a simulated setpoint's commit holds (its entries' lines).
const RECORD_BYTES: usize = 1200;

fn main() {
    let mut args = std::env::args().skip(1);
    let commits: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3000);
    let base = args
        .next()
        .map_or_else(std::env::temp_dir, std::path::PathBuf::from);
    let dir = tempfile::tempdir_in(base).expect("a directory on the disk to measure");
    let probe = prealloc(&dir.path().join("probe"), 1 << 16);
    let before = flush_p50(&probe);

    let full = open_db(&dir.path().join("full.db"), "FULL");
    let off = open_db(&dir.path().join("off.db"), "OFF");
    let journal = prealloc(&dir.path().join("journal"), JOURNAL_BYTES);
    let (to_flusher, from_flusher) = spawn_flusher(journal.try_clone().expect("dup"));

    let names = [
        "sqlite_full",
        "journal_only",
        "journal_then_sqlite",
        "journal_beside_sqlite",
    ];
    let mut times: Vec<Vec<Duration>> = vec![Vec::with_capacity(commits); names.len()];
    let record = vec![b'r'; RECORD_BYTES];
    let mut offset = 0u64;
    for i in 1..=commits {
        let seq = i64::try_from(i).expect("small");
        let t = Instant::now();
        commit(&full, seq);
        times[0].push(t.elapsed());

        let t = Instant::now();
        append(&journal, &record, &mut offset);
        journal.sync_data().expect("fdatasync");
        times[1].push(t.elapsed());

        let t = Instant::now();
        append(&journal, &record, &mut offset);
        journal.sync_data().expect("fdatasync");
        commit(&off, seq * 2);
        times[2].push(t.elapsed());

        let t = Instant::now();
        append(&journal, &record, &mut offset);
        to_flusher.send(()).expect("flusher");
        commit(&off, seq * 2 + 1);
        from_flusher.recv().expect("flusher").expect("fdatasync");
        times[3].push(t.elapsed());

        if i % 50 == 0 {
            // As the store's checkpointer does, outside the timed commits.
            for c in [&full, &off] {
                c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                    .expect("checkpoint");
            }
        }
    }
    drop(to_flusher);
    let after = flush_p50(&probe);
    let flush = (before + after) / 2.0;
    println!("FIGURE flush_4k_us p50_before={before:.1} p50_after={after:.1}");
    for (name, t) in names.iter().zip(times.iter_mut()) {
        t.sort_unstable();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let p50 = us(t[t.len() / 2]);
        let p99 = us(t[t.len() * 99 / 100]);
        println!(
            "FIGURE commit_{name}_us p50={p50:.1} p99={p99:.1} over_1_flush={:.1}",
            p50 - flush
        );
    }
}

/// Writes `record` at `offset` in the journal and moves `offset` past it
/// (wrapping before the preallocated end).
fn append(journal: &File, record: &[u8], offset: &mut u64) {
    journal.write_all_at(record, *offset).expect("write");
    let len = record.len() as u64;
    *offset = (*offset + len) % (JOURNAL_BYTES - len);
}

/// A file of `len` zero bytes, written and synced (no unwritten extents, so
/// overwriting it never changes the file's metadata).
fn prealloc(path: &Path, len: u64) -> File {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .expect("open");
    let chunk = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < len {
        let n = chunk.len().min(usize::try_from(len - at).expect("fits"));
        f.write_all_at(&chunk[..n], at).expect("prealloc");
        at += n as u64;
    }
    f.sync_all().expect("fsync");
    f
}

/// The median of 500 4 KiB overwrites, each `fdatasync`ed, in µs.
fn flush_p50(f: &File) -> f64 {
    let page = [b'p'; 4096];
    let mut t: Vec<Duration> = (0..500u64)
        .map(|i| {
            let s = Instant::now();
            f.write_all_at(&page, (i % 8) * 4096).expect("write");
            f.sync_data().expect("fdatasync");
            s.elapsed()
        })
        .collect();
    t.sort_unstable();
    t[t.len() / 2].as_secs_f64() * 1e6
}

fn open_db(path: &Path, synchronous: &str) -> Connection {
    let c = Connection::open(path).expect("open");
    let mode: String = c
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .expect("wal");
    assert!(mode.eq_ignore_ascii_case("wal"));
    c.pragma_update(None, "synchronous", synchronous)
        .expect("synchronous");
    c.pragma_update(None, "wal_autocheckpoint", 0)
        .expect("no autocheckpoint");
    c.execute_batch(
        "CREATE TABLE events(seq INTEGER PRIMARY KEY, hash TEXT, line TEXT);
         CREATE TABLE receipts(seq INTEGER, command_id TEXT PRIMARY KEY, input_digest TEXT);
         CREATE TABLE revisions(device_id TEXT, resource TEXT, revision INTEGER,
                                PRIMARY KEY(device_id, resource));
         CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT);",
    )
    .expect("schema");
    c
}

/// What a simulated setpoint's commit writes: its entry, its receipt's
/// index row, the device's revision and the chain head (five pages).
fn commit(c: &Connection, seq: i64) {
    let line = "x".repeat(900);
    c.prepare_cached("BEGIN IMMEDIATE")
        .and_then(|mut s| s.execute([]))
        .expect("begin");
    c.prepare_cached("INSERT INTO events VALUES (?1, ?2, ?3)")
        .and_then(|mut s| s.execute(params![seq, "h".repeat(64), line]))
        .expect("event");
    c.prepare_cached("INSERT INTO receipts VALUES (?1, ?2, ?3)")
        .and_then(|mut s| s.execute(params![seq, format!("cmd-{seq:012}"), "d".repeat(64)]))
        .expect("receipt");
    c.prepare_cached(
        "INSERT INTO revisions VALUES ('thermostat-1', 'main', ?1)
         ON CONFLICT(device_id, resource) DO UPDATE SET revision = excluded.revision",
    )
    .and_then(|mut s| s.execute([seq]))
    .expect("revision");
    c.prepare_cached(
        "INSERT INTO meta VALUES ('chain_head', ?1)
         ON CONFLICT(key) DO UPDATE SET value = excluded.value",
    )
    .and_then(|mut s| s.execute([format!("{seq} h")]))
    .expect("head");
    c.prepare_cached("COMMIT")
        .and_then(|mut s| s.execute([]))
        .expect("commit");
}

/// A thread that `fdatasync`s the journal each time it is asked.
fn spawn_flusher(journal: File) -> (SyncSender<()>, Receiver<std::io::Result<()>>) {
    let (ask, asked) = sync_channel::<()>(1);
    let (answer, answered) = sync_channel(1);
    std::thread::spawn(move || {
        while asked.recv().is_ok() {
            if answer.send(journal.sync_data()).is_err() {
                return;
            }
        }
    });
    (ask, answered)
}
