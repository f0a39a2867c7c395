//! MCP request handling (`tether_server::mcp::stdio::serve`, what `tether
//! mcp` runs: Tether's strict line reader in front of the `rmcp` SDK), over
//! an in-memory pipe, on a kernel on the memory store with the built-in cell.
//!
//! An input is up to [`LINES_MAX`] lines sent after a real `initialize` and
//! `notifications/initialized`; an input starting with the line `#raw` is
//! sent without them (requests before `initialize`). The pipe is then closed
//! and the server runs to its end.
//!
//! Invariants:
//! - the server ends once its input ends (bounded: no hang), and every line
//!   it wrote is JSON;
//! - a `tools/call` of the `estop` tool — by what it asks (the permissive
//!   parse, a non-finite number read as null: `method` `tools/call`,
//!   `params.name` `estop`, alone or in a batch) — latched the device
//!   `arguments.device_id` names when served here, every device otherwise,
//!   however malformed the rest.

use crate::cell::{self, LINES_MAX};
use serde_json::Value;
use std::time::Duration;
use tether_kernel::{Kernel, Principal};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"fuzz","version":"1"}}}"#;
const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

/// How long one input may be served. Generous: a run ends in milliseconds;
/// only a hang reaches it, and that is a defect.
const SERVE_WAIT: Duration = Duration::from_secs(60);

/// Answer bytes read, at most.
const ANSWER_BYTES_MAX: usize = 4 << 20;

/// Runs the target on one input.
pub fn run(data: &[u8]) {
    let rt = cell::runtime();
    assert!(rt.is_some(), "no runtime");
    let Some(rt) = rt else { return };
    rt.block_on(async {
        let kernel = cell::kernel();
        assert!(kernel.is_some(), "the built-in cell did not start");
        let Some(kernel) = kernel else { return };
        let (raw, body) = match data.strip_prefix(b"#raw\n") {
            Some(rest) => (true, rest),
            None => (false, data),
        };
        let lines: Vec<&[u8]> = body.split(|b| *b == b'\n').take(LINES_MAX).collect();
        let mut text = Vec::new();
        if !raw {
            text.extend_from_slice(INITIALIZE.as_bytes());
            text.push(b'\n');
            text.extend_from_slice(INITIALIZED.as_bytes());
            text.push(b'\n');
        }
        for l in &lines {
            text.extend_from_slice(l);
            text.push(b'\n');
        }
        let out = tokio::time::timeout(SERVE_WAIT, serve(&kernel, text)).await;
        assert!(out.is_ok(), "MCP stdio did not end after its input ended");
        let out = out.unwrap_or_default();
        for line in out.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            assert!(
                serde_json::from_slice::<Value>(line).is_ok(),
                "MCP wrote a line that is not JSON: {}",
                String::from_utf8_lossy(line)
            );
        }
        for l in lines {
            judge_estop(&kernel, l);
        }
        kernel.cancel_all_operations("fuzz input done");
    });
}

/// Serves `input` on a pipe until the server ends; answers what it wrote.
async fn serve(kernel: &Kernel, input: Vec<u8>) -> Vec<u8> {
    let (client_in, server_in) = tokio::io::duplex(64 << 10);
    let (server_out, mut client_out) = tokio::io::duplex(64 << 10);
    let server = tokio::spawn(tether_server::mcp::stdio::serve(
        kernel.clone(),
        Principal::local_agent().model_controlled(),
        server_in,
        server_out,
    ));
    let writer = tokio::spawn(async move {
        let mut client_in = client_in;
        let _ = client_in.write_all(&input).await;
        let _ = client_in.shutdown().await;
    });
    let mut out = Vec::new();
    let _ = (&mut client_out)
        .take(ANSWER_BYTES_MAX as u64)
        .read_to_end(&mut out)
        .await;
    let _ = writer.await;
    let _ = server.await;
    out
}

/// The e-stop calls in one line (alone or in a batch) latched their devices.
fn judge_estop(kernel: &Kernel, line: &[u8]) {
    let Some(v) = cell::read_permissively(line) else {
        return;
    };
    let calls: Vec<&Value> = match &v {
        Value::Array(items) => items.iter().collect(),
        other => vec![other],
    };
    for call in calls {
        let is_estop = call.get("method").and_then(Value::as_str) == Some("tools/call")
            && call.pointer("/params/name").and_then(Value::as_str)
                == Some(tether_server::tools::ESTOP_TOOL);
        if !is_estop {
            continue;
        }
        let all = kernel.device_ids();
        let named = call
            .pointer("/params/arguments/device_id")
            .and_then(Value::as_str)
            .filter(|d| all.iter().any(|x| x == d));
        let must: Vec<String> = match named {
            Some(d) => vec![d.to_owned()],
            None => all,
        };
        for d in must {
            assert!(
                cell::latched(kernel, &d),
                "an MCP estop call left `{d}` unlatched: {}",
                String::from_utf8_lossy(line)
            );
        }
    }
}
