//! Several plugins behind one `/mcp`: merged capabilities, prefixed tool and prompt names,
//! resources routed by URI, merged lists paginated with opaque cursors, completions and
//! logging levels sent to the plugins they concern. Served in the test's process: nothing here
//! needs the binary's logs or its process.

mod common;

use common::{FIXTURE, InProcess};

use serde_json::{Value, json};

/// Two fixture plugins, `alpha` (paginating by 4) and `beta` (prefix `b`), plus extra TOML.
async fn two_plugins(extra: &str) -> (InProcess, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let config = common::write_config(
        &dir,
        &format!(
            "{extra}\n[plugins.alpha]\ncommand = \"{FIXTURE}\"\nargs = [\"--page-size\", \"4\", \"--name\", \"alpha-server\"]\n\
             [plugins.beta]\ncommand = \"{FIXTURE}\"\nargs = [\"--name\", \"beta-server\"]\nprefix = \"b\"\n"
        ),
    );
    (InProcess::start(&["--config", &config]).await, dir)
}

async fn all_pages(c: &common::Client, method: &str, key: &str) -> (Vec<Value>, usize) {
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let params = cursor.as_ref().map_or(json!({}), |c| json!({"cursor": c}));
        let r = c.result(100 + pages as i64, method, params).await;
        items.extend(r[key].as_array().unwrap().iter().cloned());
        pages += 1;
        match r.get("nextCursor").and_then(Value::as_str) {
            Some(next) => cursor = Some(next.to_owned()),
            None => return (items, pages),
        }
    }
}

#[tokio::test]
async fn tools_and_prompts_are_prefixed_and_routed() {
    let (gw, _dir) = two_plugins("").await;
    let mut c = gw.client();
    let init = c.initialize().await;
    assert_eq!(init["serverInfo"]["name"], "mcp-gateway");
    assert!(
        init["instructions"]
            .as_str()
            .unwrap()
            .contains("alpha-server")
    );
    assert!(
        init["instructions"]
            .as_str()
            .unwrap()
            .contains("beta-server")
    );

    let (tools, pages) = all_pages(&c, "tools/list", "tools").await;
    assert!(pages > 1, "alpha paginates, so the merged list does too");
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    let per_plugin = names.iter().filter(|n| n.starts_with("alpha__")).count();
    assert_eq!(
        per_plugin,
        names.iter().filter(|n| n.starts_with("b__")).count()
    );
    assert_eq!(names.len(), per_plugin * 2, "every tool once: {names:?}");
    assert!(names.contains(&"alpha__echo") && names.contains(&"b__echo"));

    assert_eq!(
        c.tool_text(1, "alpha__echo", json!({"text": "to alpha"}))
            .await,
        "to alpha"
    );
    assert_eq!(c.tool_text(2, "b__counter", json!({})).await, "1");
    assert_eq!(c.tool_text(3, "b__counter", json!({})).await, "2");
    assert_eq!(
        c.tool_text(4, "alpha__counter", json!({})).await,
        "1",
        "a different plugin"
    );
    let r = c
        .call(5, "tools/call", json!({"name": "echo", "arguments": {}}))
        .await;
    assert_eq!(
        r.error_code(),
        -32602,
        "unprefixed names do not resolve with several plugins"
    );
    let r = c
        .call(6, "tools/call", json!({"name": "gamma__echo"}))
        .await;
    assert_eq!(r.error_code(), -32602);

    let (prompts, _) = all_pages(&c, "prompts/list", "prompts").await;
    assert!(prompts.iter().any(|p| p["name"] == "b__test_simple_prompt"));
    let p = c.result(7, "prompts/get", json!({"name": "b__test_prompt_with_arguments", "arguments": {"arg1": "x", "arg2": "y"}})).await;
    assert_eq!(
        p["messages"][0]["content"]["text"],
        "Prompt with arguments: arg1='x', arg2='y'"
    );
    let done = c
        .result(8, "completion/complete", json!({"ref": {"type": "ref/prompt", "name": "alpha__test_prompt_with_arguments"}, "argument": {"name": "arg1", "value": "t"}}))
        .await;
    assert!(done["completion"]["values"].is_array());
    gw.stop().await;
}

#[tokio::test]
async fn cursors_are_opaque_and_checked() {
    let (gw, _dir) = two_plugins("").await;
    let mut c = gw.client();
    c.initialize().await;
    let first = c.result(1, "tools/list", json!({})).await;
    let cursor = first["nextCursor"].as_str().unwrap();
    assert!(
        !cursor.contains("page:"),
        "the plugin's cursor is not exposed as is: {cursor}"
    );
    for bad in ["garbage", "W10", "W1siZ2FtbWEiLCJ4Il1d", ""] {
        let r = c.call(2, "tools/list", json!({"cursor": bad})).await;
        assert_eq!(r.error_code(), -32602, "cursor {bad:?}");
    }
    gw.stop().await;
}

#[tokio::test]
async fn resources_are_routed_by_uri_and_lists_merged() {
    let (gw, _dir) = two_plugins("").await;
    let mut c = gw.client();
    c.initialize().await;
    // Read before any list: the gateway learns who serves the URI.
    let r = c
        .result(1, "resources/read", json!({"uri": "test://static-text"}))
        .await;
    assert_eq!(
        r["contents"][0]["text"],
        "This is the content of the static text resource."
    );
    let r = c
        .result(
            2,
            "resources/read",
            json!({"uri": "test://template/42/data"}),
        )
        .await;
    assert!(r["contents"][0]["text"].as_str().unwrap().contains("42"));
    let r = c
        .call(3, "resources/read", json!({"uri": "nowhere://x"}))
        .await;
    assert_eq!(r.error_code(), -32002);
    let (resources, _) = all_pages(&c, "resources/list", "resources").await;
    assert_eq!(resources.len(), 6, "three from each plugin");
    let (templates, _) = all_pages(&c, "resources/templates/list", "resourceTemplates").await;
    assert_eq!(templates.len(), 2);
    let r = c
        .result(
            4,
            "resources/subscribe",
            json!({"uri": "test://watched-resource"}),
        )
        .await;
    assert_eq!(r, json!({}));
    let r = c
        .result(
            5,
            "resources/unsubscribe",
            json!({"uri": "test://watched-resource"}),
        )
        .await;
    assert_eq!(r, json!({}));
    gw.stop().await;
}

#[tokio::test]
async fn logging_level_reaches_running_and_later_plugins() {
    let (gw, _dir) = two_plugins("").await;
    let mut c = gw.client();
    c.initialize().await;
    // alpha is running before the level is set; beta starts after.
    c.tool_text(1, "alpha__echo", json!({"text": "start"}))
        .await;
    assert_eq!(
        c.result(2, "logging/setLevel", json!({"level": "warning"}))
            .await,
        json!({})
    );
    // setLevel reaches plugins in the background: poll until it has (or give up).
    async fn level_of(c: &common::Client, tool: &str) -> String {
        let mut level = String::new();
        for i in 0..100 {
            level = c.tool_text(1000 + i, tool, json!({})).await;
            if level == "warning" {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        level
    }
    assert_eq!(level_of(&c, "alpha__log_level").await, "warning");
    let beta = level_of(&c, "b__log_level").await;
    assert_eq!(
        beta, "warning",
        "replayed to a plugin started after setLevel"
    );
    gw.stop().await;
}

#[tokio::test]
async fn separator_and_prefix_are_configurable() {
    let (gw, _dir) = two_plugins("separator = \".\"").await;
    let mut c = gw.client();
    c.initialize().await;
    assert_eq!(
        c.tool_text(1, "b.echo", json!({"text": "dot"})).await,
        "dot"
    );
    assert_eq!(
        c.tool_text(2, "alpha.echo", json!({"text": "dot"})).await,
        "dot"
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_single_plugin_is_not_prefixed_and_passes_through() {
    let gw = InProcess::fixture(&[], &["--page-size", "5"]).await;
    let mut c = gw.client();
    let init = c.initialize().await;
    assert_eq!(init["serverInfo"]["name"], "mcp-fixture-server");
    let first = c.result(1, "tools/list", json!({})).await;
    assert_eq!(first["tools"].as_array().unwrap().len(), 5);
    assert_eq!(
        first["nextCursor"], "page:5",
        "the plugin's own cursor, untouched"
    );
    assert!(
        first["tools"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| !t["name"].as_str().unwrap().contains("__"))
    );
    // The JSON Schema 2020-12 keywords survive the trip.
    let (tools, _) = all_pages(&c, "tools/list", "tools").await;
    let schema = &tools
        .iter()
        .find(|t| t["name"] == "json_schema_2020_12_tool")
        .unwrap()["inputSchema"];
    assert_eq!(
        schema["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    assert_eq!(schema["properties"]["address"]["$ref"], "#/$defs/address");
    assert_eq!(schema["additionalProperties"], false);
    gw.stop().await;
}

#[tokio::test]
async fn regression_a_prefix_that_begins_another_routes_to_the_right_plugin() {
    // Guards: names were split at the first separator, so `a___counter` (plugin `a_`) went to
    // plugin `a` as `_counter`.
    let dir = tempfile::tempdir().unwrap();
    let config = common::write_config(
        &dir,
        &format!("[plugins.a]\ncommand = \"{FIXTURE}\"\n[plugins.a_]\ncommand = \"{FIXTURE}\"\n"),
    );
    let gw = InProcess::start(&["--config", &config]).await;
    let mut c = gw.client();
    c.initialize().await;
    assert_eq!(c.tool_text(1, "a___counter", json!({})).await, "1");
    assert_eq!(c.tool_text(2, "a___counter", json!({})).await, "2");
    assert_eq!(
        c.tool_text(3, "a__counter", json!({})).await,
        "1",
        "plugin `a` is another process"
    );
    gw.stop().await;
}

#[tokio::test]
async fn names_too_long_once_prefixed_are_left_out() {
    // 2025-11-25 tool names are at most 128 characters: `alpha__` and 121 make 128; one more
    // is too long, so that tool is neither listed nor callable by the long name.
    let fits = "t".repeat(121);
    let too_long = "u".repeat(122);
    let dir = tempfile::tempdir().unwrap();
    let config = common::write_config(
        &dir,
        &format!(
            "[plugins.alpha]\ncommand = \"{FIXTURE}\"\nargs = [\"--extra-tool\", \"{fits}\", \"--extra-tool\", \"{too_long}\"]\n\
             [plugins.beta]\ncommand = \"{FIXTURE}\"\n"
        ),
    );
    let gw = InProcess::start(&["--config", &config]).await;
    let mut c = gw.client();
    c.initialize().await;
    let (tools, _) = all_pages(&c, "tools/list", "tools").await;
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert!(
        names.contains(&format!("alpha__{fits}").as_str()),
        "{names:?}"
    );
    assert!(!names.iter().any(|n| n.contains(&too_long)), "{names:?}");
    assert!(names.iter().all(|n| n.len() <= 128));
    assert_eq!(
        c.tool_text(1, &format!("alpha__{fits}"), json!({})).await,
        format!("{fits} called")
    );
    let r = c
        .call(
            2,
            "tools/call",
            json!({"name": format!("alpha__{too_long}")}),
        )
        .await;
    assert_eq!(r.error_code(), -32602);
    gw.stop().await;

    // Unprefixed, the plugin's own name is the plugin's business.
    let gw = InProcess::fixture(&[], &["--extra-tool", &too_long]).await;
    let mut c = gw.client();
    c.initialize().await;
    assert_eq!(
        c.tool_text(1, &too_long, json!({})).await,
        format!("{too_long} called")
    );
    gw.stop().await;
}
