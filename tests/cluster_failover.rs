//! Cluster mode when a replica goes away (issue 21): a session whose replica was killed is
//! taken over by the next replica a request for it reaches, with the client's log level and
//! subscriptions re-sent to its new plugin instance, its buffered events replayable from
//! Redis, and the request that was in flight on the dead replica ended with an error that
//! says so; a replica stopped by SIGTERM hands its sessions over instead of ending them.
//! Real processes behind HAProxy, the Redis at 127.0.0.1:6379 under a key prefix of the
//! test's own (tests/common/cluster.rs).

mod common;

use std::time::Duration;

use common::{Client, Cluster, FIXTURE, RawEvents};
use serde_json::{Value, json};

const ADOPTED: &str = "mcp_gateway_sessions_adopted_total";

/// A client of a new session on replica `i`, directly (so the test knows its owner).
async fn session_on(cluster: &Cluster, i: usize) -> Client {
    let mut client = Client::new(&cluster.url(i));
    client.initialize().await;
    let r = client.notify("notifications/initialized", json!({})).await;
    assert_eq!(r.status, 202, "{r:?}");
    client
}

/// Sessions taken over, summed over the running replicas `which`.
async fn adopted(cluster: &Cluster, which: &[usize]) -> f64 {
    let mut sum = 0.0;
    for &i in which {
        sum += cluster.replica(i).metric(ADOPTED).await.unwrap_or(0.0);
    }
    sum
}

/// The text of a tool's answer.
fn text(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text in {result}"))
        .to_owned()
}

/// Reads a GET stream's events until one whose data holds `needle`; its id.
async fn until(events: &mut RawEvents, needle: &str) -> String {
    loop {
        let ev = events
            .next()
            .await
            .unwrap_or_else(|| panic!("the stream ended before {needle}"));
        if ev.data.contains(needle) {
            return ev.id.expect("a resumable event has an id");
        }
    }
}

/// Leaves two events on the session's GET stream, the first read by a GET and the second
/// buffered after that GET closed, both written through to Redis; the first one's id.
async fn one_read_one_buffered(
    cluster: &Cluster,
    client: &Client,
    first: &str,
    second: &str,
) -> String {
    let session = client.session.clone().expect("a session id");
    let mut get = RawEvents::new(client.get_stream().await);
    client
        .result(
            90,
            "tools/call",
            json!({"name": "background_log", "arguments": {"text": first, "after_ms": 10}}),
        )
        .await;
    let id = until(&mut get, first).await;
    drop(get);
    client
        .result(
            91,
            "tools/call",
            json!({"name": "background_log", "arguments": {"text": second, "after_ms": 10}}),
        )
        .await;
    written(cluster, &session, 2).await;
    id
}

/// A GET resuming after `last`, checked to be accepted.
async fn resume(client: &Client, last: &str) -> RawEvents {
    let r = client
        .request(reqwest::Method::GET)
        .header("accept", "text/event-stream")
        .header("last-event-id", last)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    RawEvents::new(r)
}

/// Waits until the replay events of `session`'s GET stream in Redis number at least `n`
/// (they are written through in the background).
async fn written(cluster: &Cluster, session: &str, n: usize) {
    let key = format!(
        "{}events:{}:0",
        cluster.key_prefix().unwrap(),
        cluster.session_name(session)
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let out = std::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", "6379", "XLEN", &key])
            .output()
            .expect("redis-cli");
        let len: usize = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or(0);
        if len >= n {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{n} events never reached Redis ({len})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// SIGKILL the replica that owns a session: the next request for it, at another replica,
/// takes it over. The client's log level and resource subscription reach the new plugin
/// instance; an event buffered before the kill replays from Redis; the call that was in
/// flight ends with an error saying the replica stopped; the session goes on, also through
/// the load balancer.
#[tokio::test]
async fn a_killed_replicas_session_is_taken_over_with_its_state() {
    let mut cluster = Cluster::start(3, &["--", FIXTURE]);
    let client = session_on(&cluster, 0).await;
    let session = client.session.clone().expect("a session id");
    let r = client
        .call(1, "logging/setLevel", json!({"level": "debug"}))
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let r = client
        .call(
            2,
            "resources/subscribe",
            json!({"uri": "test://static-text"}),
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        text(
            &client
                .result(
                    3,
                    "tools/call",
                    json!({"name": "log_level", "arguments": {}})
                )
                .await
        ),
        "debug"
    );

    // An event for the GET stream, read; another buffered while no GET is open.
    let first = one_read_one_buffered(&cluster, &client, "first", "second").await;

    // A call in flight when the replica dies.
    let mut slow = RawEvents::new(
        client
            .post_sse(&json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "slow", "arguments": {"ms": 60000}}}))
            .await,
    );
    let primed = slow.next().await.expect("the priming event");
    let slow_id = primed.id.expect("a priming event id");
    // Its stream is known to Redis to owe an answer before the replica dies.
    let owed = format!(
        "{}in-flight:{}",
        cluster.key_prefix().unwrap(),
        cluster.session_name(&session)
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !cluster.redis_keys().contains(&owed) {
        assert!(std::time::Instant::now() < deadline, "no in-flight record");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    cluster.kill(0);
    assert!(
        slow.next().await.is_none(),
        "the dead replica's stream ends"
    );

    // Replica 1 takes the session over on its next request.
    let there = client.at(&cluster.url(1));
    assert_eq!(
        text(
            &there
                .result(
                    7,
                    "tools/call",
                    json!({"name": "log_level", "arguments": {}})
                )
                .await
        ),
        "debug",
        "the log level reached the new plugin instance"
    );
    assert_eq!(
        text(
            &there
                .result(
                    8,
                    "tools/call",
                    json!({"name": "subscriptions", "arguments": {}})
                )
                .await
        ),
        "test://static-text",
        "the subscription reached the new plugin instance"
    );
    assert_eq!(adopted(&cluster, &[1, 2]).await, 1.0);

    // The event buffered before the kill replays from Redis.
    let mut resumed = resume(&there, &first).await;
    until(&mut resumed, "second").await;
    drop(resumed);

    // The call in flight ends with an error that says what happened.
    let mut resumed = resume(&there, &slow_id).await;
    let answer = loop {
        let ev = resumed.next().await.expect("the in-flight call's answer");
        if let Ok(v) = serde_json::from_str::<Value>(&ev.data)
            && v.get("id") == Some(&json!(6))
        {
            break v;
        }
    };
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("replica running this request stopped"),
        "{answer}"
    );

    // The session goes on, through the load balancer too (replica 0 is down).
    cluster.wait_down(0);
    let lb = client.at(&cluster.lb_url());
    for i in 0..4 {
        let r = lb
            .result(
                20 + i,
                "tools/call",
                json!({"name": "echo", "arguments": {"text": "on"}}),
            )
            .await;
        assert!(text(&r).contains("on"), "{r}");
    }
    assert_eq!(adopted(&cluster, &[1, 2]).await, 1.0, "taken over once");
}

/// SIGTERM hands a replica's sessions over: its records and events stay in Redis, and the
/// next request at another replica takes the session over at once (the heartbeat says the
/// replica is gone), events buffered before the stop replayable.
#[tokio::test]
async fn a_stopped_replica_hands_its_sessions_over() {
    let mut cluster = Cluster::start(2, &["--", FIXTURE]);
    let client = session_on(&cluster, 0).await;
    let before = one_read_one_buffered(&cluster, &client, "before", "while away").await;

    assert!(cluster.terminate(0).success());
    let there = client.at(&cluster.url(1));
    let r = there
        .result(
            3,
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "still here"}}),
        )
        .await;
    assert!(text(&r).contains("still here"), "{r}");
    assert_eq!(adopted(&cluster, &[1]).await, 1.0);
    let mut resumed = resume(&there, &before).await;
    until(&mut resumed, "while away").await;

    // DELETE ends it everywhere, taken over or not.
    assert_eq!(there.delete().await, 200);
    assert_eq!(there.call(4, "tools/list", json!({})).await.status, 404);
}

/// A frozen owner (SIGSTOP: its process and sockets stay, it answers nothing): a GET stream
/// forwarded to it ends once its heartbeat lapses, not when TCP gives up; the next request
/// takes the session over; and the owner, woken (SIGCONT), finds its session taken and lets
/// it go rather than serve it beside its new owner.
#[tokio::test]
async fn a_frozen_owner_is_found_out_and_its_session_taken_over() {
    let cluster = Cluster::start(2, &["--", FIXTURE]);
    let client = session_on(&cluster, 0).await;
    client
        .result(
            1,
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "hi"}}),
        )
        .await;
    let there = client.at(&cluster.url(1));
    let get = there.get_stream().await;
    assert_eq!(get.status(), 200);
    assert!(common::send_signal(cluster.pid(0), "-STOP"));
    let mut get = RawEvents::new(get);
    while get.next().await.is_some() {}

    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let r = loop {
        let r = there
            .call(
                2,
                "tools/call",
                json!({"name": "echo", "arguments": {"text": "taken"}}),
            )
            .await;
        if r.status != 503 {
            break r;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never taken over: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body.contains("taken"), "{r:?}");
    assert_eq!(adopted(&cluster, &[1]).await, 1.0);

    assert!(common::send_signal(cluster.pid(0), "-CONT"));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while cluster
        .replica(0)
        .metric("mcp_gateway_sessions_active")
        .await
        != Some(0.0)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the woken owner still holds the session"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Its new owner serves it still.
    let r = there
        .result(
            3,
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "still"}}),
        )
        .await;
    assert!(text(&r).contains("still"), "{r}");
}

/// A replica that passes another's GET stream through ends it when it drains, as it does its
/// own GET streams: it does not hold its stop for the whole grace period. The session, on
/// the other replica, goes on.
#[tokio::test]
async fn a_draining_forwarder_ends_the_get_streams_it_passes_through() {
    let mut cluster = Cluster::start(2, &["--shutdown-grace-secs", "60", "--", FIXTURE]);
    let client = session_on(&cluster, 0).await;
    let get = client.at(&cluster.url(1)).get_stream().await;
    assert_eq!(get.status(), 200);
    let stopping = std::time::Instant::now();
    assert!(cluster.terminate(1).success());
    assert!(
        stopping.elapsed() < Duration::from_secs(30),
        "the forwarder held its stop for the grace period"
    );
    let mut get = RawEvents::new(get);
    while get.next().await.is_some() {}
    let r = client
        .result(
            1,
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "on"}}),
        )
        .await;
    assert!(text(&r).contains("on"), "{r}");
}
