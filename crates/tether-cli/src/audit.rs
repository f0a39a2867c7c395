//! `tether audit export|verify|checkpoint|archive`: the evidence chain read straight
//! from a state directory's store (no endpoint needed), or verified from an
//! exported JSON Lines file, with the checkpoint signatures when public keys
//! are given. Exit 1 names the first broken entry.

use crate::cli::AuditAction;
use crate::store::StoreChoice;
use crate::{config, evidence, keys};
use anyhow::{bail, Context};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tether_store::checkpoint::{parse_public_key, KeyRing};
use tether_store::verify::{SigningReport, VerifyOptions, VerifyReport};

/// Runs one `tether audit` action.
pub fn audit(action: AuditAction) -> anyhow::Result<ExitCode> {
    match action {
        AuditAction::Export {
            state_dir,
            store,
            since,
            follow,
            after,
        } => {
            let choice = StoreChoice {
                state_dir,
                store,
                ..Default::default()
            };
            if follow {
                crate::follow::follow(&choice, after.unwrap_or(0))
            } else {
                export(&choice, since)
            }
        }
        AuditAction::Verify {
            state_dir,
            store,
            file,
            pubkey,
            pubkey_file,
            checkpoint,
            require_signed_tail,
            archive,
        } => {
            let keys = given_keys(&pubkey, &pubkey_file)?;
            verify(
                StoreChoice {
                    state_dir,
                    store,
                    ..Default::default()
                },
                file,
                keys,
                (checkpoint.as_deref(), require_signed_tail),
                &archive,
            )
        }
        AuditAction::Checkpoint { state_dir } => print_checkpoint(state_dir),
        AuditAction::Archive {
            before,
            out,
            state_dir,
            store,
            pubkey,
            pubkey_file,
        } => archive(
            &StoreChoice {
                state_dir,
                store,
                ..Default::default()
            },
            before,
            &out,
            given_keys(&pubkey, &pubkey_file)?,
        ),
    }
}

/// Writes the chain (or a slice of it) as JSON Lines to standard output.
fn export(choice: &StoreChoice, since: Option<u64>) -> anyhow::Result<ExitCode> {
    let opened = crate::store::open_for_shell(choice)?;
    let store = &*opened.store;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    match since {
        None => {
            let n = store.export_chain(&mut out)?;
            out.flush()?;
            eprintln!("tether: exported {n} entries from the {}", opened.shown);
        }
        Some(seq) => {
            let s = tether_store::slice::export_slice(store, seq, &mut out)?;
            out.flush()?;
            eprintln!(
                "tether: exported {} entries from seq {} (proven by the checkpoint at seq {}) from {}",
                s.entries,
                s.first_seq,
                s.checkpoint_seq,
                opened.shown
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The public keys given on the command line, `None` when none was.
fn given_keys(pubkey: &[String], files: &[PathBuf]) -> anyhow::Result<Option<KeyRing>> {
    if pubkey.is_empty() && files.is_empty() {
        return Ok(None);
    }
    let mut ring = KeyRing::new();
    for k in pubkey {
        ring.add(parse_public_key(k).map_err(|e| anyhow::anyhow!("--pubkey: {e}"))?);
    }
    for f in files {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let file_ring =
            KeyRing::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?;
        if file_ring.is_empty() {
            bail!("{} holds no public key", f.display());
        }
        ring.merge(&file_ring);
    }
    Ok(Some(ring))
}

/// Verifies an exported file (`-` is standard input), a PostgreSQL store or
/// a state directory.
fn verify(
    choice: StoreChoice,
    file: Option<PathBuf>,
    keys: Option<KeyRing>,
    (checkpoint, require_signed_tail): (Option<&Path>, bool),
    archives: &[PathBuf],
) -> anyhow::Result<ExitCode> {
    let url = choice.url(None).filter(|_| file.is_none());
    // A PostgreSQL store's keys come from the flags, or from a state
    // directory named beside it.
    let store_dir = (file.is_none() && (url.is_none() || choice.state_dir.is_some()))
        .then(|| config::state_dir(choice.state_dir.as_deref(), None));
    // A store verified without keys is checked with the public keys kept
    // beside it, when it has them (said in the report).
    let (keys, keys_from) = match (keys, &store_dir) {
        (Some(k), _) => (Some(k), None),
        (None, Some(dir)) => match keys::public_keys(dir)? {
            Some(k) => (Some(k), Some(dir.join(keys::PUBLIC_KEYS_FILE))),
            None => (None, None),
        },
        (None, None) => (None, None),
    };
    if (checkpoint.is_some() || require_signed_tail) && keys.is_none() {
        bail!("--checkpoint and --require-signed-tail need the public keys (--pubkey or --pubkey-file)");
    }
    let opts = VerifyOptions {
        keys,
        saved: checkpoint.map(evidence::read_saved).transpose()?,
        require_signed_tail,
    };
    let (report, signing) = match (file, store_dir) {
        _ if url.is_some() => {
            let url = url.unwrap_or_default();
            tether_store::postgres::verify_url_with(&url, &opts)
                .with_context(|| format!("reading the PostgreSQL store {url}"))?
        }
        // `-` is standard input, as for other Unix tools:
        // `tether audit export | tether audit verify --file -`.
        (Some(f), _) if f.as_os_str() == "-" => tether_store::verify::verify_jsonl_with(
            std::io::BufReader::new(std::io::stdin()),
            &opts,
        )
        .map_err(anyhow::Error::msg)?,
        (Some(f), _) => {
            let fh = std::fs::File::open(&f).with_context(|| format!("opening {}", f.display()))?;
            tether_store::verify::verify_jsonl_with(std::io::BufReader::new(fh), &opts)
                .map_err(anyhow::Error::msg)?
        }
        (None, dir) => {
            let dir = dir.unwrap_or_default();
            tether_store::verify::verify_store_with(&dir, &opts)
                .with_context(|| format!("reading the store in {}", dir.display()))?
        }
    };
    let mut code = say(&report, &signing, opts.saved.is_some());
    if let Some(from) = keys_from {
        println!("public keys: {} (the store's own)", from.display());
    }
    if report.ok && !archives.is_empty() {
        code = say_history(archives, &opts, signing.archived.as_ref());
    }
    Ok(code)
}

/// `--archive`: the archive files checked with the store's start (each
/// with the same keys; the saved checkpoint and the signed tail are the
/// store's questions, not theirs). Exit 1 names what breaks the history.
fn say_history(
    archives: &[PathBuf],
    opts: &VerifyOptions,
    anchor: Option<&tether_store::archive::ArchiveAnchor>,
) -> ExitCode {
    use tether_store::archive_check::{check_history, read_archive_file};
    let per_file = VerifyOptions {
        keys: opts.keys.clone(),
        ..VerifyOptions::default()
    };
    let files: Result<Vec<_>, String> = archives
        .iter()
        .map(|f| read_archive_file(f, &per_file))
        .collect();
    match files.and_then(|f| check_history(f, anchor)) {
        Ok(files) => {
            let last = files.last().map_or(0, |f| f.last_seq);
            let entries: u64 = files.iter().map(|f| f.entries).sum();
            println!(
                "history: {} archive file(s), {entries} entries, seq 1 to {last}, linked to each other and to the store's start at seq {}",
                files.len(),
                last + 1
            );
            ExitCode::SUCCESS
        }
        Err(why) => {
            println!("broken history: {why}");
            ExitCode::from(1)
        }
    }
}

/// Prints the verdict; the exit code.
fn say(report: &VerifyReport, signing: &SigningReport, saved: bool) -> ExitCode {
    if !report.ok {
        match &report.first_broken {
            Some(b) => println!(
                "broken: first broken entry at {b} ({} intact entries before it)",
                report.entries
            ),
            None => println!("broken: chain did not verify"),
        }
        return ExitCode::from(1);
    }
    println!("ok: {} entries, chain intact", report.entries);
    if let Some(a) = &signing.archived {
        println!(
            "archived: entries before seq {} are archived (anchor: seq {} to {}, {} entries, in {} with sha256 {}, last hash {}); the store starts at seq {}, proven by the signed checkpoint at seq {}",
            a.through_seq + 1,
            a.first_seq,
            a.through_seq,
            a.entries,
            a.file_name,
            a.file_sha256,
            a.through_hash,
            a.through_seq + 1,
            a.checkpoint_seq
        );
    } else if signing.first_seq > 1 {
        println!(
            "slice: seq {} to {}, its start proven by a signed checkpoint",
            signing.first_seq, signing.last_seq
        );
    }
    if !signing.checked {
        if signing.checkpoints > 0 {
            println!(
                "signatures not checked: {} checkpoints (give --pubkey or --pubkey-file)",
                signing.checkpoints
            );
        }
        return ExitCode::SUCCESS;
    }
    match signing.signed_through {
        Some(seq) => println!(
            "signed: {} checkpoints verified; last signed position seq {seq}; unsigned tail: {} entries",
            signing.checkpoints, signing.unsigned_tail
        ),
        None => println!(
            "signed: no checkpoint; unsigned tail: {} entries",
            signing.unsigned_tail
        ),
    }
    if saved {
        println!("saved checkpoint: held by the chain");
    }
    ExitCode::SUCCESS
}

/// Prints the newest signed checkpoint kept beside the store.
fn print_checkpoint(state_dir: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let dir = config::state_dir(state_dir.as_deref(), None);
    let path = evidence::checkpoint_path(&dir);
    if !path.exists() {
        bail!(
            "no signed checkpoint in {} (the endpoint signs once `tether keys init` made a key)",
            dir.display()
        );
    }
    let saved = evidence::read_saved(&path)?;
    println!("{}", saved.to_text());
    let signed = &saved.body["signed"];
    eprintln!(
        "tether: checkpoint entry seq {} signs seq {} (key id {}); keep a copy to show later that the chain was not cut back before it (`tether audit verify --checkpoint FILE`)",
        saved.entry_seq,
        signed["seq"],
        signed["key_id"].as_str().unwrap_or("?")
    );
    Ok(ExitCode::SUCCESS)
}

/// `tether audit archive`: the keys from the flags, else the state
/// directory's; refused without any.
fn archive(
    choice: &StoreChoice,
    before: u64,
    out: &Path,
    keys: Option<KeyRing>,
) -> anyhow::Result<ExitCode> {
    let dir = config::state_dir(choice.state_dir.as_deref(), None);
    let keys = match keys {
        Some(k) => k,
        None => keys::public_keys(&dir)?.ok_or_else(|| {
            anyhow::anyhow!(
                "no public key in {} (and none given with --pubkey or --pubkey-file): an archive ends at a signed checkpoint, so it needs the signing key's public keys (`tether keys init` makes a key); nothing was archived",
                dir.display()
            )
        })?,
    };
    let opened = crate::store::open_for_shell(choice)?;
    // A refusal is said as it is (a `StoreError::Invalid` would read
    // "invalid commit").
    let done = tether_store::archive::archive(&*opened.store, before, &keys, out)
        .map_err(|e| match e {
            tether_store::StoreError::Invalid(m) => anyhow::anyhow!(m),
            e => anyhow::Error::new(e),
        })
        .with_context(|| format!("archiving the {}", opened.shown))?;
    let a = &done.anchor;
    println!(
        "archived: {} entries (seq {} to {}) to {} (sha256 {})",
        a.entries,
        a.first_seq,
        a.through_seq,
        out.display(),
        a.file_sha256
    );
    println!(
        "the store now starts at seq {}, proven by the signed checkpoint at seq {} (which signs seq {}, hash {})",
        a.through_seq + 1,
        a.checkpoint_seq,
        a.through_seq,
        a.through_hash
    );
    println!(
        "kept: {} receipts and {} invocation records of the archived entries (their ids still answer)",
        done.receipts_kept, done.invocations_kept
    );
    Ok(ExitCode::SUCCESS)
}
