//! The in-process event store ([`MemoryEventStore`]): each session's events in a
//! [`SessionLog`] behind the session's own lock, bounded per stream (count, bytes), per session
//! (count, bytes) and by age. What falls out is evicted and counted; a replay that would need
//! it reports [`ReplayError::Evicted`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use dashmap::DashMap;

use super::session_log::{NONE, SessionLog};
use super::{EventStore, ReplayError, ReplayFuture, ReplayLimits, SessionEvents};

/// The in-process store. Each session's log sits behind its own lock, so sessions never
/// wait on each other; totals are summed when asked for (a metrics scrape), not kept in
/// counters every append would contend on.
pub struct MemoryEventStore {
    shared: Arc<Shared>,
    /// Hashed with foldhash, as the session table is (the key is a session id).
    sessions: DashMap<Arc<str>, Arc<MemorySession>, foldhash::fast::RandomState>,
}

/// What every session of a store uses.
struct Shared {
    limits: ReplayLimits,
    evicted: AtomicU64,
}

impl Shared {
    fn count_evicted(&self, n: u64) {
        if n > 0 {
            self.evicted.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// One session's log in [`MemoryEventStore`].
struct MemorySession {
    shared: Arc<Shared>,
    log: Mutex<SessionLog>,
}

impl MemoryEventStore {
    pub fn new(limits: ReplayLimits) -> MemoryEventStore {
        MemoryEventStore {
            shared: Arc::new(Shared {
                limits,
                evicted: AtomicU64::new(0),
            }),
            sessions: DashMap::default(),
        }
    }

    /// Events evicted so far (limits or age).
    pub fn evicted(&self) -> u64 {
        self.shared.evicted.load(Ordering::Relaxed)
    }

    /// The numbers of a session's streams that had events and were not released (what a
    /// store that copies them elsewhere must delete when the session ends).
    pub(super) fn streams_of(&self, session: &str) -> Vec<u64> {
        let Some(s) = self.sessions.get(session).map(|s| s.value().clone()) else {
            return Vec::new();
        };
        s.lock().streams.numbers().collect()
    }
}

impl MemorySession {
    fn lock(&self) -> std::sync::MutexGuard<'_, SessionLog> {
        self.log.lock().expect("session log lock")
    }

    /// Evicts the session's events past their age: oldest first, from the front of the log,
    /// so the cost is the number evicted, not the number kept.
    fn expire(&self, log: &mut SessionLog, now: Instant) {
        let max_age = self.shared.limits.max_age;
        let mut n = 0;
        while log.evict_oldest(|e| now.saturating_duration_since(e.at) > max_age) {
            n += 1;
        }
        self.shared.count_evicted(n);
    }
}

impl EventStore for MemoryEventStore {
    fn session(&self, id: &Arc<str>) -> Arc<dyn SessionEvents> {
        self.sessions
            .entry(id.clone())
            .or_insert_with(|| {
                Arc::new(MemorySession {
                    shared: self.shared.clone(),
                    log: Mutex::default(),
                })
            })
            .clone()
    }

    fn expire(&self) {
        let sessions: Vec<_> = self.sessions.iter().map(|s| s.value().clone()).collect();
        let now = Instant::now();
        for session in sessions {
            let mut log = session.lock();
            session.expire(&mut log, now);
            log.compact_if_sparse();
        }
    }

    fn release_session(&self, session: &str) {
        // Emptied now, not when the last stream lets go of it.
        if let Some((_, s)) = self.sessions.remove(session) {
            *s.lock() = SessionLog::default();
        }
    }

    fn usage(&self) -> (usize, usize) {
        let sessions: Vec<_> = self.sessions.iter().map(|s| s.value().clone()).collect();
        sessions.iter().fold((0, 0), |(events, bytes), s| {
            let log = s.lock();
            (events + log.events, bytes + log.bytes)
        })
    }
}

impl SessionEvents for MemorySession {
    fn append(&self, stream: u64, seq: u64, data: Bytes) {
        let limits = &self.shared.limits;
        let mut log = self.lock();
        let now = Instant::now();
        let (events, bytes) = log.push(stream, seq, data, now);
        if events > limits.max_events_per_stream || bytes > limits.max_bytes_per_stream {
            let mut evicted = 0;
            while log.streams.get(stream).is_some_and(|r| {
                r.events > limits.max_events_per_stream || r.bytes > limits.max_bytes_per_stream
            }) && log.pop_stream(stream)
            {
                evicted += 1;
            }
            self.shared.count_evicted(evicted);
        }
        self.expire(&mut log, now);
        // Over the session's budget: the oldest events of the session go first.
        let mut evicted = 0;
        while (log.bytes > limits.max_bytes_per_session
            || log.events > limits.max_events_per_session)
            && log.evict_oldest(|_| true)
        {
            evicted += 1;
        }
        self.shared.count_evicted(evicted);
        log.drop_gone_front();
        log.compact_if_sparse();
    }

    fn replay(&self, stream: u64, after: u64, before: u64, skip_evicted: bool) -> ReplayFuture<'_> {
        let result = (|| {
            if after + 1 >= before {
                return Ok(Vec::new());
            }
            let mut log = self.lock();
            self.expire(&mut log, Instant::now());
            let Some(rec) = log.streams.get(stream) else {
                return if skip_evicted {
                    Ok(Vec::new())
                } else {
                    Err(ReplayError::Evicted {
                        oldest_kept: before,
                    })
                };
            };
            if after + 1 < rec.first_kept && !skip_evicted {
                return Err(ReplayError::Evicted {
                    oldest_kept: rec.first_kept,
                });
            }
            Ok(log.range(rec, after, before))
        })();
        Box::pin(std::future::ready(result))
    }

    fn oldest_kept(&self, stream: u64) -> Option<u64> {
        let mut log = self.lock();
        self.expire(&mut log, Instant::now());
        log.streams.get(stream).map(|r| r.first_kept)
    }

    fn next_seq(&self, stream: u64) -> Option<u64> {
        let log = self.lock();
        let rec = log.streams.get(stream)?;
        Some(match rec.tail {
            NONE => rec.first_kept,
            tail => log.log[(tail - log.base) as usize].seq + 1,
        })
    }

    fn trim(&self, stream: u64, through: u64) {
        let mut log = self.lock();
        while let Some(head) = log
            .streams
            .get(stream)
            .map(|r| r.head)
            .filter(|h| *h != NONE)
            && log.at(head).seq <= through
        {
            log.pop_stream(stream);
        }
        log.drop_gone_front();
    }

    fn release(&self, stream: u64) {
        self.lock().release(stream);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::stream::StreamKey;

    fn key(session: &str, stream: u64) -> StreamKey {
        StreamKey {
            session: Arc::from(session),
            stream,
        }
    }

    /// The store's calls by stream key, as the tests were first written.
    trait ByKey {
        fn append(&self, k: &StreamKey, seq: u64, data: Bytes);
        fn trim(&self, k: &StreamKey, through: u64);
        fn release(&self, k: &StreamKey);
        fn next_seq(&self, k: &StreamKey) -> Option<u64>;
    }

    impl ByKey for MemoryEventStore {
        fn append(&self, k: &StreamKey, seq: u64, data: Bytes) {
            self.session(&k.session).append(k.stream, seq, data);
        }
        fn trim(&self, k: &StreamKey, through: u64) {
            self.session(&k.session).trim(k.stream, through);
        }
        fn release(&self, k: &StreamKey) {
            self.session(&k.session).release(k.stream);
        }
        fn next_seq(&self, k: &StreamKey) -> Option<u64> {
            self.session(&k.session).next_seq(k.stream)
        }
    }

    fn replay_all(
        store: &MemoryEventStore,
        k: &StreamKey,
        after: u64,
        before: u64,
    ) -> Result<Vec<(u64, Bytes)>, ReplayError> {
        let events = store.session(&k.session);
        futures_util::FutureExt::now_or_never(events.replay(k.stream, after, before, false))
            .expect("the memory store is ready at once")
    }

    fn replay(
        store: &MemoryEventStore,
        k: &StreamKey,
        after: u64,
        before: u64,
    ) -> Result<Vec<u64>, ReplayError> {
        replay_all(store, k, after, before).map(|v| v.into_iter().map(|(s, _)| s).collect())
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
            let got = replay_all(&store, &k, 0, u64::MAX);
            if mine.is_empty() {
                proptest::prop_assert!(got.is_err() || got == Ok(vec![]));
            } else {
                proptest::prop_assert_eq!(got, Ok(mine));
            }
        }
    }

    /// The store's behaviour written the plain way: every append in one list, a stream's
    /// events found by scanning it.
    #[derive(Default)]
    struct Model {
        log: Vec<(u64, u64, Bytes, bool)>,
        first_kept: std::collections::HashMap<u64, u64>,
    }

    impl Model {
        fn kill(&mut self, i: usize) {
            let (stream, seq, _, alive) = &mut self.log[i];
            *alive = false;
            self.first_kept.insert(*stream, *seq + 1);
        }

        fn kept(&self, stream: Option<u64>) -> impl Iterator<Item = usize> + '_ {
            (0..self.log.len())
                .filter(move |i| self.log[*i].3 && stream.is_none_or(|s| self.log[*i].0 == s))
        }

        fn over(&self, stream: Option<u64>, events: usize, bytes: usize) -> bool {
            self.kept(stream).count() > events
                || self
                    .kept(stream)
                    .map(|i| self.log[i].2.len())
                    .sum::<usize>()
                    > bytes
        }

        fn append(&mut self, l: &ReplayLimits, stream: u64, seq: u64, data: Bytes) {
            self.log.push((stream, seq, data, true));
            self.first_kept.entry(stream).or_insert(seq);
            while self.over(
                Some(stream),
                l.max_events_per_stream,
                l.max_bytes_per_stream,
            ) {
                let i = self.kept(Some(stream)).next().unwrap();
                self.kill(i);
            }
            while self.over(None, l.max_events_per_session, l.max_bytes_per_session) {
                let i = self.kept(None).next().unwrap();
                self.kill(i);
            }
        }

        fn trim(&mut self, stream: u64, through: u64) {
            let due: Vec<usize> = self
                .kept(Some(stream))
                .filter(|i| self.log[*i].1 <= through)
                .collect();
            for i in due {
                self.kill(i);
            }
        }

        fn release(&mut self, stream: u64) {
            for i in self.kept(Some(stream)).collect::<Vec<_>>() {
                self.log[i].3 = false;
            }
            self.first_kept.remove(&stream);
        }

        fn replay(&self, stream: u64, after: u64, before: u64) -> Result<Vec<u64>, ()> {
            if after + 1 >= before {
                return Ok(vec![]);
            }
            match self.first_kept.get(&stream) {
                Some(first) if after + 1 >= *first => Ok(self
                    .kept(Some(stream))
                    .map(|i| self.log[i].1)
                    .filter(|seq| *seq > after && *seq < before)
                    .collect()),
                _ => Err(()),
            }
        }

        fn next_seq(&self, stream: u64) -> Option<u64> {
            let first = *self.first_kept.get(&stream)?;
            Some(
                self.kept(Some(stream))
                    .map(|i| self.log[i].1 + 1)
                    .last()
                    .unwrap_or(first),
            )
        }
    }

    proptest::proptest! {
        /// Appends, trims, releases and evictions in any mix leave the store agreeing with
        /// the model on every stream's replays and positions, and on the totals.
        #[test]
        fn agrees_with_the_plain_model(
            ops in proptest::collection::vec((0u8..10, 0u64..5, 0usize..40), 0..400),
            small_session in proptest::bool::ANY,
        ) {
            let limits = ReplayLimits {
                max_events_per_stream: 6,
                max_bytes_per_stream: 60,
                max_events_per_session: if small_session { 20 } else { 10_000 },
                max_bytes_per_session: if small_session { 150 } else { 1 << 20 },
                max_age: Duration::from_secs(600),
            };
            let store = MemoryEventStore::new(limits.clone());
            let mut model = Model::default();
            let mut next = [0u64; 6];
            // Stream 5's one event stays at the front of the log (unless the session's budget
            // evicts it), so what leaves behind it piles up and the log is compacted.
            let pinned = key("s", 5);
            store.append(&pinned, 1, Bytes::from_static(b"p"));
            model.append(&limits, 5, 1, Bytes::from_static(b"p"));
            next[5] = 1;
            for (op, stream, n) in ops {
                let k = key("s", stream);
                match op {
                    0..=6 => {
                        next[stream as usize] += 1;
                        let seq = next[stream as usize];
                        let data = Bytes::from(vec![b'x'; n]);
                        store.append(&k, seq, data.clone());
                        model.append(&limits, stream, seq, data);
                    }
                    7 | 8 => {
                        let through = next[stream as usize].saturating_sub(n as u64 % 3);
                        store.trim(&k, through);
                        model.trim(stream, through);
                    }
                    _ => {
                        store.release(&k);
                        model.release(stream);
                    }
                }
                let kept: Vec<usize> = model.kept(None).collect();
                let bytes = kept.iter().map(|i| model.log[*i].2.len()).sum();
                proptest::prop_assert_eq!(store.usage(), (kept.len(), bytes));
            }
            for stream in 0..6 {
                let k = key("s", stream);
                proptest::prop_assert_eq!(store.next_seq(&k), model.next_seq(stream));
                for after in 0..next[stream as usize] {
                    proptest::prop_assert_eq!(
                        replay(&store, &k, after, u64::MAX).map_err(|_| ()),
                        model.replay(stream, after, u64::MAX)
                    );
                }
            }
        }
    }

    #[test]
    fn an_event_kept_long_does_not_hold_back_the_rest() {
        let store = MemoryEventStore::new(ReplayLimits::default());
        let get = key("s", 0);
        store.append(&get, 1, Bytes::from_static(b"kept"));
        for stream in 1..=1000 {
            let k = key("s", stream);
            store.append(&k, 1, Bytes::from_static(b"answer"));
            store.release(&k);
        }
        let session = store.sessions.get("s").unwrap().clone();
        let log = session.lock();
        assert!(
            log.log.len() <= 2 * log.events + 64,
            "the log is compacted: {} entries for {} events",
            log.log.len(),
            log.events
        );
        drop(log);
        assert_eq!(replay(&store, &get, 0, 2), Ok(vec![1]));
        assert_eq!(store.usage(), (1, 4));
    }

    #[test]
    fn a_released_session_holds_nothing_even_if_its_streams_go_on() {
        let store = MemoryEventStore::new(ReplayLimits::default());
        let events = store.session(&Arc::from("s"));
        events.append(1, 1, Bytes::from_static(b"x"));
        assert_eq!(store.usage(), (1, 1));
        store.release_session("s");
        assert_eq!(store.usage(), (0, 0));
        // A stream that had not heard of the end yet appends once more: nothing the store
        // keeps or counts, and the session is not brought back.
        events.append(1, 2, Bytes::from_static(b"y"));
        assert_eq!(store.usage(), (0, 0));
        assert!(store.sessions.is_empty());
        assert_eq!(store.session(&Arc::from("s")).next_seq(1), None);
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
