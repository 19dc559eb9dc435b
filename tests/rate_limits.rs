//! Rate limits (issue 24, `[limits]`): a caller over a limit gets 429 with `Retry-After` and
//! a JSON-RPC error naming the limit, and its call never reaches the plugin; another caller
//! is not limited; plugin and tool patterns; a 2026-07-28 request refused with its id; the
//! admin API and `/metrics` show the limits; in cluster mode two replicas count in one bucket
//! (the test Redis, under a key prefix of the test's own).
//!
//! The gateways trust 127.0.0.1 as a proxy, so `X-Forwarded-For` makes callers of different
//! addresses (authorization is off: the client address is the caller); with authorization
//! on, two tokens of different subjects from one address are two callers.

mod common;

use common::cluster::{ClusterFlags, redis_scan};
use common::modern::{MODERN, Modern};
use common::{Admin, Client, FIXTURE, Gateway, write_config};
use serde_json::{Value, json};

const ADMIN_TOKEN: &str = "limits-admin-token-0001";

fn gateway(dir: &tempfile::TempDir, limits: &str, plugins: &[&str], extra: &[&str]) -> Gateway {
    let mut text = format!("[limits]\n{limits}\n");
    for p in plugins {
        text.push_str(&format!("[plugins.{p}]\ncommand = \"{FIXTURE}\"\n"));
    }
    let cfg = write_config(dir, &text);
    let mut args = vec![
        "--config",
        &cfg,
        "--admin-token",
        ADMIN_TOKEN,
        "--trusted-proxies",
        "127.0.0.1",
    ];
    args.extend_from_slice(extra);
    Gateway::start(&args)
}

async fn client_from(gw: &Gateway, address: &str) -> Client {
    let mut c = gw.client().with_header("x-forwarded-for", address);
    c.initialize().await;
    c
}

/// Asserts a 429 naming `limit` (with its `rate`) for request `id`; returns `Retry-After`.
fn assert_limited(reply: &common::Reply, id: i64, limit: &str, rate: &str) -> u64 {
    assert_eq!(reply.status, 429, "{reply:?}");
    let message = reply.last();
    assert_eq!(message["id"], id, "{message}");
    let text = message["error"]["message"].as_str().unwrap_or_default();
    assert!(
        text.contains(&format!("rate limit `{limit}`")) && text.contains(rate),
        "the limit is named: {text}"
    );
    reply.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .expect("Retry-After in seconds")
}

#[tokio::test]
async fn a_caller_over_its_limit_gets_429_while_another_caller_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(
        &dir,
        "per_subject = { rate = \"2/min\", burst = 2 }",
        &["a"],
        &[],
    );
    let alice = client_from(&gw, "203.0.113.1").await;
    let bob = client_from(&gw, "203.0.113.2").await;
    for (id, text) in [(1, "first call"), (2, "second call")] {
        let r = alice
            .result(
                id,
                "tools/call",
                json!({"name": "stderr", "arguments": {"text": text}}),
            )
            .await;
        assert_eq!(r["content"][0]["text"], "written");
    }
    gw.wait_log("second call").await;
    let r = alice
        .call(
            3,
            "tools/call",
            json!({"name": "stderr", "arguments": {"text": "over the limit"}}),
        )
        .await;
    let retry = assert_limited(
        &r,
        3,
        "subject",
        "for this client address: 2 calls per minute",
    );
    // A token comes back every 30 s.
    assert!((1..=30).contains(&retry), "Retry-After {retry}");
    // Lists are not counted; the limited caller still sees what it may call.
    alice.result(4, "tools/list", json!({})).await;
    // Another address has a bucket of its own.
    for id in 1..=2 {
        assert_eq!(bob.tool_text(id, "echo", json!({"text": "b"})).await, "b");
    }
    assert_eq!(
        bob.call(3, "tools/call", json!({"name": "echo"}))
            .await
            .status,
        429
    );

    assert_eq!(
        gw.metric("mcp_gateway_rate_limited_total{limit=\"subject\"}")
            .await,
        Some(2.0)
    );
    let (status, limits) = Admin::of(&gw, ADMIN_TOKEN).get("/admin/limits").await;
    assert_eq!(status, 200, "{limits}");
    assert_eq!(limits["shared"], false);
    let rule = &limits["limits"][0];
    assert_eq!(
        (
            &rule["name"],
            &rule["rate"],
            &rule["burst"],
            &rule["refused"]
        ),
        (
            &json!("subject"),
            &json!("2 calls per minute"),
            &json!(2),
            &json!(2)
        ),
        "{limits}"
    );
    assert!(
        !gw.log().contains("over the limit"),
        "a refused call never reaches the plugin"
    );
}

#[tokio::test]
async fn plugin_and_tool_patterns_limit_only_what_they_name() {
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(
        &dir,
        "[[limits.rules]]\nplugin = \"f*\"\nrate = \"1/h\"\n\
         [[limits.rules]]\ntool = \"*__pid\"\nrate = \"1/h\"\n",
        &["fs", "time"],
        &[],
    );
    let c = client_from(&gw, "203.0.113.7").await;
    assert_eq!(c.tool_text(1, "fs__echo", json!({"text": "x"})).await, "x");
    let r = c
        .call(
            2,
            "tools/call",
            json!({"name": "fs__echo", "arguments": {"text": "y"}}),
        )
        .await;
    let retry = assert_limited(
        &r,
        2,
        "plugin:f*",
        "for this client address: 1 call per hour",
    );
    assert!((3500..=3600).contains(&retry), "Retry-After {retry}");
    // A prompt of the limited plugin counts too; one of the other plugin does not.
    let r = c
        .call(20, "prompts/get", json!({"name": "fs__test_simple_prompt"}))
        .await;
    assert_limited(&r, 20, "plugin:f*", "1 call per hour");
    c.result(
        21,
        "prompts/get",
        json!({"name": "time__test_simple_prompt"}),
    )
    .await;
    // The other plugin is not limited by the plugin rule...
    for id in 3..6 {
        assert_eq!(
            c.tool_text(id, "time__echo", json!({"text": "t"})).await,
            "t"
        );
    }
    // ...but its tools that match the tool rule are.
    c.tool_text(6, "time__pid", json!({})).await;
    let r = c.call(7, "tools/call", json!({"name": "time__pid"})).await;
    assert_limited(&r, 7, "tool:*__pid", "1 call per hour");
    // Another address is not limited by either.
    let other = client_from(&gw, "203.0.113.8").await;
    assert_eq!(
        other.tool_text(1, "fs__echo", json!({"text": "z"})).await,
        "z"
    );
    other.tool_text(2, "time__pid", json!({})).await;

    let (_, limits) = Admin::of(&gw, ADMIN_TOKEN).get("/admin/limits").await;
    let names: Vec<&str> = limits["limits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["plugin:f*", "tool:*__pid"], "{limits}");
    for (limit, n) in [("plugin:f*", 2.0), ("tool:*__pid", 1.0)] {
        assert_eq!(
            gw.metric(&format!(
                "mcp_gateway_rate_limited_total{{limit=\"{limit}\"}}"
            ))
            .await,
            Some(n),
            "{limit}"
        );
    }
}

/// A 2026-07-28 `tools/call` by hand: status, `Retry-After` and the JSON-RPC message.
async fn modern_call(c: &Client, id: i64, text: &str) -> (u16, Option<String>, Value) {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": "echo",
        "arguments": {"text": text},
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientInfo": {"name": "limits-test", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {},
        },
    }});
    let r = c
        .request(reqwest::Method::POST)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", MODERN)
        .header("mcp-method", "tools/call")
        .header("mcp-name", "echo")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let text = r.text().await.unwrap();
    let json = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .next_back()
        .unwrap_or(&text);
    (status, retry, serde_json::from_str(json).unwrap())
}

#[tokio::test]
async fn a_modern_request_over_a_limit_is_refused_with_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(&dir, "per_subject = { rate = \"1/min\" }", &["a"], &[]);
    let c = gw.client().with_header("x-forwarded-for", "198.51.100.4");
    let (status, _, m) = modern_call(&c, 1, "hello").await;
    assert_eq!(status, 200, "{m}");
    assert_eq!(m["result"]["content"][0]["text"], "hello");
    let (status, retry, m) = modern_call(&c, 2, "again").await;
    assert_eq!(status, 429, "{m}");
    assert_eq!(m["id"], 2, "{m}");
    let message = m["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("rate limit `subject` for this client address: 1 call per minute"),
        "{message}"
    );
    let retry: u64 = retry.expect("Retry-After").parse().unwrap();
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    // Discovery is not counted.
    let modern = Modern::new(c.clone(), json!({}));
    assert_eq!(
        modern.post(3, "server/discover", json!({})).await.status,
        200
    );
    // Another address is not limited.
    let other = gw.client().with_header("x-forwarded-for", "198.51.100.5");
    assert_eq!(modern_call(&other, 1, "x").await.0, 200);
}

#[tokio::test]
async fn replicas_of_a_cluster_share_one_bucket_per_caller() {
    let flags = ClusterFlags::new();
    let dir = tempfile::tempdir().unwrap();
    let limits = "per_subject = { rate = \"2/min\", burst = 2 }";
    let replicas: Vec<Gateway> = (0..2)
        .map(|_| {
            let port = common::free_port();
            let listen = format!("127.0.0.1:{port}");
            let mut extra: Vec<String> = vec!["--listen".into(), listen];
            extra.extend(flags.for_port(port));
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            gateway(&dir, limits, &["a"], &extra)
        })
        .collect();
    let on = |i: usize| {
        replicas[i]
            .client()
            .with_header("x-forwarded-for", "192.0.2.9")
    };
    // Two calls on replica 0 (each in a session of its own there)...
    for id in 1..=2 {
        let mut c = on(0);
        c.initialize().await;
        assert_eq!(c.tool_text(id, "echo", json!({"text": "r0"})).await, "r0");
    }
    // ...leave nothing for the same caller on replica 1, legacy or modern.
    let mut c = on(1);
    c.initialize().await;
    let r = c.call(3, "tools/call", json!({"name": "echo"})).await;
    assert_limited(&r, 3, "subject", "2 calls per minute");
    assert_eq!(modern_call(&on(1), 4, "m").await.0, 429);
    // Another caller is served by both.
    for replica in &replicas {
        let other = replica
            .client()
            .with_header("x-forwarded-for", "192.0.2.10");
        assert_eq!(modern_call(&other, 1, "o").await.0, 200);
    }
    let keys = redis_scan(&format!("{}ratelimit:", flags.key_prefix()));
    assert!(
        keys.iter()
            .any(|k| k.ends_with("subject:address 192.0.2.9")),
        "the bucket is in Redis under the test's prefix: {keys:?}"
    );
    let (_, limits) = Admin::of(&replicas[1], ADMIN_TOKEN)
        .get("/admin/limits")
        .await;
    assert_eq!(limits["shared"], true, "{limits}");
}

#[tokio::test]
async fn a_replica_whose_redis_does_not_answer_limits_on_its_own() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens on this port: every call to Redis fails at once.
    let redis = format!("redis://127.0.0.1:{}", common::free_port());
    let port = common::free_port();
    let listen = format!("127.0.0.1:{port}");
    let advertise = format!("http://{listen}");
    let secret = format!("{:032x}", rand::random::<u128>());
    let gw = gateway(
        &dir,
        "per_subject = { rate = \"1/min\" }",
        &["a"],
        &[
            "--listen",
            &listen,
            "--redis-url",
            &redis,
            "--cluster-secret",
            &secret,
            "--advertise-url",
            &advertise,
        ],
    );
    let c = gw.client().with_header("x-forwarded-for", "192.0.2.77");
    let (status, _, m) = modern_call(&c, 1, "alone").await;
    assert_eq!(status, 200, "{m}");
    gw.wait_log("counting on this replica alone").await;
    let (status, _, m) = modern_call(&c, 2, "again").await;
    assert_eq!(status, 429, "{m}");
}

#[tokio::test]
async fn with_authorization_on_each_token_subject_has_its_own_bucket() {
    use common::oauth::{AuthGateway, authorize, exchange, pkce, public_client, robot_token};
    let gw = AuthGateway::start(
        "[limits]\n[[limits.rules]]\nplugin = \"fix\"\nrate = \"1/min\"\n",
        None,
    );
    let robot = robot_token(&gw).await;
    let client = public_client(&gw).await;
    let (verifier, challenge) = pkce();
    let code = authorize(&gw, &client, &challenge, "alice", "mcp").await;
    let (status, tokens) = exchange(&gw, &client, &code, &verifier).await;
    assert_eq!(status, 200, "{tokens}");
    let alice = tokens["access_token"].as_str().unwrap();

    let mut as_robot = gw.gw.client().with_token(&robot);
    as_robot.initialize().await;
    assert_eq!(
        as_robot
            .tool_text(1, "fix__echo", json!({"text": "r"}))
            .await,
        "r"
    );
    let r = as_robot
        .call(
            2,
            "tools/call",
            json!({"name": "fix__echo", "arguments": {"text": "r"}}),
        )
        .await;
    assert_limited(&r, 2, "plugin:fix", "for this subject: 1 call per minute");
    // Alice, from the same address, has a bucket of her own.
    let mut as_alice = gw.gw.client().with_token(alice);
    as_alice.initialize().await;
    assert_eq!(
        as_alice
            .tool_text(1, "fix__echo", json!({"text": "a"}))
            .await,
        "a"
    );
    let r = as_alice
        .call(2, "tools/call", json!({"name": "fix__echo"}))
        .await;
    assert_eq!(r.status, 429, "{r:?}");
    // A plugin that needs a scope the robot lacks: refused at the door (403).
    let r = as_robot
        .call(
            3,
            "tools/call",
            json!({"name": "vault__echo", "arguments": {"text": "v"}}),
        )
        .await;
    assert_eq!(r.status, 403, "{r:?}");
    // The audit log names each call's subject; a filter by subject finds only theirs. Calls
    // refused at the door are recorded as refused, with the HTTP status they got.
    let admin = common::Admin::of(&gw.gw, common::oauth::ADMIN_TOKEN);
    let (_, refused) = admin.get("/admin/audit?outcome=refused").await;
    let refusals: Vec<(&str, &str, i64)> = refused["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["subject"].as_str().unwrap(),
                r["target"].as_str().unwrap(),
                r["error_code"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        refusals,
        [
            (common::oauth::ROBOT.0, "vault__echo", 403),
            ("alice", "fix__echo", 429),
            (common::oauth::ROBOT.0, "fix__echo", 429),
        ]
    );
    let (status, all) = admin.get("/admin/audit?tool=fix__echo&outcome=ok").await;
    assert_eq!(status, 200, "{all}");
    let subjects: Vec<&str> = all["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["subject"].as_str().unwrap())
        .collect();
    assert_eq!(subjects, ["alice", common::oauth::ROBOT.0]);
    let (_, alices) = admin.get("/admin/audit?subject=alice").await;
    assert_eq!(alices["records"].as_array().unwrap().len(), 2, "{alices}");
    assert_eq!(alices["records"][1]["outcome"], "ok");
}

#[tokio::test]
async fn a_batch_refused_whole_is_one_audit_record_with_its_count_and_calls_stay_recorded() {
    // Guards: every member of a refused 2025-03-26 batch was recorded, so a few large batches
    // filled the audit queue and the same client's real calls meanwhile ran unrecorded. A
    // batch refused whole is one record with its count, and every call that ran has one.
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(
        &dir,
        "per_subject = { rate = \"3/min\", burst = 3 }",
        &["a"],
        &[],
    );
    let mut c = gw.client().with_header("x-forwarded-for", "203.0.113.9");
    c.initialize_at("2025-03-26", json!({})).await;
    for id in 1..=3 {
        assert_eq!(c.tool_text(id, "echo", json!({"text": "ran"})).await, "ran");
    }
    let batch: Vec<Value> = (100..600)
        .map(|id| {
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                   "params": {"name": "echo", "arguments": {"text": "refused"}}})
        })
        .collect();
    for _ in 0..4 {
        let r = c.post(&Value::Array(batch.clone())).await;
        assert_eq!(r.status, 429, "{r:?}");
    }
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    let (status, body) = admin.get("/admin/audit?kind=tools/call&limit=1000").await;
    assert_eq!(status, 200, "{body}");
    let records = body["records"].as_array().unwrap();
    let refused: Vec<&Value> = records
        .iter()
        .filter(|r| r["outcome"] == "refused")
        .collect();
    assert_eq!(refused.len(), 4, "one record per refused batch: {body:#}");
    for r in &refused {
        assert_eq!(r["count"], 500, "{r}");
        assert_eq!(r["error_code"], 429, "{r}");
        assert_eq!(r["target"], "echo", "{r}");
    }
    let ran = records.iter().filter(|r| r["outcome"] == "ok").count();
    assert_eq!(ran, 3, "every call that ran is recorded: {body:#}");
    assert!(
        records
            .iter()
            .filter(|r| r["outcome"] == "ok")
            .all(|r| r["count"].is_null())
    );
}

#[tokio::test]
async fn completions_and_subscriptions_run_plugin_code_and_are_counted() {
    // Guards: `completion/complete` and `resources/subscribe` ran plugin code uncounted, so a
    // caller over its limit went on without one. They are counted now; an unsubscribe is not
    // (a limited caller can still let go).
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(
        &dir,
        "per_subject = { rate = \"2/min\", burst = 2 }",
        &["a"],
        &[],
    );
    let c = client_from(&gw, "203.0.113.20").await;
    let complete = json!({"ref": {"type": "ref/prompt", "name": "test_prompt_with_arguments"},
                          "argument": {"name": "arg1", "value": "t"}});
    let r = c.result(1, "completion/complete", complete.clone()).await;
    assert_eq!(r["completion"]["values"][0], "test-one");
    c.result(
        2,
        "resources/subscribe",
        json!({"uri": "test://static-text"}),
    )
    .await;
    let r = c.call(3, "completion/complete", complete).await;
    assert_limited(&r, 3, "subject", "2 calls per minute");
    let r = c
        .call(
            4,
            "resources/subscribe",
            json!({"uri": "test://static-text"}),
        )
        .await;
    assert_limited(&r, 4, "subject", "2 calls per minute");
    let r = c
        .call(
            5,
            "resources/unsubscribe",
            json!({"uri": "test://static-text"}),
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.last()["result"].is_object(), "{r:?}");
}
