//! The round trip of a plugin's question to its client, as a modern client makes it (an
//! `InputRequiredResult`, then the retry with the answers) and as a legacy session does (the
//! question on the call's SSE stream, the answer in a POST of its own).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::LEGACY;
use super::client::{Tally, answer, complete_text, modern_request, wait_for_tool};
use crate::load::Throughput;

/// What the plugin asks its client in a round trip, the call's text in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Question {
    /// The `ask` tool: `elicitation/create`, the text as its message.
    Elicit,
    /// The `sample` tool: `sampling/createMessage`, the text as its prompt.
    Sample,
}

impl Question {
    fn tool(self) -> &'static str {
        match self {
            Question::Elicit => "ask",
            Question::Sample => "sample",
        }
    }

    fn arguments(self, text: &str) -> Value {
        match self {
            Question::Elicit => json!({"text": text}),
            Question::Sample => json!({"prompt": text}),
        }
    }

    /// The client capability the question needs.
    fn capabilities(self) -> Value {
        match self {
            Question::Elicit => json!({"elicitation": {}}),
            Question::Sample => json!({"sampling": {}}),
        }
    }

    /// The text `request` asks, if it is this question's request.
    fn asked(self, request: &Value) -> Result<&str, String> {
        let (method, text) = match self {
            Question::Elicit => ("elicitation/create", &request["params"]["message"]),
            Question::Sample => (
                "sampling/createMessage",
                &request["params"]["messages"][0]["content"]["text"],
            ),
        };
        if request["method"] != method {
            return Err(format!("{} where {method}", request["method"]));
        }
        text.as_str()
            .ok_or_else(|| format!("{method} without its text"))
    }

    /// The client's result for a request that asked `asked`.
    fn answer(self, asked: &str) -> Value {
        let reply = reply_to(asked);
        match self {
            Question::Elicit => json!({"action": "accept", "content": {"answer": reply}}),
            Question::Sample => json!({
                "role": "assistant",
                "content": {"type": "text", "text": reply},
                "model": "mcp-bench",
                "stopReason": "endTurn",
            }),
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Client {
    Modern,
    Legacy,
}

/// The round trip of `question`: `in_flight` workers, each exchange timed whole. A legacy
/// client uses one session, which declares the capability it needs; a modern one declares it
/// on every request.
pub(super) async fn ask_load(
    client: Client,
    question: Question,
    url: &str,
    in_flight: usize,
    duration: Duration,
    tally: Arc<Tally>,
) -> Throughput {
    let http = crate::mcp::client();
    let capabilities = question.capabilities();
    let session = match client {
        Client::Modern => {
            wait_for_tool(&http, url, question.tool()).await;
            None
        }
        Client::Legacy => Some(
            crate::mcp::initialize_as(&http, url, LEGACY, &capabilities)
                .await
                .expect("a session opens"),
        ),
    };
    let ctx = Arc::new((http, url.to_owned(), capabilities, session));
    let calls = ctx.clone();
    let t = crate::load::drive(in_flight, duration, move |w, seq| {
        let (ctx, tally) = (calls.clone(), tally.clone());
        async move {
            let (http, url, capabilities, session) = &*ctx;
            let id = (w as u64) << 40 | seq;
            let text = crate::load::echo_text(w, seq);
            tally.calls[usize::from(session.is_some())].fetch_add(1, Ordering::Relaxed);
            let (side, checked) = match session {
                None => (
                    0,
                    modern_ask(http, url, question, id, &text, capabilities, &tally).await,
                ),
                Some((sid, version)) => (
                    1,
                    legacy_ask(
                        http,
                        url,
                        sid.as_deref(),
                        version,
                        question,
                        id,
                        &text,
                        &tally,
                    )
                    .await,
                ),
            };
            checked.map_err(|e| tally.wrong(side, e)).is_ok()
        }
    })
    .await;
    let (http, url, _, session) = &*ctx;
    if let Some((Some(sid), _)) = session {
        let _ = http.delete(url).header("mcp-session-id", sid).send().await;
    }
    t
}

/// The answer the client gives to the plugin's question `text`, and the text the call that
/// asked it must then answer with.
fn reply_to(text: &str) -> String {
    format!("re:{text}")
}

/// Rounds a call may take before it counts as wrong.
const MAX_ROUNDS: u64 = 64;

/// One modern exchange: the call, an `InputRequiredResult`, the retry with the answers and
/// the state, and so on until the result. Request `r` of the call has id `64 * id + r`.
async fn modern_ask(
    http: &reqwest::Client,
    url: &str,
    question: Question,
    id: u64,
    text: &str,
    capabilities: &Value,
    tally: &Tally,
) -> Result<(), String> {
    let (tool, arguments) = (question.tool(), question.arguments(text));
    let mut params = json!({"name": tool, "arguments": arguments});
    let start = Instant::now();
    // When the call was asked its own question, if that was all it was asked.
    let mut asked_own = None;
    for round in 0..MAX_ROUNDS {
        let request_id = MAX_ROUNDS * id + round;
        let req = modern_request(http, url, request_id, tool, params, capabilities);
        tally.requests[0].fetch_add(1, Ordering::Relaxed);
        let (_, messages) = crate::mcp::send(req).await?;
        let m = answer(&messages, request_id)?;
        let r = &m["result"];
        if r["resultType"] != "input_required" {
            if complete_text(m)? != reply_to(text) {
                return Err("the result is not the answer to the call's question".into());
            }
            if let (1, Some(asked)) = (round, asked_own) {
                tally.legs(0, start, asked);
            }
            return Ok(());
        }
        let mut responses = serde_json::Map::new();
        if let Some(requests) = r.get("inputRequests") {
            let requests = requests.as_object().ok_or("inputRequests not an object")?;
            if round == 0
                && requests.len() == 1
                && requests.values().next().map(|r| question.asked(r)) == Some(Ok(text))
            {
                asked_own = Some(Instant::now());
            }
            for (key, request) in requests {
                let asked = question.asked(request)?;
                tally.question(0, asked, text);
                responses.insert(key.clone(), question.answer(asked));
            }
        }
        if responses.is_empty() && r.get("requestState").is_none() {
            return Err("an InputRequiredResult with neither requests nor state".into());
        }
        params = json!({"name": tool, "arguments": arguments, "inputResponses": responses});
        if let Some(state) = r.get("requestState") {
            params["requestState"] = state.clone();
        }
    }
    Err(format!("more than {MAX_ROUNDS} rounds"))
}

/// One legacy exchange: the call's POST answers with an SSE stream; the plugin's questions
/// come on it, each answer goes in a POST of its own, and the result comes on the stream.
#[allow(clippy::too_many_arguments)]
async fn legacy_ask(
    http: &reqwest::Client,
    url: &str,
    sid: Option<&str>,
    version: &str,
    question: Question,
    id: u64,
    text: &str,
    tally: &Tally,
) -> Result<(), String> {
    let params = json!({"name": question.tool(), "arguments": question.arguments(text)});
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params});
    let mut req = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", version)
        .body(body.to_string());
    if let Some(sid) = sid {
        req = req.header("mcp-session-id", sid);
    }
    tally.requests[1].fetch_add(1, Ordering::Relaxed);
    let start = Instant::now();
    let r = req.send().await.map_err(|e| crate::mcp::describe(&e))?;
    if !r.status().is_success() {
        return Err(format!("HTTP {}", r.status()));
    }
    if !r
        .headers()
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
    {
        return Err("the call's answer is not an SSE stream".into());
    }
    let mut stream = Sse::new(r);
    // When the call's own question came, if it came first.
    let mut asked_own = None;
    let mut questions = 0;
    while let Some(m) = stream.next().await? {
        if m.get("method").is_some() && m.get("id").is_some() {
            let asked = question.asked(&m)?;
            questions += 1;
            if questions == 1 && asked == text {
                asked_own = Some(Instant::now());
            }
            tally.question(1, asked, text);
            let response =
                json!({"jsonrpc": "2.0", "id": m["id"], "result": question.answer(asked)});
            tally.requests[1].fetch_add(1, Ordering::Relaxed);
            crate::mcp::post(http, url, sid, Some(version), &response).await?;
        } else if m["id"] == id {
            if complete_text_legacy(&m)? != reply_to(text) {
                return Err("the result is not the answer to the call's question".into());
            }
            if let (1, Some(asked)) = (questions, asked_own) {
                tally.legs(1, start, asked);
            }
            return Ok(());
        }
    }
    Err("the stream ended without the result".into())
}

/// The text of a legacy tool result (no `resultType`).
fn complete_text_legacy(m: &Value) -> Result<&str, String> {
    if let Some(e) = m.get("error") {
        return Err(format!("error {} {}", e["code"], e["message"]));
    }
    m["result"]["content"][0]["text"]
        .as_str()
        .ok_or_else(|| "a result without text".into())
}

/// JSON-RPC messages from an SSE response as they come (events without data, such as the
/// priming event, are skipped).
struct Sse {
    response: reqwest::Response,
    buffer: Vec<u8>,
}

impl Sse {
    fn new(response: reqwest::Response) -> Sse {
        Sse {
            response,
            buffer: Vec::new(),
        }
    }

    async fn next(&mut self) -> Result<Option<Value>, String> {
        loop {
            while let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                let event: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let data: Vec<&[u8]> = event
                    .split(|b| *b == b'\n')
                    .filter_map(|l| l.strip_prefix(b"data:"))
                    .map(|d| d.strip_prefix(b" ").unwrap_or(d))
                    .collect();
                let data = data.join(&b'\n');
                if data.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return serde_json::from_slice(&data)
                    .map(Some)
                    .map_err(|e| format!("an event that is not JSON: {e}"));
            }
            match self
                .response
                .chunk()
                .await
                .map_err(|e| crate::mcp::describe(&e))?
            {
                Some(chunk) => self.buffer.extend_from_slice(&chunk),
                None => return Ok(None),
            }
        }
    }
}
