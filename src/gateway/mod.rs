//! The gateway's shared state: the config, the registry of plugins, the sessions, authorization
//! and the tokens that mark a stop. [`Gateway::new`] assembles it (opening the database and
//! the registry); the listeners that serve it, and its lifetime, are in [`crate::server`].
//!
//! It sits below the HTTP edge and the admin listener, which both hold it as their state; it
//! must never import them.

mod credentials;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_util::sync::CancellationToken;

use crate::audit::Auditor;
use crate::auth::Auth;
use crate::auth::store::AuthStoreError;
use crate::cluster::{Cluster, ClusterError};
use crate::config::{Config, ConfigError};
use crate::database::{Database, DatabaseError, secrets};
use crate::protocol::mrtr::StateKey;
use crate::registry::store::PluginStore;
use crate::registry::{Registry, RegistryError};
use crate::session::{ParkedCalls, SessionManager, SessionStore};
use crate::stream::{EventStore, MemoryEventStore, RedisEventStore};
use crate::supervisor::Supervisor;

/// Re-reads the configuration (a reload: SIGHUP or `POST /admin/reload`).
pub type Reloader = Box<dyn Fn() -> Result<Config, ConfigError> + Send + Sync>;

/// Everything a request handler needs.
pub struct Gateway {
    pub config: Config,
    pub auth: Arc<Auth>,
    pub registry: Arc<Registry>,
    pub plugin_store: Arc<dyn PluginStore>,
    pub sessions: Arc<SessionManager>,
    /// Cluster mode: the Redis the replicas share, this replica's heartbeat, forwarding to a
    /// session's owner. `None` on a replica of its own.
    pub cluster: Option<Arc<Cluster>>,
    /// Modern clients' calls parked for the input a plugin asked for, and the key their
    /// `requestState` is sealed with (the same on every replica: it is kept in the database).
    pub parked: Arc<ParkedCalls>,
    /// `[limits]`: the rate limits on calls and their buckets (shared through Redis in a
    /// cluster). Set at start; a reload does not change them.
    pub limits: Arc<crate::limits::RateLimits>,
    /// `[audit]`: the audit log (a record per call and admin action).
    pub audit: Arc<Auditor>,
    /// Cancelled when the gateway stops: sessions' streams close.
    pub shutdown: CancellationToken,
    /// Cancelled when a stop begins: readiness fails, the public listener stops accepting,
    /// GET streams are told to reconnect elsewhere; requests in flight go on.
    pub draining: CancellationToken,
    /// Set once the public listener serves.
    serving: AtomicBool,
    reloader: Option<Reloader>,
}

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Database(#[from] DatabaseError),
    #[error("authorization: {0}")]
    Auth(#[from] AuthStoreError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("cluster mode: {0}")]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("the admin listener cannot listen on {addr}: {source}")]
    AdminListen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Why a reload was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("reloading is not available: the gateway was started without a config source")]
    Unavailable,
    #[error("the new config is invalid, nothing changed: {0}")]
    Invalid(#[from] ConfigError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

impl Gateway {
    /// Opens the database (running its migrations) and the registry.
    pub async fn new(
        config: Config,
        reloader: Option<Reloader>,
    ) -> Result<Arc<Gateway>, StartError> {
        let bound = config.listen;
        Gateway::serving_at(config, reloader, bound).await
    }

    /// [`Gateway::new`] for a public listener bound to `bound` (its real port, when the
    /// config asked for port 0): what the cluster's other replicas are told.
    pub async fn serving_at(
        config: Config,
        reloader: Option<Reloader>,
        bound: SocketAddr,
    ) -> Result<Arc<Gateway>, StartError> {
        let database = Database::connect(&config.database_url).await?;
        let cluster = match &config.cluster {
            Some(c) => Some(Cluster::connect(c, c.advertise(bound)?).await?),
            None => None,
        };
        let state_key = database.shared_secret(secrets::REQUEST_STATE_KEY).await?;
        let audit_key = database.shared_secret(secrets::AUDIT_KEY).await?;
        let replica: Arc<str> = match &cluster {
            Some(c) => c.replica().clone(),
            None => Arc::from(format!("{:016x}", rand::random::<u64>())),
        };
        let parked = Arc::new(ParkedCalls::new(
            StateKey::new(&state_key),
            replica.clone(),
            config.session.input_timeout,
        ));
        // People's credentials, with a storage key: the config file's, and the admin API's
        // from the database (before the registry, whose plugins may use them). The connect
        // page is on the public listener, at its origin.
        let broker = match (&config.credentials.keys.current, &config.auth.public_url) {
            (Some(_), Some(public)) if config.auth.mode != crate::config::AuthMode::None => {
                let b = crate::credentials::Broker::new(
                    config.credentials.clone(),
                    database.credential_store(),
                    &public.origin().ascii_serialization(),
                );
                if let Err(e) = b.reload_definitions().await {
                    tracing::warn!(
                        "the credentials defined through the admin API were not read: {e}"
                    );
                }
                Some(b)
            }
            _ => None,
        };
        let mut config = config;
        if let Some(b) = &broker {
            config.credentials.credentials =
                b.definitions().iter().map(|c| (**c).clone()).collect();
        }
        let plugin_store = database.plugin_store();
        let registry = Registry::load(&config, plugin_store.clone()).await?;
        // In a cluster, revocations are heard by every replica at once and registrations are
        // counted across replicas.
        let shared = cluster
            .as_ref()
            .map(|c| c.auth_shared())
            .unwrap_or_default();
        let auth =
            Arc::new(Auth::with_shared(config.auth.clone(), database.auth_store(), shared).await?);
        if let Some(server) = &auth.server {
            let r = registry.clone();
            server.set_scope_source(Box::new(move || {
                r.entries()
                    .iter()
                    .filter_map(|p| p.config.scope.clone())
                    .collect()
            }));
        }
        // In a cluster, replay events are also written through to Redis, where a replica that
        // takes a session over finds them.
        let store: Arc<dyn EventStore> = match &cluster {
            Some(c) => RedisEventStore::new(
                c.events_connection(),
                c.key_prefix().to_owned(),
                c.session_names(),
                config.replay.clone(),
            ),
            None => Arc::new(MemoryEventStore::new(config.replay.clone())),
        };
        let supervisor = Supervisor::new(registry.clone(), config.max_children);
        if let Some(broker) = &broker {
            // A token_exchange credential in built-in mode exchanges the token people's
            // sign-in at the [auth.upstream] provider gave (kept only while one is defined).
            if let Some(server) = &auth.server {
                server.keep_provider_tokens(Arc::new(crate::credentials::ProviderTokenKeeper(
                    broker.clone(),
                )));
            }
            supervisor.use_credentials(broker.clone());
        }
        let sessions = SessionManager::new(
            config.session.clone(),
            store,
            // One replica: the live sessions are the whole record. In a cluster, the
            // records the replicas share name each session's owner.
            cluster.as_ref().map(|c| {
                let store = c.session_store(config.session.idle_timeout);
                Arc::new(store) as Arc<dyn SessionStore>
            }),
            config.stream.clone(),
            config.replay.max_age,
            supervisor,
        );
        let s = Arc::downgrade(&sessions);
        registry.on_change(move |view| {
            if let Some(s) = s.upgrade() {
                s.registry_changed(view);
            }
        });
        // Pools for what the registry holds already (warm processes start now).
        sessions.registry_changed(&registry.view());
        let shutdown = CancellationToken::new();
        let audit = Auditor::start(
            config.audit.clone(),
            audit_key,
            replica,
            database.audit_store(),
            shutdown.clone(),
        );
        if let Some(c) = &cluster {
            // The key of modern clients' `requestState` is always stored there.
            if config.database_url.starts_with("sqlite") {
                tracing::warn!(
                    "cluster mode on SQLite: unless every replica opens the same database file, admin API changes, signing keys, revocations and the key of modern clients' requestState stay on the replica that made them (use PostgreSQL)"
                );
            }
            // The admin API's changes reach the other replicas, which re-read the overlay
            // from the database they share; and this replica hears theirs.
            registry.set_feed(c.registry_feed());
            let keys = auth.server.as_ref().map(|s| s.keys.clone());
            c.listen(keys, &registry, shutdown.clone());
        }
        let limits = Arc::new(crate::limits::RateLimits::new(
            &config.limits,
            cluster.as_ref().map(|c| c.rate_buckets()),
        ));
        let gateway = Arc::new(Gateway {
            auth,
            limits,
            audit,
            registry,
            plugin_store,
            sessions,
            cluster,
            parked,
            shutdown,
            draining: CancellationToken::new(),
            serving: AtomicBool::new(false),
            reloader,
            config,
        });
        credentials::watch(&gateway);
        Ok(gateway)
    }

    /// Marks the public listener as serving (readiness may pass).
    pub fn mark_serving(&self) {
        self.serving.store(true, Ordering::Release);
    }

    /// Whether the public listener is serving.
    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::Acquire)
    }

    /// Whether a stop has begun.
    pub fn is_draining(&self) -> bool {
        self.draining.is_cancelled()
    }

    /// How long a client's `initialize` waits for plugin probes still running.
    pub fn probe_wait(&self) -> std::time::Duration {
        self.registry
            .entries()
            .iter()
            .map(|p| p.config.startup_timeout)
            .max()
            .unwrap_or_default()
    }

    /// Re-reads the config file and applies its plugins; an invalid config changes nothing.
    pub async fn reload(&self) -> Result<(), ReloadError> {
        let reloader = self.reloader.as_ref().ok_or(ReloadError::Unavailable)?;
        let config = reloader().inspect_err(|e| tracing::error!("reload refused: {e}"))?;
        self.registry.reload(config.plugins).await?;
        tracing::info!("configuration reloaded");
        Ok(())
    }
}
