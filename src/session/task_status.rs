//! A modern caller's task as the tasks extension (`io.modelcontextprotocol/tasks`) shows it:
//! the `DetailedTask` that `tasks/get` answers and `notifications/tasks` carries, made from
//! what the plugin's 2025-11-25 tasks say.
//!
//! The plugin's `tasks/get` gives the status; once the task is terminal its `tasks/result`
//! gives the result (a tool error is `completed` with `isError`) or the JSON-RPC error
//! (`failed`). A task that is not terminal is `input_required` exactly while it has requests
//! waiting on its client ([`super::tasks`]), which it shows as `inputRequests`; else
//! `working`. The fields are the extension's: the public id, `ttlMs` and `pollIntervalMs`
//! (integer milliseconds), no related-task `_meta`.
//!
//! A listener that asked for a task's notifications (`listen.rs`) is sent its `DetailedTask`
//! when it starts listening, whenever the plugin says the task's status changed, and whenever
//! the task asks its client something.

use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::Session;
use super::tasks::Found;
use crate::backend::RELATED_TASK;
use crate::backend::connection::CallError;
use crate::jsonrpc::code;

/// How long the plugin may take to answer a `tasks/get`, `tasks/result` or `tasks/cancel`.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a task could not be shown.
#[derive(Debug)]
pub enum TaskError {
    /// The gateway's error.
    Gateway(i64, String),
    /// The plugin's error object, to pass on.
    Plugin(String),
    /// The plugin no longer knows the task (it was forgotten).
    Gone,
}

/// A 2025-11-25 `Task` in the extension's words: the public id, `ttlMs` and
/// `pollIntervalMs` (integer milliseconds) for `ttl` and `pollInterval`, no `_meta` about
/// the related task, nothing of another status's (`result`, `error`, `inputRequests`) nor a
/// `requestState`.
pub fn modern_task(task: &mut Map<String, Value>, public: &str) {
    task.insert("taskId".into(), public.into());
    let ttl = task.remove("ttl").unwrap_or(Value::Null);
    let ttl = match ttl.as_f64() {
        Some(ms) if ms >= 1.0 => Value::from(ms.round() as u64),
        _ => Value::Null,
    };
    task.insert("ttlMs".into(), ttl);
    if let Some(ms) = task.remove("pollInterval").and_then(|p| p.as_f64())
        && ms >= 1.0
    {
        task.insert("pollIntervalMs".into(), Value::from(ms.round() as u64));
    }
    if let Some(meta) = task.remove("_meta").and_then(without_related) {
        task.insert("_meta".into(), meta);
    }
    for key in ["result", "error", "inputRequests", "requestState"] {
        task.remove(key);
    }
}

/// `_meta` without the related-task key; `None` when nothing else is left.
pub fn without_related(meta: Value) -> Option<Value> {
    let mut meta = meta.as_object()?.clone();
    meta.remove(RELATED_TASK);
    (!meta.is_empty()).then_some(Value::Object(meta))
}

/// One call to the instance that runs a task, about it (its own id in the params).
pub async fn call(found: &Found, method: &str) -> Result<Box<RawValue>, CallError> {
    let params = serde_json::json!({ "taskId": &*found.local }).to_string();
    let params = RawValue::from_string(params).expect("valid JSON");
    match tokio::time::timeout(CALL_TIMEOUT, found.conn.call(method, Some(&params))).await {
        Ok(answer) => answer,
        Err(_) => Err(CallError::Rpc(
            serde_json::json!({
                "code": code::INTERNAL_ERROR,
                "message": format!("the plugin did not answer {method} in time"),
            })
            .to_string(),
        )),
    }
}

/// Whether a JSON-RPC error object is invalid params (-32602).
pub fn is_invalid_params(error: &str) -> bool {
    error_code(error) == Some(code::INVALID_PARAMS)
}

/// The code of a JSON-RPC error object.
pub fn error_code(error: &str) -> Option<i64> {
    serde_json::from_str::<Value>(error)
        .ok()?
        .get("code")?
        .as_i64()
}

impl Session {
    /// The task `found` runs as `public`, as the extension shows it now (see the module's
    /// doc), without `resultType`. A task its plugin no longer knows is forgotten.
    pub async fn detailed_task(
        &self,
        found: &Found,
        public: &str,
    ) -> Result<Map<String, Value>, TaskError> {
        let raw = call(found, "tasks/get").await.map_err(|e| match e {
            CallError::Rpc(e) if is_invalid_params(&e) => {
                self.tasks.forget(public);
                TaskError::Gone
            }
            CallError::Rpc(e) => TaskError::Plugin(e),
            CallError::Backend(e) => TaskError::Gateway(e.code(), e.client_message()),
        })?;
        let Ok(Value::Object(mut task)) = serde_json::from_str::<Value>(raw.get()) else {
            return Err(TaskError::Gateway(
                code::INTERNAL_ERROR,
                "the plugin's tasks/get result is not a task".into(),
            ));
        };
        let status = task
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or("working")
            .to_owned();
        modern_task(&mut task, public);
        match status.as_str() {
            "completed" | "failed" => {
                // Nobody answers what it asked any more.
                self.drop_task_inputs(public);
                match call(found, "tasks/result").await {
                    Ok(result) => {
                        let mut result: Value =
                            serde_json::from_str(result.get()).map_err(|_| {
                                TaskError::Gateway(
                                    code::INTERNAL_ERROR,
                                    "the plugin's tasks/result is not JSON".into(),
                                )
                            })?;
                        if let Some(object) = result.as_object_mut()
                            && let Some(meta) = object.remove("_meta").and_then(without_related)
                        {
                            object.insert("_meta".into(), meta);
                        }
                        // A tool error (`isError`) is a result: completed.
                        task.insert("status".into(), "completed".into());
                        task.insert("result".into(), result);
                    }
                    Err(CallError::Rpc(error)) => {
                        let error: Value = serde_json::from_str(&error).unwrap_or_else(|_| {
                            serde_json::json!({ "code": code::INTERNAL_ERROR, "message": error })
                        });
                        task.insert("status".into(), "failed".into());
                        task.insert("error".into(), error);
                    }
                    Err(CallError::Backend(e)) => {
                        return Err(TaskError::Gateway(e.code(), e.client_message()));
                    }
                }
            }
            "cancelled" => self.drop_task_inputs(public),
            _ => {
                // Input required exactly while the task waits on its client for something.
                let inputs = self.task_inputs(public);
                if inputs.is_empty() {
                    task.insert("status".into(), "working".into());
                } else {
                    let mut requests = Map::new();
                    for input in inputs {
                        let mut request = Map::new();
                        request.insert("method".into(), input.method.into());
                        if let Some(p) = input
                            .params
                            .and_then(|p| serde_json::from_str(p.get()).ok())
                        {
                            request.insert("params".into(), p);
                        }
                        requests.insert(input.key, Value::Object(request));
                    }
                    task.insert("status".into(), "input_required".into());
                    task.insert("inputRequests".into(), Value::Object(requests));
                }
            }
        }
        Ok(task)
    }

    /// Tells the listeners that asked for task `public`'s notifications how it is now, if
    /// any did (the task is read again, off this path).
    pub fn task_changed(&self, public: Arc<str>) {
        if !self.wants_task(&public) {
            return;
        }
        let Some(me) = self.me.upgrade() else { return };
        tokio::spawn(async move {
            let Some(found) = me.tasks.get(&public) else {
                return;
            };
            match me.detailed_task(&found, &public).await {
                Ok(task) => me.notify_task_listeners(&public, task),
                Err(e) => {
                    tracing::debug!(session = %me.id, task = %public, "the task's status for its listeners: {e:?}")
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_legacy_task_is_shown_in_the_extensions_words() {
        let mut task = json!({
            "taskId": "local-1", "status": "working", "ttl": 60000, "pollInterval": 250,
            "createdAt": "2026-07-28T10:30:00.000Z", "lastUpdatedAt": "2026-07-28T10:30:00.000Z",
            "_meta": {RELATED_TASK: {"taskId": "local-1"}},
        })
        .as_object()
        .unwrap()
        .clone();
        modern_task(&mut task, "public-1");
        assert_eq!(
            Value::Object(task),
            json!({
                "taskId": "public-1", "status": "working", "ttlMs": 60000, "pollIntervalMs": 250,
                "createdAt": "2026-07-28T10:30:00.000Z", "lastUpdatedAt": "2026-07-28T10:30:00.000Z",
            })
        );
        let mut unlimited = json!({"taskId": "x", "ttl": null, "_meta": {"other": 1}})
            .as_object()
            .unwrap()
            .clone();
        modern_task(&mut unlimited, "y");
        assert_eq!(
            Value::Object(unlimited),
            json!({"taskId": "y", "ttlMs": null, "_meta": {"other": 1}})
        );
    }
}
