//! Where registry changes made through the admin API are kept: the seam is [`PluginStore`].
//! The SQL implementation (`SqlPluginStore`: SQLite by default, PostgreSQL when
//! `database_url` says so) lives in the `database` module, which opens and migrates the
//! database and lends the store to the registry; [`MemoryPluginStore`] keeps the overlay in
//! memory (tests, and running without a database). This module never opens a database or
//! speaks SQL.
//!
//! The store holds an overlay on the config file's plugins, one row per plugin name: a
//! definition (added or changed through the API, enabled or not) or a removal.
//!
//! Replicas that share the database share the overlay; [`ChangeFeed`] is how one tells the
//! others that it changed (cluster mode implements it on Redis), so each re-reads it.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use crate::config::PluginConfig;

/// The API's change to one plugin.
#[derive(Debug, Clone)]
pub enum Overlay {
    /// A definition from the API (a new plugin, or a config-file one replaced).
    Put {
        config: Box<PluginConfig>,
        enabled: bool,
    },
    /// A config-file plugin enabled or disabled: its definition stays the file's.
    Toggle { enabled: bool },
    /// A config-file plugin removed.
    Removed,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(String),
    #[error("a stored plugin `{name}` is unreadable: {reason}")]
    Corrupt { name: String, reason: String },
}

/// What every [`PluginStore`] call returns: a boxed future, so the trait stays object-safe.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

pub trait PluginStore: Send + Sync + 'static {
    /// Every overlay row, by plugin name.
    fn load(&self) -> StoreFuture<'_, BTreeMap<String, Overlay>>;
    /// Records a plugin's definition.
    fn put<'a>(&'a self, config: &'a PluginConfig, enabled: bool) -> StoreFuture<'a, ()>;
    /// Records a config-file plugin's enabled flag.
    fn toggle<'a>(&'a self, name: &'a str, enabled: bool) -> StoreFuture<'a, ()>;
    /// Records a config-file plugin's removal.
    fn remove<'a>(&'a self, name: &'a str) -> StoreFuture<'a, ()>;
    /// Forgets whatever is recorded for a name (an API plugin removed).
    fn forget<'a>(&'a self, name: &'a str) -> StoreFuture<'a, ()>;
    /// Whether the database answers (readiness).
    fn ping(&self) -> StoreFuture<'_, ()>;
}

/// A store that keeps the overlay in memory only (changes are lost at exit): for tests and
/// for running without a database.
#[derive(Default)]
pub struct MemoryPluginStore(std::sync::Mutex<BTreeMap<String, Overlay>>);

impl PluginStore for MemoryPluginStore {
    fn load(&self) -> StoreFuture<'_, BTreeMap<String, Overlay>> {
        let all = self.0.lock().expect("store lock").clone();
        Box::pin(std::future::ready(Ok(all)))
    }

    fn put<'a>(&'a self, config: &'a PluginConfig, enabled: bool) -> StoreFuture<'a, ()> {
        let put = Overlay::Put {
            config: Box::new(config.clone()),
            enabled,
        };
        self.0
            .lock()
            .expect("store lock")
            .insert(config.name.clone(), put);
        Box::pin(std::future::ready(Ok(())))
    }

    fn remove<'a>(&'a self, name: &'a str) -> StoreFuture<'a, ()> {
        self.0
            .lock()
            .expect("store lock")
            .insert(name.to_owned(), Overlay::Removed);
        Box::pin(std::future::ready(Ok(())))
    }

    fn toggle<'a>(&'a self, name: &'a str, enabled: bool) -> StoreFuture<'a, ()> {
        self.0
            .lock()
            .expect("store lock")
            .insert(name.to_owned(), Overlay::Toggle { enabled });
        Box::pin(std::future::ready(Ok(())))
    }

    fn forget<'a>(&'a self, name: &'a str) -> StoreFuture<'a, ()> {
        self.0.lock().expect("store lock").remove(name);
        Box::pin(std::future::ready(Ok(())))
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(std::future::ready(Ok(())))
    }
}

/// Tells the other replicas that the overlay changed (after the store has it), so each
/// re-reads it ([`super::Registry::refresh`]).
pub trait ChangeFeed: Send + Sync + 'static {
    /// Best effort: a failure is the implementation's to log and count; the others then see
    /// the change when they next re-read the overlay.
    fn announce(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}
