//! Offline verification of an evidence chain: an exported JSON Lines file or
//! a store's `events` table (a PostgreSQL store's: `postgres::verify_url`).
//!
//! Each entry must parse, carry exactly the entry members, be in RFC 8785
//! canonical form (so any changed byte is significant), recompute its own
//! hash, continue the `seq` numbering (starting at 1, no gaps) and name the
//! previous entry's hash as its `prev_hash` (64 zeros for the first). The
//! first entry failing any of these is reported and checking stops there.

use crate::chain::{check_entry_text, GENESIS_PREV_HASH, MAX_ENTRY_BYTES};
use crate::signed::Signed;
pub use crate::signed::{SigningReport, VerifyOptions};
use crate::sqlite::{recorded_head, DB_FILE_NAME, PAGE_ROWS};
use crate::StoreError;
use rusqlite::{params, Connection, OpenFlags};
use std::io::{BufRead, Read};
use std::path::Path;

/// The kind of the line that closes every export.
pub const EXPORT_SEAL_KIND: &str = "audit.export.seal";

/// Writes the line that closes an export of `entries` entries whose last hash
/// is `head_hash`: an entry-shaped line (it continues the chain, so any
/// reader that checks links and hashes accepts it) of kind
/// [`EXPORT_SEAL_KIND`] that is not stored in the chain. A hash chain cannot
/// show lines cut from its end; a file that does not end with the seal of
/// its own length can.
pub(crate) fn write_export_seal(
    out: &mut dyn std::io::Write,
    entries: u64,
    head_hash: &str,
) -> std::io::Result<()> {
    write_export_seal_at(out, entries + 1, entries, head_hash)
}

/// Writes one page of an export's entries (each canonical line, then a
/// newline), counting them; answers the page's last seq, `None` for an
/// empty page (the chain's end). Both backends page their export this way.
pub(crate) fn write_export_page(
    out: &mut dyn std::io::Write,
    page: &[(i64, String)],
    count: &mut u64,
) -> std::io::Result<Option<i64>> {
    for (_, line) in page {
        out.write_all(line.as_bytes())?;
        out.write_all(b"\n")?;
        *count += 1;
    }
    Ok(page.last().map(|&(seq, _)| seq))
}

/// [`write_export_seal`] for a slice: the seal takes seq `seq` (one past the
/// slice's last entry) and counts the slice's `entries`.
pub(crate) fn write_export_seal_at(
    out: &mut dyn std::io::Write,
    seq: u64,
    entries: u64,
    head_hash: &str,
) -> std::io::Result<()> {
    let body = tether_core::canonical::to_canonical_string(&serde_json::json!({
        "entries": entries,
        "note": "closes an export of the evidence chain; not an entry of the store",
    }));
    let ts_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    let sealed = crate::chain::seal(
        seq,
        ts_ms,
        &crate::chain::kind_json(EXPORT_SEAL_KIND),
        &body,
        head_hash,
        &mut String::new(),
    );
    out.write_all(sealed.line.as_bytes())?;
    out.write_all(b"\n")
}

/// Outcome of a verification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    /// Number of intact entries before the first broken one (all of them
    /// when `ok`).
    pub entries: u64,
    /// True when no entry is broken. An empty chain is ok.
    pub ok: bool,
    /// The first broken entry, when not `ok`.
    pub first_broken: Option<Broken>,
}

/// Where and why a chain breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken {
    /// 1-based line number in the file (for a store: 1-based row position in
    /// `seq` order).
    pub line: u64,
    /// The entry's `seq`, when it could be read.
    pub seq: Option<u64>,
    /// What is wrong, e.g. `hash mismatch`, `prev_hash does not match previous
    /// entry`, `seq gap: expected 5, found 6`, `unparseable line: …`.
    pub reason: String,
}

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.seq {
            Some(seq) => write!(f, "line {} (seq {seq}): {}", self.line, self.reason),
            None => write!(f, "line {}: {}", self.line, self.reason),
        }
    }
}

/// Incremental chain checker: feed entries in order, then take the report.
#[derive(Debug, Clone)]
pub struct ChainVerifier {
    line: u64,
    entries: u64,
    /// The seq the next entry must carry (`None` before the first entry of
    /// a verifier that accepts a slice).
    next_seq: Option<u64>,
    prev_hash: String,
    broken: Option<Broken>,
    signed: Signed,
    /// Verifying a store: where its chain must start (`Some(None)`: seq 1,
    /// `Some(Some(n))`: one past the archive it records through seq `n`),
    /// named when the first entry is not there.
    store_start: Option<Option<u64>>,
}

impl Default for ChainVerifier {
    fn default() -> Self {
        Self::new()
    }
}

impl ChainVerifier {
    /// A verifier expecting the chain to start at seq 1, checking no
    /// signature (checkpoints are counted).
    pub fn new() -> Self {
        Self::with_signed(Signed::plain())
    }

    /// A verifier with `opts`: with public keys it checks every checkpoint
    /// and accepts a slice (a chain starting after seq 1) whose start a
    /// checkpoint in it proves.
    ///
    /// # Errors
    /// A saved checkpoint whose own signature does not verify, or one given
    /// without public keys.
    pub fn with_options(opts: &VerifyOptions) -> Result<Self, String> {
        Ok(Self::with_signed(Signed::new(opts)?))
    }

    fn with_signed(signed: Signed) -> Self {
        ChainVerifier {
            line: 0,
            entries: 0,
            next_seq: (!signed.accepts_slices()).then_some(1),
            prev_hash: GENESIS_PREV_HASH.to_string(),
            broken: None,
            signed,
            store_start: None,
        }
    }

    /// A verifier of a store's chain: it starts at seq 1, or, when the store
    /// records an archive, right after it (`prev_hash` the archived head's
    /// hash), a start only a signed checkpoint in the store can prove (so
    /// that needs public keys). A store never verifies as a slice otherwise:
    /// entries removed from its beginning are found.
    ///
    /// # Errors
    /// As [`ChainVerifier::with_options`], and an archived store without keys.
    pub(crate) fn for_store(
        opts: &VerifyOptions,
        anchor: Option<&crate::archive::ArchiveAnchor>,
    ) -> Result<Self, String> {
        let mut v = Self::with_options(opts)?;
        match anchor {
            None => v.next_seq = Some(1),
            Some(a) => {
                if !v.signed.accepts_slices() {
                    return Err(format!(
                        "the store's entries up to seq {} are archived (in {}, sha256 {}): its chain from seq {} on is proven only by a signed checkpoint; give the public keys (--pubkey or --pubkey-file)",
                        a.through_seq, a.file_name, a.file_sha256, a.through_seq + 1
                    ));
                }
                v.next_seq = Some(a.through_seq + 1);
                v.prev_hash.clone_from(&a.through_hash);
                v.signed.set_archived_through(a.through_seq);
            }
        }
        v.store_start = Some(anchor.map(|a| a.through_seq));
        Ok(v)
    }

    /// Check the next entry's text (without its line terminator). Returns
    /// false once the chain is broken; later calls are ignored.
    pub fn push_line(&mut self, line: &[u8]) -> bool {
        self.push(line, None)
    }

    /// Like `push_line`, also checking the `seq` and `hash` columns a
    /// store keeps beside the entry text.
    pub(crate) fn push_stored(&mut self, line: &[u8], seq: i64, hash: &str) -> bool {
        self.push(line, Some((seq, hash)))
    }

    /// Like `push_line`, also checking the `seq` and `hash` a store keeps
    /// beside the entry text.
    fn push(&mut self, line: &[u8], stored: Option<(i64, &str)>) -> bool {
        if self.broken.is_some() {
            return false;
        }
        self.line += 1;
        let link = match check_entry_text(line) {
            Ok(link) => link,
            Err(e) => return self.fail(e.seq, e.reason),
        };
        // A slice's first entry sets where it starts; `Signed::finish`
        // refuses it unless a signed checkpoint in it proves that start.
        let expected = match self.next_seq {
            Some(n) => n,
            None => {
                // Seq 1 still needs the genesis `prev_hash`.
                if link.seq > 1 {
                    self.prev_hash.clone_from(&link.prev_hash);
                }
                link.seq
            }
        };
        if link.seq != expected {
            let reason = match (self.entries, self.store_start) {
                (0, Some(None)) => format!(
                    "the chain starts at seq {}, not 1, and the store records no archive: entries before it were removed",
                    link.seq
                ),
                (0, Some(Some(through))) => format!(
                    "the store records its entries up to seq {through} as archived, but its chain starts at seq {}",
                    link.seq
                ),
                _ => format!("seq gap: expected {expected}, found {}", link.seq),
            };
            return self.fail(Some(link.seq), reason);
        }
        if link.prev_hash != self.prev_hash {
            let reason = match (self.entries, self.store_start) {
                (0, Some(Some(through))) => format!(
                    "prev_hash is not the hash of seq {through} that the store's archive record names"
                ),
                _ => "prev_hash does not match previous entry".into(),
            };
            return self.fail(Some(link.seq), reason);
        }
        if let Some((seq_col, hash_col)) = stored {
            if u64::try_from(seq_col).ok() != Some(link.seq) {
                return self.fail(
                    Some(link.seq),
                    format!("seq column {seq_col} does not match the entry"),
                );
            }
            if hash_col != link.hash {
                return self.fail(
                    Some(link.seq),
                    "hash column does not match the entry".into(),
                );
            }
        }
        if let Err(reason) = self.signed.on_entry(&link) {
            return self.fail(Some(link.seq), reason);
        }
        self.entries += 1;
        self.next_seq = Some(expected + 1);
        self.prev_hash = link.hash;
        true
    }

    /// Ends the check: the signature side's verdict, given the seq of the
    /// chain's last entry (an export's seal not counted).
    fn finish_signed(&mut self, last_seq: u64) -> SigningReport {
        let (report, verdict) = self.signed.finish(last_seq);
        if let Err(reason) = verdict {
            self.fail_next(reason);
        }
        report
    }

    /// Ends a store's check (its cut-tail checks made): both reports, the
    /// archive the store records named in the signing one.
    pub(crate) fn finish_store(
        &mut self,
        anchor: Option<crate::archive::ArchiveAnchor>,
    ) -> (VerifyReport, SigningReport) {
        if !self.report().ok {
            return (self.report(), SigningReport::default());
        }
        let mut signing = self.finish_signed(self.last_seq());
        signing.archived = anchor;
        (self.report(), signing)
    }

    /// Seq of the last intact entry (0 when none).
    fn last_seq(&self) -> u64 {
        self.next_seq.map_or(0, |n| n - 1)
    }

    fn fail(&mut self, seq: Option<u64>, reason: String) -> bool {
        self.broken = Some(Broken {
            line: self.line.max(1),
            seq,
            reason,
        });
        false
    }

    /// Record a failure that is not about one entry's content (e.g. a read
    /// error) at the next line.
    pub fn fail_next(&mut self, reason: impl Into<String>) {
        if self.broken.is_none() {
            self.line += 1;
            self.fail(None, reason.into());
        }
    }

    /// The report so far.
    pub fn report(&self) -> VerifyReport {
        VerifyReport {
            entries: self.entries,
            ok: self.broken.is_none(),
            first_broken: self.broken.clone(),
        }
    }

    /// Hash of the last intact entry (64 zeros when none).
    pub fn head_hash(&self) -> &str {
        &self.prev_hash
    }
}

/// Verify a JSON Lines export. Lines end with `\n` (a `\r\n` ending is
/// accepted); the last line may lack its terminator. The last line must be
/// the export's seal ([`EXPORT_SEAL_KIND`]) stating how many entries precede
/// it, so a file shortened at its end (or empty) is broken; the report counts
/// the entries, not the seal.
pub fn verify_jsonl(r: impl BufRead) -> VerifyReport {
    run_jsonl(r, ChainVerifier::new()).0
}

/// [`verify_jsonl`] with public keys, a saved checkpoint or the demand of a
/// signed tail ([`VerifyOptions`]); with keys, a slice of a chain (`tether
/// audit export --since`) verifies when a signed checkpoint in it proves its
/// start.
///
/// # Errors
/// The options themselves are unusable (a saved checkpoint whose signature
/// does not verify, or one given without keys).
pub fn verify_jsonl_with(
    r: impl BufRead,
    opts: &VerifyOptions,
) -> Result<(VerifyReport, SigningReport), String> {
    Ok(run_jsonl(r, ChainVerifier::with_options(opts)?))
}

fn run_jsonl(r: impl BufRead, v: ChainVerifier) -> (VerifyReport, SigningReport) {
    let mut r = r;
    let mut v = v;
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut pending_seal: Option<u64> = None;
    let marker = format!("\"kind\":\"{EXPORT_SEAL_KIND}\"");
    let seal_marker = memchr::memmem::Finder::new(marker.as_bytes());
    // Each pass consumes at least one byte or ends the loop, and a line is
    // read through a `take` so no line can grow the buffer without bound.
    loop {
        buf.clear();
        let limit = MAX_ENTRY_BYTES as u64 + 2;
        match (&mut r).take(limit).read_until(b'\n', &mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => {
                v.fail_next(format!("read error: {e}"));
                break;
            }
        }
        let terminated = buf.last() == Some(&b'\n');
        if terminated {
            buf.pop();
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
        } else if buf.len() as u64 >= limit {
            v.fail_next(format!("line longer than {MAX_ENTRY_BYTES} bytes"));
            break;
        }
        if pending_seal.is_some() {
            // The seal closes the export: a line after it is not part of it.
            v.fail_next("a line follows the export's closing seal");
            break;
        }
        if !v.push_line(&buf) {
            break;
        }
        pending_seal = seal_entries(&buf, &seal_marker);
    }
    let report = v.report();
    if !report.ok {
        return (report, SigningReport::default());
    }
    match pending_seal {
        Some(n) if n + 1 == report.entries => {
            let signing = v.finish_signed(v.last_seq() - 1);
            let mut report = v.report();
            report.entries = report.entries.min(n);
            (report, signing)
        }
        Some(n) => {
            v.fail_next(format!(
                "the export's seal counts {n} entries, the file holds {}",
                report.entries.saturating_sub(1)
            ));
            (v.report(), SigningReport::default())
        }
        None => {
            v.fail_next(format!(
                "the export's closing seal is missing after seq {}: entries were cut from its end, or this is not a whole export",
                v.last_seq()
            ));
            (v.report(), SigningReport::default())
        }
    }
}

/// The entry count a seal line states, or `None` for any other entry.
/// `marker` finds `"kind":"audit.export.seal"` (built once per run).
fn seal_entries(line: &[u8], marker: &memchr::memmem::Finder<'_>) -> Option<u64> {
    // Only the last line is a seal: a byte look spares every other line a
    // second parse (the chain check already parsed it).
    marker.find(line)?;
    let v: serde_json::Value = serde_json::from_slice(line).ok()?;
    if v.get("kind").and_then(serde_json::Value::as_str) != Some(EXPORT_SEAL_KIND) {
        return None;
    }
    v.get("body")?.get("entries")?.as_u64()
}

/// Verify the chain stored in the state directory `dir` (its `tether.db`),
/// reading the `events` table in `seq` order a page at a time. The stored
/// entry text is the source of truth; its `seq` and `hash` columns must agree
/// with it. Opens the database read-only and never creates it.
pub fn verify_store(dir: &Path) -> Result<VerifyReport, StoreError> {
    Ok(run_store(dir, &VerifyOptions::default())?.0)
}

/// [`verify_store`] with [`VerifyOptions`] (as [`verify_jsonl_with`]).
///
/// # Errors
/// The store cannot be read ([`StoreError`]), or the options are unusable
/// ([`StoreError::Invalid`]).
pub fn verify_store_with(
    dir: &Path,
    opts: &VerifyOptions,
) -> Result<(VerifyReport, SigningReport), StoreError> {
    run_store(dir, opts)
}

fn run_store(
    dir: &Path,
    opts: &VerifyOptions,
) -> Result<(VerifyReport, SigningReport), StoreError> {
    let path = dir.join(DB_FILE_NAME);
    if !path.is_file() {
        return Err(StoreError::Io(format!(
            "no Tether store at {}",
            path.display()
        )));
    }
    let conn = Connection::open_with_flags(
        &path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| StoreError::Sqlite(format!("cannot open {}: {e}", path.display())))?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    let has_events: bool = conn.query_row(
        "SELECT EXISTS(SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'events')",
        [],
        |r| r.get(0),
    )?;
    if !has_events {
        return Err(StoreError::Corrupt(format!(
            "{} has no events table",
            path.display()
        )));
    }
    // Verify up to the head as of now: bounds the loop even while a live
    // endpoint keeps appending. The head, the one the store recorded and the
    // highest seq its indexes name are read in one snapshot.
    conn.execute_batch("BEGIN")?;
    let head: i64 = conn.query_row("SELECT COALESCE(MAX(seq), 0) FROM events", [], |r| r.get(0))?;
    let recorded = recorded_head(&conn)?;
    let indexed = highest_indexed_seq(&conn)?;
    let anchor = crate::sqlite::read_anchor(&conn)?;
    conn.execute_batch("COMMIT")?;
    let mut v = ChainVerifier::for_store(opts, anchor.as_ref()).map_err(StoreError::Invalid)?;
    let mut st = conn.prepare(
        "SELECT seq, hash, line FROM events WHERE seq > ?1 AND seq <= ?2 ORDER BY seq LIMIT ?3",
    )?;
    let mut after: i64 = i64::MIN;
    'pages: loop {
        let mut rows = st.query(params![after, head, PAGE_ROWS])?;
        let mut last = None;
        while let Some(row) = rows.next()? {
            let seq: i64 = row.get(0)?;
            let hash: String = row.get(1)?;
            // Read the text as bytes so a non-UTF-8 line is reported, not an error.
            let line: Vec<u8> = match row.get_ref(2)? {
                rusqlite::types::ValueRef::Text(t) | rusqlite::types::ValueRef::Blob(t) => {
                    t.to_vec()
                }
                _ => Vec::new(),
            };
            if !v.push(&line, Some((seq, &hash))) {
                break 'pages;
            }
            last = Some(seq);
        }
        match last {
            Some(seq) => after = seq,
            None => break,
        }
    }
    if v.report().ok {
        check_nothing_cut_from_the_end(&mut v, recorded, indexed);
    }
    Ok(v.finish_store(anchor))
}

/// A hash chain cannot show entries cut from its end; the head the store
/// recorded with its last batch, and the entries its indexes point at, can.
pub(crate) fn check_nothing_cut_from_the_end(
    v: &mut ChainVerifier,
    recorded: Option<(u64, String)>,
    indexed: Option<(u64, &'static str)>,
) {
    let last = v.last_seq();
    if let Some((seq, hash)) = recorded {
        if seq > last {
            return v.fail_next(format!(
                "entries removed from the end: the store recorded its head at seq {seq}, the chain ends at seq {last}"
            ));
        }
        if seq == last && hash != v.head_hash() {
            return v.fail_next(format!(
                "the last entry (seq {seq}) is not the one the store recorded as its head"
            ));
        }
    }
    if let Some((seq, table)) = indexed {
        if seq > last {
            v.fail_next(format!(
                "entries removed from the end: the {table} index names seq {seq}, the chain ends at seq {last}"
            ));
        }
    }
}

/// The highest entry seq any index names (receipts, REST invocations,
/// approvals), with the index's name. Tables a store of an older schema lacks
/// are skipped.
fn highest_indexed_seq(conn: &Connection) -> Result<Option<(u64, &'static str)>, StoreError> {
    let mut best: Option<(u64, &'static str)> = None;
    for (table, sql) in [
        ("receipts", "SELECT MAX(seq) FROM receipts"),
        ("invocations", "SELECT MAX(seq) FROM invocations"),
        ("approvals", "SELECT MAX(created_seq) FROM approvals"),
    ] {
        let exists: bool = conn.query_row(
            "SELECT EXISTS(SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
            [table],
            |r| r.get(0),
        )?;
        if !exists {
            continue;
        }
        let max: Option<i64> = match conn.query_row(sql, [], |r| r.get(0)) {
            Ok(m) => m,
            // An older `invocations` table has no seq column: nothing indexed.
            Err(rusqlite::Error::SqliteFailure(..)) if table == "invocations" => None,
            Err(e) => return Err(e.into()),
        };
        if let Some(seq) = max.and_then(|m| u64::try_from(m).ok()) {
            if best.is_none_or(|(b, _)| seq > b) {
                best = Some((seq, table));
            }
        }
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_file_is_not_an_export() {
        let r = verify_jsonl(&b""[..]);
        assert!(!r.ok);
        let b = r.first_broken.expect("broken");
        assert!(b.reason.contains("seal is missing"), "{}", b.reason);
    }

    #[test]
    fn the_export_of_an_empty_chain_is_its_seal() {
        let mut out = Vec::new();
        write_export_seal(&mut out, 0, GENESIS_PREV_HASH).expect("write");
        let r = verify_jsonl(&out[..]);
        assert_eq!(
            r,
            VerifyReport {
                entries: 0,
                ok: true,
                first_broken: None
            }
        );
    }

    #[test]
    fn garbage_is_unparseable() {
        let r = verify_jsonl(&b"not json\n"[..]);
        assert!(!r.ok);
        let b = r.first_broken.expect("broken");
        assert_eq!((b.line, b.seq), (1, None));
        assert!(b.reason.starts_with("unparseable line"), "{}", b.reason);
    }
}
