//! Plugins of the modern era (2026-07-28) behind the gateway (issue 22): each plugin's era is
//! probed with `initialize` and then `server/discover` (issue 38: a plugin that speaks both
//! is served in the legacy era, tests/python_plugins.rs), or pinned with `era`; a
//! modern-only plugin (tests/fixture_modern) serves legacy sessions, its `InputRequiredResult`s
//! asked of the client as requests on the session's streams and the answers sent back as the
//! retry, and modern clients, to whom its `InputRequiredResult` passes as it is. Served in the
//! test's process.

mod common;

use common::{Admin, Client, FIXTURE, FIXTURE_MODERN, InProcess, write_config};
use serde_json::{Value, json};

const TOKEN: &str = "t0ken-of-the-admin-api";

/// The `_meta` a modern plugin saw, from its `meta` tool.
async fn seen_meta(c: &Client, id: i64, name: &str) -> Value {
    serde_json::from_str(&c.tool_text(id, name, json!({})).await).unwrap()
}

/// Answers the client request `request` (one the gateway sent on a stream) with `result`.
async fn answer(c: &Client, request: &Value, result: Value) {
    let r = c
        .post(&json!({"jsonrpc": "2.0", "id": request["id"], "result": result}))
        .await;
    assert_eq!(r.status, 202, "{r:?}");
}

fn accept(name: &str) -> Value {
    json!({"action": "accept", "content": {"name": name}})
}

fn call(id: Value, name: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": {}}})
}

#[tokio::test]
async fn the_probe_finds_each_plugins_era_and_a_pin_overrides_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        &dir,
        &format!(
            "[plugins.old]\ncommand = \"{FIXTURE}\"\n\n[plugins.new]\ncommand = \"{FIXTURE_MODERN}\"\n"
        ),
    );
    let gw = InProcess::start(&["--config", &cfg, "--admin-token", TOKEN]).await;
    let admin = Admin::of(&gw, TOKEN);
    let old = admin.wait_state("old", "ready").await;
    assert_eq!(old["speaks"]["era"], "legacy", "{old}");
    assert_eq!(old["speaks"]["protocol_version"], "2025-11-25");
    assert_eq!(old["era"], "auto");
    let new = admin.wait_state("new", "ready").await;
    assert_eq!(new["speaks"]["era"], "modern", "{new}");
    assert_eq!(new["speaks"]["protocol_version"], "2026-07-28");
    assert_eq!(new["tools"], 6, "its tools were listed with _meta: {new}");

    // Both serve one legacy session, side by side.
    let mut c = gw.client();
    c.initialize().await;
    assert_eq!(c.tool_text(1, "old__echo", json!({"text": "a"})).await, "a");
    assert_eq!(c.tool_text(2, "new__echo", json!({"text": "b"})).await, "b");

    // Pinned: the probe tries only the pinned era.
    let add = |name: &str, command: &str, args: Value, era: &str| json!({"name": name, "command": command, "args": args, "era": era});
    let (s, _) = admin
        .post(
            "/admin/plugins",
            add("pinned_modern", FIXTURE_MODERN, json!([]), "modern"),
        )
        .await;
    assert_eq!(s, 201);
    let p = admin.wait_state("pinned_modern", "ready").await;
    assert_eq!(
        (p["era"].clone(), p["speaks"]["era"].clone()),
        (json!("modern"), json!("modern"))
    );

    let (s, _) = admin
        .post(
            "/admin/plugins",
            add("legacy_only", FIXTURE_MODERN, json!([]), "legacy"),
        )
        .await;
    assert_eq!(s, 201);
    let p = admin.wait_state("legacy_only", "failed").await;
    let e = p["last_error"].as_str().unwrap();
    assert!(
        e.contains("answered initialize") && e.contains("speaks only MCP 2026-07-28"),
        "a modern-only plugin pinned legacy is sent initialize, which it refuses naming its version: {e}"
    );

    let (s, _) = admin
        .post(
            "/admin/plugins",
            add("modern_only", FIXTURE, json!([]), "modern"),
        )
        .await;
    assert_eq!(s, 201);
    let p = admin.wait_state("modern_only", "failed").await;
    let e = p["last_error"].as_str().unwrap();
    assert!(e.contains("not as a 2026-07-28 server"), "{e}");

    // Modern at versions the gateway does not speak: refused, the versions named.
    let (s, _) = admin
        .post(
            "/admin/plugins",
            add(
                "future",
                FIXTURE_MODERN,
                json!(["--versions", "2027-01-01"]),
                "auto",
            ),
        )
        .await;
    assert_eq!(s, 201);
    let p = admin.wait_state("future", "failed").await;
    let e = p["last_error"].as_str().unwrap();
    assert!(
        e.contains("modern-era server supporting 2027-01-01") && e.contains("2026-07-28"),
        "{e}"
    );
    // A bad era is refused.
    let (s, body) = admin
        .post("/admin/plugins", add("bad", FIXTURE, json!([]), "ancient"))
        .await;
    assert_eq!(s, 400, "{body}");
    gw.stop().await;
}

/// A legacy server that answers nothing but `initialize` (some ignore unknown requests), after
/// the seconds its first argument says (none: at once).
const LEGACY_ONLY: &str = r#"#!/bin/sh
while IFS= read -r line; do
  case "$line" in
    *'"method":"initialize"'*)
      sleep "${1:-0}"
      id=$(printf '%s' "$line" | sed 's/^{"jsonrpc":"2.0","id":\([0-9]*\),.*/\1/')
      printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-06-18","capabilities":{},"serverInfo":{"name":"silent","version":"1"}}}\n' "$id";;
  esac
done
"#;

/// The probe sends `initialize` first; unanswered for a while, `server/discover` goes too, and
/// the era that answers first is the plugin's; refused, `server/discover` follows.
#[tokio::test]
async fn initialize_comes_first_and_a_slow_answer_of_either_era_still_counts() {
    let dir = tempfile::tempdir().unwrap();
    let legacy = common::write_file(&dir, "legacy.sh", LEGACY_ONLY);
    std::fs::set_permissions(&legacy, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let cfg = write_config(
        &dir,
        &format!(
            "[plugins.silent]\ncommand = \"{legacy}\"\n\n\
             [plugins.slow_legacy]\ncommand = \"{legacy}\"\nargs = [\"4\"]\n\n\
             [plugins.slow_modern]\ncommand = \"{FIXTURE_MODERN}\"\nargs = [\"--discover-delay-ms\", \"4500\"]\n\n\
             [plugins.deaf_modern]\ncommand = \"{FIXTURE_MODERN}\"\nargs = [\"--ignore-initialize\"]\n"
        ),
    );
    let gw = InProcess::start(&["--config", &cfg, "--admin-token", TOKEN]).await;
    let admin = Admin::of(&gw, TOKEN);
    // It answers initialize (and would never answer server/discover).
    let p = admin.wait_state("silent", "ready").await;
    assert_eq!(p["speaks"]["era"], "legacy", "{p}");
    assert_eq!(p["speaks"]["protocol_version"], "2025-06-18");
    // Its initialize answer came after the wait, while server/discover was on its way.
    let p = admin.wait_state("slow_legacy", "ready").await;
    assert_eq!(p["speaks"]["era"], "legacy", "{p}");
    // It refused initialize at once, and answered server/discover late.
    let p = admin.wait_state("slow_modern", "ready").await;
    assert_eq!(p["speaks"]["era"], "modern", "{p}");
    // It never answers initialize: server/discover, sent after the wait, found it.
    let p = admin.wait_state("deaf_modern", "ready").await;
    assert_eq!(p["speaks"]["era"], "modern", "{p}");
    gw.stop().await;
}

#[tokio::test]
async fn a_legacy_session_uses_a_modern_plugin() {
    let gw = InProcess::fixture_with(FIXTURE_MODERN, &[]).await;
    let mut c = gw.client();
    let init = c.initialize().await;
    assert_eq!(init["serverInfo"]["name"], "mcp-fixture-modern");
    assert_eq!(init["instructions"], "A modern-only fixture.");
    assert!(
        init["capabilities"]["resources"].get("subscribe").is_none(),
        "its subscriptions come only through subscriptions/listen: {init}"
    );

    let tools = c.result(1, "tools/list", json!({})).await;
    assert!(common::tool_names(&tools).contains(&"ask_name"), "{tools}");
    // Chosen: a complete result passes as the plugin sent it; its `resultType` and caching
    // hints are fields a legacy client ignores.
    assert_eq!(tools["resultType"], "complete");
    assert_eq!(c.tool_text(2, "echo", json!({"text": "hi"})).await, "hi");

    // Every request carries the session's client in `_meta`, and its log level once set.
    let meta = seen_meta(&c, 3, "meta").await;
    assert_eq!(
        meta["io.modelcontextprotocol/protocolVersion"],
        "2026-07-28"
    );
    assert_eq!(
        meta["io.modelcontextprotocol/clientInfo"]["name"],
        "gateway-tests"
    );
    assert!(meta["io.modelcontextprotocol/clientCapabilities"]["elicitation"].is_object());
    assert!(meta.get("io.modelcontextprotocol/logLevel").is_none());
    c.result(4, "logging/setLevel", json!({"level": "debug"}))
        .await;
    let meta = seen_meta(&c, 5, "meta").await;
    assert_eq!(meta["io.modelcontextprotocol/logLevel"], "debug");

    let read = c
        .result(6, "resources/read", json!({"uri": "modern://greeting"}))
        .await;
    assert_eq!(read["contents"][0]["text"], "hello from a modern plugin");
    let prompt = c
        .result(
            7,
            "prompts/get",
            json!({"name": "greet", "arguments": {"name": "Ada"}}),
        )
        .await;
    assert_eq!(prompt["messages"][0]["content"]["text"], "Say hello to Ada");
    let r = c
        .call(
            8,
            "resources/subscribe",
            json!({"uri": "modern://greeting"}),
        )
        .await;
    assert_eq!(r.error_code(), -32601);
    assert!(
        r.last()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("subscriptions/listen")
    );

    // The plugin's elicitation arrives as a request on the call's stream; the answer
    // completes the call.
    let mut events = c.stream(&call(json!("ask-1"), "ask_name")).await;
    let request = events.next().await.unwrap();
    assert_eq!(request["method"], "elicitation/create");
    assert_eq!(request["params"]["message"], "Your name?");
    answer(&c, &request, accept("Ada")).await;
    let response = events.next().await.unwrap();
    assert_eq!(response["id"], "ask-1");
    assert_eq!(response["result"]["content"][0]["text"], "Hello, Ada");
    assert!(events.next().await.is_none());

    // Two rounds, the second with two requests at once.
    let mut events = c.stream(&call(json!(9), "two_rounds")).await;
    let first = events.next().await.unwrap();
    assert_eq!(first["params"]["message"], "First name?");
    answer(&c, &first, accept("Ada")).await;
    let mut second: Vec<Value> = vec![events.next().await.unwrap(), events.next().await.unwrap()];
    second.sort_by_key(|r| r["method"].as_str().unwrap().to_owned());
    assert_eq!(second[0]["method"], "elicitation/create");
    assert_eq!(second[1]["method"], "roots/list");
    answer(&c, &second[1], json!({"roots": [{"uri": "file:///w"}]})).await;
    answer(&c, &second[0], accept("Grace")).await;
    let response = events.next().await.unwrap();
    assert_eq!(response["id"], 9);
    assert_eq!(
        response["result"]["content"][0]["text"],
        "first=Ada second=Grace roots=1"
    );

    // A round with state only is retried at once.
    assert_eq!(
        c.tool_text(10, "busy", json!({})).await,
        "done after a retry"
    );

    // The client's error ends the call.
    let mut events = c.stream(&call(json!(11), "ask_name")).await;
    let request = events.next().await.unwrap();
    let r = c
        .post(&json!({"jsonrpc": "2.0", "id": request["id"], "error": {"code": -1, "message": "user declined"}}))
        .await;
    assert_eq!(r.status, 202);
    let response = events.next().await.unwrap();
    assert_eq!(response["id"], 11);
    let m = response["error"]["message"].as_str().unwrap();
    assert!(
        m.contains("elicitation/create") && m.contains("user declined"),
        "{m}"
    );
    gw.stop().await;
}

#[tokio::test]
async fn input_a_legacy_client_did_not_declare_is_never_asked() {
    let gw = InProcess::fixture_with(FIXTURE_MODERN, &[]).await;
    let mut c = gw.client();
    c.initialize_at("2025-11-25", json!({})).await;
    // The plugin sees the client's capabilities and refuses on its own.
    let r = c.call(1, "tools/call", json!({"name": "ask_name"})).await;
    assert_eq!(r.error_code(), -32021, "{r:?}");
    // A plugin that asks anyway: the gateway refuses, naming the capability.
    let r = c
        .call(2, "tools/call", json!({"name": "rude_sampling"}))
        .await;
    assert_eq!(r.error_code(), -32021, "{r:?}");
    let e = &r.last()["error"];
    assert!(
        e["message"].as_str().unwrap().contains("did not declare"),
        "{e}"
    );
    assert!(
        e["data"]["requiredCapabilities"]["sampling"].is_object(),
        "{e}"
    );

    // Declared, the same plugin's sampling goes to the client.
    let mut c = gw.client();
    c.initialize().await;
    let mut events = c.stream(&call(json!(3), "rude_sampling")).await;
    let request = events.next().await.unwrap();
    assert_eq!(request["method"], "sampling/createMessage");
    answer(
        &c,
        &request,
        json!({"role": "assistant", "content": {"type": "text", "text": "4"}, "model": "m"}),
    )
    .await;
    let response = events.next().await.unwrap();
    assert_eq!(
        response["result"]["content"][0]["text"],
        "the model said: 4"
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_shared_modern_plugin_asks_the_session_whose_call_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        &dir,
        &format!(
            "[plugins.m]\ncommand = \"{FIXTURE_MODERN}\"\nprocess_model = \"shared\"\nrequest_timeout_secs = 2\n"
        ),
    );
    let gw = InProcess::start(&["--config", &cfg]).await;
    let mut a = gw.client();
    a.initialize().await;
    let mut b = gw.client();
    b.initialize().await;
    let mut events_a = a.stream(&call(json!(1), "ask_name")).await;
    let mut events_b = b.stream(&call(json!(1), "ask_name")).await;
    let request_b = events_b.next().await.unwrap();
    let request_a = events_a.next().await.unwrap();
    answer(&b, &request_b, accept("Bea")).await;
    answer(&a, &request_a, accept("Al")).await;
    assert_eq!(
        events_a.next().await.unwrap()["result"]["content"][0]["text"],
        "Hello, Al"
    );
    assert_eq!(
        events_b.next().await.unwrap()["result"]["content"][0]["text"],
        "Hello, Bea"
    );

    // Input never given: the call ends at its deadline, like any other.
    let mut events = a.stream(&call(json!(2), "ask_name")).await;
    let request = events.next().await.unwrap();
    assert_eq!(request["method"], "elicitation/create");
    let response = events.next().await.unwrap();
    assert_eq!(response["error"]["code"], -32001, "{response}");
    gw.stop().await;
}

/// A modern request's body: `params` with `_meta` declaring `capabilities`.
fn modern(id: i64, method: &str, mut params: Value, capabilities: Value) -> Value {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "modern-test", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    });
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

/// POSTs a modern request with the headers that mirror it: the one message answered.
async fn post_modern(c: &Client, body: &Value) -> Value {
    let mut r = c
        .request(reqwest::Method::POST)
        .header("content-type", "application/json")
        .header("accept", common::ACCEPT_BOTH)
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", body["method"].as_str().unwrap());
    let params = &body["params"];
    if let Some(name) = params["name"].as_str().or(params["uri"].as_str()) {
        r = r.header("mcp-name", name);
    }
    let r = r.body(body.to_string()).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    let json = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .next_back()
        .unwrap_or(&text);
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[tokio::test]
async fn a_modern_client_uses_a_modern_plugin_its_input_required_passed_through() {
    let gw = InProcess::fixture_with(FIXTURE_MODERN, &[]).await;
    let c = gw.client();
    let r = post_modern(&c, &modern(1, "server/discover", json!({}), json!({}))).await;
    assert_eq!(
        r["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "mcp-fixture-modern"
    );
    let r = post_modern(
        &c,
        &modern(
            2,
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "m"}}),
            json!({}),
        ),
    )
    .await;
    assert_eq!(r["result"]["content"][0]["text"], "m");
    assert_eq!(r["result"]["resultType"], "complete");
    // The client's own `_meta` reaches the plugin.
    let r = post_modern(
        &c,
        &modern(
            3,
            "tools/call",
            json!({"name": "meta"}),
            json!({"roots": {}}),
        ),
    )
    .await;
    let meta: Value =
        serde_json::from_str(r["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(
        meta["io.modelcontextprotocol/clientInfo"]["name"],
        "modern-test"
    );
    assert_eq!(
        meta["io.modelcontextprotocol/clientCapabilities"],
        json!({"roots": {}})
    );

    let caps = json!({"elicitation": {}});
    let r = post_modern(
        &c,
        &modern(4, "tools/call", json!({"name": "ask_name"}), caps.clone()),
    )
    .await;
    let result = &r["result"];
    assert_eq!(result["resultType"], "input_required", "{r}");
    assert_eq!(
        result["inputRequests"]["name"]["method"],
        "elicitation/create"
    );
    assert_eq!(result["requestState"], "ask_name");
    let retry = modern(
        5,
        "tools/call",
        json!({"name": "ask_name", "inputResponses": {"name": accept("Ada")}, "requestState": result["requestState"]}),
        caps,
    );
    let r = post_modern(&c, &retry).await;
    assert_eq!(r["result"]["content"][0]["text"], "Hello, Ada", "{r}");
    assert_eq!(r["result"]["resultType"], "complete");

    let r = post_modern(
        &c,
        &modern(
            6,
            "resources/read",
            json!({"uri": "modern://greeting"}),
            json!({}),
        ),
    )
    .await;
    assert_eq!(
        r["result"]["contents"][0]["text"],
        "hello from a modern plugin"
    );
    gw.stop().await;
}
