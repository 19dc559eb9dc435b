//! The `/mcp` endpoint's status codes and JSON-RPC errors for every kind of bad input, over
//! real HTTP against the real binary. Each refusal must say what was wrong, and a bad request
//! must never disturb another client's session.

mod common;

use common::{ACCEPT_BOTH, Client, Gateway};
use serde_json::json;

const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

async fn raw_post(
    gw: &Gateway,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, serde_json::Value, reqwest::header::HeaderMap) {
    let mut r = reqwest::Client::new().post(&gw.url).body(body.to_owned());
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(json!(text)),
        headers,
    )
}

const JSON_BOTH: &[(&str, &str)] = &[
    ("content-type", "application/json"),
    ("accept", ACCEPT_BOTH),
];

#[tokio::test]
async fn initialize_negotiates_and_mints_a_session_id() {
    let gw = Gateway::fixture(&[], &[]);
    for (asked, expected) in [
        ("2025-11-25", "2025-11-25"),
        ("2025-06-18", "2025-06-18"),
        ("2025-03-26", "2025-03-26"),
        ("2024-11-05", "2025-11-25"),
        ("2099-01-01", "2025-11-25"),
    ] {
        let mut c = gw.client();
        let result = c.initialize_at(asked, json!({})).await;
        assert_eq!(result["protocolVersion"], expected, "asked {asked}");
        let sid = c.session.clone().unwrap();
        assert!(sid.len() >= 22, "at least 128 bits: {sid}");
        assert!(sid.bytes().all(|b| (0x21..=0x7e).contains(&b)));
        assert!(result["capabilities"]["tools"].is_object());
        assert!(result["capabilities"]["logging"].is_object());
    }
}

#[tokio::test]
async fn media_types_and_body_limits() {
    let gw = Gateway::fixture(&["--max-body-bytes", "2048"], &[]);
    // Accept must list both JSON and SSE.
    let (s, body, _) = raw_post(
        &gw,
        &[
            ("content-type", "application/json"),
            ("accept", "application/json"),
        ],
        INIT,
    )
    .await;
    assert_eq!(s, 406);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("text/event-stream")
    );
    let (s, _, _) = raw_post(
        &gw,
        &[
            ("content-type", "application/json"),
            ("accept", "text/html"),
        ],
        INIT,
    )
    .await;
    assert_eq!(s, 406);
    // The body must be JSON.
    let (s, body, _) = raw_post(
        &gw,
        &[("content-type", "text/plain"), ("accept", ACCEPT_BOTH)],
        INIT,
    )
    .await;
    assert_eq!(s, 415);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("application/json")
    );
    // Too large, with and without a declared length.
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"pad":"{}"}}}}"#,
        "x".repeat(4000)
    );
    let (s, body, _) = raw_post(&gw, JSON_BOTH, &big).await;
    assert_eq!(s, 413);
    assert!(body["error"]["message"].as_str().unwrap().contains("2048"));
    let chunked = reqwest::Body::wrap_stream(futures_util::stream::iter(
        (0..8).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b' '; 1000]))),
    ));
    let r = reqwest::Client::new()
        .post(&gw.url)
        .header("content-type", "application/json")
        .header("accept", ACCEPT_BOTH)
        .body(chunked)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
}

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
async fn sessions_required_unknown_and_ended() {
    let gw = Gateway::fixture(&[], &[]);
    let c = gw.client();
    // No session and no initialize.
    let r = c.call(1, "tools/list", json!({})).await;
    assert_eq!(r.status, 400);
    assert!(
        r.last()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Mcp-Session-Id")
    );
    // Unknown session id.
    let mut bogus = gw.client();
    bogus.session = Some("no-such-session".into());
    let r = bogus.call(1, "tools/list", json!({})).await;
    assert_eq!((r.status, r.error_code()), (404, -32001));
    assert_eq!(bogus.get_stream().await.status(), 404);
    assert_eq!(bogus.delete().await, 404);
    // Ended with DELETE: 404 from then on.
    let mut c = gw.client();
    c.initialize().await;
    assert_eq!(c.delete().await, 200);
    let r = c.call(2, "tools/list", json!({})).await;
    assert_eq!(r.status, 404);
    assert_eq!(
        c.notify("notifications/initialized", json!({}))
            .await
            .status,
        404
    );
    assert_eq!(c.delete().await, 404);
    // GET and DELETE without a session header.
    let none = gw.client();
    assert_eq!(none.get_stream().await.status(), 400);
    assert_eq!(none.delete().await, 400);
}

#[tokio::test]
async fn modern_era_requests_get_a_legacy_400_so_clients_fall_back() {
    let gw = Gateway::fixture(&[], &[]);
    let c = gw.client();
    for params in [
        json!({"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}),
        json!({}),
    ] {
        for method in ["server/discover", "tools/list"] {
            let r = c.call(1, method, params.clone()).await;
            assert_eq!(r.status, 400, "{method}");
            let code = r.error_code();
            // Not a modern-era error (-32020 header mismatch, -32021 missing capability,
            // -32022 unsupported version): the client falls back to initialize.
            assert!(!(-32022..=-32020).contains(&code), "{code}");
        }
    }
}

#[tokio::test]
async fn protocol_version_header() {
    let gw = Gateway::fixture(&[], &[]);
    let mut c = gw.client();
    c.initialize_at("2025-06-18", json!({})).await;
    assert_eq!(c.tool_text(1, "echo", json!({"text": "a"})).await, "a");
    // Missing: the session's version applies.
    c.version = None;
    assert_eq!(c.tool_text(2, "echo", json!({"text": "b"})).await, "b");
    // The transport's fallback version is accepted (the conformance suite sends it).
    c.version = Some("2025-03-26".into());
    assert_eq!(c.tool_text(3, "echo", json!({"text": "c"})).await, "c");
    // Unsupported.
    c.version = Some("1999-01-01".into());
    let r = c.call(4, "tools/list", json!({})).await;
    assert_eq!(r.status, 400);
    let msg = r.last()["error"]["message"].as_str().unwrap().to_owned();
    assert!(
        msg.contains("1999-01-01") && msg.contains("2025-11-25") && msg.contains("2025-06-18"),
        "{msg}"
    );
    assert_eq!(c.get_stream().await.status(), 400);
    // Supported but not the negotiated one.
    c.version = Some("2025-11-25".into());
    let r = c.call(5, "tools/list", json!({})).await;
    assert_eq!(r.status, 400);
    assert!(
        r.last()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("negotiated")
    );
}

#[tokio::test]
async fn batches_only_for_2025_03_26() {
    let gw = Gateway::fixture(&[], &[]);
    let mut new = gw.client();
    new.initialize_at("2025-06-18", json!({})).await;
    let batch = json!([
        {"jsonrpc": "2.0", "id": 1, "method": "ping"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "x"}}},
    ]);
    let r = new.post(&batch).await;
    assert_eq!((r.status, r.error_code()), (400, -32600));
    assert!(
        r.last()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("2025-06-18")
    );

    let mut old = gw.client();
    old.initialize_at("2025-03-26", json!({})).await;
    let r = old.post(&batch).await;
    assert_eq!(r.status, 200, "{r:?}");
    let mut ids: Vec<i64> = r.messages.iter().filter_map(|m| m["id"].as_i64()).collect();
    ids.sort();
    assert_eq!(ids, [1, 2]);
    // A batch of notifications only: 202.
    let r = old
        .post(&json!([{"jsonrpc": "2.0", "method": "notifications/initialized"}, {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}]))
        .await;
    assert_eq!(r.status, 202);
    assert!(r.body.is_empty());
    // initialize inside a session's batch.
    let r = old.post_raw(format!("[{INIT}]")).await;
    assert_eq!(r.status, 400);
}

#[tokio::test]
async fn origin_and_host_checks() {
    let gw = Gateway::fixture(&[], &[]);
    let port = gw.addr.rsplit(':').next().unwrap().to_owned();
    let good_host = format!("localhost:{port}");
    let mut h = JSON_BOTH.to_vec();
    h.push(("origin", "http://evil.example.com"));
    let (s, body, _) = raw_post(&gw, &h, INIT).await;
    assert_eq!(s, 403, "a bad Origin alone is refused");
    assert!(body["id"].is_null());
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("evil.example.com")
    );
    let mut h = JSON_BOTH.to_vec();
    h.push(("host", "evil.example.com"));
    let (s, _, _) = raw_post(&gw, &h, INIT).await;
    assert_eq!(s, 403, "a rebinding Host is refused");
    let mut h = JSON_BOTH.to_vec();
    h.push(("host", &good_host));
    h.push(("origin", "http://localhost:6274"));
    let (s, _, headers) = raw_post(&gw, &h, INIT).await;
    assert_eq!(s, 200);
    assert!(headers.contains_key("mcp-session-id"));

    // Configured lists replace the defaults.
    let gw = Gateway::fixture(
        &[
            "--allowed-origins",
            "https://app.example.com",
            "--allowed-hosts",
            "mcp.example.com",
        ],
        &[],
    );
    let mut h = JSON_BOTH.to_vec();
    h.push(("host", "mcp.example.com"));
    h.push(("origin", "https://app.example.com"));
    assert_eq!(raw_post(&gw, &h, INIT).await.0, 200);
    let mut h = JSON_BOTH.to_vec();
    h.push(("host", "mcp.example.com"));
    h.push(("origin", "http://localhost:6274"));
    assert_eq!(raw_post(&gw, &h, INIT).await.0, 403);
    assert_eq!(
        raw_post(&gw, JSON_BOTH, INIT).await.0,
        403,
        "127.0.0.1 is no longer an allowed host"
    );
}

#[tokio::test]
async fn get_stream_rules() {
    let gw = Gateway::fixture(&[], &[]);
    let mut c = gw.client();
    c.initialize().await;
    let r = c
        .request(reqwest::Method::GET)
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 406);
    let first = c.get_stream().await;
    assert_eq!(first.status(), 200);
    assert!(
        first.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    assert_eq!(first.headers()["x-accel-buffering"], "no");
    assert_eq!(
        c.get_stream().await.status(),
        409,
        "one GET stream per session"
    );
    drop(first);
    // Once the first is gone, a new one may open.
    let mut status = 0;
    for _ in 0..100 {
        status = c.get_stream().await.status().as_u16();
        if status == 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(status, 200);
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
async fn regression_params_are_read_as_json_not_as_text() {
    // Guards: a params string equal to the gateway's old progress placeholder crashed the
    // request task and left its stream open; escaped strings were refused as bad params; big
    // integer ids came back altered in errors.
    let gw = Gateway::fixture(&[], &[]);
    let mut c = gw.client();
    c.initialize().await;
    let text = c
        .tool_text(
            1,
            "echo",
            json!({"text": "__mcp_gateway_progress__", "__mcp_gateway_progress__": 1}),
        )
        .await;
    assert_eq!(text, "__mcp_gateway_progress__");
    let r = c
        .post_raw(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"ech\u006f","arguments":{"text":"esc"},"_meta":{"progressToken":"__mcp_gateway_progress__"}}}"#)
        .await;
    assert_eq!(r.last()["result"]["content"][0]["text"], "esc", "{r:?}");
    let r = c
        .post_raw(r#"{"jsonrpc":"2.0","id":3,"method":"resources/read","params":{"uri":"test:\/\/static-text"}}"#)
        .await;
    assert!(r.last()["result"]["contents"].is_array(), "{r:?}");
    let r = c
        .post_raw(r#"{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"nope"}"#)
        .await;
    assert!(
        r.body.contains(r#""id":123456789012345678901234567890"#),
        "{}",
        r.body
    );
}

#[tokio::test]
async fn session_cap_holds_under_concurrent_initialize() {
    let gw = Gateway::fixture(&["--max-sessions", "5"], &[]);
    let attempts: Vec<_> = (0..20)
        .map(|_| {
            let c = Client::new(&gw.url);
            tokio::spawn(async move { c.post_raw(INIT).await.status })
        })
        .collect();
    let mut ok = 0;
    for a in attempts {
        match a.await.unwrap() {
            200 => ok += 1,
            503 => {}
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(ok, 5);
}

#[tokio::test]
async fn regression_json_no_plugin_can_read_is_refused_at_the_edge() {
    // Guards: params nested 100,000 deep, a 100,000-digit number and a lone surrogate went to
    // the plugin, which dropped the line, and the client waited for the request timeout.
    let gw = Gateway::fixture(&[], &[]);
    let mut c = gw.client();
    c.initialize().await;
    let deep = format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000));
    let digits = "9".repeat(100_000);
    for (i, arguments) in [
        format!(r#"{{"text":"x","deep":{deep}}}"#),
        format!(r#"{{"text":"x","n":{digits}}}"#),
        r#"{"text":"\ud800"}"#.to_owned(),
    ]
    .iter()
    .enumerate()
    {
        let id = 10 + i;
        let r = c
            .post_raw(format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{arguments}}}}}"#
            ))
            .await;
        assert_eq!(r.status, 400, "{r:?}");
        assert_eq!(r.error_code(), -32602, "{r:?}");
        assert_eq!(r.last()["id"], id, "{r:?}");
    }
    // A body that is not UTF-8 is not JSON.
    let r = c
        .post_raw(
            b"{\"jsonrpc\":\"2.0\",\"id\":20,\"method\":\"tools/call\",\"params\":{\"name\":\"echo\",\"arguments\":{\"text\":\"\xc3\x28\"}}}"
                .to_vec(),
        )
        .await;
    assert_eq!((r.status, r.error_code()), (400, -32700), "{r:?}");
    // The session is unharmed.
    assert_eq!(c.tool_text(30, "echo", json!({"text": "ok"})).await, "ok");
}

/// Reads from `tcp` until the gateway closes it; what it sent. Fails if it is still open
/// after `within`.
async fn read_until_closed(tcp: &mut tokio::net::TcpStream, within: std::time::Duration) -> String {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return String::from_utf8_lossy(&got).into_owned(),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => panic!(
                "the connection is still open after {within:?}; it sent {:?}",
                String::from_utf8_lossy(&got)
            ),
        }
    }
}

#[tokio::test]
async fn regression_slow_heads_slow_bodies_and_idle_connections_are_cut() {
    // Guards: connections that sent their headers or body slowly, or nothing at all, were held
    // forever, until they had taken every file descriptor.
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;
    let gw = Gateway::fixture(
        &[
            "--header-read-timeout-secs",
            "1",
            "--body-read-timeout-secs",
            "1",
            "--connection-idle-timeout-secs",
            "1",
            "--response-mode",
            "json",
        ],
        &[],
    );
    let within = Duration::from_secs(8);
    // A head that never ends.
    let mut slow_head = TcpStream::connect(&gw.addr).await.unwrap();
    slow_head
        .write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .unwrap();
    // A body that never ends: 408, then the connection closes.
    let mut slow_body = TcpStream::connect(&gw.addr).await.unwrap();
    slow_body
        .write_all(
            format!(
                "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: {ACCEPT_BOTH}\r\nContent-Length: 100\r\n\r\n{{\"jsonrpc\""
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    // An HTTP/2 connection that opens no stream.
    let mut idle_h2 = TcpStream::connect(&gw.addr).await.unwrap();
    idle_h2
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    // A connection that sends nothing.
    let mut silent = TcpStream::connect(&gw.addr).await.unwrap();
    read_until_closed(&mut slow_head, within).await;
    let answer = read_until_closed(&mut slow_body, within).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("-32000"), "{answer}");
    read_until_closed(&mut idle_h2, within).await;
    read_until_closed(&mut silent, within).await;
    // A request in flight longer than the idle timeout is not idle: a 2.5 s call answers.
    let mut c = gw.client();
    c.initialize().await;
    let r = c
        .call(
            2,
            "tools/call",
            json!({"name": "slow", "arguments": {"ms": 2500}}),
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.last().get("result").is_some(), "{r:?}");
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
