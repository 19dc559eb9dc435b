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
//! The producer side ([`Sink`]) never blocks: it appends and sends on an unbounded channel
//! under a short lock that is never held across an await.

mod by_number;
mod event_id;
mod read_proof;
pub mod store;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

// How streams behave is a setting, so it lives in `config`; re-exported for old paths.
pub use crate::config::StreamSettings;
pub use by_number::ByNumber;
pub use event_id::{EventId, EventIdError};
pub use read_proof::ReadProof;
pub use store::{
    EventStore, MemoryEventStore, ReplayError, ReplayLimits, SessionEvents, StreamKey,
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

/// Frames a connection may have queued before it counts as too slow and is dropped (the
/// client then resumes from the store).
const LIVE_QUEUE: usize = 1024;

/// Bytes a connection writing to a socket may have queued, likewise. One event larger than
/// this still goes out on a connection that has nothing queued.
pub const LIVE_QUEUE_BYTES: usize = 4 * 1024 * 1024;

/// Closes the HTTP connection a stream goes out on. A client that stops reading leaves its
/// connection holding what was queued for it for as long as the socket lives; when it falls
/// [`LIVE_QUEUE`] events or [`LIVE_QUEUE_BYTES`] behind, the stream drops the connection and
/// fires this, and the listener (`http::serve`), which watches it for each connection, closes
/// the connection. The client resumes from the store. On HTTP/2 the connection's other
/// streams end with it, and their clients resume likewise.
#[derive(Debug, Clone, Default)]
pub struct Cut(CancellationToken);

impl Cut {
    /// Resolves once the connection is to be closed.
    pub async fn fired(&self) {
        self.0.cancelled().await;
    }

    fn fire(&self) {
        self.0.cancel();
    }
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
}

struct Inner {
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
}

struct Conn {
    id: u64,
    tx: mpsc::Sender<Frame>,
    /// Bytes of the events in `tx`'s queue.
    queued: Arc<AtomicUsize>,
    cut: Option<Cut>,
}

/// A connection's end of its live queue: the frames, and the bytes they hold.
struct Live {
    rx: mpsc::Receiver<Frame>,
    queued: Arc<AtomicUsize>,
}

impl Live {
    async fn recv(&mut self) -> Option<Frame> {
        let frame = self.rx.recv().await;
        if let Some(f) = &frame {
            self.took(f);
        }
        frame
    }

    fn try_recv(&mut self) -> Result<Frame, mpsc::error::TryRecvError> {
        let frame = self.rx.try_recv();
        if let Ok(f) = &frame {
            self.took(f);
        }
        frame
    }

    fn took(&self, frame: &Frame) {
        self.queued.fetch_sub(frame.bytes(), Ordering::AcqRel);
    }
}

impl Frame {
    fn bytes(&self) -> usize {
        match self {
            Frame::Event { data, .. } => data.len(),
            Frame::End => 0,
        }
    }
}

/// Where a new connection starts reading.
#[derive(Debug, Clone, Copy)]
pub enum Cursor {
    /// From the first event (a new POST stream).
    Start,
    /// After what earlier connections were handed (a GET stream opened again); refused while
    /// another connection listens.
    Undelivered,
    /// After this sequence (`Last-Event-ID`).
    After(u64),
}

/// Why a connection could not attach.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    #[error("that stream has ended and its events were released")]
    Released,
    #[error("no event {0} was ever sent on that stream")]
    BeyondEnd(u64),
    #[error("a connection is already open on that stream")]
    Busy,
    #[error(transparent)]
    Replay(#[from] ReplayError),
}

/// A connection attached to a stream, with the events to replay before the live ones.
/// Dropping it detaches the connection.
pub struct Attached(Option<AttachedParts>);

struct AttachedParts {
    stream: Arc<Stream>,
    conn: u64,
    /// The sequence the connection starts after.
    after: u64,
    rx: Live,
    replay: Vec<(u64, Bytes)>,
}

impl Attached {
    /// The id a priming event carries: the position this connection starts after, marked
    /// with the connection's number so it is no other event's id.
    pub fn cursor_id(&self) -> EventId {
        let p = self.0.as_ref().expect("not taken");
        EventId {
            prime: Some(p.conn),
            ..p.stream.event_id(p.after)
        }
    }

    fn take(mut self) -> AttachedParts {
        self.0.take().expect("taken once")
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            p.stream.detach(p.conn, false);
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
                next_seq: 1,
                conn: None,
                attaches: 0,
                owed,
                delivered: 0,
                released: false,
                detached_at: None,
            }),
            hooks,
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

    /// Adds an event: kept in the store when buffered, sent to the connection if one is
    /// attached. A message (not a response) comes back when the stream can take none: it is
    /// released, unbuffered without a connection, or already answered in full (its
    /// connection is ending).
    fn push(&self, data: Bytes, response: bool) -> Result<(), Bytes> {
        let mut g = self.lock();
        let closed = g.released || (!response && g.owed == Some(0));
        if closed || (!self.buffered() && g.conn.is_none()) {
            if response {
                Self::count_response(&mut g);
            }
            return Err(data);
        }
        let seq = g.next_seq;
        g.next_seq += 1;
        if self.buffered() {
            self.events.append(self.key.stream, seq, data.clone());
        }
        Self::send(&mut g, Frame::Event { seq, data });
        if response {
            Self::count_response(&mut g);
        }
        Ok(())
    }

    /// Sends to the attached connection; one that is gone, or too slow to keep up, is
    /// dropped, and a slow one closed (a buffered stream's client resumes from the store).
    fn send(g: &mut Inner, frame: Frame) {
        let Some(c) = &g.conn else { return };
        let bytes = frame.bytes();
        let queued = c.queued.fetch_add(bytes, Ordering::AcqRel);
        // A queue that is not written to a socket (a JSON answer being collected) is drained
        // as it fills: only a socket's reader can fall behind in bytes.
        let sent = if c.cut.is_some() && queued > 0 && queued + bytes > LIVE_QUEUE_BYTES {
            Err(true)
        } else {
            c.tx.try_send(frame)
                .map_err(|e| matches!(e, mpsc::error::TrySendError::Full(_)))
        };
        if let Err(too_slow) = sent {
            c.queued.fetch_sub(bytes, Ordering::AcqRel);
            if too_slow {
                tracing::debug!(
                    "a client fell {LIVE_QUEUE} events or {LIVE_QUEUE_BYTES} bytes behind: its connection is closed"
                );
                if let Some(cut) = &c.cut {
                    cut.fire();
                }
            }
            g.conn = None;
            g.detached_at = Some(Instant::now());
        }
    }

    fn count_response(g: &mut Inner) {
        if let Some(n) = g.owed.as_mut() {
            *n = n.saturating_sub(1);
            if *n == 0 {
                Self::send(g, Frame::End);
            }
        }
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

    /// Attaches a new connection (replacing any other: the client knows it lost it) and reads
    /// what it must replay from the store. A cursor whose events are gone is refused before
    /// the current connection is touched. `cut` closes the connection if its client falls
    /// too far behind (none where the events are not written to a socket).
    pub async fn attach(
        self: &Arc<Self>,
        from: Cursor,
        cut: Option<Cut>,
    ) -> Result<Attached, AttachError> {
        let (tx, rx) = mpsc::channel(LIVE_QUEUE);
        let queued = Arc::new(AtomicUsize::new(0));
        let rx = Live {
            rx,
            queued: queued.clone(),
        };
        let (conn, after, upto, skip_evicted) = {
            let mut g = self.lock();
            if g.released {
                return Err(AttachError::Released);
            }
            let upto = g.next_seq;
            let (after, skip_evicted) = match from {
                Cursor::Start => (0, false),
                Cursor::Undelivered if g.conn.as_ref().is_some_and(|c| !c.tx.is_closed()) => {
                    return Err(AttachError::Busy);
                }
                // What was evicted before anyone came for it is skipped, not fatal.
                Cursor::Undelivered => (g.delivered, true),
                Cursor::After(seq) if seq >= upto => return Err(AttachError::BeyondEnd(seq)),
                Cursor::After(seq) => {
                    if self.buffered() {
                        let oldest = self.events.oldest_kept(self.key.stream).unwrap_or(upto);
                        if seq + 1 < oldest {
                            return Err(ReplayError::Evicted {
                                oldest_kept: oldest,
                            }
                            .into());
                        }
                    }
                    (seq, false)
                }
            };
            g.attaches += 1;
            let id = g.attaches;
            if g.owed == Some(0) {
                let _ = tx.try_send(Frame::End);
            }
            // The previous connection's channel closes: its response ends.
            g.conn = Some(Conn {
                id,
                tx,
                queued,
                cut,
            });
            g.detached_at = None;
            (id, after, upto, skip_evicted)
        };
        // A new stream, or a cursor at its end: nothing to read back.
        let replay = if self.buffered() && after + 1 < upto {
            match self
                .events
                .replay(self.key.stream, after, upto, skip_evicted)
                .await
            {
                Ok(events) => {
                    let skipped = events.first().map_or(upto, |(s, _)| *s) - after - 1;
                    if skip_evicted && skipped > 0 && events.len() as u64 + after + 1 < upto {
                        tracing::warn!(
                            stream = self.key.stream,
                            "events were evicted before a client came for them"
                        );
                    }
                    events
                }
                Err(e) => {
                    self.detach(conn, false);
                    return Err(e.into());
                }
            }
        } else {
            Vec::new()
        };
        Ok(Attached(Some(AttachedParts {
            stream: self.clone(),
            conn,
            after,
            rx,
            replay,
        })))
    }

    /// A connection went away; `finished` when it carried the stream to its end. An
    /// unbuffered stream is released with its connection; a buffered one that finished
    /// lingers (its session releases it later), one that did not waits to be resumed. True
    /// when the stream ended on this connection and now lingers.
    fn detach(&self, conn: u64, finished: bool) -> bool {
        let (release, linger, at) = {
            let mut g = self.lock();
            let mut at = None;
            if g.conn.as_ref().is_some_and(|c| c.id == conn) {
                g.conn = None;
                at = Some(Instant::now());
                g.detached_at = at;
            }
            let ends = !g.released && g.owed.is_some() && (finished || !self.buffered());
            let release = ends && !self.buffered();
            if release {
                g.released = true;
            }
            (release, ends && self.buffered(), at)
        };
        if release {
            self.release_buffer();
        } else if linger && let Some(h) = &self.hooks {
            h.finished(self.key.stream, at.unwrap_or_else(Instant::now));
            return true;
        }
        false
    }

    /// Detaches connection `conn`, which carried the stream to its end when `finished`; a
    /// stream that lingers is then released when `proof` shows the client read it.
    fn detach_with_proof(self: &Arc<Self>, conn: u64, finished: bool, proof: Option<&ReadProof>) {
        if self.detach(conn, finished)
            && let Some(proof) = proof
        {
            proof.ended(self.clone());
        }
    }

    /// The client read this finished stream to its end ([`ReadProof`]).
    fn read(&self) {
        if let Some(hooks) = &self.hooks {
            hooks.read(self.key.stream);
        }
    }

    fn delivered(&self, seq: u64) {
        if self.tracks_delivery {
            let mut g = self.lock();
            g.delivered = g.delivered.max(seq);
        }
        if self.buffering == Buffering::UntilDelivered {
            self.events.trim(self.key.stream, seq);
        }
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
            h.released(self.key.stream);
        }
    }
}

/// The producing end of a stream: what the router and plugin connections write to.
#[derive(Clone)]
pub struct Sink(Arc<Stream>);

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sink({:?})", self.0.key)
    }
}

impl Sink {
    pub fn new(stream: Arc<Stream>) -> Sink {
        Sink(stream)
    }

    /// Adds a response. False when it could not be kept or sent.
    pub fn respond(&self, bytes: Bytes) -> bool {
        self.0.push(bytes, true).is_ok()
    }

    /// Marks one request as ended without a response.
    pub fn dropped(&self) {
        Stream::count_response(&mut self.0.lock());
    }

    /// Adds a request or notification; gives the bytes back when this stream cannot carry it
    /// (JSON mode, released, or unbuffered without a connection).
    pub fn message(&self, bytes: Bytes) -> Result<(), Bytes> {
        if !self.0.sse {
            return Err(bytes);
        }
        self.0.push(bytes, false)
    }

    /// Whether requests and notifications can go on this stream now.
    pub fn carries_messages(&self) -> bool {
        self.0.sse && {
            let g = self.0.lock();
            !g.released && g.owed != Some(0) && (self.0.buffered() || g.conn.is_some())
        }
    }

    /// Whether both ends belong to the same stream.
    pub fn same_stream(&self, other: &Sink) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// The session the stream belongs to.
    pub fn session_id(&self) -> &str {
        &self.0.key.session
    }
}

/// Counts a session's open connections while one lives (an open one keeps a session from
/// being idle).
#[derive(Debug)]
pub struct StreamGuard(Arc<AtomicUsize>);

impl StreamGuard {
    pub fn new(counter: Arc<AtomicUsize>) -> StreamGuard {
        counter.fetch_add(1, Ordering::Relaxed);
        StreamGuard(counter)
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How a connection's SSE body begins and behaves.
pub struct Opening {
    /// Send a priming event (an id and empty data) first: clients at 2025-11-25 or later, on
    /// a resumable stream. Carries the cursor the client resumes from.
    pub priming: Option<EventId>,
    /// Send `retry:` (at the start and before a polling close): clients at 2025-11-25 or later.
    pub retry: Option<Duration>,
    /// Put ids on events.
    pub ids: bool,
    /// Close the connection after this long, the stream going on (polling mode).
    pub poll_after: Option<Duration>,
    pub keep_alive: Duration,
    /// Wait this long for live events before the response starts (see
    /// [`StreamSettings::hold`]); zero for a connection that must open at once.
    pub hold: Duration,
    /// When this fires (the gateway begins to stop), the connection sends `retry:` and ends,
    /// the stream going on, so the client reconnects (to another replica behind a load
    /// balancer). `None` for a POST's stream, which ends with its answers.
    pub drain: Option<CancellationToken>,
    /// The HTTP/1 connection's proof of reading: a stream that ends on this connection is
    /// released at the connection's next request.
    pub proof: Option<Arc<ReadProof>>,
}

/// Turns an attached connection into an SSE response: priming, replay, then live events,
/// until the stream ends, the connection is replaced, `closed` fires or polling closes it.
/// When the stream ends within `opening.hold`, the whole of it goes out as one body.
pub async fn sse_response(
    attached: Attached,
    opening: Opening,
    closed: CancellationToken,
    guard: StreamGuard,
) -> Response {
    let AttachedParts {
        stream,
        conn,
        mut rx,
        replay,
        ..
    } = attached.take();
    let mut first: VecDeque<(Option<u64>, Bytes)> = VecDeque::new();
    match (opening.priming, opening.retry) {
        (Some(id), retry) => first.push_back((None, encode(Some(id), retry, Some(b"")))),
        (None, Some(r)) => first.push_back((None, encode(None, Some(r), None))),
        (None, None) => {}
    }
    for (seq, data) in replay {
        let id = opening.ids.then(|| stream.event_id(seq));
        first.push_back((Some(seq), encode(id, None, Some(&data))));
    }
    // Whatever comes within the hold goes out with the headers.
    let mut ended = None;
    if !opening.hold.is_zero()
        && let Ok(frame) = tokio::time::timeout(opening.hold, rx.recv()).await
    {
        let mut frame = frame;
        loop {
            match frame {
                Some(Frame::Event { seq, data }) => {
                    let id = opening.ids.then(|| stream.event_id(seq));
                    first.push_back((Some(seq), encode(id, None, Some(&data))));
                }
                Some(Frame::End) => break ended = Some(true),
                // Another connection took over, or the stream was released.
                None => break ended = Some(false),
            }
            match rx.try_recv() {
                Ok(f) => frame = Some(f),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => frame = None,
            }
        }
    }
    if let Some(finished) = ended {
        let mut body = Vec::with_capacity(first.iter().map(|(_, b)| b.len()).sum());
        for (seq, chunk) in &first {
            if let Some(seq) = seq {
                stream.delivered(*seq);
            }
            body.extend_from_slice(chunk);
        }
        stream.detach_with_proof(conn, finished, opening.proof.as_deref());
        drop(guard);
        return sse_headers(axum::body::Body::from(body).into_response());
    }
    let now = tokio::time::Instant::now();
    let state = Body {
        stream,
        conn,
        rx,
        first,
        ids: opening.ids,
        retry: opening.retry,
        poll_at: opening.poll_after.map(|d| now + d),
        drain: opening.drain,
        keep_alive: opening.keep_alive,
        quiet_since: now,
        closing: false,
        finished: false,
        proof: opening.proof,
        closed,
        _guard: guard,
        _open: crate::metrics::SseOpen::new(),
    };
    let body = futures_util::stream::unfold(state, |mut st| async move {
        let chunk = st.next().await?;
        Some((Ok::<_, Infallible>(chunk), st))
    });
    sse_headers(axum::body::Body::from_stream(body).into_response())
}

/// Tells a proxy in front (nginx) not to buffer the stream. A constant, so the name is
/// checked at compile time, not on every response.
const ACCEL_BUFFERING: HeaderName = HeaderName::from_static("x-accel-buffering");

fn sse_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(ACCEL_BUFFERING, HeaderValue::from_static("no"));
    response
}

/// One SSE event. Data lines split at any line break, so no payload can end the event early
/// (a JSON-RPC message from a plugin is one line, and is copied as it is).
fn encode(id: Option<EventId>, retry: Option<Duration>, data: Option<&[u8]>) -> Bytes {
    let mut out = Vec::with_capacity(data.map_or(0, <[u8]>::len) + 64);
    if let Some(id) = id {
        out.extend_from_slice(b"id: ");
        id.write_to(&mut out);
        out.push(b'\n');
    }
    if let Some(r) = retry {
        out.extend_from_slice(b"retry: ");
        out.extend_from_slice(itoa::Buffer::new().format(r.as_millis()).as_bytes());
        out.push(b'\n');
    }
    if let Some(mut data) = data {
        loop {
            let end = memchr::memchr2(b'\n', b'\r', data);
            out.extend_from_slice(b"data: ");
            out.extend_from_slice(&data[..end.unwrap_or(data.len())]);
            out.push(b'\n');
            match end {
                Some(end) => data = &data[end + 1..],
                None => break,
            }
        }
    }
    out.push(b'\n');
    Bytes::from(out)
}

/// One connection's body.
struct Body {
    stream: Arc<Stream>,
    conn: u64,
    rx: Live,
    /// Priming and replayed events, sent before the live ones.
    first: VecDeque<(Option<u64>, Bytes)>,
    ids: bool,
    retry: Option<Duration>,
    poll_at: Option<tokio::time::Instant>,
    drain: Option<CancellationToken>,
    keep_alive: Duration,
    /// When the connection last carried anything: a keep-alive comment follows a quiet spell.
    quiet_since: tokio::time::Instant,
    /// A polling close was announced: end at the next poll.
    closing: bool,
    finished: bool,
    proof: Option<Arc<ReadProof>>,
    closed: CancellationToken,
    _guard: StreamGuard,
    /// Counted in the open-streams gauge while the response streams.
    _open: crate::metrics::SseOpen,
}

impl Body {
    async fn next(&mut self) -> Option<Bytes> {
        if self.closing {
            return None;
        }
        if let Some((seq, chunk)) = self.first.pop_front() {
            if let Some(seq) = seq {
                self.stream.delivered(seq);
            }
            return Some(chunk);
        }
        let poll = async {
            match self.poll_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let drain = async {
            match &self.drain {
                Some(token) => token.cancelled().await,
                None => std::future::pending().await,
            }
        };
        let chunk = tokio::select! {
            biased;
            frame = self.rx.recv() => match frame {
                Some(Frame::Event { seq, data }) => {
                    self.stream.delivered(seq);
                    let id = self.ids.then(|| self.stream.event_id(seq));
                    encode(id, None, Some(&data))
                }
                Some(Frame::End) => {
                    self.finished = true;
                    return None;
                }
                // Another connection took over, or the stream was released.
                None => return None,
            },
            () = self.closed.cancelled() => return None,
            () = drain => {
                // The gateway is stopping: the client is to come back (elsewhere) with
                // Last-Event-ID after `retry`.
                self.closing = true;
                encode(None, Some(self.retry.unwrap_or(Duration::from_secs(1))), None)
            }
            () = poll => {
                // Polling: the connection ends, the stream goes on; the client reconnects
                // with Last-Event-ID after `retry`.
                self.closing = true;
                encode(None, Some(self.retry.unwrap_or(Duration::from_secs(1))), None)
            }
            () = tokio::time::sleep_until(self.quiet_since + self.keep_alive) => Bytes::from_static(b":\n\n"),
        };
        self.quiet_since = tokio::time::Instant::now();
        Some(chunk)
    }
}

impl Drop for Body {
    fn drop(&mut self) {
        self.stream
            .detach_with_proof(self.conn, self.finished, self.proof.as_deref());
    }
}

/// Collects the responses of a JSON-mode POST: until its stream ends or `closed` fires (the
/// session or the gateway ends).
pub async fn collect_responses(attached: Attached, closed: &CancellationToken) -> Vec<Bytes> {
    let AttachedParts {
        stream,
        conn,
        mut rx,
        ..
    } = attached.take();
    let mut out = Vec::new();
    let mut finished = false;
    loop {
        let frame = tokio::select! {
            frame = rx.recv() => frame,
            () = closed.cancelled() => None,
        };
        match frame {
            Some(Frame::Event { data, .. }) => out.push(data),
            Some(Frame::End) => {
                finished = true;
                break;
            }
            None => break,
        }
    }
    stream.detach(conn, finished);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding() {
        let id = EventId {
            tag: 1,
            stream: 2,
            seq: 0,
            prime: None,
        };
        assert_eq!(
            &encode(Some(id), Some(Duration::from_millis(1500)), Some(b""))[..],
            b"id: 00000001-2-0\nretry: 1500\ndata: \n\n"
        );
        assert_eq!(
            &encode(None, None, Some(b"{\"a\":\r1}\nx"))[..],
            b"data: {\"a\":\ndata: 1}\ndata: x\n\n"
        );
        let primed = EventId {
            tag: 0x9f3a_12c0,
            stream: 3,
            seq: u64::MAX,
            prime: Some(20),
        };
        assert_eq!(
            &encode(Some(primed), None, Some(b"x\r\n"))[..],
            format!("id: {primed}\ndata: x\ndata: \ndata: \n\n").as_bytes()
        );
        assert_eq!(primed.to_string(), "9f3a12c0-3-18446744073709551615-p20");
        assert_eq!(
            &encode(None, Some(Duration::from_secs(1)), None)[..],
            b"retry: 1000\n\n"
        );
    }

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
