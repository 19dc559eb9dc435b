//! What a record reads of a call's params: the `name` (else the `uri`) it targets, and its
//! `arguments` as sent. Found by a scan of the text where it can say what serde would read,
//! else read by serde; params that are no object, or whose members are not what they should
//! be, give nothing.

use std::borrow::Cow;
use std::ops::Range;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::jsonrpc::scan::{object_members, plain_string_end};

/// The fields of a call's params a record reads.
#[derive(Deserialize)]
struct CallParams<'a> {
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    uri: Option<Cow<'a, str>>,
    #[serde(borrow)]
    arguments: Option<&'a RawValue>,
}

/// The target and the arguments' text of `params`.
pub(super) fn read(params: Option<&RawValue>) -> (Option<Cow<'_, str>>, Option<&str>) {
    let Some(params) = params else {
        return (None, None);
    };
    if let Some((target, arguments)) = scan(params.get()) {
        return (target.map(Cow::Borrowed), arguments);
    }
    match serde_json::from_str::<CallParams<'_>>(params.get()) {
        Ok(p) => (p.name.or(p.uri), p.arguments.map(RawValue::get)),
        Err(_) => (None, None),
    }
}

/// What [`CallParams`] reads, found by a scan of the params' text (which serde_json has
/// validated). `None` where the scan cannot say what serde would (a name or value with an
/// escape, a member twice, a `name` that is no string), and serde reads them.
fn scan(text: &str) -> Option<(Option<&str>, Option<&str>)> {
    let (mut name, mut uri, mut arguments) = (None, None, None);
    let mut twice = false;
    object_members(text.as_bytes(), |n, v| {
        let slot = match &text[n] {
            "name" => &mut name,
            "uri" => &mut uri,
            "arguments" => &mut arguments,
            _ => return,
        };
        twice |= slot.replace(v).is_some();
    })?;
    if twice {
        return None;
    }
    let plain = |v: Option<Range<usize>>| -> Option<Option<&str>> {
        match v {
            None => Some(None),
            Some(v) => {
                let end = plain_string_end(text.as_bytes(), v.start + 1);
                (text.as_bytes()[v.start] == b'"' && end == Some(v.end))
                    .then(|| Some(&text[v.start + 1..v.end - 1]))
            }
        }
    };
    let (name, uri) = (plain(name)?, plain(uri)?);
    // `arguments: null` is none, as serde reads it.
    let arguments = arguments.map(|v| &text[v]).filter(|a| *a != "null");
    Some((name.or(uri), arguments))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards the scan against serde's reading, which it stands in for.
    #[test]
    fn params_scanned_say_what_serde_reads() {
        fn serde(text: &str) -> (Option<String>, Option<String>) {
            match serde_json::from_str::<CallParams<'_>>(text) {
                Ok(p) => (
                    p.name.or(p.uri).map(|t| t.into_owned()),
                    p.arguments.map(|a| a.get().to_owned()),
                ),
                Err(_) => (None, None),
            }
        }
        for text in [
            r#"{"name":"echo","arguments":{"text":"x"}}"#,
            r#"{ "name" : "echo" , "arguments" : { "text" : "x" } , "_meta" : {"a":1} }"#,
            r#"{"uri":"file:///a b"}"#,
            r#"{"name":"n","uri":"u"}"#,
            r#"{"name":"e\u0063ho"}"#,
            r#"{"name":"a","name":"b"}"#,
            r#"{"name":5}"#,
            r#"{"arguments":null,"name":"x"}"#,
            r#"{"arguments":[1,2]}"#,
            r#"{}"#,
            "[1]",
        ] {
            let want = serde(text);
            if let Some((target, arguments)) = scan(text) {
                assert_eq!(
                    (target.map(str::to_owned), arguments.map(str::to_owned)),
                    want,
                    "{text}"
                );
            }
            let raw = RawValue::from_string(text.to_owned()).unwrap();
            let (target, arguments) = read(Some(&raw));
            assert_eq!(
                (target.map(Cow::into_owned), arguments.map(str::to_owned)),
                want,
                "{text}"
            );
        }
        assert!(scan(r#"{"name":"echo","arguments":{"text":"x"}}"#).is_some());
        assert_eq!(read(None), (None, None));
    }
}
