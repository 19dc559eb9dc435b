//! Where a request goes ([`Target`]), found before any plugin is touched: tools and prompts by
//! their (prefixed) name, resources by the URI a plugin listed or a template it advertised,
//! completions by what they complete, requests about a task by the instance that runs it.
//! What the gateway must read of the params is validated here, and a request it cannot route
//! is refused ([`Refusal`]) with the JSON-RPC error the client gets.

use std::borrow::Cow;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::{Modern, lists, modern_tasks, names, tasks};
use crate::backend::PluginConnection;
use crate::jsonrpc::{self, code};
use crate::protocol::param_headers::HeaderParam;
use crate::registry::{View, ViewPlugin};
use crate::session::tasks::Found;
use crate::session::{LOG_LEVELS, Session};

/// Where a request goes, found before any plugin is touched.
pub(super) enum Target {
    /// The gateway answers (`ping`, `logging/setLevel`, merged lists).
    Gateway,
    /// Forwarded to plugin `slot`; `rewritten` replaces the params when the gateway had to
    /// change them (a prefixed name), else the client's params go as they came; `answer` says
    /// what becomes of the plugin's answer.
    Plugin {
        slot: usize,
        rewritten: Option<Box<RawValue>>,
        answer: Answer,
        /// A `tools/call`'s tool, which the plugin must have listed: its name as the client
        /// gave it, and where its local name begins in it.
        tool: Option<CalledTool>,
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

/// The tool a `tools/call` names.
pub(super) struct CalledTool {
    /// As the client gave it.
    pub public: Box<str>,
    /// Where the plugin's own name for it begins in `public` (after a prefix).
    pub local_at: usize,
}

impl CalledTool {
    pub fn local(&self) -> &str {
        &self.public[self.local_at..]
    }
}

/// Whether a tool name is one a client may call: 1 to 128 characters (as the lists count
/// them, `names::fits`), none of them whitespace, a control character or an invisible one
/// (zero-width spaces and joiners, direction marks, the byte-order mark), which a plugin
/// matching names loosely might strip or fold. The spec's tool names are ASCII letters,
/// digits, `_`, `-` and `.`; a plugin that lists others is still served as it lists them.
fn callable_name(name: &str) -> bool {
    !name.is_empty()
        && names::fits(name)
        && !name.chars().any(|c| {
            c.is_whitespace()
                || c.is_control()
                || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{206f}' | '\u{feff}' | '\u{00ad}')
        })
}

/// What becomes of a plugin's answer on its way to the client.
pub(super) enum Answer {
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

/// A refusal before anything is forwarded.
pub(super) struct Refusal(pub(super) i64, pub(super) String);

fn refuse<T>(code: i64, message: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal(code, message.into()))
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
pub(super) struct UriParams<'a> {
    #[serde(borrow)]
    pub(super) uri: Cow<'a, str>,
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
pub(super) fn target(
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
                    tool: None,
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
            let p: NameParams = match modern.and_then(|m| Some((m.name.as_deref()?, m))) {
                Some((name, m)) => NameParams {
                    name: Cow::Borrowed(name),
                    task: m.task_hint.then_some(serde::de::IgnoredAny),
                },
                None => parse(
                    method,
                    params,
                    "params.name is required and must be a string",
                )?,
            };
            if method == "tools/call" && !callable_name(&p.name) {
                return refuse(
                    code::INVALID_PARAMS,
                    format!(
                        "Unknown tool: {:?} (a tool's name has no white space, control or invisible characters)",
                        p.name.chars().take(160).collect::<String>()
                    ),
                );
            }
            let (slot, local) = resolve_name(view, capability, &p.name).ok_or_else(|| {
                Refusal(code::INVALID_PARAMS, format!("Unknown {what}: {}", p.name))
            })?;
            let tool = (method == "tools/call").then(|| CalledTool {
                public: p.name.as_ref().into(),
                local_at: p.name.len() - local.len(),
            });
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
                    tool,
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
                tool,
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
                    tool: None,
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
                        tool: None,
                    })
                }
                CompleteRef::Resource { uri } => Ok(route_uri(session, view, &uri).map_or_else(
                    || Target::UnknownUri(uri.clone()),
                    |slot| Target::Plugin {
                        slot,
                        rewritten: None,
                        answer: Answer::AsIs,
                        tool: None,
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
    let (found, slot, public) = find_task(session, view, method, params)?;
    Ok(Target::Task {
        slot,
        params: tasks::local_params(params, &found.local),
        public,
        conn: found.conn,
    })
}

/// The task a request names (`params.taskId`), if the session has it, with its plugin's slot
/// in the view and its public id.
fn find_task(
    session: &Session,
    view: &View,
    method: &str,
    params: Option<&RawValue>,
) -> Result<(Found, usize, Arc<str>), Refusal> {
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
    Ok((found, slot, Arc::from(&*p.task_id)))
}

/// Where a modern client's request about a task goes: the gateway answers it from the
/// instance that runs the task, if the caller has it.
fn modern_task_target(
    session: &Session,
    view: &View,
    method: &str,
    params: Option<&RawValue>,
) -> Result<Target, Refusal> {
    let (found, slot, public) = find_task(session, view, method, params)?;
    Ok(Target::ModernTask {
        slot,
        found,
        public,
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
    let tools = session_tools(session, &view.plugins[slot]).await?;
    Some(tools.get(local).cloned().unwrap_or_else(|| Arc::from([])))
}

/// The tools `plugin` lists for `session`, read once, then remembered until its tools change;
/// `None` when the list cannot be read.
async fn session_tools(
    session: &Session,
    plugin: &ViewPlugin,
) -> Option<Arc<crate::session::tool_headers::ToolParams>> {
    let known = session
        .tool_headers
        .lock()
        .expect("tool headers lock")
        .get(plugin.name(), &plugin.info);
    match known {
        Some(tools) => Some(tools),
        None => lists::learn_tool_headers(session, plugin).await,
    }
}

/// Whether `plugin` listed tool `local`: when probed, or else for `session` (its whole list
/// read once, then remembered until its tools change); `None` when that list cannot be read.
pub(super) async fn listed_tool(
    session: &Session,
    plugin: &ViewPlugin,
    local: &str,
) -> Option<bool> {
    // What the probe saw listed: most calls, with no list of the session's to read.
    if plugin.info.tool_names.contains(local) {
        return Some(true);
    }
    Some(session_tools(session, plugin).await?.contains_key(local))
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

#[cfg(test)]
mod tests {
    use super::callable_name;

    #[test]
    fn names_a_plugin_could_fold_are_not_callable_others_are() {
        for ok in [
            "echo",
            "h__echo",
            "DATA_EXPORT_v2",
            "admin.tools.list",
            "météo",
            "a/b",
        ] {
            assert!(callable_name(ok), "{ok}");
        }
        let long = "x".repeat(129);
        for bad in [
            "",
            "echo ",
            "echo\t",
            "echo\u{200b}",
            "crash\u{0}",
            "ec\u{00ad}ho",
            "\u{feff}echo",
            long.as_str(),
        ] {
            assert!(!callable_name(bad), "{bad:?}");
        }
    }
}
