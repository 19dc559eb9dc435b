//! The `[stream]` section: how SSE streams behave ([`StreamSettings`]) and what is kept for
//! replay ([`ReplayLimits`]), merged from flags and the file.
//!
//! Plain data: the `stream` module reads these settings; nothing here touches a stream.

use std::time::Duration;

use super::file::StreamSection;
use super::{Cli, ConfigError, invalid};

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

/// The `[stream]` section over the flags: the streams' behaviour and the replay bounds.
pub(super) fn stream_and_replay(
    cli: &Cli,
    fs: &StreamSection,
) -> Result<(StreamSettings, ReplayLimits), ConfigError> {
    let keep_alive = cli.sse_keep_alive_secs.or(fs.keep_alive_secs).unwrap_or(15);
    if keep_alive == 0 {
        return Err(invalid("stream.keep_alive_secs", "must be at least 1"));
    }
    let retry_ms = cli.sse_retry_ms.or(fs.retry_ms).unwrap_or(1000);
    let poll_after_ms = cli.sse_poll_after_ms.or(fs.poll_after_ms);
    if poll_after_ms == Some(0) {
        return Err(invalid(
            "stream.poll_after_ms",
            "must be at least 1 (leave it out to turn polling off)",
        ));
    }
    let defaults = ReplayLimits::default();
    let replay = ReplayLimits {
        max_events_per_stream: cli
            .replay_max_events
            .or(fs.replay_max_events)
            .unwrap_or(defaults.max_events_per_stream),
        max_bytes_per_stream: cli
            .replay_max_bytes
            .or(fs.replay_max_bytes)
            .unwrap_or(defaults.max_bytes_per_stream),
        max_events_per_session: cli
            .replay_session_max_events
            .or(fs.replay_session_max_events)
            .unwrap_or(defaults.max_events_per_session),
        max_bytes_per_session: cli
            .replay_session_max_bytes
            .or(fs.replay_session_max_bytes)
            .unwrap_or(defaults.max_bytes_per_session),
        max_age: cli
            .replay_max_age_secs
            .or(fs.replay_max_age_secs)
            .map_or(defaults.max_age, Duration::from_secs),
    };
    let stream = StreamSettings {
        keep_alive: Duration::from_secs(keep_alive),
        resumable: cli.sse_resumable.or(fs.resumable).unwrap_or(true),
        retry: Duration::from_millis(retry_ms),
        poll_after: poll_after_ms.map(Duration::from_millis),
        linger: Duration::from_millis(cli.sse_linger_ms.or(fs.linger_ms).unwrap_or(5000)),
        hold: Duration::from_millis(cli.sse_hold_ms.or(fs.hold_ms).unwrap_or(5)),
        max_lingering: replay.max_events_per_session,
    };
    for (key, limit) in [
        ("stream.replay_max_events", replay.max_events_per_stream),
        ("stream.replay_max_bytes", replay.max_bytes_per_stream),
        (
            "stream.replay_session_max_events",
            replay.max_events_per_session,
        ),
        (
            "stream.replay_session_max_bytes",
            replay.max_bytes_per_session,
        ),
    ] {
        if limit == 0 {
            return Err(invalid(key, "must be at least 1"));
        }
    }
    Ok((stream, replay))
}
