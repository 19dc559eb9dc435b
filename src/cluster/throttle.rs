//! Attempt counters every replica shares: [`RedisThrottle`], the [`SharedThrottle`] of
//! cluster mode (the registration limit). Each counter is a key `<prefix>throttle:<name>`
//! holding a count, with an expiry of the window from its first attempt: a fixed window, as
//! the replica's own tables keep.
//!
//! One attempt is one Lua script, so checking every counter and counting in all of them is
//! atomic (two replicas never both take the last slot) and costs one round trip. A refused
//! attempt counts nowhere, as on a single replica. What to do when Redis does not answer is
//! the caller's choice ([`crate::auth::server`]'s registration falls back to counting on the
//! replica alone).

use std::sync::Arc;
use std::time::Duration;

use super::Cluster;
use crate::auth::shared::{Admission, SharedFuture, SharedThrottle};
use crate::metrics::RedisOp;

/// KEYS: the counters. ARGV[1]: the window in milliseconds; ARGV[1 + i]: the limit of
/// KEYS[i]. Returns `{1, 0}` when counted, `{0, wait in ms}` when a counter is at its limit.
const SCRIPT: &str = r"
for i, key in ipairs(KEYS) do
  local n = tonumber(redis.call('GET', key) or '0') or 0
  if n >= tonumber(ARGV[i + 1]) then
    local wait = redis.call('PTTL', key)
    if wait < 0 then
      redis.call('PEXPIRE', key, ARGV[1])
      wait = tonumber(ARGV[1])
    end
    return {0, wait}
  end
end
for _, key in ipairs(KEYS) do
  local n = redis.call('INCR', key)
  if n == 1 or redis.call('PTTL', key) < 0 then
    redis.call('PEXPIRE', key, ARGV[1])
  end
end
return {1, 0}
";

/// Counters in the cluster's Redis.
pub struct RedisThrottle {
    cluster: Arc<Cluster>,
    script: redis::Script,
}

impl RedisThrottle {
    pub(super) fn new(cluster: Arc<Cluster>) -> RedisThrottle {
        RedisThrottle {
            cluster,
            script: redis::Script::new(SCRIPT),
        }
    }
}

impl SharedThrottle for RedisThrottle {
    fn acquire<'a>(
        &'a self,
        counters: &'a [(String, u32)],
        window: Duration,
    ) -> SharedFuture<'a, Result<Admission, String>> {
        Box::pin(async move {
            let window_ms = window.as_millis().clamp(1, i64::MAX as u128) as i64;
            let mut invocation = self.script.prepare_invoke();
            invocation.arg(window_ms);
            for (name, limit) in counters {
                invocation
                    .key(self.cluster.key(&["throttle", name]))
                    .arg(*limit);
            }
            let mut c = self.cluster.conn.clone();
            let (admitted, wait_ms): (i64, i64) = self
                .cluster
                .call(RedisOp::Throttle, async move {
                    invocation.invoke_async(&mut c).await
                })
                .await
                .map_err(|e| e.to_string())?;
            Ok(if admitted == 1 {
                Admission::Admitted
            } else {
                Admission::Refused(Duration::from_millis(wait_ms.max(1) as u64))
            })
        })
    }
}
