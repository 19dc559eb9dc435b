//! A call's arguments as a record keeps them when it keeps no copy: `hmac-sha256:` and the
//! hex of an HMAC (a key the replicas share) over their canonical JSON, so that equal
//! arguments match across records however each client wrote them.

use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;

/// `hmac-sha256:` and the hex of `data`'s HMAC under `keyed`, a MAC that has taken its key
/// and nothing else (cloned, so it can be used again).
pub(super) fn hmac_hex(keyed: &Hmac<Sha256>, data: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut mac = keyed.clone();
    mac.update(data);
    let mut out = String::with_capacity(12 + 64 + 11);
    out.push_str("hmac-sha256:");
    for b in mac.finalize().into_bytes() {
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 15)] as char);
    }
    out
}

/// Arguments in one canonical form, so that equal arguments sent differently (spaces, the
/// order of an object's members, escapes) hash alike: the JSON without insignificant
/// whitespace, members in the order of their names (serde_json's map is ordered), strings
/// escaped only where JSON must. Text that is not JSON is hashed as it came.
pub(super) fn canonical(raw: &str) -> std::borrow::Cow<'_, str> {
    // Most clients send what serde_json would write (no spaces, one member, plain strings):
    // seen so by a scan, it is hashed as it came, unparsed.
    if already_canonical(raw.as_bytes()) {
        return std::borrow::Cow::Borrowed(raw);
    }
    match serde_json::from_str::<Value>(raw) {
        // Written straight to a buffer: `to_string` goes through `fmt`, three times slower.
        Ok(value) => serde_json::to_string(&value)
            .map_or(std::borrow::Cow::Borrowed(raw), std::borrow::Cow::Owned),
        Err(_) => std::borrow::Cow::Borrowed(raw),
    }
}

/// Whether `text`, if it is JSON at all, is its own canonical form: no white space outside
/// strings, every object's names in strictly rising order, strings without escapes, numbers
/// only integers serde_json writes back as they are. `false` where in doubt (the caller then
/// parses and writes it); text that is no JSON may be either, as both ways hash it as it came.
fn already_canonical(text: &[u8]) -> bool {
    let mut scan = Scan { text, i: 0 };
    scan.value(0) && scan.i == text.len()
}

/// Containers nested deeper than this are left to serde (whose own limit is 128).
const MAX_DEPTH: usize = 64;

struct Scan<'a> {
    text: &'a [u8],
    i: usize,
}

impl Scan<'_> {
    fn next(&mut self) -> Option<u8> {
        let b = *self.text.get(self.i)?;
        self.i += 1;
        Some(b)
    }

    fn value(&mut self, depth: usize) -> bool {
        match self.text.get(self.i) {
            Some(b'{') if depth < MAX_DEPTH => self.object(depth + 1),
            Some(b'[') if depth < MAX_DEPTH => self.array(depth + 1),
            Some(b'"') => self.string().is_some(),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(b'-' | b'0'..=b'9') => self.integer(),
            _ => false,
        }
    }

    fn object(&mut self, depth: usize) -> bool {
        self.i += 1;
        if self.text.get(self.i) == Some(&b'}') {
            self.i += 1;
            return true;
        }
        let mut previous: Option<&[u8]> = None;
        loop {
            let Some(name) = self.string() else {
                return false;
            };
            let name = &self.text[name];
            // serde_json's map keeps its names in the order of their bytes, once each.
            if previous.is_some_and(|p| p >= name) {
                return false;
            }
            previous = Some(name);
            if self.next() != Some(b':') || !self.value(depth) {
                return false;
            }
            match self.next() {
                Some(b',') => {}
                Some(b'}') => return true,
                _ => return false,
            }
        }
    }

    fn array(&mut self, depth: usize) -> bool {
        self.i += 1;
        if self.text.get(self.i) == Some(&b']') {
            self.i += 1;
            return true;
        }
        loop {
            if !self.value(depth) {
                return false;
            }
            match self.next() {
                Some(b',') => {}
                Some(b']') => return true,
                _ => return false,
            }
        }
    }

    /// The range of a string's text without escapes or control characters (which serde
    /// would write otherwise, or refuse).
    fn string(&mut self) -> Option<std::ops::Range<usize>> {
        if self.next() != Some(b'"') {
            return None;
        }
        let start = self.i;
        let rest = self.text.get(start..)?;
        let n = rest
            .iter()
            .position(|b| matches!(b, b'"' | b'\\' | 0..=0x1f))?;
        if rest[n] != b'"' {
            return None;
        }
        self.i = start + n + 1;
        Some(start..start + n)
    }

    fn literal(&mut self, word: &[u8]) -> bool {
        let found = self.text[self.i..].starts_with(word);
        self.i += word.len();
        found
    }

    /// An integer that fits in 64 bits and is written back as it is: no fraction, no
    /// exponent, no `-0`, no leading zero.
    fn integer(&mut self) -> bool {
        let negative = self.text[self.i] == b'-';
        if negative {
            self.i += 1;
        }
        let start = self.i;
        while self.text.get(self.i).is_some_and(u8::is_ascii_digit) {
            self.i += 1;
        }
        let digits = &self.text[start..self.i];
        let plain = match digits {
            [] => false,
            [b'0'] => !negative,
            [b'0', ..] => false,
            _ => digits.len() <= 18,
        };
        plain && !matches!(self.text.get(self.i), Some(b'.' | b'e' | b'E'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keyed_mac_is_used_again_unchanged() {
        // RFC 4231, test case 2.
        let keyed = Hmac::<Sha256>::new_from_slice(b"Jefe").unwrap();
        let want = "hmac-sha256:5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
        assert_eq!(hmac_hex(&keyed, b"what do ya want for nothing?"), want);
        assert_eq!(hmac_hex(&keyed, b"what do ya want for nothing?"), want);
        assert_ne!(hmac_hex(&keyed, b"what do ya want for something?"), want);
    }

    #[test]
    fn equal_arguments_hash_alike_however_they_are_written() {
        let same = [
            r#"{"text":"same","n":1}"#,
            r#"{ "text" : "same", "n" : 1 }"#,
            r#"{"n":1,"text":"same"}"#,
            "{\n  \"text\": \"s\\u0061me\",\n  \"n\": 1\n}",
        ];
        for a in same {
            assert_eq!(canonical(a), canonical(same[0]), "{a}");
        }
        assert_ne!(canonical(r#"{"text":"other"}"#), canonical(same[0]));
        assert_eq!(canonical("not json"), "not json");
    }

    /// Guards the scan that lets text be hashed unparsed: whatever it takes as canonical,
    /// serde_json writes back unchanged, and what serde_json writes it mostly takes.
    #[test]
    fn what_is_taken_as_canonical_is_what_serde_json_writes() {
        fn written(text: &str) -> Option<String> {
            serde_json::from_str::<Value>(text)
                .ok()
                .map(|v| serde_json::to_string(&v).unwrap())
        }
        let texts = [
            r#"{"text":"same"}"#,
            r#"{"a":1,"b":[true,false,null,-5,0,{"c":"d"}],"e":{}}"#,
            r#"{"b":1,"a":2}"#,
            r#"{"a":1,"a":2}"#,
            r#"{"a": 1}"#,
            r#"{"a":1.0}"#,
            r#"{"a":1e3}"#,
            r#"{"a":-0}"#,
            r#"{"a":007}"#,
            r#"{"a":12345678901234567890123}"#,
            r#"{"a":"a"}"#,
            r#"{"a":"é ✓ /"}"#,
            r#"[1,2,3]"#,
            r#""plain""#,
            "{\"a\":\"tab\there\"}",
            r#"{"a":1}x"#,
            r#"{"a":tru}"#,
            "",
            "{",
            r#"{"":1,"a":2}"#,
            r#"{"a":[]}"#,
        ];
        for text in texts {
            if already_canonical(text.as_bytes()) {
                assert!(
                    written(text).is_none_or(|w| w == text),
                    "taken as canonical but written otherwise: {text}"
                );
            }
        }
        for text in [
            r#"{"text":"same"}"#,
            r#"{"a":1,"b":[true,false,null,-5,0,{"c":"d"}],"e":{}}"#,
            r#"{"a":"é ✓ /"}"#,
            r#"{"":1,"a":2}"#,
        ] {
            assert!(already_canonical(text.as_bytes()), "{text}");
        }
        let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert!(!already_canonical(deep.as_bytes()));
        assert_eq!(canonical(&deep), deep);
    }

    proptest::proptest! {
        #[test]
        fn any_json_taken_as_canonical_is_written_back_as_it_is(v in json_value()) {
            for text in [serde_json::to_string(&v).unwrap(), serde_json::to_string_pretty(&v).unwrap()] {
                if already_canonical(text.as_bytes()) {
                    let back: Value = serde_json::from_str(&text).unwrap();
                    proptest::prop_assert_eq!(serde_json::to_string(&back).unwrap(), text);
                }
            }
        }
    }

    fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1e6f64..1e6).prop_map(Value::from),
            "[a-z\"\\\n é/]{0,6}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::btree_map("[a-c\"]{0,2}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }
}
