//! Resumable SSE: every event has an id naming its stream and position; a client that loses a
//! connection resumes with GET + Last-Event-ID and gets exactly the events it missed on that
//! stream, then the live ones. Cursors that cannot be resumed get a clear error.

mod common;

use common::{Client, Gateway, RawEvents, SseEvent};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

async fn post_stream(c: &Client, body: &Value) -> RawEvents {
    RawEvents::new(c.post_sse(body).await)
}

async fn resume(c: &Client, last_event_id: &str) -> reqwest::Response {
    c.request(reqwest::Method::GET)
        .header("accept", "text/event-stream")
        .header("last-event-id", last_event_id)
        .send()
        .await
        .unwrap()
}

fn call(id: i64, name: &str, args: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": args}})
}

fn message(ev: &SseEvent) -> Option<Value> {
    serde_json::from_str(&ev.data).ok()
}

/// The JSON messages of a stream, to its end (events without data, like retry advice, skipped).
async fn data_events(events: &mut RawEvents) -> Vec<Value> {
    let mut out = Vec::new();
    while let Some(ev) = events.next().await {
        if !ev.data.is_empty() {
            out.push(message(&ev).expect("JSON data"));
        }
    }
    out
}

/// The stream number in an event id `<tag>-<stream>-<seq>`.
fn stream_of(id: &str) -> &str {
    id.split('-').nth(1).unwrap()
}

#[tokio::test]
async fn no_message_is_lost_when_connections_drop_at_random_points() {
    let gw = Gateway::fixture(&[], &[]);
    let mut c = gw.client();
    c.initialize().await;
    let mut rng = StdRng::seed_from_u64(0x5eed_cafe);
    let mut events = post_stream(
        &c,
        &call(7, "burst", json!({"count": 1000, "pause_us": 400})),
    )
    .await;
    let priming = events.next().await.unwrap();
    assert_eq!(priming.data, "", "a priming event first");
    let stream = stream_of(priming.id.as_deref().unwrap()).to_owned();
    let mut last_id = priming.id.unwrap();
    let mut seen: Vec<u64> = Vec::new();
    let mut results = 0;
    let mut cuts = 0;
    let mut conn;
    loop {
        // Read up to a random number of bytes, then cut the connection (possibly mid-event).
        let budget = rng.random_range(150..2500);
        let mut ended = true;
        while let Some(ev) = events.next().await {
            if ev.data.is_empty() {
                continue; // retry advice at the start of a resumed connection
            }
            let id = ev.id.clone().expect("every event with data has an id");
            assert_eq!(stream_of(&id), stream, "only this stream's events: {id}");
            last_id = id;
            let m = message(&ev).expect("JSON data");
            if m["method"] == "notifications/message" {
                seen.push(m["params"]["data"].as_u64().unwrap());
            } else if m["id"] == 7 {
                assert_eq!(m["result"]["content"][0]["text"], "burst of 1000 done");
                results += 1;
            }
            if events.bytes_read > budget {
                ended = false;
                break;
            }
        }
        if results == 1 && ended {
            break;
        }
        if results == 0 || !ended {
            cuts += 1;
        }
        // A cut connection is a closed one: hyper would drain a dropped body whose rest had
        // already arrived and reuse its connection, which proves the stream read.
        drop(events);
        conn = c.on_new_connection();
        let r = resume(&conn, &last_id).await;
        assert_eq!(r.status(), 200, "resume from {last_id}");
        events = RawEvents::new(r);
    }
    assert!(
        cuts >= 10,
        "only {cuts} cuts: the test did not exercise resumption"
    );
    assert_eq!(
        seen,
        (0..1000).collect::<Vec<u64>>(),
        "every message exactly once, in order"
    );
    assert_eq!(results, 1);
}

#[tokio::test]
async fn a_response_that_comes_while_disconnected_is_delivered_on_resume() {
    let gw = Gateway::fixture(&["--sse-linger-ms", "1"], &[]);
    let mut c = gw.client();
    c.initialize().await;
    let mut events = post_stream(&c, &call(3, "slow", json!({"ms": 300}))).await;
    let priming = events.next().await.unwrap().id.unwrap();
    drop(events);
    // A disconnect is not a cancellation: the call finishes while nobody listens.
    gw.wait_log("slow request").await;
    let mut resumed = RawEvents::new(resume(&c, &priming).await);
    let messages = data_events(&mut resumed).await;
    assert_eq!(messages.len(), 1, "{messages:?}");
    assert_eq!(messages[0]["id"], 3);
    assert_eq!(messages[0]["result"]["content"][0]["text"], "slept 300 ms");
    // Delivered: once its linger time is over, the stream and its buffer are released.
    wait_released(&c, &priming).await;
}

/// Waits until resuming `id` gets 410: the stream was released after its linger time.
async fn wait_released(c: &Client, id: &str) {
    for i in 0..100 {
        // Any POST sweeps finished streams.
        c.tool_text(10_000 + i, "echo", json!({"text": "sweep"}))
            .await;
        if resume(c, id).await.status() == 410 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("stream of {id} never released");
}

#[tokio::test]
async fn priming_and_retry_only_for_2025_11_25_clients_ids_for_all() {
    let gw = Gateway::fixture(&["--sse-retry-ms", "2500"], &[]);
    let mut new = gw.client();
    new.initialize_at("2025-11-25", json!({})).await;
    let mut events = post_stream(&new, &call(1, "echo", json!({"text": "x"}))).await;
    let first = events.next().await.unwrap();
    assert!(first.id.is_some() && first.data.is_empty());
    assert_eq!(first.retry, Some(2500));

    let mut old = gw.client();
    old.initialize_at("2025-06-18", json!({})).await;
    let mut events = post_stream(&old, &call(1, "echo", json!({"text": "x"}))).await;
    let first = events.next().await.unwrap();
    assert!(
        !first.data.is_empty(),
        "no priming event for an older client"
    );
    assert!(first.retry.is_none());
    assert!(first.id.is_some(), "ids for every client");
}

#[tokio::test]
async fn a_quick_answer_leaves_with_its_headers_and_stays_resumable() {
    let gw = Gateway::fixture(&["--sse-hold-ms", "60000"], &[]);
    let mut c = gw.client();
    c.initialize_at("2025-11-25", json!({})).await;
    let r = c.post_sse(&call(1, "echo", json!({"text": "quick"}))).await;
    assert!(
        r.headers().contains_key("content-length"),
        "one body with a length: {:?}",
        r.headers()
    );
    let mut events = RawEvents::new(r);
    let priming = events.next().await.unwrap();
    assert!(priming.data.is_empty() && priming.retry.is_some());
    let answer = events.next().await.unwrap();
    assert_eq!(
        message(&answer).unwrap()["result"]["content"][0]["text"],
        "quick"
    );
    assert!(events.next().await.is_none());

    // The finished stream left memory; its events linger in the store and a client that
    // missed them (its connection broke) still gets them.
    let mut again =
        RawEvents::new(resume(&c.on_new_connection(), priming.id.as_deref().unwrap()).await);
    let retry = again.next().await.unwrap();
    assert!(
        retry.data.is_empty() && retry.retry.is_some(),
        "retry advice first"
    );
    let replayed = again.next().await.unwrap();
    assert_eq!(replayed.id, answer.id);
    assert_eq!(replayed.data, answer.data);
    assert!(again.next().await.is_none(), "then the stream ends");

    // A call that outlasts the hold gets its headers first and its answer streamed.
    let slow = Gateway::fixture(&["--sse-hold-ms", "1"], &[]);
    let mut c = slow.client();
    c.initialize_at("2025-11-25", json!({})).await;
    let r = c.post_sse(&call(2, "slow", json!({"ms": 600_000}))).await;
    assert!(!r.headers().contains_key("content-length"));
    let mut events = RawEvents::new(r);
    assert!(events.next().await.unwrap().data.is_empty(), "priming");
    slow.wait_log("fixture: slow request").await;
    c.notify("notifications/cancelled", json!({"requestId": 2}))
        .await;
    slow.wait_log("cancelled").await;
}

#[tokio::test]
async fn a_stream_read_to_its_end_is_released_at_the_next_request_on_its_connection() {
    // Lingering an hour: only the proof of reading can release the streams here.
    let gw = Gateway::fixture(&["--sse-linger-ms", "3600000"], &[]);
    let mut c = gw.client();
    c.initialize_at("2025-11-25", json!({})).await;
    let read_whole = async |c: &Client, id: i64| {
        let mut events = post_stream(c, &call(id, "echo", json!({"text": "x"}))).await;
        let priming = events.next().await.unwrap().id.unwrap();
        let answers = data_events(&mut events).await;
        assert_eq!(answers.len(), 1);
        priming
    };
    let first = read_whole(&c, 1).await;
    // No later request on that connection yet: the stream lingers for a client that lost it.
    let other = c.on_new_connection();
    let mut again = RawEvents::new(resume(&other, &first).await);
    assert_eq!(data_events(&mut again).await.len(), 1);
    // The next request on the first connection shows the client read the stream: released.
    c.tool_text(2, "echo", json!({"text": "next"})).await;
    assert_eq!(resume(&other, &first).await.status(), 410);

    // HTTP/2 multiplexes requests on one connection, so a later one proves nothing.
    let h2 = c.over_http2();
    let second = read_whole(&h2, 3).await;
    h2.tool_text(4, "echo", json!({"text": "next"})).await;
    let mut again = RawEvents::new(resume(&other, &second).await);
    assert_eq!(data_events(&mut again).await.len(), 1);
}

#[tokio::test]
async fn a_request_through_a_proxy_proves_nothing_about_what_its_client_read() {
    // A proxy reads a response before its client does, and its kept-alive connection carries
    // other clients' requests next: what comes after a stream on it proves nothing, so the
    // stream stays resumable for a client whose connection to the proxy broke.
    let gw = Gateway::fixture(&["--sse-linger-ms", "3600000"], &[]);
    let behind = Gateway::fixture(
        &[
            "--sse-linger-ms",
            "3600000",
            "--trusted-proxies",
            "127.0.0.1",
        ],
        &[],
    );
    let cases = [
        (&gw, Some(("x-forwarded-for", "203.0.113.7"))),
        (&gw, Some(("forwarded", "for=203.0.113.7;proto=https"))),
        (&gw, Some(("via", "1.1 edge"))),
        // From a trusted proxy's address, with no header naming a hop.
        (&behind, None),
    ];
    for (gateway, header) in cases {
        let mut c = gateway.client();
        if let Some((name, value)) = header {
            c = c.with_header(name, value);
        }
        c.initialize_at("2025-11-25", json!({})).await;
        let mut events = post_stream(&c, &call(1, "echo", json!({"text": "x"}))).await;
        let priming = events.next().await.unwrap().id.unwrap();
        assert_eq!(data_events(&mut events).await.len(), 1);
        c.tool_text(2, "echo", json!({"text": "next"})).await;
        let mut again = RawEvents::new(resume(&c.on_new_connection(), &priming).await);
        assert_eq!(
            data_events(&mut again).await.len(),
            1,
            "still resumable after a next request with {header:?}"
        );
    }
}

#[tokio::test]
async fn cursors_that_cannot_be_resumed_get_clear_errors() {
    // No hold: the burst must go out on a live connection that the client then drops.
    let gw = Gateway::fixture(
        &[
            "--replay-max-events",
            "5",
            "--sse-linger-ms",
            "1",
            "--sse-hold-ms",
            "0",
        ],
        &[],
    );
    let mut a = gw.client();
    a.initialize().await;
    let mut b = gw.client();
    b.initialize().await;

    // A burst of 50 while nobody listens: only the last 5 events are kept. The burst waits
    // until the gateway has seen its connection close: a stream that went out to its end on a
    // live connection would be released after the 1 ms linger instead.
    let gate = tempfile::tempdir().unwrap();
    let gate = gate.path().join("go");
    let lost = a.on_new_connection();
    let args = json!({"count": 50, "gate": gate.to_str().unwrap()});
    let mut events = post_stream(&lost, &call(1, "burst", args)).await;
    let priming = events.next().await.unwrap().id.unwrap();
    drop(events);
    drop(lost);
    gw.wait_metric("mcp_gateway_sse_streams_open", 0.0).await;
    std::fs::write(&gate, "").unwrap();
    // The plugin's answer comes after its 50 notifications, so all of them are in.
    gw.wait_log("burst of 50 sent").await;
    gw.wait_metric(
        r#"mcp_gateway_plugin_requests_in_flight{plugin="stdio"}"#,
        0.0,
    )
    .await;
    let r = resume(&a, &priming).await;
    assert_eq!(r.status(), 410, "evicted");
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no longer kept"),
        "{body}"
    );
    // From the oldest kept position it works: 47..=50 and the result (51).
    let (tag, stream) = {
        let mut p = priming.split('-');
        (p.next().unwrap().to_owned(), p.next().unwrap().to_owned())
    };
    let mut resumed = RawEvents::new(resume(&a, &format!("{tag}-{stream}-46")).await);
    let got = data_events(&mut resumed).await;
    assert_eq!(got.len(), 5);
    assert_eq!(got[0]["params"]["data"], 46);
    assert_eq!(got[4]["id"], 1);

    wait_released(&a, &format!("{tag}-{stream}-46")).await;
    let r = resume(&a, &format!("{tag}-{stream}-46")).await;
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("released"),
        "{body}"
    );
    for (client, id, status, says) in [
        (&a, "garbage".to_owned(), 400, "not an event id"),
        (&a, format!("{tag}-0-9999"), 400, "no event 9999"),
        (&a, format!("{tag}-777-1"), 400, "no stream 777"),
        (&b, priming.clone(), 400, "another session"),
    ] {
        let r = resume(client, &id).await;
        assert_eq!(r.status(), status, "{id}");
        let body: Value = r.json().await.unwrap();
        assert!(
            body["error"]["message"].as_str().unwrap().contains(says),
            "{id}: {body}"
        );
    }
    gw.wait_log("Last-Event-ID cannot be resumed").await;
}

#[tokio::test]
async fn the_get_stream_resumes_too_and_never_replays_another_streams_events() {
    let gw = Gateway::fixture(&[], &[]);
    let mut c = gw.client();
    c.initialize().await;
    let mut get = RawEvents::new(c.get_stream().await);
    let priming = get.next().await.unwrap();
    assert!(priming.data.is_empty());
    let get_stream = stream_of(priming.id.as_deref().unwrap()).to_owned();
    assert_eq!(get_stream, "0");
    c.tool_text(1, "notify_changed", json!({})).await;
    let first = get.next().await.unwrap();
    assert_eq!(
        message(&first).unwrap()["method"],
        "notifications/tools/list_changed"
    );
    drop(get);
    // While the GET connection is gone: two more list changes, and a call on a POST stream.
    c.tool_text(2, "notify_changed", json!({})).await;
    c.tool_text(3, "notify_changed", json!({})).await;
    let mut resumed = RawEvents::new(resume(&c, first.id.as_deref().unwrap()).await);
    let mut replayed = 0;
    while replayed < 2 {
        let ev = resumed.next().await.unwrap();
        if ev.data.is_empty() {
            continue;
        }
        assert_eq!(
            stream_of(ev.id.as_deref().unwrap()),
            "0",
            "only the GET stream's events"
        );
        assert_eq!(
            message(&ev).unwrap()["method"],
            "notifications/tools/list_changed"
        );
        replayed += 1;
    }
}

#[tokio::test]
async fn polling_mode_closes_connections_and_the_client_misses_nothing() {
    let gw = Gateway::fixture(&["--sse-poll-after-ms", "200"], &[]);
    let mut c = gw.client();
    c.initialize().await;
    let mut events = post_stream(&c, &call(1, "slow", json!({"ms": 1000}))).await;
    let mut last = events.next().await.unwrap().id.unwrap();
    // The connection ends with retry advice, before the answer.
    let mut retry = None;
    while let Some(ev) = events.next().await {
        retry = ev.retry.or(retry);
        if let Some(id) = ev.id {
            last = id;
        }
    }
    assert_eq!(retry, Some(1000));
    let mut polls = 0;
    let answer = loop {
        polls += 1;
        let mut e = RawEvents::new(resume(&c, &last).await);
        let mut answer = None;
        while let Some(ev) = e.next().await {
            if let Some(id) = &ev.id {
                last = id.clone();
            }
            if let Some(m) = message(&ev).filter(|m| m["id"] == 1) {
                answer = Some(m);
            }
        }
        if let Some(a) = answer {
            break a;
        }
    };
    assert_eq!(answer["result"]["content"][0]["text"], "slept 1000 ms");
    assert!(
        polls >= 2,
        "the resumed connections were closed by polling too"
    );

    // Clients before 2025-11-25 are not polled: their stream stays open to the answer.
    let mut old = gw.client();
    old.initialize_at("2025-06-18", json!({})).await;
    let r = old
        .call(
            1,
            "tools/call",
            json!({"name": "slow", "arguments": {"ms": 600}}),
        )
        .await;
    assert_eq!(r.last()["result"]["content"][0]["text"], "slept 600 ms");
}

#[tokio::test]
async fn keep_alive_comments_on_idle_streams() {
    let gw = Gateway::fixture(&["--sse-keep-alive-secs", "1"], &[]);
    let mut c = gw.client();
    c.initialize().await;
    let r = c.get_stream().await;
    assert_eq!(r.headers()["x-accel-buffering"], "no");
    let mut body = r.bytes_stream();
    let mut text = String::new();
    // Wait (bounded) until two keep-alive comments have come on the otherwise idle stream.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while text.matches(":\n\n").count() < 2 {
        let chunk = tokio::time::timeout_at(deadline, futures_util::StreamExt::next(&mut body))
            .await
            .expect("keep-alive comments within 10 s")
            .unwrap()
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let events = common::parse_sse(&text);
    assert_eq!(
        events.len(),
        1,
        "only the priming event besides comments: {text:?}"
    );
}

#[tokio::test]
async fn resumption_can_be_turned_off() {
    let gw = Gateway::fixture(&["--sse-resumable", "false"], &[]);
    let mut c = gw.client();
    c.initialize().await;
    let mut events = post_stream(&c, &call(1, "echo", json!({"text": "x"}))).await;
    let mut all = Vec::new();
    while let Some(ev) = events.next().await {
        all.push(ev);
    }
    assert!(all.iter().all(|e| e.id.is_none()), "no ids: {all:?}");
    assert!(all.iter().any(|e| e.data.contains("\"result\"")));
    let r = resume(&c, "00000000-1-0").await;
    assert_eq!(r.status(), 400);
}

#[tokio::test]
async fn regression_a_get_stream_whose_waiting_events_were_evicted_still_opens() {
    // Guards: once an event waiting for a GET connection was evicted, every later GET got 410
    // for the rest of the session.
    let gw = Gateway::fixture(&["--replay-max-events", "2"], &[]);
    let mut c = gw.client();
    c.initialize().await;
    for i in 0..5 {
        c.tool_text(i, "notify_changed", json!({})).await;
    }
    let r = c.get_stream().await;
    assert_eq!(r.status(), 200);
    let mut get = RawEvents::new(r);
    let priming = get.next().await.unwrap();
    assert!(
        priming.id.as_deref().unwrap().contains("-p"),
        "a priming id of its own: {priming:?}"
    );
    let mut kept = 0;
    while kept < 2 {
        let ev = get.next().await.unwrap();
        assert_eq!(
            message(&ev).unwrap()["method"],
            "notifications/tools/list_changed"
        );
        kept += 1;
    }
    gw.wait_log("evicted before a client came for them").await;
}

#[tokio::test]
async fn regression_a_failed_resume_leaves_the_live_connection_alone() {
    // Guards: a Last-Event-ID that could not be resumed replaced (and so closed) the healthy
    // GET connection before failing.
    let gw = Gateway::fixture(&["--replay-max-events", "2"], &[]);
    let mut c = gw.client();
    c.initialize().await;
    let mut get = RawEvents::new(c.get_stream().await);
    let priming = get.next().await.unwrap().id.unwrap();
    let mut first = None;
    for i in 0..4 {
        c.tool_text(i, "notify_changed", json!({})).await;
        let ev = get.next().await.unwrap();
        first.get_or_insert(ev.id.unwrap());
    }
    // The first event is evicted by now: resuming from before it fails...
    let stale = priming.rsplit_once("-p").unwrap().0.to_owned();
    assert_eq!(resume(&c, &stale).await.status(), 410);
    // ...and the open connection still carries what comes next.
    c.tool_text(9, "notify_changed", json!({})).await;
    let ev = get.next().await.unwrap();
    assert_eq!(
        message(&ev).unwrap()["method"],
        "notifications/tools/list_changed"
    );
}

#[tokio::test]
async fn resuming_from_a_priming_id_replays_from_its_position() {
    let gw = Gateway::fixture(&[], &[]);
    let mut c = gw.client();
    c.initialize().await;
    let mut events = post_stream(&c, &call(1, "slow", json!({"ms": 200}))).await;
    let priming = events.next().await.unwrap().id.unwrap();
    assert!(
        priming.ends_with("-0-p1") || priming.contains("-p"),
        "{priming}"
    );
    drop(events);
    gw.wait_log("slow request").await;
    let mut resumed = RawEvents::new(resume(&c, &priming).await);
    let got = data_events(&mut resumed).await;
    assert_eq!(
        got.last().unwrap()["result"]["content"][0]["text"],
        "slept 200 ms"
    );
}

/// Reads a stream to its end (or its connection's): its messages, and the last event id.
async fn read(mut events: RawEvents, got: &mut Vec<Value>, last_id: &mut Option<String>) {
    while let Some(ev) = events.next().await {
        if ev.id.is_some() {
            *last_id = ev.id.clone();
        }
        if let Some(m) = message(&ev) {
            got.push(m);
        }
    }
}

#[tokio::test]
async fn regression_a_client_that_stops_reading_is_cut_and_resumes_from_the_store() {
    // Guards: a client that stopped reading kept its connection open, and the connection's
    // queue held up to 1,024 events whatever their size (1 MiB events: 1.7 GB). The queue is
    // bounded in bytes too, and a connection that falls behind is closed.
    let gw = Gateway::fixture(
        &[
            "--replay-max-bytes",
            "100000000",
            "--replay-session-max-bytes",
            "200000000",
        ],
        &[],
    );
    let mut c = gw.client();
    c.initialize().await;
    let count = 48;
    let response = c
        .post_sse(&call(2, "burst", json!({"count": count, "pad": 1 << 20})))
        .await;
    // Nobody reads: the socket's buffers fill, then the connection's queue, past its bound.
    gw.wait_log(&format!("burst of {count} sent")).await;
    gw.wait_log("its connection is closed").await;
    let mut got = Vec::new();
    let mut last_id = None;
    read(RawEvents::new(response), &mut got, &mut last_id).await;
    assert!(
        got.iter().all(|m| m.get("result").is_none()),
        "the connection was closed before the answer"
    );
    // The client resumes after the last event it read (again, should it fall behind again
    // while the burst still comes), and nothing is lost.
    for _ in 0..count {
        if got.last().is_some_and(|m| m.get("result").is_some()) {
            break;
        }
        let r = resume(&c, last_id.as_deref().expect("the priming event at least")).await;
        assert_eq!(r.status(), 200);
        read(RawEvents::new(r), &mut got, &mut last_id).await;
    }
    let logs: Vec<u64> = got
        .iter()
        .filter_map(|m| m["params"]["data"]["i"].as_u64())
        .collect();
    assert_eq!(logs, (0..count).collect::<Vec<_>>());
    assert_eq!(got.last().unwrap()["id"], 2, "the answer comes last");
    assert!(got.last().unwrap()["result"].is_object());
}
