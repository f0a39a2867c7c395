//! MCP over stdio (`tether mcp`): newline-delimited JSON-RPC on stdin and
//! stdout, served by `rmcp`.
//!
//! The SDK's own line transport ignores unparsable lines and drops oversized
//! ones silently. Tether answers every bad line instead, so this module puts
//! its own reader in front: each line is bounded (1 MiB), parsed strictly
//! (duplicate keys, nesting deeper than 64, numbers outside f64 are refused)
//! and only then handed to the SDK; a defect is answered with a JSON-RPC error
//! on the same output. The end of stdin is the end of the connection: the
//! kernel sessions it opened are closed at once, which cancels their running
//! operations (the SDK itself would first wait up to 5 s for handlers).

use super::TetherMcp;
use crate::rpc::error_response;
use crate::stdio::{read_line_bounded, Line};
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
    let inbox = spawn_reader(reader, Arc::clone(&writer), closed.clone());
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

/// Reads lines on its own task (a read is never abandoned half-way), answers
/// defective ones itself and forwards the rest; cancels `closed` at EOF.
fn spawn_reader<R, W>(
    reader: R,
    writer: Arc<Mutex<W>>,
    closed: CancellationToken,
) -> mpsc::Receiver<RxJsonRpcMessage<RoleServer>>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::channel(INBOX_DEPTH_MAX);
    tokio::spawn(async move {
        let mut reader = BufReader::new(reader);
        loop {
            let answer = match read_line_bounded(&mut reader, crate::REQUEST_BYTES_MAX).await {
                Ok(Line::Eof) | Err(_) => break,
                Ok(Line::TooLong(n)) => Some(error_response(
                    Value::Null,
                    Code::ProtocolTooLarge,
                    "request too large",
                    json!({"limit_bytes": crate::REQUEST_BYTES_MAX, "size_bytes": n}),
                )),
                Ok(Line::Text(bytes)) if bytes.iter().all(u8::is_ascii_whitespace) => None,
                Ok(Line::Text(bytes)) => match decode(&bytes) {
                    Ok(Some(message)) => {
                        if tx.send(message).await.is_err() {
                            break;
                        }
                        None
                    }
                    Ok(None) => None,
                    Err(answer) => Some(answer),
                },
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

/// One line: a message for the SDK, nothing (a defective notification is
/// never answered), or the JSON-RPC error to answer.
fn decode(bytes: &[u8]) -> Result<Option<RxJsonRpcMessage<RoleServer>>, Value> {
    let parse_error = |reason: &str, message: String| {
        error_response(
            Value::Null,
            Code::ProtocolParseError,
            "parse error",
            json!({"reason": reason, "message": message}),
        )
    };
    let text = std::str::from_utf8(bytes)
        .map_err(|_| parse_error("not_utf8", "the line is not UTF-8".into()))?;
    let value = parse_strict(text).map_err(|m| parse_error("invalid_json", m))?;
    let id = match value.get("id") {
        Some(id @ (Value::String(_) | Value::Number(_))) => id.clone(),
        _ => Value::Null,
    };
    if !value.is_object() {
        return Err(error_response(
            id,
            Code::ProtocolInvalidRequest,
            "a message must be one JSON object (batches are not part of MCP)",
            json!({"reason": "not_an_object"}),
        ));
    }
    let is_notification = value.get("id").is_none();
    match serde_json::from_value::<RxJsonRpcMessage<RoleServer>>(value) {
        Ok(message) => Ok(Some(message)),
        Err(_) if is_notification => Ok(None),
        Err(e) => Err(error_response(
            id,
            Code::ProtocolInvalidRequest,
            "not a valid MCP message",
            json!({"reason": "invalid_message", "message": e.to_string()}),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::decode;

    #[test]
    fn duplicate_keys_and_deep_nesting_are_parse_errors() {
        let dup = decode(br#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#).expect_err("dup");
        assert_eq!(dup["error"]["code"], -32700);
        let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert_eq!(
            decode(deep.as_bytes()).expect_err("deep")["error"]["code"],
            -32700
        );
    }

    #[test]
    fn a_ping_passes_and_a_malformed_request_is_invalid() {
        assert!(matches!(
            decode(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#),
            Ok(Some(_))
        ));
        let bad = decode(br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":5}"#)
            .expect_err("invalid");
        assert_eq!(bad["id"], 7);
    }
}
