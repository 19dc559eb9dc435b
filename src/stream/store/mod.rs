//! Replay storage for SSE streams, behind [`EventStore`].
//!
//! Appends are synchronous and never fail: the stream that owns the events numbers them, so a
//! store that talks to a server (Redis streams, `XADD key <seq> ...`, for several replicas)
//! can queue appends and pipeline them in the background. Replays are rare (a client
//! reconnecting) and asynchronous. [`MemoryEventStore`] keeps events in this process, bounded
//! per stream (count, bytes), per session (bytes) and by age; what falls out is evicted, and a
//! replay that would need it reports [`ReplayError::Evicted`] rather than silently skipping.
//!
//! In cluster mode [`RedisEventStore`] wraps the memory store: this replica's own streams are
//! served from memory as on a gateway alone, and every event is also written through to Redis
//! Streams in the background, so a replica that adopts a dead replica's session
//! ([`EventStore::adopt`]) can replay it.
//!
//! Where things are: this file holds the seam (the [`EventStore`] and [`SessionEvents`]
//! traits and their types); `memory` the in-process store, `session_log` the one-log-per-
//! session structure it keeps each session's events in, and `redis` the write-through copy.

mod memory;
mod redis;
mod session_log;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

// The bounds are settings, so they live in `config`; re-exported for the store's users.
pub use self::redis::{RedisEventOptions, RedisEventStore, SessionNames};
pub use crate::config::ReplayLimits;
pub use memory::MemoryEventStore;

/// A stream of a session.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StreamKey {
    pub session: Arc<str>,
    pub stream: u64,
}

/// Why events cannot be replayed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// Events after the cursor are no longer kept (limits or age), or the stream's buffer was
    /// released.
    #[error("events after that cursor are no longer kept (the oldest kept is {oldest_kept})")]
    Evicted { oldest_kept: u64 },
    #[error("the event store failed: {0}")]
    Backend(String),
}

pub type ReplayFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<(u64, Bytes)>, ReplayError>> + Send + 'a>>;

/// Where one stream of an adopted session stands in the shared copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamPosition {
    pub stream: u64,
    /// The lowest sequence still kept (`next_seq` when none is).
    pub oldest_kept: u64,
    /// The sequence the stream's next event takes: one past the last ever written, kept or
    /// not, so a new owner neither reuses an id nor writes one the copy refuses.
    pub next_seq: u64,
}

/// What the shared copy held of a session taken over.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Adopted {
    /// Where each of its streams stands.
    pub streams: Vec<StreamPosition>,
    /// Its streams that still owed responses when their replica stopped, with the ids of
    /// the requests they owed (a JSON array, as [`SessionEvents::owes`] was given it).
    pub in_flight: Vec<(u64, Bytes)>,
}

pub type AdoptFuture<'a> = Pin<Box<dyn Future<Output = Result<Adopted, ReplayError>> + Send + 'a>>;

pub type FlushFuture<'a> = Pin<Box<dyn Future<Output = bool> + Send + 'a>>;

pub trait EventStore: Send + Sync + 'static {
    /// The events of one session: its streams keep this and use it without finding the
    /// session again on every event. Made on first use; after [`release_session`] it still
    /// works but holds nothing the store counts or replays.
    ///
    /// [`release_session`]: EventStore::release_session
    fn session(&self, id: &Arc<str>) -> Arc<dyn SessionEvents>;

    /// Evicts events past their age everywhere (periodic maintenance).
    fn expire(&self);

    /// Forgets every stream of a session.
    fn release_session(&self, session: &str);

    /// Events and bytes held now, for metrics.
    fn usage(&self) -> (usize, usize);

    /// Makes the events another replica kept for a session replayable here (cluster mode:
    /// this replica takes over the session of one that died). Afterwards the session's
    /// [`SessionEvents`] answer `replay`, `oldest_kept` and `next_seq` for those streams too;
    /// the positions returned say where each stream goes on. A store with nothing shared (in
    /// memory) has nothing to load.
    fn adopt(&self, session: &Arc<str>) -> AdoptFuture<'_> {
        let _ = session;
        Box::pin(std::future::ready(Ok(Adopted::default())))
    }

    /// Lets a session go from this process without touching the shared copy: another
    /// replica serves it next (a drain hands it over, or it was taken over). A store with
    /// nothing shared forgets it, as [`EventStore::release_session`] does.
    fn leave_session(&self, session: &str) {
        self.release_session(session);
    }

    /// Waits, at most `timeout`, until what was appended (and released) so far has been sent
    /// to the shared copy: written, or counted as dropped if that failed. For a drain, before
    /// the sessions are left to other replicas; `false` when the time ran out. A store with
    /// nothing shared is always done.
    fn flush(&self, timeout: Duration) -> FlushFuture<'_> {
        let _ = timeout;
        Box::pin(std::future::ready(true))
    }
}

/// One session's events, by stream number.
pub trait SessionEvents: Send + Sync + 'static {
    /// Keeps event `seq` of a stream. Sequences of one stream arrive in increasing order.
    fn append(&self, stream: u64, seq: u64, data: Bytes);

    /// The events with `after < seq < before`, in order. `Evicted` when any of them is gone,
    /// unless `skip_evicted`, which returns what is still kept.
    fn replay(&self, stream: u64, after: u64, before: u64, skip_evicted: bool) -> ReplayFuture<'_>;

    /// The lowest sequence still kept for a stream that ever had events, when the store can
    /// tell without waiting (checked before a connection is swapped for a resuming one).
    fn oldest_kept(&self, stream: u64) -> Option<u64>;

    /// The sequence a stream's next event would have, when the store still knows the stream
    /// (`None` once it is released or never had an event). A finished stream that is no longer
    /// in memory is rebuilt from this when a client resumes it.
    fn next_seq(&self, stream: u64) -> Option<u64>;

    /// Forgets a stream's events up to and including `through` (delivered, not kept for
    /// replay when resumption is off).
    fn trim(&self, stream: u64, through: u64);

    /// Forgets a stream's events.
    fn release(&self, stream: u64);

    /// A stream now owes responses to these requests (`ids`, a JSON array): a shared store
    /// keeps that until [`SessionEvents::answered`], so a replica that takes the session over
    /// can end them with an error if their replica dies first. Nothing in memory.
    fn owes(&self, stream: u64, ids: Bytes) {
        let _ = (stream, ids);
    }

    /// A stream owes no more responses.
    fn answered(&self, stream: u64) {
        let _ = stream;
    }

    /// A POST's stream is new, and its client has seen nothing of it yet: a shared store may
    /// hold back its copy of the stream (its events, what it owes) until
    /// [`SessionEvents::held`] says whether anyone can ask for it. Nothing in memory.
    fn hold(&self, stream: u64) {
        let _ = stream;
    }

    /// The stream's response has begun. `wanted`: it goes out as a live stream, which a client
    /// may resume, so the copy held back is sent now and the rest straight through. Not
    /// wanted: the stream ended before its response began and went out whole in one body;
    /// the owner keeps it in memory for a resumption as ever, and a shared store drops its
    /// copy (the spec lets a server not resume a stream; only a resumption on another replica
    /// after its owner died is lost). A stream not held back is not affected.
    fn held(&self, stream: u64, wanted: bool) {
        let _ = (stream, wanted);
    }
}
