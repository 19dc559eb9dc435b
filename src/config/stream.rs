//! The `[stream]` section: how SSE streams behave ([`StreamSettings`]) and what is kept for
//! replay ([`ReplayLimits`]), merged from flags and the file.
//!
//! Plain data: the `stream` module reads these settings; nothing here touches a stream.

use std::time::Duration;

/// How streams behave, from the config.
#[derive(Debug, Clone)]
pub struct StreamSettings {
    /// Interval of keep-alive comments on idle connections.
    pub keep_alive: Duration,
    /// Whether events carry ids and are kept for `Last-Event-ID` resumption.
    pub resumable: bool,
    /// The `retry:` advice sent to clients (2025-11-25 and later) before the gateway closes a
    /// connection, and with the priming event.
    pub retry: Duration,
    /// Polling mode (2025-11-25): close a connection after this long, the stream going on.
    pub poll_after: Option<Duration>,
    /// How long a finished stream stays resumable. Having written the last event to a
    /// connection does not prove the client read it: a connection can be dead before the
    /// gateway notices.
    pub linger: Duration,
    /// At most this many finished streams linger in a session; past it the oldest is released
    /// at once. Set to the session's replay budget in events: each lingering stream kept at
    /// least one event, so past that many the oldest have lost theirs to the budget already,
    /// and keeping them would only hold memory.
    pub max_lingering: usize,
    /// How long a POST's SSE response waits for its answers before its headers go out. A
    /// quick answer then leaves in the same write as the headers (one body with a length)
    /// instead of a write for the headers and another for the events.
    pub hold: Duration,
}

/// Bounds on what is kept for replay.
#[derive(Debug, Clone)]
pub struct ReplayLimits {
    pub max_events_per_stream: usize,
    pub max_bytes_per_stream: usize,
    pub max_events_per_session: usize,
    pub max_bytes_per_session: usize,
    pub max_age: Duration,
}

impl Default for ReplayLimits {
    fn default() -> Self {
        ReplayLimits {
            max_events_per_stream: 10_000,
            max_bytes_per_stream: 4 * 1024 * 1024,
            max_events_per_session: 50_000,
            max_bytes_per_session: 16 * 1024 * 1024,
            max_age: Duration::from_secs(600),
        }
    }
}
