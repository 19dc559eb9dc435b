//! The crash breaker: a plugin whose processes keep crashing (or failing to start) is not
//! started again for a while, for anyone.
//!
//! Crashes are counted per plugin over a window; a client's own processes count once per
//! client, so one client cannot shut a plugin off for everyone by crashing its own instance.
//! The state lives in the plugin's [`PluginStats`](crate::registry::PluginStats), so it
//! survives a redefinition; the rules are here and nowhere else.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::BackendError;
use crate::registry::PluginEntry;

/// Crashes in this window trip the breaker...
const BREAKER_WINDOW: Duration = Duration::from_secs(60);
/// ...when there are this many, a client's own processes counting once per client (a client
/// must not be able to shut a plugin off for everyone by crashing its own instance)...
const BREAKER_CRASHES: usize = 5;
/// ...and it stays open this long before one more start is tried.
const BREAKER_COOLDOWN: Duration = Duration::from_secs(30);

/// Refuses a start while the plugin's breaker is open.
pub(crate) fn check(entry: &PluginEntry) -> Result<(), BackendError> {
    match entry.stats.breaker_open() {
        Some(open) => Err(BackendError::Unavailable {
            plugin: entry.name().to_owned(),
            reason: format!(
                "it keeps crashing; the gateway tries it again in {} s",
                open.as_secs() + 1
            ),
        }),
        None => Ok(()),
    }
}

/// Counts a crash (or a failed start) of `client`'s own process (a session's instance,
/// started with the client's `initialize` params), or of one every client shares (`None`);
/// true when it trips the breaker.
pub(crate) fn record_crash(entry: &PluginEntry, client: Option<&Arc<str>>) -> bool {
    crate::metrics::get()
        .plugin_crashes
        .with_label_values(&[entry.name()])
        .inc();
    let stats = &entry.stats;
    stats
        .crashes
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut b = stats.breaker.lock().expect("breaker lock");
    let now = Instant::now();
    b.recent.push_back((now, client.cloned()));
    while b
        .recent
        .front()
        .is_some_and(|(t, _)| now.duration_since(*t) > BREAKER_WINDOW)
    {
        b.recent.pop_front();
    }
    let mut clients = HashSet::new();
    let counted = b
        .recent
        .iter()
        .filter(|(_, c)| c.as_ref().is_none_or(|c| clients.insert(c.clone())))
        .count();
    if counted >= BREAKER_CRASHES {
        b.open_until = Some(now + BREAKER_COOLDOWN);
        b.recent.clear();
        return true;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, PluginConfig};
    use crate::registry::Registry;
    use crate::registry::store::{MemoryPluginStore, Overlay};

    /// A plugin's entry, disabled so that no probe starts.
    fn entry() -> Arc<PluginEntry> {
        let config = Config::with_plugins(vec![PluginConfig::new("p", "true", Vec::new())]);
        let overlay = [("p".to_owned(), Overlay::Toggle { enabled: false })].into();
        let registry =
            Registry::with_overlay(&config, Arc::new(MemoryPluginStore::default()), &overlay);
        registry.get("p").unwrap()
    }

    #[tokio::test]
    async fn one_client_crashing_its_own_instances_does_not_trip_it() {
        let e = entry();
        let alice: Arc<str> = Arc::from("alice");
        for _ in 0..10 {
            assert!(!record_crash(&e, Some(&alice)));
        }
        assert!(check(&e).is_ok());
    }

    #[tokio::test]
    async fn crashes_of_several_clients_or_shared_processes_trip_it() {
        let e = entry();
        for n in 0..4 {
            assert!(!record_crash(&e, Some(&Arc::from(format!("c{n}")))));
        }
        assert!(record_crash(&e, None), "the fifth counted crash trips it");
        assert!(e.stats.breaker_open().is_some());
        assert!(check(&e).is_err());
    }
}
