//! Log messages for a modern caller's requests (2026-07-28): a request gets the
//! `notifications/message` of its plugin only when it opted in with `_meta`'s
//! `io.modelcontextprotocol/logLevel`, only at or above that level, and only on its own
//! response stream, never on another request's nor on a listen stream.
//!
//! The caller's requests share its plugin instances, so the plugins cannot filter per request:
//! they are asked (`logging/setLevel`) for the least severe level any of the caller's
//! requests has asked for, and the gateway filters each message against the level of the
//! request it belongs to. A message whose request is not certain (several of the caller's
//! requests stream at once) is dropped rather than shown to a request that may not want it.

use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use serde_json::value::RawValue;

use super::Session;
use super::log_level::{message_severity, severity};
use crate::backend::Related;
use crate::stream::Stream;

/// Longest wait for the caller's instances to take a lower log level.
const SET_LEVEL_WAIT: Duration = Duration::from_secs(2);

/// The log levels of a caller's requests in flight.
#[derive(Default)]
pub(super) struct RequestLogs {
    /// Each opted-in request's least severe level let through (1-based), by its stream's
    /// number; removed when the stream is released.
    floors: Mutex<foldhash::HashMap<u64, u8>>,
    /// The least severe level the caller's plugins were asked for (0: none yet).
    asked: Mutex<u8>,
}

impl Session {
    /// A modern request whose answer goes on `stream` wants its log messages at `level` (a
    /// level the request's `_meta` check accepted) and above. The caller's instances are
    /// asked for logs that verbose first, when none of its requests asked for as much before.
    pub async fn want_logs(&self, stream: &Stream, level: &str) {
        self.want_logs_on(stream.number(), level).await;
    }

    /// [`Session::want_logs`] for the stream numbered `stream` (a bridged call's own, whose
    /// plugin's logs relate to it rather than to the client's stream).
    pub async fn want_logs_on(&self, stream: u64, level: &str) {
        let Some(floor) = severity(level) else {
            return;
        };
        self.request_logs
            .floors
            .lock()
            .expect("request logs lock")
            .insert(stream, floor);
        let lower = {
            let mut asked = self.request_logs.asked.lock().expect("request logs lock");
            let lower = *asked == 0 || floor < *asked;
            if lower {
                *asked = floor;
            }
            lower
        };
        if !lower {
            return;
        }
        let params = RawValue::from_string(serde_json::json!({ "level": level }).to_string())
            .expect("valid JSON");
        // Kept for instances that start later (they are told as they start).
        self.log_level.set(params.clone());
        let running: Vec<_> = self
            .slots
            .lock()
            .expect("slots lock")
            .values()
            .filter(|s| s.has_capability("logging"))
            .filter_map(|s| s.current())
            .collect();
        let told = running.iter().map(|conn| {
            let params = &params;
            async move {
                match tokio::time::timeout(
                    SET_LEVEL_WAIT,
                    conn.call("logging/setLevel", Some(params)),
                )
                .await
                {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        tracing::debug!(plugin = %conn.name(), session = %self.id, "logging/setLevel: {e}")
                    }
                    Err(_) => {
                        tracing::debug!(plugin = %conn.name(), session = %self.id, "logging/setLevel: no answer")
                    }
                }
            }
        });
        futures_util::future::join_all(told).await;
    }

    /// A caller's plugin logged: onto the stream of the request it belongs to, if that
    /// request opted in at or below the message's level; else nowhere.
    pub(super) fn relay_request_log(&self, message: Bytes, related: Related) {
        let sink = match related {
            Related::Named(s) | Related::Exact(s) => s,
            Related::Ambiguous(_) | Related::None | Related::Unattributable => return,
        };
        if sink.session_id() != &*self.id {
            return;
        }
        let floor = self
            .request_logs
            .floors
            .lock()
            .expect("request logs lock")
            .get(&sink.stream_number())
            .copied();
        let Some(floor) = floor else { return };
        // A message that names no known level is let through, as a legacy session's is.
        if message_severity(&message).is_none_or(|s| s >= floor) {
            let _ = sink.message(message);
        }
    }

    /// A caller's stream is released: its request wants no more log messages.
    /// The log level stream `from` asked for, asked for stream `to` too (a bridged call's
    /// own stream, which its plugin's logs relate to once the call is bridged).
    pub(super) fn copy_request_logs(&self, from: u64, to: u64) {
        let mut floors = self.request_logs.floors.lock().expect("request logs lock");
        if let Some(floor) = floors.get(&from).copied() {
            floors.insert(to, floor);
        }
    }

    pub(super) fn forget_request_logs(&self, number: u64) {
        self.request_logs
            .floors
            .lock()
            .expect("request logs lock")
            .remove(&number);
    }
}
