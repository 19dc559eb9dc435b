//! Reading Redis back: a stream's events for a replay, and a session's streams when it is
//! adopted; queueing operations for the writer without waiting.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use ::redis::{Pipeline, Value};
use bytes::Bytes;
use tokio::sync::mpsc;

use super::*;

impl Shared {
    /// Queues an operation for the writer without waiting; past the queue's bounds it is
    /// dropped (an event then stays in memory only).
    pub(super) fn enqueue(&self, op: Op) {
        let bytes = op.bytes();
        let c = &self.counters;
        if bytes > 0
            && c.queued_bytes.fetch_add(bytes, Ordering::AcqRel) + bytes > self.options.queue_bytes
        {
            c.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
            return self.not_queued(&op, "the queue to Redis holds too many bytes");
        }
        if let Err(e) = self.queue.try_send(op) {
            c.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
            let (op, why) = match e {
                mpsc::error::TrySendError::Full(op) => (op, "the queue to Redis is full"),
                mpsc::error::TrySendError::Closed(op) => (op, "the Redis writer has stopped"),
            };
            self.not_queued(&op, why);
        }
    }

    pub(super) fn not_queued(&self, op: &Op, why: &str) {
        match op {
            Op::Append { .. } => self.counters.drop_events(1, &why),
            Op::Flush(_) => {}
            _ => {
                if self.counters.may_warn() {
                    tracing::warn!(
                        "a deletion from Redis was not queued ({why}): its keys stay until \
                         they expire"
                    );
                }
            }
        }
    }

    /// The events with `after < seq < before` of a stream of the session named `name` (see
    /// [`SessionNames`]) in Redis, bounded and checked like
    /// the memory store's: `Evicted` (with the oldest kept) when any is missing, unless
    /// `skip_evicted`. Whether the newest ones (up to `before`) are missing can be told only
    /// when they are known to exist (`reach_before`): a gap at the end of what was written
    /// looks like the end.
    pub(super) async fn read_range(
        &self,
        name: &str,
        stream: u64,
        after: u64,
        before: u64,
        skip_evicted: bool,
        reach_before: bool,
    ) -> Result<Vec<(u64, Bytes)>, ReplayError> {
        let Some(low) = after.checked_add(1).filter(|low| *low < before) else {
            return Ok(Vec::new());
        };
        let key = self.keys.stream(name, stream);
        let mut events = with_timeout(
            RedisOp::EventsRead,
            self.options.read_timeout,
            self.read_newest(&key, low, before - 1),
        )
        .await
        .map_err(ReplayError::Backend)?;
        events.reverse();
        if skip_evicted {
            return Ok(events);
        }
        // The kept events run on without a gap from `events[from]` to the newest.
        let mut from = 0;
        let mut expected = low;
        for (i, (seq, _)) in events.iter().enumerate() {
            if *seq != expected {
                from = i;
            }
            expected = seq + 1;
        }
        if reach_before && expected != before {
            // Events before `before` are known to exist (memory holds them from there on):
            // the newest ones are missing, so nothing kept here leads up to them.
            return Err(ReplayError::Evicted {
                oldest_kept: before,
            });
        }
        match events.get(from) {
            None => Err(ReplayError::Evicted {
                oldest_kept: before,
            }),
            Some((seq, _)) if *seq == low => Ok(events),
            Some((seq, _)) => Err(ReplayError::Evicted { oldest_kept: *seq }),
        }
    }

    /// A stream's newest entries with `low <= seq <= high`, newest first, as many as the
    /// per-stream bounds (count and bytes) allow, read back page by page.
    pub(super) async fn read_newest(
        &self,
        key: &str,
        low: u64,
        high: u64,
    ) -> Result<Vec<(u64, Bytes)>, String> {
        let max_events = self.limits.max_events_per_stream;
        let max_bytes = self.limits.max_bytes_per_stream;
        let mut conn = self.conn.clone();
        let mut out: Vec<(u64, Bytes)> = Vec::new();
        let mut bytes = 0usize;
        let mut top = high;
        loop {
            // One more than may be kept, so a bound that cuts the range is seen.
            let want = (max_events.saturating_add(1) - out.len()).min(READ_PAGE);
            let reply: Value = round_trip(
                RedisOp::EventsRead,
                ::redis::cmd("XREVRANGE")
                    .arg(key)
                    .arg(entry_id(top))
                    .arg(entry_id(low))
                    .arg("COUNT")
                    .arg(want)
                    .query_async(&mut conn),
            )
            .await?;
            let page = parse_entries(reply, low, top, want)?;
            let n = page.len();
            for (seq, data) in page {
                if out.len() == max_events || bytes.saturating_add(data.len()) > max_bytes {
                    return Ok(out);
                }
                bytes += data.len();
                out.push((seq, data));
            }
            match out.last() {
                Some((seq, _)) if n == want && *seq > low => top = seq - 1,
                _ => return Ok(out),
            }
        }
    }

    /// Where each stream of the session named `name` stands in Redis, and which owed
    /// responses.
    pub(super) async fn adopt(&self, name: &str) -> Result<Adopted, String> {
        let streams = self.positions(name).await?;
        let mut conn = self.conn.clone();
        let reply: Value = round_trip(
            RedisOp::EventsAdopt,
            ::redis::cmd("HGETALL")
                .arg(self.keys.in_flight(name))
                .query_async(&mut conn),
        )
        .await?;
        let in_flight = parse_in_flight(reply, MAX_ADOPTED_STREAMS)?;
        Ok(Adopted { streams, in_flight })
    }

    /// Where each stream of a session stands in Redis.
    async fn positions(&self, name: &str) -> Result<Vec<StreamPosition>, String> {
        let index = self.keys.index(name);
        let mut conn = self.conn.clone();
        let mut numbers = BTreeSet::new();
        let mut cursor = String::from("0");
        // SSCAN may return a member twice and pages with none: bounded in rounds too.
        for round in 0.. {
            if round > MAX_ADOPTED_STREAMS / SCAN_PAGE * 4 + 16 {
                return Err("redis: listing a session's streams does not end".into());
            }
            let reply: Value = round_trip(
                RedisOp::EventsAdopt,
                ::redis::cmd("SSCAN")
                    .arg(&index)
                    .arg(&cursor)
                    .arg("COUNT")
                    .arg(SCAN_PAGE)
                    .query_async(&mut conn),
            )
            .await?;
            let (next, members) = parse_scan(reply)?;
            for m in members {
                numbers.insert(parse_number(&m).ok_or("redis: a stream number that is not one")?);
            }
            if numbers.len() > MAX_ADOPTED_STREAMS {
                return Err(format!(
                    "redis: the session has more than {MAX_ADOPTED_STREAMS} streams"
                ));
            }
            if next == "0" {
                break;
            }
            cursor = next;
        }
        let numbers: Vec<u64> = numbers.into_iter().collect();
        let mut out = Vec::with_capacity(numbers.len());
        for chunk in numbers.chunks(INFO_BATCH) {
            let mut pipe = Pipeline::with_capacity(chunk.len());
            pipe.ignore_errors();
            for n in chunk {
                pipe.cmd("XINFO")
                    .arg("STREAM")
                    .arg(self.keys.stream(name, *n));
            }
            let replies: Vec<Value> =
                round_trip(RedisOp::EventsAdopt, pipe.query_async(&mut conn)).await?;
            if replies.len() != chunk.len() {
                return Err("redis: a pipeline answered with the wrong number of replies".into());
            }
            for (n, reply) in chunk.iter().zip(replies) {
                match reply {
                    // Expired since it was listed.
                    Value::ServerError(e)
                        if e.details().is_some_and(|d| d.contains("no such key")) => {}
                    Value::ServerError(e) => return Err(format!("redis: XINFO STREAM: {e}")),
                    info => out.push(parse_info(*n, info)?),
                }
            }
        }
        Ok(out)
    }
}
