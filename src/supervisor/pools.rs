//! Plugin processes that are not one session's own.
//!
//! - Shared pools (`process_model = "shared"`): one process, or `pool_size` of them, serve every
//!   session. Requests are multiplexed by the connection's own ids as always. What the process
//!   sends on its own is routed by [`SharedEvents`]: a request to a client goes to the session
//!   whose call caused it, which is only known when exactly one session has calls in flight
//!   there; otherwise the request is refused (a guess could show one user's data to another).
//!   Notifications about the plugin (list changes) go to every session; progress goes to the
//!   session whose request its token names; a request or notification that names a task
//!   (2025-11-25 tasks) goes to the session whose client created it, and to no one else;
//!   any other notification (a log) names no request, so it is dropped and counted
//!   (`mcp_gateway_plugin_notifications_dropped_total`).
//! - Warm pools (`warm = K` on a per-session plugin): K processes started and initialized ahead
//!   of demand, each handed whole to the next session that needs one, and replaced.
//!
//! Every process here counts against the plugin's limits like a session's own.
//!
//! Resource subscriptions on a shared plugin are counted across all its holders (sessions and
//! modern listeners, `subscriptions.rs`); a process of the pool that starts is subscribed to
//! what they hold, and one is started when they hold something and none runs.
//!
//! What a shared process sends reaches sessions only through [`Listeners`]: this file never
//! names a session.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use bytes::Bytes;
use serde_json::value::RawValue;

use super::limits::Limits;
use super::subjects::{SubjectKey, SubjectProcess};
use super::subscriptions::{Subscriptions, tell};
use super::{Listeners, Running, breaker, start};
use crate::backend::connection::{LIST_CHANGES, task_named};
use crate::backend::{BackendError, InputRequired, PluginConnection, PluginEvents, Related};
use crate::config::ProcessModel;
use crate::jsonrpc::{self, Id, code};
use crate::registry::{PluginEntry, Registry, View, ViewPlugin, gateway_init_params};
use crate::stream::Sink;

/// The shared and the warm pools, by plugin name.
pub(super) struct Pools {
    /// Which plugins exist now: a process started for a definition that changed meanwhile
    /// is not kept.
    pub(super) registry: Arc<Registry>,
    pub(super) limits: Limits,
    shared: Mutex<HashMap<String, Arc<SharedPool>>>,
    warm: Mutex<HashMap<String, Arc<WarmPool>>>,
    events: Arc<SharedEvents>,
    /// The resource subscriptions held on each shared plugin, by plugin name: they outlive
    /// its pool (a change of definition starts a new one).
    subscriptions: Mutex<HashMap<String, Arc<Subscriptions>>>,
    /// `per_subject` plugins' processes, by plugin and person (`subjects.rs`).
    pub(super) subjects: Mutex<HashMap<SubjectKey, Arc<SubjectProcess>>>,
}

struct SharedPool {
    entry: Arc<PluginEntry>,
    members: Vec<Member>,
    next: AtomicUsize,
}

#[derive(Default)]
struct Member {
    running: Mutex<Option<Running>>,
    starting: tokio::sync::Mutex<()>,
}

struct WarmPool {
    entry: Arc<PluginEntry>,
    ready: Mutex<VecDeque<Running>>,
    /// Instances being started now.
    filling: AtomicUsize,
}

impl Pools {
    pub(super) fn new(
        registry: Arc<Registry>,
        limits: Limits,
        listeners: Arc<OnceLock<Weak<dyn Listeners>>>,
    ) -> Arc<Pools> {
        Arc::new_cyclic(|pools| Pools {
            registry: registry.clone(),
            limits,
            shared: Mutex::new(HashMap::new()),
            warm: Mutex::new(HashMap::new()),
            events: Arc::new(SharedEvents {
                listeners,
                registry: Arc::downgrade(&registry),
                pools: pools.clone(),
                subject: None,
            }),
            subscriptions: Mutex::new(HashMap::new()),
            subjects: Mutex::new(HashMap::new()),
        })
    }

    /// The router of what a person's process sends on its own: the shared one, narrowed to
    /// that person's sessions.
    pub(super) fn subject_events(&self, subject: Arc<str>) -> Arc<SharedEvents> {
        Arc::new(SharedEvents {
            listeners: self.events.listeners.clone(),
            registry: self.events.registry.clone(),
            pools: self.events.pools.clone(),
            subject: Some(subject),
        })
    }

    /// The subscriptions held on a shared plugin.
    pub(super) fn subscriptions(&self, plugin: &str) -> Arc<Subscriptions> {
        self.subscriptions
            .lock()
            .expect("subscriptions lock")
            .entry(plugin.to_owned())
            .or_default()
            .clone()
    }

    /// The running processes of one shared plugin.
    pub(super) fn members_of(&self, plugin: &str) -> Vec<Arc<PluginConnection>> {
        self.shared
            .lock()
            .expect("pools lock")
            .get(plugin)
            .map(|p| p.members.iter().filter_map(Member::current).collect())
            .unwrap_or_default()
    }

    /// Subscribes a process that just started to what its plugin's holders hold.
    fn resubscribe(&self, plugin: &str, conn: &Arc<PluginConnection>) {
        let held = match self
            .subscriptions
            .lock()
            .expect("subscriptions lock")
            .get(plugin)
        {
            Some(s) => s.held(),
            None => return,
        };
        for uri in held {
            let conn = conn.clone();
            tokio::spawn(async move {
                if let Err(e) = tell(&conn, &uri, true).await {
                    tracing::warn!(plugin = %conn.name(), "resources/subscribe {uri} again: {e}");
                }
            });
        }
    }

    /// Starts a process of a shared plugin when something is held on it and none runs (it
    /// crashed, or its definition changed), so its holders' updates keep coming.
    fn keep_subscribed(&self, plugin: &str) {
        let holds = self
            .subscriptions
            .lock()
            .expect("subscriptions lock")
            .get(plugin)
            .is_some_and(|s| !s.is_empty());
        if !holds || !self.members_of(plugin).is_empty() {
            return;
        }
        let (Some(pools), view) = (self.events.pools.upgrade(), self.registry.view()) else {
            return;
        };
        let name = plugin.to_owned();
        tokio::spawn(async move {
            let Some(p) = view.find(&name) else { return };
            if p.entry.config.process_model != ProcessModel::Shared {
                return;
            }
            if let Err(e) = pools.shared(p).await {
                tracing::warn!(plugin = %name, "a process for the resource subscriptions held on it did not start: {e}");
            }
        });
    }

    /// Takes a dead shared process out of its pool, so it no longer counts against the
    /// limits; true if it was a member's current process.
    fn forget_shared(&self, conn: &Arc<PluginConnection>) -> bool {
        let pools = self.shared.lock().expect("pools lock");
        for pool in pools.values() {
            for m in &pool.members {
                let mut running = m.running.lock().expect("member lock");
                if running.as_ref().is_some_and(|r| Arc::ptr_eq(&r.conn, conn)) {
                    running.take();
                    return true;
                }
            }
        }
        false
    }

    /// Drops warm processes that died while waiting, and tops the pools up.
    pub(super) fn reap(&self) {
        let pools: Vec<Arc<WarmPool>> = self
            .warm
            .lock()
            .expect("pools lock")
            .values()
            .cloned()
            .collect();
        for pool in pools {
            pool.ready
                .lock()
                .expect("warm lock")
                .retain(|r| r.conn.is_alive());
            self.fill(&pool);
        }
        let view = self.registry.view();
        self.reap_subjects(|name, generation| {
            view.find(name)
                .is_some_and(|p| p.entry.generation == generation)
        });
    }

    /// A running process of a shared plugin, started if need be (round robin over the pool).
    pub(super) async fn shared(
        &self,
        plugin: &ViewPlugin,
    ) -> Result<Arc<PluginConnection>, BackendError> {
        let pool = {
            let mut pools = self.shared.lock().expect("pools lock");
            match pools.get(plugin.name()) {
                Some(p) if p.entry.generation == plugin.entry.generation => p.clone(),
                _ => {
                    let pool = Arc::new(SharedPool {
                        entry: plugin.entry.clone(),
                        members: (0..plugin.entry.config.pool_size)
                            .map(|_| Member::default())
                            .collect(),
                        next: AtomicUsize::new(0),
                    });
                    if let Some(old) = pools.insert(plugin.name().to_owned(), pool.clone()) {
                        old.stop();
                    }
                    pool
                }
            }
        };
        let member = &pool.members[pool.next.fetch_add(1, Ordering::Relaxed) % pool.members.len()];
        if let Some(c) = member.current() {
            return Ok(c);
        }
        let _starting = member.starting.lock().await;
        if let Some(c) = member.current() {
            return Ok(c);
        }
        // A process that died stops counting against the limits before its successor starts.
        member.running.lock().expect("member lock").take();
        let events: Weak<dyn PluginEvents> = Arc::downgrade(&self.events) as Weak<dyn PluginEvents>;
        let running = start(
            &self.limits,
            &pool.entry,
            Arc::from("shared"),
            &gateway_init_params(),
            None,
            Some(events),
            None,
        )
        .await?;
        let still_current = self
            .shared
            .lock()
            .expect("pools lock")
            .get(plugin.name())
            .is_some_and(|p| Arc::ptr_eq(p, &pool));
        if !still_current || !self.registry.is_current(plugin) {
            // The registry changed while the process started: it is not needed.
            running.conn.shutdown().await;
            return Err(super::changed(plugin));
        }
        let conn = running.conn.clone();
        *member.running.lock().expect("member lock") = Some(running);
        self.resubscribe(plugin.name(), &conn);
        Ok(conn)
    }

    /// Every running process of every shared pool.
    pub(super) fn shared_conns(&self) -> Vec<Arc<PluginConnection>> {
        self.shared
            .lock()
            .expect("pools lock")
            .values()
            .flat_map(|p| p.members.iter().filter_map(Member::current))
            .collect()
    }

    /// A warm process of a per-session plugin, if one is ready; a replacement starts.
    pub(super) fn take_warm(&self, plugin: &ViewPlugin) -> Option<Running> {
        if plugin.entry.config.warm == 0 {
            return None;
        }
        let pool = self
            .warm
            .lock()
            .expect("pools lock")
            .get(plugin.name())
            .cloned()?;
        if pool.entry.generation != plugin.entry.generation {
            return None;
        }
        let taken = loop {
            let next = pool.ready.lock().expect("warm lock").pop_front()?;
            if next.conn.is_alive() {
                break next;
            }
        };
        self.fill(&pool);
        Some(taken)
    }

    /// Brings the pools in line with the registry: pools of plugins that left or changed
    /// stop (a shared one with subscriptions held on it starts again); warm pools fill up.
    pub(super) fn apply(&self, view: &View) {
        let current = |name: &str, generation: u64| {
            view.find(name)
                .is_some_and(|p| p.entry.generation == generation)
        };
        self.shared
            .lock()
            .expect("pools lock")
            .retain(|name, pool| {
                let keep = current(name, pool.entry.generation);
                if !keep {
                    pool.stop();
                }
                keep
            });
        for p in &view.plugins {
            if p.entry.config.process_model == ProcessModel::Shared {
                self.keep_subscribed(p.name());
            }
        }
        let mut warm = self.warm.lock().expect("pools lock");
        warm.retain(|name, pool| {
            let keep = current(name, pool.entry.generation) && pool.entry.config.warm > 0;
            if !keep {
                pool.stop();
            }
            keep
        });
        for p in &view.plugins {
            let c = &p.entry.config;
            if c.process_model == ProcessModel::PerSession
                && c.warm > 0
                && !warm.contains_key(p.name())
            {
                let pool = Arc::new(WarmPool {
                    entry: p.entry.clone(),
                    ready: Mutex::new(VecDeque::new()),
                    filling: AtomicUsize::new(0),
                });
                warm.insert(p.name().to_owned(), pool.clone());
                self.fill(&pool);
            }
        }
    }

    /// Starts warm processes until the pool holds (or is starting) its K.
    fn fill(&self, pool: &Arc<WarmPool>) {
        let want = pool.entry.config.warm;
        loop {
            let have =
                pool.ready.lock().expect("warm lock").len() + pool.filling.load(Ordering::Acquire);
            if have >= want {
                return;
            }
            pool.filling.fetch_add(1, Ordering::AcqRel);
            let (pool, limits) = (pool.clone(), self.limits.clone());
            tokio::spawn(async move {
                let started = start(
                    &limits,
                    &pool.entry,
                    Arc::from("warm"),
                    &gateway_init_params(),
                    None,
                    None,
                    None,
                )
                .await;
                pool.filling.fetch_sub(1, Ordering::AcqRel);
                match started {
                    Ok(running) => pool.ready.lock().expect("warm lock").push_back(running),
                    Err(e) => {
                        tracing::warn!(plugin = %pool.entry.name(), "a warm process did not start: {e}")
                    }
                }
            });
        }
    }

    /// Stops every pooled process and waits for them.
    pub(super) async fn shutdown(&self) {
        let mut running: Vec<Running> = Vec::new();
        for pool in self
            .shared
            .lock()
            .expect("pools lock")
            .drain()
            .map(|(_, p)| p)
        {
            running.extend(
                pool.members
                    .iter()
                    .filter_map(|m| m.running.lock().expect("member lock").take()),
            );
        }
        for pool in self
            .warm
            .lock()
            .expect("pools lock")
            .drain()
            .map(|(_, p)| p)
        {
            running.extend(pool.ready.lock().expect("warm lock").drain(..));
        }
        for (_, p) in self.subjects.lock().expect("subjects lock").drain() {
            running.extend(p.running.lock().expect("subject lock").take());
        }
        futures_util::future::join_all(running.iter().map(|r| r.conn.shutdown())).await;
        // Sessions' processes are stopped before the pools': anything a plugin left outside
        // its process group goes now.
        crate::backend::orphans::stop_all().await;
    }
}

impl Member {
    fn current(&self) -> Option<Arc<PluginConnection>> {
        self.running
            .lock()
            .expect("member lock")
            .as_ref()
            .filter(|r| r.conn.is_alive())
            .map(|r| r.conn.clone())
    }
}

impl SharedPool {
    fn stop(&self) {
        for m in &self.members {
            if let Some(r) = m.running.lock().expect("member lock").take() {
                tokio::spawn(async move { r.conn.shutdown().await });
            }
        }
    }
}

impl WarmPool {
    fn stop(&self) {
        for r in self.ready.lock().expect("warm lock").drain(..) {
            tokio::spawn(async move { r.conn.shutdown().await });
        }
    }
}

/// Routes what a shared process sends on its own to the sessions it concerns; for a
/// person's process (`subject`), among that person's sessions alone.
pub(super) struct SharedEvents {
    /// The sessions, once the session manager has named itself.
    listeners: Arc<OnceLock<Weak<dyn Listeners>>>,
    registry: Weak<Registry>,
    pools: Weak<Pools>,
    subject: Option<Arc<str>>,
}

impl SharedEvents {
    fn listeners(&self) -> Option<Arc<dyn Listeners>> {
        self.listeners.get().and_then(Weak::upgrade)
    }

    fn session_of(&self, sink: &Sink) -> Option<Arc<dyn PluginEvents>> {
        self.listeners()?.owner_of(sink)
    }

    fn everyone(&self) -> Vec<Arc<dyn PluginEvents>> {
        let mut all = self.listeners().map(|l| l.everyone()).unwrap_or_default();
        if let Some(subject) = &self.subject {
            all.retain(|s| s.subject() == Some(&**subject));
        }
        all
    }

    /// The session whose client created `conn`'s task `task`.
    fn owner_of_task(
        &self,
        conn: &Arc<PluginConnection>,
        task: &str,
    ) -> Option<Arc<dyn PluginEvents>> {
        self.everyone()
            .into_iter()
            .find(|s| s.owns_task(conn, task))
    }
}

/// `related` if its stream is `owner`'s, else [`Related::None`]: a message routed by the task
/// it names must not go on another session's stream.
fn related_for(events: &SharedEvents, owner: &Arc<dyn PluginEvents>, related: Related) -> Related {
    let same = |sink: &Sink| {
        events
            .session_of(sink)
            .is_some_and(|s| std::ptr::addr_eq(Arc::as_ptr(&s), Arc::as_ptr(owner)))
    };
    match &related {
        Related::Named(s) | Related::Exact(s) | Related::Ambiguous(s) if same(s) => related,
        _ => Related::None,
    }
}

impl PluginEvents for SharedEvents {
    fn plugin_request(
        &self,
        conn: &Arc<PluginConnection>,
        id: Id,
        method: &str,
        params: Option<&RawValue>,
        related: Related,
    ) {
        // A request about a task (an elicitation the task needs) is for the task's client.
        if let Some(task) = task_named(method, params)
            && let Some(owner) = self.owner_of_task(conn, &task)
        {
            let related = related_for(self, &owner, related);
            return owner.plugin_request(conn, id, method, params, related);
        }
        let session = match &related {
            Related::Named(sink) | Related::Exact(sink) | Related::Ambiguous(sink) => {
                self.session_of(sink)
            }
            Related::None | Related::Unattributable => None,
        };
        match session {
            Some(s) => s.plugin_request(conn, id, method, params, related),
            None => {
                tracing::warn!(plugin = %conn.name(), "{method} from a shared plugin: no single session's call is in flight there, so it is refused");
                conn.send_raw(jsonrpc::error_bytes(
                    Some(&id),
                    code::INTERNAL_ERROR,
                    &format!("{method}: the gateway cannot tell which client this is for (this plugin is shared)"),
                ));
            }
        }
    }

    fn plugin_notification(
        &self,
        conn: &Arc<PluginConnection>,
        message: Bytes,
        method: &str,
        related: Related,
    ) {
        // About the plugin, not a request: every session hears it. A cancellation is mapped
        // only by the session that holds the request it cancels.
        if LIST_CHANGES.contains(&method) || method == "notifications/cancelled" {
            for s in self.everyone() {
                s.plugin_notification(conn, message.clone(), method, Related::None);
            }
            return;
        }
        // About a task: its client's alone.
        if let Some(owner) = named_task(method, &message).and_then(|t| self.owner_of_task(conn, &t))
        {
            let related = related_for(self, &owner, related);
            owner.plugin_notification(conn, message, method, related);
            return;
        }
        match &related {
            // It names its request (a progress token): certain.
            Related::Named(sink) => {
                if let Some(s) = self.session_of(sink) {
                    s.plugin_notification(conn, message, method, related);
                }
            }
            // A person's process: whatever it says is that person's, so a log goes to the
            // session whose call it most likely belongs to.
            Related::Exact(sink) | Related::Ambiguous(sink) if self.subject.is_some() => {
                if let Some(s) = self.session_of(sink) {
                    s.plugin_notification(conn, message, method, related);
                }
            }
            // Logs and the like name no request. That one session alone has calls in flight
            // does not make them its own: a call that has returned may leave notifications
            // behind. On a shared process they may carry another user's data: shown to no
            // one, and counted.
            Related::Exact(_) | Related::Ambiguous(_) | Related::None | Related::Unattributable => {
                crate::metrics::get()
                    .plugin_notifications_dropped
                    .with_label_values(&[conn.name()])
                    .inc();
                tracing::debug!(plugin = %conn.name(), "{method} from a shared plugin names no request in flight: dropped");
            }
        }
    }

    fn plugin_input_required(&self, conn: &Arc<PluginConnection>, input: InputRequired) {
        // The session whose call it answers: its sink names it, whoever else has calls here.
        match self.session_of(&input.sink) {
            Some(s) => s.plugin_input_required(conn, input),
            None => {
                conn.fail_input(
                    input.call,
                    code::INTERNAL_ERROR,
                    &format!(
                        "plugin '{}' asked for the client's input, but the client has gone",
                        conn.name()
                    ),
                );
            }
        }
    }

    fn plugin_exited(&self, conn: &Arc<PluginConnection>) {
        let pools = self.pools.upgrade();
        if let Some(subject) = &self.subject {
            let current = pools
                .as_ref()
                .and_then(|p| p.forget_subject(conn))
                .is_some();
            if current && !conn.is_stopping() {
                let report = conn.exit_report();
                tracing::warn!(plugin = %conn.name(), "a person's plugin process exited ({report}); it restarts on their next request");
                if let Some(entry) = self.registry.upgrade().and_then(|r| r.get(conn.name())) {
                    *entry.stats.last_error.lock().expect("stats lock") = Some(report);
                    breaker::record_crash(&entry, Some(subject));
                }
            }
            return;
        }
        let current = pools.as_ref().is_some_and(|p| p.forget_shared(conn));
        if !current || conn.is_stopping() {
            return;
        }
        let report = conn.exit_report();
        tracing::warn!(plugin = %conn.name(), "a shared plugin process exited ({report}); it restarts on the next request");
        if let Some(entry) = self.registry.upgrade().and_then(|r| r.get(conn.name())) {
            *entry.stats.last_error.lock().expect("stats lock") = Some(report);
            if breaker::record_crash(&entry, None) {
                tracing::error!(plugin = %conn.name(), "plugin keeps crashing: the circuit breaker is open");
            }
        }
        if let Some(p) = &pools {
            p.keep_subscribed(conn.name());
        }
    }
}

/// The task a shared plugin's notification names (see [`task_named`]); only a message that
/// mentions a task is parsed.
fn named_task(method: &str, message: &[u8]) -> Option<String> {
    if method != "notifications/tasks/status"
        && memchr::memmem::find(message, crate::backend::RELATED_TASK.as_bytes()).is_none()
    {
        return None;
    }
    #[derive(serde::Deserialize)]
    struct Notification {
        params: Option<Box<RawValue>>,
    }
    let n: Notification = serde_json::from_slice(message).ok()?;
    task_named(method, n.params.as_deref())
}
