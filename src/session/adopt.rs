//! Taking over a session another replica served (cluster mode): its streams go on where the
//! shared store left them, and the requests its last replica still owed answers to end with
//! an error that says what happened, never in silence.
//!
//! The record (id, version, `initialize` params, tag, generation, log level, subscriptions)
//! has already been claimed by the caller; this file only rebuilds the live part: the GET
//! stream's numbering, and a stream for each one that still owed responses, answered now with
//! an error for every request no response was kept for. Plugin instances start on first use,
//! initialized with the record's params and brought up to its log level and subscriptions,
//! as after a crash.

use std::collections::HashSet;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::Session;
use crate::jsonrpc::{self, Id};
use crate::stream::{Adopted, Buffering, Sink, Stream, StreamKey};

/// What a request that was in flight on a replica that stopped gets.
pub const IN_FLIGHT_LOST: &str = "the gateway replica running this request stopped before it \
    answered; the request may or may not have been carried out, and the session goes on";

/// Most requests one stream is taken to owe: a POST's batch is bounded far below this.
const MAX_OWED: usize = 10_000;

/// A JSON-RPC response's id, the rest of the message skipped unread.
#[derive(Deserialize)]
struct Response<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    method: Option<&'a RawValue>,
}

/// The ids of the responses among a stream's events (an event's data is one message).
fn answered(events: &[(u64, Bytes)]) -> HashSet<String> {
    events
        .iter()
        .filter_map(|(_, data)| serde_json::from_slice::<Response>(data).ok())
        .filter(|r| r.method.is_none())
        .filter_map(|r| r.id.map(|id| id.get().to_owned()))
        .collect()
}

impl Session {
    /// Goes on from where the shared store left the session's streams: the GET stream's
    /// next event id, and an error for each request a stream still owed (see the module's
    /// doc). Called once, before the session can be found.
    pub(super) async fn resume(&self, adopted: Adopted) {
        if let Some(get) = adopted.streams.iter().find(|p| p.stream == 0) {
            self.get.resume_at(get.next_seq);
        }
        for (number, ids) in adopted.in_flight {
            let owed = match serde_json::from_slice::<Vec<Box<RawValue>>>(&ids) {
                Ok(owed) if owed.len() <= MAX_OWED => owed,
                _ => {
                    tracing::warn!(session = %self.id, stream = number, "the ids a stream owed do not parse; skipped");
                    continue;
                }
            };
            // A stream that owed everything it was asked has no events: it starts at 1.
            let next_seq = adopted
                .streams
                .iter()
                .find(|p| p.stream == number)
                .map_or(1, |p| p.next_seq);
            // What was answered before the replica stopped needs no error.
            let kept = self
                .events
                .replay(number, 0, next_seq, true)
                .await
                .unwrap_or_default();
            let done = answered(&kept);
            let lost: Vec<Id> = owed
                .iter()
                .filter(|id| !done.contains(id.get()))
                .filter_map(|id| Id::from_raw(id).ok())
                .collect();
            if lost.is_empty() {
                self.events.answered(number);
                continue;
            }
            tracing::warn!(session = %self.id, stream = number, requests = lost.len(), "requests in flight on a replica that stopped end with an error");
            let stream = Stream::new(
                StreamKey {
                    session: self.id.clone(),
                    stream: number,
                },
                self.tag,
                true,
                Buffering::Replay,
                self.events.clone(),
                Some(lost.len()),
                Some(self.hooks.clone()),
            );
            stream.resume_at(next_seq);
            self.streams
                .lock()
                .expect("streams lock")
                .live
                .get_or_insert(number, stream.clone());
            let sink = Sink::new(stream);
            for id in &lost {
                sink.respond(jsonrpc::error_bytes(
                    Some(id),
                    jsonrpc::code::INTERNAL_ERROR,
                    IN_FLIGHT_LOST,
                ));
            }
        }
    }

    /// The stream answers a POST whose requests have these ids: a shared store keeps them
    /// until the stream owes no more (see [`crate::stream::SessionEvents::owes`]).
    pub fn owes(&self, stream: &Stream, ids: &[&RawValue]) {
        // Only a buffered stream tells the store it is answered; only a shared store cares.
        if ids.is_empty() || !self.stream_settings.resumable || self.records.is_none() {
            return;
        }
        let mut json = Vec::with_capacity(2 + ids.iter().map(|i| i.get().len() + 1).sum::<usize>());
        json.push(b'[');
        for (i, id) in ids.iter().enumerate() {
            if i > 0 {
                json.push(b',');
            }
            json.extend_from_slice(id.get().as_bytes());
        }
        json.push(b']');
        self.events.owes(stream.number(), Bytes::from(json));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_responses_count_as_answers() {
        let events: Vec<(u64, Bytes)> = [
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":"s1","method":"sampling/createMessage","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":"a","error":{"code":1,"message":"x"}}"#,
            "not json",
        ]
        .iter()
        .enumerate()
        .map(|(i, e)| (i as u64 + 1, Bytes::from(*e)))
        .collect();
        let got = answered(&events);
        assert_eq!(got, HashSet::from(["7".to_string(), "\"a\"".to_string()]));
    }
}
