//! Backends: the plugins behind the gateway and the gateway's MCP-client side towards them.
//!
//! - [`transport`]: the seam a plugin's bytes cross ([`PluginTransport`]); [`stdio`] is the
//!   implementation that runs a child process, [`remote`] the one that reaches an MCP server
//!   over HTTP; [`orphans`] finds what its processes left
//!   outside their group; [`stderr`] logs what a plugin writes to its stderr; `settle` tells
//!   when a plugin has written all it will for now.
//! - [`connection`]: JSON-RPC over a transport: the handshake in the plugin's era (`initialize`,
//!   or `server/discover` for a 2026-07-28 plugin, or the probe that finds which), many
//!   requests in flight matched back by gateway-assigned ids, and the plugin's own requests
//!   and notifications handed to whoever listens ([`PluginEvents`]).
//! - [`modern`]: what speaking to a modern plugin takes (its `_meta`, its
//!   `InputRequiredResult`s, what its `server/discover` says), and what a legacy one must not
//!   get of a modern client's request.
//!
//! This layer knows nothing of HTTP or sessions; it must never block a plugin's reader on a
//! slow client. It is the mechanism (spawn, speak JSON-RPC, stop); when a plugin is started,
//! restarted or refused is decided by [`crate::supervisor`].

pub mod connection;
pub mod modern;
pub(crate) mod orphans;
mod pipe_writer;
pub mod remote;
pub mod sandbox;
mod settle;
pub mod stderr;
pub mod stdio;
pub mod transport;

pub use connection::{
    Answering, InputRequired, PluginConnection, PluginEvents, RELATED_TASK, Related, Rewrite,
};
pub use modern::Era;
pub use transport::PluginTransport;

/// Why a plugin could not be used. Its `Display` is for the logs and the admin API (it may
/// hold the command line, the plugin's own words, its stderr); a client is only ever told
/// [`BackendError::client_message`] under [`BackendError::code`].
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
    /// A start that failed, with the last lines of the plugin's stderr.
    #[error("{cause}{}", stderr_tail(.stderr))]
    StartFailed {
        cause: Box<BackendError>,
        stderr: Vec<String>,
    },
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
    /// Refused by the gateway itself (limits, breaker, a session or definition gone): the
    /// reason is the gateway's own words.
    #[error("plugin '{plugin}' is unavailable: {reason}")]
    Unavailable { plugin: String, reason: String },
    /// The caller has not connected a credential the plugin is started with: they are
    /// asked to (boxed: the error travels in every call's future, this case rarely).
    #[error("plugin '{}' needs the caller's credential `{}`", .0.plugin, .0.credential)]
    CredentialNeeded(Box<Needed>),
}

/// A credential the caller has not connected, and the link they are asked to connect it at
/// (a URL mode elicitation, `elicitation_id`).
#[derive(Debug, Clone)]
pub struct Needed {
    pub plugin: String,
    pub credential: String,
    /// How people are told of it.
    pub label: String,
    pub elicitation_id: String,
    pub url: String,
}

/// `; its stderr ended with: …`, or nothing when it wrote nothing.
pub(crate) fn stderr_tail(lines: &[String]) -> String {
    if lines.is_empty() {
        String::new()
    } else {
        format!("; its stderr ended with: {}", lines.join(" | "))
    }
}

impl BackendError {
    /// The plugin it is about.
    pub fn plugin(&self) -> &str {
        match self {
            BackendError::StartFailed { cause, .. } => cause.plugin(),
            BackendError::Spawn { plugin, .. }
            | BackendError::Initialize { plugin, .. }
            | BackendError::Exited { plugin, .. }
            | BackendError::Timeout { plugin, .. }
            | BackendError::NotReading { plugin, .. }
            | BackendError::Unavailable { plugin, .. } => plugin,
            BackendError::CredentialNeeded(n) => &n.plugin,
        }
    }

    /// The JSON-RPC error code a client gets for it.
    pub fn code(&self) -> i64 {
        match self {
            BackendError::Timeout { .. } => crate::jsonrpc::code::REQUEST_TIMEOUT,
            BackendError::CredentialNeeded(_) => crate::jsonrpc::code::URL_ELICITATION_REQUIRED,
            BackendError::Spawn { .. }
            | BackendError::Initialize { .. }
            | BackendError::StartFailed { .. }
            | BackendError::Exited { .. }
            | BackendError::NotReading { .. }
            | BackendError::Unavailable { .. } => crate::jsonrpc::code::INTERNAL_ERROR,
        }
    }

    /// What a client may be told: which plugin, and what happened in the gateway's words.
    /// Never the command line, the environment, the plugin's stderr or what it answered.
    pub fn client_message(&self) -> String {
        let plugin = self.plugin();
        match self {
            BackendError::Spawn { .. }
            | BackendError::Initialize { .. }
            | BackendError::StartFailed { .. } => {
                format!("plugin '{plugin}' failed to start; the gateway's logs say why")
            }
            // An exit status, or "it is no longer running": the gateway's words.
            BackendError::Exited { .. }
            | BackendError::Timeout { .. }
            | BackendError::Unavailable { .. } => self.to_string(),
            BackendError::NotReading { .. } => format!(
                "plugin '{plugin}' is not reading its input; the request was refused, try again later"
            ),
            BackendError::CredentialNeeded(n) => format!(
                "plugin '{plugin}' acts with your own {}, which you have not connected: connect it at the link given, then try again",
                n.label
            ),
        }
    }

    /// The error a client gets for it, as JSON-RPC error bytes answering `id`: with the URL
    /// elicitation the spec's `URLElicitationRequiredError` carries, where there is one.
    pub fn error_bytes(&self, id: Option<&crate::jsonrpc::Id>) -> bytes::Bytes {
        match self {
            BackendError::CredentialNeeded(n) => {
                let (elicitation_id, url) = (&n.elicitation_id, &n.url);
                let message = self.client_message();
                let error = serde_json::json!({
                    "code": self.code(),
                    "message": message,
                    "data": {"elicitations": [{
                        "mode": "url",
                        "elicitationId": elicitation_id,
                        "url": url,
                        "message": message,
                    }]},
                });
                let error =
                    RawValue::from_string(error.to_string()).expect("serialized JSON is JSON");
                let null = RawValue::from_string("null".into()).expect("valid JSON");
                crate::jsonrpc::error_object_bytes(
                    id.map_or(&*null, crate::jsonrpc::Id::raw),
                    &error,
                )
            }
            _ => crate::jsonrpc::error_bytes(id, self.code(), &self.client_message()),
        }
    }
}

/// A person's own credentials, by name, for the one process started for them: never shown.
#[derive(Clone, Default)]
pub struct Personal {
    pub values: std::collections::BTreeMap<String, String>,
    /// Told when a remote plugin's server refuses the person's credentials.
    pub on_refused: Option<OnRefused>,
}

/// A remote server's refusal of a person's credentials: HTTP 401 or 403, and its Bearer
/// challenge's `error` and `scope` (RFC 6750 §3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub error: Option<String>,
    pub scope: Option<String>,
}

/// What hears a [`Refusal`]; whether the person is to connect again (the instance, its
/// credentials no good, then ends).
pub type OnRefused = Arc<
    dyn Fn(Refusal) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>>
        + Send
        + Sync,
>;

impl std::fmt::Debug for Personal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.values.keys()).finish()
    }
}

use std::sync::{Arc, Weak};

use serde_json::value::RawValue;

use crate::config::PluginConfig;

/// Starts a plugin and opens it in `era` (`initialize`, or for a modern plugin
/// `server/discover`; with `None`, the probe that finds its era). On failure the child is
/// stopped and the error carries the last lines of its stderr (for the logs, never for a
/// client). `label` says whom it serves in the logs; `init_params` are its client's
/// `initialize` params (a modern plugin gets the same client in each request's `_meta`);
/// `personal`, the credentials of the one person it serves, if it uses any.
pub async fn start_plugin(
    config: &PluginConfig,
    label: Arc<str>,
    init_params: &RawValue,
    era: Option<Era>,
    events: Option<Weak<dyn PluginEvents>>,
    personal: Option<&Personal>,
) -> Result<Arc<PluginConnection>, BackendError> {
    let (transport, inbound): (Box<dyn PluginTransport>, _) = if config.remote.is_some() {
        let (t, inbound) = remote::RemoteTransport::connect(config, &label, personal).await?;
        (Box::new(t), inbound)
    } else {
        let (t, inbound) = stdio::StdioTransport::spawn(config, &label, personal)?;
        (Box::new(t), inbound)
    };
    let conn = PluginConnection::new(
        Arc::from(config.name.as_str()),
        label,
        transport,
        inbound,
        events,
        config.request_timeout,
    );
    match conn.open(init_params, era, config.startup_timeout).await {
        Ok(_) => Ok(conn),
        Err(e) => {
            conn.shutdown().await;
            Err(BackendError::StartFailed {
                cause: Box::new(e),
                stderr: conn.stderr_tail(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_never_see_a_command_line_stderr_or_the_plugins_own_words() {
        let secret = "hunter2";
        let p = || "p".to_owned();
        let spawn = BackendError::Spawn {
            plugin: p(),
            command: format!("server --password {secret}"),
            reason: format!("No such file ({secret})"),
        };
        let cases = [
            spawn.clone(),
            BackendError::Initialize {
                plugin: p(),
                reason: format!("it answered initialize with {secret}"),
            },
            BackendError::StartFailed {
                cause: Box::new(spawn),
                stderr: vec![format!("password={secret}")],
            },
            BackendError::StartFailed {
                cause: Box::new(BackendError::Exited {
                    plugin: p(),
                    reason: "exit status: 3".into(),
                }),
                stderr: vec![secret.into()],
            },
        ];
        for e in cases {
            assert!(e.to_string().contains(secret), "the logs keep it: {e}");
            let m = e.client_message();
            assert!(!m.contains(secret), "{m}");
            assert!(m.contains("plugin 'p' failed to start"), "{m}");
            assert_eq!(e.code(), crate::jsonrpc::code::INTERNAL_ERROR);
        }
        let timeout = BackendError::Timeout {
            plugin: p(),
            secs: 5,
        };
        assert_eq!(timeout.code(), crate::jsonrpc::code::REQUEST_TIMEOUT);
        let full = BackendError::NotReading {
            plugin: p(),
            messages: 3,
            bytes: 4,
        };
        assert!(full.client_message().contains("plugin 'p' is not reading"));
    }
}
