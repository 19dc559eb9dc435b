//! The event store of cluster mode ([`RedisEventStore`]): the replay buffers written through to
//! Redis Streams, beside the in-memory store that goes on serving this replica.
//!
//! Every event is kept in memory exactly as on a gateway alone ([`MemoryEventStore`]: an append
//! is synchronous and never fails or waits) and is also queued for a background writer, which
//! pipelines batches of them to Redis. A replica that takes over the session of one that died
//! ([`EventStore::adopt`]) reads that session's streams back from Redis. In Redis, for a
//! session `S` and a key prefix `P`:
//!
//! - `Pevents:S:<stream>`: one Redis stream per stream of the session. Entry id `<seq>-0`, so
//!   a range by sequence is a range by id and Redis refuses an id at or below the last one;
//!   field `d` holds the event's bytes; `XADD … MAXLEN ~ max_events_per_stream`.
//! - `Pevent-streams:S`: the set of the session's stream numbers, which is how an adopting
//!   replica finds them without scanning the keyspace.
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

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ::redis::aio::ConnectionManager;
use ::redis::{Pipeline, RedisResult, Value};
use bytes::Bytes;
use dashmap::DashMap;
use tokio::sync::{mpsc, oneshot};

use super::{
    AdoptFuture, EventStore, FlushFuture, MemoryEventStore, ReplayError, ReplayFuture,
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

impl Keys {
    /// A stream's entries. A session id holds no `:` this gateway made; were one to, the
    /// number after the last `:` still tells the streams apart.
    fn stream(&self, session: &str, stream: u64) -> String {
        format!("{}events:{session}:{stream}", self.prefix)
    }

    /// The set of a session's stream numbers.
    fn index(&self, session: &str) -> String {
        format!("{}event-streams:{session}", self.prefix)
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

/// What the writer is asked to do, in the order asked.
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
    /// Answered once everything queued before it has been sent.
    Flush(oneshot::Sender<()>),
}

impl Op {
    /// What it counts against the queue's byte bound.
    fn bytes(&self) -> usize {
        match self {
            Op::Append { data, .. } => data.len(),
            _ => 0,
        }
    }
}

/// One session's events: in memory, and queued for Redis.
struct RedisSession {
    id: Arc<str>,
    memory: Arc<dyn SessionEvents>,
    shared: Arc<Shared>,
    /// Set when the session is released: a stream that has not heard of it yet appends to
    /// memory only, so no key comes back after the session's keys were deleted.
    released: AtomicBool,
    /// Set once [`EventStore::adopt`] loaded streams: only then is `remote` looked at, so a
    /// session of this replica pays one atomic load for it.
    adopted: AtomicBool,
    /// The streams another replica wrote to Redis, as loaded when this one adopted the
    /// session: what `oldest_kept` and `next_seq` answer without waiting on Redis.
    remote: Mutex<HashMap<u64, Remote>>,
}

/// Where an adopted stream stood in Redis.
#[derive(Debug, Clone, Copy)]
struct Remote {
    oldest_kept: u64,
    next_seq: u64,
}

impl RedisEventStore {
    /// A store whose events are written through to Redis under `prefix` (the cluster's
    /// `redis_key_prefix`), bounded by `limits` as in memory. Spawns the writer task, so it
    /// is called inside the Tokio runtime; the task ends when the store and its sessions are
    /// dropped.
    pub fn new(
        conn: ConnectionManager,
        prefix: String,
        limits: ReplayLimits,
    ) -> Arc<RedisEventStore> {
        RedisEventStore::with_options(conn, prefix, limits, RedisEventOptions::default())
    }

    /// [`RedisEventStore::new`] with other bounds and timeouts.
    pub fn with_options(
        conn: ConnectionManager,
        prefix: String,
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
                limits,
                options,
                queue: tx,
                counters,
            }),
            sessions: DashMap::default(),
        })
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
                    id: id.clone(),
                    memory: self.memory.session(id),
                    shared: self.shared.clone(),
                    released: AtomicBool::new(false),
                    adopted: AtomicBool::new(false),
                    remote: Mutex::default(),
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
        if let Some((_, s)) = self.sessions.remove(session) {
            s.released.store(true, Ordering::Release);
            streams.extend(s.remote_streams());
        }
        self.memory.release_session(session);
        streams.sort_unstable();
        streams.dedup();
        self.shared.enqueue(Op::ReleaseSession {
            session: Arc::from(session),
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
            let positions = with_timeout(
                RedisOp::EventsAdopt,
                self.shared.options.read_timeout,
                self.shared.adopt(&s.id),
            )
            .await
            .map_err(ReplayError::Backend)?;
            {
                let mut remote = s.remote.lock().expect("remote streams lock");
                for p in &positions {
                    remote.insert(
                        p.stream,
                        Remote {
                            oldest_kept: p.oldest_kept,
                            next_seq: p.next_seq,
                        },
                    );
                }
            }
            s.adopted.store(true, Ordering::Release);
            Ok(positions)
        })
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

impl Shared {
    /// Queues an operation for the writer without waiting; past the queue's bounds it is
    /// dropped (an event then stays in memory only).
    fn enqueue(&self, op: Op) {
        let bytes = op.bytes();
        let c = &self.counters;
        if bytes > 0
            && c.queued_bytes.fetch_add(bytes, Ordering::AcqRel) + bytes > self.options.queue_bytes
        {
            c.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
            return self.not_queued(&op, "the queue to Redis holds too many bytes");
        }
        if let Err(e) = self.queue.try_send(op) {
            c.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
            let (op, why) = match e {
                mpsc::error::TrySendError::Full(op) => (op, "the queue to Redis is full"),
                mpsc::error::TrySendError::Closed(op) => (op, "the Redis writer has stopped"),
            };
            self.not_queued(&op, why);
        }
    }

    fn not_queued(&self, op: &Op, why: &str) {
        match op {
            Op::Append { .. } => self.counters.drop_events(1, &why),
            Op::Flush(_) => {}
            _ => {
                if self.counters.may_warn() {
                    tracing::warn!(
                        "a deletion from Redis was not queued ({why}): its keys stay until \
                         they expire"
                    );
                }
            }
        }
    }

    /// The events with `after < seq < before` of a stream in Redis, bounded and checked like
    /// the memory store's: `Evicted` (with the oldest kept) when any is missing, unless
    /// `skip_evicted`. Whether the newest ones (up to `before`) are missing can be told only
    /// when they are known to exist (`reach_before`): a gap at the end of what was written
    /// looks like the end.
    async fn read_range(
        &self,
        session: &str,
        stream: u64,
        after: u64,
        before: u64,
        skip_evicted: bool,
        reach_before: bool,
    ) -> Result<Vec<(u64, Bytes)>, ReplayError> {
        let Some(low) = after.checked_add(1).filter(|low| *low < before) else {
            return Ok(Vec::new());
        };
        let key = self.keys.stream(session, stream);
        let mut events = with_timeout(
            RedisOp::EventsRead,
            self.options.read_timeout,
            self.read_newest(&key, low, before - 1),
        )
        .await
        .map_err(ReplayError::Backend)?;
        events.reverse();
        if skip_evicted {
            return Ok(events);
        }
        // The kept events run on without a gap from `events[from]` to the newest.
        let mut from = 0;
        let mut expected = low;
        for (i, (seq, _)) in events.iter().enumerate() {
            if *seq != expected {
                from = i;
            }
            expected = seq + 1;
        }
        if reach_before && expected != before {
            // Events before `before` are known to exist (memory holds them from there on):
            // the newest ones are missing, so nothing kept here leads up to them.
            return Err(ReplayError::Evicted {
                oldest_kept: before,
            });
        }
        match events.get(from) {
            None => Err(ReplayError::Evicted {
                oldest_kept: before,
            }),
            Some((seq, _)) if *seq == low => Ok(events),
            Some((seq, _)) => Err(ReplayError::Evicted { oldest_kept: *seq }),
        }
    }

    /// A stream's newest entries with `low <= seq <= high`, newest first, as many as the
    /// per-stream bounds (count and bytes) allow, read back page by page.
    async fn read_newest(
        &self,
        key: &str,
        low: u64,
        high: u64,
    ) -> Result<Vec<(u64, Bytes)>, String> {
        let max_events = self.limits.max_events_per_stream;
        let max_bytes = self.limits.max_bytes_per_stream;
        let mut conn = self.conn.clone();
        let mut out: Vec<(u64, Bytes)> = Vec::new();
        let mut bytes = 0usize;
        let mut top = high;
        loop {
            // One more than may be kept, so a bound that cuts the range is seen.
            let want = (max_events.saturating_add(1) - out.len()).min(READ_PAGE);
            let reply: Value = round_trip(
                RedisOp::EventsRead,
                ::redis::cmd("XREVRANGE")
                    .arg(key)
                    .arg(entry_id(top))
                    .arg(entry_id(low))
                    .arg("COUNT")
                    .arg(want)
                    .query_async(&mut conn),
            )
            .await?;
            let page = parse_entries(reply, low, top, want)?;
            let n = page.len();
            for (seq, data) in page {
                if out.len() == max_events || bytes.saturating_add(data.len()) > max_bytes {
                    return Ok(out);
                }
                bytes += data.len();
                out.push((seq, data));
            }
            match out.last() {
                Some((seq, _)) if n == want && *seq > low => top = seq - 1,
                _ => return Ok(out),
            }
        }
    }

    /// Where each stream of a session stands in Redis.
    async fn adopt(&self, session: &str) -> Result<Vec<StreamPosition>, String> {
        let index = self.keys.index(session);
        let mut conn = self.conn.clone();
        let mut numbers = BTreeSet::new();
        let mut cursor = String::from("0");
        // SSCAN may return a member twice and pages with none: bounded in rounds too.
        for round in 0.. {
            if round > MAX_ADOPTED_STREAMS / SCAN_PAGE * 4 + 16 {
                return Err("redis: listing a session's streams does not end".into());
            }
            let reply: Value = round_trip(
                RedisOp::EventsAdopt,
                ::redis::cmd("SSCAN")
                    .arg(&index)
                    .arg(&cursor)
                    .arg("COUNT")
                    .arg(SCAN_PAGE)
                    .query_async(&mut conn),
            )
            .await?;
            let (next, members) = parse_scan(reply)?;
            for m in members {
                numbers.insert(parse_number(&m).ok_or("redis: a stream number that is not one")?);
            }
            if numbers.len() > MAX_ADOPTED_STREAMS {
                return Err(format!(
                    "redis: the session has more than {MAX_ADOPTED_STREAMS} streams"
                ));
            }
            if next == "0" {
                break;
            }
            cursor = next;
        }
        let numbers: Vec<u64> = numbers.into_iter().collect();
        let mut out = Vec::with_capacity(numbers.len());
        for chunk in numbers.chunks(INFO_BATCH) {
            let mut pipe = Pipeline::with_capacity(chunk.len());
            pipe.ignore_errors();
            for n in chunk {
                pipe.cmd("XINFO")
                    .arg("STREAM")
                    .arg(self.keys.stream(session, *n));
            }
            let replies: Vec<Value> =
                round_trip(RedisOp::EventsAdopt, pipe.query_async(&mut conn)).await?;
            if replies.len() != chunk.len() {
                return Err("redis: a pipeline answered with the wrong number of replies".into());
            }
            for (n, reply) in chunk.iter().zip(replies) {
                match reply {
                    // Expired since it was listed.
                    Value::ServerError(e)
                        if e.details().is_some_and(|d| d.contains("no such key")) => {}
                    Value::ServerError(e) => return Err(format!("redis: XINFO STREAM: {e}")),
                    info => out.push(parse_info(*n, info)?),
                }
            }
        }
        Ok(out)
    }
}

impl RedisSession {
    /// The adopted stream's position in Redis, if this session was adopted and had it.
    fn remote(&self, stream: u64) -> Option<Remote> {
        if !self.adopted.load(Ordering::Acquire) {
            return None;
        }
        self.remote
            .lock()
            .expect("remote streams lock")
            .get(&stream)
            .copied()
    }

    fn remote_streams(&self) -> Vec<u64> {
        self.remote
            .lock()
            .expect("remote streams lock")
            .keys()
            .copied()
            .collect()
    }

    fn enqueue(&self, op: Op) {
        if !self.released.load(Ordering::Acquire) {
            self.shared.enqueue(op);
        }
    }
}

impl SessionEvents for RedisSession {
    fn append(&self, stream: u64, seq: u64, data: Bytes) {
        self.enqueue(Op::Append {
            session: self.id.clone(),
            stream,
            seq,
            data: data.clone(),
        });
        self.memory.append(stream, seq, data);
    }

    fn replay(&self, stream: u64, after: u64, before: u64, skip_evicted: bool) -> ReplayFuture<'_> {
        let remote = self.remote(stream);
        let in_memory = self.memory.oldest_kept(stream);
        let from_memory = match (remote, in_memory) {
            // Memory holds everything after the cursor.
            (_, Some(first)) if after.saturating_add(1) >= first => true,
            // A stream of this replica: answered as on a gateway alone.
            (None, Some(_)) => true,
            // Known nowhere here: another replica's (read from Redis), unless the session
            // ended, whose keys are deleted.
            (None, None) => self.released.load(Ordering::Acquire),
            // Adopted, and the cursor is older than what this replica appended.
            (Some(_), _) => false,
        };
        if from_memory {
            return self.memory.replay(stream, after, before, skip_evicted);
        }
        Box::pin(async move {
            // The older part from Redis; what this replica appended since, from memory.
            let split = in_memory.map_or(before, |first| first.min(before));
            let mut events = self
                .shared
                .read_range(
                    &self.id,
                    stream,
                    after,
                    split,
                    skip_evicted,
                    in_memory.is_some(),
                )
                .await?;
            if let Some(first) = in_memory
                && first < before
            {
                let newer = self
                    .memory
                    .replay(stream, first.saturating_sub(1), before, skip_evicted)
                    .await?;
                events.extend(newer);
            }
            Ok(events)
        })
    }

    fn oldest_kept(&self, stream: u64) -> Option<u64> {
        let in_memory = self.memory.oldest_kept(stream);
        match self.remote(stream) {
            Some(r) => Some(in_memory.map_or(r.oldest_kept, |m| m.min(r.oldest_kept))),
            None => in_memory,
        }
    }

    fn next_seq(&self, stream: u64) -> Option<u64> {
        let in_memory = self.memory.next_seq(stream);
        match self.remote(stream) {
            Some(r) => Some(in_memory.map_or(r.next_seq, |m| m.max(r.next_seq))),
            None => in_memory,
        }
    }

    fn trim(&self, stream: u64, through: u64) {
        self.memory.trim(stream, through);
        if self.adopted.load(Ordering::Acquire)
            && let Some(r) = self
                .remote
                .lock()
                .expect("remote streams lock")
                .get_mut(&stream)
        {
            r.oldest_kept = r.oldest_kept.max(through.saturating_add(1));
        }
        self.enqueue(Op::Trim {
            session: self.id.clone(),
            stream,
            through,
        });
    }

    fn release(&self, stream: u64) {
        self.memory.release(stream);
        if self.adopted.load(Ordering::Acquire) {
            self.remote
                .lock()
                .expect("remote streams lock")
                .remove(&stream);
        }
        self.enqueue(Op::Release {
            session: self.id.clone(),
            stream,
        });
    }
}

// === the writer ===

/// The background task that writes the queue to Redis, a pipelined batch per round trip.
struct Writer {
    conn: ConnectionManager,
    rx: mpsc::Receiver<Op>,
    keys: Keys,
    counters: Arc<Counters>,
    /// `MAXLEN ~` of every stream.
    maxlen: usize,
    /// Every key's expiry, refreshed by each batch that writes to it.
    ttl_ms: u64,
    options: RedisEventOptions,
}

/// What a command of a batch was, to read its reply.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Append,
    Other,
}

/// A batch turned into one pipeline.
struct Plan<'a> {
    keys: &'a Keys,
    ttl_ms: u64,
    pipe: Pipeline,
    kinds: Vec<Kind>,
    /// Streams appended to since their expiry was last refreshed in this pipeline.
    touched: BTreeSet<(Arc<str>, u64)>,
    appends: u64,
}

impl Plan<'_> {
    fn push(&mut self, kind: Kind) {
        self.kinds.push(kind);
    }

    /// Refreshes the expiry of the streams appended to, and lists them in their sessions'
    /// sets. Done before any other operation, so a deletion comes after them.
    fn touch(&mut self) {
        // In order by session, then stream: one SADD and one PEXPIRE of the set per session.
        let mut touched = std::mem::take(&mut self.touched).into_iter().peekable();
        while let Some((session, stream)) = touched.next() {
            let mut streams = vec![stream];
            while let Some((_, n)) = touched.next_if(|(s, _)| *s == session) {
                streams.push(n);
            }
            for n in &streams {
                self.pipe
                    .cmd("PEXPIRE")
                    .arg(self.keys.stream(&session, *n))
                    .arg(self.ttl_ms);
                self.push(Kind::Other);
            }
            let index = self.keys.index(&session);
            self.pipe.cmd("SADD").arg(&index).arg(streams);
            self.pipe.cmd("PEXPIRE").arg(&index).arg(self.ttl_ms);
            self.kinds.extend([Kind::Other, Kind::Other]);
        }
    }
}

impl Writer {
    async fn run(mut self) {
        while let Some(op) = self.rx.recv().await {
            let mut bytes = self.took(&op);
            let mut batch = vec![op];
            while batch.len() < self.options.batch_ops && bytes < self.options.batch_bytes {
                let Ok(op) = self.rx.try_recv() else { break };
                bytes += self.took(&op);
                batch.push(op);
            }
            self.write(batch).await;
        }
    }

    /// An operation left the queue: its bytes no longer count against it.
    fn took(&self, op: &Op) -> usize {
        let n = op.bytes();
        self.counters.queued_bytes.fetch_sub(n, Ordering::AcqRel);
        n
    }

    async fn write(&mut self, batch: Vec<Op>) {
        let superseded = superseded_trims(&batch);
        let mut plan = Plan {
            keys: &self.keys,
            ttl_ms: self.ttl_ms,
            pipe: Pipeline::with_capacity(batch.len() + 8),
            kinds: Vec::with_capacity(batch.len() + 8),
            touched: BTreeSet::new(),
            appends: 0,
        };
        plan.pipe.ignore_errors();
        let mut flushes = Vec::new();
        for (op, superseded) in batch.into_iter().zip(superseded) {
            match op {
                Op::Append {
                    session,
                    stream,
                    seq,
                    data,
                } => {
                    plan.pipe
                        .cmd("XADD")
                        .arg(self.keys.stream(&session, stream))
                        .arg("MAXLEN")
                        .arg("~")
                        .arg(self.maxlen)
                        .arg(entry_id(seq))
                        .arg(FIELD)
                        .arg(&data[..]);
                    plan.push(Kind::Append);
                    plan.appends += 1;
                    plan.touched.insert((session, stream));
                }
                Op::Trim { .. } if superseded => {}
                Op::Trim {
                    session,
                    stream,
                    through,
                } => {
                    plan.touch();
                    plan.pipe
                        .cmd("XTRIM")
                        .arg(self.keys.stream(&session, stream))
                        .arg("MINID")
                        .arg(entry_id(through.saturating_add(1)));
                    plan.push(Kind::Other);
                }
                Op::Release { session, stream } => {
                    plan.touch();
                    plan.pipe.cmd("DEL").arg(self.keys.stream(&session, stream));
                    plan.pipe
                        .cmd("SREM")
                        .arg(self.keys.index(&session))
                        .arg(stream);
                    plan.kinds.extend([Kind::Other, Kind::Other]);
                }
                Op::ReleaseSession { session, streams } => {
                    plan.touch();
                    let del = plan.pipe.cmd("DEL").arg(self.keys.index(&session));
                    for stream in streams {
                        del.arg(self.keys.stream(&session, stream));
                    }
                    plan.push(Kind::Other);
                }
                Op::Flush(tx) => flushes.push(tx),
            }
        }
        plan.touch();
        let Plan {
            pipe,
            kinds,
            appends,
            ..
        } = plan;
        if !kinds.is_empty() {
            let sent = with_timeout(
                RedisOp::EventsWrite,
                self.options.write_timeout,
                round_trip(
                    RedisOp::EventsWrite,
                    pipe.query_async::<Vec<Value>>(&mut self.conn),
                ),
            )
            .await;
            match sent {
                Ok(replies) => self.tally(&kinds, replies, appends),
                Err(e) => self.counters.drop_events(appends, &e),
            }
        }
        for tx in flushes {
            let _ = tx.send(());
        }
    }

    /// Counts what Redis took and what it refused.
    fn tally(&self, kinds: &[Kind], replies: Vec<Value>, appends: u64) {
        if replies.len() != kinds.len() {
            metrics::redis_error(RedisOp::EventsWrite);
            return self.counters.drop_events(
                appends,
                &"Redis answered a batch with the wrong number of replies",
            );
        }
        let (mut written, mut refused, mut failed) = (0, 0, 0);
        let mut first_error = None;
        for (kind, reply) in kinds.iter().zip(replies) {
            match (kind, reply) {
                (Kind::Append, Value::ServerError(e)) => {
                    refused += 1;
                    first_error.get_or_insert(e);
                }
                (Kind::Append, _) => written += 1,
                (Kind::Other, Value::ServerError(e)) => {
                    failed += 1;
                    first_error.get_or_insert(e);
                }
                (Kind::Other, _) => {}
            }
        }
        self.counters.wrote(written);
        for _ in 0..refused + failed {
            metrics::redis_error(RedisOp::EventsWrite);
        }
        if let Some(e) = first_error {
            let why = format!(
                "Redis refused {} commands, the first with: {e}",
                refused + failed
            );
            if refused > 0 {
                self.counters.drop_events(refused, &why);
            } else if self.counters.may_warn() {
                tracing::warn!("{why}");
            }
        }
    }
}

/// For each operation of a batch, whether it is a trim that a later one of the same stream
/// covers (with no release between): of a stream's trims in a batch only the last is sent,
/// so a stream trimmed as each event is delivered costs one command per batch, not per event.
fn superseded_trims(batch: &[Op]) -> Vec<bool> {
    // The highest trim of each stream later in the batch, going backwards.
    let mut later: HashMap<(&str, u64), u64> = HashMap::new();
    let mut out: Vec<bool> = batch
        .iter()
        .rev()
        .map(|op| match op {
            Op::Trim {
                session,
                stream,
                through,
            } => {
                let key = (&**session, *stream);
                let covered = later.get(&key).is_some_and(|highest| highest >= through);
                let highest = later.entry(key).or_insert(*through);
                *highest = (*highest).max(*through);
                covered
            }
            Op::Release { session, stream } => {
                later.remove(&(&**session, *stream));
                false
            }
            Op::ReleaseSession { session, .. } => {
                later.retain(|(s, _), _| *s != &**session);
                false
            }
            _ => false,
        })
        .collect();
    out.reverse();
    out
}

// === reading Redis's answers ===

/// Times a round trip (`mcp_gateway_redis_seconds`) and counts its failure; the error's text
/// is for logs.
async fn round_trip<T>(
    op: RedisOp,
    call: impl Future<Output = RedisResult<T>>,
) -> Result<T, String> {
    let started = Instant::now();
    let result = call.await;
    metrics::record_redis(op, started.elapsed(), result.is_ok());
    result.map_err(|e| format!("redis: {e}"))
}

/// Bounds a call to Redis in time; running out counts as an error of `op`.
async fn with_timeout<T>(
    op: RedisOp,
    limit: Duration,
    call: impl Future<Output = Result<T, String>>,
) -> Result<T, String> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => {
            metrics::redis_error(op);
            Err(format!("redis: no answer within {} ms", limit.as_millis()))
        }
    }
}

/// The id of event `seq`.
fn entry_id(seq: u64) -> String {
    format!("{seq}-0")
}

/// The bytes of a string reply.
fn text(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

/// A decimal number, digits only (no sign, no spaces), that fits in a `u64`.
fn parse_number(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 20 || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// The sequence in an entry id `<seq>-0`; any other id is not one this store wrote.
fn parse_id(v: &Value) -> Result<u64, String> {
    let id = text(v).ok_or("redis: an entry id that is not a string")?;
    let seq = id
        .strip_suffix(b"-0")
        .and_then(parse_number)
        .filter(|seq| *seq > 0);
    seq.ok_or_else(|| {
        format!(
            "redis: an entry id this store did not write: {:?}",
            String::from_utf8_lossy(&id[..id.len().min(64)])
        )
    })
}

/// An `XREVRANGE` reply asked for at most `want` entries with `low <= seq <= top`: each
/// entry's sequence and event, checked to be in range, in falling order, and to have its
/// field.
fn parse_entries(
    reply: Value,
    low: u64,
    top: u64,
    want: usize,
) -> Result<Vec<(u64, Bytes)>, String> {
    let entries = match reply {
        Value::Array(entries) => entries,
        Value::Nil => Vec::new(),
        _ => return Err("redis: a range that is not a list".into()),
    };
    if entries.len() > want {
        return Err(format!(
            "redis: {} entries where at most {want} were asked for",
            entries.len()
        ));
    }
    let mut out = Vec::with_capacity(entries.len());
    let mut below = top.saturating_add(1);
    for entry in entries {
        let Value::Array(parts) = entry else {
            return Err("redis: an entry that is not a list".into());
        };
        let Ok([id, fields]) = <[Value; 2]>::try_from(parts) else {
            return Err("redis: an entry that is not an id and its fields".into());
        };
        let seq = parse_id(&id)?;
        if seq < low || seq >= below {
            return Err(format!(
                "redis: entry {seq} out of the range or the order asked for"
            ));
        }
        below = seq;
        out.push((seq, field(fields)?));
    }
    Ok(out)
}

/// The event in an entry's fields.
fn field(fields: Value) -> Result<Bytes, String> {
    let pairs: Vec<(Value, Value)> = match fields {
        Value::Array(flat) if flat.len() % 2 == 0 => {
            let mut it = flat.into_iter();
            std::iter::from_fn(|| Some((it.next()?, it.next()?))).collect()
        }
        Value::Map(pairs) => pairs,
        _ => return Err("redis: an entry whose fields are not pairs".into()),
    };
    for (name, value) in pairs {
        if text(&name) == Some(FIELD) {
            return match value {
                Value::BulkString(b) => Ok(Bytes::from(b)),
                _ => Err("redis: an event that is not a string".into()),
            };
        }
    }
    Err("redis: an entry without its event".into())
}

/// An `SSCAN` reply: the next cursor and the members.
fn parse_scan(reply: Value) -> Result<(String, Vec<Vec<u8>>), String> {
    let bad = || "redis: a scan reply that is not a cursor and a list".to_string();
    let Value::Array(parts) = reply else {
        return Err(bad());
    };
    let Ok([cursor, members]) = <[Value; 2]>::try_from(parts) else {
        return Err(bad());
    };
    let cursor = text(&cursor)
        .filter(|c| parse_number(c).is_some())
        .ok_or_else(bad)?;
    let cursor = String::from_utf8_lossy(cursor).into_owned();
    let members = match members {
        Value::Array(m) | Value::Set(m) => m,
        _ => return Err(bad()),
    };
    if members.len() > SCAN_PAGE * 10 {
        return Err(format!("redis: {} members in one scan page", members.len()));
    }
    let members = members
        .into_iter()
        .map(|m| match m {
            Value::BulkString(b) => Ok(b),
            Value::SimpleString(s) => Ok(s.into_bytes()),
            _ => Err("redis: a set member that is not a string".to_string()),
        })
        .collect::<Result<_, _>>()?;
    Ok((cursor, members))
}

/// An `XINFO STREAM` reply: where stream `n` stands.
fn parse_info(n: u64, reply: Value) -> Result<StreamPosition, String> {
    let pairs: Vec<(Value, Value)> = match reply {
        Value::Array(flat) if flat.len() % 2 == 0 => {
            let mut it = flat.into_iter();
            std::iter::from_fn(|| Some((it.next()?, it.next()?))).collect()
        }
        Value::Map(pairs) => pairs,
        _ => return Err("redis: stream info that is not pairs".into()),
    };
    let (mut last, mut first) = (None, None);
    for (name, value) in pairs {
        match text(&name) {
            Some(b"last-generated-id") => last = Some(parse_id(&value)?),
            Some(b"first-entry") => {
                first = match value {
                    Value::Nil => None,
                    Value::Array(parts) => Some(parse_id(
                        parts.first().ok_or("redis: a first entry without its id")?,
                    )?),
                    _ => return Err("redis: a first entry that is not an entry".into()),
                }
            }
            _ => {}
        }
    }
    let last = last.ok_or("redis: stream info without its last id")?;
    let next_seq = last
        .checked_add(1)
        .ok_or("redis: a last id past the last sequence")?;
    let oldest_kept = first.unwrap_or(next_seq);
    if oldest_kept > next_seq {
        return Err("redis: stream info whose first entry is past its last".into());
    }
    Ok(StreamPosition {
        stream: n,
        oldest_kept,
        next_seq,
    })
}

#[cfg(test)]
mod tests {
    //! Against the real Redis at 127.0.0.1:6379 (a test fails, never skips, without it), each
    //! test under a key prefix of its own whose keys are deleted when it ends.

    use ::redis::aio::ConnectionManagerConfig;
    use ::redis::{Client, Connection};

    use super::*;

    const REDIS: &str = "redis://127.0.0.1:6379/";

    /// A key prefix of the test's own; its keys are deleted when it is dropped, a failed
    /// test's too.
    struct Prefix(String);

    impl Prefix {
        fn new() -> Prefix {
            Prefix(format!("test-{:016x}:", rand::random::<u64>()))
        }

        fn key(&self, rest: &str) -> String {
            format!("{}{rest}", self.0)
        }

        /// Every key under the prefix now.
        fn keys(&self) -> Vec<String> {
            self.try_keys().expect("the test's keys")
        }

        fn try_keys(&self) -> RedisResult<Vec<String>> {
            let mut con = Client::open(REDIS)?.get_connection()?;
            let mut cursor = String::from("0");
            let mut keys = Vec::new();
            loop {
                let (next, page): (String, Vec<String>) = ::redis::cmd("SCAN")
                    .arg(&cursor)
                    .arg("MATCH")
                    .arg(format!("{}*", self.0))
                    .arg("COUNT")
                    .arg(1000)
                    .query(&mut con)?;
                keys.extend(page);
                if next == "0" {
                    break;
                }
                cursor = next;
            }
            keys.sort();
            keys.dedup();
            Ok(keys)
        }
    }

    impl Drop for Prefix {
        fn drop(&mut self) {
            // Never a panic here: a test that failed for want of Redis is unwinding already.
            let Ok(keys) = self.try_keys() else { return };
            if !keys.is_empty()
                && let Ok(mut con) = Client::open(REDIS).and_then(|c| c.get_connection())
            {
                let _: RedisResult<()> = ::redis::cmd("DEL").arg(keys).query(&mut con);
            }
        }
    }

    fn sync_conn() -> Connection {
        Client::open(REDIS)
            .expect("a Redis URL")
            .get_connection()
            .expect("Redis at 127.0.0.1:6379 (the tests need it)")
    }

    async fn redis() -> ConnectionManager {
        ConnectionManager::new(Client::open(REDIS).expect("a Redis URL"))
            .await
            .expect("Redis at 127.0.0.1:6379 (the tests need it)")
    }

    /// A manager for `url` that connects on first use and leaves timing out to the store.
    fn lazy(url: &str) -> ConnectionManager {
        let config = ConnectionManagerConfig::new()
            .set_number_of_retries(1)
            .set_connection_timeout(None)
            .set_response_timeout(None);
        ConnectionManager::new_lazy_with_config(Client::open(url).expect("a Redis URL"), config)
            .expect("a lazy connection manager")
    }

    fn data(stream: u64, seq: u64) -> Bytes {
        Bytes::from(format!("event {stream}/{seq}"))
    }

    fn events(stream: u64, seqs: impl IntoIterator<Item = u64>) -> Vec<(u64, Bytes)> {
        seqs.into_iter()
            .map(|seq| (seq, data(stream, seq)))
            .collect()
    }

    fn sid(id: &str) -> Arc<str> {
        Arc::from(id)
    }

    const FLUSH: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn another_replica_replays_the_same_bytes_in_order() {
        let prefix = Prefix::new();
        let a = RedisEventStore::new(redis().await, prefix.0.clone(), ReplayLimits::default());
        let id = sid("s1");
        let ea = a.session(&id);
        for seq in 1..=5 {
            ea.append(0, seq, data(0, seq));
            ea.append(3, seq, data(3, seq));
        }
        assert!(a.flush(FLUSH).await);
        assert_eq!((a.written(), a.dropped()), (10, 0));
        // This replica's own replays are memory's.
        assert_eq!(ea.replay(3, 1, 6, false).await, Ok(events(3, 2..=5)));

        let b = RedisEventStore::new(redis().await, prefix.0.clone(), ReplayLimits::default());
        let eb = b.session(&id);
        // A stream this replica never held is read from Redis.
        assert_eq!(eb.replay(3, 2, 6, false).await, Ok(events(3, 3..=5)));
        assert_eq!(eb.replay(3, 0, 4, false).await, Ok(events(3, 1..=3)));
        assert_eq!(eb.replay(3, 5, 6, false).await, Ok(vec![]));
        assert_eq!(
            eb.next_seq(0),
            None,
            "not adopted: nothing known without waiting"
        );

        let mut positions = b.adopt(&id).await.expect("adopted");
        positions.sort_by_key(|p| p.stream);
        let at = |stream| StreamPosition {
            stream,
            oldest_kept: 1,
            next_seq: 6,
        };
        assert_eq!(positions, vec![at(0), at(3)]);
        assert_eq!((eb.oldest_kept(0), eb.next_seq(0)), (Some(1), Some(6)));

        // The new owner goes on with the stream: the older part comes from Redis, the newer
        // from its memory.
        eb.append(0, 6, data(0, 6));
        eb.append(0, 7, data(0, 7));
        assert_eq!(eb.next_seq(0), Some(8));
        assert_eq!(eb.oldest_kept(0), Some(1));
        assert_eq!(eb.replay(0, 0, 8, false).await, Ok(events(0, 1..=7)));
        assert_eq!(eb.replay(0, 4, 8, false).await, Ok(events(0, 5..=7)));
        assert_eq!(eb.replay(0, 6, 8, false).await, Ok(events(0, 7..=7)));
        assert!(b.flush(FLUSH).await);
        assert_eq!(
            (b.written(), b.dropped()),
            (2, 0),
            "Redis took the new owner's events after the old owner's"
        );
        // A third replica sees both.
        let c = RedisEventStore::new(redis().await, prefix.0.clone(), ReplayLimits::default());
        let ec = c.session(&id);
        assert_eq!(ec.replay(0, 0, 8, false).await, Ok(events(0, 1..=7)));
    }

    #[tokio::test]
    async fn the_stream_bound_evicts_an_old_cursor() {
        let prefix = Prefix::new();
        let limits = ReplayLimits {
            max_events_per_stream: 10,
            ..ReplayLimits::default()
        };
        let a = RedisEventStore::new(redis().await, prefix.0.clone(), limits.clone());
        let id = sid("s");
        let ea = a.session(&id);
        for seq in 1..=500 {
            ea.append(1, seq, data(1, seq));
        }
        assert!(a.flush(FLUSH).await);
        let key = prefix.key("events:s:1");
        let len: usize = ::redis::cmd("XLEN")
            .arg(&key)
            .query(&mut sync_conn())
            .unwrap();
        assert!((10..500).contains(&len), "MAXLEN ~ 10 trimmed to {len}");

        // Read with bounds as wide as Redis's: the oldest kept is Redis's first entry.
        let wide = RedisEventStore::new(redis().await, prefix.0.clone(), ReplayLimits::default());
        let first = 501 - len as u64;
        assert_eq!(
            wide.session(&id).replay(1, 0, 501, false).await,
            Err(ReplayError::Evicted { oldest_kept: first })
        );
        assert_eq!(
            wide.session(&id).replay(1, first - 1, 501, false).await,
            Ok(events(1, first..=500))
        );
        // Read with the same bounds as the writer's: no more than memory would have kept.
        let b = RedisEventStore::new(redis().await, prefix.0.clone(), limits);
        let eb = b.session(&id);
        assert_eq!(
            eb.replay(1, 0, 501, false).await,
            Err(ReplayError::Evicted { oldest_kept: 491 })
        );
        assert_eq!(
            eb.replay(1, 489, 501, false).await,
            Err(ReplayError::Evicted { oldest_kept: 491 })
        );
        assert_eq!(
            eb.replay(1, 490, 501, false).await,
            Ok(events(1, 491..=500))
        );
        assert_eq!(eb.replay(1, 0, 501, true).await, Ok(events(1, 491..=500)));
    }

    #[tokio::test]
    async fn the_byte_bound_applies_on_the_way_back() {
        let prefix = Prefix::new();
        let a = RedisEventStore::new(redis().await, prefix.0.clone(), ReplayLimits::default());
        let id = sid("s");
        let ea = a.session(&id);
        for seq in 1..=10 {
            ea.append(1, seq, Bytes::from_static(b"four"));
        }
        assert!(a.flush(FLUSH).await);
        let small = ReplayLimits {
            max_bytes_per_stream: 10,
            ..ReplayLimits::default()
        };
        let b = RedisEventStore::new(redis().await, prefix.0.clone(), small);
        let eb = b.session(&id);
        assert_eq!(
            eb.replay(1, 0, 11, false).await,
            Err(ReplayError::Evicted { oldest_kept: 9 })
        );
        let kept = vec![
            (9, Bytes::from_static(b"four")),
            (10, Bytes::from_static(b"four")),
        ];
        assert_eq!(eb.replay(1, 8, 11, false).await, Ok(kept.clone()));
        assert_eq!(eb.replay(1, 0, 11, true).await, Ok(kept));
    }

    #[tokio::test]
    async fn release_deletes_the_keys() {
        let prefix = Prefix::new();
        let limits = ReplayLimits::default();
        let a = RedisEventStore::new(redis().await, prefix.0.clone(), limits.clone());
        let id = sid("s");
        let ea = a.session(&id);
        for seq in 1..=3 {
            ea.append(1, seq, data(1, seq));
            ea.append(2, seq, data(2, seq));
        }
        assert!(a.flush(FLUSH).await);
        let (k1, k2, index) = (
            prefix.key("events:s:1"),
            prefix.key("events:s:2"),
            prefix.key("event-streams:s"),
        );
        assert_eq!(prefix.keys(), vec![index.clone(), k1.clone(), k2.clone()]);
        let mut con = sync_conn();
        for key in [&k1, &k2, &index] {
            let ttl: i64 = ::redis::cmd("PTTL").arg(key).query(&mut con).unwrap();
            assert!(
                ttl > 0 && ttl <= limits.max_age.as_millis() as i64,
                "{key} expires with the replay age: {ttl} ms"
            );
        }
        let members: BTreeSet<u64> = ::redis::cmd("SMEMBERS")
            .arg(&index)
            .query(&mut con)
            .unwrap();
        assert_eq!(members, BTreeSet::from([1, 2]));

        ea.release(1);
        assert!(a.flush(FLUSH).await);
        assert_eq!(prefix.keys(), vec![index.clone(), k2.clone()]);
        let members: BTreeSet<u64> = ::redis::cmd("SMEMBERS")
            .arg(&index)
            .query(&mut con)
            .unwrap();
        assert_eq!(members, BTreeSet::from([2]));

        // Trimmed (delivered) events leave Redis too.
        ea.trim(2, 2);
        assert!(a.flush(FLUSH).await);
        let b = RedisEventStore::new(redis().await, prefix.0.clone(), limits.clone());
        assert_eq!(
            b.session(&id).replay(2, 0, 4, false).await,
            Err(ReplayError::Evicted { oldest_kept: 3 })
        );
        assert_eq!(
            b.session(&id).replay(2, 2, 4, false).await,
            Ok(events(2, 3..=3))
        );

        a.release_session(&id);
        assert!(a.flush(FLUSH).await);
        assert_eq!(prefix.keys(), Vec::<String>::new());
        // A stream that had not heard of the end appends once more: memory only, no key
        // comes back.
        ea.append(2, 4, data(2, 4));
        assert!(a.flush(FLUSH).await);
        assert_eq!(prefix.keys(), Vec::<String>::new());
        assert_eq!(
            b.session(&id).replay(2, 0, 5, false).await,
            Err(ReplayError::Evicted { oldest_kept: 5 })
        );
    }

    #[tokio::test]
    async fn an_adopted_session_releases_what_it_adopted() {
        let prefix = Prefix::new();
        let a = RedisEventStore::new(redis().await, prefix.0.clone(), ReplayLimits::default());
        let id = sid("s");
        let ea = a.session(&id);
        for stream in 0..3 {
            ea.append(stream, 1, data(stream, 1));
        }
        assert!(a.flush(FLUSH).await);
        let b = RedisEventStore::new(redis().await, prefix.0.clone(), ReplayLimits::default());
        assert_eq!(b.adopt(&id).await.map(|p| p.len()), Ok(3));
        b.session(&id).append(5, 1, data(5, 1));
        b.session(&id).release(1);
        assert!(b.flush(FLUSH).await);
        assert_eq!(b.session(&id).next_seq(1), None);
        assert_eq!(
            prefix.keys(),
            vec![
                prefix.key("event-streams:s"),
                prefix.key("events:s:0"),
                prefix.key("events:s:2"),
                prefix.key("events:s:5"),
            ]
        );
        b.release_session(&id);
        assert!(b.flush(FLUSH).await);
        assert_eq!(prefix.keys(), Vec::<String>::new());
    }

    /// A TCP listener that accepts connections and never answers: a Redis that hangs.
    async fn black_hole() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        format!("redis://{addr}/")
    }

    #[tokio::test]
    async fn an_unreachable_redis_fails_replays_in_time_and_never_holds_appends_up() {
        for url in ["redis://127.0.0.1:1/".to_string(), black_hole().await] {
            let options = RedisEventOptions {
                read_timeout: Duration::from_millis(300),
                write_timeout: Duration::from_millis(300),
                ..RedisEventOptions::default()
            };
            let store = RedisEventStore::with_options(
                lazy(&url),
                "unreachable:".into(),
                ReplayLimits::default(),
                options,
            );
            let id = sid("s");
            let ev = store.session(&id);
            let started = Instant::now();
            for seq in 1..=5000 {
                ev.append(0, seq, data(0, seq));
            }
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "{url}: 5000 appends took {:?}",
                started.elapsed()
            );
            // This replica's own streams are memory's, as on a gateway alone.
            assert_eq!(
                ev.replay(0, 4990, 5001, false).await,
                Ok(events(0, 4991..=5000))
            );
            assert_eq!((ev.oldest_kept(0), ev.next_seq(0)), (Some(1), Some(5001)));

            let other = store.session(&sid("other"));
            let started = Instant::now();
            let got = other.replay(0, 0, 5, false).await;
            assert!(
                matches!(got, Err(ReplayError::Backend(_))),
                "{url}: {got:?}"
            );
            assert!(
                started.elapsed() < Duration::from_millis(1300),
                "{url}: the replay failed after {:?}",
                started.elapsed()
            );
            let started = Instant::now();
            let got = store.adopt(&sid("other")).await;
            assert!(
                matches!(got, Err(ReplayError::Backend(_))),
                "{url}: {got:?}"
            );
            assert!(started.elapsed() < Duration::from_millis(1300));

            let errors = |op: RedisOp| {
                metrics::get()
                    .redis_errors
                    .with_label_values(&[op.label()])
                    .get()
            };
            assert!(errors(RedisOp::EventsRead) > 0 && errors(RedisOp::EventsAdopt) > 0);
            // Every write failed or timed out: the events stay in memory only, counted.
            assert!(store.flush(Duration::from_secs(10)).await, "{url}");
            assert_eq!((store.written(), store.dropped()), (0, 5000), "{url}");
            assert_eq!(store.usage().0, 5000);
        }
    }

    #[tokio::test]
    async fn a_full_queue_drops_only_the_redis_copy() {
        let prefix = Prefix::new();
        let options = RedisEventOptions {
            queue_ops: 4,
            ..RedisEventOptions::default()
        };
        let a = RedisEventStore::with_options(
            redis().await,
            prefix.0.clone(),
            ReplayLimits::default(),
            options,
        );
        let id = sid("s");
        let ea = a.session(&id);
        // The test's runtime has one thread: the writer cannot run while this loop does, so
        // the queue fills after four events.
        for seq in 1..=100 {
            ea.append(0, seq, data(0, seq));
        }
        assert_eq!(a.dropped(), 96);
        assert_eq!(ea.replay(0, 0, 101, false).await, Ok(events(0, 1..=100)));
        assert!(a.flush(FLUSH).await);
        assert_eq!(a.written(), 4);

        // Another replica finds a gap: the events after it are all it can resume.
        ea.append(0, 101, data(0, 101));
        assert!(a.flush(FLUSH).await);
        let b = RedisEventStore::new(redis().await, prefix.0.clone(), ReplayLimits::default());
        let eb = b.session(&id);
        assert_eq!(
            eb.replay(0, 0, 102, false).await,
            Err(ReplayError::Evicted { oldest_kept: 101 })
        );
        assert_eq!(
            eb.replay(0, 100, 102, false).await,
            Ok(events(0, 101..=101))
        );
        let mut kept = events(0, 1..=4);
        kept.extend(events(0, 101..=101));
        assert_eq!(eb.replay(0, 0, 102, true).await, Ok(kept));
        // Adopted, the new owner goes on after the last id Redis took.
        let positions = b.adopt(&id).await.unwrap();
        assert_eq!(
            positions,
            vec![StreamPosition {
                stream: 0,
                oldest_kept: 1,
                next_seq: 102
            }]
        );

        // The same by bytes.
        let prefix = Prefix::new();
        let options = RedisEventOptions {
            queue_bytes: 10,
            ..RedisEventOptions::default()
        };
        let a = RedisEventStore::with_options(
            redis().await,
            prefix.0.clone(),
            ReplayLimits::default(),
            options,
        );
        let ea = a.session(&id);
        for seq in 1..=10 {
            ea.append(0, seq, Bytes::from_static(b"four"));
        }
        assert_eq!(a.dropped(), 8);
        assert_eq!(ea.replay(0, 0, 11, false).await.map(|e| e.len()), Ok(10));
        assert!(a.flush(FLUSH).await);
        assert_eq!(a.written(), 2);
    }

    #[tokio::test]
    async fn what_redis_holds_is_checked_before_it_is_used() {
        let prefix = Prefix::new();
        let mut con = sync_conn();
        let mut raw = |args: &[&str]| {
            let mut cmd = ::redis::cmd(args[0]);
            for a in &args[1..] {
                cmd.arg(*a);
            }
            let _: Value = cmd.query(&mut con).expect("a raw command");
        };
        let (k1, k2, k3, index) = (
            prefix.key("events:h:1"),
            prefix.key("events:h:2"),
            prefix.key("events:h:3"),
            prefix.key("event-streams:h"),
        );
        raw(&["XADD", &k1, "5-7", "d", "an id this store does not write"]);
        raw(&["XADD", &k2, "1-0", "other", "no event field"]);
        raw(&["SET", &k3, "not a stream"]);
        raw(&["SADD", &index, "1"]);
        let store = RedisEventStore::new(redis().await, prefix.0.clone(), ReplayLimits::default());
        let id = sid("h");
        let ev = store.session(&id);
        for stream in 1..=3 {
            let got = ev.replay(stream, 0, 10, false).await;
            assert!(
                matches!(got, Err(ReplayError::Backend(_))),
                "stream {stream}: {got:?}"
            );
        }
        let got = store.adopt(&id).await;
        assert!(matches!(got, Err(ReplayError::Backend(_))), "{got:?}");
        raw(&["DEL", &index]);
        raw(&["SADD", &index, "not a number"]);
        let got = store.adopt(&id).await;
        assert!(matches!(got, Err(ReplayError::Backend(_))), "{got:?}");
        // A listed stream that expired since is skipped.
        raw(&["DEL", &index]);
        raw(&["SADD", &index, "9"]);
        assert_eq!(store.adopt(&id).await, Ok(vec![]));
    }

    #[test]
    fn ids_and_numbers_parse_strictly() {
        let id = |s: &str| parse_id(&Value::BulkString(s.as_bytes().to_vec()));
        assert_eq!(id("5-0"), Ok(5));
        assert_eq!(id("18446744073709551615-0"), Ok(u64::MAX));
        for bad in [
            "0-0",
            "5-1",
            "5",
            "-0",
            "+5-0",
            " 5-0",
            "18446744073709551616-0",
            "5-00",
            "",
        ] {
            assert!(id(bad).is_err(), "{bad:?}");
        }
        assert!(parse_id(&Value::Int(5)).is_err());
    }

    #[test]
    fn a_range_out_of_order_or_out_of_bounds_is_refused() {
        let entry = |id: &str| {
            Value::Array(vec![
                Value::BulkString(id.as_bytes().to_vec()),
                Value::Array(vec![
                    Value::BulkString(b"d".to_vec()),
                    Value::BulkString(b"x".to_vec()),
                ]),
            ])
        };
        let range = |ids: &[&str]| Value::Array(ids.iter().map(|i| entry(i)).collect());
        assert_eq!(
            parse_entries(range(&["3-0", "2-0"]), 1, 3, 5).map(|e| e.len()),
            Ok(2)
        );
        assert!(
            parse_entries(range(&["2-0", "3-0"]), 1, 3, 5).is_err(),
            "rising"
        );
        assert!(
            parse_entries(range(&["3-0", "3-0"]), 1, 3, 5).is_err(),
            "twice"
        );
        assert!(parse_entries(range(&["4-0"]), 1, 3, 5).is_err(), "above");
        assert!(parse_entries(range(&["1-0"]), 2, 3, 5).is_err(), "below");
        assert!(
            parse_entries(range(&["3-0", "2-0"]), 1, 3, 1).is_err(),
            "too many"
        );
        assert!(parse_entries(Value::Int(1), 1, 3, 5).is_err());
        let odd = Value::Array(vec![Value::Array(vec![Value::BulkString(b"1-0".to_vec())])]);
        assert!(parse_entries(odd, 1, 3, 5).is_err());
    }

    #[test]
    fn only_the_last_trim_of_a_stream_in_a_batch_is_sent() {
        let s = sid("s");
        let trim = |stream, through| Op::Trim {
            session: s.clone(),
            stream,
            through,
        };
        let append = |stream, seq| Op::Append {
            session: s.clone(),
            stream,
            seq,
            data: Bytes::new(),
        };
        let batch = vec![
            append(0, 1),
            trim(0, 1),
            append(0, 2),
            trim(1, 5),
            trim(0, 2),
            Op::Release {
                session: s.clone(),
                stream: 1,
            },
            trim(1, 6),
        ];
        assert_eq!(
            superseded_trims(&batch),
            vec![false, true, false, false, false, false, false]
        );
    }
}
