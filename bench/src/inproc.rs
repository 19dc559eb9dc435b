//! The in-process ceiling: a minimal Streamable HTTP MCP server on axum that answers `echo`
//! itself, with no stdio hop. What a gateway could reach if its plugin cost nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

pub async fn serve(listen: &str) {
    let listener = tokio::net::TcpListener::bind(listen).await.expect("bind");
    println!(
        "listening on http://{}/mcp",
        listener.local_addr().expect("address")
    );
    let app = Router::new()
        .route(
            "/mcp",
            post(mcp).get(stream).delete(|| async { StatusCode::OK }),
        )
        .with_state(Arc::new(AtomicU64::new(0)));
    axum::serve(listener, app).await.expect("serve");
}

async fn mcp(State(sessions): State<Arc<AtomicU64>>, headers: HeaderMap, body: Bytes) -> Response {
    let Ok(msg) = serde_json::from_slice::<Value>(&body) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let json = |v: Value| ([("content-type", "application/json")], v.to_string()).into_response();
    match msg["method"].as_str() {
        Some("initialize") => {
            let sid = format!("s{}", sessions.fetch_add(1, Ordering::Relaxed));
            let mut r = json(json!({"jsonrpc": "2.0", "id": msg["id"], "result": {
                "protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "inproc", "version": "1"}}}));
            r.headers_mut()
                .insert("mcp-session-id", sid.parse().expect("ASCII"));
            r
        }
        Some("tools/call") if headers.contains_key("mcp-session-id") => {
            json(json!({"jsonrpc": "2.0", "id": msg["id"], "result": {
            "content": [{"type": "text", "text": msg["params"]["arguments"]["text"]}]}}))
        }
        Some(_) if msg.get("id").is_none() => StatusCode::ACCEPTED.into_response(),
        _ => json(
            json!({"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": "not found"}}),
        ),
    }
}

async fn stream() -> Response {
    let body = axum::body::Body::from_stream(futures_util::stream::pending::<
        Result<Bytes, std::io::Error>,
    >());
    ([("content-type", "text/event-stream")], body).into_response()
}
