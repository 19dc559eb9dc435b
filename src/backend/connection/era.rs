//! Opening a connection in its plugin's era: `initialize` for a legacy plugin, `server/discover`
//! for a modern one (which is never sent `initialize`), or, when the era is not known, the
//! stdio transport's probe: `server/discover` first; a `DiscoverResult` at 2026-07-28 means
//! modern; a recognized modern error means modern at other versions (served through
//! `initialize` only if it also speaks a legacy version the gateway does, else refused with
//! the versions named); any other error, or no answer within [`DISCOVER_WAIT`], means legacy
//! and `initialize` follows. A slow modern plugin is not mistaken for a silent legacy one: its
//! `server/discover` answer is still taken while `initialize` is under way.

use std::time::Duration;

use serde_json::value::RawValue;

use super::{CallError, PluginConnection};
use crate::backend::BackendError;
use crate::backend::modern::{self, ClientMeta, Discovered, Era, MODERN_VERSION, discover_params};
use crate::protocol::PLUGIN_VERSIONS;

/// How long `server/discover` may go unanswered before the plugin is taken for a legacy one
/// that ignores requests before `initialize` (at most the plugin's start-up timeout).
pub const DISCOVER_WAIT: Duration = Duration::from_secs(3);

impl PluginConnection {
    /// Opens the connection in `era`, or finds the plugin's era when `None`; `params` are the
    /// `initialize` params of the client the instance serves (a modern plugin gets the same
    /// client's info and capabilities in `_meta`). The era it speaks, or why not.
    pub async fn open(
        &self,
        params: &RawValue,
        era: Option<Era>,
        timeout: Duration,
    ) -> Result<Era, BackendError> {
        match era {
            Some(Era::Legacy) => self.initialize(params, timeout).await.map(|_| Era::Legacy),
            Some(Era::Modern) => self.open_modern(params, timeout).await,
            None => self.detect(params, timeout).await,
        }
    }

    fn handshake_error(&self, reason: String) -> BackendError {
        BackendError::Initialize {
            plugin: self.name.to_string(),
            reason,
        }
    }

    /// A modern plugin that lists no version the gateway speaks.
    fn no_common_version(&self, versions: &[String]) -> BackendError {
        self.handshake_error(format!(
            "it is a modern-era server supporting {}; the gateway speaks {MODERN_VERSION} to modern plugins and {} to legacy ones",
            versions.join(", "),
            PLUGIN_VERSIONS.join(", ")
        ))
    }

    /// `server/discover`, read.
    async fn discover(&self, meta: &ClientMeta) -> Result<Discovered, BackendError> {
        let params = discover_params(meta);
        match self.call("server/discover", Some(&params)).await {
            Ok(result) => Ok(modern::read_discover_result(&result)),
            Err(CallError::Rpc(error)) => Ok(modern::read_discover_error(&error)),
            Err(CallError::Backend(e)) => Err(e),
        }
    }

    /// The plugin is modern: what it said of itself is kept, and every request from now on
    /// carries `_meta` (by default `meta`'s).
    fn become_modern(&self, info: super::InitializeResult, meta: ClientMeta) -> Era {
        let _ = self.init.set(info);
        let _ = self.modern.set(meta);
        Era::Modern
    }

    async fn open_modern(&self, params: &RawValue, timeout: Duration) -> Result<Era, BackendError> {
        let meta = ClientMeta::from_init_params(params);
        let found = tokio::time::timeout(timeout, self.discover(&meta))
            .await
            .map_err(|_| BackendError::Timeout {
                plugin: self.name.to_string(),
                secs: timeout.as_secs(),
            })??;
        match found {
            Discovered::Modern(info) => Ok(self.become_modern(info, meta)),
            Discovered::OtherVersions(v) => Err(self.no_common_version(&v)),
            Discovered::Refused(why) => Err(self.handshake_error(why)),
            Discovered::Legacy(why) => Err(self.handshake_error(format!(
                "{why}, not as a {MODERN_VERSION} server (its era is pinned to \"modern\")"
            ))),
        }
    }

    /// The stdio probe (see the module's doc).
    async fn detect(&self, params: &RawValue, timeout: Duration) -> Result<Era, BackendError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let meta = ClientMeta::from_init_params(params);
        let discover = self.discover(&meta);
        tokio::pin!(discover);
        let wait = timeout.min(DISCOVER_WAIT);
        match tokio::time::timeout(wait, &mut discover).await {
            Ok(found) => {
                let why = match found? {
                    Discovered::Modern(info) => return Ok(self.become_modern(info, meta.clone())),
                    Discovered::OtherVersions(v) if Discovered::speaks_legacy(&v) => format!(
                        "it is modern at {} and also speaks a legacy version",
                        v.join(", ")
                    ),
                    Discovered::OtherVersions(v) => return Err(self.no_common_version(&v)),
                    Discovered::Refused(why) => return Err(self.handshake_error(why)),
                    Discovered::Legacy(why) => why,
                };
                tracing::debug!(plugin = %self.name, "legacy: {why}; initializing");
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                return self.initialize(params, left).await.map(|_| Era::Legacy);
            }
            Err(_) => {
                tracing::debug!(plugin = %self.name, "no answer to server/discover within {} ms; initializing", wait.as_millis());
            }
        }
        // No answer yet: legacy by the rule, unless the answer still comes (a modern plugin
        // slow to start refuses `initialize`, then answers `server/discover`).
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let init = self.initialize(params, left);
        tokio::pin!(init);
        let mut discover_pending = true;
        let initialized = tokio::select! {
            r = &mut init => r.map(|_| ()),
            found = &mut discover => {
                discover_pending = false;
                if let Ok(Discovered::Modern(info)) = found {
                    return Ok(self.become_modern(info, meta.clone()));
                }
                (&mut init).await.map(|_| ())
            }
        };
        match initialized {
            Ok(()) => Ok(Era::Legacy),
            Err(e) if discover_pending => {
                match tokio::time::timeout_at(deadline, &mut discover).await {
                    Ok(Ok(Discovered::Modern(info))) => Ok(self.become_modern(info, meta.clone())),
                    _ => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }
}
