//! All sessions of this gateway: creation under a cap, in total and per client (a token
//! subject, or an address), lookup by id, ending (by DELETE, by idleness, or sooner when no
//! request followed `initialize`, at shutdown). Ending a session stops its plugins in the
//! background; the task tracker lets shutdown wait for every one of them.
//!
//! With a [`SessionStore`] (one that replicas share), each session's record goes into it
//! once, when it is created, and leaves it when the session ends; requests never touch the
//! store. On one replica there is none: the table of live sessions is all there is to know,
//! and a record beside each would be a second copy of it (3 MB more at 10,000 sessions). The manager is also how the
//! [`Supervisor`]'s shared processes reach sessions ([`Listeners`]).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use base64::Engine;
use dashmap::DashMap;
use futures_util::FutureExt;
use rand::RngCore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::store::{SessionRecord, SessionStore, SessionStoreError, Touched};
use super::{ClientInit, Origin, Session};
use crate::backend::PluginEvents;
use crate::config::SessionConfig;
use crate::registry::View;
use crate::stream::{EventStore, Sink, StreamSettings};
use crate::supervisor::{Listeners, Supervisor};

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
    pub(super) config: SessionConfig,
    /// Where sessions' stream events are kept for replay.
    pub store: Arc<dyn EventStore>,
    /// Where sessions' records are kept for other replicas, if anywhere: written at
    /// creation, removed at the end.
    pub records: Option<Arc<dyn SessionStore>>,
    pub(super) stream_settings: Arc<StreamSettings>,
    /// How long a stream nobody resumes is kept (the replay age limit).
    pub(super) abandon_after: Duration,
    /// Starts and restarts plugin instances; keeps the shared and warm processes.
    pub supervisor: Arc<Supervisor>,
    pub(super) tasks: TaskTracker,
    /// See [`SessionManager::adoption_lock`].
    adoption_locks: Box<[tokio::sync::Mutex<()>]>,
    /// Modern clients' callers' sessions, by caller (see `callers.rs`).
    pub(super) callers: DashMap<Arc<str>, Arc<Session>, foldhash::fast::RandomState>,
    /// Modern clients' listen streams open (or being opened) now (see `listen.rs`).
    pub(super) listening: Arc<AtomicUsize>,
    stripes: foldhash::fast::RandomState,
}

/// Why a session could not be taken over.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdoptError {
    #[error("too many sessions")]
    TooMany(TooManySessions),
    /// The shared store of events failed (the text is for logs).
    #[error("the event store failed: {0}")]
    Store(String),
}

impl SessionManager {
    /// The manager of sessions served by `supervisor`'s plugins; it becomes the supervisor's
    /// [`Listeners`].
    pub fn new(
        config: SessionConfig,
        store: Arc<dyn EventStore>,
        records: Option<Arc<dyn SessionStore>>,
        stream_settings: StreamSettings,
        abandon_after: Duration,
        supervisor: Arc<Supervisor>,
    ) -> Arc<SessionManager> {
        let manager = Arc::new(SessionManager {
            sessions: DashMap::default(),
            count: AtomicUsize::new(0),
            per_client: DashMap::default(),
            config,
            store,
            records,
            stream_settings: Arc::new(stream_settings),
            abandon_after,
            supervisor,
            tasks: TaskTracker::new(),
            adoption_locks: (0..64).map(|_| tokio::sync::Mutex::new(())).collect(),
            callers: DashMap::default(),
            listening: Arc::new(AtomicUsize::new(0)),
            stripes: Default::default(),
        });
        let listeners: std::sync::Weak<dyn Listeners> = Arc::downgrade(&manager) as _;
        manager.supervisor.listen(listeners);
        manager
    }

    /// Creates a session for a client's `initialize`, and records it in the store.
    pub fn create(
        &self,
        init: ClientInit,
        gateway_shutdown: &CancellationToken,
    ) -> Result<Arc<Session>, TooManySessions> {
        self.reserve(&init.client)?;
        let session = Session::new(
            new_session_id(),
            init,
            Origin::New,
            self.supervisor.clone(),
            gateway_shutdown.child_token(),
            self.store.clone(),
            self.records.clone(),
            self.stream_settings.clone(),
        );
        self.sessions.insert(session.id.clone(), session.clone());
        crate::metrics::get().sessions_opened.inc();
        tracing::info!(session = %session.id, version = session.version, "session created");
        Ok(session)
    }

    /// Writes a new session's record to the shared store, if there is one, and waits for
    /// it: a session other replicas cannot find must not be handed to a client. On failure
    /// the session ends here and the error is returned.
    pub async fn record(&self, session: &Arc<Session>) -> Result<(), SessionStoreError> {
        let Some(records) = &self.records else {
            return Ok(());
        };
        let put = records.put(session.record(SystemTime::now())).await;
        if put.is_ok() {
            session.recorded.store(true, Ordering::Release);
        }
        if put.is_err()
            && let Some((_, s)) = self.sessions.remove(&session.id)
        {
            self.forget(&s);
            let s = s.clone();
            self.tasks.spawn(async move { s.end().await });
        }
        put
    }

    /// Takes over a session from its record, which the caller has claimed for this replica
    /// (cluster mode): its streams go on from the shared store, the requests its last
    /// replica owed end with an error, and its plugins start on first use. Under the
    /// session caps, like a new one.
    pub async fn adopt(
        &self,
        record: SessionRecord,
        client: Arc<str>,
        gateway_shutdown: &CancellationToken,
    ) -> Result<Arc<Session>, AdoptError> {
        if let Some(s) = self.get(&record.id) {
            return Ok(s);
        }
        self.reserve(&client).map_err(AdoptError::TooMany)?;
        let adopted = match self.store.adopt(&record.id).await {
            Ok(a) => a,
            Err(e) => {
                self.store.leave_session(&record.id);
                self.unreserve(&client);
                return Err(AdoptError::Store(e.to_string()));
            }
        };
        let init = ClientInit {
            version: record.version,
            plugin_params: record.init_params.clone(),
            owner: record.owner.clone(),
            client,
        };
        let session = Session::new(
            record.id.clone(),
            init,
            Origin::Adopted(&record),
            self.supervisor.clone(),
            gateway_shutdown.child_token(),
            self.store.clone(),
            self.records.clone(),
            self.stream_settings.clone(),
        );
        session.mark_used();
        session.recorded.store(true, Ordering::Release);
        session.resume(adopted).await;
        self.sessions.insert(session.id.clone(), session.clone());
        crate::metrics::get().sessions_adopted.inc();
        tracing::info!(session = %session.id, generation = session.generation, "session taken over from a replica that is gone");
        Ok(session)
    }

    /// Counts a session of `client` against the caps.
    fn reserve(&self, client: &Arc<str>) -> Result<(), TooManySessions> {
        if self.count.fetch_add(1, Ordering::AcqRel) >= self.config.max_sessions {
            self.count.fetch_sub(1, Ordering::AcqRel);
            return Err(TooManySessions::Gateway);
        }
        let mut held = self.per_client.entry(client.clone()).or_insert(0);
        if *held >= self.config.max_per_client {
            drop(held);
            self.count.fetch_sub(1, Ordering::AcqRel);
            return Err(TooManySessions::Client(self.config.max_per_client));
        }
        *held += 1;
        Ok(())
    }

    fn unreserve(&self, client: &Arc<str>) {
        self.count.fetch_sub(1, Ordering::AcqRel);
        self.per_client.remove_if_mut(client, |_, held| {
            *held -= 1;
            *held == 0
        });
    }

    /// A session out of the table: no longer counted against the caps.
    fn forget(&self, session: &Session) {
        self.unreserve(&session.client);
    }

    /// The lock a replica takes while it looks for a session's owner and takes it over, so
    /// two requests for one session adopt it once. Striped: a fixed set, whatever the ids.
    pub fn adoption_lock(&self, id: &str) -> &tokio::sync::Mutex<()> {
        use std::hash::BuildHasher;
        let i = self.stripes.hash_one(id) as usize % self.adoption_locks.len();
        &self.adoption_locks[i]
    }

    /// Most listen streams open at once: as many as sessions.
    pub(super) fn max_listeners(&self) -> usize {
        self.config.max_sessions
    }

    /// Most listen streams of one caller: as many as one client's sessions.
    pub(super) fn max_listeners_per_caller(&self) -> usize {
        self.config.max_per_client
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
        self.forget(&session);
        if let Some(records) = self.records.clone() {
            let id = session.id.clone();
            self.finish("forgetting the session", async move {
                records.remove(&id).await
            });
        }
        let s = session.clone();
        self.tasks.spawn(async move { s.end().await });
        Some(session)
    }

    /// Ends a session for its client's DELETE: as [`SessionManager::end`], but its record is
    /// gone from the shared store before this returns, so no replica finds it afterwards.
    pub async fn delete(&self, id: &str) -> Option<Arc<Session>> {
        let (_, session) = self.sessions.remove(id)?;
        self.forget(&session);
        if let Some(records) = &self.records
            && let Err(e) = records.remove(&session.id).await
        {
            tracing::warn!(session = %session.id, "forgetting the session: {e}");
        }
        let s = session.clone();
        self.tasks.spawn(async move { s.end().await });
        Some(session)
    }

    /// Lets a session go from this replica without ending it (see [`Session::leave`]).
    pub fn leave(&self, id: &str) -> Option<Arc<Session>> {
        let (_, session) = self.sessions.remove(id)?;
        self.forget(&session);
        let s = session.clone();
        self.tasks.spawn(async move { s.leave().await });
        Some(session)
    }

    /// Hands every session over at the end of a drain (cluster mode): the shared store's
    /// copy of their events is flushed, within `timeout`, then each leaves this replica with
    /// its record intact, for whichever replica its client reaches next.
    pub async fn hand_over(&self, timeout: Duration) {
        let ids: Vec<Arc<str>> = self.sessions.iter().map(|s| s.key().clone()).collect();
        if !self.store.flush(timeout).await {
            tracing::warn!("not every replay event reached the shared store before the hand-over");
        }
        for id in &ids {
            self.leave(id);
        }
        tracing::info!(
            sessions = ids.len(),
            "sessions handed over to the other replicas"
        );
    }

    /// Keeps the shared records of this replica's sessions from expiring while the sessions
    /// live, until `shutdown`: each is touched once per third of the idle timeout. A session
    /// whose record is gone (ended elsewhere, or the store lost it) ends here too; one that
    /// another replica took over is left to it. Nothing without a shared store.
    /// `now` wakes it for a round at once (the cluster found Redis may have lost data).
    pub async fn refresh_records(
        self: Arc<Self>,
        now: Option<Arc<tokio::sync::Notify>>,
        shutdown: CancellationToken,
    ) {
        use futures_util::StreamExt;
        let Some(records) = self.records.clone() else {
            return;
        };
        let every = (self.config.idle_timeout / 3).max(Duration::from_secs(1));
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            let woken = async {
                match &now {
                    Some(n) => n.notified().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tick.tick() => {}
                () = woken => {}
                () = shutdown.cancelled() => return,
            }
            // Only sessions whose record was written: one still being recorded is not missing.
            let ids: Vec<Arc<str>> = self
                .sessions
                .iter()
                .filter(|s| s.recorded.load(Ordering::Acquire))
                .map(|s| s.key().clone())
                .collect();
            let now = SystemTime::now();
            futures_util::stream::iter(ids)
                .for_each_concurrent(32, |id| {
                    let records = records.clone();
                    let me = self.clone();
                    async move {
                        match records.touch(&id, now).await {
                            Ok(Touched::Kept) => {}
                            Ok(Touched::Missing) => {
                                tracing::info!(session = %id, "the session's record is gone from the shared store: ending it");
                                me.end(&id);
                            }
                            Ok(Touched::Taken) => {
                                tracing::warn!(session = %id, "another replica took the session over: leaving it to that one");
                                me.leave(&id);
                            }
                            Err(e) => {
                                tracing::warn!(session = %id, "refreshing the session's record: {e}")
                            }
                        }
                    }
                })
                .await;
        }
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
            self.reap_callers(self.config.idle_timeout, self.config.unused_timeout);
            self.store.expire();
            self.supervisor.reap();
        }
    }

    /// Tells every session the registry changed.
    pub fn registry_changed(&self, view: &View) {
        self.supervisor.apply(view);
        for s in self.sessions.iter().chain(self.callers.iter()) {
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
        self.end_callers();
        self.tasks.close();
        self.tasks.wait().await;
        self.supervisor.shutdown().await;
    }

    /// Ends a session out of every table, in the background (shutdown waits for it).
    pub(super) fn spawn_end(&self, session: Arc<Session>) {
        self.tasks.spawn(async move { session.end().await });
    }

    /// Lets a store's call finish: at once when it can (the in-memory store's always do, so
    /// nothing is spawned), else in the background, where shutdown waits for it. A failure
    /// is logged; the session lives on in this process either way.
    fn finish(
        &self,
        what: &'static str,
        call: impl Future<Output = Result<(), SessionStoreError>> + Send + 'static,
    ) {
        fn report(what: &str, r: Result<(), SessionStoreError>) {
            if let Err(e) = r {
                tracing::warn!("{what}: {e}");
            }
        }
        let mut call = Box::pin(call);
        match call.as_mut().now_or_never() {
            Some(r) => report(what, r),
            None => {
                self.tasks.spawn(async move { report(what, call.await) });
            }
        }
    }
}

impl Listeners for SessionManager {
    fn owner_of(&self, sink: &Sink) -> Option<Arc<dyn PluginEvents>> {
        let id = sink.session_id();
        let session = match id.starts_with("caller:") {
            true => self
                .callers
                .iter()
                .find(|s| &*s.id == id)
                .map(|s| s.clone()),
            false => self.get(id),
        };
        session.map(|s| s as Arc<dyn PluginEvents>)
    }

    fn everyone(&self) -> Vec<Arc<dyn PluginEvents>> {
        self.sessions
            .iter()
            .chain(self.callers.iter())
            .map(|s| s.clone() as Arc<dyn PluginEvents>)
            .collect()
    }
}

/// 256 bits from the OS-seeded CSPRNG, base64url: 43 visible ASCII characters.
pub(super) fn new_session_id() -> Arc<str> {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    Arc::from(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

#[cfg(test)]
mod tests {
    use serde_json::value::RawValue;

    use super::*;
    use crate::config::Config;
    use crate::registry::Registry;
    use crate::registry::store::MemoryPluginStore;
    use crate::session::MemorySessionStore;
    use crate::stream::MemoryEventStore;

    #[tokio::test]
    async fn a_sessions_record_is_kept_from_initialize_until_it_ends() {
        let config = Config::with_plugins(Vec::new());
        let registry = Registry::with_overlay(
            &config,
            Arc::new(MemoryPluginStore::default()),
            &Default::default(),
        );
        let records = Arc::new(MemorySessionStore::default());
        let manager = SessionManager::new(
            config.session.clone(),
            Arc::new(MemoryEventStore::new(config.replay.clone())),
            Some(records.clone()),
            config.stream.clone(),
            config.replay.max_age,
            Supervisor::new(registry, None),
        );
        let sent = r#"{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}"#;
        let init = ClientInit {
            version: "2025-06-18",
            plugin_params: RawValue::from_string(sent.into()).unwrap().into(),
            owner: Some("alice".into()),
            client: Arc::from("alice"),
        };
        let session = manager.create(init, &CancellationToken::new()).unwrap();
        manager.record(&session).await.unwrap();
        let record = records
            .get(&session.id)
            .now_or_never()
            .expect("complete at once")
            .unwrap()
            .expect("recorded when created");
        assert_eq!(record.id, session.id);
        assert_eq!(record.version, "2025-06-18");
        assert_eq!(record.init_params.get(), sent);
        assert_eq!(record.owner.as_deref(), Some("alice"));
        assert_eq!(record.created, record.last_used);

        assert!(manager.end(&session.id).is_some());
        assert!(records.is_empty(), "removed when the session ends");
        manager.shutdown().await;
    }

    #[test]
    fn session_ids_are_long_visible_ascii_and_distinct() {
        let a = new_session_id();
        let b = new_session_id();
        assert_ne!(a, b);
        assert_eq!(a.len(), 43);
        assert!(a.bytes().all(|c| (0x21..=0x7e).contains(&c)));
    }
}
