//! Which plugin serves a request, and the requests the gateway answers itself.
//!
//! Tools and prompts are found by their (prefixed) name, resources by the URI a plugin listed
//! or a template it advertised, completions by what they complete, and `logging/setLevel`
//! goes to every plugin that logs. List methods with several plugins are merged here, with
//! cursors that say where each plugin's listing stands. Requests about a task go to the
//! plugin instance that runs it (`tasks.rs`); a modern client's, in the tasks extension's
//! wire, are mapped to the plugin's 2025-11-25 tasks (`modern_tasks.rs`). Every request
//! handed to [`dispatch`] gets exactly one answer on its sink, whatever fails.

mod initialize;
mod lists;
mod modern_tasks;
pub mod names;
mod tasks;

use std::borrow::Cow;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;

pub use crate::session::ResourceRoutes;
pub use initialize::{discover_result, initialize_result};
pub use modern_tasks::{offers_tasks, runs_as_task};

use crate::audit::{self, Ends, Ticket};
use crate::backend::connection::CallError;
use crate::backend::{Answering, PluginConnection, Rewrite};
use crate::config::{ProcessModel, ResponseMode};
use crate::jsonrpc::{self, Id, code};
use crate::protocol::param_headers::HeaderParam;
use crate::registry::{View, ViewPlugin};
use crate::session::tasks::Found;
use crate::session::{LOG_LEVELS, Session};
use crate::stream::Sink;

/// Where a request goes, found before any plugin is touched.
enum Target {
    /// The gateway answers (`ping`, `logging/setLevel`, merged lists).
    Gateway,
    /// Forwarded to plugin `slot`; `rewritten` replaces the params when the gateway had to
    /// change them (a prefixed name), else the client's params go as they came; `answer` says
    /// what becomes of the plugin's answer.
    Plugin {
        slot: usize,
        rewritten: Option<Box<RawValue>>,
        answer: Answer,
    },
    /// About a task: to the instance of plugin `slot` that runs it, under the plugin's own
    /// task id (`params`); the answer speaks of it by `public`.
    Task {
        slot: usize,
        conn: Arc<PluginConnection>,
        public: Arc<str>,
        params: Option<Box<RawValue>>,
    },
    /// A modern client's `tasks/get`, `tasks/update` or `tasks/cancel` (the tasks extension),
    /// about a task plugin `slot` runs: answered by the gateway from what that instance says.
    ModernTask {
        slot: usize,
        found: Found,
        public: Arc<str>,
    },
    /// A resource URI no plugin is known to serve yet.
    UnknownUri(String),
}

/// What becomes of a plugin's answer on its way to the client.
enum Answer {
    /// It goes as it came.
    AsIs,
    /// A task-augmented `tools/call`: a task it creates gets a public id.
    NewTask,
    /// A modern client's `tools/call` the gateway runs as a task: the task it creates gets a
    /// public id and is shown as the extension's `CreateTaskResult`; it may ask what
    /// `declared` (the request's capabilities) allows.
    ModernTask { declared: Option<Box<RawValue>> },
    /// A `tools/list` passed through: tools the client cannot use are taken out (whether it
    /// can run tasks is known when the request is dispatched).
    Tools { client_tasks: bool },
}

/// What a modern (2026-07-28) request brings to its routing besides its method and params.
#[derive(Debug, Clone, Default)]
pub struct Modern {
    /// Its `_meta` declares the tasks extension.
    pub tasks: bool,
    /// A `tools/call` runs as a task ([`runs_as_task`] said so).
    pub as_task: bool,
    /// The capabilities its `_meta` declares, as sent.
    pub declared: Option<Box<RawValue>>,
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
    /// A modern request's own part (`None`: a legacy session's request).
    modern: Option<Modern>,
}

/// Plans a request against `view` (one view for all requests of a POST): validates what the
/// gateway reads of it and finds who answers it.
pub fn plan(session: &Session, view: &Arc<View>, method: &str, params: Option<&RawValue>) -> Plan {
    Plan {
        target: target(session, view, method, params, None),
        view: view.clone(),
        modern: None,
    }
}

/// Plans a modern client's request (see [`plan`]).
pub fn plan_modern(
    session: &Session,
    view: &Arc<View>,
    method: &str,
    params: Option<&RawValue>,
    modern: Modern,
) -> Plan {
    Plan {
        target: target(session, view, method, params, Some(&modern)),
        view: view.clone(),
        modern: Some(modern),
    }
}

impl Plan {
    /// How the answer should be sent: as an SSE stream when a plugin answers it (logs,
    /// progress and requests may come first), per that plugin's configured mode.
    pub fn response_mode(&self) -> ResponseMode {
        match &self.target {
            Ok(
                Target::Plugin { slot, .. }
                | Target::Task { slot, .. }
                | Target::ModernTask { slot, .. },
            ) => self.view.plugins[*slot].entry.config.response_mode,
            Ok(Target::UnknownUri(_)) => ResponseMode::Sse,
            _ => ResponseMode::Json,
        }
    }

    /// The plugin that answers, when one does (for logs).
    pub fn plugin(&self) -> Option<&str> {
        match &self.target {
            Ok(
                Target::Plugin { slot, .. }
                | Target::Task { slot, .. }
                | Target::ModernTask { slot, .. },
            ) => Some(self.view.plugins[*slot].name()),
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
    mut audit: Option<Ticket>,
) {
    let reply = |bytes| {
        sink.respond(bytes);
    };
    let view = plan.view;
    let modern = plan.modern;
    // Whether the client can run tools as tasks: a modern request's `_meta` says so.
    let client_tasks = modern
        .as_ref()
        .map_or_else(|| session.client_capabilities().tasks(), |m| m.tasks);
    let planned = match plan.target {
        Ok(Target::UnknownUri(uri)) => {
            // Learn who serves what from the plugins' lists, then plan again.
            lists::learn_resources(&session, &view).await;
            match target(&session, &view, &method, params.as_deref(), modern.as_ref()) {
                Ok(found @ Target::Plugin { .. }) => Ok(found),
                _ => Ok(Target::UnknownUri(uri)),
            }
        }
        planned => planned,
    };
    match planned {
        Err(Refusal(code, message)) => {
            audit.ended(audit::Outcome::Refused, Some(code));
            reply(jsonrpc::error_bytes(Some(&id), code, &message))
        }
        Ok(Target::Gateway) => match method.as_str() {
            "ping" => reply(jsonrpc::result_bytes(id.raw(), &empty())),
            "logging/setLevel" => {
                set_log_level(&session, &view, params);
                reply(jsonrpc::result_bytes(id.raw(), &empty()));
            }
            "tasks/list" => reply(tasks::list(&session, &view, &id).await),
            _ => reply(
                lists::merged(
                    &session,
                    &view,
                    &id,
                    &method,
                    params.as_deref(),
                    client_tasks,
                )
                .await,
            ),
        },
        Ok(Target::Plugin {
            slot,
            rewritten,
            answer,
        }) => {
            let answer = match answer {
                Answer::Tools { .. } => Answer::Tools { client_tasks },
                other => other,
            };
            forward(
                &session,
                &view.plugins[slot],
                id,
                &method,
                rewritten.or(params),
                answer,
                &sink,
                audit,
            )
            .await
        }
        Ok(Target::ModernTask { found, public, .. }) => reply(
            modern_tasks::answer(&session, &id, &method, params.as_deref(), found, public).await,
        ),
        Ok(Target::Task {
            conn,
            public,
            params,
            ..
        }) => {
            let rewrite = tasks::answer_rewrite(&method, public);
            conn.forward_rewritten(
                session.caller,
                id,
                &method,
                params.as_deref(),
                &sink,
                Answering {
                    rewrite: Some(rewrite),
                    audit: None,
                },
            );
        }
        Ok(Target::UnknownUri(uri)) => {
            audit.ended(audit::Outcome::Refused, Some(code::RESOURCE_NOT_FOUND));
            reply(jsonrpc::error_bytes(
                Some(&id),
                code::RESOURCE_NOT_FOUND,
                &format!("Resource not found: {uri}"),
            ))
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn forward(
    session: &Arc<Session>,
    plugin: &ViewPlugin,
    id: Id,
    method: &str,
    params: Option<Box<RawValue>>,
    answer: Answer,
    sink: &Sink,
    mut audit: Option<Ticket>,
) {
    if let Some(a) = &mut audit {
        a.set_plugin(plugin.name());
    }
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
            let params = match session.toward(&conn, method, params) {
                Ok(p) => p,
                Err((code, message)) => {
                    audit.ended(audit::Outcome::Refused, Some(code));
                    sink.respond(jsonrpc::error_bytes(Some(&id), code, &message));
                    return;
                }
            };
            if let Some(p) = params.as_deref() {
                track_subscription(session, plugin.name(), method, p);
            }
            let rewrite: Option<Rewrite> = match answer {
                Answer::AsIs => None,
                Answer::NewTask => Some(tasks::new_task_rewrite(session, &conn)),
                Answer::ModernTask { declared } => {
                    Some(modern_tasks::created_rewrite(session, &conn, declared))
                }
                Answer::Tools { client_tasks } => tasks::tools_rewrite(plugin, client_tasks),
            };
            let answering = Answering { rewrite, audit };
            conn.forward_rewritten(
                session.caller,
                id,
                method,
                params.as_deref(),
                sink,
                answering,
            );
        }
        Err(e) => {
            audit.ended(audit::Outcome::Error, Some(e.code()));
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
        // A modern plugin has no logging/setLevel: the level goes in each request's `_meta`.
        if let Some(conn) = session.current(p.name()).filter(|c| !c.is_modern()) {
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
    /// Present in a task-augmented request; its content is the plugin's to read.
    #[serde(default)]
    task: Option<serde::de::IgnoredAny>,
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
    modern: Option<&Modern>,
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
                    answer: if method == "tools/list" {
                        Answer::Tools {
                            client_tasks: false,
                        }
                    } else {
                        Answer::AsIs
                    },
                }),
                None => Ok(Target::Gateway),
            }
        }
        "tasks/get" | "tasks/update" | "tasks/cancel" if modern.is_some() => {
            modern_task_target(session, view, method, params)
        }
        "tasks/list" | "tasks/get" | "tasks/result" | "tasks/cancel"
            if modern.is_none() && tasks::any_plugin_has_tasks(view) =>
        {
            task_target(session, view, method, params)
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
            // A modern client's call runs as a task when the gateway says so, whatever `task`
            // param (a 2025-11-25 hint) it carries.
            let as_task = modern.filter(|_| method == "tools/call").map(|m| m.as_task);
            let new_task = as_task.unwrap_or(method == "tools/call" && p.task.is_some());
            if new_task && !session.tasks.has_room() {
                return refuse(
                    code::INVALID_REQUEST,
                    format!(
                        "Too many tasks: this session has {} (finish or cancel some first)",
                        crate::session::tasks::MAX_TASKS
                    ),
                );
            }
            let rewritten = rename(params, &["name"], &p.name, local);
            let Some(as_task) = as_task else {
                return Ok(Target::Plugin {
                    slot,
                    rewritten,
                    answer: if new_task {
                        Answer::NewTask
                    } else {
                        Answer::AsIs
                    },
                });
            };
            let rewritten = if as_task || p.task.is_some() {
                modern_tasks::call_params(rewritten.as_deref().or(params), as_task)
            } else {
                rewritten
            };
            Ok(Target::Plugin {
                slot,
                rewritten,
                answer: if as_task {
                    Answer::ModernTask {
                        declared: modern.and_then(|m| m.declared.clone()),
                    }
                } else {
                    Answer::AsIs
                },
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
                    answer: Answer::AsIs,
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
                        answer: Answer::AsIs,
                    })
                }
                CompleteRef::Resource { uri } => Ok(route_uri(session, view, &uri).map_or_else(
                    || Target::UnknownUri(uri.clone()),
                    |slot| Target::Plugin {
                        slot,
                        rewritten: None,
                        answer: Answer::AsIs,
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

/// Where a request about a task goes: the instance that runs it, if the session has it.
fn task_target(
    session: &Session,
    view: &View,
    method: &str,
    params: Option<&RawValue>,
) -> Result<Target, Refusal> {
    if method == "tasks/list" {
        let p: CursorParams = parse(method, params, "params.cursor must be a string")?;
        if p._cursor.is_some() {
            // The gateway's list is one page: it never hands out a cursor.
            return refuse(code::INVALID_PARAMS, "Invalid cursor for tasks/list");
        }
        return Ok(Target::Gateway);
    }
    let p: tasks::TaskParams = parse(
        method,
        params,
        "params.taskId is required and must be a string",
    )?;
    let found = session.tasks.get(&p.task_id);
    let slot = found
        .as_ref()
        .and_then(|f| view.plugins.iter().position(|v| *v.name() == *f.plugin));
    let (Some(found), Some(slot)) = (found, slot) else {
        return refuse(code::INVALID_PARAMS, tasks::NOT_FOUND);
    };
    Ok(Target::Task {
        slot,
        params: tasks::local_params(params, &found.local),
        public: Arc::from(&*p.task_id),
        conn: found.conn,
    })
}

/// Where a modern client's request about a task goes: the gateway answers it from the
/// instance that runs the task, if the caller has it.
fn modern_task_target(
    session: &Session,
    view: &View,
    method: &str,
    params: Option<&RawValue>,
) -> Result<Target, Refusal> {
    let p: tasks::TaskParams = parse(
        method,
        params,
        "params.taskId is required and must be a string",
    )?;
    let found = session.tasks.get(&p.task_id);
    let slot = found
        .as_ref()
        .and_then(|f| view.plugins.iter().position(|v| *v.name() == *f.plugin));
    let (Some(found), Some(slot)) = (found, slot) else {
        return refuse(code::INVALID_PARAMS, tasks::NOT_FOUND);
    };
    Ok(Target::ModernTask {
        slot,
        found,
        public: Arc::from(&*p.task_id),
    })
}

/// The one plugin whose lists pass through untouched: the only plugin, unprefixed and
/// unfiltered.
fn passthrough_slot(view: &View) -> Option<usize> {
    match view.plugins.as_slice() {
        [only] if only.prefix.is_none() && !only.filters_tools() => Some(0),
        _ => None,
    }
}

/// The plugin a `tools/call` would reach and the tool's name there, when its params name a
/// tool of the view.
pub fn tool_target<'v>(
    view: &'v View,
    params: Option<&RawValue>,
) -> Option<(&'v ViewPlugin, String)> {
    let p: NameParams = serde_json::from_str(params?.get()).ok()?;
    resolve_name(view, "tools", &p.name)
        .map(|(slot, local)| (&view.plugins[slot], local.to_owned()))
}

/// The header-mapped parameters (`x-mcp-header`) of tool `name`, as its plugin lists it for
/// this session (read once, then remembered until its tools change); `None` when the view
/// has no such tool, or the plugin's list cannot be read.
pub async fn tool_header_params(
    session: &Session,
    view: &View,
    name: &str,
) -> Option<Arc<[HeaderParam]>> {
    let (slot, local) = resolve_name(view, "tools", name)?;
    let plugin = &view.plugins[slot];
    let known = session
        .tool_headers
        .lock()
        .expect("tool headers lock")
        .get(plugin.name(), &plugin.info);
    let tools = match known {
        Some(tools) => tools,
        None => lists::learn_tool_headers(session, plugin).await?,
    };
    Some(tools.get(local).cloned().unwrap_or_else(|| Arc::from([])))
}

/// The plugin and local name behind a public tool or prompt name: the plugin whose prefix
/// and the separator begin the name (the longest such prefix, should one prefix begin
/// another).
fn resolve_name<'a>(view: &View, capability: &str, name: &'a str) -> Option<(usize, &'a str)> {
    let (slot, local) = match view.plugins.as_slice() {
        // One unprefixed plugin: names are its own.
        [only] if only.prefix.is_none() => (0, name),
        // A prefixed name too long to be listed is not one to call either.
        _ if !names::fits(name) => return None,
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
    let allowed = capability != "tools" || plugin.allows_tool(local);
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
