//! JSON-RPC over stdio: one JSON value per line in, one per line out.
//!
//! Lines are read with a hard size bound (a longer line is answered with an
//! error and skipped, never buffered whole). Every request runs on its own
//! task and answers are written as they complete, so an e-stop is answered
//! while a long motion is still running.

use crate::rpc::{handle_text, Reply};
use tether_kernel::{Kernel, Principal};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// Answers waiting to be written, at most.
const OUTBOX_DEPTH_MAX: usize = 1024;

/// One line read by [`read_line_bounded`].
pub(crate) enum Line {
    Text(Vec<u8>),
    /// A line longer than the bound: its size and its first `limit` bytes
    /// (so an e-stop in it can still be recognised; the rest is skipped).
    TooLong {
        size: usize,
        prefix: Vec<u8>,
    },
    Eof,
}

/// Reads one line of at most `limit` bytes; of a longer one only the first
/// `limit` bytes are kept, the rest is skipped, and its size reported.
pub(crate) async fn read_line_bounded<R: AsyncRead + Unpin>(
    r: &mut BufReader<R>,
    limit: usize,
) -> std::io::Result<Line> {
    let mut buf = Vec::new();
    let mut size = 0usize;
    loop {
        let chunk = r.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(if size == 0 {
                Line::Eof
            } else {
                ended(buf, size, limit)
            });
        }
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (chunk.len(), false),
        };
        let room = limit.saturating_sub(buf.len());
        buf.extend_from_slice(&chunk[..take.min(room)]);
        size = size.saturating_add(take);
        r.consume(take + usize::from(done));
        if done {
            return Ok(ended(buf, size, limit));
        }
    }
}

fn ended(buf: Vec<u8>, size: usize, limit: usize) -> Line {
    if size > limit {
        Line::TooLong { size, prefix: buf }
    } else {
        Line::Text(buf)
    }
}

/// Serves JSON-RPC on the given reader and writer until the reader ends,
/// then waits for in-flight requests and returns.
///
/// # Errors
/// I/O errors of the reader or writer.
pub async fn serve<R, W>(
    kernel: Kernel,
    principal: Principal,
    reader: R,
    mut writer: W,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel::<Reply>(OUTBOX_DEPTH_MAX);
    let writer_task = tokio::spawn(async move {
        while let Some(reply) = rx.recv().await {
            let mut line = reply.to_bytes();
            line.push(b'\n');
            writer.write_all(&line).await?;
            writer.flush().await?;
        }
        Ok::<(), std::io::Error>(())
    });
    let mut reader = BufReader::new(reader);
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        match read_line_bounded(&mut reader, crate::REQUEST_BYTES_MAX).await? {
            Line::Eof => break,
            Line::TooLong { size, prefix } => {
                let e = crate::rpc::too_large(&kernel, &principal, &prefix, Some(size)).await;
                if tx.send(e).await.is_err() {
                    break;
                }
            }
            Line::Text(bytes) => {
                if bytes.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let k = kernel.clone();
                let p = principal.clone();
                let out = tx.clone();
                tasks.spawn(async move {
                    if let Some(answer) = handle_text(&k, &p, &bytes).await {
                        let _ = out.send(answer).await;
                    }
                });
                while tasks.try_join_next().is_some() {}
            }
        }
    }
    while tasks.join_next().await.is_some() {}
    drop(tx);
    writer_task.await.unwrap_or(Ok(()))
}
