//! `tether audit verify --archive FILE…`: the archive files a store's
//! retention moved out, checked together with the store, so an auditor can
//! show that the whole history from seq 1 is there and unbroken.
//!
//! Each file must verify on its own (its chain, its seal, its checkpoints
//! when keys are given). Ordered by their first seq, the files must start
//! at seq 1 and follow each other without a gap: each one's first entry
//! links (`prev_hash`) to the previous one's last entry. The newest must be
//! exactly the one the store's [`ArchiveAnchor`] names: its first and last
//! seq, its last hash (the `prev_hash` of the store's first entry) and its
//! SHA-256. Older files are bound by the links alone: the newest file's
//! first entry holds the hash of the entry before it, so an older file that
//! was changed no longer links.

use crate::archive::{verify_file_hashed, ArchiveAnchor};
use crate::verify::VerifyOptions;
use serde::Deserialize;
use std::io::{BufRead, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Longest line read from a file's end to find its seal (a seal is some
/// 300 bytes; a longer last line is no seal).
const SEAL_LINE_MAX: u64 = 64 * 1024;
/// Longest first line read for its `prev_hash` (the file verified, so its
/// first line is an entry the store wrote, far under this).
const FIRST_LINE_MAX: u64 = 16 * 1024 * 1024;

/// What one archive file holds, once it verified on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveFile {
    /// The file, as given.
    pub path: PathBuf,
    /// Seq of its first entry.
    pub first_seq: u64,
    /// Seq of its last entry (the seal not counted).
    pub last_seq: u64,
    /// Entries it holds (the seal not counted).
    pub entries: u64,
    /// The `prev_hash` of its first entry (the hash of the entry before it).
    pub first_prev_hash: String,
    /// The hash of its last entry (the seal's `prev_hash`).
    pub last_hash: String,
    /// SHA-256 (hex) of the whole file.
    pub sha256: String,
}

#[derive(Deserialize)]
struct Links {
    prev_hash: String,
}

/// Reads and verifies one archive file with `opts` (the keys, when given,
/// check its checkpoints).
///
/// # Errors
/// A message naming the file: it cannot be read, does not verify, or holds
/// no entry.
pub fn read_archive_file(path: &Path, opts: &VerifyOptions) -> Result<ArchiveFile, String> {
    let shown = path.display();
    let (report, signing, sha256) =
        verify_file_hashed(path, opts).map_err(|e| format!("{shown}: {e}"))?;
    if !report.ok {
        let why = report
            .first_broken
            .map_or_else(|| "it does not verify".to_owned(), |b| b.to_string());
        return Err(format!("{shown}: broken at {why}"));
    }
    if report.entries == 0 {
        return Err(format!("{shown}: holds no entry"));
    }
    let mut first = String::new();
    std::fs::File::open(path)
        .map(|f| std::io::BufReader::new(f).take(FIRST_LINE_MAX))
        .and_then(|mut r| r.read_line(&mut first))
        .map_err(|e| format!("{shown}: {e}"))?;
    let first_prev_hash = links(&first).map_err(|e| format!("{shown}: first line: {e}"))?;
    let last_hash = seal_prev_hash(path).map_err(|e| format!("{shown}: its seal: {e}"))?;
    Ok(ArchiveFile {
        path: path.to_owned(),
        first_seq: signing.first_seq,
        last_seq: signing.last_seq,
        entries: report.entries,
        first_prev_hash,
        last_hash,
        sha256,
    })
}

fn links(line: &str) -> Result<String, String> {
    serde_json::from_str::<Links>(line.trim_end())
        .map(|l| l.prev_hash)
        .map_err(|e| e.to_string())
}

/// The `prev_hash` of a file's last line (an export's seal: the hash of its
/// last entry). The file verified, so its last line is the seal.
fn seal_prev_hash(path: &Path) -> Result<String, String> {
    let mut f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    let from = len.saturating_sub(SEAL_LINE_MAX);
    f.seek(SeekFrom::Start(from)).map_err(|e| e.to_string())?;
    let mut tail = Vec::new();
    f.read_to_end(&mut tail).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&tail);
    let last = text
        .trim_end_matches('\n')
        .rsplit('\n')
        .next()
        .ok_or("the file is empty")?;
    links(last)
}

/// Checks that `files` (in any order) are the whole history before the
/// store's start: from seq 1, without gap or overlap, each linked to the
/// one before, the newest the one `anchor` names. Answers the files in seq
/// order.
///
/// # Errors
/// A message naming the first file (or pair of files) that breaks the
/// history.
pub fn check_history(
    mut files: Vec<ArchiveFile>,
    anchor: Option<&ArchiveAnchor>,
) -> Result<Vec<ArchiveFile>, String> {
    let Some(anchor) = anchor else {
        return Err(
            "the store has archived nothing (it starts at seq 1): no archive file belongs to it"
                .into(),
        );
    };
    files.sort_by_key(|f| f.first_seq);
    let Some(oldest) = files.first() else {
        return Err("no archive file given".into());
    };
    if oldest.first_seq != 1 {
        return Err(format!(
            "{}: starts at seq {}; the oldest archive starts at seq 1 (an older archive file is missing)",
            oldest.path.display(),
            oldest.first_seq
        ));
    }
    for pair in files.windows(2) {
        check_link(&pair[0], &pair[1])?;
    }
    let newest = files.last().ok_or("no archive file given")?;
    check_anchor(newest, anchor)?;
    Ok(files)
}

/// `b` follows `a` directly: no gap, no overlap, and linked by hash.
fn check_link(a: &ArchiveFile, b: &ArchiveFile) -> Result<(), String> {
    if b.first_seq != a.last_seq + 1 {
        return Err(format!(
            "{} ends at seq {} but {} starts at seq {}: {}",
            a.path.display(),
            a.last_seq,
            b.path.display(),
            b.first_seq,
            if b.first_seq > a.last_seq + 1 {
                "entries are missing between them"
            } else {
                "they overlap"
            }
        ));
    }
    if b.first_prev_hash != a.last_hash {
        return Err(format!(
            "{} (seq {}) does not link to the last entry of {} (seq {}): prev_hash {} is not {}",
            b.path.display(),
            b.first_seq,
            a.path.display(),
            a.last_seq,
            b.first_prev_hash,
            a.last_hash
        ));
    }
    Ok(())
}

/// The newest file is the one the store records.
fn check_anchor(f: &ArchiveFile, anchor: &ArchiveAnchor) -> Result<(), String> {
    let shown = f.path.display();
    if f.last_seq != anchor.through_seq || f.first_seq != anchor.first_seq {
        return Err(format!(
            "{shown} holds seq {} to {}; the store's newest archive holds seq {} to {} (in {})",
            f.first_seq, f.last_seq, anchor.first_seq, anchor.through_seq, anchor.file_name
        ));
    }
    if f.last_hash != anchor.through_hash {
        return Err(format!(
            "{shown}: its last entry's hash {} is not the one the store starts after ({})",
            f.last_hash, anchor.through_hash
        ));
    }
    if f.sha256 != anchor.file_sha256 {
        return Err(format!(
            "{shown}: sha256 {} is not the archived file's ({})",
            f.sha256, anchor.file_sha256
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, (first, last): (u64, u64), (prev, hash): (&str, &str)) -> ArchiveFile {
        ArchiveFile {
            path: PathBuf::from(name),
            first_seq: first,
            last_seq: last,
            entries: last + 1 - first,
            first_prev_hash: prev.into(),
            last_hash: hash.into(),
            sha256: format!("sha-{name}"),
        }
    }

    fn anchor(f: &ArchiveFile) -> ArchiveAnchor {
        ArchiveAnchor {
            through_seq: f.last_seq,
            through_hash: f.last_hash.clone(),
            checkpoint_seq: f.last_seq + 2,
            first_seq: f.first_seq,
            entries: f.entries,
            file_sha256: f.sha256.clone(),
            file_name: f.path.display().to_string(),
            archived_ms: 0,
        }
    }

    #[test]
    fn files_in_any_order_make_one_history_or_name_what_breaks_it() {
        let a = file("a", (1, 10), ("g", "h10"));
        let b = file("b", (11, 20), ("h10", "h20"));
        let ok = check_history(vec![b.clone(), a.clone()], Some(&anchor(&b))).expect("history");
        assert_eq!(ok[0].path, a.path);
        let gap = file("b", (12, 20), ("h11", "h20"));
        let e = check_history(vec![a.clone(), gap.clone()], Some(&anchor(&gap))).unwrap_err();
        assert!(e.contains("entries are missing between them"), "{e}");
        let unlinked = file("b", (11, 20), ("hX", "h20"));
        let e =
            check_history(vec![a.clone(), unlinked.clone()], Some(&anchor(&unlinked))).unwrap_err();
        assert!(e.contains("does not link"), "{e}");
        let mut other = anchor(&b);
        other.file_sha256 = "sha-else".into();
        let e = check_history(vec![a.clone(), b.clone()], Some(&other)).unwrap_err();
        assert!(e.contains("is not the archived file's"), "{e}");
        let e = check_history(vec![a], None).unwrap_err();
        assert!(e.contains("archived nothing"), "{e}");
        let e = check_history(Vec::new(), Some(&anchor(&b))).unwrap_err();
        assert!(e.contains("no archive file"), "{e}");
    }
}
