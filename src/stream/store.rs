//! Replay storage for SSE streams, behind [`EventStore`].
//!
//! Appends are synchronous and never fail: the stream that owns the events numbers them, so a
//! store that talks to a server (Redis streams, `XADD key <seq> ...`, for several replicas)
//! can queue appends and pipeline them in the background. Replays are rare (a client
//! reconnecting) and asynchronous. [`MemoryEventStore`] keeps events in this process, bounded
//! per stream (count, bytes), per session (bytes) and by age; what falls out is evicted, and a
//! replay that would need it reports [`ReplayError::Evicted`] rather than silently skipping.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dashmap::DashMap;

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

pub trait EventStore: Send + Sync + 'static {
    /// Keeps event `seq` of a stream. Sequences of one stream arrive in increasing order.
    fn append(&self, key: &StreamKey, seq: u64, data: Bytes);

    /// The events with `after < seq < before`, in order. `Evicted` when any of them is gone,
    /// unless `skip_evicted`, which returns what is still kept.
    fn replay(
        &self,
        key: &StreamKey,
        after: u64,
        before: u64,
        skip_evicted: bool,
    ) -> ReplayFuture<'_>;

    /// The lowest sequence still kept for a stream that ever had events, when the store can
    /// tell without waiting (checked before a connection is swapped for a resuming one).
    fn oldest_kept(&self, key: &StreamKey) -> Option<u64>;

    /// The sequence a stream's next event would have, when the store still knows the stream
    /// (`None` once it is released or never had an event). A finished stream that is no longer
    /// in memory is rebuilt from this when a client resumes it.
    fn next_seq(&self, key: &StreamKey) -> Option<u64>;

    /// Forgets a stream's events up to and including `through` (delivered, not kept for
    /// replay when resumption is off).
    fn trim(&self, key: &StreamKey, through: u64);

    /// Evicts events past their age everywhere (periodic maintenance).
    fn expire(&self);

    /// Forgets a stream's events.
    fn release(&self, key: &StreamKey);

    /// Forgets every stream of a session.
    fn release_session(&self, session: &str);

    /// Events and bytes held now, for metrics.
    fn usage(&self) -> (usize, usize);
}

/// Bounds on what is kept for replay.
#[derive(Debug, Clone)]
pub struct ReplayLimits {
    pub max_events_per_stream: usize,
    pub max_bytes_per_stream: usize,
    pub max_events_per_session: usize,
    pub max_bytes_per_session: usize,
    pub max_age: Duration,
}

impl Default for ReplayLimits {
    fn default() -> Self {
        ReplayLimits {
            max_events_per_stream: 10_000,
            max_bytes_per_stream: 4 * 1024 * 1024,
            max_events_per_session: 50_000,
            max_bytes_per_session: 16 * 1024 * 1024,
            max_age: Duration::from_secs(600),
        }
    }
}

struct Entry {
    seq: u64,
    data: Bytes,
}

struct StreamBuf {
    events: VecDeque<Entry>,
    bytes: usize,
    /// The lowest sequence still replayable: everything below was evicted.
    first_kept: u64,
}

#[derive(Default)]
struct SessionBufs {
    /// By number. Numbers rise, and streams mostly come and go in that order (a POST's stream
    /// lingers a fixed time after its answer), so an ordered map works at its two ends, which
    /// stay in cache, where a hash map would touch a random slot of a table of thousands.
    streams: BTreeMap<u64, StreamBuf>,
    events: usize,
    bytes: usize,
    /// Every append, oldest first, as (stream, sequence, time): where the session's oldest
    /// event is, and when it came, without scanning its streams. Entries whose event already
    /// went are skipped when met, and compacted away when they pile up.
    order: VecDeque<(u64, u64, Instant)>,
}

/// The in-process store. Each session's buffers sit behind their own lock, so sessions never
/// wait on each other; totals are summed when asked for (a metrics scrape), not kept in
/// counters every append would contend on.
pub struct MemoryEventStore {
    limits: ReplayLimits,
    /// Hashed with foldhash, as the session table is (the key is a session id).
    sessions: DashMap<Arc<str>, Arc<Mutex<SessionBufs>>, foldhash::fast::RandomState>,
    evicted: AtomicU64,
}

impl MemoryEventStore {
    pub fn new(limits: ReplayLimits) -> MemoryEventStore {
        MemoryEventStore {
            limits,
            sessions: DashMap::default(),
            evicted: AtomicU64::new(0),
        }
    }

    /// Events evicted so far (limits or age).
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    fn session(&self, id: &Arc<str>) -> Option<Arc<Mutex<SessionBufs>>> {
        self.sessions.get(id).map(|s| s.clone())
    }

    /// Drops a stream's oldest event; `evicted` when it goes for lack of room or age.
    fn pop_front(&self, session: &mut SessionBufs, stream: u64, evicted: bool) {
        let Some(buf) = session.streams.get_mut(&stream) else {
            return;
        };
        if let Some(e) = buf.events.pop_front() {
            buf.bytes -= e.data.len();
            buf.first_kept = e.seq + 1;
            session.bytes -= e.data.len();
            session.events -= 1;
            if evicted {
                self.evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Drops the session's oldest event if it is still kept; `false` when no entry is left.
    fn evict_oldest(&self, session: &mut SessionBufs) -> bool {
        let Some((stream, seq, _)) = session.order.pop_front() else {
            return false;
        };
        let is_front = session
            .streams
            .get(&stream)
            .and_then(|b| b.events.front())
            .is_some_and(|e| e.seq == seq);
        if is_front {
            self.pop_front(session, stream, true);
        }
        true
    }

    /// Evicts the session's events past their age: oldest first, from the front of the
    /// append order, so the cost is the number evicted, not the number kept.
    fn expire_session(&self, session: &mut SessionBufs, now: Instant) {
        while session
            .order
            .front()
            .is_some_and(|(.., at)| now.saturating_duration_since(*at) > self.limits.max_age)
        {
            self.evict_oldest(session);
        }
    }
}

impl EventStore for MemoryEventStore {
    fn append(&self, key: &StreamKey, seq: u64, data: Bytes) {
        let len = data.len();
        let session = match self.session(&key.session) {
            Some(s) => s,
            None => self
                .sessions
                .entry(key.session.clone())
                .or_default()
                .clone(),
        };
        let mut session = session.lock().expect("session buffers lock");
        let buf = session
            .streams
            .entry(key.stream)
            .or_insert_with(|| StreamBuf {
                events: VecDeque::new(),
                bytes: 0,
                first_kept: seq,
            });
        buf.events.push_back(Entry { seq, data });
        buf.bytes += len;
        let over = |b: &StreamBuf| {
            b.events.len() > self.limits.max_events_per_stream
                || b.bytes > self.limits.max_bytes_per_stream
        };
        let over_stream = over(buf);
        session.bytes += len;
        session.events += 1;
        let now = Instant::now();
        session.order.push_back((key.stream, seq, now));
        if over_stream {
            while session.streams.get(&key.stream).is_some_and(&over) {
                self.pop_front(&mut session, key.stream, true);
            }
        }
        self.expire_session(&mut session, now);
        // Over the session's budget: the oldest events of the session go first.
        while (session.bytes > self.limits.max_bytes_per_session
            || session.events > self.limits.max_events_per_session)
            && self.evict_oldest(&mut session)
        {}
        // Entries for events that left by other ways (stream limits, age, release).
        if session.order.len() > 2 * session.events + 64 {
            let SessionBufs { streams, order, .. } = &mut *session;
            order.retain(|(stream, seq, _)| {
                streams
                    .get(stream)
                    .and_then(|b| b.events.front())
                    .is_some_and(|front| *seq >= front.seq)
            });
        }
    }

    fn replay(
        &self,
        key: &StreamKey,
        after: u64,
        before: u64,
        skip_evicted: bool,
    ) -> ReplayFuture<'_> {
        let result = (|| {
            if after + 1 >= before {
                return Ok(Vec::new());
            }
            let gone = Err(ReplayError::Evicted {
                oldest_kept: before,
            });
            let Some(session) = self.session(&key.session) else {
                return if skip_evicted { Ok(Vec::new()) } else { gone };
            };
            let mut session = session.lock().expect("session buffers lock");
            self.expire_session(&mut session, Instant::now());
            let Some(buf) = session.streams.get(&key.stream) else {
                return if skip_evicted { Ok(Vec::new()) } else { gone };
            };
            if after + 1 < buf.first_kept && !skip_evicted {
                return Err(ReplayError::Evicted {
                    oldest_kept: buf.first_kept,
                });
            }
            Ok(buf
                .events
                .iter()
                .filter(|e| e.seq > after && e.seq < before)
                .map(|e| (e.seq, e.data.clone()))
                .collect())
        })();
        Box::pin(std::future::ready(result))
    }

    fn oldest_kept(&self, key: &StreamKey) -> Option<u64> {
        let session = self.session(&key.session)?;
        let mut session = session.lock().expect("session buffers lock");
        self.expire_session(&mut session, Instant::now());
        session.streams.get(&key.stream).map(|b| b.first_kept)
    }

    fn next_seq(&self, key: &StreamKey) -> Option<u64> {
        let session = self.session(&key.session)?;
        let session = session.lock().expect("session buffers lock");
        let buf = session.streams.get(&key.stream)?;
        Some(buf.events.back().map_or(buf.first_kept, |e| e.seq + 1))
    }

    fn trim(&self, key: &StreamKey, through: u64) {
        let Some(session) = self.session(&key.session) else {
            return;
        };
        let mut session = session.lock().expect("session buffers lock");
        while session
            .streams
            .get(&key.stream)
            .and_then(|b| b.events.front())
            .is_some_and(|e| e.seq <= through)
        {
            self.pop_front(&mut session, key.stream, false);
        }
    }

    fn expire(&self) {
        let sessions: Vec<_> = self.sessions.iter().map(|s| s.value().clone()).collect();
        let now = Instant::now();
        for session in sessions {
            self.expire_session(&mut session.lock().expect("session buffers lock"), now);
        }
    }

    fn release(&self, key: &StreamKey) {
        let Some(session) = self.session(&key.session) else {
            return;
        };
        let mut session = session.lock().expect("session buffers lock");
        if let Some(buf) = session.streams.remove(&key.stream) {
            session.bytes -= buf.bytes;
            session.events -= buf.events.len();
        }
    }

    fn release_session(&self, session: &str) {
        self.sessions.remove(session);
    }

    fn usage(&self) -> (usize, usize) {
        let sessions: Vec<_> = self.sessions.iter().map(|s| s.value().clone()).collect();
        sessions.iter().fold((0, 0), |(events, bytes), s| {
            let s = s.lock().expect("session buffers lock");
            (events + s.events, bytes + s.bytes)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(session: &str, stream: u64) -> StreamKey {
        StreamKey {
            session: Arc::from(session),
            stream,
        }
    }

    fn replay(
        store: &MemoryEventStore,
        k: &StreamKey,
        after: u64,
        before: u64,
    ) -> Result<Vec<u64>, ReplayError> {
        let fut = store.replay(k, after, before, false);
        futures_util::FutureExt::now_or_never(fut)
            .expect("the memory store is ready at once")
            .map(|v| v.into_iter().map(|(s, _)| s).collect())
    }

    fn limits(events: usize, bytes: usize, session: usize) -> ReplayLimits {
        ReplayLimits {
            max_events_per_stream: events,
            max_bytes_per_stream: bytes,
            max_events_per_session: 1000,
            max_bytes_per_session: session,
            max_age: Duration::from_secs(600),
        }
    }

    #[test]
    fn replays_a_range_and_only_that_stream() {
        let store = MemoryEventStore::new(ReplayLimits::default());
        let (a, b) = (key("s", 1), key("s", 2));
        for seq in 1..=5 {
            store.append(&a, seq, Bytes::from(format!("a{seq}")));
            store.append(&b, seq, Bytes::from(format!("b{seq}")));
        }
        assert_eq!(replay(&store, &a, 2, 5), Ok(vec![3, 4]));
        assert_eq!(replay(&store, &a, 0, 6), Ok(vec![1, 2, 3, 4, 5]));
        assert_eq!(replay(&store, &a, 5, 6), Ok(vec![]));
        assert_eq!(store.usage(), (10, 20));
        store.release(&a);
        assert!(matches!(
            replay(&store, &a, 0, 6),
            Err(ReplayError::Evicted { .. })
        ));
        assert_eq!(replay(&store, &b, 0, 6), Ok(vec![1, 2, 3, 4, 5]));
        store.release_session("s");
        assert_eq!(store.usage(), (0, 0));
    }

    #[test]
    fn bounds_evict_oldest_first_and_say_so() {
        let store = MemoryEventStore::new(limits(3, 1000, 1000));
        let k = key("s", 1);
        for seq in 1..=5 {
            store.append(&k, seq, Bytes::from_static(b"xx"));
        }
        assert_eq!(replay(&store, &k, 2, 6), Ok(vec![3, 4, 5]));
        assert_eq!(
            replay(&store, &k, 1, 6),
            Err(ReplayError::Evicted { oldest_kept: 3 })
        );
        assert_eq!(store.evicted(), 2);

        let store = MemoryEventStore::new(limits(100, 5, 1000));
        for seq in 1..=4 {
            store.append(&k, seq, Bytes::from_static(b"xx"));
        }
        assert_eq!(replay(&store, &k, 2, 5), Ok(vec![3, 4]), "bytes per stream");

        let store = MemoryEventStore::new(limits(100, 100, 6));
        let other = key("s", 2);
        store.append(&k, 1, Bytes::from_static(b"xx"));
        store.append(&other, 1, Bytes::from_static(b"xx"));
        store.append(&k, 2, Bytes::from_static(b"xx"));
        store.append(&other, 2, Bytes::from_static(b"xx"));
        assert!(
            replay(&store, &k, 0, 3).is_err(),
            "the session's oldest event went first"
        );
        assert_eq!(replay(&store, &other, 0, 3), Ok(vec![1, 2]));
        assert_eq!(store.usage(), (3, 6));

        let store = MemoryEventStore::new(ReplayLimits {
            max_events_per_session: 3,
            ..ReplayLimits::default()
        });
        for seq in 1..=2 {
            store.append(&k, seq, Bytes::from_static(b"x"));
            store.append(&other, seq, Bytes::from_static(b"x"));
        }
        assert_eq!(store.usage().0, 3, "events per session");
        assert!(replay(&store, &k, 0, 3).is_err());
    }

    proptest::proptest! {
        #[test]
        fn a_replay_holds_only_its_own_streams_events(
            appends in proptest::collection::vec((0u64..4, 0usize..3), 0..200),
            stream in 0u64..4,
            session in 0usize..3,
        ) {
            let store = MemoryEventStore::new(ReplayLimits::default());
            let sessions = ["a", "b", "c"];
            let mut next = std::collections::HashMap::new();
            let mut mine = Vec::new();
            for (st, se) in appends {
                let seq = next.entry((st, se)).or_insert(0u64);
                *seq += 1;
                let data = Bytes::from(format!("{se}/{st}/{seq}"));
                store.append(&key(sessions[se], st), *seq, data.clone());
                if st == stream && se == session {
                    mine.push((*seq, data));
                }
            }
            let k = key(sessions[session], stream);
            let got = futures_util::FutureExt::now_or_never(store.replay(&k, 0, u64::MAX, false)).unwrap();
            if mine.is_empty() {
                proptest::prop_assert!(got.is_err() || got == Ok(vec![]));
            } else {
                proptest::prop_assert_eq!(got, Ok(mine));
            }
        }
    }

    #[test]
    fn knows_where_a_kept_stream_goes_on() {
        let store = MemoryEventStore::new(limits(2, 1000, 1000));
        let k = key("s", 3);
        assert_eq!(store.next_seq(&k), None);
        for seq in 1..=4 {
            store.append(&k, seq, Bytes::from_static(b"x"));
        }
        assert_eq!(store.next_seq(&k), Some(5));
        store.trim(&k, 4);
        assert_eq!(
            store.next_seq(&k),
            Some(5),
            "an emptied stream is still known"
        );
        store.release(&k);
        assert_eq!(store.next_seq(&k), None);
    }

    #[test]
    fn old_events_expire() {
        let store = MemoryEventStore::new(ReplayLimits {
            max_age: Duration::ZERO,
            ..ReplayLimits::default()
        });
        let k = key("s", 1);
        store.append(&k, 1, Bytes::from_static(b"x"));
        std::thread::sleep(Duration::from_millis(2));
        assert!(replay(&store, &k, 0, 2).is_err());
    }
}
