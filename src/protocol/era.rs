//! The one place that decides which protocol era a POST belongs to.
//!
//! Legacy era (2025-03-26 .. 2025-11-25): an `initialize` handshake opens a session and every
//! later request names it with `Mcp-Session-Id`. Modern era (2026-07-28): no handshake, no
//! session; the version travels in each request's `_meta`, and that alone decides: a request
//! whose `_meta` declares a version is modern whatever its method and headers (2026-07-28
//! versioning, "Backward Compatibility": a dual-era server selects its behavior from how the
//! client opens). A request with neither a session nor a modern `_meta` is answered with a
//! plain 400 that is deliberately *not* a modern-era error.

use crate::jsonrpc::{Body, Message};

/// How a POST is to be served.
#[derive(Debug, PartialEq, Eq)]
pub enum Era<'a> {
    /// A legacy `initialize`: opens a new session.
    Initialize,
    /// A legacy request inside the named session.
    Session(&'a str),
    /// A modern-era (2026-07-28) request: its params' `_meta` declare a version. Whatever its
    /// method (`initialize` included) and whatever session header it carries.
    Modern,
    /// No session, no `initialize`, no modern `_meta`: a legacy client that forgot the
    /// session header, or a modern one that forgot its `_meta`. `modern` is true when the
    /// message hints at the modern era (`server/discover`).
    Sessionless { modern: bool },
}

/// Meta key a modern-era request carries its version in.
pub const MODERN_VERSION_META: &str = "io.modelcontextprotocol/protocolVersion";

/// Classifies a POST by its session header and body.
pub fn classify<'a>(session_header: Option<&'a str>, body: &Body) -> Era<'a> {
    let first = match body {
        Body::Single(m) => Some(m),
        Body::Batch(v) => v.first(),
    };
    if let Some(Message::Request { params, .. }) = first
        && super::modern::declared_version(params.as_deref()).is_some()
    {
        return Era::Modern;
    }
    if let Some(id) = session_header {
        return Era::Session(id);
    }
    let Some(first) = first else {
        return Era::Sessionless { modern: false };
    };
    if first.method() == Some("initialize") {
        return Era::Initialize;
    }
    Era::Sessionless {
        modern: looks_modern(first),
    }
}

fn looks_modern(m: &Message) -> bool {
    match m {
        Message::Request { method, params, .. } => {
            method == "server/discover"
                || params
                    .as_ref()
                    .is_some_and(|p| p.get().contains(MODERN_VERSION_META))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jsonrpc::parse_body;

    fn era(session: Option<&str>, body: &str) -> String {
        format!(
            "{:?}",
            classify(session, &parse_body(body.as_bytes()).unwrap())
        )
    }

    #[test]
    fn classification() {
        let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#;
        assert_eq!(era(None, init), "Initialize");
        assert_eq!(era(Some("abc"), init), "Session(\"abc\")");
        let discover = r#"{"jsonrpc":"2.0","id":1,"method":"server/discover"}"#;
        assert_eq!(era(None, discover), "Sessionless { modern: true }");
        let meta = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
        assert_eq!(era(None, meta), "Modern");
        assert_eq!(
            era(Some("abc"), meta),
            "Modern",
            "a session header is ignored"
        );
        // The method does not decide: modern `initialize` and `ping` are modern requests
        // (and then unknown methods).
        let modern_init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
        assert_eq!(era(None, modern_init), "Modern");
        // Only a string in `_meta` counts, not the key's name somewhere in the params.
        let text = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"io.modelcontextprotocol/protocolVersion"}}"#;
        assert_eq!(era(None, text), "Sessionless { modern: true }");
        let plain = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
        assert_eq!(era(None, plain), "Sessionless { modern: false }");
    }
}
