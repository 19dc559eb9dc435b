//! The load generator: workers that call `echo` one after another for a scenario's time, every
//! answer checked and the right ones timed, into a [`Throughput`]; over HTTP sessions
//! ([`http_load`]) or straight down the echo plugin's pipes ([`pipes_load`]). Its calls are
//! written out as text, not built as JSON trees: it shares the cores with what it measures.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use crate::harness::sibling;
use crate::mcp::{client, initialize, post_body};

/// (a) or (b) on one target: calls answered right per second, and their latency.
#[derive(Debug, Default, Serialize, Clone)]
pub(crate) struct Throughput {
    pub(crate) calls_per_sec: f64,
    pub(crate) ok: u64,
    pub(crate) wrong: u64,
    pub(crate) p50_ms: f64,
    pub(crate) p90_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) max_ms: f64,
}

/// `in_flight` workers over `sessions` sessions call `echo` for `duration`; every answer is
/// checked.
pub(crate) async fn http_load(
    url: &str,
    call_url: Option<&str>,
    sessions: usize,
    in_flight: usize,
    duration: Duration,
) -> Throughput {
    let http = client();
    let mut opened = Vec::new();
    for _ in 0..sessions {
        opened.push(initialize(&http, url).await.expect("a session opens"));
    }
    // Calls may go elsewhere than where the sessions opened (another replica, to measure or
    // profile the forward to the owner).
    let ctx = Arc::new((http, call_url.unwrap_or(url).to_owned(), opened));
    let calls = ctx.clone();
    let t = drive(in_flight, duration, move |w, seq| {
        let ctx = calls.clone();
        async move {
            let (http, url, opened) = &*ctx;
            let (sid, version) = &opened[w % opened.len()];
            // Unique in the session: JSON-RPC forbids reusing an id there.
            let id = (w as u64) << 40 | seq;
            let text = echo_text(w, seq);
            let body = echo_call_body(id, &text, None);
            match post_body(http, url, sid.as_deref(), Some(version), body).await {
                Ok((_, messages)) => messages
                    .iter()
                    .any(|m| m["id"] == id && m["result"]["content"][0]["text"] == text.as_str()),
                Err(_) => false,
            }
        }
    })
    .await;
    let (http, url, opened) = &*ctx;
    for sid in opened.iter().filter_map(|(sid, _)| sid.as_ref()) {
        let _ = http.delete(url).header("mcp-session-id", sid).send().await;
    }
    t
}

/// The body of call `id` of `echo` with `text`, written out as text: the load generator
/// shares the cores with what it measures, so it builds no JSON tree per call, in either era.
/// `meta` (a modern request's `_meta`, serialized once per run) ends the params.
pub(crate) fn echo_call_body(id: u64, text: &str, meta: Option<&str>) -> String {
    let text = serde_json::to_string(text).expect("a string");
    let mut body = String::with_capacity(96 + text.len() + meta.map_or(0, |m| m.len() + 9));
    body.push_str(r#"{"jsonrpc":"2.0","id":"#);
    body.push_str(&id.to_string());
    body.push_str(r#","method":"tools/call","params":{"name":"echo","arguments":{"text":"#);
    body.push_str(&text);
    body.push('}');
    if let Some(meta) = meta {
        body.push_str(r#","_meta":"#);
        body.push_str(meta);
    }
    body.push_str("}}");
    body
}

/// The 64-byte text of worker `w`'s call `seq`, unique in the run.
pub(crate) fn echo_text(w: usize, seq: u64) -> String {
    format!("{w:04}-{seq:012}-{}", "x".repeat(64 - 18))
}

/// `in_flight` workers each make `call(worker, seq)` (`seq` counting from 1) one after another
/// for `duration`; `call` says whether its answer was right, and the right ones are timed.
/// The clock starts once every worker's first call is answered: by then each session's plugin
/// process has started and each connection is open. Those one-time costs are what (d)
/// measures; a throughput scenario measures the steady state.
pub(crate) async fn drive<C, F>(in_flight: usize, duration: Duration, call: C) -> Throughput
where
    C: Fn(usize, u64) -> F + Send + Sync + 'static,
    F: Future<Output = bool> + Send + 'static,
{
    let call = Arc::new(call);
    let wrong = Arc::new(AtomicU64::new(0));
    let warmed = Arc::new(tokio::sync::Barrier::new(in_flight + 1));
    let (start, deadline) = tokio::sync::watch::channel(None::<Instant>);
    let workers: Vec<_> = (0..in_flight)
        .map(|w| {
            let (call, wrong) = (call.clone(), wrong.clone());
            let (warmed, mut deadline) = (warmed.clone(), deadline.clone());
            tokio::spawn(async move {
                let mut hist = Histogram::<u64>::new(3).expect("histogram");
                let mut seq = 0u64;
                let mut next = || {
                    seq += 1;
                    call(w, seq)
                };
                if !next().await {
                    wrong.fetch_add(1, Ordering::Relaxed);
                }
                warmed.wait().await;
                let deadline = deadline
                    .wait_for(Option::is_some)
                    .await
                    .map(|d| d.expect("waited for"))
                    .expect("the sender outlives the workers");
                while Instant::now() < deadline {
                    let t = Instant::now();
                    if next().await {
                        hist.record(t.elapsed().as_micros() as u64)
                            .expect("in range");
                    } else {
                        wrong.fetch_add(1, Ordering::Relaxed);
                    }
                }
                hist
            })
        })
        .collect();
    warmed.wait().await;
    start.send_replace(Some(Instant::now() + duration));
    let mut all = Histogram::<u64>::new(3).expect("histogram");
    for w in workers {
        all.add(w.await.expect("worker")).expect("same bounds");
    }
    // Calls per second of the scenario's own time: waiting out a target's hung requests
    // afterwards does not count (they are counted as wrong).
    throughput(&all, wrong.load(Ordering::Relaxed), duration)
}

/// The [`Throughput`] of the calls timed in `h` over `elapsed`, `wrong` of them wrong.
pub(crate) fn throughput(h: &Histogram<u64>, wrong: u64, elapsed: Duration) -> Throughput {
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    Throughput {
        calls_per_sec: h.len() as f64 / elapsed.as_secs_f64(),
        ok: h.len(),
        wrong,
        p50_ms: ms(0.5),
        p90_ms: ms(0.9),
        p99_ms: ms(0.99),
        max_ms: h.max() as f64 / 1000.0,
    }
}

/// The echo plugin driven directly over its pipes, `in_flight` requests outstanding.
pub(crate) async fn pipes_load(in_flight: usize, duration: Duration) -> Throughput {
    let mut child = Command::new(sibling("bench-echo-plugin"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the plugin");
    let mut stdin = child.stdin.take().expect("piped");
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    stdin
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{},\"clientInfo\":{\"name\":\"b\",\"version\":\"1\"}}}\n")
        .await
        .expect("write");
    lines
        .next_line()
        .await
        .expect("read")
        .expect("initialize answer");
    let sent = Arc::new(std::sync::Mutex::new(std::collections::HashMap::<
        u64,
        Instant,
    >::new()));
    let permits = Arc::new(tokio::sync::Semaphore::new(in_flight));
    let deadline = Instant::now() + duration;
    let started = Instant::now();
    let writer = {
        let (sent, permits) = (sent.clone(), permits.clone());
        tokio::spawn(async move {
            let mut id = 0u64;
            while Instant::now() < deadline {
                permits.acquire().await.expect("open").forget();
                id += 1;
                let text = format!("{id:016}-{}", "x".repeat(64 - 17));
                let line = format!(
                    "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{\"name\":\"echo\",\"arguments\":{{\"text\":\"{text}\"}}}}}}\n"
                );
                sent.lock().expect("lock").insert(id, Instant::now());
                if stdin.write_all(line.as_bytes()).await.is_err() {
                    break;
                }
            }
            id
        })
    };
    let mut hist = Histogram::<u64>::new(3).expect("histogram");
    let mut wrong = 0;
    while Instant::now() < deadline {
        let Ok(Ok(Some(line))) =
            tokio::time::timeout(Duration::from_secs(1), lines.next_line()).await
        else {
            break;
        };
        let v: Value = serde_json::from_str(&line).unwrap_or_default();
        let id = v["id"].as_u64().unwrap_or(0);
        match sent.lock().expect("lock").remove(&id) {
            Some(t)
                if v["result"]["content"][0]["text"]
                    .as_str()
                    .is_some_and(|s| s.starts_with(&format!("{id:016}-"))) =>
            {
                hist.record(t.elapsed().as_micros() as u64)
                    .expect("in range");
            }
            _ => wrong += 1,
        }
        permits.add_permits(1);
    }
    let elapsed = started.elapsed();
    writer.abort();
    throughput(&hist, wrong, elapsed)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_echo_call_written_as_text_is_the_call_as_json() {
        let text = echo_text(3, 7);
        let legacy: Value = serde_json::from_str(&echo_call_body(9, &text, None)).unwrap();
        assert_eq!(
            legacy,
            json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": text}}})
        );
        let meta = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}"#;
        let modern: Value = serde_json::from_str(&echo_call_body(9, "a\"b", Some(meta))).unwrap();
        assert_eq!(modern["params"]["arguments"]["text"], "a\"b");
        assert_eq!(
            modern["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"],
            "2026-07-28"
        );
    }
}
