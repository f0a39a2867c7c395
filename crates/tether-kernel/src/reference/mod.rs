//! What the kernel says about itself and its devices: `mhs.hello`,
//! `mhs.devices.list|get` (`describe.rs`) and each device's generated
//! reference file (`file.rs`), built from the limits the kernel enforces;
//! and the evidence chain read for the console (`evidence.rs`).
//!
//! **Never belongs here:** hand-written limits or anything a check reads.

mod describe;
mod evidence;
mod file;

pub use evidence::EVIDENCE_TAIL_MAX;
pub use file::{effective_limits, reference_json, reference_markdown};
