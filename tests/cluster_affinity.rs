//! Session affinity learned from the answers (issue 40): the shipped HAProxy configuration
//! (deploy/config/haproxy.cfg, run as it is, as its two balancers, peers of each other) in
//! front of three replicas in cluster mode. Each balancer learns from an owner's answer
//! (`Mcp-Session-Id`) which replica serves a session, and sends the session's requests
//! there: no forward, whichever balancer a request comes through. A replica that takes a
//! killed owner's session over is learned the same way. An answer relayed from the owner
//! teaches nothing. (A killed owner and a rolling restart behind these balancers, with a
//! stream that must lose nothing: tests/cluster_chaos.rs.)

mod common;

use std::time::{Duration, Instant};

use common::{Client, Cluster, FIXTURE};
use serde_json::json;

const FORWARDS: &str = "mcp_gateway_cluster_forwards_total{outcome=\"ok\"}";

/// Forwards every running replica of `replicas` has made.
async fn forwards(cluster: &Cluster, replicas: &[usize]) -> f64 {
    let mut n = 0.0;
    for &i in replicas {
        n += cluster.replica(i).metric(FORWARDS).await.unwrap_or(0.0);
    }
    n
}

/// Waits until both balancers name `replica` for session `id`.
fn wait_learned(cluster: &Cluster, id: &str, replica: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let learned = cluster.learned(id);
        if learned == [Some(replica), Some(replica)] {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the balancers learned {learned:?} for the session, not replica {replica} on both"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

async fn echo(client: &Client, id: i64, text: &str) {
    let got = client.tool_text(id, "echo", json!({ "text": text })).await;
    assert!(got.contains(text), "{got}");
}

#[tokio::test]
async fn a_session_stays_on_its_owner_through_either_balancer() {
    let cluster = Cluster::start_shipped(&["--", FIXTURE]);
    let mut client = Client::new(&cluster.lb_url());
    client.initialize().await;
    client.notify("notifications/initialized", json!({})).await;
    let id = client.session.clone().expect("a session id");
    let owner = cluster.holder(&[0, 1, 2]).await;
    // Learned from the answer to `initialize`, and passed to the other balancer.
    wait_learned(&cluster, &id, owner);

    let other = client.at(&cluster.peer_url());
    for i in 0..12 {
        let via = if i % 2 == 0 { &client } else { &other };
        echo(via, 10 + i, &format!("call {i}")).await;
    }
    // A GET stream through the other balancer lands on the owner too.
    let stream = other.get_stream().await;
    assert_eq!(stream.status(), 200);
    drop(stream);
    assert_eq!(
        forwards(&cluster, &[0, 1, 2]).await,
        0.0,
        "a request went to a replica that does not serve its session"
    );

    // The owner names the session in its answers; a replica that forwards does not.
    let direct = client.at(&cluster.url(owner));
    let r = direct
        .request(reqwest::Method::POST)
        .json(&json!({"jsonrpc": "2.0", "id": 40, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["mcp-session-id"], id.as_str());
    let forwarder = (owner + 1) % 3;
    let r = client
        .at(&cluster.url(forwarder))
        .request(reqwest::Method::POST)
        .json(&json!({"jsonrpc": "2.0", "id": 41, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers().get("mcp-session-id").is_none(),
        "a relayed answer named the session: {:?}",
        r.headers()
    );
    assert_eq!(forwards(&cluster, &[0, 1, 2]).await, 1.0);
}

#[tokio::test]
async fn the_replica_that_takes_a_session_over_is_learned() {
    let mut cluster = Cluster::start_shipped(&["--", FIXTURE]);
    let mut client = Client::new(&cluster.lb_url());
    client.initialize().await;
    client.notify("notifications/initialized", json!({})).await;
    echo(&client, 1, "before").await;
    let id = client.session.clone().expect("a session id");
    let first = cluster.holder(&[0, 1, 2]).await;
    wait_learned(&cluster, &id, first);

    // The owner is killed: the next request, sent to it, fails to connect and goes to
    // another replica, which takes the session over and names it in its answer.
    cluster.kill(first);
    echo(&client, 2, "after").await;
    let rest: Vec<usize> = (0..3).filter(|i| *i != first).collect();
    let second = cluster.holder(&rest).await;
    wait_learned(&cluster, &id, second);
    let before = forwards(&cluster, &rest).await;
    let other = client.at(&cluster.peer_url());
    for i in 0..8 {
        let via = if i % 2 == 0 { &client } else { &other };
        echo(via, 10 + i, &format!("call {i}")).await;
    }
    assert_eq!(
        forwards(&cluster, &rest).await,
        before,
        "a request went past the replica that took the session over"
    );
}
