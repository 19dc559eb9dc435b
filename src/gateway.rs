//! The gateway's shared state, and its lifetime: open the database and the registry, start
//! the idle reaper and the admin listener, serve until told to stop, drain within a grace
//! period, then end every session and wait for every plugin to be gone.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::Auth;
use crate::auth::store::AuthStoreError;
use crate::config::{Config, ConfigError};
use crate::database::{Database, DatabaseError};
use crate::http;
use crate::registry::store::PluginStore;
use crate::registry::{Registry, RegistryError};
use crate::session::SessionManager;
use crate::stream::{EventStore, MemoryEventStore};

/// Most connections the admin listener holds at once: probes and scrapes need few, and a
/// flood of them must not take the descriptors the public listener and the plugins use.
const ADMIN_MAX_CONNECTIONS: usize = 256;

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
        let database = Database::connect(&config.database_url).await?;
        let plugin_store = database.plugin_store();
        let registry = Registry::load(&config, plugin_store.clone()).await?;
        let auth = Arc::new(Auth::new(config.auth.clone(), database.auth_store()).await?);
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
            shutdown: CancellationToken::new(),
            draining: CancellationToken::new(),
            serving: AtomicBool::new(false),
            reloader,
            config,
        }))
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

/// Serves on `listener` until `shutdown` resolves, then stops in order: readiness fails and
/// no new connection is accepted; GET streams are told to reconnect (`retry:`) and closed;
/// requests in flight get up to `shutdown_grace` to finish; whatever is left is closed; then
/// every plugin is stopped (stdin close, SIGTERM, SIGKILL) and waited for.
pub async fn run(
    listener: TcpListener,
    config: Config,
    reloader: Option<Reloader>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    // Both ports are taken before the database opens and plugins are probed: a port in use
    // fails the start at once.
    let addr = config.admin.listen;
    let admin = TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::AdminListen { addr, source })?;
    let gateway = Gateway::new(config, reloader).await?;
    let admin_addr = admin.local_addr()?;
    let public_addr = listener.local_addr()?;

    tokio::spawn(gateway.sessions.clone().reap_idle(gateway.shutdown.clone()));
    spawn_reload_on_hangup(gateway.clone());
    if let Some(server) = &gateway.auth.server {
        tokio::spawn(server.clone().maintain(gateway.shutdown.clone()));
    }
    // The admin listener outlives the drain: probes see "not ready" and Prometheus can scrape
    // until the gateway has stopped.
    let app = crate::admin::router(gateway.clone());
    let admin_limits = crate::config::ConnectionLimits {
        max_connections: ADMIN_MAX_CONNECTIONS,
        ..gateway.config.connections.clone()
    };
    let admin_server = tokio::spawn(http::serve::serve(
        admin,
        app,
        admin_limits,
        gateway.shutdown.clone(),
    ));
    tracing::info!(
        "admin listener on http://{admin_addr} (/healthz, /readyz, /metrics{})",
        if gateway.config.admin.token.is_some() {
            ", /admin"
        } else {
            "; admin API off: no token"
        }
    );

    let app = http::router(gateway.clone());
    let mut server = tokio::spawn(http::serve::serve(
        listener,
        app,
        http::serve::within_descriptors(gateway.config.connections.clone()),
        gateway.draining.clone(),
    ));
    gateway.serving.store(true, Ordering::Release);
    tracing::info!("listening on http://{public_addr}/mcp");

    let mut finished = tokio::select! {
        () = shutdown => None,
        served = &mut server => Some(served),
    };
    let grace = gateway.config.shutdown_grace;
    if finished.is_none() {
        tracing::info!(
            "shutting down: no new connections, streams told to reconnect, up to {} s for requests in flight",
            grace.as_secs()
        );
        gateway.draining.cancel();
        match tokio::time::timeout(grace, &mut server).await {
            Ok(served) => finished = Some(served),
            Err(_) => {
                tracing::warn!("the grace period ended with requests still in flight: closing them")
            }
        }
    }
    gateway.draining.cancel();
    gateway.shutdown.cancel();
    if finished.is_none() {
        // Streams end once the shutdown token fires; connections close right after.
        finished = tokio::time::timeout(Duration::from_secs(2), &mut server)
            .await
            .ok();
        server.abort();
    }
    tracing::info!("stopping plugins");
    gateway.sessions.shutdown().await;
    // An admin connection that will not close (a hung scraper) does not hold the exit.
    let _ = tokio::time::timeout(Duration::from_secs(2), admin_server).await;
    tracing::info!("stopped");
    match finished {
        Some(Ok(served)) => Ok(served?),
        Some(Err(join)) => Err(StartError::Io(std::io::Error::other(join))),
        None => Ok(()),
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
