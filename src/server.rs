//! The gateway's lifetime: take both ports, assemble the [`Gateway`], serve the public and
//! admin listeners until told to stop, drain within a grace period, then end every session and
//! wait for every plugin to be gone.
//!
//! [`run`] is the whole of it for the binary. Tests that need no child process call
//! [`Server::bind`] on a `127.0.0.1:0` listener, read the two addresses, and then
//! [`Server::serve`] with a shutdown future of their own. This is the top of the house: it
//! imports the edges ([`crate::http`], [`crate::admin`]) and the state below them, and nothing
//! imports it.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::config::{Config, ConnectionLimits, PerAddress};
use crate::gateway::{Gateway, Reloader, StartError};
use crate::http;

/// Most connections the admin listener holds at once: probes and scrapes need few, and a
/// flood of them must not take the descriptors the public listener and the plugins use.
const ADMIN_MAX_CONNECTIONS: usize = 256;
/// Of those, most from one address, and how many are kept for addresses that hold none (a
/// probe or a scrape gets in while others flood the rest).
const ADMIN_PER_ADDRESS: PerAddress = PerAddress {
    max: 32,
    reserved: 32,
};
/// How long an admin connection may take to send a request head: probes and scrapes send
/// theirs at once, so a connection that dawdles is holding a slot.
const ADMIN_HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest wait, at a hand-over, for the replay events still queued to reach Redis.
const HAND_OVER_FLUSH: Duration = Duration::from_secs(5);

/// A gateway whose ports are taken and whose state is assembled, not yet serving.
pub struct Server {
    gateway: Arc<Gateway>,
    public: TcpListener,
    admin: TcpListener,
    public_addr: SocketAddr,
    admin_addr: SocketAddr,
}

/// Serves on `listener` until `shutdown` resolves; see [`Server::serve`].
pub async fn run(
    listener: TcpListener,
    config: Config,
    reloader: Option<Reloader>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    Server::bind(listener, config, reloader)
        .await?
        .serve(shutdown)
        .await
}

impl Server {
    /// Takes the admin port from the config (the public one is `listener`), then opens the
    /// database and the registry. Both ports are taken before the database opens and plugins
    /// are probed: a port in use fails the start at once.
    pub async fn bind(
        listener: TcpListener,
        config: Config,
        reloader: Option<Reloader>,
    ) -> Result<Server, StartError> {
        let addr = config.admin.listen;
        let admin = TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::AdminListen { addr, source })?;
        let admin_addr = admin.local_addr()?;
        let public_addr = listener.local_addr()?;
        // What the kernel offers plugins' sandboxes, found (and logged) once, before any
        // plugin process exists.
        crate::backend::sandbox::probe::get();
        let gateway = Gateway::serving_at(config, reloader, public_addr).await?;
        Ok(Server {
            gateway,
            public: listener,
            admin,
            public_addr,
            admin_addr,
        })
    }

    /// Where `/mcp` is served.
    pub fn public_addr(&self) -> SocketAddr {
        self.public_addr
    }

    /// Where the probes, the metrics and the admin API are served.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// The state both listeners serve.
    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.gateway
    }

    /// Serves until `shutdown` resolves, then stops in order: readiness fails and no new
    /// connection is accepted; GET streams are told to reconnect (`retry:`) and closed;
    /// requests in flight get up to `shutdown_grace` to finish; whatever is left is closed;
    /// in cluster mode the sessions are handed over (their records and events stay in Redis
    /// for the other replicas); then every plugin is stopped (stdin close, SIGTERM, SIGKILL)
    /// and waited for.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), StartError> {
        let Server {
            gateway,
            public,
            admin,
            public_addr,
            admin_addr,
        } = self;
        tokio::spawn(gateway.sessions.clone().reap_idle(gateway.shutdown.clone()));
        tokio::spawn(gateway.sessions.clone().refresh_records(
            gateway.cluster.as_ref().map(|c| c.lapsed()),
            gateway.shutdown.clone(),
        ));
        // Beats until every session here has ended: only then is this replica gone.
        let last_beat = tokio_util::sync::CancellationToken::new();
        let heartbeat = gateway
            .cluster
            .clone()
            .map(|c| tokio::spawn(c.heartbeat(last_beat.clone())));
        spawn_reload_on_hangup(gateway.clone());
        if let Some(server) = &gateway.auth.server {
            tokio::spawn(server.clone().maintain(gateway.shutdown.clone()));
        }
        // The admin listener outlives the drain: probes see "not ready" and Prometheus can
        // scrape until the gateway has stopped.
        let app = crate::admin::router(gateway.clone());
        let given = &gateway.config.connections;
        let admin_limits = ConnectionLimits {
            max_connections: ADMIN_MAX_CONNECTIONS,
            per_address: Some(ADMIN_PER_ADDRESS),
            header_timeout: ADMIN_HEADER_TIMEOUT.min(given.header_timeout),
            body_timeout: ADMIN_HEADER_TIMEOUT.min(given.body_timeout),
            ..given.clone()
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
            public,
            app,
            http::serve::within_descriptors(gateway.config.connections.clone()),
            gateway.draining.clone(),
        ));
        gateway.mark_serving();
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
            if let Some(cluster) = &gateway.cluster {
                // The others retry this replica's sessions until they are handed over; told
                // before the listener closes, so none takes a refused connection for a death.
                cluster.drain().await;
            }
            gateway.draining.cancel();
            match tokio::time::timeout(grace, &mut server).await {
                Ok(served) => finished = Some(served),
                Err(_) => {
                    tracing::warn!(
                        "the grace period ended with requests still in flight: closing them"
                    )
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
        if gateway.cluster.is_some() {
            // Handed over, not ended: their records and events stay for the other replicas,
            // which take them over once the heartbeat below says this one is gone.
            gateway.sessions.hand_over(HAND_OVER_FLUSH).await;
        }
        tracing::info!("stopping plugins");
        gateway.sessions.shutdown().await;
        // The records of the last calls, ended by the stop, are stored before the exit.
        gateway.audit.flush().await;
        // The heartbeat's last word: this replica is gone.
        last_beat.cancel();
        if let Some(h) = heartbeat {
            let _ = tokio::time::timeout(Duration::from_secs(3), h).await;
        }
        // An admin connection that will not close (a hung scraper) does not hold the exit.
        let _ = tokio::time::timeout(Duration::from_secs(2), admin_server).await;
        tracing::info!("stopped");
        match finished {
            Some(Ok(served)) => Ok(served?),
            Some(Err(join)) => Err(StartError::Io(std::io::Error::other(join))),
            None => Ok(()),
        }
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
