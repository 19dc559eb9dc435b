//! Streams towards a client: where the messages for one POST, or for the session's GET stream,
//! are queued, and how they become an SSE body or one JSON body.
//!
//! A [`Sink`] is the sending end handed to whoever produces messages (the router, a plugin
//! connection); the HTTP layer owns the receiving end and turns it into a response. A stream
//! that answers a POST ends once every request in that POST has been answered (or dropped on
//! cancellation). Sending to a sink whose client has gone reports failure, so the caller can
//! route the message elsewhere; nothing here blocks.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// One item on a stream.
#[derive(Debug)]
pub enum Outgoing {
    /// A request or notification for the client.
    Message(Bytes),
    /// The response to one of the POST's requests.
    Response(Bytes),
    /// One of the POST's requests ends without a response (the client cancelled it).
    Dropped,
}

/// The sending end of a stream.
#[derive(Clone, Debug)]
pub struct Sink {
    tx: mpsc::UnboundedSender<Outgoing>,
    /// Whether the stream is SSE (it can carry requests and notifications before the
    /// response) or one JSON body (it carries responses only).
    sse: bool,
}

impl Sink {
    /// A new stream; `sse` is false for a POST answered with one JSON body.
    pub fn new(sse: bool) -> (Sink, mpsc::UnboundedReceiver<Outgoing>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Sink { tx, sse }, rx)
    }

    /// Queues a response. False when the client has gone.
    pub fn respond(&self, bytes: Bytes) -> bool {
        self.tx.send(Outgoing::Response(bytes)).is_ok()
    }

    /// Marks one request as ended without a response.
    pub fn dropped(&self) {
        let _ = self.tx.send(Outgoing::Dropped);
    }

    /// Queues a request or notification; gives the bytes back when this stream cannot carry
    /// it (JSON mode, or the client has gone) so the caller can use another stream.
    pub fn message(&self, bytes: Bytes) -> Result<(), Bytes> {
        if !self.sse {
            return Err(bytes);
        }
        self.tx
            .send(Outgoing::Message(bytes))
            .map_err(|e| match e.0 {
                Outgoing::Message(b) => b,
                _ => unreachable!("sent a message"),
            })
    }

    /// Whether requests and notifications can go on this stream now.
    pub fn carries_messages(&self) -> bool {
        self.sse && !self.tx.is_closed()
    }

    pub fn is_open(&self) -> bool {
        !self.tx.is_closed()
    }

    /// Whether both ends belong to the same stream.
    pub fn same_stream(&self, other: &Sink) -> bool {
        self.tx.same_channel(&other.tx)
    }
}

/// Counts a session's open streams while one lives (an open stream keeps a session from
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

/// How an SSE response ends.
pub enum End {
    /// After this many responses (a POST stream).
    AfterResponses(usize),
    /// Only when the session or the gateway ends it, or the client leaves (the GET stream).
    Never,
}

/// Turns a stream's receiving end into an SSE response.
pub fn sse_response(
    rx: mpsc::UnboundedReceiver<Outgoing>,
    end: End,
    keep_alive: Duration,
    closed: CancellationToken,
    guard: StreamGuard,
) -> Response {
    let state = SseState {
        rx,
        remaining: match end {
            End::AfterResponses(n) => Some(n),
            End::Never => None,
        },
        closed,
        _guard: guard,
    };
    let stream = futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if st.remaining == Some(0) {
                return None;
            }
            let item = tokio::select! {
                item = st.rx.recv() => item?,
                () = st.closed.cancelled() => return None,
            };
            let bytes = match item {
                Outgoing::Message(b) => b,
                Outgoing::Response(b) => {
                    st.count_one();
                    b
                }
                Outgoing::Dropped => {
                    st.count_one();
                    continue;
                }
            };
            return Some((Ok::<_, Infallible>(event(&bytes)), st));
        }
    });
    let mut response = Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(keep_alive))
        .into_response();
    response.headers_mut().insert(
        "x-accel-buffering",
        axum::http::HeaderValue::from_static("no"),
    );
    response
}

struct SseState {
    rx: mpsc::UnboundedReceiver<Outgoing>,
    /// Responses still owed; `None` for a stream that only ends from outside.
    remaining: Option<usize>,
    closed: CancellationToken,
    _guard: StreamGuard,
}

impl SseState {
    fn count_one(&mut self) {
        if let Some(n) = self.remaining.as_mut() {
            *n = n.saturating_sub(1);
        }
    }
}

fn event(bytes: &Bytes) -> Event {
    Event::default().data(String::from_utf8_lossy(bytes))
}

/// Collects the responses of a JSON-mode POST: until `n` requests have ended (answered or
/// dropped) or `closed` fires (the session or the gateway ends).
pub async fn collect_responses(
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    n: usize,
    closed: &CancellationToken,
) -> Vec<Bytes> {
    let mut out = Vec::with_capacity(n);
    let mut seen = 0;
    while seen < n {
        let item = tokio::select! {
            item = rx.recv() => item,
            () = closed.cancelled() => None,
        };
        match item {
            Some(Outgoing::Response(b)) => {
                out.push(b);
                seen += 1;
            }
            Some(Outgoing::Dropped) => seen += 1,
            Some(Outgoing::Message(_)) => {}
            None => break,
        }
    }
    out
}
