//! What a session's plugins send on their own, relayed to the client, and back.
//!
//! A plugin's notification or request to the client goes on exactly one of the session's
//! streams ([`Session::deliver`]): the related request's when that is certain, else the GET
//! stream. A request to the client gets an id of the session's own (the client sees no
//! plugin's ids) and is refused at once when the client did not declare the capability it
//! needs (or the elicitation mode, or tool use in sampling: [`super::capabilities`]) or no
//! stream can carry it; the client's answer goes back to the instance that asked.
//! A `resources/list_changed` clears what the session learned of resource routes, a
//! `tools/list_changed` (or the instance's exit) what it learned of that plugin's tools'
//! header-mapped parameters. A task a
//! message names (`notifications/tasks/status`, related-task `_meta`) is given by the id the
//! client knows it by, both ways ([`super::tasks`]); a status of a task that is not this
//! session's is dropped.
//! A modern plugin's `InputRequiredResult` asks the client through the same relay, and the
//! answers go back to that round (`modern_plugins.rs`).
//! A modern caller's session has no GET stream: its list changes go to its listeners
//! (`listen.rs`), its logs to the request that asked for them (`request_logs.rs`).
//!
//! Relaying never waits for the client: a message no stream can take now waits on the GET
//! stream (a notification) or is refused to the plugin (a request).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use serde_json::value::RawValue;

use super::Session;
use super::tasks::related_task_mut;
use crate::backend::connection::LIST_CHANGES;
use crate::backend::{InputRequired, PluginConnection, PluginEvents, RELATED_TASK, Related};
use crate::jsonrpc::{self, Id, Outcome};
use crate::stream::Sink;

impl Session {
    fn forget_tool_headers(&self, plugin: &str) {
        self.tool_headers
            .lock()
            .expect("tool headers lock")
            .forget(plugin);
    }

    /// Sends a server-initiated message on exactly one stream: the related request's when it
    /// is certain, else the GET stream if a connection listens there, else (when the relation
    /// is a guess) the newest request stream. Failing these, a notification waits on the GET
    /// stream for its next connection, and a request is given back (`Err`): nobody may be
    /// there to answer it.
    pub fn deliver(&self, bytes: Bytes, related: Related, is_request: bool) -> Result<(), Bytes> {
        let (first, last_resort) = match related {
            Related::Named(s) | Related::Exact(s) => (Some(s), None),
            Related::Ambiguous(s) => (None, Some(s)),
            Related::None | Related::Unattributable => (None, None),
        };
        let get = Sink::new(self.get.clone());
        let live_get = self.get.has_connection().then_some(&get);
        let mut bytes = bytes;
        for sink in first.iter().chain(live_get).chain(last_resort.iter()) {
            match sink.message(bytes) {
                Ok(()) => return Ok(()),
                Err(b) => bytes = b,
            }
        }
        if is_request {
            return Err(bytes);
        }
        if self.for_caller {
            // A modern client listens only on its requests' own streams.
            return Err(bytes);
        }
        get.message(bytes).inspect_err(|_| {
            tracing::warn!(session = %self.id, "the GET stream is released: a notification was dropped");
        })
    }

    /// Routes a client's response to the plugin request it answers. False when the id names
    /// no request the gateway sent.
    pub fn client_response(&self, id: &Id, outcome: &Outcome) -> bool {
        if id.as_u64().is_some_and(|n| self.input_response(n, outcome)) {
            return true;
        }
        if id.as_u64().is_some_and(|n| self.own_response(n, outcome)) {
            return true;
        }
        let entry = id.as_u64().and_then(|n| {
            self.server_requests
                .lock()
                .expect("requests lock")
                .remove(&n)
        });
        let Some((conn, plugin_id)) = entry else {
            return false;
        };
        match conn.upgrade().filter(|c| c.is_alive()) {
            Some(conn) => conn.send_raw(match outcome {
                Outcome::Result(r) => match self.task_ids_in(r, &conn) {
                    Some(r) => jsonrpc::result_bytes(plugin_id.raw(), &r),
                    None => jsonrpc::result_bytes(plugin_id.raw(), r),
                },
                Outcome::Error(e) => jsonrpc::error_object_bytes(plugin_id.raw(), e),
            }),
            None => {
                tracing::debug!(session = %self.id, "answer for a plugin instance that has since exited; dropped")
            }
        }
        true
    }

    /// A client's result that relates to a task by its public id, with `conn`'s own id in its
    /// place; `None` when there is nothing to change.
    fn task_ids_in(&self, result: &RawValue, conn: &PluginConnection) -> Option<Box<RawValue>> {
        if !result.get().contains(RELATED_TASK) {
            return None;
        }
        let mut value: serde_json::Value = serde_json::from_str(result.get()).ok()?;
        let slot = related_task_mut(&mut value)?;
        *slot = (*self.tasks.local_id(conn, slot.as_str()?)?).into();
        RawValue::from_string(value.to_string()).ok()
    }

    /// Gives the task a plugin's message names in `params` (see
    /// [`crate::backend::connection::task_named`]) the id this session's client knows it by.
    /// `Ok(false)`: it names no task; `Err(())`: it names a task that is not this session's.
    fn publish_task(
        &self,
        conn: &PluginConnection,
        method: &str,
        params: &mut serde_json::Value,
    ) -> Result<bool, ()> {
        let status = method == "notifications/tasks/status";
        let local = if status {
            params.get("taskId")
        } else {
            params
                .get("_meta")
                .and_then(|m| m.get(RELATED_TASK))
                .and_then(|t| t.get("taskId"))
        };
        let Some(local) = local.and_then(serde_json::Value::as_str) else {
            return Ok(false);
        };
        let public = self.tasks.public_id(conn, local).ok_or(())?;
        if status {
            params["taskId"] = (*public).into();
        }
        if let Some(slot) = related_task_mut(params) {
            *slot = (*public).into();
        }
        Ok(true)
    }

    /// A plugin's notification with the task it names given its public id (`Ok(None)`: it
    /// names none, send it as it is); `Err(())` when the task is not this session's.
    fn published_notification(
        &self,
        conn: &PluginConnection,
        method: &str,
        message: &[u8],
    ) -> Result<Option<Bytes>, ()> {
        let status = method == "notifications/tasks/status";
        if !status && memchr::memmem::find(message, RELATED_TASK.as_bytes()).is_none() {
            return Ok(None);
        }
        let mut value: serde_json::Value = serde_json::from_slice(message).map_err(|_| ())?;
        let Some(params) = value.get_mut("params") else {
            return if status { Err(()) } else { Ok(None) };
        };
        if !self.publish_task(conn, method, params)? {
            return if status { Err(()) } else { Ok(None) };
        }
        Ok(Some(Bytes::from(value.to_string())))
    }

    /// The public id of the task a plugin's `notifications/tasks/status` is about, if it is
    /// this session's.
    fn status_task(&self, conn: &PluginConnection, message: &[u8]) -> Option<Arc<str>> {
        let value: serde_json::Value = serde_json::from_slice(message).ok()?;
        let local = value.get("params")?.get("taskId")?.as_str()?;
        self.tasks.public_id(conn, local)
    }

    /// A plugin cancelling one of its own requests to the client: the request id becomes the
    /// one the client saw.
    fn map_plugin_cancel(&self, conn: &Arc<PluginConnection>, message: &[u8]) -> Option<Bytes> {
        let mut value: serde_json::Value = serde_json::from_slice(message).ok()?;
        let plugin_id = value.get("params")?.get("requestId")?.to_string();
        let n = {
            let mut requests = self.server_requests.lock().expect("requests lock");
            let n = *requests
                .iter()
                .find(|(_, (c, id))| {
                    c.as_ptr() == Arc::as_ptr(conn) && id.raw().get() == plugin_id
                })?
                .0;
            requests.remove(&n);
            n
        };
        value["params"]["requestId"] = n.into();
        Some(Bytes::from(value.to_string()))
    }
}

impl PluginEvents for Session {
    fn subject(&self) -> Option<&str> {
        self.owner.as_deref()
    }

    fn plugin_request(
        &self,
        conn: &Arc<PluginConnection>,
        id: Id,
        method: &str,
        params: Option<&RawValue>,
        related: Related,
    ) {
        if self.for_caller {
            // A modern client is asked only through the bridge of the call it waits on.
            return self.bridge_request(conn, id, method, params, related);
        }
        if let Some((code, message)) = self.client_capabilities.refusal(method, params) {
            tracing::info!(plugin = %conn.name(), session = %self.id, "{method} refused: {message}");
            conn.send_raw(jsonrpc::error_bytes(Some(&id), code, &message));
            return;
        }
        let published;
        let params = match params.filter(|p| p.get().contains(RELATED_TASK)) {
            Some(p) => {
                let mut value: serde_json::Value =
                    serde_json::from_str(p.get()).unwrap_or_default();
                match self.publish_task(conn, method, &mut value) {
                    Ok(false) => Some(p),
                    Ok(true) => {
                        published = RawValue::from_string(value.to_string()).expect("valid JSON");
                        Some(&*published)
                    }
                    Err(()) => {
                        tracing::info!(plugin = %conn.name(), session = %self.id, "{method} refused: it relates to a task this session does not have");
                        conn.send_raw(jsonrpc::error_bytes(
                            Some(&id),
                            jsonrpc::code::INVALID_PARAMS,
                            &format!("{method}: the task it relates to is not known to the gateway (expired, or not this client's)"),
                        ));
                        return;
                    }
                }
            }
            None => params,
        };
        let n = self.next_server_request.fetch_add(1, Ordering::Relaxed);
        self.server_requests
            .lock()
            .expect("requests lock")
            .insert(n, (Arc::downgrade(conn), id));
        let bytes = jsonrpc::request_bytes(Some(Id::from_u64(n).raw()), method, params);
        if self.deliver(bytes, related, true).is_err() {
            let (_, plugin_id) = self
                .server_requests
                .lock()
                .expect("requests lock")
                .remove(&n)
                .expect("just inserted");
            tracing::warn!(plugin = %conn.name(), session = %self.id, "{method}: no client stream open to carry it; refused");
            conn.send_raw(jsonrpc::error_bytes(
                Some(&plugin_id),
                jsonrpc::code::INTERNAL_ERROR,
                &format!("{method} cannot reach the client: it has no open stream (a GET stream, or a request answered as SSE)"),
            ));
        }
    }

    fn plugin_notification(
        &self,
        conn: &Arc<PluginConnection>,
        message: Bytes,
        method: &str,
        related: Related,
    ) {
        if method == "notifications/message" {
            if self.for_caller {
                // A modern request's own, at its own level (`request_logs.rs`).
                return self.relay_request_log(message, related);
            }
            if !self.log_level.allows(&message) {
                return;
            }
        }
        match method {
            // Unrelated to any request: the GET stream, or a modern caller's listeners.
            m if LIST_CHANGES.contains(&m) => {
                if method == "notifications/resources/list_changed" {
                    self.routes.lock().expect("routes lock").clear();
                }
                if method == "notifications/tools/list_changed" {
                    self.tasks.forget_tool_support(conn.name());
                    self.forget_tool_headers(conn.name());
                }
                if self.for_caller {
                    return self.publish(Some(conn.name()), method, Some(&message[..]));
                }
                let _ = self.deliver(message, Related::None, false);
            }
            "notifications/cancelled" => {
                if let Some(bytes) = self.map_plugin_cancel(conn, &message) {
                    let _ = self.deliver(bytes, related, false);
                }
            }
            _ => match self.published_notification(conn, method, &message) {
                Ok(None) => {
                    let _ = self.deliver(message, related, false);
                }
                // About a task, not the request in flight: the GET stream; for a modern
                // caller, the listeners that asked for the task's notifications.
                Ok(Some(bytes)) if method == "notifications/tasks/status" => {
                    if self.for_caller {
                        if let Some(public) = self.status_task(conn, &message) {
                            self.task_changed(public);
                        }
                        return;
                    }
                    let _ = self.deliver(bytes, Related::None, false);
                }
                Ok(Some(bytes)) => {
                    let _ = self.deliver(bytes, related, false);
                }
                Err(()) => {
                    tracing::debug!(plugin = %conn.name(), session = %self.id, "{method} about a task this session does not have: dropped");
                }
            },
        }
    }

    fn plugin_exited(&self, conn: &Arc<PluginConnection>) {
        self.tasks.forget_tool_support(conn.name());
        self.forget_tool_headers(conn.name());
        self.instance_exited(conn);
    }

    fn owns_task(&self, conn: &Arc<PluginConnection>, task_id: &str) -> bool {
        self.tasks.public_id(conn, task_id).is_some()
    }

    fn plugin_input_required(&self, conn: &Arc<PluginConnection>, input: InputRequired) {
        self.input_required(conn, input);
    }
}
