//! JSON-RPC 2.0 envelopes, parsed shallowly.
//!
//! The gateway reads only the envelope of a message (`jsonrpc`, `id`, `method`) and keeps
//! `params`, `result` and `error` as raw JSON text, so a plugin's result travels back to the
//! client as the bytes the plugin wrote with only the id swapped. This module never looks inside
//! params; callers that must rewrite a field (a tool name, a progress token) parse just that.

pub mod limits;
mod object;
pub mod scan;

pub use object::Object;

use std::fmt;

use bytes::Bytes;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// JSON-RPC and MCP error codes the gateway emits.
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
    /// Transport-level refusals (bad session, bad version header, ...), as the SDKs use it.
    pub const SERVER_ERROR: i64 = -32000;
    /// Unknown or ended session (the TypeScript SDK's code for it).
    pub const SESSION_NOT_FOUND: i64 = -32001;
    /// MCP: a resource URI nobody serves.
    pub const RESOURCE_NOT_FOUND: i64 = -32002;
    /// A request that took longer than allowed (the official SDKs' RequestTimeout).
    pub const REQUEST_TIMEOUT: i64 = -32001;
    /// MCP (2025-11-25): the request needs a URL mode elicitation completed first.
    pub const URL_ELICITATION_REQUIRED: i64 = -32042;
}

/// A request id: the raw JSON text of a string or an integer, validated on parse.
#[derive(Clone)]
pub struct Id(Box<RawValue>);

impl PartialEq for Id {
    fn eq(&self, other: &Id) -> bool {
        self.0.get() == other.0.get()
    }
}

impl Eq for Id {}

impl std::hash::Hash for Id {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.get().hash(state);
    }
}

impl Id {
    /// Validates that `raw` is a JSON string or integer, as JSON-RPC and MCP require.
    pub fn from_raw(raw: &RawValue) -> Result<Id, &'static str> {
        let text = raw.get();
        match text.as_bytes().first() {
            Some(b'"') => {}
            Some(b'-' | b'0'..=b'9') if text.contains(['.', 'e', 'E']) => {
                return Err("request id must be a string or an integer");
            }
            Some(b'-' | b'0'..=b'9') if text.len() > limits::MAX_NUMBER_CHARS => {
                return Err("request id is an integer too long to be read by every peer");
            }
            Some(b'-' | b'0'..=b'9') => {}
            _ => return Err("request id must be a string or an integer"),
        }
        Ok(Id(raw.to_owned()))
    }

    /// An integer id the gateway minted.
    pub fn from_u64(n: u64) -> Id {
        Id(RawValue::from_string(n.to_string()).expect("an integer is valid JSON"))
    }

    pub fn raw(&self) -> &RawValue {
        &self.0
    }

    /// The id as an integer, when it is one (ids the gateway minted always are).
    pub fn as_u64(&self) -> Option<u64> {
        self.0.get().parse().ok()
    }
}

impl fmt::Debug for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.get())
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.get())
    }
}

/// One JSON-RPC message, classified.
#[derive(Debug)]
pub enum Message {
    Request {
        id: Id,
        method: String,
        params: Option<Box<RawValue>>,
    },
    Notification {
        method: String,
        params: Option<Box<RawValue>>,
    },
    Response {
        id: Id,
        outcome: Outcome,
    },
}

/// The body of a response: the raw `result` or the raw `error` object.
#[derive(Debug)]
pub enum Outcome {
    Result(Box<RawValue>),
    Error(Box<RawValue>),
}

impl Message {
    pub fn method(&self) -> Option<&str> {
        match self {
            Message::Request { method, .. } | Message::Notification { method, .. } => Some(method),
            Message::Response { .. } => None,
        }
    }

    pub fn is_request(&self) -> bool {
        matches!(self, Message::Request { .. })
    }
}

/// Why a message could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// Not JSON at all (-32700).
    Syntax(String),
    /// JSON, but not a valid JSON-RPC message (-32600), with the id when it could be read.
    Invalid { reason: String, id: Option<Id> },
    /// A request whose params are JSON no plugin should be handed (-32602): see [`limits`].
    Params { reason: String, id: Id },
}

impl ParseError {
    pub fn code(&self) -> i64 {
        match self {
            ParseError::Syntax(_) => code::PARSE_ERROR,
            ParseError::Invalid { .. } => code::INVALID_REQUEST,
            ParseError::Params { .. } => code::INVALID_PARAMS,
        }
    }

    pub fn message(&self) -> String {
        match self {
            ParseError::Syntax(e) => format!("Parse error: {e}"),
            ParseError::Invalid { reason, .. } => format!("Invalid request: {reason}"),
            ParseError::Params { reason, .. } => format!("Invalid params: {reason}"),
        }
    }

    /// The same error, its reason naming the batch item it was found in.
    fn in_batch_item(self, i: usize) -> ParseError {
        match self {
            ParseError::Invalid { reason, id } => ParseError::Invalid {
                reason: format!("batch item {i}: {reason}"),
                id,
            },
            ParseError::Params { reason, id } => ParseError::Params {
                reason: format!("batch item {i}: {reason}"),
                id,
            },
            other => other,
        }
    }

    pub fn id(&self) -> Option<&Id> {
        match self {
            ParseError::Syntax(_) => None,
            ParseError::Invalid { id, .. } => id.as_ref(),
            ParseError::Params { id, .. } => Some(id),
        }
    }
}

/// The envelope as it appears on the wire. `id` keeps an explicit `null` (which `Option`
/// alone would fold into "absent") so that `"id": null` is refused rather than read as a
/// notification.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    jsonrpc: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    method: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    params: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    error: Option<&'a RawValue>,
}

fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// The body of a POST: one message or a batch (an array).
#[derive(Debug)]
pub enum Body {
    Single(Message),
    Batch(Vec<Message>),
}

/// Parses a POST body: a single message or, when the first character is `[`, a batch. What
/// a client sends is held to [`limits`] as well: the body is UTF-8, and what the gateway
/// would pass on (params, a response's result or error) is JSON every plugin can read.
pub fn parse_body(bytes: &[u8]) -> Result<Body, ParseError> {
    if let Err(e) = std::str::from_utf8(bytes) {
        return Err(ParseError::Syntax(format!(
            "the body is not valid UTF-8 (at byte {})",
            e.valid_up_to()
        )));
    }
    let body = parse_envelopes(bytes)?;
    match &body {
        Body::Single(m) => limits::check_message(m)?,
        Body::Batch(items) => {
            for (i, m) in items.iter().enumerate() {
                limits::check_message(m).map_err(|e| e.in_batch_item(i))?;
            }
        }
    }
    Ok(body)
}

fn parse_envelopes(bytes: &[u8]) -> Result<Body, ParseError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first == Some(&b'[') {
        let items: Vec<&RawValue> = serde_json::from_slice(bytes).map_err(|e| {
            if e.is_data() {
                ParseError::Invalid {
                    reason: e.to_string(),
                    id: None,
                }
            } else {
                ParseError::Syntax(e.to_string())
            }
        })?;
        if items.is_empty() {
            return Err(ParseError::Invalid {
                reason: "empty batch".into(),
                id: None,
            });
        }
        let mut messages = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            messages.push(parse_message(item.get().as_bytes()).map_err(|e| e.in_batch_item(i))?);
        }
        Ok(Body::Batch(messages))
    } else {
        parse_message(bytes).map(Body::Single)
    }
}

/// Parses one JSON-RPC message.
pub fn parse_message(bytes: &[u8]) -> Result<Message, ParseError> {
    let env: Envelope<'_> = match serde_json::from_slice(bytes) {
        Ok(env) => env,
        Err(e) if e.is_data() => {
            return Err(ParseError::Invalid {
                reason: data_error_reason(bytes, &e),
                id: None,
            });
        }
        Err(e) => return Err(ParseError::Syntax(e.to_string())),
    };
    let id = match env.id {
        None => None,
        Some(raw) => Some(Id::from_raw(raw).map_err(|reason| ParseError::Invalid {
            reason: reason.into(),
            id: None,
        })?),
    };
    let invalid = |reason: &str| ParseError::Invalid {
        reason: reason.into(),
        id: id.clone(),
    };
    if env.jsonrpc.map(RawValue::get) != Some("\"2.0\"") {
        return Err(invalid("\"jsonrpc\" must be \"2.0\""));
    }
    match (env.method, env.result, env.error) {
        (Some(method), None, None) => {
            let method: String = serde_json::from_str(method.get())
                .map_err(|_| invalid("\"method\" must be a string"))?;
            let params = match env.params {
                Some(p) if !matches!(p.get().as_bytes().first(), Some(b'{' | b'[')) => {
                    return Err(invalid("\"params\" must be an object or an array"));
                }
                p => p.map(RawValue::to_owned),
            };
            Ok(match id {
                Some(id) => Message::Request { id, method, params },
                None => Message::Notification { method, params },
            })
        }
        (None, Some(result), None) => match id {
            Some(id) => Ok(Message::Response {
                id,
                outcome: Outcome::Result(result.to_owned()),
            }),
            None => Err(invalid("a response needs an \"id\"")),
        },
        (None, None, Some(error)) => {
            if !error.get().starts_with('{') {
                return Err(invalid("\"error\" must be an object"));
            }
            match id {
                Some(id) => Ok(Message::Response {
                    id,
                    outcome: Outcome::Error(error.to_owned()),
                }),
                None => Err(invalid("a response needs an \"id\"")),
            }
        }
        (None, None, None) => Err(invalid(
            "a message needs \"method\" (request or notification) or \"result\"/\"error\" (response)",
        )),
        _ => Err(invalid(
            "a message has either \"method\", \"result\" or \"error\", not several",
        )),
    }
}

/// For a message that is JSON but not an envelope (an array where an object belongs, a
/// duplicate key), the best human reason.
fn data_error_reason(bytes: &[u8], e: &serde_json::Error) -> String {
    match serde_json::from_slice::<serde_json::Value>(bytes) {
        Ok(v) if !v.is_object() => "a JSON-RPC message must be a JSON object".into(),
        _ => e.to_string(),
    }
}

/// Serializes a response whose result is already JSON text.
pub fn result_bytes(id: &RawValue, result: &RawValue) -> Bytes {
    response_bytes(id, "result", result)
}

/// Serializes a response whose error object is already JSON text.
pub fn error_object_bytes(id: &RawValue, error: &RawValue) -> Bytes {
    response_bytes(id, "error", error)
}

fn response_bytes(id: &RawValue, key: &str, body: &RawValue) -> Bytes {
    let (id, body) = (id.get(), body.get());
    let mut out = String::with_capacity(36 + id.len() + body.len());
    out.push_str("{\"jsonrpc\":\"2.0\",\"id\":");
    out.push_str(id);
    out.push_str(",\"");
    out.push_str(key);
    out.push_str("\":");
    out.push_str(body);
    out.push('}');
    Bytes::from(out)
}

/// Serializes an error response; `id` is `None` when the request's id could not be read.
/// The id goes back as the exact text the client sent.
pub fn error_bytes(id: Option<&Id>, code: i64, message: &str) -> Bytes {
    let error = serde_json::json!({ "code": code, "message": message }).to_string();
    let error = RawValue::from_string(error).expect("valid JSON");
    let null = RawValue::from_string("null".into()).expect("valid JSON");
    error_object_bytes(id.map_or(&*null, Id::raw), &error)
}

/// Serializes a request or notification with raw params. `params` coming from a client may
/// hold newlines between tokens (pretty-printed JSON); newline-delimited stdio forbids them,
/// and outside strings they are plain whitespace, so they become spaces.
pub fn request_bytes(id: Option<&RawValue>, method: &str, params: Option<&RawValue>) -> Bytes {
    let method = serde_json::to_string(method).expect("a string serializes");
    let mut out = String::with_capacity(64 + method.len() + params.map_or(0, |p| p.get().len()));
    out.push_str("{\"jsonrpc\":\"2.0\",");
    if let Some(id) = id {
        out.push_str("\"id\":");
        out.push_str(id.get());
        out.push(',');
    }
    out.push_str("\"method\":");
    out.push_str(&method);
    if let Some(params) = params {
        out.push_str(",\"params\":");
        out.push_str(params.get());
    }
    out.push('}');
    if memchr::memchr2(b'\n', b'\r', out.as_bytes()).is_some() {
        out = out.replace(['\n', '\r'], " ");
    }
    Bytes::from(out)
}

/// Whether a tool's result says `isError: true` (read only where the name appears).
pub fn is_tool_error(result: &str) -> bool {
    #[derive(Deserialize)]
    struct Flag {
        #[serde(rename = "isError")]
        is_error: Option<bool>,
    }
    memchr::memmem::find(result.as_bytes(), b"\"isError\"").is_some()
        && serde_json::from_str::<Flag>(result)
            .ok()
            .and_then(|f| f.is_error)
            .unwrap_or(false)
}

/// Parses raw params into a typed value, mapping failure to an invalid-params message.
pub fn params_as<'a, T: Deserialize<'a>>(params: Option<&'a RawValue>) -> Result<T, String> {
    let text = params.map_or("{}", RawValue::get);
    serde_json::from_str(text).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_errors_are_read_from_the_result() {
        assert!(is_tool_error(r#"{"content":[],"isError":true}"#));
        assert!(is_tool_error(r#"{"isError" : true, "content":[]}"#));
        assert!(!is_tool_error(r#"{"content":[],"isError":false}"#));
        assert!(!is_tool_error(
            r#"{"content":[{"type":"text","text":"\"isError\""}]}"#
        ));
        assert!(!is_tool_error("not json"));
    }

    fn invalid(bytes: &str) -> String {
        match parse_message(bytes.as_bytes()) {
            Err(ParseError::Invalid { reason, .. }) => reason,
            other => panic!("expected invalid for {bytes}: {other:?}"),
        }
    }

    #[test]
    fn classifies_messages() {
        let m = parse_message(br#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#).unwrap();
        assert!(matches!(m, Message::Request { ref method, .. } if method == "ping"));
        let m =
            parse_message(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).unwrap();
        assert!(matches!(m, Message::Notification { .. }));
        let m = parse_message(br#"{"jsonrpc":"2.0","id":"a","result":{"x":[1, 2]}}"#).unwrap();
        match m {
            Message::Response {
                id,
                outcome: Outcome::Result(r),
            } => {
                assert_eq!(id.raw().get(), "\"a\"");
                assert_eq!(r.get(), r#"{"x":[1, 2]}"#);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn refuses_bad_envelopes() {
        assert!(invalid(r#"{"jsonrpc":"2.0","id":null,"method":"x"}"#).contains("id"));
        assert!(invalid(r#"{"jsonrpc":"2.0","id":1.5,"method":"x"}"#).contains("id"));
        assert!(invalid(r#"{"jsonrpc":"1.0","id":1,"method":"x"}"#).contains("2.0"));
        assert!(invalid(r#"{"id":1,"method":"x"}"#).contains("2.0"));
        assert!(invalid(r#"{"jsonrpc":"2.0","id":1,"method":3}"#).contains("method"));
        assert!(invalid(r#"{"jsonrpc":"2.0","id":1,"method":"x","params":3}"#).contains("params"));
        assert!(invalid(r#"{"jsonrpc":"2.0","id":1}"#).contains("method"));
        assert!(
            invalid(r#"{"jsonrpc":"2.0","id":1,"result":{},"error":{}}"#).contains("not several")
        );
        assert!(invalid(r#"[1]"#).contains("object"));
        assert!(invalid(r#""str""#).contains("object"));
    }

    #[test]
    fn keeps_the_id_of_an_invalid_request() {
        let e = parse_message(br#"{"jsonrpc":"1.0","id":"abc","method":"x"}"#).unwrap_err();
        assert_eq!(e.id().unwrap().raw().get(), "\"abc\"");
    }

    #[test]
    fn syntax_errors_are_parse_errors() {
        for bad in ["{", "{\"jsonrpc\":", "nope", ""] {
            assert_eq!(
                parse_message(bad.as_bytes()).unwrap_err().code(),
                code::PARSE_ERROR,
                "{bad}"
            );
        }
    }

    #[test]
    fn error_ids_come_back_verbatim() {
        let id = match parse_message(
            br#"{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"x"}"#,
        )
        .unwrap()
        {
            Message::Request { id, .. } => id,
            other => panic!("{other:?}"),
        };
        let bytes = error_bytes(Some(&id), code::METHOD_NOT_FOUND, "nope");
        assert!(
            std::str::from_utf8(&bytes)
                .unwrap()
                .contains("\"id\":123456789012345678901234567890,")
        );
        let v: serde_json::Value = serde_json::from_slice(&error_bytes(None, -1, "x")).unwrap();
        assert!(v["id"].is_null());
    }

    #[test]
    fn batches() {
        let b = parse_body(
            br#" [{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","method":"n"}]"#,
        )
        .unwrap();
        assert!(matches!(b, Body::Batch(ref v) if v.len() == 2));
        assert_eq!(parse_body(b"[]").unwrap_err().code(), code::INVALID_REQUEST);
        assert_eq!(parse_body(b"[{]").unwrap_err().code(), code::PARSE_ERROR);
    }

    #[test]
    fn builds_messages_without_newlines() {
        let params = RawValue::from_string("{\n  \"a\": \"x\\ny\"\n}".into()).unwrap();
        let bytes = request_bytes(Some(&Id::from_u64(3).0), "tools/call", Some(&params));
        let text = std::str::from_utf8(&bytes).unwrap();
        assert!(!text.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(v["params"]["a"], "x\ny");
        assert_eq!(v["id"], 3);
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_any_input(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let _ = parse_body(&bytes);
        }

        #[test]
        fn never_panics_on_json_like_input(s in r#"[\[\]{}":,0-9a-z \-.]{0,64}"#) {
            let _ = parse_body(s.as_bytes());
        }
    }
}
