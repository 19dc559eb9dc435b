//! The tasks extension (`io.modelcontextprotocol/tasks`, SEP-2663) for modern (2026-07-28)
//! clients, over plugins that run 2025-11-25 tasks.
//!
//! Creation is the gateway's decision, as the extension has it: a `tools/call` whose `_meta`
//! declares the extension, of a tool whose plugin takes task-augmented calls and whose
//! `execution.taskSupport` is `optional` or `required` (learned from the plugin's
//! `tools/list`), goes to the plugin with a `task` param of the gateway's; a `task` param the
//! client sent (a 2025-11-25 hint) is dropped. A `required` tool called without the
//! extension is -32021 naming it. The plugin's `CreateTaskResult` becomes the extension's
//! flat one (`resultType: "task"`, `ttlMs`, `pollIntervalMs`) under a task id of the
//! gateway's, kept in the caller's table ([`crate::session::tasks`]): another caller, whose
//! table does not hold it, is told it does not exist.
//!
//! `tasks/get` is answered from the plugin's `tasks/get`, with the result or error inlined
//! from its `tasks/result` once the task is terminal (a tool error is `completed` with
//! `isError`, a JSON-RPC error `failed`), and with the requests the task waits on its client
//! for as `inputRequests` (the task is `input_required` exactly while there are some): the
//! session makes that `DetailedTask` ([`crate::session::task_status`]), which its listeners
//! hear too.
//! `tasks/update` hands the client's answers to them; `tasks/cancel` asks the plugin to
//! cancel and acknowledges, also for a task that has ended already. Both acknowledgements are
//! empty. `tasks/result` and `tasks/list` are not the extension's: not found.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::tasks::{NOT_FOUND, runs_task_calls};
use crate::backend::connection::CallError;
use crate::backend::{PluginConnection, Rewrite};
use crate::jsonrpc::{self, Id, code};
use crate::protocol::modern::ModernError;
use crate::registry::{View, ViewPlugin};
use crate::session::Session;
use crate::session::task_status::{
    TaskError, call, error_code, is_invalid_params, modern_task, without_related,
};
use crate::session::tasks::{Found, ttl_of};

/// The `ttl` the gateway asks of a plugin for a task it creates (the plugin may give less).
pub const TASK_TTL_MS: u64 = 15 * 60 * 1000;
/// Pages of a plugin's `tools/list` read to learn its tools' task support, at most.
const SUPPORT_PAGES: usize = 50;
/// How long one page may take.
const PAGE_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether any plugin of the view runs task-augmented `tools/call` (the gateway then offers
/// the extension).
pub fn offers_tasks(view: &View) -> bool {
    view.plugins.iter().any(runs_task_calls)
}

/// Whether a modern client's `tools/call` runs as a task: the tool supports one, its plugin
/// takes task-augmented calls, and the request declares the extension (`declared`). A tool
/// that must run as a task, called without the extension, is -32021.
pub async fn runs_as_task(
    session: &Session,
    view: &View,
    params: Option<&RawValue>,
    declared: bool,
) -> Result<bool, ModernError> {
    if !offers_tasks(view) {
        return Ok(false);
    }
    let Some((plugin, tool)) = super::tool_target(view, params) else {
        // Not a tool of the view: the router says so.
        return Ok(false);
    };
    if !runs_task_calls(plugin) {
        return Ok(false);
    }
    match support_of(session, plugin, &tool).await.as_deref() {
        Some("required") if !declared => Err(ModernError::tasks_extension_missing()),
        Some("required" | "optional") => Ok(declared),
        _ => Ok(false),
    }
}

/// `execution.taskSupport` of a plugin's tool, from what the session learned of the plugin's
/// tools (read now when not known yet; `None` when it cannot be).
async fn support_of(session: &Session, plugin: &ViewPlugin, tool: &str) -> Option<String> {
    if let Some(known) = session.tasks.tool_support(plugin.name()) {
        return known.get(tool).cloned();
    }
    let conn = session.plugin(plugin).await.ok()?;
    let mut support = HashMap::new();
    let mut cursor: Option<String> = None;
    for _ in 0..SUPPORT_PAGES {
        let params = cursor.as_ref().map(|c| {
            RawValue::from_string(serde_json::json!({ "cursor": c }).to_string())
                .expect("valid JSON")
        });
        let page = match tokio::time::timeout(
            PAGE_TIMEOUT,
            conn.call("tools/list", params.as_deref()),
        )
        .await
        {
            Ok(Ok(page)) => page,
            Ok(Err(e)) => {
                tracing::info!(plugin = %plugin.name(), session = %session.id, "tools/list, to learn which tools run as tasks: {e}");
                return None;
            }
            Err(_) => {
                tracing::info!(plugin = %plugin.name(), session = %session.id, "tools/list, to learn which tools run as tasks: no answer in time");
                return None;
            }
        };
        let page: Value = serde_json::from_str(page.get()).ok()?;
        for t in page
            .get("tools")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let name = t.get("name").and_then(Value::as_str);
            let s = t.pointer("/execution/taskSupport").and_then(Value::as_str);
            if let (Some(name), Some(s)) = (name, s) {
                support.insert(name.to_owned(), s.to_owned());
            }
        }
        match page.get("nextCursor").and_then(Value::as_str) {
            Some(next) => cursor = Some(next.to_owned()),
            None => {
                let found = support.get(tool).cloned();
                session.tasks.learn_tool_support(plugin.name(), support);
                return found;
            }
        }
    }
    None
}

/// A modern `tools/call`'s params toward the plugin: the client's `task` param dropped, and
/// the gateway's own added when the call runs as a task.
pub fn call_params(params: Option<&RawValue>, as_task: bool) -> Option<Box<RawValue>> {
    let mut value: Value = serde_json::from_str(params?.get()).ok()?;
    let object = value.as_object_mut()?;
    object.remove("task");
    if as_task {
        object.insert("task".into(), serde_json::json!({ "ttl": TASK_TTL_MS }));
    }
    RawValue::from_string(value.to_string()).ok()
}

/// For a `tools/call` the gateway runs as a task: the plugin's `CreateTaskResult` recorded in
/// the caller's table and shown as the extension's (flat, `resultType: "task"`), under its
/// public id. An answer without a task (the plugin ran the call as a plain one) passes as it
/// is.
pub fn created_rewrite(
    session: &Arc<Session>,
    conn: &Arc<PluginConnection>,
    declared: Option<Box<RawValue>>,
) -> Rewrite {
    let (session, conn) = (Arc::downgrade(session), Arc::downgrade(conn));
    Box::new(move |result: &RawValue| {
        let (session, conn) = (session.upgrade()?, conn.upgrade()?);
        let mut value: Value = serde_json::from_str(result.get()).ok()?;
        let object = value.as_object_mut()?;
        let mut task = object.remove("task")?.as_object()?.clone();
        let local = task.get("taskId")?.as_str()?.to_owned();
        let public = session.tasks.add(
            &conn,
            &local,
            ttl_of(&Value::Object(task.clone())),
            declared,
        );
        tracing::info!(plugin = %conn.name(), session = %session.id, task = %public, "task created for a 2026-07-28 client");
        modern_task(&mut task, &public);
        let mut created = Map::new();
        created.insert("resultType".into(), "task".into());
        created.extend(task);
        if let Some(meta) = object.remove("_meta").and_then(without_related) {
            created.insert("_meta".into(), meta);
        }
        RawValue::from_string(Value::Object(created).to_string()).ok()
    })
}

/// Answers a modern client's `tasks/get`, `tasks/update` or `tasks/cancel` about the task
/// `found` runs as `public`.
pub async fn answer(
    session: &Session,
    id: &Id,
    method: &str,
    params: Option<&RawValue>,
    found: Found,
    public: Arc<str>,
) -> Bytes {
    let outcome = match method {
        "tasks/get" => get(session, &found, &public).await,
        "tasks/update" => update(session, params, &public),
        _ => cancel(session, &found, &public).await,
    };
    match outcome {
        Ok(result) => {
            let result =
                RawValue::from_string(Value::Object(result).to_string()).expect("valid JSON");
            jsonrpc::result_bytes(id.raw(), &result)
        }
        Err(Failure::Error(code, message)) => jsonrpc::error_bytes(Some(id), code, &message),
        Err(Failure::Plugin(error)) => match RawValue::from_string(error) {
            Ok(error) => jsonrpc::error_object_bytes(id.raw(), &error),
            Err(_) => jsonrpc::error_bytes(Some(id), code::INTERNAL_ERROR, "invalid error"),
        },
    }
}

/// Why a request about a task got no result.
enum Failure {
    /// The gateway's error.
    Error(i64, String),
    /// The plugin's error object, passed on.
    Plugin(String),
}

/// The empty acknowledgement of `tasks/update` and `tasks/cancel`.
fn ack() -> Map<String, Value> {
    let mut ack = Map::new();
    ack.insert("resultType".into(), "complete".into());
    ack
}

/// `tasks/get`: the task as the plugin says it is now, in the extension's shape.
async fn get(
    session: &Session,
    found: &Found,
    public: &str,
) -> Result<Map<String, Value>, Failure> {
    let task = session
        .detailed_task(found, public)
        .await
        .map_err(|e| match e {
            TaskError::Gone => Failure::Error(code::INVALID_PARAMS, NOT_FOUND.into()),
            TaskError::Plugin(e) => Failure::Plugin(e),
            TaskError::Gateway(code, message) => Failure::Error(code, message),
        })?;
    let mut out = ack();
    out.extend(task);
    Ok(out)
}

/// `tasks/update`: the client's answers handed to what the task asked; acknowledged.
fn update(
    session: &Session,
    params: Option<&RawValue>,
    public: &str,
) -> Result<Map<String, Value>, Failure> {
    let bad = || {
        Failure::Error(
            code::INVALID_PARAMS,
            "Invalid params for tasks/update: params.inputResponses must be an object whose values are the results asked for (objects)".into(),
        )
    };
    #[derive(serde::Deserialize)]
    struct Update {
        #[serde(rename = "inputResponses")]
        responses: HashMap<String, Box<RawValue>>,
    }
    let update: Update = params
        .and_then(|p| serde_json::from_str(p.get()).ok())
        .ok_or_else(bad)?;
    if !update.responses.values().all(|v| v.get().starts_with('{')) {
        return Err(bad());
    }
    session.answer_task_inputs(public, update.responses);
    Ok(ack())
}

/// `tasks/cancel`: the plugin is asked to cancel; acknowledged, also when the task has ended
/// already (the plugin then refuses with invalid params) or the plugin cannot cancel.
async fn cancel(
    session: &Session,
    found: &Found,
    public: &str,
) -> Result<Map<String, Value>, Failure> {
    let answer = call(found, "tasks/cancel").await;
    session.drop_task_inputs(public);
    match answer {
        Ok(_) => Ok(ack()),
        Err(CallError::Rpc(e))
            if is_invalid_params(&e) || error_code(&e) == Some(code::METHOD_NOT_FOUND) =>
        {
            tracing::debug!(plugin = %found.plugin, session = %session.id, task = %public, "tasks/cancel: {e}; acknowledged");
            Ok(ack())
        }
        Err(CallError::Rpc(e)) => Err(Failure::Plugin(e)),
        Err(CallError::Backend(e)) => Err(Failure::Error(e.code(), e.client_message())),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_gateway_alone_decides_the_task_param() {
        let p = |s: &str| RawValue::from_string(s.into()).unwrap();
        let hint = p(r#"{"name":"greet","arguments":{},"task":{"ttl":1,"pollInterval":2}}"#);
        let plain: Value =
            serde_json::from_str(call_params(Some(&hint), false).unwrap().get()).unwrap();
        assert_eq!(plain, json!({"name": "greet", "arguments": {}}));
        let tasked: Value = serde_json::from_str(
            call_params(Some(&p(r#"{"name":"slow"}"#)), true)
                .unwrap()
                .get(),
        )
        .unwrap();
        assert_eq!(
            tasked,
            json!({"name": "slow", "task": {"ttl": TASK_TTL_MS}})
        );
    }
}
