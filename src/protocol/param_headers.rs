//! Tool parameters mirrored into HTTP headers (2026-07-28, `x-mcp-header`): which parameters
//! of a tool's `inputSchema` a client must send as `Mcp-Param-{Name}` headers
//! ([`header_params`]), and whether a `tools/call`'s headers match its arguments
//! ([`check_param_headers`]). What is wrong is a [`ModernError::HeaderMismatch`] (-32020,
//! HTTP 400), as the Streamable HTTP transport's "Server Behavior for Custom Headers" says.
//!
//! Only annotations a conforming client honours are enforced: on a property reached from
//! the schema's root through `properties` alone, naming a valid header token unique in the
//! schema, on a parameter of a primitive type. A client drops a tool whose annotations break
//! these rules (the spec asks it to), so nothing can be expected of it for them. A header
//! no annotation names is ignored, as an intermediary ignores it.

use serde_json::Value;

use super::modern::{ModernError, decode_header_value};

/// The prefix of a mirrored parameter's header name.
pub const PREFIX: &str = "mcp-param-";

/// A parameter a client mirrors into `Mcp-Param-{name}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderParam {
    /// The annotation's value, the header name's suffix (compared without regard to case).
    pub name: String,
    /// The `properties` keys leading to the parameter from the arguments' root.
    pub path: Vec<String>,
}

/// The header-mapped parameters of a tool's `inputSchema`.
pub fn header_params(input_schema: &Value) -> Vec<HeaderParam> {
    let mut found = Vec::new();
    let mut path = Vec::new();
    walk(input_schema, &mut path, &mut found);
    // A name used twice (in any case) makes both annotations invalid.
    let twice: Vec<String> = found
        .iter()
        .enumerate()
        .filter(|(i, p)| {
            found
                .iter()
                .skip(i + 1)
                .any(|q| q.name.eq_ignore_ascii_case(&p.name))
        })
        .map(|(_, p)| p.name.to_ascii_lowercase())
        .collect();
    found.retain(|p| !twice.contains(&p.name.to_ascii_lowercase()));
    found
}

fn walk(schema: &Value, path: &mut Vec<String>, found: &mut Vec<HeaderParam>) {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (key, property) in properties {
        path.push(key.clone());
        if let Some(name) = property.get("x-mcp-header")
            && let Some(name) = name.as_str().filter(|n| is_token(n))
            && primitive(property)
        {
            found.push(HeaderParam {
                name: name.to_owned(),
                path: path.clone(),
            });
        }
        walk(property, path, found);
        path.pop();
    }
}

/// Why a tool's `inputSchema` breaks the rules of `x-mcp-header` (2026-07-28, "Custom
/// Headers from Tool Parameters"), if it does: an annotation that is not a string, is empty,
/// is no header token, sits on a parameter of a type other than `string`, `integer` or
/// `boolean`, is not reached from the root through `properties` alone, or names the same
/// header as another (in any case). A client over HTTP drops such a tool from its list.
pub fn invalid_annotation(input_schema: &Value) -> Option<String> {
    let mut names: Vec<String> = Vec::new();
    let mut why = None;
    check_schema(input_schema, true, &mut names, &mut why, 0);
    why
}

/// Keys whose values are maps of names to schemas (none of them reached through
/// `properties`), and keys whose values are data, not schemas.
const NAMED_SCHEMAS: [&str; 5] = [
    "$defs",
    "definitions",
    "patternProperties",
    "dependentSchemas",
    "dependencies",
];
const DATA: [&str; 5] = ["enum", "const", "default", "examples", "x-mcp-header"];

fn check_schema(
    schema: &Value,
    reachable: bool,
    names: &mut Vec<String>,
    why: &mut Option<String>,
    depth: usize,
) {
    let Some(node) = schema.as_object() else {
        return;
    };
    if why.is_some() || depth > 64 {
        return;
    }
    if let Some(name) = node.get("x-mcp-header") {
        let problem = match name.as_str() {
            None => Some("an x-mcp-header that is not a string".to_owned()),
            Some("") => Some("an empty x-mcp-header".to_owned()),
            Some(n) if !is_token(n) => Some(format!(
                "x-mcp-header {n:?} is not a header token (no spaces, colons, control or non-ASCII characters)"
            )),
            Some(n) if !reachable => Some(format!(
                "x-mcp-header {n:?} is not on a property reached from the root through `properties` alone"
            )),
            Some(n) if !primitive(schema) => Some(format!(
                "x-mcp-header {n:?} is on a parameter that is not a string, integer or boolean"
            )),
            Some(n) if names.iter().any(|m| m.eq_ignore_ascii_case(n)) => {
                Some(format!("x-mcp-header {n:?} is used twice"))
            }
            Some(n) => {
                names.push(n.to_owned());
                None
            }
        };
        if problem.is_some() {
            *why = problem;
            return;
        }
    }
    for (key, value) in node {
        if DATA.contains(&key.as_str()) {
            continue;
        }
        let named = key == "properties" || NAMED_SCHEMAS.contains(&key.as_str());
        match value {
            Value::Object(map) if named => {
                for child in map.values() {
                    check_schema(
                        child,
                        reachable && key == "properties",
                        names,
                        why,
                        depth + 1,
                    );
                }
            }
            Value::Object(_) => check_schema(value, false, names, why, depth + 1),
            Value::Array(items) => {
                for item in items {
                    check_schema(item, false, names, why, depth + 1);
                }
            }
            _ => {}
        }
    }
}

/// RFC 9110 `token` (`1*tchar`): what a header name may be made of.
fn is_token(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Whether a property's declared type lets it be mirrored: `string`, `integer` or `boolean`
/// (`null` beside one of them), or no type said.
fn primitive(property: &Value) -> bool {
    let allowed = |t: &Value| matches!(t.as_str(), Some("string" | "integer" | "boolean"));
    match property.get("type") {
        None => true,
        Some(Value::Array(types)) => {
            types.iter().any(allowed)
                && types
                    .iter()
                    .all(|t| allowed(t) || t.as_str() == Some("null"))
        }
        Some(t) => allowed(t),
    }
}

/// Checks a `tools/call`'s `Mcp-Param-*` headers (`sent`: each header's name after the
/// prefix, any case, and its raw value) against its `arguments`, for the tool's header-mapped
/// `params`: a value in the body needs its header, decoded equal to it (integers compared as
/// numbers); a header needs a value; a header is sent once, in characters a header may hold
/// and, when Base64, in valid Base64.
pub fn check_param_headers(
    params: &[HeaderParam],
    sent: &[(&str, &[u8])],
    arguments: Option<&Value>,
) -> Result<(), ModernError> {
    for param in params {
        let header = format!("Mcp-Param-{}", param.name);
        let mismatch = |why: String| Err(ModernError::HeaderMismatch(why));
        let values: Vec<&[u8]> = sent
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(&param.name))
            .map(|(_, v)| *v)
            .collect();
        let body = arguments
            .and_then(|a| param.path.iter().try_fold(a, |v, key| v.get(key)))
            .filter(|v| !v.is_null());
        let at = param.path.join(".");
        match (values.as_slice(), body) {
            ([], None) => {}
            // Not a value a client can mirror: the tool's own validation says what is wrong.
            ([], Some(Value::Object(_) | Value::Array(_))) => {}
            ([], Some(_)) => {
                return mismatch(format!(
                    "the {header} header is required: the arguments carry a value for `{at}`"
                ));
            }
            ([_, _, ..], _) => return mismatch(format!("the {header} header is sent twice")),
            ([_], None) => {
                return mismatch(format!(
                    "the {header} header is sent, but the arguments carry no value for `{at}`"
                ));
            }
            ([raw], Some(body)) => {
                let Some(value) = decode_header_value(raw) else {
                    return mismatch(format!(
                        "the {header} header is malformed (characters a header may not hold, or bad Base64)"
                    ));
                };
                if !matches(&value, body) {
                    return mismatch(format!(
                        "{header} header value '{value}' does not match body value {body}"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Whether a decoded header value stands for a body value: a string as it is, a boolean as
/// `true` or `false`, a number compared numerically (`42.0` is `42`).
fn matches(header: &str, body: &Value) -> bool {
    match body {
        Value::String(s) => header == s,
        Value::Bool(b) => header == if *b { "true" } else { "false" },
        Value::Number(n) => {
            if let (Some(b), Ok(h)) = (n.as_i64(), header.parse::<i64>()) {
                return b == h;
            }
            match (n.as_f64(), header.parse::<f64>()) {
                (Some(b), Ok(h)) => h.is_finite() && b == h,
                _ => false,
            }
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_tool_whose_annotations_break_the_rules_is_named_invalid() {
        let tool = |property: Value| json!({"type": "object", "properties": {"p": property}});
        assert_eq!(
            invalid_annotation(&tool(json!({"type": "string", "x-mcp-header": "Region"}))),
            None
        );
        assert_eq!(
            invalid_annotation(&json!({"type": "object", "properties": {"outer": {
                "type": "object", "properties": {"zone": {"type": "string", "x-mcp-header": "Zone"}}}}})),
            None
        );
        for bad in [
            json!({"type": "string", "x-mcp-header": ""}),
            json!({"type": "string", "x-mcp-header": 7}),
            json!({"type": "number", "x-mcp-header": "Score"}),
            json!({"type": "object", "x-mcp-header": "Data"}),
            json!({"type": "array", "items": {"type": "string"}, "x-mcp-header": "Items"}),
            json!({"type": "null", "x-mcp-header": "Nil"}),
            json!({"type": "string", "x-mcp-header": "My Region"}),
            json!({"type": "string", "x-mcp-header": "Region:Primary"}),
            json!({"type": "string", "x-mcp-header": "R\u{e9}gion"}),
            json!({"type": "string", "x-mcp-header": "Region\t1"}),
            json!({"type": "array", "items": {"type": "string", "x-mcp-header": "Tag"}}),
            json!({"anyOf": [{"type": "string", "x-mcp-header": "Either"}]}),
        ] {
            assert!(invalid_annotation(&tool(bad.clone())).is_some(), "{bad}");
        }
        let twice = json!({"type": "object", "properties": {
            "a": {"type": "string", "x-mcp-header": "MyField"},
            "b": {"type": "string", "x-mcp-header": "myfield"}}});
        assert!(invalid_annotation(&twice).is_some());
        // A parameter named like the keyword, or the keyword as data, is no annotation.
        let data = json!({"type": "object", "properties": {
            "x-mcp-header": {"type": "string", "enum": [{"x-mcp-header": ""}]}}});
        assert_eq!(invalid_annotation(&data), None);
        let defs =
            json!({"type": "object", "$defs": {"d": {"type": "string", "x-mcp-header": "D"}}});
        assert!(invalid_annotation(&defs).is_some());
    }

    fn names(schema: Value) -> Vec<(String, String)> {
        let mut found: Vec<_> = header_params(&schema)
            .into_iter()
            .map(|p| (p.name, p.path.join(".")))
            .collect();
        found.sort();
        found
    }

    #[test]
    fn only_valid_reachable_annotations_count() {
        let schema = json!({
            "type": "object",
            "properties": {
                "region": {"type": "string", "x-mcp-header": "Region"},
                "priority": {"type": "integer", "x-mcp-header": "Priority"},
                "flag": {"type": ["boolean", "null"], "x-mcp-header": "Flag"},
                "ratio": {"type": "number", "x-mcp-header": "Ratio"},
                "tags": {"type": "array", "items": {"type": "string", "x-mcp-header": "Tag"}},
                "empty": {"type": "string", "x-mcp-header": ""},
                "spaced": {"type": "string", "x-mcp-header": "Has Space"},
                "colon": {"type": "string", "x-mcp-header": "a:b"},
                "nested": {"type": "object", "properties": {
                    "zone": {"type": "string", "x-mcp-header": "Zone"},
                }},
                "either": {"anyOf": [{"type": "string", "x-mcp-header": "Either"}]},
                "plain": {"type": "string"},
            },
        });
        assert_eq!(
            names(schema),
            [
                ("Flag".to_owned(), "flag".to_owned()),
                ("Priority".to_owned(), "priority".to_owned()),
                ("Region".to_owned(), "region".to_owned()),
                ("Zone".to_owned(), "nested.zone".to_owned()),
            ]
        );
        let twice = json!({"properties": {
            "a": {"type": "string", "x-mcp-header": "Same"},
            "b": {"type": "string", "x-mcp-header": "same"},
            "c": {"type": "string", "x-mcp-header": "Other"},
        }});
        assert_eq!(names(twice), [("Other".to_owned(), "c".to_owned())]);
        assert!(names(json!({"type": "object"})).is_empty());
    }

    #[test]
    fn headers_must_match_the_arguments() {
        let params = header_params(&json!({"properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "priority": {"type": "integer", "x-mcp-header": "Priority"},
            "verbose": {"type": "boolean", "x-mcp-header": "Verbose"},
            "nested": {"properties": {"zone": {"type": "string", "x-mcp-header": "Zone"}}},
        }}));
        let check = |sent: &[(&str, &str)], args: Value| {
            let sent: Vec<(&str, &[u8])> = sent.iter().map(|(n, v)| (*n, v.as_bytes())).collect();
            check_param_headers(&params, &sent, Some(&args))
        };
        let ok = |sent: &[(&str, &str)], args: Value| assert_eq!(check(sent, args), Ok(()));
        let refused = |sent: &[(&str, &str)], args: Value, why: &str| match check(sent, args) {
            Err(ModernError::HeaderMismatch(m)) => assert!(m.contains(why), "{m}"),
            other => panic!("{why}: {other:?}"),
        };
        ok(&[], json!({}));
        ok(&[], json!({"region": null}));
        ok(
            &[
                ("Region", "us-west1"),
                ("priority", "42"),
                ("VERBOSE", "false"),
            ],
            json!({"region": "us-west1", "priority": 42, "verbose": false}),
        );
        ok(&[("Priority", "42.0")], json!({"priority": 42}));
        ok(
            &[("Region", "=?base64?SGVsbG8=?=")],
            json!({"region": "Hello"}),
        );
        // Without the exact sentinel, a value is literal.
        ok(&[("Region", "SGVsbG8=")], json!({"region": "SGVsbG8="}));
        ok(
            &[("Region", "=?base64?SGVsbG8=")],
            json!({"region": "=?base64?SGVsbG8="}),
        );
        ok(&[("Zone", "z1")], json!({"nested": {"zone": "z1"}}));
        refused(&[], json!({"region": "us-west1"}), "is required");
        refused(&[], json!({"nested": {"zone": "z1"}}), "`nested.zone`");
        refused(
            &[("Region", "us-east1")],
            json!({"region": "us-west1"}),
            "does not match",
        );
        refused(
            &[("Priority", "43")],
            json!({"priority": 42}),
            "does not match",
        );
        refused(
            &[("Priority", "forty")],
            json!({"priority": 42}),
            "does not match",
        );
        refused(
            &[("Verbose", "True")],
            json!({"verbose": true}),
            "does not match",
        );
        refused(
            &[("Region", "=?base64?SGVsbG8?=")],
            json!({"region": "Hello"}),
            "malformed",
        );
        refused(
            &[("Region", "=?base64?SGVs!!!bG8=?=")],
            json!({"region": "Hello"}),
            "malformed",
        );
        refused(
            &[("Region", "caf\u{e9}")],
            json!({"region": "caf\u{e9}"}),
            "malformed",
        );
        refused(&[("Region", "x")], json!({}), "no value");
        refused(
            &[("Region", "x"), ("region", "x")],
            json!({"region": "x"}),
            "twice",
        );
        // A header no annotation names is not the gateway's to check.
        ok(&[("Other", "anything")], json!({}));
    }
}
