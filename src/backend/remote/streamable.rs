//! Streamable HTTP towards the upstream, in both eras: one POST per message; an answer as
//! JSON or as an SSE stream read until the request's response; a dropped legacy stream
//! resumed by GET with `Last-Event-ID`; the legacy session kept, opened again after a 404,
//! and its GET stream held open for what the upstream sends on its own.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, HeaderValue};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::outgoing::{Kind, Outgoing, Request, encode_header_value, screen_tools};
use super::sse::{Item, Parser};
use super::{Inner, Mode, is_type, logged, read_body};
use crate::jsonrpc::{self, Message, Outcome};

const ACCEPT_BOTH: &str = "application/json, text/event-stream";
/// Resumptions in a row that bring nothing before a stream is given up, and in all.
const MAX_RESUMES: u32 = 5;
const MAX_RESUMES_IN_ALL: u32 = 50;
/// The reconnection delay when the upstream names none, and the bounds of what it may name.
const DEFAULT_RETRY: Duration = Duration::from_secs(1);
const MIN_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(60);
const INITIALIZED: &[u8] = br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

/// How reading a stream ended.
enum Ended {
    /// The request's response came.
    Answered,
    /// It ended (or broke) first; resumable from the last event id, if it had one.
    Dropped {
        last_id: Option<String>,
        retry: Duration,
        why: String,
    },
    /// It broke the rules (an event too big): not resumed.
    Broken(String),
}

/// Why a request could not go.
pub(super) enum Failure {
    /// Nothing reached the upstream, or nothing came back (counts towards taking it for dead).
    Network(String),
    /// The upstream answered, but not with what was asked.
    Answer(String),
    /// The upstream refused the person's credentials, and they are asked to connect again.
    Refused(String),
}

use super::tools::OWN_LIST_ID_RAW;

impl Inner {
    /// Sends a request and hands its answer (and whatever comes with it) to the connection;
    /// a request that cannot be answered gets an error naming the plugin.
    pub(super) async fn request(self: Arc<Self>, out: Outgoing) {
        let Kind::Request(r) = &out.kind else { return };
        if let (Some(_), Some(version)) = (&r.tool, &r.modern) {
            self.learn_tools(version).await;
        }
        if let Some(tool) = &r.tool
            && self
                .state
                .lock()
                .expect("state lock")
                .tool_headers
                .rejected(tool)
        {
            // Left out of the list: never sent (its headers could not be made right).
            self.fail(
                &r.id,
                "does not offer this tool",
                &format!("the tool `{tool}` breaks the x-mcp-header rules"),
            )
            .await;
            return;
        }
        let mode = self.state.lock().expect("state lock").mode.clone();
        let result = match mode {
            Mode::Sse(endpoint) => self
                .post_sse(&endpoint, &out)
                .await
                .map_err(Failure::Network),
            Mode::Streamable => self.clone().post_request(&out, r).await,
        };
        match result {
            Ok(()) => {}
            Err(Failure::Network(why)) => {
                self.fail(&r.id, "could not be reached", &why).await;
                self.unreachable(&why);
            }
            Err(Failure::Answer(why)) => {
                self.fail(&r.id, "answered the request with an error", &why)
                    .await;
            }
            Err(Failure::Refused(why)) => {
                self.fail(
                    &r.id,
                    "refused the caller's credentials; the next call asks them to connect again",
                    &why,
                )
                .await;
                self.close(
                    "the upstream refused the person's credentials; the next call asks them to connect again".into(),
                );
            }
        }
    }

    /// The headers of one POST: the definition's, the session's (a legacy request), the
    /// mirrored ones (a 2026-07-28 request), and what the transport itself needs.
    fn post_headers(&self, r: Option<&Request>) -> (HeaderMap, u64) {
        let state = self.state.lock().expect("state lock");
        let modern = r.and_then(|r| r.modern.as_deref());
        let mut h = if modern.is_some() {
            self.headers.clone()
        } else {
            self.base_headers(&state)
        };
        h.insert("accept", HeaderValue::from_static(ACCEPT_BOTH));
        h.insert("content-type", HeaderValue::from_static("application/json"));
        if let (Some(version), Some(r)) = (modern, r) {
            let mut put = |name: &str, value: &str| {
                if let (Ok(n), Ok(v)) = (
                    reqwest::header::HeaderName::from_bytes(name.as_bytes()),
                    HeaderValue::from_str(value),
                ) {
                    h.insert(n, v);
                }
            };
            put("mcp-protocol-version", version);
            put("mcp-method", &r.method);
            if let Some(name) = &r.name {
                put("mcp-name", &encode_header_value(name));
            }
            if let Some(tool) = &r.tool {
                for (k, v) in state.tool_headers.headers(tool, r.arguments.as_ref()) {
                    put(&k, &v);
                }
            }
        }
        (h, state.generation)
    }

    /// POSTs a notification or an answer to the upstream's request: 202 (or any success) is
    /// all that is expected.
    pub(super) async fn post_one(&self, out: &Outgoing) -> Result<(), String> {
        let (headers, _) = self.post_headers(None);
        let mut response = self.send_post(headers, out.bytes.clone()).await?;
        let status = response.status();
        let body = read_body(&mut response, 64 * 1024, self.config.read_timeout)
            .await
            .unwrap_or_default();
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("HTTP {status}: {}", logged(&body)))
        }
    }

    async fn send_post(
        &self,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<reqwest::Response, String> {
        let send = self
            .http
            .post(self.url.clone())
            .headers(headers)
            .body(body)
            .send();
        tokio::select! {
            r = tokio::time::timeout(self.config.read_timeout, send) => match r {
                Ok(Ok(r)) => Ok(r),
                Ok(Err(e)) => Err(describe(&e)),
                Err(_) => Err(format!("no answer within {} s", self.config.read_timeout.as_secs())),
            },
            () = self.closed.cancelled() => Err("the transport ended".into()),
        }
    }

    pub(super) async fn post_request(
        self: Arc<Self>,
        out: &Outgoing,
        r: &Request,
    ) -> Result<(), Failure> {
        let mut renewed = false;
        loop {
            let (headers, generation) = self.post_headers(Some(r));
            let had_session = headers.contains_key("mcp-session-id");
            let mut response = self
                .send_post(headers, out.bytes.clone())
                .await
                .map_err(Failure::Network)?;
            self.reached();
            let status = response.status();
            if status == StatusCode::NOT_FOUND
                && had_session
                && !renewed
                && r.method != "initialize"
            {
                // The upstream forgot the session: a new one, then the request again.
                self.note(format!(
                    "the upstream answered 404 to session {generation}; initializing a new session"
                ));
                // In a task of its own: a request cancelled meanwhile does not leave the
                // renewal half done. One that fails ends the instance (the supervisor starts
                // it again, with a new session) rather than leave it without a session.
                let inner = self.clone();
                let renewal = tokio::spawn(async move { inner.renew_session(generation).await })
                    .await
                    .unwrap_or_else(|e| Err(e.to_string()));
                if let Err(why) = renewal {
                    self.note(format!("no new session: {why}"));
                    self.close("the upstream forgot its session and refused a new one".into());
                    return Err(Failure::Answer(why));
                }
                renewed = true;
                continue;
            }
            if r.method == "initialize" && status.is_success() {
                let mut state = self.state.lock().expect("state lock");
                state.session = response.headers().get("mcp-session-id").cloned();
            }
            if status.is_success() && is_type(response.headers(), "text/event-stream") {
                return self.clone().read_answer(response, r).await;
            }
            let body = read_body(
                &mut response,
                self.config.max_message_bytes,
                self.config.read_timeout,
            )
            .await
            .map_err(Failure::Network)?;
            if status.is_success() && is_type(response.headers(), "application/json") {
                return match self.clone().take_json(&body, r).await {
                    true => Ok(()),
                    false => Err(Failure::Answer(format!(
                        "HTTP {status} without the response: {}",
                        logged(&body)
                    ))),
                };
            }
            // A modern server refuses with a JSON-RPC error in a 4xx: the connection reads it
            // (the probe, an unsupported version).
            if status.is_client_error() && answers(&body, &r.id) {
                self.clone().take_json(&body, r).await;
                return Ok(());
            }
            if r.method == "initialize"
                && matches!(status.as_u16(), 400 | 404 | 405)
                && self.may_fall_back()
            {
                return self.fall_back(out).await;
            }
            if matches!(status.as_u16(), 401 | 403) {
                return Err(self
                    .refused(status.as_u16(), response.headers(), &body)
                    .await);
            }
            return Err(Failure::Answer(format!("HTTP {status}: {}", logged(&body))));
        }
    }

    /// Whether a refused `initialize` may be the 2024-11-05 transport's server.
    fn may_fall_back(&self) -> bool {
        self.config.transport == crate::config::RemoteTransportKind::Auto
    }

    /// The spec's fallback: a GET opening the old transport's stream, then `initialize` again
    /// through it.
    async fn fall_back(self: &Arc<Self>, out: &Outgoing) -> Result<(), Failure> {
        self.note(
            "the upstream refused a Streamable HTTP POST; trying the 2024-11-05 HTTP+SSE transport"
                .into(),
        );
        self.open_sse().await.map_err(Failure::Answer)?;
        let endpoint = match self.state.lock().expect("state lock").mode.clone() {
            Mode::Sse(e) => e,
            Mode::Streamable => return Err(Failure::Answer("no endpoint".into())),
        };
        self.post_sse(&endpoint, out)
            .await
            .map_err(Failure::Network)
    }

    /// A JSON body: the messages in it to the connection; whether the request's response
    /// was one.
    async fn take_json(self: Arc<Self>, body: &[u8], r: &Request) -> bool {
        let mut answered = false;
        let messages: Vec<Bytes> = match serde_json::from_slice::<Vec<&RawValue>>(body) {
            Ok(batch) => batch
                .iter()
                .map(|m| Bytes::copy_from_slice(m.get().as_bytes()))
                .collect(),
            Err(_) => vec![Bytes::copy_from_slice(body)],
        };
        for m in messages {
            answered |= self.clone().take(m, r).await;
        }
        answered
    }

    /// One message from the upstream to the connection; whether it is `r`'s response (the
    /// answer to `initialize` and `tools/list` is read on the way).
    async fn take(self: Arc<Self>, mut message: Bytes, r: &Request) -> bool {
        let mut answered = false;
        let mut listed = None;
        if let Ok(Message::Response { id, outcome }) = jsonrpc::parse_message(&message)
            && id.raw().get() == r.id
        {
            answered = true;
            match &outcome {
                Outcome::Result(_) if r.method == "tools/list" && r.modern.is_some() => {
                    listed = screen_tools(&self.plugin, &message);
                }
                Outcome::Result(result) if r.method == "initialize" => self.learn_version(result),
                _ => {}
            }
        }
        let own = r.id == OWN_LIST_ID_RAW;
        if let Some((rewritten, listed)) = listed {
            self.state
                .lock()
                .expect("state lock")
                .tool_headers
                .learn(listed);
            if let Some(screened) = rewritten {
                message = screened;
            }
        }
        if !(own && answered) {
            self.deliver(message).await;
        }
        answered
    }

    /// The version an `initialize` answer names.
    fn learn_version(&self, result: &RawValue) {
        #[derive(Deserialize)]
        struct Init {
            #[serde(rename = "protocolVersion")]
            version: String,
        }
        if let Ok(i) = serde_json::from_str::<Init>(result.get()) {
            self.state.lock().expect("state lock").version = Some(i.version);
        }
    }

    /// Reads a request's SSE answer to its response, resuming it while it drops early.
    async fn read_answer(
        self: Arc<Self>,
        response: reqwest::Response,
        r: &Request,
    ) -> Result<(), Failure> {
        let mut ended = self.clone().read_stream(response, Some(r)).await;
        // Resumptions in a row that brought no new event id (one since counts them anew),
        // and in all.
        let mut attempts = 0;
        let mut in_all = 0;
        let mut seen: Option<String> = None;
        loop {
            let (last_id, retry, why) = match ended {
                Ended::Answered => return Ok(()),
                Ended::Broken(why) => return Err(Failure::Answer(why)),
                Ended::Dropped {
                    last_id,
                    retry,
                    why,
                } => (last_id, retry, why),
            };
            let Some(last_id) = last_id.filter(|_| r.modern.is_none()) else {
                return Err(Failure::Answer(format!(
                    "the stream ended before the response ({why})"
                )));
            };
            if seen.as_deref() != Some(last_id.as_str()) {
                seen = Some(last_id.clone());
                attempts = 0;
            }
            attempts += 1;
            in_all += 1;
            if attempts > MAX_RESUMES || in_all > MAX_RESUMES_IN_ALL {
                return Err(Failure::Answer(format!(
                    "the stream could not be resumed ({why})"
                )));
            }
            tokio::select! {
                () = tokio::time::sleep(retry) => {}
                () = self.closed.cancelled() => return Ok(()),
            }
            self.event("resume");
            tracing::debug!(plugin = %self.plugin, last_id, "resuming a dropped stream");
            match self.get(Some(&last_id)).await {
                Ok(response) => {
                    ended = self.clone().read_stream(response, Some(r)).await;
                    if let Ended::Dropped {
                        last_id: None,
                        retry,
                        why,
                    } = ended
                    {
                        ended = Ended::Dropped {
                            last_id: Some(last_id),
                            retry,
                            why,
                        };
                    }
                }
                Err(why) => {
                    ended = Ended::Dropped {
                        last_id: Some(last_id),
                        retry,
                        why,
                    };
                }
            }
        }
    }

    /// A GET for the session's stream (resuming after `last_id`, if given).
    async fn get(&self, last_id: Option<&str>) -> Result<reqwest::Response, String> {
        let mut headers = self.base_headers(&self.state.lock().expect("state lock"));
        headers.insert("accept", HeaderValue::from_static("text/event-stream"));
        if let Some(id) = last_id.and_then(|i| HeaderValue::from_str(i).ok()) {
            headers.insert("last-event-id", id);
        }
        let send = self.http.get(self.url.clone()).headers(headers).send();
        let response = tokio::select! {
            r = tokio::time::timeout(self.config.read_timeout, send) => match r {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => return Err(describe(&e)),
                Err(_) => return Err("no answer to the GET".into()),
            },
            () = self.closed.cancelled() => return Err("the transport ended".into()),
        };
        if response.status().is_success() && is_type(response.headers(), "text/event-stream") {
            Ok(response)
        } else {
            Err(format!("the GET was answered HTTP {}", response.status()))
        }
    }

    /// Reads an SSE stream, handing each message to the connection, until `r`'s response (a
    /// request's stream) or its end.
    async fn read_stream(
        self: Arc<Self>,
        mut response: reqwest::Response,
        r: Option<&Request>,
    ) -> Ended {
        let mut parser = Parser::new(self.config.max_message_bytes);
        let (mut last_id, mut retry) = (None, DEFAULT_RETRY);
        let mut items = Vec::new();
        loop {
            let chunk = tokio::select! {
                c = tokio::time::timeout(self.config.read_timeout, response.chunk()) => c,
                () = self.closed.cancelled() => return Ended::Answered,
            };
            let chunk = match chunk {
                Ok(Ok(Some(c))) => c,
                Ok(Ok(None)) => {
                    return Ended::Dropped {
                        last_id,
                        retry,
                        why: "it closed".into(),
                    };
                }
                Ok(Err(e)) => {
                    return Ended::Dropped {
                        last_id,
                        retry,
                        why: describe(&e),
                    };
                }
                Err(_) => {
                    return Ended::Dropped {
                        last_id,
                        retry,
                        why: format!("no bytes for {} s", self.config.read_timeout.as_secs()),
                    };
                }
            };
            if let Err(e) = parser.push(&chunk, &mut items) {
                return Ended::Broken(format!("it sent {e}"));
            }
            for item in items.drain(..) {
                match item {
                    Item::Id(id) => last_id = Some(id),
                    Item::Retry(ms) => {
                        retry = Duration::from_millis(ms).clamp(MIN_RETRY, MAX_RETRY)
                    }
                    Item::Event(e) if e.event == "message" => {
                        // A replayed priming event, or garbage: not a message.
                        if jsonrpc::parse_message(&e.data).is_err() {
                            tracing::debug!(plugin = %self.plugin, "ignored an event that is no JSON-RPC message: {}", logged(&e.data));
                            continue;
                        }
                        let done = match r {
                            Some(r) => self.clone().take(e.data, r).await,
                            None => {
                                self.deliver(e.data).await;
                                false
                            }
                        };
                        if done {
                            return Ended::Answered;
                        }
                    }
                    Item::Event(_) => {}
                }
            }
        }
    }

    /// Opens a new session after the upstream forgot the one of `generation`: the client's
    /// `initialize` again, then `notifications/initialized` (once, whoever asks first).
    async fn renew_session(self: &Arc<Self>, generation: u64) -> Result<(), String> {
        let _one = self.reinit.lock().await;
        let init = {
            let mut state = self.state.lock().expect("state lock");
            if state.generation != generation {
                return Ok(());
            }
            state.session = None;
            state.init.clone().ok_or("no initialize to replay")?
        };
        let (mut headers, _) = self.post_headers(None);
        headers.remove("mcp-session-id");
        let mut response = self.send_post(headers, init.clone()).await?;
        if !response.status().is_success() {
            return Err(format!(
                "the new session was refused: HTTP {}",
                response.status()
            ));
        }
        let session = response.headers().get("mcp-session-id").cloned();
        if is_type(response.headers(), "text/event-stream") {
            // Read until its first event (the answer, the connection's no more), within the
            // read timeout in all.
            let deadline = tokio::time::Instant::now() + self.config.read_timeout;
            let mut parser = Parser::new(self.config.max_message_bytes);
            let mut items = Vec::new();
            while let Ok(Ok(Some(c))) = tokio::time::timeout_at(deadline, response.chunk()).await {
                items.clear();
                if parser.push(&c, &mut items).is_err()
                    || items.iter().any(|i| matches!(i, Item::Event(_)))
                {
                    break;
                }
            }
        } else {
            let _ = read_body(
                &mut response,
                self.config.max_message_bytes,
                self.config.read_timeout,
            )
            .await;
        }
        {
            let mut state = self.state.lock().expect("state lock");
            state.session = session;
            state.generation += 1;
        }
        self.event("reconnect");
        let initialized = Outgoing::read(Bytes::from_static(INITIALIZED)).expect("valid JSON-RPC");
        self.post_one(&initialized).await?;
        self.open_get_stream().await;
        Ok(())
    }

    /// Holds the session's GET stream open for what the upstream sends on its own, opening
    /// it again (resuming) when it drops, until the session changes or the transport ends.
    /// An upstream that offers none (405) is not asked again.
    pub(super) async fn open_get_stream(self: &Arc<Self>) {
        let generation = {
            let state = self.state.lock().expect("state lock");
            if state.mode != Mode::Streamable
                || (state.session.is_none() && state.version.is_none())
            {
                return;
            }
            state.generation
        };
        // The first GET is answered before anything else goes (as the official SDKs' clients
        // do), so that what the upstream sends on its own from then on has a stream to go to.
        let first = tokio::time::timeout(Duration::from_secs(5), self.get(None))
            .await
            .unwrap_or_else(|_| Err("no answer to the GET".into()));
        if matches!(&first, Err(why) if why.contains("HTTP 405")) {
            return;
        }
        tokio::spawn(self.clone().hold_get_stream(generation, Some(first)));
    }

    /// The rest of [`Inner::open_get_stream`]: reads the stream, and opens it again when it
    /// drops, until the session changes or the transport ends.
    async fn hold_get_stream(
        self: Arc<Self>,
        generation: u64,
        mut opened: Option<Result<reqwest::Response, String>>,
    ) {
        let (mut last_id, mut backoff) = (None::<String>, DEFAULT_RETRY);
        let mut first = true;
        loop {
            if self.is_closed() || self.state.lock().expect("state lock").generation != generation {
                return;
            }
            let got = match opened.take() {
                Some(r) => r,
                None => self.get(last_id.as_deref()).await,
            };
            match got {
                Ok(response) => {
                    if !first {
                        self.event("reconnect");
                    }
                    let opened = std::time::Instant::now();
                    match self.clone().read_stream(response, None).await {
                        Ended::Dropped {
                            last_id: l, retry, ..
                        } => {
                            last_id = l.or(last_id);
                            // A stream that ends at once is asked again more and more
                            // slowly, whatever `retry` it names.
                            backoff = if opened.elapsed() < Duration::from_secs(1) {
                                (backoff * 2).clamp(retry.max(MIN_RETRY), Duration::from_secs(30))
                            } else {
                                retry
                            };
                        }
                        Ended::Broken(why) => self.note(format!("its GET stream broke: {why}")),
                        Ended::Answered => return,
                    }
                }
                Err(why) if why.contains("HTTP 405") => return,
                Err(why) => {
                    tracing::debug!(plugin = %self.plugin, "GET stream: {why}");
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
            first = false;
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = self.closed.cancelled() => return,
            }
        }
    }
}

/// Whether `body` is a JSON-RPC response to `id`.
fn answers(body: &[u8], id: &str) -> bool {
    matches!(jsonrpc::parse_message(body), Ok(Message::Response { id: i, .. }) if i.raw().get() == id)
}

/// A reqwest error, for the logs: what failed, without the URL's query.
fn describe(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(url) = e.url() {
        s = s.replace(url.as_str(), "the upstream");
    }
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}
