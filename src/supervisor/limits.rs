//! How many plugin processes may run: per plugin (`max_children` in its definition) and for
//! the whole gateway (`max_children` at the top of the config). A process is counted from
//! before it starts until its [`Reservation`] is dropped, so concurrent starts cannot pass a
//! limit together. Probes are not counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::registry::{PluginEntry, PluginStats};

/// The gateway-wide count and limit; each plugin's count is in its [`PluginStats`].
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// Plugin processes running (or starting) now, all plugins together.
    total_running: Arc<AtomicUsize>,
    /// The gateway-wide limit, if any.
    max_children: Option<usize>,
}

/// A started (or starting) process, counted against the limits until dropped.
pub struct Reservation {
    stats: Arc<PluginStats>,
    total: Arc<AtomicUsize>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.stats.running.fetch_sub(1, Ordering::Relaxed);
        self.total.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Limits {
    pub(crate) fn new(max_children: Option<usize>) -> Limits {
        Limits {
            total_running: Arc::new(AtomicUsize::new(0)),
            max_children,
        }
    }

    /// Counts one more process of `entry` against the limits, or says which limit it meets.
    pub(crate) fn reserve(&self, entry: &PluginEntry) -> Result<Reservation, String> {
        let total = self.total_running.fetch_add(1, Ordering::AcqRel) + 1;
        let own = entry.stats.running.fetch_add(1, Ordering::AcqRel) + 1;
        let reservation = Reservation {
            stats: entry.stats.clone(),
            total: self.total_running.clone(),
        };
        if let Some(max) = entry.config.max_children.filter(|m| own > *m) {
            return Err(format!(
                "it runs its limit of {max} processes (max_children)"
            ));
        }
        if let Some(max) = self.max_children.filter(|m| total > *m) {
            return Err(format!(
                "the gateway runs its limit of {max} plugin processes (max_children)"
            ));
        }
        Ok(reservation)
    }

    /// Plugin processes running now, all plugins together.
    pub(crate) fn total_running(&self) -> usize {
        self.total_running.load(Ordering::Relaxed)
    }
}
