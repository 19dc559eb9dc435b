//! The store when Redis fails, fills up or answers what it should not: appends never wait,
//! replays fail in time, and what comes back is checked.

use super::*;

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
            names(),
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
        names(),
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
    let b = store(&prefix).await;
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
        names(),
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
        prefix.key(&format!("events:{}:1", named("h"))),
        prefix.key(&format!("events:{}:2", named("h"))),
        prefix.key(&format!("events:{}:3", named("h"))),
        prefix.key(&format!("event-streams:{}", named("h"))),
    );
    raw(&["XADD", &k1, "5-7", "d", "an id this store does not write"]);
    raw(&["XADD", &k2, "1-0", "other", "no event field"]);
    raw(&["SET", &k3, "not a stream"]);
    raw(&["SADD", &index, "1"]);
    let store = store(&prefix).await;
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
