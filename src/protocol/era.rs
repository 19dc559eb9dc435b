//! The one place that decides which protocol era a POST belongs to.
//!
//! Legacy era (2025-03-26 .. 2025-11-25): an `initialize` handshake opens a session and every
//! later request names it with `Mcp-Session-Id`. Modern era (2026-07-28): no handshake, no
//! session; the version travels in each request's `_meta`, and that alone decides: a request
//! whose `_meta` declares a version is modern whatever its method and headers (2026-07-28
//! versioning, "Backward Compatibility": a dual-era server selects its behavior from how the
//! client opens). Without a session, a request that shows it means to be modern without
//! declaring a version in `_meta` (it is `server/discover`, names a modern `_meta` key, or
//! carries a modern `MCP-Protocol-Version` header) is modern too, and malformed: the modern
//! handler refuses it with -32602, HTTP 400, as the spec says of a `_meta` that lacks a
//! required field (2026-07-28 basic, "Per-request protocol fields"). Any other request with
//! neither a session nor a modern `_meta` is answered with a plain 400 that is deliberately
//! *not* a modern-era error.

use super::modern::{ModernError, RequestMeta};
use crate::jsonrpc::{Body, Message};

/// How a POST is to be served.
#[derive(Debug)]
pub enum Era<'a> {
    /// A legacy `initialize`: opens a new session.
    Initialize,
    /// A legacy request inside the named session.
    Session(&'a str),
    /// A modern-era (2026-07-28) request: its params' `_meta` declare a version, whatever its
    /// method (`initialize` included) and whatever session header it carries; or, without a
    /// session, it hints at the modern era without declaring one (its `_meta` is then refused
    /// as malformed). It carries the `_meta` its version was found in, read in the same pass
    /// (or what is wrong with it); `None` when no version was declared.
    Modern(Option<Result<RequestMeta, ModernError>>),
    /// No session, no `initialize`, no hint of the modern era: a legacy client that forgot
    /// the session header.
    Sessionless,
}

/// Meta key a modern-era request carries its version in.
pub const MODERN_VERSION_META: &str = "io.modelcontextprotocol/protocolVersion";

/// Classifies a POST by its session and `MCP-Protocol-Version` headers and its body.
pub fn classify<'a>(
    session_header: Option<&'a str>,
    version_header: Option<&[u8]>,
    body: &Body,
) -> Era<'a> {
    let first = match body {
        Body::Single(m) => Some(m),
        Body::Batch(v) => v.first(),
    };
    if let Some(Message::Request { params, .. }) = first
        && let Some(meta) = super::modern::read_declared(params.as_deref())
    {
        return Era::Modern(Some(meta));
    }
    if let Some(id) = session_header {
        return Era::Session(id);
    }
    let Some(first) = first else {
        return Era::Sessionless;
    };
    if first.method() == Some("initialize") {
        return Era::Initialize;
    }
    let modern_header = version_header.is_some_and(|v| {
        super::modern::MODERN_VERSIONS
            .iter()
            .any(|m| m.as_bytes() == v)
    });
    if first.is_request() && (modern_header || looks_modern(first)) {
        return Era::Modern(None);
    }
    Era::Sessionless
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
        era_with(session, None, body)
    }

    fn era_with(session: Option<&str>, version: Option<&str>, body: &str) -> String {
        match classify(
            session,
            version.map(str::as_bytes),
            &parse_body(body.as_bytes()).unwrap(),
        ) {
            // Whether `_meta` was read with the version is the next test's.
            Era::Modern(_) => "Modern".into(),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn classification() {
        let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#;
        assert_eq!(era(None, init), "Initialize");
        assert_eq!(era(Some("abc"), init), "Session(\"abc\")");
        let discover = r#"{"jsonrpc":"2.0","id":1,"method":"server/discover"}"#;
        assert_eq!(
            era(None, discover),
            "Modern",
            "refused for its missing _meta"
        );
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
        // ...though naming the key hints at the modern era: refused for its `_meta`.
        assert_eq!(era(None, text), "Modern");
        let plain = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
        assert_eq!(era(None, plain), "Sessionless");
        // A modern version header without `_meta`: a modern request missing its `_meta`.
        assert_eq!(era_with(None, Some("2026-07-28"), plain), "Modern");
        assert_eq!(era_with(None, Some("2025-11-25"), plain), "Sessionless");
        assert_eq!(
            era_with(Some("abc"), Some("2026-07-28"), plain),
            "Session(\"abc\")",
            "in a session, the header is the session's to check"
        );
        assert_eq!(
            era_with(None, Some("2026-07-28"), init),
            "Initialize",
            "a legacy initialize opens a session whatever the header says"
        );
        let note = r#"{"jsonrpc":"2.0","method":"notifications/x"}"#;
        assert_eq!(era_with(None, Some("2026-07-28"), note), "Sessionless");
    }

    #[test]
    fn a_declared_version_comes_with_its_meta_read() {
        let classify_body = |body: &str| {
            let parsed = parse_body(body.as_bytes()).unwrap();
            match classify(None, None, &parsed) {
                Era::Modern(read) => read.map(|r| r.map(|m| (m.declared.version.clone(), m.name))),
                other => panic!("{other:?}"),
            }
        };
        let call = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#;
        assert_eq!(
            classify_body(call),
            Some(Ok(("2026-07-28".into(), Some("t".into()))))
        );
        // Declared, so modern; what is wrong with the rest of `_meta` goes along.
        let bad = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
        assert!(matches!(
            classify_body(bad),
            Some(Err(ModernError::InvalidMeta(_)))
        ));
        // Told by a hint, not a declared version: the handler reads `_meta` to say why not.
        let hinted = r#"{"jsonrpc":"2.0","id":1,"method":"server/discover"}"#;
        assert_eq!(classify_body(hinted), None);
        // Params that do not read as a whole still declare their era, whatever the session
        // header says.
        let twice = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","name":"b","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#;
        assert!(matches!(
            classify_body(twice),
            Some(Err(ModernError::InvalidMeta(_)))
        ));
        assert_eq!(era(Some("abc"), twice), "Modern");
    }
}
