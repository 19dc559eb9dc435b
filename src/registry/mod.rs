//! The plugin registry: every plugin the gateway knows, from the config file and from the
//! admin API (persisted by a [`store::PluginStore`]), and what each said of itself when probed.
//!
//! The registry is the only place plugins are added, changed or removed. Readers take a
//! [`View`]: an immutable snapshot of the usable plugins (enabled, probed) with their name
//! prefixes, rebuilt on every change, so a request is routed against one consistent picture
//! even while an operator edits the registry. A change runs the registered listener (the
//! gateway tells sessions, which stop instances of plugins that went away and notify clients).
//!
//! Each plugin is probed once, when it appears or changes (`probe.rs`): started, initialized
//! with the gateway's own client capabilities, asked for its tools, and stopped. A client's
//! `initialize` is answered from these answers; a session gets its own instance only when it
//! first uses the plugin.
//!
//! - `entry.rs`: one plugin, its probe state, and the record of its processes ([`PluginStats`]).
//! - `view.rs`: the snapshot readers take.
//! - `probe.rs`: the start-up probe and the `initialize` params the gateway sends for itself.
//! - [`store`] (`store.rs`): where the admin API's changes are persisted, and the
//!   [`store::ChangeFeed`] that tells other replicas sharing the store that it changed
//!   (each then [`Registry::refresh`]es from it).
//!
//! The registry says which plugins exist; it never runs one for a client. Plugin processes
//! (starting them under the limits, restarting with backoff, the crash breaker, shared and
//! warm pools) are the supervisor's: [`crate::supervisor`].

mod entry;
mod probe;
pub mod store;

#[cfg(test)]
mod tests;
mod view;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use tokio::sync::watch;

pub use entry::{PluginEntry, PluginInfo, PluginStats, ProbeState, Source};
pub use probe::gateway_init_params;
use probe::{REPROBE_AFTER, probe};
use store::{ChangeFeed, Overlay, PluginStore, StoreError};
pub use view::{View, ViewPlugin};

use crate::config::{Config, PluginConfig};

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
    /// The credentials defined (`[credentials.NAME]`, and the admin API's): a plugin may use
    /// only these.
    credentials: RwLock<Arc<[String]>>,
    generation: AtomicU64,
    listener: Mutex<Option<Listener>>,
    /// Serializes publishing views.
    publishing: Mutex<()>,
    /// Serializes changes (API calls, reloads), so each is applied whole.
    change: tokio::sync::Mutex<()>,
    /// Cluster mode: told of every API change, for the other replicas.
    feed: OnceLock<Arc<dyn ChangeFeed>>,
    me: std::sync::Weak<Registry>,
    /// The gateway-wide part of every plugin's sandbox.
    sandbox: Arc<crate::config::SandboxSettings>,
}

impl Registry {
    /// The credentials plugins may use now.
    pub fn credential_names(&self) -> Arc<[String]> {
        self.credentials.read().expect("credentials lock").clone()
    }

    /// The credentials defined changed (the admin API, or another replica's).
    pub fn set_credential_names(&self, names: Vec<String>) {
        *self.credentials.write().expect("credentials lock") = names.into();
    }

    /// The registry for `config`, with the overlay the store holds applied.
    pub async fn load(
        config: &Config,
        store: Arc<dyn PluginStore>,
    ) -> Result<Arc<Registry>, RegistryError> {
        let overlay = store.load().await?;
        validate_set(
            &merge(&config.plugins, &overlay),
            &config.separator,
            &config.credentials.names(),
        )
        .map_err(|e| {
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
                eager: false,
            })),
            file_plugins: Mutex::new(config.plugins.clone()),
            store,
            separator: Arc::from(config.separator.as_str()),
            credentials: RwLock::new(config.credentials.names().into()),
            generation: AtomicU64::new(1),
            listener: Mutex::new(None),
            publishing: Mutex::new(()),
            change: tokio::sync::Mutex::new(()),
            feed: OnceLock::new(),
            me: me.clone(),
            sandbox: config.sandbox.clone(),
        });
        registry.install(merge(&config.plugins, overlay), None);
        registry
    }

    /// From now on, every change made through the API is announced on `feed` (once set, it
    /// stays).
    pub fn set_feed(&self, feed: Arc<dyn ChangeFeed>) {
        let _ = self.feed.set(feed);
    }

    /// Tells the other replicas of an API change, when there is a feed.
    async fn announce(&self) {
        if let Some(feed) = self.feed.get() {
            feed.announce().await;
        }
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
        // Every probe done, none failed (to be made again): nothing to wait for, no timer.
        // Under the lock a probe publishes its state and view under.
        {
            let _publishing = self.publishing.lock().expect("publish lock");
            let settled = self
                .entries
                .read()
                .expect("entries lock")
                .iter()
                .filter(|e| e.enabled)
                .all(|e| matches!(*e.state.borrow(), ProbeState::Ready(_)));
            if settled {
                return self.view();
            }
        }
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
        // A probe that just ended publishes its view under this lock (see `spawn_probe`).
        let _publishing = self.publishing.lock().expect("publish lock");
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
        self.install(all, None);
        self.announce().await;
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
        self.install(all, None);
        self.announce().await;
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
        self.install(all, None);
        self.announce().await;
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
        self.install(all, None);
        self.announce().await;
        Ok(())
    }

    /// Restarts a plugin on this replica: its entry is replaced by an equal one, so its
    /// processes (shared, warm and every session's) stop and the next request that needs one
    /// starts it again, after a new probe. Nothing is stored: the definition is unchanged.
    pub async fn restart(&self, name: &str) -> Result<(), RegistryError> {
        let _change = self.change.lock().await;
        let old = self
            .get(name)
            .ok_or_else(|| RegistryError::NotFound(name.to_owned()))?;
        if !old.enabled {
            return Err(RegistryError::Invalid(format!(
                "plugin '{name}' is disabled: enable it instead"
            )));
        }
        self.install(self.current_configs(), Some(name));
        Ok(())
    }

    /// Replaces the config file's plugins (a reload), keeping the API overlay.
    pub async fn reload(&self, file_plugins: Vec<PluginConfig>) -> Result<(), RegistryError> {
        let _change = self.change.lock().await;
        let overlay = self.store.load().await?;
        let merged = merge(&file_plugins, &overlay);
        validate_set(&merged, &self.separator, &self.credential_names())?;
        *self.file_plugins.lock().expect("file plugins lock") = file_plugins;
        self.install(merged, None);
        Ok(())
    }

    /// Re-reads the API overlay from the store (another replica sharing it changed it) and
    /// applies it to the config file's plugins; whether anything changed. Nothing changes,
    /// and no session is told, when the overlay is what this replica applies already; a
    /// set that would be invalid here (this replica's config file conflicts with it) is
    /// refused and the registry stays as it was.
    pub async fn refresh(&self) -> Result<bool, RegistryError> {
        let _change = self.change.lock().await;
        let overlay = self.store.load().await?;
        let file_plugins = self.file_plugins.lock().expect("file plugins lock").clone();
        let merged = merge(&file_plugins, &overlay);
        validate_set(&merged, &self.separator, &self.credential_names())?;
        if same_set(&merged, &self.current_configs()) {
            return Ok(false);
        }
        self.install(merged, None);
        Ok(true)
    }

    fn check(&self, config: &PluginConfig) -> Result<(), RegistryError> {
        crate::config::validate_plugin(config, &self.separator, &self.credential_names())
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
    /// Installs `configs`; an unchanged plugin keeps its entry, except `fresh`, which gets a
    /// new one (a restart).
    fn install(&self, mut configs: Vec<(PluginConfig, Source, bool)>, fresh: Option<&str>) {
        let uids = sandbox_uids(&self.sandbox, configs.iter().map(|c| c.0.name.as_str()));
        for (config, _, _) in &mut configs {
            config.host = self.sandbox.clone();
            config.uid = uids.get(&config.name).copied();
        }
        let old = self.entries();
        let mut next = Vec::with_capacity(configs.len());
        let mut probe = Vec::new();
        for (config, source, enabled) in configs {
            // Unchanged: the same entry, its probe and its sessions' instances carry on.
            match old.iter().find(|e| {
                e.config == config
                    && e.enabled == enabled
                    && e.source == source
                    && fresh != Some(e.name())
            }) {
                Some(e) => next.push(e.clone()),
                None => {
                    let stats = old
                        .iter()
                        .find(|e| e.name() == config.name)
                        .map(|e| e.stats.clone())
                        .unwrap_or_default();
                    let credentials = crate::config::credentials_used(&config)
                        .into_iter()
                        .collect::<Vec<_>>()
                        .join(",")
                        .into();
                    let entry = Arc::new(PluginEntry {
                        config,
                        source,
                        enabled,
                        generation: self.generation.fetch_add(1, Ordering::Relaxed),
                        state: watch::Sender::new(ProbeState::Pending),
                        stats,
                        credentials,
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
        self.publish_locked();
    }

    /// [`Registry::publish`], the publish lock held by the caller.
    fn publish_locked(&self) {
        let entries = self.entries();
        let enabled = entries.iter().filter(|e| e.enabled).count();
        let plugins: Vec<ViewPlugin> = entries
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
                    denied_tools: Arc::from([]),
                }),
                _ => None,
            })
            .collect();
        let view = Arc::new(View {
            eager: view::any_eager(&plugins),
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
            let Some(registry) = me.upgrade() else {
                entry.state.send_replace(state);
                return;
            };
            // The state and the view that follows from it change under one lock, which
            // `ready` takes before it reads the view: a request woken by the new state never
            // reads the view from before it (without the plugin's tools).
            let _publishing = registry.publishing.lock().expect("publish lock");
            entry.state.send_replace(state);
            // Only if the entry is still the registry's (not replaced meanwhile).
            if registry.entries().iter().any(|e| Arc::ptr_eq(e, &entry)) {
                registry.publish_locked();
            }
        });
    }
}

/// Every plugin's definition valid, and no prefix used twice.
fn validate_set(
    set: &[(PluginConfig, Source, bool)],
    separator: &str,
    credentials: &[String],
) -> Result<(), RegistryError> {
    let mut prefixes = std::collections::HashMap::new();
    for (c, ..) in set {
        crate::config::validate_plugin(c, separator, credentials)
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

/// Whether two sets of plugins are the same, whatever their order.
fn same_set(a: &[(PluginConfig, Source, bool)], b: &[(PluginConfig, Source, bool)]) -> bool {
    a.len() == b.len()
        && a.iter().all(|(c, s, e)| {
            b.iter()
                .any(|(c2, s2, e2)| c2.name == c.name && c2 == c && s2 == s && e2 == e)
        })
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

/// Each plugin's user id from `sandbox.uid_range`: where its name hashes, or the next one free
/// (taken in name order, so the same set of plugins gets the same ids on every start).
fn sandbox_uids<'a>(
    settings: &crate::config::SandboxSettings,
    names: impl Iterator<Item = &'a str>,
) -> std::collections::HashMap<String, u32> {
    let mut out = std::collections::HashMap::new();
    let Some((first, last)) = settings.uid_range else {
        return out;
    };
    let size = u64::from(last - first) + 1;
    let mut names: Vec<&str> = names.collect();
    names.sort_unstable();
    names.dedup();
    let mut taken = std::collections::HashSet::new();
    for name in names {
        // FNV-1a: stable across builds and machines.
        let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        let mut slot = hash % size;
        for _ in 0..size {
            if taken.insert(slot) {
                out.insert(name.to_owned(), first + slot as u32);
                break;
            }
            slot = (slot + 1) % size;
        }
    }
    out
}
