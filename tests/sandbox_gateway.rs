//! The gateway's side of the sandbox: it hides itself (non-dumpable, its secrets gone from
//! its environment block), a plugin cannot touch another plugin's package cache, and the
//! admin API takes a plugin's sandbox and shows what this machine enforces of it (also as a
//! metric).

mod common;

use std::process::Command;

use common::admin::ADMIN_TOKEN;
use common::{Admin, Gateway};
use serde_json::{Value, json};

const HOSTILE: &str = env!("CARGO_BIN_EXE_mcp-fixture-hostile");

fn escape_errors(reply: &Value) -> Vec<(String, String)> {
    let text = reply["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or("{}");
    let report: Value = serde_json::from_str(text).unwrap_or_default();
    let mut out = Vec::new();
    for (kind, attempts) in report.as_object().into_iter().flatten() {
        for a in attempts.as_array().into_iter().flatten() {
            let said = if a["ok"] == true {
                "ok".to_owned()
            } else {
                a["error"].as_str().unwrap_or("?").to_owned()
            };
            out.push((format!("{kind} {}", a["target"]), said));
        }
    }
    out
}

#[tokio::test]
async fn the_gateway_is_non_dumpable_and_its_environment_holds_no_secret() {
    let gw = Gateway::start_with_env(
        &["--admin-token", ADMIN_TOKEN, "--", HOSTILE],
        &[("MCP_GATEWAY_DATABASE_URL", "sqlite::memory:")],
    );
    let environ = format!("/proc/{}/environ", gw.pid());
    // Root without capabilities is what a process of the gateway's own user is: the kernel
    // refuses it a non-dumpable process's environment.
    let out = Command::new("setpriv")
        .args([
            "--bounding-set=-all",
            "--inh-caps=-all",
            "--",
            "cat",
            &environ,
        ])
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "read without privilege: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "{out:?}"
    );
    // Even with privilege the secrets are not there: overwritten at start.
    let block = std::fs::read(&environ).unwrap();
    let text = String::from_utf8_lossy(&block);
    assert!(!text.contains(ADMIN_TOKEN), "{text}");
    assert!(!text.contains("sqlite::memory:"), "{text}");
    // The gateway still has them: the admin API answers to the token.
    let (status, _) = Admin::of(&gw, ADMIN_TOKEN).get("/admin/plugins").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_plugin_cannot_touch_another_plugins_package_cache() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = tempfile::tempdir().unwrap();
    let root = sandbox.path().display().to_string();
    let config = common::write_config(
        &dir,
        &format!(
            "[sandbox]\ndir = {root:?}\n[plugins.a]\ncommand = {HOSTILE:?}\n[plugins.b]\ncommand = {HOSTILE:?}\n"
        ),
    );
    let gw = Gateway::start(&["--config", &config]);
    let mut c = gw.client();
    c.initialize().await;
    // B's instance made its cache; A's instance tries to plant a file in it and read it.
    let who = c
        .call(
            1,
            "tools/call",
            json!({"name": "b__whoami", "arguments": {}}),
        )
        .await;
    assert!(who.last()["result"].is_object(), "{who:?}");
    let b_cache = sandbox.path().join("plugins/b");
    assert!(b_cache.is_dir(), "B's cache was made");
    let planted = b_cache.join("npm-planted.js");
    let reply = c
        .call(
            2,
            "tools/call",
            json!({"name": "a__escape", "arguments": {
                "write": [planted.display().to_string()],
                "read": [b_cache.display().to_string()],
            }}),
        )
        .await;
    let attempts = escape_errors(reply.last());
    assert_eq!(attempts.len(), 2, "{reply:?}");
    for (what, said) in &attempts {
        assert!(said.starts_with("EACCES"), "{what}: {said}");
    }
    assert!(!planted.exists());
}

#[tokio::test]
async fn the_admin_api_takes_a_sandbox_and_shows_what_is_enforced() {
    let gw = Gateway::start(&["--admin-token", ADMIN_TOKEN, "--", HOSTILE]);
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    let (status, body) = admin
        .post(
            "/admin/plugins",
            json!({"name": "boxed", "command": HOSTILE,
                   "sandbox": {"network": "none", "memory_mb": 64, "required": true}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = admin
        .post(
            "/admin/plugins",
            json!({"name": "open", "command": HOSTILE, "sandbox": false}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let (_, list) = admin.get("/admin/plugins").await;
    let find = |name: &str| {
        list["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .cloned()
            .unwrap()
    };
    let boxed = find("boxed");
    assert_eq!(boxed["sandbox"]["network"], "none", "{boxed}");
    assert_eq!(boxed["sandbox"]["memory_mb"], 64, "{boxed}");
    assert_eq!(boxed["isolation"]["sandboxed"], true, "{boxed}");
    let rules = boxed["isolation"]["rules"].as_array().unwrap();
    let rule = |name: &str| rules.iter().find(|r| r["rule"] == name).cloned();
    for name in ["filesystem", "network_tcp", "memory", "capabilities"] {
        assert!(rule(name).is_some(), "{name} in {boxed}");
    }
    let open = find("open");
    assert_eq!(open["sandbox"], false, "{open}");
    assert_eq!(open["isolation"]["sandboxed"], false, "{open}");
    // The metric says the same, rule by rule.
    let enforced = |r: &Value| if r["enforced"] == true { 1.0 } else { 0.0 };
    let fs = rule("filesystem").unwrap();
    let sample = "mcp_gateway_plugin_isolation{plugin=\"boxed\",rule=\"filesystem\"}";
    assert_eq!(gw.metric(sample).await, Some(enforced(&fs)));
    // A required sandbox this machine enforces in full starts; the plugin answers.
    if rules.iter().all(|r| r["enforced"] == true) {
        let mut c = gw.client();
        c.initialize().await;
        let r = c
            .call(
                1,
                "tools/call",
                json!({"name": "boxed__whoami", "arguments": {}}),
            )
            .await;
        assert!(r.last()["result"].is_object(), "{r:?}");
    }
}
