//! What a 2026-07-28 client hears beyond its answers (issue 22): log messages only for
//! requests that opt in and at their level, and a closed response stream cancelling the call
//! at the plugin. Raw HTTP against the in-process gateway and the fixture plugin.

mod common;

use std::time::Duration;

use common::{Client, Events, InProcess, parse_sse};
use serde_json::{Value, json};

const MODERN: &str = "2026-07-28";

/// A modern request: `params` with `_meta` (plus `extra_meta`) added.
fn body(id: Value, method: &str, mut params: Value, extra_meta: Value) -> Value {
    let mut meta = json!({
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "listen-test", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    if let Value::Object(extra) = extra_meta {
        meta.as_object_mut().unwrap().extend(extra);
    }
    params["_meta"] = meta;
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

/// POSTs a modern request with the headers a conforming client sends.
async fn send(c: &Client, body: &Value) -> reqwest::Response {
    let params = &body["params"];
    let mut r = c
        .request(reqwest::Method::POST)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", MODERN)
        .header("mcp-method", body["method"].as_str().unwrap());
    if let Some(name) = params["name"].as_str().or(params["uri"].as_str()) {
        r = r.header("mcp-name", name);
    }
    r.body(body.to_string()).send().await.expect("POST")
}

/// Every JSON-RPC message of a finished answer (JSON, or an SSE stream).
async fn messages(r: reqwest::Response) -> Vec<Value> {
    let sse = r
        .headers()
        .get("content-type")
        .is_some_and(|v| v.to_str().unwrap().starts_with("text/event-stream"));
    let text = r.text().await.unwrap();
    if sse {
        parse_sse(&text)
            .into_iter()
            .filter_map(|e| serde_json::from_str(&e.data).ok())
            .collect()
    } else {
        vec![serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))]
    }
}

/// Calls a tool as a modern client (with `extra_meta`); every message of the answer.
async fn call(c: &Client, name: &str, arguments: Value, extra_meta: Value) -> Vec<Value> {
    let b = body(
        json!(1),
        "tools/call",
        json!({"name": name, "arguments": arguments}),
        extra_meta,
    );
    messages(send(c, &b).await).await
}

/// The text of a modern tool call's result.
async fn text(c: &Client, name: &str, arguments: Value) -> String {
    let all = call(c, name, arguments, json!({})).await;
    let last = all.last().unwrap();
    last["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text in {last}"))
        .to_owned()
}

/// The `notifications/message` among an answer's messages.
fn logs(all: &[Value]) -> Vec<&Value> {
    all.iter()
        .filter(|m| m["method"] == "notifications/message")
        .collect()
}

#[tokio::test]
async fn log_messages_reach_only_requests_that_opt_in_at_their_level() {
    let gw = InProcess::fixture(&[], &[]).await;
    let c = gw.client();
    let level = |l: &str| json!({"io.modelcontextprotocol/logLevel": l});
    let said = |all: &[Value]| -> Vec<String> {
        logs(all)
            .iter()
            .map(|m| m["params"]["data"].as_str().unwrap().to_owned())
            .collect()
    };
    // The plugin logs whatever it was asked (`log_at` does not filter its own logs).
    let all = call(
        &c,
        "log_at",
        json!({"level": "error", "text": "unasked"}),
        json!({}),
    )
    .await;
    assert_eq!(all.last().unwrap()["result"]["resultType"], "complete");
    assert!(said(&all).is_empty(), "no opt-in, no logs: {all:?}");
    let all = call(
        &c,
        "log_at",
        json!({"level": "info", "text": "below"}),
        level("warning"),
    )
    .await;
    assert!(said(&all).is_empty(), "below the level asked: {all:?}");
    let all = call(
        &c,
        "log_at",
        json!({"level": "error", "text": "above"}),
        level("warning"),
    )
    .await;
    assert_eq!(said(&all), ["above"], "{all:?}");
    assert_eq!(logs(&all)[0]["params"]["level"], "error");
    // A log comes before its request's answer, on that request's stream.
    assert!(all.last().unwrap().get("result").is_some());
    let all = call(&c, "test_tool_with_logging", json!({}), level("debug")).await;
    assert_eq!(
        said(&all),
        [
            "Tool execution started",
            "Tool processing data",
            "Tool execution completed"
        ]
    );
    // The caller's instance was asked for the most verbose level any request wanted.
    assert_eq!(text(&c, "log_level", json!({})).await, "debug");
    gw.stop().await;
}

/// Calls `slow` with a progress token and returns its stream once the plugin has begun it
/// (its first progress came).
async fn slow_call_begun(c: &Client) -> Events {
    let b = body(
        json!(7),
        "tools/call",
        json!({"name": "slow", "arguments": {"ms": 60000}}),
        json!({"progressToken": "p"}),
    );
    let mut events = Events::new(send(c, &b).await);
    let m = events.next().await.unwrap();
    assert_eq!(m["method"], "notifications/progress", "{m}");
    events
}

#[tokio::test]
async fn a_closed_response_stream_cancels_the_call_at_the_plugin() {
    let gw = InProcess::fixture(&[], &[]).await;
    let c = gw.client();
    let stream = slow_call_begun(&c).await;
    assert_eq!(text(&c, "cancellations", json!({})).await, "0");
    drop(stream);
    wait_until_cancelled(&c).await;
    // The instance goes on serving.
    assert_eq!(text(&c, "echo", json!({"text": "after"})).await, "after");
    gw.stop().await;
}

#[tokio::test]
async fn a_closed_json_answer_cancels_the_call_at_the_plugin() {
    let gw = InProcess::fixture(&["--response-mode", "json"], &[]).await;
    let c = gw.client();
    let b = body(
        json!(7),
        "tools/call",
        json!({"name": "slow", "arguments": {"ms": 60000}}),
        json!({}),
    );
    // The client gives up on its answer (a JSON answer has no stream to show progress on,
    // so it waits until the call is surely at the plugin).
    let waited = tokio::time::timeout(Duration::from_secs(1), send(&c, &b)).await;
    assert!(waited.is_err(), "the slow call answered: {waited:?}");
    wait_until_cancelled(&c).await;
    gw.stop().await;
}

/// Waits until the fixture says its slow call was cancelled.
async fn wait_until_cancelled(c: &Client) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while text(c, "cancellations", json!({})).await != "1" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the plugin was never told"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
