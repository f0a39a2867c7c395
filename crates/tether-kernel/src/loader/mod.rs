//! Loading a cell: manifests + operator overlay -> resolved devices.
//!
//! Owns [`load`], the public types it yields ([`Cell`], [`DeviceSpec`],
//! [`BindingSpec`]) and takes ([`ManifestSource`], [`OverlaySource`]), the
//! [`Defect`] it reports, and the cell-wide checks (a device id declared
//! twice, an overlay entry for a device the endpoint does not serve). The
//! work on one manifest lives below:
//!
//! | module | owns |
//! |---|---|
//! | `manifest` | reading the texts: manifest (TOML or JSON) with the tuple rewrite, the overlay |
//! | `device` | one device: its header and resources, the overlay split by capability, compiling its schemas |
//! | `binding` | one binding: catalogue class, risk, served schema, effective limits, trusted flags |
//! | `kind` | the command kind: explicit on a physical device's effectful binding, a bound for `time_bounded` |
//! | `schema` | the writable (configure) schema, binding-over-class merge, loosenings |
//! | `checks` | envelope, safety, facts, interlocks and unit checks |
//!
//! **Fail-closed rule:** every defect is collected (not just the first) and
//! reported with the file, the device and the field, so `tether check` can
//! print them all and `tether serve` refuses to start with a message a plant
//! engineer can act on. A cell with any defect does not load: [`load`]
//! returns the cell only when no defect was found.
//!
//! **Never belongs here:** anything evaluated per request (the checks of the
//! evaluation order read the resolved [`BindingSpec`], they do not re-load),
//! the limits grammar (-> `tether-limits`), the manifest format itself
//! (-> `tether_core::manifest`).

mod binding;
mod checks;
mod device;
mod kind;
mod manifest;
mod schema;

pub use schema::{merge_schema, writable_schema};

use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;
use tether_core::catalogue::{Flags, Verb};
use tether_core::manifest::{CommandKind, Concurrency, DeviceManifest, RiskClass};
use tether_limits::EffectiveLimits;

/// A manifest's text and where it came from.
#[derive(Clone, Debug)]
pub struct ManifestSource {
    /// File path or `builtin:<name>`.
    pub origin: String,
    /// The text.
    pub text: String,
}

/// The operator overlay (`site-limits.json`) and where it came from.
#[derive(Clone, Debug)]
pub struct OverlaySource {
    /// File path.
    pub origin: String,
    /// The text.
    pub text: String,
}

/// One load defect: file, device, field, message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Defect {
    /// File (or `builtin:...`).
    pub file: String,
    /// Device id, or `-` when the device is not known yet.
    pub device: String,
    /// The field path inside the manifest (e.g. `bindings[2].limits.speed`).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Defect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: device `{}`: {}: {}",
            self.file, self.device, self.field, self.message
        )
    }
}

/// A binding after resolution against the catalogue and the limits engine.
#[derive(Debug, Clone)]
pub struct BindingSpec {
    /// Capability id.
    pub capability_id: String,
    /// Resource id.
    pub resource: String,
    /// The trusted verb: the catalogue's, or `Action` for an extension.
    pub verb: Verb,
    /// The trusted flags: the catalogue's, or none for an extension.
    pub flags: Flags,
    /// Declared verb of an extension (shown, never trusted).
    pub declared_verb: Option<Verb>,
    /// Declared flags of an extension (shown; only `two_person` is honoured).
    pub declared_flags: Option<Flags>,
    /// Whether the class is catalogued.
    pub catalogued: bool,
    /// Effective risk: max(class floor, binding risk, device risk) (CORE-030).
    pub risk: RiskClass,
    /// The served input schema (binding merged over class), with bounds.
    pub served_schema: Value,
    /// The class schema, checked too so a binding can never widen it.
    pub class_schema: Option<Value>,
    /// Output schema.
    pub output_schema: Value,
    /// Effective limits.
    pub limits: EffectiveLimits,
    /// Driver target.
    pub target: String,
    /// Concurrency.
    pub concurrency: Concurrency,
    /// Longest run, ms.
    pub max_duration_ms: Option<u64>,
    /// How the call is bounded in time: as declared, which on a hardware or
    /// hybrid device every effectful binding does; else the default
    /// (`risk_reducing` for a trusted stop or risk-reducing class,
    /// `time_bounded` otherwise).
    pub kind: CommandKind,
    /// Whether a trip, an e-stop or a cancel cancels a running call
    /// (`abortable = false` declares it does not; default `true`).
    pub abortable: bool,
    /// A `safe_state.achieved_by` action.
    pub achieves_safe_state: bool,
    /// For people.
    pub description: String,
}

impl BindingSpec {
    /// A stop class (trusted flag).
    pub fn is_stop(&self) -> bool {
        self.flags.stop_class
    }
    /// A catalogued read (the only reads the latch exempts).
    pub fn is_read(&self) -> bool {
        self.catalogued && self.verb == Verb::Read
    }
}

/// A device after loading.
#[derive(Debug, Clone)]
pub struct DeviceSpec {
    /// The manifest as written.
    pub manifest: DeviceManifest,
    /// Where it came from.
    pub origin: String,
    /// Resolved bindings, in manifest order.
    pub bindings: Vec<BindingSpec>,
    /// Whether an overlay narrowed or filled any bound of this device.
    pub overlay_applied: bool,
}

/// A loaded cell.
#[derive(Debug, Default, Clone)]
pub struct Cell {
    /// Devices in load order.
    pub devices: Vec<DeviceSpec>,
    /// Overlay origin, when one was given.
    pub overlay_origin: Option<String>,
}

/// The defects found in one manifest, each stamped with its file and device.
struct Ctx<'a> {
    file: &'a str,
    device: String,
    defects: Vec<Defect>,
}

impl Ctx<'_> {
    fn defect(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.defects.push(Defect {
            file: self.file.to_owned(),
            device: self.device.clone(),
            field: field.into(),
            message: message.into(),
        });
    }
}

/// Loads and checks a cell.
///
/// # Errors
/// Every defect found, each naming the file, the device and the field.
pub fn load(
    manifests: &[ManifestSource],
    overlay: Option<&OverlaySource>,
) -> Result<Cell, Vec<Defect>> {
    let mut defects = Vec::new();
    let overlay_map = match overlay.map(manifest::parse_overlay).transpose() {
        Ok(o) => o.unwrap_or_default(),
        Err(d) => {
            defects.push(d);
            manifest::Overlay::new()
        }
    };
    let overlay_origin = overlay.map(|o| o.origin.clone()).unwrap_or_default();
    let mut cell = Cell {
        devices: Vec::new(),
        overlay_origin: overlay.map(|o| o.origin.clone()),
    };
    let mut seen = BTreeMap::<String, String>::new();
    for src in manifests {
        let manifest = match manifest::parse_manifest(src) {
            Ok(m) => m,
            Err(message) => {
                defects.push(manifest::parse_defect(src, message));
                continue;
            }
        };
        // A second manifest with the same id is a defect, but its body is
        // still checked so `tether check` prints every defect at once.
        let first_origin = seen.get(&manifest.device_id).cloned();
        if let Some(first) = &first_origin {
            defects.push(Defect {
                file: src.origin.clone(),
                device: manifest.device_id.clone(),
                field: "device_id".into(),
                message: format!("device id already declared in {first}"),
            });
        } else {
            seen.insert(manifest.device_id.clone(), src.origin.clone());
        }
        let dev_overlay = overlay_map.get(&manifest.device_id);
        let mut ctx = Ctx {
            file: &src.origin,
            device: manifest.device_id.clone(),
            defects: Vec::new(),
        };
        let spec = device::resolve_device(&mut ctx, manifest, src, dev_overlay, &overlay_origin);
        device::check_schemas_compile(&mut ctx, &spec);
        defects.append(&mut ctx.defects);
        if first_origin.is_none() {
            cell.devices.push(spec);
        }
    }
    for device in overlay_map.keys() {
        if !seen.contains_key(device) {
            defects.push(Defect {
                file: overlay_origin.clone(),
                device: device.clone(),
                field: device.clone(),
                message: "the overlay names a device this endpoint does not serve".into(),
            });
        }
    }
    if defects.is_empty() {
        Ok(cell)
    } else {
        Err(defects)
    }
}
