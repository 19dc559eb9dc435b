//! Remote plugins (issue 42): MCP servers reached over HTTP beside the stdio ones. Real
//! upstreams: a server on the official Python SDK 2.x over Streamable HTTP (both eras), one
//! serving only the 2024-11-05 HTTP+SSE transport, `@modelcontextprotocol/server-everything`
//! in its Streamable HTTP mode, and a hostile server of the test's own; clients of both eras.
//! Needs scripts/install-test-deps.

mod common;

use common::admin::ADMIN_TOKEN;
use common::modern::{Modern, all_capabilities, only, sampled};
use common::upstream::{CutProxy, Hostile, UPSTREAM_SECRET, Upstream};
use common::{Admin, Events, Gateway, write_config};
use serde_json::{Value, json};

/// A `[plugins.NAME]` table reaching `url`, with `extra` lines.
fn remote(name: &str, url: &str, extra: &str) -> String {
    format!("[plugins.{name}]\nurl = {url:?}\n{extra}\n")
}

/// A gateway (admin API on) in front of the `[plugins]` tables `plugins`, after `head`.
fn gateway(dir: &tempfile::TempDir, head: &str, plugins: &[String]) -> Gateway {
    let cfg = write_config(dir, &format!("{head}\n{}", plugins.concat()));
    Gateway::start(&["--config", &cfg, "--admin-token", ADMIN_TOKEN])
}

fn call(id: i64, name: &str, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": arguments}})
}

async fn answer(c: &common::Client, request: &Value, result: Value) {
    let r = c
        .post(&json!({"jsonrpc": "2.0", "id": request["id"], "result": result}))
        .await;
    assert_eq!(r.status, 202, "{r:?}");
}

/// The error message a client got for a call, which must name the plugin and hold nothing
/// the upstream said.
fn error_naming(reply: &Value, plugin: &str) -> String {
    let m = reply["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("an error: {reply}"))
        .to_owned();
    assert!(m.contains(&format!("plugin '{plugin}'")), "{m}");
    assert!(!reply.to_string().contains(UPSTREAM_SECRET), "{reply}");
    m
}

#[tokio::test]
async fn a_python_sdk_server_over_http_serves_both_eras_and_is_probed_or_pinned() {
    let up = Upstream::remote(&[]);
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(
        &dir,
        "",
        &[
            remote("py", &up.url, "era = \"legacy\""),
            remote("pym", &up.url, ""),
        ],
    );
    // Probed over HTTP: `server/discover` first, which a 2.x server answers.
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    let p = admin.wait_state("py", "ready").await;
    assert_eq!(p["speaks"]["era"], "legacy", "{p}");
    assert_eq!(p["url"], up.url, "{p}");
    let p = admin.wait_state("pym", "ready").await;
    assert_eq!(p["speaks"]["era"], "modern", "{p}");

    // A legacy client: both plugins, progress passed through.
    let mut c = gw.client();
    c.initialize().await;
    for (id, tool) in [(1, "py__echo"), (2, "pym__echo")] {
        let text = c.tool_text(id, tool, json!({"text": "hi"})).await;
        assert_eq!(text, "echo: hi", "{tool}");
    }
    let mut events = c
        .stream(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "pym__slow_progress", "arguments": {"steps": 3}, "_meta": {"progressToken": "tok"}}}))
        .await;
    let mut progress = Vec::new();
    let result = loop {
        let m = events.next().await.expect("the call's stream");
        if m["method"] == "notifications/progress" {
            assert_eq!(m["params"]["progressToken"], "tok", "{m}");
            progress.push(m["params"]["progress"].as_f64().unwrap());
        } else {
            break m;
        }
    };
    assert_eq!(result["result"]["content"][0]["text"], "done 3 steps");
    assert_eq!(progress, vec![1.0, 2.0, 3.0]);
    let prompt = c
        .result(
            4,
            "prompts/get",
            json!({"name": "py__greet", "arguments": {"name": "Ann"}}),
        )
        .await;
    assert_eq!(
        prompt["messages"][0]["content"]["text"], "Hello, Ann!",
        "{prompt}"
    );
    let read = c
        .result(5, "resources/read", json!({"uri": "test://remote/hello"}))
        .await;
    assert_eq!(
        read["contents"][0]["text"], "Hello from the remote server",
        "{read}"
    );
    assert_eq!(c.delete().await, 200);

    // A 2026-07-28 client, to the legacy and the modern upstream alike.
    let m = Modern::new(gw.client(), all_capabilities());
    for (id, tool) in [(10, "py__add"), (11, "pym__add")] {
        let a = m.call(id, tool, json!({"a": 2, "b": 3})).await;
        assert_eq!(a.text(), "5", "{tool}");
    }
}

#[tokio::test]
async fn server_everything_over_streamable_http_with_sampling_elicitation_and_progress() {
    let up = Upstream::everything();
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(&dir, "", &[remote("every", &up.url, "")]);
    Admin::of(&gw, ADMIN_TOKEN)
        .wait_state("every", "ready")
        .await;

    let mut c = gw.client();
    let init = c
        .initialize_at("2025-11-25", json!({"sampling": {}, "elicitation": {}}))
        .await;
    assert!(init["capabilities"]["tools"].is_object(), "{init}");
    assert_eq!(
        c.tool_text(1, "echo", json!({"message": "hello"})).await,
        "Echo: hello"
    );
    assert_eq!(
        c.tool_text(2, "get-sum", json!({"a": 2, "b": 3.5})).await,
        "The sum of 2 and 3.5 is 5.5."
    );
    // The upstream's sampling request reaches the client on the call's stream, and the
    // answer goes back upstream.
    let mut events = c
        .stream(&call(
            3,
            "trigger-sampling-request",
            json!({"prompt": "2+2?"}),
        ))
        .await;
    let request = events.next().await.unwrap();
    assert_eq!(request["method"], "sampling/createMessage", "{request}");
    answer(&c, &request, sampled("four")).await;
    let done = loop {
        let m = events.next().await.unwrap();
        if m.get("id").is_some() {
            break m;
        }
    };
    let text = done["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.contains("four"), "{done}");
    // Progress of a long operation.
    let mut events = c
        .stream(
            &json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {
            "name": "trigger-long-running-operation", "arguments": {"duration": 1, "steps": 3},
            "_meta": {"progressToken": 77}}}),
        )
        .await;
    let mut progress = 0;
    loop {
        let m = events.next().await.unwrap();
        if m["method"] == "notifications/progress" {
            assert_eq!(m["params"]["progressToken"], 77, "{m}");
            progress += 1;
        } else if m.get("id").is_some() {
            let t = m["result"]["content"][0]["text"]
                .as_str()
                .unwrap_or_default();
            assert!(t.starts_with("Long running operation completed"), "{m}");
            break;
        }
    }
    assert_eq!(progress, 3);
    let prompt = c
        .result(
            5,
            "prompts/get",
            json!({"name": "args-prompt", "arguments": {"city": "Paris"}}),
        )
        .await;
    assert!(prompt.to_string().contains("Paris"), "{prompt}");
    let listed = c.result(6, "resources/list", json!({})).await;
    let uri = listed["resources"][0]["uri"].as_str().unwrap().to_owned();
    let read = c.result(7, "resources/read", json!({"uri": uri})).await;
    assert!(read["contents"][0]["text"].is_string(), "{read}");

    // A 2026-07-28 client: the upstream's elicitation comes back as an InputRequiredResult.
    let m = Modern::new(gw.client(), all_capabilities());
    let first = m.call(20, "trigger-elicitation-request", json!({})).await;
    let key = only(first.input_requests(), "elicitation/create");
    let done = m
        .retry(
            21,
            "trigger-elicitation-request",
            json!({}),
            json!({ key: {"action": "decline"} }),
            &first.state(),
        )
        .await;
    assert!(
        done.text().to_lowercase().contains("decline"),
        "{}",
        done.text()
    );
}

#[tokio::test]
async fn a_server_of_the_2024_11_05_sse_transport_is_reached_configured_or_found() {
    let up = Upstream::remote_sse();
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(
        &dir,
        "",
        &[
            remote("old", &up.url, "transport = \"sse\""),
            remote("found", &up.url, ""),
        ],
    );
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    admin.wait_state("old", "ready").await;
    admin.wait_state("found", "ready").await;
    let mut c = gw.client();
    c.initialize_at("2025-11-25", json!({"sampling": {}})).await;
    for (id, tool) in [(1, "old__echo"), (2, "found__echo")] {
        assert_eq!(c.tool_text(id, tool, json!({"text": "x"})).await, "echo: x");
    }
    let mut events = c
        .stream(&call(3, "old__ask_sampling", json!({"prompt": "hi"})))
        .await;
    let request = events.next().await.unwrap();
    assert_eq!(request["method"], "sampling/createMessage", "{request}");
    answer(&c, &request, sampled("hello")).await;
    let done = events.next().await.unwrap();
    assert_eq!(
        done["result"]["content"][0]["text"], "LLM response: hello",
        "{done}"
    );
}

#[tokio::test]
async fn a_dropped_upstream_stream_is_resumed_and_no_event_is_lost() {
    let up = Upstream::remote(&["--event-store"]);
    let proxy = CutProxy::start(up.port).await;
    let url = format!("http://127.0.0.1:{}/mcp", proxy.port);
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(&dir, "", &[remote("py", &url, "era = \"legacy\"")]);
    Admin::of(&gw, ADMIN_TOKEN).wait_state("py", "ready").await;
    let mut c = gw.client();
    c.initialize().await;
    let mut events = c
        .stream(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "slow_progress", "arguments": {"steps": 10}, "_meta": {"progressToken": "t"}}}),
        )
        .await;
    let mut progress = Vec::new();
    let result = loop {
        let m = events.next().await.expect("the call's stream");
        if m["method"] == "notifications/progress" {
            progress.push(m["params"]["progress"].as_f64().unwrap());
            if progress.len() == 2 {
                // The connection between gateway and upstream goes; the call goes on.
                proxy.cut();
            }
        } else {
            break m;
        }
    };
    assert_eq!(
        result["result"]["content"][0]["text"], "done 10 steps",
        "{result}"
    );
    assert_eq!(progress, (1..=10).map(f64::from).collect::<Vec<_>>());
    let resumed = gw
        .metric(r#"mcp_gateway_remote_events_total{event="resume",plugin="py"}"#)
        .await
        .unwrap_or(0.0);
    assert!(resumed >= 1.0, "resumed {resumed} times");
}

#[tokio::test]
async fn an_upstream_that_forgot_the_session_gets_a_new_one_and_the_call_goes_on() {
    let first = Upstream::remote(&[]);
    let port = first.port;
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(&dir, "", &[remote("py", &first.url, "era = \"legacy\"")]);
    Admin::of(&gw, ADMIN_TOKEN).wait_state("py", "ready").await;
    let mut c = gw.client();
    c.initialize().await;
    assert_eq!(
        c.tool_text(1, "echo", json!({"text": "a"})).await,
        "echo: a"
    );
    // The upstream restarts and knows no session: 404, a new session, the call again.
    drop(first);
    let _second = Upstream::python(common::upstream::REMOTE, port, &[], "/mcp");
    assert_eq!(
        c.tool_text(2, "echo", json!({"text": "b"})).await,
        "echo: b"
    );
    let reconnects = gw
        .metric(r#"mcp_gateway_remote_events_total{event="reconnect",plugin="py"}"#)
        .await
        .unwrap_or(0.0);
    assert!(reconnects >= 1.0);
}

#[tokio::test]
async fn hostile_upstreams_get_errors_naming_the_plugin_and_the_gateway_stays_up() {
    let h = Hostile::start().await;
    let limits = "request_timeout_secs = 4\nread_timeout_secs = 2\nmax_message_bytes = 4096";
    let names = [
        "slow-head",
        "endless",
        "huge",
        "redirect",
        "garbage",
        "error",
        "gone",
    ];
    let plugins: Vec<String> = names
        .iter()
        .map(|n| remote(&n.replace('-', "_"), &h.url(n), limits))
        .chain([remote(
            "ok",
            &h.url("ok"),
            "headers = { \"X-Api-Key\" = \"${REMOTE_TEST_KEY}\" }",
        )])
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(&dir, &plugins.concat());
    let gw = Gateway::start_with_env(
        &["--config", &cfg, "--admin-token", ADMIN_TOKEN],
        &[("REMOTE_TEST_KEY", "k-123")],
    );
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    admin.wait_state("ok", "ready").await;
    let mut c = gw.client();
    c.initialize().await;
    let mut handles = Vec::new();
    for (i, n) in names.iter().enumerate() {
        let plugin = n.replace('-', "_");
        let c = c.clone();
        handles.push(tokio::spawn(async move {
            let r = c
                .call(
                    i as i64 + 1,
                    "tools/call",
                    json!({"name": format!("{plugin}__go"), "arguments": {}}),
                )
                .await;
            (plugin, r.last().clone())
        }));
    }
    for h in handles {
        let (plugin, reply) = h.await.unwrap();
        error_naming(&reply, &plugin);
    }
    // The gateway is up, and a well-behaved upstream got its key from the environment.
    let text = c.tool_text(100, "ok__go", json!({})).await;
    assert_eq!(text, "fine key=k-123");
    let (status, _) = gw.admin_get("/healthz").await;
    assert_eq!(status, 200);
    // The upstream's words went to the log, not to the client.
    assert!(gw.log().contains(UPSTREAM_SECRET));
    let seen = h.seen.lock().unwrap();
    assert!(
        seen.headers
            .iter()
            .all(|h| !h.contains_key("authorization"))
    );
}

#[tokio::test]
async fn a_remote_plugin_added_through_the_admin_api_may_not_reach_private_addresses() {
    let up = Upstream::remote(&[]);
    let dir = tempfile::tempdir().unwrap();
    let stdio = format!("[plugins.local]\ncommand = {:?}\n", common::FIXTURE);
    let gw = gateway(&dir, "", std::slice::from_ref(&stdio));
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    let (status, body) = admin
        .post("/admin/plugins", json!({"name": "inside", "url": up.url}))
        .await;
    assert_eq!(status, 201, "{body}");
    let p = admin.wait_state("inside", "failed").await;
    let why = p["last_error"].as_str().unwrap_or_default();
    assert!(
        why.contains("not a global address") || why.contains("neither a global"),
        "{p}"
    );
    let (status, body) = admin
        .post(
            "/admin/plugins",
            json!({"name": "plain", "url": "http://mcp.example.com/mcp"}),
        )
        .await;
    assert_eq!(status, 400, "{body}");

    // An operator's network is allowed.
    let dir2 = tempfile::tempdir().unwrap();
    let gw = gateway(
        &dir2,
        "[sandbox]\nremote_networks = [\"127.0.0.0/8\"]\n",
        &[stdio],
    );
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    let (status, body) = admin
        .post("/admin/plugins", json!({"name": "inside", "url": up.url}))
        .await;
    assert_eq!(status, 201, "{body}");
    admin.wait_state("inside", "ready").await;
    let mut c = gw.client();
    c.initialize().await;
    assert_eq!(
        c.tool_text(1, "inside__echo", json!({"text": "ok"})).await,
        "echo: ok"
    );
}

#[tokio::test]
async fn a_dead_upstream_opens_the_breaker_like_a_crashing_process() {
    let up = Upstream::remote(&[]);
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(
        &dir,
        "",
        &[remote(
            "py",
            &up.url,
            "process_model = \"shared\"\nconnect_timeout_secs = 2",
        )],
    );
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    admin.wait_state("py", "ready").await;
    let mut c = gw.client();
    c.initialize().await;
    assert_eq!(
        c.tool_text(1, "echo", json!({"text": "a"})).await,
        "echo: a"
    );
    drop(up);
    let mut tripped = None;
    for i in 2..30 {
        let r = c
            .call(
                i,
                "tools/call",
                json!({"name": "echo", "arguments": {"text": "b"}}),
            )
            .await;
        let m = error_naming(r.last(), "py");
        if m.contains("keeps crashing") {
            tripped = Some(i);
            break;
        }
    }
    assert!(tripped.is_some(), "the breaker opened");
    let (_, p) = admin.get("/admin/plugins/py").await;
    assert_eq!(p["state"], "failed", "{p}");
    assert!(p["breaker_open_secs"].as_u64().is_some(), "{p}");
    let why = p["last_error"].as_str().unwrap_or_default();
    assert!(
        why.contains("unreachable")
            || why.contains("could not be reached")
            || why.contains("error"),
        "{p}"
    );
}

#[tokio::test]
async fn subscriptions_logs_list_changes_and_cancellation_pass_through_a_remote_plugin() {
    const WATCHED: &str = "test://watched-resource";
    let up = Upstream::lowlevel();
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(&dir, "", &[remote("low", &up.url, "era = \"legacy\"")]);
    Admin::of(&gw, ADMIN_TOKEN).wait_state("low", "ready").await;
    let mut c = gw.client();
    c.initialize().await;
    let mut get = Events::new(c.get_stream().await);

    // A subscription reaches the upstream, and its update, sent on the upstream's GET
    // stream, reaches the client's.
    c.result(1, "resources/subscribe", json!({"uri": WATCHED}))
        .await;
    let touched = c
        .tool_text(2, "touch_resource", json!({"uri": WATCHED}))
        .await;
    assert_eq!(touched, "subscribed");
    let update = get.next().await.unwrap();
    assert_eq!(
        update["method"], "notifications/resources/updated",
        "{update}"
    );
    assert_eq!(update["params"]["uri"], WATCHED);
    c.result(3, "resources/unsubscribe", json!({"uri": WATCHED}))
        .await;
    let touched = c
        .tool_text(4, "touch_resource", json!({"uri": WATCHED}))
        .await;
    assert_eq!(touched, "not subscribed");

    // A log message on the call's stream reaches the client's.
    let mut events = c
        .stream(&call(5, "say", json!({"text": "hello from upstream"})))
        .await;
    let log = events.next().await.unwrap();
    assert_eq!(log["method"], "notifications/message", "{log}");
    assert_eq!(log["params"]["data"], "hello from upstream", "{log}");
    let done = events.next().await.unwrap();
    assert_eq!(done["result"]["content"][0]["text"], "said", "{done}");

    // A list change: the client hears it, and the new tool is listed.
    let added = c.tool_text(5, "add_tool", json!({"name": "extra"})).await;
    assert_eq!(added, "added");
    let changed = get.next().await.unwrap();
    assert_eq!(
        changed["method"], "notifications/tools/list_changed",
        "{changed}"
    );
    let tools = c.result(51, "tools/list", json!({})).await;
    assert!(common::tool_names(&tools).contains(&"extra"), "{tools}");

    // A cancellation reaches the upstream, which stops the call.
    let slow = {
        let c = c.clone();
        tokio::spawn(async move {
            c.call(
                7,
                "tools/call",
                json!({"name": "wait_cancel", "arguments": {"seconds": 30}}),
            )
            .await
        })
    };
    let mut said = String::new();
    for id in 8..108 {
        c.notify(
            "notifications/cancelled",
            json!({"requestId": 7, "reason": "test"}),
        )
        .await;
        said = c.tool_text(id, "was_cancelled", json!({})).await;
        if said == "cancelled" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(said, "cancelled");
    slow.abort();
}
