//! Several gateway processes behind a real load balancer (HAProxy, round-robin, no
//! stickiness; `tests/common/cluster.rs`). For now the harness itself, on replicas that share
//! nothing (`Cluster::start_plain`): HAProxy spreads requests over every replica, routes
//! around a replica that was killed until it comes back on its port, and passes an SSE
//! stream through as it comes. A session lives in the
//! replica that created it here, so nothing below follows one session across replicas.
//!
//! In cluster mode (`Cluster::start`): one session served through every replica, forwarded to
//! its owner, and the official Python SDK's tools, progress, sampling, subscriptions and
//! resumption through HAProxy. A killed or stopped owner: tests/cluster_failover.rs and
//! tests/cluster_chaos.rs; Redis stopped and started: tests/cluster_redis.rs.

mod common;

use common::{Client, Cluster, FIXTURE};
use serde_json::json;

const OPENED: &str = "mcp_gateway_sessions_opened_total";

/// `initialize` alone (not `notifications/initialized` after it, which round-robin sends to
/// another replica, where the session is unknown until cluster mode), on `client`.
async fn initialize_on(client: &Client) {
    let reply = client
        .call(
            0,
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "cluster-tests", "version": "1"}}),
        )
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.last()["result"]["protocolVersion"], "2025-11-25");
}

/// `initialize` through the load balancer on a client (a connection) of its own.
async fn initialize_through(cluster: &Cluster) {
    initialize_on(&cluster.client()).await;
}

/// Sessions each replica has opened, by its own `/metrics`.
async fn opened(cluster: &Cluster, replicas: &[usize]) -> Vec<f64> {
    let mut counts = Vec::new();
    for &i in replicas {
        counts.push(cluster.replica(i).metric(OPENED).await.unwrap_or(0.0));
    }
    counts
}

#[tokio::test]
async fn haproxy_spreads_requests_over_the_replicas_and_routes_around_a_dead_one() {
    let mut cluster = Cluster::start_plain(3, &["--", FIXTURE]);
    assert_eq!(cluster.len(), 3);

    // (a) Round-robin with no stickiness: nine initializes, on one kept-alive connection and
    // on fresh ones alike, reach all three replicas.
    let kept_alive = Client::new(&cluster.lb_url());
    for _ in 0..6 {
        initialize_on(&kept_alive).await;
    }
    let counts = opened(&cluster, &[0, 1, 2]).await;
    assert!(
        counts.iter().all(|&n| n >= 1.0),
        "one connection's requests went to every replica: {counts:?}"
    );
    for _ in 0..3 {
        initialize_through(&cluster).await;
    }
    let counts = opened(&cluster, &[0, 1, 2]).await;
    assert_eq!(counts.iter().sum::<f64>(), 9.0, "{counts:?}");
    assert!(
        counts.iter().all(|&n| n >= 1.0),
        "every replica served: {counts:?}"
    );

    // (b) A replica killed: every request still succeeds, on the other two, whether or not
    // HAProxy's health check has seen the death yet (a failed connect is sent elsewhere).
    let before = opened(&cluster, &[0, 2]).await;
    let dead_port = cluster.port(1);
    cluster.kill(1);
    for _ in 0..6 {
        initialize_through(&cluster).await;
    }
    cluster.wait_down(1);
    for _ in 0..3 {
        initialize_through(&cluster).await;
    }
    let after = opened(&cluster, &[0, 2]).await;
    assert_eq!(
        after.iter().sum::<f64>() - before.iter().sum::<f64>(),
        9.0,
        "{before:?} -> {after:?}"
    );

    // Restarted on the same port, it is seen up again and gets its share.
    cluster.restart(1);
    assert_eq!(cluster.port(1), dead_port);
    assert_eq!(cluster.lb_status(1), "UP");
    for _ in 0..6 {
        initialize_through(&cluster).await;
    }
    let back = cluster.replica(1).metric(OPENED).await.unwrap_or(0.0);
    assert!(back >= 1.0, "the restarted replica serves again: {back}");

    // A replica stopped with SIGTERM exits cleanly and is routed around the same way.
    assert!(cluster.terminate(2).success());
    assert!(!cluster.is_running(2));
    cluster.wait_down(2);
    let before = opened(&cluster, &[0, 1]).await;
    for _ in 0..4 {
        initialize_through(&cluster).await;
    }
    let after = opened(&cluster, &[0, 1]).await;
    assert_eq!(
        after.iter().sum::<f64>() - before.iter().sum::<f64>(),
        4.0,
        "{before:?} -> {after:?}"
    );
}

#[tokio::test]
async fn haproxy_passes_an_sse_stream_through_as_it_comes() {
    // One replica, so the whole session stays on it: what is checked is the load balancer's
    // config, which must neither buffer an SSE response nor time it out.
    let cluster = Cluster::start_plain(1, &["--", FIXTURE]);
    let mut c = cluster.client();
    c.initialize().await;
    let started = std::time::Instant::now();
    let mut events = c
        .stream(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "slow", "arguments": {"ms": 3000}, "_meta": {"progressToken": "p"}}}),
        )
        .await;
    let first = events.next().await.expect("a progress notification");
    assert_eq!(first["method"], "notifications/progress", "{first}");
    assert!(
        started.elapsed() < std::time::Duration::from_millis(2500),
        "the progress came through before the answer, not with it: {:?}",
        started.elapsed()
    );
    let answer = events.next().await.expect("the answer");
    assert_eq!(answer["id"], 1, "{answer}");
    assert!(started.elapsed() >= std::time::Duration::from_millis(3000));
}

#[test]
fn the_harness_deletes_its_redis_keys_and_no_other() {
    // What every cluster test's clean-up rests on: the keys under its prefix go, glob
    // characters in the prefix are literal, and a key of anyone else's stays.
    common::cluster::assert_redis_up();
    let tag = format!("{:016x}", rand::random::<u64>());
    let mine = format!("test-{tag}[*]:");
    let other = format!("test-{tag}*:kept");
    let redis = |args: &[&str]| {
        let out = std::process::Command::new("redis-cli")
            .args(["-u", common::cluster::REDIS_URL])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    for k in ["session:a", "stream:b", "odd key"] {
        redis(&["SET", &format!("{mine}{k}"), "1"]);
    }
    redis(&["SET", &other, "1"]);
    assert_eq!(common::cluster::redis_scan(&mine).len(), 3);
    common::cluster::delete_redis_keys(&mine);
    assert!(common::cluster::redis_scan(&mine).is_empty());
    assert_eq!(redis(&["EXISTS", &other]), "1");
    redis(&["DEL", &other]);
}

/// Cluster mode: one session, created through HAProxy on whichever replica round-robin
/// picked, is served through all three: every request lands on another replica in turn, and
/// the two that do not own it forward to the one that does. DELETE through any ends it on all.
#[tokio::test]
async fn one_session_is_served_through_every_replica() {
    let cluster = Cluster::start(3, &["--", FIXTURE]);
    let mut client = cluster.client();
    client.initialize().await;
    for i in 0..6 {
        let text = client
            .tool_text(10 + i, "echo", json!({"text": format!("call {i}")}))
            .await;
        assert!(text.contains(&format!("call {i}")), "{text}");
    }
    let mut events = client
        .stream(&json!({"jsonrpc": "2.0", "id": 30, "method": "tools/list"}))
        .await;
    let answer = events.next().await.expect("the answer on the stream");
    assert!(answer["result"]["tools"].is_array(), "{answer}");

    // One replica owns it; the other two forwarded to it.
    let mut owners = 0;
    let mut forwarders = 0;
    for i in 0..3 {
        let r = cluster.replica(i);
        if r.metric("mcp_gateway_sessions_active").await == Some(1.0) {
            owners += 1;
        }
        let forwarded = r
            .metric("mcp_gateway_cluster_forwards_total{outcome=\"ok\"}")
            .await
            .unwrap_or(0.0);
        if forwarded > 0.0 {
            forwarders += 1;
        }
    }
    assert_eq!((owners, forwarders), (1, 2));

    assert_eq!(client.delete().await, 200);
    for i in 0..3 {
        let r = client.call(40 + i, "tools/list", json!({})).await;
        assert_eq!(r.status, 404, "{r:?}");
    }
}

/// The official Python SDK (mcp 2.x) as the client, through HAProxy in front of three
/// replicas in cluster mode that close SSE streams mid-call (polling): tools, progress, a
/// sampling round trip, a resource subscription whose update comes back, and streams resumed
/// with `Last-Event-ID` at whichever replica round-robin picks. All three replicas served it:
/// one owns the session, the other two forwarded to it.
#[tokio::test]
async fn the_python_sdk_works_through_the_load_balancer() {
    let cluster = Cluster::start(
        3,
        &[
            "--sse-poll-after-ms",
            "300",
            "--sse-retry-ms",
            "100",
            "--",
            FIXTURE,
        ],
    );
    let url = cluster.lb_url();
    let out = tokio::task::spawn_blocking(move || common::python_sdk_client("cluster", &url))
        .await
        .unwrap();
    let echoes: Vec<String> = (0..6).map(|i| format!("call {i}")).collect();
    for (got, want) in out["echo"].as_array().unwrap().iter().zip(&echoes) {
        assert!(got.as_str().unwrap().contains(want.as_str()), "{out}");
    }
    assert_eq!(out["progress"], json!([0.0, 50.0, 100.0]), "{out}");
    assert_eq!(out["sampling"], "LLM response: sampled(2+2)", "{out}");
    assert_eq!(out["updated"], json!(["test://static-text"]), "{out}");
    assert_eq!(out["slow"], "slept 1500 ms", "{out}");

    let mut owners = Vec::new();
    let mut forwarders = 0;
    for i in 0..3 {
        let r = cluster.replica(i);
        if r.metric(OPENED).await == Some(1.0) {
            owners.push(i);
        }
        let forwarded = r
            .metric("mcp_gateway_cluster_forwards_total{outcome=\"ok\"}")
            .await
            .unwrap_or(0.0);
        if forwarded > 0.0 {
            forwarders += 1;
        }
    }
    assert_eq!(
        (owners.len(), forwarders),
        (1, 2),
        "every replica served it"
    );
    let owner = cluster.replica(owners[0]);
    assert!(
        owner.log().matches("resuming stream").count() >= 1,
        "the SDK resumed a stream: {}",
        owner.log()
    );
}
