//! Remote plugins: the gateway as an MCP client over HTTP, a [`PluginTransport`] beside the
//! stdio one, so that everything above the transport (the connection's id mapping, sessions,
//! routing, era bridging, access, audit) serves a remote server as it serves a process.
//!
//! The connection writes messages as it would to a child's stdin; [`RemoteTransport`] sends
//! each as the upstream's transport wants it and hands back, as lines, what the upstream
//! answers. `streamable` speaks Streamable HTTP in both eras: a 2026-07-28 request (its
//! version in `_meta`) with the mirrored `Mcp-*` headers and no session, cancelled by
//! closing its stream; a legacy conversation with its `Mcp-Session-Id` and
//! `MCP-Protocol-Version`, a GET stream for what the upstream sends on its own, streams
//! resumed with `Last-Event-ID` after the upstream's `retry`, the session initialized again
//! (the client's own `initialize`, replayed) when the upstream answers 404, and DELETE at the
//! end. `sse` speaks the deprecated 2024-11-05 HTTP+SSE transport, chosen in the config or
//! found by the spec's fallback when a POST is refused as that transport's servers refuse it.
//!
//! An upstream is someone else's server: the connection is pinned to addresses checked
//! against private networks (for plugins defined through the admin API), redirects are never
//! followed, every wait is bounded in time and every body and event in bytes, and what the
//! upstream says when it fails goes to the logs (and the plugin's error tail), never to a
//! client: a failed request is answered with a JSON-RPC error in the gateway's words, naming
//! the plugin. Requests that fail on the way several times in a row end the transport, which
//! the supervisor sees as a crash (restart with back-off, then the breaker).

mod outgoing;
pub mod sse;
mod streamable;
mod tools;
mod transport_sse;

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::transport::{Inbound, PluginTransport, SendError};
use super::{BackendError, Personal};
use crate::config::{PluginConfig, Reference, RemoteConfig, RemoteTransportKind};
use outgoing::{Kind, Outgoing, ToolHeaders};

/// Messages and bytes queued for the upstream at most; past them the connection is told the
/// plugin is not reading.
const MAX_QUEUED: usize = 1024;
const MAX_QUEUED_BYTES: usize = 64 * 1024 * 1024;
/// Messages from the upstream waiting for the connection to read them, at most (and twice
/// the largest message in bytes).
const INBOUND_MESSAGES: usize = 256;
/// Requests that fail on the way in a row before the upstream is taken for dead.
const FAILURES_TO_DEATH: u32 = 3;
/// Lines kept of what went wrong, for the logs of a failed start.
const TAIL_LINES: usize = 10;
/// How much of an upstream's error body goes to the logs.
const LOGGED_BODY: usize = 512;

/// The most requests to one upstream under way at once, per instance.
const MAX_IN_FLIGHT: usize = 256;

/// What a remote plugin's instance is: its queue towards the upstream and the tasks that
/// speak to it.
pub struct RemoteTransport {
    inner: Arc<Inner>,
}

/// How messages reach the upstream now.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Mode {
    /// Streamable HTTP at the configured URL.
    Streamable,
    /// The 2024-11-05 HTTP+SSE transport: messages are POSTed here.
    Sse(url::Url),
}

struct State {
    mode: Mode,
    /// The legacy session the upstream gave (`Mcp-Session-Id`).
    session: Option<HeaderValue>,
    /// The legacy version `initialize` settled on (`MCP-Protocol-Version`).
    version: Option<String>,
    /// The client's `initialize`, replayed to open a new session after a 404.
    init: Option<Bytes>,
    /// Bumped at each new session: work of an older one knows it is stale.
    generation: u64,
    /// Requests on their way, by id: cancelling one closes its stream.
    requests: HashMap<String, CancellationToken>,
    /// Learnt from `tools/list` answers, for a 2026-07-28 call's `Mcp-Param-*`.
    tool_headers: ToolHeaders,
}

struct Inner {
    plugin: Arc<str>,
    label: Arc<str>,
    config: Arc<RemoteConfig>,
    url: url::Url,
    http: reqwest::Client,
    /// The definition's own headers, expanded.
    headers: HeaderMap,
    /// Told when the upstream refuses the person's credentials in them.
    on_refused: Option<super::OnRefused>,
    state: Mutex<State>,
    /// Towards the connection; taken at the end, which ends its inbound stream.
    inbound: Mutex<Option<mpsc::Sender<Bytes>>>,
    inbound_bytes: Arc<Semaphore>,
    /// Requests under way at once (each holds a permit).
    in_flight: Arc<Semaphore>,
    inbound_budget: usize,
    queue: Mutex<Option<mpsc::UnboundedSender<Outgoing>>>,
    queued: AtomicUsize,
    queued_bytes: AtomicUsize,
    /// Cancelled when the transport ends: every task stops.
    closed: CancellationToken,
    exit: watch::Sender<Option<String>>,
    tail: Mutex<VecDeque<String>>,
    failures: AtomicU32,
    /// One new session at a time.
    reinit: tokio::sync::Mutex<()>,
    /// The transport's own tools listing, one at a time, and how often it was tried.
    listing: tokio::sync::Mutex<u32>,
}

impl RemoteTransport {
    /// Prepares the transport of one instance of `config` (a remote plugin) for whom `label`
    /// names, with `personal` standing for `${credential:NAME}` in its headers. Nothing is
    /// sent yet (but for the 2024-11-05 transport, whose stream is opened first): the
    /// connection's first message opens the conversation.
    pub async fn connect(
        config: &PluginConfig,
        label: &str,
        personal: Option<&Personal>,
    ) -> Result<(RemoteTransport, Inbound), BackendError> {
        let remote = config.remote.clone().expect("a remote plugin");
        let shown = remote.display_url();
        let fail = |reason: String| BackendError::Spawn {
            plugin: config.name.clone(),
            command: shown.clone(),
            reason,
        };
        let url = url::Url::parse(&remote.url).map_err(|e| fail(e.to_string()))?;
        let headers = expand_headers(&remote, personal).map_err(fail)?;
        let http = client(&remote, &url, &config.host.remote_networks)
            .await
            .map_err(fail)?;
        let (tx, rx) = mpsc::channel(INBOUND_MESSAGES);
        let budget = remote.max_message_bytes.saturating_mul(2);
        let semaphore = Arc::new(Semaphore::new(budget));
        let (queue_tx, queue_rx) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            plugin: Arc::from(config.name.as_str()),
            label: Arc::from(label),
            url,
            http,
            headers,
            on_refused: personal.and_then(|p| p.on_refused.clone()),
            state: Mutex::new(State {
                mode: Mode::Streamable,
                session: None,
                version: None,
                init: None,
                generation: 0,
                requests: HashMap::new(),
                tool_headers: ToolHeaders::default(),
            }),
            inbound: Mutex::new(Some(tx)),
            inbound_bytes: semaphore.clone(),
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            inbound_budget: budget,
            queue: Mutex::new(Some(queue_tx)),
            queued: AtomicUsize::new(0),
            queued_bytes: AtomicUsize::new(0),
            closed: CancellationToken::new(),
            exit: watch::channel(None).0,
            tail: Mutex::new(VecDeque::new()),
            failures: AtomicU32::new(0),
            reinit: tokio::sync::Mutex::new(()),
            listing: tokio::sync::Mutex::new(0),
            config: remote,
        });
        if inner.config.transport == RemoteTransportKind::Sse {
            tokio::time::timeout(config.startup_timeout, inner.open_sse())
                .await
                .map_err(|_| fail("no endpoint event within the start-up timeout".into()))?
                .map_err(fail)?;
        }
        tokio::spawn(inner.clone().dispatch(queue_rx));
        tracing::info!(plugin = %inner.plugin, session = %inner.label, url = %inner.config.display_url(), "remote plugin connected");
        let cost = move |len: usize| len.min(budget);
        let inbound =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|b| (b, rx)) },
            )
            .map(move |b: Bytes| {
                semaphore.add_permits(cost(b.len()));
                b
            });
        Ok((RemoteTransport { inner }, Box::pin(inbound)))
    }
}

/// The definition's headers with their references expanded: `${NAME}` from the gateway's
/// environment, `${credential:NAME}` from the person the instance serves. A header naming a
/// credential that is empty (the probe's, run as no one) is left out.
fn expand_headers(remote: &RemoteConfig, personal: Option<&Personal>) -> Result<HeaderMap, String> {
    let mut map = HeaderMap::new();
    for (name, value) in &remote.headers {
        let mut empty = false;
        let value = crate::config::expand(value, |r| match r {
            Reference::Env(n) => crate::config::env_var(n)
                .ok_or_else(|| format!("`${{{n}}}` is not set in the gateway's environment")),
            Reference::Credential(n) => {
                let v = personal
                    .and_then(|p| p.values.get(n).cloned())
                    .ok_or_else(|| format!("the caller's credential `{n}` was not given"))?;
                empty |= v.is_empty();
                Ok(v)
            }
            Reference::CredentialFile(n) => Err(format!("`{n}` cannot be a file in a header")),
        })
        .map_err(|e| format!("header {name}: {e}"))?;
        if empty {
            continue;
        }
        let mut value = HeaderValue::from_str(&value)
            .map_err(|_| format!("header {name}: its value is not one a header may carry"))?;
        value.set_sensitive(true);
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("header {name}: not a header name"))?;
        map.insert(name, value);
    }
    Ok(map)
}

/// The HTTP client of one instance: no redirects, no proxy, the configured connect timeout;
/// for a plugin whose addresses are checked, pinned to an address of the host that is global
/// unicast or in `networks` (every address the name has must be).
async fn client(
    remote: &RemoteConfig,
    url: &url::Url,
    networks: &[ipnet::IpNet],
) -> Result<reqwest::Client, String> {
    let mut b = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(remote.connect_timeout)
        .tcp_nodelay(true)
        .pool_idle_timeout(Duration::from_secs(60));
    if remote.check_addresses {
        let host = url.host_str().unwrap_or_default();
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let port = url.port_or_known_default().unwrap_or(443);
        let addrs: Vec<SocketAddr> = tokio::time::timeout(
            remote.connect_timeout,
            tokio::net::lookup_host((bare, port)),
        )
        .await
        .map_err(|_| format!("resolving {host} timed out"))?
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .collect();
        let Some(first) = addrs.first().copied() else {
            return Err(format!("{host} has no address"));
        };
        if let Some(bad) = addrs
            .iter()
            .map(SocketAddr::ip)
            .find(|ip| !crate::config::reachable(*ip, networks))
        {
            return Err(format!(
                "{host} resolves to {bad}, which is neither a global address nor in [sandbox] remote_networks"
            ));
        }
        b = b.resolve(bare, first);
    }
    b.build().map_err(|e| e.to_string())
}

impl Inner {
    /// Hands a message to the connection, waiting while its queue holds its bound.
    async fn deliver(&self, message: Bytes) {
        let Some(tx) = self.inbound.lock().expect("inbound lock").clone() else {
            return;
        };
        let cost = message.len().min(self.inbound_budget);
        let permits = u32::try_from(cost).unwrap_or(u32::MAX);
        let permit = tokio::select! {
            p = self.inbound_bytes.acquire_many(permits) => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            _ = self.closed.cancelled() => return,
        };
        // Held until the message is in the queue (the reader gives the bytes back when it
        // takes it); dropped, and so given back, if the send fails or is cancelled.
        if tx.send(message).await.is_ok() {
            permit.forget();
        }
    }

    /// Answers request `id` (its JSON text) with an error in the gateway's words; `detail`,
    /// which may hold what the upstream said, goes to the logs only.
    async fn fail(&self, id: &str, what: &str, detail: &str) {
        self.note(format!("{what}: {detail}"));
        crate::metrics::get()
            .remote_events
            .with_label_values(&[&*self.plugin, "error"])
            .inc();
        let message = format!(
            "plugin '{}' {what}; the gateway's logs say more",
            self.plugin
        );
        let error =
            serde_json::json!({"code": crate::jsonrpc::code::INTERNAL_ERROR, "message": message});
        let raw = serde_json::value::RawValue::from_string(error.to_string())
            .expect("serialized JSON is JSON");
        let Ok(id) = serde_json::value::RawValue::from_string(id.to_owned()) else {
            return;
        };
        self.deliver(crate::jsonrpc::error_object_bytes(&id, &raw))
            .await;
    }

    /// A 401 or 403: the person's credentials refused, which whoever gave them hears; when
    /// they are no good any more ([`streamable::Failure::Refused`]), the instance ends once
    /// the request is answered, and the person's next call asks them to connect again.
    pub(super) async fn refused(
        &self,
        status: u16,
        headers: &HeaderMap,
        body: &[u8],
    ) -> streamable::Failure {
        let values = headers.get_all("www-authenticate");
        let challenge =
            crate::protocol::challenge::bearer(values.iter().filter_map(|v| v.to_str().ok()))
                .unwrap_or("")
                .to_owned();
        let why = format!(
            "HTTP {status} (the upstream refused the credentials sent; WWW-Authenticate: {challenge}): {}",
            logged(body)
        );
        let Some(hook) = &self.on_refused else {
            return streamable::Failure::Answer(why);
        };
        let param = |name: &str| crate::protocol::challenge::bearer_param(&challenge, name);
        let refusal = super::Refusal {
            status,
            error: param("error"),
            scope: param("scope"),
        };
        if hook(refusal).await {
            return streamable::Failure::Refused(why);
        }
        streamable::Failure::Answer(why)
    }

    /// Logs what went wrong and keeps it for a failed start's error.
    fn note(&self, line: String) {
        tracing::warn!(plugin = %self.plugin, session = %self.label, "{line}");
        let mut tail = self.tail.lock().expect("tail lock");
        if tail.len() == TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line);
    }

    fn event(&self, what: &str) {
        crate::metrics::get()
            .remote_events
            .with_label_values(&[&*self.plugin, what])
            .inc();
    }

    /// A request reached the upstream and was answered: the upstream is alive.
    fn reached(&self) {
        self.failures.store(0, Ordering::Relaxed);
    }

    /// A request could not reach the upstream; after several in a row it is taken for dead
    /// and the transport ends.
    fn unreachable(&self, why: &str) {
        if self.failures.fetch_add(1, Ordering::Relaxed) + 1 >= FAILURES_TO_DEATH {
            // Clients may be told the exit reason: the detail (`why`) is in the log already.
            tracing::warn!(plugin = %self.plugin, "the upstream is unreachable: {why}");
            self.close("the upstream is unreachable".into());
        }
    }

    /// Ends the transport: every task stops and the connection's inbound stream ends.
    fn close(&self, reason: String) {
        self.exit.send_if_modified(|r| {
            if r.is_none() {
                *r = Some(reason);
                true
            } else {
                false
            }
        });
        self.closed.cancel();
        self.inbound.lock().expect("inbound lock").take();
        self.queue.lock().expect("queue lock").take();
    }

    fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// The headers every message carries: the definition's, the legacy session's.
    fn base_headers(&self, state: &State) -> HeaderMap {
        let mut h = self.headers.clone();
        if let Some(s) = &state.session {
            h.insert("mcp-session-id", s.clone());
        }
        if let Some(v) = state
            .version
            .as_deref()
            .and_then(|v| HeaderValue::from_str(v).ok())
        {
            h.insert("mcp-protocol-version", v);
        }
        h
    }

    /// Takes messages in order; requests go on in their own tasks (after `initialize`, which
    /// is waited for: nothing else can go before it), the rest are sent one after another.
    async fn dispatch(self: Arc<Self>, mut rx: mpsc::UnboundedReceiver<Outgoing>) {
        loop {
            let out = tokio::select! {
                o = rx.recv() => match o { Some(o) => o, None => break },
                _ = self.closed.cancelled() => break,
            };
            self.queued.fetch_sub(1, Ordering::Relaxed);
            self.queued_bytes
                .fetch_sub(out.bytes.len(), Ordering::Relaxed);
            match &out.kind {
                Kind::Request(r) if r.method == "initialize" => {
                    self.state.lock().expect("state lock").init = Some(out.bytes.clone());
                    let id = r.id.clone();
                    // Waited for (nothing else can go before it), within the read timeout
                    // and for no longer than the transport lives.
                    let answered = tokio::select! {
                        r = tokio::time::timeout(self.config.read_timeout, self.clone().request(out)) => r.is_ok(),
                        () = self.closed.cancelled() => break,
                    };
                    if !answered {
                        self.fail(&id, "did not answer initialize in time", "no answer")
                            .await;
                    }
                }
                Kind::Request(r) => {
                    let token = self.closed.child_token();
                    self.state
                        .lock()
                        .expect("state lock")
                        .requests
                        .insert(r.id.clone(), token.clone());
                    let inner = self.clone();
                    tokio::spawn(async move {
                        let id = out.request().map(|r| r.id.clone()).unwrap_or_default();
                        // At most MAX_IN_FLIGHT at once; the others wait here (in order),
                        // and what is not a request (answers, notifications) goes on.
                        tokio::select! {
                            () = async {
                                let Ok(_permit) = inner.in_flight.clone().acquire_owned().await else {
                                    return;
                                };
                                inner.clone().request(out).await;
                            } => {}
                            () = token.cancelled() => {}
                        }
                        inner.state.lock().expect("state lock").requests.remove(&id);
                    });
                }
                Kind::Notification { method, cancels } => {
                    let (modern, stream) = {
                        let mut state = self.state.lock().expect("state lock");
                        let stream = cancels.as_ref().and_then(|id| state.requests.remove(id));
                        (state.version.is_none() && state.init.is_none(), stream)
                    };
                    if let Some(stream) = stream {
                        // Closing its stream is how a 2026-07-28 request is cancelled, and a
                        // legacy one's answer is not awaited any more.
                        stream.cancel();
                    }
                    // 2026-07-28 over HTTP has no notifications from the client.
                    if !(modern && cancels.is_some()) {
                        let method = method.clone();
                        self.send_one(out, &method).await;
                    }
                }
                Kind::Response => self.send_one(out, "a response").await,
            }
        }
    }

    /// Sends a notification or an answer, in the mode of the moment.
    async fn send_one(self: &Arc<Self>, out: Outgoing, what: &str) {
        let mode = self.state.lock().expect("state lock").mode.clone();
        let send = async {
            match mode {
                Mode::Streamable => self.post_one(&out).await,
                Mode::Sse(endpoint) => self.post_sse(&endpoint, &out).await,
            }
        };
        // The queue behind it waits: bounded by the read timeout, and by the transport's life.
        let result = tokio::select! {
            r = tokio::time::timeout(self.config.read_timeout, send) => {
                r.unwrap_or_else(|_| Err("no answer in time".into()))
            }
            () = self.closed.cancelled() => return,
        };
        match result {
            Err(e) => self.note(format!("{what} not delivered: {e}")),
            // The session is ready: the upstream may now send on its own.
            Ok(()) if what == "notifications/initialized" => self.open_get_stream().await,
            Ok(()) => {}
        }
    }
}

impl PluginTransport for RemoteTransport {
    /// Over Streamable HTTP; the 2024-11-05 transport carries the legacy era alone.
    fn modern_first(&self) -> bool {
        self.inner.config.transport != RemoteTransportKind::Sse
    }

    fn send(&self, message: Bytes, _tag: Option<u64>) -> Result<(), SendError> {
        let inner = &self.inner;
        if inner.is_closed() {
            return Err(SendError::Closed);
        }
        let (messages, bytes) = (
            inner.queued.load(Ordering::Relaxed),
            inner.queued_bytes.load(Ordering::Relaxed),
        );
        if messages >= MAX_QUEUED || bytes + message.len() > MAX_QUEUED_BYTES {
            return Err(SendError::Full { messages, bytes });
        }
        let Some(out) = Outgoing::read(message) else {
            // The connection writes JSON-RPC only; nothing else is sent upstream.
            return Ok(());
        };
        let len = out.bytes.len();
        let queue = inner.queue.lock().expect("queue lock");
        let Some(queue) = queue.as_ref() else {
            return Err(SendError::Closed);
        };
        inner.queued.fetch_add(1, Ordering::Relaxed);
        inner.queued_bytes.fetch_add(len, Ordering::Relaxed);
        queue.send(out).map_err(|_| SendError::Closed)
    }

    /// A request its caller gave up (a timeout, a client gone): its exchange with the
    /// upstream is ended (for a 2026-07-28 upstream that is its cancellation). The upstream
    /// may have seen it: false, so that a legacy one is told.
    fn withdraw(&self, tag: u64) -> bool {
        let stream = self
            .inner
            .state
            .lock()
            .expect("state lock")
            .requests
            .remove(&tag.to_string());
        if let Some(stream) = stream {
            stream.cancel();
        }
        false
    }

    fn shutdown(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            let inner = &self.inner;
            if inner.is_closed() {
                return;
            }
            let (session, headers, mode) = {
                let state = inner.state.lock().expect("state lock");
                (
                    state.session.clone(),
                    inner.base_headers(&state),
                    state.mode.clone(),
                )
            };
            inner.close("stopped by the gateway".into());
            if session.is_some() && mode == Mode::Streamable {
                // The spec's way to end a session; a server that does not allow it answers 405.
                let delete = inner.http.delete(inner.url.clone()).headers(headers).send();
                match tokio::time::timeout(Duration::from_secs(5), delete).await {
                    Ok(Ok(r)) => {
                        tracing::debug!(plugin = %inner.plugin, status = %r.status(), "session deleted")
                    }
                    Ok(Err(e)) => tracing::debug!(plugin = %inner.plugin, "DELETE failed: {e}"),
                    Err(_) => tracing::debug!(plugin = %inner.plugin, "DELETE timed out"),
                }
            }
        })
    }

    fn exit_reason(&self) -> Option<String> {
        self.inner.exit.borrow().clone()
    }

    fn wait_exit_reason(&self) -> Pin<Box<dyn Future<Output = String> + Send + '_>> {
        Box::pin(async move {
            self.exit_reason()
                .unwrap_or_else(|| "the upstream connection ended".into())
        })
    }

    fn stderr_tail(&self) -> Vec<String> {
        self.inner
            .tail
            .lock()
            .expect("tail lock")
            .iter()
            .cloned()
            .collect()
    }

    fn pid(&self) -> Option<u32> {
        None
    }
}

impl Drop for RemoteTransport {
    fn drop(&mut self) {
        self.inner.close("stopped by the gateway".into());
    }
}

/// At most `max` bytes of a response's body, or why not.
async fn read_body(
    response: &mut reqwest::Response,
    max: usize,
    read_timeout: Duration,
) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let chunk = tokio::time::timeout(read_timeout, response.chunk())
            .await
            .map_err(|_| format!("no bytes for {} s", read_timeout.as_secs()))?
            .map_err(|e| e.to_string())?;
        let Some(chunk) = chunk else {
            return Ok(body);
        };
        if body.len() + chunk.len() > max {
            return Err(format!("a body over {max} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
}

/// Printable text of at most [`LOGGED_BODY`] bytes of an upstream's body, for a log line.
fn logged(body: &[u8]) -> String {
    let cut = &body[..body.len().min(LOGGED_BODY)];
    String::from_utf8_lossy(cut)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Whether a response's content type is `media` (parameters aside).
fn is_type(headers: &HeaderMap, media: &str) -> bool {
    headers
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(media))
}
