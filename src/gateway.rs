//! The gateway's shared state, and its lifetime: open the database and the registry, start
//! the idle reaper and the admin API, serve until told to stop, then end every session and wait
//! for every plugin to be gone.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::Auth;
use crate::auth::store::AuthStoreError;
use crate::config::{Config, ConfigError};
use crate::http;
use crate::registry::store::{PluginStore, SqlPluginStore, StoreError};
use crate::registry::{Registry, RegistryError};
use crate::session::SessionManager;
use crate::stream::{EventStore, MemoryEventStore, ResumeCounters};

/// Re-reads the configuration (a reload: SIGHUP or `POST /admin/reload`).
pub type Reloader = Box<dyn Fn() -> Result<Config, ConfigError> + Send + Sync>;

/// Everything a request handler needs.
pub struct Gateway {
    pub config: Config,
    pub auth: Arc<Auth>,
    pub registry: Arc<Registry>,
    pub plugin_store: Arc<dyn PluginStore>,
    pub sessions: Arc<SessionManager>,
    pub guard: http::checks::Guard,
    /// How resumptions went, for metrics.
    pub resume: ResumeCounters,
    /// Cancelled when the gateway stops: sessions' streams close.
    pub shutdown: CancellationToken,
    reloader: Option<Reloader>,
}

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("authorization: {0}")]
    Auth(#[from] AuthStoreError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("cannot listen for the admin API on {addr}: {source}")]
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
        let sql = SqlPluginStore::connect(&config.database_url).await?;
        let pool = sql.pool();
        let plugin_store: Arc<dyn PluginStore> = Arc::new(sql);
        let registry = Registry::load(&config, plugin_store.clone()).await?;
        let auth = Arc::new(Auth::new(config.auth.clone(), pool).await?);
        if let Some(server) = &auth.server {
            let r = registry.clone();
            server.set_scope_source(Box::new(move || {
                r.entries()
                    .iter()
                    .filter_map(|p| p.config.scope.clone())
                    .collect()
            }));
        }
        let store: Arc<dyn EventStore> = Arc::new(MemoryEventStore::new(config.replay.clone()));
        let sessions = SessionManager::new(
            config.session.clone(),
            store,
            config.stream.clone(),
            config.replay.max_age,
            registry.clone(),
        );
        let s = Arc::downgrade(&sessions);
        registry.on_change(move |view| {
            if let Some(s) = s.upgrade() {
                s.registry_changed(view);
            }
        });
        // Pools for what the registry holds already (warm processes start now).
        sessions.registry_changed(&registry.view());
        Ok(Arc::new(Gateway {
            auth,
            registry,
            plugin_store,
            sessions,
            guard: http::checks::Guard::new(&config),
            resume: ResumeCounters::default(),
            shutdown: CancellationToken::new(),
            reloader,
            config,
        }))
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

/// Serves on `listener` until `shutdown` resolves, then stops every plugin.
pub async fn run(
    listener: TcpListener,
    config: Config,
    reloader: Option<Reloader>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    let gateway = Gateway::new(config, reloader).await?;
    tokio::spawn(gateway.sessions.clone().reap_idle(gateway.shutdown.clone()));
    spawn_reload_on_hangup(gateway.clone());
    if let Some(server) = &gateway.auth.server {
        tokio::spawn(server.clone().purge_expired(gateway.shutdown.clone()));
    }
    if gateway.config.admin.token.is_some() {
        let addr = gateway.config.admin.listen;
        let admin = TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::AdminListen { addr, source })?;
        tracing::info!("admin API listening on http://{}", admin.local_addr()?);
        let app = crate::admin::router(gateway.clone());
        let admin = admin.tap_io(no_delay);
        let stop = gateway.shutdown.clone();
        tokio::spawn(async move {
            let _ = axum::serve(admin, app)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await;
        });
    } else {
        tracing::info!("admin API off (no admin token configured)");
    }

    let token = gateway.shutdown.clone();
    let app = http::router(gateway.clone());
    // SSE goes out in several small writes: without TCP_NODELAY, Nagle's algorithm and the
    // client's delayed ACK hold each answer back by tens of milliseconds.
    let listener = listener.tap_io(no_delay);
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            tracing::info!("shutting down: closing streams and stopping plugins");
            token.cancel();
        })
        .await;
    gateway.shutdown.cancel();
    gateway.sessions.shutdown().await;
    tracing::info!("stopped");
    Ok(served?)
}

fn no_delay(tcp: &mut tokio::net::TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!("TCP_NODELAY: {e}");
    }
}

fn spawn_reload_on_hangup(gateway: Arc<Gateway>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hangup) = signal(SignalKind::hangup()) else {
        return;
    };
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = hangup.recv() => {
                    tracing::info!("SIGHUP: reloading the configuration");
                    let _ = gateway.reload().await;
                }
                () = gateway.shutdown.cancelled() => return,
            }
        }
    });
}
