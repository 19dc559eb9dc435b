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
    match serde_json::from_str::<Value>(raw) {
        // Written straight to a buffer: `to_string` goes through `fmt`, three times slower.
        Ok(value) => serde_json::to_string(&value)
            .map_or(std::borrow::Cow::Borrowed(raw), std::borrow::Cow::Owned),
        Err(_) => std::borrow::Cow::Borrowed(raw),
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
}
