//! Reading an upstream's Server-Sent Events: the WHATWG event stream format, fed chunk by
//! chunk as the bytes arrive, never holding more than one event's worth of bytes (a line or
//! an event over the bound is an error, not a growing buffer). Lines end in CRLF, LF or CR;
//! a line starting with `:` is a comment (a keep-alive); `id` sets the stream's last event id
//! (even for an event with no data, the priming event servers send); `retry` the reconnection
//! delay.

use bytes::{Bytes, BytesMut};

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Its type: `message` unless the `event` field said otherwise.
    pub event: String,
    pub data: Bytes,
}

/// What a chunk yielded, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Event(Event),
    /// The stream's last event id changed (an `id` field on a dispatched event).
    Id(String),
    /// The server asked for this reconnection delay, in milliseconds.
    Retry(u64),
}

/// The stream broke the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an event or line over {0} bytes")]
pub struct TooBig(pub usize);

pub struct Parser {
    max: usize,
    /// Bytes of an unfinished line.
    line: BytesMut,
    /// The event in the making.
    data: Vec<u8>,
    event: String,
    id: Option<String>,
    /// The previous chunk ended in CR: a LF starting this one belongs to it.
    after_cr: bool,
}

impl Parser {
    /// A parser refusing any event or line over `max` bytes.
    pub fn new(max: usize) -> Parser {
        Parser {
            max,
            line: BytesMut::new(),
            data: Vec::new(),
            event: String::new(),
            id: None,
            after_cr: false,
        }
    }

    /// Feeds the next chunk; what it completed.
    pub fn push(&mut self, mut chunk: &[u8], out: &mut Vec<Item>) -> Result<(), TooBig> {
        if self.after_cr && chunk.first() == Some(&b'\n') {
            chunk = &chunk[1..];
        }
        self.after_cr = false;
        while let Some(end) = memchr::memchr2(b'\n', b'\r', chunk) {
            let ending = chunk[end];
            let line_part = &chunk[..end];
            let line = if self.line.is_empty() {
                std::borrow::Cow::Borrowed(line_part)
            } else {
                self.line.extend_from_slice(line_part);
                std::borrow::Cow::Owned(self.line.split().to_vec())
            };
            if line.len() > self.max {
                return Err(TooBig(self.max));
            }
            self.line_done(&line, out)?;
            chunk = &chunk[end + 1..];
            if ending == b'\r' {
                if chunk.first() == Some(&b'\n') {
                    chunk = &chunk[1..];
                } else if chunk.is_empty() {
                    self.after_cr = true;
                }
            }
        }
        if self.line.len() + chunk.len() > self.max {
            return Err(TooBig(self.max));
        }
        self.line.extend_from_slice(chunk);
        Ok(())
    }

    fn line_done(&mut self, line: &[u8], out: &mut Vec<Item>) -> Result<(), TooBig> {
        if line.is_empty() {
            self.dispatch(out);
            return Ok(());
        }
        if line[0] == b':' {
            return Ok(());
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &[][..]),
        };
        match field {
            b"data" => {
                if self.data.len() + value.len() + 1 > self.max {
                    return Err(TooBig(self.max));
                }
                self.data.extend_from_slice(value);
                self.data.push(b'\n');
            }
            b"event" => self.event = String::from_utf8_lossy(value).into_owned(),
            b"id" if !value.contains(&0) => {
                self.id = Some(String::from_utf8_lossy(value).into_owned());
            }
            b"retry" => {
                if let Some(ms) = std::str::from_utf8(value)
                    .ok()
                    .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|v| v.parse().ok())
                {
                    out.push(Item::Retry(ms));
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn dispatch(&mut self, out: &mut Vec<Item>) {
        if let Some(id) = self.id.take() {
            out.push(Item::Id(id));
        }
        let event = std::mem::take(&mut self.event);
        if self.data.is_empty() {
            return;
        }
        let mut data = std::mem::take(&mut self.data);
        data.pop();
        out.push(Item::Event(Event {
            event: if event.is_empty() {
                "message".into()
            } else {
                event
            },
            data: Bytes::from(data),
        }));
    }
}

/// `text` cut into chunks of `size` (for tests of chunked input).
#[cfg(test)]
fn chunks(text: &[u8], size: usize) -> Vec<Bytes> {
    use bytes::Buf;
    let mut b = Bytes::copy_from_slice(text);
    let mut v = Vec::new();
    while b.has_remaining() {
        let n = size.min(b.remaining());
        v.push(b.split_to(n));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &[u8], size: usize, max: usize) -> Result<Vec<Item>, TooBig> {
        let mut p = Parser::new(max);
        let mut out = Vec::new();
        for c in chunks(text, size) {
            p.push(&c, &mut out)?;
        }
        Ok(out)
    }

    fn event(data: &str) -> Item {
        Item::Event(Event {
            event: "message".into(),
            data: Bytes::from(data.to_owned()),
        })
    }

    #[test]
    fn events_ids_retry_and_comments_in_any_chunking() {
        let text = b": keep-alive\r\nid: 1\r\ndata:\r\nretry: 1500\r\n\r\nid: 2\ndata: {\"a\":1}\ndata: x\n\nevent: endpoint\rdata: /messages?s=1\r\rdata:no space\n\n";
        for size in [1, 2, 3, 7, text.len()] {
            let items = parse(text, size, 1024).unwrap();
            assert_eq!(
                items,
                vec![
                    Item::Retry(1500),
                    Item::Id("1".into()),
                    // `data:` with nothing is an event with empty data (the priming event).
                    event(""),
                    Item::Id("2".into()),
                    event("{\"a\":1}\nx"),
                    Item::Event(Event {
                        event: "endpoint".into(),
                        data: Bytes::from_static(b"/messages?s=1"),
                    }),
                    event("no space"),
                ],
                "chunks of {size}"
            );
        }
    }

    #[test]
    fn an_event_or_line_over_the_bound_is_refused() {
        assert_eq!(parse(&[b'a'; 100], 10, 50), Err(TooBig(50)));
        let many = b"data: 0123456789\n".repeat(10);
        assert_eq!(parse(&many, 5, 50), Err(TooBig(50)));
        assert!(parse(b"data: 0123456789\n\n".repeat(10).as_slice(), 5, 50).is_ok());
    }

    #[test]
    fn garbage_is_ignored_not_fatal() {
        let items = parse(
            b"\xff\xfe nonsense\nretry: x1\nid: a\0b\n\ndata: ok\n\n",
            3,
            1024,
        )
        .unwrap();
        assert_eq!(items, vec![event("ok")]);
    }
}
