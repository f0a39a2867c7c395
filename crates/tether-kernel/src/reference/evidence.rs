//! The evidence chain for operators' eyes: its tail, a verification of the
//! whole chain, and an export — what `tether audit` does from a shell, for
//! the console (which may not reach the store itself).
//!
//! **Owns:** [`Kernel::evidence_tail`], [`Kernel::evidence_verify`],
//! [`Kernel::evidence_export`]: bounded reads of the store's chain.
//! **Never belongs here:** writing evidence (every stage records its own),
//! who may see it (the surface decides: the console shows it to operators).
//! **Fail-closed rule:** a chain that cannot be read is reported as an error,
//! never as verified.

use crate::kernel::Kernel;
use crate::ApiError;
use serde_json::{json, Value};
use std::io::{Read, Write};
use tether_core::Code;

/// Entries a tail holds at most.
pub const EVIDENCE_TAIL_MAX: usize = 200;
/// Chunks in flight between the export and the verifier (each up to the
/// writer's buffer): the verification's memory is bounded by this, not by
/// the chain's length.
const CHUNKS_IN_FLIGHT: usize = 16;

fn unavailable(e: &dyn std::fmt::Display) -> ApiError {
    ApiError::new(
        Code::EvidenceUnavailable,
        "the evidence chain cannot be read now",
        json!({"store_error": e.to_string()}),
    )
}

/// Bytes handed from the export thread to the verifier.
struct Chunks {
    rx: std::sync::mpsc::Receiver<Vec<u8>>,
    buf: Vec<u8>,
    pos: usize,
}

impl Read for Chunks {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.pos == self.buf.len() {
            match self.rx.recv() {
                Ok(next) => {
                    self.buf = next;
                    self.pos = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// The export's side: each write is a chunk (a closed reader ends it).
struct Sender(std::sync::mpsc::SyncSender<Vec<u8>>);

impl Write for Sender {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0
            .send(b.to_vec())
            .map_err(|_| std::io::Error::other("the verifier stopped reading"))?;
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Kernel {
    /// The newest `n` chain entries (at most [`EVIDENCE_TAIL_MAX`]), oldest
    /// first.
    ///
    /// # Errors
    /// The store cannot be read.
    pub fn evidence_tail(&self, n: usize) -> Result<Vec<Value>, ApiError> {
        self.inner
            .store
            .chain_tail(n.min(EVIDENCE_TAIL_MAX))
            .map_err(|e| unavailable(&e))
    }

    /// Writes the whole chain as JSON Lines, sealed, as `tether audit export`
    /// does; answers the count of entries.
    ///
    /// # Errors
    /// The store cannot be read or `out` refused a write.
    pub fn evidence_export(&self, out: &mut dyn Write) -> Result<u64, ApiError> {
        self.inner
            .store
            .export_chain(out)
            .map_err(|e| unavailable(&e))
    }

    /// Verifies the whole chain (hashes, links, order, the export's seal),
    /// streaming it through the verifier in bounded memory:
    /// `{ok, entries, first_broken?}`.
    ///
    /// # Errors
    /// The store cannot be read.
    pub fn evidence_verify(&self) -> Result<Value, ApiError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(CHUNKS_IN_FLIGHT);
        let kernel = self.clone();
        let export = std::thread::Builder::new()
            .name("tether-verify".into())
            .spawn(move || {
                let mut w = std::io::BufWriter::with_capacity(64 * 1024, Sender(tx));
                let n = kernel.evidence_export(&mut w);
                let flushed = w.flush();
                n.and_then(|n| flushed.map(|()| n).map_err(|e| unavailable(&e)))
            })
            .map_err(|e| unavailable(&e))?;
        let report = tether_store::verify::verify_jsonl(std::io::BufReader::new(Chunks {
            rx,
            buf: Vec::new(),
            pos: 0,
        }));
        let exported = export
            .join()
            .map_err(|_| unavailable(&"the export ended abnormally"))??;
        Ok(json!({
            "ok": report.ok,
            "entries": report.entries,
            "exported": exported,
            "first_broken": report.first_broken.map(|b| json!({"line": b.line, "seq": b.seq, "reason": b.reason})),
        }))
    }
}
