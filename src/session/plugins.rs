//! A session's plugin slots: one per plugin it has used, holding that plugin's instance for
//! this session. An instance is asked of the [`crate::supervisor`] on first use (and after a
//! crash, once the slot's backoff is over), then brought up to what the client asked of the
//! session (its log level, its resource subscriptions). Slots of plugins that left or changed
//! stop when the registry changes; instances idle past their plugin's idle timeout stop.
//!
//! This file never starts a process itself, nor decides when one may start: that is the
//! supervisor's.

use std::sync::{Arc, Weak};
use std::time::Duration;

use serde_json::value::RawValue;

use super::Session;
use crate::backend::connection::LIST_CHANGES;
use crate::backend::{BackendError, Personal, PluginConnection, PluginEvents, Related};
use crate::config::ProcessModel;
use crate::jsonrpc::{self, Id};
use crate::registry::{View, ViewPlugin};
use crate::supervisor::{Owner, Slot, changed};

/// Longest wait for a starting instance to take the session's log level.
const SET_LEVEL_WAIT: Duration = Duration::from_secs(2);

impl Session {
    /// This session's slot for a plugin of the view; a slot of an older definition is
    /// replaced (its instance stops in the background).
    fn slot(&self, plugin: &ViewPlugin) -> Arc<Slot> {
        let mut slots = self.slots.lock().expect("slots lock");
        if let Some(s) = slots.get(plugin.name())
            && s.entry.generation == plugin.entry.generation
        {
            return s.clone();
        }
        let slot = Arc::new(Slot::new(plugin));
        if let Some(old) = slots.insert(plugin.name().to_owned(), slot.clone()) {
            old.stop();
        }
        slot
    }

    /// The running instance of a plugin in this session, if any.
    pub fn current(&self, plugin: &str) -> Option<Arc<PluginConnection>> {
        self.slots
            .if_made()?
            .lock()
            .expect("slots lock")
            .get(plugin)
            .and_then(|s| s.current())
    }

    /// The session's running instance of a plugin, started (or restarted) if need be: the
    /// supervisor hands it over (a shared one is the pool's, never put in a slot).
    pub async fn plugin(&self, plugin: &ViewPlugin) -> Result<Arc<PluginConnection>, BackendError> {
        if !self.registry.is_current(plugin) {
            return Err(changed(plugin));
        }
        match plugin.entry.config.process_model {
            ProcessModel::Shared => return self.supervisor.shared(plugin).await,
            ProcessModel::PerSubject => return Box::pin(self.subject_plugin(plugin)).await,
            ProcessModel::PerSession => {}
        }
        let s = self.slot(plugin);
        if let Some(c) = s.current() {
            return Ok(c);
        }
        let _starting = s.starting().await;
        if let Some(c) = s.current() {
            return Ok(c);
        }
        s.wait_backoff(&self.id).await;
        let gone = || BackendError::Unavailable {
            plugin: s.entry.name().to_owned(),
            reason: "the session has ended".into(),
        };
        if self.closed.is_cancelled() {
            return Err(gone());
        }
        // Boxed: a rare path, kept out of every call's future.
        let personal = Box::pin(self.personal(plugin)).await?;
        let events: Weak<dyn PluginEvents> = self.me.clone();
        let running = self
            .supervisor
            .instance(
                plugin,
                &s,
                Owner {
                    label: self.id.clone(),
                    params: &self.plugin_params,
                    client: &self.client,
                    events,
                    personal: personal.as_ref(),
                },
            )
            .await?;
        let conn = running.conn.clone();
        // The client's level reaches the plugin before any request does.
        self.replay_log_level(&s, &conn).await;
        let still_current = self
            .slots
            .lock()
            .expect("slots lock")
            .get(plugin.name())
            .is_some_and(|cur| Arc::ptr_eq(cur, &s));
        if !still_current {
            // The registry changed while the process started: it is not needed.
            running.conn.shutdown().await;
            return Err(changed(plugin));
        }
        s.put(running);
        if self.closed.is_cancelled() {
            // Ended while starting: the end did not see this instance.
            s.stop();
            return Err(gone());
        }
        self.replay_state(&s, &conn);
        Ok(conn)
    }

    /// The session owner's own credentials that `plugin` is started with, if it uses any;
    /// one not connected yet is asked for ([`BackendError::CredentialNeeded`]).
    pub(super) async fn personal(
        &self,
        plugin: &ViewPlugin,
    ) -> Result<Option<Personal>, BackendError> {
        let used = crate::config::credentials_used(&plugin.entry.config);
        if used.is_empty() {
            return Ok(None);
        }
        let unavailable = |reason: String| BackendError::Unavailable {
            plugin: plugin.name().to_owned(),
            reason,
        };
        let Some(broker) = self.supervisor.credentials() else {
            return Err(unavailable("people's credentials are not set up".into()));
        };
        let Some(subject) = self.owner.as_deref() else {
            return Err(unavailable(
                "it acts with a person's own credentials, and the caller has no token that says who they are".into(),
            ));
        };
        let mut values = std::collections::BTreeMap::new();
        for name in used {
            match broker.value(subject, name).await {
                Ok(Some(v)) => {
                    values.insert(name.to_owned(), v.value);
                }
                Ok(None)
                    if broker.defined(name).is_ok_and(|c| {
                        matches!(c.kind, crate::config::CredentialKind::TokenExchange { .. })
                    }) =>
                {
                    // The caller's own token (external mode), else the one their latest
                    // sign-in at the provider gave (built-in mode with [auth.upstream]).
                    let token = match self.subject_token() {
                        Some(t) => Some(t.expose().to_owned()),
                        None => broker.provider_token(subject).await.unwrap_or_else(|e| {
                            tracing::warn!(plugin = %plugin.name(), credential = name, "credentials: {e}");
                            None
                        }),
                    };
                    let Some(token) = token else {
                        return Err(unavailable(format!(
                            "credential `{name}` is the caller's own token exchanged at the authorization server, and there is none to exchange: sign in again at the identity provider"
                        )));
                    };
                    let v = broker.exchange(subject, name, &token).await.map_err(|e| {
                        tracing::warn!(plugin = %plugin.name(), credential = name, "credentials: {e}");
                        unavailable(match e {
                            crate::credentials::CredentialError::Upstream {
                                why: crate::credentials::OAuthError::Refused(_),
                                ..
                            } => format!("credential `{name}`: the authorization server refused to exchange the caller's token"),
                            _ => format!("credential `{name}` could not be obtained now; the gateway's logs say why"),
                        })
                    })?;
                    values.insert(name.to_owned(), v.value);
                }
                Ok(None) => {
                    let asked = broker.request(subject, name).await.map_err(|e| {
                        tracing::warn!(plugin = %plugin.name(), credential = name, "credentials: {e}");
                        unavailable(format!("credential `{name}` cannot be asked for now"))
                    })?;
                    return Err(BackendError::CredentialNeeded(Box::new(
                        crate::backend::Needed {
                            plugin: plugin.name().to_owned(),
                            credential: name.to_owned(),
                            label: asked.label,
                            elicitation_id: asked.id,
                            url: asked.url,
                        },
                    )));
                }
                Err(e) => {
                    tracing::warn!(plugin = %plugin.name(), credential = name, "credentials: {e}");
                    return Err(unavailable(format!(
                        "credential `{name}` could not be read; the gateway's logs say why"
                    )));
                }
            }
        }
        // A remote server refusing these values: the broker decides whether the instance
        // ends (a step-up, a token no longer good there). Only the `oauth2` credentials for
        // that server are its to judge: those naming it as their `mcp_server`, else the one
        // such credential the plugin uses.
        let upstream = plugin
            .entry
            .config
            .remote
            .as_ref()
            .and_then(|r| url::Url::parse(&r.url).ok());
        let oauth: Vec<(String, String, bool)> = values
            .iter()
            .filter_map(|(name, value)| {
                let c = broker.defined(name).ok()?;
                let crate::config::CredentialKind::OAuth2 { server, .. } = &c.kind else {
                    return None;
                };
                let for_it = upstream.is_some() && server.mcp_server == upstream;
                Some((name.clone(), value.clone(), for_it))
            })
            .collect();
        let judged: Vec<(String, String)> = if oauth.iter().any(|(_, _, f)| *f) {
            oauth
                .into_iter()
                .filter(|(_, _, f)| *f)
                .map(|(n, v, _)| (n, v))
                .collect()
        } else if oauth.len() == 1 {
            oauth.into_iter().map(|(n, v, _)| (n, v)).collect()
        } else {
            Vec::new()
        };
        let on_refused: Option<crate::backend::OnRefused> = (!judged.is_empty()).then(|| {
            let broker = broker.clone();
            let subject = subject.to_owned();
            let judged = std::sync::Arc::new(judged);
            let hook: crate::backend::OnRefused =
                std::sync::Arc::new(move |r: crate::backend::Refusal| {
                    let (broker, subject, judged) =
                        (broker.clone(), subject.clone(), judged.clone());
                    Box::pin(async move {
                        let mut ends = false;
                        for (name, sent) in judged.iter() {
                            let refusal = (r.status, r.error.as_deref(), r.scope.as_deref());
                            ends |= broker.refused(&subject, name, sent, refusal).await;
                        }
                        ends
                    })
                });
            hook
        });
        Ok(Some(Personal { values, on_refused }))
    }

    /// The owner's process of a `per_subject` plugin, started with their credentials if need
    /// be.
    async fn subject_plugin(
        &self,
        plugin: &ViewPlugin,
    ) -> Result<Arc<PluginConnection>, BackendError> {
        let Some(subject) = self.owner.as_deref() else {
            return Err(BackendError::Unavailable {
                plugin: plugin.name().to_owned(),
                reason: "it runs a process per person, and the caller has no token that says who they are".into(),
            });
        };
        if let Some(c) = self.supervisor.subject_current(plugin, subject) {
            return Ok(c);
        }
        let personal = self.personal(plugin).await?;
        self.supervisor
            .for_subject(plugin, subject, personal.as_ref())
            .await
    }

    /// Whether an instance of `plugin` serves this session now (its own, or its person's).
    pub fn has_instance(&self, plugin: &ViewPlugin) -> bool {
        match plugin.entry.config.process_model {
            ProcessModel::PerSubject => self
                .owner
                .as_deref()
                .is_some_and(|s| self.supervisor.subject_current(plugin, s).is_some()),
            _ => self.current(plugin.name()).is_some(),
        }
    }

    /// Whether the session's owner has yet to connect a credential `plugin` is started with
    /// (one obtained without them, by token exchange, does not count). Reads the store; asks
    /// no one.
    pub async fn lacks_credential(&self, plugin: &ViewPlugin) -> bool {
        let used = crate::config::credentials_used(&plugin.entry.config);
        if used.is_empty() {
            return false;
        }
        let (Some(broker), Some(subject)) = (self.supervisor.credentials(), self.owner.as_deref())
        else {
            return true;
        };
        for name in used {
            let exchanged = broker.defined(name).is_ok_and(|c| {
                matches!(c.kind, crate::config::CredentialKind::TokenExchange { .. })
            });
            if !exchanged && !matches!(broker.value(subject, name).await, Ok(Some(_))) {
                return true;
            }
        }
        false
    }

    /// Stops this session's instance of `plugin`, if one runs (it starts again on next use);
    /// whether one did.
    pub fn stop_instance(&self, plugin: &str) -> bool {
        let Some(slots) = self.slots.if_made() else {
            return false;
        };
        let removed = slots.lock().expect("slots lock").remove(plugin);
        match removed {
            Some(s) => {
                let running = s.current().is_some();
                s.stop();
                running
            }
            None => false,
        }
    }

    /// Instances running now.
    pub fn running(&self) -> Vec<Arc<PluginConnection>> {
        let Some(slots) = self.slots.if_made() else {
            return Vec::new();
        };
        slots
            .lock()
            .expect("slots lock")
            .values()
            .filter_map(|s| s.current())
            .collect()
    }

    /// The registry changed: instances of plugins that left the view, or whose definition
    /// changed, stop; the client is told its lists changed.
    pub fn registry_changed(&self, view: &View) {
        let stale: Vec<Arc<Slot>> = match self.slots.if_made() {
            None => Vec::new(),
            Some(slots) => {
                let mut slots = slots.lock().expect("slots lock");
                let names: Vec<String> = slots
                    .iter()
                    .filter(|(name, s)| {
                        view.find(name)
                            .is_none_or(|p| p.entry.generation != s.entry.generation)
                    })
                    .map(|(name, _)| name.clone())
                    .collect();
                names.iter().filter_map(|n| slots.remove(n)).collect()
            }
        };
        for s in &stale {
            s.stop();
        }
        if let Some(routes) = self.routes.if_made() {
            routes.lock().expect("routes lock").clear();
        }
        if self.for_caller {
            for method in &LIST_CHANGES[..3] {
                self.publish(None, method, None);
            }
            return self.keep_subscribed();
        }
        for method in &LIST_CHANGES[..3] {
            let _ = self.deliver(
                jsonrpc::request_bytes(None, method, None),
                Related::None,
                false,
            );
        }
    }

    /// Stops instances unused for longer than their plugin's idle timeout (they start again
    /// on next use; this is not a crash).
    pub fn reap_idle_plugins(&self) {
        // The reaper looks at every session: one that never started a plugin has nothing to
        // reap, and its slots are not made for the look.
        let Some(slots) = self.slots.if_made() else {
            return;
        };
        let idle: Vec<Arc<Slot>> = slots
            .lock()
            .expect("slots lock")
            .values()
            // Listeners' subscriptions keep an instance busy.
            .filter(|s| !self.holds_on(s.entry.name()))
            .filter(|s| {
                s.entry.config.idle_timeout.is_some_and(|t| {
                    s.current()
                        .and_then(|c| c.idle_for())
                        .is_some_and(|d| d > t)
                })
            })
            .cloned()
            .collect();
        for s in idle {
            tracing::info!(plugin = %s.entry.name(), session = %self.id, "stopping an idle plugin process");
            s.stop();
        }
    }

    /// Tells a (re)started or warm instance the session's log level before anything else, and
    /// waits briefly for it to be taken, so it logs at that level from its first request even
    /// if it handles requests concurrently.
    async fn replay_log_level(&self, slot: &Slot, conn: &PluginConnection) {
        let Some(level) = self.log_level.params() else {
            return;
        };
        // A modern plugin has no logging/setLevel: the level goes in each request's `_meta`.
        if !slot.has_capability("logging") || conn.is_modern() {
            return;
        }
        let call = conn.call("logging/setLevel", Some(&level));
        let wait = slot.entry.config.startup_timeout.min(SET_LEVEL_WAIT);
        match tokio::time::timeout(wait, call).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::debug!(plugin = %conn.name(), session = %self.id, "logging/setLevel: {e}")
            }
            Err(_) => {
                tracing::debug!(plugin = %conn.name(), session = %self.id, "logging/setLevel: no answer")
            }
        }
    }

    /// Brings a (re)started plugin up to what the client asked of the session (its log level
    /// is sent before, by [`Session::replay_log_level`]).
    fn replay_state(&self, slot: &Slot, conn: &Arc<PluginConnection>) {
        if conn.is_modern() {
            // It has no resources/subscribe (the router refuses it), so nothing to replay.
            return;
        }
        let uris: Vec<String> = self
            .subscriptions
            .lock()
            .expect("subscriptions lock")
            .iter()
            .filter(|(p, _)| p == slot.entry.name())
            .map(|(_, u)| u.clone())
            .collect();
        for uri in uris {
            let c = conn.clone();
            let params = RawValue::from_string(serde_json::json!({ "uri": uri }).to_string())
                .expect("valid JSON");
            tokio::spawn(async move { c.call("resources/subscribe", Some(&params)).await });
        }
    }

    pub fn set_log_level(&self, params: Box<RawValue>) {
        self.log_level.set(params);
        self.save_state();
    }

    pub fn subscription(&self, plugin: &str, uri: &str, on: bool) {
        let changed = {
            let mut subs = self.subscriptions.lock().expect("subscriptions lock");
            if on {
                subs.insert((plugin.to_owned(), uri.to_owned()))
            } else {
                subs.remove(&(plugin.to_owned(), uri.to_owned()))
            }
        };
        if changed {
            self.save_state();
        }
    }

    /// Cancels a client request in flight on any of this session's plugins (its own or
    /// shared).
    pub fn cancel(&self, id: &Id, reason: Option<&RawValue>) -> bool {
        self.running()
            .iter()
            .chain(self.supervisor.shared_conns().iter())
            .any(|c| c.cancel_client_request(self.caller, id, reason))
    }

    /// One of the session's instances exited: out of its slot; unless the gateway stopped
    /// it (or the session is ending), a crash, and it restarts on the next request.
    pub(super) fn instance_exited(&self, conn: &Arc<PluginConnection>) {
        let slot = self
            .slots
            .lock()
            .expect("slots lock")
            .values()
            .find(|s| s.holds(conn))
            .cloned();
        if let Some(slot) = slot {
            slot.take_running();
            if !self.closed.is_cancelled() && !conn.is_stopping() {
                slot.crashed(conn, &self.client, &self.id);
                self.keep_subscribed();
            }
        }
    }
}
