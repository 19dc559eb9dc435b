//! Which plugin serves a request, and the requests the gateway answers itself.
//!
//! Tools and prompts are found by their (prefixed) name, resources by the URI a plugin listed
//! or a template it advertised, completions by what they complete, and `logging/setLevel`
//! goes to every plugin that logs. List methods with several plugins are merged here, with
//! cursors that say where each plugin's listing stands. Every request handed to
//! [`dispatch`] gets exactly one answer on its sink, whatever fails.

mod lists;
pub mod names;

use std::borrow::Cow;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;

pub use crate::session::ResourceRoutes;

use crate::backend::connection::CallError;
use crate::config::{ProcessModel, ResponseMode};
use crate::jsonrpc::{self, Id, code};
use crate::registry::{View, ViewPlugin};
use crate::session::{LOG_LEVELS, Session};
use crate::stream::Sink;

/// Where a request goes, found before any plugin is touched.
enum Target {
    /// The gateway answers (`ping`, `logging/setLevel`, merged lists).
    Gateway,
    /// Forwarded to plugin `slot`; `rewritten` replaces the params when the gateway had to
    /// change them (a prefixed name), else the client's params go as they came.
    Plugin {
        slot: usize,
        rewritten: Option<Box<RawValue>>,
    },
    /// A resource URI no plugin is known to serve yet.
    UnknownUri(String),
}

/// A refusal before anything is forwarded.
struct Refusal(i64, String);

fn refuse<T>(code: i64, message: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal(code, message.into()))
}

/// A request's route, worked out once: the HTTP layer reads the response mode from it, then
/// hands it to [`dispatch`].
pub struct Plan {
    /// The plugins the request was planned against (a registry change meanwhile does not
    /// move it to another plugin).
    view: Arc<View>,
    target: Result<Target, Refusal>,
}

/// Plans a request against `view` (one view for all requests of a POST): validates what the
/// gateway reads of it and finds who answers it.
pub fn plan(session: &Session, view: &Arc<View>, method: &str, params: Option<&RawValue>) -> Plan {
    Plan {
        target: target(session, view, method, params),
        view: view.clone(),
    }
}

impl Plan {
    /// How the answer should be sent: as an SSE stream when a plugin answers it (logs,
    /// progress and requests may come first), per that plugin's configured mode.
    pub fn response_mode(&self) -> ResponseMode {
        match &self.target {
            Ok(Target::Plugin { slot, .. }) => self.view.plugins[*slot].entry.config.response_mode,
            Ok(Target::UnknownUri(_)) => ResponseMode::Sse,
            _ => ResponseMode::Json,
        }
    }

    /// The plugin that answers, when one does (for logs).
    pub fn plugin(&self) -> Option<&str> {
        match &self.target {
            Ok(Target::Plugin { slot, .. }) => Some(self.view.plugins[*slot].name()),
            _ => None,
        }
    }
}

/// Answers one planned request on `sink`.
pub async fn dispatch(
    session: Arc<Session>,
    id: Id,
    method: String,
    params: Option<Box<RawValue>>,
    plan: Plan,
    sink: Sink,
) {
    let reply = |bytes| {
        sink.respond(bytes);
    };
    let view = plan.view;
    let planned = match plan.target {
        Ok(Target::UnknownUri(uri)) => {
            // Learn who serves what from the plugins' lists, then plan again.
            lists::learn_resources(&session, &view).await;
            match target(&session, &view, &method, params.as_deref()) {
                Ok(found @ Target::Plugin { .. }) => Ok(found),
                _ => Ok(Target::UnknownUri(uri)),
            }
        }
        planned => planned,
    };
    match planned {
        Err(Refusal(code, message)) => reply(jsonrpc::error_bytes(Some(&id), code, &message)),
        Ok(Target::Gateway) => match method.as_str() {
            "ping" => reply(jsonrpc::result_bytes(id.raw(), &empty())),
            "logging/setLevel" => {
                set_log_level(&session, &view, params);
                reply(jsonrpc::result_bytes(id.raw(), &empty()));
            }
            _ => reply(lists::merged(&session, &view, &id, &method, params.as_deref()).await),
        },
        Ok(Target::Plugin { slot, rewritten }) => {
            forward(
                &session,
                &view.plugins[slot],
                id,
                &method,
                rewritten.or(params),
                &sink,
            )
            .await
        }
        Ok(Target::UnknownUri(uri)) => reply(jsonrpc::error_bytes(
            Some(&id),
            code::RESOURCE_NOT_FOUND,
            &format!("Resource not found: {uri}"),
        )),
    }
}

async fn forward(
    session: &Session,
    plugin: &ViewPlugin,
    id: Id,
    method: &str,
    params: Option<Box<RawValue>>,
    sink: &Sink,
) {
    if plugin.entry.config.process_model == ProcessModel::Shared
        && let Some(on) = subscribe_verb(method)
        && let Some(UriParams { uri }) = params
            .as_deref()
            .and_then(|p| serde_json::from_str(p.get()).ok())
    {
        // Counted with every other session's and listener's (`session/holds.rs`).
        let answer = match session.client_shared_subscription(plugin, &uri, on).await {
            Ok(()) => jsonrpc::result_bytes(id.raw(), &empty()),
            Err(CallError::Rpc(e)) => match RawValue::from_string(e) {
                Ok(e) => jsonrpc::error_object_bytes(id.raw(), &e),
                Err(_) => jsonrpc::error_bytes(Some(&id), code::INTERNAL_ERROR, "invalid error"),
            },
            Err(CallError::Backend(e)) => {
                jsonrpc::error_bytes(Some(&id), e.code(), &e.client_message())
            }
        };
        sink.respond(answer);
        return;
    }
    match session.plugin(plugin).await {
        Ok(conn) => {
            if let Some(p) = params.as_deref() {
                track_subscription(session, plugin.name(), method, p);
            }
            conn.forward(session.caller, id, method, params.as_deref(), sink);
        }
        Err(e) => {
            sink.respond(jsonrpc::error_bytes(
                Some(&id),
                e.code(),
                &e.client_message(),
            ));
        }
    }
}

/// `Some(true)` for a subscribe, `Some(false)` for an unsubscribe.
fn subscribe_verb(method: &str) -> Option<bool> {
    match method {
        "resources/subscribe" => Some(true),
        "resources/unsubscribe" => Some(false),
        _ => None,
    }
}

fn track_subscription(session: &Session, plugin: &str, method: &str, params: &RawValue) {
    let Some(on) = subscribe_verb(method) else {
        return;
    };
    if let Ok(UriParams { uri }) = serde_json::from_str(params.get()) {
        session.subscription(plugin, &uri, on);
    }
}

fn set_log_level(session: &Session, view: &View, params: Option<Box<RawValue>>) {
    let Some(params) = params else { return };
    // Stored first: a plugin starting now replays it; one already running is told here.
    session.set_log_level(params.clone());
    for p in view.plugins.iter().filter(|p| p.has_capability("logging")) {
        if let Some(conn) = session.current(p.name()) {
            let params = params.clone();
            tokio::spawn(async move {
                if let Err(e) = conn.call("logging/setLevel", Some(&params)).await {
                    tracing::debug!(plugin = %conn.name(), "logging/setLevel: {e}");
                }
            });
        }
    }
}

#[derive(Deserialize)]
struct NameParams<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
}

#[derive(Deserialize)]
struct UriParams<'a> {
    #[serde(borrow)]
    uri: Cow<'a, str>,
}

#[derive(Deserialize)]
struct CursorParams<'a> {
    /// Only checked to be a string; the merged listing reads it again.
    #[serde(borrow, default, rename = "cursor")]
    _cursor: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct LevelParams<'a> {
    #[serde(borrow)]
    level: Cow<'a, str>,
}

#[derive(Deserialize)]
struct CompleteParams {
    #[serde(rename = "ref")]
    reference: CompleteRef,
    /// Checked for shape; the plugin reads it.
    #[serde(rename = "argument")]
    _argument: CompleteArgument,
}

#[derive(Deserialize)]
#[serde(tag = "type")]
enum CompleteRef {
    #[serde(rename = "ref/prompt")]
    Prompt { name: String },
    #[serde(rename = "ref/resource")]
    Resource { uri: String },
}

#[derive(Deserialize)]
struct CompleteArgument {
    #[serde(rename = "name")]
    _name: String,
    #[serde(rename = "value")]
    _value: String,
}

fn parse<'a, T: Deserialize<'a>>(
    method: &str,
    params: Option<&'a RawValue>,
    shape: &str,
) -> Result<T, Refusal> {
    jsonrpc::params_as(params).or_else(|e| {
        refuse(
            code::INVALID_PARAMS,
            format!("Invalid params for {method}: {shape} ({e})"),
        )
    })
}

/// Finds where a request goes, validating what the gateway must read of its params.
fn target(
    session: &Session,
    view: &View,
    method: &str,
    params: Option<&RawValue>,
) -> Result<Target, Refusal> {
    match method {
        "ping" => Ok(Target::Gateway),
        "logging/setLevel" => {
            let p: LevelParams = parse(method, params, "params.level is required")?;
            if !LOG_LEVELS.contains(&&*p.level) {
                return refuse(
                    code::INVALID_PARAMS,
                    format!(
                        "Invalid params for logging/setLevel: unknown level `{}` (one of {})",
                        p.level,
                        LOG_LEVELS.join(", ")
                    ),
                );
            }
            Ok(Target::Gateway)
        }
        "tools/list" | "prompts/list" | "resources/list" | "resources/templates/list" => {
            let _: CursorParams = parse(method, params, "params.cursor must be a string")?;
            match passthrough_slot(view) {
                Some(slot) => Ok(Target::Plugin {
                    slot,
                    rewritten: None,
                }),
                None => Ok(Target::Gateway),
            }
        }
        "tools/call" | "prompts/get" => {
            let (capability, what) = if method == "tools/call" {
                ("tools", "tool")
            } else {
                ("prompts", "prompt")
            };
            let p: NameParams = parse(
                method,
                params,
                "params.name is required and must be a string",
            )?;
            let (slot, local) = resolve_name(view, capability, &p.name).ok_or_else(|| {
                Refusal(code::INVALID_PARAMS, format!("Unknown {what}: {}", p.name))
            })?;
            Ok(Target::Plugin {
                slot,
                rewritten: rename(params, &["name"], &p.name, local),
            })
        }
        "resources/read" | "resources/subscribe" | "resources/unsubscribe" => {
            let p: UriParams = parse(
                method,
                params,
                "params.uri is required and must be a string",
            )?;
            Ok(route_uri(session, view, &p.uri).map_or_else(
                || Target::UnknownUri(p.uri.into_owned()),
                |slot| Target::Plugin {
                    slot,
                    rewritten: None,
                },
            ))
        }
        "completion/complete" => {
            let p: CompleteParams = parse(
                method,
                params,
                "params.ref (ref/prompt with name, or ref/resource with uri) and params.argument (name, value) are required",
            )?;
            match p.reference {
                CompleteRef::Prompt { name } => {
                    let (slot, local) = resolve_name(view, "prompts", &name).ok_or_else(|| {
                        Refusal(code::INVALID_PARAMS, format!("Unknown prompt: {name}"))
                    })?;
                    Ok(Target::Plugin {
                        slot,
                        rewritten: rename(params, &["ref", "name"], &name, local),
                    })
                }
                CompleteRef::Resource { uri } => Ok(route_uri(session, view, &uri).map_or_else(
                    || Target::UnknownUri(uri.clone()),
                    |slot| Target::Plugin {
                        slot,
                        rewritten: None,
                    },
                )),
            }
        }
        _ => refuse(
            code::METHOD_NOT_FOUND,
            format!("Method not found: {method}"),
        ),
    }
}

/// The one plugin whose lists pass through untouched: the only plugin, unprefixed and
/// unfiltered.
fn passthrough_slot(view: &View) -> Option<usize> {
    match view.plugins.as_slice() {
        [only] if only.prefix.is_none() && !only.entry.config.filters_tools() => Some(0),
        _ => None,
    }
}

/// The plugin a `tools/call` would reach, when its params name a tool of the view.
pub fn tool_plugin<'v>(view: &'v View, params: Option<&RawValue>) -> Option<&'v ViewPlugin> {
    let p: NameParams = serde_json::from_str(params?.get()).ok()?;
    resolve_name(view, "tools", &p.name).map(|(slot, _)| &view.plugins[slot])
}

/// The plugin and local name behind a public tool or prompt name: the plugin whose prefix
/// and the separator begin the name (the longest such prefix, should one prefix begin
/// another).
fn resolve_name<'a>(view: &View, capability: &str, name: &'a str) -> Option<(usize, &'a str)> {
    let (slot, local) = match view.plugins.as_slice() {
        // One unprefixed plugin: names are its own.
        [only] if only.prefix.is_none() => (0, name),
        _ => view
            .plugins
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let prefix = p.prefix.as_deref()?;
                let local = name.strip_prefix(prefix)?.strip_prefix(&*view.separator)?;
                (!local.is_empty()).then_some((i, prefix.len(), local))
            })
            .max_by_key(|(_, len, _)| *len)
            .map(|(i, _, local)| (i, local))?,
    };
    let plugin = &view.plugins[slot];
    let allowed = capability != "tools" || plugin.entry.config.allows_tool(local);
    (plugin.has_capability(capability) && allowed).then_some((slot, local))
}

/// The plugin serving resource `uri` for `session`, learning who serves what from the
/// plugins' lists when it is not known yet (a `subscriptions/listen` filter's URIs).
pub async fn resource_plugin<'v>(
    session: &Session,
    view: &'v View,
    uri: &str,
) -> Option<&'v ViewPlugin> {
    if let Some(slot) = route_uri(session, view, uri) {
        return Some(&view.plugins[slot]);
    }
    lists::learn_resources(session, view).await;
    route_uri(session, view, uri).map(|slot| &view.plugins[slot])
}

/// The plugin serving a resource URI, if known.
fn route_uri(session: &Session, view: &View, uri: &str) -> Option<usize> {
    let capable: Vec<usize> = (0..view.plugins.len())
        .filter(|i| view.plugins[*i].has_capability("resources"))
        .collect();
    if capable.len() == 1 {
        return Some(capable[0]);
    }
    let routes = session.routes.lock().expect("routes lock");
    let name = routes.find(uri)?;
    view.plugins.iter().position(|p| p.name() == name)
}

/// Params with the name at `path` replaced by its local form; `None` (send the client's
/// params untouched, without parsing them) when the name is not prefixed.
fn rename(
    params: Option<&RawValue>,
    path: &[&str],
    public: &str,
    local: &str,
) -> Option<Box<RawValue>> {
    if public == local {
        return None;
    }
    let mut value: serde_json::Value = serde_json::from_str(params?.get()).ok()?;
    let mut slot = &mut value;
    for key in path {
        slot = slot.get_mut(*key)?;
    }
    *slot = serde_json::Value::String(local.to_owned());
    RawValue::from_string(value.to_string()).ok()
}

fn empty() -> Box<RawValue> {
    RawValue::from_string("{}".into()).expect("valid JSON")
}

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
    let mut out = serde_json::json!({
        "resultType": "complete",
        "supportedVersions": crate::protocol::modern::supported_versions(),
        "capabilities": rest["capabilities"],
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
/// answers `logging/setLevel` itself), and list changes for tools, prompts and resources (the
/// registry can change them at any time).
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
