//! Opening a connection in its plugin's era: `initialize` for a legacy plugin, `server/discover`
//! for a modern one (which is never sent `initialize`), or, when the era is not known, the
//! probe, which prefers the legacy era: `initialize` first, so a plugin that speaks both eras
//! (the first request of a dual-era process decides its era, as with every server on the
//! official Python SDK 2.x) is served as a legacy one, its own requests to the client and its
//! resource subscriptions working (the gateway bridges them to modern clients). Only a
//! plugin that refuses `initialize` is asked `server/discover`: a `DiscoverResult` at
//! 2026-07-28 means modern; a recognized modern error means modern at other versions, refused
//! with the versions named; any other answer leaves the refusal of `initialize` as the error.
//! A plugin that has not answered `initialize` within [`ANSWER_WAIT`] is sent
//! `server/discover` too, and the first era that answers is its own: a legacy plugin slow to
//! start is not mistaken for a modern one, nor a modern one that ignores `initialize` for a
//! dead one. This rule departs from the stdio transport's (`server/discover` first), which
//! would make every dual-era plugin a modern one, unable to ask its client anything or be
//! subscribed to; a plugin's `era` pins either era instead. Over HTTP, where each request's
//! era is its own, the probe is the 2026-07-28 Streamable HTTP transport's: `server/discover`
//! first, and `initialize` only when the answer is no recognized modern one. A modern server
//! refusing the version with one the gateway speaks among its `supported` is asked once more.

use std::time::Duration;

use serde_json::value::RawValue;

use super::{CallError, PluginConnection};
use crate::backend::BackendError;
use crate::backend::modern::{self, ClientMeta, Discovered, Era, MODERN_VERSION, discover_params};
use crate::protocol::PLUGIN_VERSIONS;

/// How long `initialize` may go unanswered before the plugin is sent `server/discover` too (at
/// most the plugin's start-up timeout).
pub const ANSWER_WAIT: Duration = Duration::from_secs(3);

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

    /// `server/discover`, read; asked once more when the server refuses the version while
    /// naming the gateway's among those it supports.
    async fn discover(&self, meta: &ClientMeta) -> Result<Discovered, BackendError> {
        let params = discover_params(meta);
        let mut again = true;
        loop {
            let found = match self.call("server/discover", Some(&params)).await {
                Ok(result) => modern::read_discover_result(&result),
                Err(CallError::Rpc(error)) => modern::read_discover_error(&error),
                Err(CallError::Backend(e)) => return Err(e),
            };
            match found {
                Discovered::OtherVersions(v) if again && v.iter().any(|v| v == MODERN_VERSION) => {
                    again = false;
                }
                found => return Ok(found),
            }
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

    /// What a `server/discover` answer makes of a plugin that did not take `initialize`
    /// (`refused` says why not): modern at 2026-07-28, or why it cannot be served.
    fn modern_or(
        &self,
        found: Discovered,
        meta: ClientMeta,
        refused: BackendError,
    ) -> Result<Era, BackendError> {
        match found {
            Discovered::Modern(info) => Ok(self.become_modern(info, meta)),
            Discovered::OtherVersions(v) if !Discovered::speaks_legacy(&v) => {
                Err(self.no_common_version(&v))
            }
            Discovered::Refused(why) => Err(self.handshake_error(why)),
            Discovered::OtherVersions(_) | Discovered::Legacy(_) => Err(refused),
        }
    }

    /// The probe over HTTP (see the module's doc): `server/discover`, then `initialize`
    /// unless the answer was a modern one.
    async fn detect_modern_first(
        &self,
        params: &RawValue,
        timeout: Duration,
    ) -> Result<Era, BackendError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let meta = ClientMeta::from_init_params(params);
        let timed_out = || BackendError::Timeout {
            plugin: self.name.to_string(),
            secs: timeout.as_secs(),
        };
        let found = tokio::time::timeout_at(deadline, self.discover(&meta))
            .await
            .map_err(|_| timed_out())??;
        match found {
            Discovered::Modern(info) => return Ok(self.become_modern(info, meta)),
            Discovered::OtherVersions(v) if !Discovered::speaks_legacy(&v) => {
                return Err(self.no_common_version(&v));
            }
            Discovered::Refused(why) => return Err(self.handshake_error(why)),
            Discovered::OtherVersions(_) | Discovered::Legacy(_) => {}
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        self.initialize(params, left).await.map(|_| Era::Legacy)
    }

    /// The probe (see the module's doc).
    async fn detect(&self, params: &RawValue, timeout: Duration) -> Result<Era, BackendError> {
        if self.transport.modern_first() {
            return self.detect_modern_first(params, timeout).await;
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let meta = ClientMeta::from_init_params(params);
        let init = async { self.initialize(params, timeout).await.map(|_| ()) };
        tokio::pin!(init);
        let wait = timeout.min(ANSWER_WAIT);
        let refused = match tokio::time::timeout(wait, &mut init).await {
            Ok(Ok(())) => return Ok(Era::Legacy),
            // Answered, but not as a legacy server the gateway speaks to.
            Ok(Err(e @ BackendError::Initialize { .. })) => e,
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                tracing::debug!(plugin = %self.name, "no answer to initialize within {} ms; asking server/discover too", wait.as_millis());
                return self.detect_slow(init, meta, deadline).await;
            }
        };
        tracing::debug!(plugin = %self.name, "{refused}; asking server/discover");
        match tokio::time::timeout_at(deadline, self.discover(&meta)).await {
            Ok(found) => self.modern_or(found?, meta, refused),
            Err(_) => Err(BackendError::Timeout {
                plugin: self.name.to_string(),
                secs: timeout.as_secs(),
            }),
        }
    }

    /// `initialize` unanswered yet: `server/discover` goes too, and the first era that
    /// answers is the plugin's (a legacy plugin slow to start takes `initialize` in its
    /// turn; a modern one that ignores `initialize` answers `server/discover`).
    async fn detect_slow(
        &self,
        init: std::pin::Pin<&mut impl Future<Output = Result<(), BackendError>>>,
        meta: ClientMeta,
        deadline: tokio::time::Instant,
    ) -> Result<Era, BackendError> {
        let mut init = init;
        let discover = self.discover(&meta);
        tokio::pin!(discover);
        tokio::select! {
            r = &mut init => match r {
                Ok(()) => Ok(Era::Legacy),
                Err(refused @ BackendError::Initialize { .. }) => {
                    match tokio::time::timeout_at(deadline, &mut discover).await {
                        Ok(Ok(found)) => self.modern_or(found, meta.clone(), refused),
                        _ => Err(refused),
                    }
                }
                Err(e) => Err(e),
            },
            found = &mut discover => match found {
                Ok(Discovered::Modern(info)) => Ok(self.become_modern(info, meta.clone())),
                _ => init.await.map(|_| Era::Legacy),
            },
        }
    }
}
