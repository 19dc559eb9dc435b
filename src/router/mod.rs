//! Which plugin serves a request, and the requests the gateway answers itself.
//!
//! A request is planned first ([`plan`]: `target.rs` finds where it goes and validates what
//! the gateway reads of it), then [`dispatch`]ed: forwarded to its plugin, or answered here
//! (`ping`, `logging/setLevel`, which goes to every plugin that logs, and list methods with
//! several plugins, merged in `lists.rs` with cursors that say where each plugin's listing
//! stands). Requests about a task go to the plugin instance that runs it (`tasks.rs`); a
//! modern client's, in the tasks extension's wire, are mapped to the plugin's 2025-11-25
//! tasks (`modern_tasks.rs`). Every request handed to [`dispatch`] gets exactly one answer on
//! its sink, whatever fails.

mod initialize;
mod lists;
mod modern_tasks;
pub mod names;
mod target;
mod tasks;

use std::sync::Arc;

use serde_json::value::RawValue;

pub use crate::session::ResourceRoutes;
pub use initialize::{discover_result, initialize_result};
pub use modern_tasks::{offers_tasks, runs_as_task};
pub use target::{resource_plugin, tool_header_params, tool_target};

use crate::audit::{self, Ends, Ticket};
use crate::backend::connection::CallError;
use crate::backend::{Answering, Rewrite};
use crate::config::{ProcessModel, ResponseMode};
use crate::jsonrpc::{self, Id, code};
use crate::registry::{View, ViewPlugin};
use crate::session::Session;
use crate::stream::Sink;
use target::{Answer, CalledTool, Refusal, Target, UriParams, target};

/// What a modern (2026-07-28) request brings to its routing besides its method and params.
#[derive(Debug, Clone, Default)]
pub struct Modern {
    /// Its `_meta` declares the tasks extension.
    pub tasks: bool,
    /// A `tools/call` runs as a task ([`runs_as_task`] said so).
    pub as_task: bool,
    /// The capabilities its `_meta` declares, as sent.
    pub declared: Option<Box<RawValue>>,
    /// Its params' `name` where it is a string, and whether they carry `task`, as the
    /// reading of its `_meta` found them (`modern::RequestMeta`): a `tools/call` or
    /// `prompts/get` finds its plugin without reading its params for them again (without a
    /// name it does; a prefixed name's rewrite still reads them).
    pub name: Option<String>,
    pub task_hint: bool,
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
    // `connect = "eager"`: a legacy session's first request asks for what its person lacks.
    if modern.is_none()
        && view.eager
        && let Some(answer) = Box::pin(session.ask_eagerly(&view, &id, &sink)).await
    {
        audit.ended(audit::Outcome::Error, Some(code::URL_ELICITATION_REQUIRED));
        return reply(answer);
    }
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
            tool,
        }) => {
            let plugin = &view.plugins[slot];
            if let Some(tool) = tool
                && let Err(Refusal(code, message)) = listed(&session, plugin, &tool).await
            {
                audit.ended(audit::Outcome::Refused, Some(code));
                return reply(jsonrpc::error_bytes(Some(&id), code, &message));
            }
            let answer = match answer {
                Answer::Tools { .. } => Answer::Tools { client_tasks },
                other => other,
            };
            forward(
                &session,
                plugin,
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
                session.request_caller(),
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

/// A tool is called only if its plugin listed it: a name it did not list (another case, a
/// trailing character, a path) could reach a tool that the caller's rules deny, at a plugin
/// that matches names loosely. A plugin whose list cannot be read is trusted with the name
/// unless it has tool rules to keep.
async fn listed(session: &Session, plugin: &ViewPlugin, tool: &CalledTool) -> Result<(), Refusal> {
    match target::listed_tool(session, plugin, tool.local()).await {
        Some(true) => Ok(()),
        Some(false) => Err(Refusal(
            code::INVALID_PARAMS,
            format!(
                "Unknown tool: {} (its plugin does not list it)",
                tool.public
            ),
        )),
        None if plugin.filters_tools() || plugin.entry.config.restricts_callers() => Err(Refusal(
            code::INTERNAL_ERROR,
            format!(
                "Tool {} cannot be called now: its plugin's tool list could not be read",
                tool.public
            ),
        )),
        None => Ok(()),
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
        if !plugin.entry.credentials.is_empty() {
            a.set_credentials(&plugin.entry.credentials);
        }
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
    // A person who has not connected the plugin's credential sees what it listed when
    // probed as no one; its calls are what ask them.
    if !plugin.info.listed.is_empty()
        && !session.has_instance(plugin)
        && let Some(page) = lists::probed(plugin, method, params.as_deref())
        && session.lacks_credential(plugin).await
    {
        audit.ended(audit::Outcome::Ok, None);
        sink.respond(jsonrpc::result_bytes(id.raw(), &page));
        return;
    }
    let mut started = session.plugin(plugin).await;
    // A legacy client that can open a link is asked to have the person connect a missing
    // credential, and the call waits for them (once).
    if let Err(e @ crate::backend::BackendError::CredentialNeeded(_)) = &started
        && Box::pin(session.ask_to_connect(sink, e)).await == Some(crate::session::Connected::Yes)
    {
        started = session.plugin(plugin).await;
    }
    match started {
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
                session.request_caller(),
                id,
                method,
                params.as_deref(),
                sink,
                answering,
            );
        }
        Err(e) => {
            audit.ended(audit::Outcome::Error, Some(e.code()));
            // A modern client is asked for a missing credential in a round of its own.
            let answer = session
                .credential_round(sink, &id, &e)
                .unwrap_or_else(|| e.error_bytes(Some(&id)));
            sink.respond(answer);
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

fn empty() -> Box<RawValue> {
    RawValue::from_string("{}".into()).expect("valid JSON")
}
