//! Legacy-era sessions: one per `initialize`, named by `Mcp-Session-Id`.
//!
//! A session owns its own instance of each plugin (started on first use, restarted with
//! backoff after a crash and re-initialized with the client's cached `initialize` params), its
//! streams (the GET stream, number 0, and one per POST answered as SSE, kept until delivered
//! or abandoned so a client can resume them), and the map of requests its plugins sent to the
//! client. Messages a plugin sends on its own go on exactly one stream: the related request's
//! when that is certain, else the GET stream.
//!
//! A session never holds a lock across an await except the per-plugin start lock, which only
//! orders concurrent first uses of the same plugin in the same session.

mod log_level;
mod manager;
mod pools;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

pub(crate) use log_level::LOG_LEVELS;
pub use manager::{SessionManager, TooManySessions};
pub use pools::Pools;

use crate::backend::{BackendError, PluginConnection, PluginEvents, Related, start_plugin};
use crate::config::ProcessModel;
use crate::jsonrpc::{self, Id, Outcome};
use crate::registry::{PluginEntry, PluginInfo, Registry, Reservation, View, ViewPlugin};
use crate::stream::{
    Buffering, ByNumber, EventId, EventStore, SessionEvents, Sink, Stream, StreamHooks, StreamKey,
    StreamSettings,
};

/// Notifications about a plugin's lists and resources, not about any request: they go to
/// the GET stream (and, from a shared plugin, to every session). The three list changes
/// come first.
pub(crate) const LIST_CHANGES: [&str; 4] = [
    "notifications/tools/list_changed",
    "notifications/prompts/list_changed",
    "notifications/resources/list_changed",
    "notifications/resources/updated",
];

/// Longest wait for a starting instance to take the session's log level.
const SET_LEVEL_WAIT: Duration = Duration::from_secs(2);

/// Longest wait between restarts of a crashing plugin.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// What the client said in `initialize`, kept to initialize (and re-initialize) plugins.
pub struct ClientInit {
    pub version: &'static str,
    /// `initialize` params for plugins: the negotiated version, the client's capabilities and
    /// client info.
    pub plugin_params: Box<RawValue>,
    /// The token subject that opened the session (with authorization on): only it may use
    /// the session.
    pub owner: Option<String>,
    /// Whose session it is, for the per-client cap: the subject, or the client's address.
    pub client: Arc<str>,
}

/// Why a `Last-Event-ID` names no stream of this session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownStream {
    /// Its tag is another session's.
    OtherSession,
    /// The stream existed and was released (delivered, abandoned or evicted).
    Released,
    /// No such stream was ever opened.
    NeverIssued,
}

/// One plugin as seen by one session: its instance here, for one generation of its
/// definition.
pub struct PluginSlot {
    pub entry: Arc<PluginEntry>,
    pub info: Arc<PluginInfo>,
    running: Mutex<Option<Running>>,
    /// Held while starting, so concurrent first uses start one child.
    start_lock: tokio::sync::Mutex<()>,
    crashes: Mutex<Crashes>,
}

/// A running instance and its place under the limits (released when it is gone).
pub(crate) struct Running {
    pub(crate) conn: Arc<PluginConnection>,
    _reservation: Reservation,
}

/// The error for a request routed to a plugin definition that has since changed or gone.
pub(crate) fn changed(plugin: &ViewPlugin) -> BackendError {
    BackendError::Unavailable {
        plugin: plugin.name().to_owned(),
        reason: "it was changed or removed while the request was on its way; send it again".into(),
    }
}

/// Starts a process of `entry`, counted against the limits and refused while its breaker is
/// open; a failure counts towards the breaker, as `client`'s (whose `initialize` params
/// these are) or, with `None`, as a shared process's.
pub(crate) async fn start_running(
    registry: &Registry,
    entry: &PluginEntry,
    label: Arc<str>,
    params: &RawValue,
    client: Option<&Arc<str>>,
    events: Option<Weak<dyn PluginEvents>>,
) -> Result<Running, BackendError> {
    let unavailable = |reason: String| BackendError::Unavailable {
        plugin: entry.name().to_owned(),
        reason,
    };
    if let Some(open) = entry.stats.breaker_open() {
        return Err(unavailable(format!(
            "it keeps crashing; the gateway tries it again in {} s",
            open.as_secs() + 1
        )));
    }
    let reservation = registry.reserve(entry).map_err(unavailable)?;
    let conn = start_plugin(&entry.config, label, params, events).await.inspect_err(|e| {
        tracing::warn!(plugin = %entry.name(), "{e}");
        *entry.stats.last_error.lock().expect("stats lock") = Some(e.to_string());
        if entry.record_crash(client) {
            tracing::error!(plugin = %entry.name(), "plugin keeps failing: the circuit breaker is open");
        }
    })?;
    entry.record_start();
    Ok(Running {
        conn,
        _reservation: reservation,
    })
}

#[derive(Default)]
struct Crashes {
    count: u32,
    last: Option<Instant>,
}

impl PluginSlot {
    /// The running instance, if it is alive.
    pub fn current(&self) -> Option<Arc<PluginConnection>> {
        self.running
            .lock()
            .expect("slot lock")
            .as_ref()
            .filter(|r| r.conn.is_alive())
            .map(|r| r.conn.clone())
    }

    pub fn has_capability(&self, name: &str) -> bool {
        self.info
            .capabilities
            .get(name)
            .is_some_and(|c| !c.is_null())
    }

    /// Takes the instance out of the slot.
    fn take_running(&self) -> Option<Running> {
        self.running.lock().expect("slot lock").take()
    }

    fn count_crash(&self) {
        let mut c = self.crashes.lock().expect("crash lock");
        // A plugin that ran for a while before failing starts its backoff over.
        if c.last
            .is_some_and(|t| t.elapsed() > Duration::from_secs(60))
        {
            c.count = 0;
        }
        c.count += 1;
        c.last = Some(Instant::now());
    }

    fn backoff(&self) -> Option<Duration> {
        let c = self.crashes.lock().expect("crash lock");
        let last = c.last?;
        let wait =
            Duration::from_millis(100u64.saturating_mul(1 << c.count.min(10))).min(MAX_BACKOFF);
        // Jitter, so sessions whose instances crashed together do not restart together.
        let wait = wait.mul_f64(1.0 + rand::random::<f64>() * 0.5);
        wait.checked_sub(last.elapsed())
    }
}

pub struct Session {
    pub id: Arc<str>,
    pub version: &'static str,
    plugin_params: Box<RawValue>,
    /// The registry: which plugins exist now.
    pub registry: Arc<Registry>,
    /// Processes that are not this session's own: shared and warm ones.
    pools: Arc<Pools>,
    /// This session's instances, by plugin name.
    slots: Mutex<HashMap<String, Arc<PluginSlot>>>,
    last_active: Mutex<Instant>,
    /// Open connections (SSE responses and JSON waits): a session with any is not idle.
    pub connections: Arc<AtomicUsize>,
    /// The capabilities the client declared (`sampling`, `elicitation`, `roots`, ...).
    client_capabilities: HashSet<String>,
    /// The random tag in this session's event ids.
    pub tag: u32,
    /// The token subject that opened the session, if authorization is on.
    pub owner: Option<String>,
    /// Whose session it counts as (see [`ClientInit::client`]).
    pub client: Arc<str>,
    /// A request came after `initialize` (a notification alone does not count).
    used: AtomicBool,
    store: Arc<dyn EventStore>,
    /// This session's events in the store, shared by its streams.
    events: Arc<dyn SessionEvents>,
    /// What its buffered streams tell it, shared by them.
    hooks: Arc<dyn StreamHooks>,
    pub stream_settings: StreamSettings,
    /// Stream 0: server-initiated messages unrelated to a request. Kept for the session's
    /// life; what it holds while no GET connection is open waits for the next one.
    pub get: Arc<Stream>,
    /// Its buffered POST streams, live and lingering, under one lock: finishing a stream and
    /// releasing it touch both.
    streams: Mutex<StreamTable>,
    next_stream: AtomicU64,
    /// Requests plugins sent to the client, by the id the client sees: which plugin instance
    /// asked, and under which id.
    server_requests: Mutex<HashMap<u64, (Weak<PluginConnection>, Id)>>,
    next_server_request: AtomicU64,
    /// The client's last `logging/setLevel`: sent to plugins that start later, and enforced
    /// on their logs.
    log_level: log_level::LogLevel,
    /// Resource subscriptions by plugin name, replayed to a restarted plugin.
    subscriptions: Mutex<HashSet<(String, String)>>,
    /// Which plugin serves which resource URI, learned from list results.
    pub routes: Mutex<crate::router::ResourceRoutes>,
    /// Cancelled when the session ends: its streams close.
    pub closed: CancellationToken,
    me: Weak<Session>,
}

impl Session {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: Arc<str>,
        init: ClientInit,
        registry: Arc<Registry>,
        pools: Arc<Pools>,
        closed: CancellationToken,
        store: Arc<dyn EventStore>,
        stream_settings: StreamSettings,
    ) -> Arc<Session> {
        let tag = rand::random::<u32>();
        /// Only the names of the client's capabilities, the rest skipped unread.
        #[derive(serde::Deserialize)]
        struct Params {
            capabilities: HashMap<String, serde::de::IgnoredAny>,
        }
        let client_capabilities = serde_json::from_str::<Params>(init.plugin_params.get())
            .map(|p| p.capabilities.into_keys().collect())
            .unwrap_or_default();
        let events = store.session(&id);
        let get = Stream::new(
            StreamKey {
                session: id.clone(),
                stream: 0,
            },
            tag,
            true,
            if stream_settings.resumable {
                Buffering::Replay
            } else {
                Buffering::UntilDelivered
            },
            events.clone(),
            None,
            None,
        );
        Arc::new_cyclic(|me| Session {
            id,
            version: init.version,
            plugin_params: init.plugin_params,
            owner: init.owner,
            client: init.client,
            used: AtomicBool::new(false),
            registry,
            pools,
            slots: Mutex::new(HashMap::new()),
            last_active: Mutex::new(Instant::now()),
            connections: Arc::new(AtomicUsize::new(0)),
            client_capabilities,
            tag,
            store,
            events,
            hooks: Arc::new(SessionHooks(me.clone())),
            stream_settings,
            get,
            streams: Mutex::default(),
            next_stream: AtomicU64::new(1),
            server_requests: Mutex::new(HashMap::new()),
            next_server_request: AtomicU64::new(1),
            log_level: Default::default(),
            subscriptions: Mutex::new(HashSet::new()),
            routes: Mutex::new(Default::default()),
            closed,
            me: me.clone(),
        })
    }

    pub fn touch(&self) {
        *self.last_active.lock().expect("activity lock") = Instant::now();
    }

    /// A request (or a response to one of the session's requests) came, or a GET stream
    /// opened: the session is in use, and idles out on the idle timeout, not the unused one.
    pub fn mark_used(&self) {
        if !self.used.load(Ordering::Relaxed) {
            self.used.store(true, Ordering::Relaxed);
        }
    }

    pub fn is_used(&self) -> bool {
        self.used.load(Ordering::Relaxed)
    }

    /// Idle: no open stream and no request for `timeout`.
    pub fn is_idle(&self, timeout: Duration) -> bool {
        self.connections.load(Ordering::Relaxed) == 0
            && self.last_active.lock().expect("activity lock").elapsed() > timeout
    }

    /// The usable plugins now.
    pub fn view(&self) -> Arc<View> {
        self.registry.view()
    }

    /// This session's slot for a plugin of the view; a slot of an older definition is
    /// replaced (its instance stops in the background).
    fn slot(&self, plugin: &ViewPlugin) -> Arc<PluginSlot> {
        let mut slots = self.slots.lock().expect("slots lock");
        if let Some(s) = slots.get(plugin.name())
            && s.entry.generation == plugin.entry.generation
        {
            return s.clone();
        }
        let slot = Arc::new(PluginSlot {
            entry: plugin.entry.clone(),
            info: plugin.info.clone(),
            running: Mutex::new(None),
            start_lock: tokio::sync::Mutex::new(()),
            crashes: Mutex::new(Crashes::default()),
        });
        if let Some(old) = slots.insert(plugin.name().to_owned(), slot.clone()) {
            stop_slot(&old);
        }
        slot
    }

    /// The running instance of a plugin in this session, if any.
    pub fn current(&self, plugin: &str) -> Option<Arc<PluginConnection>> {
        self.slots
            .lock()
            .expect("slots lock")
            .get(plugin)
            .and_then(|s| s.current())
    }

    /// The session's running instance of a plugin, started (or restarted) if need be.
    pub async fn plugin(&self, plugin: &ViewPlugin) -> Result<Arc<PluginConnection>, BackendError> {
        if !self.registry.is_current(plugin) {
            return Err(changed(plugin));
        }
        if plugin.entry.config.process_model == ProcessModel::Shared {
            return self.pools.shared(plugin).await;
        }
        let s = self.slot(plugin);
        if let Some(c) = s.current() {
            return Ok(c);
        }
        let _starting = s.start_lock.lock().await;
        if let Some(c) = s.current() {
            return Ok(c);
        }
        if let Some(wait) = s.backoff() {
            tracing::info!(plugin = %s.entry.name(), session = %self.id, "restarting the plugin in {} ms", wait.as_millis());
            tokio::time::sleep(wait).await;
        }
        let gone = || BackendError::Unavailable {
            plugin: s.entry.name().to_owned(),
            reason: "the session has ended".into(),
        };
        if self.closed.is_cancelled() {
            return Err(gone());
        }
        let events: Weak<dyn PluginEvents> = self.me.clone();
        let running = match self.pools.take_warm(plugin) {
            // A warm instance: started and initialized ahead of demand, now this session's.
            Some(warm) if warm.conn.set_events(events.clone()) => warm,
            _ => start_running(
                &self.registry,
                &s.entry,
                self.id.clone(),
                &self.plugin_params,
                Some(&self.client),
                Some(events),
            )
            .await
            .inspect_err(|_| s.count_crash())?,
        };
        let conn = running.conn.clone();
        // The client's level reaches the plugin before any request does.
        self.replay_log_level(&s, &conn).await;
        let still_current = self
            .slots
            .lock()
            .expect("slots lock")
            .get(plugin.name())
            .is_some_and(|cur| Arc::ptr_eq(cur, &s));
        if !still_current {
            // The registry changed while the process started: it is not needed.
            running.conn.shutdown().await;
            return Err(changed(plugin));
        }
        *s.running.lock().expect("slot lock") = Some(running);
        if self.closed.is_cancelled() {
            // Ended while starting: the end did not see this instance.
            stop_slot(&s);
            return Err(gone());
        }
        self.replay_state(&s, &conn);
        Ok(conn)
    }

    /// Instances running now.
    pub fn running(&self) -> Vec<Arc<PluginConnection>> {
        self.slots
            .lock()
            .expect("slots lock")
            .values()
            .filter_map(|s| s.current())
            .collect()
    }

    /// The registry changed: instances of plugins that left the view, or whose definition
    /// changed, stop; the client is told its lists changed.
    pub fn registry_changed(&self, view: &View) {
        let stale: Vec<Arc<PluginSlot>> = {
            let mut slots = self.slots.lock().expect("slots lock");
            let names: Vec<String> = slots
                .iter()
                .filter(|(name, s)| {
                    view.find(name)
                        .is_none_or(|p| p.entry.generation != s.entry.generation)
                })
                .map(|(name, _)| name.clone())
                .collect();
            names.iter().filter_map(|n| slots.remove(n)).collect()
        };
        for s in &stale {
            stop_slot(s);
        }
        self.routes.lock().expect("routes lock").clear();
        for method in &LIST_CHANGES[..3] {
            let _ = self.deliver(
                jsonrpc::request_bytes(None, method, None),
                Related::None,
                false,
            );
        }
    }

    /// Stops instances unused for longer than their plugin's idle timeout (they start again
    /// on next use; this is not a crash).
    pub fn reap_idle_plugins(&self) {
        let idle: Vec<Arc<PluginSlot>> = self
            .slots
            .lock()
            .expect("slots lock")
            .values()
            .filter(|s| {
                s.entry.config.idle_timeout.is_some_and(|t| {
                    s.current()
                        .and_then(|c| c.idle_for())
                        .is_some_and(|d| d > t)
                })
            })
            .cloned()
            .collect();
        for s in idle {
            tracing::info!(plugin = %s.entry.name(), session = %self.id, "stopping an idle plugin process");
            stop_slot(&s);
        }
    }

    /// Tells a (re)started or warm instance the session's log level before anything else, and
    /// waits briefly for it to be taken, so it logs at that level from its first request even
    /// if it handles requests concurrently.
    async fn replay_log_level(&self, slot: &PluginSlot, conn: &PluginConnection) {
        let Some(level) = self.log_level.params() else {
            return;
        };
        if !slot.has_capability("logging") {
            return;
        }
        let call = conn.call("logging/setLevel", Some(&level));
        let wait = slot.entry.config.startup_timeout.min(SET_LEVEL_WAIT);
        match tokio::time::timeout(wait, call).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::debug!(plugin = %conn.name(), session = %self.id, "logging/setLevel: {e}")
            }
            Err(_) => {
                tracing::debug!(plugin = %conn.name(), session = %self.id, "logging/setLevel: no answer")
            }
        }
    }

    /// Brings a (re)started plugin up to what the client asked of the session (its log level
    /// is sent before, by [`Session::replay_log_level`]).
    fn replay_state(&self, slot: &PluginSlot, conn: &Arc<PluginConnection>) {
        let uris: Vec<String> = self
            .subscriptions
            .lock()
            .expect("subscriptions lock")
            .iter()
            .filter(|(p, _)| p == slot.entry.name())
            .map(|(_, u)| u.clone())
            .collect();
        for uri in uris {
            let c = conn.clone();
            let params = RawValue::from_string(serde_json::json!({ "uri": uri }).to_string())
                .expect("valid JSON");
            tokio::spawn(async move { c.call("resources/subscribe", Some(&params)).await });
        }
    }

    pub fn set_log_level(&self, params: Box<RawValue>) {
        self.log_level.set(params);
    }

    pub fn subscription(&self, plugin: &str, uri: &str, on: bool) {
        let mut subs = self.subscriptions.lock().expect("subscriptions lock");
        if on {
            subs.insert((plugin.to_owned(), uri.to_owned()));
        } else {
            subs.remove(&(plugin.to_owned(), uri.to_owned()));
        }
    }

    /// A new stream for a POST's answers: `owed` responses, SSE or JSON. An SSE stream is
    /// kept (for resumption) until its last event has gone out or it is abandoned.
    pub fn new_post_stream(&self, owed: usize, sse: bool) -> Arc<Stream> {
        let number = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let key = StreamKey {
            session: self.id.clone(),
            stream: number,
        };
        let buffered = sse && self.stream_settings.resumable;
        // Only a buffered stream is kept in `streams`, lingers and is released from there.
        let hooks = buffered.then(|| self.hooks.clone());
        let buffering = if buffered {
            Buffering::Replay
        } else {
            Buffering::None
        };
        let stream = Stream::new(
            key,
            self.tag,
            sse,
            buffering,
            self.events.clone(),
            Some(owed),
            hooks,
        );
        if buffered {
            let mut streams = self.streams.lock().expect("streams lock");
            // Checked under the lock `end` takes the map with: a stream is either in the map
            // `end` releases, or made after the end and released here.
            if self.closed.is_cancelled() {
                drop(streams);
                stream.release();
            } else {
                streams.live.get_or_insert(number, stream.clone());
            }
        }
        stream
    }

    /// Releases finished streams whose linger time is over. The linger is the same for all,
    /// so deadlines come in order: a queue, no timers. The session reaper calls it a few times
    /// a second, and a resume calls it before looking its stream up, so no client resumes a
    /// stream past its linger. A new stream does not call it: that would take the lock once
    /// more per request.
    pub fn sweep_finished(&self) {
        let now = Instant::now();
        let due: Vec<u64> = {
            let mut t = self.streams.lock().expect("streams lock");
            let mut due = Vec::new();
            while t.lingering.front().is_some_and(|(at, _)| *at <= now) {
                due.extend(t.lingering.pop_front().map(|(_, n)| n));
            }
            due
        };
        for n in due {
            self.release_lingering(n);
        }
    }

    /// Releases a finished stream whose linger is over.
    fn release_lingering(&self, n: u64) {
        let streams = self.streams.lock().expect("streams lock");
        self.release_lingering_locked(streams, n);
    }

    /// [`Session::release_lingering`] under a lock already taken.
    fn release_lingering_locked(&self, streams: MutexGuard<'_, StreamTable>, n: u64) {
        match streams.live.get(n).cloned() {
            // A stream someone resumed meanwhile is queued again when that connection ends.
            Some(s) => {
                drop(streams);
                s.release_if_detached();
            }
            // Under the lock, so a client resuming it now either finds it or is refused.
            None => self.events.release(n),
        }
    }

    /// The stream a `Last-Event-ID` names.
    pub fn stream_for(&self, id: &EventId) -> Result<Arc<Stream>, UnknownStream> {
        self.sweep_finished();
        if id.tag != self.tag {
            return Err(UnknownStream::OtherSession);
        }
        if id.stream == 0 {
            return Ok(self.get.clone());
        }
        let mut streams = self.streams.lock().expect("streams lock");
        if let Some(s) = streams.live.get(id.stream) {
            return Ok(s.clone());
        }
        if id.stream >= self.next_stream.load(Ordering::Relaxed) {
            return Err(UnknownStream::NeverIssued);
        }
        // A finished stream left memory when its last event went out; its events linger in
        // the store until released, and it is rebuilt from them for a client resuming it.
        let key = StreamKey {
            session: self.id.clone(),
            stream: id.stream,
        };
        match self.events.next_seq(id.stream) {
            Some(next) if !self.closed.is_cancelled() => {
                let hooks = Some(self.hooks.clone());
                let s = Stream::finished(key, self.tag, self.events.clone(), next, hooks);
                streams.live.get_or_insert(id.stream, s.clone());
                Ok(s)
            }
            _ => Err(UnknownStream::Released),
        }
    }

    /// Releases POST streams nobody came back for within `max_age` after their connection
    /// dropped.
    pub fn reap_streams(&self, max_age: Duration) {
        let abandoned: Vec<Arc<Stream>> = self
            .streams
            .lock()
            .expect("streams lock")
            .live
            .values()
            .filter(|s| s.abandoned_for(max_age))
            .cloned()
            .collect();
        for s in abandoned {
            tracing::debug!(session = %self.id, stream = s.number(), "releasing an abandoned stream");
            s.release();
        }
    }

    /// Sends a server-initiated message on exactly one stream: the related request's when it
    /// is certain, else the GET stream if a connection listens there, else (when the relation
    /// is a guess) the newest request stream. Failing these, a notification waits on the GET
    /// stream for its next connection, and a request is given back (`Err`): nobody may be
    /// there to answer it.
    pub fn deliver(&self, bytes: Bytes, related: Related, is_request: bool) -> Result<(), Bytes> {
        let (first, last_resort) = match related {
            Related::Named(s) | Related::Exact(s) => (Some(s), None),
            Related::Ambiguous(s) => (None, Some(s)),
            Related::None | Related::Unattributable => (None, None),
        };
        let get = Sink::new(self.get.clone());
        let live_get = self.get.has_connection().then_some(&get);
        let mut bytes = bytes;
        for sink in first.iter().chain(live_get).chain(last_resort.iter()) {
            match sink.message(bytes) {
                Ok(()) => return Ok(()),
                Err(b) => bytes = b,
            }
        }
        if is_request {
            return Err(bytes);
        }
        get.message(bytes).inspect_err(|_| {
            tracing::warn!(session = %self.id, "the GET stream is released: a notification was dropped");
        })
    }

    /// Routes a client's response to the plugin request it answers. False when the id names
    /// no request the gateway sent.
    pub fn client_response(&self, id: &Id, outcome: &Outcome) -> bool {
        let entry = id.as_u64().and_then(|n| {
            self.server_requests
                .lock()
                .expect("requests lock")
                .remove(&n)
        });
        let Some((conn, plugin_id)) = entry else {
            return false;
        };
        match conn.upgrade().filter(|c| c.is_alive()) {
            Some(conn) => conn.send_raw(match outcome {
                Outcome::Result(r) => jsonrpc::result_bytes(plugin_id.raw(), r),
                Outcome::Error(e) => jsonrpc::error_object_bytes(plugin_id.raw(), e),
            }),
            None => {
                tracing::debug!(session = %self.id, "answer for a plugin instance that has since exited; dropped")
            }
        }
        true
    }

    /// Cancels a client request in flight on any of this session's plugins (its own or
    /// shared).
    pub fn cancel(&self, id: &Id, reason: Option<&RawValue>) -> bool {
        self.running()
            .iter()
            .chain(self.pools.shared_conns().iter())
            .any(|c| c.cancel_client_request(&self.id, id, reason))
    }

    /// Ends the session: streams close, plugins stop (awaited).
    pub async fn end(&self) {
        self.closed.cancel();
        self.get.release();
        let streams = std::mem::take(&mut self.streams.lock().expect("streams lock").live);
        for s in streams.values() {
            s.release();
        }
        self.store.release_session(&self.id);
        let slots: Vec<Arc<PluginSlot>> = self
            .slots
            .lock()
            .expect("slots lock")
            .drain()
            .map(|(_, s)| s)
            .collect();
        let running: Vec<Running> = slots.iter().filter_map(|s| s.take_running()).collect();
        futures_util::future::join_all(running.iter().map(|r| r.conn.shutdown())).await;
        tracing::info!(session = %self.id, "session ended");
    }
}

/// A session's buffered POST streams.
#[derive(Default)]
struct StreamTable {
    /// Not yet finished or released, by number. A finished one lingers only as its events in
    /// the store.
    live: ByNumber<Arc<Stream>>,
    /// Finished streams waiting out their linger time, oldest first.
    lingering: VecDeque<(Instant, u64)>,
}

/// A stream's line back to its session, weak so a stream never keeps a session alive.
struct SessionHooks(Weak<Session>);

impl StreamHooks for SessionHooks {
    fn finished(&self, stream: u64, at: Instant) {
        if let Some(s) = self.0.upgrade() {
            // Its events linger in the store; the stream itself leaves memory now (a client
            // that resumes it gets it rebuilt), so finished streams cost no scans.
            let mut t = s.streams.lock().expect("streams lock");
            t.live.remove(stream);
            t.lingering
                .push_back((at + s.stream_settings.linger, stream));
            if t.lingering.len() > s.stream_settings.max_lingering
                && let Some((_, n)) = t.lingering.pop_front()
            {
                s.release_lingering_locked(t, n);
            }
        }
    }

    fn read(&self, stream: u64) {
        if let Some(s) = self.0.upgrade() {
            // Its queue entry is among the last (streams finish about in the order they are
            // read); one not found near the end is released again when it comes up, harmlessly.
            let mut t = s.streams.lock().expect("streams lock");
            let len = t.lingering.len();
            if let Some(back) = t
                .lingering
                .iter()
                .rev()
                .take(64)
                .position(|(_, n)| *n == stream)
            {
                t.lingering.remove(len - 1 - back);
            }
            s.release_lingering_locked(t, stream);
        }
    }

    fn released(&self, stream: u64) {
        if let Some(s) = self.0.upgrade() {
            s.streams.lock().expect("streams lock").live.remove(stream);
        }
    }
}

impl PluginEvents for Session {
    fn plugin_request(
        &self,
        conn: &Arc<PluginConnection>,
        id: Id,
        method: &str,
        params: Option<&RawValue>,
        related: Related,
    ) {
        let needs = match method {
            "sampling/createMessage" => Some("sampling"),
            "elicitation/create" => Some("elicitation"),
            "roots/list" => Some("roots"),
            _ => None,
        };
        if let Some(cap) = needs.filter(|c| !self.client_capabilities.contains(*c)) {
            tracing::info!(plugin = %conn.name(), session = %self.id, "{method} refused: the client did not declare the `{cap}` capability");
            conn.send_raw(jsonrpc::error_bytes(
                Some(&id),
                jsonrpc::code::METHOD_NOT_FOUND,
                &format!("the client did not declare the `{cap}` capability"),
            ));
            return;
        }
        let n = self.next_server_request.fetch_add(1, Ordering::Relaxed);
        self.server_requests
            .lock()
            .expect("requests lock")
            .insert(n, (Arc::downgrade(conn), id));
        let bytes = jsonrpc::request_bytes(Some(Id::from_u64(n).raw()), method, params);
        if self.deliver(bytes, related, true).is_err() {
            let (_, plugin_id) = self
                .server_requests
                .lock()
                .expect("requests lock")
                .remove(&n)
                .expect("just inserted");
            tracing::warn!(plugin = %conn.name(), session = %self.id, "{method}: no client stream open to carry it; refused");
            conn.send_raw(jsonrpc::error_bytes(
                Some(&plugin_id),
                jsonrpc::code::INTERNAL_ERROR,
                &format!("{method} cannot reach the client: it has no open stream (a GET stream, or a request answered as SSE)"),
            ));
        }
    }

    fn plugin_notification(
        &self,
        conn: &Arc<PluginConnection>,
        message: Bytes,
        method: &str,
        related: Related,
    ) {
        if method == "notifications/message" && !self.log_level.allows(&message) {
            return;
        }
        match method {
            // Unrelated to any request: the GET stream.
            m if LIST_CHANGES.contains(&m) => {
                if method == "notifications/resources/list_changed" {
                    self.routes.lock().expect("routes lock").clear();
                }
                let _ = self.deliver(message, Related::None, false);
            }
            "notifications/cancelled" => {
                if let Some(bytes) = self.map_plugin_cancel(conn, &message) {
                    let _ = self.deliver(bytes, related, false);
                }
            }
            _ => {
                let _ = self.deliver(message, related, false);
            }
        }
    }

    fn plugin_exited(&self, conn: &Arc<PluginConnection>) {
        let slot = self
            .slots
            .lock()
            .expect("slots lock")
            .values()
            .find(|s| {
                s.running
                    .lock()
                    .expect("slot lock")
                    .as_ref()
                    .is_some_and(|r| Arc::ptr_eq(&r.conn, conn))
            })
            .cloned();
        if let Some(slot) = slot {
            slot.take_running();
            if !self.closed.is_cancelled() && !conn.is_stopping() {
                let report = conn.exit_report();
                tracing::warn!(plugin = %conn.name(), session = %self.id, "{report}; it restarts on the next request");
                *slot.entry.stats.last_error.lock().expect("stats lock") = Some(report);
                slot.count_crash();
                if slot.entry.record_crash(Some(&self.client)) {
                    tracing::error!(plugin = %conn.name(), "plugin keeps crashing: the circuit breaker is open");
                }
            }
        }
    }
}

/// Stops a slot's instance in the background; it counts against the limits until gone.
fn stop_slot(slot: &PluginSlot) {
    if let Some(running) = slot.take_running() {
        tokio::spawn(async move { running.conn.shutdown().await });
    }
}

impl Session {
    /// A plugin cancelling one of its own requests to the client: the request id becomes the
    /// one the client saw.
    fn map_plugin_cancel(&self, conn: &Arc<PluginConnection>, message: &[u8]) -> Option<Bytes> {
        let mut value: serde_json::Value = serde_json::from_slice(message).ok()?;
        let plugin_id = value.get("params")?.get("requestId")?.to_string();
        let n = {
            let mut requests = self.server_requests.lock().expect("requests lock");
            let n = *requests
                .iter()
                .find(|(_, (c, id))| {
                    c.as_ptr() == Arc::as_ptr(conn) && id.raw().get() == plugin_id
                })?
                .0;
            requests.remove(&n);
            n
        };
        value["params"]["requestId"] = n.into();
        Some(Bytes::from(value.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::stream::{Cursor, MemoryEventStore, ReplayLimits, collect_responses};

    fn session(store: Arc<MemoryEventStore>) -> Arc<Session> {
        let registry = Registry::with_overlay(
            &crate::config::Config::with_plugins(Vec::new()),
            Arc::new(crate::registry::store::MemoryPluginStore::default()),
            &Default::default(),
        );
        let settings = StreamSettings {
            keep_alive: Duration::from_secs(15),
            resumable: true,
            retry: Duration::from_secs(1),
            poll_after: None,
            linger: Duration::from_secs(5),
            hold: Duration::ZERO,
            max_lingering: 2,
        };
        Session::new(
            Arc::from("session-1"),
            ClientInit {
                version: "2025-11-25",
                plugin_params: RawValue::from_string("{}".into()).unwrap(),
                owner: None,
                client: Arc::from("test"),
            },
            registry.clone(),
            Pools::new(registry, Weak::new()),
            CancellationToken::new(),
            store,
            settings,
        )
    }

    proptest! {
        #[test]
        fn only_this_sessions_own_streams_resolve(tag in any::<u32>(), stream in 0u64..6, seq in any::<u64>()) {
            let s = session(Arc::new(MemoryEventStore::new(ReplayLimits::default())));
            let open: Vec<u64> = (0..3).map(|_| s.new_post_stream(1, true).number()).collect();
            let id = EventId { tag, stream, seq, prime: None };
            let theirs = EventId { tag: s.tag, ..id };
            prop_assert_eq!(s.stream_for(&id).is_ok(), tag == s.tag && (stream == 0 || open.contains(&stream)));
            match s.stream_for(&theirs) {
                Ok(found) => prop_assert_eq!(found.number(), stream),
                Err(e) => prop_assert_eq!(e, UnknownStream::NeverIssued),
            }
        }
    }

    #[tokio::test]
    async fn past_the_cap_the_oldest_finished_stream_is_released_at_once() {
        let store = Arc::new(MemoryEventStore::new(ReplayLimits::default()));
        let s = session(store.clone());
        let mut numbers = Vec::new();
        for _ in 0..3 {
            let stream = s.new_post_stream(1, true);
            numbers.push(stream.number());
            let attached = stream.attach(Cursor::Start, None).await.unwrap();
            Sink::new(stream).respond(Bytes::from_static(b"answer"));
            let got = collect_responses(attached, &CancellationToken::new()).await;
            assert_eq!(got, vec![Bytes::from_static(b"answer")]);
        }
        let id = |stream| EventId {
            tag: s.tag,
            stream,
            seq: 0,
            prime: None,
        };
        assert_eq!(
            s.stream_for(&id(numbers[0])).err(),
            Some(UnknownStream::Released),
            "the oldest of three went past the cap of two"
        );
        for n in &numbers[1..] {
            assert!(s.stream_for(&id(*n)).is_ok(), "stream {n} still lingers");
        }
        assert_eq!(store.usage().0, 2);
    }

    #[tokio::test]
    async fn a_sessions_buffers_go_with_it() {
        let store = Arc::new(MemoryEventStore::new(ReplayLimits::default()));
        let s = session(store.clone());
        let post = Sink::new(s.new_post_stream(2, true));
        post.message(Bytes::from_static(b"one")).unwrap();
        post.respond(Bytes::from_static(b"two"));
        s.deliver(
            Bytes::from_static(b"for the GET stream"),
            Related::None,
            false,
        )
        .unwrap();
        assert_eq!(store.usage().0, 3);
        s.end().await;
        assert_eq!(store.usage(), (0, 0));
        assert!(post.message(Bytes::from_static(b"late")).is_err());
    }
}
