//! A session's stream table: the GET stream (number 0, kept for the session's life) and its
//! buffered POST streams, live and lingering. A stream answering a POST as SSE is kept (for
//! resumption by `Last-Event-ID`) until its last event has gone out and its linger time is
//! over, or until it is abandoned; a finished one leaves memory and lingers only as its
//! events in the store, rebuilt from them if a client resumes it.
//!
//! The table is behind one short synchronous lock, never held across an await; the reaper
//! sweeps it a few times a second. It holds streams, never a stream's events (those are the
//! event store's).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard, Weak};
use std::time::{Duration, Instant};

use super::Session;
use crate::stream::{Buffering, ByNumber, EventId, Stream, StreamHooks, StreamKey};

/// Why a `Last-Event-ID` names no stream of this session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownStream {
    /// Its tag is another session's.
    OtherSession,
    /// The stream existed and was released (delivered, abandoned or evicted).
    Released,
    /// No such stream was ever opened.
    NeverIssued,
}

/// A session's buffered POST streams.
#[derive(Default)]
pub(super) struct StreamTable {
    /// Not yet finished or released, by number. A finished one lingers only as its events in
    /// the store.
    pub(super) live: ByNumber<Arc<Stream>>,
    /// Finished streams waiting out their linger time, oldest first.
    lingering: VecDeque<(Instant, u64)>,
}

/// A stream's line back to its session, weak so a stream never keeps a session alive.
pub(super) struct SessionHooks(pub(super) Weak<Session>);

impl StreamHooks for SessionHooks {
    fn finished(&self, stream: u64, at: Instant) {
        if let Some(s) = self.0.upgrade() {
            // Its events linger in the store; the stream itself leaves memory now (a client
            // that resumes it gets it rebuilt), so finished streams cost no scans.
            let mut t = s.streams.lock().expect("streams lock");
            t.live.remove(stream);
            t.lingering
                .push_back((at + s.stream_settings.linger, stream));
            if t.lingering.len() > s.stream_settings.max_lingering
                && let Some((_, n)) = t.lingering.pop_front()
            {
                s.release_lingering_locked(t, n);
            }
        }
    }

    fn read(&self, stream: u64) {
        if let Some(s) = self.0.upgrade() {
            // Its queue entry is among the last (streams finish about in the order they are
            // read); one not found near the end is released again when it comes up, harmlessly.
            let mut t = s.streams.lock().expect("streams lock");
            let len = t.lingering.len();
            if let Some(back) = t
                .lingering
                .iter()
                .rev()
                .take(64)
                .position(|(_, n)| *n == stream)
            {
                t.lingering.remove(len - 1 - back);
            }
            s.release_lingering_locked(t, stream);
        }
    }

    fn released(&self, stream: u64) {
        if let Some(s) = self.0.upgrade() {
            s.streams.lock().expect("streams lock").live.remove(stream);
            if s.for_caller {
                s.remove_listener(stream);
                s.forget_request_logs(stream);
                s.forget_seed(stream);
            }
        }
    }

    fn cut_short(&self, stream: u64) {
        if let Some(s) = self.0.upgrade()
            && s.for_caller
        {
            s.cancel_stream(stream);
        }
    }
}

impl Session {
    /// A modern caller's stream is released before its answer (its client closed it):
    /// closing a response stream is how a 2026-07-28 client cancels, so what its request
    /// still waits for from plugins is cancelled.
    fn cancel_stream(&self, stream: u64) {
        let reason = "the client closed the response stream";
        let cancelled: usize = self
            .running()
            .iter()
            .chain(self.supervisor.shared_conns().iter())
            .map(|c| c.cancel_stream_requests(self.caller, stream, reason))
            .sum();
        if cancelled > 0 {
            tracing::debug!(session = %self.id, stream, "{reason}: {cancelled} request(s) cancelled");
        }
    }

    /// A new stream for a POST's answers: `owed` responses, SSE or JSON. An SSE stream is
    /// kept (for resumption) until its last event has gone out or it is abandoned.
    pub fn new_post_stream(&self, owed: usize, sse: bool) -> Arc<Stream> {
        let number = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let key = StreamKey {
            session: self.id.clone(),
            stream: number,
        };
        let buffered = sse && self.stream_settings.resumable;
        // Only a buffered stream is kept in `streams`, lingers and is released from there; a
        // modern caller's stream tells its release (its client may have closed it early).
        let hooks = (buffered || self.for_caller).then(|| self.hooks.clone());
        let buffering = if buffered {
            Buffering::Replay
        } else {
            Buffering::None
        };
        let stream = Stream::new(
            key,
            self.tag,
            sse,
            buffering,
            self.events.clone(),
            Some(owed),
            hooks,
        );
        if buffered {
            // Its client has seen nothing of it yet: a shared store's copy may wait until its
            // response begins (`sse_response`).
            self.events.hold(number);
            let mut streams = self.streams.lock().expect("streams lock");
            // Checked under the lock `end` takes the map with: a stream is either in the map
            // `end` releases, or made after the end and released here.
            if self.closed.is_cancelled() {
                drop(streams);
                stream.release();
            } else {
                streams.live.get_or_insert(number, stream.clone());
            }
        }
        stream
    }

    /// Releases finished streams whose linger time is over. The linger is the same for all,
    /// so deadlines come in order: a queue, no timers. The session reaper calls it a few times
    /// a second, and a resume calls it before looking its stream up, so no client resumes a
    /// stream past its linger. A new stream does not call it: that would take the lock once
    /// more per request.
    pub fn sweep_finished(&self) {
        let now = Instant::now();
        let due: Vec<u64> = {
            let mut t = self.streams.lock().expect("streams lock");
            let mut due = Vec::new();
            while t.lingering.front().is_some_and(|(at, _)| *at <= now) {
                due.extend(t.lingering.pop_front().map(|(_, n)| n));
            }
            due
        };
        for n in due {
            self.release_lingering(n);
        }
    }

    /// Releases a finished stream whose linger is over.
    fn release_lingering(&self, n: u64) {
        let streams = self.streams.lock().expect("streams lock");
        self.release_lingering_locked(streams, n);
    }

    /// [`Session::release_lingering`] under a lock already taken.
    fn release_lingering_locked(&self, streams: MutexGuard<'_, StreamTable>, n: u64) {
        match streams.live.get(n).cloned() {
            // A stream someone resumed meanwhile is queued again when that connection ends.
            Some(s) => {
                drop(streams);
                s.release_if_detached();
            }
            // Under the lock, so a client resuming it now either finds it or is refused.
            None => self.events.release(n),
        }
    }

    /// The stream a `Last-Event-ID` names.
    pub fn stream_for(&self, id: &EventId) -> Result<Arc<Stream>, UnknownStream> {
        self.sweep_finished();
        if id.tag != self.tag {
            return Err(UnknownStream::OtherSession);
        }
        if id.stream == 0 {
            return Ok(self.get.clone());
        }
        let mut streams = self.streams.lock().expect("streams lock");
        if let Some(s) = streams.live.get(id.stream) {
            return Ok(s.clone());
        }
        if id.stream >= self.next_stream.load(Ordering::Relaxed) {
            return Err(UnknownStream::NeverIssued);
        }
        // A finished stream left memory when its last event went out; its events linger in
        // the store until released, and it is rebuilt from them for a client resuming it.
        let key = StreamKey {
            session: self.id.clone(),
            stream: id.stream,
        };
        match self.events.next_seq(id.stream) {
            Some(next) if !self.closed.is_cancelled() => {
                let hooks = Some(self.hooks.clone());
                let s = Stream::finished(key, self.tag, self.events.clone(), next, hooks);
                streams.live.get_or_insert(id.stream, s.clone());
                Ok(s)
            }
            _ => Err(UnknownStream::Released),
        }
    }

    /// Releases POST streams nobody came back for within `max_age` after their connection
    /// dropped.
    pub fn reap_streams(&self, max_age: Duration) {
        let abandoned: Vec<Arc<Stream>> = self
            .streams
            .lock()
            .expect("streams lock")
            .live
            .values()
            .filter(|s| s.abandoned_for(max_age))
            .cloned()
            .collect();
        for s in abandoned {
            tracing::debug!(session = %self.id, stream = s.number(), "releasing an abandoned stream");
            s.release();
        }
    }
}
