//! A plugin's error output: logged line by line (quoted in text lines: it cannot pass for a
//! line of the gateway's own, [`crate::logs::untrusted`]), tagged with the plugin and the
//! session, the last lines kept for the logs and the admin API.
//!
//! The plugin decides what it writes here, so nothing it writes may grow the gateway: a line
//! ends at `\n` or at `\r` (a progress bar redraws with `\r` and may never end its line), and
//! a line longer than [`MAX_LINE`] is logged cut, with a marker, while the rest of it is
//! skipped as it arrives. No more than one line's cap (and one read) is ever buffered. What
//! is read here is never sent to a client.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use bytes::{Buf, BytesMut};
use futures_util::StreamExt;
use tokio::process::ChildStderr;
use tokio_util::codec::{Decoder, FramedRead};
use tokio_util::sync::CancellationToken;

/// Longest stderr line logged; the rest of a longer one is dropped.
pub const MAX_LINE: usize = 4096;
/// Stderr lines kept for error messages.
const TAIL: usize = 20;

/// The last lines a plugin wrote to stderr, oldest first.
pub type Tail = Arc<Mutex<VecDeque<String>>>;

/// Starts logging `stderr` until it ends; the tail it keeps, and a token cancelled once
/// everything is read.
pub fn spawn(stderr: ChildStderr, plugin: String, session: String) -> (Tail, CancellationToken) {
    let tail: Tail = Arc::new(Mutex::new(VecDeque::with_capacity(TAIL)));
    let keep = tail.clone();
    let done = CancellationToken::new();
    let finished = done.clone().drop_guard();
    tokio::spawn(async move {
        let _finished = finished;
        let mut lines = FramedRead::new(stderr, StderrCodec::default());
        while let Some(Ok(piece)) = lines.next().await {
            let line = match piece {
                Piece::Line(b) => String::from_utf8_lossy(&b).into_owned(),
                Piece::Cut(b) => format!(
                    "{} … [cut: the line ran past {MAX_LINE} bytes]",
                    String::from_utf8_lossy(&b)
                ),
            };
            tracing::info!(target: "mcp_gateway::plugin", plugin = %plugin, session = %session, "{}", crate::logs::untrusted(&line));
            let mut t = keep.lock().expect("stderr tail lock");
            if t.len() == TAIL {
                t.pop_front();
            }
            t.push_back(line);
        }
    });
    (tail, done)
}

/// One line of stderr, whole or cut at [`MAX_LINE`].
#[derive(Debug, PartialEq)]
pub enum Piece {
    Line(BytesMut),
    Cut(BytesMut),
}

/// Splits stderr at `\n` and `\r`, skipping empty lines; a line over [`MAX_LINE`] yields its
/// first [`MAX_LINE`] bytes and the rest is discarded up to its end.
#[derive(Default)]
pub struct StderrCodec {
    /// Inside a line already cut: bytes are dropped up to the next line end.
    discarding: bool,
    /// Bytes at the front of the buffer already searched for a line end.
    scanned: usize,
}

impl Decoder for StderrCodec {
    type Item = Piece;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Piece>, std::io::Error> {
        loop {
            let found = buf[self.scanned..]
                .iter()
                .position(|b| *b == b'\n' || *b == b'\r');
            match found {
                Some(pos) => {
                    let end = self.scanned + pos;
                    self.scanned = 0;
                    if std::mem::take(&mut self.discarding) {
                        buf.advance(end + 1);
                        continue;
                    }
                    let mut line = buf.split_to(end + 1);
                    if end == 0 {
                        // `\r\n`, or an empty line.
                        continue;
                    }
                    if end > MAX_LINE {
                        line.truncate(MAX_LINE);
                        return Ok(Some(Piece::Cut(line)));
                    }
                    line.truncate(end);
                    return Ok(Some(Piece::Line(line)));
                }
                None if self.discarding => {
                    buf.clear();
                    self.scanned = 0;
                    return Ok(None);
                }
                None if buf.len() > MAX_LINE => {
                    let line = buf.split_to(MAX_LINE);
                    buf.clear();
                    self.scanned = 0;
                    self.discarding = true;
                    return Ok(Some(Piece::Cut(line)));
                }
                None => {
                    self.scanned = buf.len();
                    return Ok(None);
                }
            }
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Piece>, std::io::Error> {
        if let Some(piece) = self.decode(buf)? {
            return Ok(Some(piece));
        }
        self.scanned = 0;
        if buf.is_empty() || std::mem::take(&mut self.discarding) {
            buf.clear();
            return Ok(None);
        }
        Ok(Some(Piece::Line(buf.split())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `chunks` one read at a time; what comes out, and the most ever buffered.
    fn decode_all(chunks: &[&[u8]]) -> (Vec<String>, usize) {
        let mut codec = StderrCodec::default();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut most = 0;
        let show = |p: Piece| match p {
            Piece::Line(b) => String::from_utf8_lossy(&b).into_owned(),
            Piece::Cut(b) => format!("cut:{}", b.len()),
        };
        for chunk in chunks {
            buf.extend_from_slice(chunk);
            while let Some(p) = codec.decode(&mut buf).unwrap() {
                out.push(show(p));
            }
            most = most.max(buf.len());
        }
        while let Some(p) = codec.decode_eof(&mut buf).unwrap() {
            out.push(show(p));
        }
        (out, most)
    }

    #[test]
    fn carriage_returns_end_lines_and_empty_lines_are_skipped() {
        let (out, _) = decode_all(&[b"a\r\nb\rc\n\n", b"d"]);
        assert_eq!(out, ["a", "b", "c", "d"]);
    }

    #[test]
    fn an_endless_line_is_cut_and_never_buffered_past_the_cap() {
        let chunk = vec![b'x'; 1000];
        let mut chunks: Vec<&[u8]> = vec![&chunk; 100];
        chunks.push(b"y\nnext\n");
        let (out, most) = decode_all(&chunks);
        assert_eq!(out, [format!("cut:{MAX_LINE}"), "next".into()]);
        assert!(most <= MAX_LINE + chunk.len(), "buffered {most} bytes");
        // A long line whose end arrives in the same read is cut as well.
        let long = [vec![b'z'; MAX_LINE + 10], b"\nok".to_vec()].concat();
        let (out, _) = decode_all(&[&long]);
        assert_eq!(out, [format!("cut:{MAX_LINE}"), "ok".into()]);
        // Cut while discarding, then the output ends: nothing more.
        let (out, _) = decode_all(&[&[b'w'; MAX_LINE + 1], b"www"]);
        assert_eq!(out, [format!("cut:{MAX_LINE}")]);
    }
}
