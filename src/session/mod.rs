//! Legacy-era sessions: one per `initialize`, named by `Mcp-Session-Id`.
//!
//! A session owns its own instance of each plugin, its streams, and the map of requests its
//! plugins sent to the client; this file holds the [`Session`] type and its lifetime (made by
//! the [`SessionManager`], used, idle, ended). The rest is by job:
//!
//! - `plugins.rs`: the session's plugin slots: an instance on first use, asked of the
//!   [`crate::supervisor`] (which starts, restarts with backoff, breaks circuits and keeps the
//!   pools), stopped when the registry changes or the instance idles; what the client asked
//!   of the session (log level, subscriptions) replayed to a new instance.
//! - `streams.rs`: the stream table: the GET stream (number 0) and one per POST answered as
//!   SSE, kept until delivered or abandoned so a client can resume them.
//! - `relay.rs`: what plugins send on their own (notifications, requests to the client), each
//!   on exactly one stream: the related request's when that is certain, else the GET stream;
//!   and the client's answers back to the plugin that asked.
//! - `modern_plugins.rs`: requests to plugins of the modern era (2026-07-28): the `_meta` they
//!   carry, and their `InputRequiredResult`s asked of a legacy client as requests on its
//!   streams, the answers sent back as the retry.
//! - `bridge.rs` and `parked.rs`: a caller's session (a modern client's): a plugin's request
//!   to the client answered as an `InputRequiredResult`, the call parked until the client's
//!   retry brings the answers (multi round-trip requests).
//! - [`routes`]: which plugin serves which resource URI for this session.
//! - [`tasks`]: the tasks the client created on its plugins, under ids of the gateway's own;
//!   [`task_status`]: a modern caller's task as the tasks extension shows it, and its
//!   notifications to the caller's listeners.
//! - [`capabilities`]: what the client declared it can do, checked before a plugin's request
//!   reaches it.
//! - `listen.rs`: a modern caller's `subscriptions/listen` streams and what they hear;
//!   `holds.rs`: resource subscriptions counted across holders (listeners, and sessions on a
//!   shared plugin); `request_logs.rs`: a modern request's log messages, at its own level.
//! - [`store`]: the session record behind the [`SessionStore`] seam.
//! - `manager.rs` ([`SessionManager`]): all sessions: creation under caps, lookup, ending, the reaper.
//!
//! A session never holds a lock across an await except a slot's start lock, which only
//! orders concurrent first uses of the same plugin in the same session.

mod adopt;
mod bridge;
mod bridged_call;
mod callers;
pub mod capabilities;
mod connect;
mod holds;
mod listen;
mod log_level;
mod manager;
mod modern_plugins;
mod parked;
mod plugins;
mod relay;
mod request_logs;
pub mod routes;
pub mod store;
mod streams;
pub mod task_status;
pub mod tasks;
pub mod tool_headers;

use std::collections::{HashMap, HashSet};
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

pub use adopt::IN_FLIGHT_LOST;
pub use bridge::{Binding, Exchange, Resume, Seed};
pub use capabilities::ClientCapabilities;
pub use connect::Connected;
pub use holds::Hold;
pub use listen::{
    LISTEN_QUEUE_BYTES, ListenFilter, ListenSlot, Listener, SUBSCRIPTION_ID, TooManyListeners,
    tagged,
};
pub(crate) use log_level::LOG_LEVELS;
pub use manager::{AdoptError, SessionManager, TooManySessions};
pub use parked::{ParkLimits, ParkRefused, ParkedCalls, ResumeRefused};
pub use routes::ResourceRoutes;
pub use store::{
    MemorySessionStore, SessionRecord, SessionState, SessionStore, SessionStoreError, Touched,
};
pub use streams::UnknownStream;
use streams::{SessionHooks, StreamTable};

use crate::backend::PluginConnection;
use crate::backend::connection::Caller;
use crate::jsonrpc::Id;
use crate::registry::{Registry, View};
use crate::stream::{
    Buffering, EventStore, SessionEvents, Stream, StreamHooks, StreamKey, StreamSettings,
};
use crate::supervisor::{Slot, Supervisor};

/// Hands out each session's [`Caller`] key: unique in this process.
static NEXT_CALLER: AtomicU64 = AtomicU64::new(1);

/// What the client said in `initialize`, kept to initialize (and re-initialize) plugins.
pub struct ClientInit {
    pub version: &'static str,
    /// `initialize` params for plugins: the negotiated version, the client's capabilities and
    /// client info. Shared with the session's record ([`SessionRecord::init_params`]), so a
    /// session holds them once.
    pub plugin_params: Arc<RawValue>,
    /// The token subject that opened the session (with authorization on): only it may use
    /// the session.
    pub owner: Option<String>,
    /// Whose session it is, for the per-client cap: the subject, or the client's address.
    pub client: Arc<str>,
}

/// A part of a session that most sessions never use (a map that stays empty): made on first
/// use, so that a session holds one word for it until then instead of the empty value (an
/// empty `HashMap` behind a lock is 56 bytes). An idle session with its GET stream was 1.4 KB
/// of which two thirds were such parts.
pub struct Lazy<T>(OnceLock<Box<T>>);

impl<T> Default for Lazy<T> {
    fn default() -> Self {
        Lazy(OnceLock::new())
    }
}

impl<T> Lazy<T> {
    /// Made already, holding `value`.
    fn with(value: T) -> Lazy<T> {
        Lazy(OnceLock::from(Box::new(value)))
    }

    /// The value, if it was ever used (named so as not to hide a `get` of the value's own).
    pub fn if_made(&self) -> Option<&T> {
        self.0.get().map(|b| &**b)
    }
}

impl<T: Default> Deref for Lazy<T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.0.get_or_init(Box::default)
    }
}

/// Requests plugins sent to a session's client, by the id the client sees.
type ServerRequests = HashMap<u64, (Weak<PluginConnection>, Id)>;

/// One legacy-era session (see the module's doc).
pub struct Session {
    pub id: Arc<str>,
    pub version: &'static str,
    /// What its plugin instances are initialized with (see [`ClientInit::plugin_params`]).
    plugin_params: Arc<RawValue>,
    /// The registry: which plugins exist now.
    pub registry: Arc<Registry>,
    /// Where its instances come from: started, restarted, or taken from a warm pool; and the
    /// shared processes.
    supervisor: Arc<Supervisor>,
    /// This session's instances, by plugin name.
    slots: Lazy<Mutex<HashMap<String, Arc<Slot>>>>,
    /// The key its requests are forwarded under: a plugin connection compares it to tell
    /// sessions apart, and never sees the session. See [`Session::request_caller`].
    caller: Caller,
    /// A modern session of clients without a token (`callers.rs`): its requests may be
    /// different clients', so none of them is taken for another's.
    anonymous: bool,
    last_active: Mutex<Instant>,
    /// Open connections (SSE responses and JSON waits): a session with any is not idle.
    pub connections: Arc<AtomicUsize>,
    /// The capabilities the client declared (`sampling`, `elicitation`, `roots`, ...).
    client_capabilities: ClientCapabilities,
    /// The tasks its client created on its plugins.
    pub tasks: Lazy<tasks::Tasks>,
    /// The random tag in this session's event ids.
    pub tag: u32,
    /// The token subject that opened the session, if authorization is on.
    pub owner: Option<String>,
    /// Whose session it counts as (see [`ClientInit::client`]).
    pub client: Arc<str>,
    /// The client's `clientInfo`, as `name version` (none for a modern caller's session).
    pub client_label: Option<Arc<str>>,
    /// When the session began here.
    pub started: std::time::SystemTime,
    /// A request came after `initialize` (a notification alone does not count).
    used: AtomicBool,
    store: Arc<dyn EventStore>,
    /// This session's events in the store, shared by its streams.
    events: Arc<dyn SessionEvents>,
    /// What its buffered streams tell it, shared by them.
    hooks: Arc<dyn StreamHooks>,
    /// The gateway's, shared by its sessions (a caller's session has its own).
    pub stream_settings: Arc<StreamSettings>,
    /// Stream 0: server-initiated messages unrelated to a request. Kept for the session's
    /// life; what it holds while no GET connection is open waits for the next one.
    pub get: Arc<Stream>,
    /// Its buffered POST streams, live and lingering, under one lock: finishing a stream and
    /// releasing it touch both.
    streams: Mutex<StreamTable>,
    next_stream: AtomicU64,
    /// Requests plugins sent to the client, by the id the client sees: which plugin instance
    /// asked, and under which id.
    server_requests: Lazy<Mutex<ServerRequests>>,
    next_server_request: AtomicU64,
    /// Input a modern plugin asked for, as requests the client was sent (numbered from the
    /// same counter): which round of which parked call each answers.
    input_requests: Lazy<Mutex<HashMap<u64, modern_plugins::Asked>>>,
    /// Requests the gateway itself sent the client (numbered from the same counter): where
    /// each answer goes (`connect.rs`).
    own_requests: Lazy<Mutex<connect::OwnRequests>>,
    /// The caller's latest bearer token (mode `external` only), for a `token_exchange`
    /// credential to exchange when an instance starts. Memory only.
    subject_token: Lazy<Mutex<Option<crate::auth::Bearer>>>,
    /// `connect = "eager"` plugins' credentials were asked for (`connect.rs`).
    eager_asked: AtomicBool,
    /// The streams of its bridged calls (a caller's session): the only ones a plugin's
    /// request to the client may go to (`bridge.rs`).
    bridged: Lazy<Mutex<foldhash::HashSet<u64>>>,
    /// Calls that would be bridged should their plugin ask the client for input, by their
    /// client's stream (`bridge.rs`).
    seeds: Lazy<Mutex<foldhash::HashMap<u64, bridge::Seed>>>,
    /// The client's last `logging/setLevel`: sent to plugins that start later, and enforced
    /// on their logs.
    log_level: log_level::LogLevel,
    /// Resource subscriptions by plugin name, replayed to a restarted plugin.
    subscriptions: Lazy<Mutex<HashSet<(String, String)>>>,
    /// Which plugin serves which resource URI, learned from list results.
    pub routes: Lazy<Mutex<ResourceRoutes>>,
    /// The header-mapped parameters of its plugins' tools, learned from their lists for a
    /// modern `tools/call` (`tool_headers.rs`).
    pub tool_headers: Lazy<Mutex<tool_headers::ToolHeaders>>,
    /// A modern caller's listen streams (`listen.rs`).
    listeners: Lazy<listen::Hub>,
    /// What its listeners hold on its own plugin instances, by plugin (`holds.rs`).
    own_holds: Lazy<Mutex<HashMap<String, Arc<crate::supervisor::subscriptions::Subscriptions>>>>,
    /// What its legacy client holds on shared plugins: (plugin, URI) (`holds.rs`).
    shared_holds: Lazy<Mutex<HashSet<(String, String)>>>,
    /// The log levels of a modern caller's requests in flight (`request_logs.rs`).
    request_logs: Lazy<request_logs::RequestLogs>,
    /// Cancelled when the session ends: its streams close.
    pub closed: CancellationToken,
    /// A modern client's caller's session: what would go on its GET stream is dropped.
    pub for_caller: bool,
    /// Times the session was taken over by another replica (cluster mode): its streams are
    /// numbered from `generation << 32`.
    pub generation: u32,
    /// Where its record is kept for other replicas, if anywhere: its state is saved there.
    records: Option<Arc<dyn SessionStore>>,
    /// Counts changes of its state (log level, subscriptions).
    state_seq: AtomicU64,
    /// Its record is in `records` (written, or taken over): only then is a record found
    /// missing a session gone.
    pub recorded: AtomicBool,
    /// A save of its state to `records` is under way; `state_dirty`: another change came.
    state_saving: AtomicBool,
    state_dirty: AtomicBool,
    me: Weak<Session>,
}

/// `initialize` params' `clientInfo` as a label.
fn client_info(params: &RawValue) -> Option<Arc<str>> {
    #[derive(serde::Deserialize)]
    struct Init<'a> {
        #[serde(borrow, rename = "clientInfo")]
        client_info: Option<&'a RawValue>,
    }
    let init: Init = serde_json::from_str(params.get()).ok()?;
    crate::protocol::client_label(init.client_info?).map(Arc::from)
}

/// Where a session comes from: a client's `initialize` here, or another replica, from its
/// record (cluster mode).
pub enum Origin<'a> {
    New,
    Adopted(&'a SessionRecord),
    /// A modern client's caller's session (`callers.rs`): no GET stream to hold messages for.
    Caller,
}

impl Session {
    /// The key a request of this session is forwarded under. A plugin's request to the
    /// client goes to the client request it relates to only when every request in flight at
    /// that instance has the same key, and is refused to the plugin otherwise. So in a
    /// session of clients without a token, where two requests may be two clients', each
    /// request has a key of its own: a question reaches the request that caused it, or
    /// nobody.
    pub fn request_caller(&self) -> Caller {
        if self.anonymous {
            self.caller
                .alone(NEXT_CALLER.fetch_add(1, Ordering::Relaxed))
        } else {
            self.caller
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: Arc<str>,
        init: ClientInit,
        origin: Origin<'_>,
        supervisor: Arc<Supervisor>,
        closed: CancellationToken,
        store: Arc<dyn EventStore>,
        records: Option<Arc<dyn SessionStore>>,
        stream_settings: Arc<StreamSettings>,
    ) -> Arc<Session> {
        let caller = matches!(origin, Origin::Caller);
        let (tag, generation, state) = match origin {
            Origin::New | Origin::Caller => (rand::random::<u32>(), 0, SessionState::default()),
            Origin::Adopted(r) => (r.tag, r.generation, r.state.clone()),
        };
        let log_level = log_level::LogLevel::default();
        if let Some(params) = state.log_level.and_then(|l| RawValue::from_string(l).ok()) {
            log_level.set(params);
        }
        let client_capabilities = ClientCapabilities::parse(&init.plugin_params, init.version);
        let events = store.session(&id);
        let get = Stream::new(
            StreamKey {
                session: id.clone(),
                stream: 0,
            },
            tag,
            true,
            if caller {
                Buffering::None
            } else if stream_settings.resumable {
                Buffering::Replay
            } else {
                Buffering::UntilDelivered
            },
            events.clone(),
            None,
            None,
        );
        let client_label = if caller {
            None
        } else {
            client_info(&init.plugin_params)
        };
        let anonymous = matches!(origin, Origin::Caller) && init.owner.is_none();
        Arc::new_cyclic(|me| Session {
            id,
            client_label,
            started: std::time::SystemTime::now(),
            version: init.version,
            plugin_params: init.plugin_params,
            owner: init.owner,
            client: init.client,
            used: AtomicBool::new(false),
            registry: supervisor.registry().clone(),
            supervisor,
            slots: Lazy::default(),
            caller: Caller::new(NEXT_CALLER.fetch_add(1, Ordering::Relaxed)),
            anonymous,
            last_active: Mutex::new(Instant::now()),
            connections: Arc::new(AtomicUsize::new(0)),
            client_capabilities,
            tasks: Lazy::default(),
            tag,
            store,
            events,
            hooks: Arc::new(SessionHooks(me.clone())),
            stream_settings,
            get,
            streams: Mutex::default(),
            next_stream: AtomicU64::new((u64::from(generation) << 32) | 1),
            server_requests: Lazy::default(),
            next_server_request: AtomicU64::new(1),
            input_requests: Lazy::default(),
            own_requests: Lazy::default(),
            subject_token: Lazy::default(),
            eager_asked: AtomicBool::new(false),
            bridged: Lazy::default(),
            seeds: Lazy::default(),
            log_level,
            subscriptions: if state.subscriptions.is_empty() {
                Lazy::default()
            } else {
                Lazy::with(Mutex::new(state.subscriptions.into_iter().collect()))
            },
            routes: Lazy::default(),
            tool_headers: Lazy::default(),
            listeners: Lazy::default(),
            own_holds: Lazy::default(),
            shared_holds: Lazy::default(),
            request_logs: Lazy::default(),
            closed,
            for_caller: caller,
            generation,
            records,
            state_seq: AtomicU64::new(state.seq),
            recorded: AtomicBool::new(false),
            state_saving: AtomicBool::new(false),
            state_dirty: AtomicBool::new(false),
            me: me.clone(),
        })
    }

    /// The session's record as a store keeps it, `now`.
    pub fn record(&self, now: std::time::SystemTime) -> SessionRecord {
        SessionRecord {
            id: self.id.clone(),
            version: self.version,
            init_params: self.plugin_params.clone(),
            owner: self.owner.clone(),
            created: now,
            last_used: now,
            tag: self.tag,
            generation: self.generation,
            state: self.state(),
        }
    }

    /// What the client asked of the session since `initialize`.
    fn state(&self) -> SessionState {
        let mut subscriptions: Vec<(String, String)> = self
            .subscriptions
            .if_made()
            .map(|s| {
                s.lock()
                    .expect("subscriptions lock")
                    .iter()
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        subscriptions.sort_unstable();
        SessionState {
            seq: self.state_seq.load(Ordering::Acquire),
            log_level: self.log_level.params().map(|p| p.get().to_owned()),
            subscriptions,
        }
    }

    /// Saves the session's state with its record, in the background: one save at a time per
    /// session, the last state always saved, so a client changing it fast costs no more than
    /// one task and a round trip at a time.
    fn save_state(&self) {
        let Some(records) = self.records.clone() else {
            return;
        };
        self.state_seq.fetch_add(1, Ordering::AcqRel);
        self.state_dirty.store(true, Ordering::Release);
        if self.state_saving.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(me) = self.me.upgrade() else { return };
        tokio::spawn(async move {
            loop {
                me.state_dirty.store(false, Ordering::Release);
                if let Err(e) = records.save_state(&me.id, me.state()).await {
                    tracing::warn!(session = %me.id, "saving the session's state: {e}");
                }
                if me.state_dirty.load(Ordering::Acquire) {
                    continue;
                }
                me.state_saving.store(false, Ordering::Release);
                // A change that came just now, whose caller saw this save still running.
                if !me.state_dirty.load(Ordering::Acquire)
                    || me.state_saving.swap(true, Ordering::AcqRel)
                {
                    break;
                }
            }
        });
    }

    /// What the client declared it can do.
    pub fn client_capabilities(&self) -> &ClientCapabilities {
        &self.client_capabilities
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

    /// Ends the session: streams close, plugins stop (awaited).
    pub async fn end(&self) {
        self.close(false).await;
        tracing::info!(session = %self.id, "session ended");
    }

    /// Lets the session go from this replica without ending it: its streams close here and
    /// its plugins stop, but what a shared store keeps of it stays for the replica that
    /// serves it next (a drain's hand-over, or another replica took it over).
    pub async fn leave(&self) {
        self.close(true).await;
        tracing::info!(session = %self.id, "session left to another replica");
    }

    async fn close(&self, leaving: bool) {
        self.closed.cancel();
        self.remove_listeners();
        self.release_shared_subscriptions();
        if leaving {
            // The store forgets first, so the releases below touch nothing shared.
            self.store.leave_session(&self.id);
        }
        self.get.release();
        let streams = std::mem::take(&mut self.streams.lock().expect("streams lock").live);
        for s in streams.values() {
            s.release();
        }
        if !leaving {
            self.store.release_session(&self.id);
        }
        let slots: Vec<Arc<Slot>> = match self.slots.if_made() {
            Some(slots) => slots
                .lock()
                .expect("slots lock")
                .drain()
                .map(|(_, s)| s)
                .collect(),
            None => Vec::new(),
        };
        futures_util::future::join_all(slots.iter().map(|s| s.shutdown())).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use bytes::Bytes;

    use super::*;
    use crate::backend::Related;
    use crate::stream::{Cursor, EventId, MemoryEventStore, ReplayLimits, Sink, collect_responses};

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
                plugin_params: RawValue::from_string("{}".into()).unwrap().into(),
                owner: None,
                client: Arc::from("test"),
            },
            Origin::New,
            Supervisor::new(registry, None),
            CancellationToken::new(),
            store,
            None,
            Arc::new(settings),
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
