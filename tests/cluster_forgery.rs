//! Cluster mode against someone who can write to the shared Redis but does not know the cluster
//! secret: what a replica reads there to decide where to forward a request (a session record's
//! owner, a replica's heartbeat and the URL in it) is signed with the secret, and a forged one
//! is ignored, so no request, with the secret and the client's bearer token it carries, is
//! ever sent to an address the attacker wrote. Session ids never appear in key names either:
//! someone who can list the keys learns none.
//!
//! Two replicas share the Redis at 127.0.0.1:6379 under a key prefix of each test's own; the
//! attacker uses `redis-cli` and listens on a TCP port of the test's own.

mod common;

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Client, FIXTURE, Gateway};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SECRET: &str = "a-cluster-secret-the-attacker-lacks";
const TOKEN: &str = "the-clients-own-bearer-token-4f1c";

fn prefix() -> String {
    format!(
        "test-forge-{}-{:016x}:",
        std::process::id(),
        rand::random::<u64>()
    )
}

fn redis(args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-u", common::cluster::REDIS_URL])
        .args(args)
        .output()
        .expect("redis-cli runs");
    assert!(out.status.success(), "redis-cli {args:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Deletes the test's keys when it ends, failed or not: declared before the replicas, so
/// that it drops after them.
struct Keys(String);

impl Drop for Keys {
    fn drop(&mut self) {
        common::cluster::delete_redis_keys(&self.0);
    }
}

fn replica(prefix: &str) -> Gateway {
    Gateway::start(&[
        "--redis-url",
        common::cluster::REDIS_URL,
        "--redis-key-prefix",
        prefix,
        "--cluster-secret",
        SECRET,
        "--",
        FIXTURE,
    ])
}

/// The attacker's listener: counts the connections made to it and keeps every byte they
/// carried; answers each request as an owner would, with a tool result of its own.
struct Trap {
    url: String,
    connections: Arc<Mutex<usize>>,
    received: Arc<Mutex<Vec<u8>>>,
}

impl Trap {
    async fn start() -> Trap {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let connections = Arc::new(Mutex::new(0));
        let received = Arc::new(Mutex::new(Vec::new()));
        let (n, got) = (connections.clone(), received.clone());
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                *n.lock().unwrap() += 1;
                let got = got.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let mut head = Vec::new();
                    let mut answered = false;
                    while let Ok(k) = conn.read(&mut buf).await {
                        if k == 0 {
                            break;
                        }
                        got.lock().unwrap().extend_from_slice(&buf[..k]);
                        head.extend_from_slice(&buf[..k]);
                        if !answered && head.windows(4).any(|w| w == b"\r\n\r\n") {
                            answered = true;
                            let body = r#"{"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"from the attacker"}]}}"#;
                            let answer = format!(
                                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                                body.len()
                            );
                            let _ = conn.write_all(answer.as_bytes()).await;
                        }
                    }
                });
            }
        });
        Trap {
            url,
            connections,
            received,
        }
    }

    /// Fails if anything reached the listener, and shows what did.
    fn assert_untouched(&self) {
        let got = String::from_utf8_lossy(&self.received.lock().unwrap()).into_owned();
        assert!(
            !got.contains(SECRET) && !got.contains(TOKEN),
            "the cluster secret or the client's token reached the attacker:\n{got}"
        );
        assert_eq!(
            *self.connections.lock().unwrap(),
            0,
            "a replica connected to the attacker's address:\n{got}"
        );
    }
}

/// A session opened on `a` (with a bearer token the gateway passes along), with replay
/// events of its own in Redis.
async fn session_on(a: &Gateway, prefix: &str) -> Client {
    let mut on_a = a
        .client()
        .with_header("authorization", &format!("Bearer {TOKEN}"));
    on_a.initialize().await;
    let mut events = on_a
        .stream(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .await;
    assert!(events.next().await.is_some(), "the answer on the stream");
    common::wait_until("replay events in Redis", Duration::from_secs(10), || {
        common::cluster::redis_scan(prefix)
            .iter()
            .any(|k| k.contains(":events:"))
    })
    .await;
    on_a
}

/// Every key name in the test's prefix, checked: none holds the session id.
fn assert_no_key_names(prefix: &str, session: &str) {
    let keys = common::cluster::redis_scan(prefix);
    assert!(
        keys.iter().any(|k| k.contains("session")),
        "a session record: {keys:?}"
    );
    let named: Vec<&String> = keys.iter().filter(|k| k.contains(session)).collect();
    assert!(named.is_empty(), "key names with the session id: {named:?}");
}

/// The attacker rewrites the session record's owner to a replica of its own making and writes
/// that replica's heartbeat, at its own address: two writes. The replica the next request
/// reaches never sends it there; the owner goes on serving the session.
#[tokio::test]
async fn a_forged_owner_and_heartbeat_in_redis_get_no_request() {
    let prefix = prefix();
    let _keys = Keys(prefix.clone());
    let mut a = replica(&prefix);
    let mut b = replica(&prefix);
    let on_a = session_on(&a, &prefix).await;

    let trap = Trap::start().await;
    let records: Vec<String> = common::cluster::redis_scan(&prefix)
        .into_iter()
        .filter(|k| k.starts_with(&format!("{prefix}session:")))
        .collect();
    assert_eq!(records.len(), 1, "{records:?}");
    redis(&["HSET", &records[0], "replica", "f0f0f0f0f0f0f0f0"]);
    redis(&[
        "SET",
        &format!("{prefix}replica:f0f0f0f0f0f0f0f0"),
        &trap.url,
        "PX",
        "60000",
    ]);

    let r = on_a.at(&b.url).call(2, "tools/list", json!({})).await;
    trap.assert_untouched();
    // The record names no replica this one can trust: to it, the session is not there.
    assert!(matches!(r.status, 404 | 503), "{r:?}");
    assert!(!r.body.contains("from the attacker"), "{r:?}");
    assert!(
        b.metric("mcp_gateway_cluster_unverified_total{what=\"owner\"}")
            .await
            .unwrap_or(0.0)
            >= 1.0
    );
    // The owner holds the session and serves it.
    let text = on_a
        .tool_text(3, "echo", json!({"text": "still on a"}))
        .await;
    assert!(text.contains("still on a"), "{text}");
    trap.assert_untouched();
    assert_no_key_names(&prefix, on_a.session.as_deref().unwrap());

    a.terminate();
    b.terminate();
}

/// The attacker overwrites the live owner's heartbeat with its own address (the owner is
/// stopped, so it does not beat it back). Another replica never forwards there: to it the
/// owner is silent, and once it may judge that, it takes the session over and serves it.
#[tokio::test]
async fn a_forged_heartbeat_of_the_owner_gets_no_request() {
    let prefix = prefix();
    let _keys = Keys(prefix.clone());
    let mut a = replica(&prefix);
    let mut b = replica(&prefix);
    let on_a = session_on(&a, &prefix).await;

    let a_heartbeat = common::cluster::redis_scan(&prefix)
        .into_iter()
        .filter(|k| k.starts_with(&format!("{prefix}replica:")))
        .find(|k| redis(&["GET", k]).contains(&a.addr))
        .expect("A's heartbeat");
    let trap = Trap::start().await;
    a.signal("-STOP");
    redis(&["SET", &a_heartbeat, &trap.url, "PX", "60000"]);

    let on_b = on_a.at(&b.url);
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let r = on_b
            .call(
                2,
                "tools/call",
                json!({"name": "echo", "arguments": {"text": "on b"}}),
            )
            .await;
        trap.assert_untouched();
        if r.status == 200 {
            break r.body;
        }
        // The owner is not heard from: B asks the client to retry until it may take over.
        assert_eq!(r.status, 503, "{r:?}");
        assert!(Instant::now() < deadline, "never taken over: {r:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(text.contains("on b"), "{text}");
    assert!(!text.contains("from the attacker"), "{text}");
    assert_eq!(
        b.metric("mcp_gateway_sessions_adopted_total").await,
        Some(1.0)
    );
    assert!(
        b.metric("mcp_gateway_cluster_unverified_total{what=\"heartbeat\"}")
            .await
            .unwrap_or(0.0)
            >= 1.0
    );
    trap.assert_untouched();
    assert_no_key_names(&prefix, on_a.session.as_deref().unwrap());

    a.signal("-CONT");
    a.terminate();
    b.terminate();
}
