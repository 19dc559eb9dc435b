//! A session's `logging/setLevel`: kept to be sent to every plugin instance the session
//! starts (before the instance serves anything), and enforced by the gateway itself on the
//! `notifications/message` its plugins send, since a plugin may not filter its own logs.
//!
//! It reads a notification only when a level is set and only for that one method; it never
//! parses anything else on the way to a client.

use std::borrow::Cow;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};

use serde::Deserialize;
use serde_json::value::RawValue;

/// The syslog severities MCP uses, least severe first.
pub(crate) use crate::protocol::LOG_LEVELS;

/// The level a client asked for, if any.
#[derive(Default)]
pub(super) struct LogLevel {
    /// The client's params, sent as they came to each plugin that starts later.
    params: Mutex<Option<Box<RawValue>>>,
    /// 0 while no level is set; else the least severe level let through, plus one.
    floor: AtomicU8,
}

#[derive(Deserialize)]
struct Level<'a> {
    #[serde(borrow)]
    level: Cow<'a, str>,
}

#[derive(Deserialize)]
struct Notification<'a> {
    #[serde(borrow)]
    params: Level<'a>,
}

/// A level's severity, 1 for the least severe; `None` for no known level.
pub(super) fn severity(level: &str) -> Option<u8> {
    LOG_LEVELS
        .iter()
        .position(|l| *l == level)
        .map(|i| i as u8 + 1)
}

impl LogLevel {
    /// Records the client's `logging/setLevel` params (the router has checked them).
    pub(super) fn set(&self, params: Box<RawValue>) {
        let floor = serde_json::from_str::<Level>(params.get())
            .ok()
            .and_then(|l| severity(&l.level))
            .unwrap_or(0);
        *self.params.lock().expect("log level lock") = Some(params);
        self.floor.store(floor, Ordering::Relaxed);
    }

    /// The params to send a plugin that starts now.
    pub(super) fn params(&self) -> Option<Box<RawValue>> {
        self.params.lock().expect("log level lock").clone()
    }

    /// The level asked for, by name (a modern plugin is told it in each request's `_meta`).
    pub(super) fn level(&self) -> Option<&'static str> {
        let floor = self.floor.load(Ordering::Relaxed);
        LOG_LEVELS.get(usize::from(floor).checked_sub(1)?).copied()
    }

    /// Whether a `notifications/message` may reach the client: its level is at or above the
    /// one asked for. One that names no known level is let through.
    pub(super) fn allows(&self, message: &[u8]) -> bool {
        let floor = self.floor.load(Ordering::Relaxed);
        if floor == 0 {
            return true;
        }
        message_severity(message).is_none_or(|s| s >= floor)
    }
}

/// The severity of a `notifications/message`, if it names a known level.
pub(super) fn message_severity(message: &[u8]) -> Option<u8> {
    serde_json::from_slice::<Notification>(message)
        .ok()
        .and_then(|n| severity(&n.params.level))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(level: &str) -> Vec<u8> {
        format!(r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"level":"{level}","data":"x"}}}}"#)
            .into_bytes()
    }

    #[test]
    fn below_the_level_is_held_back() {
        let l = LogLevel::default();
        assert!(l.allows(&note("debug")), "no level set: all pass");
        l.set(RawValue::from_string(r#"{"level":"warning"}"#.into()).unwrap());
        assert!(!l.allows(&note("debug")));
        assert!(!l.allows(&note("info")));
        assert!(l.allows(&note("warning")));
        assert!(l.allows(&note("emergency")));
        assert!(l.allows(&note("no-such-level")));
        assert!(l.params().unwrap().get().contains("warning"));
        assert_eq!(l.level(), Some("warning"));
        assert_eq!(LogLevel::default().level(), None);
    }
}
