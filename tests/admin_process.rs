//! The admin API and the plugin registry against the real binary: every operation and its
//! refusals with the gateway's own environment, persistence across restarts on SQLite and on
//! PostgreSQL, reloads by SIGHUP, the processes of removed or changed plugins, and the secrets
//! a plugin is never given. The checks that need no child process are in `admin.rs`.

mod common;

use std::time::Duration;

use common::admin::{ADMIN_TOKEN, WITH_MAIN_PLUGIN, fixture_plugin};
use common::{Admin, FIXTURE, Gateway, alive, run_cli, wait_until};
use serde_json::{Value, json};

fn names(plugins: &Value) -> Vec<String> {
    let mut v: Vec<String> = plugins["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_owned())
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn plugins_are_added_changed_disabled_and_removed_with_clear_errors() {
    let gw = Gateway::start_with_env(&WITH_MAIN_PLUGIN, &[("MY_SECRET", "s3cret-value")]);
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    let (status, list) = admin.get("/admin/plugins").await;
    assert_eq!(status, 200);
    assert_eq!(names(&list), ["main"]);
    assert_eq!(list["plugins"][0]["source"], "config");

    // Add: 201, and the probe makes it ready with its tool count.
    let mut extra = fixture_plugin("extra");
    extra["env"] = json!({"FROM_REF": "${MY_SECRET}", "LITERAL": "do-not-show"});
    let (status, added) = admin.post("/admin/plugins", extra.clone()).await;
    assert_eq!(status, 201, "{added}");
    assert_eq!(added["source"], "api");
    assert_eq!(
        added["env"],
        json!({"FROM_REF": "${MY_SECRET}", "LITERAL": "***"}),
        "secrets never leave"
    );
    let ready = admin.wait_state("extra", "ready").await;
    assert!(ready["tools"].as_u64().unwrap() > 10);

    // Refusals.
    let (status, body) = admin.post("/admin/plugins", extra.clone()).await;
    assert_eq!(status, 409, "{body}");
    assert!(body["error"].as_str().unwrap().contains("extra"));
    let (status, body) = admin
        .post("/admin/plugins", json!({"name": "x", "comand": "y"}))
        .await;
    assert_eq!(status, 400);
    assert!(body["error"].as_str().unwrap().contains("comand"), "{body}");
    let (status, body) = admin.post("/admin/plugins", json!({"command": "y"})).await;
    assert_eq!(
        (status, body["error"].as_str().unwrap().contains("name")),
        (400, true)
    );
    let (status, _) = admin
        .post(
            "/admin/plugins",
            json!({"name": "bad name!", "command": "y"}),
        )
        .await;
    assert_eq!(status, 400);
    let (status, body) = admin
        .post(
            "/admin/plugins",
            json!({"name": "y", "command": "z", "prefix": "main"}),
        )
        .await;
    assert_eq!(status, 400, "a taken prefix: {body}");
    let r = reqwest::Client::new()
        .post(format!("{}/admin/plugins", admin.base))
        .bearer_auth(ADMIN_TOKEN)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(admin.get("/admin/plugins/nope").await.0, 404);
    assert_eq!(
        admin
            .put("/admin/plugins/nope", json!({"command": "x"}))
            .await
            .0,
        404
    );
    assert_eq!(admin.delete("/admin/plugins/nope").await, 404);
    assert_eq!(
        admin.post("/admin/plugins/nope/disable", json!({})).await.0,
        404
    );

    // The added plugin works for clients, with its env reference expanded.
    let mut c = gw.client();
    c.initialize().await;
    assert_eq!(
        c.tool_text(1, "extra__getenv", json!({"name": "FROM_REF"}))
            .await,
        "s3cret-value"
    );

    // Update: a new definition; disable and enable.
    let (status, updated) = admin
        .put(
            "/admin/plugins/extra",
            json!({"command": FIXTURE, "args": ["--name", "extra2"], "prefix": "x"}),
        )
        .await;
    assert_eq!(status, 200, "{updated}");
    assert_eq!(updated["prefix"], "x");
    admin.wait_state("extra", "ready").await;
    let (_, disabled) = admin.post("/admin/plugins/extra/disable", json!({})).await;
    assert_eq!(
        (disabled["enabled"].clone(), disabled["state"].clone()),
        (json!(false), json!("disabled"))
    );
    let (_, enabled) = admin.post("/admin/plugins/extra/enable", json!({})).await;
    assert_eq!(enabled["enabled"], true);
    admin.wait_state("extra", "ready").await;

    // Remove: 204, then gone; a config-file plugin can be removed too.
    assert_eq!(admin.delete("/admin/plugins/extra").await, 204);
    assert_eq!(admin.get("/admin/plugins/extra").await.0, 404);
    assert_eq!(admin.delete("/admin/plugins/main").await, 204);
    assert_eq!(
        names(&admin.get("/admin/plugins").await.1),
        Vec::<String>::new()
    );
}

/// Adds, changes and removes through the API, restarts the gateway on the same database, and
/// checks that every change is still there.
async fn changes_survive_a_restart(database_url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("gw.toml");
    std::fs::write(
        &cfg,
        format!(
            "[plugins.base]\ncommand = \"{FIXTURE}\"\n[plugins.doomed]\ncommand = \"{FIXTURE}\"\n"
        ),
    )
    .unwrap();
    let args = [
        "--admin-token",
        ADMIN_TOKEN,
        "--database-url",
        database_url,
        "--config",
        cfg.to_str().unwrap(),
    ];
    {
        let mut gw = Gateway::start(&args);
        let admin = Admin::of(&gw, ADMIN_TOKEN);
        assert_eq!(
            admin
                .post("/admin/plugins", fixture_plugin("added"))
                .await
                .0,
            201
        );
        assert_eq!(
            admin.post("/admin/plugins/base/disable", json!({})).await.0,
            200
        );
        assert_eq!(admin.delete("/admin/plugins/doomed").await, 204);
        assert!(gw.terminate().success());
    }
    let gw = Gateway::start(&args);
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    let (_, list) = admin.get("/admin/plugins").await;
    assert_eq!(names(&list), ["added", "base"], "{list}");
    let base = list["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "base")
        .unwrap();
    assert_eq!(base["enabled"], false);
    admin.wait_state("added", "ready").await;
    let mut c = gw.client();
    c.initialize().await;
    assert_eq!(
        c.tool_text(1, "echo", json!({"text": "from the database"}))
            .await,
        "from the database"
    );
}

#[tokio::test]
async fn registry_changes_survive_a_restart_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    changes_survive_a_restart(&format!(
        "sqlite://{}/registry.db?mode=rwc",
        dir.path().display()
    ))
    .await;
}

#[tokio::test]
async fn registry_changes_survive_a_restart_on_postgres() {
    let db = common::Postgres::create("registry");
    changes_survive_a_restart(&db.url).await;
}

#[tokio::test]
async fn removing_or_changing_a_plugin_stops_its_processes() {
    let gw = Gateway::start(&WITH_MAIN_PLUGIN);
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    assert_eq!(
        admin
            .post("/admin/plugins", fixture_plugin("extra"))
            .await
            .0,
        201
    );
    admin.wait_state("extra", "ready").await;
    let mut c = gw.client();
    c.initialize().await;
    let pid: u32 = c
        .tool_text(1, "extra__pid", json!({}))
        .await
        .parse()
        .unwrap();
    let (_, p) = admin.get("/admin/plugins/extra").await;
    assert_eq!(p["running_children"], 1);
    assert_eq!(
        admin
            .put(
                "/admin/plugins/extra",
                json!({"command": FIXTURE, "args": ["--name", "v2"]})
            )
            .await
            .0,
        200
    );
    wait_until(
        "the old definition's process stopped",
        Duration::from_secs(15),
        || !alive(pid),
    )
    .await;
    admin.wait_state("extra", "ready").await;
    let pid: u32 = c
        .tool_text(2, "extra__pid", json!({}))
        .await
        .parse()
        .unwrap();
    assert_eq!(admin.delete("/admin/plugins/extra").await, 204);
    wait_until(
        "the removed plugin's process stopped",
        Duration::from_secs(15),
        || !alive(pid),
    )
    .await;
}

#[tokio::test]
async fn reload_applies_a_valid_config_and_refuses_an_invalid_one() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("gw.toml");
    std::fs::write(&cfg, format!("[plugins.one]\ncommand = \"{FIXTURE}\"\n")).unwrap();
    let gw = Gateway::start(&[
        "--admin-token",
        ADMIN_TOKEN,
        "--config",
        cfg.to_str().unwrap(),
    ]);
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    std::fs::write(
        &cfg,
        format!("[plugins.one]\ncommand = \"{FIXTURE}\"\n[plugins.two]\ncommand = \"{FIXTURE}\"\n"),
    )
    .unwrap();
    let (status, body) = admin.post("/admin/reload", json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(names(&admin.get("/admin/plugins").await.1), ["one", "two"]);

    // An invalid file changes nothing, and says why.
    std::fs::write(&cfg, "[plugins.one]\ncomand = \"x\"\n").unwrap();
    let (status, body) = admin.post("/admin/reload", json!({})).await;
    assert_eq!(status, 422);
    assert!(body["error"].as_str().unwrap().contains("comand"), "{body}");
    assert_eq!(names(&admin.get("/admin/plugins").await.1), ["one", "two"]);

    // SIGHUP reloads too.
    std::fs::write(&cfg, format!("[plugins.three]\ncommand = \"{FIXTURE}\"\n")).unwrap();
    gw.signal("-HUP");
    gw.wait_log_count("configuration reloaded", 2).await;
    assert_eq!(names(&admin.get("/admin/plugins").await.1), ["three"]);
}

#[tokio::test]
async fn regression_a_registry_change_while_a_plugin_starts_does_not_hang_the_call() {
    // Guards: a change during a plugin's start dropped the new process with the request still
    // pending on it: the client never got an answer.
    let gw = Gateway::start(&WITH_MAIN_PLUGIN);
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    let slow =
        json!({"name": "slowstart", "command": FIXTURE, "args": ["--start-delay-ms", "1500"]});
    assert_eq!(admin.post("/admin/plugins", slow).await.0, 201);
    admin.wait_state("slowstart", "ready").await;
    let mut c = gw.client();
    c.initialize().await;
    let call = {
        let c = c.clone();
        tokio::spawn(async move {
            c.call(
                1,
                "tools/call",
                json!({"name": "slowstart__echo", "arguments": {"text": "x"}}),
            )
            .await
        })
    };
    gw.wait_log_count("plugin started plugin=slowstart", 2)
        .await;
    let changed = json!({"command": FIXTURE, "args": ["--start-delay-ms", "10"]});
    assert_eq!(admin.put("/admin/plugins/slowstart", changed).await.0, 200);
    let r = tokio::time::timeout(Duration::from_secs(20), call)
        .await
        .expect("answered, not hung")
        .unwrap();
    let last = r.last();
    assert!(
        last.get("result").is_some()
            || last["error"]["message"]
                .as_str()
                .unwrap()
                .contains("slowstart"),
        "{r:?}"
    );
}

/// `mcp-gateway check` on a config file: its exit code and stderr.
fn check(dir: &tempfile::TempDir, text: &str) -> (i32, String) {
    let path = common::write_config(dir, text);
    let (code, _, err) = run_cli(&["check", "--config", &path], &[]);
    (code, err)
}

#[tokio::test]
async fn regression_an_empty_prefix_is_refused() {
    // Guards: `prefix = ""` was accepted, and the plugin's tools became `__name`.
    let dir = tempfile::tempdir().unwrap();
    let (code, err) = check(
        &dir,
        &format!("[plugins.a]\ncommand = \"{FIXTURE}\"\nprefix = \"\"\n"),
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("plugins.a.prefix") && err.contains("empty"),
        "{err}"
    );

    let gw = Gateway::start(&WITH_MAIN_PLUGIN);
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    let mut p = fixture_plugin("b");
    p["prefix"] = json!("");
    let (status, body) = admin.post("/admin/plugins", p).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("prefix"), "{body}");
}

#[tokio::test]
async fn a_prefix_that_would_break_tool_names_is_refused_naming_the_plugin() {
    // Tool names may hold only ASCII letters, digits, '_', '-' and '.', and at most 128 of
    // them (2025-11-25): a prefix is checked for both before any tool is known.
    let dir = tempfile::tempdir().unwrap();
    let long = "p".repeat(63);
    for (prefix, why) in [
        ("my tools", "may hold only"),
        ("a/b", "may hold only"),
        (long.as_str(), "at most 64"),
    ] {
        let (code, err) = check(
            &dir,
            &format!("[plugins.a]\ncommand = \"{FIXTURE}\"\nprefix = \"{prefix}\"\n"),
        );
        assert_ne!(code, 0, "{prefix}");
        assert!(
            err.contains("plugins.a.prefix") && err.contains(why),
            "{err}"
        );
    }
    let (code, err) = check(
        &dir,
        &format!("separator = \"::\"\n[plugins.a]\ncommand = \"{FIXTURE}\"\n"),
    );
    assert_ne!(code, 0);
    assert!(err.contains("separator"), "{err}");

    let gw = Gateway::start(&WITH_MAIN_PLUGIN);
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    for prefix in ["a/b", long.as_str()] {
        let mut p = fixture_plugin("b");
        p["prefix"] = json!(prefix);
        let (status, body) = admin.post("/admin/plugins", p).await;
        assert_eq!(status, 400, "{body}");
        assert!(
            body["error"].as_str().unwrap().contains("plugins.b.prefix"),
            "{body}"
        );
    }
    // A plugin name is a prefix too, once there are several plugins.
    let (status, body) = admin
        .post("/admin/plugins", fixture_plugin(&"n".repeat(70)))
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        admin.post("/admin/plugins", fixture_plugin("b")).await.0,
        201
    );
}

#[tokio::test]
async fn regression_a_plugin_is_never_given_the_gateways_secrets() {
    // Guards: a plugin's `env` could name `${MCP_GATEWAY_ADMIN_TOKEN}` (or the database URL,
    // password and all), and every plugin inherited them from the gateway's environment.
    let dir = tempfile::tempdir().unwrap();
    for secret in ["MCP_GATEWAY_ADMIN_TOKEN", "MCP_GATEWAY_DATABASE_URL"] {
        let (code, err) = check(
            &dir,
            &format!("[plugins.a]\ncommand = \"{FIXTURE}\"\nenv = {{ T = \"x-${{{secret}}}\" }}\n"),
        );
        assert_ne!(code, 0, "{secret} accepted");
        assert!(
            err.contains("plugins.a.env.T") && err.contains(secret),
            "{err}"
        );
    }

    let gw = Gateway::start_with_env(
        &["--plugin-name", "main", "--", FIXTURE],
        &[
            ("MCP_GATEWAY_ADMIN_TOKEN", ADMIN_TOKEN),
            ("HARMLESS", "visible"),
        ],
    );
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    let mut p = fixture_plugin("b");
    p["env"] = json!({"T": "${MCP_GATEWAY_ADMIN_TOKEN}"});
    let (status, body) = admin.post("/admin/plugins", p).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("MCP_GATEWAY_ADMIN_TOKEN"),
        "{body}"
    );
    // Nor does a plugin inherit them.
    let mut c = gw.client();
    c.initialize().await;
    let seen = |name: &'static str| {
        let c = c.clone();
        async move { c.tool_text(1, "getenv", json!({ "name": name })).await }
    };
    assert_eq!(seen("MCP_GATEWAY_ADMIN_TOKEN").await, "(unset)");
    // Nor anything else of the gateway's environment: a plugin's is clean (issue 39).
    assert_eq!(seen("HARMLESS").await, "(unset)");
    assert_ne!(seen("PATH").await, "(unset)");
}

#[tokio::test]
async fn regression_a_plugin_is_never_given_the_cluster_secrets() {
    // Guards: in cluster mode from the environment (as the deployment files set it), every
    // plugin inherited the Redis URL (its password, and the way to every session's record
    // and events) and the cluster secret (the way to speak to a replica as another one).
    let dir = tempfile::tempdir().unwrap();
    for secret in ["MCP_GATEWAY_REDIS_URL", "MCP_GATEWAY_CLUSTER_SECRET"] {
        let (code, err) = check(
            &dir,
            &format!("[plugins.a]\ncommand = \"{FIXTURE}\"\nenv = {{ T = \"${{{secret}}}\" }}\n"),
        );
        assert_ne!(code, 0, "{secret} accepted");
        assert!(
            err.contains("plugins.a.env.T") && err.contains(secret),
            "{err}"
        );
    }

    common::cluster::assert_redis_up();
    let prefix = format!("test-{:016x}:", rand::random::<u64>());
    // Its keys go when the test ends, after the gateway (dropped first), also on a failure.
    struct Keys(String);
    impl Drop for Keys {
        fn drop(&mut self) {
            common::cluster::delete_redis_keys(&self.0);
        }
    }
    let _keys = Keys(prefix.clone());
    let gw = Gateway::start_with_env(
        &["--plugin-name", "main", "--", FIXTURE],
        &[
            ("MCP_GATEWAY_REDIS_URL", common::cluster::REDIS_URL),
            ("MCP_GATEWAY_REDIS_KEY_PREFIX", &prefix),
            (
                "MCP_GATEWAY_CLUSTER_SECRET",
                "a-cluster-secret-of-this-test",
            ),
            ("HARMLESS", "visible"),
        ],
    );
    let mut c = gw.client();
    c.initialize().await;
    // Cluster mode is on: the session's record is in Redis under this test's prefix.
    assert!(
        !common::cluster::redis_scan(&prefix).is_empty(),
        "no key under {prefix}"
    );
    let seen = |name: &'static str| {
        let c = c.clone();
        async move { c.tool_text(1, "getenv", json!({ "name": name })).await }
    };
    assert_eq!(seen("MCP_GATEWAY_REDIS_URL").await, "(unset)");
    assert_eq!(seen("MCP_GATEWAY_CLUSTER_SECRET").await, "(unset)");
    // A plugin's environment is clean (issue 39): not even what is no secret.
    assert_eq!(seen("MCP_GATEWAY_REDIS_KEY_PREFIX").await, "(unset)");
    assert_eq!(seen("HARMLESS").await, "(unset)");
}

/// Audit records are JSON lines under the target `mcp_gateway::audit` in the text log too,
/// with the arguments hashed, and the records of calls a stop ended are stored before the
/// exit (read back from the same database after a restart).
#[tokio::test]
async fn audit_records_are_json_lines_and_survive_a_stop() {
    let db = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/gw.db?mode=rwc", db.path().display());
    let args = [
        "--admin-token",
        ADMIN_TOKEN,
        "--database-url",
        &url,
        "--plugin-name",
        "main",
        "--",
        FIXTURE,
    ];
    let mut gw = Gateway::start(&args);
    let mut c = gw.client();
    c.initialize().await;
    c.tool_text(1, "echo", json!({"text": "do-not-log"})).await;
    gw.wait_log("mcp_gateway::audit").await;
    let log = gw.log();
    let line = log
        .lines()
        .find(|l| l.contains("mcp_gateway::audit"))
        .unwrap();
    let record: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(record["target"], "mcp_gateway::audit");
    let fields = &record["fields"];
    assert_eq!(fields["kind"], "tools/call");
    assert_eq!(fields["target"], "echo");
    assert_eq!(fields["outcome"], "ok");
    assert!(
        fields["arguments"]
            .as_str()
            .unwrap()
            .starts_with("hmac-sha256:")
    );
    assert!(!log.contains("do-not-log"));
    // A call in flight when the stop comes: its record is stored before the exit.
    let slow = c.spawn_slow(2, 1500);
    gw.wait_metric(
        "mcp_gateway_plugin_requests_in_flight{plugin=\"main\"}",
        1.0,
    )
    .await;
    gw.terminate();
    let _ = slow.await;
    let gw = Gateway::start(&args);
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    let (status, body) = admin.get("/admin/audit?kind=tools/call").await;
    assert_eq!(status, 200);
    let targets: Vec<&str> = body["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["target"].as_str().unwrap())
        .collect();
    assert_eq!(targets, ["slow", "echo"], "{body}");
}

/// The audit log on PostgreSQL (as replicas share it): records stored in segments of their
/// lines are found again by every filter, a value with quotes and backslashes in it too.
#[tokio::test]
async fn audit_records_are_stored_and_found_on_postgres() {
    let db = common::Postgres::create("audit");
    let args = [
        "--admin-token",
        ADMIN_TOKEN,
        "--database-url",
        &db.url,
        "--plugin-name",
        "main",
        "--",
        FIXTURE,
    ];
    let gw = Gateway::start(&args);
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    let mut c = gw.client();
    c.initialize().await;
    c.tool_text(1, "echo", json!({"text": "one"})).await;
    // Stored before the next ones: two segments.
    let (status, _) = admin.get("/admin/audit").await;
    assert_eq!(status, 200);
    c.tool_text(2, "echo", json!({"text": "two"})).await;
    let strange = "no \"such\" \\ tool";
    let r = c
        .call(3, "tools/call", json!({"name": strange, "arguments": {}}))
        .await;
    assert!(r.last()["error"].is_object());
    let targets = |body: &Value| -> Vec<String> {
        body["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["target"].as_str().unwrap().to_owned())
            .collect()
    };
    let (_, body) = admin.get("/admin/audit?kind=tools/call").await;
    assert_eq!(targets(&body), [strange, "echo", "echo"], "{body}");
    let (_, body) = admin
        .get("/admin/audit?kind=tools/call&outcome=ok&limit=1")
        .await;
    assert_eq!(targets(&body), ["echo"], "{body}");
    let tool: String = url::form_urlencoded::byte_serialize(strange.as_bytes()).collect();
    let (_, body) = admin.get(&format!("/admin/audit?tool={tool}")).await;
    assert_eq!(targets(&body), [strange], "{body}");
    assert_eq!(body["records"][0]["outcome"], "refused");
    let (_, body) = admin.get("/admin/audit?tool=echo&plugin=nobody").await;
    assert_eq!(targets(&body), Vec::<String>::new(), "{body}");
}

/// Guards: a plugin wrote a whole audit record's JSON line to its stderr, and the text log
/// showed it unescaped beside the real ones. A plugin's stderr is quoted in text lines: every
/// line that reads as an audit record is the gateway's own.
#[tokio::test]
async fn a_plugin_cannot_forge_audit_lines() {
    let gw = Gateway::start(&WITH_MAIN_PLUGIN);
    let mut c = gw.client();
    c.initialize().await;
    let forged = json!({"timestamp": "2026-12-05T00:00:00Z", "level": "INFO", "fields": {
        "message": "audit", "id": "forged", "kind": "tools/call", "subject": "alice",
        "target": "delete_everything", "outcome": "ok"}, "target": "mcp_gateway::audit"});
    c.tool_text(1, "stderr", json!({"text": forged.to_string()}))
        .await;
    c.tool_text(2, "echo", json!({"text": "real"})).await;
    gw.wait_log("delete_everything").await;
    let log = gw.log();
    for line in log.lines() {
        if let Ok(record) = serde_json::from_str::<Value>(line) {
            assert_ne!(record["fields"]["id"], "forged", "{line}");
        }
        // Anywhere in a line, the plugin's text is a quoted string, not a JSON object.
        if line.contains("delete_everything") {
            assert!(
                line.contains(r#"mcp_gateway::plugin: "{\"fields\":"#),
                "not quoted: {line}"
            );
        }
    }
    assert!(
        log.contains("delete_everything"),
        "the plugin's line is logged: {log}"
    );
}

/// `RUST_LOG=mcp_gateway::audit=off` silences the records' lines, not the records (README,
/// "Audit log").
#[tokio::test]
async fn audit_lines_can_be_turned_off_and_records_are_still_stored() {
    let mut gw = Gateway::start_with_env(
        &WITH_MAIN_PLUGIN,
        &[("RUST_LOG", "info,mcp_gateway=debug,mcp_gateway::audit=off")],
    );
    let mut c = gw.client();
    c.initialize().await;
    c.tool_text(1, "echo", json!({"text": "quiet"})).await;
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    // The API answers once what came before it is stored.
    let (status, body) = admin.get("/admin/audit?kind=tools/call").await;
    assert_eq!(status, 200);
    assert_eq!(body["records"][0]["target"], "echo", "{body}");
    // Its line, had there been one, was written before the record was stored; the gateway's
    // last line comes after it, so once that is read nothing is still in the pipe.
    gw.terminate();
    gw.wait_log("mcp_gateway::server: stopped").await;
    let log = gw.log();
    assert!(log.contains("plugin started"), "the log is read: {log}");
    assert!(!log.contains("mcp_gateway::audit"), "{log}");
}
