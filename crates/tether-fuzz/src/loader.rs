//! The manifest loader (`tether_kernel::loader::load`: a device manifest in
//! TOML or JSON, with an optional operator overlay), as `tether check` and
//! start-up call it.
//!
//! An input is a manifest — JSON when it starts with `{`, TOML otherwise —
//! optionally followed by a line `#%overlay` and the overlay's JSON text.
//!
//! Invariants:
//! - loading is a function of the texts (twice, the same cell or defects);
//! - every defect names the file it was found in;
//! - a TOML manifest that loads loads the same from its JSON form (same
//!   devices, bindings and effective limits): the two formats are one
//!   manifest, whatever the syntax.

use tether_core::canonical::to_canonical_string;
use tether_kernel::loader::{load, Cell, ManifestSource, OverlaySource};

/// The line that separates a manifest from its overlay in an input.
const OVERLAY_MARK: &str = "\n#%overlay\n";

/// Runs the target on one input.
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (manifest, overlay) = match text.split_once(OVERLAY_MARK) {
        Some((m, o)) => (m, Some(o)),
        None => (text, None),
    };
    let json = manifest.trim_start().starts_with('{');
    let origin = if json { "fuzz-1.json" } else { "fuzz-1.toml" };
    let src = [ManifestSource {
        origin: origin.into(),
        text: manifest.into(),
    }];
    let overlay = overlay.map(|o| OverlaySource {
        origin: "site-limits.json".into(),
        text: o.into(),
    });
    let first = load(&src, overlay.as_ref());
    let second = load(&src, overlay.as_ref());
    assert_eq!(
        format!("{first:?}"),
        format!("{second:?}"),
        "loading is not a function of the texts"
    );
    let cell = match first {
        Err(defects) => {
            for d in defects {
                assert!(
                    d.file == origin || d.file == "site-limits.json",
                    "a defect names no file it was found in: {d:?}"
                );
            }
            return;
        }
        Ok(cell) => cell,
    };
    if json {
        return;
    }
    let as_json = toml::from_str::<toml::Value>(manifest)
        .ok()
        .and_then(|t| serde_json::to_string(&t).ok());
    assert!(
        as_json.is_some(),
        "a manifest that loaded is not a TOML document"
    );
    let as_json = [ManifestSource {
        origin: "fuzz-1.json".into(),
        text: as_json.unwrap_or_default(),
    }];
    let from_json = load(&as_json, overlay.as_ref());
    assert!(
        from_json.is_ok(),
        "the JSON form of a TOML manifest that loads does not load: {from_json:?}"
    );
    if let Ok(j) = from_json {
        assert_eq!(
            summary(&cell),
            summary(&j),
            "TOML and JSON load differently"
        );
    }
}

/// What must not depend on the syntax: devices, bindings, effective limits
/// (JSON compared canonically: member order is syntax too).
fn summary(cell: &Cell) -> Vec<String> {
    cell.devices
        .iter()
        .flat_map(|d| {
            std::iter::once(format!(
                "device {} {}",
                d.manifest.device_id,
                d.bindings.len()
            ))
            .chain(d.bindings.iter().map(|b| {
                format!(
                    "{} {} {:?} {} {}",
                    b.capability_id,
                    b.resource,
                    b.kind,
                    to_canonical_string(&b.limits.to_json()),
                    to_canonical_string(&b.served_schema)
                )
            }))
        })
        .collect()
}
