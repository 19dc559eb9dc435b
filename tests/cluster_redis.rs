//! Cluster mode when its Redis is in trouble, on a Redis of each test's own (started, frozen,
//! killed and started again empty by the test) and two replicas: a replica starts without
//! Redis and serves once it answers; while Redis is away, `/readyz` fails naming it and what
//! `/mcp` needs it for is 503 with `Retry-After`, each answer within a few seconds, and no
//! process dies; when Redis returns, the replicas recover without a restart; after Redis came
//! back empty, a session's id is unknown to the replicas that do not own it (404), the owner
//! ends it once its refresh finds the record gone, and new sessions work across replicas
//! again. `initialize` while Redis is down is 503 too. Redis's failures are counted in `/metrics`.

mod common;

use std::time::{Duration, Instant};

use common::redis_server::RedisServer;
use common::{Client, Cluster, FIXTURE};
use serde_json::{Value, json};

/// The longest any answer may take while Redis is away: every Redis call is under a 2 s
/// timeout, and a request makes a few at most.
const BOUND: Duration = Duration::from_secs(5);

/// How long a state change (Redis gone, Redis back) may take to show.
const SETTLE: Duration = Duration::from_secs(20);

/// An HTTP client that gives up well past [`BOUND`], so a hang fails the test, not the run.
fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(BOUND * 3)
        .build()
        .expect("HTTP client")
}

/// A client of replica `i`'s own endpoint, bypassing the load balancer.
fn client_of(cluster: &Cluster, i: usize) -> Client {
    Client {
        http: http(),
        ..Client::new(&cluster.url(i))
    }
}

/// The same session, sent to replica `i`.
fn same_session_at(c: &Client, cluster: &Cluster, i: usize) -> Client {
    Client {
        session: c.session.clone(),
        version: c.version.clone(),
        ..client_of(cluster, i)
    }
}

/// Replica `i`'s `/readyz`: its status and body, asserting it answered within [`BOUND`].
async fn readyz(cluster: &Cluster, i: usize) -> (u16, Value) {
    let started = Instant::now();
    let r = http()
        .get(format!("{}/readyz", cluster.admin_url(i)))
        .send()
        .await
        .expect("/readyz answers");
    let status = r.status().as_u16();
    let body: Value = r.json().await.expect("/readyz's body is JSON");
    assert!(
        started.elapsed() < BOUND,
        "/readyz of replica {i} took {:?}",
        started.elapsed()
    );
    (status, body)
}

/// Polls replica `i`'s `/readyz` until it answers `want`; its body then.
async fn wait_readyz(cluster: &Cluster, i: usize, want: u16) -> Value {
    let deadline = Instant::now() + SETTLE;
    loop {
        let (status, body) = readyz(cluster, i).await;
        if status == want {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz of replica {i} still {status}, not {want}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A `/readyz` body that fails on Redis and names it.
fn assert_names_redis(body: &Value, port: u16) {
    assert_eq!(body["status"], "not ready", "{body}");
    assert_eq!(body["checks"]["redis"]["ok"], false, "{body}");
    let problems = body["problems"].to_string();
    assert!(
        problems.contains("redis") && problems.contains(&format!("127.0.0.1:{port}")),
        "{body}"
    );
}

/// Waits until both replicas' heartbeats are in Redis: until then the other replica takes a
/// replica for gone.
async fn wait_heartbeats(cluster: &Cluster) {
    let deadline = Instant::now() + SETTLE;
    loop {
        let beats = cluster
            .redis_keys()
            .iter()
            .filter(|k| k.contains(":replica:"))
            .count();
        if beats == cluster.len() {
            return;
        }
        assert!(Instant::now() < deadline, "{beats} heartbeats in Redis");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends `tools/list` and asserts the answer is the cluster's 503: `Retry-After`, a JSON-RPC
/// error that says the shared state is unreachable, within [`BOUND`].
async fn assert_unavailable(c: &Client, what: &str) {
    let started = Instant::now();
    let r = c.call(7, "tools/list", json!({})).await;
    let took = started.elapsed();
    assert!(took < BOUND, "{what}: answered after {took:?}");
    assert_eq!(r.status, 503, "{what}: {r:?}");
    assert!(r.headers.contains_key("retry-after"), "{what}: {r:?}");
    assert_eq!(r.error_code(), -32000, "{what}: {r:?}");
    let message = r.last()["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("cluster's shared state"),
        "{what}: {message}"
    );
}

/// A session no replica has: looking it up needs Redis.
fn stranger(cluster: &Cluster, i: usize) -> Client {
    Client {
        session: Some("no-such-session-0123456789abcdef".into()),
        version: Some("2025-11-25".into()),
        ..client_of(cluster, i)
    }
}

/// Replica `i`'s count of failed Redis calls for `operation`.
async fn redis_errors(cluster: &Cluster, i: usize, operation: &str) -> f64 {
    let sample = format!("mcp_gateway_redis_errors_total{{operation=\"{operation}\"}}");
    cluster.replica(i).metric(&sample).await.unwrap_or(0.0)
}

/// A session opened at replica `owner` and called through replica `via` (forwarded).
async fn session_across(cluster: &Cluster, owner: usize, via: usize, text: &str) -> Client {
    let mut c = client_of(cluster, owner);
    c.initialize().await;
    let there = same_session_at(&c, cluster, via);
    let got = there.tool_text(2, "echo", json!({ "text": text })).await;
    assert!(got.contains(text), "{got}");
    c
}

/// Streams an answer to `c`'s session and waits until its event is in Redis: the replica's
/// event writer reaches Redis.
async fn assert_events_reach_redis(cluster: &Cluster, c: &Client) {
    let session = c.session.clone().expect("a session");
    let mut events = c
        .stream(&json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}))
        .await;
    let answer = events.next().await.expect("the answer on the stream");
    assert!(answer["result"]["tools"].is_array(), "{answer}");
    let deadline = Instant::now() + SETTLE;
    let wanted = format!(":events:{}:", cluster.session_name(&session));
    while !cluster.redis_keys().iter().any(|k| k.contains(&wanted)) {
        assert!(
            Instant::now() < deadline,
            "no events of {session} in Redis: {:?}",
            cluster.redis_keys()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_cluster_started_before_its_redis_is_unready_then_serves_once_it_answers() {
    let mut redis = RedisServer::reserve();
    let mut cluster = Cluster::start_on_redis(2, &redis.url(), &["--", FIXTURE]);

    // Both replicas started (the harness saw them listen) and say why they are not ready.
    for i in 0..2 {
        let body = wait_readyz(&cluster, i, 503).await;
        assert_names_redis(&body, redis.port());
        assert_unavailable(&stranger(&cluster, i), &format!("replica {i}")).await;
        assert!(redis_errors(&cluster, i, "heartbeat").await >= 1.0);
        assert!(redis_errors(&cluster, i, "ping").await >= 1.0);
        assert!(cluster.is_running(i));
    }

    // Redis comes: both become ready without a restart, and a session opened on one is
    // served through the other.
    redis.run();
    for i in 0..2 {
        wait_readyz(&cluster, i, 200).await;
    }
    wait_heartbeats(&cluster).await;
    let c = session_across(&cluster, 0, 1, "after Redis came").await;
    session_across(&cluster, 1, 0, "the other way").await;
    assert_events_reach_redis(&cluster, &c).await;
}

#[tokio::test]
async fn redis_lost_mid_run_is_503s_within_seconds_then_recovery_when_it_returns_empty() {
    let mut redis = RedisServer::start();
    // Records refreshed every 10 s (a third of the idle timeout), and a session not reaped
    // for idleness before the test ends.
    let mut cluster = Cluster::start_on_redis(
        2,
        &redis.url(),
        &["--session-idle-timeout-secs", "30", "--", FIXTURE],
    );
    for i in 0..2 {
        wait_readyz(&cluster, i, 200).await;
    }
    wait_heartbeats(&cluster).await;
    let old = session_across(&cluster, 0, 1, "before").await;
    let old_via_1 = same_session_at(&old, &cluster, 1);

    // Redis hangs (SIGSTOP): nothing waits on it past its timeout.
    redis.freeze();
    for i in 0..2 {
        let body = wait_readyz(&cluster, i, 503).await;
        assert_names_redis(&body, redis.port());
    }
    assert_unavailable(&old_via_1, "a forwarded session, Redis frozen").await;
    redis.resume();
    for i in 0..2 {
        wait_readyz(&cluster, i, 200).await;
    }
    wait_heartbeats(&cluster).await;
    let text = old_via_1
        .tool_text(3, "echo", json!({"text": "thawed"}))
        .await;
    assert!(text.contains("thawed"), "{text}");

    // Redis dies: readiness fails on both, naming it; the replica that must ask Redis who
    // owns a session answers 503 with Retry-After, quickly; no process dies.
    let before: Vec<f64> = vec![
        redis_errors(&cluster, 0, "heartbeat").await,
        redis_errors(&cluster, 1, "heartbeat").await,
    ];
    redis.kill();
    for i in 0..2 {
        let body = wait_readyz(&cluster, i, 503).await;
        assert_names_redis(&body, redis.port());
    }
    // A replica that asked Redis for the owner within the last second still forwards to it
    // (which serves its own sessions without Redis); after that it must ask, and cannot.
    let remembered_until = Instant::now() + Duration::from_secs(3);
    loop {
        let r = old_via_1.call(7, "tools/list", json!({})).await;
        if r.status != 200 {
            break;
        }
        assert!(r.last()["result"]["tools"].is_array(), "{r:?}");
        assert!(
            Instant::now() < remembered_until,
            "the owner is still remembered after a second: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_unavailable(&old_via_1, "a forwarded session, Redis dead").await;
    assert_unavailable(&stranger(&cluster, 0), "an unknown session, Redis dead").await;
    for (i, before) in before.iter().enumerate() {
        let deadline = Instant::now() + SETTLE;
        while redis_errors(&cluster, i, "heartbeat").await <= *before {
            assert!(
                Instant::now() < deadline,
                "replica {i} counted no failed beat"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(cluster.is_running(i), "replica {i} died with Redis");
    }

    // Redis comes back empty: the replicas recover without a restart; new sessions work
    // across replicas; the old session's record is gone, so the replica that does not own
    // it does not know it.
    redis.run();
    for i in 0..2 {
        wait_readyz(&cluster, i, 200).await;
    }
    wait_heartbeats(&cluster).await;
    let c = session_across(&cluster, 1, 0, "after Redis came back").await;
    session_across(&cluster, 0, 1, "and the other way").await;
    assert_events_reach_redis(&cluster, &c).await;
    let r = old_via_1.call(4, "tools/list", json!({})).await;
    assert_eq!(r.status, 404, "{r:?}");
    // The owner ends it too when its refresh finds the record gone: the client gets 404
    // wherever it asks, and initializes again.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = old.call(5, "tools/list", json!({})).await;
        if r.status == 404 {
            break;
        }
        assert_eq!(r.status, 200, "{r:?}");
        assert!(
            Instant::now() < deadline,
            "the owner still serves the lost session"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for i in 0..2 {
        assert!(cluster.is_running(i));
    }
}

/// `initialize` needs Redis in cluster mode: a session whose record was never written is
/// unknown to every other replica, so the client must not be handed its id.
#[tokio::test]
async fn initialize_while_redis_is_down_is_503_with_retry_after() {
    let redis = RedisServer::reserve();
    let cluster = Cluster::start_on_redis(1, &redis.url(), &["--", FIXTURE]);
    wait_readyz(&cluster, 0, 503).await;
    let started = Instant::now();
    let r = client_of(&cluster, 0)
        .call(
            0,
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "1"}}),
        )
        .await;
    assert!(started.elapsed() < BOUND, "{:?}", started.elapsed());
    assert_eq!(r.status, 503, "{r:?}");
    assert!(r.headers.contains_key("retry-after"), "{r:?}");
    assert!(!r.headers.contains_key("mcp-session-id"), "{r:?}");
    assert_eq!(r.error_code(), -32000, "{r:?}");
    let message = r.last()["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("cluster's shared state"), "{message}");
}
