//! The Redis event store against the real Redis at 127.0.0.1:6379 (a test fails, never skips,
//! without it), each test under a key prefix of its own whose keys are deleted when it ends.

use ::redis::aio::ConnectionManagerConfig;
use std::collections::BTreeSet;

use ::redis::{Client, Connection, RedisResult, Value};

use super::*;

const REDIS: &str = "redis://127.0.0.1:6379/";

/// A key prefix of the test's own; its keys are deleted when it is dropped, a failed
/// test's too.
struct Prefix(String);

impl Prefix {
    fn new() -> Prefix {
        Prefix(format!("test-{:016x}:", rand::random::<u64>()))
    }

    fn key(&self, rest: &str) -> String {
        format!("{}{rest}", self.0)
    }

    /// Every key under the prefix now.
    fn keys(&self) -> Vec<String> {
        self.try_keys().expect("the test's keys")
    }

    fn try_keys(&self) -> RedisResult<Vec<String>> {
        let mut con = Client::open(REDIS)?.get_connection()?;
        let mut cursor = String::from("0");
        let mut keys = Vec::new();
        loop {
            let (next, page): (String, Vec<String>) = ::redis::cmd("SCAN")
                .arg(&cursor)
                .arg("MATCH")
                .arg(format!("{}*", self.0))
                .arg("COUNT")
                .arg(1000)
                .query(&mut con)?;
            keys.extend(page);
            if next == "0" {
                break;
            }
            cursor = next;
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }
}

impl Drop for Prefix {
    fn drop(&mut self) {
        // Never a panic here: a test that failed for want of Redis is unwinding already.
        let Ok(keys) = self.try_keys() else { return };
        if !keys.is_empty()
            && let Ok(mut con) = Client::open(REDIS).and_then(|c| c.get_connection())
        {
            let _: RedisResult<()> = ::redis::cmd("DEL").arg(keys).query(&mut con);
        }
    }
}

fn sync_conn() -> Connection {
    Client::open(REDIS)
        .expect("a Redis URL")
        .get_connection()
        .expect("Redis at 127.0.0.1:6379 (the tests need it)")
}

async fn redis() -> ConnectionManager {
    ConnectionManager::new(Client::open(REDIS).expect("a Redis URL"))
        .await
        .expect("Redis at 127.0.0.1:6379 (the tests need it)")
}

/// A manager for `url` that connects on first use and leaves timing out to the store.
fn lazy(url: &str) -> ConnectionManager {
    let config = ConnectionManagerConfig::new()
        .set_number_of_retries(1)
        .set_connection_timeout(None)
        .set_response_timeout(None);
    ConnectionManager::new_lazy_with_config(Client::open(url).expect("a Redis URL"), config)
        .expect("a lazy connection manager")
}

fn data(stream: u64, seq: u64) -> Bytes {
    Bytes::from(format!("event {stream}/{seq}"))
}

fn events(stream: u64, seqs: impl IntoIterator<Item = u64>) -> Vec<(u64, Bytes)> {
    seqs.into_iter()
        .map(|seq| (seq, data(stream, seq)))
        .collect()
}

/// What the tests' sessions are called in key names.
fn names() -> SessionNames {
    SessionNames::new(b"the tests' cluster key")
}

/// The name of session `id` in key names.
fn named(id: &str) -> String {
    names().of(id)
}

fn sid(id: &str) -> Arc<str> {
    Arc::from(id)
}

const FLUSH: Duration = Duration::from_secs(5);

/// A replica's store under the test's prefix, with the default limits.
async fn store(prefix: &Prefix) -> Arc<RedisEventStore> {
    RedisEventStore::new(
        redis().await,
        prefix.0.clone(),
        names(),
        ReplayLimits::default(),
    )
}

#[tokio::test]
async fn another_replica_replays_the_same_bytes_in_order() {
    let prefix = Prefix::new();
    let a = store(&prefix).await;
    let id = sid("s1");
    let ea = a.session(&id);
    for seq in 1..=5 {
        ea.append(0, seq, data(0, seq));
        ea.append(3, seq, data(3, seq));
    }
    assert!(a.flush(FLUSH).await);
    assert_eq!((a.written(), a.dropped()), (10, 0));
    // This replica's own replays are memory's.
    assert_eq!(ea.replay(3, 1, 6, false).await, Ok(events(3, 2..=5)));

    let b = store(&prefix).await;
    let eb = b.session(&id);
    // A stream this replica never held is read from Redis.
    assert_eq!(eb.replay(3, 2, 6, false).await, Ok(events(3, 3..=5)));
    assert_eq!(eb.replay(3, 0, 4, false).await, Ok(events(3, 1..=3)));
    assert_eq!(eb.replay(3, 5, 6, false).await, Ok(vec![]));
    assert_eq!(
        eb.next_seq(0),
        None,
        "not adopted: nothing known without waiting"
    );

    let mut positions = b.adopt(&id).await.expect("adopted").streams;
    positions.sort_by_key(|p| p.stream);
    // It goes on past every event the old owner may have sent without Redis having it.
    let gap = b.unwritten_bound();
    let r = 6 + gap;
    let at = |stream| StreamPosition {
        stream,
        oldest_kept: 1,
        next_seq: r,
    };
    assert_eq!(positions, vec![at(0), at(3)]);
    assert_eq!((eb.oldest_kept(0), eb.next_seq(0)), (Some(1), Some(r)));

    // The new owner goes on with the stream: the older part comes from Redis, the newer
    // from its memory, the gap between them skipped.
    eb.append(0, r, data(0, r));
    eb.append(0, r + 1, data(0, r + 1));
    assert_eq!(eb.next_seq(0), Some(r + 2));
    assert_eq!(eb.oldest_kept(0), Some(1));
    let mut all = events(0, 1..=5);
    all.extend(events(0, r..=r + 1));
    assert_eq!(eb.replay(0, 0, r + 2, false).await, Ok(all.clone()));
    assert_eq!(eb.replay(0, 4, r + 2, false).await, Ok(all[4..].to_vec()));
    // A client that had more from the old owner than Redis kept goes on after it.
    assert_eq!(eb.replay(0, 9, r + 2, false).await, Ok(all[5..].to_vec()));
    assert_eq!(eb.replay(0, r, r + 2, false).await, Ok(all[6..].to_vec()));
    assert!(b.flush(FLUSH).await);
    assert_eq!(
        (b.written(), b.dropped()),
        (2, 0),
        "Redis took the new owner's events after the old owner's"
    );
    // A third replica reads both from Redis.
    let c = store(&prefix).await;
    let ec = c.session(&id);
    assert_eq!(ec.replay(0, 0, r + 2, true).await, Ok(all));
}

#[tokio::test]
async fn the_stream_bound_evicts_an_old_cursor() {
    let prefix = Prefix::new();
    let limits = ReplayLimits {
        max_events_per_stream: 10,
        ..ReplayLimits::default()
    };
    let a = RedisEventStore::new(redis().await, prefix.0.clone(), names(), limits.clone());
    let id = sid("s");
    let ea = a.session(&id);
    for seq in 1..=500 {
        ea.append(1, seq, data(1, seq));
    }
    assert!(a.flush(FLUSH).await);
    let key = prefix.key(&format!("events:{}:1", named("s")));
    let len: usize = ::redis::cmd("XLEN")
        .arg(&key)
        .query(&mut sync_conn())
        .unwrap();
    assert!((10..500).contains(&len), "MAXLEN ~ 10 trimmed to {len}");

    // Read with bounds as wide as Redis's: the oldest kept is Redis's first entry.
    let wide = store(&prefix).await;
    let first = 501 - len as u64;
    assert_eq!(
        wide.session(&id).replay(1, 0, 501, false).await,
        Err(ReplayError::Evicted { oldest_kept: first })
    );
    assert_eq!(
        wide.session(&id).replay(1, first - 1, 501, false).await,
        Ok(events(1, first..=500))
    );
    // Read with the same bounds as the writer's: no more than memory would have kept.
    let b = RedisEventStore::new(redis().await, prefix.0.clone(), names(), limits);
    let eb = b.session(&id);
    assert_eq!(
        eb.replay(1, 0, 501, false).await,
        Err(ReplayError::Evicted { oldest_kept: 491 })
    );
    assert_eq!(
        eb.replay(1, 489, 501, false).await,
        Err(ReplayError::Evicted { oldest_kept: 491 })
    );
    assert_eq!(
        eb.replay(1, 490, 501, false).await,
        Ok(events(1, 491..=500))
    );
    assert_eq!(eb.replay(1, 0, 501, true).await, Ok(events(1, 491..=500)));
}

#[tokio::test]
async fn the_byte_bound_applies_on_the_way_back() {
    let prefix = Prefix::new();
    let a = store(&prefix).await;
    let id = sid("s");
    let ea = a.session(&id);
    for seq in 1..=10 {
        ea.append(1, seq, Bytes::from_static(b"four"));
    }
    assert!(a.flush(FLUSH).await);
    let small = ReplayLimits {
        max_bytes_per_stream: 10,
        ..ReplayLimits::default()
    };
    let b = RedisEventStore::new(redis().await, prefix.0.clone(), names(), small);
    let eb = b.session(&id);
    assert_eq!(
        eb.replay(1, 0, 11, false).await,
        Err(ReplayError::Evicted { oldest_kept: 9 })
    );
    let kept = vec![
        (9, Bytes::from_static(b"four")),
        (10, Bytes::from_static(b"four")),
    ];
    assert_eq!(eb.replay(1, 8, 11, false).await, Ok(kept.clone()));
    assert_eq!(eb.replay(1, 0, 11, true).await, Ok(kept));
}

#[tokio::test]
async fn release_deletes_the_keys() {
    let prefix = Prefix::new();
    let limits = ReplayLimits::default();
    let a = RedisEventStore::new(redis().await, prefix.0.clone(), names(), limits.clone());
    let id = sid("s");
    let ea = a.session(&id);
    for seq in 1..=3 {
        ea.append(1, seq, data(1, seq));
        ea.append(2, seq, data(2, seq));
    }
    assert!(a.flush(FLUSH).await);
    let (k1, k2, index) = (
        prefix.key(&format!("events:{}:1", named("s"))),
        prefix.key(&format!("events:{}:2", named("s"))),
        prefix.key(&format!("event-streams:{}", named("s"))),
    );
    assert_eq!(prefix.keys(), vec![index.clone(), k1.clone(), k2.clone()]);
    let mut con = sync_conn();
    for key in [&k1, &k2, &index] {
        let ttl: i64 = ::redis::cmd("PTTL").arg(key).query(&mut con).unwrap();
        assert!(
            ttl > 0 && ttl <= limits.max_age.as_millis() as i64,
            "{key} expires with the replay age: {ttl} ms"
        );
    }
    let members: BTreeSet<u64> = ::redis::cmd("SMEMBERS")
        .arg(&index)
        .query(&mut con)
        .unwrap();
    assert_eq!(members, BTreeSet::from([1, 2]));

    ea.release(1);
    assert!(a.flush(FLUSH).await);
    assert_eq!(prefix.keys(), vec![index.clone(), k2.clone()]);
    let members: BTreeSet<u64> = ::redis::cmd("SMEMBERS")
        .arg(&index)
        .query(&mut con)
        .unwrap();
    assert_eq!(members, BTreeSet::from([2]));

    // Trimmed (delivered) events leave Redis too.
    ea.trim(2, 2);
    assert!(a.flush(FLUSH).await);
    let b = RedisEventStore::new(redis().await, prefix.0.clone(), names(), limits.clone());
    assert_eq!(
        b.session(&id).replay(2, 0, 4, false).await,
        Err(ReplayError::Evicted { oldest_kept: 3 })
    );
    assert_eq!(
        b.session(&id).replay(2, 2, 4, false).await,
        Ok(events(2, 3..=3))
    );

    a.release_session(&id);
    assert!(a.flush(FLUSH).await);
    assert_eq!(prefix.keys(), Vec::<String>::new());
    // A stream that had not heard of the end appends once more: memory only, no key
    // comes back.
    ea.append(2, 4, data(2, 4));
    assert!(a.flush(FLUSH).await);
    assert_eq!(prefix.keys(), Vec::<String>::new());
    assert_eq!(
        b.session(&id).replay(2, 0, 5, false).await,
        Err(ReplayError::Evicted { oldest_kept: 5 })
    );
}

/// Streams released in one batch are deleted together (one DEL, SREM and HDEL a session),
/// also those appended to in that same batch; the streams not released stay whole.
#[tokio::test]
async fn streams_released_together_leave_together() {
    let prefix = Prefix::new();
    let limits = ReplayLimits::default();
    let a = RedisEventStore::new(redis().await, prefix.0.clone(), names(), limits.clone());
    let (x, y) = (sid("x"), sid("y"));
    let (ex, ey) = (a.session(&x), a.session(&y));
    for stream in 1..=4 {
        ex.append(stream, 1, data(stream, 1));
        ey.append(stream, 1, data(stream, 1));
    }
    ex.owes(2, Bytes::from_static(b"[7]"));
    assert!(a.flush(FLUSH).await);
    // One batch: a new stream of x appended and released at once, three more of x released
    // (one of them still owing), two of y.
    ex.append(5, 1, data(5, 1));
    for stream in [1, 2, 3, 5] {
        ex.release(stream);
    }
    ey.release(1);
    ey.release(4);
    assert!(a.flush(FLUSH).await);
    let stream_key = |s: &str, n: u64| prefix.key(&format!("events:{}:{n}", named(s)));
    let index = |s: &str| prefix.key(&format!("event-streams:{}", named(s)));
    let mut want = vec![
        index("x"),
        index("y"),
        stream_key("x", 4),
        stream_key("y", 2),
        stream_key("y", 3),
    ];
    want.sort();
    let mut got = prefix.keys();
    got.sort();
    assert_eq!(got, want, "what is left of the sessions");
    let mut con = sync_conn();
    for (s, left) in [("x", vec![4]), ("y", vec![2, 3])] {
        let members: BTreeSet<u64> = ::redis::cmd("SMEMBERS")
            .arg(index(s))
            .query(&mut con)
            .unwrap();
        assert_eq!(members, left.into_iter().collect(), "{s}'s streams");
    }
    let b = RedisEventStore::new(redis().await, prefix.0.clone(), names(), limits.clone());
    assert_eq!(
        b.session(&y).replay(2, 0, 2, false).await,
        Ok(events(2, 1..=1))
    );
}

#[tokio::test]
async fn an_adopted_session_releases_what_it_adopted() {
    let prefix = Prefix::new();
    let a = store(&prefix).await;
    let id = sid("s");
    let ea = a.session(&id);
    for stream in 0..3 {
        ea.append(stream, 1, data(stream, 1));
    }
    assert!(a.flush(FLUSH).await);
    let b = store(&prefix).await;
    assert_eq!(b.adopt(&id).await.map(|p| p.streams.len()), Ok(3));
    b.session(&id).append(5, 1, data(5, 1));
    b.session(&id).release(1);
    assert!(b.flush(FLUSH).await);
    assert_eq!(b.session(&id).next_seq(1), None);
    assert_eq!(
        prefix.keys(),
        vec![
            prefix.key(&format!("event-streams:{}", named("s"))),
            prefix.key(&format!("events:{}:0", named("s"))),
            prefix.key(&format!("events:{}:2", named("s"))),
            prefix.key(&format!("events:{}:5", named("s"))),
        ]
    );
    b.release_session(&id);
    assert!(b.flush(FLUSH).await);
    assert_eq!(prefix.keys(), Vec::<String>::new());
}

/// A POST stream's copy is held back until its response begins: dropped, with its release,
/// when the stream went out whole within the hold; sent in order, then everything after it,
/// when it goes out live; sent at once when it grows past what is held.
#[tokio::test]
async fn a_streams_copy_waits_for_its_response_to_begin() {
    let prefix = Prefix::new();
    let a = store(&prefix).await;
    let id = sid("held");
    let e = a.session(&id);
    // Answered within the hold: nothing reaches Redis, not even the release.
    e.hold(1);
    e.owes(1, Bytes::from_static(b"[1]"));
    e.append(1, 1, data(1, 1));
    e.answered(1);
    e.held(1, false);
    assert_eq!(e.replay(1, 0, 2, false).await, Ok(events(1, 1..=1)));
    e.release(1);
    // Live: what was held goes first, in order, then the rest straight through.
    e.hold(2);
    e.owes(2, Bytes::from_static(b"[2]"));
    e.append(2, 1, data(2, 1));
    e.held(2, true);
    e.append(2, 2, data(2, 2));
    // Past what is held: sent without waiting for the response.
    e.hold(3);
    for seq in 1..=(HELD_OPS as u64 + 1) {
        e.append(3, seq, data(3, seq));
    }
    // Streams never held are not affected, and a late word on one is nothing.
    e.append(4, 1, data(4, 1));
    e.held(4, false);
    assert!(a.flush(FLUSH).await);
    assert_eq!((a.written(), a.dropped()), (2 + HELD_OPS as u64 + 1 + 1, 0));
    let keys = prefix.keys();
    let stream_key = |n: u64| prefix.key(&format!("events:{}:{n}", named("held")));
    assert!(!keys.contains(&stream_key(1)), "{keys:?}");
    for n in [2, 3, 4] {
        assert!(keys.contains(&stream_key(n)), "{n}: {keys:?}");
    }
    let b = store(&prefix).await;
    let eb = b.session(&id);
    assert_eq!(eb.replay(2, 0, 3, false).await, Ok(events(2, 1..=2)));
    let mut con = sync_conn();
    let owed: std::collections::HashMap<String, String> = ::redis::cmd("HGETALL")
        .arg(prefix.key(&format!("in-flight:{}", named("held"))))
        .query(&mut con)
        .unwrap();
    assert_eq!(owed.get("2").map(String::as_str), Some("[2]"), "{owed:?}");
    assert!(!owed.contains_key("1"));
}

mod faults;
mod handover;
