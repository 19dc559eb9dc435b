//! Registry changes made through the admin API reach every replica: [`RedisRegistryFeed`],
//! the [`ChangeFeed`] of cluster mode. The API's changes are kept in the database (the
//! registry's overlay, in the `plugins` table) that the replicas share; after each one, the
//! replica that made it publishes its id on `<prefix>registry`, and every other replica
//! re-reads the overlay ([`Registry::refresh`]), applies it to its own config file's plugins,
//! and so tells its sessions (`notifications/tools/list_changed` and the others) as it would
//! for a change made on it.
//!
//! This needs the replicas to share the database (PostgreSQL, or one SQLite file they all
//! reach): the overlay is read from there, never carried in the message. Replicas with a
//! database each hear the message and find nothing new in their own.
//!
//! A burst of messages makes one re-read at a time, and at most one more after it. A replica
//! that was not listening re-reads when it hears the channel again; a re-read that fails
//! because the database did not answer is tried again a little later, one refused because
//! the overlay conflicts with this replica's config file is logged and left.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::Cluster;
use super::bus::Listener;
use crate::registry::store::ChangeFeed;
use crate::registry::{Registry, RegistryError};

/// The channel's name under the cluster's prefix.
pub(super) const CHANNEL: &str = "registry";
/// The wait before a re-read that failed on the database is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(2);

/// Tells the other replicas that this one changed the registry.
pub struct RedisRegistryFeed {
    cluster: Arc<Cluster>,
    channel: String,
}

impl RedisRegistryFeed {
    pub(super) fn new(cluster: Arc<Cluster>) -> RedisRegistryFeed {
        let channel = cluster.channel(CHANNEL);
        RedisRegistryFeed { cluster, channel }
    }
}

impl ChangeFeed for RedisRegistryFeed {
    fn announce(&self) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            if let Err(e) = self
                .cluster
                .publish(&self.channel, self.cluster.replica())
                .await
            {
                tracing::warn!(
                    "registry change not announced to the other replicas ({e}); they apply it when they next hear the channel, or restart"
                );
            }
        })
    }
}

/// Re-reads the registry when another replica announces a change.
pub(super) struct Heard {
    /// This replica's id: its own announcements are skipped.
    me: Arc<str>,
    wake: Arc<Notify>,
}

impl Heard {
    /// The listener, and its task that re-reads `registry` until `stop`.
    pub(super) fn start(
        cluster: &Cluster,
        registry: &Arc<Registry>,
        stop: CancellationToken,
    ) -> Heard {
        let wake = Arc::new(Notify::new());
        tokio::spawn(refresher(Arc::downgrade(registry), wake.clone(), stop));
        Heard {
            me: cluster.replica().clone(),
            wake,
        }
    }
}

impl Listener for Heard {
    fn message(&self, payload: &[u8]) {
        if payload != self.me.as_bytes() {
            self.wake.notify_one();
        }
    }

    fn resubscribed(&self) {
        self.wake.notify_one();
    }
}

/// Re-reads the registry each time it is woken, until `stop` or the registry is gone.
async fn refresher(registry: Weak<Registry>, wake: Arc<Notify>, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = wake.notified() => {}
            () = stop.cancelled() => return,
        }
        let Some(registry) = registry.upgrade() else {
            return;
        };
        match registry.refresh().await {
            Ok(true) => tracing::info!("registry changed on another replica: applied here"),
            Ok(false) => {}
            Err(RegistryError::Store(e)) => {
                tracing::warn!(
                    "re-reading the registry after a change elsewhere: {e}; trying again"
                );
                let wake = wake.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(RETRY_AFTER).await;
                    wake.notify_one();
                });
            }
            Err(e) => {
                tracing::error!("a registry change made on another replica cannot apply here: {e}")
            }
        }
    }
}
