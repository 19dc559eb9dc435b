//! What `initialize` answers: the plugins' capabilities merged, the server info (the only
//! plugin's own, or the gateway's), and their instructions. It depends on the view alone, so
//! it is made once per view.

use serde_json::value::RawValue;

use crate::registry::View;

use super::tasks;

/// The `initialize` result with `view` in protocol `version`. All but the version depends on
/// the view alone (merged capabilities, server info, instructions), so it is made once per
/// view and kept in it.
pub fn initialize_result(view: &View, version: &str) -> Box<RawValue> {
    let rest = view.initialize.get_or_init(|| initialize_rest(view));
    // `rest` is an object with at least `capabilities`; the version is one of ours (no
    // escapes needed).
    RawValue::from_string(format!(r#"{{"protocolVersion":"{version}",{}"#, &rest[1..]))
        .expect("valid JSON")
}

/// The `server/discover` result of a view (2026-07-28): every version served, the same
/// merged capabilities, server info and instructions as `initialize` gives, and caching hints.
pub fn discover_result(view: &View, cache_scope: &str) -> Box<RawValue> {
    let rest = view.initialize.get_or_init(|| initialize_rest(view));
    let rest: serde_json::Value = serde_json::from_str(rest).unwrap_or_default();
    // Tasks are the extension's for a modern client: the 2025-11-25 slot is not shown.
    let mut capabilities = rest["capabilities"].clone();
    if let Some(caps) = capabilities.as_object_mut() {
        caps.remove("tasks");
        if super::modern_tasks::offers_tasks(view) {
            caps.insert(
                "extensions".into(),
                serde_json::json!({ crate::protocol::modern::TASKS_EXTENSION: {} }),
            );
        }
    }
    let mut out = serde_json::json!({
        "resultType": "complete",
        "supportedVersions": crate::protocol::modern::supported_versions(),
        "capabilities": capabilities,
        "_meta": { crate::protocol::modern::META_SERVER_INFO: rest["serverInfo"] },
        "ttlMs": 0,
        "cacheScope": cache_scope,
    });
    if let Some(text) = rest.get("instructions") {
        out["instructions"] = text.clone();
    }
    RawValue::from_string(out.to_string()).expect("valid JSON")
}

fn initialize_rest(view: &View) -> Box<str> {
    let capabilities: Vec<serde_json::Value> = view
        .plugins
        .iter()
        .map(|p| p.info.capabilities.clone())
        .collect();
    let instructions: Vec<(String, Option<String>)> = view
        .plugins
        .iter()
        .map(|p| (p.name().to_owned(), p.info.instructions.clone()))
        .collect();
    // One unprefixed plugin: the gateway is transparent and shows the plugin's own info.
    let server_info: serde_json::Value = match view.plugins.as_slice() {
        [only] if only.prefix.is_none() => {
            serde_json::from_str(only.info.server_info.get()).unwrap_or_default()
        }
        _ => serde_json::json!({ "name": "mcp-gateway", "version": env!("CARGO_PKG_VERSION") }),
    };
    let mut rest = serde_json::json!({
        "capabilities": merged_capabilities(&capabilities),
        "serverInfo": server_info,
    });
    if let Some(text) = merged_instructions(&instructions) {
        rest["instructions"] = text.into();
    }
    rest.to_string().into()
}

/// Capabilities for the client: the union of the plugins', plus `logging` (the gateway
/// answers `logging/setLevel` itself), list changes for tools, prompts and resources (the
/// registry can change them at any time), and `tasks` as `tasks.rs` merges them.
fn merged_capabilities(plugins: &[serde_json::Value]) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for caps in plugins {
        let Some(caps) = caps.as_object() else {
            continue;
        };
        for key in ["tools", "prompts", "resources", "completions"] {
            let Some(cap) = caps.get(key).and_then(|c| c.as_object()) else {
                continue;
            };
            let merged = out
                .entry(key)
                .or_insert_with(|| serde_json::Value::Object(Default::default()))
                .as_object_mut()
                .expect("an object");
            for flag in ["listChanged", "subscribe"] {
                if cap.get(flag) == Some(&serde_json::Value::Bool(true)) {
                    merged.insert(flag.into(), true.into());
                }
            }
        }
    }
    for key in ["tools", "prompts", "resources"] {
        let cap = out
            .entry(key)
            .or_insert_with(|| serde_json::Value::Object(Default::default()));
        cap["listChanged"] = true.into();
    }
    out.insert("logging".into(), serde_json::json!({}));
    if let Some(tasks) = tasks::merged_capability(plugins) {
        out.insert("tasks".into(), tasks);
    }
    serde_json::Value::Object(out)
}

/// The `instructions` for the client: the plugin's own with one plugin, each plugin's under
/// its name with several.
fn merged_instructions(plugins: &[(String, Option<String>)]) -> Option<String> {
    match plugins {
        [(_, only)] => only.clone(),
        many => {
            let parts: Vec<String> = many
                .iter()
                .filter_map(|(name, i)| i.as_ref().map(|i| format!("## {name}\n{i}")))
                .collect();
            (!parts.is_empty()).then(|| parts.join("\n\n"))
        }
    }
}
