//! Plugin supervision: every plugin process a client's request can reach is started, counted,
//! restarted, and stopped (through its slot or its pool) here.
//!
//! The supervisor owns:
//! - starting an instance ([`Supervisor::start`]): refused while the plugin's crash breaker
//!   is open or a limit is met, then spawned and initialized by the backend;
//! - the limits (`limits.rs`) on running processes, per plugin and for the gateway;
//! - the crash [`breaker`];
//! - restarts with backoff (`restart.rs`) of one owner's instance ([`Slot`]);
//! - the pools (`pools.rs`) of processes that are no one session's own: shared and warm;
//! - resource subscriptions counted by holder ([`subscriptions`]): across every session and
//!   listener on a shared plugin.
//!
//! Sessions ask it for instances and keep them in their slots; the [`crate::backend`] is the
//! mechanism (spawn a child, speak JSON-RPC with it, stop it) and decides nothing about when.
//! The registry's probes are not instances and are not supervised. The supervisor knows no
//! session type: what shared processes send on their own reaches sessions through
//! [`Listeners`], which the session manager implements.

pub mod breaker;
mod limits;
mod pools;
mod restart;
mod subjects;
pub mod subscriptions;

use std::sync::{Arc, OnceLock, Weak};

use serde_json::value::RawValue;

pub use limits::Reservation;
pub use restart::Slot;

use crate::backend::{BackendError, Personal, PluginConnection, PluginEvents, start_plugin};
use crate::credentials::Broker;
use crate::registry::{PluginEntry, Registry, View, ViewPlugin};
use crate::stream::Sink;
use limits::Limits;
use pools::Pools;

/// A running instance and its place under the limits (released when it is gone).
pub struct Running {
    pub conn: Arc<PluginConnection>,
    _reservation: Reservation,
}

/// Where what a shared process sends on its own can go: the sessions, seen from below. The
/// session manager implements it; the supervisor never names a session.
pub trait Listeners: Send + Sync + 'static {
    /// The listener whose stream `sink` writes to (the session that sent the request), if it
    /// is still there.
    fn owner_of(&self, sink: &Sink) -> Option<Arc<dyn PluginEvents>>;
    /// Every listener now.
    fn everyone(&self) -> Vec<Arc<dyn PluginEvents>>;
}

/// The error for a request routed to a plugin definition that has since changed or gone.
pub fn changed(plugin: &ViewPlugin) -> BackendError {
    BackendError::Unavailable {
        plugin: plugin.name().to_owned(),
        reason: "it was changed or removed while the request was on its way; send it again".into(),
    }
}

/// Whom a session's instance is for: its label in the logs, the client's `initialize`
/// params and key, who hears what it sends, and the person's own credentials it is started
/// with, if it uses any.
pub struct Owner<'a> {
    pub label: Arc<str>,
    pub params: &'a RawValue,
    pub client: &'a Arc<str>,
    pub events: Weak<dyn PluginEvents>,
    pub personal: Option<&'a Personal>,
}

/// Starts, counts, restarts and stops plugin processes (see the module's doc).
pub struct Supervisor {
    /// Which plugins exist now: a pool of a plugin that left or changed is not refilled.
    registry: Arc<Registry>,
    limits: Limits,
    /// Processes that are no one session's own.
    pools: Arc<Pools>,
    /// Who hears what shared processes send on their own; set once by the session manager.
    listeners: Arc<OnceLock<Weak<dyn Listeners>>>,
    /// People's own credentials, which some plugins are started with (set once, at start).
    credentials: OnceLock<Arc<Broker>>,
}

impl Supervisor {
    /// A supervisor of `registry`'s plugins, with the gateway-wide process limit.
    pub fn new(registry: Arc<Registry>, max_children: Option<usize>) -> Arc<Supervisor> {
        let limits = Limits::new(max_children);
        let listeners = Arc::new(OnceLock::new());
        Arc::new(Supervisor {
            pools: Pools::new(registry.clone(), limits.clone(), listeners.clone()),
            registry,
            limits,
            listeners,
            credentials: OnceLock::new(),
        })
    }

    /// Keeps people's credentials in `broker` (once; later calls are ignored).
    pub fn use_credentials(&self, broker: Arc<Broker>) {
        let _ = self.credentials.set(broker);
    }

    /// People's credentials, if any are defined.
    pub fn credentials(&self) -> Option<&Arc<Broker>> {
        self.credentials.get()
    }

    /// Names who hears what shared processes send on their own (once; later calls are
    /// ignored).
    pub fn listen(&self, listeners: Weak<dyn Listeners>) {
        let first = self.listeners.set(listeners).is_ok();
        debug_assert!(first, "a supervisor has one set of listeners");
    }

    /// The registry whose plugins it runs.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Plugin processes running now, all plugins together.
    pub fn total_running(&self) -> usize {
        self.limits.total_running()
    }

    /// Starts a process of `entry`, counted against the limits and refused while its breaker
    /// is open; a failure counts towards the breaker, as `client`'s (whose `initialize`
    /// params these are) or, with `None`, as a shared process's.
    pub async fn start(
        &self,
        entry: &PluginEntry,
        label: Arc<str>,
        params: &RawValue,
        client: Option<&Arc<str>>,
        events: Option<Weak<dyn PluginEvents>>,
    ) -> Result<Running, BackendError> {
        start(&self.limits, entry, label, params, client, events, None).await
    }

    /// A new instance for `slot` (which must be empty): a warm one if the plugin keeps
    /// some, else one started with the client's `params`. A failed start counts towards the
    /// slot's backoff and the plugin's breaker.
    pub async fn instance(
        &self,
        plugin: &ViewPlugin,
        slot: &Slot,
        owner: Owner<'_>,
    ) -> Result<Running, BackendError> {
        let Owner {
            label,
            params,
            client,
            events,
            personal,
        } = owner;
        if let Some(personal) = personal {
            // One person's: never a warm one (a plugin with credentials keeps none).
            return start(
                &self.limits,
                &slot.entry,
                label,
                params,
                Some(client),
                Some(events),
                Some(personal),
            )
            .await
            .inspect_err(|_| slot.count_crash());
        }
        match self.pools.take_warm(plugin) {
            // A warm instance: started and initialized ahead of demand, now this owner's.
            Some(warm) if warm.conn.set_events(events.clone()) => Ok(warm),
            _ => self
                .start(&slot.entry, label, params, Some(client), Some(events))
                .await
                .inspect_err(|_| slot.count_crash()),
        }
    }

    /// A running process of a shared plugin, started if need be (round robin over its pool).
    pub async fn shared(&self, plugin: &ViewPlugin) -> Result<Arc<PluginConnection>, BackendError> {
        self.pools.shared(plugin).await
    }

    /// `subject`'s running process of a `per_subject` plugin, if any.
    pub fn subject_current(
        &self,
        plugin: &ViewPlugin,
        subject: &str,
    ) -> Option<Arc<PluginConnection>> {
        self.pools.subject_current(plugin, subject)
    }

    /// `subject`'s process of a `per_subject` plugin, started with `personal` (their
    /// credentials) if need be.
    pub async fn for_subject(
        &self,
        plugin: &ViewPlugin,
        subject: &str,
        personal: Option<&Personal>,
    ) -> Result<Arc<PluginConnection>, BackendError> {
        self.pools.for_subject(plugin, subject, personal).await
    }

    /// Stops `plugin`'s processes of `subject`, or of everyone (`None`); how many.
    pub fn stop_subject(&self, plugin: &str, subject: Option<&str>) -> usize {
        self.pools.stop_subject(plugin, subject)
    }

    /// Stops `conn` if it is a person's process of a `per_subject` plugin.
    pub fn stop_subject_conn(&self, conn: &Arc<PluginConnection>) -> bool {
        self.pools.stop_subject_conn(conn)
    }

    /// Every person's running process: its plugin, whose, the connection.
    pub fn subject_conns(&self) -> Vec<(String, Arc<str>, Arc<PluginConnection>)> {
        self.pools.subject_conns()
    }

    /// Every running process of every shared pool.
    pub fn shared_conns(&self) -> Vec<Arc<PluginConnection>> {
        self.pools.shared_conns()
    }

    /// Brings the pools in line with the registry: pools of plugins that left or changed
    /// stop; warm pools fill up.
    pub fn apply(&self, view: &View) {
        self.pools.apply(view);
    }

    /// Drops warm processes that died while waiting, and tops the pools up.
    pub fn reap(&self) {
        self.pools.reap();
    }

    /// Stops every pooled process and waits for them, then whatever plugins left outside
    /// their process groups. Called after every session's instances have stopped.
    pub async fn shutdown(&self) {
        self.pools.shutdown().await;
    }
}

/// [`Supervisor::start`], for the pools' tasks that hold only the limits.
async fn start(
    limits: &Limits,
    entry: &PluginEntry,
    label: Arc<str>,
    params: &RawValue,
    client: Option<&Arc<str>>,
    events: Option<Weak<dyn PluginEvents>>,
    personal: Option<&Personal>,
) -> Result<Running, BackendError> {
    breaker::check(entry)?;
    let reservation = limits
        .reserve(entry)
        .map_err(|reason| BackendError::Unavailable {
            plugin: entry.name().to_owned(),
            reason,
        })?;
    let conn = start_plugin(&entry.config, label, params, entry.era(), events, personal)
        .await
        .inspect_err(|e| {
            tracing::warn!(plugin = %entry.name(), "{e}");
            *entry.stats.last_error.lock().expect("stats lock") = Some(e.to_string());
            if breaker::record_crash(entry, client) {
                tracing::error!(plugin = %entry.name(), "plugin keeps failing: the circuit breaker is open");
            }
        })?;
    entry
        .stats
        .starts
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    crate::metrics::get()
        .plugin_starts
        .with_label_values(&[entry.name()])
        .inc();
    Ok(Running {
        conn,
        _reservation: reservation,
    })
}
