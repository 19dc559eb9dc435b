//! A POST body to `/mcp`: the JSON-RPC envelope (one message or a batch), the era it belongs
//! to, and a client's `initialize` params as the gateway reads them.
//!
//! Invariants: a body is modern exactly when its first message is a request whose `_meta`
//! declares a version, whatever the session header; a refused body gets -32700, -32600 or (params no plugin could read, with the
//! request's id) -32602, and an error response that is JSON and
//! carries the id it could read; every accepted message, written again the way the gateway
//! writes it to a plugin (or back to the client), is one line of JSON that parses to the same
//! message; `initialize` params become the plugin's params on one line, at the negotiated
//! version, with the client's own capabilities and info.

#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_gateway::jsonrpc::{self, Body, Id, Message, Outcome, ParseError};
use mcp_gateway::protocol::{self, era};
use serde_json::value::RawValue;

fuzz_target!(|data: &[u8]| {
    let body = match jsonrpc::parse_body(data) {
        Ok(body) => body,
        Err(e) => return refused(&e),
    };
    let first = match &body {
        Body::Single(m) => Some(m),
        Body::Batch(v) => v.first(),
    };
    let declared = match first {
        Some(Message::Request { params, .. }) => {
            protocol::modern::declared_version(params.as_deref()).is_some()
        }
        _ => false,
    };
    // A modern `_meta` decides the era whatever the session header; otherwise the header does.
    let with_session = era::classify(Some("s"), None, &body);
    if declared {
        // With its `_meta` read in the same pass (or what is wrong with it).
        assert!(
            matches!(with_session, era::Era::Modern(Some(_))),
            "{with_session:?}"
        );
    } else {
        assert!(
            matches!(with_session, era::Era::Session("s")),
            "{with_session:?}"
        );
    }
    // Without a session, a modern `_meta` is modern too (and so may be other signs of it).
    let era = era::classify(None, None, &body);
    if declared {
        assert!(matches!(era, era::Era::Modern(Some(_))), "{era:?}");
    }
    let messages = match &body {
        Body::Single(m) => std::slice::from_ref(m),
        Body::Batch(v) => {
            assert!(!v.is_empty(), "an empty batch is refused");
            v.as_slice()
        }
    };
    if matches!(era, era::Era::Initialize) {
        assert_eq!(messages[0].method(), Some("initialize"));
    }
    for m in messages {
        rewritten(m);
        if let Message::Request { params, .. } = m {
            initialize(params.as_deref());
        }
    }
});

/// A refusal is a JSON-RPC error response with the id the client sent, when it could be read.
fn refused(e: &ParseError) {
    assert!(matches!(
        e.code(),
        jsonrpc::code::PARSE_ERROR | jsonrpc::code::INVALID_REQUEST | jsonrpc::code::INVALID_PARAMS
    ));
    // Params no plugin could read (`jsonrpc::limits`) are refused as a request's, with its id.
    if e.code() == jsonrpc::code::INVALID_PARAMS {
        assert!(
            e.id().is_some(),
            "an invalid-params refusal names its request"
        );
    }
    let bytes = jsonrpc::error_bytes(e.id(), e.code(), &e.message());
    match jsonrpc::parse_message(&bytes) {
        Ok(Message::Response {
            id,
            outcome: Outcome::Error(_),
        }) => assert_eq!(Some(&id), e.id()),
        // No id could be read: `"id": null`, which the parser (rightly) refuses to read back.
        Err(ParseError::Invalid { .. }) if e.id().is_none() => {
            let v: serde_json::Value = serde_json::from_slice(&bytes).expect("an error is JSON");
            assert!(v["id"].is_null() && v["error"]["code"] == e.code());
        }
        other => panic!("error response {bytes:?} reads back as {other:?}"),
    }
}

/// The message as the gateway writes it on: requests and notifications to a plugin (one line),
/// responses to the client with the id swapped.
fn rewritten(m: &Message) {
    match m {
        Message::Request { id, method, params } => {
            let line = jsonrpc::request_bytes(Some(id.raw()), method, params.as_deref());
            match one_line(&line) {
                Message::Request {
                    id: id2,
                    method: m2,
                    params: p2,
                } => {
                    assert_eq!(&id2, id);
                    assert_eq!(&m2, method);
                    same_params(params.as_deref(), p2.as_deref());
                }
                other => panic!("a request was rewritten as {other:?}"),
            }
        }
        Message::Notification { method, params } => {
            let line = jsonrpc::request_bytes(None, method, params.as_deref());
            match one_line(&line) {
                Message::Notification {
                    method: m2,
                    params: p2,
                } => {
                    assert_eq!(&m2, method);
                    same_params(params.as_deref(), p2.as_deref());
                }
                other => panic!("a notification was rewritten as {other:?}"),
            }
        }
        Message::Response { id, outcome } => {
            let swapped = Id::from_u64(7);
            let (bytes, body) = match outcome {
                Outcome::Result(r) => (jsonrpc::result_bytes(swapped.raw(), r), r),
                Outcome::Error(e) => (jsonrpc::error_object_bytes(swapped.raw(), e), e),
            };
            match jsonrpc::parse_message(&bytes) {
                Ok(Message::Response {
                    id: id2,
                    outcome: o2,
                }) => {
                    assert_eq!(id2, swapped, "the id of {id}");
                    let body2 = match o2 {
                        Outcome::Result(r) | Outcome::Error(r) => r,
                    };
                    assert_eq!(body2.get(), body.get());
                }
                other => panic!("a response was rewritten as {other:?}"),
            }
        }
    }
}

/// What goes to a plugin: one line that parses back.
fn one_line(line: &[u8]) -> Message {
    assert!(
        !line.contains(&b'\n') && !line.contains(&b'\r'),
        "a line to a plugin holds a line break: {:?}",
        String::from_utf8_lossy(line)
    );
    jsonrpc::parse_message(line).unwrap_or_else(|e| {
        panic!(
            "a line to a plugin does not parse ({e:?}): {:?}",
            String::from_utf8_lossy(line)
        )
    })
}

/// Params written on one line: the same text with line breaks (whitespace there) as spaces.
fn same_params(sent: Option<&RawValue>, written: Option<&RawValue>) {
    let flat = |p: Option<&RawValue>| p.map(|p| p.get().replace(['\n', '\r'], " "));
    assert_eq!(flat(sent), flat(written));
}

/// `initialize` params, read as the gateway reads them for a new session.
fn initialize(params: Option<&RawValue>) {
    let Ok(hello) = protocol::read_initialize(params) else {
        return;
    };
    assert!(protocol::CLIENT_VERSIONS.contains(&hello.version));
    let text = hello.plugin_params.get();
    assert!(
        !text.contains(['\n', '\r']),
        "plugin params hold a line break"
    );
    let Ok(sent) = jsonrpc::params_as::<serde_json::Map<String, serde_json::Value>>(params) else {
        // Nested too deep for a Value (issue 19, defect 8): nothing more to compare.
        return;
    };
    let written: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(text).expect("plugin params are JSON");
    assert_eq!(written["protocolVersion"], hello.version);
    assert_eq!(written["capabilities"], sent["capabilities"]);
    assert_eq!(written["clientInfo"], sent["clientInfo"]);
    assert_eq!(written.len(), 3, "only the three initialize params go on");
}
