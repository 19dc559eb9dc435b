//! The modern client: its requests (`_meta` on every one, the headers that mirror the body), the
//! wait until the gateway lists a tool, its answers checked, and (a) driven by it; and what a
//! comparison's clients count besides timed calls ([`Tally`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::{Value, json};

use super::MODERN;
use crate::load::Throughput;

/// What one comparison's clients count besides timed calls: wrong answers by cause, and per
/// side (0 modern, 1 legacy) the calls made, the requests sent, the questions answered and
/// those that were another call's.
pub(super) struct Tally {
    pub(super) causes: Mutex<BTreeMap<String, u64>>,
    pub(super) calls: [AtomicU64; 2],
    pub(super) questions: [AtomicU64; 2],
    pub(super) foreign: [AtomicU64; 2],
    pub(super) requests: [AtomicU64; 2],
    /// By side and leg, in µs: see [`Comparison::modern_legs_p50_ms`].
    pub(super) legs: Mutex<[[Histogram<u64>; 2]; 2]>,
}

impl Default for Tally {
    fn default() -> Tally {
        let h = || Histogram::new(3).expect("histogram");
        Tally {
            causes: Mutex::default(),
            calls: Default::default(),
            questions: Default::default(),
            foreign: Default::default(),
            requests: Default::default(),
            legs: Mutex::new([[h(), h()], [h(), h()]]),
        }
    }
}

impl Tally {
    /// Counts a wrong answer's cause under `side`.
    pub(super) fn wrong(&self, side: usize, cause: String) {
        let name = if side == 0 { "modern" } else { "legacy" };
        *self
            .causes
            .lock()
            .expect("lock")
            .entry(format!("{name}: {cause}"))
            .or_default() += 1;
    }

    /// Records the legs of a call on `side` that started at `start`, was asked at `asked` and
    /// was answered now.
    pub(super) fn legs(&self, side: usize, start: Instant, asked: Instant) {
        let mut legs = self.legs.lock().expect("lock");
        let micros = |d: Duration| d.as_micros() as u64;
        let _ = legs[side][0].record(micros(asked - start));
        let _ = legs[side][1].record(micros(asked.elapsed()));
    }

    /// Counts a question answered on `side` by the call with text `own`.
    pub(super) fn question(&self, side: usize, asked: &str, own: &str) {
        self.questions[side].fetch_add(1, Ordering::Relaxed);
        if asked != own {
            self.foreign[side].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A modern `tools/call` of `tool`: `params` with the `_meta` every request carries, and the
/// headers that mirror the body.
pub(super) fn modern_request(
    http: &reqwest::Client,
    url: &str,
    id: u64,
    tool: &str,
    params: Value,
    capabilities: &Value,
) -> reqwest::RequestBuilder {
    modern_post(
        http,
        url,
        id,
        "tools/call",
        Some(tool),
        params,
        capabilities,
    )
}

/// A modern request of `method`, with `Mcp-Name` when it names a tool.
fn modern_post(
    http: &reqwest::Client,
    url: &str,
    id: u64,
    method: &str,
    name: Option<&str>,
    mut params: Value,
    capabilities: &Value,
) -> reqwest::RequestBuilder {
    params["_meta"] = meta(capabilities);
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    modern_post_body(http, url, method, name, body.to_string())
}

/// The `_meta` every modern request of this client carries.
fn meta(capabilities: &Value) -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "mcp-bench", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    })
}

/// [`modern_post`] of a body already written.
fn modern_post_body(
    http: &reqwest::Client,
    url: &str,
    method: &str,
    name: Option<&str>,
    body: String,
) -> reqwest::RequestBuilder {
    let mut req = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", MODERN)
        .header("mcp-method", method);
    if let Some(name) = name {
        req = req.header("mcp-name", name);
    }
    req.body(body)
}

/// Waits until a modern `tools/list` lists `tool`: a modern call in the first milliseconds
/// of a fresh gateway can be refused as an unknown tool (its first probe of the plugin is
/// reported done before the view with the plugin's tools is published). The legacy client
/// starts once its session is open; the modern one once the gateway knows the tool.
pub(super) async fn wait_for_tool(http: &reqwest::Client, url: &str, tool: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        let req = modern_post(http, url, 0, "tools/list", None, json!({}), &json!({}));
        if let Ok((_, messages)) = crate::mcp::send(req).await
            && messages.iter().any(|m| {
                m["result"]["tools"]
                    .as_array()
                    .is_some_and(|t| t.iter().any(|t| t["name"] == tool))
            })
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the gateway at {url} did not list {tool} within 30 s");
}

/// The one message answering `id` among `messages`.
pub(super) fn answer(messages: &[Value], id: u64) -> Result<&Value, String> {
    messages
        .iter()
        .find(|m| m["id"] == id)
        .ok_or_else(|| "no answer to the call's id".into())
}

/// The text of a complete tool result, or what is wrong with `m`.
pub(super) fn complete_text(m: &Value) -> Result<&str, String> {
    if let Some(e) = m.get("error") {
        return Err(format!("error {} {}", e["code"], e["message"]));
    }
    let r = &m["result"];
    if r["resultType"] != "complete" {
        return Err(format!("resultType {} where complete", r["resultType"]));
    }
    r["content"][0]["text"]
        .as_str()
        .ok_or_else(|| "a result without text".into())
}

/// (a) with a modern client against a target started by hand (`mcp-bench load --modern`).
pub async fn echo_load(url: &str, in_flight: usize, duration: Duration) -> Throughput {
    let tally = Arc::new(Tally::default());
    let t = modern_echo_load(url, in_flight, duration, tally.clone()).await;
    for (cause, n) in tally.causes.lock().expect("lock").iter() {
        eprintln!("wrong: {cause} ({n})");
    }
    t
}

/// (a) with a modern client: `in_flight` workers call `echo` with no session.
pub(super) async fn modern_echo_load(
    url: &str,
    in_flight: usize,
    duration: Duration,
    tally: Arc<Tally>,
) -> Throughput {
    let http = crate::mcp::client();
    wait_for_tool(&http, url, "echo").await;
    // Serialized once: the body of each call is written out as text, as the legacy
    // client's is (`crate::load::echo_call_body`).
    let ctx = Arc::new((http, url.to_owned(), meta(&json!({})).to_string()));
    crate::load::drive(in_flight, duration, move |w, seq| {
        let (ctx, tally) = (ctx.clone(), tally.clone());
        async move {
            let (http, url, meta) = &*ctx;
            let id = (w as u64) << 40 | seq;
            let text = crate::load::echo_text(w, seq);
            let body = crate::load::echo_call_body(id, &text, Some(meta));
            let req = modern_post_body(http, url, "tools/call", Some("echo"), body);
            let checked = match crate::mcp::send(req).await {
                Ok((Some(_), _)) => Err("a session was minted".to_owned()),
                Ok((None, messages)) => answer(&messages, id)
                    .and_then(complete_text)
                    .and_then(|t| (t == text).then_some(()).ok_or("another text".into())),
                Err(e) => Err(e),
            };
            checked.map_err(|e| tally.wrong(0, e)).is_ok()
        }
    })
    .await
}
