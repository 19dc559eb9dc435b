//! A legacy plugin's answer made a modern one ([`modernize_response`]): `resultType` on every
//! result, the caching hints on cacheable ones, the legacy "resource not found" code folded
//! into invalid params; and what a message is as an answer ([`response_outcome`]).

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::jsonrpc::scan;

/// The legacy "resource not found" code, which the modern era folds into invalid params.
const LEGACY_RESOURCE_NOT_FOUND: i64 = -32002;

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    result: Option<&'a RawValue>,
    #[serde(borrow)]
    error: Option<&'a RawValue>,
}

/// What a message is as an answer: `Ok` for a result, `Err` with its `error.code` for an
/// error (0 when it has none that reads); `None` for anything that is not a response (a
/// request, a notification, what does not parse).
pub fn response_outcome(bytes: &[u8]) -> Option<Result<(), i64>> {
    #[derive(Deserialize)]
    struct Error {
        code: i64,
    }
    let envelope = serde_json::from_slice::<Envelope>(bytes).ok()?;
    match (envelope.result, envelope.error) {
        (Some(_), _) => Some(Ok(())),
        (None, Some(e)) => Some(Err(
            serde_json::from_str::<Error>(e.get()).map_or(0, |e| e.code)
        )),
        (None, None) => None,
    }
}

/// A legacy plugin's response made a modern one: a result object gets `resultType:
/// "complete"` (unless it says its type itself) and, for `cache_scope` (a cacheable method),
/// the caching hints `ttlMs: 0` (no freshness is promised: the registry can change at any
/// time) and `cacheScope`; a -32002 error becomes -32602. An `InputRequiredResult` (the
/// bridge's, or a modern plugin's) is returned as it is, as is anything that does not parse
/// as a response.
pub fn modernize_response(bytes: &[u8], cache_scope: Option<&str>) -> Vec<u8> {
    // A result in the gateway's own layout (`jsonrpc::result_bytes`), which is every
    // response a plugin's answer becomes, is scanned; anything else is read in two passes.
    match laid_result(bytes) {
        Some((at, members)) => add_members(bytes, at, &members, cache_scope),
        None => modernize_read_twice(bytes, cache_scope),
    }
}

/// The members of a result object that [`modernize_response`] may add, as raw values: a
/// `null` is there, not absent.
#[derive(Deserialize, Default)]
struct Typed<'a> {
    #[serde(borrow, default, rename = "resultType", deserialize_with = "present")]
    result_type: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "ttlMs", deserialize_with = "present")]
    ttl: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "cacheScope", deserialize_with = "present")]
    scope: Option<&'a RawValue>,
}

/// A member that is there, `null` included (an `Option` alone reads `null` as absent, and a
/// second `resultType` would be added beside it).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// Which of the members [`modernize_response`] may add a result object has.
#[derive(Default, Debug, PartialEq)]
struct Members {
    result_type: bool,
    /// Its `resultType` is `"input_required"`.
    input_required: bool,
    ttl: bool,
    scope: bool,
}

impl From<&Typed<'_>> for Members {
    fn from(t: &Typed<'_>) -> Members {
        Members {
            result_type: t.result_type.is_some(),
            input_required: t
                .result_type
                .is_some_and(|t| t.get() == r#""input_required""#),
            ttl: t.ttl.is_some(),
            scope: t.scope.is_some(),
        }
    }
}

/// A response in the gateway's own layout, `{"jsonrpc":"2.0","id":ID,"result":{...}}` with an
/// id that is a number or a string without escapes: where its result's members begin, and
/// which of them [`modernize_response`] looks for it has, found by a scan of the text (valid
/// JSON: the gateway wrote it from what it parsed; [`scan`]). `None` for anything else, a
/// member name with an escape included, which the general reading takes.
fn laid_result(bytes: &[u8]) -> Option<(usize, Members)> {
    const HEAD: &[u8] = b"{\"jsonrpc\":\"2.0\",\"id\":";
    const AFTER_ID: &[u8] = b",\"result\":";
    let mut i = HEAD.len();
    if !bytes.starts_with(HEAD) {
        return None;
    }
    i = match *bytes.get(i)? {
        b'"' => scan::plain_string_end(bytes, i + 1)?,
        b'-' | b'0'..=b'9' => {
            i + 1
                + bytes[i + 1..]
                    .iter()
                    .take_while(|b| b.is_ascii_digit())
                    .count()
        }
        _ => return None,
    };
    if !bytes[i..].starts_with(AFTER_ID) || bytes.last() != Some(&b'}') {
        return None;
    }
    let result = i + AFTER_ID.len()..bytes.len() - 1;
    if bytes.get(result.start) != Some(&b'{') {
        return None;
    }
    let mut members = Members::default();
    scan::object_members(&bytes[result.clone()], |name, value| {
        let value = &bytes[result.start + value.start..result.start + value.end];
        match &bytes[result.start + name.start..result.start + name.end] {
            b"resultType" => {
                members.result_type = true;
                members.input_required = value == br#""input_required""#;
            }
            b"ttlMs" => members.ttl = true,
            b"cacheScope" => members.scope = true,
            _ => {}
        }
    })?;
    Some((result.start + 1, members))
}

/// `bytes` with `resultType` and the caching hints it lacks (`members`) added at `at`, just
/// inside the result object's opening brace; as they are for an `InputRequiredResult`.
fn add_members(bytes: &[u8], at: usize, members: &Members, cache_scope: Option<&str>) -> Vec<u8> {
    if members.input_required {
        return bytes.to_vec();
    }
    let mut fields = String::new();
    if !members.result_type {
        fields.push_str(r#""resultType":"complete","#);
    }
    if let Some(scope) = cache_scope {
        if !members.ttl {
            fields.push_str(r#""ttlMs":0,"#);
        }
        if !members.scope {
            fields.push_str(r#""cacheScope":""#);
            fields.push_str(scope);
            fields.push_str(r#"","#);
        }
    }
    if fields.is_empty() {
        return bytes.to_vec();
    }
    if bytes[at..].trim_ascii_start().starts_with(b"}") {
        fields.pop();
    }
    let mut out = Vec::with_capacity(bytes.len() + fields.len());
    out.extend_from_slice(&bytes[..at]);
    out.extend_from_slice(fields.as_bytes());
    out.extend_from_slice(&bytes[at..]);
    out
}

/// [`modernize_response`] for a response in any layout: the envelope read, then its result.
fn modernize_read_twice(bytes: &[u8], cache_scope: Option<&str>) -> Vec<u8> {
    let Ok(envelope) = serde_json::from_slice::<Envelope>(bytes) else {
        return bytes.to_vec();
    };
    if let Some(result) = envelope.result {
        let text = result.get();
        if !text.starts_with('{') {
            return bytes.to_vec();
        }
        let keys: Typed = serde_json::from_str(text).unwrap_or_default();
        // Where the result's object opens, in `bytes` (`result` borrows from it).
        let at = text.as_ptr() as usize - bytes.as_ptr() as usize + 1;
        return add_members(bytes, at, &Members::from(&keys), cache_scope);
    }
    if let Some(error) = envelope.error
        && let Ok(mut e) = serde_json::from_str::<serde_json::Value>(error.get())
        && e["code"] == LEGACY_RESOURCE_NOT_FOUND
    {
        e["code"] = crate::jsonrpc::code::INVALID_PARAMS.into();
        let at = error.get().as_ptr() as usize - bytes.as_ptr() as usize;
        let mut out = Vec::with_capacity(bytes.len() + 8);
        out.extend_from_slice(&bytes[..at]);
        out.extend_from_slice(e.to_string().as_bytes());
        out.extend_from_slice(&bytes[at + error.get().len()..]);
        return out;
    }
    bytes.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_legacy_response_is_made_modern() {
        let m =
            |b: &str, scope| String::from_utf8(modernize_response(b.as_bytes(), scope)).unwrap();
        assert_eq!(
            m(
                r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}"#,
                Some("public")
            ),
            r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","ttlMs":0,"cacheScope":"public","tools":[]}}"#
        );
        assert_eq!(
            m(r#"{"jsonrpc":"2.0","id":1,"result":{ }}"#, None),
            r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete" }}"#
        );
        let typed = r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required"}}"#;
        assert_eq!(m(typed, None), typed, "a type of its own is kept");
        // A member that is there as `null` is there: no second one is added beside it, in
        // the gateway's layout or another.
        for nulled in [
            r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":null}}"#,
            r#"{"result":{"resultType":null},"jsonrpc":"2.0","id":1}"#,
        ] {
            assert_eq!(m(nulled, None), nulled);
        }
        let escaped = r#"{"jsonrpc":"2.0","id":1,"result":{"result\u0054ype":"input_required"}}"#;
        assert_eq!(m(escaped, None), escaped, "even behind an escape");
        let hinted = r#"{"jsonrpc":"2.0","id":1,"result":{"ttlMs":5,"tools":[]}}"#;
        assert_eq!(
            m(hinted, Some("public")),
            r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","cacheScope":"public","ttlMs":5,"tools":[]}}"#,
            "a hint of its own is kept"
        );
        assert_eq!(
            m(typed, Some("public")),
            typed,
            "an InputRequiredResult gets no caching hints"
        );
        let v: serde_json::Value = serde_json::from_str(&m(
            r#"{"jsonrpc":"2.0","id":"a","error":{"code":-32002,"message":"no such resource"}}"#,
            None,
        ))
        .unwrap();
        assert_eq!(v["error"]["code"], -32602);
        assert_eq!(v["error"]["message"], "no such resource");
        assert_eq!(m("not json", None), "not json");
        // Laid out otherwise than the gateway lays out responses: read in two passes, the same
        // members added.
        use serde_json::json;
        for (other, id) in [
            (
                r#"{"result":{"tools":[]},"id":1,"jsonrpc":"2.0"}"#,
                json!(1),
            ),
            (
                r#"{"jsonrpc":"2.0","id":"a,\"result\":{", "result":{"tools":[]}}"#,
                json!("a,\"result\":{"),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1 ,"result":{"tools":[]}}"#,
                json!(1),
            ),
        ] {
            let v: serde_json::Value = serde_json::from_str(&m(other, Some("private"))).unwrap();
            assert_eq!(v["id"], id, "{other}");
            assert_eq!(v["result"]["resultType"], "complete", "{other}");
            assert_eq!(v["result"]["cacheScope"], "private", "{other}");
        }
        let list = r#"{"jsonrpc":"2.0","id":1,"result":["not an object"]}"#;
        assert_eq!(m(list, None), list);
    }

    #[test]
    fn a_message_is_read_as_an_answer() {
        let outcome = |b: &str| response_outcome(b.as_bytes());
        assert_eq!(
            outcome(r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32021,"message":"x","data":{}}}"#),
            Some(Err(-32021))
        );
        assert_eq!(
            outcome(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#),
            Some(Ok(()))
        );
        assert_eq!(
            outcome(r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#),
            None
        );
        assert_eq!(
            outcome(r#"{"jsonrpc":"2.0","id":3,"method":"elicitation/create","params":{}}"#),
            None
        );
        assert_eq!(outcome("not json"), None);
    }

    proptest::proptest! {
        /// The scan of a result in the gateway's own layout adds what the general reading
        /// adds, whatever the result's members, their values and the white space between.
        #[test]
        fn the_scan_and_the_general_reading_agree(
            members in proptest::collection::btree_map(
                proptest::sample::select(vec![
                    "resultType", "ttlMs", "cacheScope", "content", "x", r"result\u0054ype", "",
                ]),
                proptest::sample::select(vec![
                    r#""complete""#, r#""input_required""#, "0", "-5", "null", "true",
                    r#"[1,{"a":"}"}]"#, r#"{"k":"v\",]"}"#, r#""s,}""#, "[]", "{}",
                ]),
                0..5,
            ),
            space in proptest::sample::select(vec!["", " ", "\n  "]),
            id in proptest::sample::select(vec!["1", "-12", r#""a""#, r#""b,\"result\":{""#]),
            scope in proptest::option::of(proptest::sample::select(vec!["public", "private"])),
        ) {
            let result = members
                .iter()
                .map(|(k, v)| format!(r#"{space}"{k}"{space}:{space}{v}{space}"#))
                .collect::<Vec<_>>()
                .join(",");
            let bytes = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{{result}}}}}"#);
            proptest::prop_assert_eq!(
                String::from_utf8(modernize_response(bytes.as_bytes(), scope)).unwrap(),
                String::from_utf8(modernize_read_twice(bytes.as_bytes(), scope)).unwrap(),
                "{}", bytes
            );
        }
    }
}
