//! The background writer: the queue of appends, trims and deletions, written to Redis in
//! pipelined batches, one round trip each, in the order they were queued.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use ::redis::aio::ConnectionManager;
use ::redis::{Pipeline, Value};
use tokio::sync::mpsc;

use super::*;

/// The background task that writes the queue to Redis, a pipelined batch per round trip.
pub(super) struct Writer {
    pub(super) conn: ConnectionManager,
    pub(super) rx: mpsc::Receiver<Op>,
    pub(super) keys: Keys,
    pub(super) counters: Arc<Counters>,
    /// `MAXLEN ~` of every stream.
    pub(super) maxlen: usize,
    /// Every key's expiry, refreshed by each batch that writes to it.
    pub(super) ttl_ms: u64,
    pub(super) options: RedisEventOptions,
}

/// What a command of a batch was, to read its reply.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Append,
    Other,
}

/// A batch turned into one pipeline.
pub(super) struct Plan<'a> {
    pub(super) keys: &'a Keys,
    pub(super) ttl_ms: u64,
    pub(super) pipe: Pipeline,
    pub(super) kinds: Vec<Kind>,
    /// Streams appended to since their expiry was last refreshed in this pipeline.
    pub(super) touched: BTreeSet<(Arc<str>, u64)>,
    pub(super) appends: u64,
}

impl Plan<'_> {
    pub(super) fn push(&mut self, kind: Kind) {
        self.kinds.push(kind);
    }

    /// Refreshes the expiry of the streams appended to, and lists them in their sessions'
    /// sets. Done before any other operation, so a deletion comes after them.
    pub(super) fn touch(&mut self) {
        // In order by session, then stream: one SADD and one PEXPIRE of the set per session.
        let mut touched = std::mem::take(&mut self.touched).into_iter().peekable();
        while let Some((session, stream)) = touched.next() {
            let mut streams = vec![stream];
            while let Some((_, n)) = touched.next_if(|(s, _)| *s == session) {
                streams.push(n);
            }
            for n in &streams {
                self.pipe
                    .cmd("PEXPIRE")
                    .arg(self.keys.stream(&session, *n))
                    .arg(self.ttl_ms);
                self.push(Kind::Other);
            }
            let index = self.keys.index(&session);
            self.pipe.cmd("SADD").arg(&index).arg(streams);
            self.pipe.cmd("PEXPIRE").arg(&index).arg(self.ttl_ms);
            self.kinds.extend([Kind::Other, Kind::Other]);
        }
    }
}

impl Writer {
    pub(super) async fn run(mut self) {
        while let Some(op) = self.rx.recv().await {
            let mut bytes = self.took(&op);
            let mut batch = vec![op];
            while batch.len() < self.options.batch_ops && bytes < self.options.batch_bytes {
                let Ok(op) = self.rx.try_recv() else { break };
                bytes += self.took(&op);
                batch.push(op);
            }
            self.write(batch).await;
        }
    }

    /// An operation left the queue: its bytes no longer count against it.
    pub(super) fn took(&self, op: &Op) -> usize {
        let n = op.bytes();
        self.counters.queued_bytes.fetch_sub(n, Ordering::AcqRel);
        n
    }

    pub(super) async fn write(&mut self, batch: Vec<Op>) {
        let settled = settled_in_batch(&batch);
        let superseded: Vec<bool> = superseded_trims(&batch)
            .into_iter()
            .zip(settled)
            .map(|(a, b)| a || b)
            .collect();
        let mut plan = Plan {
            keys: &self.keys,
            ttl_ms: self.ttl_ms,
            pipe: Pipeline::with_capacity(batch.len() + 8),
            kinds: Vec::with_capacity(batch.len() + 8),
            touched: BTreeSet::new(),
            appends: 0,
        };
        plan.pipe.ignore_errors();
        let mut flushes = Vec::new();
        // The streams released in this batch, by session: deleted after everything else of
        // the batch, one DEL, SREM and HDEL per session rather than three commands a stream
        // (finished streams are released in sweeps, many at a time). Later is as right: a
        // released stream gets nothing more, and deleting a session's keys twice is harmless.
        let mut released: std::collections::BTreeMap<Arc<str>, Vec<u64>> = Default::default();
        for (op, superseded) in batch.into_iter().zip(superseded) {
            match op {
                Op::Append {
                    session,
                    stream,
                    seq,
                    data,
                } => {
                    plan.pipe
                        .cmd("XADD")
                        .arg(self.keys.stream(&session, stream))
                        .arg("MAXLEN")
                        .arg("~")
                        .arg(self.maxlen)
                        .arg(entry_id(seq))
                        .arg(FIELD)
                        .arg(&data[..]);
                    plan.push(Kind::Append);
                    plan.appends += 1;
                    plan.touched.insert((session, stream));
                }
                Op::Trim { .. } if superseded => {}
                Op::Trim {
                    session,
                    stream,
                    through,
                } => {
                    plan.touch();
                    plan.pipe
                        .cmd("XTRIM")
                        .arg(self.keys.stream(&session, stream))
                        .arg("MINID")
                        .arg(entry_id(through.saturating_add(1)));
                    plan.push(Kind::Other);
                }
                // Written at the batch's end, a session's together (see `released`).
                Op::Release { session, stream } => {
                    released.entry(session).or_default().push(stream);
                }
                Op::ReleaseSession { session, streams } => {
                    plan.touch();
                    let del = plan
                        .pipe
                        .cmd("DEL")
                        .arg(self.keys.index(&session))
                        .arg(self.keys.in_flight(&session));
                    for stream in streams {
                        del.arg(self.keys.stream(&session, stream));
                    }
                    plan.push(Kind::Other);
                }
                Op::Owe { .. } | Op::Answered { .. } if superseded => {}
                Op::Owe {
                    session,
                    stream,
                    ids,
                } => {
                    let key = self.keys.in_flight(&session);
                    plan.pipe.cmd("HSET").arg(&key).arg(stream).arg(&ids[..]);
                    plan.pipe.cmd("PEXPIRE").arg(&key).arg(self.ttl_ms);
                    plan.kinds.extend([Kind::Other, Kind::Other]);
                }
                Op::Answered { session, stream } => {
                    plan.pipe
                        .cmd("HDEL")
                        .arg(self.keys.in_flight(&session))
                        .arg(stream);
                    plan.push(Kind::Other);
                }
                Op::Flush(tx) => flushes.push(tx),
            }
        }
        plan.touch();
        for (session, streams) in released {
            let del = plan.pipe.cmd("DEL");
            for n in &streams {
                del.arg(self.keys.stream(&session, *n));
            }
            plan.pipe
                .cmd("SREM")
                .arg(self.keys.index(&session))
                .arg(&streams);
            plan.pipe
                .cmd("HDEL")
                .arg(self.keys.in_flight(&session))
                .arg(&streams);
            plan.kinds.extend([Kind::Other, Kind::Other, Kind::Other]);
        }
        let Plan {
            pipe,
            kinds,
            appends,
            ..
        } = plan;
        if !kinds.is_empty() {
            let sent = with_timeout(
                RedisOp::EventsWrite,
                self.options.write_timeout,
                round_trip(
                    RedisOp::EventsWrite,
                    pipe.query_async::<Vec<Value>>(&mut self.conn),
                ),
            )
            .await;
            match sent {
                Ok(replies) => self.tally(&kinds, replies, appends),
                Err(e) => self.counters.drop_events(appends, &e),
            }
        }
        for tx in flushes {
            let _ = tx.send(());
        }
    }

    /// Counts what Redis took and what it refused.
    pub(super) fn tally(&self, kinds: &[Kind], replies: Vec<Value>, appends: u64) {
        if replies.len() != kinds.len() {
            metrics::redis_error(RedisOp::EventsWrite);
            return self.counters.drop_events(
                appends,
                &"Redis answered a batch with the wrong number of replies",
            );
        }
        let (mut written, mut refused, mut failed) = (0, 0, 0);
        let mut first_error = None;
        for (kind, reply) in kinds.iter().zip(replies) {
            match (kind, reply) {
                (Kind::Append, Value::ServerError(e)) => {
                    refused += 1;
                    first_error.get_or_insert(e);
                }
                (Kind::Append, _) => written += 1,
                (Kind::Other, Value::ServerError(e)) => {
                    failed += 1;
                    first_error.get_or_insert(e);
                }
                (Kind::Other, _) => {}
            }
        }
        self.counters.wrote(written);
        for _ in 0..refused + failed {
            metrics::redis_error(RedisOp::EventsWrite);
        }
        if let Some(e) = first_error {
            let why = format!(
                "Redis refused {} commands, the first with: {e}",
                refused + failed
            );
            if refused > 0 {
                self.counters.drop_events(refused, &why);
            } else if self.counters.may_warn() {
                tracing::warn!("{why}");
            }
        }
    }
}

/// For each operation of a batch, whether it is a debt settled in the same batch: a stream
/// that opened owing responses and was answered (or released) before the batch went out
/// needs neither its `HSET` nor its `HDEL`. A quick call, the common case, then costs the
/// in-flight hash nothing.
pub(super) fn settled_in_batch(batch: &[Op]) -> Vec<bool> {
    let mut out = vec![false; batch.len()];
    // Where each stream's pending debt was queued.
    let mut owing: HashMap<(&str, u64), usize> = HashMap::new();
    for (i, op) in batch.iter().enumerate() {
        match op {
            Op::Owe {
                session, stream, ..
            } => {
                owing.insert((&**session, *stream), i);
            }
            Op::Answered { session, stream } => {
                if let Some(at) = owing.remove(&(&**session, *stream)) {
                    out[at] = true;
                    out[i] = true;
                }
            }
            Op::Release { session, stream } => {
                if let Some(at) = owing.remove(&(&**session, *stream)) {
                    out[at] = true;
                }
            }
            Op::ReleaseSession { session, .. } => {
                owing.retain(|(s, _), at| {
                    let keep = *s != &**session;
                    if !keep {
                        out[*at] = true;
                    }
                    keep
                });
            }
            _ => {}
        }
    }
    out
}

/// For each operation of a batch, whether it is a trim that a later one of the same stream
/// covers (with no release between): of a stream's trims in a batch only the last is sent,
/// so a stream trimmed as each event is delivered costs one command per batch, not per event.
pub(super) fn superseded_trims(batch: &[Op]) -> Vec<bool> {
    // The highest trim of each stream later in the batch, going backwards.
    let mut later: HashMap<(&str, u64), u64> = HashMap::new();
    let mut out: Vec<bool> = batch
        .iter()
        .rev()
        .map(|op| match op {
            Op::Trim {
                session,
                stream,
                through,
            } => {
                let key = (&**session, *stream);
                let covered = later.get(&key).is_some_and(|highest| highest >= through);
                let highest = later.entry(key).or_insert(*through);
                *highest = (*highest).max(*through);
                covered
            }
            Op::Release { session, stream } => {
                later.remove(&(&**session, *stream));
                false
            }
            Op::ReleaseSession { session, .. } => {
                later.retain(|(s, _), _| *s != &**session);
                false
            }
            _ => false,
        })
        .collect();
    out.reverse();
    out
}
