//! The admin API and the plugin registry, served in the test's process: the token and the
//! listener it lives on, what connected clients see of a new plugin, reloads that keep file
//! edits and refuse conflicts, a plugin's last error and `/readyz`. What needs the real binary
//! (restarts on the same database, SIGHUP, logs, `check`, the gateway's own environment, the
//! processes a plugin leaves) is in `admin_process.rs`: the two harnesses never share a test
//! binary.

mod common;

use std::time::Duration;

use common::admin::{ADMIN_TOKEN, WITH_MAIN_PLUGIN, fixture_plugin};
use common::{Admin, FIXTURE, InProcess, tool_names};
use serde_json::{Value, json};

#[tokio::test]
async fn the_admin_api_needs_its_token_and_is_not_on_the_public_port() {
    let gw = InProcess::start(&["--admin-token", ADMIN_TOKEN, "--", FIXTURE]).await;
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    for token in [None, Some("wrong"), Some("")] {
        let (status, body) = admin
            .send(reqwest::Method::GET, "/admin/plugins", None, token)
            .await;
        assert_eq!(status, 401, "{token:?}");
        assert!(body["error"].as_str().unwrap().contains("token"));
    }
    assert_eq!(admin.get("/admin/plugins").await.0, 200);
    let public = reqwest::Client::new()
        .get(format!("http://{}/admin/plugins", gw.addr))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(public.status(), 404, "not served on the public port");
    gw.stop().await;
}

#[tokio::test]
async fn connected_clients_hear_of_new_plugins_and_see_their_tools() {
    let gw = InProcess::start(&WITH_MAIN_PLUGIN).await;
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    let mut c = gw.client();
    let init = c.initialize().await;
    // One unprefixed plugin: its own server info and instructions.
    assert_eq!(init["serverInfo"]["name"], "mcp-fixture-server");
    assert!(!init["instructions"].as_str().unwrap().contains("extra"));
    let mut get = common::Events::new(c.get_stream().await);
    assert_eq!(
        c.tool_text(1, "echo", json!({"text": "alone"})).await,
        "alone"
    );
    assert_eq!(
        admin
            .post("/admin/plugins", fixture_plugin("extra"))
            .await
            .0,
        201
    );
    let changed = get.next().await.unwrap();
    assert_eq!(changed["method"], "notifications/tools/list_changed");
    admin.wait_state("extra", "ready").await;
    // With two plugins, names are prefixed; the new plugin's tools are there.
    let mut found = false;
    for i in 0..50 {
        let tools = c.result(10 + i, "tools/list", json!({})).await;
        let names = tool_names(&tools);
        if names.contains(&"extra__echo") && names.contains(&"main__echo") {
            found = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(found);
    assert_eq!(
        c.tool_text(99, "extra__echo", json!({"text": "new"})).await,
        "new"
    );
    // A new session is answered from the new set of plugins, not from the first answer.
    let init = gw.client().initialize().await;
    assert_eq!(init["serverInfo"]["name"], "mcp-gateway");
    let instructions = init["instructions"].as_str().unwrap();
    assert!(instructions.contains("## extra") && instructions.contains("## main"));
    gw.stop().await;
}

#[tokio::test]
async fn regression_overlay_keeps_file_edits_and_refuses_conflicts() {
    // Guards: enable/disable froze a config plugin's definition; removing an API plugin left a
    // marker that hid a later config plugin of that name; a reload could make two plugins
    // share a prefix.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("gw.toml");
    std::fs::write(
        &cfg,
        format!("[plugins.f]\ncommand = \"{FIXTURE}\"\nargs = [\"--name\", \"v1\"]\n"),
    )
    .unwrap();
    let gw = InProcess::start(&[
        "--admin-token",
        ADMIN_TOKEN,
        "--config",
        cfg.to_str().unwrap(),
    ])
    .await;
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    assert_eq!(
        admin.post("/admin/plugins/f/disable", json!({})).await.0,
        200
    );
    assert_eq!(
        admin.post("/admin/plugins/f/enable", json!({})).await.0,
        200
    );
    assert_eq!(
        admin.post("/admin/plugins", fixture_plugin("api")).await.0,
        201
    );
    assert_eq!(admin.delete("/admin/plugins/api").await, 204);
    std::fs::write(
        &cfg,
        format!("[plugins.f]\ncommand = \"{FIXTURE}\"\nargs = [\"--name\", \"v2\"]\n[plugins.api]\ncommand = \"{FIXTURE}\"\n"),
    )
    .unwrap();
    assert_eq!(admin.post("/admin/reload", json!({})).await.0, 200);
    let (_, f) = admin.get("/admin/plugins/f").await;
    assert_eq!(
        f["args"],
        json!(["--name", "v2"]),
        "the file's edit applies"
    );
    assert_eq!(f["source"], "config");
    let (status, _) = admin.get("/admin/plugins/api").await;
    assert_eq!(status, 200, "the file's `api` plugin appears");

    assert_eq!(
        admin
            .post(
                "/admin/plugins",
                json!({"name": "x", "command": FIXTURE, "prefix": "z"})
            )
            .await
            .0,
        201
    );
    std::fs::write(
        &cfg,
        format!("[plugins.f]\ncommand = \"{FIXTURE}\"\n[plugins.z]\ncommand = \"{FIXTURE}\"\n"),
    )
    .unwrap();
    let (status, body) = admin.post("/admin/reload", json!({})).await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("prefix `z`"),
        "{body}"
    );
    gw.stop().await;
}

#[tokio::test]
async fn regression_a_crash_while_running_is_the_plugins_last_error() {
    // Guards: a plugin that crashed while running counted in `restarts`, but its `last_error`
    // stayed null.
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::write_config(
        &dir,
        &format!(
            "[plugins.own]\ncommand = \"{FIXTURE}\"\n[plugins.pooled]\ncommand = \"{FIXTURE}\"\nprocess_model = \"shared\"\n"
        ),
    );
    let gw = InProcess::start(&["--config", &cfg, "--admin-token", ADMIN_TOKEN]).await;
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    let mut c = gw.client();
    c.initialize().await;
    for (i, plugin) in ["own", "pooled"].into_iter().enumerate() {
        let (_, p) = admin.get(&format!("/admin/plugins/{plugin}")).await;
        assert_eq!(p["last_error"], Value::Null, "{p}");
        let _ = c
            .call(
                i as i64,
                "tools/call",
                json!({"name": format!("{plugin}__crash"), "arguments": {}}),
            )
            .await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let p = loop {
            let (_, p) = admin.get(&format!("/admin/plugins/{plugin}")).await;
            if p["restarts"] == 1 {
                break p;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no crash counted: {p}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let last = p["last_error"].as_str().unwrap_or_default();
        assert!(
            last.contains(&format!("plugin '{plugin}' exited"))
                && last.contains("exit status: 7")
                && last.contains("crashing on purpose"),
            "{p}"
        );
    }
    gw.stop().await;
}

#[tokio::test]
async fn regression_readyz_names_failed_plugins_without_their_command_lines() {
    // Guards: `/readyz`, which needs no token, showed each failed plugin's full command line.
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::write_config(
        &dir,
        "[plugins.broken]\ncommand = \"/nonexistent/server\"\nargs = [\"--api-key\", \"hunter2\"]\n",
    );
    let gw = InProcess::start(&["--config", &cfg]).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let body = loop {
        let (status, body) = gw.admin_get("/readyz").await;
        if status == 503 {
            break body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never unready: {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let v: Value = serde_json::from_str(&body).unwrap();
    let failed = &v["checks"]["plugins"]["failed"][0];
    assert_eq!(failed["plugin"], "broken", "{v}");
    assert!(
        failed["error"]
            .as_str()
            .unwrap()
            .contains("failed to start"),
        "{v}"
    );
    assert!(
        !body.contains("hunter2") && !body.contains("/nonexistent/server"),
        "{body}"
    );
    gw.stop().await;
}
