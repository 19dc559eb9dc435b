//! The top-level members of a JSON object, found without decoding anything: where each
//! member's name and value are in the text. For text already found to be valid JSON (serde_json
//! parsed the message it is part of), on the paths every request takes, where serde's reading
//! of a whole object to find two or three members was a visible part of a request's cost.
//!
//! It reads structure only: strings are skipped to their closing quote, containers counted to
//! their end. A name with an escape in it is not compared by its text, so the scan gives up
//! (`None`) and the caller reads that text with serde, as it would without the scan. Given text
//! that is not valid JSON it gives up or reads garbage, never panics: callers hand it only what
//! serde_json has validated.

use std::ops::Range;

use memchr::memchr2;

/// Calls `member(name, value)` for each top-level member of the JSON object that is all of
/// `text` (white space around it aside), in order, with the byte ranges in `text` of the name
/// (between its quotes) and of the value (its JSON text). `None`, after calls for the members
/// before it, where a name has an escape in it, or `text` is no object, or something follows
/// the object.
pub fn object_members(
    text: &[u8],
    mut member: impl FnMut(Range<usize>, Range<usize>),
) -> Option<()> {
    let mut i = skip_space(text, 0);
    if text.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    loop {
        i = skip_space(text, i);
        match *text.get(i)? {
            // An empty object (valid JSON puts no `}` after a `,`).
            b'}' => break,
            b'"' => {}
            _ => return None,
        }
        let name_end = plain_string_end(text, i + 1)?;
        let name = i + 1..name_end - 1;
        i = skip_space(text, name_end);
        if text.get(i) != Some(&b':') {
            return None;
        }
        let start = skip_space(text, i + 1);
        i = value_end(text, start)?;
        let mut end = i;
        while end > start && is_space(text[end - 1]) {
            end -= 1;
        }
        member(name, start..end);
        i = skip_space(text, i);
        match *text.get(i)? {
            b',' => i += 1,
            b'}' => break,
            _ => return None,
        }
    }
    (skip_space(text, i + 1) == text.len()).then_some(())
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

fn skip_space(text: &[u8], mut i: usize) -> usize {
    while text.get(i).is_some_and(|b| is_space(*b)) {
        i += 1;
    }
    i
}

/// Past the closing quote of the string whose text begins at `i` (just past its opening
/// quote), if it has no escape.
pub fn plain_string_end(text: &[u8], i: usize) -> Option<usize> {
    let n = memchr2(b'"', b'\\', text.get(i..)?)?;
    (text[i + n] == b'"').then_some(i + n + 1)
}

/// Past the closing quote of the string whose text begins at `i`, escapes and all.
fn string_end(text: &[u8], mut i: usize) -> Option<usize> {
    loop {
        i += memchr2(b'"', b'\\', text.get(i..)?)?;
        if text[i] == b'"' {
            return Some(i + 1);
        }
        // A backslash and the character it escapes (`\uXXXX` has no quote or backslash
        // after its `u`).
        i += 2;
    }
}

/// Where the value that begins at `i` ends: past its last character for a string or a
/// container; at the `,` or `}` after a number or a literal (white space included).
fn value_end(text: &[u8], mut i: usize) -> Option<usize> {
    let mut depth = 0usize;
    loop {
        match *text.get(i)? {
            b'"' => {
                i = string_end(text, i + 1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            b'{' | b'[' => {
                depth += 1;
                i += 1;
            }
            b'}' | b']' | b',' if depth == 0 => return Some(i),
            b'}' | b']' => {
                depth -= 1;
                i += 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => i += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    fn scanned(text: &str) -> Option<Vec<(String, String)>> {
        let mut out = Vec::new();
        object_members(text.as_bytes(), |n, v| {
            out.push((text[n].to_owned(), text[v].to_owned()))
        })?;
        Some(out)
    }

    /// serde_json's reading of the same object: each member's name and raw value, in order.
    fn read(text: &str) -> Vec<(String, String)> {
        struct Members(Vec<(String, String)>);
        impl<'de> serde::Deserialize<'de> for Members {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> serde::de::Visitor<'de> for V {
                    type Value = Members;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("an object")
                    }
                    fn visit_map<A: serde::de::MapAccess<'de>>(
                        self,
                        mut m: A,
                    ) -> Result<Members, A::Error> {
                        let mut out = Vec::new();
                        while let Some((k, v)) =
                            m.next_entry::<String, &serde_json::value::RawValue>()?
                        {
                            out.push((k, v.get().to_owned()));
                        }
                        Ok(Members(out))
                    }
                }
                d.deserialize_map(V)
            }
        }
        serde_json::from_str::<Members>(text).unwrap().0
    }

    #[test]
    fn members_are_found_where_they_are() {
        let text = r#" { "a" : 1 , "b":"x}\",{" ,"c" :{"d":[1,{"e":"]"}],"f":null}, "g":true,"h":-2.5e3 } "#;
        assert_eq!(scanned(text).unwrap(), read(text));
        assert_eq!(scanned("{}").unwrap(), vec![]);
        assert_eq!(scanned(" { } ").unwrap(), vec![]);
        assert_eq!(
            scanned(r#"{"s":"\\","t":"\u0022"}"#).unwrap(),
            vec![
                ("s".to_owned(), r#""\\""#.to_owned()),
                ("t".to_owned(), r#""\u0022""#.to_owned())
            ]
        );
    }

    #[test]
    fn what_it_cannot_compare_or_is_no_object_is_left_to_serde() {
        for text in [
            r#"{"na\u006de":1}"#,
            r#"{"a\"b":1}"#,
            "[1,2]",
            r#""{}""#,
            "1",
            r#"{"a":1} {"b":2}"#,
            r#"{"a":1}x"#,
            "",
        ] {
            assert!(scanned(text).is_none(), "{text}");
        }
    }

    #[test]
    fn it_never_panics_on_text_that_is_not_json() {
        for text in [
            "{",
            r#"{""#,
            r#"{"a"#,
            r#"{"a""#,
            r#"{"a":"#,
            r#"{"a":"x"#,
            r#"{"a":{"#,
            r#"{"a":1"#,
            r#"{"a":1,"#,
            r#"{"a":"\"#,
            "}",
            r#"{"a"1}"#,
            r#"{"a":1 2}"#,
        ] {
            let _ = scanned(text);
        }
    }

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            "[ -~\\\\\"\u{e9}\u{1F600}]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::btree_map("[a-z\\\\\"]{0,6}", inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Every object serde_json writes, compact or pretty, is scanned into the members
        /// serde_json reads back from it; one with a name that holds an escape is left to serde.
        #[test]
        fn it_agrees_with_serde(
            members in prop::collection::btree_map("[a-z_\\\\\"]{0,8}", json(), 0..6),
            pretty in any::<bool>(),
        ) {
            let object = Value::Object(members.into_iter().collect());
            let text = if pretty {
                serde_json::to_string_pretty(&object).unwrap()
            } else {
                object.to_string()
            };
            let escaped = object.as_object().unwrap().keys().any(|k| k.contains(['\\', '"']));
            match scanned(&text) {
                Some(found) => {
                    prop_assert!(!escaped);
                    prop_assert_eq!(found, read(&text));
                }
                None => prop_assert!(escaped, "{}", text),
            }
        }
    }
}
