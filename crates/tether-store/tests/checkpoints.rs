//! Signed checkpoints: a signed chain verifies and says where its signed
//! part ends; a changed entry, checkpoint or signature, a chain cut back
//! before a saved checkpoint, an unsigned tail (when refused) and a slice
//! whose start nothing proves each fail, naming the position; a rotated key
//! keeps older checkpoints verifiable; a slice from a checkpoint verifies
//! alone.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{json, Value};
use tether_core::canonical::{sha256_hex, to_canonical_string};
use tether_store::checkpoint::{CheckpointSigner, KeyRing, SavedCheckpoint, CHECKPOINT_KIND};
use tether_store::verify::{verify_jsonl, verify_jsonl_with, verify_store_with, VerifyOptions};
use tether_store::{Commit, EventDraft, MemoryStore, SqliteStore, Store};

fn entries(store: &dyn Store, n: usize) {
    for i in 0..n {
        store
            .commit_blocking(Commit {
                events: vec![EventDraft {
                    kind: "command.started".into(),
                    body: json!({"command_id": format!("c{i}"), "input": {"x": i}}).into(),
                }],
                ..Commit::default()
            })
            .expect("commit");
    }
}

/// Signs the current head and appends the checkpoint, as the kernel does.
fn checkpoint(store: &dyn Store, signer: &CheckpointSigner) -> SavedCheckpoint {
    let (seq, head) = store.chain_head().expect("head").expect("non-empty");
    let body = signer.sign(seq, &head, 1_700_000_000_000, "cell-test");
    checkpoint_of(store, body)
}

fn checkpoint_of(store: &dyn Store, body: Value) -> SavedCheckpoint {
    let ack = store
        .commit_blocking(Commit {
            events: vec![EventDraft {
                kind: CHECKPOINT_KIND.into(),
                body: body.clone().into(),
            }],
            ..Commit::default()
        })
        .expect("checkpoint");
    SavedCheckpoint {
        entry_seq: ack.last_seq,
        entry_hash: ack.head_hash,
        body,
    }
}

fn signer(b: u8) -> CheckpointSigner {
    CheckpointSigner::from_seed(&[b; 32])
}

fn ring(signers: &[&CheckpointSigner]) -> KeyRing {
    let mut r = KeyRing::new();
    for s in signers {
        r.add(s.public_key());
    }
    r
}

fn export(store: &dyn Store) -> Vec<Value> {
    let mut out = Vec::new();
    store.export_chain(&mut out).expect("export");
    String::from_utf8(out)
        .expect("utf8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect()
}

/// The file an attacker would write: `entries` re-chained from the first
/// one's `prev_hash` (every hash recomputed) and closed by a fresh seal.
fn rechained(entries: &[Value]) -> Vec<u8> {
    let mut prev = entries[0]["prev_hash"].as_str().expect("prev").to_owned();
    let mut out = String::new();
    let mut next_seq = entries[0]["seq"].as_u64().expect("seq");
    let push = |e: &Value, prev: &mut String, out: &mut String| {
        let mut e = e.clone();
        let m = e.as_object_mut().expect("object");
        m.remove("hash");
        m.insert("prev_hash".into(), json!(prev));
        let hash = sha256_hex(to_canonical_string(&e));
        e["hash"] = json!(hash);
        out.push_str(&to_canonical_string(&e));
        out.push('\n');
        *prev = hash;
    };
    let body: Vec<&Value> = entries
        .iter()
        .filter(|e| e["kind"] != "audit.export.seal")
        .collect();
    for e in &body {
        push(e, &mut prev, &mut out);
        next_seq = e["seq"].as_u64().expect("seq") + 1;
    }
    let seal = json!({"seq": next_seq, "ts_ms": 1, "kind": "audit.export.seal",
        "body": {"entries": body.len(), "note": "re-sealed"}});
    push(&seal, &mut prev, &mut out);
    out.into_bytes()
}

fn opts(keys: KeyRing) -> VerifyOptions {
    VerifyOptions {
        keys: Some(keys),
        saved: None,
        require_signed_tail: false,
    }
}

/// The first broken position and reason, or `ok`.
fn verdict(file: &[u8], o: &VerifyOptions) -> String {
    let (r, _) = verify_jsonl_with(file, o).expect("options");
    match r.first_broken {
        None => "ok".into(),
        Some(b) => b.to_string(),
    }
}

/// 10 entries, a checkpoint of seq 10 at seq 11, 4 more entries (12..=15).
fn signed_chain(s: &CheckpointSigner) -> (MemoryStore, SavedCheckpoint) {
    let store = MemoryStore::new();
    entries(&store, 10);
    let saved = checkpoint(&store, s);
    entries(&store, 4);
    (store, saved)
}

#[test]
fn a_signed_chain_verifies_and_reports_its_unsigned_tail() {
    let s = signer(1);
    let (store, _) = signed_chain(&s);
    let mut out = Vec::new();
    store.export_chain(&mut out).expect("export");
    let (r, signing) = verify_jsonl_with(&out[..], &opts(ring(&[&s]))).expect("options");
    assert!(r.ok, "{:?}", r.first_broken);
    assert_eq!(r.entries, 15);
    assert_eq!(
        (
            signing.checkpoints,
            signing.signed_through,
            signing.unsigned_tail
        ),
        (1, Some(10), 4)
    );
    let strict = VerifyOptions {
        require_signed_tail: true,
        ..opts(ring(&[&s]))
    };
    let v = verdict(&out, &strict);
    assert!(v.contains("unsigned tail: 4 entries after seq 10"), "{v}");
    // Signed again at the end: nothing is unsigned (the checkpoint entries
    // themselves do not count).
    checkpoint(&store, &s);
    let mut out = Vec::new();
    store.export_chain(&mut out).expect("export");
    assert_eq!(verdict(&out, &strict), "ok");
    // Without keys the chain still verifies as a hash chain, checkpoints counted.
    assert!(verify_jsonl(&out[..]).ok);
}

#[test]
fn tampering_with_an_entry_a_checkpoint_or_its_signature_is_named() {
    let s = signer(1);
    let (store, _) = signed_chain(&s);
    let chain = export(&store);
    let o = opts(ring(&[&s]));
    assert_eq!(verdict(&rechained(&chain), &o), "ok");

    // An entry before the signed head rewritten, and the chain re-hashed
    // after it: the checkpoint no longer matches the head it signed.
    let mut t = chain.clone();
    t[4]["body"]["input"]["x"] = json!(99);
    let v = verdict(&rechained(&t), &o);
    assert!(
        v.contains("(seq 11)")
            && v.contains("at seq 10, but the chain's entry at seq 10 has another hash"),
        "{v}"
    );

    // The checkpoint's signed head moved.
    let mut t = chain.clone();
    t[10]["body"]["signed"]["seq"] = json!(9);
    let v = verdict(&rechained(&t), &o);
    assert!(
        v.contains("(seq 11)") && v.contains("signature does not verify"),
        "{v}"
    );

    // Its signature changed.
    let mut t = chain.clone();
    let sig = t[10]["body"]["signature"].as_str().expect("sig").to_owned();
    let flipped = format!(
        "{}{}",
        if sig.starts_with('0') { "1" } else { "0" },
        &sig[1..]
    );
    t[10]["body"]["signature"] = json!(flipped);
    let v = verdict(&rechained(&t), &o);
    assert!(
        v.contains("(seq 11)") && v.contains("signature does not verify"),
        "{v}"
    );

    // A checkpoint forged with another key.
    let v = verdict(&rechained(&chain), &opts(ring(&[&signer(2)])));
    assert!(v.contains("(seq 11)") && v.contains("not among"), "{v}");

    // A byte changed without re-hashing: the hash chain names it.
    let mut out = Vec::new();
    store.export_chain(&mut out).expect("export");
    let text = String::from_utf8(out).expect("utf8");
    let bad = text.replacen("\"x\":3", "\"x\":4", 1);
    let v = verdict(bad.as_bytes(), &o);
    assert!(v.contains("(seq 4): hash mismatch"), "{v}");
}

#[test]
fn a_chain_cut_back_before_a_saved_checkpoint_is_named() {
    let s = signer(1);
    let (store, saved) = signed_chain(&s);
    let chain = export(&store);
    let with_saved = VerifyOptions {
        saved: Some(saved.clone()),
        ..opts(ring(&[&s]))
    };
    assert_eq!(verdict(&rechained(&chain), &with_saved), "ok");
    // Cut before the signed head (seq 10), re-sealed: only the saved copy shows it.
    let cut = rechained(&chain[..8]);
    assert_eq!(verdict(&cut, &opts(ring(&[&s]))), "ok");
    let v = verdict(&cut, &with_saved);
    assert!(
        v.contains("the chain ends at seq 8, before seq 10 that the saved checkpoint signed"),
        "{v}"
    );
    // Cut between the signed head and the checkpoint entry (seq 11).
    let v = verdict(&rechained(&chain[..10]), &with_saved);
    assert!(
        v.contains("the chain ends at seq 10, before the saved checkpoint's own entry at seq 11"),
        "{v}"
    );
    // Cut after the checkpoint: held, but what follows it is unsigned.
    let cut = rechained(&chain[..13]);
    assert_eq!(verdict(&cut, &with_saved), "ok");
    let strict = VerifyOptions {
        require_signed_tail: true,
        ..with_saved.clone()
    };
    let v = verdict(&cut, &strict);
    assert!(
        v.contains("unsigned tail: 2 entries after seq 10") && v.contains("ends at seq 13"),
        "{v}"
    );
    // A saved checkpoint whose signature fails is refused up front.
    let mut forged = saved;
    forged.body["signed"]["seq"] = json!(3);
    let bad = VerifyOptions {
        saved: Some(forged),
        ..opts(ring(&[&s]))
    };
    assert!(verify_jsonl_with(&rechained(&chain)[..], &bad)
        .unwrap_err()
        .contains("does not verify"));
}

#[test]
fn a_rotated_key_keeps_older_checkpoints_verifiable() {
    let (old, new) = (signer(1), signer(2));
    let store = MemoryStore::new();
    entries(&store, 3);
    checkpoint(&store, &old);
    entries(&store, 3);
    checkpoint(&store, &new);
    let mut out = Vec::new();
    store.export_chain(&mut out).expect("export");
    let (r, signing) = verify_jsonl_with(&out[..], &opts(ring(&[&old, &new]))).expect("options");
    assert!(r.ok, "{:?}", r.first_broken);
    assert_eq!((signing.checkpoints, signing.unsigned_tail), (2, 0));
    let v = verdict(&out, &opts(ring(&[&new])));
    assert!(v.contains("(seq 4)") && v.contains("not among"), "{v}");
}

#[test]
fn a_slice_from_a_checkpoint_verifies_alone_and_only_with_its_key() {
    let s = signer(1);
    let store = MemoryStore::new();
    entries(&store, 10);
    // Entries land between the signed head and its checkpoint entry, as
    // under load: the checkpoint at seq 13 signs seq 10.
    let (seq, head) = store.chain_head().expect("head").expect("some");
    let body = s.sign(seq, &head, 1, "cell-test");
    entries(&store, 2);
    checkpoint_of(&store, body);
    entries(&store, 5);
    let mut out = Vec::new();
    let info = tether_store::slice::export_slice(&store, 15, &mut out).expect("slice");
    assert_eq!(
        (info.first_seq, info.checkpoint_seq, info.entries),
        (11, 13, 8)
    );
    let (r, signing) = verify_jsonl_with(&out[..], &opts(ring(&[&s]))).expect("options");
    assert!(r.ok, "{:?}", r.first_broken);
    assert_eq!(
        (signing.first_seq, signing.last_seq, r.entries),
        (11, 18, 8)
    );
    // Without the key a slice is no chain.
    let v = verify_jsonl(&out[..]);
    assert!(!v.ok);
    assert!(v
        .first_broken
        .expect("broken")
        .reason
        .contains("expected 1, found 11"));
    // A slice that starts anywhere else proves nothing.
    let lines: Vec<Value> = String::from_utf8(out)
        .expect("utf8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    let v = verdict(&rechained(&lines[1..]), &opts(ring(&[&s])));
    assert!(
        v.contains("(seq 13)") && v.contains("before the first entry this verifier holds (seq 11)"),
        "{v}"
    );
    let v = verdict(&rechained(&lines[3..]), &opts(ring(&[&s])));
    assert!(
        v.contains("the slice starts at seq 14, but no signed checkpoint in it signs seq 13"),
        "{v}"
    );
    // No checkpoint at or before the asked seq: refused.
    let e = tether_store::slice::export_slice(&store, 12, &mut Vec::new()).unwrap_err();
    assert!(
        e.to_string()
            .contains("no checkpoint entry at or before seq 12"),
        "{e}"
    );
}

#[test]
fn a_store_verifies_its_checkpoints_as_its_export_does() {
    let dir = tempfile::tempdir().expect("dir");
    let s = signer(1);
    {
        let store = SqliteStore::open(dir.path()).expect("open");
        entries(&store, 5);
        checkpoint(&store, &s);
        entries(&store, 1);
    }
    let (r, signing) = verify_store_with(dir.path(), &opts(ring(&[&s]))).expect("verify");
    assert!(r.ok, "{:?}", r.first_broken);
    assert_eq!(
        (signing.signed_through, signing.unsigned_tail),
        (Some(5), 1)
    );
    let (r, _) = verify_store_with(dir.path(), &opts(ring(&[&signer(3)]))).expect("verify");
    let b = r.first_broken.expect("broken");
    assert_eq!(b.seq, Some(6));
    assert!(b.reason.contains("not among"), "{}", b.reason);
}

/// A commit recording the receipt of `id` inside its one entry.
fn receipt_commit(id: &str) -> Commit {
    let receipt = json!({"command_id": id, "receipt_id": format!("rcpt-{id}"), "status": "completed", "n": 1.5});
    Commit {
        events: vec![EventDraft {
            kind: "command.receipt".into(),
            body: json!({"command_id": id, "receipt": receipt}).into(),
        }],
        receipts: vec![tether_store::ReceiptRef {
            command_id: id.into(),
            input_digest: tether_store::canonical::digest(&json!({"id": id})),
            event: 0,
        }],
        ..Commit::default()
    }
}

#[test]
fn an_archived_store_keeps_its_receipts_and_verifies_from_the_checkpoint() {
    let dir = tempfile::tempdir().expect("dir");
    let s = signer(7);
    let keys = ring(&[&s]);
    let file = dir.path().join("archive.jsonl");
    let (first_receipt, through) = {
        let store = SqliteStore::open(dir.path()).expect("open");
        store
            .commit_blocking(receipt_commit("rc-1"))
            .expect("receipt");
        entries(&store, 4);
        let cp = checkpoint(&store, &s);
        entries(&store, 3);
        let before = store.receipt("rc-1").expect("read").expect("stored");
        // Not before any checkpoint, nor past the head.
        let early = tether_store::archive::archive(&store, 2, &keys, &file).expect_err("early");
        assert!(
            early
                .to_string()
                .contains("no signed checkpoint at or before seq 2"),
            "{early}"
        );
        assert!(!file.exists());
        let done =
            tether_store::archive::archive(&store, cp.entry_seq, &keys, &file).expect("archive");
        assert_eq!((done.anchor.first_seq, done.anchor.through_seq), (1, 5));
        assert_eq!(done.anchor.entries, 5);
        assert_eq!(done.receipts_kept, 1);
        assert_eq!(
            store.archive_anchor().expect("anchor"),
            Some(done.anchor.clone())
        );
        assert_eq!(
            tether_store::archive::file_sha256(&file).expect("digest"),
            done.anchor.file_sha256
        );
        // The id still answers from the kept document, and cannot be stored again.
        assert_eq!(store.receipt("rc-1").expect("read"), Some(before.clone()));
        let again = store
            .commit_blocking(receipt_commit("rc-1"))
            .expect_err("conflict");
        assert!(
            matches!(again, tether_store::StoreError::Conflict(_)),
            "{again}"
        );
        // An export of the store is a slice from the archive point.
        assert_eq!(export(&store)[0]["seq"], 6);
        (before, done.anchor.through_seq)
    };
    // Reopened: the same.
    let store = SqliteStore::open(dir.path()).expect("reopen");
    assert_eq!(store.receipt("rc-1").expect("read"), Some(first_receipt));
    drop(store);
    let opts = VerifyOptions {
        keys: Some(keys.clone()),
        ..VerifyOptions::default()
    };
    let (report, signing) = verify_store_with(dir.path(), &opts).expect("verify");
    assert!(report.ok, "{report:?}");
    assert_eq!(signing.archived.expect("anchor").through_seq, through);
    // Without keys the archive point cannot be proven: refused.
    let unkeyed = verify_store_with(dir.path(), &VerifyOptions::default()).expect_err("no keys");
    assert!(
        unkeyed.to_string().contains("give the public keys"),
        "{unkeyed}"
    );
    let f = std::fs::File::open(&file).expect("file");
    let (r, sr) = verify_jsonl_with(std::io::BufReader::new(f), &opts).expect("opts");
    assert!(r.ok && r.entries == 5, "{r:?}");
    assert_eq!((sr.first_seq, sr.last_seq), (1, 5));
}

#[test]
fn a_memory_store_cannot_archive() {
    let dir = tempfile::tempdir().expect("dir");
    let s = signer(8);
    let store = MemoryStore::new();
    entries(&store, 2);
    let cp = checkpoint(&store, &s);
    entries(&store, 1);
    let file = dir.path().join("a.jsonl");
    let err = tether_store::archive::archive(&store, cp.entry_seq, &ring(&[&s]), &file)
        .expect_err("unsupported");
    assert!(
        matches!(err, tether_store::StoreError::Unsupported(_)),
        "{err}"
    );
    assert_eq!(export(&store)[0]["seq"], 1, "nothing removed");
    assert!(!file.exists(), "no file left behind");
}
