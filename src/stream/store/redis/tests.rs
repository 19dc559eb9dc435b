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

fn sid(id: &str) -> Arc<str> {
    Arc::from(id)
}

const FLUSH: Duration = Duration::from_secs(5);

#[tokio::test]
async fn another_replica_replays_the_same_bytes_in_order() {
    let prefix = Prefix::new();
    let a = RedisEventStore::new(redis().await, prefix.0.clone(), ReplayLimits::default());
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

    let b = RedisEventStore::new(redis().await, prefix.0.clone(), ReplayLimits::default());
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
    let c = RedisEventStore::new(redis().await, prefix.0.clone(), ReplayLimits::default());
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
    let a = RedisEventStore::new(redis().await, prefix.0.clone(), limits.clone());
    let id = sid("s");
    let ea = a.session(&id);
    for seq in 1..=500 {
        ea.append(1, seq, data(1, seq));
    }
    assert!(a.flush(FLUSH).await);
    let key = prefix.key("events:s:1");
    let len: usize = ::redis::cmd("XLEN")
        .arg(&key)
        .query(&mut sync_conn())
        .unwrap();
    assert!((10..500).contains(&len), "MAXLEN ~ 10 trimmed to {len}");

    // Read with bounds as wide as Redis's: the oldest kept is Redis's first entry.
    let wide = RedisEventStore::new(redis().await, prefix.0.clone(), ReplayLimits::default());
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
    let b = RedisEventStore::new(redis().await, prefix.0.clone(), limits);
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
    let a = RedisEventStore::new(redis().await, prefix.0.clone(), ReplayLimits::default());
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
    let b = RedisEventStore::new(redis().await, prefix.0.clone(), small);
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
    let a = RedisEventStore::new(redis().await, prefix.0.clone(), limits.clone());
    let id = sid("s");
    let ea = a.session(&id);
    for seq in 1..=3 {
        ea.append(1, seq, data(1, seq));
        ea.append(2, seq, data(2, seq));
    }
    assert!(a.flush(FLUSH).await);
    let (k1, k2, index) = (
        prefix.key("events:s:1"),
        prefix.key("events:s:2"),
        prefix.key("event-streams:s"),
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
    let b = RedisEventStore::new(redis().await, prefix.0.clone(), limits.clone());
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

#[tokio::test]
async fn an_adopted_session_releases_what_it_adopted() {
    let prefix = Prefix::new();
    let a = RedisEventStore::new(redis().await, prefix.0.clone(), ReplayLimits::default());
    let id = sid("s");
    let ea = a.session(&id);
    for stream in 0..3 {
        ea.append(stream, 1, data(stream, 1));
    }
    assert!(a.flush(FLUSH).await);
    let b = RedisEventStore::new(redis().await, prefix.0.clone(), ReplayLimits::default());
    assert_eq!(b.adopt(&id).await.map(|p| p.streams.len()), Ok(3));
    b.session(&id).append(5, 1, data(5, 1));
    b.session(&id).release(1);
    assert!(b.flush(FLUSH).await);
    assert_eq!(b.session(&id).next_seq(1), None);
    assert_eq!(
        prefix.keys(),
        vec![
            prefix.key("event-streams:s"),
            prefix.key("events:s:0"),
            prefix.key("events:s:2"),
            prefix.key("events:s:5"),
        ]
    );
    b.release_session(&id);
    assert!(b.flush(FLUSH).await);
    assert_eq!(prefix.keys(), Vec::<String>::new());
}

/// A TCP listener that accepts connections and never answers: a Redis that hangs.
async fn black_hole() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    format!("redis://{addr}/")
}

#[tokio::test]
async fn an_unreachable_redis_fails_replays_in_time_and_never_holds_appends_up() {
    for url in ["redis://127.0.0.1:1/".to_string(), black_hole().await] {
        let options = RedisEventOptions {
            read_timeout: Duration::from_millis(300),
            write_timeout: Duration::from_millis(300),
            ..RedisEventOptions::default()
        };
        let store = RedisEventStore::with_options(
            lazy(&url),
            "unreachable:".into(),
            ReplayLimits::default(),
            options,
        );
        let id = sid("s");
        let ev = store.session(&id);
        let started = Instant::now();
        for seq in 1..=5000 {
            ev.append(0, seq, data(0, seq));
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{url}: 5000 appends took {:?}",
            started.elapsed()
        );
        // This replica's own streams are memory's, as on a gateway alone.
        assert_eq!(
            ev.replay(0, 4990, 5001, false).await,
            Ok(events(0, 4991..=5000))
        );
        assert_eq!((ev.oldest_kept(0), ev.next_seq(0)), (Some(1), Some(5001)));

        let other = store.session(&sid("other"));
        let started = Instant::now();
        let got = other.replay(0, 0, 5, false).await;
        assert!(
            matches!(got, Err(ReplayError::Backend(_))),
            "{url}: {got:?}"
        );
        assert!(
            started.elapsed() < Duration::from_millis(1300),
            "{url}: the replay failed after {:?}",
            started.elapsed()
        );
        let started = Instant::now();
        let got = store.adopt(&sid("other")).await;
        assert!(
            matches!(got, Err(ReplayError::Backend(_))),
            "{url}: {got:?}"
        );
        assert!(started.elapsed() < Duration::from_millis(1300));

        let errors = |op: RedisOp| {
            metrics::get()
                .redis_errors
                .with_label_values(&[op.label()])
                .get()
        };
        assert!(errors(RedisOp::EventsRead) > 0 && errors(RedisOp::EventsAdopt) > 0);
        // Every write failed or timed out: the events stay in memory only, counted.
        assert!(store.flush(Duration::from_secs(10)).await, "{url}");
        assert_eq!((store.written(), store.dropped()), (0, 5000), "{url}");
        assert_eq!(store.usage().0, 5000);
    }
}

#[tokio::test]
async fn a_full_queue_drops_only_the_redis_copy() {
    let prefix = Prefix::new();
    let options = RedisEventOptions {
        queue_ops: 4,
        ..RedisEventOptions::default()
    };
    let a = RedisEventStore::with_options(
        redis().await,
        prefix.0.clone(),
        ReplayLimits::default(),
        options,
    );
    let id = sid("s");
    let ea = a.session(&id);
    // The test's runtime has one thread: the writer cannot run while this loop does, so
    // the queue fills after four events.
    for seq in 1..=100 {
        ea.append(0, seq, data(0, seq));
    }
    assert_eq!(a.dropped(), 96);
    assert_eq!(ea.replay(0, 0, 101, false).await, Ok(events(0, 1..=100)));
    assert!(a.flush(FLUSH).await);
    assert_eq!(a.written(), 4);

    // Another replica finds a gap: the events after it are all it can resume.
    ea.append(0, 101, data(0, 101));
    assert!(a.flush(FLUSH).await);
    let b = RedisEventStore::new(redis().await, prefix.0.clone(), ReplayLimits::default());
    let eb = b.session(&id);
    assert_eq!(
        eb.replay(0, 0, 102, false).await,
        Err(ReplayError::Evicted { oldest_kept: 101 })
    );
    assert_eq!(
        eb.replay(0, 100, 102, false).await,
        Ok(events(0, 101..=101))
    );
    let mut kept = events(0, 1..=4);
    kept.extend(events(0, 101..=101));
    assert_eq!(eb.replay(0, 0, 102, true).await, Ok(kept));
    // Adopted, the new owner goes on after the last id Redis took.
    let positions = b.adopt(&id).await.unwrap().streams;
    assert_eq!(
        positions,
        vec![StreamPosition {
            stream: 0,
            oldest_kept: 1,
            next_seq: 102 + b.unwritten_bound()
        }]
    );

    // The same by bytes.
    let prefix = Prefix::new();
    let options = RedisEventOptions {
        queue_bytes: 10,
        ..RedisEventOptions::default()
    };
    let a = RedisEventStore::with_options(
        redis().await,
        prefix.0.clone(),
        ReplayLimits::default(),
        options,
    );
    let ea = a.session(&id);
    for seq in 1..=10 {
        ea.append(0, seq, Bytes::from_static(b"four"));
    }
    assert_eq!(a.dropped(), 8);
    assert_eq!(ea.replay(0, 0, 11, false).await.map(|e| e.len()), Ok(10));
    assert!(a.flush(FLUSH).await);
    assert_eq!(a.written(), 2);
}

#[tokio::test]
async fn what_redis_holds_is_checked_before_it_is_used() {
    let prefix = Prefix::new();
    let mut con = sync_conn();
    let mut raw = |args: &[&str]| {
        let mut cmd = ::redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        let _: Value = cmd.query(&mut con).expect("a raw command");
    };
    let (k1, k2, k3, index) = (
        prefix.key("events:h:1"),
        prefix.key("events:h:2"),
        prefix.key("events:h:3"),
        prefix.key("event-streams:h"),
    );
    raw(&["XADD", &k1, "5-7", "d", "an id this store does not write"]);
    raw(&["XADD", &k2, "1-0", "other", "no event field"]);
    raw(&["SET", &k3, "not a stream"]);
    raw(&["SADD", &index, "1"]);
    let store = RedisEventStore::new(redis().await, prefix.0.clone(), ReplayLimits::default());
    let id = sid("h");
    let ev = store.session(&id);
    for stream in 1..=3 {
        let got = ev.replay(stream, 0, 10, false).await;
        assert!(
            matches!(got, Err(ReplayError::Backend(_))),
            "stream {stream}: {got:?}"
        );
    }
    let got = store.adopt(&id).await;
    assert!(matches!(got, Err(ReplayError::Backend(_))), "{got:?}");
    raw(&["DEL", &index]);
    raw(&["SADD", &index, "not a number"]);
    let got = store.adopt(&id).await;
    assert!(matches!(got, Err(ReplayError::Backend(_))), "{got:?}");
    // A listed stream that expired since is skipped.
    raw(&["DEL", &index]);
    raw(&["SADD", &index, "9"]);
    assert_eq!(store.adopt(&id).await, Ok(Adopted::default()));
}

#[test]
fn ids_and_numbers_parse_strictly() {
    let id = |s: &str| parse_id(&Value::BulkString(s.as_bytes().to_vec()));
    assert_eq!(id("5-0"), Ok(5));
    assert_eq!(id("18446744073709551615-0"), Ok(u64::MAX));
    for bad in [
        "0-0",
        "5-1",
        "5",
        "-0",
        "+5-0",
        " 5-0",
        "18446744073709551616-0",
        "5-00",
        "",
    ] {
        assert!(id(bad).is_err(), "{bad:?}");
    }
    assert!(parse_id(&Value::Int(5)).is_err());
}

#[test]
fn a_range_out_of_order_or_out_of_bounds_is_refused() {
    let entry = |id: &str| {
        Value::Array(vec![
            Value::BulkString(id.as_bytes().to_vec()),
            Value::Array(vec![
                Value::BulkString(b"d".to_vec()),
                Value::BulkString(b"x".to_vec()),
            ]),
        ])
    };
    let range = |ids: &[&str]| Value::Array(ids.iter().map(|i| entry(i)).collect());
    assert_eq!(
        parse_entries(range(&["3-0", "2-0"]), 1, 3, 5).map(|e| e.len()),
        Ok(2)
    );
    assert!(
        parse_entries(range(&["2-0", "3-0"]), 1, 3, 5).is_err(),
        "rising"
    );
    assert!(
        parse_entries(range(&["3-0", "3-0"]), 1, 3, 5).is_err(),
        "twice"
    );
    assert!(parse_entries(range(&["4-0"]), 1, 3, 5).is_err(), "above");
    assert!(parse_entries(range(&["1-0"]), 2, 3, 5).is_err(), "below");
    assert!(
        parse_entries(range(&["3-0", "2-0"]), 1, 3, 1).is_err(),
        "too many"
    );
    assert!(parse_entries(Value::Int(1), 1, 3, 5).is_err());
    let odd = Value::Array(vec![Value::Array(vec![Value::BulkString(b"1-0".to_vec())])]);
    assert!(parse_entries(odd, 1, 3, 5).is_err());
}

#[test]
fn only_the_last_trim_of_a_stream_in_a_batch_is_sent() {
    let s = sid("s");
    let trim = |stream, through| Op::Trim {
        session: s.clone(),
        stream,
        through,
    };
    let append = |stream, seq| Op::Append {
        session: s.clone(),
        stream,
        seq,
        data: Bytes::new(),
    };
    let batch = vec![
        append(0, 1),
        trim(0, 1),
        append(0, 2),
        trim(1, 5),
        trim(0, 2),
        Op::Release {
            session: s.clone(),
            stream: 1,
        },
        trim(1, 6),
    ];
    assert_eq!(
        superseded_trims(&batch),
        vec![false, true, false, false, false, false, false]
    );
}

#[test]
fn a_debt_settled_within_a_batch_is_not_sent() {
    let s = sid("s");
    let other = sid("t");
    let owe = |session: &Arc<str>, stream| Op::Owe {
        session: session.clone(),
        stream,
        ids: Bytes::from_static(b"[1]"),
    };
    let answered = |session: &Arc<str>, stream| Op::Answered {
        session: session.clone(),
        stream,
    };
    let batch = vec![
        owe(&s, 1),
        owe(&s, 2),
        answered(&s, 1),
        owe(&s, 3),
        Op::Release {
            session: s.clone(),
            stream: 3,
        },
        owe(&other, 1),
        answered(&s, 4),
        owe(&s, 5),
        Op::ReleaseSession {
            session: s.clone(),
            streams: vec![],
        },
    ];
    assert_eq!(
        settled_in_batch(&batch),
        vec![true, true, true, true, false, false, false, true, false],
        "the other session's still owes; an answer with no debt in the batch is sent"
    );
    // Without the session's release, stream 2 still owes.
    assert!(!settled_in_batch(&batch[..8])[1]);
}

#[tokio::test]
async fn an_adopting_replica_learns_which_streams_still_owe_responses() {
    let prefix = Prefix::new();
    let a = RedisEventStore::new(redis().await, prefix.0.clone(), ReplayLimits::default());
    let id = sid("owing");
    let ea = a.session(&id);
    ea.owes(1, Bytes::from_static(b"[1]"));
    ea.owes(2, Bytes::from_static(br#"["a","b"]"#));
    ea.owes(3, Bytes::from_static(b"[3]"));
    ea.append(2, 1, data(2, 1));
    ea.answered(1);
    ea.release(3);
    assert!(a.flush(FLUSH).await);

    let b = RedisEventStore::new(redis().await, prefix.0.clone(), ReplayLimits::default());
    let adopted = b.adopt(&id).await.expect("adopted");
    assert_eq!(
        adopted.in_flight,
        vec![(2, Bytes::from_static(br#"["a","b"]"#))],
        "answered and released streams owe nothing"
    );
    // Gone with the session.
    b.release_session(&id);
    assert!(b.flush(FLUSH).await);
    assert_eq!(prefix.keys(), Vec::<String>::new());

    // What Redis hands back is checked.
    let key = prefix.key("in-flight:bad");
    let mut con = sync_conn();
    let _: () = ::redis::cmd("HSET")
        .arg(&key)
        .arg("x")
        .arg("[1]")
        .query(&mut con)
        .unwrap();
    let got = b.adopt(&sid("bad")).await;
    assert!(matches!(got, Err(ReplayError::Backend(_))), "{got:?}");
}

#[tokio::test]
async fn leaving_a_session_keeps_its_keys_for_the_next_replica() {
    let prefix = Prefix::new();
    let a = RedisEventStore::new(redis().await, prefix.0.clone(), ReplayLimits::default());
    let id = sid("left");
    let ea = a.session(&id);
    ea.append(0, 1, data(0, 1));
    a.leave_session(&id);
    ea.append(0, 2, data(0, 2));
    assert!(a.flush(FLUSH).await);
    assert_eq!(a.usage(), (0, 0), "nothing kept here");
    let b = RedisEventStore::new(redis().await, prefix.0.clone(), ReplayLimits::default());
    let eb = b.session(&id);
    assert_eq!(
        eb.replay(0, 0, 10, false).await,
        Ok(events(0, 1..=1)),
        "what was written before leaving is there; nothing after"
    );
}
