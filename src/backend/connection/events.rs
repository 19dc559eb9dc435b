//! What a plugin sends on its own initiative, and who hears it: the [`PluginEvents`]
//! listener a connection is given, the stream each message most likely relates to
//! ([`Related`]), and the [`Caller`] key requests are forwarded under.
//!
//! Nothing here knows what a listener or a caller is above the backend (a session, a shared
//! pool's router).

use std::sync::Arc;

use bytes::Bytes;
use serde_json::value::RawValue;

use super::{InputRequired, PluginConnection};
use crate::jsonrpc::Id;
use crate::stream::Sink;

/// Listens to what a plugin sends on its own initiative.
pub trait PluginEvents: Send + Sync + 'static {
    /// A request from the plugin to the client (`sampling/createMessage`, `elicitation/create`,
    /// `roots/list`, `ping`), with the client stream it relates to.
    fn plugin_request(
        &self,
        conn: &Arc<PluginConnection>,
        id: Id,
        method: &str,
        params: Option<&RawValue>,
        related: Related,
    );

    /// A notification from the plugin (progress already routed).
    fn plugin_notification(
        &self,
        conn: &Arc<PluginConnection>,
        message: Bytes,
        method: &str,
        related: Related,
    );

    /// The plugin is gone (crashed or stopped).
    fn plugin_exited(&self, conn: &Arc<PluginConnection>);

    /// The person (token subject) this listener is, if it is one's.
    fn subject(&self) -> Option<&str> {
        None
    }

    /// Whether the task `task_id` of this plugin instance is this listener's (its client
    /// created it): what a shared plugin sends about a task goes to that listener alone.
    fn owns_task(&self, _conn: &Arc<PluginConnection>, _task_id: &str) -> bool {
        false
    }

    /// A modern plugin answered a client's request with an `InputRequiredResult`: the
    /// request is parked on `conn` until the listener resumes it with the client's input
    /// ([`PluginConnection::resume_input`]), passes the result to a client that retries on
    /// its own ([`PluginConnection::pass_input`]), or fails it. By default it is passed.
    fn plugin_input_required(&self, conn: &Arc<PluginConnection>, input: InputRequired) {
        conn.pass_input(input.call, &input.result);
    }
}

/// The `_meta` key that ties a message to a task (2025-11-25 tasks).
pub const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";

/// The task a plugin's message names, if any: the `taskId` of `notifications/tasks/status`,
/// or the task in `params._meta` under [`RELATED_TASK`]. Params that do not mention the key
/// are not parsed.
pub fn task_named(method: &str, params: Option<&RawValue>) -> Option<String> {
    let params = params?;
    let status = method == "notifications/tasks/status";
    if !status && !params.get().contains(RELATED_TASK) {
        return None;
    }
    let value: serde_json::Value = serde_json::from_str(params.get()).ok()?;
    let id = if status {
        value.get("taskId")
    } else {
        value.get("_meta")?.get(RELATED_TASK)?.get("taskId")
    };
    id?.as_str().map(str::to_owned)
}

/// Notifications about a plugin's lists and resources, not about any request: above, they go
/// to a session's GET stream (and, from a shared plugin, to every session). The three list
/// changes come first.
pub const LIST_CHANGES: [&str; 4] = [
    "notifications/tools/list_changed",
    "notifications/prompts/list_changed",
    "notifications/resources/list_changed",
    "notifications/resources/updated",
];

/// The client stream a plugin's own message relates to, judged from the client requests in
/// flight on the plugin.
#[derive(Debug, Clone)]
pub enum Related {
    /// The message itself names a client request in flight here (a progress token): this is
    /// that request's stream, whoever else has requests in flight.
    Named(Sink),
    /// No client request is in flight.
    None,
    /// All requests in flight are one [`Caller`]'s, and this is the one stream among them
    /// that can carry the message (or, when none can, one of them: the caller's own stream,
    /// a session's GET stream, then carries it).
    Exact(Sink),
    /// All requests in flight are one caller's, on several streams; this is the newest. The
    /// listener prefers its own stream then.
    Ambiguous(Sink),
    /// Requests of several callers are in flight (a shared plugin): the message cannot be
    /// given to any of them safely.
    Unattributable,
}

/// Whose client request this is: an opaque key, handed in with each forwarded request and
/// only compared; the connection never looks inside. One per session, whose cancellations
/// match its requests; and within it, when the session may be several clients', one per
/// request ([`Caller::alone`]), so that a plugin's own message is given to a request only
/// while no other request is in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Caller {
    session: u64,
    within: u64,
}

impl Caller {
    pub fn new(key: u64) -> Caller {
        Caller {
            session: key,
            within: 0,
        }
    }

    /// The same session's caller, told apart from its other requests by `request`.
    pub fn alone(self, request: u64) -> Caller {
        Caller {
            within: request,
            ..self
        }
    }

    /// Whether `other` is of the same session (its cancellations may name this request).
    pub fn same_session(&self, other: &Caller) -> bool {
        self.session == other.session
    }
}
