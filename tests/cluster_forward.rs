//! Cluster mode, two replicas sharing the Redis at 127.0.0.1:6379 (a key prefix of each
//! test's own): a session created on one is served through the other, which forwards its
//! requests to the owner with the cluster's secret; DELETE on either ends it on both; a
//! forged secret gets nothing; readiness names Redis; the keys are gone once the replicas stop;
//! the owner checks the client's own Host and Origin on a forwarded request; a forwarder
//! remembers the owner for a moment and asks again when it moves.

mod common;

use std::process::Command;

use common::{Client, FIXTURE, Gateway, run_cli};
use mcp_gateway::cluster::signing;
use serde_json::json;

const SECRET: &str = "a-cluster-secret-for-tests";

/// A key prefix no other test uses.
fn prefix() -> String {
    format!("test-fwd-{}-{}:", std::process::id(), rand_suffix())
}

fn rand_suffix() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
}

fn redis_keys(prefix: &str) -> Vec<String> {
    let out = Command::new("redis-cli")
        .args(["--scan", "--pattern", &format!("{prefix}*")])
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .filter(|l| !l.is_empty())
        .collect()
}

fn replica(prefix: &str) -> Gateway {
    Gateway::start(&[
        "--redis-url",
        "redis://127.0.0.1:6379",
        "--redis-key-prefix",
        prefix,
        "--cluster-secret",
        SECRET,
        "--",
        FIXTURE,
    ])
}

#[tokio::test]
async fn a_session_is_served_through_any_replica_and_ends_on_all() {
    let prefix = prefix();
    let mut a = replica(&prefix);
    let mut b = replica(&prefix);

    let mut on_a = a.client();
    on_a.initialize().await;
    let mut on_b = Client::new(&b.url);
    on_b.session = on_a.session.clone();
    on_b.version = on_a.version.clone();

    // A request, answered by the owner's plugin through the other replica, as JSON or SSE.
    let text = on_b
        .tool_text(2, "echo", json!({"text": "through b"}))
        .await;
    assert!(text.contains("through b"), "{text}");
    let mut events = on_b
        .stream(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}))
        .await;
    let answer = events.next().await.expect("the answer on the stream");
    assert!(answer["result"]["tools"].is_array(), "{answer}");
    assert!(
        b.metric("mcp_gateway_cluster_forwards_total{outcome=\"ok\"}")
            .await
            .unwrap_or(0.0)
            >= 2.0
    );
    // B holds no session of its own: it forwarded.
    assert_eq!(b.metric("mcp_gateway_sessions_active").await, Some(0.0));
    assert_eq!(a.metric("mcp_gateway_sessions_active").await, Some(1.0));

    // Readiness names the Redis it depends on.
    let (status, body) = b.admin_get("/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"redis\":{\"ok\":true}"), "{body}");

    // DELETE through B ends the session on A; both then say 404.
    assert_eq!(on_b.delete().await, 200);
    let r = on_a.call(4, "tools/list", json!({})).await;
    assert_eq!(r.status, 404, "{r:?}");
    let r = on_b.call(5, "tools/list", json!({})).await;
    assert_eq!(r.status, 404, "{r:?}");

    a.terminate();
    b.terminate();
    // Nothing is left but each stopped replica's word that it is gone, which expires.
    let left: Vec<String> = redis_keys(&prefix)
        .into_iter()
        .filter(|k| !k.starts_with(&format!("{prefix}replica:")))
        .collect();
    assert!(left.is_empty(), "keys left in Redis: {left:?}");
    for k in redis_keys(&prefix) {
        let _ = Command::new("redis-cli").args(["del", &k]).output();
    }
}

/// A forwarded request reaches the owner with the client's own `Host` and `Origin`, which the
/// owner checks as its `/mcp` would. A forwarder that sent the owner's address instead (what an
/// HTTP/2 request carries as its authority when no `Host` goes along) would be refused: the
/// replicas here allow only a public name and one origin.
#[tokio::test]
async fn the_owner_sees_the_clients_own_host_and_origin() {
    const HOST: &str = "mcp.example.test";
    const ORIGIN: &str = "https://app.example.test";
    let prefix = prefix();
    let start = || {
        Gateway::start(&[
            "--redis-url",
            "redis://127.0.0.1:6379",
            "--redis-key-prefix",
            &prefix,
            "--cluster-secret",
            SECRET,
            "--allowed-hosts",
            HOST,
            "--allowed-origins",
            ORIGIN,
            "--",
            FIXTURE,
        ])
    };
    let mut a = start();
    let mut b = start();
    let http = reqwest::Client::new();
    let post = |url: &str, sid: Option<&str>, host: &str, body: serde_json::Value| {
        let mut r = http
            .post(url)
            .header("host", host)
            .header("origin", ORIGIN)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body.to_string());
        if let Some(sid) = sid {
            r = r.header("mcp-session-id", sid);
        }
        r.send()
    };
    let r = post(
        &a.url,
        None,
        HOST,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let sid = r.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    let r = post(
        &a.url,
        Some(&sid),
        HOST,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 202);

    // Through B, which forwards to A: A accepts the client's Host and Origin.
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "through b"}}});
    let r = post(&b.url, Some(&sid), HOST, call.clone()).await.unwrap();
    let status = r.status();
    let text = r.text().await.unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("through b"), "{text}");
    assert!(
        b.metric("mcp_gateway_cluster_forwards_total{outcome=\"ok\"}")
            .await
            .unwrap_or(0.0)
            >= 1.0
    );
    // The checks are on: a Host the replicas do not allow is refused.
    let r = post(&b.url, Some(&sid), "127.0.0.1", call).await.unwrap();
    assert_eq!(r.status(), 403);

    a.terminate();
    b.terminate();
    for k in redis_keys(&prefix) {
        let _ = Command::new("redis-cli").args(["del", &k]).output();
    }
}

/// A forwarder remembers a session's owner for a moment instead of asking Redis for every
/// request; when the owner it remembers no longer serves the session (killed, and the session
/// taken over elsewhere; or the session ended there), it asks Redis again and the client gets
/// the right answer, never a stale owner's error.
#[tokio::test]
async fn a_forwarder_remembers_the_owner_and_asks_again_when_it_moves() {
    let prefix = prefix();
    let mut a = replica(&prefix);
    let mut b = replica(&prefix);
    let mut c = replica(&prefix);
    let owner_lookups = "mcp_gateway_redis_seconds_count{operation=\"owner\"}";

    let mut on_a = a.client();
    on_a.initialize().await;
    let on_b = on_a.at(&b.url);
    let on_c = on_a.at(&c.url);

    // Asked for every request, the owner would cost B two lookups per call (the session's
    // record, then the owner's heartbeat): 60 for these 30.
    for i in 0..30 {
        let text = on_b
            .tool_text(10 + i, "echo", json!({"text": format!("b{i}")}))
            .await;
        assert!(text.contains(&format!("b{i}")), "{text}");
    }
    let lookups = b.metric(owner_lookups).await.unwrap_or(0.0);
    assert!(
        lookups < 30.0,
        "B asked Redis for the owner {lookups} times for 30 calls"
    );

    // The owner dies; C takes the session over. B, which may still remember A, finds it
    // gone, asks again, and forwards to C.
    a.signal("-KILL");
    let text = on_c.tool_text(50, "echo", json!({"text": "to c"})).await;
    assert!(text.contains("to c"), "{text}");
    assert_eq!(c.metric("mcp_gateway_sessions_active").await, Some(1.0));
    let text = on_b.tool_text(51, "echo", json!({"text": "b again"})).await;
    assert!(text.contains("b again"), "{text}");

    // The session ends on its owner, C, while B remembers C: B's next request is told the
    // session is not found, as a client must be (the spec's 404), not an error of the hop.
    let remembered = std::time::Instant::now();
    let text = on_b
        .tool_text(52, "echo", json!({"text": "b remembers c"}))
        .await;
    assert!(text.contains("b remembers c"), "{text}");
    assert_eq!(on_c.delete().await, 200);
    let r = on_b.call(53, "tools/list", json!({})).await;
    assert_eq!(r.status, 404, "{r:?}");
    if remembered.elapsed() < std::time::Duration::from_millis(500) {
        // Still remembered when it was sent: C said it does not hold the session.
        assert_eq!(
            b.metric("mcp_gateway_cluster_forwards_total{outcome=\"not_here\"}")
                .await,
            Some(1.0)
        );
    }

    b.terminate();
    c.terminate();
    let _ = a.terminate();
    for k in redis_keys(&prefix) {
        let _ = Command::new("redis-cli").args(["del", &k]).output();
    }
}

/// A session whose record names a replica that does not hold it (that replica's takeover
/// failed halfway: it claimed the record, then the shared store did not answer) is taken over
/// there when a request for it is forwarded there, as it is when a request comes straight to
/// it; the client is not told its session is gone.
#[tokio::test]
async fn a_takeover_that_failed_halfway_is_finished_by_a_forwarded_request() {
    let prefix = prefix();
    let mut a = replica(&prefix);
    let mut b = replica(&prefix);
    let mut c = replica(&prefix);
    let mut on_a = a.client();
    on_a.initialize().await;
    let sid = on_a.session.clone().unwrap();

    // B's id, from its heartbeat (which holds the address it is reached at).
    let b_id = redis_keys(&prefix)
        .into_iter()
        .filter_map(|k| {
            k.strip_prefix(&format!("{prefix}replica:"))
                .map(str::to_owned)
        })
        .find(|id| {
            let out = Command::new("redis-cli")
                .args(["get", &format!("{prefix}replica:{id}")])
                .output()
                .expect("redis-cli runs");
            // `<signature> <expires> <url>`
            let beat = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            beat.rsplit_once(' ')
                .is_some_and(|(_, url)| !url.is_empty() && b.url.starts_with(url))
        })
        .expect("B's heartbeat");
    // The record now names B, which never held the session, signed as B would have.
    let record = format!(
        "{prefix}session:{}",
        signing::session_names(SECRET).of(&sid)
    );
    let signature = signing::Signing::new(SECRET).sign(signing::Signed::Owner, &record, &b_id);
    let out = Command::new("redis-cli")
        .args(["hset", &record, "replica", &b_id, "sig", &signature])
        .output()
        .expect("redis-cli runs");
    assert!(out.status.success());

    // Through C, which forwards to B: B takes it over and answers.
    let text = on_a
        .at(&c.url)
        .tool_text(2, "echo", json!({"text": "finished on b"}))
        .await;
    assert!(text.contains("finished on b"), "{text}");
    assert_eq!(
        b.metric("mcp_gateway_sessions_adopted_total").await,
        Some(1.0)
    );

    a.terminate();
    b.terminate();
    c.terminate();
    for k in redis_keys(&prefix) {
        let _ = Command::new("redis-cli").args(["del", &k]).output();
    }
}

#[tokio::test]
async fn the_internal_route_refuses_anyone_without_the_secret() {
    let prefix = prefix();
    let mut a = replica(&prefix);
    let mut c = a.client();
    c.initialize().await;
    let internal = a.url.replace("/mcp", "/_cluster/mcp");
    let http = reqwest::Client::new();
    for secret in [None, Some("wrong"), Some("a-cluster-secret-for-test")] {
        let mut r = http
            .post(&internal)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", c.session.as_deref().unwrap())
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
        if let Some(s) = secret {
            r = r.header("x-mcp-gateway-cluster", s);
        }
        let r = r.send().await.unwrap();
        assert_eq!(r.status(), 404, "secret {secret:?}");
    }
    a.terminate();
    for k in redis_keys(&prefix) {
        let _ = Command::new("redis-cli").args(["del", &k]).output();
    }

    // A gateway on its own has no such route at all.
    let plain = Gateway::start(&["--", FIXTURE]);
    let r = http
        .post(plain.url.replace("/mcp", "/_cluster/mcp"))
        .header("x-mcp-gateway-cluster", SECRET)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

#[test]
fn cluster_mode_needs_a_real_secret_and_a_redis_url() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::write_config(&dir, &format!("[plugins.f]\ncommand = \"{FIXTURE}\"\n"));
    let check = |flags: &[&str]| {
        let mut args = flags.to_vec();
        args.extend(["check", "--config", &cfg]);
        run_cli(&args, &[])
    };
    let (code, _, err) = check(&["--redis-url", "redis://127.0.0.1:6379"]);
    assert_ne!(code, 0);
    assert!(err.contains("cluster_secret"), "{err}");
    let (code, _, err) = check(&[
        "--redis-url",
        "redis://127.0.0.1:6379",
        "--cluster-secret",
        "short",
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("at least 16"), "{err}");
    let (code, _, err) = check(&[
        "--redis-url",
        "http://user:hunter2@example",
        "--cluster-secret",
        SECRET,
    ]);
    assert_ne!(code, 0);
    assert!(
        err.contains("not a Redis URL") && !err.contains("hunter2"),
        "{err}"
    );
    let (code, out, err) = check(&[
        "--redis-url",
        "redis://127.0.0.1:6379",
        "--cluster-secret",
        SECRET,
    ]);
    assert_eq!(code, 0, "{out}{err}");
}
