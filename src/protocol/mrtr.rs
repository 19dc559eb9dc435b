//! Multi round-trip requests (2026-07-28, `basic/patterns/mrtr.mdx`) as the gateway reads and
//! writes them: which requests may be answered with an `InputRequiredResult` and which
//! requests it may carry, what a retry brings back (`inputResponses`, `requestState`), the
//! digest that ties a retry to the request it retries, and the sealed `requestState` itself.
//!
//! The state is the gateway's own: a few claims (whose call it is, until when, for which
//! request, which parked call on which replica, and the round's nonce) sealed with
//! XChaCha20-Poly1305 under a key all replicas share. A client can neither read nor change
//! it: a changed byte fails the seal, and the state is refused whole. Nothing here keeps
//! state or does I/O; the key is handed in.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

/// The client requests a server may answer with an `InputRequiredResult`.
pub const BRIDGED_METHODS: &[&str] = &["tools/call", "resources/read", "prompts/get"];

/// The server-to-client requests an `InputRequiredResult` may carry, with the capability
/// each needs.
pub const INPUT_METHODS: &[(&str, &str)] = &[
    ("sampling/createMessage", "sampling"),
    ("elicitation/create", "elicitation"),
    ("roots/list", "roots"),
];

/// The longest `requestState` read: the gateway's own are a few hundred characters.
const MAX_STATE_CHARS: usize = 2048;

/// Bound into the seal, so no other use of the key can be taken for a request state.
const AAD: &[u8] = b"mcp-gateway requestState v1";

const NONCE_LEN: usize = 24;

/// The key `requestState` is sealed with.
pub struct StateKey(XChaCha20Poly1305);

impl std::fmt::Debug for StateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateKey(***)")
    }
}

/// What a `requestState` binds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateClaims {
    /// The caller: the token's subject, or none for the anonymous caller.
    #[serde(rename = "c")]
    pub caller: Option<String>,
    /// When it lapses, in milliseconds since the Unix epoch.
    #[serde(rename = "e")]
    pub expires_ms: u64,
    /// [`request_digest`] of the request it belongs to.
    #[serde(rename = "d")]
    pub digest: String,
    /// The replica that holds the parked call.
    #[serde(rename = "r")]
    pub replica: String,
    /// The parked call, in that replica's table.
    #[serde(rename = "i")]
    pub call: u64,
    /// This round's nonce: a parked call is resumed by the state of its last round, once.
    #[serde(rename = "n")]
    pub nonce: u64,
    /// No call is parked: the retry runs the request afresh (a round the gateway asked
    /// itself, such as connecting a credential, which is done once the person has).
    #[serde(rename = "f", default, skip_serializing_if = "std::ops::Not::not")]
    pub fresh: bool,
}

/// Why a `requestState` was not accepted. The messages are for the client: they never say
/// more than that the state is not good.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// Not a state this gateway made: malformed, or the seal does not hold.
    #[error("requestState is not valid: it was changed, or not issued by this server")]
    Invalid,
}

impl StateKey {
    pub fn new(secret: &[u8; 32]) -> StateKey {
        StateKey(XChaCha20Poly1305::new(secret.into()))
    }

    /// The claims sealed: base64url of a random nonce and the ciphertext.
    pub fn seal(&self, claims: &StateClaims) -> String {
        let nonce: [u8; NONCE_LEN] = rand::random();
        let plain = serde_json::to_vec(claims).expect("claims serialize");
        let sealed = self
            .0
            .encrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: &plain,
                    aad: AAD,
                },
            )
            .expect("sealing in memory does not fail");
        let mut out = Vec::with_capacity(NONCE_LEN + sealed.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        URL_SAFE_NO_PAD.encode(out)
    }

    /// The claims of a state this key sealed.
    pub fn open(&self, state: &str) -> Result<StateClaims, StateError> {
        if state.len() > MAX_STATE_CHARS {
            return Err(StateError::Invalid);
        }
        let bytes = URL_SAFE_NO_PAD
            .decode(state)
            .map_err(|_| StateError::Invalid)?;
        if bytes.len() <= NONCE_LEN {
            return Err(StateError::Invalid);
        }
        let (nonce, sealed) = bytes.split_at(NONCE_LEN);
        let nonce: [u8; NONCE_LEN] = nonce.try_into().expect("split at its length");
        let plain = self
            .0
            .decrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: sealed,
                    aad: AAD,
                },
            )
            .map_err(|_| StateError::Invalid)?;
        serde_json::from_slice(&plain).map_err(|_| StateError::Invalid)
    }
}

/// What a retry carries besides its request.
#[derive(Debug, Default)]
pub struct Retry {
    /// `requestState`, when present.
    pub state: Option<String>,
    /// `inputResponses` by key, when present.
    pub responses: HashMap<String, Box<RawValue>>,
}

/// Reads `requestState` and `inputResponses` from a request's params. `inputResponses` is
/// only read with a state: without one there is nothing it can answer, and the request is a
/// first one. The error is the message of an invalid-params refusal.
pub fn read_retry(params: Option<&RawValue>) -> Result<Retry, String> {
    let Some(params) = params.filter(|p| may_name(p, &REQUEST_STATE)) else {
        return Ok(Retry::default());
    };
    // The top level as raw values: a `null` is there, not absent.
    let Ok(p) = serde_json::from_str::<HashMap<Cow<str>, &RawValue>>(params.get()) else {
        return Ok(Retry::default());
    };
    let Some(state) = p.get("requestState") else {
        return Ok(Retry::default());
    };
    let state: String = serde_json::from_str(state.get())
        .map_err(|_| "requestState must be a string".to_owned())?;
    let responses = match p.get("inputResponses") {
        None => HashMap::new(),
        Some(raw) => serde_json::from_str::<HashMap<String, Box<RawValue>>>(raw.get())
            .ok()
            .filter(|m| m.values().all(|v| v.get().starts_with('{')))
            .ok_or_else(|| {
                "inputResponses must be an object whose values are the results asked for (objects)"
                    .to_owned()
            })?,
    };
    Ok(Retry {
        state: Some(state),
        responses,
    })
}

/// Whether `params` may have a member named `key`: its name appears as it is, or some text
/// is escaped (a name could be written with escapes). Most requests have neither, and are
/// not parsed for it.
fn may_name(params: &RawValue, key: &memchr::memmem::Finder<'static>) -> bool {
    let text = params.get().as_bytes();
    memchr::memchr(b'\\', text).is_some() || key.find(text).is_some()
}

/// The member names [`may_name`] looks for, their searchers made once.
static REQUEST_STATE: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new("requestState"));
static INPUT_RESPONSES: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new("inputResponses"));

/// The answers a first request (one without `requestState`) carries in `inputResponses`:
/// those that are objects, by key; anything else there is ignored (a client may answer
/// before it is asked, and a server uses what it recognizes).
pub fn offered_responses(params: Option<&RawValue>) -> HashMap<String, Box<RawValue>> {
    #[derive(Deserialize)]
    struct Offered {
        #[serde(rename = "inputResponses")]
        responses: Option<HashMap<String, Box<RawValue>>>,
    }
    params
        .filter(|p| may_name(p, &INPUT_RESPONSES))
        .and_then(|p| serde_json::from_str::<Offered>(p.get()).ok())
        .and_then(|o| o.responses)
        .unwrap_or_default()
        .into_iter()
        .filter(|(_, v)| v.get().starts_with('{'))
        .collect()
}

/// The request a retry must repeat, as a digest (SHA-256, hex): the method and its params
/// without `_meta`, `inputResponses` and `requestState`, objects' keys in order, so the same
/// request sent again with its keys in another order is the same request.
pub fn request_digest(method: &str, params: Option<&RawValue>) -> String {
    let mut value: Value = params
        .and_then(|p| serde_json::from_str(p.get()).ok())
        .unwrap_or(Value::Null);
    if let Some(object) = value.as_object_mut() {
        for key in ["_meta", "inputResponses", "requestState"] {
            object.remove(key);
        }
    }
    let mut text = String::with_capacity(params.map_or(0, |p| p.get().len()) + method.len() + 1);
    text.push_str(method);
    text.push('\n');
    canonical(&value, &mut text);
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(64);
    for b in Sha256::digest(text.as_bytes()) {
        hex.push(char::from(HEX[usize::from(b >> 4)]));
        hex.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    hex
}

/// JSON with every object's keys sorted.
fn canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let sorted: BTreeMap<&String, &Value> = map.iter().collect();
            out.push('{');
            for (i, (k, v)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(v, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// The capability an input request needs that `declared` (the client's
/// `clientCapabilities`) lacks, named as the spec names it (`elicitation`,
/// `elicitation.url`, `sampling.tools`, ...); `None` when the client declared it.
pub fn missing_capability(
    method: &str,
    params: Option<&RawValue>,
    declared: Option<&RawValue>,
) -> Option<String> {
    let (_, capability) = INPUT_METHODS.iter().find(|(m, _)| *m == method)?;
    let declared: Value = declared
        .and_then(|d| serde_json::from_str(d.get()).ok())
        .unwrap_or(Value::Null);
    let Some(cap) = declared.get(*capability).filter(|c| c.is_object()) else {
        return Some((*capability).to_owned());
    };
    let params: Value = params
        .and_then(|p| serde_json::from_str(p.get()).ok())
        .unwrap_or(Value::Null);
    match *capability {
        "elicitation" => {
            let mode = params["mode"].as_str().unwrap_or("form");
            // An empty object is form mode only.
            let empty = cap.get("form").is_none() && cap.get("url").is_none();
            let declared = cap.get(mode).is_some() || (empty && mode == "form");
            (!declared).then(|| format!("elicitation.{mode}"))
        }
        "sampling" => {
            let tools = params.get("tools").is_some() || params.get("toolChoice").is_some();
            (tools && cap.get("tools").is_none()).then(|| "sampling.tools".to_owned())
        }
        _ => None,
    }
}

/// One request an `InputRequiredResult` carries.
pub struct InputRequest<'a> {
    pub key: &'a str,
    pub method: &'a str,
    pub params: Option<&'a RawValue>,
}

/// The `InputRequiredResult` carrying `requests` and `state`.
pub fn input_required_result(requests: &[InputRequest<'_>], state: &str) -> Box<RawValue> {
    let mut out = String::from(r#"{"resultType":"input_required","inputRequests":{"#);
    for (i, r) in requests.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&Value::String(r.key.to_owned()).to_string());
        out.push_str(r#":{"method":"#);
        out.push_str(&Value::String(r.method.to_owned()).to_string());
        if let Some(p) = r.params {
            out.push_str(r#","params":"#);
            out.push_str(p.get());
        }
        out.push('}');
    }
    out.push_str(r#"},"requestState":"#);
    out.push_str(&Value::String(state.to_owned()).to_string());
    out.push('}');
    RawValue::from_string(out).expect("valid JSON")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    fn claims() -> StateClaims {
        StateClaims {
            caller: Some("alice".into()),
            expires_ms: 1_800_000_000_000,
            digest: request_digest("tools/call", Some(&raw(r#"{"name":"x"}"#))),
            replica: "r1".into(),
            call: 42,
            nonce: 7,
            fresh: false,
        }
    }

    #[test]
    fn a_sealed_state_opens_only_unchanged_and_under_its_key() {
        let key = StateKey::new(&[1; 32]);
        let state = key.seal(&claims());
        assert_eq!(key.open(&state), Ok(claims()));
        assert_ne!(state, key.seal(&claims()), "a fresh nonce each time");
        assert!(!state.contains("alice"), "the claims are not readable");
        // Every single changed character is refused.
        let bytes = state.as_bytes();
        for i in 0..bytes.len() {
            let mut changed = bytes.to_vec();
            changed[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
            let changed = String::from_utf8(changed).unwrap();
            assert_eq!(key.open(&changed), Err(StateError::Invalid), "at {i}");
        }
        assert_eq!(
            StateKey::new(&[2; 32]).open(&state),
            Err(StateError::Invalid)
        );
        for bad in ["", "not base64!", &"A".repeat(5000), &state[..20]] {
            assert_eq!(key.open(bad), Err(StateError::Invalid));
        }
    }

    #[test]
    fn the_digest_ignores_what_a_retry_adds_and_the_order_of_keys() {
        let d = |m: &str, p: &str| request_digest(m, Some(&raw(p)));
        let first = d(
            "tools/call",
            r#"{"name":"t","arguments":{"a":1,"b":[1,{"y":2,"x":1}]},"_meta":{"k":1}}"#,
        );
        let retry = d(
            "tools/call",
            r#"{"arguments":{"b":[1,{"x":1,"y":2}],"a":1},"name":"t","inputResponses":{"k":{}},"requestState":"s","_meta":{"k":2}}"#,
        );
        assert_eq!(first, retry);
        assert_ne!(
            first,
            d(
                "tools/call",
                r#"{"name":"t","arguments":{"a":2,"b":[1,{"y":2,"x":1}]}}"#
            )
        );
        assert_ne!(
            first,
            d(
                "prompts/get",
                r#"{"name":"t","arguments":{"a":1,"b":[1,{"y":2,"x":1}]}}"#
            )
        );
        assert_eq!(first.len(), 64);
    }

    #[test]
    fn a_retry_is_read_only_with_a_state() {
        let r = read_retry(Some(&raw(r#"{"inputResponses":{"a":{"x":1}}}"#))).unwrap();
        assert!(r.state.is_none() && r.responses.is_empty());
        let r = read_retry(Some(&raw(
            r#"{"requestState":"s","inputResponses":{"a":{"x":1}}}"#,
        )))
        .unwrap();
        assert_eq!(r.state.as_deref(), Some("s"));
        assert_eq!(r.responses["a"].get(), r#"{"x":1}"#);
        for bad in [
            r#"{"requestState":1}"#,
            r#"{"requestState":"s","inputResponses":null}"#,
            r#"{"requestState":"s","inputResponses":{"a":12345}}"#,
            r#"{"requestState":"s","inputResponses":[]}"#,
        ] {
            assert!(read_retry(Some(&raw(bad))).is_err(), "{bad}");
        }
        assert!(read_retry(None).unwrap().state.is_none());
        let offered = offered_responses(Some(&raw(
            r#"{"inputResponses":{"a":{"x":1},"b":12345,"c":null}}"#,
        )));
        assert_eq!(offered.len(), 1);
        assert_eq!(offered["a"].get(), r#"{"x":1}"#);
        for none in [
            r#"{"inputResponses":null}"#,
            r#"{"inputResponses":[1]}"#,
            "{}",
        ] {
            assert!(offered_responses(Some(&raw(none))).is_empty(), "{none}");
        }
    }

    #[test]
    fn capabilities_are_checked_to_the_mode_and_the_tools() {
        let m = |method: &str, params: &str, declared: &str| {
            missing_capability(method, Some(&raw(params)), Some(&raw(declared)))
        };
        assert_eq!(
            m("elicitation/create", "{}", "{}").as_deref(),
            Some("elicitation")
        );
        assert_eq!(m("elicitation/create", "{}", r#"{"elicitation":{}}"#), None);
        assert_eq!(
            m(
                "elicitation/create",
                r#"{"mode":"url"}"#,
                r#"{"elicitation":{}}"#
            )
            .as_deref(),
            Some("elicitation.url")
        );
        assert_eq!(
            m(
                "elicitation/create",
                r#"{"mode":"url"}"#,
                r#"{"elicitation":{"url":{}}}"#
            ),
            None
        );
        assert_eq!(
            m("elicitation/create", "{}", r#"{"elicitation":{"url":{}}}"#).as_deref(),
            Some("elicitation.form")
        );
        assert_eq!(
            m("sampling/createMessage", "{}", r#"{"sampling":{}}"#),
            None
        );
        assert_eq!(
            m(
                "sampling/createMessage",
                r#"{"tools":[]}"#,
                r#"{"sampling":{}}"#
            )
            .as_deref(),
            Some("sampling.tools")
        );
        assert_eq!(
            m("roots/list", "{}", r#"{"sampling":{}}"#).as_deref(),
            Some("roots")
        );
        assert_eq!(
            missing_capability("roots/list", None, None).as_deref(),
            Some("roots")
        );
        assert_eq!(m("ping", "{}", "{}"), None, "not an input request");
    }

    #[test]
    fn an_input_required_result_carries_its_requests_and_state() {
        let p = raw(r#"{"message":"name?"}"#);
        let r = input_required_result(
            &[
                InputRequest {
                    key: "elicitation-1",
                    method: "elicitation/create",
                    params: Some(&p),
                },
                InputRequest {
                    key: "roots-2",
                    method: "roots/list",
                    params: None,
                },
            ],
            "st\"ate",
        );
        let v: Value = serde_json::from_str(r.get()).unwrap();
        assert_eq!(v["resultType"], "input_required");
        assert_eq!(
            v["inputRequests"]["elicitation-1"]["params"]["message"],
            "name?"
        );
        assert_eq!(v["inputRequests"]["roots-2"]["method"], "roots/list");
        assert_eq!(v["requestState"], "st\"ate");
        let response = crate::jsonrpc::result_bytes(&raw("1"), &r);
        assert_eq!(
            crate::protocol::modern::modernize_response(&response, Some("public")),
            response.to_vec(),
            "it carries no caching hints"
        );
    }
}
