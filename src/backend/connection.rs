//! The gateway as an MCP client of one plugin process.
//!
//! Every request towards the plugin gets an id from this connection's counter; a pending map
//! remembers where each answer goes: back to a client's stream with the client's own id (the
//! plugin's result bytes are forwarded with only the id swapped, unless the request came with
//! a [`Rewrite`]), or to a gateway task waiting on it. A progress token a client sent is
//! replaced by the request's plugin-side id, so the plugin's progress notifications find their
//! stream through the same map. The plugin's own
//! requests and notifications go to a [`PluginEvents`] listener, whoever set it.
//!
//! Each client request is forwarded for a [`Caller`], a key the connection is handed and
//! only ever compares: whether all requests in flight are one caller's decides how certain
//! the stream a plugin's own message is given with is ([`Related`]), and a cancellation finds
//! its request by caller and id. What a caller is (a session) is for the layers above.
//!
//! The pending map sits behind a short synchronous lock never held across an await. One task
//! reads the plugin's output (`connection/inbound.rs`); when the plugin goes, every request still pending
//! fails with an error that names the plugin. `connection/events.rs` holds the listener seam, [`Related`]
//! and [`Caller`]; `connection/era.rs` the opening of a connection in the plugin's era
//! (`initialize`, or `server/discover`, or the probe that tries `initialize` first);
//! `connection/input.rs` a modern plugin's `InputRequiredResult`s, parked until the client's
//! input comes and retried with it; this file the connection and what goes towards the plugin.
//! A modern plugin's every request carries `_meta` with the version and its client; a legacy
//! plugin gets a modern client's request without them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::oneshot;

mod era;
mod events;
mod inbound;
mod input;

pub use events::{Caller, LIST_CHANGES, PluginEvents, RELATED_TASK, Related, task_named};
pub use input::InputRequired;

use super::BackendError;
use super::modern::{self, ClientMeta, Era};
use super::transport::{Inbound, PluginTransport, SendError};
use crate::audit::{self, Ends, Ticket};
use crate::jsonrpc::{self, Id, code};
use crate::metrics::{InFlight, PluginMetrics};
use crate::stream::Sink;
use inbound::{expire_requests, read_loop};
use input::Retry;

/// Where a plugin's answer goes.
enum Pending {
    /// Back to a client: the client's id replaces ours.
    Client {
        /// Whose request it is: requests of several callers in flight make a plugin's own
        /// message unattributable, and a cancellation must come from the same caller.
        caller: Caller,
        client_id: Id,
        sink: Sink,
        progress_token: Option<Box<RawValue>>,
        /// When the request times out.
        deadline: std::time::Instant,
        /// Counts the request in flight until it ends; times its answer.
        timer: InFlight,
        /// Changes a successful answer before the client sees it (see [`Rewrite`]).
        rewrite: Option<Rewrite>,
        /// A request to a modern plugin that may be answered with an `InputRequiredResult`:
        /// what it takes to retry it.
        retry: Option<Box<Retry>>,
        /// Its audit record in the making: told how the request ended, submitted when dropped.
        audit: Option<Ticket>,
    },
    /// To a gateway task.
    Internal(oneshot::Sender<Result<Box<RawValue>, CallError>>),
}

/// What becomes of a forwarded request's answer besides going to the client's stream.
#[derive(Default)]
pub struct Answering {
    /// Changes the plugin's successful result (see [`Rewrite`]).
    pub rewrite: Option<Rewrite>,
    /// The request's audit record, told how it ended.
    pub audit: Option<Ticket>,
}

/// Changes a plugin's successful result on its way to the client: handed in with a forwarded
/// request by the layer that knows why (a task id the gateway replaces with its own, a tool
/// the client cannot use). `None` leaves the result as the plugin sent it. Errors pass
/// untouched.
pub type Rewrite = Box<dyn FnOnce(&RawValue) -> Option<Box<RawValue>> + Send>;

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
    /// Whom it serves, for logs (a session id, or `shared`, `warm`, `probe`).
    label: Arc<str>,
    transport: Box<dyn PluginTransport>,
    pending: Mutex<HashMap<u64, Pending>>,
    next_id: AtomicU64,
    alive: AtomicBool,
    init: std::sync::OnceLock<InitializeResult>,
    /// Set when the plugin speaks the modern era: the `_meta` members a request gets when
    /// nobody gave it any (the client the instance was started for, or the gateway).
    modern: std::sync::OnceLock<ClientMeta>,
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
        label: Arc<str>,
        transport: Box<dyn PluginTransport>,
        inbound: Inbound,
        events: Option<Weak<dyn PluginEvents>>,
        request_timeout: Duration,
    ) -> Arc<PluginConnection> {
        let conn = Arc::new(PluginConnection {
            label,
            transport,
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            alive: AtomicBool::new(true),
            init: std::sync::OnceLock::new(),
            modern: std::sync::OnceLock::new(),
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

    /// See [`PluginTransport::rewrite_credential_file`].
    pub fn rewrite_credential_file(&self, name: &str, value: &str) -> bool {
        self.transport.rewrite_credential_file(name, value)
    }

    /// See [`PluginTransport::settled`].
    pub fn settled(&self) -> Option<bool> {
        self.transport.settled()
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

    /// The plugin's `initialize` result (or, from a modern plugin, what its
    /// `server/discover` said), once the handshake is done.
    pub fn info(&self) -> Option<&InitializeResult> {
        self.init.get()
    }

    /// The era the plugin speaks (legacy until the handshake found it modern).
    pub fn era(&self) -> Era {
        if self.modern.get().is_some() {
            Era::Modern
        } else {
            Era::Legacy
        }
    }

    pub fn is_modern(&self) -> bool {
        self.modern.get().is_some()
    }

    /// `params` as a modern plugin must get them: with `_meta` (the connection's own members
    /// where the params have none); `None`: send them as they are.
    fn with_meta(&self, params: Option<&RawValue>) -> Option<Box<RawValue>> {
        let meta = self.modern.get()?;
        modern::with_meta(params, &meta.members(None))
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
                // Quoted and cut: the plugin wrote it, and it goes into log lines.
                "it speaks protocol version {:?}, which the gateway does not ({})",
                result.protocol_version.chars().take(64).collect::<String>(),
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
        let meta = self.with_meta(params);
        self.write(
            jsonrpc::request_bytes(
                Some(Id::from_u64(id).raw()),
                method,
                meta.as_deref().or(params),
            ),
            id,
        )?;
        let result = rx.await.unwrap_or_else(|_| Err(self.gone_error().into()));
        std::mem::forget(forget);
        result
    }

    /// Forwards `caller`'s request; the answer goes to `sink` under the client's id. On
    /// failure to send, an error response is queued on the sink instead, so the client always
    /// gets an answer.
    pub fn forward(
        &self,
        caller: Caller,
        client_id: Id,
        method: &str,
        params: Option<&RawValue>,
        sink: &Sink,
    ) {
        self.forward_rewritten(
            caller,
            client_id,
            method,
            params,
            sink,
            Answering::default(),
        );
    }

    /// [`forward`](Self::forward), with what `answering` asks of the answer: a rewrite of
    /// the plugin's successful result before it goes to the client, an audit record told how
    /// the request ended.
    pub fn forward_rewritten(
        &self,
        caller: Caller,
        client_id: Id,
        method: &str,
        params: Option<&RawValue>,
        sink: &Sink,
        answering: Answering,
    ) {
        // A legacy plugin gets a modern client's request without its envelope.
        let meta = if self.is_modern() {
            self.with_meta(params)
        } else {
            modern::without_envelope(params)
        };
        let params = meta.as_deref().or(params);
        let retry = (self.is_modern() && modern::INPUT_METHODS.contains(&method))
            .then(|| Retry::new(method, params));
        let pending = Pending::Client {
            caller,
            client_id,
            sink: sink.clone(),
            progress_token: None,
            deadline: std::time::Instant::now() + self.request_timeout,
            timer: InFlight::start(&self.metrics, method),
            rewrite: answering.rewrite,
            retry,
            audit: answering.audit,
        };
        self.send_client(method, params, pending);
    }

    /// Sends a client's request (`pending` says whose) under a new id of this connection.
    fn send_client(&self, method: &str, params: Option<&RawValue>, mut pending: Pending) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        // The progress token the plugin sees is the request's own id on this connection, so
        // its progress notifications find their way back through the pending map.
        let swapped = params
            .filter(|p| p.get().contains("\"progressToken\""))
            .and_then(|p| swap_progress_token(p, id));
        let rewritten = match swapped {
            Some((token, rewritten)) => {
                if let Pending::Client { progress_token, .. } = &mut pending {
                    *progress_token = Some(token);
                }
                Some(rewritten)
            }
            None => None,
        };
        let bytes = jsonrpc::request_bytes(
            Some(Id::from_u64(id).raw()),
            method,
            rewritten.as_deref().or(params),
        );
        let (e, pending) = if self.is_alive() {
            self.touch();
            self.pending
                .lock()
                .expect("pending lock")
                .insert(id, pending);
            let Err(e) = self.transport.send(bytes, Some(id)) else {
                return;
            };
            (self.send_error(e), self.take(id))
        } else {
            (self.gone_error(), Some(pending))
        };
        if let Some(Pending::Client {
            client_id,
            sink,
            mut audit,
            ..
        }) = pending
        {
            audit.ended(audit::Outcome::Error, Some(e.code()));
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

    /// Cancels `caller`'s request in flight here: the plugin is told, and the request's stream
    /// stops waiting for it. False when no such request is pending.
    pub fn cancel_client_request(
        &self,
        caller: Caller,
        client_id: &Id,
        reason: Option<&RawValue>,
    ) -> bool {
        let found =
            self.take_client_requests(|from, c, _| from.same_session(&caller) && c == client_id, 1);
        let reason = reason.map(|r| serde_json::from_str(r.get()).unwrap_or_default());
        let cancelled = !found.is_empty();
        for (id, sink, parked) in found {
            self.cancel_taken(id, &sink, parked, reason.clone());
        }
        cancelled
    }

    /// Cancels every request of `caller` in flight here whose answer goes to stream number
    /// `stream` (its client closed that stream: a cancellation in the 2026-07-28 era). How
    /// many there were.
    pub fn cancel_stream_requests(&self, caller: Caller, stream: u64, reason: &str) -> usize {
        let found = self.take_client_requests(
            |from, _, sink| from.same_session(&caller) && sink.stream_number() == stream,
            usize::MAX,
        );
        let n = found.len();
        for (id, sink, parked) in found {
            self.cancel_taken(id, &sink, parked, Some(reason.into()));
        }
        n
    }

    /// Moves the client request in flight whose answer goes to `from` over to `to`, under
    /// the id `id`: its answer and notifications go there from now on. Returns the id the
    /// client gave it; `None` when no request here answers to `from`. For a modern client's
    /// call whose plugin has just asked the client for input (the session's bridge); called
    /// from this connection's reader, so the request's answer is not on its way meanwhile.
    pub fn rehome(&self, from: &Sink, id: Id, to: &Sink) -> Option<Id> {
        let mut pending = self.pending.lock().expect("pending lock");
        pending.values_mut().find_map(|p| match p {
            Pending::Client {
                client_id, sink, ..
            } if sink.same_stream(from) => {
                *sink = to.clone();
                Some(std::mem::replace(client_id, id.clone()))
            }
            _ => None,
        })
    }

    /// Takes up to `most` client requests that `which` picks out of the pending map.
    fn take_client_requests(
        &self,
        which: impl Fn(&Caller, &Id, &Sink) -> bool,
        most: usize,
    ) -> Vec<(u64, Sink, bool)> {
        let mut pending = self.pending.lock().expect("pending lock");
        let keys: Vec<u64> = pending
            .iter()
            .filter_map(|(k, p)| match p {
                Pending::Client {
                    caller,
                    client_id,
                    sink,
                    ..
                } if which(caller, client_id, sink) => Some(*k),
                _ => None,
            })
            .take(most)
            .collect();
        keys.into_iter()
            .filter_map(|k| match pending.remove(&k) {
                Some(Pending::Client {
                    sink,
                    retry,
                    mut audit,
                    ..
                }) => {
                    audit.ended(audit::Outcome::Cancelled, None);
                    Some((k, sink, retry.is_some_and(|r| r.parked())))
                }
                _ => None,
            })
            .collect()
    }

    /// A client request taken out of the pending map for a cancellation: its stream stops
    /// waiting, and the plugin is told unless it never saw it.
    fn cancel_taken(&self, id: u64, sink: &Sink, parked: bool, reason: Option<serde_json::Value>) {
        sink.dropped();
        if parked {
            // Answered already, parked for the client's input: the plugin works on nothing.
            return;
        }
        if self.transport.withdraw(id) {
            // Still queued whole: the plugin never sees it, so there is nothing to tell it.
            return;
        }
        let mut params = serde_json::json!({ "requestId": id });
        if let Some(reason) = reason {
            params["reason"] = reason;
        }
        let params = RawValue::from_string(params.to_string()).expect("valid JSON");
        self.notify("notifications/cancelled", Some(&params));
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
        Err(self.send_error(e))
    }

    /// The error for a message the transport would not take.
    fn send_error(&self, e: SendError) -> BackendError {
        match e {
            SendError::Closed => self.gone_error(),
            SendError::Full { messages, bytes } => {
                tracing::warn!(plugin = %self.name, session = %self.label, "a request was refused: the plugin is not reading its input ({messages} messages, {bytes} bytes wait for it)");
                BackendError::NotReading {
                    plugin: self.name.to_string(),
                    messages,
                    bytes,
                }
            }
        }
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
