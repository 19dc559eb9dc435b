//! One session's events in one log ([`SessionLog`]): the data structure behind
//! [`MemoryEventStore`](super::MemoryEventStore). It knows positions, links and counts; the
//! limits, ages and locking are the store's.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;

use crate::stream::ByNumber;

/// No position: a stream with no event kept, or the last event of its stream.
pub(super) const NONE: u64 = u64::MAX;

/// One appended event, in its session's log.
pub(super) struct Logged {
    stream: u64,
    pub(super) seq: u64,
    pub(super) at: Instant,
    /// `None` once the event left (delivered and trimmed, released, evicted). The entry stays
    /// until it reaches the front of the log or the log is compacted.
    data: Option<Bytes>,
    /// Where the same stream's next event is in the log, or [`NONE`].
    next: u64,
}

/// What the store knows of one stream: where its kept events are in the log and how many.
pub(super) struct StreamRec {
    /// Position of the oldest event kept, or [`NONE`].
    pub(super) head: u64,
    /// Position of the newest event kept, or [`NONE`].
    pub(super) tail: u64,
    pub(super) events: usize,
    pub(super) bytes: usize,
    /// The lowest sequence still replayable: everything below was evicted or trimmed.
    pub(super) first_kept: u64,
}

/// A session's events in one log, in append order, each linked to its stream's next one.
///
/// A POST's stream holds one or a few events and lingers a while after its answer, so a busy
/// session keeps thousands of small streams. One log for them all costs no allocation per
/// stream, and the log's order is the order for age and budget eviction: the oldest event of
/// the session is at the front, and events that already left are dropped from there as they
/// come up (streams are mostly released in the order they were made).
#[derive(Default)]
pub(super) struct SessionLog {
    pub(super) log: VecDeque<Logged>,
    /// The position of `log[0]`. Positions only grow, so they stay valid as the front goes.
    pub(super) base: u64,
    pub(super) streams: ByNumber<StreamRec>,
    pub(super) events: usize,
    pub(super) bytes: usize,
}

impl SessionLog {
    pub(super) fn at(&mut self, pos: u64) -> &mut Logged {
        let base = self.base;
        &mut self.log[(pos - base) as usize]
    }

    /// Appends an event; returns the stream's kept events and bytes.
    pub(super) fn push(
        &mut self,
        stream: u64,
        seq: u64,
        data: Bytes,
        at: Instant,
    ) -> (usize, usize) {
        let pos = self.base + self.log.len() as u64;
        let len = data.len();
        self.log.push_back(Logged {
            stream,
            seq,
            at,
            data: Some(data),
            next: NONE,
        });
        let rec = self.streams.get_or_insert(
            stream,
            StreamRec {
                head: NONE,
                tail: NONE,
                events: 0,
                bytes: 0,
                first_kept: seq,
            },
        );
        let tail = std::mem::replace(&mut rec.tail, pos);
        if tail == NONE {
            rec.head = pos;
        }
        rec.events += 1;
        rec.bytes += len;
        let kept = (rec.events, rec.bytes);
        self.events += 1;
        self.bytes += len;
        if tail != NONE {
            self.at(tail).next = pos;
        }
        kept
    }

    /// Drops a stream's oldest kept event; returns whether there was one.
    pub(super) fn pop_stream(&mut self, stream: u64) -> bool {
        let Some(head) = self.streams.get(stream).map(|r| r.head) else {
            return false;
        };
        if head == NONE {
            return false;
        }
        let e = self.at(head);
        let (seq, next, len) = (e.seq, e.next, e.data.take().map_or(0, |d| d.len()));
        let rec = self.streams.get_mut(stream).expect("checked above");
        rec.head = next;
        rec.first_kept = seq + 1;
        rec.events -= 1;
        rec.bytes -= len;
        if rec.events == 0 {
            rec.tail = NONE;
        }
        self.events -= 1;
        self.bytes -= len;
        true
    }

    /// Drops entries at the front whose events already left. An emptied log gives its room
    /// back: a session that had a burst of calls does not keep the burst's log while idle.
    pub(super) fn drop_gone_front(&mut self) {
        while self.log.front().is_some_and(|e| e.data.is_none()) {
            self.log.pop_front();
            self.base += 1;
        }
        if self.log.is_empty() && self.log.capacity() > 64 {
            self.log = VecDeque::new();
        }
    }

    /// Evicts the session's oldest kept event, if it matches `pick`; `false` when none did.
    pub(super) fn evict_oldest(&mut self, pick: impl Fn(&Logged) -> bool) -> bool {
        self.drop_gone_front();
        let Some(stream) = self.log.front().filter(|e| pick(e)).map(|e| e.stream) else {
            return false;
        };
        // The front is the oldest event anywhere in the session, so its stream's oldest too.
        self.pop_stream(stream);
        self.drop_gone_front();
        true
    }

    /// Forgets a stream and its kept events.
    pub(super) fn release(&mut self, stream: u64) {
        let Some(rec) = self.streams.remove(stream) else {
            return;
        };
        let mut pos = rec.head;
        while pos != NONE {
            let e = self.at(pos);
            e.data = None;
            pos = e.next;
        }
        self.events -= rec.events;
        self.bytes -= rec.bytes;
        self.drop_gone_front();
    }

    /// Rewrites the log without the entries whose events left, once they are the greater
    /// part of it (a long-kept event at the front holds back everything after it).
    pub(super) fn compact_if_sparse(&mut self) {
        if self.log.len() <= 2 * self.events + 64 {
            return;
        }
        for rec in self.streams.values_mut() {
            rec.head = NONE;
            rec.tail = NONE;
        }
        let old = std::mem::take(&mut self.log);
        self.log.reserve(self.events);
        for e in old.into_iter().filter(|e| e.data.is_some()) {
            self.push_linked(e);
        }
    }

    /// Appends a kept entry during compaction, linking it after its stream's last one.
    fn push_linked(&mut self, mut e: Logged) {
        let pos = self.base + self.log.len() as u64;
        e.next = NONE;
        let rec = self
            .streams
            .get_mut(e.stream)
            .expect("a kept event's stream");
        let tail = std::mem::replace(&mut rec.tail, pos);
        if tail == NONE {
            rec.head = pos;
        }
        self.log.push_back(e);
        if tail != NONE {
            self.at(tail).next = pos;
        }
    }

    /// A stream's kept events with `after < seq < before`.
    pub(super) fn range(&self, stream: &StreamRec, after: u64, before: u64) -> Vec<(u64, Bytes)> {
        let mut out = Vec::new();
        let mut pos = stream.head;
        while pos != NONE {
            let e = &self.log[(pos - self.base) as usize];
            if e.seq >= before {
                break;
            }
            if let (true, Some(data)) = (e.seq > after, &e.data) {
                out.push((e.seq, data.clone()));
            }
            pos = e.next;
        }
        out
    }
}
