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
pub fn call(
    endpoint: &str,
    request: &serde_json::Value,
    token: Option<&str>,
) -> anyhow::Result<serde_json::Value> {
    let answer = http_post_json(endpoint, &request.to_string(), token)
        .with_context(|| format!("asking {endpoint}"))?;
    serde_json::from_str(&answer).context("the endpoint's answer is not JSON")
}

/// A minimal HTTP/1.1 POST on loopback: the CLI needs no TLS stack or HTTP
/// client crate for one request to a local endpoint.
fn http_post_json(url: &str, body: &str, token: Option<&str>) -> anyhow::Result<String> {
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
    let (_, payload) = raw
        .split_once("\r\n\r\n")
        .context("malformed HTTP answer")?;
    Ok(payload.to_owned())
}
