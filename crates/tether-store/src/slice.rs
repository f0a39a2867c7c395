//! A slice of the chain that verifies on its own: `tether audit export
//! --since SEQ`.
//!
//! The slice starts right after the head signed by the newest checkpoint
//! entry at or before `SEQ` (the checkpoint entry itself when nothing was
//! appended between the signed head and it), runs to the head and is closed
//! by an export seal like a whole export. Its first entry's `prev_hash` is
//! the signed head hash, so a verifier with the public key proves the start
//! from the checkpoint inside the slice ([`crate::verify::verify_jsonl_with`]).
//!
//! Written on top of [`Store::export_chain`], so every backend slices alike;
//! it reads the chain twice (once to find the checkpoint, once to write).

use crate::checkpoint::CHECKPOINT_KIND;
use crate::verify::{write_export_seal_at, EXPORT_SEAL_KIND};
use crate::{Store, StoreError};
use serde::Deserialize;
use std::io::Write;

/// What an exported slice holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceInfo {
    /// Seq of its first entry.
    pub first_seq: u64,
    /// Seq of the checkpoint entry that proves its start.
    pub checkpoint_seq: u64,
    /// Entries written (the seal not counted).
    pub entries: u64,
}

/// The members of an entry a slice needs (the body is skipped unread).
#[derive(Deserialize)]
struct Head {
    seq: u64,
    kind: String,
    hash: String,
    body: serde::de::IgnoredAny,
}

/// A checkpoint entry's signed seq.
#[derive(Deserialize)]
struct CheckpointLine {
    body: CheckpointBody,
}

#[derive(Deserialize)]
struct CheckpointBody {
    signed: Signed,
}

#[derive(Deserialize)]
struct Signed {
    seq: u64,
}

/// Writes the slice of the chain from the checkpoint at or before `since`
/// to the head, closed by its seal.
///
/// # Errors
/// No checkpoint entry at or before `since` ([`StoreError::Invalid`]), a
/// stored entry that does not parse ([`StoreError::Corrupt`]), or a read or
/// write error.
pub fn export_slice(
    store: &dyn Store,
    since: u64,
    out: &mut dyn Write,
) -> Result<SliceInfo, StoreError> {
    let mut finder = Lines::new(|line: &[u8], found: &mut Option<(u64, u64)>| {
        let head: Head = parse(line)?;
        let _ = head.body;
        if head.kind == CHECKPOINT_KIND && head.seq <= since {
            let cp: CheckpointLine = parse(line)?;
            *found = Some((head.seq, cp.body.signed.seq));
        }
        Ok(())
    });
    let read = store.export_chain(&mut finder);
    let found = finder.finish()?;
    read?;
    let Some((checkpoint_seq, signed_seq)) = found else {
        return Err(StoreError::Invalid(format!(
            "no checkpoint entry at or before seq {since}: a slice must start at a signed checkpoint (export the whole chain instead)"
        )));
    };
    let first_seq = signed_seq + 1;
    let mut writer = Lines::new(|line: &[u8], acc: &mut Option<(u64, u64, String)>| {
        let head: Head = parse(line)?;
        if head.kind == EXPORT_SEAL_KIND || head.seq < first_seq {
            return Ok(());
        }
        out.write_all(line)?;
        out.write_all(b"\n")?;
        let count = acc.as_ref().map_or(0, |a| a.1);
        *acc = Some((head.seq, count + 1, head.hash));
        Ok(())
    });
    let read = store.export_chain(&mut writer);
    let written = writer.finish()?;
    read?;
    let (last_seq, entries, last_hash) = written.ok_or_else(|| {
        StoreError::Corrupt(format!("the chain holds no entry from seq {first_seq} on"))
    })?;
    write_export_seal_at(out, last_seq + 1, entries, &last_hash)?;
    out.flush()?;
    Ok(SliceInfo {
        first_seq,
        checkpoint_seq,
        entries,
    })
}

fn parse<'a, T: Deserialize<'a>>(line: &'a [u8]) -> Result<T, StoreError> {
    serde_json::from_slice(line)
        .map_err(|e| StoreError::Corrupt(format!("an exported entry does not parse: {e}")))
}

/// A writer that hands each complete line to `each`, with state `acc`.
pub(crate) struct Lines<A, F> {
    partial: Vec<u8>,
    acc: Option<A>,
    each: F,
    error: Option<StoreError>,
}

impl<A, F: FnMut(&[u8], &mut Option<A>) -> Result<(), StoreError>> Lines<A, F> {
    pub(crate) fn new(each: F) -> Self {
        Lines {
            partial: Vec::new(),
            acc: None,
            each,
            error: None,
        }
    }

    pub(crate) fn finish(self) -> Result<Option<A>, StoreError> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(self.acc),
        }
    }
}

impl<A, F: FnMut(&[u8], &mut Option<A>) -> Result<(), StoreError>> Write for Lines<A, F> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut rest = buf;
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            self.partial.extend_from_slice(&rest[..i]);
            rest = &rest[i + 1..];
            let line = std::mem::take(&mut self.partial);
            if let Err(e) = (self.each)(&line, &mut self.acc) {
                // Kept for `finish`, which names it; the export stops here.
                let msg = e.to_string();
                self.error = Some(e);
                return Err(std::io::Error::other(msg));
            }
        }
        if self.partial.len() + rest.len() > crate::MAX_ENTRY_BYTES + 2 {
            return Err(std::io::Error::other("an exported line is too long"));
        }
        self.partial.extend_from_slice(rest);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
