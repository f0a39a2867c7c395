//! What the kernel-driven targets share: a fresh kernel on the memory store
//! serving the built-in simulated cell, on a runtime of its own, and the
//! observations the invariants are judged on (latches, revisions, stored
//! receipts, running operations).
//!
//! Every input gets its own runtime, store, drivers and kernel (only what
//! is compiled from the cell — specs, schemas, ControlPolicy — is shared),
//! so one input's latch or motion can never explain another input's
//! outcome, and a crash reproduces from its input alone.

use serde_json::{json, Value};
use std::sync::Arc;
use tether_kernel::loader::Cell;
use tether_kernel::{Compiled, Kernel, KernelConfig, Principal};

/// Lines (requests) of one input looked at, at most.
pub const LINES_MAX: usize = 8;

/// A runtime for one input: one thread, timers on.
pub fn runtime() -> Option<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()
}

/// A fresh kernel on a memory store serving the built-in cell; `None` only
/// when the cell or the kernel cannot start, which the caller asserts never
/// happens.
pub fn kernel() -> Option<Kernel> {
    // The cell's specs, compiled schemas and ControlPolicy are read-only:
    // compiled once (Cedar's parser alone took about half of an input's
    // time), shared by every input's kernel; drivers, store and kernel state
    // stay fresh.
    static COMPILED: std::sync::OnceLock<Option<(Cell, Compiled)>> = std::sync::OnceLock::new();
    let (cell, compiled) = COMPILED
        .get_or_init(|| {
            let cell = tether_kernel::loader::load(&fast_cell()?, None).ok()?;
            let compiled = Kernel::compile(KernelConfig::standard("fuzz"), cell.clone()).ok()?;
            Some((cell, compiled))
        })
        .as_ref()?;
    let drivers = tether_drivers::build_all(cell.devices.iter().map(|d| &d.manifest)).ok()?;
    let store = Arc::new(tether_store::MemoryStore::new());
    Kernel::from_compiled(compiled, drivers, store).ok()
}

/// The built-in cell with the arm on a simulated clock 1,000 times faster
/// than real time (`time_scale`, ticking every 1 ms): a motion an input asks
/// for runs its whole course, every tick checked, in a thousandth of its
/// duration, instead of holding the input for up to its deadline.
/// `None` when the arm's manifest no longer reads as this expects (the
/// caller then asserts: a silent real-time arm would only be slow).
fn fast_cell() -> Option<Vec<tether_kernel::loader::ManifestSource>> {
    let mut cell = tether_drivers::builtin_cell();
    let arm = cell
        .iter_mut()
        .find(|m| m.text.contains("driver = \"sim.arm\""))?;
    if !arm.text.contains("tick_ms = 10\n") {
        return None;
    }
    arm.text = arm
        .text
        .replacen("tick_ms = 10\n", "tick_ms = 1\ntime_scale = 1000\n", 1);
    Some(cell)
}

/// What is observed of the kernel before and after one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// `(device, resource, revision)` for every resource of every device.
    pub revisions: Vec<(String, String, Option<u64>)>,
    /// Operations running.
    pub running: usize,
}

/// The revisions and running operations now, as `mhs.devices.list` reports
/// them (each summary's `resources`: `resource`, `revision`).
pub async fn snapshot(kernel: &Kernel) -> Snapshot {
    let list = kernel.devices_list();
    let mut revisions = Vec::new();
    for d in list
        .get("devices")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let device = d
            .get("device_id")
            .and_then(Value::as_str)
            .unwrap_or_default();
        for r in d
            .get("resources")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let resource = r
                .get("resource")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let rev = r.get("revision").and_then(Value::as_u64);
            revisions.push((device.to_owned(), resource.to_owned(), rev));
        }
    }
    Snapshot {
        revisions,
        running: kernel.running_operations(),
    }
}

/// Whether `device` is latched now.
pub fn latched(kernel: &Kernel, device: &str) -> bool {
    kernel
        .safety_status(Some(device))
        .ok()
        .and_then(|s| s.pointer("/devices/0/latched").and_then(Value::as_bool))
        == Some(true)
}

/// The receipt stored as `command_id`'s outcome, as text (`None` when none).
pub fn stored(kernel: &Kernel, command_id: Option<&str>) -> Option<String> {
    let id = command_id?;
    kernel
        .stored_receipt(id)
        .ok()
        .flatten()
        .map(|r| r.to_string())
}

/// Which devices an e-stop request must have latched, judged from the
/// request alone (its params as the permissive parser reads them): the named
/// device when one served here is named; every device when none is named or
/// the params are defective; `None` when it names only devices not served
/// here (then the stop may be refused as `DEVICE.UNKNOWN`).
pub fn estop_must_latch(
    kernel: &Kernel,
    params: Option<&Value>,
    unknown_widens: bool,
) -> Option<Vec<String>> {
    let all = kernel.device_ids();
    let Some(params) = params.filter(|p| p.is_object()) else {
        return Some(all);
    };
    let known = |v: &Value| v.as_str().is_some_and(|s| all.iter().any(|d| d == s));
    let mut named: Vec<String> = Vec::new();
    let mut any_named = false;
    let mut defective = false;
    if let Some(v) = params.get("device_id") {
        any_named = true;
        if known(v) {
            named.extend(v.as_str().map(str::to_owned));
        } else if !v.is_string() && !v.is_null() {
            defective = true;
        }
    }
    if let Some(v) = params.get("device_ids") {
        match v.as_array() {
            Some(list) if list.iter().all(Value::is_string) => {
                any_named |= !list.is_empty();
                named.extend(
                    list.iter()
                        .filter(|v| known(v))
                        .filter_map(|v| v.as_str().map(str::to_owned)),
                );
            }
            _ => defective = true,
        }
    }
    if defective || !any_named {
        return Some(all);
    }
    if named.is_empty() {
        return unknown_widens.then_some(all);
    }
    Some(named)
}

/// `text` with every `$S` replaced by `session` (inputs cannot know a
/// session id a fresh kernel makes, so they name it by this placeholder).
pub fn with_session(text: &[u8], session: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + 32);
    let mut i = 0;
    while i < text.len() {
        if text[i..].starts_with(b"$S") {
            out.extend_from_slice(session.as_bytes());
            i += 2;
        } else {
            out.push(text[i]);
            i += 1;
        }
    }
    out
}

/// A session on every device for the local agent, opened over JSON-RPC.
pub async fn open_session(kernel: &Kernel) -> Option<String> {
    let req = json!({"jsonrpc": "2.0", "id": 0, "method": "mhs.session.open", "params": {}});
    let reply = tether_server::rpc::handle_text(
        kernel,
        &Principal::local_agent(),
        req.to_string().as_bytes(),
    )
    .await?;
    let v: Value = serde_json::from_slice(&reply.to_bytes()).ok()?;
    v.pointer("/result/session_id")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// What a request asks, read as an e-stop is read whatever its defects: the
/// permissive parse (the last duplicate key wins, escapes decoded), and, when
/// the text holds a non-finite number (`NaN`, an infinity, a numeral beyond
/// f64), that parse with `null` in its place (OpenMHS CORE-076, WIRE.md).
pub fn read_permissively(text: &[u8]) -> Option<Value> {
    serde_json::from_slice(text).ok().or_else(|| {
        let repaired = tether_core::json::nonfinite_as_null(std::str::from_utf8(text).ok()?)?;
        serde_json::from_str(&repaired).ok()
    })
}
