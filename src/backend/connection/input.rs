//! A modern plugin's `InputRequiredResult` (multi round-trip requests): the client's request it
//! answers is parked in the pending map under the id the plugin answered, so its deadline, a
//! cancellation and the plugin's exit still end it, and the listener is handed the result
//! ([`InputRequired`]). The listener gathers the client's input and resumes the call (the same
//! request sent again under a new id, with `inputResponses` and the `requestState` echoed),
//! passes the result through to a client that speaks the modern era itself, or fails the call.
//! Any number of rounds, up to [`MAX_ROUNDS`].
//!
//! Nothing here knows who the client is or how its input is asked for: that is the listener's.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::value::RawValue;

use super::{Pending, PluginConnection};
use crate::audit::{Ends, Outcome};
use crate::backend::modern::retry_params;
use crate::jsonrpc::{self, Id, code};
use crate::stream::Sink;

/// Most rounds of input one request may go through: a plugin that keeps asking ends with an
/// error rather than looping until the request's deadline.
pub const MAX_ROUNDS: u32 = 64;

/// What it takes to send a request to a modern plugin again with the client's input.
pub(in crate::backend) struct Retry {
    method: Box<str>,
    /// The params as first sent (with `_meta`, the client's progress token), without input.
    params: Option<Box<RawValue>>,
    /// `InputRequiredResult`s so far.
    rounds: u32,
    /// Answered with an `InputRequiredResult`, waiting for the client's input: the plugin
    /// works on nothing under this id.
    parked: bool,
}

impl Retry {
    pub(in crate::backend) fn new(method: &str, params: Option<&RawValue>) -> Box<Retry> {
        Box::new(Retry {
            method: method.into(),
            params: params.map(RawValue::to_owned),
            rounds: 0,
            parked: false,
        })
    }

    pub(in crate::backend) fn parked(&self) -> bool {
        self.parked
    }
}

/// A client's request that a modern plugin answered with an `InputRequiredResult`, parked on
/// the connection until the listener resumes, passes or fails it (by `call`).
#[derive(Debug)]
pub struct InputRequired {
    /// The parked request's id on the connection.
    pub call: u64,
    /// The stream of the client's request: where the input is asked for.
    pub sink: Sink,
    /// The plugin's `InputRequiredResult`, as it sent it.
    pub result: Box<RawValue>,
}

impl PluginConnection {
    /// The plugin answered a client's request (`pending`, under `id`) with an
    /// `InputRequiredResult`: parked, and handed to the listener.
    pub(super) fn input_required(
        self: &Arc<Self>,
        id: u64,
        mut pending: Pending,
        result: Box<RawValue>,
    ) {
        let Pending::Client {
            retry: Some(retry),
            sink,
            ..
        } = &mut pending
        else {
            unreachable!("only requests that may be retried get here")
        };
        retry.rounds += 1;
        let rounds = retry.rounds;
        retry.parked = true;
        let sink = sink.clone();
        self.pending
            .lock()
            .expect("pending lock")
            .insert(id, pending);
        if rounds > MAX_ROUNDS {
            tracing::warn!(plugin = %self.name, session = %self.label, "asked for input {rounds} times in one request; the request fails");
            self.fail_input(
                id,
                code::INTERNAL_ERROR,
                &format!(
                    "plugin '{}' asked for the client's input more than {MAX_ROUNDS} times in one request",
                    self.name
                ),
            );
            return;
        }
        let input = InputRequired {
            call: id,
            sink,
            result,
        };
        match self.events() {
            Some(events) => events.plugin_input_required(self, input),
            None => {
                self.fail_input(
                    id,
                    code::INTERNAL_ERROR,
                    &format!("plugin '{}' asked for input nobody can give", self.name),
                );
            }
        }
    }

    /// The parked request `call`, out of the pending map; `None` when it is not parked there
    /// (it timed out, was cancelled, or the plugin exited meanwhile).
    fn take_parked(&self, call: u64) -> Option<Pending> {
        let mut pending = self.pending.lock().expect("pending lock");
        match pending.get(&call) {
            Some(Pending::Client { retry: Some(r), .. }) if r.parked => pending.remove(&call),
            _ => None,
        }
    }

    /// Sends the parked request `call` again with the client's input: `responses` (the
    /// `inputResponses` object) and `state` (the plugin's `requestState`, echoed). False when
    /// the request is no longer parked.
    pub fn resume_input(
        &self,
        call: u64,
        responses: Option<&RawValue>,
        state: Option<&RawValue>,
    ) -> bool {
        let Some(mut pending) = self.take_parked(call) else {
            return false;
        };
        let Pending::Client {
            retry: Some(retry),
            client_id,
            sink,
            audit,
            ..
        } = &mut pending
        else {
            unreachable!("only parked requests are taken")
        };
        retry.parked = false;
        let Some(params) = retry_params(retry.params.as_deref(), responses, state) else {
            audit.ended(Outcome::Error, Some(code::INTERNAL_ERROR));
            sink.respond(jsonrpc::error_bytes(
                Some(client_id),
                code::INTERNAL_ERROR,
                &format!(
                    "the retry of a request to plugin '{}' could not be made",
                    self.name
                ),
            ));
            return true;
        };
        let method = retry.method.clone();
        self.send_client(&method, Some(&params), pending);
        true
    }

    /// Answers the parked request `call` with the plugin's `InputRequiredResult` itself (a
    /// client of the modern era retries it on its own). False when it is no longer parked.
    pub fn pass_input(&self, call: u64, result: &RawValue) -> bool {
        self.finish_input(call, Ending::Result(result), |id| {
            jsonrpc::result_bytes(id.raw(), result)
        })
    }

    /// Fails the parked request `call` with an error the gateway words. False when it is no
    /// longer parked.
    pub fn fail_input(&self, call: u64, code: i64, message: &str) -> bool {
        self.finish_input(call, Ending::Error(code), |id| {
            jsonrpc::error_bytes(Some(id), code, message)
        })
    }

    /// Fails the parked request `call` with an error object made by the listener (with
    /// `data`). False when it is no longer parked.
    pub fn fail_input_with(&self, call: u64, error: &RawValue) -> bool {
        self.finish_input(call, Ending::ErrorObject(error), |id| {
            jsonrpc::error_object_bytes(id.raw(), error)
        })
    }

    fn finish_input(
        &self,
        call: u64,
        ending: Ending<'_>,
        answer: impl FnOnce(&Id) -> Bytes,
    ) -> bool {
        let Some(Pending::Client {
            client_id,
            sink,
            timer,
            audit,
            ..
        }) = self.take_parked(call)
        else {
            return false;
        };
        let failed = match ending {
            Ending::Result(r) => timer.is_call() && jsonrpc::is_tool_error(r.get()),
            Ending::Error(_) | Ending::ErrorObject(_) => true,
        };
        timer.observe(failed);
        if let Some(mut a) = audit {
            match ending {
                Ending::Result(_) if failed => a.set(Outcome::ToolError, None),
                Ending::Result(_) => a.set(Outcome::Ok, None),
                Ending::Error(code) => a.set(Outcome::Error, Some(code)),
                Ending::ErrorObject(e) => a.error(e),
            }
        }
        sink.respond(answer(&client_id));
        true
    }
}

/// How a parked request ends (see [`PluginConnection::finish_input`]).
#[derive(Clone, Copy)]
enum Ending<'a> {
    /// With the plugin's result.
    Result(&'a RawValue),
    /// With an error the gateway words: its code.
    Error(i64),
    /// With an error object made by the listener.
    ErrorObject(&'a RawValue),
}
