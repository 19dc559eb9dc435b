//! Backends: the plugins behind the gateway and the gateway's MCP-client side towards them.
//!
//! - [`transport`]: the seam a plugin's bytes cross ([`PluginTransport`]); [`stdio`] is the
//!   implementation that runs a child process.
//! - [`connection`]: JSON-RPC over a transport: the `initialize` handshake, many requests in
//!   flight matched back by gateway-assigned ids, and the plugin's own requests and
//!   notifications handed to whoever listens ([`PluginEvents`]).
//!
//! This layer knows nothing of HTTP or sessions; it must never block a plugin's reader on a
//! slow client.

pub mod connection;
mod pipe_writer;
mod stderr;
pub mod stdio;
pub mod transport;

pub use connection::{PluginConnection, PluginEvents, Related};
pub use transport::PluginTransport;

/// Why a plugin could not be used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BackendError {
    #[error("plugin '{plugin}' could not be started (`{command}`): {reason}")]
    Spawn {
        plugin: String,
        command: String,
        reason: String,
    },
    #[error("plugin '{plugin}' failed to initialize: {reason}")]
    Initialize { plugin: String, reason: String },
    #[error("plugin '{plugin}' exited: {reason}")]
    Exited { plugin: String, reason: String },
    #[error("plugin '{plugin}' did not answer within {secs} s")]
    Timeout { plugin: String, secs: u64 },
    #[error(
        "plugin '{plugin}' is not reading its input: {messages} messages ({bytes} bytes) wait for it; request refused"
    )]
    NotReading {
        plugin: String,
        messages: usize,
        bytes: usize,
    },
    #[error("plugin '{plugin}' is unavailable: {reason}")]
    Unavailable { plugin: String, reason: String },
}

use std::sync::{Arc, Weak};

use serde_json::value::RawValue;

use crate::config::PluginConfig;

/// Starts a plugin and runs its `initialize` handshake. On failure the child is stopped and
/// the error carries the last lines of its stderr.
pub async fn start_plugin(
    config: &PluginConfig,
    session: Arc<str>,
    init_params: &RawValue,
    events: Option<Weak<dyn PluginEvents>>,
) -> Result<Arc<PluginConnection>, BackendError> {
    let (transport, inbound) = stdio::StdioTransport::spawn(config, &session)?;
    let conn = PluginConnection::new(
        Arc::from(config.name.as_str()),
        session,
        Box::new(transport),
        inbound,
        events,
        config.request_timeout,
    );
    match conn.initialize(init_params, config.startup_timeout).await {
        Ok(_) => Ok(conn),
        Err(e) => {
            conn.shutdown().await;
            let tail = conn.stderr_tail();
            let e = if tail.is_empty() {
                e
            } else {
                let reason = format!("{e}; its stderr ended with: {}", tail.join(" | "));
                BackendError::Unavailable {
                    plugin: config.name.clone(),
                    reason,
                }
            };
            Err(e)
        }
    }
}
