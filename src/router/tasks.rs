//! Tasks (2025-11-25) across plugins: the `tasks` capability merged for `initialize`, the
//! `tasks/*` requests sent to the plugin instance that runs the task, and the tools a client
//! is offered according to whether it can call them.
//!
//! A plugin's task is shown to the client under an id of the gateway's own, kept in the
//! session's table ([`crate::session::tasks`]): the answer that creates a task is rewritten on
//! its way out, and so are the answers to `tasks/get`, `tasks/result` and `tasks/cancel`.
//! `tasks/list` is answered by the gateway from that table, one `tasks/get` per task, so a
//! client sees its own tasks and no one else's, even on a shared plugin. A tool whose
//! `execution.taskSupport` is `"required"` is listed only to a client that declared `tasks`,
//! and only when its plugin declared task-augmented `tools/call`; a plugin that did not
//! declare it has its tools' `taskSupport` taken out, since the merged capability would
//! otherwise promise it.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::backend::{PluginConnection, RELATED_TASK, Rewrite};
use crate::jsonrpc::{self, Id, code};
use crate::registry::{View, ViewPlugin};
use crate::session::Session;
use crate::session::tasks::{Found, related_task_mut, ttl_of};

/// How long one task's `tasks/get` may take while listing before the list goes on without it.
const LIST_GET_TIMEOUT: Duration = Duration::from_secs(10);

/// The error for a task id the session does not have (the spec's wording).
pub const NOT_FOUND: &str = "Failed to retrieve task: Task not found";

#[derive(Deserialize)]
pub(super) struct TaskParams<'a> {
    #[serde(borrow, rename = "taskId")]
    pub task_id: Cow<'a, str>,
}

/// Whether the plugin declared task-augmented `tools/call`.
pub fn runs_task_calls(plugin: &ViewPlugin) -> bool {
    plugin
        .info
        .capabilities
        .get("tasks")
        .and_then(|t| t.get("requests"))
        .and_then(|r| r.get("tools"))
        .and_then(|t| t.get("call"))
        .is_some_and(|c| !c.is_null())
}

/// Whether any plugin of the view declared `tasks`: without one, `tasks/*` are unknown
/// methods as before.
pub fn any_plugin_has_tasks(view: &View) -> bool {
    view.plugins.iter().any(|p| p.has_capability("tasks"))
}

/// The `tasks` capability for the client: `requests.tools.call` when a plugin takes
/// task-augmented calls, `cancel` when one cancels, and `list`, which the gateway answers
/// itself, with either. `None` when no plugin has tasks.
pub fn merged_capability(plugins: &[Value]) -> Option<Value> {
    let declared = |path: &str| {
        plugins
            .iter()
            .any(|c| c.pointer(path).is_some_and(|v| !v.is_null()))
    };
    let calls = declared("/tasks/requests/tools/call");
    let cancel = declared("/tasks/cancel");
    if !calls && !cancel {
        return None;
    }
    let mut tasks = serde_json::json!({ "list": {} });
    if cancel {
        tasks["cancel"] = serde_json::json!({});
    }
    if calls {
        tasks["requests"] = serde_json::json!({ "tools": { "call": {} } });
    }
    Some(tasks)
}

/// Whether a tool of a plugin is offered to the client, and as what: a tool that must run as
/// a task is dropped when the plugin or the client cannot run it so; a plugin without
/// task-augmented calls has `execution.taskSupport` taken out of its tools.
pub fn offer_tool(tool: &mut Value, plugin_task_calls: bool, client_tasks: bool) -> bool {
    let Some(execution) = tool.get_mut("execution").and_then(Value::as_object_mut) else {
        return true;
    };
    if execution.get("taskSupport").and_then(Value::as_str) == Some("required")
        && !(plugin_task_calls && client_tasks)
    {
        return false;
    }
    if !plugin_task_calls {
        execution.remove("taskSupport");
    }
    true
}

/// For a `tools/list` passed through from the only plugin: the tools it lists that the client
/// cannot use taken out (see [`offer_tool`]; `client`: whether the client can run tasks).
/// `None` when every tool is of use.
pub fn tools_rewrite(plugin: &ViewPlugin, client: bool) -> Option<Rewrite> {
    let calls = runs_task_calls(plugin);
    if calls && client {
        return None;
    }
    Some(Box::new(move |result: &RawValue| {
        if !result.get().contains("\"taskSupport\"") {
            return None;
        }
        let mut value: Value = serde_json::from_str(result.get()).ok()?;
        value
            .get_mut("tools")?
            .as_array_mut()?
            .retain_mut(|t| offer_tool(t, calls, client));
        RawValue::from_string(value.to_string()).ok()
    }))
}

/// For a task-augmented `tools/call`: a task in the answer is recorded in the session's table
/// and shown under its public id. An answer without one (a plugin that ran the call as a plain
/// one) passes as it is.
pub fn new_task_rewrite(session: &Arc<Session>, conn: &Arc<PluginConnection>) -> Rewrite {
    let (session, conn) = (Arc::downgrade(session), Arc::downgrade(conn));
    Box::new(move |result: &RawValue| {
        let (session, conn) = (session.upgrade()?, conn.upgrade()?);
        let mut value: Value = serde_json::from_str(result.get()).ok()?;
        let task = value.get_mut("task")?;
        let local = task.get("taskId")?.as_str()?.to_owned();
        let public = session.tasks.add(&conn, &local, ttl_of(task), None);
        tracing::info!(plugin = %conn.name(), session = %session.id, task = %public, "task created");
        task["taskId"] = (*public).into();
        if let Some(slot) = related_task_mut(&mut value) {
            *slot = (*public).into();
        }
        RawValue::from_string(value.to_string()).ok()
    })
}

/// For `tasks/get`, `tasks/cancel` and `tasks/result`: the answer speaks of the task by its
/// public id (a `tasks/result` answer always carries the related-task `_meta`, as it must).
pub fn answer_rewrite(method: &str, public: Arc<str>) -> Rewrite {
    let result = method == "tasks/result";
    Box::new(move |answer: &RawValue| {
        let mut value: Value = serde_json::from_str(answer.get()).ok()?;
        let object = value.as_object_mut()?;
        if result {
            let meta = object
                .entry("_meta")
                .or_insert_with(|| Value::Object(Default::default()));
            meta.as_object_mut()?.insert(
                RELATED_TASK.into(),
                serde_json::json!({ "taskId": &*public }),
            );
        } else {
            object.insert("taskId".into(), (*public).into());
            if let Some(slot) = related_task_mut(&mut value) {
                *slot = (*public).into();
            }
        }
        RawValue::from_string(value.to_string()).ok()
    })
}

/// The params of a request about a task, with the plugin's id in place of the public one.
pub fn local_params(params: Option<&RawValue>, local: &str) -> Option<Box<RawValue>> {
    let mut value: Value = serde_json::from_str(params?.get()).ok()?;
    value["taskId"] = local.into();
    RawValue::from_string(value.to_string()).ok()
}

/// `tasks/list`, answered from the session's table: each task the session has on a plugin of
/// the view, as that plugin's `tasks/get` says it is now, in the order they were created. A
/// task its plugin no longer knows is forgotten; one whose plugin does not answer in time is
/// left out of this page. One page: the table is bounded.
pub async fn list(session: &Session, view: &View, id: &Id) -> Bytes {
    let mine: Vec<(Arc<str>, Found)> = session
        .tasks
        .all()
        .into_iter()
        .filter(|(_, f)| view.find(&f.plugin).is_some())
        .collect();
    let got = futures_util::future::join_all(mine.iter().map(|(_, f)| async move {
        let params = serde_json::json!({ "taskId": &*f.local }).to_string();
        let params = RawValue::from_string(params).expect("valid JSON");
        tokio::time::timeout(LIST_GET_TIMEOUT, f.conn.call("tasks/get", Some(&params))).await
    }))
    .await;
    let mut tasks = Vec::with_capacity(mine.len());
    for ((public, found), answer) in mine.iter().zip(got) {
        match answer {
            Ok(Ok(raw)) => {
                let Ok(mut task) = serde_json::from_str::<Value>(raw.get()) else {
                    continue;
                };
                let Some(object) = task.as_object_mut() else {
                    continue;
                };
                object.remove("_meta");
                object.insert("taskId".into(), (**public).into());
                tasks.push(task);
            }
            Ok(Err(crate::backend::connection::CallError::Rpc(e))) if is_invalid_params(&e) => {
                tracing::debug!(plugin = %found.plugin, session = %session.id, task = %public, "the plugin no longer knows the task; forgotten");
                session.tasks.forget(public);
            }
            Ok(Err(e)) => {
                tracing::debug!(plugin = %found.plugin, session = %session.id, "tasks/get while listing: {e}")
            }
            Err(_) => {
                tracing::debug!(plugin = %found.plugin, session = %session.id, "tasks/get while listing: no answer in time")
            }
        }
    }
    let result = serde_json::json!({ "tasks": tasks }).to_string();
    jsonrpc::result_bytes(
        id.raw(),
        &RawValue::from_string(result).expect("valid JSON"),
    )
}

fn is_invalid_params(error: &str) -> bool {
    serde_json::from_str::<Value>(error)
        .ok()
        .and_then(|e| e.get("code").and_then(Value::as_i64))
        == Some(code::INVALID_PARAMS)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_capability_merges_what_some_plugin_declared() {
        let calls = json!({"tasks": {"requests": {"tools": {"call": {}}}}});
        let cancel = json!({"tasks": {"cancel": {}, "list": {}}});
        assert_eq!(merged_capability(&[json!({"tools": {}})]), None);
        assert_eq!(
            merged_capability(&[calls.clone(), json!({})]),
            Some(json!({"list": {}, "requests": {"tools": {"call": {}}}}))
        );
        assert_eq!(
            merged_capability(&[calls, cancel]),
            Some(json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}))
        );
    }

    #[test]
    fn tools_are_offered_as_they_can_be_called() {
        let tool = |support: &str| json!({"name": "t", "execution": {"taskSupport": support}});
        let mut required = tool("required");
        assert!(offer_tool(&mut required, true, true));
        assert!(
            !offer_tool(&mut tool("required"), true, false),
            "the client cannot"
        );
        assert!(
            !offer_tool(&mut tool("required"), false, true),
            "the plugin cannot"
        );
        let mut optional = tool("optional");
        assert!(offer_tool(&mut optional, false, true));
        assert_eq!(
            optional["execution"],
            json!({}),
            "not promised for a plugin without task calls"
        );
        let mut plain = json!({"name": "t"});
        assert!(offer_tool(&mut plain, false, false));
    }
}
