//! One session's events in cluster mode ([`RedisSession`]): appended to memory and queued for
//! Redis, replayed from memory or, for another replica's streams and the older part of an
//! adopted one, from Redis.

use super::*;

/// One session's events: in memory, and queued for Redis.
pub(super) struct RedisSession {
    /// Its name in key names ([`SessionNames::of`]), computed once.
    pub(super) name: Arc<str>,
    pub(super) memory: Arc<dyn SessionEvents>,
    pub(super) shared: Arc<Shared>,
    /// Set when the session is released: a stream that has not heard of it yet appends to
    /// memory only, so no key comes back after the session's keys were deleted.
    pub(super) released: AtomicBool,
    /// Set once [`EventStore::adopt`] loaded streams: only then is `remote` looked at, so a
    /// session of this replica pays one atomic load for it.
    pub(super) adopted: AtomicBool,
    /// The streams another replica wrote to Redis, as loaded when this one adopted the
    /// session: what `oldest_kept` and `next_seq` answer without waiting on Redis.
    pub(super) remote: Mutex<HashMap<u64, Remote>>,
    /// POST streams whose copy is held back ([`SessionEvents::hold`]), and those whose copy
    /// was dropped: looked at only while `holding` counts any.
    pub(super) held: Mutex<HashMap<u64, Held>>,
    pub(super) holding: AtomicUsize,
}

/// A stream's copy held back, or dropped.
pub(super) enum Held {
    /// What the stream sent Redis's way since it was made, in order.
    Waiting { ops: Vec<Op>, bytes: usize },
    /// Not wanted: nothing of it goes to Redis, not even its release.
    Dropped,
}

/// A copy held back past this many operations or bytes is sent: what is held stays small.
pub(super) const HELD_OPS: usize = 64;
const HELD_BYTES: usize = 64 << 10;

/// Where an adopted stream stood in Redis.
#[derive(Debug, Clone, Copy)]
pub(super) struct Remote {
    pub(super) oldest_kept: u64,
    /// One past the last event Redis took.
    pub(super) next_seq: u64,
    /// Where this replica goes on: past every event the replica that died may have sent a
    /// client without writing it to Redis (see [`RedisEventStore::adopt`]). Nothing is
    /// kept between `next_seq` and this.
    pub(super) resumed_at: u64,
}

impl RedisSession {
    /// A replay of an adopted stream: what Redis holds up to where the replica that died
    /// left it, then what this replica appended since (from `resumed_at` on). A cursor past
    /// what Redis holds is one the client had live from the dead replica: it goes on with
    /// this replica's events.
    fn replay_adopted(
        &self,
        r: Remote,
        stream: u64,
        after: u64,
        before: u64,
        skip_evicted: bool,
    ) -> ReplayFuture<'_> {
        let here_after = after.max(r.resumed_at - 1);
        if after.saturating_add(1) >= r.next_seq {
            return self.memory.replay(stream, here_after, before, skip_evicted);
        }
        Box::pin(async move {
            let mut events = self
                .shared
                .read_range(
                    &self.name,
                    stream,
                    after,
                    r.next_seq.min(before),
                    skip_evicted,
                    true,
                )
                .await?;
            if before > r.resumed_at {
                let newer = self.memory.replay(stream, here_after, before, skip_evicted);
                events.extend(newer.await?);
            }
            Ok(events)
        })
    }

    /// The adopted stream's position in Redis, if this session was adopted and had it.
    pub(super) fn remote(&self, stream: u64) -> Option<Remote> {
        if !self.adopted.load(Ordering::Acquire) {
            return None;
        }
        self.remote
            .lock()
            .expect("remote streams lock")
            .get(&stream)
            .copied()
    }

    pub(super) fn remote_streams(&self) -> Vec<u64> {
        self.remote
            .lock()
            .expect("remote streams lock")
            .keys()
            .copied()
            .collect()
    }

    pub(super) fn enqueue(&self, op: Op) {
        if !self.released.load(Ordering::Acquire) {
            self.shared.enqueue(op);
        }
    }

    /// Queues `op` of `stream` for Redis, unless the stream's copy is held back (then it
    /// waits with the rest) or was dropped. `release`: the op is the stream's release, which
    /// ends what is held (nothing of a stream held or dropped ever reached Redis, so its
    /// release has nothing to delete there).
    fn route(&self, stream: u64, op: Op, release: bool) {
        if self.holding.load(Ordering::Acquire) == 0 {
            return self.enqueue(op);
        }
        let mut held = self.held.lock().expect("held streams lock");
        let Some(h) = held.get_mut(&stream) else {
            drop(held);
            return self.enqueue(op);
        };
        if release {
            held.remove(&stream);
            self.holding.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        let Held::Waiting { ops, bytes } = h else {
            return;
        };
        *bytes += op.bytes();
        ops.push(op);
        let over = ops.len() > HELD_OPS || *bytes > HELD_BYTES;
        if over {
            self.send_held(&mut held, stream);
        }
    }

    /// Sends what `stream` held back, in order, and lets its next ops through.
    fn send_held(&self, held: &mut HashMap<u64, Held>, stream: u64) {
        if !matches!(held.get(&stream), Some(Held::Waiting { .. })) {
            return;
        }
        if let Some(Held::Waiting { ops, .. }) = held.remove(&stream) {
            for op in ops {
                self.enqueue(op);
            }
        }
        self.holding.fetch_sub(1, Ordering::AcqRel);
    }

    /// Sends every copy held back: the session is left to another replica.
    pub(super) fn send_all_held(&self) {
        let mut held = self.held.lock().expect("held streams lock");
        let waiting: Vec<u64> = held
            .iter()
            .filter(|(_, h)| matches!(h, Held::Waiting { .. }))
            .map(|(s, _)| *s)
            .collect();
        for stream in waiting {
            self.send_held(&mut held, stream);
        }
    }
}

impl SessionEvents for RedisSession {
    fn append(&self, stream: u64, seq: u64, data: Bytes) {
        let op = Op::Append {
            session: self.name.clone(),
            stream,
            seq,
            data: data.clone(),
        };
        self.route(stream, op, false);
        self.memory.append(stream, seq, data);
    }

    fn replay(&self, stream: u64, after: u64, before: u64, skip_evicted: bool) -> ReplayFuture<'_> {
        let remote = self.remote(stream);
        if let Some(r) = remote {
            return self.replay_adopted(r, stream, after, before, skip_evicted);
        }
        // A stream of this replica is answered as on a gateway alone; one known nowhere here
        // is another replica's, read from Redis, unless the session ended (its keys are
        // deleted).
        if self.memory.oldest_kept(stream).is_some() || self.released.load(Ordering::Acquire) {
            return self.memory.replay(stream, after, before, skip_evicted);
        }
        Box::pin(async move {
            self.shared
                .read_range(&self.name, stream, after, before, skip_evicted, false)
                .await
        })
    }

    fn oldest_kept(&self, stream: u64) -> Option<u64> {
        let in_memory = self.memory.oldest_kept(stream);
        match self.remote(stream) {
            Some(r) => Some(in_memory.map_or(r.oldest_kept, |m| m.min(r.oldest_kept))),
            None => in_memory,
        }
    }

    fn next_seq(&self, stream: u64) -> Option<u64> {
        let in_memory = self.memory.next_seq(stream);
        match self.remote(stream) {
            Some(r) => Some(in_memory.map_or(r.resumed_at, |m| m.max(r.resumed_at))),
            None => in_memory,
        }
    }

    fn trim(&self, stream: u64, through: u64) {
        self.memory.trim(stream, through);
        if self.adopted.load(Ordering::Acquire)
            && let Some(r) = self
                .remote
                .lock()
                .expect("remote streams lock")
                .get_mut(&stream)
        {
            r.oldest_kept = r.oldest_kept.max(through.saturating_add(1));
        }
        let op = Op::Trim {
            session: self.name.clone(),
            stream,
            through,
        };
        self.route(stream, op, false);
    }

    fn owes(&self, stream: u64, ids: Bytes) {
        let op = Op::Owe {
            session: self.name.clone(),
            stream,
            ids,
        };
        self.route(stream, op, false);
    }

    fn answered(&self, stream: u64) {
        let op = Op::Answered {
            session: self.name.clone(),
            stream,
        };
        self.route(stream, op, false);
    }

    fn hold(&self, stream: u64) {
        if self.released.load(Ordering::Acquire) {
            return;
        }
        let mut held = self.held.lock().expect("held streams lock");
        let waiting = Held::Waiting {
            ops: Vec::new(),
            bytes: 0,
        };
        if held.insert(stream, waiting).is_none() {
            self.holding.fetch_add(1, Ordering::AcqRel);
        }
    }

    fn held(&self, stream: u64, wanted: bool) {
        if self.holding.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut held = self.held.lock().expect("held streams lock");
        match held.get_mut(&stream) {
            Some(h @ Held::Waiting { .. }) if !wanted => *h = Held::Dropped,
            Some(Held::Waiting { .. }) => self.send_held(&mut held, stream),
            _ => {}
        }
    }

    fn release(&self, stream: u64) {
        self.memory.release(stream);
        if self.adopted.load(Ordering::Acquire) {
            self.remote
                .lock()
                .expect("remote streams lock")
                .remove(&stream);
        }
        let op = Op::Release {
            session: self.name.clone(),
            stream,
        };
        self.route(stream, op, true);
    }
}
