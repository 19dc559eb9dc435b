//! `per_subject` plugins: one process per person (the token's subject), shared by all that
//! person's legacy sessions and 2026-07-28 calls, and started with their own credentials
//! when the plugin uses any. What the process sends on its own is routed as a shared
//! process's is (`pools.rs`), among that person's sessions alone. A process idle for the
//! plugin's `idle_timeout` (else [`DEFAULT_IDLE`]) stops, and starts again on next use.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::pools::Pools;
use super::{Running, start};
use crate::backend::{BackendError, Personal, PluginConnection, PluginEvents};
use crate::registry::{PluginEntry, ViewPlugin, gateway_init_params};

/// How long a person's process may sit idle when its plugin sets no `idle_timeout`.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(30 * 60);

/// A plugin's name and a person's subject.
pub(super) type SubjectKey = (String, Arc<str>);

/// One person's process of one plugin.
pub(super) struct SubjectProcess {
    pub(super) entry: Arc<PluginEntry>,
    pub(super) running: Mutex<Option<Running>>,
    starting: tokio::sync::Mutex<()>,
}

impl SubjectProcess {
    pub(super) fn current(&self) -> Option<Arc<PluginConnection>> {
        self.running
            .lock()
            .expect("subject lock")
            .as_ref()
            .filter(|r| r.conn.is_alive())
            .map(|r| r.conn.clone())
    }

    pub(super) fn stop(&self) -> bool {
        match self.running.lock().expect("subject lock").take() {
            Some(r) => {
                tokio::spawn(async move { r.conn.shutdown().await });
                true
            }
            None => false,
        }
    }
}

impl Pools {
    /// `subject`'s running process of `plugin` (of its current definition), if any.
    pub(super) fn subject_current(
        &self,
        plugin: &ViewPlugin,
        subject: &str,
    ) -> Option<Arc<PluginConnection>> {
        let map = self.subjects.lock().expect("subjects lock");
        map.get(&(plugin.name().to_owned(), Arc::from(subject)))
            .filter(|p| p.entry.generation == plugin.entry.generation)
            .and_then(|p| p.current())
    }

    /// `subject`'s process of `plugin`, started (with `personal`, their credentials) if need
    /// be.
    pub(super) async fn for_subject(
        self: &Arc<Self>,
        plugin: &ViewPlugin,
        subject: &str,
        personal: Option<&Personal>,
    ) -> Result<Arc<PluginConnection>, BackendError> {
        let key = (plugin.name().to_owned(), Arc::<str>::from(subject));
        let process = {
            let mut map = self.subjects.lock().expect("subjects lock");
            match map.get(&key) {
                Some(p) if p.entry.generation == plugin.entry.generation => p.clone(),
                _ => {
                    let p = Arc::new(SubjectProcess {
                        entry: plugin.entry.clone(),
                        running: Mutex::new(None),
                        starting: tokio::sync::Mutex::new(()),
                    });
                    if let Some(old) = map.insert(key.clone(), p.clone()) {
                        old.stop();
                    }
                    p
                }
            }
        };
        if let Some(c) = process.current() {
            return Ok(c);
        }
        let _starting = process.starting.lock().await;
        if let Some(c) = process.current() {
            return Ok(c);
        }
        // A process that died stops counting against the limits before its successor starts.
        process.running.lock().expect("subject lock").take();
        let events = self.subject_events(key.1.clone());
        let events: std::sync::Weak<dyn PluginEvents> =
            Arc::downgrade(&events) as std::sync::Weak<dyn PluginEvents>;
        let running = start(
            &self.limits,
            &process.entry,
            Arc::from("per-subject"),
            &gateway_init_params(),
            Some(&key.1),
            Some(events),
            personal,
        )
        .await?;
        let still_current = self
            .subjects
            .lock()
            .expect("subjects lock")
            .get(&key)
            .is_some_and(|p| Arc::ptr_eq(p, &process));
        if !still_current || !self.registry.is_current(plugin) {
            running.conn.shutdown().await;
            return Err(super::changed(plugin));
        }
        let conn = running.conn.clone();
        *process.running.lock().expect("subject lock") = Some(running);
        Ok(conn)
    }

    /// Stops the processes of `plugin` for `subject`, or for everyone (`None`); how many.
    pub(super) fn stop_subject(&self, plugin: &str, subject: Option<&str>) -> usize {
        let map = self.subjects.lock().expect("subjects lock");
        map.iter()
            .filter(|((p, s), _)| p == plugin && subject.is_none_or(|w| &**s == w))
            .map(|(_, process)| usize::from(process.stop()))
            .sum()
    }

    /// Stops `conn` if it is a person's process; whether it was.
    pub(super) fn stop_subject_conn(&self, conn: &Arc<PluginConnection>) -> bool {
        let map = self.subjects.lock().expect("subjects lock");
        map.values()
            .find(|p| p.current().is_some_and(|c| Arc::ptr_eq(&c, conn)))
            .is_some_and(|p| p.stop())
    }

    /// Every person's running process: its plugin, whose it is, the connection.
    pub(super) fn subject_conns(&self) -> Vec<(String, Arc<str>, Arc<PluginConnection>)> {
        let map = self.subjects.lock().expect("subjects lock");
        map.iter()
            .filter_map(|((plugin, subject), p)| {
                Some((plugin.clone(), subject.clone(), p.current()?))
            })
            .collect()
    }

    /// Takes a dead process out of the people's; whether it was one's current process.
    pub(super) fn forget_subject(&self, conn: &Arc<PluginConnection>) -> Option<Arc<str>> {
        let map = self.subjects.lock().expect("subjects lock");
        for ((_, subject), p) in map.iter() {
            let mut running = p.running.lock().expect("subject lock");
            if running.as_ref().is_some_and(|r| Arc::ptr_eq(&r.conn, conn)) {
                running.take();
                return Some(subject.clone());
            }
        }
        None
    }

    /// Stops people's processes idle too long, and those of plugins that left or changed
    /// (`current` says whether a definition is still the registry's).
    pub(super) fn reap_subjects(&self, current: impl Fn(&str, u64) -> bool) {
        let mut map = self.subjects.lock().expect("subjects lock");
        map.retain(|(plugin, _), p| {
            if !current(plugin, p.entry.generation) {
                p.stop();
                return false;
            }
            let idle = p.entry.config.idle_timeout.unwrap_or(DEFAULT_IDLE);
            match p.current() {
                Some(c) if c.idle_for().is_some_and(|d| d >= idle) => {
                    tracing::info!(plugin = %plugin, "a person's process idle for {} s: stopped", idle.as_secs());
                    p.stop();
                    false
                }
                Some(_) => true,
                // Gone (stopped or crashed): nothing to keep.
                None => p.starting.try_lock().is_err(),
            }
        });
    }
}
