//! One bridged call's task (see `bridge.rs`): it reads the call's stream, serves the
//! exchange of the moment (the first request, then each retry), gathers the plugin's
//! requests to the client into `InputRequiredResult`s and parks the call between rounds.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::value::RawValue;
use tokio::sync::oneshot;
use tokio::time::Instant;

use futures_util::FutureExt;

use super::Session;
use super::bridge::{Binding, Exchange, Resume};
use super::parked::ParkedCalls;
use crate::backend::PluginConnection;
use crate::jsonrpc::{self, Id, Message, Outcome, code};
use crate::protocol::modern::code::MISSING_REQUIRED_CLIENT_CAPABILITY;
use crate::protocol::mrtr::{self, InputRequest, StateClaims};
use crate::stream::{Attached, Frame, StreamGuard};

/// A round of the plugin's requests to the client is answered as soon as the plugin has
/// settled (it has written all it will and waits: see `backend::settle`). Requests a plugin
/// sends together usually arrive within microseconds of each other, but each is a write of
/// its own, and on a loaded machine the plugin can be descheduled between them (2 ms split
/// such a pair in the tests under load): a plugin still running is looked at again every
/// [`SETTLE_POLL`], until this long after its last request came. A plugin whose state
/// cannot be told is waited for this long.
const QUIET: Duration = Duration::from_millis(10);
/// How often a plugin still running is looked at again while a round is gathered.
const SETTLE_POLL: Duration = Duration::from_millis(1);
/// The longest one round is gathered.
const GATHER: Duration = Duration::from_millis(100);
/// Requests one call may have waiting on its client.
const MAX_WAITING: usize = 32;
/// Bytes of those requests.
const MAX_WAITING_BYTES: usize = 1024 * 1024;
/// How often a call looks whether its client left (a closed response stream cancels it).
const CLIENT_CHECK: Duration = Duration::from_millis(500);

/// Starts the task of bridged call `call`, dispatched to its plugin under `id` with its
/// answers on stream `stream` (read through `attached`), serving `first`.
#[allow(clippy::too_many_arguments)]
pub(super) fn start(
    session: &Arc<Session>,
    parked: Arc<ParkedCalls>,
    binding: Binding,
    plugin: Weak<PluginConnection>,
    call: u64,
    id: Id,
    stream: u64,
    attached: Attached,
    first: Exchange,
) {
    let pump = Pump {
        session: session.clone(),
        parked,
        binding,
        plugin,
        call,
        id,
        stream,
        waiting: Vec::new(),
        waiting_bytes: 0,
        offered: HashMap::new(),
        gathering: None,
        answer: None,
        open: true,
        _guard: StreamGuard::new(session.connections.clone()),
    };
    tokio::spawn(pump.run(attached, first));
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
    /// The plugin connection it runs on, asked whether the plugin has settled.
    plugin: Weak<PluginConnection>,
    /// Its number in the parked table.
    call: u64,
    /// Its id toward the plugin.
    id: Id,
    /// Its stream's number.
    stream: u64,
    /// The plugin's requests waiting on the client, in the order they came.
    waiting: Vec<Waiting>,
    waiting_bytes: usize,
    /// Answers the client gave before it was asked (see [`Exchange::offered`]).
    offered: HashMap<String, Box<RawValue>>,
    /// When the round being gathered began, and when its last request came.
    gathering: Option<(Instant, Instant)>,
    /// The plugin's answer, when it came while the call was parked.
    answer: Option<Outcome>,
    /// The plugin still works on the call (it has not answered, and its stream has not
    /// ended).
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
                Next::Parked(woken, deadline) => {
                    attached.set_waiting(true);
                    let next = self.wait(&mut attached, woken, deadline).await;
                    attached.set_waiting(false);
                    next
                }
                Next::Done => break,
            };
        }
        self.finish();
    }

    /// Serves one exchange: the plugin's notifications go to it, its answer ends it, and
    /// its requests to the client end it with an `InputRequiredResult`.
    async fn active(&mut self, attached: &mut Attached, mut exchange: Exchange) -> Next {
        self.offered = std::mem::take(&mut exchange.offered);
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
            let mut due = None;
            if let Some((first, last)) = self.gathering {
                let cap = (last + QUIET).min(first + GATHER);
                let settled = self.plugin.upgrade().and_then(|p| p.settled());
                if settled == Some(true) {
                    // What the plugin wrote before it settled is in the call's stream: it
                    // belongs to this round.
                    if let Some(frame) = attached.next_frame().now_or_never() {
                        self.take(frame, Some(&exchange));
                        continue;
                    }
                }
                if settled == Some(true) || Instant::now() >= cap {
                    self.gathering = None;
                    if let Some(next) = self.ask(&exchange) {
                        return next;
                    }
                    continue;
                }
                due = Some(match settled {
                    Some(_) => cap.min(Instant::now() + SETTLE_POLL),
                    None => cap,
                });
            }
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
                // The round's state is looked at again at the loop's top.
                Event::Due => {}
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
                    let Resume {
                        mut exchange,
                        responses,
                    } = resume;
                    self.hand(&mut exchange, responses);
                    return Next::Active(exchange);
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
            Ok(Message::Response { outcome, .. }) => {
                // Answered: nothing is left to cancel at the plugin when the call ends.
                self.answer = Some(outcome);
                self.open = false;
            }
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

    /// A request of the plugin to the client, numbered in the session's table of them. Its
    /// key is the plugin's own id for it (as text), unless a request waiting has that key.
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
        let plugin_id = self
            .session
            .server_requests
            .lock()
            .expect("requests lock")
            .get(&n)
            .map(|(_, id)| id.clone());
        let Some(plugin_id) = plugin_id else { return };
        let mut key = serde_json::from_str::<String>(plugin_id.raw().get())
            .unwrap_or_else(|_| plugin_id.raw().get().to_owned());
        if self.waiting.iter().any(|w| w.key == key) {
            key = format!("{key}-{n}");
        }
        if let Some(answer) = self.offered.remove(&key) {
            // Answered before it was asked.
            self.session.client_response(&id, &Outcome::Result(answer));
            return;
        }
        let bytes = key.len() + method.len() + params.as_ref().map_or(0, |p| p.get().len());
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
        self.waiting.push(Waiting {
            key,
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
    /// call (`Some`), or with -32021 when the client declared none of what they need (`Some`:
    /// done); or refuses what the client cannot answer and goes on serving it (`None`: nothing
    /// is left to ask, or nothing can be parked now).
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
        if !refused.is_empty() && refused.len() == self.waiting.len() {
            // Nothing of this round can be asked: the request needs what the client lacks.
            let caps: Vec<&str> = refused.iter().map(|(_, cap)| cap.as_str()).collect();
            tracing::info!(session = %self.session.id, "a bridged call needs client capabilities the request did not declare: {}", caps.join(", "));
            exchange
                .sink
                .respond(missing_capabilities(&exchange.id, &caps));
            return Some(Next::Done);
        }
        for (n, cap) in &refused {
            tracing::info!(session = %self.session.id, "a plugin's request refused: the client did not declare the `{cap}` capability");
            let code = if cap.contains('.') {
                code::INVALID_PARAMS
            } else {
                code::METHOD_NOT_FOUND
            };
            self.refuse(
                *n,
                code,
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
            &self.binding.counted_as,
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
            digest: self.binding.digest().to_owned(),
            replica: self.parked.replica.to_string(),
            call: self.call,
            nonce,
            fresh: false,
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
    /// An answer to nothing asked is kept for the retry's exchange, should the plugin ask it.
    fn hand(&mut self, exchange: &mut Exchange, responses: HashMap<String, Box<RawValue>>) {
        for (key, value) in responses {
            let Some(at) = self.waiting.iter().position(|w| w.key == key) else {
                exchange.offered.insert(key, value);
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
    /// else what the plugin asked that nobody answered goes to the call it works on now.
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
        // The plugin answered this call: what it still asks is another call's (stdio names
        // no call, and a request goes with the newest call in flight when it comes). Each
        // goes again to the call the plugin works on now, if there is one.
        for w in waiting {
            let asked = self
                .session
                .server_requests
                .lock()
                .expect("requests lock")
                .remove(&w.n)
                .and_then(|(conn, id)| Some((conn.upgrade()?, id)));
            if let Some((conn, id)) = asked {
                let related = conn.related();
                self.session
                    .bridge_request(&conn, id, &w.method, w.params.as_deref(), related);
            }
        }
    }
}

/// The -32021 answer naming the capabilities `caps` (`sampling`, `elicitation.url`, ...) in
/// `requiredCapabilities`, as a client declares them.
pub(super) fn missing_capabilities(id: &Id, caps: &[&str]) -> bytes::Bytes {
    let mut required = serde_json::Map::new();
    for cap in caps {
        let (top, sub) = cap
            .split_once('.')
            .map_or((*cap, None), |(t, s)| (t, Some(s)));
        let entry = required.entry(top).or_insert_with(|| serde_json::json!({}));
        if let Some(sub) = sub {
            entry[sub] = serde_json::json!({});
        }
    }
    let error = serde_json::json!({
        "code": MISSING_REQUIRED_CLIENT_CAPABILITY,
        "message": format!("Missing required client capability: {}", caps.join(", ")),
        "data": {"requiredCapabilities": required},
    });
    jsonrpc::error_object_bytes(
        id.raw(),
        &RawValue::from_string(error.to_string()).expect("valid JSON"),
    )
}
