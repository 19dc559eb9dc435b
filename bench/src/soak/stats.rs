//! The run's counters, shared by every session: what was checked and found right, and the
//! errors, losses and repeats by kind, each with an example.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Counters shared by every session.
#[derive(Default)]
pub(super) struct Stats {
    pub(super) sessions_opened: AtomicU64,
    pub(super) sessions_ended: AtomicU64,
    pub(super) sessions_open: AtomicU64,
    pub(super) echo_ok: AtomicU64,
    pub(super) bursts_ok: AtomicU64,
    pub(super) background_ok: AtomicU64,
    pub(super) pairs: AtomicU64,
    pub(super) get_resumes: AtomicU64,
    pub(super) post_resumes: AtomicU64,
    /// POST streams that ended before the cut could be made (the client read too slowly).
    pub(super) resumes_skipped: AtomicU64,
    pub(super) events: AtomicU64,
    /// Tagged notifications that arrived (each checked against what was asked for).
    pub(super) notifications: AtomicU64,
    /// Of those, the ones that came on a resumed connection (replayed, or live after it).
    pub(super) replayed: AtomicU64,
    pub(super) injected_crashes: AtomicU64,
    pub(super) victims: AtomicU64,
    /// Crash tokens handed out and not yet taken by a session.
    pub(super) crashes_due: AtomicU64,
    pub(super) errors: Mutex<BTreeMap<String, Tally>>,
    pub(super) lost: Mutex<BTreeMap<String, Tally>>,
    pub(super) duplicates: Mutex<BTreeMap<String, Tally>>,
    pub(super) latency: Mutex<Option<Histogram<u64>>>,
    /// `--drop-events`.
    pub(super) drop_events: u64,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub(super) struct Tally {
    pub(super) count: u64,
    pub(super) example: String,
}

pub(super) fn tally(map: &Mutex<BTreeMap<String, Tally>>, kind: &str, n: u64, example: String) {
    let mut m = map.lock().expect("stats lock");
    let t = m.entry(kind.to_owned()).or_default();
    if t.count == 0 {
        t.example = example.chars().take(300).collect();
    }
    t.count += n;
}

pub(super) fn total(map: &Mutex<BTreeMap<String, Tally>>) -> u64 {
    map.lock()
        .expect("stats lock")
        .values()
        .map(|t| t.count)
        .sum()
}

impl Stats {
    pub(super) fn error(&self, kind: &str, example: impl Into<String>) {
        tally(&self.errors, kind, 1, example.into());
    }
    pub(super) fn lost(&self, kind: &str, n: u64, example: impl Into<String>) {
        tally(&self.lost, kind, n, example.into());
    }
    pub(super) fn duplicate(&self, kind: &str, n: u64, example: impl Into<String>) {
        tally(&self.duplicates, kind, n, example.into());
    }
    pub(super) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
    pub(super) fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
    pub(super) fn record_latency(&self, d: Duration) {
        let mut h = self.latency.lock().expect("stats lock");
        let h = h.get_or_insert_with(|| Histogram::new(3).expect("histogram"));
        let _ = h.record(d.as_micros().max(1) as u64);
    }
}
