//! A connection attached to a stream: where it starts reading ([`Cursor`]), its bounded live
//! queue, the [`Cut`] that closes a client that stops reading, the [`Attached`] handle that
//! detaches it when dropped, and the [`StreamGuard`] that counts it for its session. The
//! attach and detach steps of the [`Stream`] state machine live here.
//!
//! Nothing here writes to a socket: `sse` turns an attached connection into a response.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use bytes::Bytes;
pub(super) use tokio::sync::mpsc::error::TryRecvError;
use tokio_util::sync::CancellationToken;

use super::{Buffering, EventId, Frame, ReadProof, ReplayError, Stream};

/// Frames a connection may have queued before it counts as too slow and is dropped (the
/// client then resumes from the store).
pub(super) const LIVE_QUEUE: usize = 1024;

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
pub struct Cut(pub(super) CancellationToken);

impl Cut {
    /// Resolves once the connection is to be closed; owns what it waits on, so the
    /// connection's task can hold it beside the connection.
    pub fn fired_owned(&self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        self.0.clone().cancelled_owned()
    }

    pub(super) fn fire(&self) {
        self.0.cancel();
    }
}

/// The connection attached now, as its stream sees it: the sending end of its live queue.
pub(super) struct Conn {
    /// Which attach this is: a late detach by a replaced connection leaves this one alone.
    pub(super) id: u64,
    pub(super) tx: Tx,
    /// Closes the HTTP connection when its client falls behind; `None` where the events are
    /// not written to a socket.
    pub(super) cut: Option<Cut>,
}

/// A connection's live queue: at most [`LIVE_QUEUE`] frames, sent under the stream's lock and
/// read by the one connection. It allocates nothing until a frame is queued, and gives back
/// what a burst grew once it is read, so an idle stream's connection costs one small
/// allocation (a tokio channel of this bound cost over 2 KiB up front: a block of 32 slots
/// and a cache-padded channel).
struct Queue {
    state: std::sync::Mutex<QueueState>,
}

#[derive(Default)]
struct QueueState {
    frames: VecDeque<Frame>,
    /// Bytes of the events in `frames`.
    bytes: usize,
    /// The sending end is gone (the connection was replaced, dropped, or the stream
    /// released): the receiver gets what is queued, then the end.
    sender_gone: bool,
    /// The receiving end is gone: nothing more is taken.
    receiver_gone: bool,
    /// The receiver waiting for a frame.
    waker: Option<Waker>,
}

/// Capacity a drained queue keeps; past it the queue gives its memory back.
const KEPT_CAPACITY: usize = 16;

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().expect("live queue lock")
    }
}

/// A new live queue: its sending end for the stream, its receiving end for the connection.
fn queue() -> (Tx, Live) {
    let q = Arc::new(Queue {
        state: std::sync::Mutex::default(),
    });
    (
        Tx(q.clone()),
        Live {
            queue: q,
            peeked: None,
        },
    )
}

/// Why a frame was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NotSent {
    /// The connection is gone.
    Closed,
    /// The connection fell too far behind: [`LIVE_QUEUE`] frames, or more bytes than allowed.
    TooSlow,
}

/// The sending end of a live queue.
pub(super) struct Tx(Arc<Queue>);

impl Tx {
    /// Queues `frame`, unless the connection is gone or already holds [`LIVE_QUEUE`] frames,
    /// or (with `byte_limit`) holds some and would hold more than that many bytes with it.
    pub(super) fn try_send(&self, frame: Frame, byte_limit: Option<usize>) -> Result<(), NotSent> {
        let waker = {
            let mut q = self.0.lock();
            if q.receiver_gone {
                return Err(NotSent::Closed);
            }
            let bytes = frame.bytes();
            if q.frames.len() >= LIVE_QUEUE
                || byte_limit.is_some_and(|limit| q.bytes > 0 && q.bytes + bytes > limit)
            {
                return Err(NotSent::TooSlow);
            }
            q.bytes += bytes;
            q.frames.push_back(frame);
            q.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }

    /// Whether the connection is gone.
    pub(super) fn is_closed(&self) -> bool {
        self.0.lock().receiver_gone
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        let waker = {
            let mut q = self.0.lock();
            q.sender_gone = true;
            q.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// A connection's end of its live queue.
pub(super) struct Live {
    queue: Arc<Queue>,
    /// A frame taken from the queue to be looked at ([`Attached::peek`]), handed out first.
    pub(super) peeked: Option<Frame>,
}

impl Live {
    /// The next frame; `None` once the sending end is gone and everything queued was read.
    pub(super) async fn recv(&mut self) -> Option<Frame> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// [`Live::recv`] for a hand-written future: ready with the next frame, or pending with
    /// `cx`'s task to be woken when one comes.
    pub(super) fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Frame>> {
        if let Some(f) = self.peeked.take() {
            return Poll::Ready(Some(f));
        }
        let mut q = self.queue.lock();
        match Self::take(&mut q) {
            Some(f) => Poll::Ready(Some(f)),
            None if q.sender_gone => Poll::Ready(None),
            None => {
                if !q.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    q.waker = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }

    pub(super) fn try_recv(&mut self) -> Result<Frame, TryRecvError> {
        if let Some(f) = self.peeked.take() {
            return Ok(f);
        }
        let mut q = self.queue.lock();
        match Self::take(&mut q) {
            Some(f) => Ok(f),
            None if q.sender_gone => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }

    fn take(q: &mut QueueState) -> Option<Frame> {
        let f = q.frames.pop_front()?;
        q.bytes -= f.bytes();
        if q.frames.is_empty() && q.frames.capacity() > KEPT_CAPACITY {
            q.frames = VecDeque::new();
        }
        Some(f)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let mut q = self.queue.lock();
        q.receiver_gone = true;
        q.waker = None;
        q.bytes = 0;
        // What was queued goes now, not when the stream lets go of the sending end.
        q.frames = VecDeque::new();
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
pub struct Attached(pub(super) Option<AttachedParts>);

pub(super) struct AttachedParts {
    pub(super) stream: Arc<Stream>,
    pub(super) conn: u64,
    /// The sequence the connection starts after.
    pub(super) after: u64,
    pub(super) rx: Live,
    pub(super) replay: Vec<(u64, Bytes)>,
}

impl Attached {
    /// Says whether the stream's request waits, parked, for its client's retry.
    pub fn set_waiting(&self, waiting: bool) {
        if let Some(p) = &self.0 {
            p.stream.set_waiting(waiting);
        }
    }

    /// The id a priming event carries: the position this connection starts after, marked
    /// with the connection's number so it is no other event's id.
    pub fn cursor_id(&self) -> EventId {
        let p = self.0.as_ref().expect("not taken");
        EventId {
            prime: Some(p.conn),
            ..p.stream.event_id(p.after)
        }
    }

    /// The next frame, for a reader inside the gateway (the bridge of multi round-trip
    /// requests reads a call's stream itself): what was replayed first, then the live events;
    /// `None` once the stream is released or another connection took it over.
    pub async fn next_frame(&mut self) -> Option<Frame> {
        let p = self.0.as_mut().expect("not taken");
        if !p.replay.is_empty() {
            let (seq, data) = p.replay.remove(0);
            return Some(Frame::Event { seq, data });
        }
        p.rx.recv().await
    }

    /// The data of the first event this connection will be handed (a replayed one, else the
    /// first live one, waited for), left in place: whoever reads the connection gets it all
    /// the same. `None` when the stream ends, or is released or taken over, before any.
    pub async fn peek(&mut self) -> Option<Bytes> {
        let p = self.0.as_mut().expect("not taken");
        if let Some((_, data)) = p.replay.first() {
            return Some(data.clone());
        }
        if p.rx.peeked.is_none() {
            p.rx.peeked = p.rx.recv().await;
        }
        match &p.rx.peeked {
            Some(Frame::Event { data, .. }) => Some(data.clone()),
            Some(Frame::End) | None => None,
        }
    }

    pub(super) fn take(mut self) -> AttachedParts {
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
    /// Attaches a new connection (replacing any other: the client knows it lost it) and reads
    /// what it must replay from the store. A cursor whose events are gone is refused before
    /// the current connection is touched. `cut` closes the connection if its client falls
    /// too far behind (none where the events are not written to a socket).
    pub async fn attach(
        self: &Arc<Self>,
        from: Cursor,
        cut: Option<Cut>,
    ) -> Result<Attached, AttachError> {
        let (tx, rx) = queue();
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
                let _ = tx.try_send(Frame::End, None);
            }
            // The previous connection's queue closes: its response ends.
            g.conn = Some(Conn { id, tx, cut });
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
    pub(super) fn detach(&self, conn: u64, finished: bool) -> bool {
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
    pub(super) fn detach_with_proof(
        self: &Arc<Self>,
        conn: u64,
        finished: bool,
        proof: Option<&ReadProof>,
    ) {
        if self.detach(conn, finished)
            && let Some(proof) = proof
        {
            proof.ended(self.clone());
        }
    }

    /// The client read this finished stream to its end ([`ReadProof`]).
    pub(super) fn read(&self) {
        if let Some(hooks) = &self.hooks {
            hooks.read(self.key.stream);
        }
    }

    pub(super) fn delivered(&self, seq: u64) {
        if self.tracks_delivery {
            let mut g = self.lock();
            g.delivered = g.delivered.max(seq);
        }
        if self.buffering == Buffering::UntilDelivered {
            self.events.trim(self.key.stream, seq);
        }
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
