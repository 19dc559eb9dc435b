//! A modern-era (2026-07-28) client by hand: every request carries the version, client info
//! and the capabilities it declares in `_meta`, and the headers that mirror the body; the
//! answer is read from a JSON body or an SSE stream alike. With helpers for multi round-trip
//! requests: `InputRequiredResult`s read, retries sent, the answers a client gives.

use serde_json::{Value, json};

use super::Client;

pub const MODERN: &str = "2026-07-28";

/// A modern client declaring `capabilities` on every request.
pub struct Modern {
    pub client: Client,
    pub capabilities: Value,
}

/// What the gateway answered: the status, and the one JSON-RPC response in the body (JSON,
/// or the last `data:` of an SSE stream).
pub struct Answer {
    pub status: u16,
    pub message: Value,
}

impl Answer {
    pub fn result(&self) -> &Value {
        assert!(
            self.message.get("error").is_none(),
            "an error: {}",
            self.message
        );
        &self.message["result"]
    }

    pub fn error(&self) -> (u16, i64, String) {
        let e = &self.message["error"];
        (
            self.status,
            e["code"].as_i64().unwrap_or_default(),
            e["message"].as_str().unwrap_or_default().to_owned(),
        )
    }

    /// The `inputRequests` of an `InputRequiredResult`, asserted to be one.
    pub fn input_requests(&self) -> &serde_json::Map<String, Value> {
        let r = self.result();
        assert_eq!(r["resultType"], "input_required", "{r}");
        assert!(r["requestState"].is_string(), "{r}");
        assert!(
            r.get("ttlMs").is_none() && r.get("cacheScope").is_none(),
            "no caching hints: {r}"
        );
        r["inputRequests"].as_object().expect("inputRequests")
    }

    pub fn state(&self) -> String {
        self.result()["requestState"].as_str().unwrap().to_owned()
    }

    /// The text of a complete tool result.
    pub fn text(&self) -> String {
        let r = self.result();
        assert_eq!(r["resultType"], "complete", "{r}");
        r["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

impl Modern {
    pub fn new(client: Client, capabilities: Value) -> Modern {
        Modern {
            client,
            capabilities,
        }
    }

    pub async fn post(&self, id: i64, method: &str, params: Value) -> Answer {
        self.try_post(id, method, params).await.expect("POST")
    }

    /// [`Modern::post`], giving back a failure of the HTTP exchange (a client's timeout).
    pub async fn try_post(
        &self,
        id: i64,
        method: &str,
        mut params: Value,
    ) -> Result<Answer, reqwest::Error> {
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientInfo": {"name": "mrtr-test", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": self.capabilities,
        });
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let mut r = self
            .client
            .request(reqwest::Method::POST)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", MODERN)
            .header("mcp-method", method);
        let name = params["name"].as_str().or(params["uri"].as_str());
        // The tasks extension's requests are routed by task.
        let name = name.or(params["taskId"]
            .as_str()
            .filter(|_| method.starts_with("tasks/")));
        if let Some(name) = name {
            r = r.header("mcp-name", name);
        }
        let r = r.body(body.to_string()).send().await?;
        let status = r.status().as_u16();
        let text = r.text().await?;
        let json = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .next_back()
            .unwrap_or(&text);
        let message = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {text}"));
        Ok(Answer { status, message })
    }

    pub async fn call(&self, id: i64, tool: &str, arguments: Value) -> Answer {
        self.post(
            id,
            "tools/call",
            json!({"name": tool, "arguments": arguments}),
        )
        .await
    }

    /// The retry of `tools/call` `tool` with the answers to the last round and its state.
    pub async fn retry(
        &self,
        id: i64,
        tool: &str,
        arguments: Value,
        responses: Value,
        state: &str,
    ) -> Answer {
        self.post(
            id,
            "tools/call",
            json!({"name": tool, "arguments": arguments, "inputResponses": responses, "requestState": state}),
        )
        .await
    }
}

pub fn all_capabilities() -> Value {
    json!({"elicitation": {}, "sampling": {}, "roots": {}})
}

pub fn accept(answer: &str) -> Value {
    json!({"action": "accept", "content": {"answer": answer}})
}

pub fn sampled(text: &str) -> Value {
    json!({"role": "assistant", "content": {"type": "text", "text": text}, "model": "test-model", "stopReason": "endTurn"})
}

/// The one key of `requests`, asserted to ask `method`.
pub fn only(requests: &serde_json::Map<String, Value>, method: &str) -> String {
    assert_eq!(requests.len(), 1, "{requests:?}");
    let (key, request) = requests.iter().next().unwrap();
    assert_eq!(request["method"], method, "{request}");
    key.clone()
}
