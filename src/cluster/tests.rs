//! What the replicas share through Redis, against real Redis servers: the shared Redis at
//! 127.0.0.1:6379 under a key prefix of each test's own (deleted when the test ends), and a
//! `redis-server` of the test's own where Redis must go away and come back. A test fails,
//! never skips, without them.

use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

use super::bus::Listener;
use super::*;
use crate::auth::shared::{Admission, SharedThrottle};

const REDIS: &str = "redis://127.0.0.1:6379/";

/// A key prefix of the test's own; its keys are deleted when it drops.
struct Prefix(String);

impl Prefix {
    fn new() -> Prefix {
        Prefix(format!("test-{:016x}:", rand::random::<u64>()))
    }
}

impl Drop for Prefix {
    fn drop(&mut self) {
        let Ok(mut con) = redis::Client::open(REDIS).and_then(|c| c.get_connection()) else {
            return;
        };
        let keys: Vec<String> = match redis::Commands::scan_match(&mut con, format!("{}*", self.0))
        {
            Ok(iter) => iter.filter_map(Result::ok).collect(),
            Err(_) => return,
        };
        if !keys.is_empty() {
            let _: redis::RedisResult<()> = redis::cmd("DEL").arg(keys).query(&mut con);
        }
    }
}

/// A replica's part in the cluster at `url` under `prefix`.
async fn replica(url: &str, prefix: &str) -> Arc<Cluster> {
    let config = ClusterConfig {
        redis_url: url.to_owned(),
        key_prefix: prefix.to_owned(),
        secret: "0123456789abcdef".into(),
        advertise_url: None,
    };
    Cluster::connect(&config, "http://127.0.0.1:9".into())
        .await
        .unwrap_or_else(|e| panic!("Redis at {url} (the tests need it): {e}"))
}

fn counters(addr: &str, limit: u32, total: u32) -> Vec<(String, u32)> {
    vec![
        (format!("register:{addr}"), limit),
        ("register".to_owned(), total),
    ]
}

#[tokio::test]
async fn replicas_count_against_one_limit_and_a_refusal_counts_nowhere() {
    let prefix = Prefix::new();
    let (a, b) = (
        throttle::RedisThrottle::new(replica(REDIS, &prefix.0).await),
        throttle::RedisThrottle::new(replica(REDIS, &prefix.0).await),
    );
    let window = Duration::from_secs(60);
    // Two per address, three in all, whichever replica is asked.
    let ip1 = counters("192.0.2.1", 2, 3);
    assert_eq!(a.acquire(&ip1, window).await, Ok(Admission::Admitted));
    assert_eq!(b.acquire(&ip1, window).await, Ok(Admission::Admitted));
    let Ok(Admission::Refused(wait)) = a.acquire(&ip1, window).await else {
        panic!("the address's third attempt in the window is refused, on any replica");
    };
    assert!(
        wait <= window && wait > window - Duration::from_secs(5),
        "{wait:?}"
    );
    assert!(matches!(
        b.acquire(&ip1, window).await,
        Ok(Admission::Refused(_))
    ));
    // The refusals took nothing from the total: another address has its last slot.
    let ip2 = counters("192.0.2.2", 2, 3);
    assert_eq!(b.acquire(&ip2, window).await, Ok(Admission::Admitted));
    assert!(
        matches!(a.acquire(&ip2, window).await, Ok(Admission::Refused(_))),
        "the total is reached"
    );
    // A window ends: counting starts again.
    let short = Duration::from_millis(200);
    let ip3 = counters("192.0.2.3", 1, 100);
    let ip3 = &ip3[..1];
    assert_eq!(a.acquire(ip3, short).await, Ok(Admission::Admitted));
    assert!(matches!(
        b.acquire(ip3, short).await,
        Ok(Admission::Refused(_))
    ));
    tokio::time::sleep(short + Duration::from_millis(50)).await;
    assert_eq!(b.acquire(ip3, short).await, Ok(Admission::Admitted));
    // Every counter expires.
    let mut con = redis::Client::open(REDIS)
        .unwrap()
        .get_connection()
        .unwrap();
    for name in ["register:192.0.2.1", "register"] {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(format!("{}throttle:{name}", prefix.0))
            .query(&mut con)
            .unwrap();
        assert!(ttl > 0 && ttl <= 60_000, "{name}: {ttl}");
    }
}

#[tokio::test]
async fn a_throttle_whose_redis_is_gone_says_so_within_the_timeout() {
    let port = free_port();
    let mut server = RedisServer::start(port);
    let a = throttle::RedisThrottle::new(replica(&server.url(), "t:").await);
    let counters = counters("192.0.2.9", 5, 100);
    assert_eq!(
        a.acquire(&counters, Duration::from_secs(60)).await,
        Ok(Admission::Admitted)
    );
    server.stop();
    let started = std::time::Instant::now();
    assert!(a.acquire(&counters, Duration::from_secs(60)).await.is_err());
    assert!(
        started.elapsed() < REDIS_TIMEOUT * 3,
        "{:?}",
        started.elapsed()
    );
}

/// What a listener heard.
#[derive(Default)]
struct Recorder {
    messages: Mutex<Vec<String>>,
    subscribed: Mutex<u32>,
}

impl Listener for Recorder {
    fn message(&self, payload: &[u8]) {
        let text = String::from_utf8_lossy(payload).into_owned();
        self.messages.lock().unwrap().push(text);
    }

    fn resubscribed(&self) {
        *self.subscribed.lock().unwrap() += 1;
    }
}

async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn messages_reach_the_other_replicas_and_the_subscription_outlives_a_redis_restart() {
    let port = free_port();
    let mut server = RedisServer::start(port);
    let (a, b) = (
        replica(&server.url(), "c:").await,
        replica(&server.url(), "c:").await,
    );
    let heard = Arc::new(Recorder::default());
    let other = Arc::new(Recorder::default());
    let stop = CancellationToken::new();
    let listening = tokio::spawn(a.clone().listen_on(
        vec![
            (a.channel("one"), heard.clone() as Arc<dyn Listener>),
            (a.channel("two"), other.clone() as Arc<dyn Listener>),
        ],
        stop.clone(),
    ));
    eventually("subscribed", || a.hears()).await;
    assert_eq!(*heard.subscribed.lock().unwrap(), 1);
    b.publish(&b.channel("one"), "hello").await.unwrap();
    b.publish(&b.channel("elsewhere"), "not for a")
        .await
        .unwrap();
    b.publish(&b.channel("two"), "to two").await.unwrap();
    b.publish(&b.channel("one"), &"x".repeat(bus::MAX_MESSAGE + 1))
        .await
        .unwrap();
    b.publish(&b.channel("one"), "after").await.unwrap();
    eventually("the messages", || heard.messages.lock().unwrap().len() == 2).await;
    assert_eq!(*heard.messages.lock().unwrap(), ["hello", "after"]);
    assert_eq!(*other.messages.lock().unwrap(), ["to two"]);

    // Redis restarts (empty): the subscription is lost, made again, and the listeners told.
    server.stop();
    eventually("the loss seen", || !a.hears()).await;
    server = RedisServer::start(port);
    eventually("subscribed again", || {
        a.hears() && *heard.subscribed.lock().unwrap() == 2
    })
    .await;
    assert_eq!(*other.subscribed.lock().unwrap(), 2);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while b.publish(&b.channel("one"), "again").await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "B never reconnected"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eventually("a message after the restart", || {
        heard.messages.lock().unwrap().last().map(String::as_str) == Some("again")
    })
    .await;
    stop.cancel();
    listening.await.unwrap();
    assert!(!a.hears());
    drop(server);
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `redis-server` of the test's own, keeping nothing on disk; killed when dropped.
struct RedisServer {
    port: u16,
    child: Option<Child>,
}

impl RedisServer {
    fn start(port: u16) -> RedisServer {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (scripts/install-test-deps)");
        let server = RedisServer {
            port,
            child: Some(child),
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let up = redis::Client::open(server.url())
                .and_then(|c| c.get_connection())
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_ok();
            if up {
                return server;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

#[tokio::test]
async fn a_heartbeat_put_back_after_it_expired_is_not_believed() {
    let prefix = Prefix::new();
    let c = replica(REDIS, &prefix.0).await;
    let key = c.key(&["replica", "r1"]);
    let alive = c.heartbeat_value(&key, "http://10.0.0.1:8080", Duration::from_secs(5));
    assert!(matches!(
        c.read_heartbeat(&key, Some(alive.as_bytes())),
        Heartbeat::Alive(url) if url == "http://10.0.0.1:8080"
    ));
    // Written (signed) long ago, and put back now: lapsed.
    let old = c.heartbeat_value(&key, "http://10.0.0.1:8080", Duration::from_secs(0));
    let (signature, rest) = old.split_once(' ').unwrap();
    let (_, says) = rest.split_once(' ').unwrap();
    let expired = crate::audit::now_ms() - 60_000;
    let signed = format!("{expired} {says}");
    let forged = format!("{signature} {signed}");
    assert!(
        matches!(
            c.read_heartbeat(&key, Some(forged.as_bytes())),
            Heartbeat::Lapsed
        ),
        "a changed expiry breaks the signature"
    );
    let resigned = format!(
        "{} {signed}",
        c.signing
            .sign(super::signing::Signed::Heartbeat, &key, &signed)
    );
    assert!(
        matches!(
            c.read_heartbeat(&key, Some(resigned.as_bytes())),
            Heartbeat::Lapsed
        ),
        "a validly signed heartbeat past its time is lapsed"
    );
}
