//! `Last-Event-ID`: the header's bytes, then an SSE event id.
//!
//! Invariants: only canonical ids parse, so an id that parses writes back as the very text it
//! was read from (by `Display` and by the writer every event uses); and every id the gateway
//! can write parses back to itself.

#![no_main]

use axum::http::HeaderValue;
use libfuzzer_sys::fuzz_target;
use mcp_gateway::stream::EventId;

fuzz_target!(|data: &[u8]| {
    // As `resume_point` reads the header: bytes outside visible ASCII are refused first.
    if let Ok(value) = HeaderValue::from_bytes(data)
        && let Ok(text) = value.to_str()
    {
        parsed(text);
    }
    // And any text, for ids that a future reader might take from elsewhere.
    if let Ok(text) = std::str::from_utf8(data) {
        parsed(text);
    }
    written(data);
});

fn parsed(text: &str) {
    let Ok(id) = EventId::parse(text) else { return };
    assert_eq!(id.to_string(), text);
    let mut out = Vec::new();
    id.write_to(&mut out);
    assert_eq!(out, text.as_bytes());
}

/// An id built from the input's bytes writes out and parses back to itself.
fn written(data: &[u8]) {
    let mut bytes = [0u8; 29];
    let n = data.len().min(bytes.len());
    bytes[..n].copy_from_slice(&data[..n]);
    let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
    let id = EventId {
        tag: u32::from_le_bytes(bytes[0..4].try_into().unwrap()),
        stream: u64_at(4),
        seq: u64_at(12),
        prime: (bytes[28] & 1 == 1).then(|| u64_at(20)),
    };
    let text = id.to_string();
    assert_eq!(EventId::parse(&text), Ok(id), "{text}");
}
