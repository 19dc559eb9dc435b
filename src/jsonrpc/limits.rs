//! What JSON a client may hand the gateway to pass on to a plugin.
//!
//! serde_json takes `params` (and a response's `result` or `error`) as raw text after checking
//! only its syntax, so JSON that is valid yet unreadable for many plugins would go through:
//! nesting thousands of levels deep (recursive parsers overflow or refuse), numbers of
//! thousands of digits (Python refuses integers over 4,300 digits), and `\u` escapes of lone
//! UTF-16 surrogates, which name no character (strict decoders refuse them). A plugin that
//! cannot read a line drops it, and the client waits for an answer that never comes. So the
//! edge refuses such JSON with an error that says what was wrong. One pass over the text,
//! which serde_json has already found to be valid JSON.

use memchr::memchr2;

use super::{Message, Outcome, ParseError};

/// The deepest nesting of arrays and objects taken: serde_json's own default recursion limit,
/// which Rust plugins apply when they read their params.
pub const MAX_DEPTH: usize = 128;

/// The longest number taken, in characters: room for any integer of 256 bits or float,
/// in any notation, and far below what any JSON parser refuses.
pub const MAX_NUMBER_CHARS: usize = 100;

/// Checks what a client's message carries on to a plugin.
pub(super) fn check_message(message: &Message) -> Result<(), ParseError> {
    match message {
        Message::Request {
            id,
            params: Some(p),
            ..
        } => check(p.get()).map_err(|reason| ParseError::Params {
            reason: format!("params: {reason}"),
            id: id.clone(),
        }),
        Message::Notification {
            params: Some(p), ..
        } => check(p.get()).map_err(|reason| ParseError::Invalid {
            reason: format!("params: {reason}"),
            id: None,
        }),
        Message::Response { id, outcome } => {
            let (what, raw) = match outcome {
                Outcome::Result(r) => ("result", r),
                Outcome::Error(e) => ("error", e),
            };
            check(raw.get()).map_err(|reason| ParseError::Invalid {
                reason: format!("{what}: {reason}"),
                id: Some(id.clone()),
            })
        }
        _ => Ok(()),
    }
}

/// Checks one JSON value's text (valid JSON) against the limits; what is wrong, if anything.
pub fn check(text: &str) -> Result<(), String> {
    let b = text.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'{' | b'[' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(format!("JSON is nested more than {MAX_DEPTH} levels deep"));
                }
                i += 1;
            }
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            b'"' => i = string_end(b, i + 1)?,
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < b.len() && matches!(b[i], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
                {
                    i += 1;
                }
                if i - start > MAX_NUMBER_CHARS {
                    return Err(format!(
                        "a number is {} characters long; at most {MAX_NUMBER_CHARS} are taken",
                        i - start
                    ));
                }
            }
            _ => i += 1,
        }
    }
    Ok(())
}

/// The index after the string that starts at `i` (just past its opening quote), checking that
/// every `\u` escape of a UTF-16 surrogate is half of a pair.
fn string_end(b: &[u8], mut i: usize) -> Result<usize, String> {
    loop {
        let Some(k) = memchr2(b'"', b'\\', &b[i.min(b.len())..]) else {
            return Ok(b.len());
        };
        i += k;
        if b[i] == b'"' {
            return Ok(i + 1);
        }
        // A backslash: `\uXXXX`, or a one-character escape.
        if b.get(i + 1) != Some(&b'u') {
            i += 2;
            continue;
        }
        let unit = hex4(b, i + 2);
        match unit {
            Some(0xD800..=0xDBFF) => {
                let low = (b.get(i + 6) == Some(&b'\\') && b.get(i + 7) == Some(&b'u'))
                    .then(|| hex4(b, i + 8))
                    .flatten();
                if !matches!(low, Some(0xDC00..=0xDFFF)) {
                    return Err(lone_surrogate(unit));
                }
                i += 12;
            }
            Some(0xDC00..=0xDFFF) => return Err(lone_surrogate(unit)),
            _ => i += 6,
        }
    }
}

fn lone_surrogate(unit: Option<u32>) -> String {
    format!(
        "a string holds \\u{:04x}, a lone UTF-16 surrogate, which is no character",
        unit.unwrap_or_default()
    )
}

/// The four hex digits at `at`, as a number.
fn hex4(b: &[u8], at: usize) -> Option<u32> {
    let digits = b.get(at..at + 4)?;
    u32::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jsonrpc::{code, parse_body};

    #[test]
    fn ordinary_json_passes() {
        for ok in [
            r#"{"name":"echo","arguments":{"text":"h\u00e9llo \ud83d\ude00 \"q\" \\u","n":[1,-2.5e-3,1E+10,true,false,null]}}"#,
            "[]",
            "\"\\\\ud800\"",
            &format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH)),
            &format!("[{}]", "9".repeat(MAX_NUMBER_CHARS)),
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn refuses_what_plugins_cannot_read() {
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert!(check(&deep).unwrap_err().contains("nested"));
        let long = format!("[{}]", "1".repeat(MAX_NUMBER_CHARS + 1));
        assert!(check(&long).unwrap_err().contains("number"));
        let long_float = format!("[0.{}]", "1".repeat(MAX_NUMBER_CHARS));
        assert!(check(&long_float).unwrap_err().contains("number"));
        for lone in [
            r#"{"a":"\ud800"}"#,
            r#"{"a":"x\uD800y"}"#,
            r#"{"a":"\udc00"}"#,
            r#"{"a":"\ud800\u0041"}"#,
            r#"{"a":"\ud800\n"}"#,
            r#"{"a":"\ud800"#,
        ] {
            assert!(check(lone).unwrap_err().contains("surrogate"), "{lone}");
        }
    }

    #[test]
    fn the_edge_answers_with_the_right_code_and_the_request_id() {
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{{"a":{}0{}}}}}"#,
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        let e = parse_body(deep.as_bytes()).unwrap_err();
        assert_eq!(e.code(), code::INVALID_PARAMS);
        assert_eq!(e.id().unwrap().raw().get(), "\"x\"");
        let batch = format!(
            r#"[{{"jsonrpc":"2.0","id":1,"method":"a"}},{{"jsonrpc":"2.0","id":2,"method":"b","params":[{}]}}]"#,
            "7".repeat(100_000)
        );
        let e = parse_body(batch.as_bytes()).unwrap_err();
        assert_eq!(e.code(), code::INVALID_PARAMS);
        assert!(e.message().contains("batch item 1"), "{}", e.message());
        let note = br#"{"jsonrpc":"2.0","method":"n","params":{"a":"\udfff"}}"#;
        assert_eq!(parse_body(note).unwrap_err().code(), code::INVALID_REQUEST);
        let response = br#"{"jsonrpc":"2.0","id":3,"result":{"a":"\ud800"}}"#;
        assert_eq!(
            parse_body(response).unwrap_err().code(),
            code::INVALID_REQUEST
        );
        let not_utf8 =
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"a\",\"params\":{\"s\":\"\xff\"}}";
        assert_eq!(parse_body(not_utf8).unwrap_err().code(), code::PARSE_ERROR);
    }

    proptest::proptest! {
        #[test]
        fn never_panics(s in r#"[\[\]{}"\\u0-9a-fA-F:,.eE+\- ]{0,64}"#) {
            let _ = check(&s);
        }
    }
}
