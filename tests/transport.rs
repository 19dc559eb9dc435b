//! The `/mcp` endpoint's status codes and JSON-RPC errors for every kind of bad input, over
//! real HTTP against the gateway served in the test's process. Each refusal must say what was
//! wrong, and a bad request must never disturb another client's session. The checks that need
//! the real binary (its logs, its file descriptor limit, its command line) are in
//! `transport_process.rs`: the two harnesses never share a test binary.

mod common;

use common::{ACCEPT_BOTH, Client, INIT, InProcess, JSON_BOTH, raw_post};
use serde_json::json;

#[tokio::test]
async fn initialize_negotiates_and_mints_a_session_id() {
    let gw = InProcess::fixture(&[], &[]).await;
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
    gw.stop().await;
}

#[tokio::test]
async fn media_types_and_body_limits() {
    let gw = InProcess::fixture(&["--max-body-bytes", "2048"], &[]).await;
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
    gw.stop().await;
}

#[tokio::test]
async fn sessions_required_unknown_and_ended() {
    let gw = InProcess::fixture(&[], &[]).await;
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
    gw.stop().await;
}

/// Without a session and without a modern `_meta`, a request gets a 400 that is not a
/// modern-era error (-32020..-32022), so a dual-era client falls back to `initialize`: a plain
/// one, or -32602 for a `server/discover` (modern by its method, and missing its `_meta`:
/// tests/modern.rs). With a modern `_meta` it is a modern request, refused here for its
/// missing headers with a modern error.
#[tokio::test]
async fn a_request_without_session_or_modern_meta_gets_a_legacy_400() {
    let gw = InProcess::fixture(&[], &[]).await;
    let c = gw.client();
    for method in ["server/discover", "tools/list"] {
        let r = c.call(1, method, json!({})).await;
        assert_eq!(r.status, 400, "{method}");
        let code = r.error_code();
        assert!(!(-32022..=-32020).contains(&code), "{code}");
        let r = c
            .call(
                1,
                method,
                json!({"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}),
            )
            .await;
        assert_eq!(r.status, 400, "{method}");
        assert_eq!(r.error_code(), -32020, "{r:?}");
    }
    gw.stop().await;
}

#[tokio::test]
async fn protocol_version_header() {
    let gw = InProcess::fixture(&[], &[]).await;
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
    gw.stop().await;
}

#[tokio::test]
async fn batches_only_for_2025_03_26() {
    let gw = InProcess::fixture(&[], &[]).await;
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
    gw.stop().await;
}

#[tokio::test]
async fn origin_and_host_checks() {
    let gw = InProcess::fixture(&[], &[]).await;
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
    gw.stop().await;
    let gw = InProcess::fixture(
        &[
            "--allowed-origins",
            "https://app.example.com",
            "--allowed-hosts",
            "mcp.example.com",
        ],
        &[],
    )
    .await;
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
    gw.stop().await;
}

#[tokio::test]
async fn get_stream_rules() {
    let gw = InProcess::fixture(&[], &[]).await;
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
    gw.stop().await;
}

#[tokio::test]
async fn regression_params_are_read_as_json_not_as_text() {
    // Guards: a params string equal to the gateway's old progress placeholder crashed the
    // request task and left its stream open; escaped strings were refused as bad params; big
    // integer ids came back altered in errors.
    let gw = InProcess::fixture(&[], &[]).await;
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
    gw.stop().await;
}

#[tokio::test]
async fn session_cap_holds_under_concurrent_initialize() {
    let gw = InProcess::fixture(&["--max-sessions", "5"], &[]).await;
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
    gw.stop().await;
}

#[tokio::test]
async fn regression_json_no_plugin_can_read_is_refused_at_the_edge() {
    // Guards: params nested 100,000 deep, a 100,000-digit number and a lone surrogate went to
    // the plugin, which dropped the line, and the client waited for the request timeout.
    let gw = InProcess::fixture(&[], &[]).await;
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
    gw.stop().await;
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
    let gw = InProcess::fixture(
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
    )
    .await;
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
    gw.stop().await;
}
