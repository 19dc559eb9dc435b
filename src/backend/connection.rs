//! The gateway as an MCP client of one plugin process.
//!
//! Every request towards the plugin gets an id from this connection's counter; a pending map
//! remembers where each answer goes: back to a client's stream with the client's own id (the
//! plugin's result bytes are forwarded with only the id swapped), or to a gateway task waiting
//! on it. A progress token a client sent is replaced by the request's plugin-side id, so the
//! plugin's progress notifications find their stream through the same map. The plugin's own
//! requests and notifications go to a [`PluginEvents`] listener (the session).
//!
//! The pending map sits behind a short synchronous lock never held across an await. One task
//! reads the plugin's output; when the plugin goes, every request still pending fails with an
//! error that names the plugin.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::oneshot;

use super::BackendError;
use super::transport::{Inbound, PluginTransport, SendError};
use crate::jsonrpc::{self, Id, Message, Outcome, code};
use crate::metrics::{InFlight, PluginMetrics};
use crate::stream::Sink;

/// Listens to what a plugin sends on its own initiative.
pub trait PluginEvents: Send + Sync + 'static {
    /// A request from the plugin to the client (`sampling/createMessage`, `elicitation/create`,
    /// `roots/list`, `ping`), with the client stream it relates to.
    fn plugin_request(
        &self,
        conn: &Arc<PluginConnection>,
        id: Id,
        method: &str,
        params: Option<&RawValue>,
        related: Related,
    );

    /// A notification from the plugin (progress already routed).
    fn plugin_notification(
        &self,
        conn: &Arc<PluginConnection>,
        message: Bytes,
        method: &str,
        related: Related,
    );

    /// The plugin is gone (crashed or stopped).
    fn plugin_exited(&self, conn: &Arc<PluginConnection>);
}

/// The client stream a plugin's own message relates to, judged from the client requests in
/// flight on the plugin.
#[derive(Debug, Clone)]
pub enum Related {
    /// The message itself names a client request in flight here (a progress token): this is
    /// that request's stream, whoever else has requests in flight.
    Named(Sink),
    /// No client request is in flight.
    None,
    /// All requests in flight are one session's, and this is the one stream among them that
    /// can carry the message (or, when none can, one of them: the session's GET stream then
    /// carries it).
    Exact(Sink),
    /// All requests in flight are one session's, on several streams; this is the newest. The
    /// session prefers its GET stream then.
    Ambiguous(Sink),
    /// Requests of several sessions are in flight (a shared plugin): the message cannot be
    /// given to any of them safely.
    Unattributable,
}

/// Where a plugin's answer goes.
enum Pending {
    /// Back to a client: the client's id replaces ours.
    Client {
        client_id: Id,
        sink: Sink,
        progress_token: Option<Box<RawValue>>,
        /// When the request times out.
        deadline: std::time::Instant,
        /// Counts the request in flight until it ends; times its answer.
        timer: InFlight,
    },
    /// To a gateway task.
    Internal(oneshot::Sender<Result<Box<RawValue>, CallError>>),
}

/// A failed internal call.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// The plugin answered with a JSON-RPC error (raw error object).
    #[error("plugin returned an error: {0}")]
    Rpc(String),
    #[error(transparent)]
    Backend(#[from] BackendError),
}

/// What the plugin said of itself in its `initialize` result.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeResult {
    pub protocol_version: String,
    #[serde(default = "empty_object")]
    pub capabilities: Box<RawValue>,
    #[serde(default = "empty_object")]
    pub server_info: Box<RawValue>,
    pub instructions: Option<String>,
}

fn empty_object() -> Box<RawValue> {
    RawValue::from_string("{}".into()).expect("valid JSON")
}

pub struct PluginConnection {
    /// The plugin's name, for error messages and logs.
    name: Arc<str>,
    /// The session it serves, for logs.
    session: Arc<str>,
    transport: Box<dyn PluginTransport>,
    pending: Mutex<HashMap<u64, Pending>>,
    next_id: AtomicU64,
    alive: AtomicBool,
    init: std::sync::OnceLock<InitializeResult>,
    /// Who hears the plugin's own requests and notifications: set at start, or when a warm
    /// instance is handed to a session.
    events: std::sync::OnceLock<Weak<dyn PluginEvents>>,
    /// How long a client's request may take.
    request_timeout: Duration,
    /// When a message last went either way.
    last_active: Mutex<std::time::Instant>,
    /// Set when the gateway stops the plugin on purpose.
    stopping: AtomicBool,
    /// This plugin's metrics, looked up once.
    metrics: PluginMetrics,
}

impl PluginConnection {
    /// Wraps a started transport and starts reading it. Call [`initialize`](Self::initialize)
    /// next.
    pub fn new(
        name: Arc<str>,
        session: Arc<str>,
        transport: Box<dyn PluginTransport>,
        inbound: Inbound,
        events: Option<Weak<dyn PluginEvents>>,
        request_timeout: Duration,
    ) -> Arc<PluginConnection> {
        let conn = Arc::new(PluginConnection {
            session,
            transport,
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            alive: AtomicBool::new(true),
            init: std::sync::OnceLock::new(),
            events: events.map(std::sync::OnceLock::from).unwrap_or_default(),
            request_timeout,
            last_active: Mutex::new(std::time::Instant::now()),
            stopping: AtomicBool::new(false),
            metrics: PluginMetrics::new(name.clone()),
            name,
        });
        tokio::spawn(read_loop(Arc::downgrade(&conn), inbound));
        tokio::spawn(expire_requests(Arc::downgrade(&conn), request_timeout));
        conn
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    pub fn pid(&self) -> Option<u32> {
        self.transport.pid()
    }

    /// How long nothing has happened, or `None` while requests are in flight.
    pub fn idle_for(&self) -> Option<Duration> {
        if !self.pending.lock().expect("pending lock").is_empty() {
            return None;
        }
        Some(self.last_active.lock().expect("activity lock").elapsed())
    }

    fn touch(&self) {
        *self.last_active.lock().expect("activity lock") = std::time::Instant::now();
    }

    /// The plugin's `initialize` result, once the handshake is done.
    pub fn info(&self) -> Option<&InitializeResult> {
        self.init.get()
    }

    /// Runs the handshake: `initialize` with the given params, a version check, then
    /// `notifications/initialized`.
    pub async fn initialize(
        &self,
        params: &RawValue,
        timeout: Duration,
    ) -> Result<&InitializeResult, BackendError> {
        let fail = |reason: String| BackendError::Initialize {
            plugin: self.name.to_string(),
            reason,
        };
        let raw = match tokio::time::timeout(timeout, self.call("initialize", Some(params))).await {
            Err(_) => {
                return Err(BackendError::Timeout {
                    plugin: self.name.to_string(),
                    secs: timeout.as_secs(),
                });
            }
            Ok(Err(CallError::Backend(e))) => return Err(e),
            Ok(Err(CallError::Rpc(e))) => {
                return Err(fail(format!("it answered initialize with {e}")));
            }
            Ok(Ok(raw)) => raw,
        };
        let result: InitializeResult = serde_json::from_str(raw.get())
            .map_err(|e| fail(format!("invalid initialize result: {e}")))?;
        if !crate::protocol::PLUGIN_VERSIONS.contains(&result.protocol_version.as_str()) {
            return Err(fail(format!(
                "it speaks protocol version {}, which the gateway does not ({})",
                result.protocol_version,
                crate::protocol::PLUGIN_VERSIONS.join(", ")
            )));
        }
        self.notify("notifications/initialized", None);
        Ok(self.init.get_or_init(|| result))
    }

    /// Sends a request on the gateway's own behalf and waits for its result. Dropping the
    /// future (a caller's timeout) forgets the request.
    pub async fn call(
        &self,
        method: &str,
        params: Option<&RawValue>,
    ) -> Result<Box<RawValue>, CallError> {
        let (tx, rx) = oneshot::channel();
        let id = self.register(Pending::Internal(tx))?;
        let forget = Forget { conn: self, id };
        self.write(
            jsonrpc::request_bytes(Some(Id::from_u64(id).raw()), method, params),
            id,
        )?;
        let result = rx.await.unwrap_or_else(|_| Err(self.gone_error().into()));
        std::mem::forget(forget);
        result
    }

    /// Forwards a client's request; the answer goes to `sink` under the client's id. On
    /// failure to send, an error response is queued on the sink instead, so the client always
    /// gets an answer.
    pub fn forward(&self, client_id: Id, method: &str, params: Option<&RawValue>, sink: &Sink) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        // The progress token the plugin sees is the request's own id on this connection, so
        // its progress notifications find their way back through the pending map.
        let swapped = params
            .filter(|p| p.get().contains("\"progressToken\""))
            .and_then(|p| swap_progress_token(p, id));
        let (rewritten, progress_token) = match swapped {
            Some((token, rewritten)) => (Some(rewritten), Some(token)),
            None => (None, None),
        };
        let pending = Pending::Client {
            client_id: client_id.clone(),
            sink: sink.clone(),
            progress_token,
            deadline: std::time::Instant::now() + self.request_timeout,
            timer: InFlight::start(&self.metrics, method),
        };
        let sent = self.insert(id, pending).and_then(|()| {
            self.write(
                jsonrpc::request_bytes(
                    Some(Id::from_u64(id).raw()),
                    method,
                    rewritten.as_deref().or(params),
                ),
                id,
            )
        });
        if let Err(e) = sent {
            sink.respond(jsonrpc::error_bytes(
                Some(&client_id),
                e.code(),
                &e.client_message(),
            ));
        }
    }

    /// Sends a notification.
    pub fn notify(&self, method: &str, params: Option<&RawValue>) {
        let _ = self
            .transport
            .send(jsonrpc::request_bytes(None, method, params), None);
    }

    /// Sends a message as is (a response to one of the plugin's requests).
    pub fn send_raw(&self, message: Bytes) {
        let _ = self.transport.send(message, None);
    }

    /// Cancels a client's request in flight here: the plugin is told, and the request's stream
    /// stops waiting for it. False when no such request is pending.
    pub fn cancel_client_request(
        &self,
        session: &str,
        client_id: &Id,
        reason: Option<&RawValue>,
    ) -> bool {
        let found = {
            let mut pending = self.pending.lock().expect("pending lock");
            let key = pending.iter().find_map(|(k, p)| match p {
                Pending::Client {
                    client_id: c, sink, ..
                } if c == client_id && sink.session_id() == session => Some(*k),
                _ => None,
            });
            key.and_then(|k| pending.remove(&k).map(|p| (k, p)))
        };
        let Some((id, Pending::Client { sink, .. })) = found else {
            return false;
        };
        sink.dropped();
        if self.transport.withdraw(id) {
            // Still queued whole: the plugin never sees it, so there is nothing to tell it.
            return true;
        }
        let mut params = serde_json::json!({ "requestId": id });
        if let Some(reason) = reason {
            params["reason"] = serde_json::from_str(reason.get()).unwrap_or_default();
        }
        let params = RawValue::from_string(params.to_string()).expect("valid JSON");
        self.notify("notifications/cancelled", Some(&params));
        true
    }

    /// Stops the plugin process and waits for it to be gone.
    pub async fn shutdown(&self) {
        self.stopping.store(true, Ordering::Release);
        self.transport.shutdown().await;
    }

    /// Whether the gateway stopped this plugin on purpose (its exit is not a crash).
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Where a message the plugin sends on its own most likely belongs. Stdio carries no link
    /// from a plugin's request or log to the client request that caused it, so only one
    /// stream in flight is certain; with several it is a guess.
    fn related(&self) -> Related {
        let pending = self.pending.lock().expect("pending lock");
        let mut session: Option<&Sink> = None;
        let mut newest: Option<(u64, &Sink)> = None;
        let mut streams = 0;
        for (k, p) in pending.iter() {
            let Pending::Client { sink, .. } = p else {
                continue;
            };
            match session {
                None => session = Some(sink),
                Some(s) if s.session_id() != sink.session_id() => return Related::Unattributable,
                Some(_) => {}
            }
            if sink.carries_messages() {
                if newest.is_none_or(|(_, s)| !s.same_stream(sink)) {
                    streams += 1;
                }
                if newest.is_none_or(|(n, _)| *k > n) {
                    newest = Some((*k, sink));
                }
            }
        }
        match (newest, streams, session) {
            (None, _, None) => Related::None,
            // The session's requests are on streams that cannot carry it: its GET stream can.
            (None, _, Some(s)) => Related::Exact(s.clone()),
            (Some((_, s)), 1, _) => Related::Exact(s.clone()),
            (Some((_, s)), _, _) => Related::Ambiguous(s.clone()),
        }
    }

    fn register(&self, pending: Pending) -> Result<u64, BackendError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.insert(id, pending).map(|()| id)
    }

    fn insert(&self, id: u64, pending: Pending) -> Result<(), BackendError> {
        if !self.is_alive() {
            return Err(self.gone_error());
        }
        self.touch();
        self.pending
            .lock()
            .expect("pending lock")
            .insert(id, pending);
        Ok(())
    }

    fn write(&self, bytes: Bytes, id: u64) -> Result<(), BackendError> {
        let Err(e) = self.transport.send(bytes, Some(id)) else {
            return Ok(());
        };
        self.take(id);
        Err(match e {
            SendError::Closed => self.gone_error(),
            SendError::Full { messages, bytes } => {
                tracing::warn!(plugin = %self.name, session = %self.session, "a request was refused: the plugin is not reading its input ({messages} messages, {bytes} bytes wait for it)");
                BackendError::NotReading {
                    plugin: self.name.to_string(),
                    messages,
                    bytes,
                }
            }
        })
    }

    /// Forgets a request: out of the pending map and, if still queued whole, out of the
    /// plugin's input queue. True if the plugin never saw it.
    fn withdraw(&self, id: u64) -> bool {
        self.take(id);
        self.transport.withdraw(id)
    }

    fn take(&self, id: u64) -> Option<Pending> {
        self.pending.lock().expect("pending lock").remove(&id)
    }

    fn gone_error(&self) -> BackendError {
        BackendError::Exited {
            plugin: self.name.to_string(),
            reason: self
                .transport
                .exit_reason()
                .unwrap_or_else(|| "it is no longer running".into()),
        }
    }

    /// The last stderr lines, for a start-up failure message.
    pub fn stderr_tail(&self) -> Vec<String> {
        self.transport.stderr_tail()
    }

    /// How the plugin ended, with the last lines of its stderr: for the logs and the admin
    /// API, never for a client.
    pub fn exit_report(&self) -> String {
        format!(
            "{}{}",
            self.gone_error(),
            super::stderr_tail(&self.stderr_tail())
        )
    }

    fn events(&self) -> Option<Arc<dyn PluginEvents>> {
        self.events.get().and_then(Weak::upgrade)
    }

    /// Gives an instance started without a listener (a warm one) its listener. False if it
    /// already has one.
    pub fn set_events(&self, events: Weak<dyn PluginEvents>) -> bool {
        self.events.set(events).is_ok()
    }
}

impl Drop for PluginConnection {
    /// A connection dropped with client requests still pending (its process was discarded)
    /// answers each of them, so no client waits forever.
    fn drop(&mut self) {
        let pending = self
            .pending
            .get_mut()
            .map(std::mem::take)
            .unwrap_or_default();
        for p in pending.into_values() {
            if let Pending::Client {
                client_id, sink, ..
            } = p
            {
                sink.respond(jsonrpc::error_bytes(
                    Some(&client_id),
                    code::INTERNAL_ERROR,
                    &format!("plugin '{}' was stopped before it answered", self.name),
                ));
            }
        }
    }
}

/// Removes an internal call's pending entry if its caller stops waiting.
struct Forget<'a> {
    conn: &'a PluginConnection,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.conn.withdraw(self.id);
    }
}

/// Puts `id` in place of the client's `params._meta.progressToken`, returning the client's
/// token and the rewritten params; `None` when params hold no such token.
fn swap_progress_token(params: &RawValue, id: u64) -> Option<(Box<RawValue>, Box<RawValue>)> {
    let mut value: serde_json::Value = serde_json::from_str(params.get()).ok()?;
    let slot = value.get_mut("_meta")?.get_mut("progressToken")?;
    let token = std::mem::replace(slot, id.into());
    let token = RawValue::from_string(token.to_string()).ok()?;
    let rewritten = RawValue::from_string(value.to_string()).ok()?;
    Some((token, rewritten))
}

/// Fails client requests past their deadline: the client gets an error, the plugin is told
/// to stop working on it. One light task per connection, so the hot path arms no timer.
async fn expire_requests(conn: Weak<PluginConnection>, timeout: Duration) {
    let period = (timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    loop {
        tokio::time::sleep(period).await;
        let Some(conn) = conn.upgrade().filter(|c| c.is_alive()) else {
            return;
        };
        let now = std::time::Instant::now();
        let expired: Vec<(u64, Pending)> = {
            let mut pending = conn.pending.lock().expect("pending lock");
            let ids: Vec<u64> = pending
                .iter()
                .filter(|(_, p)| matches!(p, Pending::Client { deadline, .. } if *deadline <= now))
                .map(|(k, _)| *k)
                .collect();
            ids.into_iter()
                .filter_map(|k| pending.remove(&k).map(|p| (k, p)))
                .collect()
        };
        for (id, p) in expired {
            let Pending::Client {
                client_id, sink, ..
            } = p
            else {
                continue;
            };
            conn.metrics.timeouts.inc();
            tracing::warn!(plugin = %conn.name, session = %conn.session, "request {client_id} timed out after {} s", timeout.as_secs());
            sink.respond(jsonrpc::error_bytes(
                Some(&client_id),
                code::REQUEST_TIMEOUT,
                &format!(
                    "Request timed out: plugin '{}' did not answer within {} s",
                    conn.name,
                    timeout.as_secs()
                ),
            ));
            if conn.transport.withdraw(id) {
                // It never left the queue: the plugin does not know of it.
                continue;
            }
            let params = RawValue::from_string(
                serde_json::json!({ "requestId": id, "reason": "timed out" }).to_string(),
            )
            .expect("valid JSON");
            conn.notify("notifications/cancelled", Some(&params));
        }
    }
}

async fn read_loop(conn: Weak<PluginConnection>, mut inbound: Inbound) {
    while let Some(line) = inbound.next().await {
        let Some(conn) = conn.upgrade() else { return };
        conn.handle_line(line);
    }
    let Some(conn) = conn.upgrade() else { return };
    conn.alive.store(false, Ordering::Release);
    let reason = conn.transport.wait_exit_reason().await;
    let pending: Vec<Pending> = conn
        .pending
        .lock()
        .expect("pending lock")
        .drain()
        .map(|(_, p)| p)
        .collect();
    if !pending.is_empty() {
        tracing::warn!(plugin = %conn.name, session = %conn.session, "plugin exited ({reason}) with {} request(s) in flight", pending.len());
    }
    let message = format!(
        "plugin '{}' exited while handling the request ({reason})",
        conn.name
    );
    for p in pending {
        match p {
            Pending::Client {
                client_id, sink, ..
            } => {
                sink.respond(jsonrpc::error_bytes(
                    Some(&client_id),
                    code::INTERNAL_ERROR,
                    &message,
                ));
            }
            Pending::Internal(tx) => {
                let _ = tx.send(Err(CallError::Backend(BackendError::Exited {
                    plugin: conn.name.to_string(),
                    reason: reason.clone(),
                })));
            }
        }
    }
    if let Some(events) = conn.events() {
        events.plugin_exited(&conn);
    }
}

impl PluginConnection {
    fn handle_line(self: &Arc<Self>, line: Bytes) {
        self.touch();
        let message = match jsonrpc::parse_message(&line) {
            Ok(m) => m,
            Err(e) => {
                let shown = String::from_utf8_lossy(&line[..line.len().min(200)]).into_owned();
                tracing::warn!(plugin = %self.name, session = %self.session, "dropped a line that is not JSON-RPC ({}): {shown}", e.message());
                return;
            }
        };
        match message {
            Message::Response { id, outcome } => self.handle_response(id, outcome),
            Message::Request { id, method, params } => match self.events() {
                Some(events) => {
                    events.plugin_request(self, id, &method, params.as_deref(), self.related())
                }
                None => self.answer_unlistened(id, &method),
            },
            Message::Notification { method, params } => {
                if method == "notifications/progress" && self.route_progress(params.as_deref()) {
                    return;
                }
                if let Some(events) = self.events() {
                    events.plugin_notification(self, line, &method, self.related());
                }
            }
        }
    }

    fn handle_response(&self, id: Id, outcome: Outcome) {
        let Some(pending) = id.as_u64().and_then(|n| self.take(n)) else {
            tracing::debug!(plugin = %self.name, session = %self.session, "response to no pending request (id {id}); dropped");
            return;
        };
        match pending {
            Pending::Client {
                client_id,
                sink,
                timer,
                ..
            } => {
                timer.observe();
                let bytes = match &outcome {
                    Outcome::Result(r) => jsonrpc::result_bytes(client_id.raw(), r),
                    Outcome::Error(e) => jsonrpc::error_object_bytes(client_id.raw(), e),
                };
                sink.respond(bytes);
            }
            Pending::Internal(tx) => {
                let _ = tx.send(match outcome {
                    Outcome::Result(r) => Ok(r),
                    Outcome::Error(e) => Err(CallError::Rpc(e.get().to_owned())),
                });
            }
        }
    }

    /// Sends a progress notification to the stream of the request whose token it carries,
    /// with the client's token restored. False when it matches no request.
    fn route_progress(self: &Arc<Self>, params: Option<&RawValue>) -> bool {
        let Some(params) = params else { return false };
        let Ok(mut value) = serde_json::from_str::<serde_json::Value>(params.get()) else {
            return false;
        };
        let Some(n) = value
            .get("progressToken")
            .and_then(serde_json::Value::as_u64)
        else {
            return false;
        };
        let target = {
            let pending = self.pending.lock().expect("pending lock");
            match pending.get(&n) {
                Some(Pending::Client {
                    sink,
                    progress_token: Some(token),
                    ..
                }) => Some((sink.clone(), token.clone())),
                _ => None,
            }
        };
        let Some((sink, token)) = target else {
            return false;
        };
        value["progressToken"] = serde_json::from_str(token.get()).unwrap_or_default();
        let params = RawValue::from_string(value.to_string()).expect("valid JSON");
        let bytes = jsonrpc::request_bytes(None, "notifications/progress", Some(&params));
        if let Err(bytes) = sink.message(bytes)
            && let Some(events) = self.events()
        {
            // The request's stream cannot carry it (JSON mode, or the client left): the
            // session's GET stream can.
            events.plugin_notification(self, bytes, "notifications/progress", Related::Named(sink));
        }
        true
    }

    /// Answers a plugin request when nobody listens (the start-up probe): `ping` gets `{}`,
    /// anything else a method-not-found error.
    fn answer_unlistened(&self, id: Id, method: &str) {
        let bytes = if method == "ping" {
            jsonrpc::result_bytes(id.raw(), &empty_object())
        } else {
            jsonrpc::error_bytes(
                Some(&id),
                code::METHOD_NOT_FOUND,
                &format!("{method} is not available while the gateway probes this plugin"),
            )
        };
        self.send_raw(bytes);
    }
}
