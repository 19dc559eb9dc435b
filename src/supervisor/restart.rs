//! One owner's instance of one plugin, restarted with backoff.
//!
//! A [`Slot`] holds the running process of one plugin definition for one owner (a session,
//! for a per-session plugin), the lock that orders its starts (concurrent first uses start
//! one child), and its recent crashes. After a crash nothing restarts at once: the next use
//! waits out a backoff that doubles with each crash (with jitter, so instances that crashed
//! together do not restart together), and a process that ran a minute before failing starts
//! its backoff over. A crash also counts towards the plugin's [breaker](super::breaker).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Running, breaker};
use crate::backend::PluginConnection;
use crate::registry::{PluginEntry, PluginInfo, ViewPlugin};

/// Longest wait between restarts of a crashing plugin.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// One plugin as seen by one owner: its instance there, for one generation of its
/// definition.
pub struct Slot {
    pub entry: Arc<PluginEntry>,
    pub info: Arc<PluginInfo>,
    running: Mutex<Option<Running>>,
    /// Held while starting, so concurrent first uses start one child.
    start_lock: tokio::sync::Mutex<()>,
    crashes: Mutex<Crashes>,
}

/// A slot's recent crashes, for its backoff.
#[derive(Default)]
struct Crashes {
    count: u32,
    last: Option<Instant>,
}

impl Slot {
    /// An empty slot for a plugin of the view.
    pub fn new(plugin: &ViewPlugin) -> Slot {
        Slot {
            entry: plugin.entry.clone(),
            info: plugin.info.clone(),
            running: Mutex::new(None),
            start_lock: tokio::sync::Mutex::new(()),
            crashes: Mutex::new(Crashes::default()),
        }
    }

    /// The running instance, if it is alive.
    pub fn current(&self) -> Option<Arc<PluginConnection>> {
        self.running
            .lock()
            .expect("slot lock")
            .as_ref()
            .filter(|r| r.conn.is_alive())
            .map(|r| r.conn.clone())
    }

    pub fn has_capability(&self, name: &str) -> bool {
        self.info
            .capabilities
            .get(name)
            .is_some_and(|c| !c.is_null())
    }

    /// Whether `conn` is this slot's instance.
    pub fn holds(&self, conn: &Arc<PluginConnection>) -> bool {
        self.running
            .lock()
            .expect("slot lock")
            .as_ref()
            .is_some_and(|r| Arc::ptr_eq(&r.conn, conn))
    }

    /// Puts a started instance in the slot.
    pub(crate) fn put(&self, running: Running) {
        *self.running.lock().expect("slot lock") = Some(running);
    }

    /// Takes the instance out of the slot.
    pub(crate) fn take_running(&self) -> Option<Running> {
        self.running.lock().expect("slot lock").take()
    }

    /// Stops the slot's instance in the background; it counts against the limits until gone.
    pub fn stop(&self) {
        if let Some(running) = self.take_running() {
            tokio::spawn(async move { running.conn.shutdown().await });
        }
    }

    /// Stops the slot's instance and waits until it is gone.
    pub async fn shutdown(&self) {
        if let Some(running) = self.take_running() {
            running.conn.shutdown().await;
        }
    }

    /// Waits for the right to start the slot's instance: one start at a time.
    pub async fn starting(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.start_lock.lock().await
    }

    /// Waits out the backoff after a crash, if one is due. `owner` labels the log line.
    pub async fn wait_backoff(&self, owner: &str) {
        if let Some(wait) = self.backoff() {
            tracing::info!(plugin = %self.entry.name(), session = %owner, "restarting the plugin in {} ms", wait.as_millis());
            tokio::time::sleep(wait).await;
        }
    }

    /// The slot's instance exited (it was already taken out of the slot), not on the
    /// gateway's order: the crash is logged and recorded, it counts towards the backoff and
    /// the breaker (as `client`'s own process). `owner` labels the log line.
    pub fn crashed(&self, conn: &PluginConnection, client: &Arc<str>, owner: &str) {
        let report = conn.exit_report();
        tracing::warn!(plugin = %conn.name(), session = %owner, "{report}; it restarts on the next request");
        *self.entry.stats.last_error.lock().expect("stats lock") = Some(report);
        self.count_crash();
        if breaker::record_crash(&self.entry, Some(client)) {
            tracing::error!(plugin = %conn.name(), "plugin keeps crashing: the circuit breaker is open");
        }
    }

    /// Counts a crash (or a failed start) towards the backoff.
    pub(crate) fn count_crash(&self) {
        let mut c = self.crashes.lock().expect("crash lock");
        // A plugin that ran for a while before failing starts its backoff over.
        if c.last
            .is_some_and(|t| t.elapsed() > Duration::from_secs(60))
        {
            c.count = 0;
        }
        c.count += 1;
        c.last = Some(Instant::now());
    }

    fn backoff(&self) -> Option<Duration> {
        let c = self.crashes.lock().expect("crash lock");
        let last = c.last?;
        let wait =
            Duration::from_millis(100u64.saturating_mul(1 << c.count.min(10))).min(MAX_BACKOFF);
        // Jitter, so sessions whose instances crashed together do not restart together.
        let wait = wait.mul_f64(1.0 + rand::random::<f64>() * 0.5);
        wait.checked_sub(last.elapsed())
    }
}
