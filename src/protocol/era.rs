//! The one place that decides which protocol era a POST belongs to.
//!
//! Legacy era (2025-03-26 .. 2025-11-25): an `initialize` handshake opens a session and every
//! later request names it with `Mcp-Session-Id`. Modern era (2026-07-28): no handshake, no
//! session; the version travels in each request's `_meta`. The gateway serves the legacy era
//! today; a modern request is answered with a plain 400 that is deliberately *not* a
//! modern-era error, so dual-era clients fall back to `initialize` (2026-07-28
//! streamable-http, "Backward Compatibility"). Serving the modern era natively replaces that
//! one arm.

use crate::jsonrpc::{Body, Message};

/// How a POST is to be served.
#[derive(Debug, PartialEq, Eq)]
pub enum Era<'a> {
    /// A legacy `initialize`: opens a new session.
    Initialize,
    /// A legacy request inside the named session.
    Session(&'a str),
    /// No session and no `initialize`: a modern-era request (or a client that forgot the
    /// session header). `modern` is true when the message says it is modern.
    Sessionless { modern: bool },
}

/// Meta key a modern-era request carries its version in.
pub const MODERN_VERSION_META: &str = "io.modelcontextprotocol/protocolVersion";

/// Classifies a POST by its session header and body.
pub fn classify<'a>(session_header: Option<&'a str>, body: &Body) -> Era<'a> {
    if let Some(id) = session_header {
        return Era::Session(id);
    }
    let first = match body {
        Body::Single(m) => m,
        Body::Batch(v) => match v.first() {
            Some(m) => m,
            None => return Era::Sessionless { modern: false },
        },
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
        assert_eq!(era(None, meta), "Sessionless { modern: true }");
        let plain = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
        assert_eq!(era(None, plain), "Sessionless { modern: false }");
    }
}
