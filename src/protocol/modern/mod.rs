//! The modern era (2026-07-28) as the gateway reads it from a request: the version, client
//! identity and capabilities in `params._meta`, and the HTTP headers that must mirror the body
//! (`MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`, with the Base64 sentinel form). What
//! is wrong becomes a [`ModernError`], whose code and data are the spec's; the HTTP layer only
//! maps it to a status.
//!
//! It reads only what it needs from `_meta` and never trusts a header over the body: a
//! header that disagrees with the body is refused, not preferred.
//!
//! Where things are: `meta` reads `_meta` (with the fields the headers mirror); this file
//! holds the errors, the header checks, and a legacy plugin's answers made modern.

use base64::Engine;

mod meta;
mod response;

pub use meta::{Declared, RequestMeta, declared_version, read_declared, read_meta, undeclared};
pub use response::{modernize_response, response_outcome};

/// The modern versions the gateway serves, newest first.
pub const MODERN_VERSIONS: &[&str] = &["2026-07-28"];

/// `_meta` keys of a modern request.
pub const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
pub const META_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
pub const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

/// The tasks extension's identifier (SEP-2663), in `capabilities.extensions`.
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// The methods of the tasks extension a modern client may call (`tasks/result` and
/// `tasks/list` are gone from it: not found).
pub const TASK_METHODS: &[&str] = &["tasks/get", "tasks/update", "tasks/cancel"];

/// JSON-RPC error codes of the modern era.
pub mod code {
    pub const HEADER_MISMATCH: i64 = -32020;
    pub const MISSING_REQUIRED_CLIENT_CAPABILITY: i64 = -32021;
    pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;
}

/// The methods a modern client may call on the gateway. Anything else, `initialize`, `ping`
/// and `logging/setLevel` included, is not found.
pub const METHODS: &[&str] = &[
    "server/discover",
    "tools/list",
    "tools/call",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "prompts/list",
    "prompts/get",
    "completion/complete",
    "subscriptions/listen",
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
];

/// The Base64 sentinel around an encoded header value.
const SENTINEL_START: &str = "=?base64?";
const SENTINEL_END: &str = "?=";

/// Why a modern request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModernError {
    /// A header is missing, malformed, or disagrees with the body (-32020).
    #[error("Header mismatch: {0}")]
    HeaderMismatch(String),
    /// The version in `_meta` is not one the gateway serves (-32022).
    #[error("Unsupported protocol version: {requested}")]
    UnsupportedVersion { requested: String },
    /// The method is not one the gateway serves in this era (-32601, 404).
    #[error("Method not found: {0}")]
    MethodNotFound(String),
    /// `_meta` is not what the spec says (-32602).
    #[error("Invalid params: {0}")]
    InvalidMeta(String),
    /// The request needs a capability its `_meta` does not declare (-32021); `required` is
    /// what it needs, shaped as a client declares capabilities.
    #[error("Missing required client capability: {what}")]
    MissingCapability {
        what: String,
        required: serde_json::Value,
    },
}

impl ModernError {
    /// -32021 naming the tasks extension.
    pub fn tasks_extension_missing() -> ModernError {
        ModernError::MissingCapability {
            what: format!("the {TASKS_EXTENSION} extension"),
            required: serde_json::json!({ "extensions": { TASKS_EXTENSION: {} } }),
        }
    }

    pub fn code(&self) -> i64 {
        match self {
            ModernError::HeaderMismatch(_) => code::HEADER_MISMATCH,
            ModernError::UnsupportedVersion { .. } => code::UNSUPPORTED_PROTOCOL_VERSION,
            ModernError::MethodNotFound(_) => crate::jsonrpc::code::METHOD_NOT_FOUND,
            ModernError::InvalidMeta(_) => crate::jsonrpc::code::INVALID_PARAMS,
            ModernError::MissingCapability { .. } => code::MISSING_REQUIRED_CLIENT_CAPABILITY,
        }
    }

    /// The error's `data`, where the spec gives it one.
    pub fn data(&self) -> Option<serde_json::Value> {
        match self {
            ModernError::UnsupportedVersion { requested } => Some(serde_json::json!({
                "supported": supported_versions(),
                "requested": requested,
            })),
            ModernError::MissingCapability { required, .. } => {
                Some(serde_json::json!({ "requiredCapabilities": required }))
            }
            _ => None,
        }
    }
}

/// Every version the gateway serves, modern and legacy, newest first (`server/discover`'s
/// `supportedVersions`, and the data of -32022).
pub fn supported_versions() -> Vec<&'static str> {
    MODERN_VERSIONS
        .iter()
        .chain(super::CLIENT_VERSIONS)
        .copied()
        .collect()
}

/// The headers a modern POST carries that mirror its body.
#[derive(Debug, Default, Clone, Copy)]
pub struct MirroredHeaders<'a> {
    pub protocol_version: Option<&'a [u8]>,
    pub method: Option<&'a [u8]>,
    pub name: Option<&'a [u8]>,
}

/// Checks that `MCP-Protocol-Version` equals the version in `_meta`. First of the header
/// checks: a version the gateway does not serve is refused after it (-32022) but before the
/// other headers, which a version the gateway does not know may define otherwise.
pub fn check_version_header(
    headers: MirroredHeaders<'_>,
    meta: &RequestMeta,
) -> Result<(), ModernError> {
    let mismatch = |s: String| Err(ModernError::HeaderMismatch(s));
    match headers.protocol_version {
        None => mismatch("the MCP-Protocol-Version header is required".into()),
        Some(v) if v != meta.declared.version.as_bytes() => mismatch(format!(
            "MCP-Protocol-Version header value '{}' does not match the body's protocol version '{}'",
            String::from_utf8_lossy(v),
            meta.declared.version
        )),
        Some(_) => Ok(()),
    }
}

/// Checks that the other standard headers mirror the body: `Mcp-Method` the method, and
/// `Mcp-Name` (decoded from its Base64 form) the `name` or `uri` of the requests that have
/// one, and the `taskId` of the tasks extension's. After [`check_version_header`].
pub fn check_headers(
    headers: MirroredHeaders<'_>,
    method: &str,
    meta: &RequestMeta,
) -> Result<(), ModernError> {
    let mismatch = |s: String| Err(ModernError::HeaderMismatch(s));
    match headers.method {
        None => return mismatch("the Mcp-Method header is required".into()),
        Some(m) if m != method.as_bytes() => {
            return mismatch(format!(
                "Mcp-Method header value '{}' does not match the body's method '{method}'",
                String::from_utf8_lossy(m)
            ));
        }
        Some(_) => {}
    }
    let field = match method {
        "tools/call" | "prompts/get" => "name",
        "resources/read" => "uri",
        // The tasks extension routes by task (`Mcp-Name` is the task id).
        m if TASK_METHODS.contains(&m) => "taskId",
        _ => return Ok(()),
    };
    let body_value = match field {
        "name" => &meta.name,
        "uri" => &meta.uri,
        _ => &meta.task_id,
    };
    let Some(body_value) = body_value else {
        // The body's own check (the router's) says what is missing.
        return Ok(());
    };
    let Some(header) = headers.name else {
        return mismatch(format!("the Mcp-Name header is required for {method}"));
    };
    let header = decode_header_value(header)
        .ok_or_else(|| ModernError::HeaderMismatch("the Mcp-Name header is malformed".into()))?;
    if header != *body_value {
        return mismatch(format!(
            "Mcp-Name header value '{header}' does not match body value '{body_value}'"
        ));
    }
    Ok(())
}

/// A mirrored header's value: as it is when plain, decoded when in the Base64 sentinel form;
/// `None` when it holds characters a header may not, or its Base64 or UTF-8 is bad.
pub fn decode_header_value(raw: &[u8]) -> Option<String> {
    if !raw.iter().all(|b| *b == b'\t' || (0x20..0x7f).contains(b)) {
        return None;
    }
    let text = std::str::from_utf8(raw).ok()?;
    match text
        .strip_prefix(SENTINEL_START)
        .and_then(|t| t.strip_suffix(SENTINEL_END))
    {
        Some(encoded) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .ok()?;
            String::from_utf8(bytes).ok()
        }
        None => Some(text.to_owned()),
    }
}

/// The methods whose complete results carry caching hints (2026-07-28 caching).
pub const CACHEABLE: &[&str] = &[
    "server/discover",
    "tools/list",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
    "resources/read",
];

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::value::RawValue;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    const META: &str = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"c","version":"1"},"io.modelcontextprotocol/clientCapabilities":{"elicitation":{}}}"#;

    fn params(rest: &str) -> Box<RawValue> {
        raw(&format!(r#"{{"_meta":{META}{rest}}}"#))
    }

    fn headers<'a>(v: &'a str, m: &'a str, n: Option<&'a str>) -> MirroredHeaders<'a> {
        MirroredHeaders {
            protocol_version: Some(v.as_bytes()),
            method: Some(m.as_bytes()),
            name: n.map(str::as_bytes),
        }
    }

    #[test]
    fn the_meta_is_read() {
        let p = params("");
        assert_eq!(declared_version(Some(&p)).as_deref(), Some("2026-07-28"));
        let meta = read_meta(Some(&p)).unwrap();
        assert_eq!(meta.declared.version, "2026-07-28");
        assert_eq!(
            meta.declared.capabilities_raw.as_ref().unwrap().get(),
            r#"{"elicitation":{}}"#
        );
        assert!(declared_version(Some(&raw(r#"{"name":"x"}"#))).is_none());
        // Objects only: serde would read a struct from an array by position.
        assert!(
            declared_version(Some(&raw(
                r#"[{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}]"#
            )))
            .is_none()
        );
        assert!(declared_version(Some(&raw(r#"{"_meta":["2026-07-28"]}"#))).is_none());
        assert!(declared_version(None).is_none());
        // clientInfo is optional; clientCapabilities is not.
        let lean = raw(
            r#"{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}"#,
        );
        assert_eq!(
            read_meta(Some(&lean))
                .unwrap()
                .declared
                .capabilities_raw
                .as_ref()
                .unwrap()
                .get(),
            "{}"
        );
        for (bad, why) in [
            (
                r#"{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/logLevel":"loud"}}"#,
                "logLevel",
            ),
            (
                r#"{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}"#,
                "clientCapabilities",
            ),
            (
                r#"{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":[]}}"#,
                "clientCapabilities",
            ),
            (
                r#"{"_meta":{"io.modelcontextprotocol/clientCapabilities":{}}}"#,
                "protocolVersion",
            ),
            (r#"{}"#, "_meta is required"),
            (r#"{"_meta":["2026-07-28",{}]}"#, "_meta must be an object"),
            (
                r#"[{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}]"#,
                "params must be an object",
            ),
        ] {
            match read_meta(Some(&raw(bad))) {
                Err(ModernError::InvalidMeta(m)) => assert!(m.contains(why), "{m}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
        assert!(matches!(read_meta(None), Err(ModernError::InvalidMeta(_))));
        // What routing reads of the params comes with it: the name (escapes decoded, a
        // non-string left out) and whether a task hint is there.
        let call = read_meta(Some(&params(r#","name":"a\u0062c","task":{"ttl":1}"#))).unwrap();
        assert_eq!(call.name.as_deref(), Some("abc"));
        assert!(call.task_hint);
        let call = read_meta(Some(&params(r#","name":7"#))).unwrap();
        assert_eq!(call.name, None);
        assert!(!call.task_hint);
        // A member the gateway reads, given twice, is refused (the plugin could read the other
        // one), and the error says so.
        match read_meta(Some(&params(r#","task":{},"task":{"ttl":1}"#))) {
            Err(ModernError::InvalidMeta(m)) => {
                assert!(m.contains("duplicate field `task`"), "{m}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn headers_must_mirror_the_body() {
        let p = params(r#","name":"get_weather""#);
        let meta = read_meta(Some(&p)).unwrap();
        let check = |h| {
            check_version_header(h, &meta)?;
            check_headers(h, "tools/call", &meta)
        };
        assert_eq!(
            check(headers("2026-07-28", "tools/call", Some("get_weather"))),
            Ok(())
        );
        let encoded = "=?base64?Z2V0X3dlYXRoZXI=?=";
        assert_eq!(
            check(headers("2026-07-28", "tools/call", Some(encoded))),
            Ok(())
        );
        for (h, why) in [
            (
                headers("2025-11-25", "tools/call", Some("get_weather")),
                "version",
            ),
            (
                headers("2026-07-28", "tools/list", Some("get_weather")),
                "method",
            ),
            (headers("2026-07-28", "tools/call", Some("other")), "name"),
            (headers("2026-07-28", "tools/call", None), "missing name"),
            (
                headers("2026-07-28", "tools/call", Some("=?base64?!!?=")),
                "bad base64",
            ),
            (
                MirroredHeaders {
                    protocol_version: None,
                    ..headers("2026-07-28", "tools/call", Some("get_weather"))
                },
                "missing version",
            ),
        ] {
            assert!(
                matches!(check(h), Err(ModernError::HeaderMismatch(_))),
                "{why}"
            );
        }
    }

    #[test]
    fn header_values_decode_only_from_the_exact_sentinel() {
        assert_eq!(decode_header_value(b"plain").as_deref(), Some("plain"));
        assert_eq!(
            decode_header_value(b"=?base64?SGVsbG8sIOS4lueVjA==?=").as_deref(),
            Some("Hello, 世界")
        );
        assert_eq!(
            decode_header_value(b"=?BASE64?SGk=?=").as_deref(),
            Some("=?BASE64?SGk=?=")
        );
        assert_eq!(decode_header_value(b"bad\x01"), None);
        assert_eq!(decode_header_value("é".as_bytes()), None);
    }

    #[test]
    fn an_unsupported_version_names_the_supported_ones() {
        let e = ModernError::UnsupportedVersion {
            requested: "1900-01-01".into(),
        };
        assert_eq!(e.code(), -32022);
        let data = e.data().unwrap();
        assert_eq!(data["requested"], "1900-01-01");
        assert_eq!(data["supported"][0], "2026-07-28");
    }
}
