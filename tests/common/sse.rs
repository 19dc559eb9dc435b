//! Server-sent events as the tests read them: a parser for a whole body, and live streams read
//! event by event (raw events with ids and retry advice, or JSON-RPC messages), each read
//! failing the test after 20 s instead of hanging it.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;

/// One SSE event.
#[derive(Debug, Clone, Default)]
pub struct SseEvent {
    pub id: Option<String>,
    pub data: String,
    pub retry: Option<u64>,
}

/// Parses a complete SSE body.
pub fn parse_sse(body: &str) -> Vec<SseEvent> {
    let mut out = Vec::new();
    for block in body.replace("\r\n", "\n").split("\n\n") {
        let mut ev = SseEvent::default();
        let mut any = false;
        for line in block.lines() {
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line
                .split_once(':')
                .map_or((line, ""), |(f, v)| (f, v.strip_prefix(' ').unwrap_or(v)));
            match field {
                "data" => {
                    if any && !ev.data.is_empty() {
                        ev.data.push('\n');
                    }
                    ev.data.push_str(value);
                    any = true;
                }
                "id" => {
                    ev.id = Some(value.to_owned());
                    any = true;
                }
                "retry" => {
                    ev.retry = value.parse().ok();
                    any = true;
                }
                _ => {}
            }
        }
        if any {
            out.push(ev);
        }
    }
    out
}

/// A live SSE stream, read event by event, as raw events (ids, retry, data) with the bytes
/// read so far counted (to cut a connection at a chosen point).
pub struct RawEvents {
    stream:
        std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    buf: String,
    pub bytes_read: usize,
    /// Keep-alive comments seen.
    pub comments: usize,
}

impl RawEvents {
    pub fn new(r: reqwest::Response) -> RawEvents {
        RawEvents {
            stream: Box::pin(r.bytes_stream()),
            buf: String::new(),
            bytes_read: 0,
            comments: 0,
        }
    }

    /// The next complete event, or `None` when the stream ends. Panics after 20 s.
    pub async fn next(&mut self) -> Option<SseEvent> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(pos) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..pos + 2).collect();
                match parse_sse(&block).into_iter().next() {
                    Some(ev) => return Some(ev),
                    None => {
                        self.comments += 1;
                        continue;
                    }
                }
            }
            let chunk = tokio::time::timeout_at(deadline, self.stream.next())
                .await
                .expect("timed out waiting for an SSE event");
            match chunk {
                Some(Ok(bytes)) => {
                    self.bytes_read += bytes.len();
                    self.buf
                        .push_str(&String::from_utf8_lossy(&bytes).replace("\r\n", "\n"));
                }
                _ => return None,
            }
        }
    }
}

/// A live SSE stream, read message by message.
pub struct Events {
    stream:
        std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    buf: String,
}

impl Events {
    pub fn new(r: reqwest::Response) -> Events {
        Events {
            stream: Box::pin(r.bytes_stream()),
            buf: String::new(),
        }
    }

    /// The next JSON-RPC message, or `None` when the stream ends. Panics after 20 s.
    pub async fn next(&mut self) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(pos) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..pos + 2).collect();
                if let Some(ev) = parse_sse(&block).into_iter().next()
                    && let Ok(v) = serde_json::from_str(&ev.data)
                {
                    return Some(v);
                }
                continue;
            }
            let chunk = tokio::time::timeout_at(deadline, self.stream.next())
                .await
                .expect("timed out waiting for an SSE event");
            match chunk {
                Some(Ok(bytes)) => self
                    .buf
                    .push_str(&String::from_utf8_lossy(&bytes).replace("\r\n", "\n")),
                _ => return None,
            }
        }
    }
}
