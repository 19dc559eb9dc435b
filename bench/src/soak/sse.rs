//! SSE as the soak reads it: a response body split into events as its chunks come, and the
//! gateway's event ids taken apart (stream and sequence number), to check them.

use std::collections::VecDeque;

#[derive(Debug, Clone)]
pub(super) struct SseEvent {
    pub(super) id: Option<String>,
    pub(super) data: String,
}

/// Splits an SSE body into events as its chunks come.
#[derive(Default)]
struct SseParser {
    buf: Vec<u8>,
}

impl SseParser {
    fn feed(&mut self, chunk: &[u8], out: &mut VecDeque<SseEvent>) {
        self.buf.extend_from_slice(chunk);
        while let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
            let block: Vec<u8> = self.buf.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&block);
            let (mut id, mut data, mut any) = (None, Vec::new(), false);
            for line in text.lines() {
                let line = line.trim_end_matches('\r');
                if let Some(v) = line.strip_prefix("id:") {
                    id = Some(v.trim_start().to_owned());
                    any = true;
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push(v.strip_prefix(' ').unwrap_or(v).to_owned());
                    any = true;
                }
                // `retry:` and comments (keep-alives) carry nothing to check.
            }
            if any {
                out.push_back(SseEvent {
                    id,
                    data: data.join("\n"),
                });
            }
        }
    }
}

/// An SSE response body, event by event.
pub(super) struct EventStream {
    resp: reqwest::Response,
    parser: SseParser,
    pending: VecDeque<SseEvent>,
    /// The id of the last event taken from it.
    pub(super) last_id: Option<String>,
}

impl EventStream {
    pub(super) fn new(resp: reqwest::Response) -> EventStream {
        EventStream {
            resp,
            parser: SseParser::default(),
            pending: VecDeque::new(),
            last_id: None,
        }
    }

    pub(super) async fn next(&mut self) -> Result<Option<SseEvent>, String> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                if e.id.is_some() {
                    self.last_id.clone_from(&e.id);
                }
                return Ok(Some(e));
            }
            match self.resp.chunk().await {
                Ok(Some(b)) => self.parser.feed(&b, &mut self.pending),
                Ok(None) => return Ok(None),
                Err(e) => return Err(describe(&e)),
            }
        }
    }
}

/// A reqwest error with its causes, for the error tally.
pub(super) fn describe(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(c) = source {
        s.push_str(": ");
        s.push_str(&c.to_string());
        source = c.source();
    }
    s
}

/// `<tag>-<stream>-<seq>` or, for a priming event, `<tag>-<stream>-<seq>-p<n>`.
pub(super) fn parse_event_id(id: &str) -> Option<(u64, u64, bool)> {
    let mut parts = id.split('-');
    let _tag = parts.next()?;
    let stream = parts.next()?.parse().ok()?;
    let seq = parts.next()?.parse().ok()?;
    let priming = match parts.next() {
        None => false,
        Some(p) if p.starts_with('p') => true,
        Some(_) => return None,
    };
    Some((stream, seq, priming))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_split_across_chunks() {
        let mut p = SseParser::default();
        let mut out = VecDeque::new();
        p.feed(
            b"id: 0000abcd-0-0-p1\nretry: 1000\ndata: \n\n: keep-alive\n\nid: 0000ab",
            &mut out,
        );
        p.feed(b"cd-0-1\ndata: {\"a\":1}\n\n", &mut out);
        let ids: Vec<_> = out
            .iter()
            .map(|e| e.id.clone().unwrap_or_default())
            .collect();
        assert_eq!(ids, ["0000abcd-0-0-p1", "0000abcd-0-1"]);
        assert_eq!(out[1].data, "{\"a\":1}");
        assert_eq!(parse_event_id("0000abcd-3-17"), Some((3, 17, false)));
        assert_eq!(parse_event_id("0000abcd-3-0-p2"), Some((3, 0, true)));
        assert_eq!(parse_event_id("x-y"), None);
    }
}
