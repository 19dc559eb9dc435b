//! Redis's answers read with suspicion: every id, field, count and size is checked, and what
//! does not parse is an error, never a panic; and each round trip under its timeout.

use std::future::Future;
use std::time::{Duration, Instant};

use ::redis::{RedisResult, Value};
use bytes::Bytes;

use super::*;

/// Times a round trip (`mcp_gateway_redis_seconds`) and counts its failure; the error's text
/// is for logs.
pub(super) async fn round_trip<T>(
    op: RedisOp,
    call: impl Future<Output = RedisResult<T>>,
) -> Result<T, String> {
    let started = Instant::now();
    let result = call.await;
    metrics::record_redis(op, started.elapsed(), result.is_ok());
    result.map_err(|e| format!("redis: {e}"))
}

/// Bounds a call to Redis in time; running out counts as an error of `op`.
pub(super) async fn with_timeout<T>(
    op: RedisOp,
    limit: Duration,
    call: impl Future<Output = Result<T, String>>,
) -> Result<T, String> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => {
            metrics::redis_error(op);
            Err(format!("redis: no answer within {} ms", limit.as_millis()))
        }
    }
}

/// The id of event `seq`.
pub(super) fn entry_id(seq: u64) -> String {
    format!("{seq}-0")
}

/// The bytes of a string reply.
pub(super) fn text(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

/// A decimal number, digits only (no sign, no spaces), that fits in a `u64`.
pub(super) fn parse_number(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 20 || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// The sequence in an entry id `<seq>-0`; any other id is not one this store wrote.
pub(super) fn parse_id(v: &Value) -> Result<u64, String> {
    let id = text(v).ok_or("redis: an entry id that is not a string")?;
    let seq = id
        .strip_suffix(b"-0")
        .and_then(parse_number)
        .filter(|seq| *seq > 0);
    seq.ok_or_else(|| {
        format!(
            "redis: an entry id this store did not write: {:?}",
            String::from_utf8_lossy(&id[..id.len().min(64)])
        )
    })
}

/// An `XREVRANGE` reply asked for at most `want` entries with `low <= seq <= top`: each
/// entry's sequence and event, checked to be in range, in falling order, and to have its
/// field.
pub(super) fn parse_entries(
    reply: Value,
    low: u64,
    top: u64,
    want: usize,
) -> Result<Vec<(u64, Bytes)>, String> {
    let entries = match reply {
        Value::Array(entries) => entries,
        Value::Nil => Vec::new(),
        _ => return Err("redis: a range that is not a list".into()),
    };
    if entries.len() > want {
        return Err(format!(
            "redis: {} entries where at most {want} were asked for",
            entries.len()
        ));
    }
    let mut out = Vec::with_capacity(entries.len());
    let mut below = top.saturating_add(1);
    for entry in entries {
        let Value::Array(parts) = entry else {
            return Err("redis: an entry that is not a list".into());
        };
        let Ok([id, fields]) = <[Value; 2]>::try_from(parts) else {
            return Err("redis: an entry that is not an id and its fields".into());
        };
        let seq = parse_id(&id)?;
        if seq < low || seq >= below {
            return Err(format!(
                "redis: entry {seq} out of the range or the order asked for"
            ));
        }
        below = seq;
        out.push((seq, field(fields)?));
    }
    Ok(out)
}

/// The event in an entry's fields.
pub(super) fn field(fields: Value) -> Result<Bytes, String> {
    let pairs: Vec<(Value, Value)> = match fields {
        Value::Array(flat) if flat.len() % 2 == 0 => {
            let mut it = flat.into_iter();
            std::iter::from_fn(|| Some((it.next()?, it.next()?))).collect()
        }
        Value::Map(pairs) => pairs,
        _ => return Err("redis: an entry whose fields are not pairs".into()),
    };
    for (name, value) in pairs {
        if text(&name) == Some(FIELD) {
            return match value {
                Value::BulkString(b) => Ok(Bytes::from(b)),
                _ => Err("redis: an event that is not a string".into()),
            };
        }
    }
    Err("redis: an entry without its event".into())
}

/// An `SSCAN` reply: the next cursor and the members.
pub(super) fn parse_scan(reply: Value) -> Result<(String, Vec<Vec<u8>>), String> {
    let bad = || "redis: a scan reply that is not a cursor and a list".to_string();
    let Value::Array(parts) = reply else {
        return Err(bad());
    };
    let Ok([cursor, members]) = <[Value; 2]>::try_from(parts) else {
        return Err(bad());
    };
    let cursor = text(&cursor)
        .filter(|c| parse_number(c).is_some())
        .ok_or_else(bad)?;
    let cursor = String::from_utf8_lossy(cursor).into_owned();
    let members = match members {
        Value::Array(m) | Value::Set(m) => m,
        _ => return Err(bad()),
    };
    if members.len() > SCAN_PAGE * 10 {
        return Err(format!("redis: {} members in one scan page", members.len()));
    }
    let members = members
        .into_iter()
        .map(|m| match m {
            Value::BulkString(b) => Ok(b),
            Value::SimpleString(s) => Ok(s.into_bytes()),
            _ => Err("redis: a set member that is not a string".to_string()),
        })
        .collect::<Result<_, _>>()?;
    Ok((cursor, members))
}

/// An `XINFO STREAM` reply: where stream `n` stands.
pub(super) fn parse_info(n: u64, reply: Value) -> Result<StreamPosition, String> {
    let pairs: Vec<(Value, Value)> = match reply {
        Value::Array(flat) if flat.len() % 2 == 0 => {
            let mut it = flat.into_iter();
            std::iter::from_fn(|| Some((it.next()?, it.next()?))).collect()
        }
        Value::Map(pairs) => pairs,
        _ => return Err("redis: stream info that is not pairs".into()),
    };
    let (mut last, mut first) = (None, None);
    for (name, value) in pairs {
        match text(&name) {
            Some(b"last-generated-id") => last = Some(parse_id(&value)?),
            Some(b"first-entry") => {
                first = match value {
                    Value::Nil => None,
                    Value::Array(parts) => Some(parse_id(
                        parts.first().ok_or("redis: a first entry without its id")?,
                    )?),
                    _ => return Err("redis: a first entry that is not an entry".into()),
                }
            }
            _ => {}
        }
    }
    let last = last.ok_or("redis: stream info without its last id")?;
    let next_seq = last
        .checked_add(1)
        .ok_or("redis: a last id past the last sequence")?;
    let oldest_kept = first.unwrap_or(next_seq);
    if oldest_kept > next_seq {
        return Err("redis: stream info whose first entry is past its last".into());
    }
    Ok(StreamPosition {
        stream: n,
        oldest_kept,
        next_seq,
    })
}

/// The most bytes of request ids one stream may owe, as read back: a stream owes one
/// response per request of its POST, and a POST's body is bounded far below this.
const MAX_OWED_BYTES: usize = 1024 * 1024;

/// An `HGETALL` of a session's streams that owe responses: stream number and the JSON array
/// of ids, at most `max` of them. The ids are checked to be a JSON array where they are used.
pub(super) fn parse_in_flight(reply: Value, max: usize) -> Result<Vec<(u64, Bytes)>, String> {
    let pairs: Vec<(Value, Value)> = match reply {
        Value::Array(flat) if flat.len() % 2 == 0 => {
            let mut it = flat.into_iter();
            std::iter::from_fn(|| Some((it.next()?, it.next()?))).collect()
        }
        Value::Map(pairs) => pairs,
        Value::Nil => Vec::new(),
        _ => return Err("redis: an in-flight hash that is not pairs".into()),
    };
    if pairs.len() > max {
        return Err(format!("redis: {} streams in flight", pairs.len()));
    }
    let mut out = Vec::with_capacity(pairs.len());
    for (name, value) in pairs {
        let stream = text(&name)
            .and_then(parse_number)
            .ok_or("redis: an in-flight stream number that is not one")?;
        let ids = match value {
            Value::BulkString(b) if b.len() <= MAX_OWED_BYTES => Bytes::from(b),
            _ => return Err("redis: in-flight ids that are not a bounded string".into()),
        };
        out.push((stream, ids));
    }
    out.sort_unstable_by_key(|(n, _)| *n);
    Ok(out)
}
