//! What a session's plugins send on their own, relayed to the client, and back.
//!
//! A plugin's notification or request to the client goes on exactly one of the session's
//! streams ([`Session::deliver`]): the related request's when that is certain, else the GET
//! stream. A request to the client gets an id of the session's own (the client sees no
//! plugin's ids) and is refused at once when the client did not declare the capability it
//! needs or no stream can carry it; the client's answer goes back to the instance that asked.
//! A `resources/list_changed` clears what the session learned of resource routes. A modern
//! caller's session has no GET stream: its list changes go to its listeners (`listen.rs`),
//! its logs to the request that asked for them (`request_logs.rs`).
//!
//! Relaying never waits for the client: a message no stream can take now waits on the GET
//! stream (a notification) or is refused to the plugin (a request).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use serde_json::value::RawValue;

use super::Session;
use crate::backend::connection::LIST_CHANGES;
use crate::backend::{PluginConnection, PluginEvents, Related};
use crate::jsonrpc::{self, Id, Outcome};
use crate::stream::Sink;

impl Session {
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
                Outcome::Result(r) => jsonrpc::result_bytes(plugin_id.raw(), r),
                Outcome::Error(e) => jsonrpc::error_object_bytes(plugin_id.raw(), e),
            }),
            None => {
                tracing::debug!(session = %self.id, "answer for a plugin instance that has since exited; dropped")
            }
        }
        true
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
    fn plugin_request(
        &self,
        conn: &Arc<PluginConnection>,
        id: Id,
        method: &str,
        params: Option<&RawValue>,
        related: Related,
    ) {
        let needs = match method {
            "sampling/createMessage" => Some("sampling"),
            "elicitation/create" => Some("elicitation"),
            "roots/list" => Some("roots"),
            _ => None,
        };
        if let Some(cap) = needs.filter(|c| !self.client_capabilities.contains(*c)) {
            tracing::info!(plugin = %conn.name(), session = %self.id, "{method} refused: the client did not declare the `{cap}` capability");
            conn.send_raw(jsonrpc::error_bytes(
                Some(&id),
                jsonrpc::code::METHOD_NOT_FOUND,
                &format!("the client did not declare the `{cap}` capability"),
            ));
            return;
        }
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
            _ => {
                let _ = self.deliver(message, related, false);
            }
        }
    }

    fn plugin_exited(&self, conn: &Arc<PluginConnection>) {
        self.instance_exited(conn);
    }
}
