//! MCP over stdio (`tether mcp`): newline-delimited JSON-RPC on stdin and
//! stdout, served by `rmcp`.
//!
//! The SDK's own line transport ignores unparsable lines and drops oversized
//! ones silently. Tether answers every bad line instead, so this module puts
//! its own reader in front: each line is bounded (1 MiB), parsed strictly
//! (duplicate keys, nesting deeper than 64, numbers outside f64 are refused)
//! and only then handed to the SDK; a defect is answered with a JSON-RPC error
//! on the same output. A `tools/call` of the `estop` tool that is defective,
//! or that arrives before the SDK would serve it (before `initialize`, or
//! without the request metadata a session-less 2026-07-28 request carries),
//! is served here: the devices are latched and the protocol error says so
//! (see [`super::screen`]). The end of stdin is the end of the connection: the
//! kernel sessions it opened are closed at once, which cancels their running
//! operations (the SDK itself would first wait up to 5 s for handlers).

use super::screen::{self, DefectiveEstop, Screened};
use super::TetherMcp;
use crate::rpc::error_response;
use crate::stdio::{read_line_bounded, Line};
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, GetMeta, ProtocolVersion};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::{RoleServer, ServiceExt};
use serde_json::{json, Value};
use std::sync::Arc;
use tether_core::json::parse_strict;
use tether_core::Code;
use tether_kernel::{Kernel, Principal};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, Mutex};
use tokio_util::sync::CancellationToken;

/// Parsed messages waiting for the SDK, at most. The SDK takes each one at
/// once (every request runs in its own task), so this only smooths bursts.
const INBOX_DEPTH_MAX: usize = 64;

/// Serves MCP on `reader`/`writer` until the reader ends, then closes the
/// kernel sessions of the connection.
///
/// # Errors
/// I/O errors of the writer.
pub async fn serve<R, W>(
    kernel: Kernel,
    principal: Principal,
    reader: R,
    writer: W,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let closed = CancellationToken::new();
    let server = TetherMcp::for_stdio(kernel, principal, closed.clone());
    let writer = Arc::new(Mutex::new(writer));
    let inbox = spawn_reader(reader, Arc::clone(&writer), closed.clone(), server.clone());
    // Closing the sessions at EOF, not when the SDK is done draining, is what
    // makes a closed stream cancel the calls still running.
    let closer = {
        let server = server.clone();
        tokio::spawn(async move {
            closed.cancelled().await;
            server.close_sessions().await;
        })
    };
    let transport = StrictLines { inbox, writer };
    match server.clone().serve(transport).await {
        Ok(running) => {
            let _ = running.waiting().await;
        }
        // The client left (or spoke nonsense) before initializing: nothing to serve.
        Err(e) => tracing::debug!(error = %e, "MCP stdio session did not start"),
    }
    server.close_sessions().await;
    closer.abort();
    // The calls the closed sessions cancelled still record their receipts.
    if !server.drain().await {
        tracing::warn!("MCP stdio: calls still running at exit; their receipts may be missing");
    }
    Ok(())
}

/// The transport the SDK sees: already-checked messages in, answers out.
struct StrictLines<W> {
    inbox: mpsc::Receiver<RxJsonRpcMessage<RoleServer>>,
    writer: Arc<Mutex<W>>,
}

async fn write_line<W: AsyncWrite + Unpin>(
    writer: &Mutex<W>,
    mut line: Vec<u8>,
) -> std::io::Result<()> {
    line.push(b'\n');
    let mut w = writer.lock().await;
    w.write_all(&line).await?;
    w.flush().await
}

impl<W: AsyncWrite + Unpin + Send + 'static> Transport<RoleServer> for StrictLines<W> {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        let writer = Arc::clone(&self.writer);
        async move {
            let line = serde_json::to_vec(&item).map_err(std::io::Error::other)?;
            write_line(&writer, line).await
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        // Cancel-safe: the SDK polls this inside `select!`.
        self.inbox.recv().await
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.writer.lock().await.flush().await
    }
}

/// Which lifecycle the SDK selected, as far as the reader has forwarded
/// messages (the SDK takes them in order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lifecycle {
    /// Nothing selected yet: the SDK answers anything but `initialize`,
    /// `ping`, `server/discover` and complete 2026-07-28 requests with an
    /// error, without reaching the handler.
    Unselected,
    /// `initialize` was forwarded: requests need no metadata of their own.
    Initialized,
    /// A 2026-07-28 request selected the inline lifecycle: every request must
    /// carry its metadata, or the SDK refuses it before the handler.
    Inline,
}

/// What became of one line.
#[derive(Debug)]
enum Decoded {
    /// A message for the SDK (boxed: it is much larger than the others).
    Forward(Box<RxJsonRpcMessage<RoleServer>>),
    /// Nothing to do (a defective notification is never answered).
    Nothing,
    /// A JSON-RPC error to answer.
    Answer(Value),
    /// An e-stop to serve here, then answer.
    Estop(DefectiveEstop),
}

/// Reads lines on its own task (a read is never abandoned half-way), answers
/// defective ones itself and forwards the rest; cancels `closed` at EOF.
fn spawn_reader<R, W>(
    reader: R,
    writer: Arc<Mutex<W>>,
    closed: CancellationToken,
    server: TetherMcp,
) -> mpsc::Receiver<RxJsonRpcMessage<RoleServer>>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::channel(INBOX_DEPTH_MAX);
    tokio::spawn(async move {
        let mut reader = BufReader::new(reader);
        let mut lifecycle = Lifecycle::Unselected;
        loop {
            let decoded = match read_line_bounded(&mut reader, crate::REQUEST_BYTES_MAX).await {
                Ok(Line::Eof) | Err(_) => break,
                Ok(Line::TooLong { size, prefix }) => too_long(&prefix, size),
                Ok(Line::Text(bytes)) if bytes.iter().all(u8::is_ascii_whitespace) => continue,
                Ok(Line::Text(bytes)) => decode(&bytes, &mut lifecycle),
            };
            let answer = match decoded {
                Decoded::Forward(message) => {
                    if tx.send(*message).await.is_err() {
                        break;
                    }
                    None
                }
                Decoded::Nothing => None,
                Decoded::Answer(answer) => Some(answer),
                Decoded::Estop(estop) => {
                    // Served on its own task: the stop path takes up to
                    // a device's stop budget, and the next line (another
                    // stop, a cancel) must not wait behind it. Tracked
                    // with the connection's calls, so an exit waits for
                    // the stop and its answer.
                    let kernel = server.kernel.clone();
                    let principal = server.conn.principal.clone();
                    let writer = Arc::clone(&writer);
                    server.conn.inflight.spawn(async move {
                        if let Some(answer) = estop.serve(&kernel, principal).await {
                            let _ = write_line(&writer, answer.to_string().into_bytes()).await;
                        }
                    });
                    None
                }
            };
            if let Some(answer) = answer {
                if write_line(&writer, answer.to_string().into_bytes())
                    .await
                    .is_err()
                {
                    break;
                }
            }
        }
        closed.cancel();
    });
    rx
}

/// A line longer than the bound, of which `prefix` is the start: the
/// protocol error, or — when it reads as a call of the `estop` tool — an
/// e-stop of every device answered with that error.
fn too_long(prefix: &[u8], size: usize) -> Decoded {
    let message = format!(
        "request too large ({size} bytes; the limit is {})",
        crate::REQUEST_BYTES_MAX
    );
    match screen::unparsable(&String::from_utf8_lossy(prefix), &message) {
        Some(estop) => Decoded::Estop(screen::DefectiveEstop {
            code: Code::ProtocolTooLarge,
            reason: "too_large",
            message: message.clone(),
            // Its arguments were never read: every device is stopped.
            arguments: None,
            ..estop
        }),
        None => Decoded::Answer(error_response(
            Value::Null,
            Code::ProtocolTooLarge,
            "request too large",
            json!({"limit_bytes": crate::REQUEST_BYTES_MAX, "size_bytes": size}),
        )),
    }
}

/// One line: a message for the SDK, nothing, the JSON-RPC error to answer,
/// or an e-stop the SDK would not serve. `lifecycle` follows what was
/// forwarded.
fn decode(bytes: &[u8], lifecycle: &mut Lifecycle) -> Decoded {
    let parse_error = |reason: &str, message: String| {
        error_response(
            Value::Null,
            Code::ProtocolParseError,
            "parse error",
            json!({"reason": reason, "message": message}),
        )
    };
    let Ok(text) = std::str::from_utf8(bytes) else {
        let message = "the line is not UTF-8";
        // Still an e-stop if it reads as one.
        let lossy = String::from_utf8_lossy(bytes);
        return match screen::unparsable(&lossy, message) {
            Some(estop) => Decoded::Estop(estop),
            None => Decoded::Answer(parse_error("not_utf8", message.into())),
        };
    };
    let value = match parse_strict(text) {
        Ok(v) => v,
        Err(m) => {
            return match screen::unparsable(text, &m) {
                Some(estop) => Decoded::Estop(estop),
                None => Decoded::Answer(parse_error("invalid_json", m)),
            }
        }
    };
    let value = match screen::message(value) {
        Screened::Pass(v) => v,
        Screened::Refuse(Some(answer)) => return Decoded::Answer(answer),
        Screened::Refuse(None) => return Decoded::Nothing,
        Screened::Estop(estop) => return Decoded::Estop(estop),
    };
    let id = match value.get("id") {
        Some(id @ (Value::String(_) | Value::Number(_))) => id.clone(),
        _ => Value::Null,
    };
    if !value.is_object() {
        return Decoded::Answer(error_response(
            id,
            Code::ProtocolInvalidRequest,
            "a message must be one JSON object (batches are not part of MCP)",
            json!({"reason": "not_an_object"}),
        ));
    }
    let is_notification = value.get("id").is_none();
    let arguments = value
        .get("params")
        .and_then(|p| p.get("arguments"))
        .and_then(Value::as_object)
        .cloned();
    match serde_json::from_value::<RxJsonRpcMessage<RoleServer>>(value) {
        Ok(message) => match follow_lifecycle(&message, lifecycle) {
            None => Decoded::Forward(Box::new(message)),
            Some(message) => Decoded::Estop(DefectiveEstop {
                id: Some(id),
                code: Code::ProtocolInvalidRequest,
                reason: "not_initialized",
                message,
                arguments,
            }),
        },
        Err(_) if is_notification => Decoded::Nothing,
        Err(e) => Decoded::Answer(error_response(
            id,
            Code::ProtocolInvalidRequest,
            "not a valid MCP message",
            json!({"reason": "invalid_message", "message": e.to_string()}),
        )),
    }
}

/// Follows the lifecycle the SDK selects from the messages forwarded to it.
/// Answers why, when `message` is a call of the `estop` tool the SDK would
/// refuse before the handler (no lifecycle yet, or an inline lifecycle and
/// no request metadata); it is then served here and not forwarded.
fn follow_lifecycle(message: &ClientJsonRpcMessage, lifecycle: &mut Lifecycle) -> Option<String> {
    let ClientJsonRpcMessage::Request(req) = message else {
        return None;
    };
    let complete_meta = req
        .request
        .get_meta()
        .missing_required_keys(&ProtocolVersion::V_2026_07_28)
        .is_empty();
    let estop = matches!(&req.request, ClientRequest::CallToolRequest(c) if c.params.name == crate::tools::ESTOP_TOOL);
    match (&req.request, *lifecycle) {
        (ClientRequest::InitializeRequest(_), Lifecycle::Unselected) => {
            *lifecycle = Lifecycle::Initialized;
            None
        }
        (_, Lifecycle::Initialized) => None,
        (_, _) if estop && !complete_meta => Some(if *lifecycle == Lifecycle::Unselected {
            "the e-stop was sent before initialize".to_owned()
        } else {
            "the e-stop lacks the request metadata (_meta) of a 2026-07-28 request".to_owned()
        }),
        (ClientRequest::DiscoverRequest(_) | ClientRequest::PingRequest(_), _) => None,
        (_, Lifecycle::Unselected) if complete_meta => {
            *lifecycle = Lifecycle::Inline;
            None
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{decode, Decoded, Lifecycle};
    use serde_json::Value;

    fn answer(bytes: &[u8]) -> Value {
        match decode(bytes, &mut Lifecycle::Initialized) {
            Decoded::Answer(v) => v,
            other => panic!("not answered: {other:?}"),
        }
    }

    #[test]
    fn duplicate_keys_and_deep_nesting_are_parse_errors() {
        let dup = answer(br#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#);
        assert_eq!(dup["error"]["code"], -32700);
        let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert_eq!(answer(deep.as_bytes())["error"]["code"], -32700);
    }

    #[test]
    fn a_ping_passes_and_a_malformed_request_is_invalid() {
        assert!(matches!(
            decode(
                br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
                &mut Lifecycle::Initialized
            ),
            Decoded::Forward(_)
        ));
        let bad = answer(br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":5}"#);
        assert_eq!(bad["id"], 7);
        assert_eq!(bad["error"]["code"], -32602);
    }

    #[test]
    fn a_duplicate_key_estop_is_served_not_refused() {
        let line = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"estop","arguments":{"reason":"a","reason":"b"}}}"#;
        assert!(matches!(
            decode(line, &mut Lifecycle::Initialized),
            Decoded::Estop(_)
        ));
    }

    #[test]
    fn an_estop_before_initialize_is_served_here_and_after_it_by_the_sdk() {
        let estop =
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"estop","arguments":{}}}"#;
        let mut lifecycle = Lifecycle::Unselected;
        let Decoded::Estop(e) = decode(estop, &mut lifecycle) else {
            panic!("not served before initialize");
        };
        assert_eq!(e.reason, "not_initialized");
        assert_eq!(e.id, Some(serde_json::json!(1)));
        let init = br#"{"jsonrpc":"2.0","id":2,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
        assert!(matches!(decode(init, &mut lifecycle), Decoded::Forward(_)));
        assert_eq!(lifecycle, Lifecycle::Initialized);
        assert!(matches!(decode(estop, &mut lifecycle), Decoded::Forward(_)));
    }
}
