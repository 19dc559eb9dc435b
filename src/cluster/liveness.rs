//! Watching the replicas that requests are forwarded to: while a forward waits on an owner, or
//! streams its answer back, the owner's heartbeat is checked once a second (one `MGET` for
//! every replica watched, in the heartbeat's loop, however many forwards there are). An owner
//! whose heartbeat lapsed is gone: its forwards end (see [`Cluster::forward`]) instead of
//! waiting for TCP to notice a peer that may never answer.
//!
//! A lapsed heartbeat is judged as in [`Cluster::owner_of`]: only once this replica has itself
//! beaten without a break for longer than a heartbeat lasts. A heartbeat whose signature does
//! not verify ([`super::signing`]) counts as lapsed here too.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::{Cluster, ClusterError};
use crate::metrics::RedisOp;

/// What the watch keeps.
pub(super) struct Liveness {
    /// Replicas with forwards in flight, and how many.
    watched: Mutex<HashMap<Arc<str>, usize>>,
    /// Those of them found gone.
    gone: Mutex<HashSet<Arc<str>>>,
    /// Bumped whenever `gone` grows.
    changed: watch::Sender<u64>,
}

impl Default for Liveness {
    fn default() -> Self {
        Liveness {
            watched: Mutex::default(),
            gone: Mutex::default(),
            changed: watch::Sender::new(0),
        }
    }
}

/// A forward in flight to a replica: watched until this drops.
pub(super) struct Watching {
    cluster: Arc<Cluster>,
    replica: Arc<str>,
}

impl Drop for Watching {
    fn drop(&mut self) {
        let mut watched = self.cluster.liveness.watched.lock().expect("liveness lock");
        if let Some(n) = watched.get_mut(&self.replica) {
            *n -= 1;
            if *n == 0 {
                watched.remove(&self.replica);
            }
        }
    }
}

impl Cluster {
    /// Watches `replica` until the guard drops.
    pub(super) fn watch(self: &Arc<Self>, replica: &str) -> Watching {
        let replica: Arc<str> = Arc::from(replica);
        *self
            .liveness
            .watched
            .lock()
            .expect("liveness lock")
            .entry(replica.clone())
            .or_insert(0) += 1;
        Watching {
            cluster: self.clone(),
            replica,
        }
    }

    /// Resolves once `replica` (watched) is found gone.
    pub(super) fn owner_gone(
        self: &Arc<Self>,
        replica: &str,
    ) -> impl Future<Output = ()> + Send + 'static {
        let me = self.clone();
        let replica: Arc<str> = Arc::from(replica);
        let mut changes = self.liveness.changed.subscribe();
        async move {
            loop {
                if me
                    .liveness
                    .gone
                    .lock()
                    .expect("liveness lock")
                    .contains(&replica)
                {
                    return;
                }
                if changes.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
        }
    }

    /// Checks the watched replicas' heartbeats (the heartbeat's loop calls it each second).
    pub(super) async fn check_watched(&self) -> Result<(), ClusterError> {
        let replicas: Vec<Arc<str>> = {
            let watched = self.liveness.watched.lock().expect("liveness lock");
            // Forget what is no longer watched: a replica id is never reused.
            self.liveness
                .gone
                .lock()
                .expect("liveness lock")
                .retain(|r| watched.contains_key(r));
            watched.keys().cloned().collect()
        };
        if replicas.is_empty() || !self.may_judge_liveness() {
            return Ok(());
        }
        let keys: Vec<String> = replicas.iter().map(|r| self.key(&["replica", r])).collect();
        let mut c = self.conn.clone();
        let k = keys.clone();
        let beats: Vec<Option<Vec<u8>>> = self
            .call(RedisOp::Owner, async move {
                redis::cmd("MGET").arg(k).query_async(&mut c).await
            })
            .await?;
        // A heartbeat that is not signed is none.
        let lapsed: Vec<Arc<str>> = replicas
            .into_iter()
            .zip(keys.iter().zip(beats))
            .filter(|(_, (key, beat))| {
                matches!(
                    self.read_heartbeat(key, beat.as_deref()),
                    super::Heartbeat::Lapsed
                )
            })
            .map(|(r, _)| r)
            .collect();
        if !lapsed.is_empty() {
            for r in &lapsed {
                tracing::warn!(replica = %r, "a replica that requests are forwarded to stopped beating: its forwards end");
            }
            self.liveness
                .gone
                .lock()
                .expect("liveness lock")
                .extend(lapsed);
            self.liveness.changed.send_modify(|n| *n += 1);
        }
        Ok(())
    }
}
