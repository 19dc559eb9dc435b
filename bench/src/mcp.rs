//! The MCP client of the scenarios, over Streamable HTTP: the HTTP client, a session's
//! handshake (`initialize`, then `notifications/initialized`) at a protocol version of the
//! caller's, and POSTs whose answers are read as JSON or SSE. The soak, which checks every SSE
//! event on its own, has a client of its own. A leaf: it imports no other module.

use std::time::Duration;

use serde_json::{Value, json};

/// The HTTP client of a scenario: many idle connections kept, each request given 10 s.
pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .timeout(Duration::from_secs(10))
        .build()
        .expect("HTTP client")
}

/// Opens a session: `initialize`, then `notifications/initialized`.
pub(crate) async fn initialize(
    http: &reqwest::Client,
    url: &str,
) -> Result<(Option<String>, String), String> {
    let (sid, version) = initialize_request(http, url).await?;
    initialized(http, url, sid.as_deref(), &version).await?;
    Ok((sid, version))
}

/// The `initialize` request alone: the session id, if any, and the negotiated version.
pub(crate) async fn initialize_request(
    http: &reqwest::Client,
    url: &str,
) -> Result<(Option<String>, String), String> {
    initialize_request_as(http, url, "2025-06-18", &json!({})).await
}

/// Opens a session at protocol `version`, declaring `capabilities`.
pub(crate) async fn initialize_as(
    http: &reqwest::Client,
    url: &str,
    version: &str,
    capabilities: &Value,
) -> Result<(Option<String>, String), String> {
    let (sid, version) = initialize_request_as(http, url, version, capabilities).await?;
    initialized(http, url, sid.as_deref(), &version).await?;
    Ok((sid, version))
}

/// [`initialize_request`] at protocol `version`, declaring `capabilities`.
async fn initialize_request_as(
    http: &reqwest::Client,
    url: &str,
    version: &str,
    capabilities: &Value,
) -> Result<(Option<String>, String), String> {
    let r = post(http, url, None, None, &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": capabilities, "clientInfo": {"name": "mcp-bench", "version": "1"}}}))
    .await?;
    // A target without sessions (stateless) gives none.
    let sid = r.0;
    let version =
        r.1.iter()
            .find_map(|m| m["result"]["protocolVersion"].as_str().map(str::to_owned))
            .ok_or("no initialize result")?;
    Ok((sid, version))
}

/// `notifications/initialized`, which ends a session's handshake.
pub(crate) async fn initialized(
    http: &reqwest::Client,
    url: &str,
    sid: Option<&str>,
    version: &str,
) -> Result<(), String> {
    post(
        http,
        url,
        sid,
        Some(version),
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await
    .map(drop)
}

/// One POST; the session id from the response and every JSON-RPC message in it (JSON or SSE).
pub(crate) async fn post(
    http: &reqwest::Client,
    url: &str,
    sid: Option<&str>,
    version: Option<&str>,
    body: &Value,
) -> Result<(Option<String>, Vec<Value>), String> {
    post_body(http, url, sid, version, body.to_string()).await
}

/// [`post`] of a body already written.
pub(crate) async fn post_body(
    http: &reqwest::Client,
    url: &str,
    sid: Option<&str>,
    version: Option<&str>,
    body: String,
) -> Result<(Option<String>, Vec<Value>), String> {
    let mut req = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body);
    if let Some(s) = sid {
        req = req.header("mcp-session-id", s);
    }
    if let Some(v) = version {
        req = req.header("mcp-protocol-version", v);
    }
    send(req).await
}

/// Sends a POST built by the caller: the session id from the response and every JSON-RPC
/// message in it (JSON or SSE).
pub(crate) async fn send(
    req: reqwest::RequestBuilder,
) -> Result<(Option<String>, Vec<Value>), String> {
    let r = req.send().await.map_err(|e| describe(&e))?;
    if !r.status().is_success() {
        return Err(format!("HTTP {}", r.status()));
    }
    let sid = r
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let kind = r
        .headers()
        .get("content-type")
        .map(|v| v.as_bytes().to_vec())
        .unwrap_or_default();
    let sse = kind.starts_with(b"text/event-stream");
    let json = kind.starts_with(b"application/json");
    let text = r.text().await.map_err(|e| describe(&e))?;
    let messages = if sse {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect()
    } else if text.trim().is_empty() || !json {
        // No body, or not JSON-RPC (a 202 with a plain-text word, as some servers send).
        Vec::new()
    } else {
        vec![serde_json::from_str(&text).map_err(|e| e.to_string())?]
    };
    Ok((sid, messages))
}

/// An error with its causes (reqwest's own message alone says only "error sending request"
/// or "error decoding response body").
pub(crate) fn describe(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
