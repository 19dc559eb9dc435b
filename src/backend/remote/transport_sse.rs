//! The deprecated 2024-11-05 HTTP+SSE transport, as a client: a GET opens the stream, whose
//! first event (`endpoint`) names where messages are POSTed; every message from the upstream,
//! answers included, comes on that stream. The endpoint must be on the upstream's own origin
//! (an upstream may not send the gateway's messages, and the headers with them, elsewhere). The
//! stream cannot be resumed: when it ends, the transport ends, and the supervisor starts the
//! instance again as it does a process that exited.

use std::sync::Arc;

use reqwest::header::HeaderValue;

use super::outgoing::Outgoing;
use super::sse::{Item, Parser};
use super::{Inner, Mode, is_type, logged, read_body};

impl Inner {
    /// Opens the stream and waits for its `endpoint`; from then on messages go there, and a
    /// task reads the rest of the stream.
    pub(super) async fn open_sse(self: &Arc<Self>) -> Result<(), String> {
        let mut headers = self.headers.clone();
        headers.insert("accept", HeaderValue::from_static("text/event-stream"));
        let send = self.http.get(self.url.clone()).headers(headers).send();
        let mut response = tokio::time::timeout(self.config.read_timeout, send)
            .await
            .map_err(|_| "no answer to the GET of the SSE stream".to_owned())?
            .map_err(|e| e.without_url().to_string())?;
        if !response.status().is_success() || !is_type(response.headers(), "text/event-stream") {
            let status = response.status();
            let body = read_body(&mut response, 4096, self.config.read_timeout)
                .await
                .unwrap_or_default();
            return Err(format!(
                "the GET of the SSE stream was answered HTTP {status}: {}",
                logged(&body)
            ));
        }
        let mut parser = Parser::new(self.config.max_message_bytes);
        let mut items = Vec::new();
        // The endpoint event within the read timeout in all, not per chunk.
        let deadline = tokio::time::Instant::now() + self.config.read_timeout;
        let endpoint = loop {
            let chunk = tokio::time::timeout_at(deadline, response.chunk())
                .await
                .map_err(|_| "no endpoint event in time".to_owned())?
                .map_err(|e| e.without_url().to_string())?
                .ok_or("the SSE stream ended before its endpoint event")?;
            parser
                .push(&chunk, &mut items)
                .map_err(|e| format!("the SSE stream sent {e}"))?;
            let found = items.iter().find_map(|i| match i {
                Item::Event(e) if e.event == "endpoint" => Some(e.data.clone()),
                _ => None,
            });
            if let Some(data) = found {
                items.clear();
                break data;
            }
            items.clear();
        };
        let text = std::str::from_utf8(&endpoint).map_err(|_| "an endpoint that is not text")?;
        let endpoint = self
            .url
            .join(text.trim())
            .map_err(|e| format!("the endpoint `{}` is no URL: {e}", logged(&endpoint)))?;
        if endpoint.origin() != self.url.origin() {
            return Err(format!(
                "the endpoint `{}` is not on the upstream's own origin",
                logged(endpoint.as_str().as_bytes())
            ));
        }
        self.state.lock().expect("state lock").mode = Mode::Sse(endpoint);
        let inner = self.clone();
        tokio::spawn(async move {
            let why = inner.read_sse(response, parser).await;
            if !inner.is_closed() {
                inner.note(format!("its SSE stream ended: {why}"));
                // Clients may be told the exit reason: the detail is in the log (the note).
                inner.close("the upstream's SSE stream ended".into());
            }
        });
        Ok(())
    }

    /// The rest of the stream: every `message` event to the connection. Why it ended.
    async fn read_sse(&self, mut response: reqwest::Response, mut parser: Parser) -> String {
        let mut items = Vec::new();
        loop {
            // The stream is the only way answers come: it waits as long as the upstream is
            // up, with no read timeout (a dead peer is found by the requests' own).
            let chunk = tokio::select! {
                c = response.chunk() => c,
                () = self.closed.cancelled() => return "the transport ended".into(),
            };
            let chunk = match chunk {
                Ok(Some(c)) => c,
                Ok(None) => return "it closed".into(),
                Err(e) => return e.without_url().to_string(),
            };
            if let Err(e) = parser.push(&chunk, &mut items) {
                return format!("it sent {e}");
            }
            for item in items.drain(..) {
                if let Item::Event(e) = item
                    && e.event == "message"
                {
                    if crate::jsonrpc::parse_message(&e.data).is_err() {
                        tracing::debug!(plugin = %self.plugin, "ignored an event that is no JSON-RPC message: {}", logged(&e.data));
                        continue;
                    }
                    self.deliver(e.data).await;
                }
            }
        }
    }

    /// POSTs one message to the endpoint; its answer, if any, comes on the stream.
    pub(super) async fn post_sse(&self, endpoint: &url::Url, out: &Outgoing) -> Result<(), String> {
        let mut headers = self.headers.clone();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        let send = self
            .http
            .post(endpoint.clone())
            .headers(headers)
            .body(out.bytes.clone())
            .send();
        let mut response = tokio::select! {
            r = tokio::time::timeout(self.config.read_timeout, send) => r
                .map_err(|_| "no answer to the POST".to_owned())?
                .map_err(|e| e.without_url().to_string())?,
            () = self.closed.cancelled() => return Err("the transport ended".into()),
        };
        let status = response.status();
        let body = read_body(&mut response, 64 * 1024, self.config.read_timeout)
            .await
            .unwrap_or_default();
        if status.is_success() {
            self.reached();
            Ok(())
        } else {
            Err(format!("HTTP {status}: {}", logged(&body)))
        }
    }
}
