//! Chaos in cluster mode (issue 21): while a plugin streams 1,000 numbered notifications to a
//! client through HAProxy, the replica that owns the plugin is killed (SIGKILL), and later
//! every replica is restarted one at a time (SIGTERM, start). The client resumes through the
//! load balancer each time, as a client does (`Last-Event-ID`, retrying while the balancer
//! or a replica says to), and must end with every message the plugin produced exactly once
//! and in order; what the killed instance could no longer produce ends in an error that says
//! so; the session goes on; no process is left behind (/proc). Behind the test harness's
//! balancer (round-robin, no affinity) and behind the shipped one (deploy/config/haproxy.cfg:
//! affinity learned from the answers).

mod common;

use std::time::{Duration, Instant};

use common::{Client, Cluster, FIXTURE, RawEvents, alive, descendants};
use serde_json::{Value, json};

const COUNT: u64 = 1000;

/// What the client got of one burst: the numbers in the order they came, and the answer.
struct Received {
    numbers: Vec<u64>,
    answer: Value,
    /// Times the stream had to be resumed.
    resumes: usize,
}

/// Reads a burst's stream to its answer, resuming through the load balancer whenever the
/// stream breaks off; `on_event` runs after each notification (to kill or restart replicas
/// mid-stream).
async fn follow(
    lb: &Client,
    call_id: u64,
    tag: &str,
    mut events: RawEvents,
    mut on_event: impl FnMut(u64) -> Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>>,
) -> Received {
    let mut numbers = Vec::new();
    let mut last_id: Option<String> = None;
    let mut resumes = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        while let Some(ev) = events.next().await {
            if ev.id.is_some() {
                last_id = ev.id.clone();
            }
            let Ok(msg) = serde_json::from_str::<Value>(&ev.data) else {
                continue;
            };
            if msg.get("id") == Some(&json!(call_id)) {
                return Received {
                    numbers,
                    answer: msg,
                    resumes,
                };
            }
            if let Some(data) = msg["params"]["data"].as_str()
                && let Some(n) = data.strip_prefix(&format!("{tag}:"))
            {
                let n: u64 = n.parse().expect("a number");
                numbers.push(n);
                if let Some(work) = on_event(n) {
                    work.await;
                }
            }
        }
        // The stream broke off: resume after the last event, through the load balancer,
        // retrying while it answers 503 or cannot be reached.
        let last = last_id.clone().expect("an event id to resume from");
        events = loop {
            assert!(Instant::now() < deadline, "could not resume the stream");
            let got = lb
                .request(reqwest::Method::GET)
                .header("accept", "text/event-stream")
                .header("last-event-id", &last)
                .send()
                .await;
            match got {
                Ok(r) if r.status() == 200 => break RawEvents::new(r),
                Ok(r) if r.status() == 503 || r.status() == 502 => {}
                Ok(r) => panic!("resuming after {last}: {} {:?}", r.status(), r.text().await),
                Err(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        resumes += 1;
    }
}

fn burst(id: u64, tag: &str, pause_us: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "burst",
        "arguments": {"count": COUNT, "tag": tag, "pause_us": pause_us}}})
}

const ARGS: &[&str] = &["--shutdown-grace-secs", "20", "--", FIXTURE];

#[tokio::test]
async fn a_stream_survives_a_killed_owner_and_a_rolling_restart() {
    survives(Cluster::start(3, ARGS)).await;
}

/// The same behind the shipped HAProxy configuration (two balancers, each session kept on
/// its owner, learned from the answers): the balancer still sends the client to whichever
/// replica serves its session after the owner is killed and while each replica restarts.
#[tokio::test]
async fn a_stream_survives_a_killed_owner_and_a_rolling_restart_with_affinity() {
    survives(Cluster::start_shipped(ARGS)).await;
}

async fn survives(mut cluster: Cluster) {
    let mut client = Client::new(&cluster.lb_url());
    client.initialize().await;
    client.notify("notifications/initialized", json!({})).await;
    // The session's plugin starts on the owner.
    client
        .result(
            1,
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "up"}}),
        )
        .await;
    let first_owner = cluster.holder(&[0, 1, 2]).await;
    let plugins = descendants(cluster.pid(first_owner));
    assert!(!plugins.is_empty(), "the owner runs the session's plugin");

    // 1. The owner is killed mid-burst.
    let killed = std::cell::Cell::new(false);
    let cluster_cell = std::cell::RefCell::new(&mut cluster);
    let events = RawEvents::new(client.post_sse(&burst(2, "a", 3000)).await);
    let got = follow(&client, 2, "a", events, |n| {
        if n == 200 && !killed.get() {
            killed.set(true);
            cluster_cell.borrow_mut().kill(first_owner);
        }
        None
    })
    .await;
    let cluster = cluster_cell.into_inner();
    assert!(killed.get());
    assert!(got.resumes >= 1, "the stream broke off with its replica");
    eprintln!(
        "killed owner: {} messages, {} resumes",
        got.numbers.len(),
        got.resumes
    );
    let expected: Vec<u64> = (0..got.numbers.len() as u64).collect();
    assert_eq!(got.numbers, expected, "every message once, in order");
    assert!(got.numbers.len() as u64 >= 201 && (got.numbers.len() as u64) < COUNT);
    let message = got.answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("replica running this request stopped"),
        "{}",
        got.answer
    );
    // The killed replica's plugin went with it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while plugins.iter().any(|p| alive(*p)) {
        assert!(
            Instant::now() < deadline,
            "a plugin of the killed replica is left: {plugins:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // 2. Every replica restarted, one at a time, while a burst streams.
    cluster.restart(first_owner);
    let events = RawEvents::new(client.post_sse(&burst(3, "b", 8000)).await);
    let mut next = 0usize;
    let cluster_cell = std::cell::RefCell::new(cluster);
    let got = follow(&client, 3, "b", events, |n| {
        // A restart every 250 messages: replica 0, 1, then 2.
        if n > 0 && n % 250 == 0 && next < 3 {
            cluster_cell.borrow_mut().restart(next);
            next += 1;
        }
        None
    })
    .await;
    let cluster = cluster_cell.into_inner();
    assert_eq!(next, 3, "every replica restarted during the burst");
    eprintln!("rolling restart: {} resumes", got.resumes);
    let expected: Vec<u64> = (0..COUNT).collect();
    assert_eq!(got.numbers, expected, "every message once, in order");
    assert!(got.answer["result"].is_object(), "{}", got.answer);

    // The session goes on, and no replica keeps a plugin it does not need.
    let r = client
        .result(
            4,
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "after"}}),
        )
        .await;
    assert!(r["content"][0]["text"].as_str().unwrap().contains("after"));
    // One plugin instance for the one session, on its owner. A replica restarted a moment
    // ago may still be probing its plugin (a process of its own, stopped once the plugin has
    // answered), and a replica a session left stops its instance in the background: the
    // count is waited on, and what each replica has is told if it does not come to one.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut each = Vec::new();
        for i in 0..cluster.len() {
            let sessions = cluster
                .replica(i)
                .metric("mcp_gateway_sessions_active")
                .await;
            each.push((i, descendants(cluster.pid(i)), sessions));
        }
        if each.iter().map(|(_, p, _)| p.len()).sum::<usize>() == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "one plugin instance for the one session, on its owner; (replica, its \
             processes, its sessions): {each:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
