//! Signed checkpoints of the evidence chain: what one says, how it is signed
//! and how a verifier checks it.
//!
//! A hash chain shows that an entry was changed, removed or reordered, but
//! anyone who rewrites the whole chain from some point on gets a chain that
//! verifies again. A checkpoint is a claim, signed with the endpoint's
//! ed25519 key, that the chain once had the head hash `head_hash` at `seq`:
//! whoever keeps a checkpoint (or trusts the public key) can show that no
//! entry up to `seq` was rewritten and, with a saved copy, that the chain was
//! never cut back before it.
//!
//! A checkpoint is an ordinary chain entry of kind [`CHECKPOINT_KIND`] whose
//! body is
//! `{"alg": "ed25519", "signed": {endpoint_id, head_hash, key_id, seq, ts_ms}, "signature": hex}`.
//! The signature covers [`SIGNATURE_DOMAIN`] followed by the RFC 8785 form of
//! `signed`, so a signature over anything else Tether might sign one day can
//! never pass for a checkpoint's. The kernel reads the head and signs it off
//! the command path, then appends the checkpoint like any other entry; other
//! entries may land between the signed head and the checkpoint entry, so
//! `seq` is at most the checkpoint entry's own seq minus one, and the verifier
//! looks the hash of `seq` up among the entries it has read
//! ([`CHECKPOINT_LAG_MAX`] back at most).
//!
//! This module owns no key file: the CLI keeps the key and its mode; here a
//! key is 32 bytes.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde_json::{json, Map, Value};
use tether_core::canonical::{sha256_hex, to_canonical_string};

/// Event kind of a checkpoint entry.
pub const CHECKPOINT_KIND: &str = "evidence.checkpoint";

/// Prefix of every signed checkpoint message (domain separation).
pub const SIGNATURE_DOMAIN: &str = "tether.evidence.checkpoint.v1\n";

/// The only signature algorithm.
pub const ALG: &str = "ed25519";

/// How many entries before a checkpoint entry its signed head may lie: a
/// verifier remembers the hashes of that many entries (32 bytes each, so at
/// most 32 MiB). The signed head is read right before the checkpoint is
/// queued, so only entries already queued in the store (at most
/// `QUEUE_CAPACITY` commits) can come between.
pub const CHECKPOINT_LAG_MAX: u64 = 1 << 20;

/// Length of a key id in hex digits (the first 64 bits of the SHA-256 of the
/// public key).
pub const KEY_ID_HEX_LEN: usize = 16;

/// What a checkpoint signs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// `seq` of the chain entry whose hash is `head_hash` (≥ 1).
    pub seq: u64,
    /// That entry's hash.
    pub head_hash: String,
    /// When it was signed (milliseconds since the Unix epoch).
    pub ts_ms: u64,
    /// The endpoint that signed it.
    pub endpoint_id: String,
    /// Which key signed it ([`key_id`] of its public key).
    pub key_id: String,
}

impl Checkpoint {
    fn signed_value(&self) -> Value {
        json!({
            "endpoint_id": self.endpoint_id,
            "head_hash": self.head_hash,
            "key_id": self.key_id,
            "seq": self.seq,
            "ts_ms": self.ts_ms,
        })
    }
}

/// The message a checkpoint's signature covers.
fn message(signed: &Value) -> Vec<u8> {
    let mut m = SIGNATURE_DOMAIN.as_bytes().to_vec();
    m.extend_from_slice(to_canonical_string(signed).as_bytes());
    m
}

/// The key id of a public key: 16 hex digits of its SHA-256.
pub fn key_id(key: &VerifyingKey) -> String {
    let mut id = sha256_hex(key.as_bytes());
    id.truncate(KEY_ID_HEX_LEN);
    id
}

/// The text form of a public key: `ed25519:` and 64 hex digits.
pub fn public_key_text(key: &VerifyingKey) -> String {
    format!("{ALG}:{}", hex_encode(key.as_bytes()))
}

/// Parses a public key written as `ed25519:<64 hex digits>` or as the bare
/// 64 hex digits.
///
/// # Errors
/// Not 32 bytes of hex, or not a valid ed25519 point.
pub fn parse_public_key(text: &str) -> Result<VerifyingKey, String> {
    let t = text.trim();
    let hex = t.strip_prefix("ed25519:").unwrap_or(t);
    let bytes: [u8; 32] = hex_decode_32(hex)
        .ok_or_else(|| format!("a public key is 64 hex digits (`ed25519:<hex>`), not {t:?}"))?;
    VerifyingKey::from_bytes(&bytes).map_err(|e| format!("not an ed25519 public key: {e}"))
}

/// The signing side: one ed25519 key and its id.
pub struct CheckpointSigner {
    key: SigningKey,
    key_id: String,
}

impl CheckpointSigner {
    /// The signer of the 32-byte secret `seed` (the key file's content).
    pub fn from_seed(seed: &[u8; 32]) -> Self {
        let key = SigningKey::from_bytes(seed);
        let key_id = key_id(&key.verifying_key());
        CheckpointSigner { key, key_id }
    }

    /// The public key.
    pub fn public_key(&self) -> VerifyingKey {
        self.key.verifying_key()
    }

    /// The key id.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The body of a checkpoint entry signing `seq` / `head_hash`.
    pub fn sign(&self, seq: u64, head_hash: &str, ts_ms: u64, endpoint_id: &str) -> Value {
        let cp = Checkpoint {
            seq,
            head_hash: head_hash.to_owned(),
            ts_ms,
            endpoint_id: endpoint_id.to_owned(),
            key_id: self.key_id.clone(),
        };
        let signed = cp.signed_value();
        let signature = self.key.sign(&message(&signed));
        json!({
            "alg": ALG,
            "signed": signed,
            "signature": hex_encode(&signature.to_bytes()),
        })
    }
}

/// The public keys a verifier trusts, by key id (current and retired ones).
#[derive(Debug, Clone, Default)]
pub struct KeyRing {
    keys: Vec<(String, VerifyingKey)>,
}

impl KeyRing {
    /// An empty ring.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a key (a key already held is not added twice).
    pub fn add(&mut self, key: VerifyingKey) {
        let id = key_id(&key);
        if !self.keys.iter().any(|(i, _)| *i == id) {
            self.keys.push((id, key));
        }
    }

    /// Adds every key of `other`.
    pub fn merge(&mut self, other: &KeyRing) {
        for (_, k) in &other.keys {
            self.add(*k);
        }
    }

    /// Parses a public-keys file: one key a line (`ed25519:<hex>`, anything
    /// after it on the line is a note), `#` comments and blank lines skipped.
    ///
    /// # Errors
    /// A line whose first word is not a public key.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut ring = KeyRing::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let first = line.split_whitespace().next().unwrap_or("");
            let key = parse_public_key(first).map_err(|e| format!("line {}: {e}", n + 1))?;
            ring.add(key);
        }
        Ok(ring)
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when the ring holds no key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key of `key_id`.
    pub fn get(&self, key_id: &str) -> Option<&VerifyingKey> {
        self.keys.iter().find(|(i, _)| i == key_id).map(|(_, k)| k)
    }

    /// Checks a checkpoint entry's body: its shape, its key and its
    /// signature. Answers what it signs.
    ///
    /// # Errors
    /// A message naming what is wrong (the caller adds the position).
    pub fn check_body(&self, body: &Value) -> Result<Checkpoint, String> {
        let map = body.as_object().ok_or("checkpoint body is not an object")?;
        exact_members(map, &["alg", "signature", "signed"], "checkpoint body")?;
        if map.get("alg").and_then(Value::as_str) != Some(ALG) {
            return Err(format!("checkpoint alg is not {ALG:?}"));
        }
        let signed = map.get("signed").unwrap_or(&Value::Null);
        let cp = parse_signed(signed)?;
        let key = self.get(&cp.key_id).ok_or_else(|| {
            format!(
                "checkpoint signed by key id {} that is not among the {} public key(s) given",
                cp.key_id,
                self.keys.len()
            )
        })?;
        let sig_hex = map
            .get("signature")
            .and_then(Value::as_str)
            .ok_or("checkpoint signature is not a string")?;
        let sig = hex_decode_64(sig_hex).ok_or("checkpoint signature is not 128 hex digits")?;
        key.verify_strict(&message(signed), &Signature::from_bytes(&sig))
            .map_err(|_| {
                format!(
                    "checkpoint signature does not verify with key id {}",
                    cp.key_id
                )
            })?;
        Ok(cp)
    }
}

fn exact_members(map: &Map<String, Value>, names: &[&str], what: &str) -> Result<(), String> {
    if let Some(missing) = names.iter().find(|n| !map.contains_key(**n)) {
        return Err(format!("{what} lacks member \"{missing}\""));
    }
    if let Some(extra) = map.keys().find(|k| !names.contains(&k.as_str())) {
        return Err(format!("{what} has unexpected member \"{extra}\""));
    }
    Ok(())
}

fn parse_signed(signed: &Value) -> Result<Checkpoint, String> {
    let map = signed
        .as_object()
        .ok_or("checkpoint `signed` is not an object")?;
    exact_members(
        map,
        &["endpoint_id", "head_hash", "key_id", "seq", "ts_ms"],
        "checkpoint `signed`",
    )?;
    let text = |name: &str| {
        map.get(name)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| format!("checkpoint {name} is not a string"))
    };
    let head_hash = text("head_hash")?;
    if !crate::chain::is_hash_hex(&head_hash) {
        return Err("checkpoint head_hash is not 64 lower-case hex digits".into());
    }
    Ok(Checkpoint {
        seq: map
            .get("seq")
            .and_then(Value::as_u64)
            .ok_or("checkpoint seq is not a non-negative integer")?,
        head_hash,
        ts_ms: map
            .get("ts_ms")
            .and_then(Value::as_u64)
            .ok_or("checkpoint ts_ms is not a non-negative integer")?,
        endpoint_id: text("endpoint_id")?,
        key_id: text("key_id")?,
    })
}

/// A checkpoint saved outside the chain (the file beside the store, or a
/// copy an auditor kept): the entry's place and hash, and its body.
#[derive(Debug, Clone, PartialEq)]
pub struct SavedCheckpoint {
    /// `seq` of the checkpoint entry itself.
    pub entry_seq: u64,
    /// Hash of the checkpoint entry.
    pub entry_hash: String,
    /// The entry's body (what [`KeyRing::check_body`] reads).
    pub body: Value,
}

impl SavedCheckpoint {
    /// The canonical JSON text of the saved form:
    /// `{"body", "entry_hash", "entry_seq", "kind"}`.
    pub fn to_text(&self) -> String {
        to_canonical_string(&json!({
            "kind": CHECKPOINT_KIND,
            "entry_seq": self.entry_seq,
            "entry_hash": self.entry_hash,
            "body": self.body,
        }))
    }

    /// Parses the saved form.
    ///
    /// # Errors
    /// Not JSON, or not the saved form of a checkpoint.
    pub fn parse(text: &str) -> Result<Self, String> {
        let v: Value = serde_json::from_str(text.trim()).map_err(|e| format!("not JSON: {e}"))?;
        let map = v.as_object().ok_or("not a JSON object")?;
        exact_members(
            map,
            &["body", "entry_hash", "entry_seq", "kind"],
            "saved checkpoint",
        )?;
        if map.get("kind").and_then(Value::as_str) != Some(CHECKPOINT_KIND) {
            return Err(format!("kind is not {CHECKPOINT_KIND:?}"));
        }
        let entry_hash = map
            .get("entry_hash")
            .and_then(Value::as_str)
            .filter(|h| crate::chain::is_hash_hex(h))
            .ok_or("entry_hash is not 64 lower-case hex digits")?
            .to_owned();
        Ok(SavedCheckpoint {
            entry_seq: map
                .get("entry_seq")
                .and_then(Value::as_u64)
                .ok_or("entry_seq is not a non-negative integer")?,
            entry_hash,
            body: map.get("body").cloned().unwrap_or(Value::Null),
        })
    }
}

fn hex_encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

fn hex_nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

fn hex_decode<const N: usize>(hex: &str) -> Option<[u8; N]> {
    let b = hex.as_bytes();
    if b.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = (hex_nibble(b[2 * i])? << 4) | hex_nibble(b[2 * i + 1])?;
    }
    Some(out)
}

/// 32 bytes from 64 hex digits.
pub(crate) fn hex_decode_32(hex: &str) -> Option<[u8; 32]> {
    hex_decode::<32>(hex)
}

fn hex_decode_64(hex: &str) -> Option<[u8; 64]> {
    hex_decode::<64>(hex)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_body_checks_and_any_change_does_not() {
        let s = CheckpointSigner::from_seed(&[7u8; 32]);
        let mut ring = KeyRing::new();
        ring.add(s.public_key());
        let body = s.sign(12, &"ab".repeat(32), 1_700_000_000_000, "cell-a");
        let cp = ring.check_body(&body).expect("intact");
        assert_eq!((cp.seq, cp.key_id.as_str()), (12, s.key_id()));
        let mut moved = body.clone();
        moved["signed"]["seq"] = json!(13);
        assert!(ring
            .check_body(&moved)
            .unwrap_err()
            .contains("does not verify"));
        let mut sig = body.clone();
        sig["signature"] = json!("00".repeat(64));
        assert!(ring
            .check_body(&sig)
            .unwrap_err()
            .contains("does not verify"));
        let other = KeyRing::parse(&public_key_text(
            &CheckpointSigner::from_seed(&[8u8; 32]).public_key(),
        ))
        .expect("ring");
        assert!(other.check_body(&body).unwrap_err().contains("not among"));
    }

    #[test]
    fn public_keys_parse_in_both_spellings_and_refuse_junk() {
        let k = CheckpointSigner::from_seed(&[1u8; 32]).public_key();
        let text = public_key_text(&k);
        assert_eq!(parse_public_key(&text).expect("prefixed"), k);
        assert_eq!(parse_public_key(&text[8..]).expect("bare"), k);
        assert!(parse_public_key("ed25519:zz").is_err());
        let ring = KeyRing::parse(&format!("# keys\n\n{text} {}\n", key_id(&k))).expect("file");
        assert_eq!(ring.len(), 1);
        assert!(KeyRing::parse("nonsense\n").is_err());
    }
}
