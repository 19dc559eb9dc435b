//! The event store of cluster mode ([`RedisEventStore`]): the replay buffers written through to
//! Redis Streams, beside the in-memory store that goes on serving this replica.
//!
//! Every event is kept in memory exactly as on a gateway alone ([`MemoryEventStore`]: an append
//! is synchronous and never fails or waits) and is also queued for a background writer, which
//! pipelines batches of them to Redis. A replica that takes over the session of one that died
//! ([`EventStore::adopt`]) reads that session's streams back from Redis. In Redis, for a
//! session whose name is `S` (a keyed hash of its id, never the id: [`SessionNames`]) and a key
//! prefix `P`:
//!
//! - `Pevents:S:<stream>`: one Redis stream per stream of the session. Entry id `<seq>-0`, so
//!   a range by sequence is a range by id and Redis refuses an id at or below the last one;
//!   field `d` holds the event's bytes; `XADD … MAXLEN ~ max_events_per_stream`.
//! - `Pevent-streams:S`: the set of the session's stream numbers, which is how an adopting
//!   replica finds them without scanning the keyspace.
//! - `Pin-flight:S`: a hash of the session's streams that still owe responses (stream number
//!   to the JSON array of the ids owed), set when a stream opens and cleared when it owes no
//!   more: what an adopting replica ends with an error when their replica died first.
//!
//! A POST's stream is copied only once its response has begun live ([`SessionEvents::hold`],
//! [`SessionEvents::held`]): most calls are answered within the hold, and their stream goes
//! out whole in one body made before any of it is sent; for those nothing is written to
//! Redis at all (a key made and deleted per call was most of Redis's work, and of
//! the replica's in cluster mode). The owner keeps them in memory for a resumption as ever;
//! only a resumption at another replica after the owner died finds nothing, which the spec
//! allows (a server MAY make a stream resumable).
//!
//! Every key expires `max_age` after the last event written to it (`PEXPIRE`, refreshed by
//! each batch). Releasing a stream or a session deletes its keys through the same writer, so a
//! deletion never overtakes the events queued before it.
//!
//! Which streams are read from Redis: a stream this replica holds in memory is answered from
//! memory, as on a gateway alone. Redis is read for a stream memory does not know (a session
//! of another replica), and for the older part of an adopted stream, whose newer events
//! (appended here since) come from memory. A session of this replica never waits on Redis.
//!
//! What it must never do: make an append wait on Redis or fail because of it (past the queue's
//! bounds the Redis copy of an event is dropped and counted, never the event); wait on Redis
//! past a timeout; trust what it reads back (every id, field, count and size is checked, and a
//! value that does not parse is an error, never a panic); show Redis's error text to a client
//! (it goes into [`ReplayError::Backend`], which the HTTP layer logs).
//!
//! What the copy does not bound as memory does: bytes per stream and the per-session budget
//! are applied on the way back (a read takes at most `max_events_per_stream` events and
//! `max_bytes_per_stream` bytes, the newest), not in Redis; age is bounded per key, not per
//! event. A write that fails is not retried: its events are counted as dropped, and a replay
//! that would need them reports them evicted.
//!
//! Where things are: this file holds the store and the seam's store-wide methods; `session`
//! one session's events (appends, replays, adopted streams), `read` the replays and adoptions
//! from Redis, `writer` the background writer, `parse` the checks of Redis's answers, `names`
//! the sessions' names in keys, `tests` the tests against the real Redis.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ::redis::aio::ConnectionManager;
use bytes::Bytes;
use dashmap::DashMap;
use tokio::sync::{mpsc, oneshot};

use super::{
    AdoptFuture, Adopted, EventStore, FlushFuture, MemoryEventStore, ReplayError, ReplayFuture,
    ReplayLimits, SessionEvents, StreamPosition,
};
use crate::metrics::{self, RedisOp};

/// The field of an entry that holds the event's bytes.
const FIELD: &[u8] = b"d";

/// Entries asked for in one read round trip.
const READ_PAGE: usize = 256;

/// Members asked for in one `SSCAN` round trip while adopting.
const SCAN_PAGE: usize = 1000;

/// Streams measured (`XINFO STREAM`) in one pipelined round trip while adopting.
const INFO_BATCH: usize = 256;

/// The longest expiry set on a key: a hundred years.
const MAX_TTL_MS: u128 = 100 * 365 * 24 * 3600 * 1000;

/// Most streams an adopted session may have in Redis: more is not something this gateway
/// wrote (a session keeps at most `max_lingering` finished streams), so it is refused.
const MAX_ADOPTED_STREAMS: usize = 100_000;

/// How the write-through copy behaves: its queue's bounds, its batches and its timeouts.
#[derive(Debug, Clone)]
pub struct RedisEventOptions {
    /// Operations waiting for the writer, at most: past it an event is kept in memory only.
    pub queue_ops: usize,
    /// Bytes of events waiting for the writer, at most, likewise.
    pub queue_bytes: usize,
    /// Operations in one pipelined round trip, at most.
    pub batch_ops: usize,
    /// Bytes of events in one pipelined round trip, about (a batch closes once past it).
    pub batch_bytes: usize,
    /// How long one write round trip may take before its events count as dropped.
    pub write_timeout: Duration,
    /// How long a replay or an adoption may wait on Redis, all its round trips together.
    pub read_timeout: Duration,
    /// The shortest time between two warnings about events that did not reach Redis.
    pub log_interval: Duration,
}

impl Default for RedisEventOptions {
    fn default() -> Self {
        RedisEventOptions {
            queue_ops: 65_536,
            queue_bytes: 64 * 1024 * 1024,
            batch_ops: 1024,
            batch_bytes: 4 * 1024 * 1024,
            write_timeout: Duration::from_secs(5),
            read_timeout: Duration::from_secs(2),
            log_interval: Duration::from_secs(10),
        }
    }
}

/// The replay store of cluster mode (see the module's doc).
pub struct RedisEventStore {
    /// This replica's events, served as on a gateway alone.
    memory: MemoryEventStore,
    shared: Arc<Shared>,
    /// The sessions handed out, so `release_session` can stop their late appends and find
    /// the streams they adopted. Hashed with foldhash, as the memory store's table is.
    sessions: DashMap<Arc<str>, Arc<RedisSession>, foldhash::fast::RandomState>,
}

/// What the store and its sessions share.
struct Shared {
    /// A clone per use: it multiplexes one connection and reconnects by itself.
    conn: ConnectionManager,
    keys: Keys,
    /// What a session is called in key names.
    names: SessionNames,
    limits: ReplayLimits,
    options: RedisEventOptions,
    /// To the writer task; bounded in operations (its capacity) and in bytes (`counters`).
    queue: mpsc::Sender<Op>,
    counters: Arc<Counters>,
}

/// The keys of one store (one cluster's prefix).
#[derive(Clone)]
struct Keys {
    prefix: Arc<str>,
}

/// Each takes the session's name ([`SessionNames::of`]), never its id.
impl Keys {
    /// A stream's entries.
    fn stream(&self, name: &str, stream: u64) -> String {
        format!("{}events:{name}:{stream}", self.prefix)
    }

    /// The set of a session's stream numbers.
    fn index(&self, name: &str) -> String {
        format!("{}event-streams:{name}", self.prefix)
    }

    /// A hash of a session's streams that owe responses: stream number to the JSON array of
    /// the ids of the requests it owes.
    fn in_flight(&self, name: &str) -> String {
        format!("{}in-flight:{name}", self.prefix)
    }
}

/// Counts shared by the store and its writer.
struct Counters {
    /// Bytes of events in the queue now.
    queued_bytes: AtomicUsize,
    written: AtomicU64,
    dropped: AtomicU64,
    /// When a warning was last logged, in milliseconds since `born` (0: never).
    last_warned: AtomicU64,
    born: Instant,
    log_interval: Duration,
}

impl Counters {
    /// Whether a warning may be logged now (at most one per `log_interval`).
    fn may_warn(&self) -> bool {
        let now = self.born.elapsed().as_millis() as u64 + 1;
        let last = self.last_warned.load(Ordering::Relaxed);
        (last == 0 || now - last.min(now) >= self.log_interval.as_millis() as u64)
            && self
                .last_warned
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// `n` events stay in memory only.
    fn drop_events(&self, n: u64, why: &dyn std::fmt::Display) {
        if n == 0 {
            return;
        }
        let total = self.dropped.fetch_add(n, Ordering::Relaxed) + n;
        metrics::get().redis_events_dropped.inc_by(n);
        if self.may_warn() {
            tracing::warn!(
                events = n,
                dropped_so_far = total,
                "replay events are kept in memory but not in Redis ({why}): another replica \
                 adopting their session cannot replay them"
            );
        }
    }

    fn wrote(&self, n: u64) {
        if n > 0 {
            self.written.fetch_add(n, Ordering::Relaxed);
            metrics::get().redis_events_written.inc_by(n);
        }
    }
}

/// What the writer is asked to do, in the order asked. Each `session` is the session's name
/// in key names ([`SessionNames::of`]), not its id.
enum Op {
    Append {
        session: Arc<str>,
        stream: u64,
        seq: u64,
        data: Bytes,
    },
    Trim {
        session: Arc<str>,
        stream: u64,
        through: u64,
    },
    Release {
        session: Arc<str>,
        stream: u64,
    },
    ReleaseSession {
        session: Arc<str>,
        /// Its streams' numbers, as this replica knows them.
        streams: Vec<u64>,
    },
    /// A stream owes responses to these requests (a JSON array of their ids).
    Owe {
        session: Arc<str>,
        stream: u64,
        ids: Bytes,
    },
    /// A stream owes no more.
    Answered {
        session: Arc<str>,
        stream: u64,
    },
    /// Answered once everything queued before it has been sent.
    Flush(oneshot::Sender<()>),
}

impl Op {
    /// What it counts against the queue's byte bound.
    fn bytes(&self) -> usize {
        match self {
            Op::Append { data, .. } => data.len(),
            Op::Owe { ids, .. } => ids.len(),
            _ => 0,
        }
    }
}

impl RedisEventStore {
    /// A store whose events are written through to Redis under `prefix` (the cluster's
    /// `redis_key_prefix`), its sessions named by `names`, bounded by `limits` as in memory.
    /// Spawns the writer task, so it is called inside the Tokio runtime; the task ends when
    /// the store and its sessions are dropped.
    pub fn new(
        conn: ConnectionManager,
        prefix: String,
        names: SessionNames,
        limits: ReplayLimits,
    ) -> Arc<RedisEventStore> {
        RedisEventStore::with_options(conn, prefix, names, limits, RedisEventOptions::default())
    }

    /// [`RedisEventStore::new`] with other bounds and timeouts.
    pub fn with_options(
        conn: ConnectionManager,
        prefix: String,
        names: SessionNames,
        limits: ReplayLimits,
        options: RedisEventOptions,
    ) -> Arc<RedisEventStore> {
        // Each operation's label is there from the start, at zero.
        for op in RedisOp::ALL {
            let _ = metrics::get().redis_errors.with_label_values(&[op.label()]);
        }
        let (tx, rx) = mpsc::channel(options.queue_ops.max(1));
        let counters = Arc::new(Counters {
            queued_bytes: AtomicUsize::new(0),
            written: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            last_warned: AtomicU64::new(0),
            born: Instant::now(),
            log_interval: options.log_interval,
        });
        let keys = Keys {
            prefix: Arc::from(prefix),
        };
        let writer = Writer {
            conn: conn.clone(),
            rx,
            keys: keys.clone(),
            counters: counters.clone(),
            maxlen: limits.max_events_per_stream.max(1),
            // Within what Redis takes (it refuses an expiry past its clock's range).
            ttl_ms: limits.max_age.as_millis().clamp(1, MAX_TTL_MS) as u64,
            options: options.clone(),
        };
        tokio::spawn(writer.run());
        Arc::new(RedisEventStore {
            memory: MemoryEventStore::new(limits.clone()),
            shared: Arc::new(Shared {
                conn,
                keys,
                names,
                limits,
                options,
                queue: tx,
                counters,
            }),
            sessions: DashMap::default(),
        })
    }

    /// How many events of a stream a replica may have sent its clients without Redis having
    /// them yet, at most: its queue to the writer, and a batch on its way. An adopted stream
    /// goes on this far past what Redis holds, so no event id a client saw from the replica
    /// that died is issued again, and a client that saw more than Redis kept resumes after
    /// it.
    fn unwritten_bound(&self) -> u64 {
        (self.shared.options.queue_ops + self.shared.options.batch_ops + 1) as u64
    }

    /// Events written to Redis so far.
    pub fn written(&self) -> u64 {
        self.shared.counters.written.load(Ordering::Relaxed)
    }

    /// Events kept in memory but not written to Redis so far (queue full, Redis failed or
    /// refused).
    pub fn dropped(&self) -> u64 {
        self.shared.counters.dropped.load(Ordering::Relaxed)
    }

    fn redis_session(&self, id: &Arc<str>) -> Arc<RedisSession> {
        self.sessions
            .entry(id.clone())
            .or_insert_with(|| {
                Arc::new(RedisSession {
                    name: Arc::from(self.shared.names.of(id)),
                    memory: self.memory.session(id),
                    shared: self.shared.clone(),
                    released: AtomicBool::new(false),
                    adopted: AtomicBool::new(false),
                    remote: Mutex::default(),
                    held: Mutex::default(),
                    holding: AtomicUsize::new(0),
                })
            })
            .clone()
    }
}

impl EventStore for RedisEventStore {
    fn session(&self, id: &Arc<str>) -> Arc<dyn SessionEvents> {
        self.redis_session(id)
    }

    fn expire(&self) {
        // Redis expires its keys by itself.
        self.memory.expire();
    }

    fn release_session(&self, session: &str) {
        let mut streams = self.memory.streams_of(session);
        let name = match self.sessions.remove(session) {
            Some((_, s)) => {
                s.released.store(true, Ordering::Release);
                streams.extend(s.remote_streams());
                s.name.clone()
            }
            None => Arc::from(self.shared.names.of(session)),
        };
        self.memory.release_session(session);
        streams.sort_unstable();
        streams.dedup();
        self.shared.enqueue(Op::ReleaseSession {
            session: name,
            streams,
        });
    }

    fn usage(&self) -> (usize, usize) {
        // What this replica holds; the Redis copy is Redis's memory.
        self.memory.usage()
    }

    fn adopt(&self, session: &Arc<str>) -> AdoptFuture<'_> {
        let s = self.redis_session(session);
        Box::pin(async move {
            let mut adopted = with_timeout(
                RedisOp::EventsAdopt,
                self.shared.options.read_timeout,
                self.shared.adopt(&s.name),
            )
            .await
            .map_err(ReplayError::Backend)?;
            {
                let mut remote = s.remote.lock().expect("remote streams lock");
                for p in &adopted.streams {
                    remote.insert(
                        p.stream,
                        Remote {
                            oldest_kept: p.oldest_kept,
                            next_seq: p.next_seq,
                            resumed_at: p.next_seq.saturating_add(self.unwritten_bound()),
                        },
                    );
                }
                for p in &mut adopted.streams {
                    p.next_seq = p.next_seq.saturating_add(self.unwritten_bound());
                }
            }
            s.adopted.store(true, Ordering::Release);
            Ok(adopted)
        })
    }

    fn leave_session(&self, session: &str) {
        // Its keys stay for the replica that serves it next; late appends stay here. A copy
        // held back goes first: the next replica may be asked for it.
        if let Some((_, s)) = self.sessions.remove(session) {
            s.send_all_held();
            s.released.store(true, Ordering::Release);
        }
        self.memory.release_session(session);
    }

    fn flush(&self, timeout: Duration) -> FlushFuture<'_> {
        Box::pin(async move {
            let (tx, rx) = oneshot::channel();
            tokio::time::timeout(timeout, async {
                self.shared.queue.send(Op::Flush(tx)).await.is_ok() && rx.await.is_ok()
            })
            .await
            .unwrap_or(false)
        })
    }
}

mod names;
mod parse;
mod read;
mod session;
mod writer;

#[cfg(test)]
mod tests;

pub use names::SessionNames;
use parse::*;
use session::*;
use writer::*;
