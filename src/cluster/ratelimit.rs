//! Rate-limit buckets every replica shares: [`RedisBuckets`], the
//! [`crate::limits::SharedBuckets`] of cluster mode. Each bucket is a key
//! `<prefix>ratelimit:<limit>:<caller>` holding its theoretical arrival time (GCRA, the same
//! rule as `governor`'s buckets on one replica) in microseconds of Redis's clock, expiring
//! when the bucket would be full again, so idle callers cost Redis nothing.
//!
//! One call is one Lua script over all of its buckets: it takes a token from every one or,
//! when one is empty, from none, and costs one round trip.

use std::sync::Arc;
use std::time::Duration;

use super::Cluster;
use crate::limits::{SharedBucket, SharedBuckets, SharedFuture};
use crate::metrics::RedisOp;

/// KEYS: the buckets. ARGV[2i-1]: KEYS[i]'s interval in microseconds; ARGV[2i]: its burst.
/// Returns `{0, 0}` when taken, `{i, wait in microseconds}` when KEYS[i] is empty.
const SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local next_tats = {}
for i, key in ipairs(KEYS) do
  local interval = tonumber(ARGV[2 * i - 1])
  local burst = tonumber(ARGV[2 * i])
  local tat = tonumber(redis.call('GET', key) or '0') or 0
  if tat < now then tat = now end
  local next_tat = tat + interval
  local allowed_at = next_tat - interval * burst
  if allowed_at > now then
    return {i, allowed_at - now}
  end
  next_tats[i] = next_tat
end
for i, key in ipairs(KEYS) do
  local ttl = math.ceil((next_tats[i] - now) / 1000) + 1
  redis.call('SET', key, string.format('%.0f', next_tats[i]), 'PX', ttl)
end
return {0, 0}
";

/// Buckets in the cluster's Redis.
pub struct RedisBuckets {
    cluster: Arc<Cluster>,
    script: redis::Script,
}

impl RedisBuckets {
    pub(super) fn new(cluster: Arc<Cluster>) -> RedisBuckets {
        RedisBuckets {
            cluster,
            script: redis::Script::new(SCRIPT),
        }
    }
}

impl SharedBuckets for RedisBuckets {
    fn take<'a>(
        &'a self,
        buckets: &'a [SharedBucket],
    ) -> SharedFuture<'a, Result<Option<(usize, Duration)>, String>> {
        Box::pin(async move {
            let mut invocation = self.script.prepare_invoke();
            for b in buckets {
                let interval = b.interval.as_micros().clamp(1, i64::MAX as u128) as i64;
                invocation
                    .key(self.cluster.key(&["ratelimit", &b.rule, &b.caller]))
                    .arg(interval)
                    .arg(b.burst);
            }
            let mut c = self.cluster.conn.clone();
            let (index, wait_us): (i64, i64) = self
                .cluster
                .call(RedisOp::Throttle, async move {
                    invocation.invoke_async(&mut c).await
                })
                .await
                .map_err(|e| e.to_string())?;
            Ok((index > 0).then(|| {
                (
                    (index - 1) as usize,
                    Duration::from_micros(wait_us.max(1) as u64),
                )
            }))
        })
    }
}
