//! A session's requests: POST and GET on the gateway, a call and its answer read off its
//! stream, and the three checked calls (`echo`, `burst`, `background_log`).

use std::sync::atomic::Ordering;
use std::time::Instant;

use serde_json::{Value, json};

use super::sse::{EventStream, describe};
use super::stats::Stats;
use super::track::{SessionState, Via};
use super::{BURST, Ctx};

/// A POST's answer: an SSE stream, one JSON body, or nothing (202).
pub(super) enum Posted {
    Stream(EventStream),
    Json(Value),
    Accepted,
}

pub(super) async fn post(
    ctx: &Ctx,
    st: Option<&SessionState>,
    body: &Value,
) -> Result<Posted, String> {
    let mut req = ctx
        .http
        .post(&ctx.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body.to_string());
    if let Some(st) = st {
        req = req
            .header("mcp-session-id", &st.sid)
            .header("mcp-protocol-version", &st.version);
    }
    let r = req.send().await.map_err(|e| describe(&e))?;
    if !r.status().is_success() {
        let status = r.status();
        let text = r.text().await.unwrap_or_default();
        return Err(format!(
            "HTTP {status}: {}",
            text.chars().take(200).collect::<String>()
        ));
    }
    let kind = r
        .headers()
        .get("content-type")
        .map(|v| v.as_bytes().to_vec())
        .unwrap_or_default();
    if kind.starts_with(b"text/event-stream") {
        Ok(Posted::Stream(EventStream::new(r)))
    } else if kind.starts_with(b"application/json") {
        let text = r.text().await.map_err(|e| describe(&e))?;
        serde_json::from_str(&text)
            .map(Posted::Json)
            .map_err(|e| format!("a JSON body that does not parse: {e}"))
    } else {
        Ok(Posted::Accepted)
    }
}

/// A GET on the session: its GET stream, or with `last` the stream that event id names,
/// after it.
pub(super) async fn get(
    ctx: &Ctx,
    client: &reqwest::Client,
    st: &SessionState,
    last: Option<&str>,
) -> Result<EventStream, String> {
    let mut req = client
        .get(&ctx.url)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &st.sid)
        .header("mcp-protocol-version", &st.version);
    if let Some(id) = last {
        req = req.header("last-event-id", id);
    }
    let r = req.send().await.map_err(|e| describe(&e))?;
    if !r.status().is_success() {
        let status = r.status();
        let text = r.text().await.unwrap_or_default();
        return Err(format!(
            "HTTP {status}: {}",
            text.chars().take(200).collect::<String>()
        ));
    }
    Ok(EventStream::new(r))
}

/// Reads a request's stream to its end; its answer, checked in the session's books.
pub(super) async fn answer(
    ctx: &Ctx,
    st: &SessionState,
    es: &mut EventStream,
    id: u64,
    via: Via,
) -> Result<Value, String> {
    let mut answer = None;
    while let Some(ev) = es.next().await? {
        if let Some(v) = st.absorb(&ev, via, &ctx.stats)
            && (v.get("result").is_some() || v.get("error").is_some())
        {
            if v["id"] == id {
                answer = Some(v);
            } else {
                ctx.stats
                    .error("an answer to another request", ev.data.clone());
            }
        }
    }
    answer.ok_or_else(|| "the stream ended without the answer".to_owned())
}

/// Why a call did not give a result.
pub(super) enum CallError {
    /// The request failed (HTTP status, transport).
    Request(String),
    /// The stream ended without the answer: a lost message.
    NoAnswer,
    /// A JSON-RPC error.
    Rpc(String),
}

/// `tools/call` and its answer's result.
pub(super) async fn call(
    ctx: &Ctx,
    st: &SessionState,
    tool: &str,
    args: Value,
) -> Result<Value, CallError> {
    let id = st.id();
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": args}});
    let answer = match post(ctx, Some(st), &body).await {
        Err(e) => return Err(CallError::Request(e)),
        Ok(Posted::Json(v)) => v,
        Ok(Posted::Accepted) => return Err(CallError::NoAnswer),
        Ok(Posted::Stream(mut es)) => {
            let a = answer(ctx, st, &mut es, id, Via::Post).await;
            st.forget_stream(es.last_id.as_deref());
            match a {
                Ok(v) => v,
                Err(e) if e.starts_with("the stream ended") => return Err(CallError::NoAnswer),
                Err(e) => return Err(CallError::Request(e)),
            }
        }
    };
    st.started.store(true, Ordering::Relaxed);
    if let Some(e) = answer.get("error") {
        return Err(CallError::Rpc(
            e["message"].as_str().unwrap_or_default().to_owned(),
        ));
    }
    Ok(answer["result"].clone())
}

pub(super) fn result_text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or_default()
}

/// Counts a call's failure under `what`.
pub(super) fn count_failure(ctx: &Ctx, what: &str, e: CallError) {
    match e {
        CallError::Request(e) => ctx.stats.error(&format!("{what}: request failed"), e),
        CallError::NoAnswer => ctx
            .stats
            .lost(&format!("{what}: no answer"), 1, what.to_owned()),
        CallError::Rpc(m) => ctx.stats.error(&format!("{what}: JSON-RPC error"), m),
    }
}

/// `echo` with a unique text, checked.
pub(super) async fn echo(ctx: &Ctx, st: &SessionState) {
    let text = st.unique("echo");
    let t = Instant::now();
    match call(ctx, st, "echo", json!({"text": text})).await {
        Ok(r) if result_text(&r) == text => {
            ctx.stats.record_latency(t.elapsed());
            Stats::add(&ctx.stats.echo_ok, 1);
        }
        Ok(r) => ctx
            .stats
            .lost("echo: a wrong answer", 1, format!("{text} answered {r}")),
        Err(e) => count_failure(ctx, "echo", e),
    }
}

/// `burst` with a tag: its notifications are checked wherever they arrive.
pub(super) async fn burst(ctx: &Ctx, st: &SessionState) {
    let tag = st.unique("b");
    st.expect_burst(&tag, BURST);
    match call(ctx, st, "burst", json!({"count": BURST, "tag": tag})).await {
        Ok(r) if result_text(&r) == format!("burst of {BURST} done") => {
            Stats::add(&ctx.stats.bursts_ok, 1);
        }
        Ok(r) => ctx.stats.lost("burst: a wrong answer", 1, r.to_string()),
        Err(e) => {
            st.excuse(&tag);
            count_failure(ctx, "burst", e);
        }
    }
}

/// `background_log`: answers at once, logs `after_ms` later.
pub(super) async fn background(ctx: &Ctx, st: &SessionState, after_ms: u64) {
    let text = st.unique("bg");
    st.expect_log(&text);
    match call(
        ctx,
        st,
        "background_log",
        json!({"text": text, "after_ms": after_ms}),
    )
    .await
    {
        Ok(r) if result_text(&r) == "logging later" => {
            Stats::add(&ctx.stats.background_ok, 1);
        }
        Ok(r) => ctx
            .stats
            .lost("background_log: a wrong answer", 1, r.to_string()),
        Err(e) => {
            st.excuse(&text);
            count_failure(ctx, "background_log", e);
        }
    }
}
