//! What a connection sends: SSE encoding of events, and the HTTP response built from an
//! attached connection ([`sse_response`]: priming, replay, live events, keep-alives, polling
//! and drain closes), or the responses of a JSON-mode POST ([`collect_responses`]).
//!
//! Events are copied into the body as the bytes the plugin sent; nothing here parses them.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::connection::{AttachedParts, Live, TryRecvError};
use super::{Attached, EventId, Frame, ReadProof, Stream, StreamGuard};

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
    /// [`StreamSettings::hold`](crate::config::StreamSettings::hold)); zero for a connection that must open at once.
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
    let mut waiting = Detach {
        stream: stream.clone(),
        conn,
        armed: true,
    };
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
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => frame = None,
            }
        }
    }
    waiting.armed = false;
    if let Some(finished) = ended {
        let mut body = Vec::with_capacity(first.iter().map(|(_, b)| b.len()).sum());
        for (seq, chunk) in &first {
            if let Some(seq) = seq {
                stream.delivered(*seq);
            }
            body.extend_from_slice(chunk);
        }
        stream.response_began(finished);
        stream.detach_with_proof(conn, finished, opening.proof.as_deref());
        drop(guard);
        return sse_headers(axum::body::Body::from(body).into_response());
    }
    stream.response_began(false);
    let body = Body {
        stream,
        conn,
        rx,
        first,
        ids: opening.ids,
        retry: opening.retry,
        poll: opening.poll_after.map(|d| Box::pin(tokio::time::sleep(d))),
        drain: opening.drain.map(CancellationToken::cancelled_owned),
        keep_alive: opening.keep_alive,
        quiet: tokio::time::sleep(opening.keep_alive),
        closing: false,
        finished: false,
        proof: opening.proof,
        closed: closed.cancelled_owned(),
        _guard: guard,
        _open: crate::metrics::SseOpen::new(),
    };
    sse_headers(axum::body::Body::new(body).into_response())
}

/// Tells a proxy in front (nginx) not to buffer the stream. A constant, so the name is
/// checked at compile time, not on every response.
const ACCEL_BUFFERING: HeaderName = HeaderName::from_static("x-accel-buffering");

fn sse_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    if headers.is_empty() {
        // Room for the three below and no more: hyper keeps a response's header map for the
        // connection's next request, which for a GET stream is the stream's whole life (a
        // map grown one insert at a time is twice the size).
        *headers = axum::http::HeaderMap::with_capacity(3);
    }
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

pin_project! {
    /// One connection's body: a hand-written body, not a stream of an `async` block's
    /// `select!`, so that what an idle connection keeps is its timers and little else.
    struct Body {
        stream: Arc<Stream>,
        conn: u64,
        rx: Live,
        // Priming and replayed events, sent before the live ones.
        first: VecDeque<(Option<u64>, Bytes)>,
        ids: bool,
        retry: Option<Duration>,
        // Polling mode: when the connection closes, the stream going on.
        poll: Option<Pin<Box<Sleep>>>,
        #[pin]
        drain: Option<WaitForCancellationFutureOwned>,
        keep_alive: Duration,
        // A keep-alive comment goes out when the connection has carried nothing this long.
        #[pin]
        quiet: Sleep,
        // A polling or draining close was announced: the body ends.
        closing: bool,
        finished: bool,
        proof: Option<Arc<ReadProof>>,
        #[pin]
        closed: WaitForCancellationFutureOwned,
        _guard: StreamGuard,
        // Counted in the open-streams gauge while the response streams.
        _open: crate::metrics::SseOpen,
    }

    impl PinnedDrop for Body {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            this.stream
                .detach_with_proof(*this.conn, *this.finished, this.proof.as_deref());
        }
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        let mut this = self.project();
        if *this.closing {
            return Poll::Ready(None);
        }
        if let Some((seq, chunk)) = this.first.pop_front() {
            if let Some(seq) = seq {
                this.stream.delivered(seq);
            }
            if this.first.is_empty() {
                // Its room goes too: the connection may live long.
                *this.first = VecDeque::new();
            }
            return Poll::Ready(Some(Ok(hyper::body::Frame::data(chunk))));
        }
        let chunk = match this.rx.poll_recv(cx) {
            Poll::Ready(Some(Frame::Event { seq, data })) => {
                this.stream.delivered(seq);
                let id = this.ids.then(|| this.stream.event_id(seq));
                encode(id, None, Some(&data))
            }
            Poll::Ready(Some(Frame::End)) => {
                *this.finished = true;
                return Poll::Ready(None);
            }
            // Another connection took over, or the stream was released.
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => {
                if this.closed.poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
                // The gateway is stopping (drain), or polling closes the connection: the
                // stream goes on, and the client comes back (elsewhere) with Last-Event-ID
                // after `retry`.
                let drained = this
                    .drain
                    .as_mut()
                    .as_pin_mut()
                    .is_some_and(|d| d.poll(cx).is_ready());
                if drained
                    || this
                        .poll
                        .as_mut()
                        .is_some_and(|p| p.as_mut().poll(cx).is_ready())
                {
                    *this.closing = true;
                    encode(
                        None,
                        Some(this.retry.unwrap_or(Duration::from_secs(1))),
                        None,
                    )
                } else if this.quiet.as_mut().poll(cx).is_ready() {
                    Bytes::from_static(b":\n\n")
                } else {
                    return Poll::Pending;
                }
            }
        };
        this.quiet
            .as_mut()
            .reset(tokio::time::Instant::now() + *this.keep_alive);
        Poll::Ready(Some(Ok(hyper::body::Frame::data(chunk))))
    }
}

/// Collects the responses of a JSON-mode POST: until its stream ends or `closed` fires (the
/// session or the gateway ends).
pub async fn collect_responses(attached: Attached, closed: &CancellationToken) -> Vec<Bytes> {
    let AttachedParts {
        stream,
        conn,
        mut rx,
        replay,
        ..
    } = attached.take();
    let mut waiting = Detach {
        stream: stream.clone(),
        conn,
        armed: true,
    };
    let mut out: Vec<Bytes> = replay.into_iter().map(|(_, data)| data).collect();
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
    waiting.armed = false;
    stream.detach(conn, finished);
    out
}

/// Detaches a connection whose response is dropped while it waits (its client went away
/// before the body began, or during a JSON answer): the stream must not think it attached.
/// An unbuffered stream is then released, which is how a modern request's cancellation is
/// seen.
struct Detach {
    stream: Arc<Stream>,
    conn: u64,
    armed: bool,
}

impl Drop for Detach {
    fn drop(&mut self) {
        if self.armed {
            self.stream.detach(self.conn, false);
        }
    }
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
}
