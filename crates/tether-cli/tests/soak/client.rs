//! The soak's client: one keep-alive HTTP/1.1 connection per load thread
//! (a soak that opened a connection per request would measure the kernel's
//! accept queue, not its memory), reconnecting when the endpoint closes it.
//! Every read and write is bounded by [`REQUEST_TIMEOUT`].

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Bound on one request's answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// Longest answer head the client reads, bytes.
const HEAD_MAX: usize = 16 * 1024;

/// A keep-alive connection to the endpoint.
pub struct Conn {
    addr: SocketAddr,
    stream: Option<BufReader<TcpStream>>,
    /// Connections opened (1 when the endpoint never closed one).
    pub connects: u64,
}

impl Conn {
    pub fn new(addr: SocketAddr) -> Conn {
        Conn {
            addr,
            stream: None,
            connects: 0,
        }
    }

    fn stream(&mut self) -> Result<&mut BufReader<TcpStream>, String> {
        if self.stream.is_none() {
            let s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(5))
                .map_err(|e| format!("connect: {e}"))?;
            s.set_read_timeout(Some(REQUEST_TIMEOUT))
                .map_err(|e| e.to_string())?;
            s.set_write_timeout(Some(REQUEST_TIMEOUT))
                .map_err(|e| e.to_string())?;
            s.set_nodelay(true).map_err(|e| e.to_string())?;
            self.connects += 1;
            self.stream = Some(BufReader::new(s));
        }
        self.stream.as_mut().ok_or_else(|| "no stream".to_owned())
    }

    /// One request; the status and the JSON body. A request whose answer
    /// did not arrive whole drops the connection (the next one reconnects).
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<(u16, Value), String> {
        let r = self.exchange(method, path, body);
        if r.is_err() {
            self.stream = None;
        }
        r
    }

    fn exchange(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<(u16, Value), String> {
        let addr = self.addr;
        let s = self.stream()?;
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n");
        if let Some(b) = body {
            req.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
                b.len()
            ));
        } else {
            req.push_str("\r\n");
        }
        s.get_mut()
            .write_all(req.as_bytes())
            .map_err(|e| format!("write: {e}"))?;
        let (status, length, close) = read_head(s)?;
        let mut buf = vec![0u8; length];
        s.read_exact(&mut buf).map_err(|e| format!("body: {e}"))?;
        if close {
            self.stream = None;
        }
        let v = serde_json::from_slice(&buf).map_err(|e| format!("body is not JSON: {e}"))?;
        Ok((status, v))
    }
}

/// The status, `Content-Length` and whether the server closes after it.
fn read_head(s: &mut BufReader<TcpStream>) -> Result<(u16, usize, bool), String> {
    let mut status = None;
    let mut length = None;
    let mut close = false;
    let mut read = 0usize;
    loop {
        let mut line = String::new();
        let n = s.read_line(&mut line).map_err(|e| format!("head: {e}"))?;
        if n == 0 {
            return Err("connection closed before the answer".into());
        }
        read += n;
        if read > HEAD_MAX {
            return Err("answer head too long".into());
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if status.is_none() {
            status = line.split_whitespace().nth(1).and_then(|c| c.parse().ok());
            continue;
        }
        if let Some((k, v)) = line.split_once(':') {
            let k = k.trim();
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().ok();
            } else if k.eq_ignore_ascii_case("connection") && v.trim().eq_ignore_ascii_case("close")
            {
                close = true;
            } else if k.eq_ignore_ascii_case("transfer-encoding") {
                return Err(format!("unexpected transfer-encoding {v}"));
            }
        }
    }
    let status = status.ok_or("no status line")?;
    Ok((status, length.ok_or("no content-length")?, close))
}

/// The resident set of a process, KiB (`VmRSS` of `/proc/PID/status`).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}
