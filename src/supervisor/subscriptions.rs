//! Resource subscriptions held on a plugin, counted by holder: the first holder of a URI
//! subscribes the plugin, the last one to let go unsubscribes it, and nobody in between
//! reaches the plugin at all. Holders are a shared plugin's sessions and modern listeners
//! together (one table per shared plugin, here in the pools), or the listeners of one modern
//! caller on that caller's own instance (a table in the caller's session).
//!
//! The plugin calls of one table happen one at a time, under an async lock taken before the
//! count changes, so a subscribe and an unsubscribe of a URI reach the plugin in the order
//! their counts changed. Each call is bounded by [`SUBSCRIBE_WAIT`]. Nothing here knows who a
//! holder is; the callers say how the plugin is told.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::value::RawValue;

use super::Supervisor;
use crate::backend::connection::CallError;
use crate::backend::{BackendError, PluginConnection};
use crate::registry::ViewPlugin;

/// Longest wait for a plugin's answer to `resources/subscribe` or `resources/unsubscribe`.
pub const SUBSCRIBE_WAIT: Duration = Duration::from_secs(10);

/// One plugin's subscriptions, by URI (see the module's doc).
#[derive(Default)]
pub struct Subscriptions {
    /// Orders the plugin calls (see the module's doc).
    order: tokio::sync::Mutex<()>,
    /// Holders by URI; a URI nobody holds has no entry.
    counts: Mutex<HashMap<String, usize>>,
}

impl Subscriptions {
    /// One more holder of `uri`. The first one's `subscribe` runs, and is waited for: when
    /// it fails, nothing is held and its error is returned.
    pub async fn hold<F>(&self, uri: &str, subscribe: impl FnOnce() -> F) -> Result<(), CallError>
    where
        F: Future<Output = Result<(), CallError>>,
    {
        let _order = self.order.lock().await;
        let first = {
            let mut counts = self.counts.lock().expect("subscriptions lock");
            let n = counts.entry(uri.to_owned()).or_insert(0);
            *n += 1;
            *n == 1
        };
        if first && let Err(e) = subscribe().await {
            self.counts.lock().expect("subscriptions lock").remove(uri);
            return Err(e);
        }
        Ok(())
    }

    /// One holder of `uri` fewer; the last one's `unsubscribe` runs. A URI nobody holds is
    /// left alone.
    pub async fn release<F>(&self, uri: &str, unsubscribe: impl FnOnce() -> F)
    where
        F: Future<Output = ()>,
    {
        let _order = self.order.lock().await;
        let last = {
            let mut counts = self.counts.lock().expect("subscriptions lock");
            match counts.get_mut(uri) {
                None => return,
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                Some(_) => counts.remove(uri).is_some(),
            }
        };
        if last {
            unsubscribe().await;
        }
    }

    /// The URIs held now (what a process that starts is subscribed to).
    pub fn held(&self) -> Vec<String> {
        self.counts
            .lock()
            .expect("subscriptions lock")
            .keys()
            .cloned()
            .collect()
    }

    /// Whether anybody holds anything.
    pub fn is_empty(&self) -> bool {
        self.counts.lock().expect("subscriptions lock").is_empty()
    }
}

/// Sends `resources/subscribe` (`on`) or `resources/unsubscribe` for `uri` to `conn` and
/// waits for its answer, at most [`SUBSCRIBE_WAIT`].
pub async fn tell(conn: &PluginConnection, uri: &str, on: bool) -> Result<(), CallError> {
    let method = if on {
        "resources/subscribe"
    } else {
        "resources/unsubscribe"
    };
    let params =
        RawValue::from_string(serde_json::json!({ "uri": uri }).to_string()).expect("valid JSON");
    match tokio::time::timeout(SUBSCRIBE_WAIT, conn.call(method, Some(&params))).await {
        Ok(answer) => answer.map(drop),
        Err(_) => Err(CallError::Backend(BackendError::Timeout {
            plugin: conn.name().to_owned(),
            secs: SUBSCRIBE_WAIT.as_secs(),
        })),
    }
}

impl Supervisor {
    /// One more holder of `uri` on a shared plugin. The first one subscribes every running
    /// process of the plugin's pool (one is started if none runs; those that start later are
    /// subscribed as they start); it fails only when no process took it.
    pub async fn hold_shared(&self, plugin: &ViewPlugin, uri: &str) -> Result<(), CallError> {
        // Started first: a process that starts subscribes to what is held by then, and this
        // URI is not yet (the first holder's own call below subscribes it).
        self.pools.shared(plugin).await?;
        let table = self.pools.subscriptions(plugin.name());
        table
            .hold(uri, || async {
                let members = self.pools.members_of(plugin.name());
                let told =
                    futures_util::future::join_all(members.iter().map(|c| tell(c, uri, true)))
                        .await;
                let mut first_error = None;
                for t in told {
                    match t {
                        Ok(()) => return Ok(()),
                        Err(e) => {
                            first_error.get_or_insert(e);
                        }
                    }
                }
                Err(first_error.unwrap_or_else(|| CallError::Backend(super::changed(plugin))))
            })
            .await
    }

    /// One holder of `uri` on a shared plugin fewer; the last one unsubscribes every running
    /// process of its pool.
    pub async fn release_shared(&self, plugin: &str, uri: &str) {
        let table = self.pools.subscriptions(plugin);
        table
            .release(uri, || async {
                for c in self.pools.members_of(plugin) {
                    if let Err(e) = tell(&c, uri, false).await {
                        tracing::debug!(plugin = %plugin, "resources/unsubscribe {uri}: {e}");
                    }
                }
            })
            .await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn the_first_holder_subscribes_and_the_last_unsubscribes() {
        let table = Subscriptions::default();
        let subscribed = AtomicUsize::new(0);
        let unsubscribed = AtomicUsize::new(0);
        let sub = || async {
            subscribed.fetch_add(1, Ordering::Relaxed);
            Ok(())
        };
        let unsub = || async {
            unsubscribed.fetch_add(1, Ordering::Relaxed);
        };
        table.hold("a", sub).await.unwrap();
        table.hold("a", sub).await.unwrap();
        table.hold("b", sub).await.unwrap();
        assert_eq!(subscribed.load(Ordering::Relaxed), 2);
        let mut held = table.held();
        held.sort();
        assert_eq!(held, ["a", "b"]);
        table.release("a", unsub).await;
        assert_eq!(
            unsubscribed.load(Ordering::Relaxed),
            0,
            "one holder is left"
        );
        table.release("a", unsub).await;
        assert_eq!(unsubscribed.load(Ordering::Relaxed), 1);
        table.release("a", unsub).await;
        assert_eq!(unsubscribed.load(Ordering::Relaxed), 1, "nobody held it");
        table.release("b", unsub).await;
        assert!(table.is_empty());
    }

    #[tokio::test]
    async fn a_failed_subscribe_holds_nothing() {
        let table = Subscriptions::default();
        let refused = table
            .hold("a", || async { Err(CallError::Rpc("{}".into())) })
            .await;
        assert!(refused.is_err());
        assert!(table.is_empty());
        let calls = AtomicUsize::new(0);
        table
            .hold("a", || async {
                calls.fetch_add(1, Ordering::Relaxed);
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(
            calls.load(Ordering::Relaxed),
            1,
            "the next holder is the first again"
        );
    }
}
