//! A plugin's stderr: split into log lines at `\n` and `\r` as it arrives, each line capped at
//! `MAX_LINE` bytes.
//!
//! The first input byte sets the size of each read (1 to 256 bytes, times 1 to 64 by the
//! second, so long lines arrive both whole and in pieces); the rest is the output. Invariants:
//! the lines are exactly the output's non-empty `\n`/`\r`-separated lines, a line over the cap
//! cut to its first `MAX_LINE` bytes; and the codec never holds more than the cap between
//! reads, whatever the plugin writes.

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use mcp_gateway::backend::stderr::{MAX_LINE, Piece, StderrCodec};
use tokio_util::codec::Decoder;

fuzz_target!(|data: &[u8]| {
    let [read, times, output @ ..] = data else {
        return;
    };
    let read = (usize::from(*read) + 1) * (usize::from(*times % 64) + 1);

    let mut codec = StderrCodec::default();
    let mut buf = BytesMut::new();
    let mut lines = Vec::new();
    for piece in output.chunks(read) {
        buf.extend_from_slice(piece);
        while let Some(line) = codec.decode(&mut buf).expect("decoding never fails") {
            lines.push(line);
        }
        assert!(buf.len() <= MAX_LINE, "{} bytes held", buf.len());
    }
    while let Some(line) = codec.decode_eof(&mut buf).expect("decoding never fails") {
        lines.push(line);
    }
    assert_eq!(lines, expected(output));
});

/// The lines, by a plain split.
fn expected(output: &[u8]) -> Vec<Piece> {
    output
        .split(|b| *b == b'\n' || *b == b'\r')
        .filter(|line| !line.is_empty())
        .map(|line| {
            if line.len() > MAX_LINE {
                Piece::Cut(BytesMut::from(&line[..MAX_LINE]))
            } else {
                Piece::Line(BytesMut::from(line))
            }
        })
        .collect()
}
