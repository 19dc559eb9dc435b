//! Requests to plugins of the modern era (2026-07-28), from a session.
//!
//! Each request carries `_meta`: the modern version, and the session's client (its info and
//! the capabilities it declared in `initialize`), with the session's log level when it set
//! one; a modern client's request (through its caller's session) keeps its own `_meta`.
//!
//! A modern plugin never sends the client a request; it answers with an `InputRequiredResult`
//! instead. For a legacy client, each of its `inputRequests` becomes a request on the session's
//! streams (as a legacy plugin's own `elicitation/create`, `sampling/createMessage` or
//! `roots/list` would, on the call's stream when it can carry it), and once the client has
//! answered them all, the call is sent to the plugin again with the answers as
//! `inputResponses` under the plugin's keys and its `requestState` echoed: as many rounds as
//! the plugin asks. An input the client did not declare the capability for is never asked:
//! the call fails with -32021 naming it. A client that answers with an error fails the call.
//! A modern client is handed the `InputRequiredResult` itself and retries on its own.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};

use serde::Deserialize;
use serde_json::value::RawValue;

use super::Session;
use crate::backend::modern::{self, ClientMeta};
use crate::backend::{InputRequired, PluginConnection, Related};
use crate::jsonrpc::{self, Id, Outcome, code};
use crate::protocol::modern::code::MISSING_REQUIRED_CLIENT_CAPABILITY;

/// Most requests one `InputRequiredResult` may ask of the client.
const MAX_INPUT_REQUESTS: usize = 16;

/// One request the client was sent for a modern plugin's input.
pub(super) struct Asked {
    round: Arc<Round>,
    /// The plugin's key for it in `inputRequests`.
    key: String,
    method: &'static str,
}

/// One `InputRequiredResult` being answered.
struct Round {
    conn: Weak<PluginConnection>,
    /// The parked call on `conn`.
    call: u64,
    /// The plugin's `requestState`, echoed on the retry.
    state: Option<Box<RawValue>>,
    /// The answers so far, and how many are still awaited; `None` once the call was resumed
    /// or failed.
    answers: Mutex<Option<Answers>>,
}

struct Answers {
    left: usize,
    responses: Vec<(String, Box<RawValue>)>,
}

#[derive(Deserialize)]
struct InputRequiredResult {
    #[serde(rename = "inputRequests")]
    input_requests: Option<BTreeMap<String, InputRequest>>,
    #[serde(rename = "requestState")]
    request_state: Option<Box<RawValue>>,
}

#[derive(Deserialize)]
struct InputRequest {
    method: String,
    params: Option<Box<RawValue>>,
}

/// The requests an `InputRequiredResult` may carry, and the client capability each needs.
fn input_method(method: &str) -> Option<(&'static str, &'static str)> {
    match method {
        "elicitation/create" => Some(("elicitation/create", "elicitation")),
        "sampling/createMessage" => Some(("sampling/createMessage", "sampling")),
        "roots/list" => Some(("roots/list", "roots")),
        _ => None,
    }
}

impl Session {
    /// The params a request of this session goes to `conn` with: as they are for a legacy
    /// plugin; for a modern one, with `_meta` (see the module's doc). A refusal (code,
    /// message) for what the modern era does not have.
    pub fn toward(
        &self,
        conn: &PluginConnection,
        method: &str,
        params: Option<Box<RawValue>>,
    ) -> Result<Option<Box<RawValue>>, (i64, String)> {
        if !conn.is_modern() {
            return Ok(params);
        }
        if matches!(method, "resources/subscribe" | "resources/unsubscribe") {
            return Err((
                code::METHOD_NOT_FOUND,
                format!(
                    "plugin '{}' speaks MCP {}, which has no {method} (its resource updates come through subscriptions/listen, which the gateway does not open toward plugins yet)",
                    conn.name(),
                    modern::MODERN_VERSION
                ),
            ));
        }
        let meta = ClientMeta::from_init_params(&self.plugin_params);
        let members = meta.members(self.log_level.level());
        Ok(modern::with_meta(params.as_deref(), &members).or(params))
    }

    /// A modern plugin's `InputRequiredResult` for one of this session's calls (see the
    /// module's doc).
    pub(super) fn input_required(&self, conn: &Arc<PluginConnection>, input: InputRequired) {
        if self.for_caller {
            // A modern client: it retries with its input on its own, and the retry goes to
            // the plugin as it comes.
            conn.pass_input(input.call, &input.result);
            return;
        }
        let fail = |message: String| {
            tracing::warn!(plugin = %conn.name(), session = %self.id, "{message}");
            conn.fail_input(input.call, code::INTERNAL_ERROR, &message);
        };
        let Ok(result) = serde_json::from_str::<InputRequiredResult>(input.result.get()) else {
            return fail(format!(
                "plugin '{}' answered with an InputRequiredResult the gateway cannot read",
                conn.name()
            ));
        };
        if result
            .request_state
            .as_ref()
            .is_some_and(|s| !s.get().starts_with('"'))
        {
            return fail(format!(
                "plugin '{}' gave a requestState that is not a string",
                conn.name()
            ));
        }
        let requests = result.input_requests.unwrap_or_default();
        if requests.is_empty() && result.request_state.is_none() {
            return fail(format!(
                "plugin '{}' answered with an InputRequiredResult that holds neither inputRequests nor requestState",
                conn.name()
            ));
        }
        if requests.len() > MAX_INPUT_REQUESTS {
            return fail(format!(
                "plugin '{}' asked the client for {} inputs at once (at most {MAX_INPUT_REQUESTS})",
                conn.name(),
                requests.len()
            ));
        }
        let mut missing = serde_json::Map::new();
        for r in requests.values() {
            match input_method(&r.method) {
                None => {
                    return fail(format!(
                        "plugin '{}' asked the client for {}, which an InputRequiredResult may not carry",
                        conn.name(),
                        r.method.chars().take(64).collect::<String>()
                    ));
                }
                Some((_, cap)) if !self.client_capabilities.has(cap) => {
                    missing.insert(cap.into(), serde_json::json!({}));
                }
                Some(_) => {}
            }
        }
        if !missing.is_empty() {
            let names: Vec<&str> = missing.keys().map(String::as_str).collect();
            let message = format!(
                "plugin '{}' needs the client's {} capability, which the client did not declare",
                conn.name(),
                names.join(", ")
            );
            tracing::info!(plugin = %conn.name(), session = %self.id, "{message}");
            let error = serde_json::json!({
                "code": MISSING_REQUIRED_CLIENT_CAPABILITY,
                "message": message,
                "data": { "requiredCapabilities": missing },
            });
            let error = RawValue::from_string(error.to_string()).expect("valid JSON");
            conn.fail_input_with(input.call, &error);
            return;
        }
        if requests.is_empty() {
            // Only state: the plugin wants the call again at once.
            conn.resume_input(input.call, None, result.request_state.as_deref());
            return;
        }
        self.ask(conn, input, requests, result.request_state);
    }

    /// Sends the client a round's requests, each on the call's stream when it can carry one.
    fn ask(
        &self,
        conn: &Arc<PluginConnection>,
        input: InputRequired,
        requests: BTreeMap<String, InputRequest>,
        state: Option<Box<RawValue>>,
    ) {
        let round = Arc::new(Round {
            conn: Arc::downgrade(conn),
            call: input.call,
            state,
            answers: Mutex::new(Some(Answers {
                left: requests.len(),
                responses: Vec::with_capacity(requests.len()),
            })),
        });
        for (key, request) in requests {
            let (method, _) = input_method(&request.method).expect("checked above");
            let n = self.next_server_request.fetch_add(1, Ordering::Relaxed);
            self.input_requests.lock().expect("input lock").insert(
                n,
                Asked {
                    round: round.clone(),
                    key,
                    method,
                },
            );
            let bytes = jsonrpc::request_bytes(
                Some(Id::from_u64(n).raw()),
                method,
                request.params.as_deref(),
            );
            if self
                .deliver(bytes, Related::Exact(input.sink.clone()), true)
                .is_err()
            {
                self.forget_round(&round);
                tracing::warn!(plugin = %conn.name(), session = %self.id, "{method}: no client stream open to carry it; the call fails");
                conn.fail_input(
                    input.call,
                    code::INTERNAL_ERROR,
                    &format!("{method} cannot reach the client: it has no open stream (a GET stream, or a request answered as SSE)"),
                );
                return;
            }
        }
    }

    /// A round ends: its requests still out are answered for nobody.
    fn forget_round(&self, round: &Arc<Round>) {
        round.answers.lock().expect("answers lock").take();
        self.input_requests
            .lock()
            .expect("input lock")
            .retain(|_, a| !Arc::ptr_eq(&a.round, round));
    }

    /// The client's answer to request `n`, if it was sent for a modern plugin's input: kept,
    /// and once the round is complete the call is resumed with them all. False when `n` is
    /// no such request.
    pub(super) fn input_response(&self, n: u64, outcome: &Outcome) -> bool {
        let Some(asked) = self.input_requests.lock().expect("input lock").remove(&n) else {
            return false;
        };
        let Asked { round, key, method } = asked;
        match outcome {
            Outcome::Result(result) => {
                let complete = {
                    let mut answers = round.answers.lock().expect("answers lock");
                    let Some(a) = answers.as_mut() else {
                        return true;
                    };
                    a.responses.push((key, result.clone()));
                    a.left -= 1;
                    if a.left == 0 { answers.take() } else { None }
                };
                let Some(done) = complete else { return true };
                let Some(conn) = round.conn.upgrade() else {
                    return true;
                };
                let mut object = String::from("{");
                for (i, (key, value)) in done.responses.iter().enumerate() {
                    if i > 0 {
                        object.push(',');
                    }
                    object.push_str(&serde_json::to_string(key).expect("a string"));
                    object.push(':');
                    object.push_str(value.get());
                }
                object.push('}');
                let responses = RawValue::from_string(object).expect("valid JSON");
                if !conn.resume_input(round.call, Some(&responses), round.state.as_deref()) {
                    tracing::debug!(plugin = %conn.name(), session = %self.id, "input for a call that has ended (timed out, cancelled, or its plugin exited); dropped");
                }
            }
            Outcome::Error(error) => {
                if round.answers.lock().expect("answers lock").is_none() {
                    return true;
                }
                self.forget_round(&round);
                #[derive(Deserialize)]
                struct Said {
                    message: Option<String>,
                }
                let said = serde_json::from_str::<Said>(error.get())
                    .ok()
                    .and_then(|s| s.message)
                    .unwrap_or_default();
                let said: String = said.chars().take(200).collect();
                if let Some(conn) = round.conn.upgrade() {
                    conn.fail_input(
                        round.call,
                        code::INTERNAL_ERROR,
                        &format!("the client answered {method} with an error: {said}"),
                    );
                }
            }
        }
        true
    }
}
