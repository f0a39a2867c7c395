//! What a verifier with public keys adds to the hash-chain check: every
//! checkpoint's signature and signed head, where the signed part of the chain
//! ends, a slice's start proven by a checkpoint in it, and a saved checkpoint
//! the chain must still hold.

use crate::chain::EntryLink;
use crate::checkpoint::{
    hex_decode_32 as hex32, Checkpoint, KeyRing, SavedCheckpoint, CHECKPOINT_LAG_MAX,
};
use std::collections::VecDeque;

/// What the verifier is given beyond the chain.
#[derive(Debug, Clone, Default)]
pub struct VerifyOptions {
    /// Public keys to check checkpoint signatures with (current and retired).
    /// Without them checkpoints are counted, not checked, and only a whole
    /// chain (from seq 1) verifies.
    pub keys: Option<KeyRing>,
    /// A checkpoint saved earlier: the chain must still hold the head it
    /// signed and the checkpoint entry itself (needs `keys`).
    pub saved: Option<SavedCheckpoint>,
    /// Entries after the last signed position are a failure.
    pub require_signed_tail: bool,
}

/// What the verifier found about signatures.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SigningReport {
    /// True when signatures were checked (public keys were given).
    pub checked: bool,
    /// Checkpoint entries read (each checked when `checked`).
    pub checkpoints: u64,
    /// The newest signed position: the seq whose head hash a verified
    /// checkpoint signed.
    pub signed_through: Option<u64>,
    /// Seq of the first entry (1 for a whole chain, more for a slice).
    pub first_seq: u64,
    /// Seq of the last entry (the export's seal not counted); 0 when none.
    pub last_seq: u64,
    /// Entries after `signed_through`, checkpoint entries not counted (all
    /// entries when nothing is signed). Meaningful when `checked`.
    pub unsigned_tail: u64,
    /// True when a saved checkpoint was given and the chain holds it.
    pub saved_held: bool,
    /// A store's newest archive (`tether audit archive`): its chain starts
    /// right after `through_seq`, proven by a signed checkpoint in it.
    pub archived: Option<crate::archive::ArchiveAnchor>,
}

/// The signature side of one verification, fed every intact entry in order.
#[derive(Debug, Clone)]
pub(crate) struct Signed {
    keys: Option<KeyRing>,
    saved: Option<(Checkpoint, SavedCheckpoint)>,
    require_signed_tail: bool,
    /// Hashes of the last entries read, `ring[0]` being seq `ring_base`.
    ring: VecDeque<[u8; 32]>,
    ring_base: u64,
    checkpoints: u64,
    signed_through: Option<u64>,
    /// Seqs of checkpoint entries after `signed_through` (not in the tail).
    tail_checkpoints: VecDeque<u64>,
    first_seq: Option<u64>,
    /// The hashes seen at the saved checkpoint's signed seq and entry seq.
    saved_head_seen: Option<String>,
    saved_entry_seen: Option<String>,
    /// Set once a verified checkpoint names the seq before a slice's first.
    slice_start_proven: bool,
    /// A store whose entries up to this seq were archived (for the message).
    archived_through: Option<u64>,
}

/// Most checkpoint entries remembered after the signed position; past it the
/// oldest are dropped, which can only make the tail look longer.
const TAIL_CHECKPOINTS_MAX: usize = 4096;

impl Signed {
    /// Checks the saved checkpoint's own signature up front.
    pub(crate) fn new(opts: &VerifyOptions) -> Result<Self, String> {
        let saved = match (&opts.saved, &opts.keys) {
            (None, _) => None,
            (Some(_), None) => {
                return Err("a saved checkpoint is checked only with public keys".into())
            }
            (Some(s), Some(keys)) => {
                let cp = keys
                    .check_body(&s.body)
                    .map_err(|e| format!("the saved checkpoint: {e}"))?;
                if cp.seq >= s.entry_seq {
                    return Err("the saved checkpoint signs a seq at or after its own entry".into());
                }
                Some((cp, s.clone()))
            }
        };
        Ok(Self::build(
            opts.keys.clone(),
            saved,
            opts.require_signed_tail,
        ))
    }

    /// No keys, nothing saved: checkpoints are counted only.
    pub(crate) fn plain() -> Self {
        Self::build(None, None, false)
    }

    fn build(
        keys: Option<KeyRing>,
        saved: Option<(Checkpoint, SavedCheckpoint)>,
        require_signed_tail: bool,
    ) -> Self {
        Signed {
            keys,
            saved,
            require_signed_tail,
            ring: VecDeque::new(),
            ring_base: 0,
            checkpoints: 0,
            signed_through: None,
            tail_checkpoints: VecDeque::new(),
            first_seq: None,
            saved_head_seen: None,
            saved_entry_seen: None,
            slice_start_proven: false,
            archived_through: None,
        }
    }

    /// The chain is a store's that archived its entries up to `through`.
    pub(crate) fn set_archived_through(&mut self, through: u64) {
        self.archived_through = Some(through);
    }

    /// Whether a chain may start after seq 1 (a slice): only when its start
    /// can be proven, i.e. with public keys.
    pub(crate) fn accepts_slices(&self) -> bool {
        self.keys.is_some()
    }

    /// One intact entry (its hash and link already checked).
    pub(crate) fn on_entry(&mut self, link: &EntryLink) -> Result<(), String> {
        if self.first_seq.is_none() {
            self.first_seq = Some(link.seq);
            self.ring_base = link.seq - 1;
            self.remember(&link.prev_hash);
            self.note_saved(link.seq - 1, &link.prev_hash);
        }
        if let Some(body) = &link.checkpoint {
            self.checkpoints += 1;
            if let Some(keys) = &self.keys {
                let cp = keys.check_body(body)?;
                self.check_head(&cp, link.seq)?;
                self.advance(cp.seq, link.seq);
            }
        }
        self.note_saved(link.seq, &link.hash);
        if self.keys.is_some() {
            self.remember(&link.hash);
        }
        Ok(())
    }

    fn remember(&mut self, hash: &str) {
        self.ring.push_back(hex32(hash).unwrap_or([0; 32]));
        if self.ring.len() as u64 > CHECKPOINT_LAG_MAX + 1 {
            self.ring.pop_front();
            self.ring_base += 1;
        }
    }

    fn note_saved(&mut self, seq: u64, hash: &str) {
        if let Some((cp, s)) = &self.saved {
            if seq == cp.seq {
                self.saved_head_seen = Some(hash.to_owned());
            }
            if seq == s.entry_seq {
                self.saved_entry_seen = Some(hash.to_owned());
            }
        }
    }

    /// The head a checkpoint at `entry_seq` signed must be an entry read before it.
    fn check_head(&self, cp: &Checkpoint, entry_seq: u64) -> Result<(), String> {
        if cp.seq >= entry_seq {
            return Err(format!(
                "checkpoint signs seq {}, not an entry before its own",
                cp.seq
            ));
        }
        let Some(i) = cp.seq.checked_sub(self.ring_base) else {
            return Err(format!(
                "checkpoint signs seq {}, before the first entry this verifier holds (seq {})",
                cp.seq, self.ring_base
            ));
        };
        let held = usize::try_from(i).ok().and_then(|i| self.ring.get(i));
        match held {
            Some(h) if Some(*h) == hex32(&cp.head_hash) => Ok(()),
            Some(_) => Err(format!(
                "checkpoint signs head hash {} at seq {}, but the chain's entry at seq {} has another hash",
                cp.head_hash, cp.seq, cp.seq
            )),
            None => Err(format!("checkpoint signs seq {}, not read yet", cp.seq)),
        }
    }

    fn advance(&mut self, signed: u64, entry_seq: u64) {
        if self.first_seq.is_some_and(|f| f > 1 && signed + 1 == f) {
            self.slice_start_proven = true;
        }
        let through = self.signed_through.map_or(signed, |s| s.max(signed));
        self.signed_through = Some(through);
        self.tail_checkpoints.push_back(entry_seq);
        while self.tail_checkpoints.front().is_some_and(|&s| s <= through)
            || self.tail_checkpoints.len() > TAIL_CHECKPOINTS_MAX
        {
            self.tail_checkpoints.pop_front();
        }
    }

    /// The report once the chain's last entry (`last_seq`, the seal not
    /// counted) was read; `Err` names why the chain fails on signatures.
    pub(crate) fn finish(&self, last_seq: u64) -> (SigningReport, Result<(), String>) {
        let first_seq = self.first_seq.unwrap_or(1);
        let after = self.signed_through.unwrap_or(first_seq.saturating_sub(1));
        let tail = last_seq
            .saturating_sub(after)
            .saturating_sub(self.tail_checkpoints.len() as u64);
        let report = SigningReport {
            checked: self.keys.is_some(),
            checkpoints: self.checkpoints,
            signed_through: self.signed_through,
            first_seq,
            last_seq,
            unsigned_tail: if self.signed_through.is_some() {
                tail
            } else {
                last_seq.saturating_sub(first_seq.saturating_sub(1))
            },
            saved_held: false,
            archived: None,
        };
        let verdict = self.judge(&report);
        let report = SigningReport {
            saved_held: self.saved.is_some() && verdict.is_ok(),
            ..report
        };
        (report, verdict)
    }

    fn judge(&self, r: &SigningReport) -> Result<(), String> {
        if let Some(through) = self.archived_through.filter(|_| !self.slice_start_proven) {
            return Err(format!(
                "the store records its entries up to seq {through} as archived, but no signed checkpoint in it signs seq {through}: the archive point is not proven"
            ));
        }
        if r.first_seq > 1 && !self.slice_start_proven {
            return Err(format!(
                "the slice starts at seq {}, but no signed checkpoint in it signs seq {}: its start is not proven",
                r.first_seq,
                r.first_seq - 1
            ));
        }
        if let Some((cp, s)) = &self.saved {
            check_saved(cp, s, r, (&self.saved_head_seen, &self.saved_entry_seen))?;
        }
        if self.require_signed_tail {
            if r.signed_through.is_none() {
                return Err(format!(
                    "no signed checkpoint: every entry (seq {} to {}) is an unsigned tail",
                    r.first_seq, r.last_seq
                ));
            }
            if r.unsigned_tail > 0 {
                return Err(format!(
                    "unsigned tail: {} entries after seq {} (the last signed position; the chain ends at seq {}) are not covered by a signed checkpoint",
                    r.unsigned_tail,
                    r.signed_through.unwrap_or(0),
                    r.last_seq
                ));
            }
        }
        Ok(())
    }
}

fn check_saved(
    cp: &Checkpoint,
    s: &SavedCheckpoint,
    r: &SigningReport,
    (head_seen, entry_seen): (&Option<String>, &Option<String>),
) -> Result<(), String> {
    if cp.seq + 1 < r.first_seq {
        return Err(format!(
            "the saved checkpoint signs seq {}, before this slice (which starts at seq {})",
            cp.seq, r.first_seq
        ));
    }
    if r.last_seq < cp.seq {
        return Err(format!(
            "the chain ends at seq {}, before seq {} that the saved checkpoint signed: entries were cut from its end",
            r.last_seq, cp.seq
        ));
    }
    if head_seen.as_deref() != Some(cp.head_hash.as_str()) {
        return Err(format!(
            "the chain's entry at seq {} is not the one the saved checkpoint signed: it was rewritten",
            cp.seq
        ));
    }
    if r.last_seq < s.entry_seq {
        return Err(format!(
            "the chain ends at seq {}, before the saved checkpoint's own entry at seq {}: entries were cut from its end",
            r.last_seq, s.entry_seq
        ));
    }
    if entry_seen.as_deref() != Some(s.entry_hash.as_str()) {
        return Err(format!(
            "the chain's entry at seq {} is not the saved checkpoint",
            s.entry_seq
        ));
    }
    Ok(())
}
