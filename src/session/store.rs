//! The session record and the seam it is kept behind ([`SessionStore`]).
//!
//! A record is what another process would need to take a session over: its id, the version
//! negotiated, the `initialize` params its plugin instances are given (an instance can be
//! initialized again from them), the token subject that owns it, and when it was created and
//! last used. The live session (its streams, its plugin instances) is never in the store.
//!
//! The session manager writes a record once, when `initialize` creates the session, and
//! removes it when the session ends (DELETE, idleness, shutdown); nothing on a request's way
//! touches the store. A gateway on its own keeps no records (its live sessions are all there
//! is to know); the cluster mode gives the manager a store the replicas share, in Redis.
//! [`MemorySessionStore`] is the in-process implementation of the seam, what its tests and a
//! store's callers are checked against.
//!
//! The methods return boxed futures (no `async-trait`): a networked store needs them. The
//! in-memory one does its work before returning, so the manager's calls complete at once, in
//! the order they were made, and nothing is spawned. A store whose calls finish later is run
//! in the background; it must itself keep one session's calls in order (a put, then its
//! remove).

mod memory;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

use serde_json::value::RawValue;

pub use memory::MemorySessionStore;

/// What a store's call resolves to.
pub type StoreFuture<'a, T> =
    Pin<Box<dyn Future<Output = Result<T, SessionStoreError>> + Send + 'a>>;

/// Why a store could not do what it was asked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SessionStoreError {
    /// The store could not be reached or refused the call; the text is for the logs.
    #[error("the session store is unavailable: {0}")]
    Unavailable(String),
}

/// One session as the store keeps it.
#[derive(Debug, Clone)]
pub struct SessionRecord {
    /// The `Mcp-Session-Id`.
    pub id: Arc<str>,
    /// The protocol version negotiated in `initialize` (one of [`crate::protocol`]'s).
    pub version: &'static str,
    /// The `initialize` params the session's plugin instances are initialized with (the
    /// negotiated version, the client's capabilities and client info, as
    /// [`crate::protocol::read_initialize`] accepted them): an instance can be initialized
    /// from them wherever the session is served. Only what the gateway read is kept, not
    /// whatever else a client put in its `initialize`, and it is shared with the live session.
    pub init_params: Arc<RawValue>,
    /// The token subject that opened the session, if authorization is on: only it may use
    /// the session.
    pub owner: Option<String>,
    pub created: SystemTime,
    /// When the session was last used, as far as the store was told.
    pub last_used: SystemTime,
    /// The random tag in the session's event ids: kept, so ids a client holds stay valid
    /// wherever the session is served next.
    pub tag: u32,
    /// How many times the session was taken over: a replica that adopts it numbers its new
    /// streams from `generation << 32`, so no stream number is issued twice.
    pub generation: u32,
    /// What the client asked of the session since, resent to plugin instances that start
    /// wherever the session goes.
    pub state: SessionState,
}

/// What a client asked of its session after `initialize`, kept with the record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionState {
    /// Counts the changes: a store keeps a state only over an older one, so two saves that
    /// arrive out of order leave the newer.
    pub seq: u64,
    /// The params of the client's last `logging/setLevel`, as JSON text.
    pub log_level: Option<String>,
    /// Resource subscriptions: (plugin, URI).
    pub subscriptions: Vec<(String, String)>,
}

/// What [`SessionStore::touch`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Touched {
    /// The record is there, this process's, and kept longer.
    Kept,
    /// There is no record: the session ended elsewhere, expired, or the store lost it.
    Missing,
    /// Another process took the session over (cluster mode): this one must let it go.
    Taken,
}

/// Where session records are kept (see the module's doc).
pub trait SessionStore: Send + Sync + 'static {
    /// Keeps a record, replacing any with the same id.
    fn put(&self, record: SessionRecord) -> StoreFuture<'_, ()>;
    /// The record of a session, if the store has it.
    fn get<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<SessionRecord>>;
    /// Records that a session was used at `at`; nothing if the store has no such session.
    /// The manager does not call it per request: in this process the live session's own
    /// idle clock decides when it ends. It is for a store several replicas share, whose
    /// cadence the cluster mode decides (the reaper's period, not a request's).
    fn touch<'a>(&'a self, id: &'a str, at: SystemTime) -> StoreFuture<'a, Touched>;
    /// Keeps a session's state with its record, unless the record is gone or holds a newer
    /// one (a higher `seq`).
    fn save_state<'a>(&'a self, id: &'a str, state: SessionState) -> StoreFuture<'a, ()>;
    /// Forgets a session; nothing if the store has no such session.
    fn remove<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()>;
}
