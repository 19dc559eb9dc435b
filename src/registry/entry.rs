//! One plugin as the registry holds it: its definition, where it was declared, its probe's
//! outcome, and the record of its processes that the admin API and the metrics show.
//!
//! The record ([`PluginStats`]) is written by the supervisor ([`crate::supervisor`]), which
//! starts, counts and breaks circuits; this file only keeps it, so that it outlives a
//! redefinition of the plugin. It must never decide anything about processes.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use tokio::sync::watch;

use crate::backend::Era;
use crate::config::PluginConfig;

/// What a plugin said of itself.
#[derive(Debug)]
pub struct PluginInfo {
    /// The era it speaks: its instances are opened in it, without probing again.
    pub era: Era,
    /// False for a remote plugin the upstream would not let the probe in without a person's
    /// token: nothing was found of it, each instance probes for itself.
    pub reached: bool,
    /// The version it answered `initialize` with, or 2026-07-28 for a modern plugin.
    pub protocol_version: String,
    /// From `initialize`, or a modern plugin's `DiscoverResult`.
    pub capabilities: serde_json::Value,
    /// `serverInfo`, or a modern plugin's `_meta["io.modelcontextprotocol/serverInfo"]`.
    pub server_info: Box<RawValue>,
    pub instructions: Option<String>,
    /// Its tools, as listed when probed (for counts and change detection).
    pub tools: usize,
    /// The names of the tools it listed when probed (the first page, at most
    /// [`MAX_PROBED_NAMES`]): a call of one of these needs no list of its own.
    pub tool_names: std::collections::HashSet<String>,
    /// A plugin started with people's credentials: the first page of each list it answered
    /// when probed (as no one), by method. What a person who has not connected yet is shown,
    /// so that they can find the tools whose call asks them to connect.
    pub listed: Vec<(&'static str, Arc<serde_json::Value>)>,
}

/// The lists a plugin started with people's credentials is asked for when probed, and the
/// capability each needs.
pub const PROBED_LISTS: &[(&str, &str)] = &[
    ("tools/list", "tools"),
    ("prompts/list", "prompts"),
    ("resources/list", "resources"),
    ("resources/templates/list", "resources"),
];

/// The largest list page a probe keeps.
pub const MAX_PROBED_LIST_BYTES: usize = 1024 * 1024;

/// Most tool names a probe keeps.
pub const MAX_PROBED_NAMES: usize = 10_000;

#[derive(Debug, Clone)]
pub enum ProbeState {
    /// The first probe is running: a client's `initialize` waits for it.
    Pending,
    Ready(Arc<PluginInfo>),
    Failed {
        /// All of it, for the logs and the admin API.
        error: String,
        /// Which plugin and what failed, for those without a token (`/readyz`): no command
        /// line, no stderr.
        summary: String,
        at: Instant,
    },
    /// A failed plugin is probed again; sessions created meanwhile go without it.
    Reprobing,
}

/// Where a plugin was declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Config,
    Api,
}

/// Counters about one plugin, across all its processes. The supervisor writes them; the
/// admin API and the metrics read them.
#[derive(Debug, Default)]
pub struct PluginStats {
    /// Processes running now (probes excluded), counted from before they start.
    pub running: AtomicUsize,
    pub starts: AtomicU64,
    pub crashes: AtomicU64,
    pub last_error: Mutex<Option<String>>,
    /// The crash breaker's state, kept here so it survives a redefinition like the counters
    /// do. When it trips and for how long is [`crate::supervisor::breaker`]'s to decide.
    pub(crate) breaker: Mutex<BreakerState>,
}

/// What the crash breaker remembers of one plugin.
#[derive(Debug, Default)]
pub(crate) struct BreakerState {
    /// Recent crashes, and whose process each was (`None`: one every client shares).
    pub(crate) recent: VecDeque<(Instant, Option<Arc<str>>)>,
    /// Until when no new process is started, once the breaker has tripped.
    pub(crate) open_until: Option<Instant>,
}

impl PluginStats {
    /// How long the breaker stays open, if it is.
    pub fn breaker_open(&self) -> Option<Duration> {
        let b = self.breaker.lock().expect("breaker lock");
        b.open_until
            .and_then(|t| t.checked_duration_since(Instant::now()))
    }
}

/// One plugin.
#[derive(Debug)]
pub struct PluginEntry {
    pub config: PluginConfig,
    pub source: Source,
    pub enabled: bool,
    /// Changes whenever the plugin is redefined: a session's instance of an older generation
    /// is stopped and started afresh.
    pub generation: u64,
    pub(super) state: watch::Sender<ProbeState>,
    pub stats: Arc<PluginStats>,
    /// The caller's own credentials its processes are started with, by name,
    /// comma-separated (empty: none), as its calls' audit records name them.
    pub credentials: Arc<str>,
}

impl PluginEntry {
    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn state(&self) -> ProbeState {
        self.state.borrow().clone()
    }

    /// The era its instances are opened in: the one its config pins, else the one its probe
    /// found; `None` until probed (an instance then probes for itself).
    pub fn era(&self) -> Option<Era> {
        Era::pinned(self.config.era).or_else(|| match &*self.state.borrow() {
            ProbeState::Ready(info) if info.reached => Some(info.era),
            _ => None,
        })
    }
}
