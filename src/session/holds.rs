//! Resource subscriptions a session holds on plugins, counted with every other holder of the
//! same URI on the same plugin instance ([`crate::supervisor::subscriptions`]): the first
//! holder subscribes the plugin, the last one to let go unsubscribes it.
//!
//! - A modern caller's listeners (`subscriptions/listen`) hold each URI they asked for as a
//!   [`Hold`], let go when the listener goes. On a `shared` plugin the count is the pool's,
//!   with every session's; on a `per_session` plugin it is this caller's own instance's,
//!   counted among the caller's listeners, and kept in the session's subscriptions so that an
//!   instance that restarts is subscribed again.
//! - A legacy session's `resources/subscribe` to a shared plugin is one holder there too
//!   (its unsubscribe, or its end, lets go); to its own instance it goes straight to the
//!   plugin as before (nobody else uses that instance).
//!
//! An instance holders count on is kept running: started again after a crash or a change of
//! definition, and not stopped for idleness.

use std::sync::{Arc, Weak};

use super::Session;
use crate::backend::connection::CallError;
use crate::config::ProcessModel;
use crate::registry::ViewPlugin;
use crate::supervisor::Supervisor;
use crate::supervisor::subscriptions::{Subscriptions, tell};

/// One holder's claim on a resource subscription; dropping it lets go (in the background).
pub struct Hold {
    on: HoldOn,
    plugin: String,
    uri: String,
}

enum HoldOn {
    /// A shared plugin's pool.
    Shared(Arc<Supervisor>),
    /// The caller's own instance.
    Own(Weak<Session>),
}

impl Drop for Hold {
    fn drop(&mut self) {
        // Outside a runtime (a test's end) there is no plugin left to tell.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (plugin, uri) = (
            std::mem::take(&mut self.plugin),
            std::mem::take(&mut self.uri),
        );
        match &self.on {
            HoldOn::Shared(supervisor) => {
                let supervisor = supervisor.clone();
                runtime.spawn(async move { supervisor.release_shared(&plugin, &uri).await });
            }
            HoldOn::Own(session) => {
                let Some(session) = session.upgrade() else {
                    return;
                };
                runtime.spawn(async move { session.release_own(&plugin, &uri).await });
            }
        }
    }
}

impl Session {
    /// Holds a subscription to `uri` on `plugin` for one of this session's listeners (see
    /// the module's doc); the plugin is subscribed before this returns, unless another
    /// holder had it subscribed already.
    pub async fn hold_subscription(
        self: &Arc<Self>,
        plugin: &ViewPlugin,
        uri: &str,
    ) -> Result<Hold, CallError> {
        if plugin.entry.config.process_model == ProcessModel::Shared {
            self.supervisor.hold_shared(plugin, uri).await?;
            return Ok(Hold {
                on: HoldOn::Shared(self.supervisor.clone()),
                plugin: plugin.name().to_owned(),
                uri: uri.to_owned(),
            });
        }
        let table = self.own_table(plugin.name());
        table
            .hold(uri, || async {
                let conn = self.plugin(plugin).await?;
                // Kept first, so an instance that restarts meanwhile is subscribed too.
                self.subscription(plugin.name(), uri, true);
                tell(&conn, uri, true)
                    .await
                    .inspect_err(|_| self.subscription(plugin.name(), uri, false))
            })
            .await?;
        Ok(Hold {
            on: HoldOn::Own(self.me.clone()),
            plugin: plugin.name().to_owned(),
            uri: uri.to_owned(),
        })
    }

    /// One of this session's listeners let go of `uri` on its own instance of `plugin`.
    async fn release_own(&self, plugin: &str, uri: &str) {
        let table = self.own_table(plugin);
        table
            .release(uri, || async {
                self.subscription(plugin, uri, false);
                if self.closed.is_cancelled() {
                    return;
                }
                if let Some(conn) = self.current(plugin)
                    && let Err(e) = tell(&conn, uri, false).await
                {
                    tracing::debug!(plugin, session = %self.id, "resources/unsubscribe {uri}: {e}");
                }
            })
            .await;
    }

    fn own_table(&self, plugin: &str) -> Arc<Subscriptions> {
        self.own_holds
            .lock()
            .expect("holds lock")
            .entry(plugin.to_owned())
            .or_default()
            .clone()
    }

    /// Whether this session's listeners hold anything on its own instance of `plugin`.
    pub(super) fn holds_on(&self, plugin: &str) -> bool {
        self.own_holds
            .lock()
            .expect("holds lock")
            .get(plugin)
            .is_some_and(|t| !t.is_empty())
    }

    /// Starts this session's instances of the plugins its listeners hold subscriptions on
    /// where none runs (after a crash, or a change of definition): they are subscribed again
    /// as they start.
    pub(super) fn keep_subscribed(&self) {
        let Some(me) = self.me.upgrade() else { return };
        if self.closed.is_cancelled() {
            return;
        }
        let names: Vec<String> = self
            .own_holds
            .lock()
            .expect("holds lock")
            .iter()
            .filter(|(_, t)| !t.is_empty())
            .map(|(name, _)| name.clone())
            .collect();
        let view = self.view();
        for name in names {
            if self.current(&name).is_some() {
                continue;
            }
            let (me, view) = (me.clone(), view.clone());
            tokio::spawn(async move {
                let Some(plugin) = view.find(&name) else {
                    return;
                };
                if let Err(e) = me.plugin(plugin).await {
                    tracing::warn!(plugin = %name, session = %me.id, "an instance for the resource subscriptions held on it did not start: {e}");
                }
            });
        }
    }

    /// A legacy client's `resources/subscribe` (`on`) or `resources/unsubscribe` of `uri` on
    /// a shared plugin: this session holds it or lets go, counted with every other holder
    /// (the plugin hears only the first subscribe and the last unsubscribe). Subscribing
    /// twice holds once; unsubscribing what it does not hold does nothing.
    pub async fn client_shared_subscription(
        &self,
        plugin: &ViewPlugin,
        uri: &str,
        on: bool,
    ) -> Result<(), CallError> {
        let key = (plugin.name().to_owned(), uri.to_owned());
        let changed = {
            let mut held = self.shared_holds.lock().expect("holds lock");
            if on {
                held.insert(key.clone())
            } else {
                held.remove(&key)
            }
        };
        if !changed {
            return Ok(());
        }
        self.subscription(plugin.name(), uri, on);
        if !on {
            self.supervisor.release_shared(plugin.name(), uri).await;
            return Ok(());
        }
        self.supervisor
            .hold_shared(plugin, uri)
            .await
            .inspect_err(|_| {
                self.shared_holds.lock().expect("holds lock").remove(&key);
                self.subscription(plugin.name(), uri, false);
            })
    }

    /// Lets go of everything this session holds on shared plugins (it ends here).
    pub(super) fn release_shared_subscriptions(&self) {
        let Some(holds) = self.shared_holds.if_made() else {
            return;
        };
        let held: Vec<(String, String)> = holds.lock().expect("holds lock").drain().collect();
        if held.is_empty() {
            return;
        }
        let supervisor = self.supervisor.clone();
        tokio::spawn(async move {
            for (plugin, uri) in held {
                supervisor.release_shared(&plugin, &uri).await;
            }
        });
    }
}
