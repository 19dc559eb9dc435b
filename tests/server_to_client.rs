//! What plugins send on their own: requests to the client (sampling, elicitation, roots),
//! progress and logs, list changes. Each reaches the client on exactly one stream: the POST
//! stream of the related request while it is open, else the GET stream; the client's answers
//! go back to the plugin that asked. Served in the test's process; the two checks that wait on
//! the gateway's log are in `server_to_client_process.rs`.

mod common;

use common::{Client, Events, InProcess};
use serde_json::{Value, json};

#[tokio::test]
async fn sampling_round_trip_on_the_call_stream() {
    let gw = InProcess::fixture(&[], &[]).await;
    let mut c = gw.client();
    c.initialize().await;
    let mut events = c
        .stream(&json!({"jsonrpc": "2.0", "id": "call-1", "method": "tools/call", "params": {"name": "test_sampling", "arguments": {"prompt": "2+2?"}}}))
        .await;
    let request = events.next().await.unwrap();
    assert_eq!(request["method"], "sampling/createMessage");
    assert_eq!(request["params"]["messages"][0]["content"]["text"], "2+2?");
    let id = request["id"].clone();
    // The client answers with a POST of its own: 202.
    let r = c
        .post(&json!({"jsonrpc": "2.0", "id": id, "result": {"role": "assistant", "content": {"type": "text", "text": "4"}, "model": "m"}}))
        .await;
    assert_eq!(r.status, 202);
    let response = events.next().await.unwrap();
    assert_eq!(response["id"], "call-1");
    assert_eq!(response["result"]["content"][0]["text"], "LLM response: 4");
    assert!(
        events.next().await.is_none(),
        "the stream closes after the response"
    );
    // The same answer again is for nobody.
    let again = c
        .post(&json!({"jsonrpc": "2.0", "id": id, "result": {}}))
        .await;
    assert_eq!(again.status, 400);
    gw.stop().await;
}

#[tokio::test]
async fn client_errors_and_roots_travel_back() {
    let gw = InProcess::fixture(&[], &[]).await;
    let mut c = gw.client();
    c.initialize().await;
    let mut events = c
        .stream(&json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "roots", "arguments": {}}}))
        .await;
    let request = events.next().await.unwrap();
    assert_eq!(request["method"], "roots/list");
    let r = c
        .post(&json!({"jsonrpc": "2.0", "id": request["id"], "result": {"roots": [{"uri": "file:///work", "name": "work"}]}}))
        .await;
    assert_eq!(r.status, 202);
    let response = events.next().await.unwrap();
    assert!(
        response["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("file:///work")
    );

    let mut events = c
        .stream(&json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "test_elicitation", "arguments": {"message": "who?"}}}))
        .await;
    let request = events.next().await.unwrap();
    assert_eq!(request["method"], "elicitation/create");
    let r = c
        .post(&json!({"jsonrpc": "2.0", "id": request["id"], "error": {"code": -1, "message": "user declined"}}))
        .await;
    assert_eq!(r.status, 202);
    let response = events.next().await.unwrap();
    assert_eq!(response["id"], 6);
    assert!(
        response["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("User response")
    );
    gw.stop().await;
}

#[tokio::test]
async fn logs_and_progress_go_on_the_call_stream_list_changes_on_the_get_stream() {
    let gw = InProcess::fixture(&[], &[]).await;
    let mut c = gw.client();
    c.initialize().await;
    let get = c.get_stream().await;
    assert_eq!(get.status(), 200);
    let mut get = Events::new(get);

    let r = c
        .call(
            1,
            "tools/call",
            json!({"name": "test_tool_with_progress", "_meta": {"progressToken": "p-1"}}),
        )
        .await;
    let progress: Vec<_> = r
        .messages
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .collect();
    assert_eq!(progress.len(), 3, "{r:?}");
    assert!(
        progress
            .iter()
            .all(|m| m["params"]["progressToken"] == "p-1"),
        "the client's own token comes back"
    );
    let r = c
        .call(2, "tools/call", json!({"name": "test_tool_with_logging"}))
        .await;
    assert_eq!(
        r.messages
            .iter()
            .filter(|m| m["method"] == "notifications/message")
            .count(),
        3
    );

    let r = c
        .call(3, "tools/call", json!({"name": "notify_changed"}))
        .await;
    assert!(
        r.messages
            .iter()
            .all(|m| m["method"] != "notifications/tools/list_changed"),
        "list changes are not related to the call: {r:?}"
    );
    let changed = get.next().await.unwrap();
    assert_eq!(changed["method"], "notifications/tools/list_changed");
    gw.stop().await;
}

#[tokio::test]
async fn messages_wait_for_a_get_stream_when_none_is_open() {
    let gw = InProcess::fixture(&[], &[]).await;
    let mut c = gw.client();
    c.initialize().await;
    c.tool_text(1, "notify_changed", json!({})).await;
    let mut get = Events::new(c.get_stream().await);
    assert_eq!(
        get.next().await.unwrap()["method"],
        "notifications/tools/list_changed"
    );
    gw.stop().await;
}

#[tokio::test]
async fn json_response_mode_sends_one_body_and_the_rest_on_get() {
    let gw = InProcess::fixture(&["--response-mode", "json"], &[]).await;
    let mut c = gw.client();
    c.initialize().await;
    let mut get = Events::new(c.get_stream().await);
    let r = c
        .call(
            1,
            "tools/call",
            json!({"name": "test_tool_with_progress", "_meta": {"progressToken": 9}}),
        )
        .await;
    assert!(r.content_type().starts_with("application/json"), "{r:?}");
    assert_eq!(r.messages.len(), 1);
    assert_eq!(
        r.last()["result"]["content"][0]["text"],
        "Progress tool completed"
    );
    for _ in 0..3 {
        let p = get.next().await.unwrap();
        assert_eq!(p["method"], "notifications/progress");
        assert_eq!(p["params"]["progressToken"], 9);
    }
    gw.stop().await;
}

#[tokio::test]
async fn concurrent_calls_each_get_their_own_answer() {
    // Three calls in flight on one plugin, each asking the client for a sample. Stdio does not
    // say which call a plugin request belongs to, so the gateway may carry a request on the
    // GET stream; what must hold is that each request reaches the client exactly once and each
    // call ends with the answer to its own question.
    let gw = InProcess::fixture(&[], &[]).await;
    let mut c = gw.client();
    c.initialize().await;
    let (asks_tx, mut asks_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut get = Events::new(c.get_stream().await);
    let tx = asks_tx.clone();
    tokio::spawn(async move {
        while let Some(m) = get.next().await {
            if m["method"] == "sampling/createMessage" {
                let _ = tx.send(m);
            }
        }
    });
    let mut calls = Vec::new();
    for i in 0..3 {
        let mut s = c
            .stream(&json!({"jsonrpc": "2.0", "id": 1000 + i, "method": "tools/call", "params": {"name": "test_sampling", "arguments": {"prompt": format!("q{i}")}}}))
            .await;
        let tx = asks_tx.clone();
        calls.push(tokio::spawn(async move {
            while let Some(m) = s.next().await {
                if m["method"] == "sampling/createMessage" {
                    let _ = tx.send(m);
                } else if m.get("result").is_some() || m.get("error").is_some() {
                    return m;
                }
            }
            panic!("stream {i} ended without its response");
        }));
    }
    let mut seen = std::collections::HashSet::new();
    for _ in 0..3 {
        let ask = tokio::time::timeout(std::time::Duration::from_secs(20), asks_rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(
            seen.insert(ask["id"].to_string()),
            "a request delivered twice: {ask}"
        );
        let q = ask["params"]["messages"][0]["content"]["text"]
            .as_str()
            .unwrap()
            .to_owned();
        let r = c
            .post(&json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"role": "assistant", "content": {"type": "text", "text": format!("a-{q}")}, "model": "m"}}))
            .await;
        assert_eq!(r.status, 202);
    }
    for (i, call) in calls.into_iter().enumerate() {
        let done = call.await.unwrap();
        assert_eq!(done["id"], 1000 + i as i64);
        assert_eq!(
            done["result"]["content"][0]["text"],
            format!("LLM response: a-q{i}")
        );
    }
    assert!(asks_rx.try_recv().is_err(), "no request delivered twice");
    gw.stop().await;
}

/// The `notifications/message` texts of a reply.
fn logs(r: &common::Reply) -> Vec<String> {
    r.messages
        .iter()
        .filter(|m| m["method"] == "notifications/message")
        .map(|m| m["params"]["data"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn regression_a_log_level_set_before_a_plugin_starts_holds_for_every_instance() {
    // Guards: `logging/setLevel` sent before the session's plugin instance started was lost:
    // the client asked for `error` and then got `info` messages.
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::write_config(
        &dir,
        &format!(
            "[plugins.own]\ncommand = \"{}\"\n[plugins.warmed]\ncommand = \"{}\"\nwarm = 1\n",
            common::FIXTURE,
            common::FIXTURE
        ),
    );
    let gw = InProcess::start(&["--config", &cfg]).await;
    let mut c = gw.client();
    c.initialize().await;
    let r = c
        .call(1, "logging/setLevel", json!({"level": "error"}))
        .await;
    assert!(r.last().get("result").is_some(), "{r:?}");
    for plugin in ["own", "warmed"] {
        // The first call starts the instance (the warm one is taken from its pool): the level
        // reached the plugin before the call did...
        let tool = format!("{plugin}__log_level");
        assert_eq!(c.tool_text(2, &tool, json!({})).await, "error", "{plugin}");
        // ...and a plugin that logs below it anyway is filtered by the gateway.
        let call = |id, level: &str| {
            c.call(
                id,
                "tools/call",
                json!({"name": format!("{plugin}__log_at"), "arguments": {"level": level, "text": format!("{plugin} at {level}")}}),
            )
        };
        assert_eq!(
            logs(&call(3, "info").await),
            Vec::<String>::new(),
            "{plugin}"
        );
        assert_eq!(
            logs(&call(4, "critical").await),
            [format!("{plugin} at critical")]
        );
    }
    // A restarted instance gets it too.
    let _ = c
        .call(
            5,
            "tools/call",
            json!({"name": "own__crash", "arguments": {}}),
        )
        .await;
    assert_eq!(c.tool_text(6, "own__log_level", json!({})).await, "error");
    // Without a level set, everything comes through.
    let mut d = gw.client();
    d.initialize().await;
    let r = d
        .call(
            1,
            "tools/call",
            json!({"name": "own__log_at", "arguments": {"level": "debug", "text": "d at debug"}}),
        )
        .await;
    assert_eq!(logs(&r), ["d at debug"]);
    gw.stop().await;
}

/// Has the fixture send the client `ask` (its `ask_client` tool): the request, with the call's
/// stream to answer on, if it reached the client; else the answer the fixture got instead.
async fn ask_client(c: &Client, id: i64, ask: &Value) -> Result<(Value, Events), Value> {
    let mut events = c
        .stream(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "ask_client", "arguments": ask}}))
        .await;
    let first = events.next().await.expect("a message");
    if first.get("method").is_some() {
        return Ok((first, events));
    }
    let text = first["result"]["content"][0]["text"]
        .as_str()
        .expect("the tool's answer");
    Err(serde_json::from_str(text).unwrap())
}

#[tokio::test]
async fn elicitation_modes_and_tool_use_in_sampling_need_their_sub_capabilities() {
    let gw = InProcess::fixture(&[], &[]).await;
    let url = json!({"method": "elicitation/create", "params": {"mode": "url", "message": "sign in",
        "url": "https://example.com/sign-in", "elicitationId": "e-1"}});
    let form = json!({"method": "elicitation/create", "params": {"message": "name?",
        "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}}}});
    let tools = json!({"method": "sampling/createMessage", "params": {"maxTokens": 10,
        "messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}],
        "tools": [{"name": "lookup", "inputSchema": {"type": "object"}}]}});
    let refused = |answer: Result<(Value, Events), Value>, what: &str| {
        let answer = answer
            .err()
            .unwrap_or_else(|| panic!("{what}: reached the client"));
        assert_eq!(answer["error"]["code"], -32602, "{answer}");
        assert!(
            answer["error"]["message"].as_str().unwrap().contains(what),
            "{answer}"
        );
    };
    let reaches = |answer: Result<(Value, Events), Value>, method: &str| {
        let (request, events) = answer.unwrap_or_else(|a| panic!("refused: {a}"));
        assert_eq!(request["method"], method);
        (request, events)
    };

    // An empty `elicitation` is form mode only; `sampling` alone is without tool use.
    let mut c = gw.client();
    c.initialize_at("2025-11-25", json!({"elicitation": {}, "sampling": {}}))
        .await;
    refused(ask_client(&c, 1, &url).await, "elicitation.url");
    refused(ask_client(&c, 2, &tools).await, "sampling.tools");
    let (request, mut events) = reaches(ask_client(&c, 3, &form).await, "elicitation/create");
    let r = c
        .post(&json!({"jsonrpc": "2.0", "id": request["id"], "result": {"action": "decline"}}))
        .await;
    assert_eq!(r.status, 202);
    let done = events.next().await.unwrap();
    assert!(
        done["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("decline")
    );

    // URL mode alone, and tool use.
    let mut c = gw.client();
    c.initialize_at(
        "2025-11-25",
        json!({"elicitation": {"url": {}}, "sampling": {"tools": {}}}),
    )
    .await;
    refused(ask_client(&c, 1, &form).await, "elicitation.form");
    for (id, ask, method) in [
        (2, &url, "elicitation/create"),
        (3, &tools, "sampling/createMessage"),
    ] {
        let (request, mut events) = reaches(ask_client(&c, id, ask).await, method);
        let r = c
            .post(&json!({"jsonrpc": "2.0", "id": request["id"], "error": {"code": -1, "message": "no"}}))
            .await;
        assert_eq!(r.status, 202);
        assert_eq!(events.next().await.unwrap()["id"], id);
    }
    gw.stop().await;
}
