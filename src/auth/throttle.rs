//! Bounded, keyed attempt counters for the authorization server's limits: failed sign-ins per
//! user and per client address, registrations and metadata-document fetches per address.
//!
//! Each key counts attempts in a fixed window that starts at its first attempt; at the limit
//! it is refused until the window ends, and that wait is the `Retry-After`. A table holds at
//! most `capacity` keys: when it is full, keys whose window has ended go first, then an
//! arbitrary one, so an attacker who floods it with fresh keys (addresses, user names) makes it
//! forget, never grow. The counters are per process: each replica counts on its own (in
//! cluster mode, registrations are counted across replicas first: `server/register.rs`).
//!
//! `governor` was considered: its keyed limiter does not bound the number of keys (it needs a
//! periodic `retain_recent` and still grows within a period), and a lockout window is what a
//! sign-in page should explain, so this small table does the job.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct Throttle<K> {
    limit: u32,
    window: Duration,
    capacity: usize,
    table: Mutex<Table<K>>,
}

struct Table<K> {
    slots: HashMap<K, Slot>,
    /// When expired slots were last swept out (at most once a second when the table is full).
    swept: Option<Instant>,
}

struct Slot {
    count: u32,
    reset_at: Instant,
}

impl<K: Hash + Eq + Clone> Throttle<K> {
    /// At most `limit` attempts per `window` for each key, and at most `capacity` keys.
    pub fn new(limit: u32, window: Duration, capacity: usize) -> Throttle<K> {
        Throttle {
            limit,
            window,
            capacity: capacity.max(1),
            table: Mutex::new(Table {
                slots: HashMap::new(),
                swept: None,
            }),
        }
    }

    /// How long `key` must wait, if it has reached its limit.
    pub fn blocked(&self, key: &K) -> Option<Duration> {
        self.blocked_at(key, Instant::now())
    }

    /// Counts an attempt for `key` (a failed sign-in).
    pub fn hit(&self, key: K) {
        self.hit_at(key, Instant::now());
    }

    /// Counts an attempt unless `key` has reached its limit; the wait when it has.
    pub fn acquire(&self, key: K) -> Result<(), Duration> {
        let now = Instant::now();
        if let Some(wait) = self.blocked_at(&key, now) {
            return Err(wait);
        }
        self.hit_at(key, now);
        Ok(())
    }

    /// Forgets `key` (a successful sign-in clears its user's failures).
    pub fn clear(&self, key: &K) {
        self.table.lock().expect("throttle lock").slots.remove(key);
    }

    /// How many keys are held.
    pub fn len(&self) -> usize {
        self.table.lock().expect("throttle lock").slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn blocked_at(&self, key: &K, now: Instant) -> Option<Duration> {
        let table = self.table.lock().expect("throttle lock");
        let slot = table.slots.get(key)?;
        (slot.reset_at > now && slot.count >= self.limit).then(|| slot.reset_at - now)
    }

    fn hit_at(&self, key: K, now: Instant) {
        let mut table = self.table.lock().expect("throttle lock");
        if let Some(slot) = table.slots.get_mut(&key) {
            if slot.reset_at <= now {
                *slot = Slot {
                    count: 0,
                    reset_at: now + self.window,
                };
            }
            slot.count = slot.count.saturating_add(1);
            return;
        }
        if table.slots.len() >= self.capacity {
            if table
                .swept
                .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1))
            {
                table.slots.retain(|_, s| s.reset_at > now);
                table.swept = Some(now);
            }
            if table.slots.len() >= self.capacity {
                // Full of live keys: one goes (the hasher's order is random).
                if let Some(victim) = table.slots.keys().next().cloned() {
                    table.slots.remove(&victim);
                }
            }
        }
        table.slots.insert(
            key,
            Slot {
                count: 1,
                reset_at: now + self.window,
            },
        );
    }
}

/// The key a client address is counted under: IPv4 as it is (an IPv4-mapped IPv6 address is
/// its IPv4 address), IPv6 by its /64, which one subscriber usually holds whole.
pub fn address_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(bits.into())
        }
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_refused_at_its_limit_until_its_window_ends() {
        let t = Throttle::new(3, Duration::from_secs(60), 10);
        let now = Instant::now();
        for _ in 0..3 {
            assert_eq!(t.blocked_at(&"a", now), None);
            t.hit_at("a", now);
        }
        let wait = t.blocked_at(&"a", now + Duration::from_secs(10)).unwrap();
        assert_eq!(wait, Duration::from_secs(50));
        assert_eq!(t.blocked_at(&"b", now), None, "keys count apart");
        let later = now + Duration::from_secs(61);
        assert_eq!(t.blocked_at(&"a", later), None, "the window ended");
        t.hit_at("a", later);
        assert_eq!(t.blocked_at(&"a", later), None, "a new window");
        t.clear(&"a");
        assert!(t.blocked_at(&"a", later).is_none());
    }

    #[test]
    fn the_table_never_holds_more_than_its_capacity() {
        let t = Throttle::new(1, Duration::from_secs(60), 100);
        let now = Instant::now();
        for i in 0..10_000u32 {
            t.hit_at(i, now);
            assert!(t.len() <= 100);
        }
        assert_eq!(t.len(), 100);
        // Expired keys make room before live ones are dropped.
        let later = now + Duration::from_secs(61);
        t.hit_at(u32::MAX, later);
        assert_eq!(t.len(), 1, "the expired keys were swept");
    }

    #[test]
    fn acquire_counts_until_the_limit() {
        let t = Throttle::new(2, Duration::from_secs(60), 10);
        assert!(t.acquire("x").is_ok());
        assert!(t.acquire("x").is_ok());
        let wait = t.acquire("x").unwrap_err();
        assert!(wait <= Duration::from_secs(60) && wait > Duration::from_secs(58));
    }

    #[test]
    fn addresses_are_counted_by_ipv4_or_ipv6_64() {
        let k = |s: &str| address_key(s.parse().unwrap());
        assert_eq!(k("192.0.2.7"), k("::ffff:192.0.2.7"));
        assert_eq!(k("2001:db8:1:2:aaaa::1"), k("2001:db8:1:2:bbbb::2"));
        assert_ne!(k("2001:db8:1:2::1"), k("2001:db8:1:3::1"));
        assert_ne!(k("192.0.2.7"), k("192.0.2.8"));
    }
}
