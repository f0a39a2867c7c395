//! `tether keys init|rotate|show`: the endpoint's evidence signing key in
//! its state directory, and loading it for the endpoint.
//!
//! The key is 32 bytes of OS randomness written as hex to
//! [`KEY_FILE`] with mode 0600; a key file that group or others may read is
//! refused wherever it is loaded (a key others could read signs nothing an
//! auditor should trust). Every public key the directory ever had stays in
//! [`PUBLIC_KEYS_FILE`] (oldest first, one `ed25519:<hex> <key id>` line
//! each), so checkpoints signed before a rotation still verify.

use crate::cli::KeysAction;
use crate::config;
use anyhow::{bail, Context};
use rand::RngCore;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tether_store::checkpoint::{key_id, public_key_text, CheckpointSigner, KeyRing};

/// The signing key, beside the store.
pub const KEY_FILE: &str = "evidence-signing.key";

/// Every public key of the directory, retired ones included.
pub const PUBLIC_KEYS_FILE: &str = "evidence-public-keys";

/// Runs one `tether keys` action.
pub fn keys(action: KeysAction) -> anyhow::Result<ExitCode> {
    match action {
        KeysAction::Init { state_dir, rotate } => init(&dir_of(state_dir), rotate),
        KeysAction::Rotate { state_dir } => init(&dir_of(state_dir), true),
        KeysAction::Show { state_dir, all } => show(&dir_of(state_dir), all),
    }
}

fn dir_of(state_dir: Option<PathBuf>) -> PathBuf {
    config::state_dir(state_dir.as_deref(), None)
}

/// Creates (or, with `rotate`, replaces) the signing key.
fn init(dir: &Path, rotate: bool) -> anyhow::Result<ExitCode> {
    let key_path = dir.join(KEY_FILE);
    let old = load(dir)?;
    if old.is_some() && !rotate {
        bail!(
            "{} already holds a signing key; `tether keys rotate` replaces it (keeping its public key)",
            key_path.display()
        );
    }
    if old.is_none() && rotate {
        bail!(
            "no signing key in {} to rotate; `tether keys init` creates one",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut seed = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut seed);
    let signer = CheckpointSigner::from_seed(&seed);
    // The public key is kept before the secret replaces the old one, so a
    // crash between the two never leaves a key whose checkpoints no listed
    // key verifies.
    if let Some(old) = &old {
        add_public_key(dir, old, "retired")?;
    }
    add_public_key(dir, &signer, "current")?;
    let mut text = hex::encode(seed);
    text.push('\n');
    write_secret(&key_path, text.as_bytes())?;
    eprintln!(
        "tether: {} signing key in {} (mode 0600); endpoints on this state directory now sign checkpoints",
        if rotate { "rotated the" } else { "created a" },
        key_path.display()
    );
    print_key(&signer);
    Ok(ExitCode::SUCCESS)
}

fn print_key(signer: &CheckpointSigner) {
    println!("public key: {}", public_key_text(&signer.public_key()));
    println!("key id: {}", signer.key_id());
}

fn show(dir: &Path, all: bool) -> anyhow::Result<ExitCode> {
    if all {
        let path = dir.join(PUBLIC_KEYS_FILE);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        print!("{text}");
        return Ok(ExitCode::SUCCESS);
    }
    let Some(signer) = load(dir)? else {
        bail!(
            "no signing key in {}; `tether keys init` creates one",
            dir.display()
        );
    };
    print_key(&signer);
    Ok(ExitCode::SUCCESS)
}

/// The state directory's signing key, `None` when it has none.
///
/// # Errors
/// A key file that group or others may read, that is not a regular file,
/// or that does not hold 64 hex digits.
pub fn load(dir: &Path) -> anyhow::Result<Option<CheckpointSigner>> {
    let path = dir.join(KEY_FILE);
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    if !meta.file_type().is_file() {
        bail!(
            "the signing key {} is not a regular file; refusing it",
            path.display()
        );
    }
    check_mode(&path, &meta)?;
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut seed = [0u8; 32];
    hex::decode_to_slice(text.trim(), &mut seed).map_err(|_| {
        anyhow::anyhow!(
            "the signing key {} does not hold 64 hex digits",
            path.display()
        )
    })?;
    Ok(Some(CheckpointSigner::from_seed(&seed)))
}

#[cfg(unix)]
fn check_mode(path: &Path, meta: &std::fs::Metadata) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        bail!(
            "the signing key {} has mode {mode:04o}: group or others may read it; refusing it (`chmod 600 {}` if no one else read it, else `tether keys rotate`)",
            path.display(),
            path.display()
        );
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_mode(_path: &Path, _meta: &std::fs::Metadata) -> anyhow::Result<()> {
    Ok(())
}

/// The public keys in the state directory's file (none when it is absent).
///
/// # Errors
/// A file that cannot be read or holds a line that is not a key.
pub fn public_keys(dir: &Path) -> anyhow::Result<Option<KeyRing>> {
    let path = dir.join(PUBLIC_KEYS_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => KeyRing::parse(&text)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Appends `signer`'s public key to the public-keys file unless it is
/// listed already.
fn add_public_key(dir: &Path, signer: &CheckpointSigner, note: &str) -> anyhow::Result<()> {
    let path = dir.join(PUBLIC_KEYS_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let key = public_key_text(&signer.public_key());
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    match lines.iter_mut().find(|l| l.starts_with(&key)) {
        Some(line) => *line = format!("{key} {} {note}", key_id(&signer.public_key())),
        None => {
            if lines.is_empty() {
                lines.push("# Tether evidence public keys, oldest first (tether keys show --all); checkpoints signed by any of them verify".into());
            }
            lines.push(format!("{key} {} {note}", key_id(&signer.public_key())));
        }
    }
    let mut out = lines.join("\n");
    out.push('\n');
    write_atomically(&path, out.as_bytes(), 0o644)
}

fn write_secret(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    write_atomically(path, bytes, 0o600)
}

/// Writes `path` whole or not at all: a temporary file beside it (created
/// with `mode`), synced, renamed over it, the directory synced.
///
/// # Errors
/// Any file-system error.
pub fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let name = path
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{name}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut f = opts
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    drop(f);
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}
