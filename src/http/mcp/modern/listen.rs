//! `subscriptions/listen` (2026-07-28): a long-lived SSE answer that opens with
//! `notifications/subscriptions/acknowledged` (the part of the filter the gateway honours) and
//! then carries the list changes and resource updates the client asked for, each tagged with
//! the request's id as the subscription id (the caller's session does that:
//! `session/listen.rs`).
//!
//! The list changes are always honoured (the registry can change any list at any time). A
//! resource URI is honoured when a plugin the caller may use serves it and declares
//! `resources.subscribe`, and that plugin took the subscription (or already had it for
//! another holder: subscriptions are counted, `session/holds.rs`). A task id (`taskIds`, the
//! tasks extension, which the request must declare: -32021 otherwise) is honoured when it is
//! one of the caller's tasks; its `notifications/tasks` carry the task as `tasks/get` would
//! show it (`session/task_status.rs`), the first one at once, then one on each change. When the gateway drains,
//! each listen stream gets its successful response (`resultType: complete`) and ends, as the
//! spec's graceful closure says; a client that closes its stream ends the listener and lets
//! go of its subscriptions.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::super::Conn;
use crate::auth::Principal;
use crate::http::Edge;
use crate::http::error::HttpError;
use crate::jsonrpc::{self, Id};
use crate::protocol::modern::ModernError;
use crate::registry::View;
use crate::router;
use crate::session::{ListenFilter, Listener, SUBSCRIPTION_ID, Session, TooManyListeners, tagged};
use crate::stream::{self, Cursor, Opening, Sink, StreamGuard};

/// Most resource URIs one listener may ask for.
const MAX_URIS: usize = 100;
/// Most task ids one listener may ask for.
const MAX_TASK_IDS: usize = 256;

#[derive(Deserialize)]
struct Params {
    notifications: Filter,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Filter {
    tools_list_changed: Option<bool>,
    prompts_list_changed: Option<bool>,
    resources_list_changed: Option<bool>,
    resource_subscriptions: Option<Vec<String>>,
    task_ids: Option<Vec<String>>,
}

/// Answers a `subscriptions/listen` of `session`'s caller with its listen stream; `tasks`:
/// whether the request declares the tasks extension.
#[allow(clippy::too_many_arguments)]
pub(super) async fn listen(
    gw: &Edge,
    session: &Arc<Session>,
    view: &Arc<View>,
    principal: Option<&Principal>,
    id: Id,
    params: Option<Box<RawValue>>,
    tasks: bool,
    conn: &Conn,
) -> Result<Response, HttpError> {
    let bad = |why: String| HttpError::InvalidParams(why, id.clone());
    let asked: Params = params
        .as_deref()
        .ok_or_else(|| bad("subscriptions/listen needs params.notifications".into()))
        .and_then(|p| {
            serde_json::from_str(p.get()).map_err(|e| {
                bad(format!(
                    "params.notifications must be a subscription filter ({e})"
                ))
            })
        })?;
    let uris: BTreeSet<String> = asked
        .notifications
        .resource_subscriptions
        .unwrap_or_default()
        .into_iter()
        .collect();
    if uris.len() > MAX_URIS {
        return Err(bad(format!(
            "a listener may ask for at most {MAX_URIS} resource URIs"
        )));
    }
    let task_ids: BTreeSet<String> = asked
        .notifications
        .task_ids
        .unwrap_or_default()
        .into_iter()
        .collect();
    if !task_ids.is_empty() && !tasks {
        return Err(HttpError::Modern(
            ModernError::tasks_extension_missing(),
            Some(id.clone()),
        ));
    }
    if task_ids.len() > MAX_TASK_IDS {
        return Err(bad(format!(
            "a listener may ask for at most {MAX_TASK_IDS} task ids"
        )));
    }
    // Only the caller's own tasks: another's is not known, as it is not to tasks/get.
    let task_ids: BTreeSet<String> = task_ids
        .into_iter()
        .filter(|t| session.tasks.get(t).is_some())
        .collect();
    let slot = gw.sessions.reserve_listener(session).map_err(|e| match e {
        TooManyListeners::Gateway(_) => HttpError::TooManyListeners(Some(id.clone())),
        TooManyListeners::Caller(n) => HttpError::TooManyListenersForCaller(n, Some(id.clone())),
    })?;
    // Each URI held at a plugin that can honour it; the others are left out of the ack.
    let held = futures_util::future::join_all(uris.iter().map(|uri| async move {
        let plugin = router::resource_plugin(session, view, uri).await?;
        let subscribable = plugin
            .info
            .capabilities
            .get("resources")
            .and_then(|r| r.get("subscribe"))
            == Some(&serde_json::Value::Bool(true));
        if !subscribable {
            return None;
        }
        match session.hold_subscription(plugin, uri).await {
            Ok(hold) => Some((uri.clone(), hold)),
            Err(e) => {
                tracing::info!(plugin = %plugin.name(), "resources/subscribe {uri} for a listener: {e}");
                None
            }
        }
    }))
    .await;
    let (honoured, holds): (BTreeSet<String>, Vec<_>) = held.into_iter().flatten().unzip();
    let filter = ListenFilter {
        tools: asked.notifications.tools_list_changed == Some(true),
        prompts: asked.notifications.prompts_list_changed == Some(true),
        resources: asked.notifications.resources_list_changed == Some(true),
        uris: honoured,
        task_ids,
    };

    let stream = session.listen_stream();
    let attached = stream
        .attach(Cursor::Start, conn.cut.clone())
        .await
        .map_err(|e| HttpError::EventStore(e.to_string()))?;
    let sink = Sink::new(stream.clone());
    let _ = sink.message(acknowledgement(id.raw(), &filter));
    let tasks_asked: Vec<String> = filter.task_ids.iter().cloned().collect();
    let gone = session.add_listener(Listener {
        sink: sink.clone(),
        subscription_id: id.raw().to_owned(),
        filter,
        caller: principal.cloned(),
        holds,
        slot,
    });
    // Each task as it is now, first: it may have changed before the listener came.
    for task in tasks_asked {
        session.task_changed(Arc::from(task));
    }
    // The gateway drains: the listener's graceful end, its one response.
    let draining = gw.draining.clone();
    let subscription = id.raw().to_owned();
    tokio::spawn(async move {
        tokio::select! {
            () = draining.cancelled() => {
                sink.respond(closing(&subscription));
            }
            () = gone.cancelled() => {}
        }
    });
    let opening = Opening {
        priming: None,
        retry: None,
        ids: false,
        poll_after: None,
        keep_alive: session.stream_settings.keep_alive,
        hold: Duration::ZERO,
        drain: None,
        proof: None,
    };
    let guard = StreamGuard::new(session.connections.clone());
    Ok(stream::sse_response(attached, opening, session.closed.clone(), guard).await)
}

/// `notifications/subscriptions/acknowledged`: what the listener will hear.
fn acknowledgement(id: &RawValue, filter: &ListenFilter) -> bytes::Bytes {
    let mut honoured = serde_json::Map::new();
    for (key, on) in [
        ("toolsListChanged", filter.tools),
        ("promptsListChanged", filter.prompts),
        ("resourcesListChanged", filter.resources),
    ] {
        if on {
            honoured.insert(key.into(), true.into());
        }
    }
    if !filter.uris.is_empty() {
        honoured.insert(
            "resourceSubscriptions".into(),
            filter.uris.iter().cloned().collect(),
        );
    }
    if !filter.task_ids.is_empty() {
        honoured.insert("taskIds".into(), filter.task_ids.iter().cloned().collect());
    }
    let honoured = serde_json::Value::Object(honoured);
    let message = tagged("notifications/subscriptions/acknowledged", id, None);
    // The tagged params with the filter beside `_meta`.
    let mut value: serde_json::Value = serde_json::from_slice(&message).expect("valid JSON");
    value["params"]["notifications"] = honoured;
    bytes::Bytes::from(value.to_string())
}

/// The listen request's response when the gateway ends it: complete, naming the subscription.
fn closing(id: &RawValue) -> bytes::Bytes {
    let result = format!(
        r#"{{"resultType":"complete","_meta":{{"{SUBSCRIPTION_ID}":{}}}}}"#,
        id.get()
    );
    let result = RawValue::from_string(result).expect("valid JSON");
    jsonrpc::result_bytes(id, &result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_acknowledgement_and_the_closing_name_the_subscription() {
        let id = RawValue::from_string("5".into()).unwrap();
        let filter = ListenFilter {
            tools: true,
            uris: ["test://a".to_owned()].into(),
            ..Default::default()
        };
        let ack: serde_json::Value =
            serde_json::from_slice(&acknowledgement(&id, &filter)).unwrap();
        assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
        assert_eq!(ack["params"]["_meta"][SUBSCRIPTION_ID], 5);
        assert_eq!(
            ack["params"]["notifications"],
            serde_json::json!({"toolsListChanged": true, "resourceSubscriptions": ["test://a"]})
        );
        let end: serde_json::Value = serde_json::from_slice(&closing(&id)).unwrap();
        assert_eq!(end["id"], 5);
        assert_eq!(end["result"]["resultType"], "complete");
        assert_eq!(end["result"]["_meta"][SUBSCRIPTION_ID], 5);
    }
}
