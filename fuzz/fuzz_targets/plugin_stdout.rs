//! A plugin's stdout: split into lines as it arrives, read by pieces of any size, each line
//! then read as a JSON-RPC message, as the plugin's connection does.
//!
//! The first input byte sets the size of each read (1 to 256 bytes), the second the line cap
//! (a small one, so the fuzzer reaches it; the gateway's is 64 MiB); the rest is the output.
//! Invariants: the lines are exactly the output's `\n`-separated lines (a trailing `\r`
//! dropped, the last line without `\n` at the end too), each line over the cap is reported as
//! one `TooLong` and never delivered, and the codec never holds more than the cap between
//! reads. A response relayed to the client with its id swapped is the plugin's result,
//! byte for byte.

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use mcp_gateway::backend::stdio::{Line, LineCodec};
use mcp_gateway::jsonrpc::{self, Id, Message, Outcome};
use tokio_util::codec::Decoder;

fuzz_target!(|data: &[u8]| {
    let [read, cap, output @ ..] = data else {
        return;
    };
    let read = usize::from(*read) + 1;
    let cap = usize::from(*cap) + 1;

    let mut codec = LineCodec::with_max_line(cap);
    let mut buf = BytesMut::new();
    let mut lines = Vec::new();
    for piece in output.chunks(read) {
        buf.extend_from_slice(piece);
        while let Some(line) = codec.decode(&mut buf).expect("decoding never fails") {
            lines.push(line);
        }
        assert!(buf.len() <= cap, "{} bytes held, cap {cap}", buf.len());
    }
    while let Some(line) = codec.decode_eof(&mut buf).expect("decoding never fails") {
        lines.push(line);
    }
    assert_eq!(lines, expected(output, cap));

    for line in &lines {
        if let Line::Data(line) = line {
            message(line);
        }
    }
});

/// The lines, by a plain split.
fn expected(output: &[u8], cap: usize) -> Vec<Line> {
    let mut lines = Vec::new();
    let mut rest = output;
    while let Some(end) = rest.iter().position(|b| *b == b'\n') {
        let line = &rest[..end];
        rest = &rest[end + 1..];
        if line.len() > cap {
            lines.push(Line::TooLong);
        } else {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            lines.push(Line::Data(bytes::Bytes::copy_from_slice(line)));
        }
    }
    // Output that ends without a line end: its last line, unless it ran past the cap.
    if !rest.is_empty() && rest.len() <= cap {
        lines.push(Line::Data(bytes::Bytes::copy_from_slice(rest)));
    }
    lines
}

/// What the connection does with a line: a response goes to the client with its id swapped.
fn message(line: &[u8]) {
    let Ok(Message::Response { outcome, .. }) = jsonrpc::parse_message(line) else {
        return;
    };
    let client_id =
        Id::from_raw(&serde_json::value::RawValue::from_string("\"c-1\"".into()).unwrap())
            .expect("a string id");
    let (bytes, body) = match &outcome {
        Outcome::Result(r) => (jsonrpc::result_bytes(client_id.raw(), r), r),
        Outcome::Error(e) => (jsonrpc::error_object_bytes(client_id.raw(), e), e),
    };
    match jsonrpc::parse_message(&bytes) {
        Ok(Message::Response { id, outcome: o2 }) => {
            assert_eq!(id, client_id);
            let (Outcome::Result(b) | Outcome::Error(b)) = o2;
            assert_eq!(b.get(), body.get());
        }
        other => panic!("relayed response reads back as {other:?}"),
    }
}
