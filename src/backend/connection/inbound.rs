//! What a plugin sends, read: answers matched back to their requests through the pending
//! map (forwarded to the client's stream with the client's id, or handed to the gateway task
//! waiting), progress routed by its token, and the plugin's own requests and notifications
//! handed to the listener with the stream they most likely relate to. Also the one light
//! timer task per connection that fails requests past their deadline.
//!
//! The reader must never wait on a client: everything it hands on is queued, not awaited.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::value::RawValue;

use super::super::BackendError;
use super::super::transport::Inbound;
use super::{CallError, Caller, Pending, PluginConnection, Related, empty_object};
use crate::audit::{Ends, Outcome as Outcome_};
use crate::backend::modern::is_input_required;
use crate::jsonrpc::{self, Id, Message, Outcome, code};
use crate::stream::Sink;

/// Fails client requests past their deadline: the client gets an error, the plugin is told
/// to stop working on it. One light task per connection, so the hot path arms no timer.
pub(super) async fn expire_requests(conn: Weak<PluginConnection>, timeout: Duration) {
    let period = (timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    loop {
        tokio::time::sleep(period).await;
        let Some(conn) = conn.upgrade().filter(|c| c.is_alive()) else {
            return;
        };
        let now = std::time::Instant::now();
        let expired: Vec<(u64, Pending)> = {
            let mut pending = conn.pending.lock().expect("pending lock");
            let ids: Vec<u64> = pending
                .iter()
                .filter(|(_, p)| matches!(p, Pending::Client { deadline, .. } if *deadline <= now))
                .map(|(k, _)| *k)
                .collect();
            ids.into_iter()
                .filter_map(|k| pending.remove(&k).map(|p| (k, p)))
                .collect()
        };
        for (id, p) in expired {
            let Pending::Client {
                client_id,
                sink,
                retry,
                mut audit,
                ..
            } = p
            else {
                continue;
            };
            audit.ended(Outcome_::Timeout, Some(code::REQUEST_TIMEOUT));
            conn.metrics.timeouts.inc();
            conn.metrics.errors.inc();
            tracing::warn!(plugin = %conn.name, session = %conn.label, "request {client_id} timed out after {} s", timeout.as_secs());
            sink.respond(jsonrpc::error_bytes(
                Some(&client_id),
                code::REQUEST_TIMEOUT,
                &format!(
                    "Request timed out: plugin '{}' did not answer within {} s",
                    conn.name,
                    timeout.as_secs()
                ),
            ));
            if retry.is_some_and(|r| r.parked()) || conn.transport.withdraw(id) {
                // Parked for the client's input (the plugin answered it), or it never left
                // the queue: the plugin works on nothing to cancel.
                continue;
            }
            let params = RawValue::from_string(
                serde_json::json!({ "requestId": id, "reason": "timed out" }).to_string(),
            )
            .expect("valid JSON");
            conn.notify("notifications/cancelled", Some(&params));
        }
    }
}

pub(super) async fn read_loop(conn: Weak<PluginConnection>, mut inbound: Inbound) {
    while let Some(line) = inbound.next().await {
        let Some(conn) = conn.upgrade() else { return };
        conn.handle_line(line);
    }
    let Some(conn) = conn.upgrade() else { return };
    conn.alive.store(false, Ordering::Release);
    let reason = conn.transport.wait_exit_reason().await;
    let pending: Vec<Pending> = conn
        .pending
        .lock()
        .expect("pending lock")
        .drain()
        .map(|(_, p)| p)
        .collect();
    if !pending.is_empty() {
        tracing::warn!(plugin = %conn.name, session = %conn.label, "plugin exited ({reason}) with {} request(s) in flight", pending.len());
    }
    let message = format!(
        "plugin '{}' exited while handling the request ({reason})",
        conn.name
    );
    for p in pending {
        match p {
            Pending::Client {
                client_id, sink, ..
            } => {
                sink.respond(jsonrpc::error_bytes(
                    Some(&client_id),
                    code::INTERNAL_ERROR,
                    &message,
                ));
            }
            Pending::Internal(tx) => {
                let _ = tx.send(Err(CallError::Backend(BackendError::Exited {
                    plugin: conn.name.to_string(),
                    reason: reason.clone(),
                })));
            }
        }
    }
    if let Some(events) = conn.events() {
        events.plugin_exited(&conn);
    }
}

/// Where a plugin's own message belongs among `clients` (key, caller, sink of each client
/// request in flight): the one caller's one stream that can carry it, a guess among its
/// streams, or nobody's when several callers' requests are in flight.
fn judge<'a>(clients: impl Iterator<Item = (u64, Caller, &'a Sink)>) -> Related {
    // The one caller with requests in flight, and one of its sinks.
    let mut first: Option<(Caller, &Sink)> = None;
    let mut newest: Option<(u64, &Sink)> = None;
    let mut streams = 0;
    for (k, caller, sink) in clients {
        match first {
            None => first = Some((caller, sink)),
            Some((c, _)) if c != caller => return Related::Unattributable,
            Some(_) => {}
        }
        if sink.carries_messages() {
            if newest.is_none_or(|(_, s)| !s.same_stream(sink)) {
                streams += 1;
            }
            if newest.is_none_or(|(n, _)| k > n) {
                newest = Some((k, sink));
            }
        }
    }
    match (newest, streams, first) {
        (None, _, None) => Related::None,
        // The caller's requests are on streams that cannot carry it: its GET stream can.
        (None, _, Some((_, s))) => Related::Exact(s.clone()),
        (Some((_, s)), 1, _) => Related::Exact(s.clone()),
        (Some((_, s)), _, _) => Related::Ambiguous(s.clone()),
    }
}

impl PluginConnection {
    /// Where a message the plugin sends on its own most likely belongs. Stdio carries no link
    /// from a plugin's request or log to the client request that caused it, so only one
    /// stream in flight is certain; with several it is a guess.
    pub fn related(&self) -> Related {
        let pending = self.pending.lock().expect("pending lock");
        let clients = || {
            pending.iter().filter_map(|(k, p)| match p {
                Pending::Client { caller, sink, .. } => Some((*k, *caller, sink)),
                _ => None,
            })
        };
        // A call parked for its client's retry (a bridged call between rounds) is set aside
        // while another request of its session runs: that session's clients cannot be told
        // apart by key (`Caller::alone`), and the running one is the one that can be asking.
        // Another session's parked call still makes the message unattributable.
        if clients().any(|(_, _, sink)| sink.waiting()) {
            let active = judge(clients().filter(|(_, _, sink)| !sink.waiting()));
            let Some(caller) = clients()
                .find(|(_, _, sink)| !sink.waiting())
                .map(|(_, c, _)| c)
            else {
                return judge(clients());
            };
            if matches!(active, Related::Unattributable)
                || clients().any(|(_, c, sink)| sink.waiting() && !c.same_session(&caller))
            {
                return Related::Unattributable;
            }
            return active;
        }
        judge(clients())
    }

    fn handle_line(self: &Arc<Self>, line: Bytes) {
        self.touch();
        let message = match jsonrpc::parse_message(&line) {
            Ok(m) => m,
            Err(e) => {
                let shown = String::from_utf8_lossy(&line[..line.len().min(200)]).into_owned();
                tracing::warn!(plugin = %self.name, session = %self.label, "dropped a line that is not JSON-RPC ({}): {}", e.message(), crate::logs::untrusted(&shown));
                return;
            }
        };
        match message {
            Message::Response { id, outcome } => self.handle_response(id, outcome),
            Message::Request { id, method, params } => match self.events() {
                Some(events) => {
                    events.plugin_request(self, id, &method, params.as_deref(), self.related())
                }
                None => self.answer_unlistened(id, &method),
            },
            Message::Notification { method, params } => {
                if method == "notifications/progress" && self.route_progress(params.as_deref()) {
                    return;
                }
                if let Some(events) = self.events() {
                    events.plugin_notification(self, line, &method, self.related());
                }
            }
        }
    }

    fn handle_response(self: &Arc<Self>, id: Id, outcome: Outcome) {
        let Some((n, pending)) = id.as_u64().and_then(|n| Some((n, self.take(n)?))) else {
            tracing::debug!(plugin = %self.name, session = %self.label, "response to no pending request (id {id}); dropped");
            return;
        };
        // A modern plugin asking for the client's input: parked until it comes.
        let (pending, outcome) = match (pending, outcome) {
            (p @ Pending::Client { retry: Some(_), .. }, Outcome::Result(r))
                if is_input_required(&r) =>
            {
                return self.input_required(n, p, r);
            }
            other => other,
        };
        match pending {
            Pending::Client {
                client_id,
                sink,
                timer,
                rewrite,
                mut audit,
                ..
            } => {
                let failed = match &outcome {
                    Outcome::Result(r) => timer.is_call() && jsonrpc::is_tool_error(r.get()),
                    Outcome::Error(_) => true,
                };
                timer.observe(failed);
                if let Some(a) = &mut audit {
                    match &outcome {
                        Outcome::Result(_) if failed => a.set(Outcome_::ToolError, None),
                        Outcome::Result(_) => a.set(Outcome_::Ok, None),
                        Outcome::Error(e) => a.error(e),
                    }
                }
                let bytes = match &outcome {
                    Outcome::Result(r) => match rewrite.and_then(|f| f(r)) {
                        Some(changed) => jsonrpc::result_bytes(client_id.raw(), &changed),
                        None => jsonrpc::result_bytes(client_id.raw(), r),
                    },
                    Outcome::Error(e) => jsonrpc::error_object_bytes(client_id.raw(), e),
                };
                sink.respond(bytes);
            }
            Pending::Internal(tx) => {
                let _ = tx.send(match outcome {
                    Outcome::Result(r) => Ok(r),
                    Outcome::Error(e) => Err(CallError::Rpc(e.get().to_owned())),
                });
            }
        }
    }

    /// Sends a progress notification to the stream of the request whose token it carries,
    /// with the client's token restored. False when it matches no request.
    fn route_progress(self: &Arc<Self>, params: Option<&RawValue>) -> bool {
        let Some(params) = params else { return false };
        let Ok(mut value) = serde_json::from_str::<serde_json::Value>(params.get()) else {
            return false;
        };
        let Some(n) = value
            .get("progressToken")
            .and_then(serde_json::Value::as_u64)
        else {
            return false;
        };
        let target = {
            let pending = self.pending.lock().expect("pending lock");
            match pending.get(&n) {
                Some(Pending::Client {
                    sink,
                    progress_token: Some(token),
                    ..
                }) => Some((sink.clone(), token.clone())),
                _ => None,
            }
        };
        let Some((sink, token)) = target else {
            return false;
        };
        value["progressToken"] = serde_json::from_str(token.get()).unwrap_or_default();
        let params = RawValue::from_string(value.to_string()).expect("valid JSON");
        let bytes = jsonrpc::request_bytes(None, "notifications/progress", Some(&params));
        if let Err(bytes) = sink.message(bytes)
            && let Some(events) = self.events()
        {
            // The request's stream cannot carry it (JSON mode, or the client left): the
            // listener's own stream (a session's GET stream) can.
            events.plugin_notification(self, bytes, "notifications/progress", Related::Named(sink));
        }
        true
    }

    /// Answers a plugin request when nobody listens (the start-up probe): `ping` gets `{}`,
    /// anything else a method-not-found error.
    fn answer_unlistened(&self, id: Id, method: &str) {
        let bytes = if method == "ping" {
            jsonrpc::result_bytes(id.raw(), &empty_object())
        } else {
            jsonrpc::error_bytes(
                Some(&id),
                code::METHOD_NOT_FOUND,
                &format!("{method} is not available while the gateway probes this plugin"),
            )
        };
        self.send_raw(bytes);
    }
}
