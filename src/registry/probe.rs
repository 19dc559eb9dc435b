//! The start-up probe: each plugin is started once when it appears or changes, opened with the
//! gateway's own client capabilities (its era found legacy first: `initialize`, then
//! `server/discover` if it refuses, so a plugin that speaks both is served in the legacy era;
//! or pinned by its `era`; the rule is [`crate::backend::PluginConnection::open`]'s), asked
//! for its tools, and stopped. What it said, and its era, become the entry's [`ProbeState`], from
//! which a client's `initialize` and `server/discover` are answered.
//!
//! A probe is not an instance: it is not counted against the limits, never restarted, and
//! not subject to the crash breaker (those are [`crate::supervisor`]'s). It must never serve a
//! client's request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::value::RawValue;

use super::{PluginEntry, PluginInfo, ProbeState};
use crate::backend::{Era, start_plugin};
use crate::protocol;

/// How long after a failed probe a new session may trigger another.
pub(super) const REPROBE_AFTER: Duration = Duration::from_secs(30);

/// The `initialize` params the gateway sends on its own behalf.
pub fn gateway_init_params() -> Box<RawValue> {
    let params = serde_json::json!({
        "protocolVersion": protocol::LATEST,
        "capabilities": { "roots": { "listChanged": true }, "sampling": {}, "elicitation": {} },
        "clientInfo": { "name": "mcp-gateway", "version": env!("CARGO_PKG_VERSION") },
    });
    RawValue::from_string(params.to_string()).expect("valid JSON")
}

/// A modern plugin's resource subscriptions come only through `subscriptions/listen`, which
/// the gateway does not open toward plugins: its `resources.subscribe` is not offered on.
fn without_subscriptions(capabilities: &mut serde_json::Value) {
    if let Some(r) = capabilities
        .get_mut("resources")
        .and_then(serde_json::Value::as_object_mut)
    {
        r.remove("subscribe");
    }
}

pub(super) async fn probe(entry: &PluginEntry) -> ProbeState {
    let started = Instant::now();
    // A plugin started with a person's credential is probed as no one: each credential empty.
    let nobody = crate::backend::Personal {
        values: crate::config::credentials_used(&entry.config)
            .into_iter()
            .map(|c| (c.to_owned(), String::new()))
            .collect(),
        on_refused: None,
    };
    // A remote server refusing no one's credentials (a 401 or 403): heard, not guessed.
    let refused = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let nobody = crate::backend::Personal {
        on_refused: (!nobody.values.is_empty()).then(|| {
            let refused = refused.clone();
            let hook: crate::backend::OnRefused = Arc::new(move |_| {
                refused.store(true, std::sync::atomic::Ordering::Relaxed);
                Box::pin(async { false })
            });
            hook
        }),
        ..nobody
    };
    let result = start_plugin(
        &entry.config,
        Arc::from("probe"),
        &gateway_init_params(),
        Era::pinned(entry.config.era),
        None,
        Some(&nobody),
    )
    .await;
    match result {
        Ok(conn) => {
            let init = conn.info().expect("initialized");
            let mut capabilities: serde_json::Value =
                serde_json::from_str(init.capabilities.get()).unwrap_or_default();
            if conn.is_modern() {
                without_subscriptions(&mut capabilities);
            }
            let personal = !nobody.values.is_empty();
            let mut listed = Vec::new();
            let mut tool_names = std::collections::HashSet::new();
            for (method, capability) in super::entry::PROBED_LISTS {
                let wanted = *method == "tools/list" || personal;
                if !wanted || capabilities.get(capability).is_none() {
                    continue;
                }
                let answer =
                    tokio::time::timeout(entry.config.startup_timeout, conn.call(method, None))
                        .await;
                let Ok(Ok(raw)) = answer else { continue };
                if raw.get().len() > super::entry::MAX_PROBED_LIST_BYTES {
                    continue;
                }
                let Ok(page) = serde_json::from_str::<serde_json::Value>(raw.get()) else {
                    continue;
                };
                if *method == "tools/list"
                    && let Some(tools) = page.get("tools").and_then(|t| t.as_array())
                {
                    tool_names = tools
                        .iter()
                        .filter_map(|t| t.get("name")?.as_str())
                        .take(super::entry::MAX_PROBED_NAMES)
                        .map(str::to_owned)
                        .collect();
                }
                if personal {
                    listed.push((*method, Arc::new(page)));
                }
            }
            let tools = tool_names
                .iter()
                .filter(|n| entry.config.allows_tool(n))
                .count();
            let info = PluginInfo {
                era: conn.era(),
                reached: true,
                protocol_version: init.protocol_version.clone(),
                capabilities,
                server_info: init.server_info.clone(),
                instructions: init.instructions.clone(),
                tools,
                tool_names,
                listed,
            };
            conn.shutdown().await;
            tracing::info!(
                plugin = %entry.name(),
                era = %info.era,
                version = %info.protocol_version,
                tools,
                "plugin probed in {} ms",
                started.elapsed().as_millis()
            );
            ProbeState::Ready(Arc::new(info))
        }
        Err(_) if refused.load(std::sync::atomic::Ordering::Relaxed) => {
            tracing::info!(plugin = %entry.name(), url = %entry.config.command_line(), "the upstream lets no one in without a person's token: its lists are each person's own, once they connect");
            ProbeState::Ready(Arc::new(PluginInfo {
                era: Era::Legacy,
                reached: false,
                protocol_version: crate::protocol::PLUGIN_VERSIONS[0].to_owned(),
                capabilities: serde_json::json!({"tools": {"listChanged": true}, "prompts": {"listChanged": true}, "resources": {"listChanged": true}}),
                server_info: serde_json::value::RawValue::from_string(
                    serde_json::json!({"name": entry.name(), "version": "unknown"}).to_string(),
                )
                .expect("serialized JSON is JSON"),
                instructions: None,
                tools: 0,
                tool_names: Default::default(),
                listed: Vec::new(),
            }))
        }
        Err(e) => {
            tracing::error!(plugin = %entry.name(), command = %entry.config.command_line(), "{e}; its tools are absent until it starts");
            *entry.stats.last_error.lock().expect("stats lock") = Some(e.to_string());
            ProbeState::Failed {
                error: e.to_string(),
                summary: e.client_message(),
                at: Instant::now(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_modern_plugins_subscriptions_are_not_offered() {
        let mut caps =
            serde_json::json!({"resources": {"subscribe": true, "listChanged": true}, "tools": {}});
        without_subscriptions(&mut caps);
        assert_eq!(
            caps,
            serde_json::json!({"resources": {"listChanged": true}, "tools": {}})
        );
        let mut none = serde_json::json!({"tools": {}});
        without_subscriptions(&mut none);
        assert_eq!(none, serde_json::json!({"tools": {}}));
    }
}
