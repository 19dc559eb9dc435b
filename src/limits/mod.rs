//! Rate limits on the calls that reach plugins ([`crate::config::LimitsConfig`]): for each
//! limit, a token bucket per caller (a client key: the token's subject, or the client's
//! address). Only `tools/call`, `prompts/get`, `resources/read`, `completion/complete` and
//! `resources/subscribe` are counted ([`counts`]): they are what runs plugin code; lists, pings
//! and the protocol's own requests are answered from the gateway's own state and stay
//! available to a caller that is being limited, so it can still see what it may call and
//! when; `resources/unsubscribe` only gives back what a subscription took.
//!
//! On one replica the buckets are `governor`'s, kept per limit in a map bounded by
//! `max_keys`: when it is full, the buckets of idle callers (refilled, so no different from
//! new ones) are dropped, and callers beyond that share one bucket. In cluster mode the
//! buckets are kept in Redis behind [`SharedBuckets`] (one atomic script takes a token from
//! every bucket of a call, or from none); when Redis does not answer, the replica's own
//! buckets count instead, and the log says so (Redis is asked again every two seconds
//! meanwhile, so calls do not wait for its timeout).

use std::collections::HashMap;
use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use governor::clock::Clock;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use crate::config::{LimitRule, LimitsConfig};

/// Whether a request of this method is counted.
pub fn counts(method: &str) -> bool {
    matches!(
        method,
        "tools/call"
            | "prompts/get"
            | "resources/read"
            | "completion/complete"
            | "resources/subscribe"
    )
}

/// The call being admitted: where it goes.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    /// The plugin that serves it, when routed to one.
    pub plugin: Option<&'a str>,
    /// A `tools/call`'s tool name, as the client sent it.
    pub tool: Option<&'a str>,
}

/// A call refused: which limit, and when a token comes back.
#[derive(Debug, Clone)]
pub struct Limited {
    /// The limit's name (`subject`, `plugin:<pattern>`, `tool:<pattern>`).
    pub rule: String,
    /// `10 calls per minute`.
    pub rate: String,
    /// `subject` or `client address`.
    pub whom: &'static str,
    pub wait: Duration,
}

impl std::fmt::Display for Limited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rate limit `{}` for this {}: {}; retry in {} s",
            self.rule,
            self.whom,
            self.rate,
            self.retry_after()
        )
    }
}

impl std::error::Error for Limited {}

impl Limited {
    /// What `Retry-After` says: whole seconds until a token is there, rounded up (at least 1).
    pub fn retry_after(&self) -> u64 {
        retry_after_secs(self.wait)
    }
}

fn retry_after_secs(wait: Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1)
}

/// One bucket of a call in the shared store.
#[derive(Debug, Clone)]
pub struct SharedBucket {
    /// The limit's name.
    pub rule: String,
    /// The caller's client key.
    pub caller: String,
    /// The time one token takes to come back.
    pub interval: Duration,
    pub burst: u32,
}

pub type SharedFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Buckets every replica shares (cluster mode's Redis).
pub trait SharedBuckets: Send + Sync {
    /// Takes a token from every bucket, or from none: `None` when taken, or the index of a
    /// bucket that is empty and how long until it has a token. `Err`: the store did not answer.
    fn take<'a>(
        &'a self,
        buckets: &'a [SharedBucket],
    ) -> SharedFuture<'a, Result<Option<(usize, Duration)>, String>>;
}

/// The limits in force, and their buckets.
pub struct RateLimits {
    limits: Vec<Limit>,
    max_keys: usize,
    shared: Option<Arc<dyn SharedBuckets>>,
    /// Set while the shared store does not answer (logged once per outage).
    falling_back: AtomicBool,
    /// While the shared store does not answer, when to ask it again: until then calls are
    /// counted here without waiting for it (a frozen Redis would hold each call for the
    /// cluster's Redis timeout).
    retry_shared_at: Mutex<Option<Instant>>,
}

/// How long calls are counted on the replica alone after the shared store failed, before
/// it is asked again.
const SHARED_RETRY: Duration = Duration::from_secs(2);

struct Limit {
    rule: LimitRule,
    quota: Quota,
    /// How long a bucket takes to refill from empty: one unused for that long is as new.
    idle: Duration,
    buckets: Mutex<Buckets>,
}

#[derive(Default)]
struct Buckets {
    by_caller: HashMap<Arc<str>, Bucket>,
    /// Shared by the callers that find the map full.
    overflow: Option<DefaultDirectRateLimiter>,
    swept: Option<Instant>,
}

struct Bucket {
    limiter: DefaultDirectRateLimiter,
    used: Instant,
}

impl RateLimits {
    pub fn new(config: &LimitsConfig, shared: Option<Arc<dyn SharedBuckets>>) -> RateLimits {
        let limits = config
            .rules
            .iter()
            .map(|rule| {
                let interval = rule.interval().max(Duration::from_nanos(1));
                let burst = NonZeroU32::new(rule.burst).unwrap_or(NonZeroU32::MIN);
                let quota = Quota::with_period(interval)
                    .expect("a non-zero period")
                    .allow_burst(burst);
                // Seen in /metrics from the start, at 0.
                let _ = crate::metrics::get()
                    .rate_limited
                    .with_label_values(&[rule.name.as_str()]);
                Limit {
                    rule: rule.clone(),
                    quota,
                    idle: interval * rule.burst,
                    buckets: Mutex::new(Buckets::default()),
                }
            })
            .collect();
        RateLimits {
            limits,
            max_keys: config.max_keys,
            shared,
            falling_back: AtomicBool::new(false),
            retry_shared_at: Mutex::new(None),
        }
    }

    /// Whether any limit is configured.
    pub fn enabled(&self) -> bool {
        !self.limits.is_empty()
    }

    /// The limits in force, for the admin API.
    pub fn rules(&self) -> impl Iterator<Item = &LimitRule> {
        self.limits.iter().map(|l| &l.rule)
    }

    /// Whether the buckets are shared between replicas.
    pub fn shared(&self) -> bool {
        self.shared.is_some()
    }

    /// Counts a call of `caller` (a client key) in every limit that applies to it, or
    /// refuses it naming the limit it is over.
    pub async fn admit(&self, caller: &str, call: Call<'_>) -> Result<(), Limited> {
        let applying: Vec<&Limit> = self
            .limits
            .iter()
            .filter(|l| l.rule.applies(call.plugin, call.tool))
            .collect();
        if applying.is_empty() {
            return Ok(());
        }
        let whom = if caller.starts_with("subject ") {
            "subject"
        } else {
            "client address"
        };
        let refused = |limit: &Limit, wait: Duration| {
            crate::metrics::get()
                .rate_limited
                .with_label_values(&[limit.rule.name.as_str()])
                .inc();
            Limited {
                rule: limit.rule.name.clone(),
                rate: limit.rule.describe(),
                whom,
                wait,
            }
        };
        if let Some(shared) = self.shared.as_ref().filter(|_| self.ask_shared()) {
            let buckets: Vec<SharedBucket> = applying
                .iter()
                .map(|l| SharedBucket {
                    rule: l.rule.name.clone(),
                    caller: caller.to_owned(),
                    interval: l.rule.interval(),
                    burst: l.rule.burst,
                })
                .collect();
            match shared.take(&buckets).await {
                Ok(taken) => {
                    *self
                        .retry_shared_at
                        .lock()
                        .unwrap_or_else(|p| p.into_inner()) = None;
                    if self.falling_back.swap(false, Ordering::Relaxed) {
                        tracing::info!("rate limits: shared through Redis again");
                    }
                    return match taken {
                        None => Ok(()),
                        Some((i, wait)) => Err(refused(applying[i], wait)),
                    };
                }
                Err(e) => {
                    *self
                        .retry_shared_at
                        .lock()
                        .unwrap_or_else(|p| p.into_inner()) = Some(Instant::now() + SHARED_RETRY);
                    if !self.falling_back.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            "rate limits: Redis did not answer ({e}); counting on this replica alone until it does"
                        );
                    }
                }
            }
        }
        // Narrowest first: a call a later limit refuses has still used a token of the ones
        // before it (`governor`'s buckets take as they check).
        for limit in applying.iter().rev() {
            if let Err(wait) = limit.check(caller, self.max_keys) {
                return Err(refused(limit, wait));
            }
        }
        Ok(())
    }
}

impl RateLimits {
    /// Whether to ask the shared store now: not while it is known not to answer.
    fn ask_shared(&self) -> bool {
        let mut at = self
            .retry_shared_at
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match *at {
            Some(t) if Instant::now() < t => false,
            Some(_) => {
                // One call asks again; the others go on counting here meanwhile.
                *at = Some(Instant::now() + SHARED_RETRY);
                true
            }
            None => true,
        }
    }
}

impl Limit {
    /// Takes a token from `caller`'s bucket here, or says how long until one is there.
    fn check(&self, caller: &str, max_keys: usize) -> Result<(), Duration> {
        let now = Instant::now();
        let mut b = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let b = &mut *b;
        if !b.by_caller.contains_key(caller) && b.by_caller.len() >= max_keys {
            // At most once a second: the map may be full of callers that are all busy.
            if b.swept
                .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1))
            {
                b.swept = Some(now);
                let idle = self.idle;
                b.by_caller
                    .retain(|_, bucket| now.duration_since(bucket.used) < idle);
            }
        }
        if !b.by_caller.contains_key(caller) && b.by_caller.len() < max_keys {
            b.by_caller.insert(
                Arc::from(caller),
                Bucket {
                    limiter: RateLimiter::direct(self.quota),
                    used: now,
                },
            );
        }
        let limiter = match b.by_caller.get_mut(caller) {
            Some(bucket) => {
                bucket.used = now;
                &bucket.limiter
            }
            None => b
                .overflow
                .get_or_insert_with(|| RateLimiter::direct(self.quota)),
        };
        limiter
            .check()
            .map_err(|not_until| not_until.wait_time_from(limiter.clock().now()))
    }

    #[cfg(test)]
    fn callers(&self) -> usize {
        self.buckets.lock().unwrap().by_caller.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Matcher, Per};

    fn rule(name: &str, matcher: Matcher, count: u32, per: Per, burst: u32) -> LimitRule {
        LimitRule {
            name: name.into(),
            matcher,
            count,
            per,
            burst,
        }
    }

    fn limits(rules: Vec<LimitRule>, max_keys: usize) -> RateLimits {
        RateLimits::new(&LimitsConfig { rules, max_keys }, None)
    }

    const FS: Call<'static> = Call {
        plugin: Some("fs"),
        tool: Some("fs__read"),
    };

    #[tokio::test]
    async fn a_caller_over_its_burst_is_refused_and_told_when_to_retry() {
        let l = limits(vec![rule("subject", Matcher::All, 2, Per::Minute, 2)], 10);
        l.admit("subject alice", FS).await.unwrap();
        l.admit("subject alice", FS).await.unwrap();
        let e = l.admit("subject alice", FS).await.unwrap_err();
        assert_eq!(e.rule, "subject");
        assert!((29..=30).contains(&e.retry_after()), "{e:?}");
        assert!(
            e.to_string()
                .starts_with("rate limit `subject` for this subject: 2 calls per minute"),
            "{e}"
        );
        // Another caller has its own bucket.
        l.admit("address 10.0.0.1", FS).await.unwrap();
    }

    #[tokio::test]
    async fn a_plugin_rule_counts_only_its_plugins() {
        let l = limits(
            vec![rule(
                "plugin:f*",
                Matcher::Plugin("f*".into()),
                1,
                Per::Hour,
                1,
            )],
            10,
        );
        l.admit("subject a", FS).await.unwrap();
        let e = l.admit("subject a", FS).await.unwrap_err();
        assert_eq!(e.rule, "plugin:f*");
        let other = Call {
            plugin: Some("time"),
            tool: Some("time__now"),
        };
        l.admit("subject a", other).await.unwrap();
        l.admit("subject a", other).await.unwrap();
    }

    #[tokio::test]
    async fn callers_are_bounded_and_idle_ones_evicted() {
        let l = limits(vec![rule("subject", Matcher::All, 10, Per::Second, 1)], 2);
        l.admit("subject a", FS).await.unwrap();
        l.admit("subject b", FS).await.unwrap();
        // Full of busy callers: the next ones share a bucket.
        l.admit("subject c", FS).await.unwrap();
        assert!(l.admit("subject d", FS).await.is_err());
        assert_eq!(l.limits[0].callers(), 2);
        // Once a and b are idle (refilled) they make room.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            l.limits[0].buckets.lock().unwrap().swept = None;
            if l.admit("subject e", FS).await.is_ok() && l.limits[0].callers() <= 2 {
                let keys: Vec<_> = l.limits[0]
                    .buckets
                    .lock()
                    .unwrap()
                    .by_caller
                    .keys()
                    .cloned()
                    .collect();
                if keys.iter().any(|k| &**k == "subject e") {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "idle callers were never evicted");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
