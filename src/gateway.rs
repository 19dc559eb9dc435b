//! The gateway's shared state, and its lifetime: start probes and the idle reaper, serve
//! until told to stop, then end every session and wait for every plugin to be gone.

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::backend::Catalog;
use crate::config::Config;
use crate::http;
use crate::session::SessionManager;
use crate::stream::{EventStore, MemoryEventStore, ResumeCounters};

/// Everything a request handler needs.
pub struct Gateway {
    pub config: Config,
    pub catalog: Catalog,
    pub sessions: Arc<SessionManager>,
    pub guard: http::checks::Guard,
    pub separator: Arc<str>,
    /// How resumptions went, for metrics.
    pub resume: ResumeCounters,
    /// Cancelled when the gateway stops: sessions' streams close.
    pub shutdown: CancellationToken,
}

impl Gateway {
    pub fn new(config: Config) -> Arc<Gateway> {
        let store: Arc<dyn EventStore> = Arc::new(MemoryEventStore::new(config.replay.clone()));
        Arc::new(Gateway {
            catalog: Catalog::new(&config),
            sessions: Arc::new(SessionManager::new(
                config.session.clone(),
                store,
                config.stream.clone(),
                config.replay.max_age,
            )),
            resume: ResumeCounters::default(),
            guard: http::checks::Guard::new(&config),
            separator: Arc::from(config.separator.as_str()),
            shutdown: CancellationToken::new(),
            config,
        })
    }

    /// How long a client's `initialize` waits for plugin probes still running.
    pub fn probe_wait(&self) -> std::time::Duration {
        self.config
            .plugins
            .iter()
            .map(|p| p.startup_timeout)
            .max()
            .unwrap_or_default()
    }
}

/// Serves on `listener` until `shutdown` resolves, then stops every plugin.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let gateway = Gateway::new(config);
    gateway.catalog.start_probes();
    tokio::spawn(gateway.sessions.clone().reap_idle(gateway.shutdown.clone()));

    let token = gateway.shutdown.clone();
    let app = http::router(gateway.clone());
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
    served
}
