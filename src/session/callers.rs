//! The sessions behind modern-era (2026-07-28) clients, which have none of their own: one
//! hidden legacy session per caller (the token's subject when authorization is on; without a
//! token, the client's address, an IPv6 one's /64, as `http::checks::client_key` names it),
//! through which their requests reach plugins exactly as a legacy session's do. A
//! `per_session` plugin therefore runs one instance per caller, so anonymous clients at other
//! addresses never share one; a `shared` plugin is shared as always. There are at most as
//! many callers' sessions as the gateway's `max_sessions`. A caller's session is made on its first request, is never
//! named to a client nor found by an `Mcp-Session-Id`, keeps no replay buffers (the modern
//! era has no resumption), and ends when idle like any other.
//!
//! Its plugin instances are initialized at the newest legacy version, as a client the gateway
//! speaks for, declaring sampling, elicitation and roots: a plugin may ask, and the bridge
//! (`bridge.rs`) asks the modern client through an `InputRequiredResult`, only what that
//! request's own `_meta` declares, and only while its `tools/call`, `resources/read` or
//! `prompts/get` runs.

use std::sync::Arc;

use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use super::manager::{SessionManager, TooManySessions};
use super::{ClientInit, Origin, Session};

/// The `initialize` params a caller's plugin instances get.
fn plugin_params() -> Arc<RawValue> {
    let params = serde_json::json!({
        "protocolVersion": crate::protocol::LATEST,
        "capabilities": {
            "sampling": {"tools": {}},
            "elicitation": {"form": {}, "url": {}},
            "roots": {},
        },
        "clientInfo": {"name": "mcp-gateway", "version": env!("CARGO_PKG_VERSION")},
    });
    Arc::from(RawValue::from_string(params.to_string()).expect("valid JSON"))
}

impl SessionManager {
    /// The session a modern caller's requests go through, made on first use. `caller` is
    /// the token's subject, or `None` for a client without one; `key` is the client key
    /// (`subject …`, or `address …` for a client without a token) it is kept under.
    pub fn for_caller(
        &self,
        caller: Option<&str>,
        key: &Arc<str>,
        gateway_shutdown: &CancellationToken,
    ) -> Result<Arc<Session>, TooManySessions> {
        if let Some(s) = self.callers.get(key)
            && !s.closed.is_cancelled()
        {
            return Ok(s.clone());
        }
        if self.callers.len() >= self.config.max_sessions && !self.callers.contains_key(key) {
            return Err(TooManySessions::Gateway);
        }
        let key = key.clone();
        let entry = self.callers.entry(key.clone());
        let session = entry
            .and_modify(|s| {
                if s.closed.is_cancelled() {
                    *s = self.new_caller_session(caller, &key, gateway_shutdown);
                }
            })
            .or_insert_with(|| self.new_caller_session(caller, &key, gateway_shutdown))
            .clone();
        Ok(session)
    }

    fn new_caller_session(
        &self,
        caller: Option<&str>,
        key: &Arc<str>,
        gateway_shutdown: &CancellationToken,
    ) -> Arc<Session> {
        let mut settings = (*self.stream_settings).clone();
        settings.resumable = false;
        let init = ClientInit {
            version: crate::protocol::LATEST,
            plugin_params: plugin_params(),
            owner: caller.map(str::to_owned),
            client: key.clone(),
        };
        // An id no client can name: it never leaves the gateway, and `get` never finds it.
        let id: Arc<str> = Arc::from(format!("caller:{}", super::manager::new_session_id()));
        tracing::debug!(session = %id, "a session for a modern client's caller");
        Session::new(
            id,
            init,
            Origin::Caller,
            self.supervisor.clone(),
            gateway_shutdown.child_token(),
            self.store.clone(),
            None,
            Arc::new(settings),
        )
    }

    /// Ends callers' sessions idle for `idle`, or for `unused` when nothing but
    /// `server/discover` ever came (so a flood of addresses that only discover does not hold
    /// the callers' places for long); the reaper calls it.
    pub(super) fn reap_callers(&self, idle: std::time::Duration, unused: std::time::Duration) {
        let done = |s: &Session| {
            let timeout = if s.is_used() { idle } else { idle.min(unused) };
            s.is_idle(timeout) || s.closed.is_cancelled()
        };
        let idle: Vec<Arc<str>> = self
            .callers
            .iter()
            .filter(|s| done(s))
            .map(|s| s.key().clone())
            .collect();
        for key in idle {
            if let Some((_, s)) = self.callers.remove_if(&key, |_, s| done(s)) {
                self.spawn_end(s);
            }
        }
        for s in self.callers.iter() {
            s.reap_streams(self.abandon_after);
            s.reap_idle_plugins();
        }
    }

    /// Every modern caller's session now.
    pub fn caller_sessions(&self) -> Vec<Arc<Session>> {
        self.callers.iter().map(|s| s.clone()).collect()
    }

    /// Ends the caller's session whose id is `id` (its plugin instances stop; the caller's
    /// next request makes a new one). False when there is none.
    pub fn end_caller(&self, id: &str) -> bool {
        let key = self
            .callers
            .iter()
            .find(|s| &*s.id == id)
            .map(|s| s.key().clone());
        match key.and_then(|k| self.callers.remove(&k)) {
            Some((_, s)) => {
                self.spawn_end(s);
                true
            }
            None => false,
        }
    }

    /// Ends every caller's session (shutdown).
    pub(super) fn end_callers(&self) {
        let keys: Vec<Arc<str>> = self.callers.iter().map(|s| s.key().clone()).collect();
        for key in keys {
            if let Some((_, s)) = self.callers.remove(&key) {
                self.spawn_end(s);
            }
        }
    }
}
