//! The `/mcp` endpoint's checks that need the real binary as a child process: bad input that
//! never reaches the plugin (its stderr is in the gateway's log), sessions ended for idling or
//! for going unused (logged), a flood of connections under a low file descriptor limit, and the
//! head size limit with its command-line check. The rest of the endpoint's refusals are in
//! `transport.rs`, served in-process.

mod common;

use common::{ACCEPT_BOTH, Client, Gateway, INIT, JSON_BOTH, raw_post};
use serde_json::json;

#[tokio::test]
async fn request_heads_past_max_header_bytes_get_431_and_bodies_past_it_still_flow() {
    let gw = Gateway::fixture(&[], &[]);
    let mut c = gw.client();
    c.initialize().await;
    // A body far larger than the 8 KiB connection buffer is read through it in pieces.
    let text = "y".repeat(1 << 20);
    assert_eq!(c.tool_text(2, "echo", json!({"text": text})).await, text);
    // A head over 8 KiB is refused before it reaches a handler; the session is unharmed.
    let big_header = "h".repeat(10_000);
    let (s, _, _) = raw_post(&gw, &[JSON_BOTH, &[("x-big", &big_header)]].concat(), INIT).await;
    assert_eq!(s, 431);
    assert_eq!(
        c.tool_text(3, "echo", json!({"text": "still"})).await,
        "still"
    );
    // The limit is a setting, with hyper's 8 KiB as its floor.
    let roomy = Gateway::fixture(&["--max-header-bytes", "32768"], &[]);
    let (s, _, _) = raw_post(
        &roomy,
        &[JSON_BOTH, &[("x-big", &big_header)]].concat(),
        INIT,
    )
    .await;
    assert_eq!(s, 200);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-gateway"))
        .args(["--max-header-bytes", "4096", "check"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_header_bytes"));
}

#[tokio::test]
async fn malformed_and_invalid_messages() {
    let gw = Gateway::fixture(&[], &[]);
    let (s, body, _) = raw_post(&gw, JSON_BOTH, "{not json").await;
    assert_eq!((s, body["error"]["code"].as_i64()), (400, Some(-32700)));
    assert!(body["id"].is_null());
    let (s, body, _) = raw_post(
        &gw,
        JSON_BOTH,
        r#"{"jsonrpc":"1.0","id":"x","method":"initialize"}"#,
    )
    .await;
    assert_eq!((s, body["error"]["code"].as_i64()), (400, Some(-32600)));
    assert_eq!(body["id"], "x", "the request's id when it can be read");
    let (s, body, _) = raw_post(&gw, JSON_BOTH, r#"[1,2]"#).await;
    assert_eq!((s, body["error"]["code"].as_i64()), (400, Some(-32600)));
    // initialize inside a batch.
    let (s, body, _) = raw_post(&gw, JSON_BOTH, &format!("[{INIT}]")).await;
    assert_eq!((s, body["error"]["code"].as_i64()), (400, Some(-32600)));
    assert!(body["error"]["message"].as_str().unwrap().contains("batch"));
    // initialize with bad params.
    let (s, body, _) = raw_post(
        &gw,
        JSON_BOTH,
        r#"{"jsonrpc":"2.0","id":5,"method":"initialize","params":{"capabilities":{}}}"#,
    )
    .await;
    assert_eq!(
        (s, body["error"]["code"].as_i64(), body["id"].as_i64()),
        (400, Some(-32602), Some(5))
    );

    let mut c = gw.client();
    c.initialize().await;
    let r = c.post_raw("{\"jsonrpc\":\"2.0\",").await;
    assert_eq!((r.status, r.error_code()), (400, -32700));
    let r = c.call(2, "no/such/method", json!({})).await;
    assert_eq!((r.status, r.error_code()), (200, -32601));
    assert_eq!(r.last()["id"], 2);
    let r = c.call(3, "tools/call", json!({"arguments": {}})).await;
    assert_eq!(r.error_code(), -32602);
    assert!(
        r.last()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("name")
    );
    let r = c
        .call(4, "tools/call", json!({"name": "no_such_tool"}))
        .await;
    assert_eq!(r.error_code(), -32602);
    let r = c
        .call(5, "logging/setLevel", json!({"level": "loud"}))
        .await;
    assert_eq!(r.error_code(), -32602);
    let r = c.call(6, "resources/read", json!({})).await;
    assert_eq!(r.error_code(), -32602);
    let r = c
        .call(
            7,
            "completion/complete",
            json!({"ref": {"type": "ref/nothing"}}),
        )
        .await;
    assert_eq!(r.error_code(), -32602);
    let r = c.call(8, "tools/list", json!({"cursor": 5})).await;
    assert_eq!(r.error_code(), -32602);
    // A response to a request nobody sent.
    let r = c
        .post(&json!({"jsonrpc": "2.0", "id": 999, "result": {}}))
        .await;
    assert_eq!((r.status, r.error_code()), (400, -32600));
    // Initialize again inside the session.
    let r = c.post_raw(INIT).await;
    assert_eq!((r.status, r.error_code()), (400, -32600));
    // None of it hurt the session, and no bad input reached the plugin.
    assert_eq!(
        c.tool_text(9, "echo", json!({"text": "still here"})).await,
        "still here"
    );
    assert!(
        !gw.log().contains("unparseable"),
        "bad input reached the plugin:\n{}",
        gw.log()
    );
}

#[tokio::test]
async fn session_cap_and_idle_timeout() {
    let gw = Gateway::fixture(
        &["--max-sessions", "2", "--session-idle-timeout-secs", "1"],
        &[],
    );
    let mut a = gw.client();
    a.initialize().await;
    let mut b = gw.client();
    b.initialize().await;
    let r = gw.client().post_raw(INIT).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.headers["retry-after"], "5");
    // A session with an open GET stream is not idle; one without it ends.
    let get = a.get_stream().await;
    assert_eq!(get.status(), 200);
    let b_id = b.session.clone().unwrap();
    gw.wait_log(&format!("session={b_id}")).await;
    common::wait_until(
        "idle session ended",
        std::time::Duration::from_secs(20),
        || {
            gw.log()
                .lines()
                .any(|l| l.contains("idle for") && l.contains(&b_id))
        },
    )
    .await;
    assert_eq!(b.call(1, "ping", json!({})).await.status, 404);
    assert_eq!(
        a.call(2, "ping", json!({})).await.status,
        200,
        "its GET stream kept it alive"
    );
    // Room again for a new session.
    assert_eq!(Client::new(&gw.url).post_raw(INIT).await.status, 200);
}

#[tokio::test]
async fn regression_a_flood_of_connections_leaves_the_admin_listener_its_descriptors() {
    // Guards: ~20,000 slow connections took every file descriptor and /healthz stopped
    // answering. Here the gateway may open 256 files, and 300 connections come.
    use tokio::io::AsyncWriteExt;
    let gw = Gateway::start_wrapped(&["prlimit", "--nofile=256:256"], &["--", common::FIXTURE]);
    let mut flood = Vec::new();
    for _ in 0..300 {
        // Past the backlog a connection may be refused: what counts is what got in.
        let connect = tokio::net::TcpStream::connect(&gw.addr);
        if let Ok(Ok(mut tcp)) =
            tokio::time::timeout(std::time::Duration::from_secs(1), connect).await
        {
            let _ = tcp.write_all(b"POST /mcp HTTP/1.1\r\n").await;
            flood.push(tcp);
        }
    }
    assert!(flood.len() > 256, "only {} connections got in", flood.len());
    let admin = format!("http://{}/healthz", gw.admin.as_ref().unwrap());
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(5))
        .build()
        .unwrap();
    for _ in 0..5 {
        let r = client.get(&admin).send().await.expect("/healthz answers");
        assert_eq!(r.status(), 200);
    }
    gw.wait_log("the process may open only 256 files").await;
    drop(flood);
    // Once the flood is gone, the public listener serves again.
    let mut c = gw.client();
    c.initialize().await;
}

#[tokio::test]
async fn regression_one_client_cannot_take_every_session() {
    // Guards: one anonymous client opened 10,000 sessions in 25 s and locked everyone out
    // until they idled out. Sessions are capped per client, and one that makes no request
    // after initialize goes sooner. 127.0.0.1 is a trusted proxy here, so X-Forwarded-For
    // names the clients.
    let gw = Gateway::fixture(
        &[
            "--max-sessions-per-client",
            "3",
            "--session-unused-timeout-secs",
            "1",
            "--trusted-proxies",
            "127.0.0.1",
        ],
        &[],
    );
    let init_as = |client: &'static str| {
        let headers = [
            ("content-type", "application/json"),
            ("accept", ACCEPT_BOTH),
            ("x-forwarded-for", client),
        ];
        let gw = &gw;
        async move { raw_post(gw, &headers, INIT).await }
    };
    let mut mallory = Vec::new();
    for _ in 0..3 {
        let (status, _, headers) = init_as("203.0.113.7").await;
        assert_eq!(status, 200);
        mallory.push(headers["mcp-session-id"].to_str().unwrap().to_owned());
    }
    let (status, body, headers) = init_as("203.0.113.7").await;
    assert_eq!(status, 429, "{body}");
    assert!(headers.contains_key("retry-after"));
    assert_eq!(
        body["id"], 1,
        "the refusal names the request (INIT's id): {body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("3 sessions"),
        "{body}"
    );
    // What a client writes before the proxy's entry is not believed.
    let (status, ..) = init_as("198.51.100.1, 203.0.113.7").await;
    assert_eq!(status, 429);
    // Another client is not locked out; it uses its session.
    let (status, _, headers) = init_as("203.0.113.8").await;
    assert_eq!(status, 200);
    let alice = headers["mcp-session-id"].to_str().unwrap().to_owned();
    let in_session = |id: &str| {
        [
            ("content-type", "application/json".to_owned()),
            ("accept", ACCEPT_BOTH.to_owned()),
            ("mcp-session-id", id.to_owned()),
            ("mcp-protocol-version", "2025-11-25".to_owned()),
        ]
    };
    let ping = r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#;
    let h = in_session(&alice);
    let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(raw_post(&gw, &h, ping).await.0, 200);
    // The sessions nobody used after initialize end after the unused timeout, and the client
    // has room again; the used one stays.
    for id in &mallory {
        gw.wait_log(&format!(
            "no request came in the 1 s after the session's initialize: ending it session={id}"
        ))
        .await;
    }
    let (status, ..) = init_as("203.0.113.7").await;
    assert_eq!(status, 200);
    assert_eq!(raw_post(&gw, &h, ping).await.0, 200, "a used session stays");
}

#[tokio::test]
async fn regression_what_a_session_keeps_of_initialize_is_bounded() {
    // Guards: sessions whose `initialize` carried 3 MiB of capabilities kept it all (60 took
    // 217 MB; one client at its session cap pinned ~0.9 GiB). Past 64 KiB it is refused
    // with -32602, and no session is opened.
    let gw = Gateway::fixture(&[], &[]);
    let init = |experimental: usize| {
        json!({"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {"experimental": {"x": {"pad": "p".repeat(experimental)}}},
            "clientInfo": {"name": "big", "version": "1"}}})
        .to_string()
    };
    let (status, body, headers) = raw_post(&gw, JSON_BOTH, &init(3 << 20)).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], -32602, "{body}");
    assert_eq!(body["id"], 7);
    assert!(body["error"]["message"].as_str().unwrap().contains("65536"));
    assert!(!headers.contains_key("mcp-session-id"));
    // Up to the bound, as before.
    let (status, body, headers) = raw_post(&gw, JSON_BOTH, &init(60_000)).await;
    assert_eq!(status, 200, "{body}");
    assert!(headers.contains_key("mcp-session-id"));
}
