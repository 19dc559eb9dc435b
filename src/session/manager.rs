//! All sessions of this gateway: creation under a cap, in total and per client (a token
//! subject, or an address), lookup by id, ending (by DELETE, by idleness, or sooner when no
//! request followed `initialize`, at shutdown). Ending a session stops its plugins in the background; the task
//! tracker lets shutdown wait for every one of them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine;
use dashmap::DashMap;
use rand::RngCore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{ClientInit, Pools, Session};
use crate::config::SessionConfig;
use crate::registry::{Registry, View};
use crate::stream::{EventStore, StreamSettings};

/// Why no session was created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TooManySessions {
    /// The gateway holds its maximum.
    Gateway,
    /// The client holds its maximum, this many.
    Client(usize),
}

pub struct SessionManager {
    /// Hashed with foldhash: SipHash over a 36-byte id was a visible part of every request.
    /// Keys are ids this gateway made; a client's id is only ever looked up.
    sessions: DashMap<Arc<str>, Arc<Session>, foldhash::fast::RandomState>,
    /// Sessions held or being created: reserved before creating, so the cap holds under
    /// concurrent `initialize`s.
    count: AtomicUsize,
    /// Sessions held by each client; a client with none has no entry.
    per_client: DashMap<Arc<str>, usize, foldhash::fast::RandomState>,
    config: SessionConfig,
    /// Where sessions' stream events are kept for replay.
    pub store: Arc<dyn EventStore>,
    stream_settings: StreamSettings,
    /// How long a stream nobody resumes is kept (the replay age limit).
    abandon_after: Duration,
    /// Shared and warm plugin processes.
    pub pools: Arc<Pools>,
    tasks: TaskTracker,
}

impl SessionManager {
    pub fn new(
        config: SessionConfig,
        store: Arc<dyn EventStore>,
        stream_settings: StreamSettings,
        abandon_after: Duration,
        registry: Arc<Registry>,
    ) -> Arc<SessionManager> {
        Arc::new_cyclic(|me| SessionManager {
            sessions: DashMap::default(),
            count: AtomicUsize::new(0),
            per_client: DashMap::default(),
            config,
            store,
            stream_settings,
            abandon_after,
            pools: Pools::new(registry, me.clone()),
            tasks: TaskTracker::new(),
        })
    }

    pub fn create(
        &self,
        init: ClientInit,
        registry: Arc<Registry>,
        gateway_shutdown: &CancellationToken,
    ) -> Result<Arc<Session>, TooManySessions> {
        if self.count.fetch_add(1, Ordering::AcqRel) >= self.config.max_sessions {
            self.count.fetch_sub(1, Ordering::AcqRel);
            return Err(TooManySessions::Gateway);
        }
        {
            let mut held = self.per_client.entry(init.client.clone()).or_insert(0);
            if *held >= self.config.max_per_client {
                drop(held);
                self.count.fetch_sub(1, Ordering::AcqRel);
                return Err(TooManySessions::Client(self.config.max_per_client));
            }
            *held += 1;
        }
        let session = Session::new(
            new_session_id(),
            init,
            registry,
            self.pools.clone(),
            gateway_shutdown.child_token(),
            self.store.clone(),
            self.stream_settings.clone(),
        );
        self.sessions.insert(session.id.clone(), session.clone());
        crate::metrics::get().sessions_opened.inc();
        tracing::info!(session = %session.id, version = session.version, "session created");
        Ok(session)
    }

    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.sessions.get(id).map(|s| s.clone())
    }

    pub fn len(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Ends a session: later requests with its id get 404 at once; its plugins stop in the
    /// background. Returns the ended session, to await its end if wanted.
    pub fn end(&self, id: &str) -> Option<Arc<Session>> {
        let (_, session) = self.sessions.remove(id)?;
        self.count.fetch_sub(1, Ordering::AcqRel);
        self.per_client.remove_if_mut(&session.client, |_, held| {
            *held -= 1;
            *held == 0
        });
        let s = session.clone();
        self.tasks.spawn(async move { s.end().await });
        Some(session)
    }

    /// Ends idle sessions until `shutdown`, checking a few times per idle period.
    pub async fn reap_idle(self: Arc<Self>, shutdown: CancellationToken) {
        // Often enough for plugin idle timeouts and stream lingering too.
        let period = (self.config.idle_timeout.min(self.config.unused_timeout) / 4)
            .clamp(Duration::from_millis(100), Duration::from_secs(1));
        loop {
            tokio::select! {
                () = tokio::time::sleep(period) => {}
                () = shutdown.cancelled() => return,
            }
            let (idle, unused) = (self.config.idle_timeout, self.config.unused_timeout);
            let idle: Vec<(Arc<str>, bool)> = self
                .sessions
                .iter()
                .filter_map(|s| {
                    let early = !s.is_used() && unused < idle;
                    s.is_idle(if early { unused } else { idle })
                        .then(|| (s.key().clone(), early))
                })
                .collect();
            for (id, early) in idle {
                if !early {
                    tracing::info!(session = %id, "session idle for {} s: ending it", self.config.idle_timeout.as_secs());
                } else {
                    tracing::info!(session = %id, "no request came in the {} s after the session's initialize: ending it", self.config.unused_timeout.as_secs());
                }
                self.end(&id);
            }
            for s in self.sessions.iter() {
                s.sweep_finished();
                s.reap_streams(self.abandon_after);
                s.reap_idle_plugins();
            }
            self.store.expire();
            self.pools.reap();
        }
    }

    /// Tells every session the registry changed.
    pub fn registry_changed(&self, view: &View) {
        self.pools.apply(view);
        for s in self.sessions.iter() {
            s.registry_changed(view);
        }
    }

    /// Every session now.
    pub fn all(&self) -> Vec<Arc<Session>> {
        self.sessions.iter().map(|s| s.clone()).collect()
    }

    /// Ends every session and waits until all their plugins have stopped.
    pub async fn shutdown(&self) {
        let ids: Vec<Arc<str>> = self.sessions.iter().map(|s| s.key().clone()).collect();
        for id in ids {
            self.end(&id);
        }
        self.tasks.close();
        self.tasks.wait().await;
        self.pools.shutdown().await;
    }
}

/// 256 bits from the OS-seeded CSPRNG, base64url: 43 visible ASCII characters.
fn new_session_id() -> Arc<str> {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    Arc::from(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_are_long_visible_ascii_and_distinct() {
        let a = new_session_id();
        let b = new_session_id();
        assert_ne!(a, b);
        assert_eq!(a.len(), 43);
        assert!(a.bytes().all(|c| (0x21..=0x7e).contains(&c)));
    }
}
