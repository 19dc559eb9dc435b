//! A session's own books: which event it saw last on each stream, and which tagged
//! notifications it asked for and how often each came. Every event passes through
//! [`SessionState::absorb`], which counts gaps, repeats and what nobody asked for.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde_json::Value;

use super::sse::{SseEvent, parse_event_id};
use super::stats::Stats;

/// What one session expects and has seen.
#[derive(Default)]
pub(super) struct Track {
    /// Per stream number: the sequence number of the last event seen.
    pub(super) last_seq: HashMap<u64, u64>,
    /// The last event id seen on the GET stream.
    pub(super) get_last_id: Option<String>,
    /// Per burst tag: how often each notification number arrived.
    pub(super) bursts: HashMap<String, Vec<u32>>,
    /// Bursts and background logs whose call failed (an error counted already): what they
    /// miss is not counted lost as well.
    pub(super) excused: std::collections::HashSet<String>,
    /// Per background-log text: how often it arrived.
    pub(super) logs: HashMap<String, u32>,
}

#[derive(Default)]
pub(super) struct Missing {
    pub(super) bursts: u64,
    pub(super) logs: u64,
    pub(super) burst_example: String,
    pub(super) log_example: String,
}

pub(super) struct SessionState {
    pub(super) sid: String,
    pub(super) version: String,
    pub(super) no: u64,
    pub(super) track: Mutex<Track>,
    pub(super) next_id: AtomicU64,
    pub(super) seq: AtomicU64,
    /// Whether the session's plugin instance has started (a crash needs one).
    pub(super) started: AtomicBool,
}

/// Where an event came from.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Via {
    Post,
    /// A GET connection, resumed (with `Last-Event-ID`) or not.
    Get {
        resumed: bool,
    },
}

impl SessionState {
    pub(super) fn id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// A text unique in the whole run.
    pub(super) fn unique(&self, what: &str) -> String {
        format!(
            "{what}-{}-{}",
            self.no,
            self.seq.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Checks an event's id for gaps and repeats, and a notification's tag against what was
    /// asked for. Returns the JSON-RPC message it carries, if any.
    pub(super) fn absorb(&self, ev: &SseEvent, via: Via, stats: &Stats) -> Option<Value> {
        let n = stats.events.fetch_add(1, Ordering::Relaxed) + 1;
        if stats.drop_events > 0 && n.is_multiple_of(stats.drop_events) {
            return None;
        }
        let mut t = self.track.lock().expect("track lock");
        if let Some(id) = &ev.id {
            match parse_event_id(id) {
                None => stats.error("malformed event id", id.clone()),
                Some((stream, seq, priming)) => {
                    if matches!(via, Via::Get { .. }) && stream == 0 {
                        t.get_last_id = Some(id.clone());
                    }
                    let last = t.last_seq.get(&stream).copied();
                    match (priming, last) {
                        // A priming event carries the position its connection starts after.
                        (true, Some(l)) if seq != l => stats.error(
                            "priming event at another position than the client's",
                            format!("{id} after event {l}"),
                        ),
                        (true, _) => {}
                        (false, Some(l)) if seq > l + 1 => stats.lost(
                            "SSE events skipped on a stream",
                            seq - l - 1,
                            format!("session {}: event {id} after event {l}", self.sid),
                        ),
                        (false, Some(l)) if seq <= l => stats.duplicate(
                            "SSE event repeated",
                            1,
                            format!("session {}: event {id} after event {l}", self.sid),
                        ),
                        (false, None) if seq != 1 => stats.lost(
                            "SSE events skipped on a stream",
                            seq - 1,
                            format!("session {}: first event {id}", self.sid),
                        ),
                        _ => {}
                    }
                    let next = if priming {
                        seq
                    } else {
                        seq.max(last.unwrap_or(0))
                    };
                    t.last_seq.insert(stream, next);
                }
            }
        }
        if ev.data.is_empty() {
            return None;
        }
        let Ok(v) = serde_json::from_str::<Value>(&ev.data) else {
            stats.error("SSE data that is not JSON", ev.data.clone());
            return None;
        };
        if v["method"] == "notifications/message" {
            let data = &v["params"]["data"];
            match v["params"]["logger"].as_str() {
                Some("burst") => {
                    let parsed = data.as_str().and_then(|d| {
                        let (tag, i) = d.rsplit_once(':')?;
                        Some((tag.to_owned(), i.parse::<usize>().ok()?))
                    });
                    match parsed.and_then(|(tag, i)| Some((t.bursts.get_mut(&tag)?, i, tag))) {
                        Some((counts, i, tag)) if i < counts.len() => {
                            counts[i] += 1;
                            Stats::add(&stats.notifications, 1);
                            if matches!(via, Via::Get { resumed: true }) {
                                Stats::add(&stats.replayed, 1);
                            }
                            if counts[i] > 1 {
                                stats.duplicate(
                                    "burst notification repeated",
                                    1,
                                    format!("session {}: {tag}:{i}", self.sid),
                                );
                            }
                        }
                        _ => stats.error("burst notification nobody asked for", ev.data.clone()),
                    }
                }
                Some("fixture") if data.as_str().is_some_and(|d| d.starts_with("bg-")) => {
                    let text = data.as_str().unwrap_or_default();
                    match t.logs.get_mut(text) {
                        Some(n) => {
                            *n += 1;
                            Stats::add(&stats.notifications, 1);
                            if matches!(via, Via::Get { resumed: true }) {
                                Stats::add(&stats.replayed, 1);
                            }
                            if *n > 1 {
                                stats.duplicate(
                                    "background log repeated",
                                    1,
                                    format!("session {}: {text}", self.sid),
                                );
                            }
                        }
                        None => stats.error("background log nobody asked for", ev.data.clone()),
                    }
                }
                _ => stats.error("log notification nobody asked for", ev.data.clone()),
            }
        } else if v.get("method").is_some() && v.get("id").is_some() {
            stats.error("a request from the plugin", ev.data.clone());
        }
        Some(v)
    }

    pub(super) fn expect_burst(&self, tag: &str, count: u64) {
        self.track
            .lock()
            .expect("track lock")
            .bursts
            .insert(tag.to_owned(), vec![0; count as usize]);
    }

    pub(super) fn expect_log(&self, text: &str) {
        self.track
            .lock()
            .expect("track lock")
            .logs
            .insert(text.to_owned(), 0);
    }

    /// The call for this tag or text failed: what it would have sent is not expected.
    pub(super) fn excuse(&self, tag: &str) {
        self.track
            .lock()
            .expect("track lock")
            .excused
            .insert(tag.to_owned());
    }

    /// Tagged notifications asked for and not (yet) arrived: burst notifications and
    /// background logs, each with an example.
    pub(super) fn missing(&self) -> Missing {
        let t = self.track.lock().expect("track lock");
        let mut m = Missing::default();
        for (tag, counts) in t.bursts.iter().filter(|(k, _)| !t.excused.contains(*k)) {
            let n = counts.iter().filter(|c| **c == 0).count() as u64;
            if n > 0 && m.burst_example.is_empty() {
                m.burst_example =
                    format!("session {}: burst {tag}: {n} of {}", self.sid, counts.len());
            }
            m.bursts += n;
        }
        for (text, _) in t
            .logs
            .iter()
            .filter(|(k, n)| **n == 0 && !t.excused.contains(*k))
        {
            if m.logs == 0 {
                m.log_example = format!("session {}: {text}", self.sid);
            }
            m.logs += 1;
        }
        m
    }

    pub(super) fn forget_stream(&self, id: Option<&str>) {
        if let Some((stream, _, _)) = id.and_then(parse_event_id)
            && stream != 0
        {
            self.track
                .lock()
                .expect("track lock")
                .last_seq
                .remove(&stream);
        }
    }
}
