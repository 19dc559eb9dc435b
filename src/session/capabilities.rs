//! What a session's client declared it can do, read once from its `initialize` params: the
//! capabilities by name, and the parts of them 2025-11-25 made finer (elicitation's `form` and
//! `url` modes, tool use in sampling, tasks). A plugin's request to the client is checked here
//! before it goes out; it must never reach a client that said it cannot take it.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use crate::jsonrpc::code;

/// The client's capabilities, as far as the gateway checks them.
#[derive(Debug, Default)]
pub struct ClientCapabilities {
    /// The top-level names (`sampling`, `elicitation`, `roots`, `tasks`, ...).
    names: HashSet<String>,
    /// `elicitation.form`, or an empty `elicitation` (which means form only).
    elicitation_form: bool,
    /// `elicitation.url`.
    elicitation_url: bool,
    /// `sampling.tools`: tool use in sampling requests.
    sampling_tools: bool,
    /// `tasks`, at a version that has them (2025-11-25 on): the client can make task-augmented
    /// requests, so a tool that must run as a task is of use to it.
    tasks: bool,
}

impl ClientCapabilities {
    /// Reads the `capabilities` of `initialize` params (as the session keeps them) negotiated
    /// at `version`. Params without them declare nothing.
    pub fn parse(params: &RawValue, version: &str) -> ClientCapabilities {
        #[derive(Deserialize)]
        struct Params {
            capabilities: HashMap<String, serde_json::Value>,
        }
        let Ok(Params { capabilities }) = serde_json::from_str::<Params>(params.get()) else {
            return ClientCapabilities::default();
        };
        let has = |cap: &str, sub: &str| {
            capabilities
                .get(cap)
                .and_then(|c| c.get(sub))
                .is_some_and(|v| !v.is_null())
        };
        let elicitation_url = has("elicitation", "url");
        ClientCapabilities {
            elicitation_form: capabilities.contains_key("elicitation")
                && (has("elicitation", "form") || !elicitation_url),
            elicitation_url,
            sampling_tools: has("sampling", "tools"),
            tasks: capabilities.get("tasks").is_some_and(|t| !t.is_null())
                && version >= "2025-11-25",
            names: capabilities
                .into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, _)| k)
                .collect(),
        }
    }

    /// Whether the client declared the capability `name`.
    pub fn has(&self, name: &str) -> bool {
        self.names.contains(name)
    }

    /// Whether the client can make task-augmented requests (see the field).
    pub fn tasks(&self) -> bool {
        self.tasks
    }

    /// Why a plugin's request may not go to this client, as the JSON-RPC error (code,
    /// message) the plugin gets instead; `None` when it may. A capability the client did not
    /// declare at all is method not found; a mode or feature of a declared one it did not
    /// declare is invalid params, as the client itself would answer (2025-11-25).
    pub fn refusal(&self, method: &str, params: Option<&RawValue>) -> Option<(i64, String)> {
        let cap = match method {
            "sampling/createMessage" => "sampling",
            "elicitation/create" => "elicitation",
            "roots/list" => "roots",
            _ => return None,
        };
        if !self.has(cap) {
            return Some((
                code::METHOD_NOT_FOUND,
                format!("the client did not declare the `{cap}` capability"),
            ));
        }
        #[derive(Deserialize, Default)]
        struct Asked<'a> {
            #[serde(borrow, default)]
            mode: Option<Cow<'a, str>>,
            #[serde(default)]
            tools: Option<IgnoredAny>,
        }
        let asked: Asked = params
            .and_then(|p| serde_json::from_str(p.get()).ok())
            .unwrap_or_default();
        let refuse = |what: &str| {
            Some((
                code::INVALID_PARAMS,
                format!("the client did not declare the `{what}` capability"),
            ))
        };
        match method {
            "sampling/createMessage" if asked.tools.is_some() && !self.sampling_tools => {
                refuse("sampling.tools")
            }
            "elicitation/create" => match asked.mode.as_deref().unwrap_or("form") {
                "form" if self.elicitation_form => None,
                "url" if self.elicitation_url => None,
                "form" => refuse("elicitation.form"),
                "url" => refuse("elicitation.url"),
                other => Some((
                    code::INVALID_PARAMS,
                    format!("elicitation mode `{other}` is not one the client can take"),
                )),
            },
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(json: &str, version: &str) -> ClientCapabilities {
        let params = format!(r#"{{"protocolVersion":"{version}","capabilities":{json}}}"#);
        ClientCapabilities::parse(&RawValue::from_string(params).unwrap(), version)
    }

    fn refused(c: &ClientCapabilities, method: &str, params: &str) -> Option<i64> {
        let p = RawValue::from_string(params.into()).unwrap();
        c.refusal(method, Some(&p)).map(|(code, _)| code)
    }

    #[test]
    fn an_empty_elicitation_is_form_only() {
        let c = caps(r#"{"elicitation":{}}"#, "2025-11-25");
        assert_eq!(
            refused(&c, "elicitation/create", r#"{"message":"m"}"#),
            None
        );
        assert_eq!(
            refused(&c, "elicitation/create", r#"{"mode":"form"}"#),
            None
        );
        assert_eq!(
            refused(&c, "elicitation/create", r#"{"mode":"url"}"#),
            Some(code::INVALID_PARAMS)
        );
    }

    #[test]
    fn url_alone_is_not_form() {
        let c = caps(r#"{"elicitation":{"url":{}}}"#, "2025-11-25");
        assert_eq!(refused(&c, "elicitation/create", r#"{"mode":"url"}"#), None);
        assert_eq!(
            refused(&c, "elicitation/create", r#"{"message":"m"}"#),
            Some(code::INVALID_PARAMS)
        );
        let both = caps(r#"{"elicitation":{"url":{},"form":{}}}"#, "2025-11-25");
        assert_eq!(refused(&both, "elicitation/create", r#"{}"#), None);
        assert_eq!(
            refused(&both, "elicitation/create", r#"{"mode":"carrier-pigeon"}"#),
            Some(code::INVALID_PARAMS)
        );
    }

    #[test]
    fn tool_use_in_sampling_needs_sampling_tools() {
        let plain = caps(r#"{"sampling":{}}"#, "2025-11-25");
        let tools = caps(r#"{"sampling":{"tools":{}}}"#, "2025-11-25");
        let with_tools = r#"{"messages":[],"maxTokens":1,"tools":[]}"#;
        assert_eq!(
            refused(&plain, "sampling/createMessage", with_tools),
            Some(code::INVALID_PARAMS)
        );
        assert_eq!(refused(&tools, "sampling/createMessage", with_tools), None);
        assert_eq!(
            refused(&plain, "sampling/createMessage", r#"{"tools":null}"#),
            None
        );
    }

    #[test]
    fn an_undeclared_capability_is_method_not_found() {
        let c = caps(r#"{"roots":{}}"#, "2025-11-25");
        assert_eq!(
            refused(&c, "sampling/createMessage", "{}"),
            Some(code::METHOD_NOT_FOUND)
        );
        assert_eq!(
            refused(&c, "elicitation/create", "{}"),
            Some(code::METHOD_NOT_FOUND)
        );
        assert_eq!(refused(&c, "roots/list", "{}"), None);
        assert_eq!(refused(&c, "ping", "{}"), None);
    }

    #[test]
    fn tasks_need_a_version_that_has_them() {
        assert!(caps(r#"{"tasks":{}}"#, "2025-11-25").tasks());
        assert!(!caps(r#"{"tasks":{}}"#, "2025-06-18").tasks());
        assert!(!caps(r#"{}"#, "2025-11-25").tasks());
    }
}
