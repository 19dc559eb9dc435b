//! The audit log through the admin API, served in the test's process: one record per
//! `tools/call`, `prompts/get` and `resources/read` and per admin action, with who, what, how
//! it ended and how long it took; arguments only as a keyed hash unless
//! `audit.include_arguments`; the filters. The JSON log lines need the real binary
//! (`admin_process.rs`).

mod common;

use common::admin::{ADMIN_TOKEN, WITH_MAIN_PLUGIN};
use common::{Admin, FIXTURE, InProcess};
use serde_json::{Value, json};

async fn records(admin: &Admin, query: &str) -> Vec<Value> {
    let (status, body) = admin.get(&format!("/admin/audit?{query}")).await;
    assert_eq!(status, 200, "{body}");
    body["records"].as_array().unwrap().clone()
}

#[tokio::test]
async fn calls_and_admin_actions_are_recorded_with_arguments_hashed() {
    let gw = InProcess::start(&WITH_MAIN_PLUGIN).await;
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    let mut c = gw.client();
    c.initialize().await;
    let session = c.session.clone().unwrap();
    let secret = json!({"text": "card 4111 1111 1111 1111"});
    assert_eq!(
        c.tool_text(1, "echo", secret.clone()).await,
        "card 4111 1111 1111 1111"
    );
    c.tool_text(2, "echo", secret.clone()).await;
    c.tool_text(3, "echo", json!({"text": "other"})).await;
    let r = c
        .call(
            4,
            "tools/call",
            json!({"name": "test_error_handling", "arguments": {}}),
        )
        .await;
    assert_eq!(r.last()["result"]["isError"], true);
    let r = c
        .call(
            5,
            "tools/call",
            json!({"name": "no_such_tool", "arguments": {}}),
        )
        .await;
    assert!(r.last()["error"].is_object());
    c.result(6, "resources/read", json!({"uri": "test://static-text"}))
        .await;
    c.result(7, "prompts/get", json!({"name": "test_simple_prompt"}))
        .await;
    c.result(8, "tools/list", json!({})).await;

    let all = records(&admin, "kind=tools/call").await;
    assert_eq!(all.len(), 5, "{all:#?}");
    // Newest first. A tool its plugin did not list is refused by the gateway.
    assert_eq!(all[0]["target"], "no_such_tool");
    assert_eq!(all[0]["outcome"], "refused");
    assert_eq!(all[0]["error_code"], -32602);
    assert_eq!(all[1]["target"], "test_error_handling");
    assert_eq!(all[1]["outcome"], "tool_error");
    let echo: Vec<&Value> = all.iter().filter(|r| r["target"] == "echo").collect();
    assert_eq!(echo.len(), 3);
    for r in &echo {
        assert_eq!(r["outcome"], "ok");
        assert_eq!(r["plugin"], "main");
        assert_eq!(r["session"], &session[..8]);
        assert_eq!(r["client"], "gateway-tests 1");
        assert!(r["subject"].is_null(), "no authorization: no subject");
        assert!(r["duration_ms"].as_f64().unwrap() > 0.0);
        assert!(r["time"].as_str().unwrap().ends_with('Z'));
        let args = r["arguments"].as_str().unwrap();
        assert!(
            args.starts_with("hmac-sha256:") && args.len() == 12 + 64,
            "{args}"
        );
    }
    // Equal arguments hash alike; the text is nowhere in the records.
    assert_eq!(echo[1]["arguments"], echo[2]["arguments"]);
    assert_ne!(echo[0]["arguments"], echo[1]["arguments"]);
    let everything = records(&admin, "limit=1000").await;
    assert!(
        !Value::Array(everything.clone())
            .to_string()
            .contains("4111")
    );
    // One record each for the resource and the prompt; none for a list.
    let read = records(&admin, "kind=resources/read").await;
    assert_eq!(read.len(), 1);
    assert_eq!(read[0]["target"], "test://static-text");
    assert_eq!(read[0]["outcome"], "ok");
    assert_eq!(records(&admin, "kind=prompts/get").await.len(), 1);
    assert!(everything.iter().all(|r| r["kind"] != "tools/list"));

    // Filters: by tool and outcome, by time.
    let ok_echo = records(&admin, "tool=echo&outcome=ok").await;
    assert_eq!(ok_echo.len(), 3);
    let oldest = echo[2]["at_ms"].as_i64().unwrap();
    let since = records(&admin, &format!("tool=echo&since={}", oldest + 1)).await;
    assert!(since.len() < 3);
    let (status, body) = admin.get("/admin/audit?outcome=fine").await;
    assert_eq!(status, 400);
    assert!(body["error"].as_str().unwrap().contains("fine"), "{body}");

    // Admin actions: who, which action, which plugin, the status.
    assert_eq!(
        admin.post("/admin/plugins/main/disable", json!({})).await.0,
        200
    );
    assert_eq!(
        admin.post("/admin/plugins/nope/enable", json!({})).await.0,
        404
    );
    let actions = records(&admin, "kind=admin").await;
    assert_eq!(actions.len(), 2, "{actions:#?}");
    assert_eq!(actions[0]["target"], "plugin.enable");
    assert_eq!(actions[0]["plugin"], "nope");
    assert_eq!(actions[0]["outcome"], "error");
    assert_eq!(actions[0]["error_code"], 404);
    assert_eq!(actions[1]["target"], "plugin.disable");
    assert_eq!(actions[1]["subject"], "admin");
    assert_eq!(actions[1]["outcome"], "ok");
    // With its plugin disabled, a call is refused by the gateway.
    let r = c
        .call(9, "tools/call", json!({"name": "echo", "arguments": {}}))
        .await;
    assert!(r.last()["error"].is_object());
    let refused = records(&admin, "outcome=refused&tool=echo").await;
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert_eq!(refused[0]["target"], "echo");
    assert!(refused[0]["plugin"].is_null());
    // Reading is not an action.
    assert!(
        records(&admin, "kind=admin&limit=1000")
            .await
            .iter()
            .all(|r| !r["target"].as_str().unwrap().starts_with("GET"))
    );
    gw.stop().await;
}

/// A modern (2026-07-28) client's call: no session, its client named by its `_meta`.
#[tokio::test]
async fn a_modern_clients_calls_are_recorded_too() {
    let gw = InProcess::start(&WITH_MAIN_PLUGIN).await;
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    let m = common::modern::Modern::new(gw.client(), json!({}));
    assert_eq!(
        m.call(1, "echo", json!({"text": "now"})).await.text(),
        "now"
    );
    let r = records(&admin, "tool=echo").await;
    assert_eq!(r.len(), 1, "{r:#?}");
    assert_eq!(r[0]["outcome"], "ok");
    assert_eq!(r[0]["plugin"], "main");
    assert_eq!(r[0]["client"], "mrtr-test 1");
    assert!(r[0]["session"].is_null());
    // The modern call's target and arguments are read with its `_meta`: they are recorded as
    // a legacy session's same call records them (the same arguments, the same HMAC).
    let mut c = gw.client();
    c.initialize().await;
    c.tool_text(2, "echo", json!({"text": "now"})).await;
    let r = records(&admin, "tool=echo").await;
    assert_eq!(r.len(), 2, "{r:#?}");
    let (modern, legacy) = if r[0]["session"].is_null() {
        (&r[0], &r[1])
    } else {
        (&r[1], &r[0])
    };
    assert_eq!(modern["target"], "echo");
    assert!(
        modern["arguments"]
            .as_str()
            .is_some_and(|a| a.starts_with("hmac-sha256:")),
        "{modern}"
    );
    assert_eq!(modern["arguments"], legacy["arguments"]);
    gw.stop().await;
}

/// With the arguments kept, a modern call's are kept as sent, out of params that also carry
/// its `_meta`.
#[tokio::test]
async fn a_modern_calls_arguments_are_kept_as_sent() {
    let gw = with_config("[audit]\ninclude_arguments = true\n").await;
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    let m = common::modern::Modern::new(gw.client(), json!({}));
    let args = json!({"text": "kept, with \"quotes\" and {braces}"});
    assert_eq!(
        m.call(1, "echo", args.clone()).await.text(),
        args["text"].as_str().unwrap()
    );
    let r = records(&admin, "tool=echo").await;
    assert_eq!(r.len(), 1, "{r:#?}");
    let kept: Value = serde_json::from_str(r[0]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(kept, args);
    assert_eq!(r[0]["target"], "echo");
    gw.stop().await;
}

/// A gateway with the admin API, the fixture plugin and `config` as its config file.
async fn with_config(config: &str) -> InProcess {
    let dir = tempfile::tempdir().unwrap();
    let config = common::write_config(&dir, config);
    let args = [
        "--admin-token",
        ADMIN_TOKEN,
        "--config",
        &config,
        "--",
        FIXTURE,
    ];
    // The file is read at start.
    InProcess::start(&args).await
}

#[tokio::test]
async fn include_arguments_keeps_them_as_sent() {
    let gw = with_config("[audit]\ninclude_arguments = true\n").await;
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    let mut c = gw.client();
    c.initialize().await;
    c.tool_text(1, "echo", json!({"text": "kept"})).await;
    let long = "x".repeat(10_000);
    c.tool_text(2, "echo", json!({ "text": long })).await;
    let r = records(&admin, "tool=echo").await;
    assert_eq!(r.len(), 2);
    // Too long to keep: hashed, and marked so.
    let cut = r[0]["arguments"].as_str().unwrap();
    assert!(
        cut.starts_with("hmac-sha256:") && cut.ends_with("(too long)"),
        "{cut}"
    );
    let kept: Value = serde_json::from_str(r[1]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(kept, json!({"text": "kept"}));
    gw.stop().await;
}

#[tokio::test]
async fn the_audit_log_can_be_turned_off() {
    let gw = with_config("[audit]\nenabled = false\n").await;
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    let mut c = gw.client();
    c.initialize().await;
    c.tool_text(1, "echo", json!({"text": "x"})).await;
    let (status, body) = admin.get("/admin/audit").await;
    assert_eq!(status, 409, "{body}");
    assert!(body["error"].as_str().unwrap().contains("audit.enabled"));
    gw.stop().await;
}
