//! The plugin registry: every plugin the gateway knows, from the config file and from the
//! admin API (persisted by a [`store::PluginStore`]), and what each said of itself when probed.
//!
//! The registry is the only place plugins are added, changed or removed. Readers take a
//! [`View`]: an immutable snapshot of the usable plugins (enabled, probed) with their name
//! prefixes, rebuilt on every change, so a request is routed against one consistent picture
//! even while an operator edits the registry. A change runs the registered listener (the
//! gateway tells sessions, which stop instances of plugins that went away and notify clients).
//!
//! Each plugin is probed once, when it appears or changes: started, initialized with the
//! gateway's own client capabilities, asked for its tools, and stopped. A client's
//! `initialize` is answered from these answers; a session starts its own instance only when
//! it first uses the plugin.

pub mod store;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use tokio::sync::watch;

use crate::backend::start_plugin;
use crate::config::{Config, PluginConfig};
use crate::protocol;
use store::{Overlay, PluginStore, StoreError};

/// How long after a failed probe a new session may trigger another.
const REPROBE_AFTER: Duration = Duration::from_secs(30);

/// What a plugin said of itself.
#[derive(Debug)]
pub struct PluginInfo {
    pub protocol_version: String,
    pub capabilities: serde_json::Value,
    pub server_info: Box<RawValue>,
    pub instructions: Option<String>,
    /// Its tools, as listed when probed (for counts and change detection).
    pub tools: usize,
}

#[derive(Debug, Clone)]
pub enum ProbeState {
    /// The first probe is running: a client's `initialize` waits for it.
    Pending,
    Ready(Arc<PluginInfo>),
    Failed {
        /// All of it, for the logs and the admin API.
        error: String,
        /// Which plugin and what failed, for those without a token (`/readyz`): no command
        /// line, no stderr.
        summary: String,
        at: Instant,
    },
    /// A failed plugin is probed again; sessions created meanwhile go without it.
    Reprobing,
}

/// Where a plugin was declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Config,
    Api,
}

/// Crashes in this window trip the breaker...
const BREAKER_WINDOW: Duration = Duration::from_secs(60);
/// ...when there are this many, a client's own processes counting once per client (a client
/// must not be able to shut a plugin off for everyone by crashing its own instance)...
const BREAKER_CRASHES: usize = 5;
/// ...and it stays open this long before one more start is tried.
const BREAKER_COOLDOWN: Duration = Duration::from_secs(30);

/// Counters about one plugin, across all its processes.
#[derive(Debug, Default)]
pub struct PluginStats {
    /// Processes running now (probes excluded), counted from before they start.
    pub running: AtomicUsize,
    pub starts: AtomicU64,
    pub crashes: AtomicU64,
    pub last_error: Mutex<Option<String>>,
    breaker: Mutex<Breaker>,
}

#[derive(Debug, Default)]
struct Breaker {
    /// Recent crashes, and whose process each was (`None`: one every client shares).
    recent: std::collections::VecDeque<(Instant, Option<Arc<str>>)>,
    open_until: Option<Instant>,
}

impl PluginStats {
    /// Records a crash (or a failed start) of a process of `client`'s own (a session's
    /// instance, started with the client's `initialize` params), or of one every client
    /// shares (`None`); true when it trips the breaker.
    pub fn crashed(&self, client: Option<&Arc<str>>) -> bool {
        self.crashes.fetch_add(1, Ordering::Relaxed);
        let mut b = self.breaker.lock().expect("breaker lock");
        let now = Instant::now();
        b.recent.push_back((now, client.cloned()));
        while b
            .recent
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > BREAKER_WINDOW)
        {
            b.recent.pop_front();
        }
        let mut clients = std::collections::HashSet::new();
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

    /// How long the breaker stays open, if it is.
    pub fn breaker_open(&self) -> Option<Duration> {
        let b = self.breaker.lock().expect("breaker lock");
        b.open_until
            .and_then(|t| t.checked_duration_since(Instant::now()))
    }
}

/// A started (or starting) process, counted against the limits until dropped.
pub struct Reservation {
    stats: Arc<PluginStats>,
    total: Arc<AtomicUsize>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.stats.running.fetch_sub(1, Ordering::Relaxed);
        self.total.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One plugin.
#[derive(Debug)]
pub struct PluginEntry {
    pub config: PluginConfig,
    pub source: Source,
    pub enabled: bool,
    /// Changes whenever the plugin is redefined: a session's instance of an older generation
    /// is stopped and started afresh.
    pub generation: u64,
    state: watch::Sender<ProbeState>,
    pub stats: Arc<PluginStats>,
}

impl PluginEntry {
    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn state(&self) -> ProbeState {
        self.state.borrow().clone()
    }

    /// Counts a process started for a session or a pool.
    pub fn record_start(&self) {
        self.stats.starts.fetch_add(1, Ordering::Relaxed);
        crate::metrics::get()
            .plugin_starts
            .with_label_values(&[self.name()])
            .inc();
    }

    /// Counts a crash (or a failed start) of `client`'s own process, or of a shared one
    /// (`None`); true when it trips the breaker.
    pub fn record_crash(&self, client: Option<&Arc<str>>) -> bool {
        crate::metrics::get()
            .plugin_crashes
            .with_label_values(&[self.name()])
            .inc();
        self.stats.crashed(client)
    }
}

/// A usable plugin, as a view shows it.
#[derive(Debug, Clone)]
pub struct ViewPlugin {
    pub entry: Arc<PluginEntry>,
    pub info: Arc<PluginInfo>,
    /// Prefix of its tool and prompt names, if names are prefixed.
    pub prefix: Option<String>,
}

impl ViewPlugin {
    pub fn name(&self) -> &str {
        self.entry.name()
    }

    pub fn has_capability(&self, name: &str) -> bool {
        self.info
            .capabilities
            .get(name)
            .is_some_and(|c| !c.is_null())
    }
}

/// The usable plugins at one moment.
#[derive(Debug)]
pub struct View {
    pub plugins: Vec<ViewPlugin>,
    pub separator: Arc<str>,
    /// What `initialize` answers with this view, all but the protocol version: the router
    /// makes it on first use, and every later session of the view takes it as it is.
    pub initialize: OnceLock<Box<str>>,
}

impl View {
    pub fn find(&self, name: &str) -> Option<&ViewPlugin> {
        self.plugins.iter().find(|p| p.name() == name)
    }

    /// The same view without the plugins `hide` picks (names keep their prefixes).
    pub fn without(&self, hide: impl Fn(&ViewPlugin) -> bool) -> View {
        View {
            plugins: self.plugins.iter().filter(|p| !hide(p)).cloned().collect(),
            separator: self.separator.clone(),
            initialize: OnceLock::new(),
        }
    }
}

/// Why a registry change was refused.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("a plugin named `{0}` already exists")]
    Exists(String),
    #[error("no plugin named `{0}`")]
    NotFound(String),
    #[error("invalid plugin: {0}")]
    Invalid(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

type Listener = Box<dyn Fn(&Arc<View>) + Send + Sync>;

pub struct Registry {
    entries: RwLock<Vec<Arc<PluginEntry>>>,
    view: RwLock<Arc<View>>,
    /// The config file's plugins, as last loaded (the base the API overlay applies to).
    file_plugins: Mutex<Vec<PluginConfig>>,
    store: Arc<dyn PluginStore>,
    separator: Arc<str>,
    generation: AtomicU64,
    listener: Mutex<Option<Listener>>,
    /// Plugin processes running (or starting) now, all plugins together.
    total_running: Arc<AtomicUsize>,
    max_children: Option<usize>,
    /// Serializes publishing views.
    publishing: Mutex<()>,
    /// Serializes changes (API calls, reloads), so each is applied whole.
    change: tokio::sync::Mutex<()>,
    me: std::sync::Weak<Registry>,
}

impl Registry {
    /// The registry for `config`, with the overlay the store holds applied.
    pub async fn load(
        config: &Config,
        store: Arc<dyn PluginStore>,
    ) -> Result<Arc<Registry>, RegistryError> {
        let overlay = store.load().await?;
        validate_set(&merge(&config.plugins, &overlay), &config.separator).map_err(|e| {
            RegistryError::Invalid(format!(
                "the config file and the changes made through the admin API conflict: {e}"
            ))
        })?;
        Ok(Registry::with_overlay(config, store, &overlay))
    }

    /// The registry for `config` with `overlay` applied (probes start at once).
    pub fn with_overlay(
        config: &Config,
        store: Arc<dyn PluginStore>,
        overlay: &BTreeMap<String, Overlay>,
    ) -> Arc<Registry> {
        let registry = Arc::new_cyclic(|me| Registry {
            entries: RwLock::new(Vec::new()),
            view: RwLock::new(Arc::new(View {
                plugins: Vec::new(),
                separator: Arc::from(config.separator.as_str()),
                initialize: OnceLock::new(),
            })),
            file_plugins: Mutex::new(config.plugins.clone()),
            store,
            separator: Arc::from(config.separator.as_str()),
            generation: AtomicU64::new(1),
            listener: Mutex::new(None),
            total_running: Arc::new(AtomicUsize::new(0)),
            max_children: config.max_children,
            publishing: Mutex::new(()),
            change: tokio::sync::Mutex::new(()),
            me: me.clone(),
        });
        registry.install(merge(&config.plugins, overlay));
        registry
    }

    /// Counts one more process of `entry` against the limits, or says which limit it meets.
    pub fn reserve(&self, entry: &PluginEntry) -> Result<Reservation, String> {
        let total = self.total_running.fetch_add(1, Ordering::AcqRel) + 1;
        let own = entry.stats.running.fetch_add(1, Ordering::AcqRel) + 1;
        let reservation = Reservation {
            stats: entry.stats.clone(),
            total: self.total_running.clone(),
        };
        if let Some(max) = entry.config.max_children.filter(|m| own > *m) {
            return Err(format!(
                "it runs its limit of {max} processes (max_children)"
            ));
        }
        if let Some(max) = self.max_children.filter(|m| total > *m) {
            return Err(format!(
                "the gateway runs its limit of {max} plugin processes (max_children)"
            ));
        }
        Ok(reservation)
    }

    /// Plugin processes running now, all plugins together.
    pub fn total_running(&self) -> usize {
        self.total_running.load(Ordering::Relaxed)
    }

    /// Called with the new view after every change.
    pub fn on_change(&self, f: impl Fn(&Arc<View>) + Send + Sync + 'static) {
        *self.listener.lock().expect("listener lock") = Some(Box::new(f));
    }

    /// The usable plugins now.
    pub fn view(&self) -> Arc<View> {
        self.view.read().expect("view lock").clone()
    }

    /// Whether a view's plugin is still the registry's current definition.
    pub fn is_current(&self, plugin: &ViewPlugin) -> bool {
        self.view()
            .find(plugin.name())
            .is_some_and(|p| p.entry.generation == plugin.entry.generation)
    }

    /// Every plugin, usable or not (for the admin API).
    pub fn entries(&self) -> Vec<Arc<PluginEntry>> {
        self.entries.read().expect("entries lock").clone()
    }

    pub fn get(&self, name: &str) -> Option<Arc<PluginEntry>> {
        self.entries().into_iter().find(|e| e.name() == name)
    }

    /// The usable plugins once no first probe is pending (or `timeout` passed). Failed probes
    /// old enough are retried in the background for later sessions.
    pub async fn ready(&self, timeout: Duration) -> Arc<View> {
        let deadline = tokio::time::Instant::now() + timeout;
        for entry in self.entries().iter().filter(|e| e.enabled) {
            let mut rx = entry.state.subscribe();
            let state = match tokio::time::timeout_at(
                deadline,
                rx.wait_for(|s| !matches!(s, ProbeState::Pending)),
            )
            .await
            {
                Ok(Ok(s)) => s.clone(),
                _ => continue,
            };
            if let ProbeState::Failed { .. } = state {
                // Claimed atomically: one re-probe, however many sessions start now.
                let claimed = entry.state.send_if_modified(|s| match s {
                    ProbeState::Failed { at, .. } if at.elapsed() > REPROBE_AFTER => {
                        *s = ProbeState::Reprobing;
                        true
                    }
                    _ => false,
                });
                if claimed {
                    self.spawn_probe(entry.clone());
                }
            }
        }
        self.view()
    }

    /// Adds a plugin through the API; persisted.
    pub async fn add(&self, config: PluginConfig, enabled: bool) -> Result<(), RegistryError> {
        let _change = self.change.lock().await;
        if self.get(&config.name).is_some() {
            return Err(RegistryError::Exists(config.name));
        }
        self.check(&config)?;
        self.store.put(&config, enabled).await?;
        let mut all = self.current_configs();
        all.push((config, Source::Api, enabled));
        self.install(all);
        Ok(())
    }

    /// Replaces a plugin's definition; persisted.
    pub async fn update(&self, config: PluginConfig) -> Result<(), RegistryError> {
        let _change = self.change.lock().await;
        let old = self
            .get(&config.name)
            .ok_or_else(|| RegistryError::NotFound(config.name.clone()))?;
        self.check(&config)?;
        self.store.put(&config, old.enabled).await?;
        let all = self
            .current_configs()
            .into_iter()
            .map(|(c, s, e)| {
                if c.name == config.name {
                    (config.clone(), Source::Api, e)
                } else {
                    (c, s, e)
                }
            })
            .collect();
        self.install(all);
        Ok(())
    }

    /// Enables or disables a plugin; persisted. A config-file plugin keeps the file's
    /// definition (later edits to the file still apply); only the flag is recorded.
    pub async fn set_enabled(&self, name: &str, enabled: bool) -> Result<(), RegistryError> {
        let _change = self.change.lock().await;
        let old = self
            .get(name)
            .ok_or_else(|| RegistryError::NotFound(name.to_owned()))?;
        match old.source {
            Source::Config => self.store.toggle(name, enabled).await?,
            Source::Api => self.store.put(&old.config, enabled).await?,
        }
        let all = self
            .current_configs()
            .into_iter()
            .map(|(c, s, e)| {
                if c.name == name {
                    (c, s, enabled)
                } else {
                    (c, s, e)
                }
            })
            .collect();
        self.install(all);
        Ok(())
    }

    /// Removes a plugin; persisted (a config-file plugin stays removed across reloads).
    pub async fn remove(&self, name: &str) -> Result<(), RegistryError> {
        let _change = self.change.lock().await;
        self.get(name)
            .ok_or_else(|| RegistryError::NotFound(name.to_owned()))?;
        let in_file = self
            .file_plugins
            .lock()
            .expect("file plugins lock")
            .iter()
            .any(|p| p.name == name);
        if in_file {
            self.store.remove(name).await?;
        } else {
            self.store.forget(name).await?;
        }
        let all = self
            .current_configs()
            .into_iter()
            .filter(|(c, ..)| c.name != name)
            .collect();
        self.install(all);
        Ok(())
    }

    /// Replaces the config file's plugins (a reload), keeping the API overlay.
    pub async fn reload(&self, file_plugins: Vec<PluginConfig>) -> Result<(), RegistryError> {
        let _change = self.change.lock().await;
        let overlay = self.store.load().await?;
        let merged = merge(&file_plugins, &overlay);
        validate_set(&merged, &self.separator)?;
        *self.file_plugins.lock().expect("file plugins lock") = file_plugins;
        self.install(merged);
        Ok(())
    }

    fn check(&self, config: &PluginConfig) -> Result<(), RegistryError> {
        crate::config::validate_plugin(config, &self.separator)
            .map_err(|e| RegistryError::Invalid(e.to_string()))?;
        let prefix = config.prefix.as_deref().unwrap_or(&config.name);
        if let Some(other) = self.entries().iter().find(|e| {
            e.name() != config.name && e.config.prefix.as_deref().unwrap_or(e.name()) == prefix
        }) {
            return Err(RegistryError::Invalid(format!(
                "prefix `{prefix}` is taken by plugin `{}`",
                other.name()
            )));
        }
        Ok(())
    }

    fn current_configs(&self) -> Vec<(PluginConfig, Source, bool)> {
        self.entries()
            .iter()
            .map(|e| (e.config.clone(), e.source, e.enabled))
            .collect()
    }

    /// Makes `configs` the registry: unchanged plugins keep their entry (and probe), changed
    /// and new ones get a new generation and a probe.
    fn install(&self, configs: Vec<(PluginConfig, Source, bool)>) {
        let old = self.entries();
        let mut next = Vec::with_capacity(configs.len());
        let mut probe = Vec::new();
        for (config, source, enabled) in configs {
            // Unchanged: the same entry, its probe and its sessions' instances carry on.
            match old
                .iter()
                .find(|e| e.config == config && e.enabled == enabled && e.source == source)
            {
                Some(e) => next.push(e.clone()),
                None => {
                    let stats = old
                        .iter()
                        .find(|e| e.name() == config.name)
                        .map(|e| e.stats.clone())
                        .unwrap_or_default();
                    let entry = Arc::new(PluginEntry {
                        config,
                        source,
                        enabled,
                        generation: self.generation.fetch_add(1, Ordering::Relaxed),
                        state: watch::Sender::new(ProbeState::Pending),
                        stats,
                    });
                    if enabled {
                        probe.push(entry.clone());
                    }
                    next.push(entry);
                }
            }
        }
        *self.entries.write().expect("entries lock") = next;
        self.publish();
        for entry in probe {
            self.spawn_probe(entry);
        }
    }

    /// Rebuilds the view and tells the listener. Serialized: the snapshot, the view and the
    /// listener's call happen together, so an older view never replaces a newer one.
    fn publish(&self) {
        let _publishing = self.publishing.lock().expect("publish lock");
        let entries = self.entries();
        let enabled = entries.iter().filter(|e| e.enabled).count();
        let plugins = entries
            .iter()
            .filter(|e| e.enabled)
            .filter_map(|e| match e.state() {
                ProbeState::Ready(info) => Some(ViewPlugin {
                    entry: e.clone(),
                    info,
                    prefix: match (&e.config.prefix, enabled) {
                        (Some(p), _) => Some(p.clone()),
                        (None, 1) => None,
                        (None, _) => Some(e.name().to_owned()),
                    },
                }),
                _ => None,
            })
            .collect();
        let view = Arc::new(View {
            plugins,
            separator: self.separator.clone(),
            initialize: OnceLock::new(),
        });
        *self.view.write().expect("view lock") = view.clone();
        if let Some(f) = self.listener.lock().expect("listener lock").as_ref() {
            f(&view);
        }
    }

    fn spawn_probe(&self, entry: Arc<PluginEntry>) {
        let me = self.me.clone();
        tokio::spawn(async move {
            let state = probe(&entry).await;
            entry.state.send_replace(state);
            if let Some(registry) = me.upgrade() {
                // Only if the entry is still the registry's (not replaced meanwhile).
                if registry.entries().iter().any(|e| Arc::ptr_eq(e, &entry)) {
                    registry.publish();
                }
            }
        });
    }
}

/// Every plugin's definition valid, and no prefix used twice.
fn validate_set(
    set: &[(PluginConfig, Source, bool)],
    separator: &str,
) -> Result<(), RegistryError> {
    let mut prefixes = std::collections::HashMap::new();
    for (c, ..) in set {
        crate::config::validate_plugin(c, separator)
            .map_err(|e| RegistryError::Invalid(e.to_string()))?;
        let prefix = c.prefix.as_deref().unwrap_or(&c.name);
        if let Some(other) = prefixes.insert(prefix.to_owned(), c.name.clone()) {
            return Err(RegistryError::Invalid(format!(
                "plugins `{other}` and `{}` would both use the prefix `{prefix}`",
                c.name
            )));
        }
    }
    Ok(())
}

/// The config file's plugins with the API overlay applied: definitions replace or add,
/// toggles enable or disable, removals remove.
fn merge(
    file: &[PluginConfig],
    overlay: &BTreeMap<String, Overlay>,
) -> Vec<(PluginConfig, Source, bool)> {
    let mut out: Vec<(PluginConfig, Source, bool)> = file
        .iter()
        .filter_map(|p| match overlay.get(&p.name) {
            None => Some((p.clone(), Source::Config, true)),
            Some(Overlay::Toggle { enabled }) => Some((p.clone(), Source::Config, *enabled)),
            Some(_) => None,
        })
        .collect();
    for o in overlay.values() {
        if let Overlay::Put { config, enabled } = o {
            out.push(((**config).clone(), Source::Api, *enabled));
        }
    }
    out
}

/// The `initialize` params the gateway sends on its own behalf.
pub fn gateway_init_params() -> Box<RawValue> {
    let params = serde_json::json!({
        "protocolVersion": protocol::LATEST,
        "capabilities": { "roots": { "listChanged": true }, "sampling": {}, "elicitation": {} },
        "clientInfo": { "name": "mcp-gateway", "version": env!("CARGO_PKG_VERSION") },
    });
    RawValue::from_string(params.to_string()).expect("valid JSON")
}

async fn probe(entry: &PluginEntry) -> ProbeState {
    let started = Instant::now();
    let result = start_plugin(
        &entry.config,
        Arc::from("probe"),
        &gateway_init_params(),
        None,
    )
    .await;
    match result {
        Ok(conn) => {
            let init = conn.info().expect("initialized");
            let capabilities: serde_json::Value =
                serde_json::from_str(init.capabilities.get()).unwrap_or_default();
            let tools = if capabilities.get("tools").is_some() {
                match tokio::time::timeout(
                    entry.config.startup_timeout,
                    conn.call("tools/list", None),
                )
                .await
                {
                    Ok(Ok(raw)) => serde_json::from_str::<serde_json::Value>(raw.get())
                        .ok()
                        .and_then(|v| {
                            let tools = v.get("tools")?.as_array()?;
                            Some(
                                tools
                                    .iter()
                                    .filter_map(|t| t.get("name")?.as_str())
                                    .filter(|n| entry.config.allows_tool(n))
                                    .count(),
                            )
                        })
                        .unwrap_or(0),
                    _ => 0,
                }
            } else {
                0
            };
            let info = PluginInfo {
                protocol_version: init.protocol_version.clone(),
                capabilities,
                server_info: init.server_info.clone(),
                instructions: init.instructions.clone(),
                tools,
            };
            conn.shutdown().await;
            tracing::info!(
                plugin = %entry.name(),
                version = %info.protocol_version,
                tools,
                "plugin probed in {} ms",
                started.elapsed().as_millis()
            );
            ProbeState::Ready(Arc::new(info))
        }
        Err(e) => {
            tracing::error!(plugin = %entry.name(), command = %entry.config.command_line(), "{e}; its tools are absent until it starts");
            *entry.stats.last_error.lock().expect("stats lock") = Some(e.to_string());
            ProbeState::Failed {
                error: e.to_string(),
                summary: e.client_message(),
                at: Instant::now(),
            }
        }
    }
}
