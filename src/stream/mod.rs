//! Streams towards a client: a POST's answer stream, or the session's GET stream.
//!
//! A [`Stream`] outlives its HTTP connections. Each event gets the next sequence number of its
//! stream and an id that names it ([`EventId`]), goes to the event store ([`EventStore`]) when
//! the stream is resumable, and to the connection attached now, if any. A client that lost the
//! connection attaches a new one with `Last-Event-ID`: it gets what the store holds after that
//! cursor, then the live events. A dropped connection is not a cancellation: the work goes on
//! and its events wait in the store. A POST stream ends once every request in the POST has been
//! answered (or dropped on cancellation); when its last event has gone out on a connection, the
//! stream and its buffer are released.
//!
//! The producer side ([`Sink`]) never blocks: it appends and sends on the connection's queue
//! without waiting, under a short lock that is never held across an await.
//!
//! Where things are: this file holds the [`Stream`] state machine (its state, hooks and
//! release); `sink` the producing end and how an event is taken in; `connection` the
//! consuming end (cursors, the live queue, attach and detach); `sse` the wire (SSE encoding,
//! the SSE or JSON response); `store` the replay buffers behind [`EventStore`]; `event_id`,
//! `read_proof` and `by_number` one job each. Besides `config` (its settings) and `metrics`
//! (the open-streams gauge) it imports no other module of the crate.

mod by_number;
mod connection;
mod event_id;
mod read_proof;
mod sink;
mod sse;
pub mod store;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use self::connection::Conn;

// How streams behave is a setting, so it lives in `config`; re-exported for old paths.
pub use crate::config::StreamSettings;
pub use by_number::ByNumber;
pub use connection::{AttachError, Attached, Cursor, Cut, LIVE_QUEUE_BYTES, StreamGuard};
pub use event_id::{EventId, EventIdError};
pub use read_proof::ReadProof;
pub use sink::Sink;
pub use sse::{Opening, collect_responses, sse_response};
pub use store::{
    Adopted, EventStore, MemoryEventStore, RedisEventOptions, RedisEventStore, ReplayError,
    ReplayLimits, SessionEvents, SessionNames, StreamKey, StreamPosition,
};

/// What a stream hands its connection.
#[derive(Debug)]
pub enum Frame {
    Event {
        seq: u64,
        data: Bytes,
    },
    /// Every request of the stream is answered: the connection ends after what came before.
    End,
}

/// One stream of a session.
pub struct Stream {
    key: StreamKey,
    /// The session's event-id tag.
    tag: u32,
    /// SSE (carries requests and notifications) or one JSON body (responses only).
    sse: bool,
    buffering: Buffering,
    /// The GET stream (nothing owed): it remembers what reached a connection, for
    /// `Cursor::Undelivered`. A POST stream skips that bookkeeping.
    tracks_delivery: bool,
    /// Its session's events in the store.
    events: Arc<dyn SessionEvents>,
    inner: Mutex<Inner>,
    /// What the stream tells its session (`None` for streams no session tracks); one for all
    /// of a session's streams.
    hooks: Option<Arc<dyn StreamHooks>>,
    /// Its request waits, parked, for its client's retry (a bridged call between rounds):
    /// see [`Sink::waiting`].
    waiting: std::sync::atomic::AtomicBool,
}

/// What a stream keeps in the event store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buffering {
    /// Nothing: events go to the connection attached now, or nowhere.
    None,
    /// Every event, for resumption with `Last-Event-ID` (within the store's limits).
    Replay,
    /// Events until a connection has taken them (a GET stream when resumption is off).
    UntilDelivered,
}

/// How a stream tells its session about its end.
pub trait StreamHooks: Send + Sync {
    /// The stream went out to its end on a connection at `at`: release it after the linger
    /// time.
    fn finished(&self, stream: u64, at: Instant);
    /// The client read the finished stream to its end ([`ReadProof`]): release it now.
    fn read(&self, stream: u64);
    /// The stream is released: forget it.
    fn released(&self, stream: u64);
    /// The stream is released with requests on it still unanswered (its client went away
    /// from an unbuffered stream, or its session ended): called just before
    /// [`StreamHooks::released`].
    fn cut_short(&self, _stream: u64) {}
}

/// Rewrites a response before it is kept or sent (see [`Stream::rewrite_responses`]).
pub type Rewrite = Arc<dyn Fn(Bytes) -> Bytes + Send + Sync>;

struct Inner {
    /// Applied to each response before it is kept or sent.
    rewrite: Option<Rewrite>,
    next_seq: u64,
    conn: Option<Conn>,
    attaches: u64,
    /// Responses still owed (a POST stream); `None` for the GET stream, which never ends.
    owed: Option<usize>,
    /// The highest sequence handed to a connection (kept for the GET stream only).
    delivered: u64,
    /// Released: nothing more is taken, and no connection attaches again.
    released: bool,
    /// When the last connection went away without finishing the stream.
    detached_at: Option<Instant>,
    /// Bytes a connection writing to a socket may have queued before it counts as too slow
    /// ([`LIVE_QUEUE_BYTES`] unless the stream says less).
    queue_limit: usize,
}

impl Frame {
    fn bytes(&self) -> usize {
        match self {
            Frame::Event { data, .. } => data.len(),
            Frame::End => 0,
        }
    }
}

impl Stream {
    pub fn new(
        key: StreamKey,
        tag: u32,
        sse: bool,
        buffering: Buffering,
        events: Arc<dyn SessionEvents>,
        owed: Option<usize>,
        hooks: Option<Arc<dyn StreamHooks>>,
    ) -> Arc<Stream> {
        Arc::new(Stream {
            key,
            tag,
            sse,
            buffering,
            tracks_delivery: owed.is_none(),
            events,
            inner: Mutex::new(Inner {
                rewrite: None,
                next_seq: 1,
                conn: None,
                attaches: 0,
                owed,
                delivered: 0,
                released: false,
                detached_at: None,
                queue_limit: LIVE_QUEUE_BYTES,
            }),
            hooks,
            waiting: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// A finished POST stream brought back from the store for a client resuming it after it
    /// left memory: it replays what the store keeps, then ends.
    pub fn finished(
        key: StreamKey,
        tag: u32,
        events: Arc<dyn SessionEvents>,
        next_seq: u64,
        hooks: Option<Arc<dyn StreamHooks>>,
    ) -> Arc<Stream> {
        let s = Stream::new(key, tag, true, Buffering::Replay, events, Some(0), hooks);
        s.lock().next_seq = next_seq;
        s
    }

    /// Says whether its request waits, parked, for its client's retry.
    pub fn set_waiting(&self, waiting: bool) {
        self.waiting
            .store(waiting, std::sync::atomic::Ordering::Release);
    }

    /// Has every response of this stream rewritten before it is kept or sent (a modern
    /// client's results get `resultType`), set before any response comes.
    pub fn rewrite_responses(&self, rewrite: Rewrite) {
        self.lock().rewrite = Some(rewrite);
    }

    /// Lowers the bytes a connection may fall behind by before it is dropped and cut (a
    /// long-lived stream of small notifications needs far less than a call's answer).
    pub fn limit_queue_bytes(&self, bytes: usize) {
        let mut g = self.lock();
        g.queue_limit = g.queue_limit.min(bytes);
    }

    /// Its response has begun, as one body holding the whole stream (`whole`) or live: a
    /// shared store's copy held back since the stream was made is dropped or sent
    /// ([`SessionEvents::held`]).
    pub fn response_began(&self, whole: bool) {
        self.events.held(self.key.stream, !whole);
    }

    /// Whether this stream has carried one event and it was the answer that ended it (a
    /// POST whose first message was its answer). Read once that event has come.
    pub fn answered_alone(&self) -> bool {
        let g = self.lock();
        g.next_seq == 2 && g.owed == Some(0)
    }

    /// Takes a stream over from where another replica left it in the shared store (an
    /// adopted session): its next event is `next_seq`, and it counts as left by its client
    /// now, so it is released if nobody resumes it within the replay age.
    pub fn resume_at(&self, next_seq: u64) {
        let mut g = self.lock();
        g.next_seq = g.next_seq.max(next_seq);
        if g.conn.is_none() {
            g.detached_at = Some(Instant::now());
        }
    }

    pub fn number(&self) -> u64 {
        self.key.stream
    }

    /// The id of this stream's event `seq`.
    pub fn event_id(&self, seq: u64) -> EventId {
        EventId {
            tag: self.tag,
            stream: self.key.stream,
            seq,
            prime: None,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("stream lock")
    }

    fn buffered(&self) -> bool {
        self.buffering != Buffering::None
    }

    /// Whether a connection is attached and listening now.
    pub fn has_connection(&self) -> bool {
        self.lock().conn.as_ref().is_some_and(|c| !c.tx.is_closed())
    }

    /// Whether a connection is attached (listening or not yet noticed gone).
    pub fn is_attached(&self) -> bool {
        self.lock().conn.is_some()
    }

    /// A POST stream whose connection has been gone for longer than `max_age`.
    pub fn abandoned_for(&self, max_age: Duration) -> bool {
        let g = self.lock();
        g.conn.is_none() && g.detached_at.is_some_and(|t| t.elapsed() > max_age)
    }

    pub fn is_released(&self) -> bool {
        self.lock().released
    }

    /// Releases the stream if no connection is attached (its linger time is over), in one
    /// step, so a client resuming at this moment is not cut off.
    pub fn release_if_detached(&self) -> bool {
        let release = {
            let mut g = self.lock();
            let release = !g.released && g.conn.is_none();
            if release {
                g.released = true;
            }
            release
        };
        if release {
            self.release_buffer();
        }
        release
    }

    /// Releases the stream now (its session ends, or it was abandoned).
    pub fn release(&self) {
        let was = {
            let mut g = self.lock();
            g.conn = None;
            std::mem::replace(&mut g.released, true)
        };
        if !was {
            self.release_buffer();
        }
    }

    fn release_buffer(&self) {
        if self.buffered() {
            self.events.release(self.key.stream);
        }
        if let Some(h) = &self.hooks {
            if self.lock().owed.is_some_and(|n| n > 0) {
                h.cut_short(self.key.stream);
            }
            h.released(self.key.stream);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::connection::LIVE_QUEUE;
    use super::*;

    fn stream(owed: Option<usize>, buffered: bool) -> (Arc<Stream>, Arc<MemoryEventStore>) {
        let store = Arc::new(MemoryEventStore::new(ReplayLimits::default()));
        let key = StreamKey {
            session: Arc::from("s"),
            stream: 1,
        };
        let buffering = if buffered {
            Buffering::Replay
        } else {
            Buffering::None
        };
        (
            Stream::new(
                key,
                7,
                true,
                buffering,
                store.session(&Arc::from("s")),
                owed,
                None,
            ),
            store,
        )
    }

    fn drain(a: &mut Attached) -> Vec<String> {
        let a = a.0.as_mut().unwrap();
        let mut out: Vec<String> = a
            .replay
            .drain(..)
            .map(|(s, d)| format!("{s}:{}", String::from_utf8_lossy(&d)))
            .collect();
        while let Ok(f) = a.rx.try_recv() {
            out.push(match f {
                Frame::Event { seq, data } => format!("{seq}:{}", String::from_utf8_lossy(&data)),
                Frame::End => "end".into(),
            });
        }
        out
    }

    #[tokio::test]
    async fn a_new_connection_replays_after_its_cursor_then_goes_live() {
        let (s, _) = stream(Some(1), true);
        let sink = Sink::new(s.clone());
        let mut a = s.attach(Cursor::Start, None).await.unwrap();
        sink.message(Bytes::from_static(b"one")).unwrap();
        sink.message(Bytes::from_static(b"two")).unwrap();
        assert_eq!(drain(&mut a), ["1:one", "2:two"]);
        // The connection drops; work goes on.
        drop(a);
        sink.message(Bytes::from_static(b"three")).unwrap();
        let mut b = s.attach(Cursor::After(1), None).await.unwrap();
        sink.respond(Bytes::from_static(b"done"));
        assert_eq!(drain(&mut b), ["2:two", "3:three", "4:done", "end"]);
        assert_eq!(
            s.attach(Cursor::After(9), None).await.err(),
            Some(AttachError::BeyondEnd(9))
        );
    }

    #[derive(Default)]
    struct Calls(Mutex<Vec<String>>);

    impl StreamHooks for Calls {
        fn finished(&self, stream: u64, _: Instant) {
            self.0.lock().unwrap().push(format!("finished {stream}"));
        }
        fn read(&self, stream: u64) {
            self.0.lock().unwrap().push(format!("read {stream}"));
        }
        fn released(&self, stream: u64) {
            self.0.lock().unwrap().push(format!("released {stream}"));
        }
    }

    #[tokio::test]
    async fn a_replaced_connection_ends_and_a_finished_stream_lingers_until_released() {
        let store = Arc::new(MemoryEventStore::new(ReplayLimits::default()));
        let calls = Arc::new(Calls::default());
        let key = StreamKey {
            session: Arc::from("s"),
            stream: 4,
        };
        let s = Stream::new(
            key,
            7,
            true,
            Buffering::Replay,
            store.session(&Arc::from("s")),
            Some(1),
            Some(calls.clone()),
        );
        let sink = Sink::new(s.clone());
        let mut first = s.attach(Cursor::Start, None).await.unwrap();
        let second = s.attach(Cursor::Start, None).await.unwrap();
        let rx = &mut first.0.as_mut().unwrap().rx;
        assert!(
            rx.recv().await.is_none(),
            "the old connection's channel closed"
        );
        sink.respond(Bytes::from_static(b"r"));
        assert_eq!(store.usage().0, 1);
        // The body that carried End finished: the session is told, the events stay for now.
        let parts = second.take();
        s.detach(parts.conn, true);
        assert!(!s.is_released());
        let mut again = s.attach(Cursor::After(0), None).await.unwrap();
        assert_eq!(drain(&mut again), ["1:r", "end"]);
        drop(again);
        s.release();
        assert_eq!(store.usage(), (0, 0));
        assert_eq!(*calls.0.lock().unwrap(), ["finished 4", "released 4"]);
        assert_eq!(
            s.attach(Cursor::Start, None).await.err(),
            Some(AttachError::Released)
        );
        assert!(sink.message(Bytes::from_static(b"late")).is_err());
    }

    #[tokio::test]
    async fn unbuffered_streams_give_messages_back_without_a_connection() {
        let (s, store) = stream(Some(2), false);
        let sink = Sink::new(s.clone());
        assert!(sink.message(Bytes::from_static(b"m")).is_err());
        let a = s.attach(Cursor::Start, None).await.unwrap();
        assert!(sink.message(Bytes::from_static(b"m")).is_ok());
        drop(a);
        assert!(
            sink.message(Bytes::from_static(b"m")).is_err(),
            "released with its connection"
        );
        assert_eq!(store.usage(), (0, 0));
    }

    #[tokio::test]
    async fn regression_nothing_is_taken_after_the_last_response() {
        // Guards: a message accepted after the stream's End was queued behind it and lost.
        let (s, _) = stream(Some(1), true);
        let sink = Sink::new(s.clone());
        let _a = s.attach(Cursor::Start, None).await.unwrap();
        sink.dropped();
        assert!(!sink.carries_messages());
        assert!(sink.message(Bytes::from_static(b"late")).is_err());
    }

    #[tokio::test]
    async fn until_delivered_keeps_only_what_no_connection_took() {
        let store = Arc::new(MemoryEventStore::new(ReplayLimits::default()));
        let key = StreamKey {
            session: Arc::from("s"),
            stream: 0,
        };
        let s = Stream::new(
            key,
            7,
            true,
            Buffering::UntilDelivered,
            store.session(&Arc::from("s")),
            None,
            None,
        );
        let sink = Sink::new(s.clone());
        sink.message(Bytes::from_static(b"a")).unwrap();
        sink.message(Bytes::from_static(b"b")).unwrap();
        assert_eq!(store.usage().0, 2);
        s.delivered(1);
        assert_eq!(store.usage().0, 1);
    }

    #[tokio::test]
    async fn a_slow_connection_is_dropped_and_resumes_from_the_store() {
        let (s, _) = stream(None, true);
        let sink = Sink::new(s.clone());
        let a = s.attach(Cursor::Undelivered, None).await.unwrap();
        for _ in 0..=LIVE_QUEUE {
            sink.message(Bytes::from_static(b"x")).unwrap();
        }
        assert!(!s.is_attached(), "dropped once its queue was full");
        drop(a);
        let mut b = s.attach(Cursor::After(0), None).await.unwrap();
        assert_eq!(
            drain(&mut b).len(),
            LIVE_QUEUE + 1,
            "everything is in the store"
        );
    }

    #[tokio::test]
    async fn a_connection_that_falls_behind_in_bytes_is_cut() {
        let (s, _) = stream(None, true);
        let sink = Sink::new(s.clone());
        let cut = Cut::default();
        let mut a = s
            .attach(Cursor::Undelivered, Some(cut.clone()))
            .await
            .unwrap();
        // One event larger than the bound goes out on an empty queue.
        let big = Bytes::from(vec![b'x'; LIVE_QUEUE_BYTES + 1]);
        sink.message(big.clone()).unwrap();
        assert!(s.is_attached());
        assert_eq!(drain(&mut a).len(), 1);
        let chunk = Bytes::from(vec![b'y'; LIVE_QUEUE_BYTES / 4]);
        for _ in 0..4 {
            sink.message(chunk.clone()).unwrap();
        }
        assert!(s.is_attached(), "exactly at the bound");
        assert!(!cut.0.is_cancelled());
        sink.message(Bytes::from_static(b"z")).unwrap();
        assert!(!s.is_attached(), "dropped past the bound");
        assert!(cut.0.is_cancelled(), "and its connection cut");
        drop(a);
        let mut b = s.attach(Cursor::After(5), None).await.unwrap();
        assert_eq!(drain(&mut b), ["6:z"], "the client resumes from the store");
    }

    #[tokio::test]
    async fn the_get_stream_hands_undelivered_events_to_its_next_connection() {
        let (s, _) = stream(None, true);
        let sink = Sink::new(s.clone());
        sink.message(Bytes::from_static(b"a")).unwrap();
        let mut a = s.attach(Cursor::Undelivered, None).await.unwrap();
        assert_eq!(drain(&mut a), ["1:a"]);
        s.delivered(1);
        drop(a);
        sink.message(Bytes::from_static(b"b")).unwrap();
        let mut b = s.attach(Cursor::Undelivered, None).await.unwrap();
        assert_eq!(drain(&mut b), ["2:b"]);
        assert!(
            !s.is_released(),
            "a GET stream lives as long as its session"
        );
    }
}
