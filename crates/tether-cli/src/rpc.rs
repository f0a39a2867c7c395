//! The JSON-RPC client of the operator commands (`approvals`, `reset`, `arm`,
//! `disarm`): one HTTP/1.1 POST to a running endpoint, with the bearer token
//! taken from the environment.

use anyhow::Context;
use std::io::Write;

/// The operator's token: from `TETHER_TOKEN`, never from a flag (flags show
/// up in process listings).
pub fn operator_token() -> Option<String> {
    std::env::var("TETHER_TOKEN").ok()
}

/// Sends one JSON-RPC request to `endpoint` and parses the answer.
///
/// # Errors
/// The endpoint cannot be reached, serves no JSON-RPC at that path (an
/// endpoint started without `--http`, or the MCP listener), or answers
/// something that is not JSON — each said plainly, with what to do.
pub fn call(
    endpoint: &str,
    request: &serde_json::Value,
    token: Option<&str>,
) -> anyhow::Result<serde_json::Value> {
    let (status, answer) = http_post_json(endpoint, &request.to_string(), token).with_context(|| {
        format!(
            "cannot reach {endpoint}: is `tether serve --http ADDR` running there? (--endpoint or TETHER_ENDPOINT names it)"
        )
    })?;
    if matches!(status, 404 | 405) {
        anyhow::bail!(
            "{endpoint} serves no JSON-RPC (HTTP {status}): start the endpoint with `tether serve --http ADDR` and point --endpoint (or TETHER_ENDPOINT) at http://ADDR/rpc"
        );
    }
    serde_json::from_str(&answer)
        .with_context(|| format!("the answer of {endpoint} (HTTP {status}) is not JSON-RPC"))
}

/// A refusal's message and code, with the missing-token hint when that is
/// the cause.
pub fn refusal_text(error: &serde_json::Value, token: Option<&str>) -> String {
    let code = error["data"]["mhs_code"].as_str().unwrap_or("?");
    let message = error["message"].as_str().unwrap_or("refused");
    let auth = [
        tether_core::Code::AuthUnauthenticated,
        tether_core::Code::AuthForbidden,
    ]
    .iter()
    .any(|c| c.as_str() == code);
    let hint = if token.is_none() && auth {
        " — set TETHER_TOKEN to an operator's token"
    } else {
        ""
    };
    format!("{message} ({code}){hint}")
}

/// A minimal HTTP/1.1 POST on loopback: the CLI needs no TLS stack or HTTP
/// client crate for one request to a local endpoint. Answers the status and
/// the body.
fn http_post_json(url: &str, body: &str, token: Option<&str>) -> anyhow::Result<(u16, String)> {
    use std::io::Read;
    let rest = url
        .strip_prefix("http://")
        .context("only http:// endpoints are supported")?;
    let (host, path) = rest.split_once('/').map_or((rest, ""), |(h, p)| (h, p));
    let mut stream = std::net::TcpStream::connect(host)?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "POST /{path} HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut raw = String::new();
    stream.take(16 << 20).read_to_string(&mut raw)?;
    let (head, payload) = raw
        .split_once("\r\n\r\n")
        .context("malformed HTTP answer")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .context("malformed HTTP status line")?;
    Ok((status, payload.to_owned()))
}
