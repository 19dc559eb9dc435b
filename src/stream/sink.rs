//! The producing end of a stream: [`Sink`], the handle the router and plugin connections
//! write events into, and the steps of the [`Stream`] state machine that take an event in and
//! hand it to the attached connection.
//!
//! It never blocks: an event is appended to the store and sent on the connection's bounded
//! queue under the stream's short lock, never held across an await; a connection too slow to
//! keep up is dropped (and cut), not waited for.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use super::connection::{LIVE_QUEUE, NotSent};
use super::{Frame, Inner, Stream};

impl Stream {
    /// Adds an event: kept in the store when buffered, sent to the connection if one is
    /// attached. A message (not a response) comes back when the stream can take none: it is
    /// released, unbuffered without a connection, or already answered in full (its
    /// connection is ending).
    fn push(&self, data: Bytes, response: bool) -> Result<(), Bytes> {
        let mut g = self.lock();
        let data = match &g.rewrite {
            Some(rewrite) if response => rewrite(data),
            _ => data,
        };
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
            self.count_answered(&mut g);
        }
        Ok(())
    }

    /// [`Stream::count_response`], and the store told when a buffered stream owes no more.
    fn count_answered(&self, g: &mut Inner) {
        Self::count_response(g);
        if g.owed == Some(0) && self.buffered() {
            self.events.answered(self.key.stream);
        }
    }

    /// Sends to the attached connection; one that is gone, or too slow to keep up, is
    /// dropped, and a slow one closed (a buffered stream's client resumes from the store).
    fn send(g: &mut Inner, frame: Frame) {
        let Some(c) = &g.conn else { return };
        // A queue that is not written to a socket (a JSON answer being collected) is drained
        // as it fills: only a socket's reader can fall behind in bytes.
        let byte_limit = c.cut.is_some().then_some(g.queue_limit);
        if let Err(not_sent) = c.tx.try_send(frame, byte_limit) {
            if not_sent == NotSent::TooSlow {
                tracing::debug!(
                    "a client fell {LIVE_QUEUE} events or {} bytes behind: its connection is closed",
                    g.queue_limit
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
        self.0.count_answered(&mut self.0.lock());
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

    /// Whether the stream takes nothing any more (released: answered and gone, or its
    /// client left an unbuffered stream).
    pub fn is_closed(&self) -> bool {
        self.0.is_released()
    }

    /// Whether both ends belong to the same stream.
    pub fn same_stream(&self, other: &Sink) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Whether its request waits, parked, for its client's retry (nothing it runs can be
    /// asking the client meanwhile).
    pub fn waiting(&self) -> bool {
        self.0.waiting.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The number of the stream within its session.
    pub fn stream_number(&self) -> u64 {
        self.0.key.stream
    }

    /// The session the stream belongs to.
    pub fn session_id(&self) -> &str {
        &self.0.key.session
    }
}
