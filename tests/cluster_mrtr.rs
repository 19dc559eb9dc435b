//! Multi round-trip requests in cluster mode (issue 22): two replicas sharing the Redis at
//! 127.0.0.1:6379 (a key prefix of the test's own) and a PostgreSQL database, so the key that
//! seals `requestState` is the same on both. A modern client's retry that reaches the other
//! replica is sent on to the one that holds the parked call, round after round; once that
//! replica is gone the call is lost, and the retry is refused as the spec says, for the client
//! to start the request again.

mod common;

use common::modern::{Modern, accept, all_capabilities, only};
use common::{Client, FIXTURE, Gateway, Postgres};
use serde_json::json;

const SECRET: &str = "a-cluster-secret-for-mrtr-tests";

fn replica(prefix: &str, db: &str) -> Gateway {
    Gateway::start(&[
        "--redis-url",
        "redis://127.0.0.1:6379",
        "--redis-key-prefix",
        prefix,
        "--cluster-secret",
        SECRET,
        "--database-url",
        db,
        "--",
        FIXTURE,
    ])
}

#[tokio::test]
async fn a_retry_reaches_the_replica_holding_its_call_until_that_one_is_gone() {
    common::cluster::assert_redis_up();
    let db = Postgres::create("mrtr");
    let prefix = format!("test-mrtr-{:016x}:", rand::random::<u64>());
    let mut a = replica(&prefix, &db.url);
    let b = replica(&prefix, &db.url);
    let on_a = Modern::new(Client::new(&a.url), all_capabilities());
    let on_b = Modern::new(Client::new(&b.url), all_capabilities());

    // Parked on A; both rounds' retries go through B.
    let first = on_a.call(1, "ask_twice", json!({})).await;
    let key = only(first.input_requests(), "elicitation/create");
    let second = on_b
        .retry(
            2,
            "ask_twice",
            json!({}),
            json!({ key: accept("a") }),
            &first.state(),
        )
        .await;
    let key = only(second.input_requests(), "elicitation/create");
    let done = on_b
        .retry(
            3,
            "ask_twice",
            json!({}),
            json!({ key: accept("b") }),
            &second.state(),
        )
        .await;
    assert_eq!(done.text(), "first=a second=b");
    assert!(
        b.metric("mcp_gateway_cluster_forwards_total{outcome=\"ok\"}")
            .await
            .unwrap_or(0.0)
            >= 2.0,
        "B forwarded the retries"
    );

    // A call parked on A is lost with A: B refuses its retry, and the request starts again
    // (on B).
    let first = on_a.call(4, "ask_twice", json!({})).await;
    let key = only(first.input_requests(), "elicitation/create");
    a.terminate();
    let lost = on_b
        .retry(
            5,
            "ask_twice",
            json!({}),
            json!({ key: accept("a") }),
            &first.state(),
        )
        .await;
    let (status, code, message) = lost.error();
    assert_eq!((status, code), (400, -32602), "{}", lost.message);
    assert!(message.contains("no longer held"), "{message}");
    let again = on_b.call(6, "ask_twice", json!({})).await;
    only(again.input_requests(), "elicitation/create");
    drop(b);
    common::cluster::delete_redis_keys(&prefix);
}

/// A 2026-07-28 request needs no owner: one caller's calls through either replica, as a
/// round-robin balancer would send them, are each served where they land, never forwarded.
#[tokio::test]
async fn modern_calls_are_served_where_they_land() {
    common::cluster::assert_redis_up();
    let db = Postgres::create("mrtr_land");
    let prefix = format!("test-mrtr-land-{:016x}:", rand::random::<u64>());
    let a = replica(&prefix, &db.url);
    let b = replica(&prefix, &db.url);
    let on = [
        Modern::new(Client::new(&a.url), all_capabilities()),
        Modern::new(Client::new(&b.url), all_capabilities()),
    ];
    for id in 1..=10 {
        let text = format!("call {id}");
        let r = on[id as usize % 2]
            .call(id, "echo", json!({ "text": text }))
            .await;
        assert_eq!(r.text(), text);
    }
    for (name, replica) in [("A", &a), ("B", &b)] {
        let forwarded = replica
            .metric("mcp_gateway_cluster_forwards_total{outcome=\"ok\"}")
            .await
            .unwrap_or(0.0);
        assert_eq!(forwarded, 0.0, "{name} forwarded a modern call");
    }
}
