//! Retention: `tether audit archive --before SEQ` moves the oldest entries of
//! the chain into a sealed export file and removes them from the store,
//! which then verifies from a signed checkpoint on.
//!
//! The cut is always at a head a checkpoint signed: the newest checkpoint
//! entry at or before `SEQ` signs seq `S`; entries up to `S` go to the file,
//! and the store keeps `S + 1` on, which holds that checkpoint (its entry
//! comes after the head it signs), so the store's start is proven exactly as
//! a slice's is ([`crate::slice`]). The order is fixed so that nothing is lost
//! whatever fails: the file is written, fsynced (with its directory) and
//! verified with the public keys first; only then does one store transaction
//! copy the receipts and invocation records those entries held into their
//! index rows (a `command_id` stays answered, never runnable again), delete
//! the entries and record an [`ArchiveAnchor`]. A failure before that
//! transaction leaves the store as it was.
//!
//! Written on [`Store::export_chain`] for the reading, so both backends
//! archive alike; the transaction is the backend's
//! ([`Store::archive_commit`]).

use crate::checkpoint::{KeyRing, CHECKPOINT_KIND};
use crate::signed::SigningReport;
use crate::verify::{
    verify_jsonl_with, write_export_seal_at, VerifyOptions, VerifyReport, EXPORT_SEAL_KIND,
};
use crate::{Store, StoreError};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::Path;

/// What the store records of one archive: where its chain now starts and
/// the file that holds what came before. Not signed: what proves the
/// store's start is the checkpoint that signs `through_seq`; what shows
/// that nothing is missing is the archive file ending where the store
/// begins (its last entry's hash is `through_hash`, its SHA-256 is
/// `file_sha256`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ArchiveAnchor {
    /// Seq of the last archived entry (the head the checkpoint signs).
    pub through_seq: u64,
    /// Its hash: the `prev_hash` of the store's first entry.
    pub through_hash: String,
    /// Seq of the checkpoint entry (still in the store) that signs it.
    pub checkpoint_seq: u64,
    /// Seq of the first entry in the file (1, or one past the previous archive).
    pub first_seq: u64,
    /// Entries in the file (the seal not counted).
    pub entries: u64,
    /// SHA-256 (hex) of the whole file, seal included.
    pub file_sha256: String,
    /// The file's name as given to `archive` (for people; not checked).
    pub file_name: String,
    /// When the entries were removed (ms since the Unix epoch).
    pub archived_ms: u64,
}

/// What one archive run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveOutcome {
    /// The anchor now recorded.
    pub anchor: ArchiveAnchor,
    /// Receipts whose documents moved from their entries into their index rows.
    pub receipts_kept: u64,
    /// Invocation records moved likewise.
    pub invocations_kept: u64,
}

/// What the backend transaction reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ArchiveCommitted {
    /// Receipt documents copied into the receipts index.
    pub receipts_kept: u64,
    /// Invocation records copied into the invocations index.
    pub invocations_kept: u64,
}

/// The members of an entry the search needs.
#[derive(Deserialize)]
struct Head {
    seq: u64,
    kind: String,
    body: serde_json::Value,
}

/// The members of an entry the writing pass needs (the body skipped unread).
#[derive(Deserialize)]
struct Link {
    seq: u64,
    kind: String,
    hash: String,
}

/// The checkpoint found for the cut.
struct Found {
    entry_seq: u64,
    body: serde_json::Value,
}

/// Archives the entries before the newest signed checkpoint at or before
/// `before` into a new file `out` (never overwritten), then removes them
/// from `store`.
///
/// # Errors
/// [`StoreError::Invalid`] for a refusal (no checkpoint at or before
/// `before`, `before` past the head, nothing left to archive, a checkpoint
/// that does not verify with `keys`, `out` already there); [`StoreError::Io`]
/// when the file cannot be written; any error of the backend's transaction.
/// Nothing is removed from the store unless this returns `Ok`.
pub fn archive(
    store: &dyn Store,
    before: u64,
    keys: &KeyRing,
    out: &Path,
) -> Result<ArchiveOutcome, StoreError> {
    if keys.is_empty() {
        return Err(StoreError::Invalid(
            "no public key: archiving needs the evidence signing key's public keys".into(),
        ));
    }
    let previous = store.archive_anchor()?;
    let first_seq = previous.as_ref().map_or(1, |a| a.through_seq + 1);
    let (head, _) = store
        .chain_head()?
        .ok_or_else(|| StoreError::Invalid("the chain is empty: nothing to archive".into()))?;
    if before > head {
        return Err(StoreError::Invalid(format!(
            "--before {before} is beyond the chain's head (seq {head}); nothing was archived"
        )));
    }
    if let Some(p) = previous.as_ref().filter(|p| before <= p.checkpoint_seq) {
        return Err(StoreError::Invalid(format!(
            "nothing to archive before seq {before}: the store starts at seq {first_seq} (seq {} to {} are archived in {}), and its first checkpoint is at seq {}",
            p.first_seq, p.through_seq, p.file_name, p.checkpoint_seq
        )));
    }
    let found = find_checkpoint(store, before)?;
    let cp = keys.check_body(&found.body).map_err(|e| {
        StoreError::Invalid(format!(
            "the checkpoint at seq {} does not verify: {e}; nothing was archived",
            found.entry_seq
        ))
    })?;
    if cp.seq < first_seq {
        return Err(StoreError::Invalid(format!(
            "nothing to archive: the newest checkpoint at or before seq {before} (seq {}) signs seq {}, and the store already starts at seq {first_seq}",
            found.entry_seq, cp.seq
        )));
    }
    if let Some(p) = previous.as_ref().filter(|p| cp.seq < p.checkpoint_seq) {
        return Err(StoreError::Invalid(format!(
            "the checkpoint at seq {} signs seq {}, before the checkpoint at seq {} that proves the store's start: an archive of seq {first_seq} to {} would not verify on its own; archive --before a later seq",
            found.entry_seq, cp.seq, p.checkpoint_seq, cp.seq
        )));
    }
    let (entries, last_hash) = write_file(store, out, first_seq, cp.seq)?;
    if last_hash != cp.head_hash {
        let _ = std::fs::remove_file(out);
        return Err(StoreError::Corrupt(format!(
            "the entry at seq {} is not the head the checkpoint at seq {} signed; nothing was archived",
            cp.seq, found.entry_seq
        )));
    }
    let file_sha256 = match check_file(out, keys, first_seq, cp.seq, entries) {
        Ok(d) => d,
        Err(e) => {
            let _ = std::fs::remove_file(out);
            return Err(e);
        }
    };
    let anchor = ArchiveAnchor {
        through_seq: cp.seq,
        through_hash: cp.head_hash,
        checkpoint_seq: found.entry_seq,
        first_seq,
        entries,
        file_sha256,
        file_name: out.display().to_string(),
        archived_ms: tether_core::receipt::now_ms(),
    };
    let done = match store.archive_commit(&anchor) {
        Ok(d) => d,
        // The file stays when the entries may be gone (a commit whose
        // outcome is unknown); otherwise nothing was removed, nor is kept.
        Err(e @ StoreError::Indeterminate(_)) => return Err(e),
        Err(e) => {
            let _ = std::fs::remove_file(out);
            return Err(e);
        }
    };
    Ok(ArchiveOutcome {
        anchor,
        receipts_kept: done.receipts_kept,
        invocations_kept: done.invocations_kept,
    })
}

/// The newest checkpoint entry at or before `before`.
fn find_checkpoint(store: &dyn Store, before: u64) -> Result<Found, StoreError> {
    let mut finder = crate::slice::Lines::new(|line: &[u8], found: &mut Option<Found>| {
        if !contains(line, CHECKPOINT_KIND.as_bytes()) {
            return Ok(());
        }
        let h: Head = parse(line)?;
        if h.kind == CHECKPOINT_KIND && h.seq <= before {
            *found = Some(Found {
                entry_seq: h.seq,
                body: h.body,
            });
        }
        Ok(())
    });
    let read = store.export_chain(&mut finder);
    let found = finder.finish()?;
    read?;
    found.ok_or_else(|| {
        StoreError::Invalid(format!(
            "no signed checkpoint at or before seq {before}: an archive ends at a head a checkpoint signed (an endpoint with a key signs them; see `tether keys init`); nothing was archived"
        ))
    })
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn parse<'a, T: Deserialize<'a>>(line: &'a [u8]) -> Result<T, StoreError> {
    serde_json::from_slice(line)
        .map_err(|e| StoreError::Corrupt(format!("an exported entry does not parse: {e}")))
}

/// Writes entries `first..=last` and the seal to a new file `out`, fsynced
/// with its directory; answers the count and the last entry's hash.
fn write_file(
    store: &dyn Store,
    out: &Path,
    first: u64,
    last: u64,
) -> Result<(u64, String), StoreError> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(out)
        .map_err(|e| {
            StoreError::Io(format!(
                "cannot create the archive file {}: {e}; nothing was archived",
                out.display()
            ))
        })?;
    let r = write_into(store, &file, first, last).and_then(|written| {
        file.sync_all()?;
        sync_dir(out)?;
        Ok(written)
    });
    if r.is_err() {
        let _ = std::fs::remove_file(out);
    }
    r
}

fn write_into(
    store: &dyn Store,
    file: &std::fs::File,
    first: u64,
    last: u64,
) -> Result<(u64, String), StoreError> {
    let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
    let mut pick = crate::slice::Lines::new(|line: &[u8], acc: &mut Option<(u64, u64, String)>| {
        let h: Link = parse(line)?;
        if h.kind == EXPORT_SEAL_KIND || h.seq < first || h.seq > last {
            return Ok(());
        }
        w.write_all(line)?;
        w.write_all(b"\n")?;
        let count = acc.as_ref().map_or(0, |a| a.1);
        *acc = Some((h.seq, count + 1, h.hash));
        Ok(())
    });
    let read = store.export_chain(&mut pick);
    let got = pick.finish()?;
    read?;
    let (seq, entries, hash) = got
        .ok_or_else(|| StoreError::Corrupt(format!("the store holds no entry from seq {first}")))?;
    if seq != last || entries != last - first + 1 {
        return Err(StoreError::Corrupt(format!(
            "the store's entries from seq {first} to {last} are not all there (read {entries}, the last at seq {seq})"
        )));
    }
    write_export_seal_at(&mut w, last + 1, entries, &hash)?;
    w.flush()?;
    Ok((entries, hash))
}

/// A new file's name lasts only once its directory is on disk.
fn sync_dir(file: &Path) -> Result<(), StoreError> {
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

/// Reads the written file back: it verifies with the keys, from `first` to
/// `last`, every entry there; answers its SHA-256.
fn check_file(
    out: &Path,
    keys: &KeyRing,
    first: u64,
    last: u64,
    entries: u64,
) -> Result<String, StoreError> {
    let opts = VerifyOptions {
        keys: Some(keys.clone()),
        ..VerifyOptions::default()
    };
    let (report, signing, sha256) = verify_file_hashed(out, &opts)?;
    if !report.ok
        || report.entries != entries
        || signing.first_seq != first
        || signing.last_seq != last
    {
        let why = report.first_broken.map_or_else(
            || "it does not hold what was written".into(),
            |b| b.to_string(),
        );
        return Err(StoreError::Corrupt(format!(
            "the archive file {} does not verify ({why}); it was removed and nothing was archived",
            out.display()
        )));
    }
    Ok(sha256)
}

/// Verifies an export file with `opts` and takes its SHA-256 in the same
/// read.
///
/// # Errors
/// The file cannot be read; [`StoreError::Invalid`] for what the verifier
/// refuses to read at all.
pub(crate) fn verify_file_hashed(
    path: &Path,
    opts: &VerifyOptions,
) -> Result<(VerifyReport, SigningReport, String), StoreError> {
    let mut hashing = HashingReader {
        inner: std::fs::File::open(path)?,
        sha: Sha256::new(),
    };
    let (report, signing) = verify_jsonl_with(std::io::BufReader::new(&mut hashing), opts)
        .map_err(StoreError::Invalid)?;
    // Anything after the seal fails the check; read to the end all the
    // same so the digest covers every byte.
    std::io::copy(&mut hashing, &mut std::io::sink())?;
    Ok((report, signing, hex::encode(hashing.sha.finalize())))
}

struct HashingReader<R> {
    inner: R,
    sha: Sha256,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.sha.update(&buf[..n]);
        Ok(n)
    }
}

/// The SHA-256 (hex) of a file, as [`ArchiveAnchor::file_sha256`] records it.
///
/// # Errors
/// The file cannot be read.
pub fn file_sha256(path: &Path) -> Result<String, StoreError> {
    let mut r = HashingReader {
        inner: std::fs::File::open(path)?,
        sha: Sha256::new(),
    };
    std::io::copy(&mut r, &mut std::io::sink())?;
    Ok(hex::encode(r.sha.finalize()))
}
