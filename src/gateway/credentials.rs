//! People's credentials seen from the running instances: which instances were started with
//! whose credential, stopping them when it is revoked, and replacing them when it changes.
//!
//! [`watch`] runs for the gateway's lifetime when credentials are set up. Every second it
//! refreshes, through the broker, the OAuth tokens of running instances that are near their
//! end; every few seconds it asks the database whether each running instance's credential is
//! still the one it was started with, so a disconnect, a revocation, a refresh or a new
//! connection made on another replica reaches this one's instances too. An instance whose
//! credential changed is replaced once it is idle (stopped; the next call starts it with the
//! new value); one whose credential is gone is stopped at once, and its next call asks again.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::Gateway;
use crate::backend::PluginConnection;
use crate::credentials::{Broker, Check, Event};
use crate::session::Session;

/// An instance started with a person's credential, as it was when marked.
#[derive(Clone)]
enum Instance {
    /// A session's own instance of a plugin.
    Session(Weak<Session>, String, Weak<PluginConnection>),
    /// A person's process of a `per_subject` plugin.
    Subject(Weak<PluginConnection>),
}

/// How often running instances' credentials are looked at for a refresh.
const TICK: Duration = Duration::from_secs(1);

/// Every how many ticks the database is asked whether they changed or went.
const CHECK_EVERY: u32 = 3;

/// Every how many ticks the credentials defined through the admin API are read again.
const RELOAD_EVERY: u32 = 5;

impl Gateway {
    /// The plugins started with credential `name`.
    pub fn credential_users(&self, name: &str) -> Vec<String> {
        self.registry
            .entries()
            .iter()
            .filter(|e| crate::config::credentials_used(&e.config).contains(name))
            .map(|e| e.name().to_owned())
            .collect()
    }

    /// Stops the running instances, on this replica, of the plugins started with credential
    /// `name`, for `subject` or for everyone (`None`): their value is gone, and their next
    /// call asks again. How many stopped.
    pub fn stop_credential_users(&self, name: &str, subject: Option<&str>) -> usize {
        let plugins = self.credential_users(name);
        let supervisor = &self.sessions.supervisor;
        let mut stopped: usize = plugins
            .iter()
            .map(|p| supervisor.stop_subject(p, subject))
            .sum();
        for s in self.people_sessions() {
            let theirs = subject.is_none_or(|wanted| s.owner.as_deref() == Some(wanted));
            if theirs {
                for p in &plugins {
                    stopped += usize::from(s.stop_instance(p));
                }
            }
        }
        stopped
    }

    /// The sessions, of both eras, that belong to someone.
    fn people_sessions(&self) -> Vec<Arc<Session>> {
        self.sessions
            .all()
            .into_iter()
            .chain(self.sessions.caller_sessions())
            .filter(|s| s.owner.is_some())
            .collect()
    }

    /// The (subject, credential) pairs of the instances running now, and by which sessions'
    /// instances of which plugins.
    fn running_credentials(&self) -> HashMap<(String, String), Vec<Instance>> {
        let mut users: HashMap<(String, String), Vec<Instance>> = HashMap::new();
        let entries = self.registry.entries();
        if !entries.iter().any(|e| !e.credentials.is_empty()) {
            return users;
        }
        for s in self.people_sessions() {
            let Some(owner) = s.owner.clone() else {
                continue;
            };
            for e in entries.iter() {
                let used = crate::config::credentials_used(&e.config);
                if used.is_empty() {
                    continue;
                }
                let Some(conn) = s.current(e.name()) else {
                    continue;
                };
                for name in used {
                    users
                        .entry((owner.clone(), name.to_owned()))
                        .or_default()
                        .push(Instance::Session(
                            Arc::downgrade(&s),
                            e.name().to_owned(),
                            Arc::downgrade(&conn),
                        ));
                }
            }
        }
        for (plugin, subject, conn) in self.sessions.supervisor.subject_conns() {
            let Some(e) = entries.iter().find(|e| e.name() == plugin) else {
                continue;
            };
            for name in crate::config::credentials_used(&e.config) {
                users
                    .entry((subject.to_string(), name.to_owned()))
                    .or_default()
                    .push(Instance::Subject(Arc::downgrade(&conn)));
            }
        }
        users
    }
}

/// Starts the watch of `gateway`'s running credentials, if it keeps any.
pub(super) fn watch(gateway: &Arc<Gateway>) {
    let Some(broker) = gateway.sessions.supervisor.credentials().cloned() else {
        return;
    };
    let events = broker.subscribe();
    let shutdown = gateway.shutdown.clone();
    let weak = Arc::downgrade(gateway);
    tokio::spawn(async move {
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = run(weak, broker, events) => {}
        }
    });
}

async fn run(
    gateway: Weak<Gateway>,
    broker: Arc<Broker>,
    mut events: tokio::sync::broadcast::Receiver<Event>,
) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Instances to replace once idle.
    let mut replace: Vec<Instance> = Vec::new();
    let mut n: u32 = 0;
    loop {
        let event = tokio::select! {
            e = events.recv() => Some(e),
            _ = tick.tick() => None,
        };
        let Some(g) = gateway.upgrade() else { return };
        match event {
            Some(Ok(Event::Refreshed { subject, name })) => {
                if let Some(users) = g
                    .running_credentials()
                    .remove(&(subject.clone(), name.clone()))
                {
                    update(&g, &broker, &subject, &name, users, &mut replace).await;
                }
            }
            Some(Ok(Event::Lost { subject, name, why })) => {
                tracing::info!(subject = %subject, credential = %name, "credential lost: {why}");
                g.audit.credential(&subject, "refresh", &name, 401);
                g.stop_credential_users(&name, Some(&subject));
            }
            Some(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => {}
            Some(Err(tokio::sync::broadcast::error::RecvError::Closed)) => return,
            None => {
                n = n.wrapping_add(1);
                // Definitions the admin API changed on another replica.
                if n.is_multiple_of(RELOAD_EVERY) {
                    match broker.reload_definitions().await {
                        Ok(true) => g.registry.set_credential_names(broker.names()),
                        Ok(false) => {}
                        Err(e) => tracing::warn!("credentials: {e}"),
                    }
                }
                let running = g.running_credentials();
                for ((subject, name), users) in &running {
                    if broker.due(subject, name) {
                        if !broker.renews_itself(name) {
                            // Started again when idle, with a value obtained afresh.
                            replace.extend(users.iter().cloned());
                            continue;
                        }
                        // Refreshes it (and says so by an event), or finds it gone.
                        if let Err(e) = broker.value(subject, name).await {
                            tracing::warn!(subject = %subject, credential = %name, "credentials: {e}");
                        }
                        continue;
                    }
                    if !n.is_multiple_of(CHECK_EVERY) {
                        continue;
                    }
                    match broker.check(subject, name).await {
                        Ok(Check::Same) => {}
                        Ok(Check::Changed) => {
                            update(&g, &broker, subject, name, users.clone(), &mut replace).await;
                        }
                        Ok(Check::Gone) => {
                            let stopped = g.stop_credential_users(name, Some(subject));
                            tracing::info!(subject = %subject, credential = %name, stopped, "credential gone: its instances stopped");
                        }
                        Err(e) => {
                            tracing::warn!(subject = %subject, credential = %name, "credentials: {e}")
                        }
                    }
                }
                replace_idle(&g, &mut replace);
            }
        }
    }
}

/// `subject`'s credential `name` changed: instances given it only as a file get the new
/// value written in place; the others are to be replaced once idle.
async fn update(
    g: &Gateway,
    broker: &Broker,
    subject: &str,
    name: &str,
    users: Vec<Instance>,
    replace: &mut Vec<Instance>,
) {
    let entries = g.registry.entries();
    let mut value: Option<Option<String>> = None;
    for u in users {
        let conn = match &u {
            Instance::Session(_, _, c) | Instance::Subject(c) => c.upgrade(),
        };
        let in_files = conn.as_ref().is_some_and(|c| {
            entries
                .iter()
                .find(|e| e.name() == c.name())
                .is_some_and(|e| crate::config::credential_in_files_only(&e.config, name))
        });
        if in_files && let Some(conn) = conn {
            if value.is_none() {
                value = Some(match broker.value(subject, name).await {
                    Ok(v) => v.map(|v| v.value),
                    Err(e) => {
                        tracing::warn!(subject, credential = name, "credentials: {e}");
                        None
                    }
                });
            }
            if let Some(Some(v)) = &value
                && conn.rewrite_credential_file(name, v)
            {
                tracing::info!(plugin = %conn.name(), credential = name, "the credential's file was written again in place");
                continue;
            }
        }
        replace.push(u);
    }
}

/// Stops the instances in `replace` that are idle (their next call starts them with the new
/// value); keeps the busy ones for the next tick.
fn replace_idle(g: &Gateway, replace: &mut Vec<Instance>) {
    let mut seen = BTreeSet::new();
    replace.retain(|instance| match instance {
        Instance::Session(session, plugin, marked) => {
            let Some(s) = session.upgrade() else {
                return false;
            };
            if !seen.insert((s.id.to_string(), plugin.clone())) {
                return false;
            }
            match s.current(plugin) {
                // Gone, or started again since (with the new value).
                None => false,
                Some(c) if !std::ptr::eq(Arc::as_ptr(&c), marked.as_ptr()) => false,
                Some(c) if c.idle_for().is_some() => {
                    s.stop_instance(plugin);
                    tracing::info!(session = %s.id, plugin = %plugin, "instance replaced: its credential changed");
                    false
                }
                Some(_) => true,
            }
        }
        Instance::Subject(marked) => {
            let Some(c) = marked.upgrade() else {
                return false;
            };
            if !seen.insert((format!("{:p}", Arc::as_ptr(&c)), String::new())) {
                return false;
            }
            if !c.is_alive() {
                return false;
            }
            if c.idle_for().is_some() {
                g.sessions.supervisor.stop_subject_conn(&c);
                tracing::info!(plugin = %c.name(), "a person's process replaced: their credential changed");
                return false;
            }
            true
        }
    });
}
