//! A transport client written by hand, so tests see status codes, headers and streams as the
//! gateway sends them: sessions, protocol versions, JSON and SSE replies, and raw POSTs with
//! headers of the test's choosing. It works against either harness through [`Endpoints`]; it
//! never hides an error status behind a retry.

use std::time::Duration;

use serde_json::{Value, json};

use super::Endpoints;
use super::sse::{Events, parse_sse};

pub const ACCEPT_BOTH: &str = "application/json, text/event-stream";

/// A plain `initialize` request, as bytes on the wire.
pub const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

/// The content type and accept headers every POST needs.
pub const JSON_BOTH: &[(&str, &str)] = &[
    ("content-type", "application/json"),
    ("accept", ACCEPT_BOTH),
];

/// POSTs `body` to `/mcp` with exactly `headers`: the status, the body as JSON (or as a JSON
/// string when it is not JSON) and the headers.
pub async fn raw_post(
    gw: &impl Endpoints,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, serde_json::Value, reqwest::header::HeaderMap) {
    let mut r = reqwest::Client::new()
        .post(gw.mcp_url())
        .body(body.to_owned());
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

/// The names in a `tools/list` result.
pub fn tool_names(tools: &Value) -> Vec<&str> {
    tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect()
}

/// A hand-rolled transport client.
#[derive(Clone)]
pub struct Client {
    pub url: String,
    pub http: reqwest::Client,
    pub session: Option<String>,
    pub version: Option<String>,
    /// Headers sent on every request besides the transport's own.
    pub headers: reqwest::header::HeaderMap,
}

/// An HTTP response, read whole: its status, headers and JSON-RPC messages (from a JSON body
/// or from each SSE event).
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: String,
    pub messages: Vec<Value>,
}

impl Reply {
    pub fn content_type(&self) -> String {
        self.headers
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    }

    /// The only message, or the last one (the response, on an SSE stream).
    pub fn last(&self) -> &Value {
        self.messages
            .last()
            .unwrap_or_else(|| panic!("no message in reply: {self:?}"))
    }

    pub fn error_code(&self) -> i64 {
        self.last()["error"]["code"]
            .as_i64()
            .unwrap_or_else(|| panic!("no error in {self:?}"))
    }
}

impl Client {
    pub fn new(url: &str) -> Client {
        Client {
            url: url.to_owned(),
            // A hung request fails the test instead of hanging it.
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(90))
                .build()
                .expect("HTTP client"),
            session: None,
            version: None,
            headers: Default::default(),
        }
    }

    /// The same client sending `name: value` on every request.
    pub fn with_header(mut self, name: &'static str, value: &str) -> Client {
        self.headers
            .insert(name, value.parse().expect("a header value"));
        self
    }

    /// The same session from another HTTP client, so its requests go on another connection:
    /// a client whose connection broke.
    pub fn on_new_connection(&self) -> Client {
        Client {
            session: self.session.clone(),
            version: self.version.clone(),
            headers: self.headers.clone(),
            ..Client::new(&self.url)
        }
    }

    /// The same session at another URL (another replica, or the load balancer).
    pub fn at(&self, url: &str) -> Client {
        Client {
            session: self.session.clone(),
            version: self.version.clone(),
            headers: self.headers.clone(),
            ..Client::new(url)
        }
    }

    /// The same session over HTTP/2 (cleartext, prior knowledge).
    pub fn over_http2(&self) -> Client {
        Client {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(90))
                .http2_prior_knowledge()
                .build()
                .expect("HTTP client"),
            ..self.on_new_connection()
        }
    }

    /// The same client sending `Authorization: Bearer <token>` on every request.
    pub fn with_token(mut self, token: &str) -> Client {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            "authorization",
            format!("Bearer {token}").parse().expect("a header value"),
        );
        self.http = reqwest::Client::builder()
            .timeout(Duration::from_secs(90))
            .default_headers(headers)
            .build()
            .expect("HTTP client");
        self
    }

    pub fn request(&self, method: reqwest::Method) -> reqwest::RequestBuilder {
        let mut r = self
            .http
            .request(method, &self.url)
            .headers(self.headers.clone());
        if let Some(s) = &self.session {
            r = r.header("mcp-session-id", s);
        }
        if let Some(v) = &self.version {
            r = r.header("mcp-protocol-version", v);
        }
        r
    }

    /// POSTs a raw body with the standard headers.
    pub async fn post_raw(&self, body: impl Into<reqwest::Body>) -> Reply {
        let r = self
            .request(reqwest::Method::POST)
            .header("content-type", "application/json")
            .header("accept", ACCEPT_BOTH)
            .body(body)
            .send()
            .await
            .expect("POST");
        read_reply(r).await
    }

    pub async fn post(&self, message: &Value) -> Reply {
        self.post_raw(message.to_string()).await
    }

    /// Sends a request and returns the reply (JSON or a finished SSE stream).
    pub async fn call(&self, id: i64, method: &str, params: Value) -> Reply {
        self.post(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await
    }

    /// The result of a request, asserting it succeeded.
    pub async fn result(&self, id: i64, method: &str, params: Value) -> Value {
        let reply = self.call(id, method, params).await;
        assert_eq!(reply.status, 200, "{reply:?}");
        let last = reply.last().clone();
        assert!(last.get("result").is_some(), "no result: {reply:?}");
        assert_eq!(last["id"], id);
        last["result"].clone()
    }

    /// The text of the first content item of a tool call's result.
    pub async fn tool_text(&self, id: i64, name: &str, arguments: Value) -> String {
        let r = self
            .result(
                id,
                "tools/call",
                json!({"name": name, "arguments": arguments}),
            )
            .await;
        r["content"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("no text in {r}"))
            .to_owned()
    }

    /// Starts the fixture's `slow` tool (sleeps `ms` unless cancelled) in the background.
    pub fn spawn_slow(&self, id: i64, ms: u64) -> tokio::task::JoinHandle<Reply> {
        let c = self.clone();
        tokio::spawn(async move {
            c.call(
                id,
                "tools/call",
                json!({"name": "slow", "arguments": {"ms": ms}}),
            )
            .await
        })
    }

    pub async fn notify(&self, method: &str, params: Value) -> Reply {
        self.post(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
            .await
    }

    /// `initialize` at `version`, then `notifications/initialized`; keeps the session id.
    pub async fn initialize_at(&mut self, version: &str, capabilities: Value) -> Value {
        let reply = self
            .call(
                0,
                "initialize",
                json!({"protocolVersion": version, "capabilities": capabilities, "clientInfo": {"name": "gateway-tests", "version": "1"}}),
            )
            .await;
        assert_eq!(reply.status, 200, "{reply:?}");
        self.session = Some(
            reply.headers["mcp-session-id"]
                .to_str()
                .expect("session id is ASCII")
                .to_owned(),
        );
        let result = reply.last()["result"].clone();
        self.version = Some(result["protocolVersion"].as_str().unwrap().to_owned());
        let r = self.notify("notifications/initialized", json!({})).await;
        assert_eq!(r.status, 202, "{r:?}");
        result
    }

    pub async fn initialize(&mut self) -> Value {
        self.initialize_at(
            "2025-11-25",
            json!({"sampling": {}, "elicitation": {}, "roots": {"listChanged": true}}),
        )
        .await
    }

    /// Opens a streaming POST: the response, checked to be an SSE stream.
    pub async fn post_sse(&self, message: &Value) -> reqwest::Response {
        let r = self
            .request(reqwest::Method::POST)
            .header("content-type", "application/json")
            .header("accept", ACCEPT_BOTH)
            .body(message.to_string())
            .send()
            .await
            .expect("POST");
        assert_eq!(r.status(), 200);
        assert!(
            r.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream")
        );
        assert_eq!(r.headers()["x-accel-buffering"], "no");
        r
    }

    /// Opens a streaming POST and returns its live messages.
    pub async fn stream(&self, message: &Value) -> Events {
        Events::new(self.post_sse(message).await)
    }

    /// Opens the GET stream.
    pub async fn get_stream(&self) -> reqwest::Response {
        self.request(reqwest::Method::GET)
            .header("accept", "text/event-stream")
            .send()
            .await
            .expect("GET")
    }

    pub async fn delete(&self) -> u16 {
        self.request(reqwest::Method::DELETE)
            .send()
            .await
            .expect("DELETE")
            .status()
            .as_u16()
    }
}

async fn read_reply(r: reqwest::Response) -> Reply {
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let body = r.text().await.unwrap_or_default();
    let is_sse = headers
        .get("content-type")
        .is_some_and(|v| v.to_str().unwrap().starts_with("text/event-stream"));
    let messages = if is_sse {
        parse_sse(&body)
            .into_iter()
            .filter_map(|e| serde_json::from_str(&e.data).ok())
            .collect()
    } else if body.trim().is_empty() {
        Vec::new()
    } else {
        match serde_json::from_str::<Value>(&body) {
            Ok(Value::Array(v)) => v,
            Ok(v) => vec![v],
            Err(_) => Vec::new(),
        }
    };
    Reply {
        status,
        headers,
        body,
        messages,
    }
}
