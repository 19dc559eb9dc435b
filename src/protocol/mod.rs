//! What the gateway knows of MCP itself: protocol versions, their negotiation (a client's
//! `initialize`, the `MCP-Protocol-Version` header), and the era a request belongs to. It
//! holds no state and does no I/O.

pub mod challenge;
pub mod era;
pub mod modern;
pub mod mrtr;
pub mod param_headers;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::jsonrpc;

/// Versions the gateway speaks to HTTP clients, newest first.
pub const CLIENT_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26"];

/// Versions the gateway accepts from stdio plugins, newest first. 2024-11-05 predates
/// Streamable HTTP but is still what many stdio servers speak; over stdio it is compatible.
pub const PLUGIN_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// The syslog severities MCP uses for log messages, least severe first.
pub const LOG_LEVELS: &[&str] = &[
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
];

/// The newest version the gateway speaks.
pub const LATEST: &str = CLIENT_VERSIONS[0];

/// The version the transport spec says to assume when a request carries no
/// `MCP-Protocol-Version` header and nothing else tells.
pub const DEFAULT_HTTP_VERSION: &str = "2025-03-26";

/// A client's `clientInfo` (an `Implementation`) as one short label, `name version`, for
/// logs, the audit log and the console: at most 128 bytes of each, `None` without a name.
pub fn client_label(info: &RawValue) -> Option<String> {
    #[derive(Deserialize)]
    struct Implementation<'a> {
        #[serde(borrow)]
        name: Option<std::borrow::Cow<'a, str>>,
        #[serde(borrow)]
        version: Option<std::borrow::Cow<'a, str>>,
    }
    let i: Implementation = serde_json::from_str(info.get()).ok()?;
    let cut = |s: &str, out: &mut String| {
        // Most labels are short printable ASCII, copied as they are.
        if s.len() <= 128 && s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            out.push_str(s);
        } else {
            out.extend(s.chars().filter(|c| !c.is_control()).take(128));
        }
    };
    let name = i.name?;
    let mut label =
        String::with_capacity(name.len() + 1 + i.version.as_ref().map_or(0, |v| v.len()));
    cut(&name, &mut label);
    if let Some(v) = i.version {
        label.push(' ');
        cut(&v, &mut label);
    }
    Some(label)
}

/// Lifecycle negotiation: echo the client's version when supported, else offer the latest.
pub fn negotiate(requested: &str) -> &'static str {
    CLIENT_VERSIONS
        .iter()
        .find(|v| **v == requested)
        .copied()
        .unwrap_or(LATEST)
}

/// Whether a session at this version may POST JSON-RPC batches (removed in 2025-06-18).
pub fn allows_batches(version: &str) -> bool {
    version == "2025-03-26"
}

/// Whether clients at this version get SSE priming events and `retry:` advice (SEP-1699,
/// 2025-11-25): older clients may fail on an event with empty data.
pub fn primes_streams(version: &str) -> bool {
    version >= "2025-11-25"
}

/// A comma-separated list of supported versions, for error messages.
pub fn supported_list() -> String {
    CLIENT_VERSIONS.join(", ")
}

/// Checks the `MCP-Protocol-Version` header of a request in a session negotiated at
/// `negotiated`: it must be a supported version and the session's. The transport's fallback
/// version ([`DEFAULT_HTTP_VERSION`], what a server assumes for a request without the header)
/// is accepted on any session: the official conformance suite sends it on sessions it
/// negotiated at 2025-11-25. The error says what was wrong.
pub fn check_version_header(value: &str, negotiated: &str) -> Result<(), String> {
    if !CLIENT_VERSIONS.contains(&value) {
        return Err(format!(
            "Unsupported protocol version: {value} (supported versions: {})",
            supported_list()
        ));
    }
    if value != negotiated && value != DEFAULT_HTTP_VERSION {
        return Err(format!(
            "MCP-Protocol-Version {value} is not the version negotiated for this session ({negotiated})"
        ));
    }
    Ok(())
}

/// A client's `initialize`, read: the version negotiated for it, and the params its
/// session's plugin instances are initialized with (the client's own capabilities and info,
/// at that version, on one line).
#[derive(Debug)]
pub struct ClientHello {
    pub version: &'static str,
    pub plugin_params: Box<RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct InitializeParams {
    protocol_version: String,
    capabilities: Box<RawValue>,
    client_info: Box<RawValue>,
}

/// Most bytes of a client's `capabilities` and `clientInfo` together that a session keeps
/// (for its plugins' `initialize`, again at each restart): without a bound, one client's
/// sessions could pin the body limit each, times its session cap.
pub const MAX_INITIALIZE_BYTES: usize = 64 * 1024;

/// Reads the params of a client's `initialize`; the error is an invalid-params message.
pub fn read_initialize(params: Option<&RawValue>) -> Result<ClientHello, String> {
    let p: InitializeParams = jsonrpc::params_as(params).map_err(|e| {
        format!("initialize needs protocolVersion, capabilities and clientInfo ({e})")
    })?;
    if !p.capabilities.get().starts_with('{') || !p.client_info.get().starts_with('{') {
        return Err("initialize: capabilities and clientInfo must be objects".into());
    }
    let kept = p.capabilities.get().len() + p.client_info.get().len();
    if kept > MAX_INITIALIZE_BYTES {
        return Err(format!(
            "initialize: capabilities and clientInfo hold {kept} bytes; a session keeps at most {MAX_INITIALIZE_BYTES}"
        ));
    }
    let version = negotiate(&p.protocol_version);
    let mut plugin_params = format!(
        r#"{{"protocolVersion":"{version}","capabilities":{},"clientInfo":{}}}"#,
        p.capabilities.get(),
        p.client_info.get()
    );
    // Plugins read one message per line: a client's pretty-printed params go on one line.
    if memchr::memchr2(b'\n', b'\r', plugin_params.as_bytes()).is_some() {
        plugin_params = plugin_params.replace(['\n', '\r'], " ");
    }
    Ok(ClientHello {
        version,
        plugin_params: RawValue::from_string(plugin_params).expect("valid JSON"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_echoes_or_offers_latest() {
        assert_eq!(negotiate("2025-06-18"), "2025-06-18");
        assert_eq!(negotiate("2025-03-26"), "2025-03-26");
        assert_eq!(negotiate("2024-11-05"), LATEST);
        assert_eq!(negotiate("2026-07-28"), LATEST);
        assert_eq!(negotiate("garbage"), LATEST);
    }

    #[test]
    fn version_header_must_be_the_sessions_or_the_fallback() {
        assert!(check_version_header("2025-06-18", "2025-06-18").is_ok());
        assert!(check_version_header(DEFAULT_HTTP_VERSION, "2025-11-25").is_ok());
        let e = check_version_header("2025-06-18", "2025-11-25").unwrap_err();
        assert!(e.contains("not the version negotiated"), "{e}");
        let e = check_version_header("2024-11-05", "2025-11-25").unwrap_err();
        assert!(
            e.contains("Unsupported protocol version: 2024-11-05"),
            "{e}"
        );
    }

    #[test]
    fn what_a_session_keeps_of_initialize_is_bounded() {
        let params = |experimental: &str| {
            RawValue::from_string(format!(
                r#"{{"protocolVersion":"2025-11-25","capabilities":{{"experimental":{{"x":"{experimental}"}}}},"clientInfo":{{"name":"c","version":"1"}}}}"#
            ))
            .unwrap()
        };
        assert!(read_initialize(Some(&params(&"a".repeat(60_000)))).is_ok());
        let e = read_initialize(Some(&params(&"a".repeat(70_000))))
            .err()
            .unwrap();
        assert!(e.contains("at most 65536"), "{e}");
    }

    #[test]
    fn initialize_params_go_to_plugins_on_one_line() {
        let params = RawValue::from_string(
            "{\n \"protocolVersion\": \"2025-06-18\",\n \"capabilities\": {\"roots\": {}},\n \"clientInfo\": {\"name\": \"c\"}}".into(),
        )
        .unwrap();
        let hello = read_initialize(Some(&params)).unwrap();
        assert_eq!(hello.version, "2025-06-18");
        assert_eq!(
            hello.plugin_params.get(),
            r#"{"protocolVersion":"2025-06-18","capabilities":{"roots": {}},"clientInfo":{"name": "c"}}"#
        );
        let old = RawValue::from_string(
            r#"{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{}}"#.into(),
        )
        .unwrap();
        assert_eq!(read_initialize(Some(&old)).unwrap().version, LATEST);
        let e = read_initialize(None).unwrap_err();
        assert!(e.contains("initialize needs protocolVersion"), "{e}");
        let list = RawValue::from_string(
            r#"{"protocolVersion":"2025-06-18","capabilities":[],"clientInfo":{}}"#.into(),
        )
        .unwrap();
        assert!(
            read_initialize(Some(&list))
                .unwrap_err()
                .contains("must be objects")
        );
    }

    #[test]
    fn a_client_label_is_name_and_version_without_control_characters() {
        let label = |json: &str| {
            client_label(&serde_json::value::RawValue::from_string(json.into()).unwrap())
        };
        assert_eq!(
            label(r#"{"name":"claude-ai","version":"0.1.0"}"#).as_deref(),
            Some("claude-ai 0.1.0")
        );
        assert_eq!(label(r#"{"name":"x"}"#).as_deref(), Some("x"));
        assert_eq!(label(r#"{"version":"1"}"#), None);
        // Control characters go, C1 ones included; each part keeps 128 characters.
        assert_eq!(
            label(r#"{"name":"a\nb\u0085c","version":"\u001b[31m2"}"#).as_deref(),
            Some("abc [31m2")
        );
        let long = "é".repeat(200);
        let cut = label(&format!(r#"{{"name":"{long}"}}"#)).unwrap();
        assert_eq!(cut.chars().count(), 128);
        let ascii = "n".repeat(200);
        let cut = label(&format!(r#"{{"name":"{ascii}","version":"1"}}"#)).unwrap();
        assert_eq!(cut, format!("{} 1", "n".repeat(128)));
    }
}
