//! `bench-echo-plugin`: the fastest stdio MCP server we can write, so that a benchmark
//! measures the gateway in front of it, not the plugin. Single-threaded, no async: it reads a
//! line, answers, and flushes only when no more input is waiting.
//!
//! Tools: `echo(text)` returns its text; `progress(steps)` sends that many progress
//! notifications first; `sample(prompt)` asks the client for a sample and returns its text;
//! `ask(text)` asks the client with `elicitation/create` (the text as its message) and returns
//! the `answer` the client accepted with. A client's error answer fails the call.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, BufWriter, Write};

use serde::Deserialize;
use serde_json::value::RawValue;

#[derive(Deserialize)]
struct Msg<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    method: Option<&'a str>,
    #[serde(borrow)]
    params: Option<&'a RawValue>,
    #[serde(borrow)]
    result: Option<&'a RawValue>,
    #[serde(borrow)]
    error: Option<&'a RawValue>,
}

/// What the plugin asked the client, for which call: the call's id and the field of the
/// client's result the call answers with.
struct Asked {
    call: String,
    kind: Kind,
}

enum Kind {
    /// `sampling/createMessage`: `content.text`.
    Sample,
    /// `elicitation/create`: `content.answer`.
    Elicit,
}

#[derive(Deserialize)]
struct Call<'a> {
    name: &'a str,
    #[serde(default)]
    arguments: Args,
    #[serde(rename = "_meta", default)]
    meta: Option<Meta>,
}

#[derive(Deserialize, Default)]
struct Args {
    #[serde(default)]
    text: String,
    #[serde(default)]
    steps: u32,
    #[serde(default)]
    prompt: String,
}

#[derive(Deserialize)]
struct Meta {
    #[serde(rename = "progressToken")]
    progress_token: Option<serde_json::Value>,
}

const TOOLS: &str = r#"{"tools":[{"name":"echo","description":"Echoes its text","inputSchema":{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}},{"name":"progress","description":"Reports progress, then answers","inputSchema":{"type":"object","properties":{"steps":{"type":"integer"}}}},{"name":"sample","description":"Asks the client for a sample","inputSchema":{"type":"object","properties":{"prompt":{"type":"string"}}}},{"name":"ask","description":"Asks the client a question, then answers with its answer","inputSchema":{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}}]}"#;

fn main() -> std::io::Result<()> {
    let mut input = BufReader::with_capacity(1 << 16, std::io::stdin().lock());
    let mut out = BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    let mut asked: HashMap<u64, Asked> = HashMap::new();
    let mut next = 1u64;
    let mut line = String::new();
    loop {
        line.clear();
        if input.read_line(&mut line)? == 0 {
            return out.flush();
        }
        let Ok(msg) = serde_json::from_str::<Msg>(line.trim_end()) else {
            continue;
        };
        let id = msg.id.map(RawValue::get);
        match (msg.method, id) {
            (Some("initialize"), Some(id)) => writeln!(
                out,
                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"protocolVersion":"2025-06-18","capabilities":{{"tools":{{}}}},"serverInfo":{{"name":"bench-echo","version":"1"}}}}}}"#
            )?,
            (Some("tools/list"), Some(id)) => {
                writeln!(out, r#"{{"jsonrpc":"2.0","id":{id},"result":{TOOLS}}}"#)?
            }
            (Some("ping"), Some(id)) => {
                writeln!(out, r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#)?
            }
            (Some("tools/call"), Some(id)) => {
                let Some(call) = msg
                    .params
                    .and_then(|p| serde_json::from_str::<Call>(p.get()).ok())
                else {
                    writeln!(
                        out,
                        r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32602,"message":"bad params"}}}}"#
                    )?;
                    continue;
                };
                match call.name {
                    "echo" => {
                        let text = serde_json::to_string(&call.arguments.text).expect("a string");
                        writeln!(
                            out,
                            r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":{text}}}]}}}}"#
                        )?;
                    }
                    "progress" => {
                        if let Some(token) = call.meta.and_then(|m| m.progress_token) {
                            for i in 1..=call.arguments.steps {
                                writeln!(
                                    out,
                                    r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":{token},"progress":{i},"total":{}}}}}"#,
                                    call.arguments.steps
                                )?;
                            }
                        }
                        writeln!(
                            out,
                            r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"done"}}]}}}}"#
                        )?;
                    }
                    "sample" => {
                        let prompt =
                            serde_json::to_string(&call.arguments.prompt).expect("a string");
                        writeln!(
                            out,
                            r#"{{"jsonrpc":"2.0","id":{next},"method":"sampling/createMessage","params":{{"messages":[{{"role":"user","content":{{"type":"text","text":{prompt}}}}}],"maxTokens":10}}}}"#
                        )?;
                        asked.insert(
                            next,
                            Asked {
                                call: id.to_owned(),
                                kind: Kind::Sample,
                            },
                        );
                        next += 1;
                    }
                    "ask" => {
                        let text = serde_json::to_string(&call.arguments.text).expect("a string");
                        writeln!(
                            out,
                            r#"{{"jsonrpc":"2.0","id":{next},"method":"elicitation/create","params":{{"message":{text},"requestedSchema":{{"type":"object","properties":{{"answer":{{"type":"string"}}}},"required":["answer"]}}}}}}"#
                        )?;
                        asked.insert(
                            next,
                            Asked {
                                call: id.to_owned(),
                                kind: Kind::Elicit,
                            },
                        );
                        next += 1;
                    }
                    _ => writeln!(
                        out,
                        r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32602,"message":"unknown tool"}}}}"#
                    )?,
                }
            }
            (None, Some(id)) => {
                let Some(Asked { call, kind }) =
                    id.parse().ok().and_then(|n: u64| asked.remove(&n))
                else {
                    continue;
                };
                let result = msg
                    .result
                    .and_then(|r| serde_json::from_str::<serde_json::Value>(r.get()).ok());
                let text = match (&result, kind) {
                    (Some(r), Kind::Sample) => {
                        Some(r["content"]["text"].as_str().unwrap_or_default())
                    }
                    (Some(r), Kind::Elicit) if r["action"] == "accept" => {
                        r["content"]["answer"].as_str()
                    }
                    _ => None,
                };
                match text {
                    Some(text) => {
                        let text = serde_json::to_string(text).expect("a string");
                        writeln!(
                            out,
                            r#"{{"jsonrpc":"2.0","id":{call},"result":{{"content":[{{"type":"text","text":{text}}}]}}}}"#
                        )?;
                    }
                    None => {
                        let why = msg.error.map_or(
                            "no answer in the client's result",
                            |_| "the client answered with an error",
                        );
                        writeln!(
                            out,
                            r#"{{"jsonrpc":"2.0","id":{call},"error":{{"code":-32603,"message":"{why}"}}}}"#
                        )?;
                    }
                }
            }
            (Some(_), Some(id)) => writeln!(
                out,
                r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32601,"message":"not found"}}}}"#
            )?,
            _ => {}
        }
        if input.buffer().is_empty() {
            out.flush()?;
        }
    }
}
