//! The configured plugins and what each said of itself when the gateway probed it.
//!
//! At start-up each plugin is started once, initialized with the gateway's own client
//! capabilities, and stopped; its capabilities, server info and instructions are kept. A
//! client's `initialize` is then answered from these, and a session starts its own instance of
//! a plugin only when it first uses it. A plugin whose probe failed is left out of new sessions
//! (its tools are absent) and probed again later; the others keep working.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use tokio::sync::watch;

use crate::config::{Config, PluginConfig};
use crate::protocol;

/// How long after a failed probe a new session may trigger another.
const REPROBE_AFTER: Duration = Duration::from_secs(30);

/// What a plugin said of itself.
#[derive(Debug)]
pub struct PluginInfo {
    pub protocol_version: String,
    pub capabilities: serde_json::Value,
    pub server_info: Box<RawValue>,
    pub instructions: Option<String>,
}

#[derive(Debug, Clone)]
pub enum ProbeState {
    /// The first probe is running: a client's `initialize` waits for it.
    Pending,
    Ready(Arc<PluginInfo>),
    Failed {
        error: String,
        at: Instant,
    },
    /// A failed plugin is probed again; sessions created meanwhile go without it.
    Reprobing,
}

/// One configured plugin.
#[derive(Debug)]
pub struct PluginEntry {
    pub config: PluginConfig,
    /// Prefix of its tool and prompt names, if names are prefixed.
    pub prefix: Option<String>,
    state: watch::Sender<ProbeState>,
}

impl PluginEntry {
    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn state(&self) -> ProbeState {
        self.state.borrow().clone()
    }
}

pub struct Catalog {
    entries: Vec<Arc<PluginEntry>>,
}

impl Catalog {
    pub fn new(config: &Config) -> Catalog {
        let entries = config
            .plugins
            .iter()
            .map(|p| {
                Arc::new(PluginEntry {
                    config: p.clone(),
                    prefix: config.prefix_of(p).map(str::to_owned),
                    state: watch::Sender::new(ProbeState::Pending),
                })
            })
            .collect();
        Catalog { entries }
    }

    pub fn entries(&self) -> &[Arc<PluginEntry>] {
        &self.entries
    }

    /// Probes every plugin in the background.
    pub fn start_probes(&self) {
        for entry in &self.entries {
            tokio::spawn(probe(entry.clone()));
        }
    }

    /// The plugins usable now, once no probe is pending (or `timeout` passed). Failed probes
    /// old enough are retried in the background for later sessions.
    pub async fn ready(&self, timeout: Duration) -> Vec<(Arc<PluginEntry>, Arc<PluginInfo>)> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut out = Vec::with_capacity(self.entries.len());
        for entry in &self.entries {
            let mut rx = entry.state.subscribe();
            let state = match tokio::time::timeout_at(
                deadline,
                rx.wait_for(|s| !matches!(s, ProbeState::Pending)),
            )
            .await
            {
                Ok(Ok(s)) => s.clone(),
                _ => continue,
            };
            match state {
                ProbeState::Ready(info) => out.push((entry.clone(), info)),
                ProbeState::Failed { .. } => {
                    // Claimed atomically: one re-probe, however many sessions start now.
                    let claimed = entry.state.send_if_modified(|s| match s {
                        ProbeState::Failed { at, .. } if at.elapsed() > REPROBE_AFTER => {
                            *s = ProbeState::Reprobing;
                            true
                        }
                        _ => false,
                    });
                    if claimed {
                        tokio::spawn(probe(entry.clone()));
                    }
                }
                ProbeState::Pending | ProbeState::Reprobing => {}
            }
        }
        out
    }
}

/// The `initialize` params the gateway sends on its own behalf.
pub fn gateway_init_params() -> Box<RawValue> {
    let params = serde_json::json!({
        "protocolVersion": protocol::LATEST,
        "capabilities": { "roots": { "listChanged": true }, "sampling": {}, "elicitation": {} },
        "clientInfo": { "name": "mcp-gateway", "version": env!("CARGO_PKG_VERSION") },
    });
    RawValue::from_string(params.to_string()).expect("valid JSON")
}

async fn probe(entry: Arc<PluginEntry>) {
    let started = Instant::now();
    let result = super::start_plugin(
        &entry.config,
        Arc::from("probe"),
        &gateway_init_params(),
        None,
    )
    .await;
    let state = match result {
        Ok(conn) => {
            let info = conn.info().expect("initialized");
            let info = PluginInfo {
                protocol_version: info.protocol_version.clone(),
                capabilities: serde_json::from_str(info.capabilities.get()).unwrap_or_default(),
                server_info: info.server_info.clone(),
                instructions: info.instructions.clone(),
            };
            conn.shutdown().await;
            tracing::info!(
                plugin = %entry.name(),
                version = %info.protocol_version,
                "plugin probed in {} ms",
                started.elapsed().as_millis()
            );
            ProbeState::Ready(Arc::new(info))
        }
        Err(e) => {
            tracing::error!(plugin = %entry.name(), command = %entry.config.command_line(), "{e}; its tools are absent until it starts");
            ProbeState::Failed {
                error: e.to_string(),
                at: Instant::now(),
            }
        }
    };
    entry.state.send_replace(state);
}
