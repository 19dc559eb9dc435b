//! `mcp-fixture-modern`: a stdio MCP server of the modern era (2026-07-28) only, written for
//! the gateway's tests.
//!
//! It answers `server/discover`, refuses `initialize` with an error naming the versions it
//! speaks, and refuses any request whose `_meta` lacks the version or names another one. It
//! never sends a request of its own: what it needs from the client it asks for with an
//! `InputRequiredResult` (its state in `requestState`, plain text: tampering can only fail the
//! request). Tools: `echo`; `meta` (the request's `_meta`, as text); `ask_name` (one
//! elicitation); `two_rounds` (an elicitation, then an elicitation and `roots/list` together);
//! `busy` (a round with only `requestState`); `rude_sampling` (asks for sampling whatever the
//! client declared, as a misbehaving plugin would). A resource, `modern://greeting`, and a
//! prompt, `greet`. Flags: `--versions A,B` lists other versions than 2026-07-28 (so the
//! gateway's probe finds none it speaks); `--discover-delay-ms N` answers its first
//! `server/discover` only after N ms (a server slow to start), reading nothing meanwhile;
//! `--ignore-initialize` answers nothing to `initialize` (a server that ignores what it does
//! not know).

use std::io::{BufRead, Write};

use serde_json::{Value, json};

const VERSION: &str = "2026-07-28";
const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
const META_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

/// A JSON-RPC error: code, message, data.
type Refusal = (i64, String, Option<Value>);

fn main() {
    let mut versions = vec![VERSION.to_owned()];
    let mut discover_delay = std::time::Duration::ZERO;
    let mut ignore_initialize = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--versions" => {
                versions = args
                    .next()
                    .unwrap_or_default()
                    .split(',')
                    .map(str::to_owned)
                    .collect();
            }
            "--discover-delay-ms" => {
                let ms = args.next().and_then(|n| n.parse().ok()).unwrap_or(0);
                discover_delay = std::time::Duration::from_millis(ms);
            }
            "--ignore-initialize" => ignore_initialize = true,
            other => {
                eprintln!("fixture-modern: unknown flag {other}");
                std::process::exit(2);
            }
        }
    }
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            eprintln!("fixture-modern: unparseable line: {line}");
            continue;
        };
        // Notifications (cancellations) and responses need no answer: it sends no requests.
        let (Some(id), Some(method)) = (msg.get("id"), msg["method"].as_str()) else {
            continue;
        };
        if method == "initialize" && ignore_initialize {
            continue;
        }
        if method == "server/discover" && !discover_delay.is_zero() {
            std::thread::sleep(std::mem::take(&mut discover_delay));
        }
        let answer = match handle(&versions, method, &msg["params"]) {
            Ok(mut result) => {
                result["resultType"] = result
                    .get("resultType")
                    .cloned()
                    .unwrap_or(json!("complete"));
                result["_meta"] = json!({ META_SERVER_INFO: server_info() });
                json!({"jsonrpc": "2.0", "id": id, "result": result})
            }
            Err((code, message, data)) => {
                let mut error = json!({"code": code, "message": message});
                if let Some(d) = data {
                    error["data"] = d;
                }
                json!({"jsonrpc": "2.0", "id": id, "error": error})
            }
        };
        if writeln!(stdout, "{answer}")
            .and_then(|()| stdout.flush())
            .is_err()
        {
            break;
        }
    }
}

fn server_info() -> Value {
    json!({"name": "mcp-fixture-modern", "version": "1.0.0"})
}

fn handle(versions: &[String], method: &str, params: &Value) -> Result<Value, Refusal> {
    if method == "initialize" {
        return Err((
            -32022,
            format!(
                "this server speaks only MCP {} and has no initialize",
                versions.join(", ")
            ),
            Some(json!({"supported": versions, "requested": params["protocolVersion"]})),
        ));
    }
    let meta = &params["_meta"];
    let Some(requested) = meta[META_VERSION].as_str() else {
        return Err((
            -32602,
            format!("_meta[\"{META_VERSION}\"] is required"),
            None,
        ));
    };
    if !versions.iter().any(|v| v == requested) {
        return Err((
            -32022,
            "Unsupported protocol version".into(),
            Some(json!({"supported": versions, "requested": requested})),
        ));
    }
    if !meta[META_CAPABILITIES].is_object() {
        return Err((
            -32602,
            format!("_meta[\"{META_CAPABILITIES}\"] is required"),
            None,
        ));
    }
    match method {
        "server/discover" => Ok(json!({
            "supportedVersions": versions,
            "capabilities": {"tools": {}, "resources": {"subscribe": true}, "prompts": {}},
            "instructions": "A modern-only fixture.",
            "ttlMs": 0,
            "cacheScope": "public",
        })),
        "tools/list" => Ok(json!({"tools": [
            tool("echo", "Echoes its text", json!({"text": {"type": "string"}})),
            tool("meta", "The request's _meta, as text", json!({})),
            tool("ask_name", "Asks the user's name (elicitation)", json!({})),
            tool("two_rounds", "Asks twice, the second time with roots", json!({})),
            tool("busy", "Asks to be called again, with state only", json!({})),
            tool("rude_sampling", "Asks for sampling, declared or not", json!({})),
        ], "ttlMs": 0, "cacheScope": "public"})),
        "tools/call" => call_tool(params),
        "resources/list" => Ok(json!({"resources": [
            {"uri": "modern://greeting", "name": "greeting", "mimeType": "text/plain"},
        ], "ttlMs": 0, "cacheScope": "public"})),
        "resources/templates/list" => {
            Ok(json!({"resourceTemplates": [], "ttlMs": 0, "cacheScope": "public"}))
        }
        "resources/read" if params["uri"] == "modern://greeting" => Ok(json!({"contents": [
            {"uri": "modern://greeting", "mimeType": "text/plain", "text": "hello from a modern plugin"},
        ], "ttlMs": 0, "cacheScope": "public"})),
        "resources/read" => Err((
            -32602,
            format!("Resource not found: {}", params["uri"]),
            None,
        )),
        "prompts/list" => Ok(json!({"prompts": [
            {"name": "greet", "description": "Greets someone", "arguments": [{"name": "name", "required": true}]},
        ], "ttlMs": 0, "cacheScope": "public"})),
        "prompts/get" if params["name"] == "greet" => Ok(json!({"messages": [
            {"role": "user", "content": {"type": "text", "text": format!("Say hello to {}", params["arguments"]["name"].as_str().unwrap_or("nobody"))}},
        ]})),
        "prompts/get" => Err((-32602, format!("Unknown prompt: {}", params["name"]), None)),
        _ => Err((-32601, format!("Method not found: {method}"), None)),
    }
}

fn tool(name: &str, description: &str, properties: Value) -> Value {
    json!({"name": name, "description": description, "inputSchema": {"type": "object", "properties": properties}})
}

fn text(t: impl Into<String>) -> Result<Value, Refusal> {
    Ok(json!({"content": [{"type": "text", "text": t.into()}]}))
}

fn elicit(message: &str) -> Value {
    json!({"method": "elicitation/create", "params": {
        "mode": "form",
        "message": message,
        "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    }})
}

fn input_required(requests: Value, state: &str) -> Result<Value, Refusal> {
    let mut r = json!({"resultType": "input_required", "requestState": state});
    if !requests.is_null() {
        r["inputRequests"] = requests;
    }
    Ok(r)
}

/// The name an elicitation answer accepted, if it did.
fn accepted(answer: &Value) -> Option<&str> {
    (answer["action"] == "accept")
        .then(|| answer["content"]["name"].as_str())
        .flatten()
}

/// What the client declared, as this request's `_meta` says.
fn declared(params: &Value, capability: &str) -> bool {
    params["_meta"][META_CAPABILITIES][capability].is_object()
}

fn missing(capability: &str) -> Result<Value, Refusal> {
    Err((
        -32021,
        format!("this tool needs the client's {capability} capability"),
        Some(json!({"requiredCapabilities": {capability: {}}})),
    ))
}

fn call_tool(params: &Value) -> Result<Value, Refusal> {
    let state = params["requestState"].as_str();
    let responses = &params["inputResponses"];
    match params["name"].as_str().unwrap_or_default() {
        "echo" => text(params["arguments"]["text"].as_str().unwrap_or_default()),
        "meta" => text(params["_meta"].to_string()),
        "ask_name" if !declared(params, "elicitation") => missing("elicitation"),
        "ask_name" => match (state, accepted(&responses["name"])) {
            (Some("ask_name"), Some(name)) => text(format!("Hello, {name}")),
            (Some("ask_name"), None) if !responses["name"].is_null() => text("No name given"),
            // First call, or the answer is missing: ask (again).
            _ => input_required(json!({"name": elicit("Your name?")}), "ask_name"),
        },
        "two_rounds" if !declared(params, "elicitation") => missing("elicitation"),
        "two_rounds" if !declared(params, "roots") => missing("roots"),
        "two_rounds" => {
            let first = state.and_then(|s| s.strip_prefix("second:"));
            match (state, first) {
                (Some("first"), _) => match accepted(&responses["first"]) {
                    Some(name) => input_required(
                        json!({"second": elicit("And the second name?"), "roots": {"method": "roots/list"}}),
                        &format!("second:{name}"),
                    ),
                    None => input_required(json!({"first": elicit("First name?")}), "first"),
                },
                (_, Some(first)) => {
                    let second = accepted(&responses["second"]).unwrap_or("?");
                    let roots = responses["roots"]["roots"].as_array().map_or(0, Vec::len);
                    text(format!("first={first} second={second} roots={roots}"))
                }
                _ => input_required(json!({"first": elicit("First name?")}), "first"),
            }
        }
        "busy" => match state {
            Some("later") => text("done after a retry"),
            _ => input_required(Value::Null, "later"),
        },
        "rude_sampling" => match responses["answer"]["content"]["text"].as_str() {
            Some(t) => text(format!("the model said: {t}")),
            None => input_required(
                json!({"answer": {"method": "sampling/createMessage", "params": {
                    "messages": [{"role": "user", "content": {"type": "text", "text": "2+2?"}}],
                    "maxTokens": 10,
                }}}),
                "rude",
            ),
        },
        other => Err((-32602, format!("Unknown tool: {other}"), None)),
    }
}
