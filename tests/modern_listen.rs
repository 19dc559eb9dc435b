//! What a 2026-07-28 client hears beyond its answers (issue 22): `subscriptions/listen`
//! streams (acknowledged first, list changes and resource updates as asked, each tagged with
//! the subscription id, a graceful end when the gateway drains), resource subscriptions
//! counted across listeners and legacy sessions (the plugin subscribed by the first holder
//! and unsubscribed by the last), log messages only for requests that opt in and at their
//! level, and a closed response stream cancelling the call at the plugin. Raw HTTP against
//! the in-process gateway and the fixture plugin; the Python SDK's `Client.listen()` is in
//! tests/python_sdk.rs.

mod common;

use std::time::Duration;

use common::admin::{ADMIN_TOKEN, WITH_MAIN_PLUGIN, fixture_plugin};
use common::{Admin, Client, Events, FIXTURE, InProcess, parse_sse};
use serde_json::{Value, json};

const MODERN: &str = "2026-07-28";
const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
const WATCHED: &str = "test://watched-resource";
const STATIC: &str = "test://static-text";

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

/// Opens a listen stream and reads its acknowledgement: the stream and what it honoured.
async fn listen(c: &Client, id: Value, notifications: Value) -> (Events, Value) {
    let r = send(
        c,
        &body(
            id.clone(),
            "subscriptions/listen",
            json!({"notifications": notifications}),
            json!({}),
        ),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut events = Events::new(r);
    let ack = events.next().await.expect("an acknowledgement");
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(ack["params"]["_meta"][SUBSCRIPTION_ID], id, "{ack}");
    (events, ack["params"]["notifications"].clone())
}

/// Asserts `m` is `method` on subscription `id` (about `uri`, for an update).
fn assert_notice(m: &Value, method: &str, id: Value, uri: Option<&str>) {
    assert_eq!(m["method"], method, "{m}");
    assert_eq!(m["params"]["_meta"][SUBSCRIPTION_ID], id, "{m}");
    if let Some(uri) = uri {
        assert_eq!(m["params"]["uri"], uri, "{m}");
    }
}

#[tokio::test]
async fn listeners_hear_list_changes_they_asked_for_and_end_gracefully_on_drain() {
    let gw = InProcess::start(&WITH_MAIN_PLUGIN).await;
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    let c = gw.client();
    let (mut tools, honoured) = listen(&c, json!(1), json!({"toolsListChanged": true})).await;
    assert_eq!(honoured, json!({"toolsListChanged": true}));
    let (mut others, honoured) = listen(
        &c,
        json!("b"),
        json!({"promptsListChanged": true, "resourcesListChanged": true}),
    )
    .await;
    assert_eq!(
        honoured,
        json!({"promptsListChanged": true, "resourcesListChanged": true})
    );
    assert_eq!(
        admin
            .post("/admin/plugins", fixture_plugin("extra"))
            .await
            .0,
        201
    );
    let m = tools.next().await.unwrap();
    assert_notice(&m, "notifications/tools/list_changed", json!(1), None);
    let m = others.next().await.unwrap();
    assert_notice(&m, "notifications/prompts/list_changed", json!("b"), None);
    let m = others.next().await.unwrap();
    assert_notice(&m, "notifications/resources/list_changed", json!("b"), None);

    // The gateway drains: each stream's next message is its listen request's response (so
    // nothing it did not ask for came before), then the stream ends.
    let stopping = tokio::spawn(gw.stop());
    for (events, id) in [(&mut tools, json!(1)), (&mut others, json!("b"))] {
        let end = events.next().await.unwrap();
        assert_eq!(end["id"], id, "{end}");
        assert_eq!(end["result"]["resultType"], "complete", "{end}");
        assert_eq!(end["result"]["_meta"][SUBSCRIPTION_ID], id, "{end}");
        assert!(events.next().await.is_none(), "the stream ends after it");
    }
    stopping.await.unwrap();
}

#[tokio::test]
async fn resource_updates_reach_the_listeners_of_that_uri_only() {
    let gw = InProcess::fixture(&[], &[]).await;
    let c = gw.client();
    let (mut watched, honoured) =
        listen(&c, json!(1), json!({"resourceSubscriptions": [WATCHED]})).await;
    assert_eq!(honoured, json!({"resourceSubscriptions": [WATCHED]}));
    let (mut fixed, _) = listen(&c, json!(2), json!({"resourceSubscriptions": [STATIC]})).await;
    text(&c, "touch_resource", json!({"uri": WATCHED})).await;
    let m = watched.next().await.unwrap();
    assert_notice(
        &m,
        "notifications/resources/updated",
        json!(1),
        Some(WATCHED),
    );
    text(&c, "touch_resource", json!({"uri": STATIC})).await;
    text(&c, "touch_resource", json!({"uri": WATCHED})).await;
    let m = fixed.next().await.unwrap();
    assert_notice(
        &m,
        "notifications/resources/updated",
        json!(2),
        Some(STATIC),
    );
    // The next update the first listener hears is its own URI's again, not the other one.
    let m = watched.next().await.unwrap();
    assert_notice(
        &m,
        "notifications/resources/updated",
        json!(1),
        Some(WATCHED),
    );
    text(&c, "touch_resource", json!({"uri": STATIC})).await;
    let m = fixed.next().await.unwrap();
    assert_eq!(m["params"]["uri"], STATIC, "{m}");

    // A filter that is not one is refused.
    let r = send(
        &c,
        &body(json!(3), "subscriptions/listen", json!({}), json!({})),
    )
    .await;
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], -32602, "{e}");
    gw.stop().await;
}

#[tokio::test]
async fn two_listeners_on_one_uri_subscribe_the_plugin_once_and_unsubscribe_once() {
    // Two listeners per caller at most (as many as one client's sessions).
    let gw = InProcess::fixture(&["--max-sessions-per-client", "2"], &[]).await;
    let c = gw.client();
    let filter = json!({"resourceSubscriptions": [WATCHED]});
    let (first, _) = listen(&c, json!(1), filter.clone()).await;
    let (second, honoured) = listen(&c, json!(2), filter).await;
    assert_eq!(honoured, json!({"resourceSubscriptions": [WATCHED]}));
    assert_eq!(text(&c, "subscriptions", json!({})).await, WATCHED);
    assert_eq!(
        text(&c, "subscription_calls", json!({})).await,
        "subscribe 1 unsubscribe 0"
    );
    // A third listener is over the caller's limit.
    let third = body(
        json!(3),
        "subscriptions/listen",
        json!({"notifications": {"resourceSubscriptions": [STATIC]}}),
        json!({}),
    );
    let r = send(&c, &third).await;
    assert_eq!(r.status(), 429);
    assert!(r.headers().get("retry-after").is_some());
    let refused: Value = r.json().await.unwrap();
    assert_eq!(refused["id"], 3, "the refusal names the request: {refused}");

    // The first listener leaves; once its place is free, the third one gets in.
    drop(first);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let third = loop {
        let r = send(&c, &third).await;
        if r.status() == 200 {
            break Events::new(r);
        }
        assert_eq!(r.status(), 429);
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first listener's place was never freed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // The second still holds the URI: nothing was unsubscribed.
    assert_eq!(
        text(&c, "subscriptions", json!({})).await,
        format!("{STATIC} {WATCHED}")
    );
    assert_eq!(
        text(&c, "subscription_calls", json!({})).await,
        "subscribe 2 unsubscribe 0"
    );
    drop(second);
    drop(third);
    let mut subscribed = String::from("?");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !subscribed.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "still subscribed: {subscribed}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        subscribed = text(&c, "subscriptions", json!({})).await;
    }
    assert_eq!(
        text(&c, "subscription_calls", json!({})).await,
        "subscribe 2 unsubscribe 2"
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_shared_plugins_subscription_is_counted_across_legacy_sessions_and_listeners() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::write_config(
        &dir,
        &format!("[plugins.a]\ncommand = \"{FIXTURE}\"\nprocess_model = \"shared\"\n"),
    );
    let gw = InProcess::start(&["--config", &cfg]).await;
    let mut legacy = gw.client();
    legacy.initialize().await;
    legacy
        .result(1, "resources/subscribe", json!({"uri": WATCHED}))
        .await;
    let modern = gw.client();
    let (mut listener, honoured) = listen(
        &modern,
        json!(1),
        json!({"resourceSubscriptions": [WATCHED]}),
    )
    .await;
    assert_eq!(honoured, json!({"resourceSubscriptions": [WATCHED]}));
    let calls = |id| {
        let legacy = legacy.clone();
        async move { legacy.tool_text(id, "subscription_calls", json!({})).await }
    };
    assert_eq!(calls(2).await, "subscribe 1 unsubscribe 0");
    // The one process is everyone's: a legacy client's touch reaches the listener.
    legacy
        .tool_text(3, "touch_resource", json!({"uri": WATCHED}))
        .await;
    let m = listener.next().await.unwrap();
    assert_notice(
        &m,
        "notifications/resources/updated",
        json!(1),
        Some(WATCHED),
    );
    // The legacy session lets go: the listener still holds it.
    legacy
        .result(4, "resources/unsubscribe", json!({"uri": WATCHED}))
        .await;
    assert_eq!(calls(5).await, "subscribe 1 unsubscribe 0");
    assert_eq!(
        legacy.tool_text(6, "subscriptions", json!({})).await,
        WATCHED
    );
    // ... and holds it again, which the plugin need not hear of either.
    legacy
        .result(7, "resources/subscribe", json!({"uri": WATCHED}))
        .await;
    assert_eq!(calls(8).await, "subscribe 1 unsubscribe 0");
    // The listener goes, then the legacy session lets go: the plugin hears one unsubscribe.
    drop(listener);
    legacy
        .result(9, "resources/unsubscribe", json!({"uri": WATCHED}))
        .await;
    let mut subscribed = String::from("?");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut id = 10;
    while !subscribed.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "still subscribed: {subscribed}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        subscribed = legacy.tool_text(id, "subscriptions", json!({})).await;
        id += 1;
    }
    assert_eq!(calls(id).await, "subscribe 1 unsubscribe 1");
    gw.stop().await;
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
