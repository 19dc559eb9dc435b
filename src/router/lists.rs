//! List methods merged across plugins.
//!
//! One page of a merged list is one page from each plugin still listing, fetched
//! concurrently. The cursor handed to the client is opaque: base64url of the plugins still
//! listing and each one's own cursor. A cursor that does not decode, or names a plugin this
//! session does not have, is invalid params. Resource results also teach the session which
//! plugin serves which URI; a plugin's whole tool list, read for a modern `tools/call`, which
//! of its tools' parameters are mirrored in headers. Tools the client cannot use (`tasks.rs`) and names too long once
//! prefixed (`names.rs`) are left out.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use serde_json::Value;
use serde_json::value::RawValue;

use std::sync::Arc;

use super::names;
use crate::jsonrpc::{self, Id, code};
use crate::protocol::param_headers::header_params;
use crate::registry::{View, ViewPlugin};
use crate::session::tool_headers::ToolParams;
use crate::session::{ResourceRoutes, Session};

/// Pages fetched per plugin when learning resource routes, at most.
const LEARN_PAGES: usize = 50;
/// Most tools of one plugin remembered for a session: a plugin listing more has the rest
/// refused.
const MAX_LEARNED_TOOLS: usize = 10_000;
/// Least time between two full listings for unknown URIs in one session.
const RELEARN_AFTER: std::time::Duration = std::time::Duration::from_secs(10);
/// How long one plugin's page may take before the merged list goes on without it.
const PAGE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

struct Kind {
    /// The result's array key.
    key: &'static str,
    /// The capability a plugin needs to be asked.
    capability: &'static str,
    /// Whether item names carry the plugin prefix.
    prefixed: bool,
}

impl Kind {
    /// Teaches `routes` what `item` of a `plugin`'s list of this kind says.
    fn learn(&self, routes: &mut ResourceRoutes, plugin: &str, item: &Value) {
        match self.key {
            "resources" => {
                if let Some(uri) = item.get("uri").and_then(Value::as_str) {
                    routes.learn_uri(plugin, uri);
                }
            }
            "resourceTemplates" => {
                if let Some(t) = item.get("uriTemplate").and_then(Value::as_str) {
                    routes.learn_template(plugin, t);
                }
            }
            _ => {}
        }
    }

    fn of(method: &str) -> Kind {
        match method {
            "tools/list" => Kind {
                key: "tools",
                capability: "tools",
                prefixed: true,
            },
            "prompts/list" => Kind {
                key: "prompts",
                capability: "prompts",
                prefixed: true,
            },
            "resources/list" => Kind {
                key: "resources",
                capability: "resources",
                prefixed: false,
            },
            _ => Kind {
                key: "resourceTemplates",
                capability: "resources",
                prefixed: false,
            },
        }
    }
}

/// One merged page of `method`, as a response to `id`; `client_tasks`: whether the client
/// can run tools as tasks.
pub async fn merged(
    session: &Session,
    view: &View,
    id: &Id,
    method: &str,
    params: Option<&RawValue>,
    client_tasks: bool,
) -> Bytes {
    let kind = Kind::of(method);
    let cursor = params
        .and_then(|p| serde_json::from_str::<Value>(p.get()).ok())
        .and_then(|p| p.get("cursor").and_then(Value::as_str).map(str::to_owned));
    let targets = match cursor {
        None => (0..view.plugins.len())
            .filter(|i| view.plugins[*i].has_capability(kind.capability))
            .map(|i| (i, None))
            .collect(),
        Some(c) => match decode_cursor(view, &kind, &c) {
            Some(t) => t,
            None => {
                return jsonrpc::error_bytes(
                    Some(id),
                    code::INVALID_PARAMS,
                    &format!("Invalid cursor for {method}"),
                );
            }
        },
    };
    let pages = futures_util::future::join_all(targets.iter().map(|(slot, cursor)| {
        fetch_page(session, &view.plugins[*slot], method, cursor.as_deref())
    }))
    .await;
    let mut items = Vec::new();
    let mut remaining = Vec::new();
    for ((slot, _), page) in targets.iter().zip(pages) {
        let s = &view.plugins[*slot];
        let page = match page {
            Ok(page) => page,
            Err(e) => {
                tracing::warn!(plugin = %s.name(), session = %session.id, "{method}: {e}; its entries are left out");
                continue;
            }
        };
        let task_calls = super::tasks::runs_task_calls(s);
        let mut routes = session.routes.lock().expect("routes lock");
        for mut item in page
            .get(kind.key)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
        {
            kind.learn(&mut routes, s.name(), &item);
            if kind.key == "tools"
                && !item
                    .get("name")
                    .and_then(Value::as_str)
                    .is_some_and(|n| s.allows_tool(n))
            {
                continue;
            }
            if kind.key == "tools" && !super::tasks::offer_tool(&mut item, task_calls, client_tasks)
            {
                continue;
            }
            if kind.prefixed
                && let Some(name) = item.get("name").and_then(Value::as_str)
            {
                let public = names::join(s.prefix.as_deref(), &view.separator, name);
                if !names::fits(&public) {
                    names::warn_too_long(s.name(), &kind.key[..kind.key.len() - 1], &public);
                    continue;
                }
                item["name"] = Value::String(public);
            }
            items.push(item);
        }
        if let Some(next) = page.get("nextCursor").and_then(Value::as_str) {
            remaining.push((s.name().to_owned(), next.to_owned()));
        }
    }
    let mut result = serde_json::Map::new();
    result.insert(kind.key.into(), Value::Array(items));
    if !remaining.is_empty() {
        let encoded = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&remaining).expect("serializable"));
        result.insert("nextCursor".into(), Value::String(encoded));
    }
    let result = RawValue::from_string(Value::Object(result).to_string()).expect("valid JSON");
    jsonrpc::result_bytes(id.raw(), &result)
}

/// Lists every resource and template of every plugin (bounded), to route a URI nobody
/// claimed yet.
pub async fn learn_resources(session: &Session, view: &View) {
    let claimed = session
        .routes
        .lock()
        .expect("routes lock")
        .claim_listing(RELEARN_AFTER);
    if !claimed {
        return;
    }
    let work = view
        .plugins
        .iter()
        .filter(|p| p.has_capability("resources"))
        .flat_map(|plugin| {
            ["resources/list", "resources/templates/list"]
                .into_iter()
                .map(move |method| learn_one(session, plugin, method))
        });
    futures_util::future::join_all(work).await;
}

async fn learn_one(session: &Session, plugin: &ViewPlugin, method: &str) {
    let kind = Kind::of(method);
    let mut cursor: Option<String> = None;
    for _ in 0..LEARN_PAGES {
        let Ok(page) = fetch_page(session, plugin, method, cursor.as_deref()).await else {
            return;
        };
        {
            let mut routes = session.routes.lock().expect("routes lock");
            for item in page
                .get(kind.key)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                kind.learn(&mut routes, plugin.name(), item);
            }
        }
        match page.get("nextCursor").and_then(Value::as_str) {
            Some(next) => cursor = Some(next.to_owned()),
            None => return,
        }
    }
}

/// The tools `plugin` lists, with their header-mapped parameters, from its whole `tools/list`
/// (bounded), remembered for the session; `None` when the list cannot be read.
pub async fn learn_tool_headers(session: &Session, plugin: &ViewPlugin) -> Option<Arc<ToolParams>> {
    let mut tools = ToolParams::new();
    let mut cursor: Option<String> = None;
    for _ in 0..LEARN_PAGES {
        let page = match fetch_page(session, plugin, "tools/list", cursor.as_deref()).await {
            Ok(page) => page,
            Err(e) => {
                tracing::info!(plugin = %plugin.name(), session = %session.id, "its tools' header-mapped parameters are unknown: {e}; Mcp-Param headers go unchecked");
                return None;
            }
        };
        for tool in page
            .get("tools")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(name) = tool.get("name").and_then(Value::as_str) else {
                continue;
            };
            if tools.len() >= MAX_LEARNED_TOOLS {
                break;
            }
            // Every tool listed is kept (calls of others are refused), with its header-mapped
            // parameters if it has any.
            let params = tool
                .get("inputSchema")
                .map(header_params)
                .unwrap_or_default();
            tools.insert(name.to_owned(), params.into());
        }
        match page.get("nextCursor").and_then(Value::as_str) {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    let tools = Arc::new(tools);
    session
        .tool_headers
        .lock()
        .expect("tool headers lock")
        .learn(plugin.name(), plugin.info.clone(), tools.clone());
    Some(tools)
}

/// The first page of `method` that `plugin` listed when probed as no one, when the request
/// asks for a first page.
pub(super) fn probed(
    plugin: &ViewPlugin,
    method: &str,
    params: Option<&RawValue>,
) -> Option<Box<RawValue>> {
    let first = params.is_none_or(|p| {
        serde_json::from_str::<Value>(p.get()).is_ok_and(|v| v.get("cursor").is_none())
    });
    if !first {
        return None;
    }
    let (_, page) = plugin.info.listed.iter().find(|(m, _)| *m == method)?;
    RawValue::from_string(page.to_string()).ok()
}

async fn fetch_page(
    session: &Session,
    plugin: &ViewPlugin,
    method: &str,
    cursor: Option<&str>,
) -> Result<Value, String> {
    // A person who has not connected a credential the plugin needs is shown what it listed
    // when probed as no one: its tools' calls are what ask them to connect.
    if cursor.is_none()
        && !plugin.info.listed.is_empty()
        && !session.has_instance(plugin)
        && session.lacks_credential(plugin).await
    {
        return plugin
            .info
            .listed
            .iter()
            .find(|(m, _)| *m == method)
            .map(|(_, page)| (**page).clone())
            .ok_or_else(|| {
                format!("{method}: not listed until the caller connects its credential")
            });
    }
    let conn = session.plugin(plugin).await.map_err(|e| e.to_string())?;
    let params = cursor.map(|c| {
        RawValue::from_string(serde_json::json!({ "cursor": c }).to_string()).expect("valid JSON")
    });
    let raw = tokio::time::timeout(PAGE_TIMEOUT, conn.call(method, params.as_deref()))
        .await
        .map_err(|_| format!("no answer to {method} within {} s", PAGE_TIMEOUT.as_secs()))?
        .map_err(|e| e.to_string())?;
    serde_json::from_str(raw.get()).map_err(|e| format!("invalid {method} result: {e}"))
}

fn decode_cursor(view: &View, kind: &Kind, cursor: &str) -> Option<Vec<(usize, Option<String>)>> {
    let bytes = URL_SAFE_NO_PAD.decode(cursor).ok()?;
    let entries: Vec<(String, String)> = serde_json::from_slice(&bytes).ok()?;
    if entries.is_empty() {
        return None;
    }
    entries
        .into_iter()
        .map(|(name, c)| {
            let slot = view
                .plugins
                .iter()
                .position(|p| p.name() == name && p.has_capability(kind.capability))?;
            Some((slot, Some(c)))
        })
        .collect()
}
