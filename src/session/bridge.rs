//! The bridge of multi round-trip requests (2026-07-28): a legacy plugin's request to a
//! modern client (`sampling/createMessage`, `elicitation/create`, `roots/list`) made while it
//! serves that client's `tools/call`, `resources/read` or `prompts/get`.
//!
//! A bridged call runs on a stream of its own that no connection reads: its bridge does. The
//! relay sends a plugin's request to a caller's client only to such a stream
//! ([`Session::bridge_request`]); the bridge gathers the requests that come together (until
//! the plugin is quiet for a few milliseconds, bounded), refuses those whose capability the
//! client did not declare in this request's `_meta`, answers the client with the rest as one
//! `InputRequiredResult` whose `requestState` it seals, and parks the call
//! ([`super::parked`]). The client's retry wakes it with the answers, each handed to the
//! plugin as the response it waits for, and with the retry's own stream, which the call's
//! notifications and its answer (or the next round's requests) go to from then on. Any number
//! of rounds. A call nobody resumes in time is cancelled toward the plugin, as a client's
//! cancellation is.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::value::RawValue;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::Session;
use super::parked::ParkedCalls;
use crate::backend::{PluginConnection, Related};
use crate::jsonrpc::{self, Id, Message, Outcome, code};
use crate::protocol::mrtr::{self, InputRequest, StateClaims};
use crate::stream::{Attached, Cursor, Frame, Sink, StreamGuard};

/// How long the bridge waits after a plugin's request for more to come before it answers
/// the client with them.
const QUIET: Duration = Duration::from_millis(10);
/// The longest one round is gathered.
const GATHER: Duration = Duration::from_millis(100);
/// Requests one call may have waiting on its client.
const MAX_WAITING: usize = 32;
/// Bytes of those requests.
const MAX_WAITING_BYTES: usize = 1024 * 1024;
/// How often a call looks whether its client left (a closed response stream cancels it).
const CLIENT_CHECK: Duration = Duration::from_millis(500);

/// One HTTP request of a bridged call: the first, or a retry.
pub struct Exchange {
    /// Its JSON-RPC id.
    pub id: Id,
    /// Its response stream.
    pub sink: Sink,
    /// The capabilities its `_meta` declares (`clientCapabilities`), as sent.
    pub capabilities: Option<Box<RawValue>>,
}

/// A retry, for the parked call it resumes.
pub struct Resume {
    pub exchange: Exchange,
    /// `inputResponses`, by key: each an object.
    pub responses: HashMap<String, Box<RawValue>>,
}

/// What each round's `requestState` binds besides the call.
pub struct Binding {
    /// The token's subject, or none for the anonymous caller.
    pub caller: Option<String>,
    /// [`mrtr::request_digest`] of the request.
    pub digest: String,
}

impl Session {
    /// Starts a bridged call answering `first`: the id and the sink to dispatch it to the
    /// plugin with. `None` when the session has ended.
    pub async fn bridge(
        self: &Arc<Self>,
        parked: Arc<ParkedCalls>,
        binding: Binding,
        first: Exchange,
    ) -> Option<(Id, Sink)> {
        if self.closed.is_cancelled() {
            return None;
        }
        let stream = self.new_post_stream(1, true);
        let attached = stream.attach(Cursor::Start, None).await.ok()?;
        let number = stream.number();
        self.bridged.lock().expect("bridged lock").insert(number);
        let call: u64 = rand::random();
        let id = Id::from_raw(
            &RawValue::from_string(format!("\"bridged-{call:016x}\"")).expect("valid JSON"),
        )
        .expect("a string id");
        let pump = Pump {
            session: self.clone(),
            parked,
            binding,
            call,
            id: id.clone(),
            stream: number,
            waiting: Vec::new(),
            waiting_bytes: 0,
            gathering: None,
            answer: None,
            open: true,
            _guard: StreamGuard::new(self.connections.clone()),
        };
        tokio::spawn(pump.run(attached, first));
        Some((id, Sink::new(stream)))
    }

    /// A plugin's request to a caller's client (a modern one, which takes no requests): it
    /// goes to the bridged call it was made for, if the stream it relates to is one; `ping`
    /// is answered here; anything else is refused as a request the client cannot be asked.
    pub(super) fn bridge_request(
        &self,
        conn: &Arc<PluginConnection>,
        id: Id,
        method: &str,
        params: Option<&RawValue>,
        related: Related,
    ) {
        let sink = match related {
            Related::Named(s) | Related::Exact(s) | Related::Ambiguous(s) => Some(s),
            Related::None | Related::Unattributable => None,
        }
        .filter(|s| {
            s.session_id() == &*self.id
                && self
                    .bridged
                    .lock()
                    .expect("bridged lock")
                    .contains(&s.stream_number())
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

/// A plugin's request waiting on the client.
struct Waiting {
    /// Its key in `inputRequests`.
    key: String,
    /// Its id in the session's table of requests to the client.
    n: u64,
    method: String,
    params: Option<Box<RawValue>>,
    bytes: usize,
}

/// What a bridged call does next.
enum Next {
    /// Serves this exchange.
    Active(Exchange),
    /// Waits for its client's retry (woken by it), until the deadline.
    Parked(oneshot::Receiver<Resume>, Instant),
    Done,
}

/// What woke a bridged call.
enum Event {
    Frame(Option<Frame>),
    Due,
    /// Time to look whether the client left.
    Check,
    Woken(Option<Resume>),
    Closed,
}

/// One bridged call's task (see the module's doc).
struct Pump {
    session: Arc<Session>,
    parked: Arc<ParkedCalls>,
    binding: Binding,
    /// Its number in the parked table.
    call: u64,
    /// Its id toward the plugin.
    id: Id,
    /// Its stream's number.
    stream: u64,
    /// The plugin's requests waiting on the client, in the order they came.
    waiting: Vec<Waiting>,
    waiting_bytes: usize,
    /// When the round being gathered began, and when its last request came.
    gathering: Option<(Instant, Instant)>,
    /// The plugin's answer, when it came while the call was parked.
    answer: Option<Outcome>,
    /// The call's stream still delivers (the plugin has not answered).
    open: bool,
    /// Keeps the caller's session from idling out under a parked call.
    _guard: StreamGuard,
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Pump {
    async fn run(mut self, mut attached: Attached, first: Exchange) {
        let mut next = Next::Active(first);
        loop {
            next = match next {
                Next::Active(exchange) => self.active(&mut attached, exchange).await,
                Next::Parked(woken, deadline) => self.wait(&mut attached, woken, deadline).await,
                Next::Done => break,
            };
        }
        self.finish();
    }

    /// Serves one exchange: the plugin's notifications go to it, its answer ends it, and
    /// its requests to the client end it with an `InputRequiredResult`.
    async fn active(&mut self, attached: &mut Attached, exchange: Exchange) -> Next {
        let closed = self.session.closed.clone();
        let mut check_at = Instant::now() + CLIENT_CHECK;
        loop {
            if let Some(answer) = self.answer.take() {
                let bytes = match &answer {
                    Outcome::Result(r) => jsonrpc::result_bytes(exchange.id.raw(), r),
                    Outcome::Error(e) => jsonrpc::error_object_bytes(exchange.id.raw(), e),
                };
                exchange.sink.respond(bytes);
                return Next::Done;
            }
            if !self.open {
                exchange.sink.respond(jsonrpc::error_bytes(
                    Some(&exchange.id),
                    code::INTERNAL_ERROR,
                    "the request ended without an answer",
                ));
                return Next::Done;
            }
            let due = self
                .gathering
                .map(|(first, last)| (last + QUIET).min(first + GATHER));
            let event = tokio::select! {
                frame = attached.next_frame() => Event::Frame(frame),
                () = sleep_until(due) => Event::Due,
                () = closed.cancelled() => Event::Closed,
                () = sleep_until(Some(check_at)) => Event::Check,
            };
            match event {
                Event::Frame(frame) => self.take(frame, Some(&exchange)),
                Event::Check => {
                    check_at = Instant::now() + CLIENT_CHECK;
                    if exchange.sink.is_closed() {
                        tracing::debug!(session = %self.session.id, "the client left a bridged call: cancelled");
                        return Next::Done;
                    }
                }
                Event::Due => {
                    self.gathering = None;
                    if let Some(next) = self.ask(&exchange) {
                        return next;
                    }
                }
                Event::Closed | Event::Woken(_) => {
                    exchange.sink.respond(jsonrpc::error_bytes(
                        Some(&exchange.id),
                        code::INTERNAL_ERROR,
                        "the session serving this request has ended (the gateway is stopping)",
                    ));
                    return Next::Done;
                }
            }
        }
    }

    /// Waits parked for the client's retry, taking what the plugin sends meanwhile.
    async fn wait(
        &mut self,
        attached: &mut Attached,
        mut woken: oneshot::Receiver<Resume>,
        deadline: Instant,
    ) -> Next {
        let closed = self.session.closed.clone();
        let mut deadline = Some(deadline);
        loop {
            let open = self.open;
            let event = tokio::select! {
                frame = attached.next_frame(), if open => Event::Frame(frame),
                resume = &mut woken => Event::Woken(resume.ok()),
                () = sleep_until(deadline) => Event::Due,
                () = closed.cancelled() => Event::Closed,
            };
            match event {
                Event::Frame(frame) => self.take(frame, None),
                Event::Check => {}
                Event::Woken(Some(resume)) => {
                    self.hand(resume.responses);
                    return Next::Active(resume.exchange);
                }
                // Its waker was dropped unused: the retry that took it failed.
                Event::Woken(None) => return Next::Done,
                Event::Due => {
                    if self.parked.unpark(self.call) {
                        tracing::info!(session = %self.session.id, "a call waiting for its client's input timed out after {} s: cancelled", self.parked.timeout.as_secs());
                        return Next::Done;
                    }
                    // A retry took it just now: its answers are on their way.
                    deadline = None;
                }
                Event::Closed => {
                    self.parked.unpark(self.call);
                    return Next::Done;
                }
            }
        }
    }

    /// Takes a frame of the call's stream: the plugin's answer, a request to the client, or
    /// a notification (for `exchange`, if one is being served).
    fn take(&mut self, frame: Option<Frame>, exchange: Option<&Exchange>) {
        let data = match frame {
            Some(Frame::Event { data, .. }) => data,
            Some(Frame::End) | None => {
                self.open = false;
                return;
            }
        };
        match jsonrpc::parse_message(&data) {
            Ok(Message::Response { outcome, .. }) => self.answer = Some(outcome),
            Ok(Message::Request { id, method, params }) => self.asked(id, &method, params),
            Ok(Message::Notification { method, params }) => {
                if method == "notifications/cancelled" {
                    // The plugin withdrew one of its requests (its id already the session's).
                    self.withdrawn(params.as_deref());
                } else if let Some(exchange) = exchange {
                    let _ = exchange.sink.message(data);
                }
            }
            Err(_) => {}
        }
    }

    fn withdrawn(&mut self, params: Option<&RawValue>) {
        #[derive(serde::Deserialize)]
        struct Cancelled {
            #[serde(rename = "requestId")]
            request_id: u64,
        }
        let Some(n) = params
            .and_then(|p| serde_json::from_str::<Cancelled>(p.get()).ok())
            .map(|c| c.request_id)
        else {
            return;
        };
        if let Some(at) = self.waiting.iter().position(|w| w.n == n) {
            let w = self.waiting.remove(at);
            self.waiting_bytes -= w.bytes;
        }
    }

    /// A request of the plugin to the client, numbered in the session's table of them.
    fn asked(&mut self, id: Id, method: &str, params: Option<Box<RawValue>>) {
        let Some(n) = id.as_u64() else { return };
        if method == "ping" {
            self.session.client_response(&id, &Outcome::Result(empty()));
            return;
        }
        if !mrtr::INPUT_METHODS.iter().any(|(m, _)| *m == method) {
            self.refuse(
                n,
                code::METHOD_NOT_FOUND,
                &format!("{method} is not a request a 2026-07-28 client can be asked"),
            );
            return;
        }
        let bytes = method.len() + params.as_ref().map_or(0, |p| p.get().len());
        if self.waiting.len() >= MAX_WAITING || self.waiting_bytes + bytes > MAX_WAITING_BYTES {
            self.refuse(
                n,
                code::INTERNAL_ERROR,
                &format!(
                    "{method}: too many requests wait on the client already ({MAX_WAITING} or {MAX_WAITING_BYTES} bytes at most)"
                ),
            );
            return;
        }
        let kind = method.split('/').next().unwrap_or(method);
        self.waiting.push(Waiting {
            key: format!("{kind}-{n}"),
            n,
            method: method.to_owned(),
            params,
            bytes,
        });
        self.waiting_bytes += bytes;
        let now = Instant::now();
        self.gathering = Some((self.gathering.map_or(now, |(first, _)| first), now));
    }

    /// Ends `exchange` with an `InputRequiredResult` of the requests waiting and parks the
    /// call (`Some`), or refuses what the client cannot answer and goes on serving it
    /// (`None`: nothing is left to ask, or nothing can be parked now).
    fn ask(&mut self, exchange: &Exchange) -> Option<Next> {
        let declared = exchange.capabilities.as_deref();
        let refused: Vec<(u64, String)> = self
            .waiting
            .iter()
            .filter_map(|w| {
                mrtr::missing_capability(&w.method, w.params.as_deref(), declared)
                    .map(|cap| (w.n, cap))
            })
            .collect();
        for (n, cap) in &refused {
            tracing::info!(session = %self.session.id, "a plugin's request refused: the client did not declare the `{cap}` capability");
            self.refuse(
                *n,
                code::METHOD_NOT_FOUND,
                &format!("the client did not declare the `{cap}` capability"),
            );
            self.forget(*n);
        }
        if self.waiting.is_empty() {
            return None;
        }
        let nonce: u64 = rand::random();
        let (wake, woken) = oneshot::channel();
        if let Err(e) = self.parked.park(
            self.call,
            self.binding.caller.as_deref(),
            nonce,
            self.waiting_bytes,
            wake,
        ) {
            tracing::warn!(session = %self.session.id, "a plugin's requests to the client refused: {e}");
            for w in std::mem::take(&mut self.waiting) {
                self.refuse(w.n, code::INTERNAL_ERROR, &format!("{e}; try again later"));
            }
            self.waiting_bytes = 0;
            return None;
        }
        let deadline = Instant::now() + self.parked.timeout;
        let expires = SystemTime::now() + self.parked.timeout;
        let state = self.parked.key.seal(&StateClaims {
            caller: self.binding.caller.clone(),
            expires_ms: expires
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            digest: self.binding.digest.clone(),
            replica: self.parked.replica.to_string(),
            call: self.call,
            nonce,
        });
        let requests: Vec<InputRequest> = self
            .waiting
            .iter()
            .map(|w| InputRequest {
                key: &w.key,
                method: &w.method,
                params: w.params.as_deref(),
            })
            .collect();
        let result = mrtr::input_required_result(&requests, &state);
        let sent = exchange
            .sink
            .respond(jsonrpc::result_bytes(exchange.id.raw(), &result));
        if !sent {
            // Its client is gone: nobody will come back with the answers.
            self.parked.unpark(self.call);
            return Some(Next::Done);
        }
        tracing::debug!(session = %self.session.id, asked = self.waiting.len(), "a call parked for its client's input");
        Some(Next::Parked(woken, deadline))
    }

    /// Hands the client's answers to the plugin; what they leave unanswered is asked again.
    fn hand(&mut self, responses: HashMap<String, Box<RawValue>>) {
        for (key, value) in responses {
            // What matches nothing asked is not the plugin's business.
            let Some(at) = self.waiting.iter().position(|w| w.key == key) else {
                continue;
            };
            let w = self.waiting.remove(at);
            self.waiting_bytes -= w.bytes;
            self.session
                .client_response(&Id::from_u64(w.n), &Outcome::Result(value));
        }
        if !self.waiting.is_empty() {
            let now = Instant::now();
            self.gathering = Some((now, now));
        }
    }

    fn forget(&mut self, n: u64) {
        if let Some(at) = self.waiting.iter().position(|w| w.n == n) {
            let w = self.waiting.remove(at);
            self.waiting_bytes -= w.bytes;
        }
    }

    /// Answers one of the plugin's requests to the client with an error.
    fn refuse(&self, n: u64, code: i64, message: &str) {
        let error = serde_json::json!({ "code": code, "message": message });
        let error = RawValue::from_string(error.to_string()).expect("valid JSON");
        self.session
            .client_response(&Id::from_u64(n), &Outcome::Error(error));
    }

    /// The call is over: cancelled toward the plugin if it still works on it (its requests
    /// to the client go with it, unanswered: an answer could overtake the cancellation);
    /// else what it asked that nobody answered is answered with an error.
    fn finish(&mut self) {
        self.session
            .bridged
            .lock()
            .expect("bridged lock")
            .remove(&self.stream);
        let waiting = std::mem::take(&mut self.waiting);
        self.waiting_bytes = 0;
        if self.open {
            let reason = RawValue::from_string(
                "\"the client did not come back with the input asked for\"".into(),
            )
            .expect("valid JSON");
            self.session.cancel(&self.id, Some(&reason));
            let mut requests = self.session.server_requests.lock().expect("requests lock");
            for w in &waiting {
                requests.remove(&w.n);
            }
            return;
        }
        for w in waiting {
            self.refuse(
                w.n,
                code::INTERNAL_ERROR,
                "the request this was asked for has ended",
            );
        }
    }
}
