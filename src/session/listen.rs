//! A modern caller's `subscriptions/listen` streams (2026-07-28), as its hidden session keeps
//! them: each listener's filter, its stream, and the subscriptions it holds. What the
//! session's plugins say about their lists and resources ([`LIST_CHANGES`]), and the
//! gateway's own list changes when the registry changes, go to every listener that asked for
//! them, rewritten as the gateway's own notification carrying the listener's subscription id
//! (nothing else of a plugin's message is passed on). A listener hears only of plugins its
//! caller may use.
//!
//! How many listeners there are is bounded per caller and in total ([`ListenSlot`]), and so is
//! what each may fall behind by ([`LISTEN_QUEUE_BYTES`]): a listener that stops reading is cut
//! off. A listener goes when its stream is released (its client closed it, the gateway
//! ended it, or it fell behind), and with it its subscriptions.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use super::Session;
use super::holds::Hold;
use super::manager::SessionManager;
use crate::auth::{Principal, access};
use crate::backend::connection::LIST_CHANGES;
use crate::jsonrpc;
use crate::stream::{Buffering, Sink, Stream, StreamKey};

/// Bytes a listener's connection may fall behind by before it is cut off: notifications are
/// small, so a listener that has this much unread has stopped reading.
pub const LISTEN_QUEUE_BYTES: usize = 64 * 1024;

/// The `_meta` key that names the subscription a message belongs to.
pub const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// What a listener asked for and was granted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListenFilter {
    pub tools: bool,
    pub prompts: bool,
    pub resources: bool,
    /// `notifications/resources/updated` for these URIs.
    pub uris: BTreeSet<String>,
    /// `notifications/tasks` for these tasks (the caller's, by public id).
    pub task_ids: BTreeSet<String>,
}

/// One open listen stream.
pub struct Listener {
    pub sink: Sink,
    /// The `subscriptions/listen` request's id, as the client sent it.
    pub subscription_id: Box<RawValue>,
    pub filter: ListenFilter,
    /// The caller when authorization is on: a plugin it may not use (another scope, or
    /// rules that leave it out) is not its business. `None`: every plugin without rules is.
    pub caller: Option<Principal>,
    /// The subscriptions it holds, let go with it.
    pub holds: Vec<Hold>,
    /// Its place under the limits.
    pub slot: ListenSlot,
}

/// A session's listeners, by their stream's number.
#[derive(Default)]
pub(super) struct Hub {
    listeners: Mutex<foldhash::HashMap<u64, (Arc<Listener>, CancellationToken)>>,
    /// Listeners of this caller counted against the per-caller limit (reserved or open).
    counted: Arc<AtomicUsize>,
}

/// Why no listener was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TooManyListeners {
    /// The gateway holds this many, its most.
    Gateway(usize),
    /// The caller holds this many, the most one caller may.
    Caller(usize),
}

/// A listener's place under the limits: counted while it lives.
pub struct ListenSlot {
    counters: [Arc<AtomicUsize>; 2],
}

impl Drop for ListenSlot {
    fn drop(&mut self) {
        for c in &self.counters {
            c.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Takes one place from `counter` unless it holds `most`.
fn reserve(counter: &AtomicUsize, most: usize) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < most).then_some(n + 1)
        })
        .is_ok()
}

impl SessionManager {
    /// A place for one more listener of `session`'s caller: listen streams are as long-lived
    /// as sessions, so they count against the same limits (the gateway's most sessions, and
    /// one client's).
    pub fn reserve_listener(&self, session: &Session) -> Result<ListenSlot, TooManyListeners> {
        let (total, per_caller) = (self.max_listeners(), self.max_listeners_per_caller());
        if !reserve(&self.listening, total) {
            return Err(TooManyListeners::Gateway(total));
        }
        if !reserve(&session.listeners.counted, per_caller) {
            self.listening.fetch_sub(1, Ordering::AcqRel);
            return Err(TooManyListeners::Caller(per_caller));
        }
        Ok(ListenSlot {
            counters: [self.listening.clone(), session.listeners.counted.clone()],
        })
    }
}

#[derive(Deserialize)]
struct Updated {
    params: UpdatedParams,
}

#[derive(Deserialize)]
struct UpdatedParams {
    uri: String,
}

impl Session {
    /// A new stream for a `subscriptions/listen` answer: SSE, kept nowhere (no resumption),
    /// owing the one response that ends it.
    pub fn listen_stream(&self) -> Arc<Stream> {
        let number = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let key = StreamKey {
            session: self.id.clone(),
            stream: number,
        };
        let stream = Stream::new(
            key,
            self.tag,
            true,
            Buffering::None,
            self.events.clone(),
            Some(1),
            Some(self.hooks.clone()),
        );
        stream.limit_queue_bytes(LISTEN_QUEUE_BYTES);
        stream
    }

    /// Adds a listener whose acknowledgement is already on its stream: from now on it hears
    /// what it asked for. The token fires when it goes. A session that has ended takes none.
    pub fn add_listener(&self, listener: Listener) -> CancellationToken {
        let gone = CancellationToken::new();
        let number = listener.sink.stream_number();
        if self.closed.is_cancelled() {
            gone.cancel();
            return gone;
        }
        let listener = Arc::new(listener);
        self.listeners
            .listeners
            .lock()
            .expect("listeners lock")
            .insert(number, (listener.clone(), gone.clone()));
        // Its client may have gone already, the stream's release told to nobody.
        if !listener.sink.carries_messages() {
            self.remove_listener(number);
        }
        gone
    }

    /// The stream numbered `number` is released: a listener on it goes.
    pub(super) fn remove_listener(&self, number: u64) {
        let gone = self
            .listeners
            .listeners
            .lock()
            .expect("listeners lock")
            .remove(&number);
        if let Some((_, token)) = gone {
            token.cancel();
        }
    }

    /// Every listener goes (the session ends).
    pub(super) fn remove_listeners(&self) {
        let Some(hub) = self.listeners.if_made() else {
            return;
        };
        let all: Vec<_> = hub
            .listeners
            .lock()
            .expect("listeners lock")
            .drain()
            .collect();
        for (_, (_, token)) in all {
            token.cancel();
        }
    }

    /// Tells the listeners that asked for it of a change: `method` is one of
    /// [`LIST_CHANGES`], `message` the plugin's own (for the URI of a resource update), and
    /// `from` the plugin that sent it (`None`: the gateway's own, the registry changed).
    pub(super) fn publish(&self, from: Option<&str>, method: &str, message: Option<&[u8]>) {
        let Some(hub) = self.listeners.if_made() else {
            return;
        };
        let listeners: Vec<Arc<Listener>> = {
            let table = hub.listeners.lock().expect("listeners lock");
            if table.is_empty() {
                return;
            }
            table.values().map(|(l, _)| l.clone()).collect()
        };
        let uri = match method {
            "notifications/resources/updated" => {
                match message.and_then(|m| serde_json::from_slice::<Updated>(m).ok()) {
                    Some(u) => Some(u.params.uri),
                    None => return,
                }
            }
            m if LIST_CHANGES.contains(&m) => None,
            _ => return,
        };
        // A plugin's notice reaches only callers who may use the plugin.
        let plugin = from.and_then(|name| self.registry.get(name));
        for l in listeners {
            let wanted = match method {
                "notifications/tools/list_changed" => l.filter.tools,
                "notifications/prompts/list_changed" => l.filter.prompts,
                "notifications/resources/list_changed" => l.filter.resources,
                _ => uri.as_ref().is_some_and(|u| l.filter.uris.contains(u)),
            };
            let allowed = plugin
                .as_ref()
                .is_none_or(|p| access::may_use(&p.config, l.caller.as_ref()));
            if wanted && allowed {
                let _ = l
                    .sink
                    .message(tagged(method, &l.subscription_id, uri.as_deref()));
            }
        }
    }
}

impl Session {
    /// Whether a listener asked for task `public`'s notifications.
    pub(super) fn wants_task(&self, public: &str) -> bool {
        let Some(hub) = self.listeners.if_made() else {
            return false;
        };
        let table = hub.listeners.lock().expect("listeners lock");
        table
            .values()
            .any(|(l, _)| l.filter.task_ids.contains(public))
    }

    /// Sends `notifications/tasks` with `task` (a `DetailedTask`) to the listeners that asked
    /// for task `public`'s.
    pub(super) fn notify_task_listeners(
        &self,
        public: &str,
        task: serde_json::Map<String, serde_json::Value>,
    ) {
        let Some(hub) = self.listeners.if_made() else {
            return;
        };
        let listeners: Vec<Arc<Listener>> = {
            let table = hub.listeners.lock().expect("listeners lock");
            table
                .values()
                .filter(|(l, _)| l.filter.task_ids.contains(public))
                .map(|(l, _)| l.clone())
                .collect()
        };
        for l in listeners {
            let mut params = task.clone();
            let subscription: serde_json::Value =
                serde_json::from_str(l.subscription_id.get()).unwrap_or_default();
            let meta = params
                .entry("_meta")
                .or_insert_with(|| serde_json::Value::Object(Default::default()));
            if let Some(meta) = meta.as_object_mut() {
                meta.insert(SUBSCRIPTION_ID.into(), subscription);
            }
            let params = RawValue::from_string(serde_json::Value::Object(params).to_string())
                .expect("valid JSON");
            let _ = l.sink.message(jsonrpc::request_bytes(
                None,
                "notifications/tasks",
                Some(&params),
            ));
        }
    }
}

/// A notification on a listen stream: `method`, the subscription's id in `_meta`, and the
/// resource's URI for an update.
pub fn tagged(method: &str, subscription_id: &RawValue, uri: Option<&str>) -> Bytes {
    let mut params = format!(
        r#"{{"_meta":{{"{SUBSCRIPTION_ID}":{}}}"#,
        subscription_id.get()
    );
    if let Some(uri) = uri {
        params.push_str(r#","uri":"#);
        params.push_str(&serde_json::to_string(uri).expect("a string serializes"));
    }
    params.push('}');
    let params = RawValue::from_string(params).expect("valid JSON");
    jsonrpc::request_bytes(None, method, Some(&params))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifications_carry_the_subscription_id() {
        let id = RawValue::from_string(r#""listen-1""#.into()).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&tagged(
            "notifications/resources/updated",
            &id,
            Some("file:///a \"b\""),
        ))
        .unwrap();
        assert_eq!(v["method"], "notifications/resources/updated");
        assert_eq!(v["params"]["_meta"][SUBSCRIPTION_ID], "listen-1");
        assert_eq!(v["params"]["uri"], "file:///a \"b\"");
        assert!(v.get("id").is_none());
        let id = RawValue::from_string("7".into()).unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&tagged("notifications/tools/list_changed", &id, None)).unwrap();
        assert_eq!(
            v["params"],
            serde_json::json!({"_meta": {SUBSCRIPTION_ID: 7}})
        );
    }

    #[test]
    fn a_limit_is_never_passed() {
        let c = AtomicUsize::new(0);
        assert!(reserve(&c, 2));
        assert!(reserve(&c, 2));
        assert!(!reserve(&c, 2));
        assert_eq!(c.load(Ordering::Relaxed), 2);
    }
}
