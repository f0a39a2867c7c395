//! The evidence verifier (`tether_store::verify::verify_jsonl`) on mutated
//! exports of a real chain.
//!
//! The export is made once per process: a kernel on the memory store serves
//! a few real requests (a setpoint, a refused setpoint, a read, an e-stop),
//! then exports its chain. An input whose first byte is even is a list of
//! mutations of that export (4 bytes each: what, where (2 bytes), a byte);
//! an odd first byte makes the rest of the input the export itself.
//!
//! Invariants: the untouched export verifies; a mutated export verifies as
//! intact only when the mutation is a no-op (the same lines, up to the
//! accepted `\r\n` endings and a missing final newline); a report is
//! consistent (intact exactly when it names no broken line; the entries it
//! counts are lines of the file).

use serde_json::json;
use std::sync::OnceLock;
use tether_kernel::Principal;
use tether_store::verify::{verify_jsonl, VerifyReport};

/// Mutations applied, at most.
const MUTATIONS_MAX: usize = 16;

/// The real export, made once.
pub fn export() -> &'static [u8] {
    static EXPORT: OnceLock<Vec<u8>> = OnceLock::new();
    EXPORT.get_or_init(make_export)
}

fn make_export() -> Vec<u8> {
    let Some(rt) = crate::cell::runtime() else {
        return Vec::new();
    };
    rt.block_on(async {
        let Some(kernel) = crate::cell::kernel() else {
            return Vec::new();
        };
        let Some(s) = crate::cell::open_session(&kernel).await else {
            return Vec::new();
        };
        let p = Principal::local_agent();
        let requests = [
            json!({"jsonrpc":"2.0","id":1,"method":"mhs.command","params":{"session_id":s,"command_id":"fuzz-1","device_id":"thermostat-1","capability_id":"cap.thermal.setpoint.v1","input":{"target_temperature":30}}}),
            json!({"jsonrpc":"2.0","id":2,"method":"mhs.command","params":{"session_id":s,"command_id":"fuzz-2","device_id":"thermostat-1","capability_id":"cap.thermal.setpoint.v1","input":{"target_temperature":400}}}),
            json!({"jsonrpc":"2.0","id":3,"method":"mhs.resource.read","params":{"session_id":s,"device_id":"thermostat-1","resource":"main"}}),
            json!({"jsonrpc":"2.0","id":4,"method":"mhs.safety.estop","params":{"device_id":"relay-1","reason":"fuzz export"}}),
        ];
        for r in requests {
            let _ = tether_server::rpc::handle_text(&kernel, &p, r.to_string().as_bytes()).await;
        }
        let mut out = Vec::new();
        let _ = kernel.evidence_export(&mut out);
        out
    })
}

/// Runs the target on one input.
pub fn run(data: &[u8]) {
    let original = export();
    let whole = verify_jsonl(original);
    assert!(
        whole.ok && whole.entries > 3,
        "the real export does not verify: {whole:?}"
    );
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 1 {
        let report = verify_jsonl(rest);
        assert_consistent(&report, rest);
        return;
    }
    let mut text = original.to_vec();
    for op in rest.chunks_exact(4).take(MUTATIONS_MAX) {
        mutate(&mut text, op);
    }
    let report = verify_jsonl(text.as_slice());
    assert_consistent(&report, &text);
    if report.ok {
        assert_eq!(
            lines(&text),
            lines(original),
            "a mutated export verified as intact: {report:?}"
        );
    }
}

/// One mutation: `op` is what (0..=9), where (2 bytes, scaled to the text),
/// and a byte.
fn mutate(text: &mut Vec<u8>, op: &[u8]) {
    let [what, hi, lo, byte] = [op[0], op[1], op[2], op[3]];
    let at = (usize::from(hi) << 8 | usize::from(lo)) * text.len().max(1) / 65_536;
    let line_starts: Vec<usize> = std::iter::once(0)
        .chain(
            text.iter()
                .enumerate()
                .filter(|(_, b)| **b == b'\n')
                .map(|(i, _)| i + 1),
        )
        .filter(|&i| i < text.len())
        .collect();
    let line = line_starts
        .get(usize::from(byte) % line_starts.len().max(1))
        .copied();
    let line_end = |start: usize, t: &[u8]| {
        t[start..]
            .iter()
            .position(|b| *b == b'\n')
            .map_or(t.len(), |p| start + p + 1)
    };
    match what % 10 {
        0 if at < text.len() => text[at] = byte,
        1 => text.insert(at.min(text.len()), byte),
        2 if at < text.len() => {
            text.remove(at);
        }
        3 if at < text.len() => text[at] ^= 1 << (byte % 8),
        4 => text.truncate(at),
        5 => {
            if let Some(s) = line {
                let e = line_end(s, text);
                text.drain(s..e);
            }
        }
        6 => {
            if let Some(s) = line {
                let e = line_end(s, text);
                let copy = text[s..e].to_vec();
                text.splice(s..s, copy);
            }
        }
        7 => {
            if let Some(s) = line {
                let e = line_end(s, text);
                let e2 = line_end(e.min(text.len()), text);
                if e < e2 {
                    let mut swapped = text[e..e2].to_vec();
                    swapped.extend_from_slice(&text[s..e]);
                    text.splice(s..e2, swapped);
                }
            }
        }
        8 => {
            // A no-op for the verifier: `\r\n` for `\n`.
            if let Some(s) = line {
                let e = line_end(s, text);
                if e > s && text[e - 1] == b'\n' && (e < 2 || text[e - 2] != b'\r') {
                    text.insert(e - 1, b'\r');
                }
            }
        }
        _ => {
            // A no-op for the verifier: the final newline dropped.
            if text.last() == Some(&b'\n') {
                text.pop();
            }
        }
    }
}

/// The lines of an export as the verifier reads them: split at `\n`, one
/// `\r` before it dropped, no empty line after the last terminator.
fn lines(text: &[u8]) -> Vec<&[u8]> {
    let mut out: Vec<&[u8]> = text
        .split(|b| *b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .collect();
    if text.last() == Some(&b'\n') || text.is_empty() {
        out.pop();
    }
    out
}

fn assert_consistent(report: &VerifyReport, text: &[u8]) {
    assert_eq!(report.ok, report.first_broken.is_none(), "{report:?}");
    let n = u64::try_from(lines(text).len()).unwrap_or(u64::MAX);
    assert!(
        report.entries <= n,
        "{report:?} counts more entries than lines ({n})"
    );
    if report.ok {
        assert_eq!(
            report.entries + 1,
            n,
            "an intact export is its entries and its seal"
        );
    }
}
