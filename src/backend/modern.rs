//! Plugins of the modern era (2026-07-28) as the gateway's client side speaks to them: which
//! era a plugin speaks ([`Era`]), what `server/discover` answered ([`Discovered`]), the
//! `_meta` every request to a modern plugin carries ([`ClientMeta`], [`with_meta`]), and the
//! `InputRequiredResult` a modern plugin answers with when it needs the client's input
//! ([`is_input_required`], [`retry_params`]).
//!
//! Pure functions over JSON text: no I/O, no state. It never reads more of a message than the
//! field it is about, and leaves params that already declare a version exactly as they came
//! (a modern client's own `_meta` passes through).

use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use super::connection::InitializeResult;
use crate::config::PluginEra;
use crate::jsonrpc::scan::object_members;
use crate::protocol::modern::{
    META_CAPABILITIES, META_CLIENT_INFO, META_LOG_LEVEL, META_SERVER_INFO, META_VERSION,
    MODERN_VERSIONS, code,
};
use crate::protocol::{PLUGIN_VERSIONS, modern::declared_version};

/// The modern version the gateway speaks to plugins.
pub const MODERN_VERSION: &str = MODERN_VERSIONS[0];

/// The requests a modern plugin may answer with an `InputRequiredResult`.
pub const INPUT_METHODS: &[&str] = &["tools/call", "resources/read", "prompts/get"];

/// Which era a running plugin speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Era {
    /// Initialized with `initialize`; sends its own requests to the client.
    Legacy,
    /// 2026-07-28: no `initialize`, `_meta` on every request, `InputRequiredResult`s.
    Modern,
}

impl Era {
    /// The era a plugin's config pins, if it pins one.
    pub fn pinned(era: PluginEra) -> Option<Era> {
        match era {
            PluginEra::Auto => None,
            PluginEra::Legacy => Some(Era::Legacy),
            PluginEra::Modern => Some(Era::Modern),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Era::Legacy => "legacy",
            Era::Modern => "modern",
        }
    }
}

impl std::fmt::Display for Era {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a modern plugin is told of its client on each request: the `_meta` members for the
/// version, the client's info and its capabilities, as JSON text without the braces.
#[derive(Debug, Clone)]
pub struct ClientMeta(Box<str>);

#[derive(Deserialize)]
struct InitParams<'a> {
    #[serde(borrow)]
    capabilities: Option<&'a RawValue>,
    #[serde(borrow, rename = "clientInfo")]
    client_info: Option<&'a RawValue>,
}

impl ClientMeta {
    /// The members for a client known by its `initialize` params (a legacy session's, or the
    /// gateway's own): its capabilities and info, at the modern version.
    pub fn from_init_params(params: &RawValue) -> ClientMeta {
        fn object(v: Option<&RawValue>) -> Option<&str> {
            v.map(RawValue::get).filter(|t| t.starts_with('{'))
        }
        let p: Option<InitParams> = serde_json::from_str(params.get()).ok();
        let capabilities = p.as_ref().and_then(|p| object(p.capabilities));
        let info = p.as_ref().and_then(|p| object(p.client_info));
        let gateway = format!(
            r#"{{"name":"mcp-gateway","version":"{}"}}"#,
            env!("CARGO_PKG_VERSION")
        );
        ClientMeta(
            format!(
                r#""{META_VERSION}":"{MODERN_VERSION}","{META_CLIENT_INFO}":{},"{META_CAPABILITIES}":{}"#,
                info.unwrap_or(&gateway),
                capabilities.unwrap_or("{}")
            )
            .into(),
        )
    }

    /// The members, with a log level the request opts into (a legacy session's
    /// `logging/setLevel`, which a modern plugin takes per request).
    pub fn members(&self, log_level: Option<&str>) -> Cow<'_, str> {
        match log_level {
            None => Cow::Borrowed(&self.0),
            // A level is one of the spec's names: no escaping needed.
            Some(l) => Cow::Owned(format!(r#"{},"{META_LOG_LEVEL}":"{l}""#, self.0)),
        }
    }
}

#[derive(Deserialize)]
struct TopMeta<'a> {
    #[serde(borrow, rename = "_meta")]
    meta: Option<&'a RawValue>,
}

/// `params` with the `members` added to their `_meta` (those it does not have already);
/// `None` when the params go as they are: they declare a version already (a modern client's
/// request, passed through), or they are not an object (the plugin says what is wrong).
pub fn with_meta(params: Option<&RawValue>, members: &str) -> Option<Box<RawValue>> {
    if declared_version(params).is_some() {
        return None;
    }
    let text = params.map_or("{}", RawValue::get);
    let top: TopMeta = serde_json::from_str(text).ok()?;
    let out = match top.meta {
        None => {
            let rest = text.trim_start().strip_prefix('{')?;
            let comma = if rest.trim_start().starts_with('}') {
                ""
            } else {
                ","
            };
            format!(r#"{{"_meta":{{{members}}}{comma}{rest}"#)
        }
        Some(_) => {
            let mut value: serde_json::Value = serde_json::from_str(text).ok()?;
            let ours: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(&format!("{{{members}}}")).ok()?;
            let theirs = value.get_mut("_meta")?.as_object_mut()?;
            for (k, v) in ours {
                theirs.entry(k).or_insert(v);
            }
            value.to_string()
        }
    };
    RawValue::from_string(out).ok()
}

/// The members of `_meta` that make a request a modern one: a legacy plugin never gets them.
const ENVELOPE: [&str; 4] = [
    META_VERSION,
    META_CLIENT_INFO,
    META_CAPABILITIES,
    META_LOG_LEVEL,
];

/// `params` as a legacy plugin must get them: a modern client's request without the members
/// of its `_meta` that make it modern (a legacy plugin has the session's `initialize` for
/// them, and may refuse a request that carries them, as a dual-era server on the official
/// Python SDK does), its other `_meta` members (a progress token) kept; `None` when they go
/// as they are (no version declared: the text is read only when it names the member).
pub fn without_envelope(params: Option<&RawValue>) -> Option<Box<RawValue>> {
    let text = params?.get();
    // Every request to a legacy plugin comes here: a searcher made once (`str::contains`
    // builds one per call, as costly as the search).
    static VERSION: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(META_VERSION));
    VERSION.find(text.as_bytes())?;
    // Where the members are, without decoding anything (the arguments may be large): the
    // envelope's members are cut out of `_meta`'s text, the rest is copied as it came. A
    // name with an escape in it makes the scan give up, and serde reads the whole.
    let mut members: Vec<(Range<usize>, Range<usize>)> = Vec::new();
    if object_members(text.as_bytes(), |name, value| members.push((name, value))).is_none() {
        return without_envelope_read(text);
    }
    let at = members
        .iter()
        .position(|(name, _)| &text[name.clone()] == "_meta")?;
    let value = members[at].1.clone();
    let meta = &text[value.clone()];
    let mut kept: Vec<Range<usize>> = Vec::new();
    let mut cut = 0;
    if object_members(
        meta.as_bytes(),
        |name: Range<usize>, member: Range<usize>| {
            if ENVELOPE.contains(&&meta[name.clone()]) {
                cut += 1;
            } else {
                // From the name's opening quote to the end of its value.
                kept.push(name.start - 1..member.end);
            }
        },
    )
    .is_none()
    {
        return without_envelope_read(text);
    }
    if cut == 0 {
        return None;
    }
    let out = if !kept.is_empty() {
        let mut out = String::with_capacity(text.len());
        out.push_str(&text[..value.start]);
        out.push('{');
        for (i, r) in kept.into_iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&meta[r]);
        }
        out.push('}');
        out.push_str(&text[value.end..]);
        out
    } else if at > 0 {
        // From the end of the member before (its comma) to the end of `_meta`'s value.
        format!("{}{}", &text[..members[at - 1].1.end], &text[value.end..])
    } else if let Some((next, _)) = members.get(1) {
        // From `_meta`'s opening quote to the next member's.
        let start = members[0].0.start - 1;
        format!("{}{}", &text[..start], &text[next.start - 1..])
    } else {
        "{}".to_owned()
    };
    RawValue::from_string(out).ok()
}

/// [`without_envelope`] by reading the whole params, for text the scan gives up on (a member
/// name with an escape in it).
fn without_envelope_read(text: &str) -> Option<Box<RawValue>> {
    let mut value: serde_json::Value = serde_json::from_str(text).ok()?;
    let object = value.as_object_mut()?;
    let meta = object.get_mut("_meta")?.as_object_mut()?;
    if ENVELOPE.iter().filter_map(|k| meta.remove(*k)).count() == 0 {
        return None;
    }
    if meta.is_empty() {
        object.remove("_meta");
    }
    RawValue::from_string(value.to_string()).ok()
}

#[derive(Deserialize)]
struct Typed<'a> {
    #[serde(borrow, rename = "resultType")]
    result_type: Option<Cow<'a, str>>,
}

/// Whether a result is an `InputRequiredResult` (read only when the text names the type).
pub fn is_input_required(result: &RawValue) -> bool {
    result.get().contains("input_required")
        && serde_json::from_str::<Typed>(result.get())
            .is_ok_and(|t| t.result_type.as_deref() == Some("input_required"))
}

/// The retry of a request that was answered with an `InputRequiredResult`: the request's own
/// params with `inputResponses` (when there are any) and `requestState` (echoed exactly, when
/// the plugin gave one) in place of any earlier round's.
pub fn retry_params(
    original: Option<&RawValue>,
    responses: Option<&RawValue>,
    state: Option<&RawValue>,
) -> Option<Box<RawValue>> {
    let mut value: serde_json::Value =
        serde_json::from_str(original.map_or("{}", RawValue::get)).ok()?;
    let object = value.as_object_mut()?;
    object.remove("inputResponses");
    object.remove("requestState");
    if let Some(r) = responses {
        object.insert("inputResponses".into(), serde_json::from_str(r.get()).ok()?);
    }
    if let Some(s) = state {
        object.insert("requestState".into(), serde_json::from_str(s.get()).ok()?);
    }
    RawValue::from_string(value.to_string()).ok()
}

/// The params of the gateway's `server/discover` probe.
pub fn discover_params(meta: &ClientMeta) -> Box<RawValue> {
    RawValue::from_string(format!(r#"{{"_meta":{{{}}}}}"#, meta.members(None))).expect("valid JSON")
}

/// What a plugin's answer to `server/discover` says of its era (the stdio transport's
/// backward-compatibility rules).
#[derive(Debug)]
pub enum Discovered {
    /// A `DiscoverResult` that lists 2026-07-28: modern, and what it said of itself.
    Modern(InitializeResult),
    /// Modern, but not at 2026-07-28: the versions it supports (from a `DiscoverResult`, or
    /// an `UnsupportedProtocolVersionError`).
    OtherVersions(Vec<String>),
    /// Another modern error (a header mismatch, a capability it requires): modern, and it
    /// refused the probe.
    Refused(String),
    /// Any other answer: legacy, and why it looks so (for the logs).
    Legacy(String),
}

impl Discovered {
    /// Whether versions a modern plugin listed include a legacy one the gateway speaks: such
    /// a plugin is served through `initialize`.
    pub fn speaks_legacy(versions: &[String]) -> bool {
        versions
            .iter()
            .any(|v| PLUGIN_VERSIONS.contains(&v.as_str()))
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DiscoverResult {
    supported_versions: Vec<String>,
    capabilities: Option<Box<RawValue>>,
    #[serde(rename = "_meta")]
    meta: Option<HashMap<String, Box<RawValue>>>,
    instructions: Option<String>,
}

/// Reads a `server/discover` result.
pub fn read_discover_result(result: &RawValue) -> Discovered {
    let Ok(r) = serde_json::from_str::<DiscoverResult>(result.get()) else {
        return Discovered::Legacy("its answer to server/discover is not a DiscoverResult".into());
    };
    if !r.supported_versions.iter().any(|v| v == MODERN_VERSION) {
        return Discovered::OtherVersions(r.supported_versions);
    }
    let empty = || RawValue::from_string("{}".into()).expect("valid JSON");
    let server_info = r
        .meta
        .and_then(|mut m| m.remove(META_SERVER_INFO))
        .filter(|i| i.get().starts_with('{'))
        .unwrap_or_else(empty);
    Discovered::Modern(InitializeResult {
        protocol_version: MODERN_VERSION.to_owned(),
        capabilities: r
            .capabilities
            .filter(|c| c.get().starts_with('{'))
            .unwrap_or_else(empty),
        server_info,
        instructions: r.instructions,
    })
}

#[derive(Deserialize)]
struct ErrorObject {
    code: Option<i64>,
    data: Option<ErrorData>,
}

#[derive(Deserialize)]
struct ErrorData {
    supported: Option<Vec<String>>,
    #[serde(flatten)]
    _rest: HashMap<String, IgnoredAny>,
}

/// Reads a JSON-RPC error a plugin answered `server/discover` with (`error`, its raw error
/// object): only the spec's modern errors say modern; anything else says legacy, whatever
/// its code.
pub fn read_discover_error(error: &str) -> Discovered {
    let shown: String = error.chars().take(200).collect();
    let Ok(e) = serde_json::from_str::<ErrorObject>(error) else {
        return Discovered::Legacy(format!("it answered server/discover with {shown}"));
    };
    match (e.code, e.data.and_then(|d| d.supported)) {
        (Some(code::UNSUPPORTED_PROTOCOL_VERSION), Some(versions)) => {
            Discovered::OtherVersions(versions)
        }
        (Some(code::HEADER_MISMATCH | code::MISSING_REQUIRED_CLIENT_CAPABILITY), _) => {
            Discovered::Refused(format!("it refused server/discover: {shown}"))
        }
        _ => Discovered::Legacy(format!("it answered server/discover with {shown}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    fn meta() -> ClientMeta {
        ClientMeta::from_init_params(&raw(
            r#"{"protocolVersion":"2025-11-25","capabilities":{"elicitation":{}},"clientInfo":{"name":"c","version":"1"}}"#,
        ))
    }

    #[test]
    fn a_legacy_clients_request_gets_the_sessions_meta() {
        let m = meta();
        let members = m.members(Some("debug"));
        let v: serde_json::Value = serde_json::from_str(
            with_meta(Some(&raw(r#"{"name":"echo"}"#)), &members)
                .unwrap()
                .get(),
        )
        .unwrap();
        assert_eq!(v["name"], "echo");
        assert_eq!(v["_meta"][META_VERSION], "2026-07-28");
        assert_eq!(v["_meta"][META_CLIENT_INFO]["name"], "c");
        assert_eq!(
            v["_meta"][META_CAPABILITIES],
            serde_json::json!({"elicitation": {}})
        );
        assert_eq!(v["_meta"][META_LOG_LEVEL], "debug");

        // Its own `_meta` (a progress token) is kept beside.
        let v: serde_json::Value = serde_json::from_str(
            with_meta(Some(&raw(r#"{"_meta":{"progressToken":7}}"#)), &members)
                .unwrap()
                .get(),
        )
        .unwrap();
        assert_eq!(v["_meta"]["progressToken"], 7);
        assert_eq!(v["_meta"][META_VERSION], "2026-07-28");
        // No params at all, and empty ones.
        for p in [None, Some(raw("{ }"))] {
            let v: serde_json::Value =
                serde_json::from_str(with_meta(p.as_deref(), &members).unwrap().get()).unwrap();
            assert_eq!(v["_meta"][META_VERSION], "2026-07-28", "{p:?}");
        }
        assert!(with_meta(Some(&raw("[1]")), &members).is_none());
    }

    #[test]
    fn a_modern_clients_own_meta_passes_through() {
        let theirs = raw(
            r#"{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}},"name":"x"}"#,
        );
        assert!(with_meta(Some(&theirs), &meta().members(None)).is_none());
    }

    #[test]
    fn a_legacy_plugin_gets_a_modern_request_without_its_envelope() {
        let envelope = r#""io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"m","version":"1"},"io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/logLevel":"info""#;
        let theirs = raw(&format!(
            r#"{{"name":"x","_meta":{{{envelope},"progressToken":3,"io.modelcontextprotocol/related-task":{{"taskId":"t"}}}}}}"#
        ));
        let v: serde_json::Value =
            serde_json::from_str(without_envelope(Some(&theirs)).unwrap().get()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"name": "x", "_meta": {"progressToken": 3, "io.modelcontextprotocol/related-task": {"taskId": "t"}}})
        );
        // Nothing else left in `_meta`: no `_meta`.
        let only = raw(&format!(r#"{{"_meta":{{{envelope}}},"uri":"u"}}"#));
        let v: serde_json::Value =
            serde_json::from_str(without_envelope(Some(&only)).unwrap().get()).unwrap();
        assert_eq!(v, serde_json::json!({"uri": "u"}));
        // Last, or alone, it goes too; the other members stay as they were written.
        for (params, want) in [
            (
                format!(r#"{{"uri":"u", "_meta":{{{envelope}}}}}"#),
                r#"{"uri":"u"}"#,
            ),
            (format!(r#"{{"_meta":{{{envelope}}}}}"#), "{}"),
            (
                format!(r#"{{"a": [1, 2], "_meta":{{{envelope},"k":1}}, "b":{{}}}}"#),
                r#"{"a": [1, 2], "_meta":{"k":1}, "b":{}}"#,
            ),
            (
                format!(r#"{{"a\u0062":1,"_meta":{{{envelope}}}}}"#),
                r#"{"ab":1}"#,
            ),
        ] {
            assert_eq!(
                without_envelope(Some(&raw(&params))).unwrap().get(),
                want,
                "{params}"
            );
        }
        // A legacy client's request goes as it is.
        for p in [r#"{"name":"x","_meta":{"progressToken":1}}"#, "{}", "[1]"] {
            assert!(without_envelope(Some(&raw(p))).is_none(), "{p}");
        }
        assert!(without_envelope(None).is_none());
        // The version named elsewhere than in `_meta`: as it is.
        let arg = raw(r#"{"arguments":{"io.modelcontextprotocol/protocolVersion":"x"}}"#);
        assert!(without_envelope(Some(&arg)).is_none());
    }

    #[test]
    fn without_init_params_the_gateway_speaks_for_itself() {
        let m = ClientMeta::from_init_params(&raw("{}"));
        let v: serde_json::Value = serde_json::from_str(discover_params(&m).get()).unwrap();
        assert_eq!(v["_meta"][META_CLIENT_INFO]["name"], "mcp-gateway");
        assert_eq!(v["_meta"][META_CAPABILITIES], serde_json::json!({}));
    }

    #[test]
    fn input_required_is_told_by_its_type() {
        assert!(is_input_required(&raw(
            r#"{"resultType":"input_required","requestState":"s"}"#
        )));
        assert!(!is_input_required(&raw(r#"{"resultType":"complete"}"#)));
        assert!(!is_input_required(&raw(
            r#"{"content":[{"type":"text","text":"input_required"}]}"#
        )));
    }

    #[test]
    fn a_retry_carries_this_rounds_responses_and_state_only() {
        let first = retry_params(
            Some(&raw(r#"{"name":"t","_meta":{"k":1}}"#)),
            Some(&raw(r#"{"a":{"action":"accept"}}"#)),
            Some(&raw(r#""s1""#)),
        )
        .unwrap();
        let v: serde_json::Value = serde_json::from_str(first.get()).unwrap();
        assert_eq!(v["inputResponses"]["a"]["action"], "accept");
        assert_eq!(v["requestState"], "s1");
        assert_eq!(v["_meta"]["k"], 1);
        let second = retry_params(Some(&first), None, Some(&raw(r#""s2""#))).unwrap();
        let v: serde_json::Value = serde_json::from_str(second.get()).unwrap();
        assert!(v.get("inputResponses").is_none());
        assert_eq!(v["requestState"], "s2");
    }

    #[test]
    fn discover_answers_decide_the_era() {
        let modern = read_discover_result(&raw(
            r#"{"resultType":"complete","supportedVersions":["2026-07-28"],"capabilities":{"tools":{}},"_meta":{"io.modelcontextprotocol/serverInfo":{"name":"m","version":"1"}},"instructions":"hi","ttlMs":0,"cacheScope":"public"}"#,
        ));
        let Discovered::Modern(info) = modern else {
            panic!("{modern:?}")
        };
        assert_eq!(info.protocol_version, "2026-07-28");
        assert_eq!(info.capabilities.get(), r#"{"tools":{}}"#);
        assert_eq!(info.server_info.get(), r#"{"name":"m","version":"1"}"#);
        assert_eq!(info.instructions.as_deref(), Some("hi"));
        assert!(matches!(
            read_discover_result(&raw(r#"{"supportedVersions":["2027-01-01"],"capabilities":{}}"#)),
            Discovered::OtherVersions(v) if v == ["2027-01-01"]
        ));
        assert!(matches!(
            read_discover_result(&raw(r#"{"tools":[]}"#)),
            Discovered::Legacy(_)
        ));
        assert!(matches!(
            read_discover_error(r#"{"code":-32022,"message":"no","data":{"supported":["2027-01-01","2025-06-18"],"requested":"2026-07-28"}}"#),
            Discovered::OtherVersions(v) if Discovered::speaks_legacy(&v)
        ));
        assert!(matches!(
            read_discover_error(r#"{"code":-32021,"message":"needs roots"}"#),
            Discovered::Refused(_)
        ));
        // The fallback is never keyed to one code: -32601, -32602, -32022 without its data,
        // or anything else, is legacy.
        for e in [
            r#"{"code":-32601,"message":"Method not found"}"#,
            r#"{"code":-32602,"message":"not initialized"}"#,
            r#"{"code":-32022,"message":"odd"}"#,
            r#"{"code":-32000,"message":"Server not initialized"}"#,
            "not json",
        ] {
            assert!(
                matches!(read_discover_error(e), Discovered::Legacy(_)),
                "{e}"
            );
        }
        assert!(!Discovered::speaks_legacy(&["2027-01-01".to_owned()]));
    }
}
