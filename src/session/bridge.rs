//! The bridge of multi round-trip requests (2026-07-28): a legacy plugin's request to a
//! modern client (`sampling/createMessage`, `elicitation/create`, `roots/list`) made while it
//! serves that client's `tools/call`, `resources/read` or `prompts/get`.
//!
//! Such a call starts as any call does, dispatched under the client's id to the client's
//! stream, with a [`Seed`] beside it: most plugins never ask, and those calls cost nothing
//! more. When its plugin asks (the relay hands the request to [`Session::bridge_request`]),
//! the call becomes a bridged call: a stream of its own that no connection reads, its task
//! does (`bridged_call.rs`); the plugin's request in flight is moved to that stream under a
//! new id, and the client's request becomes the call's first exchange. The relay sends a
//! plugin's request to a caller's client only to such a stream; the task gathers the
//! requests that come together (until the plugin is quiet for a few milliseconds, bounded)
//! and answers the client with them as one `InputRequiredResult`, each under the plugin's
//! own request id as its key, with a sealed `requestState`; the call is parked
//! ([`super::parked`]). The client's retry wakes it with the answers, each handed to the
//! plugin as the response it waits for, and with the retry's own stream, which the call's
//! notifications and its answer (or the next round's requests) go to from then on. Any
//! number of rounds.
//!
//! What the client may be asked is what this request's `_meta` declares: a request it cannot
//! take is refused to the plugin as a legacy session refuses it, and when nothing of a round
//! can be asked the client gets -32021 (`requiredCapabilities`) and the call is cancelled. An
//! answer the client gives before it is asked (a first request's `inputResponses`) goes to
//! the plugin's request whose key it bears. A call nobody resumes in time, or whose client
//! leaves, is cancelled toward the plugin, as a client's cancellation is.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures_util::FutureExt;
use serde_json::value::RawValue;

use super::Session;
use super::parked::ParkedCalls;
use crate::backend::{PluginConnection, Related};
use crate::jsonrpc::{self, Id, code};
use crate::stream::{Cursor, Sink};

/// One HTTP request of a bridged call: the first, or a retry.
pub struct Exchange {
    /// Its JSON-RPC id.
    pub id: Id,
    /// Its response stream.
    pub sink: Sink,
    /// The capabilities its `_meta` declares (`clientCapabilities`), as sent.
    pub capabilities: Option<Box<RawValue>>,
    /// Answers the client gave to no request asked yet (a first request's
    /// `inputResponses`), by key: one goes, unasked, to the plugin's request of that key.
    pub offered: HashMap<String, Box<RawValue>>,
}

/// A retry, for the parked call it resumes.
pub struct Resume {
    pub exchange: Exchange,
    /// `inputResponses`, by key: each an object.
    pub responses: HashMap<String, Box<RawValue>>,
}

/// What each round's `requestState` binds besides the call.
pub struct Binding {
    /// The token's subject, or none for a client without a token.
    pub caller: Option<String>,
    /// The client key the call is counted against among the parked (by address for a client
    /// without a token).
    pub counted_as: Arc<str>,
    /// The request's method and params, for its digest.
    method: String,
    params: Option<Box<RawValue>>,
    /// [`crate::protocol::mrtr::request_digest`] of the request: made when a round is first
    /// asked of the client (most calls never ask), then kept.
    digest: std::sync::OnceLock<String>,
}

impl Binding {
    pub fn new(
        caller: Option<String>,
        counted_as: Arc<str>,
        method: String,
        params: Option<Box<RawValue>>,
    ) -> Binding {
        Binding {
            caller,
            counted_as,
            method,
            params,
            digest: std::sync::OnceLock::new(),
        }
    }

    pub fn digest(&self) -> &str {
        self.digest.get_or_init(|| {
            crate::protocol::mrtr::request_digest(&self.method, self.params.as_deref())
        })
    }
}

/// A call that becomes a bridged call should its plugin ask the client for input: what the
/// bridge needs then. Most calls never ask; they run as any call does, straight to their
/// client's stream, and their seed goes with that stream.
pub struct Seed {
    pub parked: Arc<ParkedCalls>,
    pub binding: Binding,
    /// See [`Exchange::capabilities`].
    pub capabilities: Option<Box<RawValue>>,
    /// See [`Exchange::offered`].
    pub offered: HashMap<String, Box<RawValue>>,
}

impl Session {
    /// Marks the call whose answer goes to `stream` (a first request of a modern client's
    /// `tools/call`, `resources/read` or `prompts/get`, dispatched there under the client's
    /// id) as one to bridge should its plugin ask the client for input.
    pub fn seed(&self, stream: u64, seed: Seed) {
        self.seeds.lock().expect("seeds lock").insert(stream, seed);
    }

    pub(super) fn forget_seed(&self, stream: u64) {
        self.seeds.lock().expect("seeds lock").remove(&stream);
    }

    /// Makes the seeded call answering to `client` a bridged call, its plugin having asked
    /// the client for input on `conn`: a stream of its own that the call's task reads, the
    /// plugin's request in flight moved to it under a new id, the client's request the
    /// call's first exchange. The new stream's sink; `None` when `client` is no seeded
    /// call's, or the call is no longer in flight on `conn`.
    fn promote(&self, conn: &Arc<PluginConnection>, client: &Sink) -> Option<Sink> {
        let number = client.stream_number();
        let seed = self.seeds.lock().expect("seeds lock").remove(&number)?;
        let me = self.me.upgrade()?;
        if self.closed.is_cancelled() {
            return None;
        }
        let stream = self.new_post_stream(1, true);
        // An unbuffered stream (a caller's session keeps none) attaches at once.
        let attached = stream.attach(Cursor::Start, None).now_or_never()?.ok()?;
        let call: u64 = rand::random();
        let id = Id::from_raw(
            &RawValue::from_string(format!("\"bridged-{call:016x}\"")).expect("valid JSON"),
        )
        .expect("a string id");
        let sink = Sink::new(stream);
        let client_id = conn.rehome(client, id.clone(), &sink)?;
        self.bridged
            .lock()
            .expect("bridged lock")
            .insert(sink.stream_number());
        // The plugin's logs relate to the call's own stream from now on.
        self.copy_request_logs(number, sink.stream_number());
        let first = Exchange {
            id: client_id,
            sink: client.clone(),
            capabilities: seed.capabilities,
            offered: seed.offered,
        };
        super::bridged_call::start(
            &me,
            seed.parked,
            seed.binding,
            Arc::downgrade(conn),
            call,
            id,
            sink.stream_number(),
            attached,
            first,
        );
        Some(sink)
    }

    /// A plugin's request to a caller's client (a modern one, which takes no requests): one
    /// a task makes (related-task `_meta`) waits among that task's `inputRequests`
    /// ([`Session::task_input_request`]); any other goes to the bridged call it was made for,
    /// if the stream it relates to is one; `ping` is answered here; anything else is refused
    /// as a request the client cannot be asked.
    pub(super) fn bridge_request(
        &self,
        conn: &Arc<PluginConnection>,
        id: Id,
        method: &str,
        params: Option<&RawValue>,
        related: Related,
    ) {
        if method != "ping"
            && let Some(task) = crate::backend::connection::task_named(method, params)
        {
            return self.task_input_request(conn, id, method, params, &task);
        }
        let sink = match related {
            Related::Named(s) | Related::Exact(s) | Related::Ambiguous(s) => Some(s),
            Related::None | Related::Unattributable => None,
        }
        .filter(|s| s.session_id() == &*self.id)
        .and_then(|s| {
            let bridged = self
                .bridged
                .lock()
                .expect("bridged lock")
                .contains(&s.stream_number());
            if bridged {
                Some(s)
            } else {
                self.promote(conn, &s)
            }
        });
        let Some(sink) = sink else {
            if method == "ping" {
                conn.send_raw(jsonrpc::result_bytes(id.raw(), &empty()));
                return;
            }
            tracing::info!(plugin = %conn.name(), session = %self.id, "{method} refused: a 2026-07-28 client is asked for input only while its tools/call, resources/read or prompts/get runs");
            conn.send_raw(jsonrpc::error_bytes(
                Some(&id),
                code::METHOD_NOT_FOUND,
                &format!("{method} cannot reach this client: a 2026-07-28 client is asked for input only while its tools/call, resources/read or prompts/get runs"),
            ));
            return;
        };
        let n = self.next_server_request.fetch_add(1, Ordering::Relaxed);
        self.server_requests
            .lock()
            .expect("requests lock")
            .insert(n, (Arc::downgrade(conn), id));
        let bytes = jsonrpc::request_bytes(Some(Id::from_u64(n).raw()), method, params);
        if sink.message(bytes).is_err() {
            let (_, plugin_id) = self
                .server_requests
                .lock()
                .expect("requests lock")
                .remove(&n)
                .expect("just inserted");
            conn.send_raw(jsonrpc::error_bytes(
                Some(&plugin_id),
                code::INTERNAL_ERROR,
                &format!("{method}: the request it was made for has ended"),
            ));
        }
    }
}

fn empty() -> Box<RawValue> {
    RawValue::from_string("{}".into()).expect("valid JSON")
}

impl Session {
    /// A modern client's call (seeded, answering to `client` under `id`) whose plugin cannot
    /// start until the caller connects one of their own credentials (`needed`): the round
    /// the gateway asks itself, an `InputRequiredResult` holding a URL mode elicitation of
    /// the connect page's link, whose `requestState` runs the request afresh when retried.
    /// -32021 when the client declared no URL elicitation; an error when its retry declined.
    /// `None` when `client` is no seeded call's (the caller gets the plain error).
    pub fn credential_round(
        &self,
        client: &Sink,
        id: &Id,
        needed: &crate::backend::BackendError,
    ) -> Option<bytes::Bytes> {
        let crate::backend::BackendError::CredentialNeeded(n) = needed else {
            return None;
        };
        let (credential, elicitation_id, url) = (&n.credential, &n.elicitation_id, &n.url);
        let seed = self
            .seeds
            .lock()
            .expect("seeds lock")
            .remove(&client.stream_number())?;
        let key = format!("connect-{credential}");
        if let Some(answer) = seed.offered.get(&key) {
            #[derive(serde::Deserialize)]
            struct Answer {
                action: Option<String>,
            }
            let action = serde_json::from_str::<Answer>(answer.get())
                .ok()
                .and_then(|a| a.action);
            if action.as_deref() != Some("accept") {
                return Some(jsonrpc::error_bytes(
                    Some(id),
                    code::INVALID_REQUEST,
                    &format!(
                        "the call needs your own credential `{credential}`, and you did not connect it; it was not made"
                    ),
                ));
            }
        }
        let message = needed.client_message();
        let params = serde_json::json!({
            "mode": "url",
            "elicitationId": elicitation_id,
            "url": url,
            "message": message,
        });
        let params = RawValue::from_string(params.to_string()).expect("serialized JSON");
        if crate::protocol::mrtr::missing_capability(
            "elicitation/create",
            Some(&params),
            seed.capabilities.as_deref(),
        )
        .is_some()
        {
            return Some(super::bridged_call::missing_capabilities(
                id,
                &["elicitation.url"],
            ));
        }
        let expires = std::time::SystemTime::now() + seed.parked.timeout;
        let state = seed.parked.key.seal(&crate::protocol::mrtr::StateClaims {
            caller: seed.binding.caller.clone(),
            expires_ms: expires
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            digest: seed.binding.digest().to_owned(),
            replica: seed.parked.replica.to_string(),
            call: 0,
            nonce: 0,
            fresh: true,
        });
        let request = crate::protocol::mrtr::InputRequest {
            key: &key,
            method: "elicitation/create",
            params: Some(&params),
        };
        let result = crate::protocol::mrtr::input_required_result(&[request], &state);
        Some(jsonrpc::result_bytes(id.raw(), &result))
    }
}
