//! What the HTTP transport must know of a message going upstream: whether it is a request
//! (and its id, whose answer ends its stream), a notification or an answer to the upstream's
//! own request; its era (a 2026-07-28 request carries its version in `_meta`); and the
//! headers the 2026-07-28 transport mirrors from its body (`Mcp-Method`, `Mcp-Name`, and the
//! `Mcp-Param-{Name}` of a tool's `x-mcp-header` parameters).

use std::collections::HashMap;

use base64::Engine;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::jsonrpc::{self, Message};
use crate::protocol::param_headers::{HeaderParam, header_params};

/// One message queued for the upstream, read.
pub struct Outgoing {
    pub bytes: Bytes,
    pub kind: Kind,
}

pub enum Kind {
    Request(Request),
    Notification {
        method: String,
        /// `notifications/cancelled`: the request it cancels (its id's JSON text).
        cancels: Option<String>,
    },
    /// An answer to the upstream's own request.
    Response,
}

pub struct Request {
    /// Its id's JSON text.
    pub id: String,
    pub method: String,
    /// `params.name` or `params.uri` of a `tools/call`, `resources/read`, `prompts/get`.
    pub name: Option<String>,
    /// The version in its `_meta`: a 2026-07-28 request.
    pub modern: Option<String>,
    /// A `tools/call`'s arguments (for `Mcp-Param-*`).
    pub arguments: Option<Value>,
    /// A `tools/call`'s tool.
    pub tool: Option<String>,
}

#[derive(Deserialize)]
struct Params<'a> {
    #[serde(borrow, default)]
    name: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    uri: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default, rename = "_meta")]
    meta: Option<&'a RawValue>,
    #[serde(default)]
    arguments: Option<Value>,
    #[serde(borrow, default, rename = "requestId")]
    request_id: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Meta<'a> {
    #[serde(borrow, default, rename = "io.modelcontextprotocol/protocolVersion")]
    version: Option<std::borrow::Cow<'a, str>>,
}

const NAMED: &[&str] = &["tools/call", "resources/read", "prompts/get"];

impl Outgoing {
    /// Reads a message the connection queued; `None` for something that is not one JSON-RPC
    /// message (never the case for what the connection writes).
    pub fn read(bytes: Bytes) -> Option<Outgoing> {
        let message = jsonrpc::parse_message(&bytes).ok()?;
        let kind = match message {
            Message::Request { id, method, params } => {
                let params: Option<Params<'_>> = params
                    .as_deref()
                    .and_then(|p| serde_json::from_str(p.get()).ok());
                let mut r = Request {
                    id: id.raw().get().to_owned(),
                    name: None,
                    modern: None,
                    arguments: None,
                    tool: None,
                    method,
                };
                if let Some(p) = params {
                    if NAMED.contains(&r.method.as_str()) {
                        r.name = p.name.as_deref().or(p.uri.as_deref()).map(str::to_owned);
                    }
                    r.modern = p
                        .meta
                        .and_then(|m| serde_json::from_str::<Meta<'_>>(m.get()).ok())
                        .and_then(|m| m.version)
                        .map(|v| v.into_owned());
                    if r.method == "tools/call" {
                        r.tool = p.name.map(|n| n.into_owned());
                        r.arguments = p.arguments;
                    }
                }
                Kind::Request(r)
            }
            Message::Notification { method, params } => {
                let cancels = (method == "notifications/cancelled")
                    .then(|| {
                        params
                            .as_deref()
                            .and_then(|p| serde_json::from_str::<Params<'_>>(p.get()).ok())
                            .and_then(|p| p.request_id.map(|r| r.get().to_owned()))
                    })
                    .flatten();
                Kind::Notification { method, cancels }
            }
            Message::Response { .. } => Kind::Response,
        };
        Some(Outgoing { bytes, kind })
    }

    pub fn request(&self) -> Option<&Request> {
        match &self.kind {
            Kind::Request(r) => Some(r),
            _ => None,
        }
    }
}

/// The tools' `x-mcp-header` parameters, learnt from the upstream's `tools/list` answers,
/// and the tools dropped from them for breaking the annotation rules.
#[derive(Default)]
pub struct ToolHeaders {
    params: HashMap<String, Vec<HeaderParam>>,
    rejected: std::collections::HashSet<String>,
    /// Whether a list was seen.
    pub listed: bool,
    /// The last list's `nextCursor`, for the transport's own listing to follow.
    pub next_cursor: Option<String>,
}

/// Most tools remembered (a hostile upstream's list is bounded).
const MAX_TOOLS: usize = 10_000;

/// What one `tools/list` answer teaches: each tool's header parameters, and the tools dropped.
#[derive(Default)]
pub struct Listed {
    params: Vec<(String, Vec<HeaderParam>)>,
    rejected: Vec<String>,
    next_cursor: Option<String>,
}

/// A `tools/list` response from the upstream (`message`, the whole JSON-RPC response) as the
/// gateway takes it: without the tools whose `x-mcp-header` annotations break the rules
/// (the 2026-07-28 Streamable HTTP transport has clients drop them, with a warning), and
/// what it teaches. Parsed outside any lock; `None` when it is no list.
pub fn screen_tools(plugin: &str, message: &[u8]) -> Option<(Option<Bytes>, Listed)> {
    let mut response: Value = serde_json::from_slice(message).ok()?;
    let tools = response
        .get_mut("result")?
        .get_mut("tools")?
        .as_array_mut()?;
    let mut listed = Listed::default();
    tools.retain(|t| {
        let name = t.get("name").and_then(Value::as_str).unwrap_or_default();
        let schema = t.get("inputSchema").unwrap_or(&Value::Null);
        if let Some(why) = crate::protocol::param_headers::invalid_annotation(schema) {
            tracing::warn!(
                plugin,
                tool = name,
                "the upstream's tool is left out: {why}"
            );
            listed.rejected.push(name.to_owned());
            return false;
        }
        listed.params.push((name.to_owned(), header_params(schema)));
        true
    });
    let rewritten = (!listed.rejected.is_empty())
        .then(|| serde_json::to_vec(&response).ok().map(Bytes::from))
        .flatten();
    Some((rewritten, listed))
}

impl ToolHeaders {
    /// Keeps what a `tools/list` answer taught.
    pub fn learn(&mut self, listed: Listed) {
        self.listed = true;
        self.next_cursor = listed.next_cursor;
        for (name, params) in listed.params {
            self.rejected.remove(&name);
            if params.is_empty() {
                self.params.remove(&name);
            } else if self.params.len() < MAX_TOOLS || self.params.contains_key(&name) {
                self.params.insert(name, params);
            }
        }
        for name in listed.rejected {
            self.params.remove(&name);
            if self.rejected.len() < MAX_TOOLS {
                self.rejected.insert(name);
            }
        }
    }

    /// Whether `tool` was dropped from the upstream's list.
    pub fn rejected(&self, tool: &str) -> bool {
        self.rejected.contains(tool)
    }

    /// The `Mcp-Param-{Name}` headers of a call of `tool` with `arguments`.
    pub fn headers(&self, tool: &str, arguments: Option<&Value>) -> Vec<(String, String)> {
        let Some(params) = self.params.get(tool) else {
            return Vec::new();
        };
        params
            .iter()
            .filter_map(|p| {
                let v = p.path.iter().try_fold(arguments?, |v, key| v.get(key))?;
                let text = match v {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.to_string(),
                    Value::Bool(b) => b.to_string(),
                    _ => return None,
                };
                Some((format!("Mcp-Param-{}", p.name), encode_header_value(&text)))
            })
            .collect()
    }
}

/// A value as a header may carry it: as it is when it is plain visible ASCII (spaces inside
/// allowed), else in the spec's Base64 sentinel form `=?base64?…?=`.
pub fn encode_header_value(value: &str) -> String {
    let plain = !value.is_empty()
        && value.bytes().all(|b| (0x20..0x7f).contains(&b))
        && !value.starts_with(' ')
        && !value.ends_with(' ')
        && !value.starts_with("=?base64?");
    if plain {
        value.to_owned()
    } else {
        format!(
            "=?base64?{}?=",
            base64::engine::general_purpose::STANDARD.encode(value)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::modern::decode_header_value;

    #[test]
    fn requests_notifications_and_answers_are_told_apart() {
        let o = Outgoing::read(Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"r":"eu"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
        ))
        .unwrap();
        let r = o.request().unwrap();
        assert_eq!(
            (r.id.as_str(), r.method.as_str(), r.name.as_deref()),
            ("7", "tools/call", Some("echo"))
        );
        assert_eq!(r.modern.as_deref(), Some("2026-07-28"));
        let o = Outgoing::read(Bytes::from_static(
            br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"a"}}"#,
        ))
        .unwrap();
        assert!(matches!(o.kind, Kind::Notification { cancels: Some(ref c), .. } if c == "\"a\""));
        let o = Outgoing::read(Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
        ))
        .unwrap();
        assert!(matches!(o.kind, Kind::Response));
        assert!(Outgoing::read(Bytes::from_static(b"garbage")).is_none());
    }

    #[test]
    fn header_values_round_trip() {
        for v in [
            "plain",
            "with space",
            " lead",
            "naïve",
            "=?base64?x?=",
            "a\nb",
            "",
        ] {
            let e = encode_header_value(v);
            assert_eq!(
                decode_header_value(e.as_bytes()).as_deref(),
                Some(v),
                "{v} -> {e}"
            );
        }
        assert_eq!(encode_header_value("eu-west"), "eu-west");
    }

    #[test]
    fn param_headers_come_from_the_listed_schema() {
        let mut t = ToolHeaders::default();
        let list = br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"q","inputSchema":{"type":"object","properties":{"region":{"type":"string","x-mcp-header":"Region"}}}},{"name":"bad","inputSchema":{"type":"object","properties":{"n":{"type":"number","x-mcp-header":"N"}}}}]}}"#;
        let (rewritten, listed) = screen_tools("p", list).unwrap();
        let rewritten: Value = serde_json::from_slice(&rewritten.unwrap()).unwrap();
        assert_eq!(rewritten["result"]["tools"].as_array().unwrap().len(), 1);
        t.learn(listed);
        assert!(t.rejected("bad") && !t.rejected("q"));
        let args = serde_json::json!({"region": "eu"});
        assert_eq!(
            t.headers("q", Some(&args)),
            vec![("Mcp-Param-Region".to_owned(), "eu".to_owned())]
        );
        assert!(t.headers("q", Some(&serde_json::json!({}))).is_empty());
        assert!(t.headers("other", Some(&args)).is_empty());
    }
}
