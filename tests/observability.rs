//! What operators watch: Prometheus metrics, `/healthz` and `/readyz` on the admin listener
//! (and not on the public port), request logs that carry the session and the plugin and never
//! a token, and W3C trace context passed to plugins.

mod common;

use std::time::Duration;

use common::{FIXTURE, Gateway, Postgres, metric_in};
use serde_json::{Value, json};

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[tokio::test]
async fn probes_and_metrics_live_on_the_admin_listener_only() {
    let gw = Gateway::fixture(&[], &[]);
    let (status, body) = gw.admin_get("/healthz").await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["status"],
        "ok"
    );

    let (status, body) = gw.admin_get("/readyz").await;
    assert_eq!(status, 200, "{body}");
    let ready: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(ready["status"], "ready");
    assert_eq!(ready["checks"]["database"]["ok"], true);
    assert_eq!(ready["checks"]["listening"]["ok"], true);
    assert_eq!(ready["checks"]["plugins"]["enabled"], 1);

    // Without an admin token the admin API is off, and says how to turn it on.
    let (status, body) = gw.admin_get("/admin/plugins").await;
    assert_eq!(status, 404);
    assert!(body.contains("admin.token"), "{body}");

    // The container health check asks the same endpoint.
    let admin = gw.admin.clone().unwrap();
    let check = |addr: &str| {
        std::process::Command::new(common::GATEWAY)
            .args(["healthcheck", "--admin-listen", addr])
            .env_remove("MCP_GATEWAY_CONFIG")
            .output()
            .unwrap()
    };
    let ok = check(&admin);
    assert_eq!(ok.status.code(), Some(0), "{ok:?}");
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let down = check(&closed);
    assert_eq!(down.status.code(), Some(1), "{down:?}");
    assert!(String::from_utf8_lossy(&down.stderr).contains("/healthz"));

    // None of it is on the public port.
    let public = format!("http://{}", gw.addr);
    for path in ["/metrics", "/healthz", "/readyz"] {
        let r = reqwest::get(format!("{public}{path}")).await.unwrap();
        assert_eq!(r.status().as_u16(), 404, "{path} on the public port");
    }
}

#[tokio::test]
async fn metrics_count_requests_sessions_streams_replays_and_plugins() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::write_config(
        &dir,
        &format!(
            "[plugins.fx]\ncommand = \"{FIXTURE}\"\nrequest_timeout_secs = 1\nresponse_mode = \"sse\"\n"
        ),
    );
    let gw = Gateway::start(&["--config", &config]);
    let mut c = gw.client();
    c.initialize().await;
    assert_eq!(c.tool_text(1, "echo", json!({"text": "hi"})).await, "hi");
    assert_eq!(
        c.tool_text(2, "echo", json!({"text": "again"})).await,
        "again"
    );

    // A refusal, a raw URI with a query string, and a path nothing serves.
    let no_session = common::Client::new(&gw.url)
        .call(3, "tools/list", json!({}))
        .await;
    assert_eq!(no_session.status, 400);
    let odd = reqwest::Client::new()
        .post(format!("{}?token=sekrit-query-value", gw.url))
        .header("content-type", "application/json")
        .header("accept", common::ACCEPT_BOTH)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(odd.status().as_u16(), 400);
    let nowhere = reqwest::get(format!("http://{}/nope/12345", gw.addr))
        .await
        .unwrap();
    assert_eq!(nowhere.status().as_u16(), 404);

    // A GET stream is open while we look.
    let get = c.get_stream().await;
    assert_eq!(get.status().as_u16(), 200);

    // A timeout (the plugin's limit is 1 s), then a crash.
    let timed_out = c
        .call(
            4,
            "tools/call",
            json!({"name": "slow", "arguments": {"ms": 5000}}),
        )
        .await;
    assert!(timed_out.body.contains("timed out"), "{}", timed_out.body);
    let crashed = c
        .call(5, "tools/call", json!({"name": "crash", "arguments": {}}))
        .await;
    assert!(crashed.body.contains("exited"), "{}", crashed.body);

    // A cursor that names no stream of this session. From another connection: a request on
    // this one would show the last answer was read and release it from the replay buffer.
    let miss = c
        .on_new_connection()
        .request(reqwest::Method::GET)
        .header("accept", "text/event-stream")
        .header("last-event-id", "00000001-77-3")
        .send()
        .await
        .unwrap();
    assert!(miss.status().is_client_error(), "{}", miss.status());

    let (_, text) = gw.admin_get("/metrics").await;
    let m = |s: &str| metric_in(&text, s);
    assert!(
        m(r#"mcp_gateway_http_requests_total{method="POST",route="/mcp",status="200"}"#).unwrap()
            >= 5.0,
        "{text}"
    );
    assert!(
        m(r#"mcp_gateway_http_requests_total{method="POST",route="/mcp",status="400"}"#).unwrap()
            >= 2.0
    );
    assert_eq!(
        m(r#"mcp_gateway_http_requests_total{method="GET",route="unmatched",status="404"}"#),
        Some(1.0)
    );
    assert!(
        m(r#"mcp_gateway_http_request_duration_seconds_bucket{method="POST",route="/mcp",le="+Inf"}"#)
            .unwrap()
            >= 5.0
    );
    assert!(m(r#"mcp_gateway_http_request_duration_seconds_bucket{method="POST",route="/mcp",le="0.001"}"#).is_some());
    assert!(
        !text.contains("sekrit-query-value"),
        "a raw URI in the metrics"
    );
    assert!(!text.contains("/nope/12345"), "a raw path in the metrics");

    assert_eq!(m("mcp_gateway_sessions_active"), Some(1.0));
    assert!(m("mcp_gateway_sessions_opened_total").unwrap() >= 1.0);
    assert_eq!(
        m("mcp_gateway_sse_streams_open"),
        Some(1.0),
        "the GET stream"
    );
    assert!(m("mcp_gateway_replay_buffer_events").unwrap() >= 1.0);
    assert!(m("mcp_gateway_replay_buffer_bytes").unwrap() > 0.0);
    assert_eq!(m("mcp_gateway_replay_cursors_not_found_total"), Some(1.0));

    assert_eq!(
        m(r#"mcp_gateway_plugin_request_duration_seconds_count{method="tools/call",plugin="fx"}"#),
        Some(2.0),
        "the two echoes answered (the slow one timed out, the crash never answered)"
    );
    assert_eq!(
        m(r#"mcp_gateway_plugin_request_timeouts_total{plugin="fx"}"#),
        Some(1.0)
    );
    assert_eq!(
        m(r#"mcp_gateway_plugin_crashes_total{plugin="fx"}"#),
        Some(1.0)
    );
    assert_eq!(
        m(r#"mcp_gateway_plugin_starts_total{plugin="fx"}"#),
        Some(1.0)
    );
    assert_eq!(
        m(r#"mcp_gateway_plugin_requests_in_flight{plugin="fx"}"#),
        Some(0.0)
    );
    assert_eq!(m(r#"mcp_gateway_plugin_processes{plugin="fx"}"#), Some(0.0));
    assert_eq!(m(r#"mcp_gateway_plugin_up{plugin="fx"}"#), Some(1.0));
    assert!(m("process_resident_memory_bytes").unwrap() > 0.0);
    assert!(text.contains("# TYPE mcp_gateway_http_request_duration_seconds histogram"));

    // The crashed plugin restarts on the next request; a replay is counted.
    assert_eq!(
        c.tool_text(6, "echo", json!({"text": "back"})).await,
        "back"
    );
    assert_eq!(
        gw.metric(r#"mcp_gateway_plugin_starts_total{plugin="fx"}"#)
            .await,
        Some(2.0)
    );
    assert_eq!(
        gw.metric(r#"mcp_gateway_plugin_processes{plugin="fx"}"#)
            .await,
        Some(1.0)
    );
    drop(get);
    let events = c
        .stream(&json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "x"}}}))
        .await;
    drop(events);
    let reply = c
        .call(
            8,
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "y"}}),
        )
        .await;
    let first_id = common::parse_sse(&reply.body)
        .into_iter()
        .find_map(|e| e.id)
        .expect("an event id");
    // Resumed as by a client whose connection broke (on the same connection, the request
    // would show the answer was read, and find it released).
    let resumed = c
        .on_new_connection()
        .request(reqwest::Method::GET)
        .header("accept", "text/event-stream")
        .header("last-event-id", first_id)
        .send()
        .await
        .unwrap();
    assert_eq!(resumed.status().as_u16(), 200);
    drop(resumed);
    assert_eq!(
        gw.metric("mcp_gateway_replays_served_total").await,
        Some(1.0)
    );
}

#[tokio::test]
async fn readiness_fails_when_every_plugin_failed_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::write_config(
        &dir,
        "[plugins.broken]\ncommand = \"/bin/false\"\nstartup_timeout_secs = 2\n",
    );
    let gw = Gateway::start(&["--config", &config]);
    let mut body;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (status, b) = gw.admin_get("/readyz").await;
        body = b;
        if status == 503 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never unready: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "not ready");
    assert_eq!(v["checks"]["plugins"]["ok"], false);
    assert_eq!(v["checks"]["plugins"]["failed"][0]["plugin"], "broken");
    assert!(
        v["problems"][0]
            .as_str()
            .unwrap()
            .contains("all 1 plugin(s) failed"),
        "{v}"
    );
    assert_eq!(v["checks"]["database"]["ok"], true);
    // Alive all the same.
    assert_eq!(gw.admin_get("/healthz").await.0, 200);
    assert_eq!(
        gw.metric(r#"mcp_gateway_plugin_up{plugin="broken"}"#).await,
        Some(0.0)
    );
}

#[tokio::test]
async fn readiness_fails_when_the_database_goes_away() {
    let db = Postgres::create("readyz");
    let gw = Gateway::fixture(&["--database-url", &db.url], &[]);
    assert_eq!(gw.admin_get("/readyz").await.0, 200);
    db.destroy();
    let (status, body) = gw.admin_get("/readyz").await;
    assert_eq!(status, 503, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["checks"]["database"]["ok"], false);
    assert!(
        v["problems"][0].as_str().unwrap().starts_with("database: "),
        "{v}"
    );
    assert_eq!(gw.admin_get("/healthz").await.0, 200);
}

#[tokio::test]
async fn logs_carry_session_plugin_and_trace_context_but_no_token() {
    let gw = Gateway::fixture(&["--log-format", "json"], &[]);
    let mut c = gw.client().with_token("sekrit-bearer-value");
    c.initialize().await;
    let session = c.session.clone().unwrap();
    let meta = meta_seen(
        &c,
        1,
        json!({}),
        &[("traceparent", TRACEPARENT), ("tracestate", "vendor=abc")],
    )
    .await;
    assert_eq!(meta["traceparent"], TRACEPARENT, "{meta}");
    assert_eq!(meta["tracestate"], "vendor=abc");

    // A client's own _meta.traceparent wins over the header; an invalid header is dropped.
    let own = "00-11111111111111111111111111111111-2222222222222222-01";
    let bad = [("traceparent", "00-zzzz-bad")];
    let meta = meta_seen(&c, 2, json!({"traceparent": own}), &bad).await;
    assert_eq!(meta["traceparent"], own, "{meta}");
    let meta = meta_seen(&c, 3, json!({}), &bad).await;
    assert!(
        meta.get("traceparent").is_none(),
        "an invalid header reached the plugin: {meta}"
    );

    // The plugin's stderr, logged while it serves this session's request.
    c.tool_text(4, "stderr", json!({"text": "plugin-said-this"}))
        .await;
    gw.wait_log("plugin-said-this").await;

    let lines: Vec<Value> = gw
        .log()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let access: Vec<&Value> = lines
        .iter()
        .filter(|l| l["target"] == "mcp_gateway::access")
        .collect();
    let traced = access
        .iter()
        .find(|l| l["span"]["traceparent"] == TRACEPARENT)
        .unwrap_or_else(|| panic!("no access line with the traceparent: {access:?}"));
    assert_eq!(traced["span"]["session"], session.as_str());
    assert_eq!(traced["span"]["plugin"], "stdio");
    assert_eq!(traced["span"]["route"], "/mcp");
    assert_eq!(traced["fields"]["status"], 200);
    let stderr_line = lines
        .iter()
        .find(|l| l.to_string().contains("plugin-said-this"))
        .unwrap();
    let flat = stderr_line.to_string();
    assert!(flat.contains(&session) && flat.contains("stdio"), "{flat}");
    assert!(
        !gw.log().contains("sekrit-bearer-value"),
        "a bearer token reached the logs"
    );
}

/// Calls the fixture's `meta` tool with `meta` as the request's `_meta` and `headers` on the
/// POST; the `_meta` the plugin saw.
async fn meta_seen(c: &common::Client, id: i64, meta: Value, headers: &[(&str, &str)]) -> Value {
    let mut params = json!({"name": "meta", "arguments": {}});
    if meta.as_object().is_some_and(|m| !m.is_empty()) {
        params["_meta"] = meta;
    }
    let mut request = c
        .request(reqwest::Method::POST)
        .header("content-type", "application/json");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let body = request
        .body(
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
                .to_string(),
        )
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let event = common::parse_sse(&body)
        .into_iter()
        .find(|e| e.data.contains("\"result\""))
        .unwrap_or_else(|| panic!("{body}"));
    let result: Value = serde_json::from_str(&event.data).unwrap();
    let text = result["result"]["content"][0]["text"].as_str().unwrap();
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Every metric family the gateway exposes is in README.md's table, by name: the table is
/// what operators build dashboards from. (A family with labels shows only once it has a
/// sample, so the other direction cannot be checked here.)
#[tokio::test]
async fn the_readme_lists_every_metric() {
    let gw = Gateway::fixture(&[], &[]);
    let (status, text) = gw.admin_get("/metrics").await;
    assert_eq!(status, 200);
    let registered: std::collections::BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with("mcp_gateway_"))
        .collect();
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let listed: std::collections::BTreeSet<&str> = readme
        .lines()
        .filter(|l| l.starts_with("| `mcp_gateway_"))
        .flat_map(|l| l.split('|').nth(1).unwrap_or_default().split(','))
        .map(|n| n.trim().trim_matches('`'))
        .collect();
    assert!(registered.len() > 10, "{registered:?}");
    let unlisted: Vec<_> = registered.difference(&listed).collect();
    assert!(unlisted.is_empty(), "not in README's table: {unlisted:?}");
}
